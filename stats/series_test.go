package stats

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/llm"
)

// TestMergeEqualsOneGroup: groups merged across teams (or everything) report
// what one group fed all their records would: the same counts, sums and
// quantiles, since merged sketches are the sketch of the union.
func TestMergeEqualsOneGroup(t *testing.T) {
	clk := newFakeClock()
	split, one := New(clk.now), New(clk.now)
	rng := rand.New(rand.NewPCG(1, 2))
	teams := []string{"alpha", "beta", "gamma", ""}
	slo := llm.SLOTargets{TTFT: 300 * time.Millisecond}
	for i := range 600 {
		ttft := time.Duration(20+rng.IntN(500)) * time.Millisecond
		o := okStream(teams[i%len(teams)], ttft, ttft+time.Duration(1+rng.IntN(900))*time.Millisecond, int64(2+rng.IntN(40)))
		if i%7 == 0 {
			o.outcome = llm.OutcomeUpstreamError
		}
		rec := record(clk.now(), o, slo)
		rec.CostMicros = int64(i)
		rec.Usage.Input, rec.Usage.HasInput = int64(i%13), true
		split.Observe(rec, "gpt")
		merged := *rec
		merged.Team = "x"
		one.Observe(&merged, "gpt")
		gap := time.Duration(1+rng.IntN(80)) * time.Millisecond
		split.ObserveITL(llm.RouteChatCompletions, "gpt", gap)
		one.ObserveITL(llm.RouteChatCompletions, "gpt", gap)
		clk.advance(time.Duration(rng.IntN(300)) * time.Millisecond)
	}
	got := split.snapshot(filter{mergeTeam: true})
	want := one.snapshot(filter{mergeTeam: true})
	all := split.snapshot(filter{mergeTeam: true, mergeModel: true, mergeRoute: true})
	for i, win := range got.Windows {
		if len(win.Groups) != 1 {
			t.Fatalf("%s: %d groups after merge=team, want 1: %+v", win.Name, len(win.Groups), win.Groups)
		}
		g, w := win.Groups[0], want.Windows[i].Groups[0]
		if g.Route != "chat_completions" || g.Model != "gpt" || g.Team != "*" {
			t.Errorf("%s: merged labels %s/%s/%s", win.Name, g.Route, g.Model, g.Team)
		}
		if fmt.Sprint(g.Figures) != fmt.Sprint(w.Figures) {
			t.Errorf("%s: merged\n%+v\nwant\n%+v", win.Name, g.Figures, w.Figures)
		}
		if g.ITL.Count == 0 || g.TTFT.Count == 0 {
			t.Errorf("%s: merge=team lost ITL or TTFT: %+v", win.Name, g)
		}
		a := all.Windows[i].Groups
		if len(a) != 1 || a[0].Route != "*" || a[0].Model != "*" || fmt.Sprint(a[0].Figures) != fmt.Sprint(g.Figures) {
			t.Errorf("%s: merge=route,model,team = %+v, want the one group", win.Name, a)
		}
	}
	w1h := want.Windows[2].Groups[0]
	if w1h.Requests != 600 || w1h.CostUSD != float64(599*600/2)/1e6 {
		t.Errorf("1h: %d requests, cost %g", w1h.Requests, w1h.CostUSD)
	}
}

