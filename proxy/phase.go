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
