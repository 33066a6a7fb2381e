package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/metrics"
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

// TestBreakerBypassJudgedAsProbe: a bypass ticket (a request sent although
// the breaker refuses it) is judged as a half-open probe, without a probe
// slot: its success half-opens an open breaker and counts toward closing
// it, its failure reopens a half-open one and leaves an open one as it was.
func TestBreakerBypassJudgedAsProbe(t *testing.T) {
	bypass := func(t *testing.T, r *breakerRig) ticket {
		t.Helper()
		if _, ok := r.b.allow(); ok {
			t.Fatalf("allow admitted a request in state %s; the case needs a refusing breaker", r.b.state())
		}
		tk := r.b.allowOrBypass()
		if !tk.bypass || tk.probe {
			t.Fatalf("allowOrBypass on a refusing breaker: %+v, want a bypass ticket", tk)
		}
		return tk
	}
	cases := []struct {
		name  string
		run   func(t *testing.T, r *breakerRig)
		want  breakerState
		moves []string
	}{
		{"success while open half-opens", func(t *testing.T, r *breakerRig) {
			tk := bypass(t, r)
			tk.done(true)
		}, breakerHalfOpen, []string{"closed>open", "open>half_open"}},
		{"success while open counts as a probe's", func(t *testing.T, r *breakerRig) {
			tk := bypass(t, r)
			tk.done(true)
			r.feed(t, "S") // the second of half_open_probes = 2
		}, breakerClosed, []string{"closed>open", "open>half_open", "half_open>closed"}},
		{"failure while open changes nothing", func(t *testing.T, r *breakerRig) {
			r.clock.Advance(2 * time.Second)
			tk := bypass(t, r)
			tk.done(false)
			if got := r.b.retryIn(); got != 3*time.Second {
				t.Errorf("retryIn after a bypass failure = %v, want the cooldown's 3s left", got)
			}
		}, breakerOpen, []string{"closed>open"}},
		{"half-open with every slot taken", func(t *testing.T, r *breakerRig) {
			r.clock.Advance(r.b.cfg.cooldown)
			p1, _ := r.b.allow()
			p2, _ := r.b.allow()
			tk := bypass(t, r)
			tk.done(true)
			p1.done(true)  // the second success closes it
			p2.done(false) // stale: the breaker closed since p2 was issued
		}, breakerClosed, []string{"closed>open", "open>half_open", "half_open>closed"}},
		{"failure while half-open reopens", func(t *testing.T, r *breakerRig) {
			r.clock.Advance(r.b.cfg.cooldown)
			p1, _ := r.b.allow()
			p2, _ := r.b.allow()
			tk := bypass(t, r)
			tk.done(false)
			p1.done(true) // stale
			p2.done(true) // stale
		}, breakerOpen, []string{"closed>open", "open>half_open", "half_open>open"}},
		{"stale bypass ignored", func(t *testing.T, r *breakerRig) {
			tk := bypass(t, r)
			r.clock.Advance(r.b.cfg.cooldown)
			r.b.state() // half-open: a new generation
			tk.done(true)
			p, ok := r.b.allow()
			if !ok || !p.probe {
				t.Fatalf("allow after a stale bypass: %+v %v, want a probe ticket", p, ok)
			}
			p.done(false)
		}, breakerOpen, []string{"closed>open", "open>half_open", "half_open>open"}},
		{"release gives no verdict", func(t *testing.T, r *breakerRig) {
			tk := bypass(t, r)
			tk.release()
			tk.done(true) // after release: nothing
		}, breakerOpen, []string{"closed>open"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newBreakerRig(breakerConfig{cooldown: 5 * time.Second, halfOpenProbes: 2})
			r.open(t)
			c.run(t, r)
			if got := r.b.state(); got != c.want {
				t.Errorf("state = %s, want %s", got, c.want)
			}
			if got := r.transitions(); !slices.Equal(got, c.moves) {
				t.Errorf("transitions = %q, want %q", got, c.moves)
			}
		})
	}
}

// TestBreakerBypassWithOneProbeCloses: with half_open_probes = 1 a bypass
// success closes an open breaker at once, through half-open.
func TestBreakerBypassWithOneProbeCloses(t *testing.T) {
	r := newBreakerRig(breakerConfig{halfOpenProbes: 1})
	r.open(t)
	tk := r.b.allowOrBypass()
	tk.done(true)
	if got := r.b.state(); got != breakerClosed {
		t.Fatalf("state = %s, want closed", got)
	}
	if got, want := r.transitions(), []string{"closed>open", "open>half_open", "half_open>closed"}; !slices.Equal(got, want) {
		t.Fatalf("transitions = %q, want %q", got, want)
	}
}

