package proxy

import (
	"net/http"
	"runtime/debug"

	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/ratelimit"
)

// statusClientClosed is the status recorded (never sent) for a caller that
// went away before the answer, after nginx's 499.
const statusClientClosed = 499

// exchange is one request's state on its way through the gateway.
type exchange struct {
	g          *Gateway
	gen        *generation // the configuration it runs under, from start to finish
	w          http.ResponseWriter
	r          *http.Request
	rec        llm.Record
	modelLabel string
	info       requestInfo
	// out is what the caller got (respond.go).
	out reply
	// kind is what the exchange is (kind.go): a model call, a replay, a
	// metered or plain forward, a probe. answer is the dialect its errors
	// are written in: its own, or for a forwarded path the one its path and
	// headers suggest. Both are fixed at construction, except that reading
	// a forward's body may make it metered (inspect).
	kind   exchangeKind
	answer llm.Dialect
	// promptEstimate is the prompt size in tokens guessed from the body
	// (about 4 bytes a token), -1 when unknown. It only places a request
	// whose upstream reported no usage in an input-size bucket.
	promptEstimate int64
	// served is set once an upstream has answered with a success status:
	// modelLabel is then metrics.ModelServed's answer, before it was
	// metrics.Model's (see servedBy). Every series of the exchange carries
	// modelLabel as it is when written, and the only one written before
	// finish, ITL, is resolved after the success status.
	served bool

	// stored is the stored response or conversation the path addresses.
	stored storedUse
	// trip is the request's way through its upstreams (roundtrip.go).
	trip trip
	// last is the state of the last attempt, the one whose answer (or
	// failure) the caller got, as it ended (attemptResult.at); nil before
	// any attempt (see lastAttempt).
	last *attemptState

	// Governance: the caller's [[keys]] entry (nil if none), its lease when
	// a limiter admitted it, the limiter's RPM/TPM states for the
	// rate-limit headers.
	key      *keyEntry
	lease    *ratelimit.Lease
	rlStates []ratelimit.State

	// conv is the conversation the exchange is a turn of (conversation.go).
	conv convTurn

	// tr is the exchange's spans (trace.go); nil when tracing is off.
	tr *exchangeTrace
}

// dialectHandler serves POST /v1/chat/completions and POST /v1/messages.
func (g *Gateway) dialectHandler(route llm.Route, d llm.Dialect) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { g.handle(w, r, route, d) }
}

// forwardHandler serves every other /v1/* path: the request goes to the
// upstream unchanged and only its end-to-end latency is measured (a model
// call there is metered too). A background response streamed by
// GET /v1/responses/{id}?stream=true is measured as a stream.
func (g *Gateway) forwardHandler(w http.ResponseWriter, r *http.Request) {
	if isReplay(r) {
		g.handle(w, r, llm.RouteResponsesRetrieve, llm.DialectResponses)
		return
	}
	if isTokenCount(r) {
		g.handle(w, r, llm.RouteCountTokens, llm.DialectNone)
		return
	}
	g.handle(w, r, llm.RouteOther, llm.DialectNone)
}

// isTokenCount reports a request that counts a prompt's tokens and
// generates nothing: Anthropic's POST /v1/messages/count_tokens and the
// Responses API's POST /v1/responses/input_tokens. Agents send them before
// a turn (to decide on compaction), many at a start; they are their own
// request class (kindCountTokens). An escaped path is not one: the
// upstream could split it otherwise.
func isTokenCount(r *http.Request) bool {
	return r.Method == http.MethodPost && r.URL.RawPath == "" &&
		(r.URL.Path == "/v1/messages/count_tokens" || r.URL.Path == "/v1/responses/input_tokens")
}

// abortOnPanic turns a panic after the response has started into
// http.ErrAbortHandler, so the connection is cut (the caller sees a broken
// response) instead of the recoverer writing an error body into a stream.
func (ex *exchange) abortOnPanic() {
	p := recover()
	if p == nil {
		return
	}
	if ex.out.sent() && p != http.ErrAbortHandler {
		ex.g.log.Error("panic after the response started; aborting the connection",
			"request_id", ex.rec.RequestID, "panic", p, "stack", string(debug.Stack()))
		panic(http.ErrAbortHandler)
	}
	panic(p)
}

// noAttempt is the state of no attempt: what lastAttempt gives before one.
// Nothing writes it.
var noAttempt attemptState

// lastAttempt is the state of the exchange's last attempt as it ended, or
// noAttempt (its up nil) when none was made.
func (ex *exchange) lastAttempt() *attemptState {
	if ex.last == nil {
		return &noAttempt
	}
	return ex.last
}
