package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tollgate-llm/tollgate/internal/retryhint"
	"github.com/tollgate-llm/tollgate/llm"
	gwstats "github.com/tollgate-llm/tollgate/stats"
)

// The windows of a tollgate's /stats, smallest first, with the span each is
// sure to cover: a window is whole slices, the current one included, so it
// reaches back between its length less one slice and its length
// (gwstats.Window).
var gatewayWindows = [...]struct {
	name string
	span time.Duration
}{
	{"1m", 50 * time.Second},
	{"5m", 290 * time.Second},
	{"1h", 59 * time.Minute},
}

// pickWindow returns the smallest /stats window sure to hold every request
// of a run that began d ago, or "" when none is. The margin (15 s + 5 %)
// covers the fetch itself and the slack between the client's and the
// gateway's clocks, so a 40 s run asks for 5m and the 1h window takes runs
// up to 56 min.
func pickWindow(d time.Duration) string {
	need := d + d/20 + 15*time.Second
	for _, w := range gatewayWindows {
		if need <= w.span {
			return w.name
		}
	}
	return ""
}

// Bounds of the /stats fetches. A record reaches /stats after the gateway
// has written the request's last byte, so the client can finish before the
// gateway has counted it: Finish asks again, every statsPoll, while the
// gateway has counted fewer requests than were sent, until the count has
// not moved for statsStable polls (the requests it lacks are not coming:
// connection failures, other replicas, a model counted as "other") or
// statsSettle has passed.
const (
	statsTimeout  = 5 * time.Second
	statsBodyCap  = 4 << 20
	statsTries    = 3 // /stats answers 503 while too many are served at once
	statsMaxWait  = 2 * time.Second
	statsPoll     = 100 * time.Millisecond
	statsStable   = 3
	statsSettle   = 2 * time.Second
	retryAfterDef = time.Second
)

// StatsURL returns the /stats URL of a tollgate: base read as
// Config.BaseURL (a trailing /v1 is dropped) with /stats appended, or base
// as it is when its path already ends in /stats. Its query is dropped
// (WatchGateway sets it), and so are credentials (user:password@): /stats
// is public, and bench sends it no secret.
func StatsURL(base string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return "", fmt.Errorf("bench: stats URL is not a URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return "", fmt.Errorf("bench: stats URL %q: want http:// or https:// and a host", u.Redacted())
	}
	path := strings.TrimSuffix(u.Path, "/")
	if !strings.HasSuffix(path, "/stats") {
		path = strings.TrimSuffix(path, "/v1") + "/stats"
	}
	u.User, u.Path, u.RawPath, u.RawQuery, u.Fragment = nil, path, "", "", ""
	return u.String(), nil
}

// GatewayWatch reads a tollgate's /stats around a run, to put the gateway's
// own figures for the run beside the client's. It never sends the API key,
// nor any credentials: /stats is public on the serving port.
type GatewayWatch struct {
	url          string // /stats, without a query or credentials
	route, model string
	client       *http.Client
	before       *gwstats.Report
	// series is false when the gateway has no /stats/series (one from
	// before it): the run's counts are then the window's after the run
	// less before it.
	series bool
	// from is the start of the series' slice current at the first read,
	// and first that slice's counts then; from is zero when the group
	// had nothing in the last hour, so that every slice counts.
	from  time.Time
	first counts
}

// seriesWindow is the /stats/series window the run's counts are read from:
// one-minute slices over the last hour, which hold the slice current at
// the first read for runs up to 59 minutes, longer than any run pickWindow
// takes.
const seriesWindow = "1h"

