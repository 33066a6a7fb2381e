package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"sync/atomic"
	"unicode/utf8"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/internal/otlptest"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/sseparse"
	"github.com/tollgate-llm/tollgate/tracing"
)

// Caller's W3C trace context, sent by the tests.
const (
	callerTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	callerSpanID  = "00f067aa0ba902b7"
	callerParent  = "00-" + callerTraceID + "-" + callerSpanID + "-01"
	callerState   = "vendor=abc,other=1"
)

// newTestTracer returns a tracer exporting to endpoint over protocol, shut
// down at the end of the test.
func newTestTracer(tb testing.TB, protocol, endpoint string, edit func(*config.Tracing)) *tracing.Tracer {
	tb.Helper()
	c := config.Default().Tracing
	c.Enabled, c.Protocol, c.Endpoint, c.Insecure = true, protocol, endpoint, true
	c.ServiceName = "tollgate-test"
	c.ExportTimeoutSeconds = 5
	if edit != nil {
		edit(&c)
	}
	tr, err := tracing.New(context.Background(), c, tracing.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = tr.Shutdown(ctx)
	})
	return tr
}

// flush exports every span ended so far.
func flush(tb testing.TB, tr *tracing.Tracer) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tr.ForceFlush(ctx); err != nil {
		tb.Fatalf("flushing spans: %v", err)
	}
}

// headerUpstream is an SSE upstream that answers status (then 200) to the
// first fail requests and an OpenAI stream of 5 tokens to the others,
// keeping each request's headers.
type headerUpstream struct {
	fail    int
	status  int
	mu      sync.Mutex
	headers []http.Header
}

