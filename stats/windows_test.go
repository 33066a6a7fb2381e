package stats

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/llm"
)

// fakeClock is a settable clock, safe for concurrent use.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// recordOpts describes a test record; times are offsets from In.
type recordOpts struct {
	route                    llm.Route
	team                     string
	stream                   bool
	upSent, first, last, end time.Duration
	noFirstOut               bool
	output                   int64
	outcome                  llm.Outcome
}

// record builds a Record ending at now, goodput classified by slo.
func record(now time.Time, o recordOpts, slo llm.SLOTargets) *llm.Record {
	in := now.Add(-o.end)
	rec := &llm.Record{Route: o.route, Team: o.team, Stream: o.stream, Outcome: o.outcome, Status: 200}
	at := func(d time.Duration) time.Time {
		if d == 0 {
			return time.Time{}
		}
		return in.Add(d)
	}
	rec.Timing = llm.Timing{In: in, UpSent: at(o.upSent), FirstToken: at(o.first), LastToken: at(o.last), End: at(o.end)}
	if !o.noFirstOut && o.first > 0 {
		rec.Timing.FirstTokenOut = at(o.first + 10*time.Microsecond)
	}
	if o.output > 0 {
		rec.Usage = llm.Usage{Output: o.output, HasOutput: true}
	}
	// The population, as the gateway decides it: refused before any
	// attempt, else by route.
	switch {
	case (o.outcome == llm.OutcomeRejected || o.outcome == llm.OutcomeBadRequest) && o.upSent == 0:
		rec.Population = llm.PopRefused
	case o.route == llm.RouteOther:
		rec.Population = llm.PopForward
	}
	rec.Goodput = slo.Classify(rec)
	return rec
}

func okStream(team string, ttft, end time.Duration, tokens int64) recordOpts {
	return recordOpts{route: llm.RouteChatCompletions, team: team, stream: true, upSent: 50 * time.Microsecond,
		first: ttft, last: end - time.Millisecond, end: end, output: tokens, outcome: llm.OutcomeOK}
}

func findWindow(t *testing.T, r Report, name string) Window {
	t.Helper()
	for _, w := range r.Windows {
		if w.Name == name {
			return w
		}
	}
	t.Fatalf("no window %q in report", name)
	return Window{}
}

func findGroup(w Window, route, model, team string) (Group, bool) {
	for _, g := range w.Groups {
		if g.Route == route && g.Model == model && g.Team == team {
			return g, true
		}
	}
	return Group{}, false
}

// TestWindowAging: a record 61 s old has left the 1m window but not the 5m
// one; 3601 s old it has left the 1h window and its group is dropped. The
// record's offset inside a slice does not matter.
func TestWindowAging(t *testing.T) {
	for off := time.Duration(0); off < sliceLong; off += 3500 * time.Millisecond {
		t.Run(off.String(), func(t *testing.T) {
			clk := newFakeClock()
			w := New(clk.now)
			clk.advance(off)
			w.Observe(record(clk.now(), okStream("a", 100*time.Millisecond, time.Second, 10), llm.SLOTargets{}), "m")

			present := func(age time.Duration) [3]bool {
				var got [3]bool
				for i, win := range w.Snapshot().Windows {
					_, got[i] = findGroup(win, "chat_completions", "m", "a")
				}
				return got
			}
			steps := []struct {
				age  time.Duration
				want [3]bool // 1m, 5m, 1h
			}{
				{0, [3]bool{true, true, true}},
				{49 * time.Second, [3]bool{true, true, true}},
				{61 * time.Second, [3]bool{false, true, true}},
				{289 * time.Second, [3]bool{false, true, true}},
				{301 * time.Second, [3]bool{false, false, true}},
				{59 * time.Minute, [3]bool{false, false, true}},
				{3601 * time.Second, [3]bool{false, false, false}},
			}
			age := time.Duration(0)
			for _, st := range steps {
				clk.advance(st.age - age)
				age = st.age
				if got := present(age); got != st.want {
					t.Errorf("age %v: in 1m/5m/1h = %v, want %v", age, got, st.want)
				}
			}
			w.mu.Lock()
			n := len(w.groups)
			w.mu.Unlock()
			if n != 0 {
				t.Errorf("%d groups kept after an idle hour", n)
			}
		})
	}
}