// WatchGateway fetches statsURL (see StatsURL) once before a run of cfg, and
// its /stats/series: it asks for cfg's route (chat_completions or messages)
// and model, teams merged, in every window, since the window is chosen from
// the run's duration once it is known. It fails when the answer is not a
// tollgate's /stats report. A gateway without /stats/series (404) is read
// the older way (see GatewayStats.Counts). client nil means a client of its
// own.
func WatchGateway(ctx context.Context, statsURL string, cfg Config, client *http.Client) (*GatewayWatch, error) {
	route := llm.RouteChatCompletions
	if cfg.Dialect == llm.DialectAnthropic {
		route = llm.RouteMessages
	}
	if client == nil {
		// A few fetches, one at a time, minutes apart: a connection kept
		// between them would only outlive the command.
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.DisableKeepAlives = true
		client = &http.Client{Transport: tr}
	}
	if u, err := url.Parse(statsURL); err == nil && u.User != nil {
		u.User = nil // whoever built the URL, /stats gets no credentials
		statsURL = u.String()
	}
	w := &GatewayWatch{url: statsURL, route: route.String(), model: cfg.Model, client: client}
	rep, err := w.fetchReport(ctx, "")
	if err != nil {
		return nil, err
	}
	w.before = rep
	sr, err := w.fetchSeries(ctx)
	switch {
	case errors.Is(err, errNoSeries):
	case err != nil:
		return nil, err
	default:
		w.series = true
		// The group's last point is the slice current at the read; with
		// no group the gateway counted nothing for it in the last hour.
		if s := w.findSeries(sr); s != nil && len(s.Points) > 0 {
			p := &s.Points[len(s.Points)-1]
			w.from, w.first = p.Start, countsOf(&p.Figures)
		}
	}
	return w, nil
}

var (
	// errNoSeries is a gateway that does not serve /stats/series.
	errNoSeries = errors.New("no /stats/series")
	// errNotStats is an answer that is not what a tollgate serves there.
	errNotStats = errors.New("not a tollgate /stats report")
)

// query returns the URL of path (/stats or /stats/series) for window (""
// for all).
func (w *GatewayWatch) query(path, window string) string {
	q := url.Values{}
	q.Set("route", w.route)
	q.Set("model", w.model)
	q.Set("merge", "team")
	if window != "" {
		q.Set("window", window)
	}
	return path + "?" + q.Encode()
}

// fetchReport GETs /stats for window.
func (w *GatewayWatch) fetchReport(ctx context.Context, window string) (*gwstats.Report, error) {
	rep := new(gwstats.Report)
	if err := w.fetch(ctx, w.url, w.query(w.url, window), rep); err != nil {
		return nil, err
	}
	if rep.Sketch.Kind == "" {
		return nil, fmt.Errorf("bench: %s: %w", redact(w.url), errNotStats)
	}
	return rep, nil
}

// fetchSeries GETs /stats/series for seriesWindow. It returns errNoSeries
// when the gateway has none: a 404, or an answer that is not a series.
func (w *GatewayWatch) fetchSeries(ctx context.Context) (*gwstats.SeriesReport, error) {
	where := w.url + "/series"
	sr := new(gwstats.SeriesReport)
	err := w.fetch(ctx, where, w.query(where, seriesWindow), sr)
	var se *statusError
	if errors.As(err, &se) && se.code == http.StatusNotFound || errors.Is(err, errNotStats) ||
		err == nil && (sr.Sketch.Kind == "" || sr.Window != seriesWindow) {
		return nil, errNoSeries
	}
	if err != nil {
		return nil, err
	}
	return sr, nil
}

// findSeries returns sr's series for the watched route and model with
// teams merged, or nil.
func (w *GatewayWatch) findSeries(sr *gwstats.SeriesReport) *gwstats.Series {
	for i := range sr.Series {
		if s := &sr.Series[i]; s.Route == w.route && s.Model == w.model && s.Team == "*" {
			return s
		}
	}
	return nil
}

// statusError is an answer other than 200.
type statusError struct {
	where string
	code  int
}

func (e *statusError) Error() string { return fmt.Sprintf("bench: %s: status %d", e.where, e.code) }

// fetch GETs u (a query of where) into the JSON document dst, trying again
// after a 503.
func (w *GatewayWatch) fetch(ctx context.Context, where, u string, dst any) error {
	for try := 1; ; try++ {
		wait, err := w.get(ctx, where, u, dst)
		if wait == 0 || try == statsTries {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("bench: %s: %w", redact(where), ctx.Err())
		}
	}
}