// TestBreakerAllowOrBypassAdmitsAsAllow: where allow would admit a request,
// allowOrBypass gives the same ticket (closed, or a half-open probe slot),
// and refusing says so.
func TestBreakerAllowOrBypassAdmitsAsAllow(t *testing.T) {
	r := newBreakerRig(breakerConfig{halfOpenProbes: 1})
	if _, refused := r.b.refusing(); refused {
		t.Fatal("a closed breaker refuses")
	}
	if tk := r.b.allowOrBypass(); tk.bypass || tk.probe || tk.b == nil {
		t.Fatalf("closed: %+v, want a plain ticket", tk)
	}
	r.halfOpen(t)
	opened := r.clock.Now().Add(-r.b.cfg.cooldown)
	if at, refused := r.b.refusing(); refused || !at.Equal(opened) {
		t.Fatalf("half-open with a free slot: refusing = %v, %v; want false, %v", at, refused, opened)
	}
	p := r.b.allowOrBypass()
	if !p.probe || p.bypass {
		t.Fatalf("half-open with a free slot: %+v, want a probe ticket", p)
	}
	if at, refused := r.b.refusing(); !refused || !at.Equal(opened) {
		t.Fatalf("half-open, slot taken: refusing = %v, %v; want true, %v", at, refused, opened)
	}
	p.done(true)
	if got := r.b.state(); got != breakerClosed {
		t.Fatalf("state = %s, want closed", got)
	}
}

// The gateway's verdicts: which answers of an upstream open its breaker
// and which spare it, through a real gateway in front of loopback upstreams.
// An answer that says nothing of the upstream's health (a caller's own rate
// limit, a quota, a request error, a caller who left) must not open it; a
// half-open probe is judged as soon as its answer is.

