package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/tollgate-llm/tollgate/internal/jsonlog"
	"github.com/tollgate-llm/tollgate/llm"
)

// fieldCase is a finished record whose access line and span are compared.
type fieldCase struct {
	name  string
	path  string // the request's path, for the span's operation name
	probe bool
	rec   llm.Record
}

// fieldCases are records as the gateway finishes them, together covering
// every presence rule of recordFields both ways: a retried stream with every
// figure, a non-streamed answer billed on estimates, refusals with a reason,
// an upstream's error with its type, interrupted streams, an incomplete
// Responses answer, a probe, a request refused before anything was known.
func fieldCases() []fieldCase {
	t0 := time.Date(2026, 12, 2, 11, 27, 41, 0, time.UTC)
	ended := func(d time.Duration) llm.Timing { return llm.Timing{In: t0, End: t0.Add(d)} }
	attempt := func(r *llm.Record, up string, status int, result string) {
		r.AddAttempt(llm.Attempt{Upstream: up, Status: status, Result: result, Duration: 3 * time.Millisecond})
	}

	okStream := *streamedRecord()
	okStream.TraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	okStream.Usage.CacheRead, okStream.Usage.CacheWrite = 12, 5
	okStream.QueueWait = 2 * time.Millisecond

	estimated := llm.Record{RequestID: "tg_est", KeyID: "alpha", Team: "search", Route: llm.RouteMessages,
		Dialect: llm.DialectAnthropic, Model: "claude-test", Upstream: "primary", Status: 200, Timing: ended(80 * time.Millisecond),
		Usage: llm.Usage{Input: 812, Output: 64, HasInput: true}, InputEstimated: true, Estimated: true, CostMicros: 3400,
		InputBucket: "500-2000", Goodput: llm.SLOMet, BytesOut: 900}
	attempt(&estimated, "primary", 200, "ok")

	notAllowed := llm.Record{RequestID: "tg_403", KeyID: "alpha", Team: "search", Route: llm.RouteChatCompletions,
		Dialect: llm.DialectOpenAI, Model: "gpt-test", Status: 403, Timing: ended(time.Millisecond),
		Outcome: llm.OutcomeRejected, Rejection: llm.RejectModelNotAllowed, InputBucket: "0-500", Goodput: llm.SLOFailed, BytesOut: 145}

	limited := llm.Record{RequestID: "tg_429", KeyID: "beta", Team: "ads", Route: llm.RouteMessages,
		Dialect: llm.DialectAnthropic, Model: "claude-test", Stream: true, Status: 429, Timing: ended(time.Millisecond),
		Outcome: llm.OutcomeRejected, Rejection: llm.RejectRPM, ErrorType: "rate_limit_error", InputBucket: "0-500",
		Goodput: llm.SLOFailed, BytesOut: 210}

	upstreamErr := llm.Record{RequestID: "tg_529", KeyID: "e0af5a5e4f88", Route: llm.RouteMessages, Dialect: llm.DialectAnthropic,
		Model: "claude-test", Upstream: "primary", Status: 529, UpstreamRequestID: "req_529", Timing: ended(400 * time.Millisecond),
		Outcome: llm.OutcomeUpstreamError, ErrorType: "overloaded_error", InputBucket: "0-500", Goodput: llm.SLOFailed,
		BytesOut: 120, RetryWait: 250 * time.Millisecond}
	attempt(&upstreamErr, "primary", 529, "overloaded")
	attempt(&upstreamErr, "primary", 529, "overloaded")

	// A stream the caller left after its first tokens: no terminal, no
	// reported usage (counted), no inter-token gap yet, no error type.
	cancelled := llm.Record{RequestID: "tg_cancel", KeyID: "e0af5a5e4f88", Route: llm.RouteChatCompletions,
		Dialect: llm.DialectOpenAI, Model: "gpt-4o-mini", Upstream: "primary", Stream: true, Status: 200,
		Timing: llm.Timing{In: t0, UpSent: t0.Add(time.Millisecond), FirstToken: t0.Add(90 * time.Millisecond),
			FirstTokenOut: t0.Add(91 * time.Millisecond), LastToken: t0.Add(90 * time.Millisecond), End: t0.Add(95 * time.Millisecond)},
		Usage: llm.Usage{Output: 1}, Estimated: true, TokenEvents: 1, Outcome: llm.OutcomeClientCancel,
		Interruption: llm.InterruptClientCancel, InputBucket: "0-500", Goodput: llm.SLOFailed, BytesOut: 300}
	attempt(&cancelled, "primary", 200, "client_gone")

	// A stream that broke before its first token: nothing but the
	// events' count, an error event's type.
	broken := llm.Record{RequestID: "tg_broken", KeyID: "e0af5a5e4f88", Route: llm.RouteResponses, Dialect: llm.DialectResponses,
		Model: "gpt-4o-mini", Upstream: "primary", Stream: true, Status: 200, Timing: ended(30 * time.Millisecond),
		Outcome: llm.OutcomeUpstreamError, Interruption: llm.InterruptUpstreamErrorEvent, ErrorType: "server_error",
		InputBucket: "0-500", Goodput: llm.SLOFailed, BytesOut: 80}
	attempt(&broken, "primary", 200, "error_event")

	incomplete := llm.Record{RequestID: "tg_incomplete", KeyID: "e0af5a5e4f88", Route: llm.RouteResponses,
		Dialect: llm.DialectResponses, Model: "gpt-4o-mini", Upstream: "primary", Status: 200, Timing: ended(50 * time.Millisecond),
		Usage: llm.Usage{Input: 10, Output: 16, Reasoning: 16, HasInput: true, HasOutput: true}, IncompleteReason: "max_output_tokens",
		InputBucket: "0-500", Goodput: llm.SLOMet, BytesOut: 700}
	attempt(&incomplete, "primary", 200, "ok")

	probe := llm.Record{RequestID: "tg_probe", KeyID: "e0af5a5e4f88", Route: llm.RouteChatCompletions, Dialect: llm.DialectOpenAI,
		Model: "probe-model", Upstream: "mock", Status: 200, Timing: ended(20 * time.Millisecond),
		Usage: llm.Usage{Input: 15, Output: 8, HasInput: true, HasOutput: true}, InputBucket: "0-500", BytesOut: 400}
	attempt(&probe, "mock", 200, "ok")

	// Refused at the edge, before its key, body or upstream were read.
	badPath := llm.Record{RequestID: "tg_400", Status: 400, Timing: ended(0), Outcome: llm.OutcomeRejected,
		Rejection: llm.RejectNonCanonicalPath, InputBucket: "unknown", Goodput: llm.SLOFailed, BytesOut: 251}

	// A turn on a Responses WebSocket: the record says its transport.
	socketTurn := *streamedRecord()
	socketTurn.RequestID, socketTurn.Transport = "tg_ws", llm.TransportWebSocket
	socketTurn.Route, socketTurn.Dialect = llm.RouteResponses, llm.DialectResponses
	// A subagent's call of a coding agent's session.
	socketTurn.Conversation, socketTurn.ConversationSource = "9253e8ff0c3a4b1d9253e8ff0c3a4b1d", "session-id"
	socketTurn.RequestClass, socketTurn.Agent = "subagent", "4b1d9253e8ff"

	return []fieldCase{
		{name: "ok stream", path: "/v1/chat/completions", rec: okStream},
		{name: "estimated tokens", path: "/v1/messages", rec: estimated},
		{name: "rejected: model not allowed", path: "/v1/chat/completions", rec: notAllowed},
		{name: "rejected: rate limit", path: "/v1/messages", rec: limited},
		{name: "upstream error with type", path: "/v1/messages", rec: upstreamErr},
		{name: "stream cancelled", path: "/v1/chat/completions", rec: cancelled},
		{name: "stream broken by an error event", path: "/v1/responses", rec: broken},
		{name: "incomplete answer", path: "/v1/responses", rec: incomplete},
		{name: "a WebSocket turn", path: "/v1/responses", rec: socketTurn},
		{name: "probe", path: "/v1/chat/completions", probe: true, rec: probe},
		{name: "bad path", path: "/v1/models%2F..%2Ffiles", rec: badPath},
	}
}