func (u *headerUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	u.mu.Lock()
	u.headers = append(u.headers, r.Header.Clone())
	n := len(u.headers)
	u.mu.Unlock()
	if n <= u.fail {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(u.status)
		_, _ = io.WriteString(w, `{"error":{"message":"busy","type":"server_error","code":null}}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	for _, p := range openAIStream(5) {
		_, _ = w.Write(p)
		_ = rc.Flush()
	}
}

func (u *headerUpstream) got() []http.Header {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]http.Header(nil), u.headers...)
}

// tracedGateway is a test gateway in front of up with tr as its tracer.
func tracedGateway(t *testing.T, up http.Handler, tr *tracing.Tracer, edit func(*config.Config)) *testGateway {
	t.Helper()
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	return newTestGatewayWith(t, srv.URL, edit, func(o *Options) {
		if tr != nil {
			o.Tracer = tr.Tracer()
		}
	})
}

const tracedBody = `{"model":"gpt-4o-mini","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"secret prompt"}]}`

// splitSpans returns the request spans and the attempt spans of spans.
func splitSpans(spans []otlptest.Span) (requests, attempts []otlptest.Span) {
	for _, s := range spans {
		if s.GetName() == tracing.SpanAttempt {
			attempts = append(attempts, s)
		} else {
			requests = append(requests, s)
		}
	}
	return requests, attempts
}

// accessLine returns the access log's one request line, decoded.
func accessLine(t *testing.T, tg *testGateway) map[string]any {
	t.Helper()
	var lines []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(tg.logs.Bytes()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("access log line %q: %v", sc.Text(), err)
		}
		if m["msg"] == "request" {
			lines = append(lines, m)
		}
	}
	if len(lines) != 1 {
		t.Fatalf("%d access-log request lines, want 1:\n%s", len(lines), tg.logs.String())
	}
	return lines[0]
}

// number returns v (an OTLP int or double, or a JSON number) as a float64.
func number(v any) (float64, bool) {
	switch x := v.(type) {
	case int64:
		return float64(x), true
	case float64:
		return x, true
	}
	return 0, false
}

// TestTraceSpanContinuesCallerAndMatchesAccessLog sends one streamed
// request with a caller's traceparent and tracestate through a real
// gateway to a real OTLP/HTTP receiver: one request span arrives, child of
// the caller's span in the caller's trace, named "chat gpt-4o-mini", with
// one attempt span under it; the upstream got a traceparent naming the
// attempt span and the caller's tracestate; every attribute the access log
// also writes has the access log's value; the access log names the trace.
func TestTraceSpanContinuesCallerAndMatchesAccessLog(t *testing.T) {
	rcv := otlptest.StartHTTP(t)
	tr := newTestTracer(t, config.TracingHTTP, rcv.Endpoint, nil)
	up := &headerUpstream{}
	tg := tracedGateway(t, up, tr, nil)

	resp, _ := post(t, tg.URL+"/v1/chat/completions", tracedBody, map[string]string{
		"traceparent": callerParent, "tracestate": callerState, "Authorization": "Bearer sk-caller-key"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	rec := tg.record(t)
	flush(t, tr)

	reqs, attempts := splitSpans(rcv.Spans())
	if len(reqs) != 1 || len(attempts) != 1 {
		t.Fatalf("%d request spans and %d attempt spans, want 1 and 1", len(reqs), len(attempts))
	}
	s, a := reqs[0], attempts[0]
	if s.TraceID() != callerTraceID || s.ParentID() != callerSpanID {
		t.Errorf("request span in trace %s under %s, want the caller's %s under %s", s.TraceID(), s.ParentID(),
			callerTraceID, callerSpanID)
	}
	if s.GetName() != "chat gpt-4o-mini" || s.GetKind() != tracepb.Span_SPAN_KIND_SERVER {
		t.Errorf("request span %q of kind %v, want \"chat gpt-4o-mini\", server", s.GetName(), s.GetKind())
	}
	if a.TraceID() != callerTraceID || a.ParentID() != s.SpanID() || a.GetKind() != tracepb.Span_SPAN_KIND_CLIENT {
		t.Errorf("attempt span in trace %s under %s (kind %v), want under the request span %s, client",
			a.TraceID(), a.ParentID(), a.GetKind(), s.SpanID())
	}
	if got := s.Resource["service.name"]; got != "tollgate-test" {
		t.Errorf("service.name %v", got)
	}
	if s.GetStartTimeUnixNano() != uint64(rec.Timing.In.UnixNano()) || s.GetEndTimeUnixNano() != uint64(rec.Timing.End.UnixNano()) {
		t.Errorf("request span from %d to %d, want t_in %d to t_end %d", s.GetStartTimeUnixNano(), s.GetEndTimeUnixNano(),
			rec.Timing.In.UnixNano(), rec.Timing.End.UnixNano())
	}

	// The upstream continues the trace under the attempt span.
	hs := up.got()
	if len(hs) != 1 {
		t.Fatalf("upstream got %d requests", len(hs))
	}
	if got, want := hs[0].Get("traceparent"), "00-"+callerTraceID+"-"+a.SpanID()+"-01"; got != want {
		t.Errorf("upstream traceparent %q, want %q", got, want)
	}
	if got := hs[0].Get("tracestate"); got != callerState {
		t.Errorf("upstream tracestate %q, want %q", got, callerState)
	}

	attrs := s.Attrs()
	line := accessLine(t, tg)
	if line["trace_id"] != callerTraceID {
		t.Errorf("access log trace_id %v, want %s", line["trace_id"], callerTraceID)
	}
	// Access-log field → span attribute.
	same := map[string]string{
		"request_id": "tollgate.request_id", "key_id": "tollgate.key", "model": "gen_ai.request.model",
		"upstream": "tollgate.upstream", "stream": "gen_ai.request.stream", "status": "http.response.status_code",
		"outcome": "tollgate.outcome", "e2e_ms": "tollgate.e2e_ms", "overhead_ms": "tollgate.overhead_ms",
		"bytes_out": "tollgate.bytes_out", "ttft_ms": "tollgate.ttft_ms", "upstream_ttft_ms": "tollgate.upstream_ttft_ms",
		"token_events": "tollgate.token_events", "tpot_ms": "tollgate.tpot_ms",
		"input_tokens": "gen_ai.usage.input_tokens", "cache_read_tokens": "gen_ai.usage.cache_read.input_tokens",
		"cache_write_tokens": "gen_ai.usage.cache_creation.input_tokens", "output_tokens": "gen_ai.usage.output_tokens",
		"reasoning_tokens": "gen_ai.usage.reasoning.output_tokens", "tokens_estimated": "tollgate.tokens_estimated",
		"input_bucket": "tollgate.input_bucket", "goodput": "tollgate.goodput", "attempt_count": "tollgate.attempt_count",
	}
	for field, key := range same {
		lv, ok := line[field]
		if !ok {
			t.Errorf("access log lacks %s", field)
			continue
		}
		sv, ok := attrs[key]
		if !ok {
			t.Errorf("span lacks %s (access log %s = %v)", key, field, lv)
			continue
		}
		ln, lnum := number(lv)
		sn, snum := number(sv)
		if lnum && snum && ln == sn || !lnum && lv == sv {
			continue
		}
		t.Errorf("span %s = %v, access log %s = %v", key, sv, field, lv)
	}
	if key, _ := attrs["tollgate.key"].(string); key == "" || strings.Contains(key, "sk-caller-key") {
		t.Errorf("tollgate.key %q: want the key's hash id, never the key", key)
	}
	for key, want := range map[string]any{
		"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.max_tokens": int64(64),
		"gen_ai.response.time_to_first_chunk": rec.TTFT().Seconds(),
	} {
		if attrs[key] != want {
			t.Errorf("span %s = %v (%T), want %v", key, attrs[key], attrs[key], want)
		}
	}
	for key := range attrs {
		if strings.HasPrefix(key, "tollgate.request.content") || key == "error.type" {
			t.Errorf("span has %s", key)
		}
	}
	if ac := a.Attrs(); ac["tollgate.upstream"] != "mock" || ac["http.response.status_code"] != int64(200) ||
		ac["tollgate.attempt.result"] != "ok" {
		t.Errorf("attempt span attributes %v", ac)
	}
}

// TestTraceRetriedRequestHasAttemptSpans retries a request once (a 503,
// then a stream): the request span has two attempt children, with the
// statuses and results of the record's attempts, each upstream request
// carrying its own attempt's traceparent, and a retry-wait event between.
func TestTraceRetriedRequestHasAttemptSpans(t *testing.T) {
	rcv := otlptest.StartHTTP(t)
	tr := newTestTracer(t, config.TracingHTTP, rcv.Endpoint, nil)
	up := &headerUpstream{fail: 1, status: http.StatusServiceUnavailable}
	tg := tracedGateway(t, up, tr, func(c *config.Config) { fastRetry(&c.Upstreams[0]) })

	resp, _ := post(t, tg.URL+"/v1/chat/completions", tracedBody, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	rec := tg.record(t)
	flush(t, tr)
	if rec.AttemptCount != 2 {
		t.Fatalf("%d attempts recorded, want 2", rec.AttemptCount)
	}

	reqs, attempts := splitSpans(rcv.Spans())
	if len(reqs) != 1 || len(attempts) != 2 {
		t.Fatalf("%d request spans and %d attempt spans, want 1 and 2", len(reqs), len(attempts))
	}
	s := reqs[0]
	if s.GetParentSpanId() != nil {
		t.Errorf("request without traceparent: span has parent %s", s.ParentID())
	}
	hs := up.got()
	for i, a := range attempts {
		// Attempts end in order, so they are exported in order.
		ac := a.Attrs()
		want := rec.Attempts[i]
		if a.ParentID() != s.SpanID() || a.TraceID() != s.TraceID() {
			t.Errorf("attempt %d under %s in %s, want under %s in %s", i+1, a.ParentID(), a.TraceID(), s.SpanID(), s.TraceID())
		}
		if ac["tollgate.attempt.number"] != int64(i+1) || ac["http.response.status_code"] != int64(want.Status) ||
			ac["tollgate.attempt.result"] != want.Result || ac["tollgate.upstream"] != want.Upstream {
			t.Errorf("attempt %d attributes %v, want record's %+v", i+1, ac, want)
		}
		if got, wantTP := hs[i].Get("traceparent"), "00-"+s.TraceID()+"-"+a.SpanID()+"-01"; got != wantTP {
			t.Errorf("upstream request %d traceparent %q, want %q", i+1, got, wantTP)
		}
	}
	if r := attempts[0].Attrs()["error.type"]; r != rec.Attempts[0].Result {
		t.Errorf("failed attempt's error.type %v, want %q", r, rec.Attempts[0].Result)
	}
	if attempts[0].GetStatus().GetCode() != tracepb.Status_STATUS_CODE_ERROR {
		t.Errorf("failed attempt's status %v", attempts[0].GetStatus())
	}
	var waits []*tracepb.Span_Event
	for _, e := range s.GetEvents() {
		if e.GetName() == tracing.EventRetryWait {
			waits = append(waits, e)
		}
	}
	if len(waits) != 1 {
		t.Fatalf("%d retry-wait events, want 1: %v", len(waits), s.GetEvents())
	}
	w := waits[0]
	if at := w.GetTimeUnixNano(); at < attempts[0].GetEndTimeUnixNano() || at > attempts[1].GetStartTimeUnixNano() {
		t.Errorf("retry wait at %d, not between the attempts (%d, %d)", at, attempts[0].GetEndTimeUnixNano(),
			attempts[1].GetStartTimeUnixNano())
	}
	ea := otlptest.Span{Span: &tracepb.Span{Attributes: w.GetAttributes()}}.Attrs()
	if ea["tollgate.retry.reason"] != rec.Attempts[0].Result || ea["tollgate.upstream"] != "mock" {
		t.Errorf("retry-wait event attributes %v", ea)
	}
	if got := s.Attrs()["tollgate.attempt_count"]; got != int64(2) {
		t.Errorf("tollgate.attempt_count %v", got)
	}
}

// TestTraceOverGRPC exports the request's spans to an OTLP/gRPC receiver.
func TestTraceOverGRPC(t *testing.T) {
	rcv := otlptest.StartGRPC(t)
	tr := newTestTracer(t, config.TracingGRPC, rcv.Endpoint, nil)
	tg := tracedGateway(t, &headerUpstream{}, tr, nil)

	resp, _ := post(t, tg.URL+"/v1/chat/completions", tracedBody, map[string]string{"traceparent": callerParent})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	tg.record(t)
	flush(t, tr)
	reqs, attempts := splitSpans(rcv.Spans())
	if len(reqs) != 1 || len(attempts) != 1 {
		t.Fatalf("%d request spans and %d attempt spans, want 1 and 1", len(reqs), len(attempts))
	}
	if s := reqs[0]; s.ParentID() != callerSpanID || s.GetName() != "chat gpt-4o-mini" {
		t.Errorf("span %q under %s", s.GetName(), s.ParentID())
	}
}

// TestTraceStalledCollectorDropsAndCounts holds the exporter in an export
// to a collector that never answers, with a queue of one span: every
// request still succeeds, the spans past the queue are dropped and counted
// in tollgate_tracing_dropped_spans_total, none waited for.
func TestTraceStalledCollectorDropsAndCounts(t *testing.T) {
	rcv := otlptest.StartHTTP(t)
	tr := newTestTracer(t, config.TracingHTTP, rcv.Endpoint, func(c *config.Tracing) {
		c.QueueSize = 1
		c.ExportTimeoutSeconds = 60
	})
	tg := tracedGateway(t, &headerUpstream{}, tr, nil)
	tg.registry.MustRegister(tr.Collector())

	// One request whose spans the exporter takes to the stalled collector,
	// where it waits.
	rcv.Stall()
	post(t, tg.URL+"/v1/chat/completions", tracedBody, nil)
	tg.record(t)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = tr.ForceFlush(ctx)
	}()
	rcv.WaitExport(t)
	// The exporter is held. The queue is empty, or holds the first
	// request's second span if a timed export took the first one alone.
	full0, _ := tr.Dropped()

	const n = 10
	for i := range n {
		resp, body := post(t, tg.URL+"/v1/chat/completions", tracedBody, nil)
		if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte("[DONE]")) {
			t.Fatalf("request %d: status %d, %q", i, resp.StatusCode, body)
		}
		tg.record(t)
	}
	// 2 spans a request (request and attempt); the queue holds one at most.
	full, _ := tr.Dropped()
	if d := full - full0; d != 2*n-1 && d != 2*n {
		t.Errorf("%d spans dropped for a full queue, want %d or %d", d, 2*n-1, 2*n)
	}
	wantMetric(t, tg, "tollgate_tracing_dropped_spans_total", map[string]string{"reason": "queue_full"}, float64(full))
	rcv.Unstall()
}

// TestTraceCollectorDownCountsFailedExports points the exporter at a
// closed port: requests succeed, and the spans whose export failed are
// counted as dropped (export_failed).
func TestTraceCollectorDownCountsFailedExports(t *testing.T) {
	tr := newTestTracer(t, config.TracingHTTP, closedPortURL(t), func(c *config.Tracing) {
		c.ExportTimeoutSeconds = 0.5
	})
	tg := tracedGateway(t, &headerUpstream{}, tr, nil)
	const n = 3
	for i := range n {
		resp, _ := post(t, tg.URL+"/v1/chat/completions", tracedBody, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
		tg.record(t)
	}
	flush(t, tr)
	if full, failed := tr.Dropped(); full != 0 || failed != 2*n {
		t.Errorf("dropped: %d for a full queue, %d failed exports; want 0 and %d", full, failed, 2*n)
	}
}

// TestTraceCaptureContent exports the request's messages only with
// capture_content, and never the caller's key.
func TestTraceCaptureContent(t *testing.T) {
	for _, capture := range []bool{false, true} {
		t.Run(fmt.Sprintf("capture=%v", capture), func(t *testing.T) {
			rcv := otlptest.StartHTTP(t)
			tr := newTestTracer(t, config.TracingHTTP, rcv.Endpoint, nil)
			tg := tracedGateway(t, &headerUpstream{}, tr, func(c *config.Config) { c.Tracing.CaptureContent = capture })
			post(t, tg.URL+"/v1/chat/completions", tracedBody, map[string]string{"Authorization": "Bearer sk-caller-key"})
			tg.record(t)
			flush(t, tr)
			reqs, _ := splitSpans(rcv.Spans())
			if len(reqs) != 1 {
				t.Fatalf("%d request spans", len(reqs))
			}
			var all strings.Builder
			for k, v := range reqs[0].Attrs() {
				fmt.Fprintf(&all, "%s=%v\n", k, v)
			}
			if strings.Contains(all.String(), "sk-caller-key") {
				t.Errorf("span shows the caller's key:\n%s", all.String())
			}
			got := reqs[0].Attrs()["tollgate.request.content"]
			want := any(nil)
			if capture {
				want = `[{"role":"user","content":"secret prompt"}]`
			}
			if got != want {
				t.Errorf("tollgate.request.content = %v, want %v", got, want)
			}
			if !capture && strings.Contains(all.String(), "secret prompt") {
				t.Errorf("content exported without capture_content:\n%s", all.String())
			}
		})
	}
}

// TestTraceRejectedRequest traces a request the gateway refuses before any
// attempt: the span carries error.type and no attempt child.
func TestTraceRejectedRequest(t *testing.T) {
	rcv := otlptest.StartHTTP(t)
	tr := newTestTracer(t, config.TracingHTTP, rcv.Endpoint, nil)
	tg := tracedGateway(t, &headerUpstream{}, tr, nil)
	resp, _ := post(t, tg.URL+"/v1/chat/completions", `{"model":`, nil)
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("status %d", resp.StatusCode)
	}
	tg.record(t)
	flush(t, tr)
	reqs, attempts := splitSpans(rcv.Spans())
	if len(reqs) != 1 || len(attempts) != 0 {
		t.Fatalf("%d request spans and %d attempt spans, want 1 and 0", len(reqs), len(attempts))
	}
	s := reqs[0]
	if s.Attrs()["error.type"] != "bad_request" || s.GetStatus().GetCode() != tracepb.Status_STATUS_CODE_ERROR ||
		s.GetName() != "chat" {
		t.Errorf("span %q, status %v, attributes %v", s.GetName(), s.GetStatus(), s.Attrs())
	}
}

// BenchmarkStreamTracing sends whole streamed requests (64 tokens) through
// the gateway over loopback with tracing off, on with a collector that
// takes the spans (OTLP/HTTP), and on with the collector down (a closed
// port: every export fails and its spans are dropped and counted). The
// relay must not slow down in either case.
func BenchmarkStreamTracing(b *testing.B) {
	const tokens = 64
	mock := httptest.NewServer(mockllm.New(mockllm.Options{OutputTokens: tokens}))
	defer mock.Close()
	body := `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hello"}]}`
	rcv := otlptest.StartHTTP(b)
	for _, c := range []struct{ name, endpoint string }{
		{"off", ""}, {"on", rcv.Endpoint}, {"collector_down", closedPortURL(b)},
	} {
		b.Run(c.name, func(b *testing.B) {
			var tr *tracing.Tracer
			if c.endpoint != "" {
				tr = newTestTracer(b, config.TracingHTTP, c.endpoint, func(t *config.Tracing) { t.ExportTimeoutSeconds = 1 })
			}
			g := bareGatewayWith(b, mock.URL, nil, func(o *Options) {
				if tr != nil {
					o.Tracer = tr.Tracer()
				}
			})
			gw := httptest.NewServer(g.Handler())
			defer gw.Close()
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
			defer client.CloseIdleConnections()
			b.ReportAllocs()
			for b.Loop() {
				resp, err := client.Post(gw.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				n, err := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 || n < 1000 {
					b.Fatalf("status %d, %d bytes, %v", resp.StatusCode, n, err)
				}
			}
			b.StopTimer()
			if tr != nil {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_ = tr.ForceFlush(ctx) // against the closed port: fails at once, counted
				cancel()
				full, failed := tr.Dropped()
				b.ReportMetric(float64(full+failed)/float64(b.N), "dropped/op")
			}
		})
	}
}

// TestTracingOffAllocatesNothing: without a Tracer every tracing hook of
// the request path is a nil check, allocating nothing.
func TestTracingOffAllocatesNothing(t *testing.T) {
	g := bareGateway(t, "http://127.0.0.1:1", nil)
	ex := &exchange{g: g, gen: g.gen.Load(), r: httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)}
	up := g.gen.Load().upstreams[0]
	h := http.Header{}
	allocs := testing.AllocsPerRun(100, func() {
		ex.startTrace()
		ex.startAttemptSpan(up, false, nil)
		ex.injectTrace(h)
		ex.traceRetryWait("mock", time.Millisecond, "server_error")
		ex.traceEvent(&sseparse.Event{Data: []byte(`{"id":"x","model":"m","choices":[{"finish_reason":"stop"}]}`)})
		ex.traceSkip("mock", "breaker_open")
		ex.endAttemptSpan(200, "ok")
		ex.endTrace(&ex.rec)
	})
	if allocs != 0 || ex.tr != nil || len(h) != 0 {
		t.Errorf("tracing off: %v allocations a request, state %v, header %v", allocs, ex.tr, h)
	}
}

// TestTraceNonStreamedResponseAttributes: a non-streamed answer's id, model
// and finish reasons are on the span; no stream attribute is.
func TestTraceNonStreamedResponseAttributes(t *testing.T) {
	rcv := otlptest.StartHTTP(t)
	tr := newTestTracer(t, config.TracingHTTP, rcv.Endpoint, nil)
	up := newFixedUpstream(http.StatusInternalServerError, "", "")
	up.okAuth = "Bearer ok"
	tg := tracedGateway(t, up, tr, nil)
	resp, _ := post(t, tg.URL+"/v1/chat/completions", `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`,
		map[string]string{"Authorization": "Bearer ok"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	tg.record(t)
	flush(t, tr)
	reqs, _ := splitSpans(rcv.Spans())
	if len(reqs) != 1 {
		t.Fatalf("%d request spans", len(reqs))
	}
	a := reqs[0].Attrs()
	if a["gen_ai.response.id"] != "chatcmpl-fixed" || a["gen_ai.response.model"] != "gpt-4o-mini" ||
		fmt.Sprint(a["gen_ai.response.finish_reasons"]) != "[stop]" {
		t.Errorf("response attributes: id %v, model %v, finish reasons %v", a["gen_ai.response.id"],
			a["gen_ai.response.model"], a["gen_ai.response.finish_reasons"])
	}
	if _, ok := a["gen_ai.request.stream"]; ok {
		t.Errorf("non-streamed request has gen_ai.request.stream")
	}
	if a["gen_ai.usage.input_tokens"] != int64(1) || a["gen_ai.usage.output_tokens"] != int64(1) {
		t.Errorf("usage %v / %v", a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"])
	}
}

// TestTraceProbeHasNoSpan: the synthetic probe's requests make no span and
// send the upstream no traceparent.
func TestTraceProbeHasNoSpan(t *testing.T) {
	rcv := otlptest.StartHTTP(t)
	tr := newTestTracer(t, config.TracingHTTP, rcv.Endpoint, nil)
	up := &headerUpstream{}
	tg := tracedGateway(t, up, tr, nil)
	res, err := tg.gw.Probe(testCtx(t), llm.ProbeTarget{Upstream: "mock", Model: "m", Dialect: llm.DialectOpenAI,
		Prompt: "hi", MaxTokens: 8})
	if err != nil || res.Result != "ok" {
		t.Fatalf("probe: %+v, %v", res, err)
	}
	flush(t, tr)
	if spans := rcv.Spans(); len(spans) != 0 {
		t.Errorf("%d spans for a probe, want none", len(spans))
	}
	if hs := up.got(); len(hs) != 1 || hs[0].Get("traceparent") != "" {
		t.Errorf("probe's upstream requests %d, traceparent %q", len(hs), hs[0].Get("traceparent"))
	}
}

// A stream's span carries its response's id, model and finish reasons, read
// from the events as they were relayed, in each dialect: the same the
// caller's stream carried (mockllm speaks each wire format).
func TestTraceStreamedResponseAttributes(t *testing.T) {
	cases := []struct {
		path, body, reasons string
	}{
		{"/v1/chat/completions", `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}`, "[stop]"},
		{"/v1/messages", `{"model":"claude-test","max_tokens":50,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, "[end_turn]"},
		{"/v1/responses", `{"model":"gpt-4o-mini","stream":true,"input":"hi"}`, "[completed]"},
	}
	for _, tc := range cases {
		t.Run(tc.path, func(t *testing.T) {
			rcv := otlptest.StartHTTP(t)
			tr := newTestTracer(t, config.TracingHTTP, rcv.Endpoint, nil)
			tg := tracedGateway(t, mockllm.New(mockllm.Options{OutputTokens: 3}), tr, nil)
			resp, body := post(t, tg.URL+tc.path, tc.body, map[string]string{"Authorization": "Bearer sk-x", "Anthropic-Version": "2023-06-01"})
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			tg.record(t)
			flush(t, tr)
			reqs, _ := splitSpans(rcv.Spans())
			if len(reqs) != 1 {
				t.Fatalf("%d request spans", len(reqs))
			}
			a := reqs[0].Attrs()
			id, _ := a["gen_ai.response.id"].(string)
			model, _ := a["gen_ai.response.model"].(string)
			if id == "" || !strings.Contains(string(body), `"`+id+`"`) || model == "" || !strings.Contains(string(body), `"model":"`+model+`"`) {
				t.Errorf("response id %q and model %q: not those the stream carried:\n%s", id, model, body)
			}
			if got := fmt.Sprint(a["gen_ai.response.finish_reasons"]); got != tc.reasons {
				t.Errorf("finish reasons %s, want %s", got, tc.reasons)
			}
		})
	}
}

// TestTraceContentCutAtRuneBoundaryDoesNotLoseBatch: with capture_content,
// a prompt of non-ASCII text longer than tracing.ContentLimit is cut in the
// middle of a rune; the span must still be exported (valid UTF-8), and the
// other spans of its batch with it.
func TestTraceContentCutAtRuneBoundaryDoesNotLoseBatch(t *testing.T) {
	rcv := otlptest.StartHTTP(t)
	tr := newTestTracer(t, config.TracingHTTP, rcv.Endpoint, nil)
	tg := tracedGateway(t, &headerUpstream{}, tr, func(c *config.Config) {
		c.Tracing.CaptureContent = true
		c.Server.MaxBodyBytes = 1 << 20
	})
	// `[{"role":"user","content":"` is 27 bytes: 16384-27 is odd, so the
	// cut falls inside a 2-byte é.
	big := `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"` +
		strings.Repeat("é", 10000) + `"}]}`
	post(t, tg.URL+"/v1/chat/completions", tracedBody, nil)
	tg.record(t)
	post(t, tg.URL+"/v1/chat/completions", big, nil)
	tg.record(t)
	flush(t, tr)
	_, failed := tr.Dropped()
	reqs, _ := splitSpans(rcv.Spans())
	if len(reqs) != 2 || failed != 0 {
		t.Fatalf("%d request spans exported, %d spans dropped as export_failed; want 2 and 0", len(reqs), failed)
	}
	for _, s := range reqs {
		if c, ok := s.Attrs()["tollgate.request.content"].(string); ok && !utf8.ValidString(c) {
			t.Errorf("request content is not valid UTF-8")
		}
	}
}

var _ = http.StatusOK
var _ = tracing.ContentLimit

// TestTraceRestartedTraceDropsCallersTracestate: a caller's traceparent
// that is not valid starts a new trace here; the upstream must not get the
// caller's tracestate, which belongs to a trace it is no longer in, beside
// the new traceparent.
func TestTraceRestartedTraceDropsCallersTracestate(t *testing.T) {
	rcv := otlptest.StartHTTP(t)
	tr := newTestTracer(t, config.TracingHTTP, rcv.Endpoint, nil)
	up := &headerUpstream{}
	tg := tracedGateway(t, up, tr, nil)
	post(t, tg.URL+"/v1/chat/completions", tracedBody, map[string]string{
		"traceparent": "00-not-a-valid-traceparent-01", "tracestate": callerState})
	tg.record(t)
	h := up.got()
	if len(h) != 1 {
		t.Fatalf("%d upstream requests", len(h))
	}
	tp, ts := h[0].Get("traceparent"), h[0].Values("tracestate")
	if strings.Contains(tp, "not-a-valid") {
		t.Fatalf("caller's traceparent forwarded raw: %q", tp)
	}
	if len(ts) != 0 {
		t.Errorf("upstream got traceparent %q (a new trace) with the caller's tracestate %q", tp, ts)
	}
}

// TestTraceResponsesFinishReasonsStreamedOrNot: the same Responses request
// through the same upstream, streamed and not: both spans carry the
// response's finish reasons (the stream's come from its terminal event's
// status; a non-streamed answer has the same status in its body).
func TestTraceResponsesFinishReasonsStreamedOrNot(t *testing.T) {
	rcv := otlptest.StartHTTP(t)
	tr := newTestTracer(t, config.TracingHTTP, rcv.Endpoint, nil)
	tg := tracedGateway(t, mockllm.New(mockllm.Options{OutputTokens: 3}), tr, nil)
	for _, stream := range []string{"true", "false"} {
		resp, _ := post(t, tg.URL+"/v1/responses", `{"model":"gpt-4o-mini","stream":`+stream+`,"input":"hi"}`, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("stream=%s: status %d", stream, resp.StatusCode)
		}
		tg.record(t)
	}
	flush(t, tr)
	reqs, _ := splitSpans(rcv.Spans())
	if len(reqs) != 2 {
		t.Fatalf("%d request spans", len(reqs))
	}
	for _, s := range reqs {
		a := s.Attrs()
		t.Logf("stream=%v id=%v model=%v finish_reasons=%v", a["gen_ai.request.stream"], a["gen_ai.response.id"],
			a["gen_ai.response.model"], a["gen_ai.response.finish_reasons"])
		if a["gen_ai.response.finish_reasons"] == nil {
			t.Errorf("span (stream=%v) has no gen_ai.response.finish_reasons", a["gen_ai.request.stream"])
		}
	}
}

// brokenFirstStream answers its first request with an Anthropic stream
// that opens (message_start of msg_first) and breaks before any token, and
// every later one with mockllm's whole stream.
type brokenFirstStream struct {
	n    atomic.Int32
	next http.Handler
}

func (u *brokenFirstStream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if u.n.Add(1) > 1 {
		u.next.ServeHTTP(w, r)
		return
	}
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "text/event-stream")
	_, _ = io.WriteString(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_first\","+
		"\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-broken\",\"content\":[],\"stop_reason\":null,"+
		"\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n")
	w.(http.Flusher).Flush()
	panic(http.ErrAbortHandler) // the connection breaks before the first token
}

// TestTraceRetriedStreamHasServedResponseID: a stream whose first attempt
// opened (message_start) and broke before anything reached the caller is
// retried; the span's gen_ai.response.id and .model must be those of the
// response the caller got, not the abandoned attempt's.
func TestTraceRetriedStreamHasServedResponseID(t *testing.T) {
	rcv := otlptest.StartHTTP(t)
	tr := newTestTracer(t, config.TracingHTTP, rcv.Endpoint, nil)
	up := &brokenFirstStream{next: mockllm.New(mockllm.Options{OutputTokens: 3})}
	tg := tracedGateway(t, up, tr, nil)
	resp, body := post(t, tg.URL+"/v1/messages",
		`{"model":"claude-sonnet-4","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
	rec := tg.record(t)
	if resp.StatusCode != http.StatusOK || rec.AttemptCount < 2 {
		t.Fatalf("status %d, %d attempts; want 200 after a retry", resp.StatusCode, rec.AttemptCount)
	}
	if strings.Contains(string(body), "msg_first") {
		t.Fatalf("the caller got the broken attempt's events")
	}
	flush(t, tr)
	reqs, _ := splitSpans(rcv.Spans())
	if len(reqs) != 1 {
		t.Fatalf("%d request spans", len(reqs))
	}
	a := reqs[0].Attrs()
	if a["gen_ai.response.id"] == "msg_first" || a["gen_ai.response.model"] == "claude-broken" {
		t.Errorf("span names the abandoned attempt's response: id %v, model %v (the caller got %.120q)",
			a["gen_ai.response.id"], a["gen_ai.response.model"], body)
	}
}

// TestTraceUpstreamInvalidUTF8IDDoesNotLoseBatch: capture_content off; an
// upstream's stream opens with a response id holding a byte that is not
// UTF-8. That span must not make the export of its batch (another
// request's span here) fail.
func TestTraceUpstreamInvalidUTF8IDDoesNotLoseBatch(t *testing.T) {
	for _, proto := range []string{config.TracingHTTP, config.TracingGRPC} {
		t.Run(proto, func(t *testing.T) { upstreamInvalidUTF8ID(t, proto) })
	}
}

func upstreamInvalidUTF8ID(t *testing.T, proto string) {
	rcv := otlptest.StartHTTP(t)
	if proto == config.TracingGRPC {
		rcv = otlptest.StartGRPC(t)
	}
	tr := newTestTracer(t, proto, rcv.Endpoint, nil)
	var n atomic.Int32
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		id := "chatcmpl-ok"
		if n.Add(1) == 2 {
			id = "chatcmpl-\xff"
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, d := range []string{
			`{"id":"` + id + `","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"role":"assistant","content":"hi"},"finish_reason":null}]}`,
			`{"id":"` + id + `","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
			`{"id":"` + id + `","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`,
			`[DONE]`} {
			_, _ = io.WriteString(w, "data: "+d+"\n\n")
		}
	})
	tg := tracedGateway(t, up, tr, nil)
	for range 2 {
		post(t, tg.URL+"/v1/chat/completions", tracedBody, nil)
		tg.record(t)
	}
	flush(t, tr)
	_, failed := tr.Dropped()
	reqs, _ := splitSpans(rcv.Spans())
	if failed != 0 || len(reqs) != 2 {
		t.Fatalf("%d request spans exported, %d spans dropped as export_failed; want 2 and 0", len(reqs), failed)
	}
}

// With tracing on, reading a stream's events for the span allocates
// nothing per token event once the response is named: only the id, model
// and finish reason strings, once a stream.
func TestTraceEventAllocatesNothingPerTokenEvent(t *testing.T) {
	ex := &exchange{tr: &exchangeTrace{}}
	ex.rec.Dialect = llm.DialectOpenAI
	open := &sseparse.Event{Data: []byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}`)}
	token := &sseparse.Event{Data: []byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}`)}
	ex.traceEvent(open)
	if allocs := testing.AllocsPerRun(200, func() { ex.traceEvent(token) }); allocs != 0 {
		t.Errorf("%v allocations per token event with tracing on, want 0", allocs)
	}
	if ex.tr.respID != "chatcmpl-1" || ex.tr.respModel != "gpt-4o-mini" {
		t.Errorf("named %q %q", ex.tr.respID, ex.tr.respModel)
	}
}
