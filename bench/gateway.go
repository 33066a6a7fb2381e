package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
// as it is when its path already ends in /stats. Its query is dropped:
// WatchGateway sets it.
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
	u.Path, u.RawPath, u.RawQuery, u.Fragment = path, "", "", ""
	return u.String(), nil
}

// GatewayWatch reads a tollgate's /stats around a run, to put the gateway's
// own figures for the run beside the client's. It never sends the API key:
// /stats is public on the serving port.
type GatewayWatch struct {
	url          string // /stats, without a query
	route, model string
	client       *http.Client
	before       *gwstats.Report
}

// WatchGateway fetches statsURL (see StatsURL) once before a run of cfg: it
// asks for cfg's route (chat_completions or messages) and model, teams
// merged, in every window, since the window is chosen from the run's
// duration once it is known. It fails when the answer is not a tollgate's
// /stats report. client nil means a client of its own.
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
	w := &GatewayWatch{url: statsURL, route: route.String(), model: cfg.Model, client: client}
	rep, err := w.fetch(ctx, "")
	if err != nil {
		return nil, err
	}
	w.before = rep
	return w, nil
}

// query returns the /stats URL for window ("" for all).
func (w *GatewayWatch) query(window string) string {
	q := url.Values{}
	q.Set("route", w.route)
	q.Set("model", w.model)
	q.Set("merge", "team")
	if window != "" {
		q.Set("window", window)
	}
	return w.url + "?" + q.Encode()
}

// fetch GETs /stats for window, trying again after a 503.
func (w *GatewayWatch) fetch(ctx context.Context, window string) (*gwstats.Report, error) {
	for try := 1; ; try++ {
		rep, wait, err := w.get(ctx, window)
		if wait == 0 || try == statsTries {
			return rep, err
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("bench: %s: %w", redact(w.url), ctx.Err())
		}
	}
}

// get GETs /stats once. A 503 comes with how long to wait before the next
// try.
func (w *GatewayWatch) get(ctx context.Context, window string) (rep *gwstats.Report, wait time.Duration, err error) {
	ctx, cancel := context.WithTimeout(ctx, statsTimeout)
	defer cancel()
	where := redact(w.url)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.query(window), nil)
	if err != nil {
		return nil, 0, fmt.Errorf("bench: %s: %w", where, err)
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "tollgate-bench")
	resp, err := w.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // it quotes the URL, credentials included
		}
		return nil, 0, fmt.Errorf("bench: %s: %w", where, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, statsBodyCap))
	if err != nil {
		return nil, 0, fmt.Errorf("bench: %s: reading the answer: %w", where, err)
	}
	if resp.StatusCode != http.StatusOK {
		err := fmt.Errorf("bench: %s: status %d", where, resp.StatusCode)
		if resp.StatusCode == http.StatusServiceUnavailable {
			wait, ok := retryhint.Parse(resp.Header, time.Now())
			if !ok {
				wait = retryAfterDef
			}
			return nil, min(max(wait, statsPoll), statsMaxWait), err
		}
		return nil, 0, err
	}
	rep = new(gwstats.Report)
	if err := json.Unmarshal(body, rep); err != nil || rep.Sketch.Kind == "" {
		return nil, 0, fmt.Errorf("bench: %s: not a tollgate /stats report", where)
	}
	return rep, 0, nil
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
// goodput) are the window's after the run less before it; the quantiles
// cannot be differenced and are the whole window's, so they include
// requests not from the run when OtherTraffic is set.
type GatewayStats struct {
	// StatsURL is the query made after the run, credentials redacted.
	StatsURL string `json:"stats_url"`
	Route    string `json:"route"`
	Model    string `json:"model"`
	// Window is the smallest window sure to hold the whole run ("" when
	// the run is longer than any window holds); WindowSeconds is the span
	// it covered, as the gateway reported it.
	Window        string  `json:"window"`
	WindowSeconds float64 `json:"window_seconds"`
	// RelativeError is the sketch's bound on the gateway's quantiles.
	RelativeError float64 `json:"relative_error"`
	// Note says why there are no gateway figures, when Group is nil.
	Note string `json:"note,omitempty"`
	// Group is the window's group for Route and Model, teams merged, as
	// fetched after the run; Before is the same before the run (nil when it
	// had none).
	Group  *gwstats.Group `json:"group"`
	Before *gwstats.Group `json:"before"`

	RequestsBefore int64 `json:"requests_before"`
	RequestsAfter  int64 `json:"requests_after"`
	// Run holds the counts of the run: after less before.
	Run GatewayRun `json:"run"`
	// ClientAttempts counts the HTTP requests the client sent: its
	// requests and their retries, each of which the gateway counts.
	ClientAttempts int `json:"client_attempts"`
	// OtherTraffic is set when the window's figures are not this run's
	// alone: it held requests before the run, or the gateway counted a
	// number of requests other than ClientAttempts.
	OtherTraffic bool `json:"other_traffic"`
	// Covered is false when the window reaches back less far than the
	// run's start (the gateway restarted during the run).
	Covered bool `json:"covered"`
	// RunSeconds is the time from the run's start to the fetch.
	RunSeconds float64 `json:"run_seconds"`
	// Runs counts the runs compared: 1, or the levels or stages run.
	Runs int `json:"runs"`
	// Client are the client's figures over every request of the runs
	// compared, pooled.
	Client Summary `json:"client"`
}

