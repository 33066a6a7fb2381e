package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/tollgate-llm/tollgate/internal/jsonscan"
	"github.com/tollgate-llm/tollgate/internal/retryhint"
	"github.com/tollgate-llm/tollgate/internal/shaper"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/sseparse"
)

// Causes of an attempt cut by one of its phase timers (issue 4, item 5).
var (
	errHeaderTimeout     = errors.New("proxy: upstream response headers timed out")
	errFirstTokenTimeout = errors.New("proxy: upstream first token timed out")
	errIdleTimeout       = errors.New("proxy: upstream stream went idle")
	errAttemptTimeout    = errors.New("proxy: upstream attempt timed out")
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

// Phases of an attempt, each with its own timer.
const (
	phaseNone int32 = iota
	phaseHeaders
	phaseFirstToken
	phaseIdle
)

// phaseTimer cancels an attempt whose current phase outlasts its timeout,
// with the phase's error as the context's cause. One timer serves every
// phase; in the idle phase a read only moves the deadline (touchAt), and the
// timer, firing before it, re-arms itself for the rest.
type phaseTimer struct {
	t      *time.Timer
	phase  atomic.Int32
	cancel context.CancelCauseFunc
	idle   time.Duration
	// deadline (UnixNano) is when the current phase runs out: a timer that
	// fires as its phase ends (the headers came just in time) finds the
	// deadline moved or cleared and does nothing. mu makes the deadline and
	// the phase change together, so fire never pairs an old deadline with
	// the next phase.
	mu       sync.Mutex
	deadline atomic.Int64
	// now is the clock deadlines are read on (nil: time.Now); the gateway's,
	// so that the relay can pass the time it already read to touchAt.
	now func() time.Time
}

func (pt *phaseTimer) clock() time.Time {
	if pt.now != nil {
		return pt.now()
	}
	return time.Now()
}

func newPhaseTimer(cancel context.CancelCauseFunc, idle time.Duration) *phaseTimer {
	return &phaseTimer{cancel: cancel, idle: idle}
}

func (pt *phaseTimer) fire() {
	pt.mu.Lock()
	var cause error
	now := pt.clock().UnixNano()
	if d := pt.deadline.Load(); now < d {
		// touch moved the idle deadline without resetting the timer:
		// sleep again for what is left.
		if pt.t != nil && pt.phase.Load() == phaseIdle && d != math.MaxInt64 {
			pt.t.Reset(time.Duration(d - now))
		}
	} else {
		switch pt.phase.Load() {
		case phaseHeaders:
			cause = errHeaderTimeout
		case phaseFirstToken:
			cause = errFirstTokenTimeout
		case phaseIdle:
			cause = errIdleTimeout
		}
	}
	pt.mu.Unlock()
	if cause != nil {
		pt.cancel(cause)
	}
}

// enter starts phase ph with timeout d (0: no timer in this phase).
func (pt *phaseTimer) enter(ph int32, d time.Duration) {
	pt.mu.Lock()
	if d <= 0 {
		pt.deadline.Store(math.MaxInt64)
	} else {
		pt.deadline.Store(pt.clock().Add(d).UnixNano())
	}
	pt.phase.Store(ph)
	pt.mu.Unlock()
	switch {
	case d <= 0:
		if pt.t != nil {
			pt.t.Stop()
		}
	case pt.t == nil:
		pt.t = time.AfterFunc(d, pt.fire)
	default:
		pt.t.Reset(d)
	}
}

// firstToken moves a stream whose first token arrived to its idle phase.
func (pt *phaseTimer) firstToken() { pt.enter(phaseIdle, pt.idle) }

// touchAt moves the idle deadline after a read, at now, the time of the
// read (which the relay has already read from the timer's clock). It only
// stores the new deadline (no lock, no timer reset on every read): the
// timer, when it fires early, finds the deadline moved and sleeps again for
// the rest. enter and touchAt run on the relay's goroutine, so they cannot
// race each other.
func (pt *phaseTimer) touchAt(now time.Time) {
	if pt.idle > 0 && pt.phase.Load() == phaseIdle {
		pt.deadline.Store(now.Add(pt.idle).UnixNano())
	}
}

func (pt *phaseTimer) stop() {
	pt.mu.Lock()
	pt.deadline.Store(math.MaxInt64)
	pt.phase.Store(phaseNone)
	pt.mu.Unlock()
	if pt.t != nil {
		pt.t.Stop()
	}
}

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
	upReqID   string
	// usage is what a held stream reported before it failed.
	usage llm.Usage
}

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
}

