// Package llm holds the domain types every other tollgate package shares: the
// API dialects, token usage, the moments of one exchange, its outcome, and the
// Record that the gateway writes once per request.
//
// It imports the standard library only, so that every package may import it.
package llm

import (
	"strconv"
	"time"
)

// Dialect is the wire format a caller speaks.
type Dialect uint8

const (
	// DialectNone marks paths that are forwarded without being parsed
	// (for example /v1/models).
	DialectNone Dialect = iota
	// DialectOpenAI is OpenAI Chat Completions (POST /v1/chat/completions).
	DialectOpenAI
	// DialectAnthropic is Anthropic Messages (POST /v1/messages).
	DialectAnthropic
	// DialectResponses is OpenAI's Responses API (POST /v1/responses). Only
	// sseparse decodes it so far; no route produces it yet.
	DialectResponses
)

// String returns the dialect's name as used in config files and logs.
func (d Dialect) String() string {
	switch d {
	case DialectOpenAI:
		return "openai"
	case DialectAnthropic:
		return "anthropic"
	case DialectResponses:
		return "responses"
	default:
		return "none"
	}
}

// ParseDialect returns the dialect named s ("openai" or "anthropic").
func ParseDialect(s string) (Dialect, bool) {
	switch s {
	case "openai":
		return DialectOpenAI, true
	case "anthropic":
		return DialectAnthropic, true
	}
	return DialectNone, false
}

// Route is the closed set of route label values.
type Route uint8

const (
	RouteOther Route = iota
	RouteChatCompletions
	RouteMessages
	// RouteResponses is POST /v1/responses.
	RouteResponses
	// RouteResponsesRetrieve is GET /v1/responses/{id}?stream=true: a
	// background response's stored events replayed, then followed live. It
	// is measured as a stream but never billed (its usage is its creation's).
	RouteResponsesRetrieve
	// RouteCountTokens is POST /v1/messages/count_tokens: forwarded in
	// every mode, limited by its own optional rate, never billed.
	RouteCountTokens
)

// String returns the route's metric label value.
func (r Route) String() string {
	switch r {
	case RouteChatCompletions:
		return "chat_completions"
	case RouteMessages:
		return "messages"
	case RouteResponses:
		return "responses"
	case RouteResponsesRetrieve:
		return "responses_retrieve"
	case RouteCountTokens:
		return "count_tokens"
	default:
		return "other"
	}
}

// RejectionOfStatus names the refusal of a request no rule refused by the
// status the gateway answered it with.
func RejectionOfStatus(status int) Rejection {
	switch status {
	case 400:
		return RejectBadRequest
	case 401:
		return RejectUnauthorized
	case 404:
		return RejectNotFound
	case 405:
		return RejectMethodNotAllowed
	case 413:
		return RejectTooLarge
	case 415:
		return RejectUnsupportedEncoding
	case 426:
		return RejectUpgradeRequired
	case 431:
		return RejectHeadersTooLarge
	}
	return RejectOther
}

// Population is which requests a record is counted among: each figure the
// gateway exports is over one population (docs/metrics.md, "Which
// requests"), decided once per record as it ends.
type Population uint8

const (
	// PopModelCall: a request on a model route (chat completions,
	// messages, the Responses API, over HTTP or a socket) that the gateway
	// admitted. TTFT, TPOT, ITL, E2E, tokens and goodput are over these.
	PopModelCall Population = iota
	// PopRefused: a request the gateway answered itself, before any
	// upstream attempt, with an error: identity, limits, budgets, bad
	// input, ownership (its Rejection says which).
	PopRefused
	// PopForward: any other request sent upstream: /v1/models, files,
	// token counts, stored objects, embeddings, a background response
	// streamed again.
	PopForward
	// PopProbe: the gateway's own synthetic probe.
	PopProbe
)

// NumPopulations is the number of populations.
const NumPopulations = int(PopProbe) + 1

