package tracing

import "go.opentelemetry.io/otel/attribute"

// Every span, event and attribute name tollgate exports is in this file.
//
// The gen_ai.*, error.type and http.* names are those of the OpenTelemetry
// semantic conventions v1.41.1: docs/gen-ai/gen-ai-spans.md (the inference
// span), docs/registry/attributes/gen-ai.md, error.md and http.md. v1.41.1
// is the last release that holds the GenAI conventions; later ones moved
// them to the semantic-conventions-genai repository, still in development
// status, so a rename there shows up as a change to this file alone.
// go.opentelemetry.io/otel/semconv (as of otel v1.47.0) has no GenAI
// package at that version, so the keys are plain attribute.Key constants.
// The tollgate.* names are the gateway's own, after its access-log fields.

// GenAI inference span attributes (gen-ai-spans.md, "Inference").
const (
	// OperationName is required: OpChat for the three dialect routes.
	OperationName = attribute.Key("gen_ai.operation.name")
	// ProviderName is required: the dialect's provider (ProviderOpenAI,
	// ProviderAnthropic), the telemetry flavour per the conventions' note.
	ProviderName = attribute.Key("gen_ai.provider.name")
	RequestModel = attribute.Key("gen_ai.request.model")
	// RequestStream is set, true, if and only if the request streams.
	RequestStream    = attribute.Key("gen_ai.request.stream")
	RequestMaxTokens = attribute.Key("gen_ai.request.max_tokens")
	// ResponseModel, ResponseID and ResponseFinishReasons (a string array)
	// are read from a non-streamed answer's body, or from a stream's events
	// as they are relayed.
	ResponseModel         = attribute.Key("gen_ai.response.model")
	ResponseID            = attribute.Key("gen_ai.response.id")
	ResponseFinishReasons = attribute.Key("gen_ai.response.finish_reasons")
	// ResponseTimeToFirstChunk is in seconds (double).
	ResponseTimeToFirstChunk = attribute.Key("gen_ai.response.time_to_first_chunk")
	UsageInputTokens         = attribute.Key("gen_ai.usage.input_tokens")
	UsageOutputTokens        = attribute.Key("gen_ai.usage.output_tokens")
	// UsageCacheReadInputTokens and UsageCacheCreationInputTokens are parts
	// of UsageInputTokens; UsageReasoningOutputTokens of UsageOutputTokens.
	UsageCacheReadInputTokens     = attribute.Key("gen_ai.usage.cache_read.input_tokens")
	UsageCacheCreationInputTokens = attribute.Key("gen_ai.usage.cache_creation.input_tokens")
	UsageReasoningOutputTokens    = attribute.Key("gen_ai.usage.reasoning.output_tokens")

	// ErrorType is set only when the operation failed (error.md).
	ErrorType = attribute.Key("error.type")
	// HTTPResponseStatusCode is the status sent to the caller (on the
	// request's span) or received from the upstream (on an attempt's).
	HTTPResponseStatusCode = attribute.Key("http.response.status_code")
)

// Well-known values of gen_ai.operation.name and gen_ai.provider.name.
const (
	OpChat           = "chat"
	OpEmbeddings     = "embeddings"
	OpTextCompletion = "text_completion"
	// OpForward is tollgate's own operation name (the conventions allow
	// custom values) for another /v1/* request forwarded as it is.
	OpForward = "tollgate.forward"

	ProviderOpenAI    = "openai"
	ProviderAnthropic = "anthropic"
)

