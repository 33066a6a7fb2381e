package proxy

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// breakerRig is a breaker on a hand-moved clock that remembers its
// transitions as "from>to" strings.
type breakerRig struct {
	b     *breaker
	clock *fakeClock
	mu    sync.Mutex
	moves []string
}

func newBreakerRig(cfg breakerConfig) *breakerRig {
	r := &breakerRig{clock: newFakeClock()}
	r.b = newBreaker(cfg, r.clock.Now, func(from, to breakerState) {
		r.mu.Lock()
		r.moves = append(r.moves, from.String()+">"+to.String())
		r.mu.Unlock()
	})
	return r
}

func (r *breakerRig) transitions() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.moves)
}

// feed sends one request per letter of outcomes ('S' success, 'F' failure)
// through the breaker; every request must be allowed.
func (r *breakerRig) feed(t *testing.T, outcomes string) {
	t.Helper()
	for i, c := range outcomes {
		tk, ok := r.b.allow()
		if !ok {
			t.Fatalf("request %d of %q rejected in state %s", i, outcomes, r.b.state())
		}
		tk.done(c == 'S')
	}
}

// open trips the breaker with consecutive failures.
func (r *breakerRig) open(t *testing.T) {
	t.Helper()
	r.feed(t, strings.Repeat("F", r.b.cfg.consecutiveFailures))
	if got := r.b.state(); got != breakerOpen {
		t.Fatalf("state after %d failures = %s, want open", r.b.cfg.consecutiveFailures, got)
	}
}

// halfOpen trips the breaker and waits out the cooldown.
func (r *breakerRig) halfOpen(t *testing.T) {
	t.Helper()
	r.open(t)
	r.clock.Advance(r.b.cfg.cooldown)
	if got := r.b.state(); got != breakerHalfOpen {
		t.Fatalf("state after cooldown = %s, want half_open", got)
	}
}

type breakerStep struct {
	wait     time.Duration
	outcomes string
}

func TestBreakerClosedRules(t *testing.T) {
	cases := []struct {
		name  string
		steps []breakerStep
		want  breakerState
	}{
		{"consecutive failures open", []breakerStep{{0, "FFFFF"}}, breakerOpen},
		{"one short of consecutive stays closed", []breakerStep{{0, "FFFF"}}, breakerClosed},
		{"a success resets the run", []breakerStep{{0, "FFFFSFFFF"}}, breakerClosed},
		{"ratio opens at minRequests", []breakerStep{{0, strings.Repeat("SF", 10)}}, breakerOpen},
		{"ratio below minRequests stays closed", []breakerStep{{0, strings.Repeat("SF", 9)}}, breakerClosed},
		{"ratio under threshold stays closed", []breakerStep{{0, strings.Repeat("SSF", 20)}}, breakerClosed},
		{"all successes stay closed", []breakerStep{{0, strings.Repeat("S", 100)}}, breakerClosed},
		{"failures inside the window still count",
			[]breakerStep{{0, strings.Repeat("SF", 9)}, {5 * time.Second, "SF"}}, breakerOpen},
		{"window slides: old failures forgotten",
			[]breakerStep{{0, strings.Repeat("SF", 9)}, {11 * time.Second, "SF"}}, breakerClosed},
		{"window slides: old successes forgotten too",
			[]breakerStep{{0, strings.Repeat("S", 10)}, {6 * time.Second, strings.Repeat("SF", 5)},
				{6 * time.Second, strings.Repeat("SF", 5)}}, breakerOpen},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newBreakerRig(breakerConfig{})
			for _, s := range tc.steps {
				r.clock.Advance(s.wait)
				r.feed(t, s.outcomes)
			}
			if got := r.b.state(); got != tc.want {
				t.Fatalf("state = %s, want %s", got, tc.want)
			}
			var want []string
			if tc.want == breakerOpen {
				want = []string{"closed>open"}
			}
			if got := r.transitions(); !slices.Equal(got, want) {
				t.Fatalf("transitions = %q, want %q", got, want)
			}
		})
	}
}

func TestBreakerOpenRejectsUntilCooldown(t *testing.T) {
	r := newBreakerRig(breakerConfig{cooldown: 3 * time.Second})
	r.open(t)
	if got := r.b.retryIn(); got != 3*time.Second {
		t.Fatalf("retryIn right after opening = %v, want 3s", got)
	}
	r.clock.Advance(3*time.Second - time.Nanosecond)
	for range 3 {
		if tk, ok := r.b.allow(); ok {
			t.Fatalf("allowed while open: %+v", tk)
		}
	}
	if got := r.b.retryIn(); got != time.Nanosecond {
		t.Fatalf("retryIn 1ns before cooldown = %v, want 1ns", got)
	}
	if got := r.b.state(); got != breakerOpen {
		t.Fatalf("state 1ns before cooldown = %s, want open", got)
	}
	r.clock.Advance(time.Nanosecond)
	if got := r.b.retryIn(); got != 0 {
		t.Fatalf("retryIn after cooldown = %v, want 0", got)
	}
	if _, ok := r.b.allow(); !ok {
		t.Fatal("rejected after cooldown")
	}
	if got := r.b.state(); got != breakerHalfOpen {
		t.Fatalf("state after cooldown = %s, want half_open", got)
	}
}

