// Package shaper smooths the attempts a gateway sends to one upstream (issue
// 4): an optional cap on attempts open at once and an optional request rate,
// with a bounded, time-limited wait queue in front of both. A burst waits its
// turn here instead of provoking 429s upstream, and a burst too large for the
// queue is refused at once so that the caller can fall back or answer 503.
//
// The shaper starts no goroutines. Waits are timers selected against the
// caller's context, so a caller that hangs up leaves the queue at once and
// holds nothing.
package shaper

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

var (
	// ErrQueueFull is returned by Acquire, without waiting, when the request
	// would have to wait and the queue already holds queueSize waiters.
	ErrQueueFull = errors.New("shaper: queue full")
	// ErrQueueTimeout is returned by Acquire when the request waited
	// queueTimeout, or when its rate turn is further away than the queue
	// time it has left (it fails at once rather than sleep and then fail).
	ErrQueueTimeout = errors.New("shaper: queue timeout")
)

// Shaper shapes the attempts sent to one upstream. A nil *Shaper shapes
// nothing: Acquire returns at once and Release does nothing. It is safe for
// concurrent use.
type Shaper struct {
	// slots is a counting semaphore, nil without a concurrency cap. A
	// sender blocked on a full buffered channel is handed the buffer place
	// of the next receive, in arrival order, so a released slot goes to the
	// longest waiter and a newcomer cannot barge past the queue.
	slots chan struct{}
	// limiter spaces attempts 1/perSecond apart (burst 1); nil without a
	// rate.
	limiter      *rate.Limiter
	queueSize    int64
	queueTimeout time.Duration

	inflight atomic.Int64
	waiting  atomic.Int64

	// OnWaiting, if set (before the first Acquire), is called with the
	// number of waiting requests each time a request joins or leaves the
	// queue (for a gauge); only requests that wait pay for it.
	OnWaiting func(waiting int)
	waitMu    sync.Mutex

	// now is the clock given to the limiter and used to measure waits.
	// Tests replace it to place rate turns at synthetic instants.
	now func() time.Time
}

// New returns a Shaper that allows at most maxConcurrent attempts at once
// (none when <= 0) and at most perSecond attempts a second, evenly spaced
// (no rate when <= 0 or +Inf). At most queueSize requests (<= 0: none) wait
// for a slot or a turn, each for at most queueTimeout (<= 0: a request that
// would have to wait fails at once). New returns nil when there is neither a
// cap nor a rate; a nil *Shaper is ready to use.
func New(maxConcurrent int, perSecond float64, queueSize int, queueTimeout time.Duration) *Shaper {
	hasRate := perSecond > 0 && !math.IsInf(perSecond, 1)
	if maxConcurrent <= 0 && !hasRate {
		return nil
	}
	s := &Shaper{
		queueSize:    int64(max(queueSize, 0)),
		queueTimeout: queueTimeout,
		now:          time.Now,
	}
	if maxConcurrent > 0 {
		s.slots = make(chan struct{}, maxConcurrent)
	}
	if hasRate {
		// Burst 1 spaces attempts evenly instead of letting an idle period
		// build up credit that a burst would then spend all at once.
		s.limiter = rate.NewLimiter(rate.Limit(perSecond), 1)
	}
	return s
}

// Acquire waits for a concurrency slot and then for the request's turn
// under the rate, at most queueTimeout in all, and returns how long it
// waited (0 when it did not). After a nil error the caller must call Release
// once the attempt ends (a stream holds its slot until it ends).
//
// Acquire fails with ErrQueueFull, without waiting, when the request would
// have to wait and queueSize requests already wait; with ErrQueueTimeout
// when the wait would exceed queueTimeout; and with context.Cause(ctx) when
// ctx ends first. On error nothing is held and no rate turn is used.
func (s *Shaper) Acquire(ctx context.Context) (waited time.Duration, err error) {
	if s == nil {
		return 0, nil
	}
	// Fast path: a free slot and a turn due now. It neither allocates nor
	// touches the queue.
	if s.slots != nil {
		select {
		case s.slots <- struct{}{}:
		default:
			return s.wait(ctx, false)
		}
	}
	// AllowN takes the turn only when it is due now; otherwise it leaves the
	// limiter untouched, so a request refused below has used nothing.
	if s.limiter != nil && !s.limiter.AllowN(s.now(), 1) {
		return s.wait(ctx, true)
	}
	s.inflight.Add(1)
	return 0, nil
}