// TestBreakerCycleEndToEnd: on the gateway's clock, a breaker opens after
// its consecutive failures, makes requests skip its upstream, half-opens
// after the cooldown, and closes on a successful probe. With no other
// upstream, requests still go to it while it is open (in bypass), and the
// first success closes it.
func TestBreakerCycleEndToEnd(t *testing.T) {
	breakerEdit := func(u *config.Upstream) {
		u.Retry.MaxAttempts = 1
		u.Breaker = config.Breaker{Enabled: true, ConsecutiveFailures: 2, FailureRatio: 0.5, MinRequests: 20,
			WindowSeconds: 10, CooldownSeconds: 5, HalfOpenProbes: 1}
	}
	state := func(t *testing.T, w *resWorld, name string) float64 {
		t.Helper()
		return circuitState(t, w.tg, name)
	}
	transitions := func(t *testing.T, w *resWorld, to string) float64 {
		t.Helper()
		return metricValue(t, w.tg, "tollgate_upstream_circuit_transitions_total", map[string]string{"upstream": "primary", "to": to})
	}

	t.Run("with a backup", func(t *testing.T) {
		w := newResWorld(t, resSetup{upstreams: []string{"primary", "backup"}, clock: true, edit: func(c *config.Config) {
			breakerEdit(upstreamCfg(t, c, "primary"))
		}})
		// Two failures in a row on primary, each served by backup.
		for i, k := range []sdkKind{kindOpenAI, kindAnthropicStream} {
			w.inject(t, "primary", "status=500", 1)
			wantSuccess(t, k, w.call(t, k, nil))
			rec := w.tg.record(t)
			wantAttempts(t, rec, "primary:500:server_error", "backup:200:ok")
			if want := []float64{0, 2}[i]; state(t, w, "primary") != want {
				t.Errorf("after %d failures the circuit state is %v, want %v", i+1, state(t, w, "primary"), want)
			}
		}
		if transitions(t, w, "open") != 1 {
			t.Errorf("transitions to open: %v, want 1", transitions(t, w, "open"))
		}
		// Open: primary is skipped without being touched, until the
		// cooldown has passed.
		for _, adv := range []time.Duration{0, 4 * time.Second} {
			w.clock.Advance(adv)
			wantSuccess(t, kindOpenAIStream, w.call(t, kindOpenAIStream, nil))
			rec := w.tg.record(t)
			wantAttempts(t, rec, "primary:0:breaker_open", "backup:200:ok")
			if rec.Upstream != "backup" {
				t.Errorf("record upstream %q, want backup", rec.Upstream)
			}
		}
		if n := w.requests("primary"); n != 2 {
			t.Errorf("primary saw %d requests while open, want the 2 failures only", n)
		}
		wantMetric(t, w.tg, "tollgate_upstream_fallbacks_total",
			map[string]string{"from": "primary", "to": "backup", "reason": "breaker_open"}, 2)
		// Past the cooldown: the next request is a probe to primary, which
		// succeeds and closes the circuit.
		w.clock.Advance(time.Second)
		wantSuccess(t, kindAnthropic, w.call(t, kindAnthropic, nil))
		rec := w.tg.record(t)
		wantAttempts(t, rec, "primary:200:ok")
		if rec.Upstream != "primary" || w.requests("primary") != 3 || w.requests("backup") != 4 {
			t.Errorf("probe served by %q; primary saw %d requests, backup %d", rec.Upstream, w.requests("primary"),
				w.requests("backup"))
		}
		if state(t, w, "primary") != 0 || transitions(t, w, "half_open") != 1 || transitions(t, w, "closed") != 1 ||
			transitions(t, w, "open") != 1 {
			t.Errorf("after the probe: state %v, transitions open %v half_open %v closed %v; want 0, 1, 1, 1",
				state(t, w, "primary"), transitions(t, w, "open"), transitions(t, w, "half_open"), transitions(t, w, "closed"))
		}
		if state(t, w, "backup") != 0 {
			t.Errorf("backup circuit state %v, want 0", state(t, w, "backup"))
		}
	})

	t.Run("no upstream left", func(t *testing.T) {
		w := newResWorld(t, resSetup{upstreams: []string{"primary"}, clock: true, edit: func(c *config.Config) {
			breakerEdit(upstreamCfg(t, c, "primary"))
		}})
		// Two failures, relayed as they came (nothing to retry on), and a
		// third for the first request while the circuit is open.
		w.inject(t, "primary", "status=500", 3)
		for range 2 {
			a := w.call(t, kindOpenAI, nil)
			var oe *openai.Error
			if !errors.As(a.err, &oe) || oe.StatusCode != http.StatusInternalServerError {
				t.Fatalf("failing upstream: %v; want its 500", a.err)
			}
			w.tg.record(t)
		}
		if state(t, w, "primary") != 2 {
			t.Fatalf("circuit state %v after 2 failures, want 2 (open)", state(t, w, "primary"))
		}
		// Open, with no other upstream to take the request: it still goes
		// to primary (in bypass), whose failure the caller gets as it came,
		// and the circuit stays open.
		a := w.call(t, kindOpenAI, nil)
		var oe *openai.Error
		if !errors.As(a.err, &oe) || oe.StatusCode != http.StatusInternalServerError {
			t.Errorf("OpenAI SDK with the circuit open: %v; want the upstream's 500", a.err)
		}
		rec := w.tg.record(t)
		wantAttempts(t, rec, "primary:500:server_error")
		if !rec.Attempts[0].BreakerBypass {
			t.Error("the attempt on the open circuit is not marked breaker_bypass")
		}
		if state(t, w, "primary") != 2 {
			t.Errorf("circuit state %v after a failed bypass, want 2 (open)", state(t, w, "primary"))
		}
		// Still open (the clock has not moved): the next request goes to
		// primary too, and its success closes the circuit (half_open_probes 1).
		wantSuccess(t, kindAnthropicStream, w.call(t, kindAnthropicStream, nil))
		rec = w.tg.record(t)
		wantAttempts(t, rec, "primary:200:ok")
		if !rec.Attempts[0].BreakerBypass {
			t.Error("the attempt on the open circuit is not marked breaker_bypass")
		}
		if n := w.requests("primary"); n != 4 {
			t.Errorf("primary saw %d requests, want 4: every request reached it", n)
		}
		wantMetric(t, w.tg, "tollgate_upstream_breaker_bypass_total", map[string]string{"upstream": "primary"}, 2)
		if state(t, w, "primary") != 0 || transitions(t, w, "half_open") != 1 || transitions(t, w, "closed") != 1 {
			t.Errorf("after the bypass success: state %v, transitions half_open %v closed %v; want 0, 1, 1",
				state(t, w, "primary"), transitions(t, w, "half_open"), transitions(t, w, "closed"))
		}
		wantSuccess(t, kindOpenAIStream, w.call(t, kindOpenAIStream, nil))
		if rec := w.tg.record(t); rec.AttemptCount != 1 || rec.Attempts[0].BreakerBypass {
			t.Errorf("closed again: attempts %+v, want one plain attempt", rec.Attempts[:rec.AttemptCount])
		}
	})
}

