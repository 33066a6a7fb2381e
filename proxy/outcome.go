package proxy

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/tollgate-llm/tollgate/internal/jsonscan"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/sseparse"
)

// Attempt results: the "result" label of tollgate_upstream_attempts_total
// and the reason of a retry or fallback.
const (
	resultOK                = "ok"
	resultClientError       = "client_error"
	resultRateLimited       = "rate_limited"
	resultOverloaded        = "overloaded"
	resultServerError       = "server_error"
	resultConnectError      = "connect_error"
	resultConnectionError   = "connection_error"
	resultHeaderTimeout     = "header_timeout"
	resultFirstTokenTimeout = "first_token_timeout"
	resultIdleTimeout       = "idle_timeout"
	resultTimeout           = "timeout"
	resultErrorEvent        = "error_event"
	resultStreamBroken      = "stream_broken"
	resultClientGone        = "client_gone"
	// Not sent at all.
	skipBreakerOpen  = "breaker_open"
	skipQueueFull    = "queue_full"
	skipQueueTimeout = "queue_timeout"
	skipBudget       = "budget"
	skipKeyScope     = "key_scope"
	skipWaitTooLong  = "wait_too_long"
	skipAttempts     = "attempts"
)

// stage is where in an attempt its end was seen.
type stage uint8

const (
	stageNoRequest   stage = iota // the upstream request could not be built
	stageNoAnswer                 // the upstream sent no response
	stageErrorAnswer              // an answer of 400 or more, read before deciding on a retry
	stageErrorCopied              // such an answer, relayed to the caller
	stageHeld                     // a stream that failed before anything reached the caller
	stageStream                   // a stream relayed to the caller
	stageBody                     // any other answer, copied to the caller
)

// stop is what an attempt saw when it ended, as the path that noticed the
// end observed it.
type stop struct {
	stage stage
	// ctx is the attempt's context: its cause names the timer that cut it.
	ctx context.Context
	// err is the upstream's: RoundTrip's error, or the body's read error
	// (nil at a clean end); writeErr is the caller's.
	err, writeErr error
	status        int
	header        http.Header // the error answer's
	// body is the error answer the upstream's health is judged by.
	body []byte
	// errType is an error event's type.
	errType string
	// errorEvent: the stream carried an error event; tooLarge: an event
	// outgrew max_event_bytes; notJSON: a whole 200 on a dialect route is
	// not JSON; failed: a whole Responses API 200 whose status is "failed"
	// (errType its code); terminalOut: the terminal marker reached the
	// caller; complete: the error answer was read whole.
	errorEvent, tooLarge, notJSON, failed, terminalOut, complete bool
	// conflict: the answer names a stored object another team owns; it
	// was withheld from the caller.
	conflict bool
}

// ending is how an attempt ended, decided in one place (classify): what the
// record says, what the retry loop and the breaker are told.
type ending struct {
	outcome   llm.Outcome
	interrupt llm.Interruption
	result    string
	errType   string
	// healthy is the breaker's verdict; retryable says another attempt may
	// do better (only for an attempt that sent the caller nothing).
	healthy, retryable bool
	// gone: the caller left, or the gateway cut the exchange.
	gone bool
}

// cut names the timer that ended an attempt.
type cut uint8

const (
	cutNone cut = iota
	cutHeaders
	cutFirstToken
	cutIdle
	cutAttempt
)

// cutOf reads which timer ended the attempt whose context is ctx. A cause
// of its own (context.Canceled) is no timer; any other is the attempt's
// deadline.
func cutOf(ctx context.Context) cut {
	if ctx == nil {
		return cutNone
	}
	switch cause := context.Cause(ctx); {
	case cause == nil || errors.Is(cause, context.Canceled):
		return cutNone
	case errors.Is(cause, errHeaderTimeout):
		return cutHeaders
	case errors.Is(cause, errFirstTokenTimeout):
		return cutFirstToken
	case errors.Is(cause, errIdleTimeout):
		return cutIdle
	}
	return cutAttempt
}

// classify decides how an attempt that reached the upstream ended. Every
// path that sees such an attempt end calls it. The rest is decided where it
// happens: the retry loop names an upstream it skipped, and respond.go
// records the outcome of the gateway's own answers (its errors, a caller
// gone before any answer).
func (ex *exchange) classify(at *attemptState, s stop) ending {
	gone := s.writeErr != nil || ex.r.Context().Err() != nil
	c := cutOf(s.ctx)
	var e ending
	switch s.stage {
	case stageNoRequest:
		return ending{outcome: llm.OutcomeUpstreamError, result: resultConnectionError, healthy: true}
	case stageNoAnswer:
		e = ex.noAnswerEnding(at, s, gone, c)
	case stageErrorAnswer, stageErrorCopied:
		e = ex.errorAnswerEnding(at, s, gone, c)
	case stageHeld:
		e = ex.heldEnding(at, s, gone, c)
	case stageStream:
		e = ex.streamEnding(at, s, gone, c)
	case stageBody:
		e = ex.bodyEnding(at, s, gone, c)
	}
	return e
}

