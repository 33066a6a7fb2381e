package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/stats"
)

// discardWriter is a ResponseWriter that drops the body and counts flushes.
type discardWriter struct {
	h       http.Header
	flushes int
}

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *discardWriter) WriteHeader(int)             {}
func (d *discardWriter) Flush()                      { d.flushes++ }

var _ http.Flusher = (*discardWriter)(nil)

// piecesReader returns one piece per Read, as a socket delivering one event
// per packet would.
type piecesReader struct {
	pieces [][]byte
	i      int
}

func (p *piecesReader) Read(b []byte) (int, error) {
	if p.i == len(p.pieces) {
		return 0, io.EOF
	}
	n := copy(b, p.pieces[p.i])
	if n == len(p.pieces[p.i]) {
		p.i++
	} else {
		p.pieces[p.i] = p.pieces[p.i][n:]
	}
	return n, nil
}

// openAIStream returns an OpenAI stream of n token chunks, split one event per
// piece, ending with the usage chunk and [DONE].
func openAIStream(n int) [][]byte {
	pieces := [][]byte{[]byte(openAIRole)}
	for i := range n {
		pieces = append(pieces, fmt.Appendf(nil,
			`data: {"id":"chatcmpl-b","object":"chat.completion.chunk","created":1767225600,"model":"gpt-4o-mini","system_fingerprint":"fp_b","choices":[{"index":0,"delta":{"content":" tok%d"},"logprobs":null,"finish_reason":null}],"usage":null,"obfuscation":"x9"}`+"\n\n", i))
	}
	return append(pieces, []byte(openAIStop), []byte(openAIUsage), []byte(openAIDone))
}

var sseHeader = http.Header{"Content-Type": {"text/event-stream"}}

// relayHarness runs ex.relay in process, with no sockets, so the relay's own
// cost is what is measured.
type relayHarness struct {
	g   *Gateway
	req *http.Request
	w   *discardWriter
	src [][]byte
	// resp and pt are reused so the harness adds no allocation per run.
	resp http.Response
	pt   phaseTimer
	// hold relays as when another attempt could follow: the opening
	// events wait for the first token.
	hold bool
	// idle arms the phase timer's idle timeout (as the default 300 s does
	// in production), so every read pays for touch.
	idle time.Duration
}

func newRelayHarness(tb testing.TB, events int, native bool) *relayHarness {
	tb.Helper()
	g := bareGateway(tb, "http://127.0.0.1:1", func(c *config.Config) { c.Metrics.NativeHistograms = native })
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	return &relayHarness{g: g, req: req, w: &discardWriter{h: http.Header{}}, src: openAIStream(events)}
}

// run relays one whole stream and returns its record.
func (h *relayHarness) run(ex *exchange, body *piecesReader) {
	*ex = exchange{g: h.g, w: h.w, r: h.req, up: h.g.upstreams[0], modelLabel: "gpt-4o-mini"}
	ex.rec.Route, ex.rec.Dialect, ex.rec.Status = llm.RouteChatCompletions, llm.DialectOpenAI, 200
	ex.info.suppressUsage = true
	body.pieces = append(body.pieces[:0], h.src...)
	body.i = 0
	h.resp = http.Response{StatusCode: http.StatusOK, Header: sseHeader, Body: io.NopCloser(body)}
	h.pt.idle = h.idle
	if h.pt.cancel == nil {
		h.pt.cancel = func(error) {}
	}
	ex.relay(context.Background(), func() {}, &h.resp, h.hold, &h.pt)
}

// TestRelayAllocationsDoNotGrowWithEvents proves that the relay allocates
// nothing per event: a stream of 1,024 events costs the same number of
// allocations as one of 16 (only per-request costs remain).
//
// Native histograms are off here: client_golang allocates a sparse bucket
// the first time an ITL value lands in a new bucket (at most
// NativeHistogramMaxBucketNumber of them, so amortised to zero, as
// BenchmarkRelay shows), which would make an exact count depend on timing.
func TestRelayAllocationsDoNotGrowWithEvents(t *testing.T) {
	for _, hold := range []bool{false, true} {
		t.Run(fmt.Sprintf("hold=%v", hold), func(t *testing.T) { relayAllocations(t, hold) })
	}
}

