package stats

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/llm"
)

func BenchmarkObserve(b *testing.B) {
	clk := newFakeClock()
	w := New(clk.now)
	rec := record(clk.now(), okStream("a", 100*time.Millisecond, time.Second, 50), llm.SLOTargets{TTFT: time.Second})
	w.Observe(rec, "m")
	b.ReportAllocs()
	for b.Loop() {
		w.Observe(rec, "m")
	}
}

func BenchmarkObserveITL(b *testing.B) {
	clk := newFakeClock()
	w := New(clk.now)
	w.ObserveITL(llm.RouteChatCompletions, "m", time.Millisecond)
	b.ReportAllocs()
	for b.Loop() {
		w.ObserveITL(llm.RouteChatCompletions, "m", 20*time.Millisecond)
	}
}

// BenchmarkObserveITLRealClock includes time.Now and the slice rotations
// a real clock brings.
func BenchmarkObserveITLRealClock(b *testing.B) {
	w := New(nil)
	b.ReportAllocs()
	for b.Loop() {
		w.ObserveITL(llm.RouteChatCompletions, "m", 20*time.Millisecond)
	}
}

func BenchmarkObserveITLParallel(b *testing.B) {
	w := New(nil)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			w.ObserveITL(llm.RouteChatCompletions, "m", 20*time.Millisecond)
		}
	})
}

// fill50 loads an hour of traffic into 50 groups: 8 models × 5 teams of
// requests and 10 ITL groups, each request group getting 20 records and
// each ITL group 200 gaps per 10 s slice, with lognormal latencies.
func fill50(clk *fakeClock, w *Windows) {
	r := rand.New(rand.NewPCG(5, 6))
	logn := func(median time.Duration, sigma float64) time.Duration {
		return time.Duration(float64(median) * math.Exp(sigma*r.NormFloat64()))
	}
	slo := llm.SLOTargets{TTFT: time.Second, TPOT: 50 * time.Millisecond}
	for range 360 {
		clk.advance(sliceShort)
		now := clk.now()
		for m := range 8 {
			model := fmt.Sprint("model-", m)
			for tm := range 5 {
				for range 20 {
					ttft := logn(300*time.Millisecond, 0.8)
					w.Observe(record(now, okStream(fmt.Sprint("team-", tm), ttft, ttft+logn(4*time.Second, 0.5), 200), slo), model)
				}
			}
			for range 200 {
				w.ObserveITL(llm.RouteChatCompletions, model, logn(20*time.Millisecond, 0.6))
			}
		}
		for m := range 2 {
			for range 200 {
				w.ObserveITL(llm.RouteMessages, fmt.Sprint("model-", m), logn(20*time.Millisecond, 0.6))
			}
		}
	}
}

func BenchmarkSnapshot50Groups(b *testing.B) {
	clk := newFakeClock()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	w := New(clk.now)
	fill50(clk, w)
	runtime.GC()
	runtime.ReadMemStats(&after)
	if n := len(w.groups); n != 50 {
		b.Fatalf("%d groups", n)
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = w.Snapshot()
	}
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/50/1024, "KiB/group")
}

// BenchmarkDashboardRefresh50Groups is what one dashboard refresh asks of
// a gateway with 50 groups: the whole gateway merged, its 5 min series,
// and the groups merged by team and by route and model.
func BenchmarkDashboardRefresh50Groups(b *testing.B) {
	clk := newFakeClock()
	w := New(clk.now)
	fill50(clk, w)
	b.ReportAllocs()
	for b.Loop() {
		_ = w.snapshot(filter{window: "5m", mergeRoute: true, mergeModel: true, mergeTeam: true})
		if _, err := w.series(filter{window: "5m", mergeRoute: true, mergeModel: true, mergeTeam: true}); err != nil {
			b.Fatal(err)
		}
		_ = w.snapshot(filter{window: "5m", mergeRoute: true, mergeModel: true})
		_ = w.snapshot(filter{window: "5m", mergeTeam: true})
	}
}

// BenchmarkSeries1h50Groups: the 1 h series of every group, unmerged (60
// points each).
func BenchmarkSeries1h50Groups(b *testing.B) {
	clk := newFakeClock()
	w := New(clk.now)
	fill50(clk, w)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := w.Series("1h"); err != nil {
			b.Fatal(err)
		}
	}
}