// goneEnding is the end of an attempt whose caller left (or whose exchange
// the gateway cut): no verdict on the upstream.
func (ex *exchange) goneEnding() ending {
	o, _ := ex.cancelledBy()
	return ending{outcome: o, result: resultClientGone, healthy: true, gone: true}
}

func (ex *exchange) noAnswerEnding(at *attemptState, s stop, gone bool, c cut) ending {
	if gone {
		return ex.goneEnding()
	}
	e := ending{outcome: llm.OutcomeUpstreamError, result: resultConnectionError, retryable: true}
	var ne net.Error
	var oe *net.OpError
	switch {
	case c == cutHeaders:
		e.outcome, e.result = llm.OutcomeUpstreamTimeout, resultHeaderTimeout
	case errors.As(s.err, &oe) && oe.Op == "dial": // refused, or connect_timeout_seconds
		e.outcome, e.result = llm.OutcomeUpstreamUnreachable, resultConnectError
	case c == cutAttempt || errors.As(s.err, &ne) && ne.Timeout():
		e.outcome, e.result = llm.OutcomeUpstreamTimeout, resultTimeout
	}
	ex.g.log.Warn("upstream attempt failed", "request_id", ex.rec.RequestID, "upstream", at.up.cfg.Name,
		"result", e.result, "err", s.err)
	return e
}

// errorAnswerEnding judges an answer of 400 or more. Read before a retry is
// decided, it may be retried; relayed, its outcome is how the copy ended.
// Quota, billing, key and request errors are about the account or the
// request, not the upstream's health: they do not open its breaker.
func (ex *exchange) errorAnswerEnding(at *attemptState, s stop, gone bool, c cut) ending {
	if s.stage == stageErrorAnswer && s.err != nil && gone {
		return ex.goneEnding()
	}
	typ, code := errorFields(s.body)
	e := ending{outcome: llm.OutcomeUpstreamError, result: statusResult(s.status),
		healthy: ex.answerHealthy(at, s.status, typ, code)}
	if s.stage == stageErrorAnswer {
		e.retryable = s.complete && shouldRetry(at.up.policy, s.status, s.header, typ, code)
		e.errType = sseparse.ErrorTypeFromBody(s.body)
		return e
	}
	switch {
	case gone:
		e.outcome, _ = ex.cancelledBy()
	case c == cutAttempt:
		e.outcome = llm.OutcomeUpstreamTimeout
	case s.err != nil:
		ex.g.log.Warn("upstream body broke", "request_id", ex.rec.RequestID, "upstream", at.up.cfg.Name, "err", s.err)
	}
	e.errType = sseparse.ErrorTypeFromBody(at.captured)
	return e
}

// heldEnding judges a stream that failed before anything reached the
// caller. An error event is retried by the rules of the status the same
// error has outside a stream; any other failure is worth another attempt.
func (ex *exchange) heldEnding(at *attemptState, s stop, gone bool, c cut) ending {
	e := ending{outcome: llm.OutcomeUpstreamError, result: resultStreamBroken, retryable: true}
	switch {
	case s.conflict:
		return conflictEnding()
	case s.errorEvent:
		e.interrupt, e.result, e.errType = llm.InterruptUpstreamErrorEvent, resultErrorEvent, s.errType
		status := errorEventStatus(s.errType)
		e.retryable = status != 0 && retryableStatus(at.up.policy, status, e.errType, "")
		e.healthy = ex.errorEventHealthy(at, e.errType)
	case s.tooLarge:
		e.interrupt, e.errType = llm.InterruptProtocolError, "event_too_large"
	case gone:
		return ex.goneEnding()
	case c == cutFirstToken:
		e.outcome, e.interrupt, e.result = llm.OutcomeUpstreamTimeout, llm.InterruptTimeout, resultFirstTokenTimeout
	case c == cutAttempt:
		e.outcome, e.interrupt, e.result = llm.OutcomeUpstreamTimeout, llm.InterruptTimeout, resultTimeout
	default:
		e.interrupt = llm.InterruptUpstreamEOF
	}
	return e
}