// GatewayRun are the gateway's counts for the run: the window's after the
// run less before it.
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
		StatsURL: redact(w.query("")), Route: w.route, Model: w.model,
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
	gs.StatsURL = redact(w.query(gs.Window))

	settle := time.Now().Add(statsSettle)
	last, stable := int64(-1), 0
	for {
		rep, err := w.fetch(ctx, gs.Window)
		if err != nil {
			return nil, err
		}
		gs.fill(w.before, rep, time.Since(runs[0].Started))
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
	return gs, nil
}

// fill sets the figures from the reports before and after the run; since
// is the time from the run's start to the after report.
func (gs *GatewayStats) fill(before, after *gwstats.Report, since time.Duration) {
	gs.RelativeError = after.Sketch.RelativeError
	gs.Group, gs.Before, gs.WindowSeconds = nil, nil, 0
	win := findWindow(after, gs.Window)
	if win != nil {
		gs.WindowSeconds = win.Seconds
		gs.Group = findGroup(win, gs.Route, gs.Model)
	}
	if bw := findWindow(before, gs.Window); bw != nil {
		gs.Before = findGroup(bw, gs.Route, gs.Model)
	}
	// The window's span is measured up to the gateway's snapshot, which
	// is before the answer arrives; a second absorbs the rest.
	gs.Covered = win != nil && gs.WindowSeconds+1 >= since.Seconds()
	gs.Note = ""
	if gs.Group == nil {
		gs.Note = fmt.Sprintf("the gateway has no figures for route %s, model %q in the %s window "+
			"(a model outside its metrics.models list is counted as \"other\")", gs.Route, gs.Model, gs.Window)
	}
	var b, a gwstats.Figures
	if gs.Before != nil {
		b = gs.Before.Figures
	}
	if gs.Group != nil {
		a = gs.Group.Figures
	}
	gs.RequestsBefore, gs.RequestsAfter = b.Requests, a.Requests
	gs.Run = GatewayRun{
		Requests:     a.Requests - b.Requests,
		InputTokens:  a.InputTokens - b.InputTokens,
		OutputTokens: a.OutputTokens - b.OutputTokens,
		// The gateway counts micro-dollars: round off the float noise.
		CostUSD:    math.Round((a.CostUSD-b.CostUSD)*1e6) / 1e6,
		Good:       a.Goodput.Good - b.Goodput.Good,
		Total:      a.Goodput.Total - b.Goodput.Total,
		Rejections: map[string]int64{},
	}
	if gs.Run.Total > 0 {
		gs.Run.Ratio = float64(gs.Run.Good) / float64(gs.Run.Total)
	}
	for reason, n := range a.Rejections {
		if n -= b.Rejections[reason]; n != 0 {
			gs.Run.Rejections[reason] = n
		}
	}
	gs.OtherTraffic = b.Requests > 0 || gs.Run.Requests != int64(gs.ClientAttempts)
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

	fmt.Fprintf(b, "gateway counts: the window's after the run less before it (%d − %d); its quantiles: the whole window's (%.0f s), ±%.0f%% (sketch).\n",
		gs.RequestsAfter, gs.RequestsBefore, gs.WindowSeconds, 100*gs.RelativeError)
	if !gs.Covered {
		fmt.Fprintf(b, "WARNING: the window reaches back %.0f s but the run began %.0f s before the fetch (the gateway restarted?): its figures miss part of the run.\n",
			gs.WindowSeconds, gs.RunSeconds)
	}
	switch {
	case gs.RequestsBefore > 0:
		fmt.Fprintf(b, "WARNING: other traffic: the window already held %d requests before the run; the gateway's quantiles include requests not from this run.\n",
			gs.RequestsBefore)
	case gs.Run.Requests > int64(gs.ClientAttempts):
		fmt.Fprintf(b, "WARNING: other traffic: the gateway counted %d requests during the run, the client sent %d; its quantiles include requests not from this run.\n",
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