// TestCostTokensRejections: a window sums cost, input and output tokens and
// counts the rejected requests by reason.
func TestCostTokensRejections(t *testing.T) {
	clk := newFakeClock()
	w := New(clk.now)
	clk.advance(5 * time.Second)
	ok := record(clk.now(), okStream("alpha", 100*time.Millisecond, time.Second, 30), llm.SLOTargets{})
	ok.Usage.Input, ok.Usage.HasInput = 1000, true
	ok.CostMicros = 2_500_000
	w.Observe(ok, "gpt")
	for i, r := range []llm.Rejection{llm.RejectRPM, llm.RejectRPM, llm.RejectCostPerDay, llm.RejectNone, llm.Rejection(200)} {
		rec := &llm.Record{Route: llm.RouteChatCompletions, Team: "alpha", Outcome: llm.OutcomeRejected, Rejection: r, Status: 429,
			Population: llm.PopRefused}
		rec.Timing.In = clk.now().Add(-time.Millisecond)
		rec.Timing.End = clk.now()
		if i == 0 {
			// A rejection set on a record of another population is not one.
			other := *rec
			other.Outcome, other.Population = llm.OutcomeOK, llm.PopModelCall
			w.Observe(&other, "gpt")
		}
		w.Observe(rec, "gpt")
	}
	g, found := findGroup(findWindow(t, w.Snapshot(), "1m"), "chat_completions", "gpt", "alpha")
	if !found {
		t.Fatal("no group")
	}
	if g.CostUSD != 2.5 || g.InputTokens != 1000 || g.OutputTokens != 30 || g.OutputTokensPerSecond != 6 {
		t.Errorf("cost %g input %d output %d tok/s %g", g.CostUSD, g.InputTokens, g.OutputTokens, g.OutputTokensPerSecond)
	}
	if fmt.Sprint(g.Rejections) != "map[cost_per_day:1 other:2 rpm:2]" || g.Outcomes["rejected"] != 5 {
		t.Errorf("rejections %v, outcomes %v", g.Rejections, g.Outcomes)
	}
}

// TestSeries: one point per slice of the window, empty slices included,
// each holding exactly the records that ended in it; the current slice
// spans the time since it began.
func TestSeries(t *testing.T) {
	clk := newFakeClock()
	w := New(clk.now)
	t0 := clk.now()
	// Slice k (10 s wide) gets k records, for k = 0..6, each mid-slice;
	// slice 3 gets none.
	at := func(d time.Duration) { clk.advance(t0.Add(d).Sub(clk.now())) }
	for k := range 7 {
		if k == 3 {
			continue
		}
		for i := range k {
			at(time.Duration(k)*10*time.Second + 5*time.Second + time.Duration(i)*time.Millisecond)
			w.Observe(record(clk.now(), okStream("alpha", 10*time.Duration(k)*time.Millisecond, 200*time.Millisecond, 5), llm.SLOTargets{}), "gpt")
		}
	}
	// Now 72 s in: slice 7 is current and holds one record, 2 s into it.
	at(72 * time.Second)
	w.Observe(record(clk.now(), okStream("alpha", 70*time.Millisecond, 200*time.Millisecond, 5), llm.SLOTargets{}), "gpt")

	rep, err := w.Series("1m")
	if err != nil {
		t.Fatal(err)
	}
	if rep.Window != "1m" || rep.SliceSeconds != 10 || len(rep.Series) != 1 {
		t.Fatalf("report %+v", rep)
	}
	pts := rep.Series[0].Points
	// The 1m window is 6 slices: 2..7.
	if len(pts) != 6 {
		t.Fatalf("%d points, want 6", len(pts))
	}
	for i, p := range pts {
		k := i + 2
		want := int64(k)
		switch k {
		case 3:
			want = 0
		case 7:
			want = 1
		}
		if p.Requests != want || p.TTFT.Count != want {
			t.Errorf("slice %d: %d requests, %d TTFTs, want %d", k, p.Requests, p.TTFT.Count, want)
		}
		if want > 0 && math.Abs(p.TTFT.P50-float64(10*k)) > float64(10*k)*relativeError {
			t.Errorf("slice %d: TTFT P50 %g ms, want %d ms ±%g%%", k, p.TTFT.P50, 10*k, 100*relativeError)
		}
		if !p.Start.Equal(t0.Add(time.Duration(k) * 10 * time.Second)) {
			t.Errorf("slice %d starts at %v, want %v", k, p.Start.Sub(t0), time.Duration(k)*10*time.Second)
		}
		wantSec := 10.0
		if k == 7 {
			wantSec = 2
		}
		if p.Seconds != wantSec || (want > 0 && p.OutputTokensPerSecond != float64(5*want)/wantSec) {
			t.Errorf("slice %d: seconds %g tok/s %g", k, p.Seconds, p.OutputTokensPerSecond)
		}
	}
	// 1h: one slice of one minute (10 s slices 0 to 5), then the current
	// one (slices 6 and 7).
	h, _ := w.Series("1h")
	if len(h.Series[0].Points) != 2 || h.Series[0].Points[0].Requests != 12 || h.Series[0].Points[1].Requests != 7 {
		t.Errorf("1h points %+v", h.Series[0].Points)
	}
	if _, err := w.Series("2m"); err == nil {
		t.Error("Series(2m) did not fail")
	}
}

