// Package config owns the gateway.toml schema: its defaults, strict decoding,
// validation with clear messages, and secrets read from the environment.
package config

import (
	"time"
)

// Config is the whole gateway.toml. Parse and Load start from Default() and
// decode the file over it, so that every key the file leaves out keeps its
// default; each [[upstreams]] table gets DefaultUpstream()'s values for the
// keys it leaves out.
type Config struct {
	Server    Server     `toml:"server"`
	Auth      Auth       `toml:"auth"`
	Upstreams []Upstream `toml:"upstreams"`
	Routes    []Route    `toml:"routes"`
	Metrics   Metrics    `toml:"metrics"`
	SLO       SLO        `toml:"slo"`
	Log       Log        `toml:"log"`

	// Governance (governance.go).
	Admin     Admin     `toml:"admin"`
	RateLimit RateLimit `toml:"ratelimit"`
	Redis     Redis     `toml:"redis"`
	Spend     Spend     `toml:"spend"`
	Models    []Model   `toml:"models"`
	Teams     []Team    `toml:"teams"`
	Keys      []Key     `toml:"keys"`
	Ownership Ownership `toml:"ownership"`
	// RuntimeKeys are gateway keys issued at runtime (runtimekeys.go).
	RuntimeKeys RuntimeKeys `toml:"runtime_keys"`

	// Probe is the synthetic probe (probe.go).
	Probe Probe `toml:"probe"`

	// Tracing is the OpenTelemetry export of traces (tracing.go).
	Tracing Tracing `toml:"tracing"`

	// Conversations are the figures per conversation (conversations.go).
	Conversations Conversations `toml:"conversations"`
}

// Server is the [server] table: the gateway's own listener.
type Server struct {
	// Listen is the address to serve on. Default ":8080".
	Listen string `toml:"listen"`
	// MaxBodyBytes caps a request body, as sent and, for one sent with a
	// Content-Encoding, once decoded. Default 33554432 (32 MiB, Anthropic's
	// own limit for Messages).
	MaxBodyBytes int64 `toml:"max_body_bytes"`
	// MaxEventBytes caps one SSE event from the upstream (raw bytes, all its
	// lines). Default 16777216 (16 MiB).
	MaxEventBytes int `toml:"max_event_bytes"`
	// MaxHeaderBytes caps a request's headers (names, values and their
	// line overhead, as on the wire). Default 65536 (64 KiB).
	MaxHeaderBytes int `toml:"max_header_bytes"`
	// ReadHeaderTimeoutSeconds bounds reading a request's headers. Default 10.
	ReadHeaderTimeoutSeconds float64 `toml:"read_header_timeout_seconds"`
	// IdleTimeoutSeconds closes idle keep-alive client connections. Default 120.
	IdleTimeoutSeconds float64 `toml:"idle_timeout_seconds"`
	// ShutdownDelaySeconds is how long the gateway keeps accepting requests
	// after SIGINT or SIGTERM while /readyz answers 503, so a load balancer
	// can take it out of rotation before the listener closes. Default 0.
	ShutdownDelaySeconds float64 `toml:"shutdown_delay_seconds"`
	// DrainTimeoutSeconds is how long open streams may run after the
	// listener closes before they are cancelled. Default 30.
	DrainTimeoutSeconds float64 `toml:"drain_timeout_seconds"`
	// StreamErrorEvents makes the gateway end a stream the upstream broke
	// after bytes were sent (the body ended or broke without its terminal
	// event, an idle or total timeout, an oversized event) with an error
	// event in the caller's dialect, so the client's SDK raises instead of
	// taking a cut answer for a whole one. Default true.
	StreamErrorEvents bool `toml:"stream_error_events"`
	// WatchConfig reloads the config file when its contents change (read
	// once a second; a change is taken once it has held for a second), as
	// SIGHUP and POST /admin/reload do. Default false.
	WatchConfig bool `toml:"watch_config"`
}

// Auth is the [auth] table: how callers are identified.
type Auth struct {
	// Mode is "passthrough" or "keys". Passthrough: the caller's own key
	// (Authorization: Bearer or x-api-key) goes upstream unchanged and is
	// identified by its [[keys]] name when its hash is listed there, else by
	// a short hash. Keys: the caller's key must be one of [[keys]] and the
	// upstream's own key (api_key_env) replaces it. Default "passthrough".
	Mode string `toml:"mode"`
	// RequireKey rejects requests that carry no key with 401. When false, a
	// request without a key is sent upstream with the upstream's own key
	// (api_key_env), if it has one. Default true.
	RequireKey bool `toml:"require_key"`
}

