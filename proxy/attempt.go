package proxy

import (
	"bytes"
	"context"
	"io"
	"mime"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/sseparse"
)

// attemptState is one attempt's own state, made for each try (attemptWith)
// and passed to the attempt, the relay and the copy, so nothing of one
// attempt outlives it into the next. What finish and the trace need of the
// attempt that answered comes back in its result (attemptResult.at).
type attemptState struct {
	up *upstream
	// callerKeyUp: the caller's own key goes upstream (passthrough), so a
	// 429 describes the caller's account, not the upstream's health.
	callerKeyUp bool
	// tk is the attempt's breaker ticket (the zero ticket without a
	// breaker); a stream reports it healthy at its first token (tkEarly),
	// so a long stream does not hold a half-open probe slot to its end.
	tk      ticket
	tkEarly bool
	// claim is the kind of stored object whose new id the answer names,
	// still to be recorded as the caller's (mode "keys", see claims);
	// storedNone once recorded, or when there is none. link: the answer
	// names a new stored response, to be linked to the exchange's
	// conversation (linksResponse).
	claim storedKind
	link  bool
	// suppressUsage is set when the gateway added include_usage on the
	// caller's behalf (bodyFor), so the usage-only chunk is kept from the
	// caller.
	suppressUsage bool
	// captured is a bounded copy of a body that is not relayed event by
	// event (copyBody); idConflict says that body named a stored object
	// another team owns and was withheld.
	captured   []byte
	idConflict bool
	// terminalOut is set once the terminal marker has been flushed to the
	// caller; lastFlush is the time of the last flush.
	terminalOut bool
	lastFlush   time.Time
	// learned is what the attempt found out about its upstream's answer:
	// the record's, when it is the last attempt (finish).
	learned answerFacts
}

// answerFacts is what one attempt learned of its upstream's answer.
type answerFacts struct {
	// requestID is the upstream's id for the answer (upstreamRequestID);
	// sent and firstByte the moments the request was written and the
	// answer's first byte came.
	requestID       string
	sent, firstByte time.Time
	form            answerForm
	// firstTokenOut is when the first token was flushed to the caller;
	// relayOverhead sums each relayed event's time from its read to its
	// flush.
	firstTokenOut time.Time
	relayOverhead time.Duration
	// tally is a relayed stream's figures, when tallied.
	tally   sseparse.Summary
	tallied bool
	// usage is a whole answer's, read from its body when hasUsage, and
	// incompleteReason a Responses API answer's incomplete_details.reason.
	usage            llm.Usage
	hasUsage         bool
	incompleteReason string
}

// answerForm is how an upstream answered: the record's Stream is the form
// the caller asked for until an answer says otherwise.
type answerForm uint8

const (
	formUnknown answerForm = iota // no answer, or an error answer
	formStream                    // an event stream, relayed event by event
	formWhole                     // one piece, copied
)

// attemptResult is what one attempt left behind.
type attemptResult struct {
	result string
	status int
	// done: the caller has its answer (or left); no other attempt follows.
	done bool
	// retryable: the attempt failed before the caller got a byte, in a way
	// another attempt may not.
	retryable bool
	// healthy is the breaker's outcome: false for connection errors,
	// timeouts, 408, 429, 5xx and streams the upstream broke.
	healthy bool
	fail    *failure
	// at is the attempt's state as it ended.
	at *attemptState
}

// attemptTrace holds the moments the transport's goroutines report for one
// attempt, as nanoseconds since the exchange's arrival (0 = not yet); atomic
// because the HTTP/1 write loop may still run when RoundTrip returns.
type attemptTrace struct {
	sent, firstByte atomic.Int64
}

