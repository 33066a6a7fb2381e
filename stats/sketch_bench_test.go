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

// spread is a range of latencies met in LLM serving, drawn log-uniformly.
type spread struct {
	name   string
	lo, hi time.Duration
}

var (
	spreadTTFT     = spread{"ttft", 50 * time.Millisecond, 5 * time.Second}
	spreadITL      = spread{"itl", time.Millisecond, 200 * time.Millisecond}
	spreadTPOT     = spread{"tpot", 5 * time.Millisecond, 100 * time.Millisecond}
	spreadE2E      = spread{"e2e", 500 * time.Millisecond, time.Minute}
	spreadOverhead = spread{"overhead", 20 * time.Microsecond, 2 * time.Millisecond}
)

func (s spread) draw(r *rand.Rand) time.Duration {
	return time.Duration(float64(s.lo) * math.Exp(r.Float64()*math.Log(float64(s.hi)/float64(s.lo))))
}

func (s spread) values(seed uint64, n int) []time.Duration {
	r := rand.New(rand.NewPCG(seed, 77))
	v := make([]time.Duration, n)
	for i := range v {
		v[i] = s.draw(r)
	}
	return v
}

// filled returns a sketch of n values of s.
func filled(s spread, seed uint64, n int) *sketch {
	sk := newSketch()
	for _, v := range s.values(seed, n) {
		sk.Add(v)
	}
	return sk
}

// BenchmarkSketchAdd: one value into the slice being written.
func BenchmarkSketchAdd(b *testing.B) {
	for _, s := range []spread{spreadTTFT, spreadITL} {
		b.Run(s.name, func(b *testing.B) {
			vals := s.values(1, 4096)
			sk := newSketch()
			for _, v := range vals {
				sk.Add(v)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				sk.Add(vals[i&4095])
				i++
			}
		})
	}
}

// BenchmarkSketchQuantiles: P50, P95 and P99 of a merged sketch, as each
// figure of each reported group asks.
func BenchmarkSketchQuantiles(b *testing.B) {
	for _, n := range []int{1000, 100_000} {
		for _, s := range []spread{spreadTTFT, spreadITL} {
			b.Run(fmt.Sprintf("%s/%d", s.name, n), func(b *testing.B) {
				sk := filled(s, 2, n)
				dst := make([]float64, len(quantileLevels))
				b.ReportAllocs()
				for b.Loop() {
					sk.quantiles(dst, quantileLevels)
				}
			})
		}
	}
}

// BenchmarkSketchMerge: a closed slice (compact) and the current slice
// (dense) merged into a report's scratch sketch, and a slice closed
// (fill), each for a 10 s slice of a light and of a heavy group.
func BenchmarkSketchMerge(b *testing.B) {
	for _, n := range []int{100, 10_000} {
		for _, s := range []spread{spreadTTFT, spreadITL} {
			src := filled(s, 3, n)
			var c compact
			c.fill(src)
			b.Run(fmt.Sprintf("compact/%s/%d", s.name, n), func(b *testing.B) {
				dst := newSketch()
				b.ReportAllocs()
				for b.Loop() {
					dst.mergeCompact(&c)
				}
			})
			b.Run(fmt.Sprintf("dense/%s/%d", s.name, n), func(b *testing.B) {
				dst := newSketch()
				b.ReportAllocs()
				for b.Loop() {
					dst.Merge(src)
				}
			})
			b.Run(fmt.Sprintf("fill/%s/%d", s.name, n), func(b *testing.B) {
				var c compact
				b.ReportAllocs()
				for b.Loop() {
					c.fill(src)
				}
			})
		}
	}
}

// heapBytes returns the live heap after a collection.
func heapBytes() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// load is a traffic level: requests and ITL gaps per second of one group.
type load struct {
	name        string
	reqs, gaps  int // per 10 s slice
	groupsTimes int // groups measured at once, to average the heap's noise
}

var loads = []load{
	// A group seeing 2 requests a second (fill50's level) and 100 gaps.
	{"light", 20, 1000, 8},
	// One group carrying 256 streams: 128 requests and 12,800 gaps a second.
	{"heavy", 1280, 128_000, 1},
}

