package llm

import "time"

// Probe results that are not attempt results (see ProbeResult.Result).
const (
	// ProbeTimeout: the probe's context ran out before an answer (its own
	// timeout_seconds, or the end of its round); the breaker gets no
	// verdict, as for a caller that gives up. Not the attempt result
	// "timeout" (the upstream's 408 or 504, or its own timeout_seconds),
	// which is a failure.
	ProbeTimeout = "probe_timeout"
	// ProbeAuthError: the upstream refused the probe's key (401 or 403):
	// the probed upstream needs an api_key_env, or its key is wrong.
	ProbeAuthError = "auth_error"
	// ProbeCanceled: the probe's context was cancelled (shutdown); the
	// request says nothing about the upstream.
	ProbeCanceled = "canceled"
	// ProbeInternalError: the gateway failed (a panic, logged); not the
	// upstream's doing.
	ProbeInternalError = "internal_error"
)

// ProbeTarget is what one probe request asks for.
type ProbeTarget struct {
	// Upstream is the [[upstreams]] name the request goes to, and only
	// there: no route, no fallback, no retry.
	Upstream string
	// Model is the model asked for, sent as it is.
	Model string
	// Dialect is the API spoken; DialectNone means the upstream's first.
	Dialect Dialect
	// Prompt is the user message.
	Prompt string
	// MaxTokens caps the answer: max_tokens, or in the OpenAI dialect
	// max_completion_tokens, which reasoning models require.
	MaxTokens int
}

// ProbeResult is how one probe request went.
type ProbeResult struct {
	// Result is "ok" or why the request failed: the attempt's result
	// (rate_limited, overloaded, server_error, connect_error,
	// header_timeout, error_event, stream_broken, ...), why nothing was
	// sent (breaker_open, queue_full, queue_timeout), or ProbeTimeout,
	// ProbeAuthError, ProbeCanceled, ProbeInternalError.
	Result string
	// Status is the upstream's HTTP status (0 when it sent none).
	Status int
	// TTFT is from the request entering the gateway to its first
	// token-bearing event relayed; TPOT the time per output token; E2E the
	// whole exchange. HasTTFT and HasTPOT say whether they exist (a first
	// token; at least 2 output tokens).
	TTFT, TPOT, E2E  time.Duration
	HasTTFT, HasTPOT bool
	// OutputTokens is the answer's size, from its usage or its events.
	OutputTokens int64
}