// String returns the population's label value.
func (p Population) String() string {
	switch p {
	case PopRefused:
		return "refused"
	case PopForward:
		return "forward"
	case PopProbe:
		return "probe"
	}
	return "model_call"
}

// RequestClasses are the request classes a coding agent may name a call
// by: Claude Code's five, and Codex's warm-up. A value outside them is
// ClassOther; a call that names none has no class.
var RequestClasses = []string{"main", "subagent", "workflow", "compaction", "auxiliary", "warmup", ClassOther}

// ClassOther is the request class of a call whose agent named a class
// outside RequestClasses.
const ClassOther = "other"

// Transport is how an exchange reached the gateway.
type Transport uint8

const (
	// TransportHTTP is one HTTP request and its answer (an SSE stream or a
	// body).
	TransportHTTP Transport = iota
	// TransportWebSocket is one response.create of the Responses API's
	// WebSocket mode: a turn on a socket that carries many.
	TransportWebSocket
)

// String returns the transport's label value.
func (t Transport) String() string {
	if t == TransportWebSocket {
		return "websocket"
	}
	return "http"
}

// Usage is the token usage of one exchange, normalised across dialects.
//
// Input is the whole prompt, cached tokens included (OpenAI prompt_tokens;
// Anthropic input_tokens + cache_read_input_tokens +
// cache_creation_input_tokens). CacheRead and CacheWrite are parts of Input,
// Reasoning is part of Output. The Has flags tell "reported as zero" from "not
// reported".
type Usage struct {
	Input      int64
	Output     int64
	CacheRead  int64
	CacheWrite int64
	Reasoning  int64

	HasInput  bool
	HasOutput bool
}

// Outcome is the closed set of ways an exchange ends.
type Outcome uint8

const (
	OutcomeOK Outcome = iota
	OutcomeClientCancel
	OutcomeUpstreamTimeout
	OutcomeUpstreamError
	OutcomeUpstreamUnreachable
	OutcomeRejected
	OutcomeBadRequest
	// OutcomeShutdown: the gateway cancelled the exchange because it was
	// shutting down and the drain timeout ran out.
	OutcomeShutdown
)

var outcomeNames = [...]string{
	OutcomeOK:                  "ok",
	OutcomeClientCancel:        "client_cancel",
	OutcomeUpstreamTimeout:     "upstream_timeout",
	OutcomeUpstreamError:       "upstream_error",
	OutcomeUpstreamUnreachable: "upstream_unreachable",
	OutcomeRejected:            "rejected",
	OutcomeBadRequest:          "bad_request",
	OutcomeShutdown:            "gateway_shutdown",
}

// String returns the outcome's label value.
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return "unknown"
}

// Outcomes lists every outcome, for pre-creating metric series.
func Outcomes() []Outcome {
	return []Outcome{OutcomeOK, OutcomeClientCancel, OutcomeUpstreamTimeout,
		OutcomeUpstreamError, OutcomeUpstreamUnreachable, OutcomeRejected, OutcomeBadRequest, OutcomeShutdown}
}

// Rejection is why the gateway refused a request (outcome rejected): the
// limit that refused it, or the rule it broke.
type Rejection uint8