func TestBreakerRetryInZeroWhenNotOpen(t *testing.T) {
	r := newBreakerRig(breakerConfig{})
	if got := r.b.retryIn(); got != 0 {
		t.Fatalf("closed retryIn = %v, want 0", got)
	}
	r.halfOpen(t)
	if got := r.b.retryIn(); got != 0 {
		t.Fatalf("half-open retryIn = %v, want 0", got)
	}
}

func TestBreakerHalfOpenProbes(t *testing.T) {
	cases := []struct {
		name   string
		probes int
		// results is the outcome of each probe, reported in order once all
		// probes are out.
		results string
		want    breakerState
	}{
		{"two successes close", 2, "SS", breakerClosed},
		{"first fails reopens", 2, "FS", breakerOpen},
		{"second fails reopens", 2, "SF", breakerOpen},
		{"one success is not enough", 2, "S", breakerHalfOpen},
		{"three probes all succeed", 3, "SSS", breakerClosed},
		{"single probe closes", 1, "S", breakerClosed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newBreakerRig(breakerConfig{halfOpenProbes: tc.probes, cooldown: 5 * time.Second})
			r.halfOpen(t)
			tickets := make([]ticket, tc.probes)
			for i := range tickets {
				var ok bool
				if tickets[i], ok = r.b.allow(); !ok {
					t.Fatalf("probe %d rejected", i)
				}
			}
			if _, ok := r.b.allow(); ok {
				t.Fatalf("probe %d allowed beyond the limit of %d", tc.probes+1, tc.probes)
			}
			for i, c := range tc.results {
				tickets[i].done(c == 'S')
			}
			if got := r.b.state(); got != tc.want {
				t.Fatalf("state = %s, want %s", got, tc.want)
			}
			want := []string{"closed>open", "open>half_open", "half_open>" + tc.want.String()}
			if tc.want == breakerHalfOpen {
				want = want[:2]
			}
			if got := r.transitions(); !slices.Equal(got, want) {
				t.Fatalf("transitions = %q, want %q", got, want)
			}
		})
	}
}

func TestBreakerHalfOpenFreesSlotOnSuccess(t *testing.T) {
	r := newBreakerRig(breakerConfig{halfOpenProbes: 3})
	r.halfOpen(t)
	t1, _ := r.b.allow()
	t2, _ := r.b.allow()
	t3, _ := r.b.allow()
	if _, ok := r.b.allow(); ok {
		t.Fatal("fourth probe allowed with three outstanding")
	}
	t1.done(true)
	t4, ok := r.b.allow()
	if !ok {
		t.Fatal("no probe slot after a probe finished")
	}
	t2.done(true)
	if got := r.b.state(); got != breakerHalfOpen {
		t.Fatalf("state after 2 of 3 successes = %s, want half_open", got)
	}
	t3.done(true)
	if got := r.b.state(); got != breakerClosed {
		t.Fatalf("state after 3 successes = %s, want closed", got)
	}
	t4.done(false) // issued in the half-open generation: must not count now.
	r.feed(t, "FFFF")
	if got := r.b.state(); got != breakerClosed {
		t.Fatalf("stale probe failure counted: state = %s", got)
	}
}

func TestBreakerProbeFailureRestartsCooldown(t *testing.T) {
	r := newBreakerRig(breakerConfig{cooldown: 4 * time.Second})
	r.halfOpen(t)
	t1, _ := r.b.allow()
	t2, _ := r.b.allow()
	r.clock.Advance(time.Second)
	t1.done(false)
	if got := r.b.retryIn(); got != 4*time.Second {
		t.Fatalf("retryIn after failed probe = %v, want a fresh 4s", got)
	}
	t2.done(true) // stale: the breaker reopened since t2 was issued.
	r.clock.Advance(4*time.Second - time.Nanosecond)
	if got := r.b.state(); got != breakerOpen {
		t.Fatalf("state before the new cooldown ends = %s, want open", got)
	}
	r.clock.Advance(time.Nanosecond)
	if got := r.b.state(); got != breakerHalfOpen {
		t.Fatalf("state after the new cooldown = %s, want half_open", got)
	}
	want := []string{"closed>open", "open>half_open", "half_open>open", "open>half_open"}
	if got := r.transitions(); !slices.Equal(got, want) {
		t.Fatalf("transitions = %q, want %q", got, want)
	}
}

