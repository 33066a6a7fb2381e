package proxy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/internal/jsonlog"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/stats"
)

// BenchmarkRelay measures the relay loop alone (framer, decoder, tap, ITL
// observation, write and flush to a discarding writer), per event.
func BenchmarkRelay(b *testing.B) {
	for _, c := range []struct {
		events int
		hold   bool
		idle   time.Duration
		stats  bool
		// responses relays a Responses API stream instead of a chat one.
		responses bool
	}{{64, false, 0, false, false}, {1024, false, 0, false, false}, {64, true, 0, false, false}, {1024, true, 0, false, false},
		{1024, true, 300 * time.Second, false, false}, {1024, true, 300 * time.Second, true, false},
		{1024, true, 300 * time.Second, false, true}} {
		events := c.events
		name := fmt.Sprintf("events=%d/hold=%v/idle=%s/stats=%v", events, c.hold, c.idle, c.stats)
		if c.responses {
			name = fmt.Sprintf("responses/events=%d/hold=%v/idle=%s", events, c.hold, c.idle)
		}
		b.Run(name, func(b *testing.B) {
			rb := newRelayBench(b, events, true)
			if c.responses {
				rb.src, rb.d, rb.suppress = responsesStream(b, events), llm.DialectResponses, false
				rb.r = httptest.NewRequest(http.MethodPost, "/v1/responses", nil)
			}
			// An idle timeout (as the default 300 s in production) makes
			// every read pay for touch.
			rb.hold, rb.pt.idle = c.hold, c.idle
			if c.stats { // as serve runs it: the live windows behind /stats
				rb.g.stats = stats.New(nil)
			}
			defer rb.pt.stop()
			rb.run()
			if rb.ex.rec.Outcome != llm.OutcomeOK || rb.ex.rec.TokenEvents != events {
				b.Fatalf("relay of %d events: outcome %s, %d token events", events, rb.ex.rec.Outcome, rb.ex.rec.TokenEvents)
			}
			var bytes int64
			for _, p := range rb.src {
				bytes += int64(len(p))
			}
			b.SetBytes(bytes)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				rb.run()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(rb.src)), "ns/event")
		})
	}
}

// cpuTime returns the process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkStreamLoopback sends whole streamed requests over loopback, to
// mockllm directly and through the gateway, in the same process. The
// difference of ns/op is the gateway's added latency per streamed request;
// divided by the events it is the added latency per event; the difference of
// cpu-ms/1000req is the gateway's CPU per 1,000 streamed requests, the
// access-log line included.
func BenchmarkStreamLoopback(b *testing.B) {
	const tokens = 64
	mock := httptest.NewServer(mockllm.New(mockllm.Options{OutputTokens: tokens}))
	defer mock.Close()
	// The access log on, as it is by default, to a writer that drops it.
	g := bareGatewayWith(b, mock.URL, nil, func(o *Options) { o.AccessLog = slog.New(jsonlog.NewHandler(io.Discard, nil)) })
	gw := httptest.NewServer(g.Handler())
	defer gw.Close()
	body := `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hello"}]}`
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer client.CloseIdleConnections()

	for _, target := range []struct{ name, url string }{{"direct", mock.URL}, {"gateway", gw.URL}} {
		b.Run(target.name, func(b *testing.B) {
			b.ReportAllocs()
			cpu0 := cpuTime()
			for b.Loop() {
				resp, err := client.Post(target.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				n, err := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 || n < 1000 {
					b.Fatalf("status %d, %d bytes, %v", resp.StatusCode, n, err)
				}
			}
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-ms/1000req")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*(tokens+3)), "ns/event")
		})
	}
}

// heldMemory is what a process holds in Go memory at one moment.
type heldMemory struct{ heap, stack, goroutines float64 }

func (a heldMemory) minus(b heldMemory) heldMemory {
	return heldMemory{a.heap - b.heap, a.stack - b.stack, a.goroutines - b.goroutines}
}

// settledMemory collects twice (so sync.Pool's victims go too) and reads
// the heap and stacks in use and the goroutines.
func settledMemory() heldMemory {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return heldMemory{float64(ms.HeapInuse), float64(ms.StackInuse), float64(runtime.NumGoroutine())}
}

// heldStreams opens n streams to url whose upstream pauses after the first
// token, waits until every one has its first token, and returns the memory
// in use at that moment; then it ends them and waits until their goroutines
// are gone, so that the next measurement starts from the same place.
func heldStreams(b *testing.B, url string, n int) heldMemory {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	ready := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions",
				strings.NewReader(`{"model":"m","stream":true}`))
			req.Header.Set("X-Mock-ITL-Ms", "60000")
			resp, err := client.Do(req)
			if err != nil {
				ready <- err
				return
			}
			defer resp.Body.Close()
			buf := make([]byte, 4096)
			for {
				k, err := resp.Body.Read(buf)
				if err != nil {
					ready <- err
					return
				}
				if strings.Contains(string(buf[:k]), " tok1") {
					break
				}
			}
			ready <- nil
			_, _ = io.Copy(io.Discard, resp.Body) // until cancel
		})
	}
	for range n {
		if err := <-ready; err != nil {
			b.Fatal(err)
		}
	}
	m := settledMemory()
	cancel()
	wg.Wait()
	client.CloseIdleConnections()
	return m
}

// BenchmarkHeldStreamMemory reports the gateway's Go memory per open
// stream: the heap, the goroutine stacks and the goroutines in use with 500
// streams held open through the gateway, less the same with 500 held open
// directly (client and fake upstream live in the same process), divided by
// 500. RSS is more than this (the heap's headroom until the next GC, the
// runtime's own); the bench-compare tool measures it per process.
func BenchmarkHeldStreamMemory(b *testing.B) {
	const n = 500
	mock := httptest.NewServer(mockllm.New(mockllm.Options{OutputTokens: 2}))
	defer mock.Close()
	g := bareGateway(b, mock.URL, nil)
	gw := httptest.NewServer(g.Handler())
	defer gw.Close()
	var per heldMemory
	for b.Loop() {
		direct := heldStreams(b, mock.URL, n)
		via := heldStreams(b, gw.URL, n)
		d := via.minus(direct)
		per = heldMemory{d.heap / n, d.stack / n, d.goroutines / n}
	}
	b.ReportMetric(per.heap, "heap-B/stream")
	b.ReportMetric(per.stack, "stack-B/stream")
	b.ReportMetric(per.heap+per.stack, "B/stream")
	b.ReportMetric(per.goroutines, "goroutines/stream")
}
