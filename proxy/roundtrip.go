package proxy

import (
	"errors"
	"time"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/internal/shaper"
	"github.com/tollgate-llm/tollgate/llm"
)

// targets returns the upstreams a request for model goes to, in order.
// Another /v1/* path that no upstream of its guessed dialect serves goes to
// the first upstream.
func (ex *exchange) targets(model string) []target {
	rt := ex.gen.routing
	t := rt.targets(ex.routeDialect(), model)
	if len(t) == 0 && ex.rec.Dialect == llm.DialectNone {
		t = rt.fallback[llm.DialectNone]
	}
	return t
}

// routeDialect is the dialect that picks a request's upstreams: the one it
// is answered in (ex.answer), the Responses API's being OpenAI's.
func (ex *exchange) routeDialect() llm.Dialect {
	if ex.answer == llm.DialectResponses {
		return llm.DialectOpenAI // OpenAI's upstreams serve its Responses API
	}
	return ex.answer
}

// roundTrip sends the request to its route's upstreams and relays the
// answer: each upstream gets up to its retry policy's attempts, with backoff
// or the upstream's Retry-After between them; then the next upstream, while
// nothing has been sent to the caller. When the breaker of every upstream
// the request may use refuses it, it goes to the one open longest anyway
// (bypassTarget). callerKeyUp says whether the caller's key goes upstream;
// when it does not, each upstream's own key (if any) is sent instead.
func (ex *exchange) roundTrip(body []byte, callerKeyUp bool, targets []target) {
	if len(targets) == 0 {
		ex.fail(errNoUpstream(ex.rec.Dialect), llm.OutcomeBadRequest)
		return
	}
	rt := &route{targets: targets, body: body, retryOK: ex.kind.retried(ex.r.Method), callerKeyUp: callerKeyUp}
	by := ex.bypassTarget(rt)
	if by < 0 {
		for ti := range targets {
			if ex.tryUpstream(rt, ti) {
				return
			}
		}
		if !rt.sent && !rt.shed {
			// Every breaker refused it after all: one turned between
			// bypassTarget's look and its ticket.
			by = ex.bypassTarget(rt)
		}
	}
	if by >= 0 {
		rt.bypass = true
		if ex.tryUpstream(rt, by) {
			return
		}
	}
	switch {
	case rt.held != nil:
		ex.relayFailure(rt.held)
		if rt.tried != nil {
			ex.reportRetryWait(rt.tried)
		}
	case !rt.sent:
		ex.allUnavailable(rt.openFor)
	}
}

// trip is the record of a request's way through its upstreams, written only
// here: its attempts and the upstreams it passed over, and the time spent
// before the last attempt. finish folds it into the record.
type trip struct {
	llm.AttemptLog
	// retrying runs from the first attempt's start to the last one's;
	// retryWait is the time waited between attempts, queueWait in shaping
	// queues.
	retrying, retryWait, queueWait time.Duration
}

// route is one request's way through its targets.
type route struct {
	targets []target
	body    []byte
	retryOK bool
	// callerKeyUp: the caller's own key goes upstream (passthrough).
	callerKeyUp bool
	// held is the last failed attempt's failure, relayed if nothing better
	// follows.
	held       *failure
	firstStart time.Time
	// tried is the last upstream attempted and its result; skipped the last
	// one passed over and why: a fallback is counted from the former when
	// there is one.
	tried, skipped    *upstream
	triedResult, skip string
	sent              bool
	openFor           time.Duration // shortest wait until a skipped breaker half-opens
	// shed: a shaping queue refused the request (full, or timed out).
	shed bool
	// bypass: the request goes to one upstream although its breaker
	// refuses it (bypassTarget).
	bypass bool
}

// eligible reports whether target t may get the request. A caller's own
// key goes only where the route sends it first (or to upstreams that
// accept it): a key for one provider must not reach another's endpoint.
func (rt *route) eligible(t target) bool {
	return !rt.callerKeyUp || config.CallerKeyMayGo(rt.targets[0].up.origin, t.up.origin, t.up.cfg.CallerKeysOnFallback)
}

// hasNext reports whether an eligible target follows targets[ti].
func (rt *route) hasNext(ti int) bool {
	for _, t := range rt.targets[ti+1:] {
		if rt.eligible(t) {
			return true
		}
	}
	return false
}