// TestSeriesHTTP: /stats/series takes the same filters and merge, 5m by
// default; bad parameters are 400s.
func TestSeriesHTTP(t *testing.T) {
	w := served(t)
	rr := get(t, w, http.MethodGet, "/stats/series?merge=route,model,team")
	if rr.Code != http.StatusOK || rr.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("status %d %s", rr.Code, rr.Body)
	}
	var rep SeriesReport
	if err := json.Unmarshal(rr.Body.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Window != "5m" || len(rep.Series) != 1 || rep.Series[0].Team != "*" {
		t.Fatalf("series %+v", rep)
	}
	var req, itl int64
	for _, p := range rep.Series[0].Points {
		req += p.Requests
		itl += p.ITL.Count
	}
	if req != 3 || itl != 2 {
		t.Errorf("points hold %d requests, %d gaps; want 3, 2", req, itl)
	}
	rr = get(t, w, http.MethodGet, "/stats/series?window=1h&merge=route,model&team=alpha")
	if err := json.Unmarshal(rr.Body.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	var teams []string
	for _, s := range rep.Series {
		teams = append(teams, s.Route+"/"+s.Model+"/"+s.Team)
	}
	if fmt.Sprint(teams) != "[*/*/ */*/alpha]" {
		t.Errorf("series %v", teams)
	}
	for _, q := range []string{"/stats/series?window=2m", "/stats/series?merge=tenant", "/stats?merge=route,", "/stats?merge=team&window=7m"} {
		if rr := get(t, w, http.MethodGet, q); rr.Code != http.StatusBadRequest {
			t.Errorf("%s: status %d", q, rr.Code)
		}
	}
	if rr := get(t, w, http.MethodGet, "/stats?merge=team,model"); rr.Code != http.StatusOK {
		t.Errorf("merge=team,model: status %d", rr.Code)
	}
}

// TestMergedReadLocksOneGroupAtATime: while a merged report is between two
// groups, a writer to any group goes through: the report holds no lock
// across groups (it once locked the whole set for the whole merge, so a
// dashboard refresh stalled every stream's ITL writes).
func TestMergedReadLocksOneGroupAtATime(t *testing.T) {
	clk := newFakeClock()
	w := New(clk.now)
	for _, team := range []string{"a", "b", "c"} {
		w.Observe(record(clk.now(), okStream(team, 10*time.Millisecond, 50*time.Millisecond, 4), llm.SLOTargets{}), "gpt")
	}
	paused := make(chan struct{})
	resume := make(chan struct{})
	var once sync.Once
	afterGroupHook = func(*group) {
		once.Do(func() {
			close(paused)
			<-resume
		})
	}
	t.Cleanup(func() { afterGroupHook = nil })
	done := make(chan Report)
	go func() { done <- w.snapshot(filter{window: "1m", mergeTeam: true}) }()
	<-paused
	wrote := make(chan struct{})
	go func() {
		for _, team := range []string{"a", "b", "c"} {
			w.Observe(record(clk.now(), okStream(team, 10*time.Millisecond, 50*time.Millisecond, 4), llm.SLOTargets{}), "gpt")
		}
		w.ObserveITL(llm.RouteChatCompletions, "gpt", time.Millisecond)
		close(wrote)
	}()
	select {
	case <-wrote:
	case <-time.After(10 * time.Second):
		t.Error("writers blocked while a merged report was paused between groups")
	}
	close(resume)
	rep := <-done
	<-wrote
	if g := rep.Windows[0].Groups; len(g) != 1 || g[0].Requests < 3 || g[0].Requests > 6 {
		t.Errorf("merged report %+v", g)
	}
}
