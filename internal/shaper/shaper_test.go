package shaper

import (
	"context"
	"errors"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeClock is a clock that moves only when the test says so.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// newShaper is New with the fake clock wired in.
func newShaper(t *testing.T, maxConcurrent int, perSecond float64, queueSize int, queueTimeout time.Duration) (*Shaper, *fakeClock) {
	t.Helper()
	s := New(maxConcurrent, perSecond, queueSize, queueTimeout)
	if s == nil {
		t.Fatal("New returned nil for a shaping configuration")
	}
	c := newFakeClock()
	s.now = c.Now
	return s, c
}

// waitFor polls cond until it holds. The bound only keeps a broken test from
// hanging; nothing is asserted about how long the wait takes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		runtime.Gosched()
		time.Sleep(100 * time.Microsecond)
	}
}

// checkIdle asserts that nothing is held or waiting.
func checkIdle(t *testing.T, s *Shaper) {
	t.Helper()
	if n := s.InFlight(); n != 0 {
		t.Errorf("InFlight = %d, want 0", n)
	}
	if n := s.Waiting(); n != 0 {
		t.Errorf("Waiting = %d, want 0", n)
	}
	if len(s.slots) != 0 {
		t.Errorf("%d slots still taken", len(s.slots))
	}
}

// guard returns a context that ends a call expected to fail at once, so that
// a shaper that makes it wait fails the test instead of hanging it.
func guard(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func mustAcquire(t *testing.T, s *Shaper) time.Duration {
	t.Helper()
	waited, err := s.Acquire(context.Background())
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	return waited
}

func TestNewWithoutShapingIsNil(t *testing.T) {
	for _, tc := range []struct {
		name          string
		maxConcurrent int
		perSecond     float64
		want          bool
	}{
		{"zero", 0, 0, false},
		{"negative", -1, -5, false},
		{"infinite rate", 0, math.Inf(1), false},
		{"NaN rate", 0, math.NaN(), false},
		{"cap only", 1, 0, true},
		{"rate only", 0, 0.5, true},
		{"both", 2, 10, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := New(tc.maxConcurrent, tc.perSecond, 4, time.Second)
			if got := s != nil; got != tc.want {
				t.Errorf("New(%d, %v) != nil is %v, want %v", tc.maxConcurrent, tc.perSecond, got, tc.want)
			}
		})
	}
}

func TestNilShaper(t *testing.T) {
	var s *Shaper
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 3 {
		waited, err := s.Acquire(ctx)
		if err != nil || waited != 0 {
			t.Fatalf("nil Acquire = %v, %v; want 0, nil", waited, err)
		}
	}
	s.Release()
	if s.InFlight() != 0 || s.Waiting() != 0 {
		t.Errorf("nil shaper reports %d in flight, %d waiting", s.InFlight(), s.Waiting())
	}
}

func TestCapIsNeverExceeded(t *testing.T) {
	const (
		capacity = 3
		workers  = 24
		rounds   = 20
	)
	s, _ := newShaper(t, capacity, 0, workers, time.Minute)
	var cur, peak, tickets, held atomic.Int64
	gate := make(chan struct{})
	enter := func() {
		n := cur.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers*rounds)
	for range workers {
		wg.Go(func() {
			for range rounds {
				if _, err := s.Acquire(context.Background()); err != nil {
					errs <- err
					return
				}
				enter()
				if tickets.Add(1) <= capacity {
					// The first holders keep their slots until all the
					// others queue up, so the cap is reached for certain.
					held.Add(1)
					<-gate
				}
				runtime.Gosched()
				cur.Add(-1)
				s.Release()
			}
		})
	}
	waitFor(t, "the cap to fill and the rest to queue", func() bool {
		return held.Load() == capacity && s.Waiting() == workers-capacity
	})
	if n := peak.Load(); n != capacity {
		t.Errorf("%d in flight with the cap full and %d queued, want %d", n, workers-capacity, capacity)
	}
	close(gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("Acquire: %v", err)
	}
	if n := peak.Load(); n > capacity {
		t.Errorf("peak in flight %d, cap %d", n, capacity)
	}
	checkIdle(t, s)
}

