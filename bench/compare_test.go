package bench_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/bench"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/stats"
)

// fakeGateway is a tollgate's /stats and /stats/series (the real handler)
// on a clock the test moves.
type fakeGateway struct {
	t0  time.Time
	url string // the /stats URL

	mu  sync.Mutex
	now time.Time
	w   *stats.Windows
}

// newFakeGateway serves the stats of a gateway started at t0; series false
// answers /stats/series 404, as a gateway from before it did.
func newFakeGateway(t *testing.T, series bool) *fakeGateway {
	t.Helper()
	g := &fakeGateway{t0: time.Unix(1_700_000_000, 0)}
	g.now = g.t0
	g.w = stats.New(g.clock)
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if !series && strings.HasSuffix(r.URL.Path, "/series") {
			http.NotFound(rw, r)
			return
		}
		g.windows().ServeHTTP(rw, r)
	}))
	t.Cleanup(srv.Close)
	g.url = srv.URL + "/stats"
	return g
}

func (g *fakeGateway) clock() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.now
}

func (g *fakeGateway) windows() *stats.Windows {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.w
}

// restart starts the gateway's figures anew, at the current time.
func (g *fakeGateway) restart() {
	w := stats.New(g.clock)
	g.mu.Lock()
	g.w = w
	g.mu.Unlock()
}

// at sets the gateway's clock to d after its start.
func (g *fakeGateway) at(d time.Duration) {
	g.mu.Lock()
	g.now = g.t0.Add(d)
	g.mu.Unlock()
}

// serve records n successful chat requests for model "gpt" at the current
// time, each with 3 output tokens and costing one micro-dollar.
func (g *fakeGateway) serve(n int) {
	for range n {
		now := g.clock()
		rec := &llm.Record{Route: llm.RouteChatCompletions, Team: "a", Outcome: llm.OutcomeOK, Status: 200,
			Usage: llm.Usage{Output: 3, HasOutput: true}, CostMicros: 1}
		rec.Timing.In, rec.Timing.End = now.Add(-time.Millisecond), now
		g.windows().Observe(rec, "gpt")
	}
}

// batch is n requests at t after the gateway's start.
type batch struct {
	t time.Duration
	n int
}

// runOf is a finished run of n requests, one attempt each, that began 25 s
// ago by the client's clock: the 1m window is the one chosen.
func runOf(n int) *bench.Result {
	res := &bench.Result{Started: time.Now().Add(-25 * time.Second), Duration: 20 * time.Second,
		Samples: make([]bench.Sample, n)}
	for i := range res.Samples {
		res.Samples[i] = bench.Sample{Index: i, Attempts: 1, Status: 200}
	}
	return res
}

// TestGatewayCountsFromSeries: the run's counts come from /stats/series, so
// they are exact whatever the quantiles' window held before the run or lost
// during it; the window's own count says whether its quantiles are the
// run's alone.
func TestGatewayCountsFromSeries(t *testing.T) {
	for _, c := range []struct {
		name            string
		earlier         []batch // traffic before the first read
		before          time.Duration
		run             []batch
		after           time.Duration
		want            int64 // the run's requests
		other, covered  bool
		warning, absent string
	}{
		// An earlier run (100 requests at 1 s) is in the 1m window at
		// the first read, and out of it at the second: "after less
		// before" gave −90.
		{name: "earlier traffic leaves the window", earlier: []batch{{time.Second, 100}}, before: 45 * time.Second,
			run: []batch{{50 * time.Second, 10}}, after: 61 * time.Second, want: 10, covered: true,
			absent: "WARNING"},
		// The run starts in the minute of the earlier traffic and ends
		// in the next.
		{name: "run across a minute", earlier: []batch{{time.Second, 100}}, before: 45 * time.Second,
			run: []batch{{50 * time.Second, 10}, {65 * time.Second, 5}}, after: 70 * time.Second, want: 15, covered: true,
			absent: "WARNING"},
		// The earlier traffic is still in the window after the run: the
		// counts are the run's, the quantiles are not.
		{name: "earlier traffic in the window", earlier: []batch{{20 * time.Second, 100}}, before: 45 * time.Second,
			run: []batch{{50 * time.Second, 10}}, after: 61 * time.Second, want: 10, other: true, covered: true,
			warning: "WARNING: other traffic: the 1m window holds 110 requests, 10 of them from the run"},
		// The window reaches back 55 s; the run's first requests ended
		// 75 s before the read.
		{name: "window misses the run's start", before: 5 * time.Second,
			run: []batch{{50 * time.Second, 10}, {120 * time.Second, 5}}, after: 125 * time.Second, want: 15,
			warning: "WARNING: the 1m window holds 5 of the run's 15 requests"},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := newFakeGateway(t, true)
			for _, b := range c.earlier {
				g.at(b.t)
				g.serve(b.n)
			}
			g.at(c.before)
			w, err := bench.WatchGateway(t.Context(), g.url, bench.Config{Model: "gpt"}, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range c.run {
				g.at(b.t)
				g.serve(b.n)
			}
			g.at(c.after)
			gs, err := w.Finish(t.Context(), runOf(int(c.want)))
			if err != nil {
				t.Fatal(err)
			}
			if gs.Window != "1m" || gs.Group == nil {
				t.Fatalf("window %q, group %v; want 1m and the group", gs.Window, gs.Group)
			}
			if r := gs.Run; r.Requests != c.want || r.OutputTokens != 3*c.want || r.CostUSD != float64(c.want)/1e6 ||
				r.Total != c.want {
				t.Errorf("run %+v; want %d requests, %d output tokens, %d µ$, goodput total %d",
					r, c.want, 3*c.want, c.want, c.want)
			}
			if gs.OtherTraffic != c.other || gs.Covered != c.covered {
				t.Errorf("other traffic %v, covered %v; want %v, %v", gs.OtherTraffic, gs.Covered, c.other, c.covered)
			}
			if gs.Counts != "series" || gs.CountsUnreliable || gs.WindowRequests != gs.Group.Requests {
				t.Errorf("counts from %q, unreliable %v (%s), window requests %d of the group's %d; want series, reliable",
					gs.Counts, gs.CountsUnreliable, gs.CountsNote, gs.WindowRequests, gs.Group.Requests)
			}
			res := runOf(int(c.want))
			res.Gateway = gs
			var b strings.Builder
			if err := res.WriteTable(&b); err != nil {
				t.Fatal(err)
			}
			table := b.String()
			if want := "  " + strconv.FormatInt(c.want, 10) + " counted"; !strings.Contains(table, want) {
				t.Errorf("table lacks %q:\n%s", want, table)
			}
			if c.warning != "" && !strings.Contains(table, c.warning) {
				t.Errorf("table lacks %q:\n%s", c.warning, table)
			}
			if c.absent != "" && strings.Contains(table, c.absent) {
				t.Errorf("table has %q:\n%s", c.absent, table)
			}
		})
	}
}