// halfOpenProbeUpstream answers its first request 500, its second with a stream
// that sends its first token and waits for release, and later ones with a
// whole stream.
type halfOpenProbeUpstream struct {
	hits    atomic.Int32
	release chan struct{}
}

func (u *halfOpenProbeUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	switch u.hits.Add(1) {
	case 1:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, `{"error":{"message":"boom","type":"server_error","param":null,"code":null}}`)
	case 2:
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, openAIRole+openAITok1)
		_ = http.NewResponseController(w).Flush()
		select {
		case <-u.release:
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, openAITok2+openAIStop+openAIUsage+openAIDone)
	default:
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, openAIRole+openAITok1+openAIStop+openAIUsage+openAIDone)
	}
}

// TestHalfOpenProbeReleasedAtFirstToken: a half-open probe that is a stream
// reports the upstream healthy at its first token, so the breaker closes
// and the next request reaches the upstream on an ordinary ticket while the
// probe still streams, instead of being refused one (and sent only in
// bypass) until the probe's stream ends.
func TestHalfOpenProbeReleasedAtFirstToken(t *testing.T) {
	clk := newFakeClock()
	up := &halfOpenProbeUpstream{release: make(chan struct{})}
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(up.release) }) }
	us := httptest.NewServer(up)
	defer us.Close()
	defer release() // before us.Close: the probe's handler must end
	tg := newTestGatewayWith(t, us.URL, func(c *config.Config) {
		u := &c.Upstreams[0]
		fastRetry(u)
		u.Breaker.ConsecutiveFailures, u.Breaker.CooldownSeconds, u.Breaker.HalfOpenProbes = 1, 5, 1
	}, func(o *Options) { o.Now = clk.Now })

	// One failure opens the circuit.
	if resp, _ := post(t, tg.URL+"/v1/chat/completions", plainChat, nil); resp.StatusCode != http.StatusInternalServerError {
		t.Fatalf("first request: %d, want the upstream's 500", resp.StatusCode)
	}
	tg.record(t)
	if s := circuitState(t, tg, "mock"); s != metrics.CircuitOpen {
		t.Fatalf("circuit state %v after the failure, want open", s)
	}
	clk.Advance(6 * time.Second) // past the cooldown: the next request is the probe

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, tg.URL+"/v1/chat/completions", strings.NewReader(streamChat))
	if err != nil {
		t.Fatal(err)
	}
	probe, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Body.Close()
	var got bytes.Buffer
	br := bufio.NewReader(probe.Body)
	for !strings.Contains(got.String(), openAITok1) {
		line, err := br.ReadBytes('\n')
		got.Write(line)
		if err != nil {
			t.Fatalf("probe stream ended before its first token (%v): %q", err, got.String())
		}
	}
	// The caller has the probe's first token; the probe still streams.
	if s := circuitState(t, tg, "mock"); s != metrics.CircuitClosed {
		t.Errorf("circuit state %v once the probe's first token is out, want closed", s)
	}
	resp, body := post(t, tg.URL+"/v1/chat/completions", streamChat, nil)
	if want := openAIRole + openAITok1 + openAIStop + openAIDone; resp.StatusCode != http.StatusOK || string(body) != want {
		t.Errorf("request during the probe stream: %d %q; want the upstream's stream", resp.StatusCode, body)
	}
	if n := up.hits.Load(); n != 3 {
		t.Errorf("upstream hits %d, want 3 (failure, probe, the request during the probe)", n)
	}
	release()
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatalf("reading the rest of the probe: %v", err)
	}
	got.Write(rest)
	if want := openAIRole + openAITok1 + openAITok2 + openAIStop + openAIDone; got.String() != want {
		t.Errorf("probe stream: %s", firstDiff(got.Bytes(), want))
	}
}