func TestQueueFullRefusesAtQueueSize(t *testing.T) {
	const queueSize = 2
	s, clock := newShaper(t, 1, 0, queueSize, time.Minute)
	mustAcquire(t, s)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		waited time.Duration
		err    error
	}
	results := make(chan result, queueSize)
	for range queueSize {
		go func() {
			w, err := s.Acquire(ctx)
			results <- result{w, err}
		}()
	}
	waitFor(t, "the queue to fill", func() bool { return s.Waiting() == queueSize })

	if w, err := s.Acquire(guard(t)); !errors.Is(err, ErrQueueFull) || w != 0 {
		t.Fatalf("Acquire on a full queue = %v, %v; want 0, ErrQueueFull", w, err)
	}
	if n := s.Waiting(); n != queueSize {
		t.Errorf("Waiting = %d after a refusal, want %d", n, queueSize)
	}

	// The waiters started on the fake clock's t0, so the one served after
	// 5 s of fake time reports exactly that.
	clock.Advance(5 * time.Second)
	s.Release()
	r := <-results
	if r.err != nil || r.waited != 5*time.Second {
		t.Fatalf("first waiter = %v, %v; want 5s, nil", r.waited, r.err)
	}
	cancel()
	if r := <-results; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v, want context.Canceled", r.err)
	}
	s.Release()
	checkIdle(t, s)
}

func TestQueueSizeZeroNeverWaits(t *testing.T) {
	t.Run("cap", func(t *testing.T) {
		s, _ := newShaper(t, 1, 0, 0, time.Minute)
		mustAcquire(t, s)
		if _, err := s.Acquire(guard(t)); !errors.Is(err, ErrQueueFull) {
			t.Fatalf("second Acquire: %v, want ErrQueueFull", err)
		}
		s.Release()
		checkIdle(t, s)
	})
	t.Run("rate", func(t *testing.T) {
		s, clock := newShaper(t, 0, 1, 0, time.Minute)
		mustAcquire(t, s)
		if _, err := s.Acquire(guard(t)); !errors.Is(err, ErrQueueFull) {
			t.Fatalf("second Acquire: %v, want ErrQueueFull", err)
		}
		// The refused request took no turn: the next one is due 1 s after
		// the first, not 2 s.
		clock.Advance(time.Second)
		if w := mustAcquire(t, s); w != 0 {
			t.Errorf("turn due now waited %v", w)
		}
		s.Release()
		s.Release()
		checkIdle(t, s)
	})
	t.Run("cap and rate", func(t *testing.T) {
		s, _ := newShaper(t, 2, 1, 0, time.Minute)
		mustAcquire(t, s)
		if _, err := s.Acquire(guard(t)); !errors.Is(err, ErrQueueFull) {
			t.Fatalf("second Acquire: %v, want ErrQueueFull", err)
		}
		if n := len(s.slots); n != 1 {
			t.Errorf("%d slots taken after a refusal, want 1", n)
		}
		s.Release()
		checkIdle(t, s)
	})
}

func TestQueueTimeout(t *testing.T) {
	t.Run("slot", func(t *testing.T) {
		s := New(1, 0, 4, 5*time.Millisecond)
		mustAcquire(t, s)
		if _, err := s.Acquire(context.Background()); !errors.Is(err, ErrQueueTimeout) {
			t.Fatalf("Acquire with the slot held: %v, want ErrQueueTimeout", err)
		}
		if n := s.InFlight(); n != 1 {
			t.Errorf("InFlight = %d after a timeout, want 1", n)
		}
		s.Release()
		checkIdle(t, s)
	})
	t.Run("zero timeout", func(t *testing.T) {
		s := New(1, 0, 4, 0)
		mustAcquire(t, s)
		if _, err := s.Acquire(context.Background()); !errors.Is(err, ErrQueueTimeout) {
			t.Fatalf("Acquire: %v, want ErrQueueTimeout", err)
		}
		s.Release()
		checkIdle(t, s)
	})
	t.Run("rate turn too far", func(t *testing.T) {
		// A turn 100 ms away with 50 ms of queue time fails at once and
		// gives back both its slot and its turn.
		s, clock := newShaper(t, 1, 10, 4, 50*time.Millisecond)
		mustAcquire(t, s)
		s.Release()
		if _, err := s.Acquire(guard(t)); !errors.Is(err, ErrQueueTimeout) {
			t.Fatalf("Acquire 100 ms before its turn: %v, want ErrQueueTimeout", err)
		}
		checkIdle(t, s)
		clock.Advance(100 * time.Millisecond)
		if w := mustAcquire(t, s); w != 0 {
			t.Errorf("turn due now waited %v", w)
		}
		s.Release()
		checkIdle(t, s)
	})
}

