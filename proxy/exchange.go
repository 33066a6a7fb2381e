package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"mime"
	"net/http"
	"runtime/debug"
	"strings"
	"time"

	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/ratelimit"
	"github.com/tollgate-llm/tollgate/sseparse"
)

// statusClientClosed is the status recorded (never sent) for a caller that
// went away before the answer, after nginx's 499.
const statusClientClosed = 499

// errorCaptureLimit bounds the copy of an upstream error body kept to read
// its error type.
const errorCaptureLimit = 64 << 10

// exchange is one request's state on its way through the gateway.
type exchange struct {
	g          *Gateway
	w          http.ResponseWriter
	r          *http.Request
	rec        llm.Record
	modelLabel string
	up         *upstream
	info       requestInfo
	captured   []byte // bounded copy of a non-relayed body
	// terminalOut is set once the terminal marker has been flushed to the
	// caller; lastFlush is the time of the last flush.
	terminalOut bool
	lastFlush   time.Time
	// headersSent is set once the response status is written: after that
	// an error can no longer be reported as a status.
	headersSent bool
	// metered is set for a forwarded request (another /v1/* path) whose
	// body names a model: it is admitted and billed like a dialect request.
	metered bool
	// promptEstimate is the prompt size in tokens guessed from the body
	// (about 4 bytes a token), -1 when unknown. It only places a request
	// whose upstream reported no usage in an input-size bucket.
	promptEstimate int64

	// tk is the breaker ticket of the attempt in progress; a stream reports
	// it healthy at its first token (tkEarly), so a long stream does not
	// hold a half-open probe slot to its end.
	tk      *ticket
	tkEarly bool
	// callerKeyUp: the caller's own key went upstream (passthrough), so a
	// 429 describes the caller's account, not the upstream's health.
	callerKeyUp bool
	// firstTokenCut: the first-token timer ended a committed stream.
	firstTokenCut bool

	// Governance: the caller's [[keys]] entry (nil if none), its lease when
	// a limiter admitted it, the limiter's RPM/TPM states for the
	// rate-limit headers, and the cost billed.
	key        *keyEntry
	lease      *ratelimit.Lease
	rlStates   []ratelimit.State
	costMicros int64

	// probe, set for a synthetic probe (Gateway.Probe), is its one target:
	// tried once, with no retry and no fallback. nil for a caller's request.
	probe []target
}

// dialectHandler serves POST /v1/chat/completions and POST /v1/messages.
func (g *Gateway) dialectHandler(route llm.Route, d llm.Dialect) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		g.open.Add(1)
		defer g.open.Add(-1)
		ex := &exchange{g: g, w: w, r: r, promptEstimate: -1}
		ex.rec.Timing.In = g.now()
		ex.rec.Route, ex.rec.Dialect = route, d
		ex.rec.RequestID = requestIDFrom(r.Context())
		inflight := g.metrics.Inflight(route)
		inflight.Inc()
		defer inflight.Dec()
		defer ex.finish()
		defer ex.abortOnPanic()
		ex.serve()
	}
}

// forwardHandler serves every other /v1/* path: the request goes to the
// upstream unchanged and only its end-to-end latency is measured.
func (g *Gateway) forwardHandler(w http.ResponseWriter, r *http.Request) {
	g.open.Add(1)
	defer g.open.Add(-1)
	ex := &exchange{g: g, w: w, r: r, promptEstimate: -1}
	ex.rec.Timing.In = g.now()
	ex.rec.Route, ex.rec.Dialect = llm.RouteOther, llm.DialectNone
	ex.rec.RequestID = requestIDFrom(r.Context())
	inflight := g.metrics.Inflight(llm.RouteOther)
	inflight.Inc()
	defer inflight.Dec()
	defer ex.finish()
	defer ex.abortOnPanic()
	ex.serve()
}