// TestWindowSeconds: the span is the time since start at first, then whole
// slices back from now; tokens per second divide by it.
func TestWindowSeconds(t *testing.T) {
	clk := newFakeClock()
	w := New(clk.now)
	clk.advance(5 * time.Second)
	w.Observe(record(clk.now(), okStream("a", 100*time.Millisecond, time.Second, 132), llm.SLOTargets{}), "m")

	r := w.Snapshot()
	for _, win := range r.Windows {
		if win.Seconds != 5 {
			t.Errorf("%s right after start spans %gs, want 5", win.Name, win.Seconds)
		}
	}
	g, _ := findGroup(findWindow(t, r, "1m"), "chat_completions", "m", "a")
	if g.OutputTokensPerSecond != 132.0/5 {
		t.Errorf("tokens/s = %g, want %g", g.OutputTokensPerSecond, 132.0/5)
	}

	clk.advance(61 * time.Second) // 66 s since start
	r = w.Snapshot()
	// 1m: slices 1..6 of 10 s, from 10 s; 5m and 1h: everything since start.
	want := map[string]float64{"1m": 56, "5m": 66, "1h": 66}
	for _, win := range r.Windows {
		if win.Seconds != want[win.Name] {
			t.Errorf("%s at 66s spans %gs, want %g", win.Name, win.Seconds, want[win.Name])
		}
	}
	g, _ = findGroup(findWindow(t, r, "5m"), "chat_completions", "m", "a")
	if g.OutputTokensPerSecond != 2 {
		t.Errorf("5m tokens/s = %g, want 132/66", g.OutputTokensPerSecond)
	}

	// Long after start a window spans its nominal length less at most one
	// slice (10 s for 1m and 5m, 60 s for 1h), wherever now falls.
	for range 25 {
		clk.advance(2*time.Hour + 7300*time.Millisecond)
		for _, win := range w.Snapshot().Windows {
			span := map[string][2]float64{"1m": {50, 60}, "5m": {290, 300}, "1h": {3540, 3600}}[win.Name]
			if win.Seconds <= span[0] || win.Seconds > span[1] {
				t.Errorf("%s spans %gs, want (%g, %g]", win.Name, win.Seconds, span[0], span[1])
			}
		}
	}
}

// TestWindowSpecsMatchRings: each window reads a ring of its slice width
// holding at least its slices, and the 1 min slices are made of 10 s ones.
func TestWindowSpecsMatchRings(t *testing.T) {
	g := newGroup(groupKey{}, 0)
	for _, spec := range windowSpecs {
		r := &g.rings[spec.ring]
		if r.width != int64(spec.width) || int64(len(r.slots)) < spec.slices {
			t.Errorf("window %s: ring of %v × %d, want %v × ≥ %d", spec.name, time.Duration(r.width), len(r.slots), spec.width, spec.slices)
		}
	}
	// The long ring's slices are merged from the short ring's.
	if sliceLong%sliceShort != 0 || int64(len(g.rings[0].slots)) <= shortPerLong {
		t.Errorf("%v slices are not whole %v slices, or the short ring holds too few", sliceLong, sliceShort)
	}
}

// TestMergedWindowEqualsOneSketch: values spread over many slices (and so
// compacted and merged) give the same figures as one sketch of the values
// inside the window's reported span.
func TestMergedWindowEqualsOneSketch(t *testing.T) {
	clk := newFakeClock()
	w := New(clk.now)
	type obs struct {
		at time.Duration
		v  time.Duration
	}
	var all []obs
	elapsed := time.Duration(0)
	// Mid-slice times (5 s + 10 s·k, plus sub-second steps) keep every value
	// clear of a window's edge.
	for k := range 200 {
		target := 5*time.Second + time.Duration(k)*10*time.Second
		clk.advance(target - elapsed)
		elapsed = target
		for j := range 25 {
			v := time.Duration(1+(k*37+j*11)%500) * time.Millisecond
			w.ObserveITL(llm.RouteMessages, "claude", v)
			all = append(all, obs{elapsed, v})
			clk.advance(time.Millisecond)
			elapsed += time.Millisecond
		}
	}
	r := w.Snapshot()
	for _, win := range r.Windows {
		from := elapsed - time.Duration(win.Seconds*float64(time.Second))
		want := newSketch()
		for _, o := range all {
			if o.at >= from {
				want.Add(o.v)
			}
		}
		g, ok := findGroup(win, "messages", "claude", "")
		if !ok {
			t.Fatalf("%s: no ITL group", win.Name)
		}
		if g.ITL != quantilesOf(want) {
			t.Errorf("%s: ITL %+v, want %+v", win.Name, g.ITL, quantilesOf(want))
		}
		if g.Requests != 0 || g.TTFT.Count != 0 {
			t.Errorf("%s: ITL group has requests or TTFT: %+v", win.Name, g)
		}
	}
	if n := findWindow(t, r, "1h"); n.Groups[0].ITL.Count != int64(len(all)) {
		t.Errorf("1h holds %d of %d gaps (all are under 35 min old)", n.Groups[0].ITL.Count, len(all))
	}
}