// attemptTrace holds the moments the transport's goroutines report for one
// attempt, as nanoseconds since the exchange's arrival (0 = not yet); atomic
// because the HTTP/1 write loop may still run when RoundTrip returns.
type attemptTrace struct {
	sent, firstByte atomic.Int64
}

// roundTrip sends the request to its route's upstreams and relays the
// answer: each upstream gets up to its retry policy's attempts, with backoff
// or the upstream's Retry-After between them; then the next upstream, while
// nothing has been sent to the caller (issue 4). callerKeyUp says whether
// the caller's key goes upstream; when it does not, each upstream's own key
// (if any) is sent instead.
func (ex *exchange) roundTrip(body []byte, callerKeyUp bool) {
	g, r := ex.g, ex.r
	ex.callerKeyUp = callerKeyUp
	targets := ex.targets(ex.rec.Model)
	if ex.probe != nil {
		targets = ex.probe
	}
	if len(targets) == 0 {
		ex.fail(errNoUpstream(ex.rec.Dialect), llm.OutcomeBadRequest)
		return
	}
	// Other /v1/* paths are retried only when the request is idempotent or
	// a model call; a file upload retried could be stored twice.
	// A probe is one attempt: it must see its upstream's raw health.
	retryOK := ex.probe == nil && (ex.rec.Dialect != llm.DialectNone || ex.metered ||
		r.Method == http.MethodGet || r.Method == http.MethodHead)
	// A caller's own key goes only where the route sends it first (or to
	// upstreams that accept it): a key for one provider must not reach
	// another's endpoint.
	eligible := func(t target) bool {
		return !callerKeyUp || t.up.origin == targets[0].up.origin || t.up.cfg.CallerKeysOnFallback
	}
	hasNext := func(ti int) bool {
		for _, t := range targets[ti+1:] {
			if eligible(t) {
				return true
			}
		}
		return false
	}
	var (
		held       *failure
		firstStart time.Time
		// tried is the last upstream attempted and its result; skipped
		// the last one passed over and why: a fallback is counted from
		// the former when there is one.
		tried, skipped    *upstream
		triedResult, skip string
		sent              bool
		openFor           time.Duration // shortest wait until a skipped breaker half-opens
	)
	for ti, t := range targets {
		up := t.up
		if !eligible(t) {
			ex.skip(up, skipKeyScope)
			continue
		}
		var waited time.Duration // between attempts on this upstream
		for n := 0; ; n++ {
			tk, ok := up.allow()
			if !ok {
				ex.skip(up, skipBreakerOpen)
				skipped, skip = up, skipBreakerOpen
				if d := up.retryIn(); d > 0 && (openFor == 0 || d < openFor) {
					openFor = d
				}
				break
			}
			if firstStart.IsZero() {
				firstStart = g.now()
			}
			qw, err := up.shaper.Acquire(r.Context())
			if qw > 0 {
				ex.rec.QueueWait += qw
				g.metrics.QueueWait(up.cfg.Name, qw)
			}
			if err != nil {
				tk.release()
				if r.Context().Err() != nil {
					ex.clientGone()
					return
				}
				why := skipQueueFull
				if errors.Is(err, shaper.ErrQueueTimeout) {
					why = skipQueueTimeout
				}
				ex.skip(up, why)
				skipped, skip = up, why
				break
			}
			if n == 0 {
				// A fallback is a first request to this upstream; its own
				// retries are charged below, before their wait.
				up.budget.recordRequest()
			}
			if n == 0 && tried != nil {
				// The request moves on after a failed attempt: a retry,
				// taken as a fallback.
				g.metrics.UpstreamRetry(tried.cfg.Name, triedResult)
				g.metrics.UpstreamFallback(tried.cfg.Name, up.cfg.Name, triedResult)
			} else if n == 0 && skipped != nil {
				g.metrics.UpstreamFallback(skipped.cfg.Name, up.cfg.Name, skip)
			}
			mayRetry := retryOK && (n+1 < up.policy.maxAttempts || hasNext(ti))
			start := g.now()
			ex.rec.Retrying = start.Sub(firstStart)
			res := func() (res attemptResult) {
				ex.tk, ex.tkEarly = &tk, false
				defer up.shaper.Release()
				defer func() { // a panic counts as a failure
					early := ex.tkEarly
					ex.tk = nil
					if res.result == resultClientGone {
						// No verdict on the upstream: a caller that gives up
						// on a hanging upstream must not close its breaker
						// (nor, closed, reset its count of failures).
						tk.release()
						return
					}
					tk.done(res.healthy)
					if early && !res.healthy && up.breaker != nil {
						// The stream was reported healthy at its first
						// token and failed later.
						up.breaker.observe(false)
					}
				}()
				return ex.attempt(t, body, callerKeyUp, mayRetry)
			}()
			sent = true
			ex.rec.AddAttempt(llm.Attempt{Upstream: up.cfg.Name, Status: res.status, Result: res.result,
				Duration: g.now().Sub(start)})
			g.metrics.UpstreamAttempt(up.cfg.Name, res.result)
			if res.done {
				ex.reportRetryWait(up)
				return
			}
			held = res.fail
			if !res.retryable || !retryOK || !ex.repeatable(res) {
				ex.relayFailure(held)
				ex.reportRetryWait(up)
				return
			}
			tried, triedResult = up, res.result
			wait, ok := up.policy.waitWithin(n, held.header, g.now(), up.policy.maxWait-waited, jitter)
			// Decided before the wait: a retry that will not be taken
			// must not make the caller wait for it.
			why := ""
			switch {
			case !ok && n+1 >= up.policy.maxAttempts:
				why = skipAttempts
			case !ok:
				why = skipWaitTooLong
			case up.breaker != nil && up.breaker.state() == breakerOpen:
				why = skipBreakerOpen
			case !up.budget.tryRetry():
				why = skipBudget
			}
			if why != "" {
				g.metrics.UpstreamRetrySkipped(up.cfg.Name, why)
				break
			}
			g.metrics.UpstreamRetry(up.cfg.Name, res.result)
			if !ex.sleep(wait) {
				ex.clientGone()
				return
			}
			waited += wait
			ex.rec.RetryWait += wait
		}
	}
	switch {
	case held != nil:
		ex.relayFailure(held)
		if tried != nil {
			ex.reportRetryWait(tried)
		}
	case !sent:
		ex.allUnavailable(openFor)
	}
}