// abortOnPanic turns a panic after the response has started into
// http.ErrAbortHandler, so the connection is cut (the caller sees a broken
// response) instead of the recoverer writing an error body into a stream.
func (ex *exchange) abortOnPanic() {
	p := recover()
	if p == nil {
		return
	}
	if ex.headersSent && p != http.ErrAbortHandler {
		ex.g.log.Error("panic after the response started; aborting the connection",
			"request_id", ex.rec.RequestID, "panic", p, "stack", string(debug.Stack()))
		panic(http.ErrAbortHandler)
	}
	panic(p)
}

// fail answers the caller with e and records the outcome.
func (ex *exchange) fail(e *apiError, o llm.Outcome) {
	ex.rec.Outcome = o
	ex.rec.Status = e.Status
	d := ex.rec.Dialect
	if d == llm.DialectNone {
		d = guessDialect(ex.r)
	}
	ex.headersSent = true
	ex.rec.BytesOut += int64(writeError(ex.w, d, ex.rec.RequestID, e))
	ex.rec.Timing.End = ex.g.now()
}

// ErrShutdown is the cause a server gives the requests' base context when it
// cancels open exchanges at the end of its drain timeout, so they are
// recorded as cut by the gateway, not by their callers.
var ErrShutdown = errors.New("proxy: gateway shutting down")

// cancelledBy tells who ended an exchange whose caller's context is done or
// whose caller could not be written to.
func (ex *exchange) cancelledBy() (llm.Outcome, llm.Interruption) {
	if errors.Is(context.Cause(ex.r.Context()), ErrShutdown) {
		return llm.OutcomeShutdown, llm.InterruptShutdown
	}
	return llm.OutcomeClientCancel, llm.InterruptClientCancel
}

// clientGone records that the caller left (or the gateway cancelled the
// exchange) before an answer was sent.
//
// When the gateway cut it (the drain timeout ran out) and nothing was sent
// yet, the caller is still there: it gets a 503 in its dialect with
// Retry-After, not an empty answer that an SDK could take for a whole one
// (a request waiting to retry meets this more often than any other).
func (ex *exchange) clientGone() {
	o, _ := ex.cancelledBy()
	if o == llm.OutcomeShutdown && !ex.headersSent {
		setRetryAfter(ex.w.Header(), time.Second)
		ex.fail(errShuttingDown(), llm.OutcomeShutdown)
		return
	}
	ex.rec.Outcome = o
	ex.rec.Status = statusClientClosed
	ex.rec.Timing.End = ex.g.now()
}

func (ex *exchange) serve() {
	g, r := ex.g, ex.r
	cfg := g.cfg

	key, hasKey, malformed := callerKey(r.Header)
	sum, id := keyHash(key)
	ex.rec.KeyID = id
	switch {
	case malformed:
		ex.fail(errUnauthorized("malformed Authorization header: expected \"Bearer <key>\""), llm.OutcomeBadRequest)
		return
	case !hasKey && cfg.Auth.RequireKey:
		ex.fail(errUnauthorized("missing API key: send \"Authorization: Bearer <key>\" or \"x-api-key: <key>\""),
			llm.OutcomeBadRequest)
		return
	}
	if aerr := ex.identify(sum, hasKey); aerr != nil {
		ex.fail(aerr, llm.OutcomeBadRequest)
		return
	}

	d := ex.rec.Dialect
	if len(ex.targets("")) == 0 {
		ex.fail(errNoUpstream(d), llm.OutcomeBadRequest)
		return
	}

	body, aerr := readBody(r, cfg.Server.MaxBodyBytes)
	if aerr != nil {
		if r.Context().Err() != nil {
			ex.clientGone()
			return
		}
		ex.fail(aerr, llm.OutcomeBadRequest)
		return
	}

	if d != llm.DialectNone {
		ex.promptEstimate = int64(len(body)+3) / 4
		info, aerr := inspectRequest(d, body)
		if aerr != nil {
			ex.fail(aerr, llm.OutcomeBadRequest)
			return
		}
		if key, field, bad := caseVariantField(body); bad {
			ex.fail(errCaseVariant(key, field), llm.OutcomeBadRequest)
			return
		}
		ex.info = info
		ex.rec.Model = info.Model
		ex.rec.Stream = info.Stream
	}
	if d == llm.DialectNone {
		if aerr := ex.meterForwarded(body); aerr != nil {
			ex.rec.Rejection = llm.RejectNotMeterable
			ex.fail(aerr, llm.OutcomeRejected)
			return
		}
	}
	ex.modelLabel = g.metrics.Model(ex.rec.Model)
	if (d != llm.DialectNone || ex.metered) && !ex.admit() {
		return
	}

	// In mode "keys" the caller's key is the gateway's, never the
	// upstream's: the upstream's own key replaces it.
	ex.roundTrip(body, hasKey && !g.gov.keysMode)
}