// bypassTarget returns the target a request goes to although its breaker
// refuses it, or -1. Refusing a request that every breaker of its route
// refuses would black out the route, an only upstream included, for a
// cooldown that one caller's failing requests can start and a steady share
// of failures can renew. So when the breaker of every target the request
// may use (rt.eligible) refuses it (open, or half-open with every probe
// slot taken), it goes, as under Envoy's healthy panic threshold, to the
// target whose breaker opened longest ago (the first in route order on a
// tie), the likeliest to have recovered. The breaker then only orders
// fallbacks (an open upstream is skipped while another takes requests) and
// holds back retries: none goes to an open upstream, so a request sent in
// bypass gets one attempt unless the breaker lets probes through before it
// fails, and it falls back nowhere. The bypass is judged as a half-open
// probe (breaker.allowOrBypass), so its success starts closing the circuit.
// -1 when a target has no breaker, and for the synthetic probe, which must
// see its upstream's own state.
func (ex *exchange) bypassTarget(rt *route) int {
	if ex.kind == kindProbe {
		return -1
	}
	by := -1
	var oldest time.Time
	for i, t := range rt.targets {
		if !rt.eligible(t) {
			continue
		}
		if t.up.breaker == nil {
			return -1
		}
		at, refused := t.up.breaker.refusing()
		if !refused {
			return -1
		}
		if by < 0 || at.Before(oldest) {
			by, oldest = i, at
		}
	}
	return by
}

// tryUpstream makes the attempts on rt.targets[ti] that its retry policy,
// breaker, shaping queue and retry budget allow. done says the exchange is
// over (answered, or its caller gone); otherwise the next target follows.
func (ex *exchange) tryUpstream(rt *route, ti int) (done bool) {
	g, t := ex.g, rt.targets[ti]
	up := t.up
	if !rt.eligible(t) {
		ex.skip(up, skipKeyScope)
		return false
	}
	var waited time.Duration // between attempts on this upstream
	for n := 0; ; n++ {
		tk, ok, gone := ex.takeSlot(rt, up, rt.bypass && n == 0)
		if !ok {
			return gone
		}
		if n == 0 {
			ex.countMove(rt, up)
		}
		bypassed := tk.bypass
		if bypassed {
			g.metrics.UpstreamBreakerBypass(up.cfg.Name)
		}
		// A request sent in bypass falls back nowhere: every other target
		// refused it too.
		mayRetry := rt.retryOK && (n+1 < up.policy.maxAttempts || !rt.bypass && rt.hasNext(ti))
		start := g.now()
		ex.trip.retrying = start.Sub(rt.firstStart)
		ex.startAttemptSpan(up, bypassed, rt.body)
		res := ex.attemptWith(t, tk, rt.body, rt.callerKeyUp, mayRetry)
		rt.sent = true
		ex.attempted(res.at, start, res.status, res.result, bypassed)
		ex.endAttemptSpan(res.status, res.result)
		g.metrics.UpstreamAttempt(up.cfg.Name, res.result)
		if res.done {
			ex.reportRetryWait(up)
			return true
		}
		rt.held = res.fail
		if !res.retryable || !rt.retryOK || !ex.repeatable(res) {
			ex.relayFailure(rt.held)
			ex.reportRetryWait(up)
			return true
		}
		rt.tried, rt.triedResult = up, res.result
		wait, fits := up.policy.waitWithin(n, rt.held.header, g.now(), up.policy.maxWait-waited, jitter)
		if why := up.retryVeto(n, fits); why != "" {
			g.metrics.UpstreamRetrySkipped(up.cfg.Name, why)
			return false
		}
		g.metrics.UpstreamRetry(up.cfg.Name, res.result)
		ex.traceRetryWait(up.cfg.Name, wait, res.result)
		if !ex.sleep(wait) {
			ex.clientGone()
			return true
		}
		waited += wait
		ex.trip.retryWait += wait
	}
}