// repeatable reports whether a failed attempt may be sent again. The dialect
// routes and GET/HEAD always may. Other model calls may create things
// (fine-tuning jobs, images, stored responses), so they are sent again only
// when the upstream surely did not act on them: connection refused, 429,
// 503 or 529.
func (ex *exchange) repeatable(res attemptResult) bool {
	if ex.rec.Dialect != llm.DialectNone || ex.r.Method == http.MethodGet || ex.r.Method == http.MethodHead {
		return true
	}
	switch res.result {
	case resultConnectError, resultRateLimited, resultOverloaded:
		return true
	}
	return res.status == http.StatusServiceUnavailable
}

// reportRetryWait reports the request's retry waits, once, under the
// upstream that answered it.
func (ex *exchange) reportRetryWait(up *upstream) {
	if ex.rec.RetryWait > 0 {
		ex.g.metrics.RetryWait(up.cfg.Name, ex.rec.RetryWait)
	}
}

// skip records an upstream passed over without an attempt.
func (ex *exchange) skip(up *upstream, why string) {
	ex.rec.AddAttempt(llm.Attempt{Upstream: up.cfg.Name, Result: why})
	ex.g.metrics.UpstreamRetrySkipped(up.cfg.Name, why)
}

// sleep waits d on a timer against the caller's context; false when the
// caller left first.
func (ex *exchange) sleep(d time.Duration) bool {
	if d <= 0 {
		return ex.r.Context().Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ex.r.Context().Done():
		return false
	}
}