// readBody reads the whole request body, at most limit bytes. The body is
// read before the upstream request starts: streaming the inbound body into
// the outbound request truncates streams under load (golang/go#40747,
// DESIGN 1), and the dialect handler needs the bytes anyway.
func readBody(r *http.Request, limit int64) ([]byte, *apiError) {
	if r.ContentLength > limit {
		return nil, errTooLarge(limit)
	}
	var buf bytes.Buffer
	if r.ContentLength > 0 {
		buf.Grow(int(r.ContentLength))
	}
	_, err := buf.ReadFrom(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, errBadRequest("could not read the request body", "")
	}
	if int64(buf.Len()) > limit {
		return nil, errTooLarge(limit)
	}
	return buf.Bytes(), nil
}

// targets returns the upstreams a request for model goes to, in order.
// Another /v1/* path that no upstream of its guessed dialect serves goes to
// the first upstream.
func (ex *exchange) targets(model string) []target {
	rt := ex.g.routing
	t := rt.targets(ex.routeDialect(), model)
	if len(t) == 0 && ex.rec.Dialect == llm.DialectNone {
		t = rt.fallback[llm.DialectNone]
	}
	return t
}

// routeDialect is the dialect that picks a request's upstreams: its own, or
// for another /v1/* path the one its path and headers suggest.
func (ex *exchange) routeDialect() llm.Dialect {
	if ex.rec.Dialect != llm.DialectNone {
		return ex.rec.Dialect
	}
	return guessDialect(ex.r)
}

func (ex *exchange) since(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return ex.rec.Timing.In.Add(time.Duration(ns))
}

// setUpstreamKey puts the upstream's own key in the header its API expects.
func setUpstreamKey(h http.Header, d llm.Dialect, r *http.Request, key string) {
	if d == llm.DialectNone {
		d = guessDialect(r)
	}
	if d == llm.DialectAnthropic {
		h.Set("X-Api-Key", key)
		return
	}
	h.Set("Authorization", "Bearer "+key)
}

// isEventStream reports whether a Content-Type is text/event-stream,
// parameters allowed.
func isEventStream(ct string) bool {
	if ct == "" {
		return false
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return strings.HasPrefix(strings.ToLower(strings.TrimSpace(ct)), "text/event-stream")
	}
	return mt == "text/event-stream"
}

// usageFromBody reads the usage of a non-streamed answer from the bounded
// copy of its body.
func (ex *exchange) usageFromBody() {
	var u llm.Usage
	var ok bool
	switch ex.rec.Dialect {
	case llm.DialectOpenAI:
		u, ok = sseparse.UsageFromOpenAIBody(ex.captured)
	case llm.DialectAnthropic:
		u, ok = sseparse.UsageFromAnthropicBody(ex.captured)
	default: // a metered forwarded answer: prompt_tokens or input_tokens
		if u, ok = sseparse.UsageFromOpenAIBody(ex.captured); !ok {
			u, ok = sseparse.UsageFromAnthropicBody(ex.captured)
		}
	}
	if ok {
		ex.rec.Usage = u
	}
}

// upstreamRequestID returns the upstream's id for the exchange, if it sent a
// plain one: OpenAI's x-request-id or Anthropic's request-id.
func upstreamRequestID(h http.Header) string {
	for _, k := range []string{"X-Request-Id", "Request-Id"} {
		if v := h.Get(k); v != "" && validRequestID(v) {
			return v
		}
	}
	return ""
}