const (
	RejectNone Rejection = iota
	RejectRPM
	RejectTPM
	RejectConcurrency
	RejectTokensPerDay
	RejectCostPerDay
	RejectCostPerMonth
	// RejectModelNotAllowed: the caller's team may not use the model.
	RejectModelNotAllowed
	// RejectUnpricedModel: a budget applies and the model has no price.
	RejectUnpricedModel
	// RejectLimiterUnavailable: the limiter could not be asked.
	RejectLimiterUnavailable
	// RejectNotMeterable: a governed caller sent a request the gateway
	// cannot meter (another /v1/* path).
	RejectNotMeterable
	// RejectNotOwner: in mode "keys", the request names a stored response
	// or conversation its team did not create (answered 404).
	RejectNotOwner
	// RejectOwnershipUnavailable: the store of who owns stored state could
	// not be asked.
	RejectOwnershipUnavailable
	// RejectNonCanonicalPath: the path has dot segments, empty segments,
	// backslashes or encoded dots, slashes or backslashes, which an upstream
	// could resolve to a path the gateway never judged.
	RejectNonCanonicalPath
	// RejectHeadersTooLarge: the request's headers exceed
	// server.max_header_bytes.
	RejectHeadersTooLarge
	// RejectCostPerConversation: the turn would take its conversation past
	// its team's max_cost_per_conversation_usd.
	RejectCostPerConversation
	// The refusals of a request the gateway could not take, by what its
	// answer says (RejectionOfStatus): no rule refused it, the request
	// itself was wrong (a key missing or unknown, a malformed body, a
	// path no route serves).
	RejectUnauthorized
	RejectBadRequest
	RejectNotFound
	RejectMethodNotAllowed
	RejectTooLarge
	RejectUnsupportedEncoding
	RejectUpgradeRequired
	// RejectOther is any other refusal.
	RejectOther
)

var rejectionNames = [...]string{
	RejectNone:                 "",
	RejectRPM:                  "rpm",
	RejectTPM:                  "tpm",
	RejectConcurrency:          "concurrency",
	RejectTokensPerDay:         "tokens_per_day",
	RejectCostPerDay:           "cost_per_day",
	RejectCostPerMonth:         "cost_per_month",
	RejectModelNotAllowed:      "model_not_allowed",
	RejectUnpricedModel:        "unpriced_model",
	RejectLimiterUnavailable:   "limiter_unavailable",
	RejectNotMeterable:         "not_meterable",
	RejectNotOwner:             "not_owner",
	RejectOwnershipUnavailable: "ownership_unavailable",
	RejectNonCanonicalPath:     "non_canonical_path",
	RejectHeadersTooLarge:      "headers_too_large",
	RejectCostPerConversation:  "cost_per_conversation",
	RejectUnauthorized:         "unauthorized",
	RejectBadRequest:           "bad_request",
	RejectNotFound:             "not_found",
	RejectMethodNotAllowed:     "method_not_allowed",
	RejectTooLarge:             "too_large",
	RejectUnsupportedEncoding:  "unsupported_encoding",
	RejectUpgradeRequired:      "upgrade_required",
	RejectOther:                "other",
}

// String returns the rejection's name ("" for RejectNone).
func (r Rejection) String() string {
	if int(r) < len(rejectionNames) {
		return rejectionNames[r]
	}
	return "other"
}

// NumRejections is one more than the largest Rejection.
const NumRejections = int(RejectOther) + 1

// Interruption is the closed set of reasons a started stream ended early.
type Interruption uint8

const (
	InterruptNone Interruption = iota
	// InterruptUpstreamEOF: the upstream body ended (or broke) without its
	// terminal marker ([DONE] or message_stop).
	InterruptUpstreamEOF
	// InterruptUpstreamErrorEvent: the upstream sent an error event in the stream.
	InterruptUpstreamErrorEvent
	// InterruptClientCancel: the client went away mid-stream.
	InterruptClientCancel
	// InterruptIdleTimeout: no event arrived within the idle timeout.
	InterruptIdleTimeout
	// InterruptTimeout: the upstream's total timeout ended the stream.
	InterruptTimeout
	// InterruptProtocolError: the upstream broke its wire format: an event
	// over the size cap (the gateway cut the stream), or a non-streamed
	// answer on a dialect route that is not JSON.
	InterruptProtocolError
	// InterruptShutdown: the gateway's drain timeout ended the stream.
	InterruptShutdown
)

// String returns the interruption's label value ("" for none).
func (i Interruption) String() string {
	switch i {
	case InterruptUpstreamEOF:
		return "upstream_eof"
	case InterruptUpstreamErrorEvent:
		return "upstream_error_event"
	case InterruptClientCancel:
		return "client_cancel"
	case InterruptIdleTimeout:
		return "idle_timeout"
	case InterruptTimeout:
		return "timeout"
	case InterruptProtocolError:
		return "protocol_error"
	case InterruptShutdown:
		return "shutdown"
	}
	return ""
}