// get GETs u once. A 503 comes with how long to wait before the next try.
func (w *GatewayWatch) get(ctx context.Context, where, u string, dst any) (wait time.Duration, err error) {
	ctx, cancel := context.WithTimeout(ctx, statsTimeout)
	defer cancel()
	where = redact(where)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, fmt.Errorf("bench: %s: %w", where, err)
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "tollgate-bench")
	resp, err := w.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // it quotes the URL
		}
		return 0, fmt.Errorf("bench: %s: %w", where, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, statsBodyCap))
	if err != nil {
		return 0, fmt.Errorf("bench: %s: reading the answer: %w", where, err)
	}
	if resp.StatusCode != http.StatusOK {
		err := &statusError{where: where, code: resp.StatusCode}
		if resp.StatusCode == http.StatusServiceUnavailable {
			wait, ok := retryhint.Parse(resp.Header, time.Now())
			if !ok {
				wait = retryAfterDef
			}
			return min(max(wait, statsPoll), statsMaxWait), err
		}
		return 0, err
	}
	if err := json.Unmarshal(body, dst); err != nil {
		return 0, fmt.Errorf("bench: %s: %w", where, errNotStats)
	}
	return 0, nil
}

// redact returns raw without its credentials.
func redact(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		return u.Redacted()
	}
	return "the stats URL"
}

// GatewayStats are a tollgate's own figures for a run, fetched from its
// /stats after the run, beside the client's. Counts (requests, tokens, cost,
// goodput) are the run's alone, from the gateway's series (see Counts); the
// quantiles cannot be differenced and are the whole window's, so they
// include requests not from the run when OtherTraffic is set.
type GatewayStats struct {
	// StatsURL is the /stats query made after the run.
	StatsURL string `json:"stats_url"`
	Route    string `json:"route"`
	Model    string `json:"model"`
	// Window is the smallest window sure to hold the whole run ("" when
	// the run is longer than any window holds); WindowSeconds is the span
	// it covered, as the gateway reported it, and WindowRequests the
	// requests in it after the run.
	Window         string  `json:"window"`
	WindowSeconds  float64 `json:"window_seconds"`
	WindowRequests int64   `json:"window_requests"`
	// RelativeError is the sketch's bound on the gateway's quantiles.
	RelativeError float64 `json:"relative_error"`
	// Note says why there are no gateway figures, when Group is nil.
	Note string `json:"note,omitempty"`
	// Group is the window's group for Route and Model, teams merged, as
	// fetched after the run; Before is the same before the run (nil when it
	// had none).
	Group  *gwstats.Group `json:"group"`
	Before *gwstats.Group `json:"before"`

	// Counts says where Run comes from. "series": /stats/series?window=1h
	// (one-minute slices), the slices from the one current at the read
	// before the run to the last, less that first slice's counts before
	// the run; exact, whatever leaves the window meanwhile. "window" (a
	// gateway without /stats/series): the window's counts after the run
	// less before it, wrong when requests counted before the run leave
	// the window during it.
	Counts string `json:"counts"`
	// RequestsBefore and RequestsAfter are the request counts Run.Requests
	// is the difference of.
	RequestsBefore int64 `json:"requests_before"`
	RequestsAfter  int64 `json:"requests_after"`
	// Run holds the counts of the run.
	Run GatewayRun `json:"run"`
	// CountsUnreliable is set when Run may be wrong, and CountsNote says
	// why: without a series, the window held requests before the run; or
	// the series lost the run's first minute or a count went down (the
	// gateway restarted). Run's counts are never below zero.
	CountsUnreliable bool   `json:"counts_unreliable"`
	CountsNote       string `json:"counts_note,omitempty"`
	// ClientAttempts counts the HTTP requests the client sent: its
	// requests and their retries, each of which the gateway counts.
	ClientAttempts int `json:"client_attempts"`
	// OtherTraffic is set when the window's figures are not this run's
	// alone: the window holds more requests than the run, or the gateway
	// counted a number of requests during the run other than
	// ClientAttempts.
	OtherTraffic bool `json:"other_traffic"`
	// Covered is false when the window misses part of the run: it reaches
	// back less far than the run's start (the gateway restarted during
	// the run), or holds fewer requests than the run's.
	Covered bool `json:"covered"`
	// RunSeconds is the time from the run's start to the fetch.
	RunSeconds float64 `json:"run_seconds"`
	// Runs counts the runs compared: 1, or the levels or stages run.
	Runs int `json:"runs"`
	// Client are the client's figures over every request of the runs
	// compared, pooled.
	Client Summary `json:"client"`
}