// logFields writes rec's access line as the gateway does and returns its
// fields, the handler's own (time, level, msg) left out.
func logFields(t *testing.T, rec *llm.Record, probe bool) map[string]any {
	t.Helper()
	var b bytes.Buffer
	logRecord(slog.New(jsonlog.NewHandler(&b, nil)), rec, probe)
	var m map[string]any
	if err := json.Unmarshal(b.Bytes(), &m); err != nil {
		t.Fatalf("access line %q: %v", b.String(), err)
	}
	delete(m, slog.TimeKey)
	delete(m, slog.LevelKey)
	delete(m, slog.MessageKey)
	return m
}

// spanFields ends the span of an exchange that finished as rec, through
// the gateway's own span path (startTrace, endTrace) on a tracer whose
// spans are recorded in memory, and returns its attributes.
func spanFields(t *testing.T, g *Gateway, sr *tracetest.SpanRecorder, path string, rec llm.Record) map[attribute.Key]attribute.Value {
	t.Helper()
	n := len(sr.Ended())
	ex := &exchange{g: g, gen: g.gen.Load(), r: httptest.NewRequest(http.MethodPost, "/", nil)}
	ex.r.URL.RawPath, ex.r.URL.Path = path, path
	ex.rec.Timing.In = rec.Timing.In
	ex.startTrace()
	if ex.tr == nil {
		t.Fatal("no span started")
	}
	ex.rec = rec
	ex.endTrace(&ex.rec)
	ended := sr.Ended()
	if len(ended) != n+1 {
		t.Fatalf("%d spans ended, want 1", len(ended)-n)
	}
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range ended[n].Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// TestAccessLogAndSpanCarryTheSameFields writes records covering every
// presence rule both ways through the access log and the request's span:
// the fields present on the line are, under recordFields' mapping, the
// attributes present on the span, with the same values, apart from those
// declared log-only or span-only. A field added to one side alone fails it.
func TestAccessLogAndSpanCarryTheSameFields(t *testing.T) {
	byLog := map[string]*recordField{}
	bySpan := map[attribute.Key]*recordField{}
	for i := range recordFields {
		f := &recordFields[i]
		if byLog[f.log] != nil || f.span != "" && bySpan[f.span] != nil {
			t.Errorf("%s (%s) is in recordFields twice", f.log, f.span)
		}
		byLog[f.log] = f
		if (f.span == "") == (f.logOnly == "") {
			t.Errorf("%s: a field has a span attribute or says why it has none (logOnly), not both", f.log)
		}
		if f.span != "" {
			bySpan[f.span] = f
		}
		if slices.Contains(spanOnly[:], f.span) {
			t.Errorf("%s is span-only and the span of %s", f.span, f.log)
		}
	}

	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	g := bareGatewayWith(t, "http://127.0.0.1:1", nil, func(o *Options) { o.Tracer = tp.Tracer("test") })

	seen, missed := map[string]bool{}, map[string]bool{}
	for _, c := range fieldCases() {
		t.Run(c.name, func(t *testing.T) {
			line := logFields(t, &c.rec, c.probe)
			span := spanFields(t, g, sr, c.path, c.rec)
			if got := line[probeField] == true; got != c.probe {
				t.Errorf("probe field %v, want %v", line[probeField], c.probe)
			}
			delete(line, probeField)
			for _, k := range spanOnly {
				delete(span, k)
			}
			for name, lv := range line {
				f := byLog[name]
				if f == nil {
					t.Errorf("access log field %s is not in recordFields", name)
					continue
				}
				if f.logOnly != "" || f.spanTrueOnly && lv == false {
					continue
				}
				sv, ok := span[f.span]
				if !ok {
					t.Errorf("access log has %s = %v, span lacks %s", name, lv, f.span)
					continue
				}
				if !sameValue(lv, sv) {
					t.Errorf("access log %s = %v, span %s = %v", name, lv, f.span, sv.String())
				}
			}
			for k, sv := range span {
				f := bySpan[k]
				if f == nil {
					t.Errorf("span attribute %s = %v is neither in recordFields nor span-only", k, sv.String())
					continue
				}
				if _, ok := line[f.log]; !ok {
					t.Errorf("span has %s = %v, access log lacks %s", k, sv.String(), f.log)
				}
			}
			for i := range recordFields {
				f := &recordFields[i]
				if _, ok := line[f.log]; ok {
					seen[f.log] = true
				} else {
					missed[f.log] = true
				}
			}
		})
	}
	// Every rule was seen to hold and, where there is a rule, to fail.
	for i := range recordFields {
		f := &recordFields[i]
		if !seen[f.log] || f.present != nil && !missed[f.log] {
			t.Errorf("%s: the cases have it present %v, absent %v; want both (absent only if it has a rule)",
				f.log, seen[f.log], missed[f.log])
		}
	}
}

// sameValue says whether an access-log value, as JSON decodes it, is the
// span attribute's.
func sameValue(lv any, sv attribute.Value) bool {
	switch sv.Type() {
	case attribute.STRING:
		return lv == sv.AsString()
	case attribute.BOOL:
		return lv == sv.AsBool()
	case attribute.INT64:
		f, ok := lv.(float64)
		return ok && f == float64(sv.AsInt64())
	case attribute.FLOAT64:
		f, ok := lv.(float64)
		return ok && f == sv.AsFloat64()
	}
	return false
}