// SLO names which service-level objective a request broke first.
type SLO uint8

const (
	SLOMet SLO = iota
	SLOTTFT
	SLOTPOT
	SLOE2E
	// SLOFailed marks a request that did not succeed; it is not good.
	SLOFailed
	// SLOExcluded marks a request that is not a model call
	// (Population): it is in no goodput figure.
	SLOExcluded
)

// String returns the SLO's label value.
func (s SLO) String() string {
	switch s {
	case SLOTTFT:
		return "ttft"
	case SLOTPOT:
		return "tpot"
	case SLOE2E:
		return "e2e"
	case SLOFailed:
		return "failed"
	case SLOExcluded:
		return "excluded"
	}
	return "met"
}

// Timing holds the moments of one exchange, taken from the
// monotonic clock. A zero time means the moment did not happen.
type Timing struct {
	In            time.Time // handler starts
	UpSent        time.Time // request written to the upstream
	UpFirstByte   time.Time // upstream's first response byte
	FirstToken    time.Time // first token-bearing event read
	FirstTokenOut time.Time // that event flushed to the client
	HeadersOut    time.Time // an upstream answer's headers written to the client
	LastToken     time.Time // last token-bearing event read
	End           time.Time // last byte flushed, or the exchange ended otherwise
}

// Observer receives one value; prometheus.Observer satisfies it.
type Observer interface {
	Observe(float64)
}

// Record is everything the gateway learned about one request. It is built on
// the request path and handed, once, to the sinks (metrics, access log).
type Record struct {
	RequestID string
	// TraceID is the W3C trace id of the exchange's span, in hex, when it
	// was sampled; "" when tracing is off.
	TraceID string
	// UpstreamRequestID is the upstream's own id for the exchange (OpenAI
	// x-request-id, Anthropic request-id), to join with provider logs.
	UpstreamRequestID string
	KeyID             string // short hash of the caller's key; never the key
	Team              string
	Route             Route
	Dialect           Dialect
	Model             string // requested model
	Upstream          string // upstream name from config
	Transport         Transport
	Stream            bool
	Status            int // status sent to the client

	// Conversation is the conversation the request is a turn of: its key
	// (a hash of its owner and id; never the id), "" for none.
	// ConversationSource is the [conversations] identity entry that named
	// it (a header's name, "baggage", "client_metadata", "responses").
	Conversation       string
	ConversationSource string
	// RequestClass and Agent are what a coding agent said of the call, for
	// reporting only: its request class ("main", "subagent", ...; "" when
	// none said), and the agent that made it (a hash of the agent's id; ""
	// for the main loop).
	RequestClass string
	Agent        string

	Timing Timing

	// Usage as reported by the upstream, or counted from events when
	// Estimated is true. When the upstream reported no input and the
	// exchange was billed, Usage.Input is the prompt estimate it was billed
	// and InputEstimated is true (so tokens and spend agree); a forwarded
	// answer billed max_tokens for want of usage has Estimated true and
	// that Output.
	Usage          Usage
	Estimated      bool
	InputEstimated bool
	// CostMicros is what the exchange was billed, in micro-dollars, priced
	// by [[models]] (0 when unpriced or not billable).
	CostMicros int64

	// TokenEvents counts token-bearing events; ITLCount, ITLSum and ITLMax
	// summarise the gaps between them.
	TokenEvents int
	ITLCount    int
	ITLSum      time.Duration
	ITLMax      time.Duration

	// RelayOverhead sums, over every event, the time between reading it from
	// the upstream and flushing it to the client.
	RelayOverhead time.Duration

	InputBucket  string // label of the input-size bucket
	Outcome      Outcome
	Interruption Interruption
	ErrorType    string // upstream error type (from an error body or event), if any
	TerminalSeen bool   // [DONE], message_stop or a Responses terminal event was seen
	// IncompleteReason is why a Responses API answer is incomplete
	// (incomplete_details.reason: max_output_tokens, content_filter); the
	// answer is still a success.
	IncompleteReason string
	Goodput          SLO
	// Rejection says why the gateway refused the request: the rule, for
	// OutcomeRejected, else (a request of population PopRefused) what its
	// answer's status says (RejectionOfStatus).
	Rejection Rejection
	// Population is which requests the record is counted among.
	Population Population
	BytesOut   int64

	// AttemptLog lists the upstream attempts (Attempts, AttemptCount).
	// RetryWait is the time spent waiting between attempts (backoff and
	// Retry-After), and QueueWait in upstreams' shaping queues.
	AttemptLog
	RetryWait time.Duration
	QueueWait time.Duration
	// Retrying is the time from the first attempt's start to the last
	// one's: failed attempts, waits between them and shaping queues. It is
	// not the gateway's overhead, so Overhead leaves it out.
	Retrying time.Duration
}