func TestRateSpacing(t *testing.T) {
	// With queue size 0 every decision is immediate: admitted when the turn
	// is due, refused otherwise. Turns are 100 ms apart and idle time builds
	// no credit (burst 1).
	s, clock := newShaper(t, 0, 10, 0, time.Minute)
	t0 := clock.Now()
	for _, step := range []struct {
		at   time.Duration
		want bool
	}{
		{0, true}, {0, false}, {99 * time.Millisecond, false}, {100 * time.Millisecond, true},
		{150 * time.Millisecond, false}, {200 * time.Millisecond, true}, {200 * time.Millisecond, false},
		{10 * time.Second, true}, {10 * time.Second, false}, {10*time.Second + 99*time.Millisecond, false},
		{10*time.Second + 100*time.Millisecond, true},
	} {
		clock.Advance(t0.Add(step.at).Sub(clock.Now()))
		_, err := s.Acquire(guard(t))
		switch {
		case step.want && err != nil:
			t.Fatalf("at +%v: %v, want admitted", step.at, err)
		case !step.want && !errors.Is(err, ErrQueueFull):
			t.Fatalf("at +%v: %v, want ErrQueueFull", step.at, err)
		case err == nil:
			s.Release()
		}
	}
	checkIdle(t, s)
}

func TestRateWaitTakesTheTurn(t *testing.T) {
	// On a frozen clock the second request's turn is 1 ms away: it waits
	// (on a real timer) and takes that turn, so the limiter is empty at it.
	s, clock := newShaper(t, 0, 1000, 4, time.Minute)
	t0 := clock.Now()
	mustAcquire(t, s)
	mustAcquire(t, s)
	if n := s.InFlight(); n != 2 {
		t.Errorf("InFlight = %d, want 2", n)
	}
	if tok := s.limiter.TokensAt(t0.Add(time.Millisecond)); math.Abs(tok) > 1e-9 {
		t.Errorf("tokens at the second turn = %v, want 0 (turn taken)", tok)
	}
	s.Release()
	s.Release()
	checkIdle(t, s)
}

func TestCancelLeavesNothingHeld(t *testing.T) {
	errGone := errors.New("client went away")
	t.Run("waiting for a slot", func(t *testing.T) {
		s, _ := newShaper(t, 1, 0, 4, time.Minute)
		mustAcquire(t, s)
		ctx, cancel := context.WithCancelCause(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := s.Acquire(ctx)
			done <- err
		}()
		waitFor(t, "the waiter", func() bool { return s.Waiting() == 1 })
		cancel(errGone)
		if err := <-done; !errors.Is(err, errGone) {
			t.Fatalf("cancelled Acquire: %v, want the cancel cause", err)
		}
		if n, w := s.InFlight(), s.Waiting(); n != 1 || w != 0 {
			t.Errorf("after cancel: %d in flight, %d waiting; want 1, 0", n, w)
		}
		s.Release()
		checkIdle(t, s)
		// The slot is usable again without waiting.
		if w := mustAcquire(t, s); w != 0 {
			t.Errorf("free slot waited %v", w)
		}
		s.Release()
	})
	t.Run("already cancelled", func(t *testing.T) {
		s, _ := newShaper(t, 1, 0, 4, time.Minute)
		mustAcquire(t, s)
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(errGone)
		if _, err := s.Acquire(ctx); !errors.Is(err, errGone) {
			t.Fatalf("Acquire on a done ctx with the slot held: %v, want the cause", err)
		}
		s.Release()
		checkIdle(t, s)
	})
}

