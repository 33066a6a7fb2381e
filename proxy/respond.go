package proxy

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/sseparse"
)

// reply is what the caller got, written only here, as it is sent: the
// status, the bytes, and how the answer ended. finish folds it into the
// record.
type reply struct {
	// status is the status sent, 0 before one: after it an error can no
	// longer be reported as a status. A caller that got none is recorded
	// with statusClientClosed.
	status int
	bytes  int64
	// outcome, interrupt and errType: how the answer ended, as the last
	// attempt judged it (ended) or the gateway answered instead (fail,
	// clientGone, relayFailure).
	outcome   llm.Outcome
	interrupt llm.Interruption
	errType   string
	// usage is what a relayed failure reported (a held stream's opening
	// events); the record takes it when it has a count.
	usage llm.Usage
	// headersAt is when an upstream's answer's headers were written to the
	// caller (writeHeader): for a held stream, when the hold ended.
	headersAt time.Time
}

// sent reports whether the status has been sent.
func (p *reply) sent() bool { return p.status != 0 }

// failure is an attempt that failed before anything was sent to the caller:
// what the caller gets if no other attempt follows.
type failure struct {
	status int
	// header and body are the upstream's answer (body bounded by
	// errorCaptureLimit, or the events held back from a stream); header is
	// nil when the upstream sent none, and apiErr is the gateway's answer.
	header    http.Header
	body      []byte
	stream    bool
	apiErr    *apiError
	outcome   llm.Outcome
	interrupt llm.Interruption
	errType   string
	// usage is what a held stream reported before it failed; errorEvent
	// ends the held events sent, for a stream the upstream broke without
	// an error event of its own (streamErrorEvent).
	usage      llm.Usage
	errorEvent []byte
}

// relayFailure sends the caller the failure of the last attempt when no
// other attempt follows: the upstream's error answer as it came, the opening
// of a stream the upstream broke (ended by an error event in the caller's
// dialect), or the gateway's own error.
func (ex *exchange) relayFailure(f *failure) {
	out := &ex.out
	out.interrupt = f.interrupt
	if f.errType != "" {
		out.errType = f.errType
	}
	if f.header == nil {
		ex.fail(f.apiErr, f.outcome)
		return
	}
	out.outcome, out.usage = f.outcome, f.usage
	ex.prepareHeaders(f.header)
	if f.stream {
		ex.sseHeaders()
	}
	ex.writeHeader(f.status)
	err := ex.write(f.body)
	if err == nil && f.errorEvent != nil && ex.gen.cfg.Server.StreamErrorEvents {
		err = ex.write(f.errorEvent)
	}
	if err == nil {
		_ = http.NewResponseController(ex.w).Flush()
	}
}

// writeHeader sends the answer's status: from here on an error can no
// longer be reported as a status.
func (ex *exchange) writeHeader(status int) {
	ex.out.status, ex.out.headersAt = status, ex.g.now()
	ex.w.WriteHeader(status)
}

// gatewayError is the gateway's own answer for an attempt that got no
// response and ended with outcome o.
func gatewayError(o llm.Outcome) *apiError {
	switch o {
	case llm.OutcomeUpstreamTimeout:
		return errUpstreamTimeout()
	case llm.OutcomeUpstreamUnreachable:
		return errUpstreamUnreachable()
	}
	return errUpstreamFailed()
}

// fail answers the caller with e and records the outcome.
func (ex *exchange) fail(e *apiError, o llm.Outcome) {
	ex.out.outcome, ex.out.status = o, e.Status
	ex.out.bytes += int64(writeError(ex.w, ex.answer, ex.rec.RequestID, e))
}

// ended records how the attempt that answered the caller ended.
func (ex *exchange) ended(e ending) {
	ex.out.outcome, ex.out.interrupt = e.outcome, e.interrupt
	if e.errType != "" {
		ex.out.errType = e.errType
	}
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
	if o == llm.OutcomeShutdown && !ex.out.sent() {
		setRetryAfter(ex.w.Header(), time.Second)
		ex.fail(errShuttingDown(), llm.OutcomeShutdown)
		return
	}
	ex.out.outcome = o // and no status: recorded as statusClientClosed
}

// allUnavailable answers a request whose every upstream was skipped, a
// full or timed-out shaping queue among them (the others with an open
// breaker, or a caller's key that may not go there; a request that every
// breaker refuses is sent in bypass instead, see bypassTarget): 503 with
// Retry-After, the shortest wait until one of the skipped breakers lets
// probes through (at least 1 s).
func (ex *exchange) allUnavailable(wait time.Duration) {
	if wait < time.Second {
		wait = time.Second
	}
	setRetryAfter(ex.w.Header(), wait)
	ex.fail(&apiError{Status: http.StatusServiceUnavailable, Kind: "server_error", Code: "upstream_unavailable",
		AnthropicKind: "overloaded_error",
		Msg: "every upstream for this request is unavailable (circuit open or queue full); retry after " +
			strconv.FormatInt(int64((wait+time.Second-1)/time.Second), 10) + " s"}, llm.OutcomeUpstreamUnreachable)
}