// MaxRecordedAttempts bounds the attempts a Record lists (a fixed array, so
// recording them costs no allocation).
const MaxRecordedAttempts = 8

// Attempt is one request sent to an upstream on behalf of a caller.
type Attempt struct {
	Upstream string
	// Status is the upstream's HTTP status, 0 when it sent none.
	Status int
	// Result is the attempt's result: "ok", or why it failed (for example
	// "rate_limited", "overloaded", "server_error", "connect_error",
	// "header_timeout", "first_token_timeout", "error_event",
	// "stream_broken"); or why it was not sent ("breaker_open",
	// "queue_full", "queue_timeout", "key_scope").
	Result string
	// Duration runs from the attempt's start to its end (for a stream
	// relayed to the caller, the stream's end).
	Duration time.Duration
	// BreakerBypass: the attempt was sent although the upstream's breaker
	// refused it, every upstream the request could use refusing it.
	BreakerBypass bool
}

// AttemptLog lists a request's upstream attempts in order, at most
// MaxRecordedAttempts: the first ones and the last (see AddAttempt);
// AttemptCount counts them all. A fixed array, so keeping it costs no
// allocation.
type AttemptLog struct {
	Attempts     [MaxRecordedAttempts]Attempt
	AttemptCount int
}

// AddAttempt appends a to the log. Past MaxRecordedAttempts it takes the
// last place, so the attempt that ended the request is always listed.
func (l *AttemptLog) AddAttempt(a Attempt) {
	l.Attempts[min(l.AttemptCount, MaxRecordedAttempts-1)] = a
	l.AttemptCount++
}

// since returns b-a, or 0 when either moment is missing.
func since(a, b time.Time) time.Duration {
	if a.IsZero() || b.IsZero() {
		return 0
	}
	return b.Sub(a)
}

// TTFT is t_first_token_out − t_in: what the caller waits, less its network.
func (r *Record) TTFT() time.Duration { return since(r.Timing.In, r.Timing.FirstTokenOut) }

// UpstreamTTFT is t_first_token − t_up_sent.
func (r *Record) UpstreamTTFT() time.Duration { return since(r.Timing.UpSent, r.Timing.FirstToken) }

// E2E is t_end − t_in.
func (r *Record) E2E() time.Duration { return since(r.Timing.In, r.Timing.End) }

// TPOT is (t_last_token − t_first_token) / (output_tokens − 1). ok is false
// when fewer than two output tokens were produced.
func (r *Record) TPOT() (d time.Duration, ok bool) {
	n := r.Usage.Output
	if n < 2 || r.Timing.FirstToken.IsZero() || r.Timing.LastToken.IsZero() {
		return 0, false
	}
	return r.Timing.LastToken.Sub(r.Timing.FirstToken) / time.Duration(n-1), true
}

