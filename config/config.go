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
}

// Server is the [server] table: the gateway's own listener.
type Server struct {
	// Listen is the address to serve on. Default ":8080".
	Listen string `toml:"listen"`
	// MaxBodyBytes caps a request body. Default 33554432 (32 MiB, Anthropic's
	// own limit for Messages).
	MaxBodyBytes int64 `toml:"max_body_bytes"`
	// MaxEventBytes caps one SSE event from the upstream (raw bytes, all its
	// lines). Default 16777216 (16 MiB).
	MaxEventBytes int `toml:"max_event_bytes"`
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
	// A request goes to the first upstream that serves its dialect; other
	// /v1/* paths go to the first upstream. Default ["openai", "anthropic"].
	Dialects []string `toml:"dialects"`
	// TimeoutSeconds bounds a whole exchange, streamed or not. Default 600.
	TimeoutSeconds float64 `toml:"timeout_seconds"`
	// ConnectTimeoutSeconds bounds dialing the upstream. Default 10.
	ConnectTimeoutSeconds float64 `toml:"connect_timeout_seconds"`
	// IncludeUsage makes the gateway ask OpenAI-dialect streams for usage
	// (stream_options.include_usage) when the caller did not, and keep the
	// extra usage-only chunk from the caller. Turn it off for servers that
	// reject the field. Default true.
	IncludeUsage bool `toml:"include_usage"`
	// MaxIdleConns sizes the pool of idle connections kept to the upstream.
	// Default 256.
	MaxIdleConns int `toml:"max_idle_conns"`
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
	// Models are model names always used as they are in the model label.
	// Other names are used as seen until MaxModels distinct names exist;
	// after that they are labelled "other". Default [].
	Models []string `toml:"models"`
	// MaxModels caps distinct model label values. Default 100.
	MaxModels int `toml:"max_models"`
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