// Upstream is one [[upstreams]] table: an OpenAI- or Anthropic-compatible
// endpoint.
type Upstream struct {
	// Name identifies the upstream in logs and metrics. Required, unique.
	Name string `toml:"name"`
	// BaseURL is the endpoint, with an optional path prefix: "/v1/..." is
	// appended to it ("https://host/api" serves "https://host/api/v1/..."),
	// so it must not end in "/v1". Required; http or https, with no query,
	// fragment or credentials. A trailing slash is removed at load time.
	BaseURL string `toml:"base_url"`
	// APIKeyEnv names the environment variable that holds the upstream's own
	// key. Optional; when set, the variable must be set and non-empty.
	APIKeyEnv string `toml:"api_key_env"`
	// APIKey is the key read from APIKeyEnv at load time. It prints as
	// "<secret>"; see Secret.
	APIKey Secret `toml:"-"`
	// Dialects lists the APIs this upstream serves: "openai", "anthropic".
	// A request goes to the upstreams of its route (see Route) that serve
	// its dialect or, when no route matches its model, to every upstream
	// that serves it, in file order, falling back down that list before
	// the first byte is sent to the caller. Other /v1/* paths are routed
	// the same way in the dialect their path and headers suggest (Anthropic
	// for /v1/messages/... or an anthropic-version or x-api-key header,
	// OpenAI otherwise), and go to the first upstream when none serves it.
	// Default ["openai", "anthropic"].
	Dialects []string `toml:"dialects"`
	// TimeoutSeconds bounds one attempt whole, from sending the request to
	// the end of the answer, streamed or not; a retry or a fallback starts
	// a fresh one. Default 600.
	TimeoutSeconds float64 `toml:"timeout_seconds"`
	// ConnectTimeoutSeconds bounds dialing the upstream and the TLS
	// handshake. Default 10.
	ConnectTimeoutSeconds float64 `toml:"connect_timeout_seconds"`
	// IncludeUsage makes the gateway ask OpenAI-dialect streams for usage
	// (stream_options.include_usage) when the caller did not, and keep the
	// extra usage-only chunk from the caller. Turn it off for servers that
	// reject the field. Default true.
	IncludeUsage bool `toml:"include_usage"`
	// CallerKeysOnFallback lets a passthrough caller's own key reach this
	// upstream when it is a fallback at another origin (scheme, host, port)
	// than the first upstream of the request's route. Off, such a fallback
	// is skipped for callers that bring a key, so that a key for one
	// provider never reaches another's endpoint; turn it on for endpoints
	// that accept the same keys (replicas of one self-hosted server). It
	// does not matter in mode "keys", where each upstream gets its own key.
	// Default false.
	CallerKeysOnFallback bool `toml:"caller_keys_on_fallback"`
	// ResponsesWebSocket says the upstream speaks the Responses API's
	// WebSocket mode (GET /v1/responses with Upgrade: websocket; OpenAI's
	// API does): the gateway then joins a caller's socket to one of its
	// own to this upstream and meters each turn. Without an upstream that
	// does, the gateway answers the upgrade 426, which makes clients such
	// as Codex fall back to HTTP at once. Default false.
	ResponsesWebSocket bool `toml:"responses_websocket"`
	// MaxIdleConns sizes the pool of idle connections kept to the upstream.
	// Default 256.
	MaxIdleConns int `toml:"max_idle_conns"`
	// H2C speaks HTTP/2 with prior knowledge (h2c) to an http:// base_url,
	// and nothing else: the upstream must serve it. Its streams then share a
	// few connections (one per 100 to 250 concurrent streams, as the
	// upstream allows) instead of taking one each, so that an open stream
	// costs the gateway one file descriptor, its caller's, not two. An
	// https:// upstream negotiates HTTP/2 on its own (ALPN) and may not set
	// it. Default false.
	H2C bool `toml:"h2c"`

	// Timeouts by phase. TimeoutSeconds bounds one attempt whole;
	// ConnectTimeoutSeconds the dial (and TLS handshake).

	// HeaderTimeoutSeconds bounds the wait from the attempt's start (dial,
	// TLS and sending the request included) to the response headers of a
	// streamed request; a stall there is retried.
	// A non-streamed answer's headers come with its whole body, so only
	// TimeoutSeconds bounds it. 0 turns it off. Default 30.
	HeaderTimeoutSeconds float64 `toml:"header_timeout_seconds"`
	// FirstTokenTimeoutSeconds bounds the wait from a stream's response
	// headers to its first token-bearing event. While nothing has been sent
	// to the caller the attempt is abandoned and retried (or falls back).
	// Reasoning models can think for minutes before their first token, so
	// it is off by default. 0 turns it off. Default 0.
	FirstTokenTimeoutSeconds float64 `toml:"first_token_timeout_seconds"`
	// IdleTimeoutSeconds bounds the gap between two reads of a stream after
	// its first token. 0 turns it off. Default 300.
	IdleTimeoutSeconds float64 `toml:"idle_timeout_seconds"`

	// Shaping: smooth bursts instead of provoking upstream 429s.

	// MaxConcurrent caps the attempts open to this upstream at once (a
	// stream holds its slot until it ends). 0 means no cap. Default 0.
	MaxConcurrent int `toml:"max_concurrent"`
	// RequestsPerSecond caps the rate of attempts sent to this upstream,
	// evenly spaced. 0 means no cap. Default 0.
	RequestsPerSecond float64 `toml:"requests_per_second"`
	// QueueSize is how many requests may wait for a slot or for their turn
	// under MaxConcurrent and RequestsPerSecond; one more is refused at once
	// (and falls back to the next upstream, or gets 503). Default 64.
	QueueSize int `toml:"queue_size"`
	// QueueTimeoutSeconds is the longest a request waits in that queue.
	// Default 10.
	QueueTimeoutSeconds float64 `toml:"queue_timeout_seconds"`

	// Retry is the [upstreams.retry] table.
	Retry Retry `toml:"retry"`
	// Breaker is the [upstreams.breaker] table.
	Breaker Breaker `toml:"breaker"`
}