// streamEnding judges a relayed stream. A caller that has the whole answer,
// up to its terminal marker, got it whatever happened after (a caller that
// hangs up at [DONE] as the SDKs do, an upstream that holds the body open).
// The SDKs hang up as soon as they read an error event, so a caller gone
// after one does not make the end the caller's doing. A body that ends
// without its terminal marker is a truncated stream, never a success.
func (ex *exchange) streamEnding(at *attemptState, s stop, gone bool, c cut) ending {
	e := ending{outcome: llm.OutcomeUpstreamError, result: resultStreamBroken, gone: gone, errType: s.errType}
	switch {
	case s.conflict:
		return conflictEnding()
	case s.errorEvent: // e.g. vLLM: an error event, then [DONE]
		e.interrupt, e.result = llm.InterruptUpstreamErrorEvent, resultErrorEvent
		e.healthy = ex.errorEventHealthy(at, e.errType)
	case s.terminalOut:
		e.outcome, e.result, e.healthy = llm.OutcomeOK, resultOK, true
	case gone:
		e.outcome, e.interrupt = ex.cancelledBy()
		e.result, e.healthy = resultClientGone, true
	case s.tooLarge:
		ex.g.log.Warn("upstream event too large; stream cut", "request_id", ex.rec.RequestID,
			"upstream", at.up.cfg.Name, "limit_bytes", ex.gen.cfg.Server.MaxEventBytes)
		e.interrupt = llm.InterruptProtocolError
		if e.errType == "" {
			e.errType = "event_too_large"
		}
	case c == cutIdle:
		e.outcome, e.interrupt, e.result = llm.OutcomeUpstreamTimeout, llm.InterruptIdleTimeout, resultIdleTimeout
	case c != cutNone: // the attempt's total or first-token timeout
		e.outcome, e.interrupt, e.result = llm.OutcomeUpstreamTimeout, llm.InterruptTimeout, resultTimeout
		if c == cutFirstToken {
			e.result = resultFirstTokenTimeout
		}
	default:
		e.interrupt = llm.InterruptUpstreamEOF
		if s.err != nil {
			ex.g.log.Warn("upstream stream broke", "request_id", ex.rec.RequestID,
				"upstream", at.up.cfg.Name, "err", s.err)
		}
	}
	return e
}

// bodyEnding judges an answer copied whole: a non-streamed answer, or any
// answer on a forwarded path. A whole 200 on a dialect route that is not
// JSON (cut by a proxy, an HTML page) is no success: the caller's SDK
// cannot parse it; nor is a Responses API answer whose status is failed.
func (ex *exchange) bodyEnding(at *attemptState, s stop, gone bool, c cut) ending {
	e := ending{outcome: llm.OutcomeUpstreamError, result: resultStreamBroken}
	switch {
	case s.conflict:
		return conflictEnding()
	case gone:
		e.outcome, _ = ex.cancelledBy()
		e.result, e.healthy, e.gone = resultClientGone, true, true
	case c == cutAttempt:
		e.outcome, e.result = llm.OutcomeUpstreamTimeout, resultTimeout
	case s.err != nil:
		ex.g.log.Warn("upstream body broke", "request_id", ex.rec.RequestID, "upstream", at.up.cfg.Name, "err", s.err)
	case s.notJSON:
		e.interrupt, e.errType = llm.InterruptProtocolError, "invalid_json"
		ex.g.log.Warn("upstream answer is not JSON", "request_id", ex.rec.RequestID,
			"upstream", at.up.cfg.Name, "bytes", len(at.captured))
	case s.failed:
		// The answer's own error, as a stream's response.failed would
		// carry it: judged by its code like an error event.
		e.result, e.errType = resultErrorEvent, s.errType
		e.healthy = ex.errorEventHealthy(at, e.errType)
	default:
		e.outcome, e.result, e.healthy = llm.OutcomeOK, resultOK, true
	}
	return e
}

// conflictEnding is the end of an answer withheld because it names a stored
// object another team owns: a protocol fault of the upstream, not retried
// (another attempt would make, and bill, another object) and no verdict on
// its health (one such answer says nothing of the next).
func conflictEnding() ending {
	return ending{outcome: llm.OutcomeUpstreamError, interrupt: llm.InterruptProtocolError,
		result: resultStreamBroken, errType: "stored_id_conflict", healthy: true}
}

// result is the attempt's result for the retry loop and the breaker.
func (ex *exchange) result(e ending, status int, done bool) attemptResult {
	return attemptResult{result: e.result, status: status, done: done, retryable: e.retryable, healthy: e.healthy}
}

// ErrShutdown is the cause a server gives the requests' base context when it
// cancels open exchanges at the end of its drain timeout, so they are
// recorded as cut by the gateway, not by their callers.
var ErrShutdown = errors.New("proxy: gateway shutting down")