// allUnavailable answers a request whose every upstream was skipped (open
// breaker, full or timed-out queue, a caller's key that may not go there):
// 503 with Retry-After, the shortest wait until one of the skipped breakers
// lets probes through (at least 1 s).
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

// attempt sends the request to one upstream. mayRetry says whether another
// attempt could follow: then a stream's opening events are held back until
// its first token, so that an error or a stall before it can still be
// retried (issue 4, item 1); otherwise every event goes out at once.
func (ex *exchange) attempt(t target, body []byte, callerKeyUp, mayRetry bool) attemptResult {
	g, r, up := ex.g, ex.r, t.up
	ex.up = up
	ex.rec.Upstream = up.cfg.Name
	body = ex.bodyFor(t, body)

	// The attempt lives in the caller's context: a caller that hangs up
	// cancels it (DESIGN 1). No http.Client.Timeout: it would cap streams.
	ctx, cancelTotal := context.WithTimeoutCause(r.Context(), up.timeout, errAttemptTimeout)
	defer cancelTotal()
	ctx, cancelCause := context.WithCancelCause(ctx)
	defer cancelCause(nil)
	cancel := func() { cancelCause(nil) }
	pt := newPhaseTimer(cancelCause, up.idle)
	pt.now = g.now
	defer pt.stop()

	in := ex.rec.Timing.In
	tr := &attemptTrace{}
	trace := &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) {
			tr.sent.CompareAndSwap(0, int64(max(g.now().Sub(in), 1)))
		},
		GotFirstResponseByte: func() {
			tr.firstByte.CompareAndSwap(0, int64(max(g.now().Sub(in), 1)))
		},
	}
	// The HTTP/1 write loop reports the request written from its own
	// goroutine once it has flushed it, and RoundTrip returns as soon as the
	// answer's headers are in, which can be before that report: read it
	// when the attempt ends, or the exchange loses its overhead and upstream
	// TTFT. finish, which uses them, runs after the attempts.
	defer func() { ex.rec.Timing.UpSent = ex.since(tr.sent.Load()) }()
	// The path goes upstream as the caller encoded it: decoding it would
	// turn an escaped "?" or "/" into a different request than the one the
	// router and the governance saw.
	tgt := up.cfg.URL(r.URL.EscapedPath())
	if r.URL.RawQuery != "" {
		tgt += "?" + r.URL.RawQuery
	}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), r.Method, tgt, bytes.NewReader(body))
	if err != nil {
		g.log.Error("building upstream request", "request_id", ex.rec.RequestID, "upstream", up.cfg.Name, "err", err)
		ex.fail(errUpstreamFailed(), llm.OutcomeUpstreamError)
		return attemptResult{result: resultConnectionError, done: true, healthy: true}
	}
	if len(body) == 0 && r.ContentLength == 0 {
		req.Body, req.GetBody, req.ContentLength = http.NoBody, nil, 0
	}
	req.Header = upstreamRequestHeaders(r.Header)
	req.Header.Set(requestIDHeader, ex.rec.RequestID)
	if ex.probe != nil {
		req.Header.Set(ProbeHeader, "1")
	}
	if !callerKeyUp {
		req.Header.Del("Authorization")
		req.Header.Del("X-Api-Key")
		if g.gov.keysMode {
			// With the gateway's upstream key, the caller must not pick the
			// organisation or project that is billed.
			req.Header.Del("Openai-Organization")
			req.Header.Del("Openai-Project")
		}
		if k := up.cfg.APIKey.Reveal(); k != "" {
			setUpstreamKey(req.Header, ex.rec.Dialect, r, k)
		}
	}

	if ex.info.Stream {
		// A non-streamed answer's headers come with its whole body.
		pt.enter(phaseHeaders, up.headerTimeout)
	}
	resp, err := up.transport.RoundTrip(req)
	ex.rec.Timing.UpFirstByte = ex.since(tr.firstByte.Load())
	if err != nil {
		return ex.noResponse(ctx, err)
	}
	defer resp.Body.Close()
	ex.rec.UpstreamRequestID = upstreamRequestID(resp.Header)

	switch {
	case resp.StatusCode >= 400:
		pt.enter(phaseNone, 0)
		return ex.errorStatus(ctx, resp, mayRetry)
	case isEventStream(resp.Header.Get("Content-Type")) && ex.rec.Dialect != llm.DialectNone:
		if ex.rec.Stream {
			pt.enter(phaseFirstToken, up.firstToken)
		} else {
			pt.enter(phaseNone, 0) // a stream nobody asked for: only the total timeout
		}
		ex.rec.Stream = true
		ex.rec.Status = resp.StatusCode
		return ex.relay(ctx, cancel, resp, mayRetry, pt)
	default:
		pt.enter(phaseNone, 0)
		ex.rec.Status = resp.StatusCode
		ex.prepareHeaders(resp.Header)
		if isEventStream(resp.Header.Get("Content-Type")) {
			ex.sseHeaders()
			ex.copyBody(ctx, resp.Body, 0, true)
		} else {
			ex.rec.Stream = false // answered in one piece, whatever was asked
			limit := 0
			if ex.rec.Dialect != llm.DialectNone || ex.metered {
				limit = g.cfg.Server.MaxEventBytes
			}
			ex.copyBody(ctx, resp.Body, limit, resp.ContentLength < 0 && ex.rec.Dialect == llm.DialectNone)
			if ex.rec.Outcome == llm.OutcomeOK && (ex.rec.Dialect != llm.DialectNone || ex.metered) {
				if len(ex.captured) >= limit {
					g.log.Warn("answer larger than max_event_bytes: usage not read", "request_id", ex.rec.RequestID,
						"upstream", up.cfg.Name, "limit_bytes", limit)
				}
				ex.usageFromBody()
				if resp.StatusCode == http.StatusOK && ex.rec.Dialect != llm.DialectNone &&
					len(ex.captured) < limit && !json.Valid(ex.captured) {
					// A whole 200 on a dialect route that is not JSON (cut
					// by a proxy, an HTML page): the caller's SDK cannot
					// parse it, so it is no success, and is not billed.
					ex.rec.Outcome = llm.OutcomeUpstreamError
					ex.rec.Interruption = llm.InterruptProtocolError
					ex.rec.ErrorType = "invalid_json"
					g.log.Warn("upstream answer is not JSON", "request_id", ex.rec.RequestID,
						"upstream", up.cfg.Name, "bytes", len(ex.captured))
				}
			}
		}
		return ex.committed(resp.StatusCode)
	}
}