// Retry is an [upstreams.retry] table: how a failed attempt on this upstream
// is retried. Retries happen only before the first byte of the answer is
// sent to the caller.
type Retry struct {
	// MaxAttempts is the number of attempts on this upstream, the first
	// included: 1 never retries. After them the request falls back to the
	// route's next upstream. Default 3.
	MaxAttempts int `toml:"max_attempts"`
	// BaseDelayMs caps the first retry's delay; the cap grows by Multiplier
	// per retry up to MaxDelayMs, and the delay is drawn uniformly below the
	// cap (full jitter). Default 250.
	BaseDelayMs float64 `toml:"base_delay_ms"`
	// MaxDelayMs caps every computed delay. An upstream's Retry-After or
	// retry-after-ms is honoured as it is, even above it. Default 8000.
	MaxDelayMs float64 `toml:"max_delay_ms"`
	// Multiplier is the growth of the delay cap per retry, at least 1.
	// Default 2.
	Multiplier float64 `toml:"multiplier"`
	// MaxWaitSeconds is the most one request waits, in total, between its
	// attempts on this upstream; a wait that would not fit is not taken
	// (the request falls back, or the caller gets the upstream's error with
	// its Retry-After). Default 30.
	MaxWaitSeconds float64 `toml:"max_wait_seconds"`
	// Statuses are the upstream HTTP statuses worth another attempt.
	// Connection errors before a response and stalls are retried too, and
	// so is an error event before a stream's first token whose type stands
	// for one of these statuses (overloaded_error for 529, ...). Errors no retry can fix
	// (insufficient_quota and other billing errors, authentication,
	// permission and invalid-request errors) never are. Default
	// [408, 409, 429, 500, 502, 503, 504, 529].
	Statuses []int `toml:"statuses"`
	// BudgetRatio caps retries to this upstream at this share of the
	// requests first sent to it (a fallback to it counts as one of those),
	// over a 10 s window, so an outage does not multiply its load.
	// Default 0.2.
	BudgetRatio float64 `toml:"budget_ratio"`
	// BudgetMinPerSecond is the floor of that budget: retries per second
	// always allowed, so a quiet upstream still gets its retries. Default 1.
	BudgetMinPerSecond float64 `toml:"budget_min_per_second"`
}

