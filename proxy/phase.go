package proxy

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Causes of an attempt cut by one of its phase timers.
var (
	errHeaderTimeout     = errors.New("proxy: upstream response headers timed out")
	errFirstTokenTimeout = errors.New("proxy: upstream first token timed out")
	errIdleTimeout       = errors.New("proxy: upstream stream went idle")
	errAttemptTimeout    = errors.New("proxy: upstream attempt timed out")
)

// Phases of an attempt, each with its own timer.
const (
	phaseNone int32 = iota
	phaseHeaders
	phaseFirstToken
	phaseIdle
)

// phaseTimer cancels an attempt whose current phase outlasts its timeout,
// with the phase's error as the context's cause, or the attempt as a whole
// outlasts the upstream's total timeout (errAttemptTimeout), or a stream
// whose end is out waits too long for its upstream's end of body (no
// cause). One timer serves all of them, armed for whichever comes first.
// In the idle phase a read only moves the deadline (touchAt), and the
// timer, firing before it, re-arms itself for the rest.
//
// Every instant is kept as nanoseconds since base, the timer's start read
// on its clock: with time.Now that difference is monotonic, so a step of
// the wall clock neither cuts a healthy attempt nor holds one past its
// timeout. math.MaxInt64 is "never", and a timeout too long to represent
// saturates to it.
type phaseTimer struct {
	t      *time.Timer
	phase  atomic.Int32
	cancel context.CancelCauseFunc
	idle   time.Duration
	base   time.Time
	// deadline is when the current phase runs out: a timer that fires as
	// its phase ends (the headers came just in time) finds the deadline
	// moved or cleared and sleeps again until the next instant, or stops.
	// end is when the attempt runs out, grace when a stream whose end is
	// already out stops waiting for its upstream's end of body (graceAt).
	// mu makes the instants, the phase and the timer change together, so
	// fire never pairs an old deadline with the next phase, and finds t set.
	mu         sync.Mutex
	deadline   atomic.Int64
	end, grace int64
	// now is the clock instants are read on (nil: time.Now); the gateway's,
	// so that the relay can pass the time it already read to touchAt.
	now func() time.Time
}

func (pt *phaseTimer) clock() time.Time {
	if pt.now != nil {
		return pt.now()
	}
	return time.Now()
}

// newPhaseTimer starts the timer of an attempt that may last total (0: no
// limit but its phases'), on the clock now (nil: time.Now). It stands in
// for a context deadline, whose context, child and timer would cost the
// attempt another few allocations.
func newPhaseTimer(cancel context.CancelCauseFunc, idle, total time.Duration, now func() time.Time) *phaseTimer {
	pt := &phaseTimer{}
	pt.init(cancel, idle, total, now)
	return pt
}

// init readies a phase timer held by value, as newPhaseTimer does.
func (pt *phaseTimer) init(cancel context.CancelCauseFunc, idle, total time.Duration, now func() time.Time) {
	pt.cancel, pt.idle, pt.now = cancel, idle, now
	pt.base = pt.clock()
	pt.deadline.Store(math.MaxInt64)
	pt.mu.Lock()
	pt.end, pt.grace = later(0, total), math.MaxInt64
	pt.arm(0)
	pt.mu.Unlock()
}

// since is t as nanoseconds since the timer's base.
func (pt *phaseTimer) since(t time.Time) int64 { return int64(t.Sub(pt.base)) }

// later is d after at, or math.MaxInt64 (never) when that is past what an
// int64 holds or d is not positive.
func later(at int64, d time.Duration) int64 {
	if d <= 0 || at > math.MaxInt64-int64(d) {
		return math.MaxInt64
	}
	return at + int64(d)
}

// arm sets the timer for the earliest of the phase's deadline, the
// attempt's end and the grace, from now; it stops it when none is set.
// mu is held.
func (pt *phaseTimer) arm(now int64) {
	switch wake := min(pt.deadline.Load(), pt.end, pt.grace); {
	case wake == math.MaxInt64:
		if pt.t != nil {
			pt.t.Stop()
		}
	case pt.t == nil:
		pt.t = time.AfterFunc(time.Duration(wake-now), pt.fire)
	default:
		pt.t.Reset(time.Duration(wake - now))
	}
}

func (pt *phaseTimer) fire() {
	pt.mu.Lock()
	var cause error
	now := pt.since(pt.clock())
	switch {
	case now >= pt.grace:
		cause = context.Canceled // the answer is out: no timeout to report
	case now >= pt.end:
		cause = errAttemptTimeout
	case now >= pt.deadline.Load():
		switch pt.phase.Load() {
		case phaseHeaders:
			cause = errHeaderTimeout
		case phaseFirstToken:
			cause = errFirstTokenTimeout
		case phaseIdle:
			cause = errIdleTimeout
		default: // no phase to cut
			pt.deadline.Store(math.MaxInt64)
		}
	}
	if cause == nil {
		// touch moved the idle deadline without resetting the timer, the
		// phase changed as the timer fired, or there was no phase to cut:
		// sleep again for what is left (arm stops it when nothing is).
		pt.arm(now)
	}
	pt.mu.Unlock()
	if cause != nil {
		pt.cancel(cause)
	}
}

// enter starts phase ph with timeout d (0: no timer in this phase).
func (pt *phaseTimer) enter(ph int32, d time.Duration) {
	pt.mu.Lock()
	now := pt.since(pt.clock())
	pt.deadline.Store(later(now, d))
	pt.phase.Store(ph)
	pt.arm(now)
	pt.mu.Unlock()
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
		pt.deadline.Store(later(pt.since(now), pt.idle))
	}
}

// graceAt ends the attempt d after now (the time its terminal event went
// out) unless it ends first, on the timer that serves its phases, so that a
// stream's end costs no timer of its own.
func (pt *phaseTimer) graceAt(now time.Time, d time.Duration) {
	pt.mu.Lock()
	at := pt.since(now)
	pt.grace = later(at, d)
	pt.arm(at)
	pt.mu.Unlock()
}

// abort ends the attempt's context with no timer's cause: the caller left,
// and the upstream need not finish.
func (pt *phaseTimer) abort() { pt.cancel(nil) }

// stop clears every instant and stops the timer; the attempt is over.
func (pt *phaseTimer) stop() {
	pt.mu.Lock()
	pt.deadline.Store(math.MaxInt64)
	pt.end, pt.grace = math.MaxInt64, math.MaxInt64
	pt.phase.Store(phaseNone)
	if pt.t != nil {
		pt.t.Stop()
	}
	pt.mu.Unlock()
}
