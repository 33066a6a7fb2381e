package proxy

import (
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/tracing"
)

// recordField is one field of a finished request's record as the access
// log and the request's span both carry it: its access-log name, its span
// attribute, when the record has it and its value. logRecord and
// spanAttributes both walk recordFields, so a field is added to both or is
// declared to belong to one side (logOnly here, spanOnly below), which
// TestAccessLogAndSpanCarryTheSameFields checks.
type recordField struct {
	log  string        // access-log field
	span attribute.Key // span attribute; "" for a log-only field
	// present says whether the record has the field; nil means always.
	present func(*llm.Record) bool
	// value is the field's value, a string, int64, float64 or bool; a
	// log-only field's may be a jsonlog.Appender. A slog.Value holds each
	// of these without allocating, which keeps the access log's line free
	// of allocations.
	value func(*llm.Record) slog.Value
	// spanTrueOnly: the span leaves the field out when it is false, where
	// the log writes false too. Only gen_ai.request.stream, which the GenAI
	// conventions set on streams alone, while the log's readers filter on
	// "stream":false.
	spanTrueOnly bool
	// logOnly says why a log-only field (span "") has no span attribute.
	logOnly string
}

// recordFields are the record's fields, in the access line's order. The
// log's names and the span's keys differ where each has its own convention
// (key_id is tollgate.key, the GenAI conventions name the model, stream,
// tokens, status and error type): both are public, so neither is renamed.
var recordFields = [...]recordField{
	{log: "request_id", span: tracing.RequestID,
		value: func(r *llm.Record) slog.Value { return slog.StringValue(r.RequestID) }},
	{log: "key_id", span: tracing.Key, // the key's name or hash id, never the key
		value: func(r *llm.Record) slog.Value { return slog.StringValue(r.KeyID) }},
	{log: "route", span: tracing.Route,
		value: func(r *llm.Record) slog.Value { return slog.StringValue(r.Route.String()) }},
	{log: "model", span: tracing.RequestModel, present: func(r *llm.Record) bool { return r.Model != "" },
		value: func(r *llm.Record) slog.Value { return slog.StringValue(r.Model) }},
	{log: "upstream", span: tracing.Upstream, present: func(r *llm.Record) bool { return r.Upstream != "" },
		value: func(r *llm.Record) slog.Value { return slog.StringValue(r.Upstream) }},
	{log: "transport", span: tracing.Transport, present: func(r *llm.Record) bool { return r.Transport != llm.TransportHTTP },
		value: func(r *llm.Record) slog.Value { return slog.StringValue(r.Transport.String()) }},
	{log: "stream", span: tracing.RequestStream, spanTrueOnly: true,
		value: func(r *llm.Record) slog.Value { return slog.BoolValue(r.Stream) }},
	{log: "status", span: tracing.HTTPResponseStatusCode,
		value: func(r *llm.Record) slog.Value { return slog.IntValue(r.Status) }},
	{log: "outcome", span: tracing.Outcome,
		value: func(r *llm.Record) slog.Value { return slog.StringValue(r.Outcome.String()) }},
	{log: "e2e_ms", span: tracing.E2EMs,
		value: func(r *llm.Record) slog.Value { return msValue(r.E2E()) }},
	{log: "overhead_ms", span: tracing.OverheadMs,
		value: func(r *llm.Record) slog.Value { return msValue(r.Overhead()) }},
	{log: "bytes_out", span: tracing.BytesOut,
		value: func(r *llm.Record) slog.Value { return slog.Int64Value(r.BytesOut) }},
	{log: "team", span: tracing.Team, present: func(r *llm.Record) bool { return r.Team != "" },
		value: func(r *llm.Record) slog.Value { return slog.StringValue(r.Team) }},
	{log: "conversation", span: tracing.Conversation, present: func(r *llm.Record) bool { return r.Conversation != "" },
		value: func(r *llm.Record) slog.Value { return slog.StringValue(r.Conversation) }},
	{log: "conversation_source", span: tracing.ConversationSource,
		present: func(r *llm.Record) bool { return r.ConversationSource != "" },
		value:   func(r *llm.Record) slog.Value { return slog.StringValue(r.ConversationSource) }},
	{log: "request_class", span: tracing.RequestClass, present: func(r *llm.Record) bool { return r.RequestClass != "" },
		value: func(r *llm.Record) slog.Value { return slog.StringValue(r.RequestClass) }},
	{log: "agent", span: tracing.Agent, present: func(r *llm.Record) bool { return r.Agent != "" },
		value: func(r *llm.Record) slog.Value { return slog.StringValue(r.Agent) }},
	{log: "upstream_request_id", span: tracing.UpstreamRequestID,
		present: func(r *llm.Record) bool { return r.UpstreamRequestID != "" },
		value:   func(r *llm.Record) slog.Value { return slog.StringValue(r.UpstreamRequestID) }},
	{log: "trace_id", logOnly: "the span is in that trace: its trace id is the span's own",
		present: func(r *llm.Record) bool { return r.TraceID != "" },
		value:   func(r *llm.Record) slog.Value { return slog.StringValue(r.TraceID) }},

	// A stream's figures.
	{log: "headers_ms", span: tracing.HeadersMs,
		present: func(r *llm.Record) bool { _, ok := r.TimeToHeaders(); return ok },
		value:   func(r *llm.Record) slog.Value { d, _ := r.TimeToHeaders(); return msValue(d) }},
	{log: "hold_ms", span: tracing.HoldMs,
		present: func(r *llm.Record) bool { _, ok := r.Hold(); return ok },
		value:   func(r *llm.Record) slog.Value { d, _ := r.Hold(); return msValue(d) }},
	{log: "ttft_ms", span: tracing.TTFTMs, present: hasTTFT,
		value: func(r *llm.Record) slog.Value { return msValue(r.TTFT()) }},
	{log: "upstream_ttft_ms", span: tracing.UpstreamTTFT,
		present: func(r *llm.Record) bool {
			return r.Stream && !r.Timing.FirstToken.IsZero() && !r.Timing.UpSent.IsZero()
		},
		value: func(r *llm.Record) slog.Value { return msValue(r.UpstreamTTFT()) }},
	{log: "token_events", span: tracing.TokenEvents, present: streamed,
		value: func(r *llm.Record) slog.Value { return slog.IntValue(r.TokenEvents) }},
	{log: "terminal_seen", span: tracing.TerminalSeen, present: streamed,
		value: func(r *llm.Record) slog.Value { return slog.BoolValue(r.TerminalSeen) }},
	{log: "tpot_ms", span: tracing.TPOTMs,
		present: func(r *llm.Record) bool { _, ok := r.TPOT(); return r.Stream && ok },
		value:   func(r *llm.Record) slog.Value { tpot, _ := r.TPOT(); return msValue(tpot) }},
	{log: "itl_mean_ms", span: tracing.ITLMeanMs, present: hasITL,
		value: func(r *llm.Record) slog.Value { return msValue(r.ITLSum / time.Duration(r.ITLCount)) }},
	{log: "itl_max_ms", span: tracing.ITLMaxMs, present: hasITL,
		value: func(r *llm.Record) slog.Value { return msValue(r.ITLMax) }},

	// Tokens and their cost.
	{log: "input_tokens", span: tracing.UsageInputTokens, present: hasInput,
		value: func(r *llm.Record) slog.Value { return slog.Int64Value(r.Usage.Input) }},
	{log: "cache_read_tokens", span: tracing.UsageCacheReadInputTokens, present: hasInput,
		value: func(r *llm.Record) slog.Value { return slog.Int64Value(r.Usage.CacheRead) }},
	{log: "cache_write_tokens", span: tracing.UsageCacheCreationInputTokens, present: hasInput,
		value: func(r *llm.Record) slog.Value { return slog.Int64Value(r.Usage.CacheWrite) }},
	{log: "input_estimated", span: tracing.InputEstimated,
		present: func(r *llm.Record) bool { return r.Usage.HasInput && r.InputEstimated },
		value:   func(*llm.Record) slog.Value { return slog.BoolValue(true) }},
	{log: "output_tokens", span: tracing.UsageOutputTokens, present: hasOutput,
		value: func(r *llm.Record) slog.Value { return slog.Int64Value(r.Usage.Output) }},
	{log: "reasoning_tokens", span: tracing.UsageReasoningOutputTokens, present: hasOutput,
		value: func(r *llm.Record) slog.Value { return slog.Int64Value(r.Usage.Reasoning) }},
	{log: "tokens_estimated", span: tracing.TokensEstimated, present: hasOutput,
		value: func(r *llm.Record) slog.Value { return slog.BoolValue(r.Estimated) }},
	{log: "cost_micros", span: tracing.CostMicros, present: func(r *llm.Record) bool { return r.CostMicros > 0 },
		value: func(r *llm.Record) slog.Value { return slog.Int64Value(r.CostMicros) }},

	{log: "input_bucket", span: tracing.InputBucket,
		value: func(r *llm.Record) slog.Value { return slog.StringValue(r.InputBucket) }},
	{log: "population", span: tracing.Population,
		value: func(r *llm.Record) slog.Value { return slog.StringValue(r.Population.String()) }},
	{log: "goodput", span: tracing.Goodput,
		value: func(r *llm.Record) slog.Value { return slog.StringValue(r.Goodput.String()) }},

	// How it ended, when not well.
	{log: "interruption", span: tracing.Interruption,
		present: func(r *llm.Record) bool { return r.Interruption != llm.InterruptNone },
		value:   func(r *llm.Record) slog.Value { return slog.StringValue(r.Interruption.String()) }},
	{log: "rejection", span: tracing.Rejection,
		present: func(r *llm.Record) bool { return r.Rejection != llm.RejectNone },
		value:   func(r *llm.Record) slog.Value { return slog.StringValue(r.Rejection.String()) }},
	// On failures only, as the conventions set error.type.
	{log: "error_type", span: tracing.ErrorType,
		present: func(r *llm.Record) bool { return r.Outcome != llm.OutcomeOK },
		value:   func(r *llm.Record) slog.Value { return slog.StringValue(errorType(r)) }},
	{log: "incomplete_reason", span: tracing.IncompleteReason,
		present: func(r *llm.Record) bool { return r.IncompleteReason != "" },
		value:   func(r *llm.Record) slog.Value { return slog.StringValue(r.IncompleteReason) }},

	// The upstream attempts and the waits between and before them.
	{log: "attempt_count", span: tracing.AttemptCount, present: attempted,
		value: func(r *llm.Record) slog.Value { return slog.IntValue(r.AttemptCount) }},
	{log: "attempts", present: attempted,
		logOnly: "on the span each attempt is a child span (tollgate.attempt), and a skipped upstream an event",
		value:   func(r *llm.Record) slog.Value { return slog.AnyValue(attemptsJSON{r}) }},
	{log: "retry_wait_ms", span: tracing.RetryWaitMs, present: func(r *llm.Record) bool { return r.RetryWait > 0 },
		value: func(r *llm.Record) slog.Value { return msValue(r.RetryWait) }},
	{log: "queue_wait_ms", span: tracing.QueueWaitMs, present: func(r *llm.Record) bool { return r.QueueWait > 0 },
		value: func(r *llm.Record) slog.Value { return msValue(r.QueueWait) }},
}