// GatewayRun are the gateway's counts for the run (see GatewayStats.Counts).
type GatewayRun struct {
	Requests     int64            `json:"requests"`
	InputTokens  int64            `json:"input_tokens"`
	OutputTokens int64            `json:"output_tokens"`
	CostUSD      float64          `json:"cost_usd"`
	Good         int64            `json:"goodput_good"`
	Total        int64            `json:"goodput_total"`
	Ratio        float64          `json:"goodput_ratio"`
	Rejections   map[string]int64 `json:"rejections"`
}

// Finish fetches /stats after runs (one run, or the levels or stages of
// one, in order) and returns the gateway's figures for them. It picks the
// window from the time since the first run began (see GatewayStats); when
// no window holds the runs it fetches nothing and says so in Note. It fails
// when /stats cannot be fetched.
func (w *GatewayWatch) Finish(ctx context.Context, runs ...*Result) (*GatewayStats, error) {
	if len(runs) == 0 {
		return nil, errors.New("bench: gateway stats: no run")
	}
	var samples []*Sample
	var d time.Duration
	attempts := 0
	for _, r := range runs {
		d += r.Duration
		for i := range r.Samples {
			samples = append(samples, &r.Samples[i])
			attempts += r.Samples[i].Attempts
		}
	}
	gs := &GatewayStats{
		StatsURL: redact(w.query(w.url, "")), Route: w.route, Model: w.model,
		RelativeError: w.before.Sketch.RelativeError, ClientAttempts: attempts, Runs: len(runs),
		Client: summarizeClass(ClassAll, samples, runs[0].SLO, d),
	}
	since := time.Since(runs[0].Started)
	gs.RunSeconds = since.Seconds()
	gs.Window = pickWindow(since)
	if gs.Window == "" {
		gs.Note = fmt.Sprintf("the run took %s; /stats windows reach back an hour at most, so the gateway's figures do not cover it",
			since.Round(time.Second))
		return gs, nil
	}
	gs.StatsURL = redact(w.query(w.url, gs.Window))

	settle := time.Now().Add(statsSettle)
	last, stable := int64(-1), 0
	for {
		if err := w.count(ctx, gs, since); err != nil {
			return nil, err
		}
		if gs.RequestsAfter == last {
			stable++
		} else {
			last, stable = gs.RequestsAfter, 0
		}
		if gs.Run.Requests >= int64(attempts) || stable == statsStable || time.Now().After(settle) {
			break
		}
		t := time.NewTimer(statsPoll)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("bench: %s: %w", redact(w.url), ctx.Err())
		}
	}
	if w.series {
		// After the counts, so that the window holds every request they
		// do, and any more is other traffic.
		rep, err := w.fetchReport(ctx, gs.Window)
		if err != nil {
			return nil, err
		}
		gs.fillWindow(w.before, rep, time.Since(runs[0].Started))
	}
	gs.judge()
	return gs, nil
}