// TestGoodputAndOutcomes: counts are exact, per SLO broken first, and
// figures follow the records the metrics package counts.
func TestGoodputAndOutcomes(t *testing.T) {
	clk := newFakeClock()
	w := New(clk.now)
	slo := llm.SLOTargets{TTFT: 500 * time.Millisecond, TPOT: 20 * time.Millisecond, E2E: 5 * time.Second}
	ms := time.Millisecond
	cases := []struct {
		n    int
		opts recordOpts
	}{
		{3, okStream("a", 100*ms, time.Second, 51)},     // met; TPOT = 998 ms/50 ≈ 19.96 ms
		{2, okStream("a", 600*ms, time.Second, 51)},     // ttft
		{1, okStream("a", 100*ms, 3*time.Second, 51)},   // tpot (≈ 58 ms)
		{1, okStream("a", 100*ms, 6*time.Second, 1000)}, // e2e (TPOT ≈ 5.9 ms)
		{1, okStream("a", 600*ms, 6*time.Second, 51)},   // ttft first, though all three broke
		{2, recordOpts{route: llm.RouteChatCompletions, team: "a", stream: true, upSent: 50 * time.Microsecond, first: 100 * ms, last: 200 * ms, end: 300 * ms, output: 20, outcome: llm.OutcomeClientCancel}},
		{1, recordOpts{route: llm.RouteChatCompletions, team: "a", end: 2 * ms, outcome: llm.OutcomeRejected}},
		// Not streamed: no TTFT or TPOT, but E2E and overhead.
		{2, recordOpts{route: llm.RouteChatCompletions, team: "a", upSent: 100 * time.Microsecond, first: 0, end: 800 * ms, output: 30, outcome: llm.OutcomeOK}},
		// Streamed, first token never reached the client, one token: no TTFT, no TPOT.
		{1, recordOpts{route: llm.RouteChatCompletions, team: "a", stream: true, upSent: 50 * time.Microsecond, first: 100 * ms, last: 100 * ms, end: 400 * ms, output: 1, noFirstOut: true, outcome: llm.OutcomeUpstreamError}},
		// Other route: outcomes, not goodput.
		{4, recordOpts{route: llm.RouteOther, team: "a", upSent: 20 * time.Microsecond, end: 30 * ms, outcome: llm.OutcomeOK}},
		// Another team and no team.
		{1, okStream("b", 100*ms, time.Second, 51)},
		{1, okStream("", 100*ms, time.Second, 51)},
	}
	for _, c := range cases {
		for range c.n {
			clk.advance(100 * ms)
			w.Observe(record(clk.now(), c.opts, slo), "gpt")
		}
	}
	win := findWindow(t, w.Snapshot(), "1m")
	g, ok := findGroup(win, "chat_completions", "gpt", "a")
	if !ok {
		t.Fatalf("no group for team a: %+v", win.Groups)
	}
	if g.Requests != 14 {
		t.Errorf("requests = %d, want 14", g.Requests)
	}
	// Met: 3 streams and the 2 unstreamed answers; the refused one is no
	// model call, in no goodput figure.
	wantGood := Goodput{Good: 5, Total: 13, Ratio: 5.0 / 13,
		Broken: map[string]int64{"ttft": 3, "tpot": 1, "e2e": 1, "failed": 3}}
	if fmt.Sprint(g.Goodput) != fmt.Sprint(wantGood) {
		t.Errorf("goodput = %+v, want %+v", g.Goodput, wantGood)
	}
	wantOut := map[string]int64{"ok": 10, "client_cancel": 2, "rejected": 1, "upstream_error": 1,
		"upstream_timeout": 0, "upstream_unreachable": 0, "bad_request": 0, "gateway_shutdown": 0}
	if fmt.Sprint(g.Outcomes) != fmt.Sprint(wantOut) {
		t.Errorf("outcomes = %v, want %v", g.Outcomes, wantOut)
	}
	// TTFT: streams whose first token went out (3+2+1+1+1+2); TPOT: those
	// with ≥ 2 tokens, cancelled ones included; E2E and overhead: all but
	// the refused one (a refusal's time is not a model call's).
	for name, got := range map[string]int64{"ttft": g.TTFT.Count, "tpot": g.TPOT.Count, "e2e": g.E2E.Count, "overhead": g.Overhead.Count, "itl": g.ITL.Count} {
		want := map[string]int64{"ttft": 10, "tpot": 10, "e2e": 13, "overhead": 13, "itl": 0}[name]
		if got != want {
			t.Errorf("%s count = %d, want %d", name, got, want)
		}
	}
	// TTFT: 7 of 100.01 ms and 3 of 600.01 ms.
	if got := g.TTFT; math.Abs(got.P50-100.01) > 100.01*relativeError || math.Abs(got.P99-600.01) > 600.01*relativeError ||
		math.Abs(got.Max-600.01) > 1e-9 || math.Abs(got.Mean-(7*100.01+3*600.01)/10) > 1e-9 {
		t.Errorf("TTFT = %+v", got)
	}
	// Output tokens: 51·7 + 1000 + 20·2 + 30·2 + 1 = 1458 over the 2 s since
	// start (20 records, 100 ms apart).
	if win.Seconds != 2 {
		t.Errorf("1m spans %gs, want 2", win.Seconds)
	}
	if want := 1458.0 / 2; math.Abs(g.OutputTokensPerSecond-want) > 1e-9 {
		t.Errorf("tokens/s = %g, want %g", g.OutputTokensPerSecond, want)
	}

	other, ok := findGroup(win, "other", "gpt", "a")
	if !ok || other.Requests != 4 || other.Outcomes["ok"] != 4 || other.Goodput.Total != 0 || other.Overhead.Count != 4 ||
		other.Populations["forward"] != 4 {
		t.Errorf("other route group = %+v (found %v)", other, ok)
	}
	if b, ok := findGroup(win, "chat_completions", "gpt", "b"); !ok || b.Goodput.Good != 1 || b.Requests != 1 {
		t.Errorf("team b group = %+v", b)
	}
	if _, ok := findGroup(win, "chat_completions", "gpt", "none"); !ok {
		t.Error("a record without a team is not under team none")
	}
}