func TestAbandonedWaiterDoesNotConsumeRate(t *testing.T) {
	// One turn a second, 1 s of queue time, a frozen clock at t0. The first
	// request takes the turn at t0; the second reserves t0+1s and waits on
	// a real 1 s timer, and is cancelled long before it fires.
	s, clock := newShaper(t, 2, 1, 4, time.Second)
	mustAcquire(t, s)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := s.Acquire(ctx)
		if err == nil {
			s.Release()
		}
		done <- err
	}()
	waitFor(t, "the waiter", func() bool { return s.Waiting() == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("abandoned waiter: %v, want context.Canceled (it must be cancelled before its 1 s timer fires)", err)
	}
	if n, taken := s.InFlight(), len(s.slots); n != 1 || taken != 1 {
		t.Fatalf("after abandon: %d in flight, %d slots taken; want 1, 1", n, taken)
	}

	// At t0+990ms the next turn is t0+1s if the abandoned turn was given
	// back: 10 ms away, within the queue time. Had it been kept, the next
	// turn would be t0+2s, beyond the queue time, and Acquire would fail
	// with ErrQueueTimeout at once.
	clock.Advance(990 * time.Millisecond)
	if _, err := s.Acquire(context.Background()); err != nil {
		t.Fatalf("Acquire after the abandoned turn: %v, want nil (the turn was not given back)", err)
	}
	s.Release()
	s.Release()
	checkIdle(t, s)
}

func TestReleaseWithoutAcquirePanics(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    *Shaper
	}{
		{"cap", New(1, 0, 0, 0)},
		{"rate", New(0, 1, 0, 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("Release without Acquire did not panic")
				}
			}()
			tc.s.Release()
		})
	}
}

// steppingClock returns a clock that moves step forward on every reading,
// so that each uncontended Acquire finds its rate turn due.
func steppingClock(step time.Duration) func() time.Time {
	t := time.Unix(1_000_000, 0)
	return func() time.Time {
		t = t.Add(step)
		return t
	}
}

func TestFastPathDoesNotAllocate(t *testing.T) {
	rateOnly := New(0, 1000, 4, time.Second)
	rateOnly.now = steppingClock(time.Millisecond)
	both := New(4, 1000, 4, time.Second)
	both.now = steppingClock(time.Millisecond)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		s    *Shaper
	}{
		{"nil", nil},
		{"cap", New(4, 0, 4, time.Second)},
		{"rate", rateOnly},
		{"cap and rate", both},
	} {
		t.Run(tc.name, func(t *testing.T) {
			allocs := testing.AllocsPerRun(1000, func() {
				if w, err := tc.s.Acquire(ctx); err != nil || w != 0 {
					t.Fatalf("uncontended Acquire = %v, %v", w, err)
				}
				tc.s.Release()
			})
			if allocs != 0 {
				t.Errorf("Acquire+Release allocates %v times", allocs)
			}
		})
	}
}

func BenchmarkAcquireRelease(b *testing.B) {
	ctx := context.Background()
	rateFake := New(0, 1000, 4, time.Second)
	rateFake.now = steppingClock(time.Millisecond)
	for _, bc := range []struct {
		name string
		s    *Shaper
	}{
		{"nil", nil},
		{"cap", New(64, 0, 64, time.Second)},
		// A stepping clock makes every turn due, whatever the machine's speed.
		{"rate", rateFake},
		// The real clock at one turn per nanosecond: the cost with time.Now.
		{"rate_realclock", New(0, 1e9, 64, time.Second)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := bc.s.Acquire(ctx); err != nil {
					b.Fatal(err)
				}
				bc.s.Release()
			}
		})
	}
}

// TestOnWaitingFollowsTheQueue checks that the hook sees a request join the
// queue while it waits and leave it once it has its slot.
func TestOnWaitingFollowsTheQueue(t *testing.T) {
	s := New(1, 0, 4, 10*time.Second)
	var mu sync.Mutex
	var seen []int
	s.OnWaiting = func(n int) {
		mu.Lock()
		seen = append(seen, n)
		mu.Unlock()
	}
	if _, err := s.Acquire(context.Background()); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.Acquire(context.Background())
		done <- err
	}()
	for s.Waiting() != 1 {
		runtime.Gosched()
	}
	s.Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	s.Release()
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 || seen[0] != 1 || seen[1] != 0 {
		t.Fatalf("OnWaiting saw %v, want [1 0]", seen)
	}
}