// count sets the run's counts: from the series or, without one, from the
// window, whose figures it then sets too; since is the time from the run's
// start.
func (w *GatewayWatch) count(ctx context.Context, gs *GatewayStats, since time.Duration) error {
	if !w.series {
		rep, err := w.fetchReport(ctx, gs.Window)
		if err != nil {
			return err
		}
		gs.fillWindow(w.before, rep, since)
		var b, a counts
		if gs.Before != nil {
			b = countsOf(&gs.Before.Figures)
		}
		if gs.Group != nil {
			a = countsOf(&gs.Group.Figures)
		}
		gs.Counts = "window"
		gs.setRun(a, b)
		if b.requests > 0 {
			gs.CountsUnreliable = true
			gs.CountsNote = fmt.Sprintf("the gateway has no /stats/series, so they are the %s window's after the run less before it, "+
				"and the %d requests it held before the run may have left it during the run", gs.Window, b.requests)
		}
		return nil
	}
	sr, err := w.fetchSeries(ctx)
	if errors.Is(err, errNoSeries) {
		err = fmt.Errorf("bench: %s: no series after the run", redact(w.url+"/series"))
	}
	if err != nil {
		return err
	}
	gs.RelativeError = sr.Sketch.RelativeError
	var a counts
	// A zero from counts every point: the group had nothing before.
	found := w.from.IsZero()
	if s := w.findSeries(sr); s != nil {
		for i := range s.Points {
			p := &s.Points[i]
			if p.Start.Before(w.from) {
				continue
			}
			found = found || p.Start.Equal(w.from)
			a.add(countsOf(&p.Figures))
		}
	}
	b := w.first
	if !found {
		// The slice that held the counts before the run is gone: the
		// gateway restarted (its slices are aligned on its start), and
		// the points are all after that.
		b = counts{}
	}
	gs.Counts = "series"
	gs.setRun(a, b)
	if !found {
		gs.CountsUnreliable = true
		gs.CountsNote = "the minute the run began is no longer in the gateway's series (it restarted?): they miss the run's requests before that"
	}
	return nil
}

// fillWindow sets the window's figures from the reports before and after
// the run; since is the time from the run's start to the after report.
func (gs *GatewayStats) fillWindow(before, after *gwstats.Report, since time.Duration) {
	gs.RelativeError = after.Sketch.RelativeError
	gs.Group, gs.Before, gs.WindowSeconds, gs.WindowRequests = nil, nil, 0, 0
	win := findWindow(after, gs.Window)
	if win != nil {
		gs.WindowSeconds = win.Seconds
		gs.Group = findGroup(win, gs.Route, gs.Model)
	}
	if bw := findWindow(before, gs.Window); bw != nil {
		gs.Before = findGroup(bw, gs.Route, gs.Model)
	}
	if gs.Group != nil {
		gs.WindowRequests = gs.Group.Requests
	}
	// The window's span is measured up to the gateway's snapshot, which
	// is before the answer arrives; a second absorbs the rest.
	gs.Covered = win != nil && gs.WindowSeconds+1 >= since.Seconds()
	gs.Note = ""
	if gs.Group == nil {
		gs.Note = fmt.Sprintf("the gateway has no figures for route %s, model %q in the %s window "+
			"(a model outside its metrics.models list is counted as \"other\")", gs.Route, gs.Model, gs.Window)
	}
}

// judge sets OtherTraffic and Covered from the window's and the run's
// request counts, once both are set.
func (gs *GatewayStats) judge() {
	gs.OtherTraffic = gs.WindowRequests > gs.Run.Requests || gs.Run.Requests != int64(gs.ClientAttempts)
	gs.Covered = gs.Covered && gs.WindowRequests >= gs.Run.Requests
}

// counts are the exact counts of a span of the gateway's figures.
type counts struct {
	requests, input, output, micros, good, total int64
	rejections                                   map[string]int64
}

func countsOf(f *gwstats.Figures) counts {
	c := counts{requests: f.Requests, input: f.InputTokens, output: f.OutputTokens,
		// The gateway counts micro-dollars: round off the float noise.
		micros: int64(math.Round(f.CostUSD * 1e6)),
		good:   f.Goodput.Good, total: f.Goodput.Total}
	if len(f.Rejections) > 0 {
		c.rejections = maps.Clone(f.Rejections)
	}
	return c
}

func (c *counts) add(o counts) {
	c.requests += o.requests
	c.input += o.input
	c.output += o.output
	c.micros += o.micros
	c.good += o.good
	c.total += o.total
	for reason, n := range o.rejections {
		if c.rejections == nil {
			c.rejections = map[string]int64{}
		}
		c.rejections[reason] += n
	}
}