// tollgate's own attributes on the request's span, named after the
// access-log fields they carry (the same values, from the same record).
const (
	RequestID         = attribute.Key("tollgate.request_id")
	UpstreamRequestID = attribute.Key("tollgate.upstream_request_id")
	// Key is the caller's key as the access log names it: its [[keys]] name
	// or the hash prefix id. Never the key.
	Key       = attribute.Key("tollgate.key")
	Team      = attribute.Key("tollgate.team")
	Route     = attribute.Key("tollgate.route")
	Upstream  = attribute.Key("tollgate.upstream")
	Transport = attribute.Key("tollgate.transport")
	// Conversation is the key (a hash) of the conversation or agent
	// session the request is a turn of; ConversationSource what named it.
	Conversation       = attribute.Key("tollgate.conversation")
	ConversationSource = attribute.Key("tollgate.conversation_source")
	// RequestClass and Agent are what a coding agent said of the call
	// (reporting only); Agent is a hash of the agent's id.
	RequestClass = attribute.Key("tollgate.request_class")
	Agent        = attribute.Key("tollgate.agent")
	Outcome      = attribute.Key("tollgate.outcome")
	Interruption = attribute.Key("tollgate.interruption")
	Rejection    = attribute.Key("tollgate.rejection")
	TTFTMs       = attribute.Key("tollgate.ttft_ms")
	// HeadersMs is the time to the upstream answer's response headers;
	// HoldMs how long a stream was held before them (llm.Record.Hold).
	HeadersMs    = attribute.Key("tollgate.headers_ms")
	HoldMs       = attribute.Key("tollgate.hold_ms")
	UpstreamTTFT = attribute.Key("tollgate.upstream_ttft_ms")
	TPOTMs       = attribute.Key("tollgate.tpot_ms")
	E2EMs        = attribute.Key("tollgate.e2e_ms")
	OverheadMs   = attribute.Key("tollgate.overhead_ms")
	TokenEvents  = attribute.Key("tollgate.token_events")
	// TokensEstimated: the output tokens were counted from events, the
	// upstream reporting none.
	TokensEstimated = attribute.Key("tollgate.tokens_estimated")
	CostMicros      = attribute.Key("tollgate.cost_micros")
	InputBucket     = attribute.Key("tollgate.input_bucket")
	Goodput         = attribute.Key("tollgate.goodput")
	// Population is which requests the record is counted among
	// (model_call, refused, forward).
	Population   = attribute.Key("tollgate.population")
	BytesOut     = attribute.Key("tollgate.bytes_out")
	AttemptCount = attribute.Key("tollgate.attempt_count")
	RetryWaitMs  = attribute.Key("tollgate.retry_wait_ms")
	QueueWaitMs  = attribute.Key("tollgate.queue_wait_ms")

	// TerminalSeen: the stream's terminal marker ([DONE], message_stop, a
	// Responses terminal event) was read.
	TerminalSeen = attribute.Key("tollgate.terminal_seen")
	// ITLMeanMs and ITLMaxMs summarise the gaps between a stream's token
	// events (inter-token latency).
	ITLMeanMs = attribute.Key("tollgate.itl_mean_ms")
	ITLMaxMs  = attribute.Key("tollgate.itl_max_ms")
	// InputEstimated: the input tokens are the prompt estimate billed, the
	// upstream reporting none.
	InputEstimated = attribute.Key("tollgate.input_estimated")
	// IncompleteReason is why a Responses answer is incomplete
	// (incomplete_details.reason); the answer is still a success.
	IncompleteReason = attribute.Key("tollgate.incomplete_reason")

	// RequestContent and ResponseContent are exported only with
	// [tracing] capture_content: the request's messages (its "messages",
	// or a Responses request's "input", as JSON) and a non-streamed
	// answer's body, each cut at ContentLimit bytes; ContentTruncated says
	// one was cut. They are in the provider's own format, not the GenAI
	// conventions' gen_ai.input.messages schema, hence names of our own.
	RequestContent   = attribute.Key("tollgate.request.content")
	ResponseContent  = attribute.Key("tollgate.response.content")
	ContentTruncated = attribute.Key("tollgate.content_truncated")
)

// ContentLimit bounds each captured content attribute, in bytes.
const ContentLimit = 16 << 10

// Attempt spans and the request span's events.
const (
	// SpanAttempt names the child span of one request sent upstream (kind
	// client); it carries Upstream, HTTPResponseStatusCode,
	// AttemptResult, AttemptNumber and, when sent past an open breaker,
	// BreakerBypass.
	SpanAttempt   = "tollgate.attempt"
	AttemptResult = attribute.Key("tollgate.attempt.result")
	AttemptNumber = attribute.Key("tollgate.attempt.number")
	BreakerBypass = attribute.Key("tollgate.attempt.breaker_bypass")

	// EventRetryWait marks the start of a wait before the next attempt on
	// the same upstream: RetryWaitMs long, after an attempt whose result was
	// RetryReason.
	EventRetryWait = "tollgate.retry_wait"
	RetryReason    = attribute.Key("tollgate.retry.reason")
	// EventSkipped marks an upstream passed over without an attempt, its
	// reason in AttemptResult (breaker_open, queue_full, queue_timeout,
	// key_scope).
	EventSkipped = "tollgate.upstream_skipped"
)