// TestITLGroups: ITL is kept per route and model, under team "", apart
// from the request groups.
func TestITLGroups(t *testing.T) {
	clk := newFakeClock()
	w := New(clk.now)
	w.Observe(record(clk.now(), okStream("a", 100*time.Millisecond, time.Second, 10), llm.SLOTargets{}), "m1")
	for i := range 10 {
		w.ObserveITL(llm.RouteChatCompletions, "m1", time.Duration(i+1)*time.Millisecond)
	}
	w.ObserveITL(llm.RouteChatCompletions, "m2", 30*time.Millisecond)
	w.ObserveITL(llm.RouteMessages, "m1", 40*time.Millisecond)
	w.ObserveITL(llm.RouteMessages, "m1", -time.Millisecond) // a clock step: counted as 0

	win := findWindow(t, w.Snapshot(), "5m")
	var keys []string
	for _, g := range win.Groups {
		keys = append(keys, g.Route+"/"+g.Model+"/"+g.Team)
	}
	want := "[chat_completions/m1/ chat_completions/m1/a chat_completions/m2/ messages/m1/]"
	if fmt.Sprint(keys) != want {
		t.Fatalf("groups %v, want %s (sorted by route, model, team)", keys, want)
	}
	g := win.Groups[0]
	// The median of 1..10 ms interpolates between 5 and 6 ms.
	if g.ITL.Count != 10 || g.ITL.Max != 10 || g.ITL.Mean != 5.5 || math.Abs(g.ITL.P50-5.5) > 5.5*relativeError {
		t.Errorf("chat/m1 ITL = %+v", g.ITL)
	}
	if win.Groups[1].ITL.Count != 0 {
		t.Error("request group got ITL")
	}
	// {0, 40 ms}: the median halfway, the exact ends at P0 and P100.
	if m := win.Groups[3].ITL; m.Count != 2 || m.Max != 40 || m.P50 != 20 {
		t.Errorf("messages/m1 ITL = %+v", m)
	}
}