// attempt sends the request to one upstream and hands its answer on.
// mayRetry says whether another attempt could follow: then a stream's
// opening events are held back until its first token, so that an error or a
// stall before it can still be retried; otherwise every event goes out at
// once.
func (ex *exchange) attempt(at *attemptState, t target, body []byte, mayRetry bool) attemptResult {
	g, up := ex.g, t.up
	body = ex.bodyFor(at, t, body)
	// Each attempt that succeeds upstream creates its own stored object.
	at.claim = ex.claims()
	at.link = ex.linksResponse()

	// The attempt lives in the caller's context: a caller that hangs up
	// cancels it. No http.Client.Timeout: it would cap streams. The phase
	// timer ends it at the upstream's total timeout too.
	ctx, cancel := context.WithCancelCause(ex.r.Context())
	defer cancel(nil)
	pt := newPhaseTimer(cancel, up.idle, up.timeout, g.now)
	defer pt.stop()

	tr := &attemptTrace{}
	// The HTTP/1 write loop reports the request written from its own
	// goroutine once it has flushed it, and RoundTrip returns as soon as the
	// answer's headers are in, which can be before that report: read it
	// when the attempt ends, or the exchange loses its overhead and upstream
	// TTFT. finish, which uses them, runs after the attempts.
	defer func() { at.learned.sent = ex.since(tr.sent.Load()) }()
	req, err := ex.upstreamRequest(tr.trace(ctx, g.now, ex.rec.Timing.In), up, body, at.callerKeyUp)
	if err != nil {
		g.log.Error("building upstream request", "request_id", ex.rec.RequestID, "upstream", up.cfg.Name, "err", err)
		ex.fail(errUpstreamFailed(), llm.OutcomeUpstreamError)
		e := ex.classify(at, stop{stage: stageNoRequest})
		return ex.result(e, 0, true)
	}
	if ex.info.Stream {
		// A non-streamed answer's headers come with its whole body.
		pt.enter(phaseHeaders, up.headerTimeout)
	}
	resp, err := up.transport.RoundTrip(req)
	at.learned.firstByte = ex.since(tr.firstByte.Load())
	if err != nil {
		return ex.noResponse(ctx, at, err)
	}
	defer resp.Body.Close()
	at.learned.requestID = upstreamRequestID(resp.Header)
	ex.servedBy(resp.StatusCode)

	switch {
	case resp.StatusCode >= 400:
		pt.enter(phaseNone, 0)
		return ex.errorAnswer(ctx, at, resp, mayRetry)
	case isEventStream(resp.Header.Get("Content-Type")) && ex.rec.Dialect != llm.DialectNone:
		if ex.info.Stream { // the caller asked for a stream
			pt.enter(phaseFirstToken, up.firstToken)
		} else {
			pt.enter(phaseNone, 0) // a stream nobody asked for: only the total timeout
		}
		at.learned.form = formStream
		return ex.relay(ctx, at, resp, mayRetry, pt)
	default:
		pt.enter(phaseNone, 0)
		ex.prepareHeaders(resp.Header)
		return ex.copyAnswer(ctx, at, resp)
	}
}

// servedBy fixes the exchange's model label at the first success status an
// upstream answers it with: only then may the model take a label of its own
// (metrics.ModelServed), so that names the upstream refuses, and requests
// the gateway refuses or never sends, use up none. It runs before the relay
// resolves the ITL observer with the label. A probe's model is no caller's.
func (ex *exchange) servedBy(status int) {
	if ex.served || !ex.kind.caller() || status < 200 || status > 299 {
		return
	}
	ex.served = true
	ex.modelLabel = ex.g.metrics.ModelServed(ex.rec.Model)
}

// trace reports the moments the request was written and the first byte of
// the answer came, as nanoseconds since in (at least 1, so 0 stays "not
// yet").
func (tr *attemptTrace) trace(ctx context.Context, now func() time.Time, in time.Time) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) {
			tr.sent.CompareAndSwap(0, int64(max(now().Sub(in), 1)))
		},
		GotFirstResponseByte: func() {
			tr.firstByte.CompareAndSwap(0, int64(max(now().Sub(in), 1)))
		},
	})
}