// TestBreakAfterFirstTokenCountsAsFailure: a stream reported healthy at its
// first token and broken by the upstream later still counts as a failure:
// one such break opens a breaker set to open after one failure. The early
// report at the first token must not lose the later failure.
func TestBreakAfterFirstTokenCountsAsFailure(t *testing.T) {
	var hits atomic.Int32
	us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, openAIRole+openAITok1) // then the body ends, no [DONE]
	}))
	defer us.Close()
	tg := newTestGatewayWith(t, us.URL, func(c *config.Config) {
		c.Upstreams[0].Breaker.ConsecutiveFailures = 1
	}, func(o *Options) { o.Now = newFakeClock().Now })
	resp, body := post(t, tg.URL+"/v1/chat/completions", streamChat, nil)
	rec := tg.record(t)
	if want := openAIRole + openAITok1 + string(openAIBrokenEvent); resp.StatusCode != http.StatusOK || string(body) != want {
		t.Errorf("caller got %d %q; want the token, then the gateway's error event", resp.StatusCode, body)
	}
	if rec.Interruption != llm.InterruptUpstreamEOF || hits.Load() != 1 {
		t.Errorf("record interruption %s, upstream hits %d; want upstream_eof, 1", rec.Interruption, hits.Load())
	}
	if s := circuitState(t, tg, "mock"); s != metrics.CircuitOpen {
		t.Errorf("circuit state %v after a stream broken after its first token, want open (%d)", s, metrics.CircuitOpen)
	}
	if n := metricValue(t, tg, "tollgate_upstream_circuit_transitions_total",
		map[string]string{"upstream": "mock", "to": "open"}); n != 1 {
		t.Errorf("transitions to open: %v, want 1", n)
	}
}

// TestQuotaDoesNotOpenBreaker: insufficient_quota (a 429 no retry can
// fix) says nothing about the upstream's health, so two of them leave a
// breaker set to open after one failure closed; a plain 500 then opens it.
func TestQuotaDoesNotOpenBreaker(t *testing.T) {
	// With retries possible the error body is read before deciding; on the
	// last attempt (max_attempts 1) it is relayed first and judged after.
	for _, attempts := range []int{3, 1} {
		t.Run(fmt.Sprintf("max_attempts=%d", attempts), func(t *testing.T) { quotaSparesBreaker(t, attempts) })
	}
}

func quotaSparesBreaker(t *testing.T, attempts int) {
	const quota = `{"error":{"message":"You exceeded your current quota.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`
	var hits atomic.Int32
	us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		if hits.Add(1) <= 2 {
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, quota)
			return
		}
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, `{"error":{"message":"boom","type":"server_error","param":null,"code":null}}`)
	}))
	defer us.Close()
	tg := newTestGatewayWith(t, us.URL, func(c *config.Config) {
		u := &c.Upstreams[0]
		fastRetry(u)
		u.Retry.MaxAttempts = attempts
		u.Breaker.ConsecutiveFailures = 1
	}, func(o *Options) { o.Now = newFakeClock().Now })
	for i := range 2 {
		resp, body := post(t, tg.URL+"/v1/chat/completions", plainChat, nil)
		if resp.StatusCode != http.StatusTooManyRequests || string(body) != quota {
			t.Fatalf("quota request %d: %d %q; want the upstream's 429", i+1, resp.StatusCode, body)
		}
		wantAttempts(t, tg.record(t), "mock:429:rate_limited")
		if s := circuitState(t, tg, "mock"); s != metrics.CircuitClosed {
			t.Errorf("circuit state %v after %d quota answers, want closed", s, i+1)
		}
	}
	resp, _ := post(t, tg.URL+"/v1/chat/completions", plainChat, nil)
	tg.record(t)
	if resp.StatusCode != http.StatusInternalServerError {
		t.Errorf("plain failure: %d, want the upstream's 500", resp.StatusCode)
	}
	if s := circuitState(t, tg, "mock"); s != metrics.CircuitOpen {
		t.Errorf("circuit state %v after a 500, want open", s)
	}
	if n := hits.Load(); n != 3 {
		t.Errorf("upstream hits %d, want 3", n)
	}
}