// wait is Acquire's slow path: the request joins the queue, waits for a slot
// unless haveSlot, then reserves its rate turn and waits for it.
func (s *Shaper) wait(ctx context.Context, haveSlot bool) (time.Duration, error) {
	start := s.now()
	if !s.enqueue() {
		if haveSlot {
			s.releaseSlot()
		}
		return 0, ErrQueueFull
	}
	defer func() {
		s.waiting.Add(-1)
		s.reportWaiting()
	}()
	s.reportWaiting()
	if s.queueTimeout <= 0 {
		if haveSlot {
			s.releaseSlot()
		}
		return 0, ErrQueueTimeout
	}

	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	if !haveSlot {
		timer = time.NewTimer(s.queueTimeout)
		select {
		case s.slots <- struct{}{}:
		case <-ctx.Done():
			return s.now().Sub(start), context.Cause(ctx)
		case <-timer.C:
			return s.now().Sub(start), ErrQueueTimeout
		}
	}

	if s.limiter != nil {
		// The turn is reserved only now that the slot is held: reserved
		// earlier, it could come due while the request still waits for a
		// slot, and the time would be lost to every other request.
		now := s.now()
		r := s.limiter.ReserveN(now, 1)
		if delay := r.DelayFrom(now); delay > 0 {
			if delay > s.queueTimeout-now.Sub(start) {
				r.CancelAt(now)
				s.releaseSlot()
				return now.Sub(start), ErrQueueTimeout
			}
			if timer == nil {
				timer = time.NewTimer(delay)
			} else {
				// Since Go 1.23 Reset discards a stale tick, so the
				// timer needs no draining.
				timer.Reset(delay)
			}
			select {
			case <-timer.C:
			case <-ctx.Done():
				// Giving the turn back lets the next request have it,
				// as far as later reservations allow (rate.CancelAt).
				now := s.now()
				r.CancelAt(now)
				s.releaseSlot()
				return now.Sub(start), context.Cause(ctx)
			}
		}
	}
	s.inflight.Add(1)
	return s.now().Sub(start), nil
}

// reportWaiting calls OnWaiting with the queue's length, read under a lock
// so that two requests leaving together cannot report out of order (the
// last report is always the current length).
func (s *Shaper) reportWaiting() {
	if s.OnWaiting == nil {
		return
	}
	s.waitMu.Lock()
	defer s.waitMu.Unlock()
	s.OnWaiting(int(s.waiting.Load()))
}

// enqueue counts the request as waiting, or reports false when queueSize
// requests already wait.
func (s *Shaper) enqueue() bool {
	for {
		n := s.waiting.Load()
		if n >= s.queueSize {
			return false
		}
		if s.waiting.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Release ends an attempt begun by a successful Acquire and hands its
// concurrency slot to the longest waiter. Calling it more often than
// Acquire succeeded is a bug and panics, like unlocking an unlocked mutex.
func (s *Shaper) Release() {
	if s == nil {
		return
	}
	if s.inflight.Add(-1) < 0 {
		panic("shaper: Release without Acquire")
	}
	s.releaseSlot()
}

func (s *Shaper) releaseSlot() {
	if s.slots == nil {
		return
	}
	select {
	case <-s.slots:
	default:
		panic("shaper: Release without Acquire")
	}
}

// InFlight returns the number of attempts between a successful Acquire and
// their Release; 0 for a nil Shaper.
func (s *Shaper) InFlight() int {
	if s == nil {
		return 0
	}
	return int(s.inflight.Load())
}

// Waiting returns the number of requests waiting for a slot or for their
// rate turn; 0 for a nil Shaper.
func (s *Shaper) Waiting() int {
	if s == nil {
		return 0
	}
	return int(s.waiting.Load())
}
