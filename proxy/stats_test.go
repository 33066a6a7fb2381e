package proxy

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/stats"
)

// TestStatsQuantilesOfATightLoad: streams through real sockets with a
// steady upstream, so that most TTFTs and E2Es are within a few percent of
// each other; the P50, P95 and P99 that GET /stats reports are told apart
// and each is within the sketch's 0.1 % of the exact quantile of the
// records the gateway finished.
func TestStatsQuantilesOfATightLoad(t *testing.T) {
	_, mockURL := mockUpstream(t, mockllm.Options{TTFT: 60 * time.Millisecond, ITL: 2 * time.Millisecond,
		Jitter: time.Millisecond, OutputTokens: 4, Seed: 3})
	live := stats.New(nil)
	tg := newTestGatewayWith(t, mockURL, nil, func(o *Options) { o.Stats = live })

	const n, concurrency = 150, 10
	// run sends per requests from each of concurrency clients, and returns
	// the records the gateway finished.
	run := func(path, body string, per int) []llm.Record {
		var wg sync.WaitGroup
		errs := make(chan string, concurrency*per)
		for w := range concurrency {
			wg.Go(func() {
				for range per {
					res := sendRequest(testCtx(t), http.MethodPost, tg.URL+path, "application/json", body, nil)
					if res.err != nil || res.resp.StatusCode != http.StatusOK {
						errs <- fmt.Sprintf("client %d: %v %v", w, res.err, res.resp)
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Fatal(e)
		}
		recs := make([]llm.Record, concurrency*per)
		for i := range recs {
			if recs[i] = tg.record(t); recs[i].Outcome != llm.OutcomeOK {
				t.Fatalf("a request to %s ended %s", path, recs[i].Outcome)
			}
		}
		return recs
	}
	// Connections are opened on another route, which the report leaves
	// out, so that none of the measured requests pays for one.
	run("/v1/responses", `{"model":"gpt-4o-mini","stream":true,"input":"hi"}`, 1)
	var ttft, e2e []time.Duration
	for _, rec := range run("/v1/chat/completions", `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}`, n/concurrency) {
		ttft, e2e = append(ttft, rec.TTFT()), append(e2e, rec.E2E())
	}

	resp, err := http.Get(tg.URL + "/stats?window=1m&route=chat_completions&merge=route,model,team")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rep stats.Report
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Windows) != 1 || len(rep.Windows[0].Groups) != 1 {
		t.Fatalf("report %+v, want one window with one merged group", rep)
	}
	g := rep.Windows[0].Groups[0]
	if rep.Sketch.RelativeError > 0.001 {
		t.Errorf("the sketch's bound is %g, want 0.1 %% at most", rep.Sketch.RelativeError)
	}
	for _, f := range []struct {
		name string
		got  stats.Quantiles
		vals []time.Duration
	}{{"TTFT", g.TTFT, ttft}, {"E2E", g.E2E, e2e}} {
		slices.Sort(f.vals)
		if f.got.Count != n {
			t.Fatalf("%s: /stats counts %d, the gateway finished %d", f.name, f.got.Count, n)
		}
		// The upstream's 1 ms jitter keeps the middle half within a few
		// percent; the tail is the machine's scheduling.
		q1, q3 := millis(f.vals[n/4]), millis(f.vals[3*n/4])
		t.Logf("%s: %d values in [%.3f, %.3f] ms, middle half within %.2f %%; /stats P50 %.3f P95 %.3f P99 %.3f",
			f.name, n, millis(f.vals[0]), millis(f.vals[n-1]), 100*(q3-q1)/q1, f.got.P50, f.got.P95, f.got.P99)
		if !(f.got.P50 < f.got.P95 && f.got.P95 < f.got.P99) {
			t.Errorf("%s: P50 %.3f, P95 %.3f, P99 %.3f ms not told apart", f.name, f.got.P50, f.got.P95, f.got.P99)
		}
		for _, c := range []struct {
			q   float64
			got float64
		}{{0.5, f.got.P50}, {0.95, f.got.P95}, {0.99, f.got.P99}} {
			// numpy.percentile's default, as the sketch interpolates.
			h := c.q * float64(n-1)
			lo := int(h)
			exact := millis(f.vals[lo]) + (h-float64(lo))*(millis(f.vals[lo+1])-millis(f.vals[lo]))
			if e := math.Abs(c.got - exact); e > 0.001*exact {
				t.Errorf("%s P%g: /stats %.4f ms, exact %.4f ms: off by %.3f %%", f.name, 100*c.q, c.got, exact, 100*e/exact)
			}
		}
	}
}

// millis is d in milliseconds, to the nanosecond (the access log's ms rounds to
// the microsecond).
func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
