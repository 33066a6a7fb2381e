package proxy

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"
)

// TestPhaseTimerTouchMovesIdleDeadline: a read during the idle phase moves the
// deadline, and a timer that fires before it sleeps again instead of
// cutting the stream; once the deadline has passed, it cuts it with the idle
// cause. fire is called by hand, so no timing decides the result.
func TestPhaseTimerTouchMovesIdleDeadline(t *testing.T) {
	var causes []error
	pt := testPhaseTimer(t, func(c error) { causes = append(causes, c) }, time.Hour)
	pt.t = time.AfterFunc(time.Hour, func() {}) // a timer fire may re-arm; never runs here
	defer pt.t.Stop()
	pt.phase.Store(phaseIdle)
	pt.deadline.Store(0) // the idle phase ran out...
	pt.touch()           // ...but a read just came
	pt.fire()
	if len(causes) != 0 {
		t.Fatalf("fire after a read cut the stream with %v", causes)
	}
	pt.deadline.Store(0)
	pt.fire()
	if len(causes) != 1 || !errors.Is(causes[0], errIdleTimeout) {
		t.Fatalf("fire past the deadline: causes %v, want the idle timeout", causes)
	}
}

// testPhaseTimer is the phase timer of an attempt whose cancel is cancel,
// with the idle timeout idle, stopped when the test ends.
func testPhaseTimer(t *testing.T, cancel context.CancelCauseFunc, idle time.Duration) *phaseTimer {
	pt := newPhaseTimer(cancel, idle, 0, nil)
	t.Cleanup(pt.stop)
	return pt
}

// checkCause fails t unless ctx ended with cause want, or is still live
// when want is nil.
func checkCause(t *testing.T, ctx context.Context, want error) {
	t.Helper()
	got := context.Cause(ctx)
	if ctx.Err() == nil {
		got = nil
	}
	if !errors.Is(got, want) || (got == nil) != (want == nil) {
		t.Errorf("cause %v, want %v", got, want)
	}
}

// touch is touchAt now, on the timer's clock.
func (pt *phaseTimer) touch() { pt.touchAt(pt.clock()) }

// phaseTimerCause waits (bounded) for ctx to end and returns its cause.
func phaseTimerCause(t *testing.T, ctx context.Context) error {
	t.Helper()
	await(t, ctx.Done(), "the phase timer to fire")
	return context.Cause(ctx)
}

// The phase timer fires with the cause of the phase it is in, on a real
// timer with tiny durations; only the cause is checked.
func TestPhaseTimerFiresWithPhaseCause(t *testing.T) {
	tests := []struct {
		name  string
		start func(pt *phaseTimer)
		want  error
	}{
		{"headers", func(pt *phaseTimer) { pt.enter(phaseHeaders, time.Millisecond) }, errHeaderTimeout},
		{"first token", func(pt *phaseTimer) { pt.enter(phaseFirstToken, time.Millisecond) }, errFirstTokenTimeout},
		{"idle after the first token", func(pt *phaseTimer) { pt.firstToken() }, errIdleTimeout},
		{"timer reused by the next phase", func(pt *phaseTimer) {
			pt.enter(phaseHeaders, time.Hour)
			pt.enter(phaseFirstToken, time.Millisecond)
		}, errFirstTokenTimeout},
		{"timer stopped by a phase without timeout, then reused", func(pt *phaseTimer) {
			pt.enter(phaseHeaders, time.Hour)
			pt.enter(phaseNone, 0)
			pt.enter(phaseIdle, time.Millisecond)
		}, errIdleTimeout},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			pt := testPhaseTimer(t, cancel, time.Millisecond)
			tc.start(pt)
			if got := phaseTimerCause(t, ctx); !errors.Is(got, tc.want) {
				t.Errorf("cause %v, want %v", got, tc.want)
			}
		})
	}
}