// BenchmarkSketchBytes measures, per sketch, what a 10 s and a 1 min slice
// of each load hold: the slice being written (dense) and a closed slice
// (compact). Run with -benchtime 1x; the figures are in the metrics.
func BenchmarkSketchBytes(b *testing.B) {
	for _, l := range loads {
		for _, s := range []spread{spreadTTFT, spreadITL} {
			for _, width := range []int{1, 6} { // 10 s, 1 min
				n := l.reqs * width
				if s == spreadITL {
					n = l.gaps * width
				}
				b.Run(fmt.Sprintf("%s/%s/%ds", l.name, s.name, 10*width), func(b *testing.B) {
					const k = 16
					for b.Loop() {
						vals := s.values(4, n)
						before := heapBytes()
						dense := make([]*sketch, k)
						for i := range dense {
							dense[i] = newSketch()
							for _, v := range vals {
								dense[i].Add(v)
							}
						}
						mid := heapBytes()
						closed := make([]compact, k)
						for i := range closed {
							closed[i].fill(dense[i])
						}
						after := heapBytes()
						b.ReportMetric(float64(mid-before)/k, "B/dense")
						b.ReportMetric(float64(after-mid)/k, "B/closed")
						runtime.KeepAlive(vals)
						runtime.KeepAlive(dense)
						runtime.KeepAlive(closed)
					}
				})
			}
		}
	}
}

// observeHour feeds w an hour of one load into one request group and one
// ITL group per model, with the spreads above; kinds says which groups
// ("request", "itl" or both).
func observeHour(clk *fakeClock, w *Windows, l load, models int, kinds string) {
	r := rand.New(rand.NewPCG(5, 6))
	gaps := make([]time.Duration, 100)
	for range 360 {
		clk.advance(sliceShort)
		now := clk.now()
		for m := range models {
			model := fmt.Sprint("model-", m)
			for range l.reqs {
				if kinds == "itl" {
					break
				}
				ttft, e2e := spreadTTFT.draw(r), spreadE2E.draw(r)
				if e2e <= ttft {
					e2e = ttft + time.Millisecond
				}
				tokens := int64(200)
				rec := &llm.Record{Route: llm.RouteChatCompletions, Team: "t", Stream: true, Outcome: llm.OutcomeOK, Status: 200,
					Usage: llm.Usage{Output: tokens, HasOutput: true}}
				in := now.Add(-e2e)
				tpot := spreadTPOT.draw(r)
				first := in.Add(ttft - time.Duration(tokens-1)*tpot/2)
				rec.Timing = llm.Timing{In: in, UpSent: in.Add(spreadOverhead.draw(r)), FirstToken: first,
					FirstTokenOut: in.Add(ttft), LastToken: first.Add(time.Duration(tokens-1) * tpot), End: now}
				w.Observe(rec, model)
			}
			for done := 0; done < l.gaps && kinds != "request"; done += len(gaps) {
				for i := range gaps {
					gaps[i] = spreadITL.draw(r)
				}
				w.ObserveITLs(llm.RouteChatCompletions, model, gaps)
			}
		}
	}
}

// BenchmarkGroupBytes measures the heap groups hold after an hour of each
// load: a request group (TTFT, TPOT, E2E, overhead), an ITL group, and
// both, as a route and model with one team has. Run with -benchtime 1x.
func BenchmarkGroupBytes(b *testing.B) {
	for _, l := range loads {
		for _, kinds := range []string{"request", "itl", "both"} {
			b.Run(l.name+"/"+kinds, func(b *testing.B) {
				for b.Loop() {
					clk := newFakeClock()
					before := heapBytes()
					w := New(clk.now)
					observeHour(clk, w, l, l.groupsTimes, kinds)
					after := heapBytes()
					want := l.groupsTimes
					if kinds == "both" {
						want *= 2
					}
					if len(w.groups) != want {
						b.Fatalf("%d groups", len(w.groups))
					}
					b.ReportMetric(float64(after-before)/float64(l.groupsTimes)/1024, "KiB/"+kinds)
					runtime.KeepAlive(w)
				}
			})
		}
	}
}