// watchRun reads g's stats before the run (at before), serves the run's
// batches, and reads them after (at after).
func watchRun(t *testing.T, g *fakeGateway, before time.Duration, run []batch, after time.Duration, between func()) *bench.GatewayStats {
	t.Helper()
	g.at(before)
	w, err := bench.WatchGateway(t.Context(), g.url, bench.Config{Model: "gpt"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if between != nil {
		between()
	}
	n := 0
	for _, b := range run {
		g.at(b.t)
		g.serve(b.n)
		n += b.n
	}
	g.at(after)
	gs, err := w.Finish(t.Context(), runOf(n))
	if err != nil {
		t.Fatal(err)
	}
	return gs
}

// tableOf is the table report of gs's run.
func tableOf(t *testing.T, gs *bench.GatewayStats) string {
	t.Helper()
	res := runOf(gs.ClientAttempts)
	res.Gateway = gs
	var b strings.Builder
	if err := res.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestGatewayCountsWithoutSeries: a gateway without /stats/series is read
// the older way, after less before in the window: exact on a window empty
// before the run; otherwise flagged unreliable, and never below zero.
func TestGatewayCountsWithoutSeries(t *testing.T) {
	g := newFakeGateway(t, false)
	gs := watchRun(t, g, 5*time.Second, []batch{{10 * time.Second, 10}}, 30*time.Second, nil)
	if gs.Counts != "window" || gs.Run.Requests != 10 || gs.CountsUnreliable || gs.OtherTraffic || !gs.Covered {
		t.Errorf("empty window: %+v; want 10 requests from the window, reliable", gs)
	}

	// TestGatewayCountsFromSeries's first case: 100 requests at 1 s are
	// in the window before the run and out of it after.
	g = newFakeGateway(t, false)
	g.at(time.Second)
	g.serve(100)
	gs = watchRun(t, g, 45*time.Second, []batch{{50 * time.Second, 10}}, 61*time.Second, nil)
	if gs.Counts != "window" || !gs.CountsUnreliable || !strings.Contains(gs.CountsNote, "no /stats/series") {
		t.Errorf("counts from %q, unreliable %v (%q); want window, unreliable, and why", gs.Counts, gs.CountsUnreliable, gs.CountsNote)
	}
	if r := gs.Run; r.Requests != 0 || r.OutputTokens != 0 || r.CostUSD != 0 || r.Good != 0 || r.Total != 0 {
		t.Errorf("run %+v; want every count at zero, none below", r)
	}
	table := tableOf(t, gs)
	for _, want := range []string{"  0 counted", "WARNING: the gateway's counts for the run are unreliable: the gateway has no /stats/series"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	if strings.Contains(table, "-9") {
		t.Errorf("table shows a negative count:\n%s", table)
	}
}

// TestGatewayCountsRestart: a gateway that restarted during the run has
// lost the minute the run began; the counts since are taken whole and
// flagged, and the window is flagged short.
func TestGatewayCountsRestart(t *testing.T) {
	g := newFakeGateway(t, true)
	g.at(time.Second)
	g.serve(100)
	gs := watchRun(t, g, 45*time.Second, []batch{{80 * time.Second, 10}}, 90*time.Second, func() {
		g.at(70 * time.Second)
		g.restart()
	})
	if gs.Counts != "series" || gs.Run.Requests != 10 || gs.RequestsBefore != 0 || !gs.CountsUnreliable || gs.Covered {
		t.Errorf("%+v; want the 10 requests since the restart, unreliable, not covered", gs)
	}
	table := tableOf(t, gs)
	for _, want := range []string{"WARNING: the gateway's counts for the run are unreliable: the minute the run began is no longer",
		"WARNING: the window reaches back 20 s"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
}