// A fire whose phase has moved on (or whose timer was stopped) does
// nothing; touch moves the idle deadline, and only in the idle phase. The
// timer's callback is called by hand with the deadline set as if its time
// had come, so nothing depends on the scheduler.
func TestPhaseTimerStaleAndTouch(t *testing.T) {
	expired := func(pt *phaseTimer) { pt.deadline.Store(0) }
	tests := []struct {
		name string
		idle time.Duration
		run  func(pt *phaseTimer)
		want error // nil: not cancelled
	}{
		{"expired headers phase fires", time.Hour, func(pt *phaseTimer) {
			pt.enter(phaseHeaders, time.Hour)
			expired(pt)
			pt.fire()
		}, errHeaderTimeout},
		{"headers timer firing after the first-token phase began", time.Hour, func(pt *phaseTimer) {
			pt.enter(phaseHeaders, time.Hour)
			pt.enter(phaseFirstToken, time.Hour)
			pt.fire()
		}, nil},
		{"first-token timer firing after the first token", time.Hour, func(pt *phaseTimer) {
			pt.enter(phaseFirstToken, time.Hour)
			pt.firstToken()
			pt.fire()
		}, nil},
		{"phase without timeout", time.Hour, func(pt *phaseTimer) {
			pt.enter(phaseHeaders, time.Hour)
			pt.enter(phaseNone, 0)
			pt.fire()
		}, nil},
		{"phase with timeout 0", time.Hour, func(pt *phaseTimer) {
			pt.enter(phaseFirstToken, 0)
			pt.fire()
		}, nil},
		{"stopped", time.Hour, func(pt *phaseTimer) {
			pt.enter(phaseFirstToken, time.Hour)
			pt.stop()
			pt.fire()
		}, nil},
		{"stopped with an expired deadline", time.Hour, func(pt *phaseTimer) {
			pt.enter(phaseFirstToken, time.Hour)
			pt.stop()
			expired(pt)
			pt.fire()
		}, nil},
		{"expired idle phase fires", time.Hour, func(pt *phaseTimer) {
			pt.firstToken()
			expired(pt)
			pt.fire()
		}, errIdleTimeout},
		{"touch extends the idle phase", time.Hour, func(pt *phaseTimer) {
			pt.firstToken()
			expired(pt)
			pt.touch()
			pt.fire()
		}, nil},
		{"touch does not extend the first-token phase", time.Hour, func(pt *phaseTimer) {
			pt.enter(phaseFirstToken, time.Hour)
			expired(pt)
			pt.touch()
			pt.fire()
		}, errFirstTokenTimeout},
		{"touch does not extend the headers phase", time.Hour, func(pt *phaseTimer) {
			pt.enter(phaseHeaders, time.Hour)
			expired(pt)
			pt.touch()
			pt.fire()
		}, errHeaderTimeout},
		{"idle timeout off: no timer after the first token", 0, func(pt *phaseTimer) {
			pt.enter(phaseFirstToken, time.Hour)
			pt.firstToken()
			pt.touch()
			pt.fire()
		}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			pt := testPhaseTimer(t, cancel, tc.idle)
			tc.run(pt)
			checkCause(t, ctx, tc.want)
		})
	}
}

// Touching the idle phase on a real timer keeps it from firing at its
// first deadline: the timer is re-armed for a full idle period from the
// touch, so a touch made long before the deadline cannot end the stream
// early. Only the cause is checked once the stream is left alone.
func TestPhaseTimerTouchRearms(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	pt := testPhaseTimer(t, cancel, 5*time.Millisecond)
	pt.firstToken()
	for range 3 {
		pt.touch()
	}
	if got := phaseTimerCause(t, ctx); !errors.Is(got, errIdleTimeout) {
		t.Errorf("cause %v, want %v", got, errIdleTimeout)
	}
}

