package bench

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"time"

	gwstats "github.com/tollgate-llm/tollgate/stats"
)

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

// How Finish waits for the gateway's counts. A record reaches /stats after
// the gateway has written the request's last byte, so the client can finish
// before the gateway has counted it: Finish asks again, every statsPoll,
// while the gateway has counted fewer requests than were sent, until the
// count has not moved for statsStable polls (the requests it lacks are not
// coming: connection failures, other replicas, a model counted as "other")
// or statsSettle has passed. statsPoll is also the shortest wait after a 503.
const (
	statsPoll   = 100 * time.Millisecond
	statsStable = 3
	statsSettle = 2 * time.Second
)

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

// judge sets OtherTraffic and Covered from the window's and the run's
// request counts, once both are set.
func (gs *GatewayStats) judge() {
	gs.OtherTraffic = gs.WindowRequests > gs.Run.Requests || gs.Run.Requests != int64(gs.ClientAttempts)
	gs.Covered = gs.Covered && gs.WindowRequests >= gs.Run.Requests
}