// Overhead is the gateway's own share of the exchange: (t_up_sent − t_in),
// less the time spent on earlier attempts (Retrying),
// plus the time every event spent between being read and being flushed.
func (r *Record) Overhead() time.Duration {
	return max(since(r.Timing.In, r.Timing.UpSent)-r.Retrying, 0) + r.RelayOverhead
}

// SLOTargets are the goodput objectives; a zero target is not checked.
type SLOTargets struct {
	TTFT time.Duration
	TPOT time.Duration
	E2E  time.Duration
}

// Classify returns whether the record meets the targets, and if not which
// objective it broke first (in the order TTFT, TPOT, E2E). A request that did
// not succeed is SLOFailed; a request that is not a model call (Population)
// is SLOExcluded, in no goodput figure. TTFT and TPOT apply only to streams that produced
// tokens; a target is met when the figure is at or under it (as vLLM counts
// goodput).
func (t SLOTargets) Classify(r *Record) SLO {
	if r.Population != PopModelCall {
		return SLOExcluded
	}
	if r.Outcome != OutcomeOK {
		return SLOFailed
	}
	if t.TTFT > 0 && r.Stream && !r.Timing.FirstTokenOut.IsZero() && r.TTFT() > t.TTFT {
		return SLOTTFT
	}
	if t.TPOT > 0 {
		if tpot, ok := r.TPOT(); ok && tpot > t.TPOT {
			return SLOTPOT
		}
	}
	if t.E2E > 0 && r.E2E() > t.E2E {
		return SLOE2E
	}
	return SLOMet
}

// TimeToHeaders is how long the caller waited for an upstream answer's
// response headers: from arrival to their writing. ok is false when no
// upstream answer's headers were written (a refusal, a gateway error, a
// WebSocket turn).
func (r *Record) TimeToHeaders() (d time.Duration, ok bool) {
	if r.Timing.HeadersOut.IsZero() || r.Timing.In.IsZero() {
		return 0, false
	}
	return max(r.Timing.HeadersOut.Sub(r.Timing.In), 0), true
}

// Hold is how long a stream's answer was held back before its headers
// went to the caller: from the upstream's first byte to the headers'
// writing. The gateway holds a stream's headers and opening events until
// its first token, so that a failure before it can be retried unseen
// (DESIGN 1); this is what that costs the caller in time to headers. ok is
// false for an answer that was not a stream, or had no headers written.
func (r *Record) Hold() (d time.Duration, ok bool) {
	if !r.Stream || r.Timing.HeadersOut.IsZero() || r.Timing.UpFirstByte.IsZero() {
		return 0, false
	}
	return max(r.Timing.HeadersOut.Sub(r.Timing.UpFirstByte), 0), true
}

// Buckets maps an input-token count to a bucket label. Edges are ascending
// lower bounds starting at 0, e.g. [0 500 2000 8000 32000] gives labels
// "0-500", "500-2000", "2000-8000", "8000-32000", "32000+".
type Buckets struct {
	edges  []int64
	labels []string
}

// NewBuckets builds the labels for edges. Edges must be ascending; the caller
// validates them.
func NewBuckets(edges []int64) Buckets {
	b := Buckets{edges: append([]int64(nil), edges...)}
	for i, e := range edges {
		if i+1 < len(edges) {
			b.labels = append(b.labels, itoa(e)+"-"+itoa(edges[i+1]))
		} else {
			b.labels = append(b.labels, itoa(e)+"+")
		}
	}
	return b
}

// Labels lists every bucket label in order, for pre-creating series.
func (b Buckets) Labels() []string { return b.labels }

// Label returns the label of the bucket holding n tokens. n < 0 (unknown)
// returns "unknown".
func (b Buckets) Label(n int64) string {
	if n < 0 || len(b.edges) == 0 {
		return "unknown"
	}
	for i := len(b.edges) - 1; i >= 0; i-- {
		if n >= b.edges[i] {
			return b.labels[i]
		}
	}
	return b.labels[0]
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