func TestBreakerStaleTicketsIgnored(t *testing.T) {
	cases := []struct {
		name string
		run  func(t *testing.T, r *breakerRig)
		want breakerState
	}{
		{"closed ticket success while open does not close", func(t *testing.T, r *breakerRig) {
			old, _ := r.b.allow()
			r.open(t)
			old.done(true)
		}, breakerOpen},
		{"closed ticket success does not count as a probe", func(t *testing.T, r *breakerRig) {
			old1, _ := r.b.allow()
			old2, _ := r.b.allow()
			r.halfOpen(t)
			old1.done(true)
			old2.done(true)
		}, breakerHalfOpen},
		{"closed ticket failure does not reopen half-open", func(t *testing.T, r *breakerRig) {
			old, _ := r.b.allow()
			r.halfOpen(t)
			old.done(false)
		}, breakerHalfOpen},
		{"stale probes do not use new probe slots", func(t *testing.T, r *breakerRig) {
			r.halfOpen(t)
			p1, _ := r.b.allow()
			p2, _ := r.b.allow()
			p1.done(false) // reopens; p2 is now stale
			r.clock.Advance(r.b.cfg.cooldown)
			n1, ok1 := r.b.allow()
			n2, ok2 := r.b.allow()
			if !ok1 || !ok2 {
				t.Fatalf("new round probes rejected: %v %v", ok1, ok2)
			}
			p2.done(true) // must neither free a slot nor count a success
			if _, ok := r.b.allow(); ok {
				t.Fatal("stale done freed a probe slot")
			}
			n1.done(true)
			if got := r.b.state(); got != breakerHalfOpen {
				t.Fatalf("stale success counted: state = %s", got)
			}
			n2.done(true)
		}, breakerClosed},
		{"pre-open failures do not count after closing", func(t *testing.T, r *breakerRig) {
			var old [4]ticket
			for i := range old {
				old[i], _ = r.b.allow()
			}
			r.halfOpen(t)
			r.feed(t, "SS")
			for i := range old {
				old[i].done(false)
			}
			r.feed(t, "FFFF")
		}, breakerClosed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newBreakerRig(breakerConfig{})
			tc.run(t, r)
			if got := r.b.state(); got != tc.want {
				t.Fatalf("state = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestBreakerDoneTwiceHarmless(t *testing.T) {
	t.Run("closed", func(t *testing.T) {
		r := newBreakerRig(breakerConfig{})
		for range 4 {
			tk, _ := r.b.allow()
			tk.done(false)
			tk.done(false)
		}
		if got := r.b.state(); got != breakerClosed {
			t.Fatalf("4 failures reported twice: state = %s, want closed", got)
		}
		r.feed(t, "F")
		if got := r.b.state(); got != breakerOpen {
			t.Fatalf("5th failure: state = %s, want open", got)
		}
	})
	t.Run("half-open", func(t *testing.T) {
		r := newBreakerRig(breakerConfig{})
		r.halfOpen(t)
		tk, _ := r.b.allow()
		tk.done(true)
		tk.done(true)
		if got := r.b.state(); got != breakerHalfOpen {
			t.Fatalf("one probe reported twice: state = %s, want half_open", got)
		}
	})
	t.Run("rejected ticket", func(t *testing.T) {
		r := newBreakerRig(breakerConfig{})
		r.halfOpen(t)
		p1, _ := r.b.allow()
		p2, _ := r.b.allow()
		rej, ok := r.b.allow()
		if ok {
			t.Fatal("third probe allowed")
		}
		rej.done(false)
		if got := r.b.state(); got != breakerHalfOpen {
			t.Fatalf("rejected ticket reported: state = %s, want half_open", got)
		}
		p1.done(true)
		p2.done(true)
		if got := r.b.state(); got != breakerClosed {
			t.Fatalf("state = %s, want closed", got)
		}
	})
}

func TestBreakerOnChangeOncePerTransition(t *testing.T) {
	r := newBreakerRig(breakerConfig{})
	r.open(t)
	r.b.allow() // rejected: no transition
	r.clock.Advance(r.b.cfg.cooldown)
	for range 3 { // each may notice the cooldown; only the first moves
		r.b.state()
		r.b.retryIn()
	}
	p1, _ := r.b.allow()
	p1.done(false)
	r.clock.Advance(r.b.cfg.cooldown)
	p2, _ := r.b.allow()
	p3, _ := r.b.allow()
	p2.done(true)
	p3.done(true)
	r.feed(t, "SSS")
	want := []string{"closed>open", "open>half_open", "half_open>open", "open>half_open", "half_open>closed"}
	if got := r.transitions(); !slices.Equal(got, want) {
		t.Fatalf("transitions = %q, want %q", got, want)
	}
}

func TestBreakerConfigDefaults(t *testing.T) {
	b := newBreaker(breakerConfig{}, nil, nil)
	if b.cfg != defaultBreakerConfig() {
		t.Fatalf("zero config = %+v, want defaults %+v", b.cfg, defaultBreakerConfig())
	}
	custom := breakerConfig{consecutiveFailures: 2, failureRatio: 0.9, minRequests: 3,
		window: time.Minute, cooldown: time.Second, halfOpenProbes: 1}
	if got := newBreaker(custom, nil, nil).cfg; got != custom {
		t.Fatalf("custom config = %+v, want %+v", got, custom)
	}
	// The real clock must work when none is injected.
	tk, ok := b.allow()
	if !ok {
		t.Fatal("fresh breaker rejected")
	}
	tk.done(true)
	labels := []string{breakerClosed.String(), breakerOpen.String(), breakerHalfOpen.String(), breakerState(9).String()}
	if want := []string{"closed", "open", "half_open", "unknown"}; !slices.Equal(labels, want) {
		t.Fatalf("labels = %q, want %q", labels, want)
	}
}

// TestBreakerConcurrent hammers one breaker from a few goroutines while the
// clock moves, and checks that every transition is legal and chained, and
// that no generation ever had more probes out than allowed.
func TestBreakerConcurrent(t *testing.T) {
	const workers, iters = 4, 1000
	r := newBreakerRig(breakerConfig{})
	var (
		mu       sync.Mutex
		held     = map[uint64]int{}
		maxHeld  int
		wg       sync.WaitGroup
		allowed  int
		rejected int
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range iters {
				if w == 0 && i%25 == 0 {
					r.clock.Advance(time.Second)
				}
				tk, ok := r.b.allow()
				mu.Lock()
				if !ok {
					rejected++
					mu.Unlock()
					continue
				}
				allowed++
				if tk.probe {
					held[tk.gen]++
					maxHeld = max(maxHeld, held[tk.gen])
				}
				mu.Unlock()
				if tk.probe {
					mu.Lock()
					held[tk.gen]--
					mu.Unlock()
				}
				tk.done(i%3 == 0) // mostly failures, so the breaker cycles
			}
		}()
	}
	wg.Wait()
	if allowed+rejected != workers*iters {
		t.Fatalf("allowed %d + rejected %d != %d", allowed, rejected, workers*iters)
	}
	if maxHeld > r.b.cfg.halfOpenProbes {
		t.Fatalf("%d probes out in one generation, limit %d", maxHeld, r.b.cfg.halfOpenProbes)
	}
	moves := r.transitions()
	if len(moves) == 0 || moves[0] != "closed>open" {
		t.Fatalf("transitions = %q, want a start with closed>open", moves)
	}
	legal := map[string]bool{"closed>open": true, "open>half_open": true, "half_open>open": true, "half_open>closed": true}
	prev := "closed"
	for i, m := range moves {
		from, to, _ := strings.Cut(m, ">")
		if !legal[m] || from != prev {
			t.Fatalf("transition %d %q illegal after %q (all: %q)", i, m, prev, moves)
		}
		prev = to
	}
	if got := r.b.state().String(); got != prev && !(prev == "open" && got == "half_open") {
		t.Fatalf("final state %s does not follow last transition to %s", got, prev)
	}
}

func BenchmarkBreakerAllowDone(b *testing.B) {
	br := newBreaker(defaultBreakerConfig(), nil, nil)
	b.ReportAllocs()
	for b.Loop() {
		tk, ok := br.allow()
		if !ok {
			b.Fatal("closed breaker rejected")
		}
		tk.done(true)
	}
}

func BenchmarkBreakerAllowDoneParallel(b *testing.B) {
	br := newBreaker(defaultBreakerConfig(), nil, nil)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			tk, ok := br.allow()
			if !ok {
				b.Fatal("closed breaker rejected")
			}
			tk.done(true)
		}
	})
}

func TestBreakerClosingForgetsTheOutage(t *testing.T) {
	r := newBreakerRig(breakerConfig{})
	r.feed(t, strings.Repeat("SF", 10)) // opens on the ratio rule
	r.clock.Advance(r.b.cfg.cooldown)   // the outage is still inside the window
	r.feed(t, "SS")                     // probes close it
	r.feed(t, "FSF")                    // 12 of 23 would reopen if the outage still counted
	if got := r.b.state(); got != breakerClosed {
		t.Fatalf("state = %s, want closed", got)
	}
}