// committed is the result of an attempt whose answer went to the caller.
func (ex *exchange) committed(status int) attemptResult {
	res := attemptResult{status: status, done: true, result: resultOK, healthy: true}
	switch ex.rec.Outcome {
	case llm.OutcomeUpstreamTimeout:
		res.result, res.healthy = resultTimeout, false
		switch {
		case ex.rec.Interruption == llm.InterruptIdleTimeout:
			res.result = resultIdleTimeout
		case ex.firstTokenCut:
			res.result = resultFirstTokenTimeout
		}
	case llm.OutcomeUpstreamError:
		res.result, res.healthy = resultStreamBroken, false
		if ex.rec.Interruption == llm.InterruptUpstreamErrorEvent {
			res.result, res.healthy = resultErrorEvent, ex.errorEventHealthy(ex.rec.ErrorType)
		}
	case llm.OutcomeClientCancel, llm.OutcomeShutdown:
		res.result = resultClientGone
	}
	return res
}

// noResponse classifies an attempt that got no response.
func (ex *exchange) noResponse(ctx context.Context, err error) attemptResult {
	if ex.r.Context().Err() != nil {
		ex.clientGone()
		return attemptResult{result: resultClientGone, done: true, healthy: true}
	}
	result := resultConnectionError
	f := &failure{outcome: llm.OutcomeUpstreamError, apiErr: errUpstreamFailed()}
	var ne net.Error
	var oe *net.OpError
	cause := context.Cause(ctx)
	switch {
	case errors.Is(cause, errHeaderTimeout):
		result, f.outcome, f.apiErr = resultHeaderTimeout, llm.OutcomeUpstreamTimeout, errUpstreamTimeout()
	case errors.As(err, &oe) && oe.Op == "dial": // refused, or connect_timeout_seconds
		result, f.outcome, f.apiErr = resultConnectError, llm.OutcomeUpstreamUnreachable, errUpstreamUnreachable()
	case errors.Is(cause, errAttemptTimeout) || errors.As(err, &ne) && ne.Timeout():
		result, f.outcome, f.apiErr = resultTimeout, llm.OutcomeUpstreamTimeout, errUpstreamTimeout()
	}
	ex.g.log.Warn("upstream attempt failed", "request_id", ex.rec.RequestID, "upstream", ex.up.cfg.Name,
		"result", result, "err", err)
	return attemptResult{result: result, retryable: true, fail: f}
}