// A half-open probe whose stream breaks before its first token is a failed
// probe: the circuit opens again (the ticket is reported healthy only at the
// first token, not when the stream is committed).
func TestHalfOpenProbeBrokenBeforeTokenReopens(t *testing.T) {
	clk := newFakeClock()
	var hits atomic.Int32
	us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if hits.Add(1) <= 2 {
			w.WriteHeader(500)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, openAIRole) // headers, then the body ends: no token
	}))
	defer us.Close()
	tg := newTestGatewayWith(t, us.URL, func(c *config.Config) {
		u := &c.Upstreams[0]
		u.Retry.MaxAttempts = 1
		u.Breaker.ConsecutiveFailures, u.Breaker.CooldownSeconds, u.Breaker.HalfOpenProbes = 2, 5, 1
	}, func(o *Options) { o.Now = clk.Now })
	post(t, tg.URL+"/v1/chat/completions", plainChat, nil)
	tg.record(t)
	post(t, tg.URL+"/v1/chat/completions", plainChat, nil)
	tg.record(t)
	if s := circuitState(t, tg, "mock"); s != 2 {
		t.Fatalf("circuit state %v after 2 failures in a row, want 2 (open)", s)
	}
	clk.Advance(6 * time.Second)
	resp, _ := post(t, tg.URL+"/v1/chat/completions", streamChat, nil)
	rec := tg.record(t)
	if resp.StatusCode != 200 || rec.AttemptCount != 1 || rec.Attempts[0].Result != resultStreamBroken {
		t.Fatalf("probe: status %d attempts %v, want one stream_broken attempt", resp.StatusCode, attemptList(rec))
	}
	if s := circuitState(t, tg, "mock"); s != 2 {
		t.Errorf("circuit state %v after a probe that broke before its first token, want 2 (open)", s)
	}
}

// TestErrorEventBeforeTokenHealth: an error event before the first token whose type
// is a quota, billing, key or request error is not an outage (the breaker
// stays closed); one of an unknown type is taken for one.
func TestErrorEventBeforeTokenHealth(t *testing.T) {
	for _, c := range []struct {
		typ       string
		wantState float64
	}{
		{"insufficient_quota", metrics.CircuitClosed},
		{"invalid_request_error", metrics.CircuitClosed},
		{"mystery_error", metrics.CircuitOpen},
	} {
		t.Run(c.typ, func(t *testing.T) {
			ev := `data: {"error":{"message":"no","type":"` + c.typ + `","param":null,"code":null}}` + "\n\n"
			us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = io.WriteString(w, openAIRole+ev)
			}))
			defer us.Close()
			tg := newTestGatewayWith(t, us.URL, func(cfg *config.Config) {
				cfg.Upstreams[0].Breaker.ConsecutiveFailures = 1
			}, func(o *Options) { o.Now = newFakeClock().Now })
			resp, body := post(t, tg.URL+"/v1/chat/completions", streamChat, nil)
			rec := tg.record(t)
			if resp.StatusCode != 200 || !strings.Contains(string(body), c.typ) || rec.AttemptCount != 1 {
				t.Fatalf("status %d attempts %v body %q: want the upstream's error event, not retried",
					resp.StatusCode, attemptList(rec), body)
			}
			s := circuitState(t, tg, "mock")
			if s != c.wantState {
				t.Errorf("circuit state %v, want %v", s, c.wantState)
			}
		})
	}
}

// TestHalfOpenProbeCallerLeavesNoVerdict: a half-open probe whose caller gives
// up on a hanging upstream is no verdict: the breaker stays half-open (it
// does not close and flood a dead upstream), and the probe slot is free for
// the next request, whose success closes it.
func TestHalfOpenProbeCallerLeavesNoVerdict(t *testing.T) {
	clk := newFakeClock()
	var hits atomic.Int32
	got := make(chan struct{}, 1)
	us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		switch hits.Add(1) {
		case 1:
			w.WriteHeader(http.StatusInternalServerError)
		case 2: // hangs until the caller leaves
			got <- struct{}{}
			<-r.Context().Done()
		default:
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
		}
	}))
	defer us.Close()
	tg := newTestGatewayWith(t, us.URL, func(c *config.Config) {
		u := &c.Upstreams[0]
		u.Retry.MaxAttempts = 1
		u.Breaker.ConsecutiveFailures, u.Breaker.CooldownSeconds, u.Breaker.HalfOpenProbes = 1, 5, 1
	}, func(o *Options) { o.Now = clk.Now })
	post(t, tg.URL+"/v1/chat/completions", plainChat, nil)
	tg.record(t)
	if s := circuitState(t, tg, "mock"); s != metrics.CircuitOpen {
		t.Fatalf("circuit state %v after a 500, want open", s)
	}
	clk.Advance(6 * time.Second)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, tg.URL+"/v1/chat/completions", strings.NewReader(plainChat))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	await(t, got, "the probe to reach the upstream")
	cancel()
	if err := <-done; err == nil {
		t.Error("the probe's caller had an answer from a hanging upstream")
	}
	if rec := tg.record(t); rec.AttemptCount != 1 || rec.Attempts[0].Result != resultClientGone {
		t.Fatalf("probe attempts %v, want one client_gone", attemptList(rec))
	}
	if s := circuitState(t, tg, "mock"); s != metrics.CircuitHalfOpen {
		t.Fatalf("circuit state %v after the probe's caller left, want half-open (no verdict)", s)
	}
	resp, body := post(t, tg.URL+"/v1/chat/completions", plainChat, nil)
	tg.record(t)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("next request: %d %s; want the probe slot free and the upstream's answer", resp.StatusCode, body)
	}
	if s := circuitState(t, tg, "mock"); s != metrics.CircuitClosed {
		t.Errorf("circuit state %v after a successful probe, want closed", s)
	}
}