// takeSlot asks up's breaker for a ticket and its shaping queue for a slot.
// Without them up is skipped (ok false); gone says the caller left while it
// queued, which ends the exchange. bypass asks for a ticket even from a
// breaker that refuses requests (bypassTarget).
func (ex *exchange) takeSlot(rt *route, up *upstream, bypass bool) (tk ticket, ok, gone bool) {
	g, r := ex.g, ex.r
	if bypass {
		tk, ok = up.allowOrBypass(), true
	} else {
		tk, ok = up.allow()
	}
	if !ok {
		ex.skip(up, skipBreakerOpen)
		rt.skipped, rt.skip = up, skipBreakerOpen
		if d := up.retryIn(); d > 0 && (rt.openFor == 0 || d < rt.openFor) {
			rt.openFor = d
		}
		return tk, false, false
	}
	if rt.firstStart.IsZero() {
		rt.firstStart = g.now()
	}
	qw, err := up.shaper.Acquire(r.Context())
	if qw > 0 {
		ex.trip.queueWait += qw
		g.metrics.QueueWait(up.cfg.Name, qw)
	}
	if err != nil {
		tk.release()
		if r.Context().Err() != nil {
			ex.clientGone()
			return tk, false, true
		}
		why := skipQueueFull
		if errors.Is(err, shaper.ErrQueueTimeout) {
			why = skipQueueTimeout
		}
		ex.skip(up, why)
		rt.skipped, rt.skip, rt.shed = up, why, true
		return tk, false, false
	}
	return tk, true, false
}

// countMove counts a first request to up: in its retry budget (its own
// retries are charged before their wait), and as a retry taken as a
// fallback when an attempt on another upstream failed, or as a fallback
// from an upstream skipped (not for a request sent in bypass, which was
// refused everywhere and goes to one of those it was refused by).
func (ex *exchange) countMove(rt *route, up *upstream) {
	g := ex.g
	up.budget.recordRequest()
	switch {
	case rt.tried != nil:
		g.metrics.UpstreamRetry(rt.tried.cfg.Name, rt.triedResult)
		g.metrics.UpstreamFallback(rt.tried.cfg.Name, up.cfg.Name, rt.triedResult)
	case rt.skipped != nil && !rt.bypass:
		g.metrics.UpstreamFallback(rt.skipped.cfg.Name, up.cfg.Name, rt.skip)
	}
}

// attemptWith runs one attempt with breaker ticket tk and a shaping slot,
// and gives the breaker its verdict (a panic counts as a failure). A caller
// that gave up gives none: a caller that leaves a hanging upstream must not
// close its breaker (nor, closed, reset its count of failures). A stream
// reported healthy at its first token that failed later counts that
// failure too.
func (ex *exchange) attemptWith(t target, tk ticket, body []byte, callerKeyUp, mayRetry bool) (res attemptResult) {
	up := t.up
	// The ticket lives in the attempt's state: the relay may report it
	// done at the first token, after which its verdict here is a no-op.
	at := attemptState{up: up, tk: tk, callerKeyUp: callerKeyUp}
	defer up.shaper.Release()
	defer func() {
		if res.result == resultClientGone {
			at.tk.release()
		} else {
			at.tk.done(res.healthy)
			if at.tkEarly && !res.healthy && up.breaker != nil {
				up.breaker.observe(false)
			}
		}
		res.at = &at // its ticket settled
		// The exchange's last attempt, even one a panic ends: finish
		// records what it learned.
		ex.last = &at
	}()
	return ex.attempt(&at, t, body, mayRetry)
}

// reportRetryWait reports the request's retry waits, once, under the
// upstream that answered it.
func (ex *exchange) reportRetryWait(up *upstream) {
	if ex.trip.retryWait > 0 {
		ex.g.metrics.RetryWait(up.cfg.Name, ex.trip.retryWait)
	}
}

// attempted keeps the state of an attempt that ended (at) as the
// exchange's last, and lists it on the trip: started at start, the
// upstream's status, its result, whether it went in bypass of its breaker.
func (ex *exchange) attempted(at *attemptState, start time.Time, status int, result string, bypassed bool) {
	ex.last = at
	ex.trip.AddAttempt(llm.Attempt{Upstream: at.up.cfg.Name, Status: status, Result: result,
		Duration: ex.g.now().Sub(start), BreakerBypass: bypassed})
}

// skip records an upstream passed over without an attempt.
func (ex *exchange) skip(up *upstream, why string) {
	ex.trip.AddAttempt(llm.Attempt{Upstream: up.cfg.Name, Result: why})
	ex.g.metrics.UpstreamRetrySkipped(up.cfg.Name, why)
	ex.traceSkip(up.cfg.Name, why)
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