// prepareHeaders copies the upstream's response headers for the caller,
// with the caller's own rate-limit headers in place of the upstream
// account's.
func (ex *exchange) prepareHeaders(upH http.Header) {
	g := ex.g
	h := ex.w.Header()
	copyResponseHeaders(h, upH)
	if ex.gen.gov.keysMode || len(ex.rlStates) > 0 {
		// The upstream's rate-limit headers describe the gateway's upstream
		// account, not the caller: a governed caller sees only its own
		// limits, never a mix of both.
		deleteUpstreamAccountHeaders(h, ex.gen.gov.keysMode)
	}
	if len(ex.rlStates) > 0 {
		setRateLimitHeaders(h, ex.rec.Dialect, ex.rlStates, g.now())
	}
}

// sseHeaders marks a relayed event stream as not to be buffered.
func (ex *exchange) sseHeaders() {
	h := ex.w.Header()
	h.Set("X-Accel-Buffering", "no")
	if h.Get("Cache-Control") == "" {
		h.Set("Cache-Control", "no-cache")
	}
}

// streamErrorEvent is the error event that ends a stream the upstream broke
// after bytes were sent, in the caller's dialect: OpenAI SDKs raise on a data
// payload with a top-level "error" object, Anthropic SDKs on `event: error`.
// On the Responses API all three SDKs raise on an `error` event whose error
// is nested (the flat form only Node's helper raises on); it takes the next
// sequence_number, and a response.failed for the response tap saw created
// follows it, so a client reading the raw events sees the response fail.
func streamErrorEvent(d llm.Dialect, why llm.Interruption, tap *sseparse.Tap) []byte {
	timeout := why == llm.InterruptIdleTimeout || why == llm.InterruptTimeout
	switch {
	case d == llm.DialectResponses && timeout:
		return responsesErrorEvents("upstream_timeout", msgTimedOut, tap)
	case d == llm.DialectResponses:
		return responsesErrorEvents("upstream_stream_broken", msgBroken, tap)
	case d == llm.DialectAnthropic && timeout:
		return anthropicTimeoutEvent
	case d == llm.DialectAnthropic:
		return anthropicBrokenEvent
	case timeout:
		return openAITimeoutEvent
	}
	return openAIBrokenEvent
}

const (
	msgBroken   = "the upstream stream ended before it was complete; the answer is cut"
	msgTimedOut = "the upstream stream timed out before it was complete; the answer is cut"
)

var (
	openAIBrokenEvent    = []byte(`data: {"error":{"message":"` + msgBroken + `","type":"server_error","param":null,"code":"upstream_stream_broken"}}` + "\n\n")
	openAITimeoutEvent   = []byte(`data: {"error":{"message":"` + msgTimedOut + `","type":"server_error","param":null,"code":"upstream_timeout"}}` + "\n\n")
	anthropicBrokenEvent = []byte("event: error\n" +
		`data: {"type":"error","error":{"type":"api_error","message":"` + msgBroken + `"}}` + "\n\n")
	anthropicTimeoutEvent = []byte("event: error\n" +
		`data: {"type":"error","error":{"type":"timeout_error","message":"` + msgTimedOut + `"}}` + "\n\n")
)

// responsesErrorEvents renders the Responses API end of a broken stream
// (see streamErrorEvent). It runs once, for a stream that broke.
func responsesErrorEvents(code, msg string, tap *sseparse.Tap) []byte {
	seq := tap.Sequence()
	b := append([]byte(nil), "event: error\ndata: {\"type\":\"error\",\"sequence_number\":"...)
	b = strconv.AppendInt(b, seq+1, 10)
	b = append(b, `,"error":{"type":"server_error","code":"`+code+`","message":"`+msg+`","param":null}}`+"\n\n"...)
	id := tap.ResponseID()
	if len(id) == 0 {
		return b
	}
	quoted, err := json.Marshal(string(id))
	if err != nil { // cannot happen for a string
		return b
	}
	b = append(b, "event: response.failed\ndata: {\"type\":\"response.failed\",\"sequence_number\":"...)
	b = strconv.AppendInt(b, seq+2, 10)
	b = append(b, `,"response":{"id":`...)
	b = append(b, quoted...)
	return append(b, `,"object":"response","status":"failed","error":{"code":"server_error","message":"`+msg+
		`"},"incomplete_details":null,"output":[],"usage":null}}`+"\n\n"...)
}

// write sends p to the client and counts it.
func (ex *exchange) write(p []byte) error {
	n, err := ex.w.Write(p)
	ex.out.bytes += int64(n)
	return err
}