// upstreamRequest builds the request to up. The path goes upstream as the
// caller encoded it: decoding it would turn an escaped "?" or "/" into a
// different request than the one the router and the governance saw. When
// the caller's key does not go upstream, the upstream's own key (if any) is
// sent instead.
func (ex *exchange) upstreamRequest(ctx context.Context, up *upstream, body []byte, callerKeyUp bool) (*http.Request, error) {
	r := ex.r
	tgt := up.cfg.URL(r.URL.EscapedPath())
	if r.URL.RawQuery != "" {
		tgt += "?" + r.URL.RawQuery
	}
	req, err := http.NewRequestWithContext(ctx, r.Method, tgt, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	if len(body) == 0 && r.ContentLength == 0 {
		req.Body, req.GetBody, req.ContentLength = http.NoBody, nil, 0
	}
	req.Header = upstreamRequestHeaders(r.Header)
	if ex.info.decoded {
		// The body is the decoded one, its Content-Length set from it.
		req.Header.Del("Content-Encoding")
	}
	req.Header.Set(requestIDHeader, ex.rec.RequestID)
	ex.injectTrace(req.Header)
	if ex.kind == kindProbe {
		req.Header.Set(ProbeHeader, "1")
	}
	if !callerKeyUp {
		req.Header.Del("Authorization")
		req.Header.Del("X-Api-Key")
		if ex.gen.gov.keysMode {
			// With the gateway's upstream key, the caller must not pick the
			// organisation or project that is billed.
			req.Header.Del("Openai-Organization")
			req.Header.Del("Openai-Project")
		}
		if k := up.cfg.APIKey.Reveal(); k != "" {
			setUpstreamKey(req.Header, ex.answer, k)
		}
	}
	return req, nil
}

// noResponse ends an attempt that got no response.
func (ex *exchange) noResponse(ctx context.Context, at *attemptState, err error) attemptResult {
	e := ex.classify(at, stop{stage: stageNoAnswer, ctx: ctx, err: err})
	if e.gone {
		return ex.callerLeft(e, 0)
	}
	return attemptResult{result: e.result, retryable: e.retryable, healthy: e.healthy,
		fail: &failure{outcome: e.outcome, apiErr: gatewayError(e.outcome)}}
}

// errorAnswer handles an upstream answer of 400 or more. The body is read
// (up to errorCaptureLimit) before deciding: when the attempt may be retried
// it is kept, to be relayed if no later attempt does better.
func (ex *exchange) errorAnswer(ctx context.Context, at *attemptState, resp *http.Response, mayRetry bool) attemptResult {
	st := resp.StatusCode
	s := stop{stage: stageErrorAnswer, ctx: ctx, status: st, header: resp.Header}
	if mayRetry {
		s.body, s.err = io.ReadAll(io.LimitReader(resp.Body, errorCaptureLimit+1))
		s.complete = s.err == nil && len(s.body) <= errorCaptureLimit
	}
	e := ex.classify(at, s)
	switch {
	case e.gone:
		return ex.callerLeft(e, st)
	case e.retryable:
		return attemptResult{result: e.result, status: st, retryable: true, healthy: e.healthy,
			fail: &failure{status: st, header: resp.Header, body: s.body, outcome: e.outcome, errType: e.errType}}
	}
	// Not retried: relay the answer now, the part already read first.
	ex.prepareHeaders(resp.Header)
	read := s.body
	s.stage = stageErrorCopied
	s.err, s.writeErr = ex.copyBody(at, st, io.MultiReader(bytes.NewReader(read), resp.Body), errorCaptureLimit, false)
	if !mayRetry {
		// The body was not read before: judge the upstream's health on what
		// was relayed (a quota error on the last attempt is not an outage
		// either).
		s.body = at.captured
	}
	e = ex.classify(at, s)
	ex.ended(e)
	return ex.result(e, st, true)
}

// callerLeft ends an attempt whose caller left before its answer started;
// the caller is told if the gateway cut it.
func (ex *exchange) callerLeft(e ending, status int) attemptResult {
	ex.clientGone()
	return attemptResult{result: e.result, status: status, done: true, healthy: true}
}

// since turns a moment the trace reported (nanoseconds since t_in, 0 for
// none) into a time.
func (ex *exchange) since(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return ex.rec.Timing.In.Add(time.Duration(ns))
}

// setUpstreamKey puts the upstream's own key in the header its API (d, the
// exchange's answering dialect) expects.
func setUpstreamKey(h http.Header, d llm.Dialect, key string) {
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
	if rest, ok := strings.CutPrefix(ct, "text/event-stream"); ok && (rest == "" || rest[0] == ';') {
		// What an SSE upstream sends: true below either way (parsed, or
		// by the prefix when the parameters are malformed), without
		// ParseMediaType's allocation.
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return strings.HasPrefix(strings.ToLower(strings.TrimSpace(ct)), "text/event-stream")
	}
	return mt == "text/event-stream"
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