// TestIdleSketchReleased: a dense sketch that stays empty for a whole slice
// is let go, and comes back on the next value.
func TestIdleSketchReleased(t *testing.T) {
	clk := newFakeClock()
	w := New(clk.now)
	w.ObserveITL(llm.RouteMessages, "m", time.Millisecond)
	g := w.groups[groupKey{route: llm.RouteMessages, model: "m"}]
	clk.advance(sliceShort)
	w.ObserveITL(llm.RouteMessages, "m", time.Millisecond) // closes slice 0, sketch reused
	if g.rings[0].cur.figs[figITL] == nil {
		t.Fatal("sketch in use was released")
	}
	clk.advance(sliceShort)
	w.Observe(&llm.Record{Route: llm.RouteMessages}, "x") // other group: no effect on g
	clk.advance(sliceShort)
	w.ObserveITL(llm.RouteMessages, "m", time.Millisecond) // closes slice 1 (used)
	if g.rings[0].cur.figs[figITL] == nil {
		t.Fatal("sketch released after a used slice")
	}
	clk.advance(sliceShort)
	w.mu.Lock()
	g.advance(w.elapsed(clk.now()))                     // closes slice 3 (used)
	g.advance(w.elapsed(clk.now()) + int64(sliceShort)) // closes slice 4 (empty)
	w.mu.Unlock()
	if g.rings[0].cur.figs[figITL] != nil {
		t.Error("sketch kept after an empty slice")
	}
	if got := findWindow(t, w.Snapshot(), "1m"); got.Groups[0].ITL.Count != 3 {
		t.Errorf("ITL count %d after release, want 3", got.Groups[0].ITL.Count)
	}
}

// TestClockBack: a clock that steps back keeps writing the current slice.
func TestClockBack(t *testing.T) {
	clk := newFakeClock()
	w := New(clk.now)
	clk.advance(30 * time.Second)
	w.ObserveITL(llm.RouteMessages, "m", time.Millisecond)
	clk.advance(-25 * time.Second)
	w.ObserveITL(llm.RouteMessages, "m", time.Millisecond)
	clk.advance(-10 * time.Second) // before start
	w.ObserveITL(llm.RouteMessages, "m", time.Millisecond)
	clk.advance(40 * time.Second)
	if g := findWindow(t, w.Snapshot(), "1m").Groups; len(g) != 1 || g[0].ITL.Count != 3 {
		t.Errorf("groups after clock steps: %+v", g)
	}
}

// TestGroupCap: past maxGroups, new groups fold into model "other".
func TestGroupCap(t *testing.T) {
	clk := newFakeClock()
	w := New(clk.now)
	for i := range maxGroups + 10 {
		w.Observe(&llm.Record{Route: llm.RouteChatCompletions, Team: "t"}, fmt.Sprint("m", i))
	}
	w.ObserveITL(llm.RouteChatCompletions, "late", time.Millisecond)
	win := findWindow(t, w.Snapshot(), "1m")
	if len(win.Groups) != maxGroups+2 {
		t.Errorf("%d groups, want %d", len(win.Groups), maxGroups+2)
	}
	if g, ok := findGroup(win, "chat_completions", "other", "other"); !ok || g.Requests != 10 {
		t.Errorf("overflow group = %+v (found %v)", g, ok)
	}
	if g, ok := findGroup(win, "chat_completions", "other", ""); !ok || g.ITL.Count != 1 {
		t.Errorf("ITL overflow group = %+v (found %v)", g, ok)
	}
}

// TestConcurrent: writers and readers together (run with -race); counts
// come out exact.
func TestConcurrent(t *testing.T) {
	clk := newFakeClock()
	w := New(clk.now)
	const writers, per = 4, 2000
	var wg sync.WaitGroup
	for i := range writers {
		wg.Go(func() {
			for j := range per {
				rec := record(clk.now(), okStream(fmt.Sprint("t", i%2), time.Duration(j+1)*time.Microsecond*100, time.Second, 3), llm.SLOTargets{})
				w.Observe(rec, "m")
				w.ObserveITL(llm.RouteChatCompletions, "m", time.Millisecond)
				if j%100 == 0 {
					clk.advance(time.Second)
				}
			}
		})
	}
	wg.Go(func() {
		for range 50 {
			_ = w.Snapshot()
		}
	})
	wg.Wait()
	var req, itl int64
	for _, g := range findWindow(t, w.Snapshot(), "5m").Groups {
		req += g.Requests
		itl += g.ITL.Count
	}
	if req != writers*per || itl != writers*per {
		t.Errorf("requests %d, ITL gaps %d, want %d each", req, itl, writers*per)
	}
}

