package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate-llm/tollgate/internal/jsonscan"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/sseparse"
	"github.com/tollgate-llm/tollgate/tracing"
)

// exchangeTrace is an exchange's tracing state, nil when tracing is off
// (Options.Tracer nil) and for the synthetic probe, so that neither
// allocates anything for it.
//
// The request's span starts at t_in (handle) and ends at t_end (finish);
// every attribute it carries is set at the end from the finished record,
// the one the access log writes, so the two agree by construction. Each
// request sent upstream is a child span from just before its request is
// built to the attempt's end; its context is the traceparent the upstream
// gets. Upstreams skipped and retry waits are events on the request's span.
type exchangeTrace struct {
	ctx     context.Context // carries span
	span    trace.Span
	attempt trace.Span // the attempt in progress, nil between attempts
	n       int        // attempts started
	content string     // the request's messages (capture_content)
	cut     bool       // content was cut at tracing.ContentLimit

	// A stream's response id, model and finish reasons, read from its
	// events as they are relayed (traceEvent); a non-streamed answer's come
	// from its body at the end.
	respID, respModel string
	reasons           []string
}

// startTrace starts the request's span, continuing the caller's W3C trace
// context if it sent one, and returns its trace id for the record (the
// access log's trace_id), "" when it is not sampled or tracing is off.
func (ex *exchange) startTrace() string {
	tr := ex.g.tracer
	if tr == nil {
		return ""
	}
	parent := tracing.Propagator.Extract(ex.r.Context(), propagation.HeaderCarrier(ex.r.Header))
	// The name wants the model, read later from the body: SetName at the end.
	ctx, span := tr.Start(parent, tracing.OpForward, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithTimestamp(ex.rec.Timing.In))
	ex.tr = &exchangeTrace{ctx: ctx, span: span}
	if sc := span.SpanContext(); sc.IsSampled() {
		return sc.TraceID().String()
	}
	return ""
}

// startAttemptSpan starts the span of an attempt on up; body is the
// request as the caller sent it (captured once, with capture_content).
func (ex *exchange) startAttemptSpan(up *upstream, bypass bool, body []byte) {
	t := ex.tr
	if t == nil {
		return
	}
	if ex.g.traceContent && t.n == 0 {
		t.content, t.cut = requestContent(body)
	}
	// What the response is comes from the attempt that serves it, not
	// from one that opened a stream and broke.
	t.respID, t.respModel, t.reasons = "", "", t.reasons[:0]
	t.n++
	attrs := []attribute.KeyValue{tracing.Upstream.String(up.cfg.Name), tracing.AttemptNumber.Int(t.n)}
	if bypass {
		attrs = append(attrs, tracing.BreakerBypass.Bool(true))
	}
	_, t.attempt = ex.g.tracer.Start(t.ctx, tracing.SpanAttempt, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithTimestamp(ex.g.now()), trace.WithAttributes(attrs...))
}

// endAttemptSpan ends the attempt's span with the upstream's status (0:
// none) and the attempt's result, the upstream_attempts_total label.
func (ex *exchange) endAttemptSpan(status int, result string) {
	t := ex.tr
	if t == nil || t.attempt == nil {
		return
	}
	if status != 0 {
		t.attempt.SetAttributes(tracing.HTTPResponseStatusCode.Int(status))
	}
	t.attempt.SetAttributes(tracing.AttemptResult.String(result))
	if result != resultOK {
		t.attempt.SetAttributes(tracing.ErrorType.String(result))
		t.attempt.SetStatus(codes.Error, result)
	}
	t.attempt.End(trace.WithTimestamp(ex.g.now()))
	t.attempt = nil
}

// injectTrace puts the current attempt's trace context (else the
// request's) on the upstream request, in place of the caller's.
func (ex *exchange) injectTrace(h http.Header) {
	t := ex.tr
	if t == nil {
		return
	}
	ctx := t.ctx
	if t.attempt != nil {
		ctx = trace.ContextWithSpan(ctx, t.attempt)
	}
	// The caller's own go: a tracestate the propagator did not take (the
	// caller's traceparent invalid, or the tracestate malformed) would
	// otherwise ride along with a trace it does not belong to.
	h.Del("Traceparent")
	h.Del("Tracestate")
	tracing.Propagator.Inject(ctx, propagation.HeaderCarrier(h))
}