// errorStatus handles an upstream answer of 400 or more. The body is read
// (up to errorCaptureLimit) before deciding: when the attempt may be retried
// it is kept, to be relayed if no later attempt does better.
func (ex *exchange) errorStatus(ctx context.Context, resp *http.Response, mayRetry bool) attemptResult {
	st := resp.StatusCode
	res := attemptResult{status: st, result: statusResult(st)}
	var captured []byte
	complete := false
	if mayRetry {
		b, err := io.ReadAll(io.LimitReader(resp.Body, errorCaptureLimit+1))
		captured, complete = b, err == nil && len(b) <= errorCaptureLimit
		if err != nil && ex.r.Context().Err() != nil {
			ex.clientGone()
			res.done, res.result, res.healthy = true, resultClientGone, true
			return res
		}
	}
	errType, errCode := errorFields(captured)
	// Quota, billing, key and request errors are about the account or the
	// request, not the upstream's health: they do not open its breaker.
	res.healthy = ex.answerHealthy(st, errType, errCode)
	if complete && shouldRetry(ex.up.policy, st, resp.Header, errType, errCode) {
		res.retryable = true
		res.fail = &failure{status: st, header: resp.Header, body: captured,
			outcome: llm.OutcomeUpstreamError, errType: sseparse.ErrorTypeFromBody(captured),
			upReqID: ex.rec.UpstreamRequestID}
		return res
	}
	// Not retried: relay the answer now, the part already read first.
	ex.rec.Status = st
	ex.prepareHeaders(resp.Header)
	ex.rec.Outcome = llm.OutcomeUpstreamError
	ex.copyBody(ctx, io.MultiReader(bytes.NewReader(captured), resp.Body), errorCaptureLimit, false)
	ex.rec.ErrorType = sseparse.ErrorTypeFromBody(ex.captured)
	if !mayRetry {
		// The body was not read before: judge the upstream's health on
		// what was relayed (a quota error on the last attempt is not an
		// outage either).
		typ, code := errorFields(ex.captured)
		res.healthy = ex.answerHealthy(st, typ, code)
	}
	res.done = true
	return res
}