// TestPassthrough429SparesBreaker: in passthrough the caller's own
// key goes upstream, so a 429 (a plain rate limit, not a quota) is that
// account's limit: three of them in a row leave a consecutive_failures 2
// breaker closed, and another caller still reaches the upstream. In mode
// "keys" the gateway's own upstream key got the same 429s: they are the
// upstream's trouble and open the breaker.
func TestPassthrough429SparesBreaker(t *testing.T) {
	const rateLimited = `{"error":{"message":"Rate limit reached for gpt-4o-mini","type":"requests","param":null,"code":"rate_limit_exceeded"}}`
	state := func(t *testing.T, tg *testGateway) float64 {
		t.Helper()
		return circuitState(t, tg, "mock")
	}
	edit := func(c *config.Config) {
		u := &c.Upstreams[0]
		u.Retry.MaxAttempts = 1
		u.Breaker = tightBreaker
	}

	t.Run("passthrough", func(t *testing.T) {
		up := newFixedUpstream(http.StatusTooManyRequests, rateLimited, "")
		up.okAuth = "Bearer sk-b"
		us := httptest.NewServer(up)
		defer us.Close()
		tg := newTestGateway(t, us.URL, edit)
		for i := range 3 {
			resp, b := post(t, tg.URL+"/v1/chat/completions", plainChat, map[string]string{"Authorization": "Bearer sk-a"})
			if resp.StatusCode != http.StatusTooManyRequests {
				t.Errorf("sk-a call %d: %d %s, want the upstream's 429", i+1, resp.StatusCode, b)
			}
			wantAttempts(t, tg.record(t), "mock:429:rate_limited")
		}
		if s := state(t, tg); s != metrics.CircuitClosed {
			t.Errorf("circuit state %v after 3 passthrough 429s, want closed", s)
		}
		if n := up.count("Bearer sk-a"); n != 3 {
			t.Errorf("upstream saw %d requests with sk-a, want 3", n)
		}
		resp, b := post(t, tg.URL+"/v1/chat/completions", plainChat, map[string]string{"Authorization": "Bearer sk-b"})
		tg.record(t)
		if resp.StatusCode != http.StatusOK || up.count("Bearer sk-b") != 1 {
			t.Errorf("another caller: %d %s, upstream saw it %d times; want 200 from the upstream", resp.StatusCode, b,
				up.count("Bearer sk-b"))
		}
	})

	t.Run("keys_mode", func(t *testing.T) {
		up := newFixedUpstream(http.StatusTooManyRequests, rateLimited, "")
		us := httptest.NewServer(up)
		defer us.Close()
		tg := newTestGateway(t, us.URL, func(c *config.Config) {
			edit(c)
			c.Auth.Mode = "keys"
			c.Upstreams[0].APIKeyEnv, c.Upstreams[0].APIKey = "UPSTREAM_KEY", upstreamKey
			c.Keys = []config.Key{{Name: "alpha", SHA256: sha(keyAlpha)}, {Name: "beta", SHA256: sha(keyBeta)}}
		})
		for range 2 {
			resp, b := post(t, tg.URL+"/v1/chat/completions", plainChat, map[string]string{"Authorization": "Bearer " + keyAlpha})
			if resp.StatusCode != http.StatusTooManyRequests {
				t.Errorf("alpha: %d %s, want the upstream's 429", resp.StatusCode, b)
			}
			wantAttempts(t, tg.record(t), "mock:429:rate_limited")
		}
		if s := state(t, tg); s != metrics.CircuitOpen {
			t.Errorf("circuit state %v after 2 429s on the gateway's key, want open", s)
		}
		// The only upstream is open: beta's request still goes to it, in
		// bypass, and gets its 429 as it came.
		resp, b := post(t, tg.URL+"/v1/chat/completions", plainChat, map[string]string{"Authorization": "Bearer " + keyBeta})
		rec := tg.record(t)
		wantAttempts(t, rec, "mock:429:rate_limited")
		if resp.StatusCode != http.StatusTooManyRequests || !rec.Attempts[0].BreakerBypass {
			t.Errorf("beta with the circuit open: %d %s, bypass %v; want the upstream's 429, sent in bypass",
				resp.StatusCode, b, rec.Attempts[0].BreakerBypass)
		}
		if n, want := up.count("Bearer "+upstreamKey), 3; n != want || up.requests() != want {
			t.Errorf("upstream saw %d requests (%d with the gateway's key), want %d", up.requests(), n, want)
		}
	})
}