// TestObserveITLsBatchEqualsOneByOne: a read's gaps given in one call count
// as the same gaps given one by one, negative ones as 0; an empty batch
// creates nothing.
func TestObserveITLsBatchEqualsOneByOne(t *testing.T) {
	gaps := []time.Duration{3 * time.Millisecond, 7 * time.Millisecond, -time.Millisecond, 40 * time.Millisecond}
	clk1, clk2 := newFakeClock(), newFakeClock()
	one, batch := New(clk1.now), New(clk2.now)
	for _, g := range gaps {
		one.ObserveITL(llm.RouteChatCompletions, "m", g)
	}
	batch.ObserveITLs(llm.RouteChatCompletions, "m", gaps)
	batch.ObserveITLs(llm.RouteMessages, "m", nil)
	a, b := one.Snapshot(), batch.Snapshot()
	if len(b.Windows) == 0 || len(b.Windows[0].Groups) != 1 {
		t.Fatalf("batch snapshot %+v, want one group (the empty batch creates none)", b)
	}
	for i := range a.Windows {
		ga, gb := a.Windows[i].Groups[0].ITL, b.Windows[i].Groups[0].ITL
		if ga != gb || gb.Count != int64(len(gaps)) {
			t.Errorf("%s: one by one %+v, batch %+v", a.Windows[i].Name, ga, gb)
		}
	}
}

// TestObserveAllocationFree: in steady traffic, recording a request or a
// read's gaps allocates nothing, slice after slice.
func TestObserveAllocationFree(t *testing.T) {
	clk := newFakeClock()
	w := New(clk.now)
	slo := llm.SLOTargets{TTFT: time.Second}
	recs := make([]*llm.Record, 64)
	for i := range recs {
		ttft := spreadTTFT.values(uint64(i), 1)[0]
		recs[i] = record(clk.now(), okStream("a", ttft, ttft+time.Second, 50), slo)
	}
	gaps := spreadITL.values(3, 4096)
	feed := func() {
		for _, rec := range recs {
			w.Observe(rec, "m")
		}
		for i := 0; i < len(gaps); i += 16 {
			w.ObserveITLs(llm.RouteChatCompletions, "m", gaps[i:i+16])
		}
	}
	for range 3 { // the groups, their sketches and pages, and a closed slice of each
		feed()
		clk.advance(sliceShort)
	}
	feed()
	if n := testing.AllocsPerRun(20, feed); n != 0 {
		t.Errorf("%g allocations per %d records and %d gaps", n, len(recs), len(gaps))
	}
}

// TestHourSeriesEqualsMinuteSketches: with writes at random times, idle
// spells of minutes included, each point of the 1h series (a 1 min slice,
// merged from its 10 s slices when current or closed) equals one sketch of
// the values written in that minute.
func TestHourSeriesEqualsMinuteSketches(t *testing.T) {
	clk := newFakeClock()
	w := New(clk.now)
	r := rand.New(rand.NewPCG(61, 62))
	byMinute := map[int64][]time.Duration{}
	elapsed := time.Duration(0)
	for elapsed < 100*time.Minute {
		step := time.Duration(r.Int64N(int64(4 * time.Second)))
		if r.IntN(40) == 0 {
			step = time.Duration(r.Int64N(int64(8 * time.Minute))) // idle
		}
		clk.advance(step)
		elapsed += step
		v := spreadITL.draw(r)
		w.ObserveITL(llm.RouteMessages, "m", v)
		k := int64(elapsed / sliceLong)
		byMinute[k] = append(byMinute[k], v)
	}
	rep, err := w.Series("1h")
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Series) != 1 || len(rep.Series[0].Points) != 60 {
		t.Fatalf("series %+v", rep)
	}
	first := int64(elapsed/sliceLong) - 59
	for i, p := range rep.Series[0].Points {
		want := newSketch()
		for _, v := range byMinute[first+int64(i)] {
			want.Add(v)
		}
		if p.ITL != quantilesOf(want) {
			t.Errorf("minute %d: ITL %+v, want %+v", first+int64(i), p.ITL, quantilesOf(want))
		}
	}
}