// traceRetryWait marks the start of a wait of d before the next attempt on
// upstream, after an attempt that ended with result.
func (ex *exchange) traceRetryWait(upstream string, d time.Duration, result string) {
	if ex.tr == nil {
		return
	}
	ex.tr.span.AddEvent(tracing.EventRetryWait, trace.WithTimestamp(ex.g.now()), trace.WithAttributes(
		tracing.Upstream.String(upstream), tracing.RetryWaitMs.Float64(ms(d)), tracing.RetryReason.String(result)))
}

// traceSkip marks an upstream passed over without an attempt.
func (ex *exchange) traceSkip(upstream, why string) {
	if ex.tr == nil {
		return
	}
	ex.tr.span.AddEvent(tracing.EventSkipped, trace.WithTimestamp(ex.g.now()), trace.WithAttributes(
		tracing.Upstream.String(upstream), tracing.AttemptResult.String(why)))
}

// endTrace ends the request's span at t_end with the finished record's
// (rec) figures. An attempt span a panic left open ends with it.
func (ex *exchange) endTrace(rec *llm.Record) {
	t := ex.tr
	if t == nil {
		return
	}
	if t.attempt != nil {
		ex.endAttemptSpan(0, "panic")
	}
	op := operationName(rec.Route, ex.r.URL.Path)
	name := op
	if rec.Model != "" {
		name = op + " " + rec.Model
	}
	t.span.SetName(strings.ToValidUTF8(name, "\uFFFD"))
	if t.span.IsRecording() {
		t.span.SetAttributes(validUTF8(ex.spanAttributes(rec, op))...)
	}
	if rec.Outcome != llm.OutcomeOK {
		t.span.SetStatus(codes.Error, rec.Outcome.String())
	}
	t.span.End(trace.WithTimestamp(rec.Timing.End))
}

// validUTF8 replaces the bytes of string attributes that are not UTF-8
// (an upstream's id or error type, content cut inside a character) with
// U+FFFD: OTLP's protobuf encoding refuses such a string, and with it the
// whole batch of spans it travels in.
func validUTF8(attrs []attribute.KeyValue) []attribute.KeyValue {
	for i, kv := range attrs {
		switch kv.Value.Type() {
		case attribute.STRING:
			if v := kv.Value.AsString(); !utf8.ValidString(v) {
				attrs[i] = kv.Key.String(strings.ToValidUTF8(v, "\uFFFD"))
			}
		case attribute.STRINGSLICE:
			vs := kv.Value.AsStringSlice()
			for j, v := range vs {
				vs[j] = strings.ToValidUTF8(v, "\uFFFD")
			}
			attrs[i] = kv.Key.StringSlice(vs)
		}
	}
	return attrs
}

// spanAttributes returns the request span's attributes: the GenAI
// conventions' that are not the record's (spanOnly), then the record's
// fields that recordFields gives a span attribute, under the same
// conditions and with the same values as the access log writes them.
func (ex *exchange) spanAttributes(rec *llm.Record, op string) []attribute.KeyValue {
	a := make([]attribute.KeyValue, 0, 48)
	a = append(a, tracing.OperationName.String(op))
	if p := ex.providerName(); p != "" {
		a = append(a, tracing.ProviderName.String(p))
	}
	if ex.info.MaxTokens > 0 {
		a = append(a, tracing.RequestMaxTokens.Int64(ex.info.MaxTokens))
	}
	if hasTTFT(rec) {
		a = append(a, tracing.ResponseTimeToFirstChunk.Float64(rec.TTFT().Seconds()))
	}
	for i := range recordFields {
		f := &recordFields[i]
		if f.span == "" || f.present != nil && !f.present(rec) {
			continue
		}
		v := f.value(rec)
		if f.spanTrueOnly && !v.Bool() {
			continue
		}
		a = append(a, spanAttribute(f.span, v))
	}
	a = ex.responseAttributes(rec, a)
	if ex.g.traceContent {
		a = ex.contentAttributes(rec, a)
	}
	return a
}

// maxTracedChoices bounds the finish reasons a stream's span keeps: one per
// choice index below it.
const maxTracedChoices = 128