// Breaker is an [upstreams.breaker] table: the circuit breaker that stops
// sending requests to an upstream that keeps failing. Failures are
// connection errors, timeouts, 408, 429, 5xx and streams the upstream broke;
// quota, billing, key and invalid-request errors are not, nor is a 429 to a
// passthrough caller's own key.
type Breaker struct {
	// Enabled turns the breaker on. Default true.
	Enabled bool `toml:"enabled"`
	// ConsecutiveFailures opens the breaker after this many failures in a
	// row. Default 5.
	ConsecutiveFailures int `toml:"consecutive_failures"`
	// FailureRatio opens it when this share of the requests in the window
	// failed, once MinRequests were seen there. Default 0.5.
	FailureRatio float64 `toml:"failure_ratio"`
	// MinRequests keeps the ratio rule quiet on thin traffic. Default 20.
	MinRequests int `toml:"min_requests"`
	// WindowSeconds is how far back the ratio rule looks. Default 10.
	WindowSeconds float64 `toml:"window_seconds"`
	// CooldownSeconds is how long an open breaker refuses requests before
	// it lets probes through (half-open). Default 5.
	CooldownSeconds float64 `toml:"cooldown_seconds"`
	// HalfOpenProbes is how many probes a half-open breaker lets through at
	// once; that many successes close it, one failure opens it again.
	// Default 2.
	HalfOpenProbes int `toml:"half_open_probes"`
}

// Route is one [[routes]] table: the ordered upstreams for the models its
// patterns match. A request goes to the first route whose pattern matches
// its model; a request no route matches goes to every upstream serving its
// dialect, in file order. Upstreams that do not serve the request's dialect
// are skipped.
type Route struct {
	// Models are path.Match patterns on the requested model ("gpt-4o*").
	// Required, non-empty.
	Models []string `toml:"models"`
	// Upstreams are [[upstreams]] names, tried in this order: the first not
	// skipped (open circuit, full queue, or a caller's key that may not go
	// there) gets the request, and a retryable failure before the first byte
	// was sent to the caller falls back to the next. Required.
	Upstreams []string `toml:"upstreams"`
	// Rename maps an upstream name to the model name sent to it (for
	// example a deployment name); the caller's model is sent otherwise.
	Rename map[string]string `toml:"rename"`
}

// Metrics is the [metrics] table.
type Metrics struct {
	// LatencyBuckets are ascending input-token edges, starting at 0, that
	// segment latency by prompt size. Default [0, 500, 2000, 8000, 32000].
	LatencyBuckets []int64 `toml:"latency_buckets"`
	// Labels are constant labels put on every tollgate_ series (for example
	// env = "prod", scene = "chat"). Names must be valid Prometheus label
	// names and must not clash with tollgate's own labels (nor with "le" and
	// "quantile"). Default: none.
	Labels map[string]string `toml:"labels"`
	// Models are model names always used as they are in the model label,
	// from the start. Default [].
	Models []string `toml:"models"`
	// MaxModels caps distinct model label values, Models included. Another
	// name takes one of these labels only once an upstream has answered a
	// request for it with a success status (2xx), and only while one is
	// free; until then, and for good after that, it is labelled "other".
	// Default 100.
	MaxModels int `toml:"max_models"`
	// ModelsFromPrices, when [[models]] tables exist, gives a label of its
	// own (within MaxModels) only to a name that matches one of their
	// patterns; other names are labelled "other". false: any name an
	// upstream served. No effect without [[models]]. Default true.
	ModelsFromPrices bool `toml:"models_from_prices"`
	// NativeHistograms adds Prometheus native (exponential) buckets to the
	// latency histograms. Default true.
	NativeHistograms bool `toml:"native_histograms"`
}

// SLO is the [slo] table: the goodput objectives. 0 leaves one unchecked.
type SLO struct {
	// TTFTMs is the time-to-first-token objective in ms. Default 2000.
	TTFTMs float64 `toml:"ttft_ms"`
	// TPOTMs is the time-per-output-token objective in ms. Default 100.
	TPOTMs float64 `toml:"tpot_ms"`
	// E2ELMs is the end-to-end latency objective in ms. Default 0 (off).
	E2ELMs float64 `toml:"e2el_ms"`
}

// Log is the [log] table.
type Log struct {
	// Level is "debug", "info", "warn" or "error". Default "info".
	Level string `toml:"level"`
	// Format is "json" or "text". Default "json".
	Format string `toml:"format"`
	// AccessLog writes one line per request. Default true.
	AccessLog bool `toml:"access_log"`
}

// Seconds converts a seconds value from the file to a time.Duration.
func Seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// Millis converts a milliseconds value from the file to a time.Duration.
func Millis(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }
