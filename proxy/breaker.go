package proxy

import (
	"sync"
	"time"

	"github.com/tollgate-llm/tollgate/config"
)

// breakerBuckets is how many slices the failure-ratio window is cut into. The
// window slides one slice at a time, so memory is constant and an old failure
// is forgotten at most window/breakerBuckets late.
const breakerBuckets = 10

// breakerState is where a circuit breaker stands.
type breakerState uint8

const (
	breakerClosed breakerState = iota
	breakerOpen
	breakerHalfOpen
)

// String returns the state as a metric label value.
func (s breakerState) String() string {
	switch s {
	case breakerClosed:
		return "closed"
	case breakerOpen:
		return "open"
	case breakerHalfOpen:
		return "half_open"
	}
	return "unknown"
}

// breakerConfig tunes a breaker. A zero or negative field takes its default
// (see defaultBreakerConfig), so the zero value is usable.
type breakerConfig struct {
	// consecutiveFailures opens the breaker after this many failures in a row.
	consecutiveFailures int
	// failureRatio opens the breaker when failures/requests in the window
	// reaches it, once minRequests requests were seen in the window.
	failureRatio float64
	// minRequests keeps the ratio rule quiet on thin traffic.
	minRequests int
	// window is how far back the ratio rule looks.
	window time.Duration
	// cooldown is how long the breaker stays open before it lets probes through.
	cooldown time.Duration
	// halfOpenProbes caps the tickets outstanding while half-open; that many
	// successful probes close the breaker.
	halfOpenProbes int
}

// defaultBreakerConfig is the configuration of an [upstreams.breaker] table
// left to its defaults (config.DefaultUpstream, where they are chosen and
// documented): 5 failures in a row, or half of at least 20 requests over
// 10 s, open the breaker for 5 s; then 2 probes.
func defaultBreakerConfig() breakerConfig { return breakerFrom(config.DefaultUpstream().Breaker) }

// breakerFrom converts an [upstreams.breaker] table.
func breakerFrom(b config.Breaker) breakerConfig {
	return breakerConfig{
		consecutiveFailures: b.ConsecutiveFailures,
		failureRatio:        b.FailureRatio,
		minRequests:         b.MinRequests,
		window:              config.Seconds(b.WindowSeconds),
		cooldown:            config.Seconds(b.CooldownSeconds),
		halfOpenProbes:      b.HalfOpenProbes,
	}
}

// withDefaults fills the unset fields of c.
func (c breakerConfig) withDefaults() breakerConfig {
	d := defaultBreakerConfig()
	if c.consecutiveFailures <= 0 {
		c.consecutiveFailures = d.consecutiveFailures
	}
	if c.failureRatio <= 0 {
		c.failureRatio = d.failureRatio
	}
	if c.minRequests <= 0 {
		c.minRequests = d.minRequests
	}
	if c.window <= 0 {
		c.window = d.window
	}
	if c.cooldown <= 0 {
		c.cooldown = d.cooldown
	}
	if c.halfOpenProbes <= 0 {
		c.halfOpenProbes = d.halfOpenProbes
	}
	return c
}

// breakerBucket counts the outcomes of one slice of the window; num is the
// slice's absolute number (unix nanoseconds / slice width), so a slot whose
// num is stale is known to be empty without a sweep.
type breakerBucket struct {
	num      int64
	requests int
	failures int
}

// breaker is a circuit breaker for one upstream. It is safe for concurrent
// use, starts no goroutine, and moves from open to half-open lazily, when
// allow, state or retryIn is called after the cooldown.
//
// Outcomes are tied to the generation they were issued in: every state change
// starts a new generation, and a ticket from an older one is ignored, so a
// slow request that began before the breaker opened cannot close it or count
// against the next round of probes.
type breaker struct {
	cfg      breakerConfig
	width    int64 // nanoseconds per bucket
	now      func() time.Time
	onChange func(from, to breakerState)

	mu       sync.Mutex
	st       breakerState
	gen      uint64
	consec   int       // failures in a row while closed
	openedAt time.Time // when the breaker last opened
	probes   int       // half-open tickets outstanding
	passed   int       // half-open probes that succeeded
	buckets  [breakerBuckets]breakerBucket
}

// newBreaker returns a closed breaker. now is its clock (nil: time.Now).
// onChange, if not nil, is called on every transition with the breaker's
// lock held, so calls arrive in order; it must be quick and must not call
// back into the breaker.
func newBreaker(cfg breakerConfig, now func() time.Time, onChange func(from, to breakerState)) *breaker {
	cfg = cfg.withDefaults()
	if now == nil {
		now = time.Now
	}
	w := int64(cfg.window) / breakerBuckets
	if w < 1 {
		w = 1
	}
	return &breaker{cfg: cfg, width: w, now: now, onChange: onChange}
}

// ticket is the right to send one request through a breaker. Report its
// outcome with done exactly once (defer it): a half-open probe whose ticket
// is never done holds its probe slot until the breaker changes state.
// A ticket must not be copied after allow returns it; done on the copy would
// count the outcome twice.
type ticket struct {
	b     *breaker
	gen   uint64
	probe bool
	// bypass: issued by allowOrBypass although the breaker refuses requests.
	bypass bool
}

// allow asks whether a request may go to the upstream. When it may not, the
// returned ticket is inert and retryIn says how long to wait.
func (b *breaker) allow() (ticket, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.allowLocked()
}

// allowOrBypass is allow for a request that no other upstream would take:
// where allow refuses (open, or half-open with every probe slot taken) it
// issues a bypass ticket instead of none. A bypass ticket holds no probe
// slot and is judged as a probe is: its success moves an open breaker to
// half-open and counts as one of the half_open_probes successes that close
// it; its failure opens a half-open breaker again and leaves an open one as
// it is, cooldown and all.
func (b *breaker) allowOrBypass() ticket {
	b.mu.Lock()
	defer b.mu.Unlock()
	if tk, ok := b.allowLocked(); ok {
		return tk
	}
	return ticket{b: b, gen: b.gen, bypass: true}
}

// refusing reports whether allow would refuse a request now, and when the
// breaker last opened (which orders the upstreams a bypass may pick).
func (b *breaker) refusing() (openedAt time.Time, refused bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance()
	switch b.st {
	case breakerOpen:
		return b.openedAt, true
	case breakerHalfOpen:
		return b.openedAt, b.probes >= b.cfg.halfOpenProbes
	}
	return time.Time{}, false
}

// allowLocked is allow with b.mu held.
func (b *breaker) allowLocked() (ticket, bool) {
	b.advance()
	switch b.st {
	case breakerClosed:
		return ticket{b: b, gen: b.gen}, true
	case breakerHalfOpen:
		if b.probes < b.cfg.halfOpenProbes {
			b.probes++
			return ticket{b: b, gen: b.gen, probe: true}, true
		}
	}
	return ticket{}, false
}

// done records whether the request succeeded. What counts as a failure
// (5xx, 429, connection error, timeout) is the caller's decision; a request
// the client abandoned is no verdict either way and should be released
// instead. A second call, or a call on a rejected ticket, does nothing.
func (t *ticket) done(success bool) {
	b := t.b
	if b == nil {
		return
	}
	t.b = nil
	b.mu.Lock()
	defer b.mu.Unlock()
	if t.gen != b.gen {
		return
	}
	now := b.now()
	switch b.st {
	case breakerClosed:
		b.record(now, success)
	case breakerOpen:
		// Only a bypass ticket is of an open generation.
		if t.bypass && success {
			b.setState(breakerHalfOpen, now)
			b.pass(now)
		}
	case breakerHalfOpen:
		if !t.probe && !t.bypass {
			return
		}
		if t.probe {
			b.probes--
		}
		if !success {
			b.setState(breakerOpen, now)
			return
		}
		b.pass(now)
	}
}

// pass counts a half-open probe's success and closes the breaker at the
// half_open_probes-th.
func (b *breaker) pass(now time.Time) {
	b.passed++
	if b.passed >= b.cfg.halfOpenProbes {
		b.setState(breakerClosed, now)
	}
}

// release gives the ticket back without an outcome: the request it was
// taken for was never sent (the upstream's shaping queue refused it). A
// half-open probe slot is freed for another request. A second call,
// or a call after done, does nothing.
func (t *ticket) release() {
	b := t.b
	if b == nil {
		return
	}
	t.b = nil
	b.mu.Lock()
	defer b.mu.Unlock()
	if t.gen == b.gen && t.probe && b.st == breakerHalfOpen {
		b.probes--
	}
}

// observe counts the outcome of a request whose ticket is already done (a
// stream reported healthy at its first token that the upstream broke
// later). It weighs only in the closed state; a probe's verdict stands.
func (b *breaker) observe(success bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.st == breakerClosed {
		b.record(b.now(), success)
	}
}

// state returns the current state, moving from open to half-open if the
// cooldown has passed.
func (b *breaker) state() breakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance()
	return b.st
}

// retryIn returns how long until the open breaker lets probes through, for a
// Retry-After header; 0 when it is not open (including half-open with every
// probe slot taken, where no honest estimate exists).
func (b *breaker) retryIn() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance()
	if b.st != breakerOpen {
		return 0
	}
	// The clock may have moved since advance read it.
	return max(b.cfg.cooldown-b.now().Sub(b.openedAt), 0)
}

// advance moves an open breaker whose cooldown has passed to half-open. It
// reads the clock only when open, which keeps it off the closed fast path.
func (b *breaker) advance() {
	if b.st != breakerOpen {
		return
	}
	if now := b.now(); now.Sub(b.openedAt) >= b.cfg.cooldown {
		b.setState(breakerHalfOpen, now)
	}
}

// record counts a closed-state outcome and opens the breaker when either
// rule trips. Only a failure is checked against the rules: a success cannot
// make the upstream look worse.
func (b *breaker) record(now time.Time, success bool) {
	num := now.UnixNano() / b.width
	bk := &b.buckets[uint64(num)%breakerBuckets]
	if bk.num != num {
		*bk = breakerBucket{num: num}
	}
	bk.requests++
	if success {
		b.consec = 0
		return
	}
	bk.failures++
	b.consec++
	if b.consec >= b.cfg.consecutiveFailures {
		b.setState(breakerOpen, now)
		return
	}
	var reqs, fails int
	for i := range b.buckets {
		if n := b.buckets[i].num; n > num-breakerBuckets && n <= num {
			reqs += b.buckets[i].requests
			fails += b.buckets[i].failures
		}
	}
	if reqs >= b.cfg.minRequests && float64(fails) >= b.cfg.failureRatio*float64(reqs) {
		b.setState(breakerOpen, now)
	}
}

// setState moves to a new state and generation and resets the counters the
// new state starts from.
func (b *breaker) setState(to breakerState, now time.Time) {
	from := b.st
	b.st = to
	b.gen++
	b.probes, b.passed, b.consec = 0, 0, 0
	switch to {
	case breakerOpen:
		b.openedAt = now
	case breakerClosed:
		// A closed breaker judges the upstream afresh, not on the outage.
		b.buckets = [breakerBuckets]breakerBucket{}
	}
	if b.onChange != nil {
		b.onChange(from, to)
	}
}