// The attempt's total timeout ends it in whichever phase it is in, and the
// earlier of the phase's deadline and the attempt's end decides the cause;
// the grace after a stream's terminal event ends it with no timer's cause.
// The clock is the test's and fire is called by hand, so nothing depends
// on the scheduler; stop clears the end with the phases.
func TestPhaseTimerTotalEndsTheAttempt(t *testing.T) {
	const total = time.Minute
	tests := []struct {
		name    string
		run     func(pt *phaseTimer)
		advance time.Duration
		want    error // nil: not cancelled
	}{
		{"before any phase", func(pt *phaseTimer) {}, total, errAttemptTimeout},
		{"not yet", func(pt *phaseTimer) {}, total - time.Nanosecond, nil},
		{"headers phase longer than the attempt", func(pt *phaseTimer) { pt.enter(phaseHeaders, time.Hour) }, total, errAttemptTimeout},
		{"headers phase shorter than the attempt", func(pt *phaseTimer) { pt.enter(phaseHeaders, time.Second) }, time.Second, errHeaderTimeout},
		{"first-token phase", func(pt *phaseTimer) { pt.enter(phaseFirstToken, time.Hour) }, total, errAttemptTimeout},
		{"idle phase touched past the end", func(pt *phaseTimer) {
			pt.firstToken()
			pt.touch()
		}, total, errAttemptTimeout},
		{"body of a non-streamed answer", func(pt *phaseTimer) { pt.enter(phaseNone, 0) }, total, errAttemptTimeout},
		{"stopped", func(pt *phaseTimer) { pt.stop() }, total, nil},
		{"grace after the terminal event", func(pt *phaseTimer) {
			pt.firstToken()
			pt.graceAt(pt.clock(), time.Second)
		}, time.Second, context.Canceled},
		{"grace longer than the attempt", func(pt *phaseTimer) {
			pt.firstToken()
			pt.graceAt(pt.clock(), 2*total)
		}, total, errAttemptTimeout},
		{"grace not yet over", func(pt *phaseTimer) {
			pt.firstToken()
			pt.graceAt(pt.clock(), time.Second)
		}, time.Second - time.Nanosecond, nil},
		{"grace stopped", func(pt *phaseTimer) {
			pt.graceAt(pt.clock(), time.Second)
			pt.stop()
		}, time.Second, nil},
		{"phase timeout too long to hold", func(pt *phaseTimer) {
			pt.enter(phaseFirstToken, time.Duration(math.MaxInt64))
		}, total, errAttemptTimeout},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			now := time.Unix(1_700_000_000, 0)
			pt := newPhaseTimer(cancel, time.Hour, total, func() time.Time { return now })
			t.Cleanup(pt.stop)
			tc.run(pt)
			now = now.Add(tc.advance)
			pt.fire()
			checkCause(t, ctx, tc.want)
		})
	}
}

// A timer that wakes for a deadline that passed with no phase to cut sleeps
// again for what else is set, here the grace, instead of dropping it.
func TestPhaseTimerPassedDeadlineKeepsTheGrace(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	pt := testPhaseTimer(t, cancel, 0)
	pt.deadline.Store(0) // passed, in no phase: the timer wakes at once
	pt.graceAt(pt.clock(), 5*time.Millisecond)
	if got := phaseTimerCause(t, ctx); !errors.Is(got, context.Canceled) {
		t.Errorf("cause %v, want the grace's (none)", got)
	}
}

// A total or idle timeout too long to hold in nanoseconds means never: it
// does not wrap around and take the place of a phase's shorter timeout.
func TestPhaseTimerLongTimeoutsSaturate(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	now := time.Unix(1_700_000_000, 0)
	long := time.Duration(math.MaxInt64)
	pt := newPhaseTimer(cancel, long, long, func() time.Time { return now })
	t.Cleanup(pt.stop)
	pt.firstToken()
	now = now.Add(100 * 365 * 24 * time.Hour)
	pt.touch()
	pt.fire()
	checkCause(t, ctx, nil)
	pt.enter(phaseFirstToken, time.Second)
	now = now.Add(time.Second)
	pt.fire()
	checkCause(t, ctx, errFirstTokenTimeout)
}

// On a real timer the total timeout fires even while reads keep moving the
// idle deadline past it: the timer is armed for the attempt's end, not
// only for the phase's.
func TestPhaseTimerTotalOutlastsTouches(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	pt := newPhaseTimer(cancel, time.Hour, 5*time.Millisecond, nil)
	t.Cleanup(pt.stop)
	pt.enter(phaseHeaders, time.Hour)
	pt.firstToken()
	pt.touch()
	if got := phaseTimerCause(t, ctx); !errors.Is(got, errAttemptTimeout) {
		t.Errorf("cause %v, want %v", got, errAttemptTimeout)
	}
}