// cancelledBy tells who ended an exchange whose caller's context is done or
// whose caller could not be written to.
func (ex *exchange) cancelledBy() (llm.Outcome, llm.Interruption) {
	if c := context.Cause(ex.r.Context()); errors.Is(c, ErrShutdown) || errors.Is(c, errSocketsClosed) {
		return llm.OutcomeShutdown, llm.InterruptShutdown
	}
	return llm.OutcomeClientCancel, llm.InterruptClientCancel
}

// answerHealthy judges an upstream error answer for the breaker: 408, 429
// and 5xx are the upstream's trouble; quota, billing, key and request errors
// are about the account or the request. When the caller's own key went
// upstream (passthrough) a 429 is that caller's account's limit, which must
// not open the circuit for every other caller; likewise a probe's 429 on a
// key no caller's request carries. at is the attempt that got the answer.
func (ex *exchange) answerHealthy(at *attemptState, st int, errType, errCode string) bool {
	switch {
	case neverRetryable(errType) || neverRetryable(errCode):
		return true
	case st == http.StatusTooManyRequests:
		return at.callerKeyUp || ex.probeOwnKey(at.up)
	}
	return st < 500 && st != http.StatusRequestTimeout
}

// probeOwnKey reports whether this is a probe whose key no caller's request
// carries: passthrough with require_key, and an upstream key of its own.
func (ex *exchange) probeOwnKey(up *upstream) bool {
	return ex.kind == kindProbe && !ex.gen.gov.keysMode && ex.gen.cfg.Auth.RequireKey &&
		up != nil && up.cfg.APIKey != ""
}

// errorEventHealthy judges an error event the same way, by its type.
func (ex *exchange) errorEventHealthy(at *attemptState, errType string) bool {
	st := errorEventStatus(errType)
	if st == 0 {
		return neverRetryable(errType) // an unknown type is taken for an outage
	}
	return ex.answerHealthy(at, st, errType, "")
}

// statusResult names an upstream error status.
func statusResult(st int) string {
	switch {
	case st == http.StatusTooManyRequests:
		return resultRateLimited
	case st == 529:
		return resultOverloaded
	case st == http.StatusRequestTimeout || st == http.StatusGatewayTimeout:
		return resultTimeout
	case st >= 500:
		return resultServerError
	}
	return resultClientError
}

// errorFields reads error.type and error.code (a string, JSON escapes
// decoded, or a number) from an error body in either dialect.
func errorFields(body []byte) (typ, code string) {
	obj, ok := jsonscan.Value(body)
	if !ok {
		return "", ""
	}
	e, ok := jsonscan.Get(obj, "error")
	if !ok || jsonscan.KindOf(e) != jsonscan.KindObject {
		return "", ""
	}
	str := func(key string) string {
		v, ok := jsonscan.Get(e, key)
		if !ok {
			return ""
		}
		if s, ok := jsonscan.String(v); ok {
			return string(jsonscan.AppendUnescape(nil, s))
		}
		if jsonscan.KindOf(v) == jsonscan.KindNumber {
			return string(v)
		}
		return ""
	}
	return str("type"), str("code")
}

// errorEventStatus maps the error type of a stream's error event to the
// status the same error has outside a stream, so a first-event error is
// retried by the same rules as an error answer; 0 when unknown (not
// retried).
func errorEventStatus(errType string) int {
	switch errType {
	case "overloaded_error":
		return 529
	case "api_error", "server_error", "internal_server_error", "InternalServerError":
		return http.StatusInternalServerError
	case "rate_limit_error", "rate_limit_exceeded":
		return http.StatusTooManyRequests
	case "timeout_error":
		return http.StatusGatewayTimeout
	case "not_found_error":
		return http.StatusNotFound
	case "request_too_large":
		return http.StatusRequestEntityTooLarge
	case "service_unavailable", "ServiceUnavailableError":
		return http.StatusServiceUnavailable
	case "vector_store_timeout": // a hosted tool's timeout (Responses API)
		return http.StatusGatewayTimeout
	case "context_length_exceeded", "bio_policy", "data_residency_mismatch", "model_not_found":
		// The Responses API's client and policy codes: the request's
		// trouble, not the upstream's.
		return http.StatusBadRequest
	}
	if strings.HasPrefix(errType, "invalid_") || strings.Contains(errType, "image") {
		return http.StatusBadRequest // invalid_prompt, invalid_image, image_too_large, ...
	}
	if n, err := strconv.Atoi(errType); err == nil && n >= 400 && n <= 599 {
		return n // vLLM's numeric code
	}
	return 0
}