// setRun sets Run to a less b, each count at least zero: a count that went
// down (the gateway restarted, or, without a series, requests left the
// window) makes the counts unreliable rather than negative.
func (gs *GatewayStats) setRun(a, b counts) {
	gs.RequestsBefore, gs.RequestsAfter = b.requests, a.requests
	gs.CountsUnreliable, gs.CountsNote = false, ""
	down := false
	diff := func(a, b int64) int64 {
		if a < b {
			down = true
			return 0
		}
		return a - b
	}
	gs.Run = GatewayRun{
		Requests:     diff(a.requests, b.requests),
		InputTokens:  diff(a.input, b.input),
		OutputTokens: diff(a.output, b.output),
		CostUSD:      float64(diff(a.micros, b.micros)) / 1e6,
		Good:         diff(a.good, b.good),
		Total:        diff(a.total, b.total),
		Rejections:   map[string]int64{},
	}
	if gs.Run.Good > gs.Run.Total {
		gs.Run.Good, down = gs.Run.Total, true
	}
	if gs.Run.Total > 0 {
		gs.Run.Ratio = float64(gs.Run.Good) / float64(gs.Run.Total)
	}
	for reason := range b.rejections {
		if _, ok := a.rejections[reason]; !ok {
			down = true
		}
	}
	for reason, n := range a.rejections {
		if n = diff(n, b.rejections[reason]); n != 0 {
			gs.Run.Rejections[reason] = n
		}
	}
	if down {
		gs.CountsUnreliable = true
		gs.CountsNote = "a count went down between the reads before and after the run (the gateway restarted?)"
	}
}

func findWindow(rep *gwstats.Report, name string) *gwstats.Window {
	for i := range rep.Windows {
		if rep.Windows[i].Name == name {
			return &rep.Windows[i]
		}
	}
	return nil
}

// findGroup returns the window's group for route and model with teams
// merged (team "*").
func findGroup(w *gwstats.Window, route, model string) *gwstats.Group {
	for i := range w.Groups {
		if g := &w.Groups[i]; g.Route == route && g.Model == model && g.Team == "*" {
			return g
		}
	}
	return nil
}