// answerHealthy judges an upstream error answer for the breaker: 408, 429
// and 5xx are the upstream's trouble; quota, billing, key and request errors
// are about the account or the request; and when the caller's own key went
// upstream (passthrough) a 429 is the caller's account's limit, which must
// not open the circuit for every other caller. The same holds for a probe
// sent with the upstream's own key in passthrough mode when every caller must
// bring a key: no caller's request uses that key, so its limit is nobody's
// health. (In mode keys, or when keyless callers use the upstream's key, or
// when there is no key at all, the probe's 429 is what callers meet.)
func (ex *exchange) answerHealthy(st int, errType, errCode string) bool {
	switch {
	case neverRetryable(errType) || neverRetryable(errCode):
		return true
	case st == http.StatusTooManyRequests:
		return ex.callerKeyUp || ex.probeOwnKey()
	}
	return st < 500 && st != http.StatusRequestTimeout
}

// probeOwnKey reports whether this is a probe whose key no caller's request
// carries: passthrough with require_key, and an upstream key of its own.
func (ex *exchange) probeOwnKey() bool {
	return ex.probe != nil && !ex.g.gov.keysMode && ex.g.cfg.Auth.RequireKey &&
		ex.up != nil && ex.up.cfg.APIKey != ""
}

// errorEventHealthy judges an error event the same way, by its type.
func (ex *exchange) errorEventHealthy(errType string) bool {
	st := errorEventStatus([]byte(errType))
	if st == 0 {
		return neverRetryable(errType) // an unknown type is taken for an outage
	}
	return ex.answerHealthy(st, errType, "")
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

// shouldRetry decides on an upstream error answer: the upstream's
// x-should-retry (sent by OpenAI and Anthropic, and honoured by their SDKs)
// wins when it says false, and may add a status the policy leaves out when
// it says true; errors no retry can fix are never retried (wire.md 1.7, 2.7).
func shouldRetry(p retryPolicy, status int, h http.Header, errType, errCode string) bool {
	if neverRetryable(errType) || neverRetryable(errCode) {
		return false
	}
	if retry, said := retryhint.ShouldRetry(h); said {
		return retry
	}
	return retryableStatus(p, status, errType, errCode)
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
func errorEventStatus(errType []byte) int {
	switch string(errType) {
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
	}
	if n, err := strconv.Atoi(string(errType)); err == nil && n >= 400 && n <= 599 {
		return n // vLLM's numeric code
	}
	return 0
}

// prepareHeaders copies the upstream's response headers for the caller,
// with the caller's own rate-limit headers in place of the upstream
// account's.
func (ex *exchange) prepareHeaders(upH http.Header) {
	g := ex.g
	h := ex.w.Header()
	copyResponseHeaders(h, upH)
	if g.gov.keysMode || len(ex.rlStates) > 0 {
		// The upstream's rate-limit headers describe the gateway's upstream
		// account, not the caller: a governed caller sees only its own
		// limits, never a mix of both.
		deleteUpstreamAccountHeaders(h, g.gov.keysMode)
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

// relayFailure sends the caller the failure of the last attempt when no
// other attempt follows: the upstream's error answer as it came, the opening
// of a stream the upstream broke (ended by an error event in the caller's
// dialect), or the gateway's own error.
func (ex *exchange) relayFailure(f *failure) {
	rec := &ex.rec
	if f.header == nil {
		ex.fail(f.apiErr, f.outcome)
		return
	}
	rec.UpstreamRequestID = f.upReqID
	rec.Status = f.status
	rec.Outcome, rec.Interruption = f.outcome, f.interrupt
	if f.usage.HasInput || f.usage.HasOutput {
		rec.Usage = f.usage
	}
	if f.errType != "" {
		rec.ErrorType = f.errType
	}
	ex.prepareHeaders(f.header)
	if f.stream {
		ex.sseHeaders()
	}
	ex.headersSent = true
	ex.w.WriteHeader(f.status)
	err := ex.write(f.body)
	if err == nil && f.stream && f.interrupt != llm.InterruptUpstreamErrorEvent && ex.g.cfg.Server.StreamErrorEvents {
		err = ex.write(streamErrorEvent(rec.Dialect, rec.Interruption))
	}
	if err == nil {
		_ = http.NewResponseController(ex.w).Flush()
	}
	rec.Timing.End = ex.g.now()
}

// streamErrorEvent is the error event that ends a stream the upstream broke
// after bytes were sent (issue 4, item 6), in the caller's dialect: OpenAI
// SDKs raise on a data payload with a top-level "error" object, Anthropic
// SDKs on `event: error` (wire.md 1.5, 2.5).
func streamErrorEvent(d llm.Dialect, why llm.Interruption) []byte {
	timeout := why == llm.InterruptIdleTimeout || why == llm.InterruptTimeout
	switch {
	case d == llm.DialectAnthropic && timeout:
		return anthropicTimeoutEvent
	case d == llm.DialectAnthropic:
		return anthropicBrokenEvent
	case timeout:
		return openAITimeoutEvent
	}
	return openAIBrokenEvent
}

var (
	openAIBrokenEvent    = []byte(`data: {"error":{"message":"the upstream stream ended before it was complete; the answer is cut","type":"server_error","param":null,"code":"upstream_stream_broken"}}` + "\n\n")
	openAITimeoutEvent   = []byte(`data: {"error":{"message":"the upstream stream timed out before it was complete; the answer is cut","type":"server_error","param":null,"code":"upstream_timeout"}}` + "\n\n")
	anthropicBrokenEvent = []byte("event: error\n" +
		`data: {"type":"error","error":{"type":"api_error","message":"the upstream stream ended before it was complete; the answer is cut"}}` + "\n\n")
	anthropicTimeoutEvent = []byte("event: error\n" +
		`data: {"type":"error","error":{"type":"timeout_error","message":"the upstream stream timed out before it was complete; the answer is cut"}}` + "\n\n")
)

// bodyFor returns the body sent to target t: the model renamed when its
// route says so, and (OpenAI streams) usage asked for when the upstream
// allows it and the caller did not. ex.info.suppressUsage follows.
func (ex *exchange) bodyFor(t target, body []byte) []byte {
	if t.model != "" {
		if nb, ok := setModel(body, t.model); ok {
			body = nb
		}
	}
	ex.info.suppressUsage = false
	if ex.rec.Dialect == llm.DialectOpenAI && ex.info.Stream && t.up.cfg.IncludeUsage && !ex.info.IncludeUsage {
		if nb, ok := addIncludeUsage(body); ok {
			body = nb
			ex.info.suppressUsage = true
		}
	}
	return body
}

// setModel returns body with every top-level "model" member's value
// replaced by the JSON string of name, every other byte as the caller sent
// it.
func setModel(body []byte, name string) ([]byte, bool) {
	obj, ok := jsonscan.Value(body)
	if !ok || jsonscan.KindOf(obj) != jsonscan.KindObject {
		return body, false
	}
	if !utf8.ValidString(name) { // json.Marshal would turn it into U+FFFD
		return body, false
	}
	q, err := json.Marshal(name) // JSON's escapes, not Go's (\x00, \a, \U…)
	if err != nil {
		return body, false
	}
	out := make([]byte, 0, len(body)+len(q))
	prev := 0
	it := jsonscan.Object(obj)
	for it.Next() {
		if it.KeyIs("model") {
			v := it.Value()
			at := cap(body) - cap(v)
			out = append(out, body[prev:at]...)
			out = append(out, q...)
			prev = at + len(v)
		}
	}
	if it.Err() != nil || prev == 0 {
		return body, false
	}
	return append(out, body[prev:]...), true
}