// TestCommittedClientErrorEventSparesBreaker: a stream that relayed a
// token and then carried an error event of a request type
// (invalid_request_error, context_length_exceeded) says nothing of the
// upstream's health: a consecutive_failures 1 breaker stays closed and the
// next request reaches the upstream on an ordinary ticket, whether the
// opening was held (another attempt could follow) or not. A server_error
// event opens it: the next request reaches the only upstream in bypass.
func TestCommittedClientErrorEventSparesBreaker(t *testing.T) {
	for _, attempts := range []int{1, 2} {
		for _, c := range []struct {
			typ, code string
			open      bool
		}{
			{"invalid_request_error", "context_length_exceeded", false},
			{"server_error", "", true},
		} {
			t.Run(c.typ+"/max_attempts="+strconv.Itoa(attempts), func(t *testing.T) {
				up := &rawUpstream{pieces: eventPieces(chunkEvent(`{"role":"assistant","content":""}`),
					chunkEvent(`{"content":"Hello"}`), errorEvent(c.typ, c.code))}
				var hits atomic.Int32
				us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					hits.Add(1)
					up.ServeHTTP(w, r)
				}))
				defer us.Close()
				tg := newTestGatewayWith(t, us.URL, func(cf *config.Config) {
					u := &cf.Upstreams[0]
					u.Retry.MaxAttempts = attempts
					fastRetry(u)
					u.Breaker = tightBreaker
					u.Breaker.ConsecutiveFailures = 1
				}, func(o *Options) { o.Now = newFakeClock().Now })

				resp, b := post(t, tg.URL+"/v1/chat/completions", streamChat, nil)
				rec := tg.record(t)
				if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "Hello") ||
					!strings.Contains(string(b), c.typ) {
					t.Fatalf("caller got %d %q; want the token, then the error event", resp.StatusCode, b)
				}
				if rec.Interruption != llm.InterruptUpstreamErrorEvent || rec.TokenEvents != 1 {
					t.Errorf("record interruption %s, %d tokens; want upstream_error_event after 1 token",
						rec.Interruption, rec.TokenEvents)
				}
				wantAttempts(t, rec, "mock:200:error_event")
				want := float64(metrics.CircuitClosed)
				if c.open {
					want = metrics.CircuitOpen
				}
				if s := circuitState(t, tg, "mock"); s != want {
					t.Errorf("circuit state %v after a committed %s event, want %v", s, c.typ, want)
				}
				// The next request reaches the only upstream either way; with
				// the circuit open it is sent in bypass.
				resp, b = post(t, tg.URL+"/v1/chat/completions", streamChat, nil)
				rec = tg.record(t)
				if resp.StatusCode != http.StatusOK || hits.Load() != 2 {
					t.Errorf("next request: %d %.80q, upstream hits %d; want it to reach the upstream", resp.StatusCode, b, hits.Load())
				}
				wantAttempts(t, rec, "mock:200:error_event")
				if got := rec.Attempts[0].BreakerBypass; got != c.open {
					t.Errorf("next request sent in bypass: %v, want %v (the circuit open)", got, c.open)
				}
			})
		}
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