// traceEvent reads a relayed stream event for the span's response
// attributes: the response's id and model from the event that opens it
// (an OpenAI chunk, Anthropic's message_start, a Responses
// response.created), its finish reasons from the events that carry them
// (an OpenAI chunk's choices, Anthropic's message_delta, a Responses
// terminal event's status or incomplete reason). With tracing off it is a
// nil check.
func (ex *exchange) traceEvent(ev *sseparse.Event) {
	t := ex.tr
	if t == nil || len(ev.Data) == 0 || ev.Data[0] != '{' {
		return
	}
	str := func(obj []byte, key string) string {
		v, _ := jsonscan.Get(obj, key)
		s, ok := jsonscan.String(v)
		if !ok || len(s) == 0 {
			return ""
		}
		return string(jsonscan.AppendUnescape(nil, s))
	}
	opened := func(obj []byte) {
		if t.respID == "" {
			t.respID, t.respModel = str(obj, "id"), str(obj, "model")
		}
	}
	switch ex.rec.Dialect {
	case llm.DialectOpenAI:
		opened(ev.Data)
		if !bytes.Contains(ev.Data, []byte(`"finish_reason":"`)) && !bytes.Contains(ev.Data, []byte(`"finish_reason": "`)) {
			return
		}
		// One reason per choice, by its index: a provider may repeat it
		// (on the usage chunk, say).
		choices, _ := jsonscan.Get(ev.Data, "choices")
		for it := jsonscan.Array(choices); it.Next(); {
			c := it.Value()
			r := str(c, "finish_reason")
			iv, _ := jsonscan.Get(c, "index")
			i, ok := jsonscan.Int(iv)
			if r == "" || !ok || i < 0 || i >= maxTracedChoices {
				continue
			}
			for int64(len(t.reasons)) <= i {
				t.reasons = append(t.reasons, "")
			}
			t.reasons[i] = r
		}
	case llm.DialectAnthropic:
		switch string(ev.Type) {
		case "message_start":
			msg, _ := jsonscan.Get(ev.Data, "message")
			opened(msg)
		case "message_delta":
			delta, _ := jsonscan.Get(ev.Data, "delta")
			if r := str(delta, "stop_reason"); r != "" {
				t.reasons = append(t.reasons[:0], r)
			}
		}
	case llm.DialectResponses:
		switch string(ev.Type) {
		case "response.created", "response.completed", "response.incomplete", "response.failed":
			resp, _ := jsonscan.Get(ev.Data, "response")
			opened(resp)
			if string(ev.Type) == "response.created" {
				return
			}
			details, _ := jsonscan.Get(resp, "incomplete_details")
			if r := str(details, "reason"); r != "" {
				t.reasons = append(t.reasons[:0], r)
			} else if r := str(resp, "status"); r != "" {
				t.reasons = append(t.reasons[:0], r)
			}
		}
	}
}

// responseAttributes adds gen_ai.response.id, .model and .finish_reasons:
// a stream's, read from its events as they were relayed (traceEvent), or
// read from a non-streamed success's body, the bounded copy the gateway
// keeps for its usage.
func (ex *exchange) responseAttributes(rec *llm.Record, a []attribute.KeyValue) []attribute.KeyValue {
	var id, model string
	var reasons []string
	if rec.Stream {
		id, model = ex.tr.respID, ex.tr.respModel
		for _, r := range ex.tr.reasons {
			if r != "" {
				reasons = append(reasons, r)
			}
		}
	} else if captured := ex.lastAttempt().captured; rec.Status/100 == 2 && rec.Dialect != llm.DialectNone && len(captured) > 0 {
		id, model, reasons = answerResponse(rec.Dialect, captured)
	}
	if id != "" {
		a = append(a, tracing.ResponseID.String(id))
	}
	if model != "" {
		a = append(a, tracing.ResponseModel.String(model))
	}
	if len(reasons) > 0 {
		a = append(a, tracing.ResponseFinishReasons.StringSlice(reasons))
	}
	return a
}