// probeField marks the access-log line of one of the gateway's own probe
// requests ("probe": true). It is log-only and not of the record: logRecord
// is told, and the probe's requests make no span.
const probeField = "probe"

// spanOnly are the request span's attributes with no access-log field, by
// design: the GenAI conventions' view of the request and its answer, read
// from the request, the answer or the config rather than the record, or
// the record's TTFT again in the conventions' unit.
var spanOnly = [...]attribute.Key{
	tracing.OperationName,            // from the route and path; the log has route
	tracing.ProviderName,             // from the dialect or the upstream's config
	tracing.RequestMaxTokens,         // the request's own limit, not a figure of the exchange
	tracing.ResponseTimeToFirstChunk, // ttft_ms, in seconds
	tracing.ResponseID,               // the answer's id, model and finish reasons, read
	tracing.ResponseModel,            // from its body or events for the span alone
	tracing.ResponseFinishReasons,
	tracing.RequestContent, // capture_content: never in the log
	tracing.ResponseContent,
	tracing.ContentTruncated,
}

func msValue(d time.Duration) slog.Value { return slog.Float64Value(ms(d)) }

func streamed(r *llm.Record) bool  { return r.Stream }
func hasTTFT(r *llm.Record) bool   { return r.Stream && !r.Timing.FirstTokenOut.IsZero() }
func hasITL(r *llm.Record) bool    { return r.Stream && r.ITLCount > 0 }
func hasInput(r *llm.Record) bool  { return r.Usage.HasInput }
func hasOutput(r *llm.Record) bool { return r.Usage.HasOutput || r.Estimated }
func attempted(r *llm.Record) bool { return r.AttemptCount > 0 }

// spanAttribute is v, a field's value, as attribute k.
func spanAttribute(k attribute.Key, v slog.Value) attribute.KeyValue {
	switch v.Kind() {
	case slog.KindInt64:
		return k.Int64(v.Int64())
	case slog.KindFloat64:
		return k.Float64(v.Float64())
	case slog.KindBool:
		return k.Bool(v.Bool())
	}
	return k.String(v.String())
}