func relayAllocations(t *testing.T, hold bool) {
	allocs := func(events int) float64 {
		h := newRelayHarness(t, events, false)
		h.hold = hold
		var ex exchange
		var body piecesReader
		h.run(&ex, &body) // warm the pools and the metric children
		if ex.rec.Outcome != llm.OutcomeOK || ex.rec.TokenEvents != events || ex.rec.Usage.Output != 8 {
			t.Fatalf("relay of %d events: outcome %s, %d token events, usage %+v", events, ex.rec.Outcome,
				ex.rec.TokenEvents, ex.rec.Usage)
		}
		return testing.AllocsPerRun(50, func() { h.run(&ex, &body) })
	}
	small, large := allocs(16), allocs(1024)
	// One allocation per event would add 1,008; a few of slack absorb the
	// race detector, which makes sync.Pool drop items at random (seen: 2 vs
	// 3 under -race).
	if large > small+4 {
		t.Fatalf("relay allocations grow with events: %.1f for 16 events, %.1f for 1024", small, large)
	}
	t.Logf("allocations per stream: %.1f (16 events), %.1f (1024 events)", small, large)
}

// BenchmarkRelay measures the relay loop alone (framer, decoder, tap, ITL
// observation, write and flush to a discarding writer), per event.
func BenchmarkRelay(b *testing.B) {
	for _, c := range []struct {
		events int
		hold   bool
		idle   time.Duration
		stats  bool
	}{{64, false, 0, false}, {1024, false, 0, false}, {64, true, 0, false}, {1024, true, 0, false},
		{1024, true, 300 * time.Second, false}, {1024, true, 300 * time.Second, true}} {
		events := c.events
		b.Run(fmt.Sprintf("events=%d/hold=%v/idle=%s/stats=%v", events, c.hold, c.idle, c.stats), func(b *testing.B) {
			h := newRelayHarness(b, events, true)
			h.hold, h.idle = c.hold, c.idle
			if c.stats { // as serve runs it: the live windows behind /stats
				h.g.stats = stats.New(nil)
			}
			defer h.pt.stop()
			var ex exchange
			var body piecesReader
			h.run(&ex, &body)
			var bytes int64
			for _, p := range h.src {
				bytes += int64(len(p))
			}
			b.SetBytes(bytes)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				h.run(&ex, &body)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*(events+4)), "ns/event")
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
// cpu-ms/1000req is the gateway's CPU per 1,000 streamed requests.
func BenchmarkStreamLoopback(b *testing.B) {
	const tokens = 64
	mock := httptest.NewServer(mockllm.New(mockllm.Options{OutputTokens: tokens}))
	defer mock.Close()
	g := bareGateway(b, mock.URL, nil)
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

// heldStreams opens n streams to url whose upstream pauses after the first
// token, waits until every one has its first token, and returns the heap and
// stack in use at that moment (after a GC), then releases them.
func heldStreams(b *testing.B, url string, n int) uint64 {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	defer client.CloseIdleConnections()
	ready := make(chan error, n)
	for range n {
		go func() {
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
		}()
	}
	for range n {
		if err := <-ready; err != nil {
			b.Fatal(err)
		}
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse + ms.StackInuse
}

// BenchmarkHeldStreamMemory reports the gateway's memory per open stream:
// the heap and stacks with 200 streams held open through the gateway, less
// the same with 200 held open directly (client and fake upstream live in the
// same process), divided by 200.
func BenchmarkHeldStreamMemory(b *testing.B) {
	const n = 200
	mock := httptest.NewServer(mockllm.New(mockllm.Options{OutputTokens: 2}))
	defer mock.Close()
	g := bareGateway(b, mock.URL, nil)
	gw := httptest.NewServer(g.Handler())
	defer gw.Close()
	var per float64
	for b.Loop() {
		runtime.GC()
		direct := heldStreams(b, mock.URL, n)
		runtime.GC()
		via := heldStreams(b, gw.URL, n)
		per = (float64(via) - float64(direct)) / n
	}
	b.ReportMetric(per, "bytes/stream")
}