// writeTable writes the side-by-side section of the table report.
func (gs *GatewayStats) writeTable(b *strings.Builder) error {
	all := ""
	if gs.Runs > 1 {
		all = fmt.Sprintf(", all %d runs together", gs.Runs)
	}
	fmt.Fprintf(b, "\nclient vs gateway%s (/stats window %s, route %s, model %s)\n", all, orDash(gs.Window), gs.Route, gs.Model)
	if gs.Group == nil {
		fmt.Fprintf(b, "no gateway figures: %s\n", gs.Note)
		return nil
	}
	g := &gs.Group.Figures
	c := &gs.Client
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\tclient\t\t\t\tgateway\t\t\t\t")
	fmt.Fprintln(tw, "ms\tP50\tP95\tP99\tmean\tP50\tP95\tP99\tmean\t")
	for _, f := range []struct {
		name string
		c    *Stats
		g    *gwstats.Quantiles
	}{
		{"TTFT", &c.TTFT, &g.TTFT}, {"TPOT", &c.TPOT, &g.TPOT}, {"ITL", &c.ITL, &g.ITL},
		{"E2E", &c.E2E, &g.E2E}, {"overhead", nil, &g.Overhead},
	} {
		fmt.Fprint(tw, f.name)
		if f.c == nil {
			fmt.Fprint(tw, "\t-\t-\t-\t-")
		} else {
			for _, v := range []float64{f.c.Median, f.c.P95, f.c.P99, f.c.Mean} {
				fmt.Fprint(tw, "\t", msCell(f.c, v))
			}
		}
		for _, v := range []float64{f.g.P50, f.g.P95, f.g.P99, f.g.Mean} {
			cell := "-"
			if f.g.Count > 0 {
				cell = fmt.Sprintf("%.2f", v)
			}
			fmt.Fprint(tw, "\t", cell)
		}
		fmt.Fprintln(tw, "\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	b.WriteByte('\n')

	tw = tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\tclient\tgateway\t")
	sent := fmt.Sprintf("%d sent", gs.ClientAttempts)
	if gs.ClientAttempts != c.Requests {
		sent = fmt.Sprintf("%d sent (%d requests + %d retries)", gs.ClientAttempts, c.Requests, gs.ClientAttempts-c.Requests)
	}
	fmt.Fprintf(tw, "requests\t%s\t%d counted\t\n", sent, gs.Run.Requests)
	fmt.Fprintf(tw, "goodput\t%d/%d (%.1f%%)\t%d/%d (%.1f%%)\t\n",
		c.Goodput.Good, c.Requests, 100*c.Goodput.Ratio, gs.Run.Good, gs.Run.Total, 100*gs.Run.Ratio)
	fmt.Fprintf(tw, "output tokens\t%d\t%d\t\n", c.OutputTokens, gs.Run.OutputTokens)
	fmt.Fprintf(tw, "cost USD\t-\t%.6f\t\n", gs.Run.CostUSD)
	if len(gs.Run.Rejections) > 0 {
		fmt.Fprintf(tw, "rejected\t-\t%s\t\n", countsText(gs.Run.Rejections))
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	if gs.Counts == "series" {
		fmt.Fprintf(b, "gateway counts: /stats/series (1 min slices) from the minute the run began, less that minute's before the run (%d − %d); "+
			"its quantiles: the whole window's (%.0f s, %d requests), ±%.0f%% (sketch).\n",
			gs.RequestsAfter, gs.RequestsBefore, gs.WindowSeconds, gs.WindowRequests, 100*gs.RelativeError)
	} else {
		fmt.Fprintf(b, "gateway counts: the window's after the run less before it (%d − %d); its quantiles: the whole window's (%.0f s), ±%.0f%% (sketch).\n",
			gs.RequestsAfter, gs.RequestsBefore, gs.WindowSeconds, 100*gs.RelativeError)
	}
	if gs.CountsUnreliable {
		fmt.Fprintf(b, "WARNING: the gateway's counts for the run are unreliable: %s.\n", gs.CountsNote)
	}
	switch {
	case gs.WindowSeconds+1 < gs.RunSeconds:
		fmt.Fprintf(b, "WARNING: the window reaches back %.0f s but the run began %.0f s before the fetch (the gateway restarted?): its quantiles miss part of the run.\n",
			gs.WindowSeconds, gs.RunSeconds)
	case gs.WindowRequests < gs.Run.Requests:
		fmt.Fprintf(b, "WARNING: the %s window holds %d of the run's %d requests: its quantiles miss the others.\n",
			gs.Window, gs.WindowRequests, gs.Run.Requests)
	case gs.WindowRequests > gs.Run.Requests:
		fmt.Fprintf(b, "WARNING: other traffic: the %s window holds %d requests, %d of them from the run; the gateway's quantiles include the others.\n",
			gs.Window, gs.WindowRequests, gs.Run.Requests)
	}
	switch {
	case gs.Run.Requests > int64(gs.ClientAttempts):
		fmt.Fprintf(b, "WARNING: other traffic: the gateway counted %d requests during the run, the client sent %d; its counts and quantiles include requests not from this run.\n",
			gs.Run.Requests, gs.ClientAttempts)
	case gs.Run.Requests < int64(gs.ClientAttempts):
		fmt.Fprintf(b, "WARNING: the gateway counted %d of the %d requests sent (connection failures, or replicas that each report their own).\n",
			gs.Run.Requests, gs.ClientAttempts)
	}
	b.WriteString("Why they differ: the client's times include the network and its own reading of the stream; the gateway's\n" +
		"run from the request's arrival to the first (TTFT) or last (E2E) byte written to the client, and its TPOT and\n" +
		"ITL from tokens as read from the upstream. Goodput: the client's against -slo-*, the gateway's against its [slo].\n")
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// countsText lists counts by name in name order, e.g. "rpm:2 tpm:1".
func countsText(m map[string]int64) string {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	slices.Sort(names)
	parts := make([]string, len(names))
	for i, k := range names {
		parts[i] = fmt.Sprintf("%s:%d", k, m[k])
	}
	return strings.Join(parts, " ")
}