// answerResponse reads a non-streamed answer's id, model and finish
// reasons from its body: an OpenAI answer's choices, an Anthropic
// stop_reason, a Responses answer's incomplete reason or else its status.
func answerResponse(d llm.Dialect, body []byte) (id, model string, reasons []string) {
	var f struct {
		ID      string `json:"id"`
		Model   string `json:"model"`
		Choices []struct {
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
		StopReason        *string `json:"stop_reason"` // Anthropic
		Status            string  `json:"status"`      // Responses
		IncompleteDetails *struct {
			Reason string `json:"reason"`
		} `json:"incomplete_details"`
	}
	if json.Unmarshal(body, &f) != nil {
		return "", "", nil
	}
	for _, c := range f.Choices {
		if c.FinishReason != nil {
			reasons = append(reasons, *c.FinishReason)
		}
	}
	if f.StopReason != nil {
		reasons = append(reasons, *f.StopReason)
	}
	if d == llm.DialectResponses {
		switch {
		case f.IncompleteDetails != nil && f.IncompleteDetails.Reason != "":
			reasons = append(reasons, f.IncompleteDetails.Reason)
		case f.Status != "":
			reasons = append(reasons, f.Status)
		}
	}
	return f.ID, f.Model, reasons
}

// contentAttributes adds the captured request messages and a non-streamed
// answer's body (capture_content), each bounded.
func (ex *exchange) contentAttributes(rec *llm.Record, a []attribute.KeyValue) []attribute.KeyValue {
	t := ex.tr
	cut := t.cut
	if t.content != "" {
		a = append(a, tracing.RequestContent.String(t.content))
	}
	if body := ex.lastAttempt().captured; !rec.Stream && len(body) > 0 {
		if len(body) > tracing.ContentLimit {
			body, cut = body[:tracing.ContentLimit], true
		}
		a = append(a, tracing.ResponseContent.String(string(body)))
	}
	if cut {
		a = append(a, tracing.ContentTruncated.Bool(true))
	}
	return a
}

// requestContent returns the request's messages as JSON ("messages", or a
// Responses request's "input"; with an Anthropic "system" prompt, both in
// one object), cut at tracing.ContentLimit.
func requestContent(body []byte) (string, bool) {
	var f struct {
		Messages json.RawMessage `json:"messages"`
		Input    json.RawMessage `json:"input"`
		System   json.RawMessage `json:"system"`
	}
	if json.Unmarshal(body, &f) != nil {
		return "", false
	}
	c := f.Messages
	if len(c) == 0 {
		c = f.Input
	}
	if len(f.System) > 0 {
		if b, err := json.Marshal(map[string]json.RawMessage{"system": f.System, "messages": c}); err == nil {
			c = b
		}
	}
	if len(c) > tracing.ContentLimit {
		return string(c[:tracing.ContentLimit]), true
	}
	return string(c), false
}

// operationName is gen_ai.operation.name: "chat" for the dialect routes, a
// well-known name for the forwarded embeddings and legacy completions
// paths, else tollgate's own.
func operationName(route llm.Route, path string) string {
	switch route {
	case llm.RouteChatCompletions, llm.RouteMessages, llm.RouteResponses, llm.RouteResponsesRetrieve:
		return tracing.OpChat
	}
	switch strings.TrimSuffix(path, "/") {
	case "/v1/embeddings":
		return tracing.OpEmbeddings
	case "/v1/completions":
		return tracing.OpTextCompletion
	}
	return tracing.OpForward
}

// providerName is gen_ai.provider.name: the API the request speaks, or for
// a forwarded request the first one its upstream serves.
func (ex *exchange) providerName() string {
	d := ex.rec.Dialect
	if up := ex.lastAttempt().up; d == llm.DialectNone && up != nil && len(up.cfg.Dialects) > 0 {
		d, _ = llm.ParseDialect(up.cfg.Dialects[0])
	}
	switch d {
	case llm.DialectOpenAI, llm.DialectResponses:
		return tracing.ProviderOpenAI
	case llm.DialectAnthropic:
		return tracing.ProviderAnthropic
	}
	return ""
}

// errorType is error.type (the access log's error_type) for a failed
// exchange: the upstream's error type when it named one, else the outcome
// (low cardinality either way).
func errorType(rec *llm.Record) string {
	if rec.ErrorType != "" {
		return rec.ErrorType
	}
	return rec.Outcome.String()
}
