package ratelimit

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// localClock is a settable synthetic clock: tests move it to instants lt0..tN
// instead of sleeping.
type localClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *localClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *localClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

var lt0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func newTestLocal(t testing.TB, at time.Time) (*Local, *localClock) {
	t.Helper()
	c := &localClock{t: at}
	l := NewLocal(LocalOptions{Now: c.Now})
	t.Cleanup(func() { _ = l.Close() })
	return l, c
}

func lkey(id string, lim Limits) Subject  { return Subject{Scope: ScopeKey, ID: id, Limits: lim} }
func lteam(id string, lim Limits) Subject { return Subject{Scope: ScopeTeam, ID: id, Limits: lim} }

// findLocalState returns the state of kind k of the subject (scope, id) in sts.
func findLocalState(t *testing.T, sts []State, scope Scope, id string, k Kind) State {
	t.Helper()
	for _, s := range sts {
		if s.Scope == scope && s.ID == id && s.Kind == k {
			return s
		}
	}
	t.Fatalf("no %s %s state for %s in %+v", scope, k, id, sts)
	return State{}
}

func peekLocal(t *testing.T, l *Local, s Subject, k Kind) State {
	t.Helper()
	sts, err := l.Peek(context.Background(), []Subject{s})
	if err != nil {
		t.Fatalf("Peek: %v", err)
	}
	return findLocalState(t, sts, s.Scope, s.ID, k)
}

func ladmit(t *testing.T, l *Local, req Request) Decision {
	t.Helper()
	d, err := l.Admit(context.Background(), req)
	if err != nil {
		t.Fatalf("Admit: %v", err)
	}
	if d.Allowed != (d.Lease != nil) {
		t.Fatalf("Allowed=%v but Lease=%v", d.Allowed, d.Lease)
	}
	return d
}

func lsettle(t *testing.T, l *Local, ls *Lease, tokens, cost int64) {
	t.Helper()
	if err := l.Settle(context.Background(), ls, tokens, cost); err != nil {
		t.Fatalf("Settle: %v", err)
	}
}

func TestLocalRPMBurstThenRefill(t *testing.T) {
	// RPM 3: burst 3, one request refills every 20s.
	s := lkey("k", Limits{RPM: 3})
	l, c := newTestLocal(t, lt0)
	steps := []struct {
		at        time.Duration
		allowed   bool
		retry     time.Duration
		remaining int64
		reset     time.Duration
	}{
		{0, true, 0, 2, 20 * time.Second},
		{0, true, 0, 1, 40 * time.Second},
		{0, true, 0, 0, 60 * time.Second},
		{0, false, 20 * time.Second, 0, 60 * time.Second},
		{19 * time.Second, false, time.Second, 0, 41 * time.Second},
		{20 * time.Second, true, 0, 0, 60 * time.Second},
		{50 * time.Second, true, 0, 0, 50 * time.Second},
		{100 * time.Second, true, 0, 2, 20 * time.Second}, // full again: a fresh burst
		{100 * time.Second, true, 0, 1, 40 * time.Second},
	}
	for i, st := range steps {
		c.Set(lt0.Add(st.at))
		d := ladmit(t, l, Request{Subjects: []Subject{s}})
		if d.Allowed != st.allowed || d.RetryAfter != st.retry {
			t.Fatalf("step %d at lt0+%v: allowed=%v retry=%v, want %v %v", i, st.at, d.Allowed, d.RetryAfter, st.allowed, st.retry)
		}
		rpm := findLocalState(t, d.States, ScopeKey, "k", KindRPM)
		if rpm.Remaining != st.remaining || rpm.Reset != st.reset || rpm.Limit != 3 || rpm.Used != 3-st.remaining {
			t.Fatalf("step %d: state %+v, want remaining %d reset %v", i, rpm, st.remaining, st.reset)
		}
		if !d.Allowed && (d.Refused.Kind != KindRPM || d.Refused.Scope != ScopeKey) {
			t.Fatalf("step %d: refused by %+v, want key rpm", i, d.Refused)
		}
	}
}

func TestLocalTPMReserveSettle(t *testing.T) {
	// TPM 600: one token refills every 100ms.
	s := lkey("k", Limits{TPM: 600})
	l, c := newTestLocal(t, lt0)
	var leases []*Lease
	steps := []struct {
		name      string
		at        time.Duration
		admit     int64 // tokens to admit, or -1 for a settle
		settle    int   // lease index to settle
		actual    int64
		allowed   bool
		retry     time.Duration
		remaining int64
		reset     time.Duration
	}{
		{name: "reserve 300", admit: 300, allowed: true, remaining: 300, reset: 30 * time.Second},
		{name: "refund 200", admit: -1, settle: 0, actual: 100, remaining: 500, reset: 10 * time.Second},
		{name: "reserve rest", admit: 500, allowed: true, remaining: 0, reset: 60 * time.Second},
		{name: "empty bucket refuses", admit: 100, retry: 10 * time.Second, remaining: 0, reset: 60 * time.Second},
		{name: "debt 300", admit: -1, settle: 1, actual: 800, remaining: 0, reset: 90 * time.Second},
		{name: "debt waits", at: 30 * time.Second, admit: 100, retry: 10 * time.Second, remaining: 0, reset: 60 * time.Second},
		{name: "debt paid", at: 40 * time.Second, admit: 100, allowed: true, remaining: 0, reset: 60 * time.Second},
		{name: "full", at: 100 * time.Second, admit: 300, allowed: true, remaining: 300, reset: 30 * time.Second},
		// A refund never fills the bucket beyond full.
		{name: "late refund", at: 140 * time.Second, admit: -1, settle: 3, actual: 0, remaining: 600, reset: 0},
		{name: "burst after refund", at: 140 * time.Second, admit: 600, allowed: true, remaining: 0, reset: 60 * time.Second},
		{name: "nothing above full", at: 140 * time.Second, admit: 1, retry: 100 * time.Millisecond, remaining: 0, reset: 60 * time.Second},
	}
	for _, st := range steps {
		c.Set(lt0.Add(st.at))
		var tpm State
		if st.admit >= 0 {
			d := ladmit(t, l, Request{Subjects: []Subject{s}, Tokens: st.admit})
			if d.Allowed != st.allowed || d.RetryAfter != st.retry {
				t.Fatalf("%s: allowed=%v retry=%v, want %v %v", st.name, d.Allowed, d.RetryAfter, st.allowed, st.retry)
			}
			if d.Allowed {
				leases = append(leases, d.Lease)
			}
			tpm = findLocalState(t, d.States, ScopeKey, "k", KindTPM)
		} else {
			lsettle(t, l, leases[st.settle], st.actual, 0)
			tpm = peekLocal(t, l, s, KindTPM)
		}
		if tpm.Remaining != st.remaining || tpm.Reset != st.reset {
			t.Fatalf("%s: tpm %+v, want remaining %d reset %v", st.name, tpm, st.remaining, st.reset)
		}
	}
}

func TestLocalTPMOversizedEstimateIsClamped(t *testing.T) {
	// An estimate above the TPM limit reserves the whole bucket instead of
	// being refused forever; the real usage is charged as debt on Settle.
	s := lkey("k", Limits{TPM: 100}) // 600ms per token
	l, c := newTestLocal(t, lt0)
	d := ladmit(t, l, Request{Subjects: []Subject{s}, Tokens: 500})
	if !d.Allowed {
		t.Fatalf("oversized estimate refused: %+v", d)
	}
	if st := findLocalState(t, d.States, ScopeKey, "k", KindTPM); st.Remaining != 0 || st.Reset != time.Minute {
		t.Fatalf("after clamped reservation: %+v, want remaining 0 reset 1m", st)
	}
	lsettle(t, l, d.Lease, 500, 0) // 400 beyond the 100 reserved: 4 minutes of debt
	if st := peekLocal(t, l, s, KindTPM); st.Reset != 5*time.Minute || st.Used != 500 {
		t.Fatalf("after debt: %+v, want reset 5m used 500", st)
	}
	d = ladmit(t, l, Request{Subjects: []Subject{s}, Tokens: 1})
	if d.Allowed || d.RetryAfter != 4*time.Minute+600*time.Millisecond {
		t.Fatalf("in debt: allowed=%v retry=%v, want refused 4m0.6s", d.Allowed, d.RetryAfter)
	}
	// A full bucket admits an oversized estimate again.
	c.Set(lt0.Add(5 * time.Minute))
	if d := ladmit(t, l, Request{Subjects: []Subject{s}, Tokens: 10_000}); !d.Allowed {
		t.Fatalf("full bucket refused an oversized estimate: %+v", d)
	}
}

func TestLocalRetryAfterExact(t *testing.T) {
	cases := []struct {
		name   string
		lim    Limits
		tokens int64
		debt   int64 // settle the first lease with this many tokens
	}{
		{"rpm 7", Limits{RPM: 7}, 0, 0},
		{"rpm 1", Limits{RPM: 1}, 0, 0},
		{"rpm 1000", Limits{RPM: 1000}, 0, 0},
		{"tpm 1000 by 333", Limits{TPM: 1000}, 333, 0},
		{"tpm 7 by 3", Limits{TPM: 7}, 3, 0},
		{"tpm 90000 by 4097", Limits{TPM: 90000}, 4097, 0},
		{"tpm 1000 in debt", Limits{TPM: 1000}, 100, 2500},
		{"rpm and tpm", Limits{RPM: 5, TPM: 1000}, 150, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l, c := newTestLocal(t, lt0)
			req := Request{Subjects: []Subject{lkey("k", tc.lim)}, Tokens: tc.tokens}
			var d Decision
			for i := 0; i < 10_000; i++ {
				if d = ladmit(t, l, req); !d.Allowed {
					break
				}
				if i == 0 && tc.debt > 0 {
					lsettle(t, l, d.Lease, tc.debt, 0)
				}
			}
			if d.Allowed {
				t.Fatal("never refused")
			}
			r := d.RetryAfter
			if r <= 0 || (tc.debt == 0 && r > time.Minute) {
				t.Fatalf("RetryAfter %v: want in (0, 1m]", r)
			}
			c.Set(lt0.Add(r - 1))
			if d := ladmit(t, l, req); d.Allowed || d.RetryAfter != 1 {
				t.Fatalf("at now+RetryAfter-1ns: allowed=%v retry=%v, want refused 1ns", d.Allowed, d.RetryAfter)
			}
			c.Set(lt0.Add(r))
			if d := ladmit(t, l, req); !d.Allowed {
				t.Fatalf("at now+RetryAfter: refused %+v (retry %v)", d.Refused, d.RetryAfter)
			}
		})
	}
}

func TestLocalKeyAndTeamAtomic(t *testing.T) {
	l, _ := newTestLocal(t, lt0)
	k := lkey("k", Limits{RPM: 10, TPM: 1000})
	tm := lteam("t", Limits{RPM: 2, TPM: 100_000})
	req := Request{Subjects: []Subject{k, tm}, Tokens: 100}
	for i := range 2 {
		d := ladmit(t, l, req)
		if !d.Allowed {
			t.Fatalf("request %d refused: %+v", i, d.Refused)
		}
		if len(d.States) != 4 {
			t.Fatalf("States: %d, want rpm and tpm of key and team: %+v", len(d.States), d.States)
		}
	}
	// The team's RPM refuses; the key must not be charged.
	d := ladmit(t, l, req)
	if d.Allowed || d.Refused.Scope != ScopeTeam || d.Refused.Kind != KindRPM || d.Refused.ID != "t" {
		t.Fatalf("want refusal by team rpm, got allowed=%v %+v", d.Allowed, d.Refused)
	}
	if st := findLocalState(t, d.States, ScopeKey, "k", KindRPM); st.Remaining != 8 {
		t.Fatalf("key rpm after team refusal: %+v, want remaining 8", st)
	}
	if st := findLocalState(t, d.States, ScopeKey, "k", KindTPM); st.Remaining != 800 {
		t.Fatalf("key tpm after team refusal: %+v, want remaining 800", st)
	}

	// The key's TPM refuses; the team must not be charged.
	l2, _ := newTestLocal(t, lt0)
	big := Request{Subjects: []Subject{k, lteam("t", Limits{RPM: 100, TPM: 100_000})}, Tokens: 900}
	if d := ladmit(t, l2, big); !d.Allowed {
		t.Fatalf("first refused: %+v", d.Refused)
	}
	d = ladmit(t, l2, big)
	if d.Allowed || d.Refused.Scope != ScopeKey || d.Refused.Kind != KindTPM {
		t.Fatalf("want refusal by key tpm, got allowed=%v %+v", d.Allowed, d.Refused)
	}
	if st := findLocalState(t, d.States, ScopeTeam, "t", KindTPM); st.Remaining != 100_000-900 {
		t.Fatalf("team tpm after key refusal: %+v, want remaining %d", st, 100_000-900)
	}
	if st := findLocalState(t, d.States, ScopeTeam, "t", KindRPM); st.Remaining != 99 {
		t.Fatalf("team rpm after key refusal: %+v, want remaining 99", st)
	}
}

func TestLocalLongestRefusalWins(t *testing.T) {
	// Key RPM 1 waits 60s, team TPM waits 6s: a retry must wait for both.
	l, _ := newTestLocal(t, lt0)
	req := Request{Subjects: []Subject{lkey("k", Limits{RPM: 1}), lteam("t", Limits{TPM: 100})}, Tokens: 90}
	if d := ladmit(t, l, req); !d.Allowed {
		t.Fatalf("first refused: %+v", d.Refused)
	}
	d := ladmit(t, l, req)
	if d.Allowed || d.RetryAfter != time.Minute || d.Refused.Kind != KindRPM {
		t.Fatalf("got allowed=%v retry=%v refused=%+v, want rpm 1m", d.Allowed, d.RetryAfter, d.Refused)
	}
}

func TestLocalConcurrencyAndSettleOnce(t *testing.T) {
	l, _ := newTestLocal(t, lt0)
	s := lkey("k", Limits{Concurrency: 2, TPM: 1000})
	req := Request{Subjects: []Subject{s}, Tokens: 100}
	a, b := ladmit(t, l, req), ladmit(t, l, req)
	if !a.Allowed || !b.Allowed {
		t.Fatal("first two refused")
	}
	d := ladmit(t, l, req)
	if d.Allowed || d.Refused.Kind != KindConcurrency || d.RetryAfter != ConcurrencyRetryAfter || d.Refused.Used != 2 {
		t.Fatalf("third: allowed=%v refused=%+v retry=%v, want concurrency refusal", d.Allowed, d.Refused, d.RetryAfter)
	}
	lsettle(t, l, a.Lease, 40, 0)
	tpm := peekLocal(t, l, s, KindTPM)
	lsettle(t, l, a.Lease, 40, 0) // a second Settle does nothing
	lsettle(t, l, a.Lease, 0, 0)
	if got := peekLocal(t, l, s, KindTPM); got != tpm {
		t.Fatalf("repeated Settle changed tpm: %+v, was %+v", got, tpm)
	}
	if got := peekLocal(t, l, s, KindConcurrency); got.Used != 1 || got.Remaining != 1 {
		t.Fatalf("after settling one lease three times: %+v, want used 1", got)
	}
	c := ladmit(t, l, req)
	if !c.Allowed {
		t.Fatalf("released slot not reusable: %+v", c.Refused)
	}
	if d := ladmit(t, l, req); d.Allowed {
		t.Fatal("cap exceeded after a repeated Settle")
	}
	lsettle(t, l, b.Lease, 0, 0)
	lsettle(t, l, c.Lease, 0, 0)
	if got := peekLocal(t, l, s, KindConcurrency); got.Used != 0 || got.Remaining != 2 {
		t.Fatalf("all settled: %+v", got)
	}
}

func TestLocalCancelledRequestSettlesSoFar(t *testing.T) {
	l, _ := newTestLocal(t, lt0)
	s := lkey("k", Limits{TPM: 6000, TokensPerDay: 10_000, CostPerDayMicros: 1_000_000, Concurrency: 1})
	d := ladmit(t, l, Request{Subjects: []Subject{s}, Tokens: 4000, CostMicros: 400_000})
	if !d.Allowed {
		t.Fatalf("refused: %+v", d.Refused)
	}
	// The client went away after 37 tokens; the context of the request is
	// cancelled and is what the caller hands to Settle.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.Settle(ctx, d.Lease, 37, 3_700); err != nil {
		t.Fatalf("Settle with a cancelled context: %v", err)
	}
	sts, err := l.Peek(context.Background(), []Subject{s})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct {
		k    Kind
		used int64
	}{{KindTPM, 37}, {KindTokensPerDay, 37}, {KindCostPerDay, 3_700}, {KindConcurrency, 0}} {
		if got := findLocalState(t, sts, ScopeKey, "k", want.k); got.Used != want.used {
			t.Errorf("%s: used %d, want %d", want.k, got.Used, want.used)
		}
	}
}

func TestLocalBudgetAcrossMidnight(t *testing.T) {
	day1 := time.Date(2026, 11, 30, 23, 59, 59, 0, time.UTC)
	day2 := time.Date(2026, 12, 1, 0, 0, 1, 0, time.UTC)
	s := lkey("k", Limits{TokensPerDay: 1000, CostPerMonthMicros: 5_000})
	l, c := newTestLocal(t, day1)

	a := ladmit(t, l, Request{Subjects: []Subject{s}, Tokens: 400, CostMicros: 1_000})
	if !a.Allowed {
		t.Fatalf("refused: %+v", a.Refused)
	}
	if st := peekLocal(t, l, s, KindTokensPerDay); st.Used != 0 || st.Reserved != 400 || st.Remaining != 600 || st.Reset != time.Second {
		t.Fatalf("day 1: %+v, want reserved 400 reset 1s", st)
	}
	if st := peekLocal(t, l, s, KindCostPerMonth); st.Reserved != 1_000 || st.Reset != time.Second {
		t.Fatalf("november: %+v, want reserved 1000 reset 1s", st)
	}

	c.Set(day2)
	if st := peekLocal(t, l, s, KindTokensPerDay); st.Used != 0 || st.Reserved != 0 || st.Reset != 24*time.Hour-time.Second {
		t.Fatalf("day 2 before any request: %+v", st)
	}
	b := ladmit(t, l, Request{Subjects: []Subject{s}, Tokens: 300, CostMicros: 500})
	if !b.Allowed {
		t.Fatalf("new day refused: %+v", b.Refused)
	}
	// The lease admitted at 23:59:59 belongs to November 30: settling it
	// with far more than reserved leaves December 1 alone.
	lsettle(t, l, a.Lease, 900, 4_000)
	if st := peekLocal(t, l, s, KindTokensPerDay); st.Used != 0 || st.Reserved != 300 {
		t.Fatalf("day 2 after settling a day-1 lease: %+v, want reserved 300", st)
	}
	if st := peekLocal(t, l, s, KindCostPerMonth); st.Used != 0 || st.Reserved != 500 {
		t.Fatalf("december after settling a november lease: %+v, want reserved 500", st)
	}
	lsettle(t, l, b.Lease, 100, 200)
	if st := peekLocal(t, l, s, KindTokensPerDay); st.Used != 100 || st.Reserved != 0 {
		t.Fatalf("day 2 after its own settle: %+v, want used 100", st)
	}
	if st := peekLocal(t, l, s, KindCostPerMonth); st.Used != 200 || st.Reserved != 0 {
		t.Fatalf("december after its own settle: %+v, want used 200", st)
	}
}

func TestLocalBudgetSettleAfterMidnightBeforeNewDay(t *testing.T) {
	// No request has opened the new day yet when the day-1 lease settles:
	// its excess lands in day 1, and day 2 starts empty.
	day1 := time.Date(2026, 11, 30, 23, 59, 59, 0, time.UTC)
	s := lkey("k", Limits{TokensPerDay: 1000})
	l, c := newTestLocal(t, day1)
	a := ladmit(t, l, Request{Subjects: []Subject{s}, Tokens: 100})
	c.Set(day1.Add(2 * time.Second))
	lsettle(t, l, a.Lease, 1000, 0)
	if st := peekLocal(t, l, s, KindTokensPerDay); st.Used != 0 {
		t.Fatalf("day 2: %+v, want used 0", st)
	}
	if d := ladmit(t, l, Request{Subjects: []Subject{s}, Tokens: 1000}); !d.Allowed {
		t.Fatalf("day 2 refused a full-budget request: %+v", d.Refused)
	}
}

// TestLocalBudgetRetryAfterIsWindowEnd: a spent budget (requests settled
// with their estimates until the settled usage reached the limit) waits for
// the end of its window.
func TestLocalBudgetRetryAfterIsWindowEnd(t *testing.T) {
	cases := []struct {
		name  string
		at    time.Time
		lim   Limits
		req   Request // admitted and settled with its estimate until refused
		kind  Kind
		retry time.Duration
	}{
		{"tokens per day", time.Date(2026, 11, 30, 18, 0, 0, 0, time.UTC),
			Limits{TokensPerDay: 1000}, Request{Tokens: 400}, KindTokensPerDay, 6 * time.Hour},
		{"cost per day", time.Date(2026, 11, 30, 23, 30, 0, 5, time.UTC),
			Limits{CostPerDayMicros: 5_000_000}, Request{CostMicros: 2_000_000}, KindCostPerDay, 30*time.Minute - 5},
		{"cost per month, february", time.Date(2026, 2, 27, 12, 0, 0, 0, time.UTC),
			Limits{CostPerMonthMicros: 1_000}, Request{CostMicros: 300}, KindCostPerMonth, 36 * time.Hour},
		{"cost per month, december", time.Date(2026, 12, 31, 23, 0, 0, 0, time.UTC),
			Limits{CostPerMonthMicros: 1_000}, Request{CostMicros: 300}, KindCostPerMonth, time.Hour},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l, _ := newTestLocal(t, tc.at)
			req := tc.req
			req.Subjects = []Subject{lteam("t", tc.lim)}
			var d Decision
			n := 0
			for ; n < 100; n++ {
				if d = ladmit(t, l, req); !d.Allowed {
					break
				}
				lsettle(t, l, d.Lease, req.Tokens, req.CostMicros)
			}
			if d.Allowed || d.Refused.Kind != tc.kind || !d.Refused.Spent() || d.RetryAfter != tc.retry || d.Refused.Reset != tc.retry {
				t.Fatalf("after %d: allowed=%v refused=%+v retry=%v, want %s %v", n, d.Allowed, d.Refused, d.RetryAfter, tc.kind, tc.retry)
			}
		})
	}
}

func TestLocalZeroLimitsUnlimited(t *testing.T) {
	l, _ := newTestLocal(t, lt0)
	s := lkey("k", Limits{})
	for i := range 1000 {
		d := ladmit(t, l, Request{Subjects: []Subject{s}, Tokens: 1 << 40, CostMicros: 1 << 40})
		if !d.Allowed || len(d.States) != 0 {
			t.Fatalf("request %d: allowed=%v states=%v", i, d.Allowed, d.States)
		}
	}
	sts, err := l.Peek(context.Background(), []Subject{s})
	if err != nil || len(sts) != 0 {
		t.Fatalf("Peek of an unlimited subject: %v %v", sts, err)
	}
}

func TestLocalPeekEveryLimit(t *testing.T) {
	l, _ := newTestLocal(t, lt0)
	all := lkey("k", Limits{RPM: 1, TPM: 2, Concurrency: 3, TokensPerDay: 4, CostPerDayMicros: 5, CostPerMonthMicros: 6})
	one := lteam("t", Limits{TPM: 9})
	sts, err := l.Peek(context.Background(), []Subject{all, one})
	if err != nil {
		t.Fatal(err)
	}
	want := []State{
		{ScopeKey, "k", KindRPM, 1, 0, 0, 1, 0},
		{ScopeKey, "k", KindTPM, 2, 0, 0, 2, 0},
		{ScopeKey, "k", KindConcurrency, 3, 0, 0, 3, 0},
		{ScopeKey, "k", KindTokensPerDay, 4, 0, 0, 4, 12 * time.Hour},
		{ScopeKey, "k", KindCostPerDay, 5, 0, 0, 5, 12 * time.Hour},
		{ScopeKey, "k", KindCostPerMonth, 6, 0, 0, 6, 12 * time.Hour},
		{ScopeTeam, "t", KindTPM, 9, 0, 0, 9, 0},
	}
	if len(sts) != len(want) {
		t.Fatalf("Peek: %d states, want %d: %+v", len(sts), len(want), sts)
	}
	for i := range want {
		if sts[i] != want[i] {
			t.Errorf("state %d: %+v, want %+v", i, sts[i], want[i])
		}
	}
	if l.subjects[subjectKey{ScopeKey, "k"}] != nil {
		t.Error("Peek created state")
	}
}

func TestLocalLeaseIDsUnique(t *testing.T) {
	l, _ := newTestLocal(t, lt0)
	seen := make(map[string]bool)
	for range 1000 {
		d := ladmit(t, l, Request{Subjects: []Subject{lkey("k", Limits{})}})
		if d.Lease.ID == "" || seen[d.Lease.ID] {
			t.Fatalf("lease ID %q empty or repeated", d.Lease.ID)
		}
		seen[d.Lease.ID] = true
		lsettle(t, l, d.Lease, 0, 0)
	}
}

func TestLocalLeaseOwnsItsSubjects(t *testing.T) {
	// The caller may reuse its Subjects slice after Admit.
	l, _ := newTestLocal(t, lt0)
	subs := []Subject{lkey("k", Limits{Concurrency: 1}), lteam("t", Limits{Concurrency: 1}), lteam("u", Limits{Concurrency: 1})}
	d := ladmit(t, l, Request{Subjects: subs})
	subs[0], subs[1], subs[2] = lkey("x", Limits{}), lkey("y", Limits{}), lkey("z", Limits{})
	lsettle(t, l, d.Lease, 0, 0)
	if d := ladmit(t, l, Request{Subjects: []Subject{lkey("k", Limits{Concurrency: 1}), lteam("u", Limits{Concurrency: 1})}}); !d.Allowed {
		t.Fatalf("slot not released after the caller reused its slice: %+v", d.Refused)
	}
}

func TestLocalEviction(t *testing.T) {
	c := &localClock{t: lt0}
	l := NewLocal(LocalOptions{Now: c.Now, MaxSubjects: 2})
	defer l.Close()
	has := func(s Subject) bool { return l.subjects[subjectKey{s.Scope, s.ID}] != nil }
	touch := func(id string) { // a subject that leaves nothing behind
		d := ladmit(t, l, Request{Subjects: []Subject{lkey(id, Limits{})}})
		lsettle(t, l, d.Lease, 0, 0)
	}

	open := lkey("open", Limits{Concurrency: 1})
	held := ladmit(t, l, Request{Subjects: []Subject{open}})
	idle := lkey("idle", Limits{RPM: 100})
	d := ladmit(t, l, Request{Subjects: []Subject{idle}})
	lsettle(t, l, d.Lease, 0, 0)
	debtor := lkey("debtor", Limits{TPM: 60})
	d = ladmit(t, l, Request{Subjects: []Subject{debtor}, Tokens: 1})
	lsettle(t, l, d.Lease, 600, 0) // ten minutes of debt

	// idle's RPM bucket refills within a second; open and debtor are
	// protected.
	c.Set(lt0.Add(time.Second))
	touch("new")
	if has(idle) || !has(open) || !has(debtor) {
		t.Fatalf("after insert: idle=%v open=%v debtor=%v, want only idle evicted", has(idle), has(open), has(debtor))
	}
	if d := ladmit(t, l, Request{Subjects: []Subject{debtor}, Tokens: 1}); d.Allowed {
		t.Fatal("debt forgotten")
	}
	if d := ladmit(t, l, Request{Subjects: []Subject{open}}); d.Allowed {
		t.Fatal("open lease forgotten")
	}
	lsettle(t, l, held.Lease, 0, 0)
	if d := ladmit(t, l, Request{Subjects: []Subject{open}}); !d.Allowed {
		t.Fatalf("slot not released: %+v", d.Refused)
	} else {
		lsettle(t, l, d.Lease, 0, 0)
	}

	// Budget usage in the current day is protected too; once the window
	// ends and the debt is paid, everything idle goes.
	spender := lkey("spender", Limits{TokensPerDay: 100})
	d = ladmit(t, l, Request{Subjects: []Subject{spender}, Tokens: 100})
	lsettle(t, l, d.Lease, 100, 0)
	for i := range 4 {
		touch(string(rune('a' + i)))
	}
	if !has(spender) || !has(debtor) {
		t.Fatalf("spender=%v debtor=%v, want both kept", has(spender), has(debtor))
	}
	if d := ladmit(t, l, Request{Subjects: []Subject{spender}, Tokens: 1}); d.Allowed {
		t.Fatal("budget usage forgotten")
	}
	c.Set(lt0.Add(24 * time.Hour))
	for i := range 8 {
		touch(string(rune('p' + i)))
	}
	if len(l.subjects) > 2 {
		t.Fatalf("%d subjects kept, bound 2", len(l.subjects))
	}
}

func TestLocalClosed(t *testing.T) {
	l, _ := newTestLocal(t, lt0)
	d := ladmit(t, l, Request{Subjects: []Subject{lkey("k", Limits{RPM: 1})}})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Admit(context.Background(), Request{}); !errors.Is(err, ErrClosed) {
		t.Errorf("Admit after Close: %v", err)
	}
	if err := l.Settle(context.Background(), d.Lease, 0, 0); !errors.Is(err, ErrClosed) {
		t.Errorf("Settle after Close: %v", err)
	}
	if _, err := l.Peek(context.Background(), nil); !errors.Is(err, ErrClosed) {
		t.Errorf("Peek after Close: %v", err)
	}
	if err := l.Settle(context.Background(), nil, 0, 0); err == nil {
		t.Error("Settle of a nil lease: no error")
	}
}

func TestLocalConcurrentUse(t *testing.T) {
	const workers, iterations = 4, 200

	t.Run("burst", func(t *testing.T) {
		// The clock stands still: exactly one burst may pass.
		l, _ := newTestLocal(t, lt0)
		req := Request{Subjects: []Subject{lkey("k", Limits{RPM: 50}), lteam("t", Limits{RPM: 1000, TPM: 1_000_000})}, Tokens: 10}
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for range iterations {
					d, err := l.Admit(context.Background(), req)
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						admitted.Add(1)
						_ = l.Settle(context.Background(), d.Lease, 10, 0)
					}
				}
			})
		}
		wg.Wait()
		if got := admitted.Load(); got != 50 {
			t.Fatalf("admitted %d in one instant, want the burst of 50", got)
		}
	})

	t.Run("concurrency cap", func(t *testing.T) {
		c := &localClock{t: lt0}
		l := NewLocal(LocalOptions{Now: c.Now})
		defer l.Close()
		const limit = 3
		req := Request{Subjects: []Subject{lkey("k", Limits{Concurrency: 10}), lteam("t", Limits{Concurrency: limit})}}
		var inflight, peak, admitted atomic.Int64
		var wg sync.WaitGroup
		for range workers + 2 {
			wg.Go(func() {
				for range iterations {
					d, err := l.Admit(context.Background(), req)
					if err != nil {
						t.Error(err)
						return
					}
					if !d.Allowed {
						runtime.Gosched()
						continue
					}
					admitted.Add(1)
					n := inflight.Add(1)
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					runtime.Gosched()
					inflight.Add(-1)
					if err := l.Settle(context.Background(), d.Lease, 0, 0); err != nil {
						t.Error(err)
					}
				}
			})
		}
		wg.Wait()
		if p := peak.Load(); p > limit || p < 1 || admitted.Load() == 0 {
			t.Fatalf("peak in flight %d (admitted %d), cap %d", p, admitted.Load(), limit)
		}
		sts, _ := l.Peek(context.Background(), req.Subjects)
		if st := findLocalState(t, sts, ScopeTeam, "t", KindConcurrency); st.Used != 0 {
			t.Fatalf("slots left open: %+v", st)
		}
	})
}

// TestLocalSeed: usage seeded at startup counts against the budgets of its
// day and month, adds up, leaves other days alone, and keeps its subject
// from eviction while its windows run.
func TestLocalSeed(t *testing.T) {
	c := &localClock{t: lt0}
	l := NewLocal(LocalOptions{Now: c.Now, MaxSubjects: 1})
	defer l.Close()
	lim := Limits{TokensPerDay: 1000, CostPerDayMicros: 5000, CostPerMonthMicros: 8000}
	team := lteam("seeded", lim)
	yesterday := lteam("yesterday", lim)

	l.Seed(team, lt0.Add(-time.Hour), 600, 1000, 6000)
	l.Seed(team, lt0, 300, 3000, 1000) // adds to the same windows
	l.Seed(yesterday, lt0.Add(-24*time.Hour), 1000, 5000, 0)
	l.Seed(team, lt0.Add(-24*time.Hour), 1000, 5000, 0) // an ended day: ignored
	for _, w := range []struct {
		s    Subject
		k    Kind
		used int64
	}{
		{team, KindTokensPerDay, 900}, {team, KindCostPerDay, 4000}, {team, KindCostPerMonth, 7000},
		{yesterday, KindTokensPerDay, 0}, {yesterday, KindCostPerDay, 0},
	} {
		if st := peekLocal(t, l, w.s, w.k); st.Used != w.used || st.Remaining != lim.Get(w.k)-w.used {
			t.Fatalf("%s %s after Seed: %+v, want used %d", w.s.ID, w.k, st, w.used)
		}
	}

	// Busy subjects come and go; the seeded one stays (MaxSubjects 1).
	for i := range 5 {
		d := ladmit(t, l, Request{Subjects: []Subject{lkey(string(rune('a'+i)), Limits{})}})
		lsettle(t, l, d.Lease, 0, 0)
	}
	if l.subjects[subjectKey{ScopeTeam, "seeded"}] == nil {
		t.Fatal("a subject holding seeded usage was evicted")
	}

	// 100 tokens are left today: a request reserves them and the day is
	// then spent until midnight.
	d := ladmit(t, l, Request{Subjects: []Subject{team}, Tokens: 500, CostMicros: 500})
	if !d.Allowed {
		t.Fatalf("seeded budget with room refused: %+v", d)
	}
	lsettle(t, l, d.Lease, 100, 500)
	d = ladmit(t, l, Request{Subjects: []Subject{team}, Tokens: 1})
	if d.Allowed || d.Refused.Kind != KindTokensPerDay || d.RetryAfter != 12*time.Hour {
		t.Fatalf("spent seeded day: %+v, want tokens_per_day refused for 12h", d)
	}
	if d := ladmit(t, l, Request{Subjects: []Subject{yesterday}, Tokens: 1000, CostMicros: 5000}); !d.Allowed {
		t.Fatalf("yesterday's seed refused today: %+v", d)
	}

	// The next day (the next month too: lt0 is November 30) starts empty.
	c.Set(lt0.Add(12 * time.Hour))
	for _, k := range []Kind{KindTokensPerDay, KindCostPerDay, KindCostPerMonth} {
		if st := peekLocal(t, l, team, k); st.Used != 0 {
			t.Fatalf("%s on December 1: %+v, want 0", k, st)
		}
	}
}

// TestLocalChargeRatesRebuildsTheBuckets: a limiter charged, at a restart,
// with what another admitted (each request at its admission instant, its
// real tokens) holds the same RPM and TPM state and refuses what the other
// refuses: no fresh burst.
func TestLocalChargeRatesRebuildsTheBuckets(t *testing.T) {
	key := lkey("k", Limits{RPM: 10, TPM: 1000})
	team := lteam("t", Limits{RPM: 6})
	live, c := newTestLocal(t, lt0)
	type admitted struct {
		at     time.Time
		tokens int64
	}
	var log []admitted
	for i := range 40 {
		c.Set(lt0.Add(time.Duration(i) * 700 * time.Millisecond))
		tokens := int64(40 + i)
		d := ladmit(t, live, Request{Subjects: []Subject{key, team}, Tokens: tokens})
		if d.Allowed {
			lsettle(t, live, d.Lease, tokens, 0)
			log = append(log, admitted{d.Lease.At, tokens})
		}
	}
	if len(log) == 0 || len(log) == 40 {
		t.Fatalf("%d of 40 admitted: the test needs some of each", len(log))
	}
	restart := lt0.Add(40 * 700 * time.Millisecond)
	c.Set(restart)
	restored, rc := newTestLocal(t, restart)
	for _, a := range log {
		restored.ChargeRates(key, a.at, 1, a.tokens)
		restored.ChargeRates(team, a.at, 1, a.tokens) // the team has no TPM: its tokens change nothing
	}
	for _, w := range []struct {
		s Subject
		k Kind
	}{{key, KindRPM}, {key, KindTPM}, {team, KindRPM}} {
		if got, want := peekLocal(t, restored, w.s, w.k), peekLocal(t, live, w.s, w.k); got != want {
			t.Fatalf("%s %s restored %+v, live %+v", w.s.ID, w.k, got, want)
		}
	}
	refused := 0
	for i := range 20 {
		at := restart.Add(time.Duration(i) * time.Second)
		c.Set(at)
		rc.Set(at)
		d1 := ladmit(t, live, Request{Subjects: []Subject{key, team}, Tokens: 50})
		d2 := ladmit(t, restored, Request{Subjects: []Subject{key, team}, Tokens: 50})
		if d1.Allowed != d2.Allowed || d1.RetryAfter != d2.RetryAfter {
			t.Fatalf("%v after the restart: live allowed %v (retry %v), restored %v (retry %v)",
				at.Sub(restart), d1.Allowed, d1.RetryAfter, d2.Allowed, d2.RetryAfter)
		}
		if !d1.Allowed {
			refused++
		}
	}
	if refused == 0 || refused == 20 {
		t.Fatalf("%d of 20 refused after the restart: the test needs some of each", refused)
	}
}

// TestLocalChargeRatesOutOfOrder: charges out of order leave a bucket no
// fuller than in order; a charge older than the bucket's refill leaves it
// full and its subject evictable; nothing happens without rate limits,
// with nothing to charge, or after Close.
func TestLocalChargeRatesOutOfOrder(t *testing.T) {
	s := lkey("k", Limits{RPM: 6}) // one request refills every 10 s
	now := lt0.Add(time.Minute)
	inOrder, _ := newTestLocal(t, now)
	reversed, _ := newTestLocal(t, now)
	ats := []time.Duration{0, 5 * time.Second, 20 * time.Second, 50 * time.Second, 55 * time.Second}
	for i := range ats {
		inOrder.ChargeRates(s, lt0.Add(ats[i]), 1, 0)
		reversed.ChargeRates(s, lt0.Add(ats[len(ats)-1-i]), 1, 0)
	}
	a, b := peekLocal(t, inOrder, s, KindRPM), peekLocal(t, reversed, s, KindRPM)
	// In order: TATs 10, 20, 30, 60, 70 s after lt0, i.e. 10 s after now.
	if a.Reset != 10*time.Second || b.Remaining > a.Remaining || b.Reset < a.Reset {
		t.Fatalf("in order %+v (want reset 10s), reversed %+v (want no more remaining)", a, b)
	}

	c := &localClock{t: now}
	l := NewLocal(LocalOptions{Now: c.Now, MaxSubjects: 1})
	defer l.Close()
	l.ChargeRates(s, now.Add(-2*time.Minute), 5, 0)
	if st := peekLocal(t, l, s, KindRPM); st.Remaining != 6 {
		t.Fatalf("a charge two minutes old: %+v, want a full bucket", st)
	}
	l.ChargeRates(lkey("other", Limits{RPM: 6}), now, 1, 0)
	if l.subjects[subjectKey{ScopeKey, "k"}] != nil {
		t.Fatal("a subject with a full bucket was kept past MaxSubjects")
	}
	l.ChargeRates(lkey("none", Limits{TokensPerDay: 10}), now, 1, 100)
	l.ChargeRates(lkey("zero", Limits{RPM: 6, TPM: 6}), now, 0, -5)
	for _, id := range []string{"none", "zero"} {
		if l.subjects[subjectKey{ScopeKey, id}] != nil {
			t.Fatalf("ChargeRates with nothing to charge made an entry for %q", id)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l.ChargeRates(s, now, 1, 0) // no panic, nothing kept
}

// TestLocalHeldBudgetRetryAfter: a held budget's RetryAfter is when the
// oldest request in flight admitted in the window is expected to end, its
// admission plus the typical duration of the requests settled so far, within
// [1 s, 1 min] and never past the window's end; a spent budget's is the
// window's end.
func TestLocalHeldBudgetRetryAfter(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	s := lteam("B", Limits{TokensPerDay: 1000})
	req := Request{Subjects: []Subject{s}, Tokens: 500}
	l, c := newTestLocal(t, t0)
	held := func(step string, at time.Time, used int64, retry time.Duration) {
		t.Helper()
		c.Set(at)
		d := ladmit(t, l, req)
		if d.Allowed || d.Refused.Spent() || d.Refused.Used != used || d.Refused.Reserved != 1000-used ||
			d.RetryAfter != retry {
			t.Fatalf("%s: %+v, want held with %d used, RetryAfter %v", step, d, used, retry)
		}
	}

	a := ladmit(t, l, req)
	c.Set(t0.Add(5 * time.Second))
	b := ladmit(t, l, req)
	held("no request has ended yet", t0.Add(6*time.Second), 0, time.Second)

	// a lasted 10 s, the typical duration now; b, the oldest in flight, is
	// expected to end 10 s after its admission at t0+5s.
	c.Set(t0.Add(10 * time.Second))
	lsettle(t, l, a.Lease, 500, 0)
	if got := l.typical.get(); got != 10*time.Second {
		t.Fatalf("typical duration %v after one request of 10s", got)
	}
	held("b expected at t0+15s", t0.Add(10*time.Second), 500, 5*time.Second)
	held("b expected at t0+15s", t0.Add(12*time.Second), 500, 3*time.Second)
	held("b overdue", t0.Add(40*time.Second), 500, time.Second)
	l.typical.ns.Store(int64(time.Hour))
	held("a long typical duration", t0.Add(40*time.Second), 500, time.Minute)

	// b ends having used 600: 1100 of 1000 are spent, until midnight.
	lsettle(t, l, b.Lease, 600, 0)
	if got := l.typical.get(); got != time.Hour+(35*time.Second-time.Hour)/8 {
		t.Fatalf("typical duration %v, want the moving average", got)
	}
	d := ladmit(t, l, req)
	if d.Allowed || !d.Refused.Spent() || d.Refused.Used != 1100 || d.Refused.Reserved != 0 ||
		d.RetryAfter != 12*time.Hour-40*time.Second {
		t.Fatalf("spent: %+v", d)
	}

	// Near midnight the window's end comes first; after it, only the new
	// day's requests hold the new day's budget.
	day1 := time.Date(2026, 11, 30, 23, 59, 30, 0, time.UTC)
	l, c = newTestLocal(t, day1)
	l.typical.ns.Store(int64(time.Minute))
	ladmit(t, l, req)
	ladmit(t, l, req)
	c.Set(day1.Add(10 * time.Second))
	if d := ladmit(t, l, req); d.Allowed || d.RetryAfter != 20*time.Second {
		t.Fatalf("20 s before midnight: %+v", d)
	}
	c.Set(day1.Add(40 * time.Second)) // 00:00:10, December 1
	ladmit(t, l, req)
	ladmit(t, l, req)
	c.Set(day1.Add(50 * time.Second))
	// The oldest of the day came at 00:00:10 and is expected at 00:01:10;
	// November's, still open, at 00:00:30.
	if d := ladmit(t, l, req); d.Allowed || d.RetryAfter != 50*time.Second {
		t.Fatalf("December 1, 00:00:20: %+v, want RetryAfter 50s", d)
	}
}

// TestLocalRaiseTo: RaiseTo brings a budget's windows up to the figures
// given and never lowers them, so raising twice raises once; usage counted
// in the windows stays when it is above; a window without a budget is not
// raised; an ended day is rolled over first.
func TestLocalRaiseTo(t *testing.T) {
	c := &localClock{t: lt0}
	l := NewLocal(LocalOptions{Now: c.Now})
	defer l.Close()
	team := lteam("raised", Limits{TokensPerDay: 1000, CostPerMonthMicros: 8000})
	l.Seed(team, lt0.Add(-24*time.Hour), 900, 0, 0) // yesterday's tokens: rolled away
	l.RaiseTo(team, lt0, 300, 5000, 2000)
	l.RaiseTo(team, lt0, 300, 5000, 2000) // again: nothing more
	l.RaiseTo(team, lt0, 100, 0, 1000)    // lower figures: nothing lowered
	for _, w := range []struct {
		k    Kind
		used int64
	}{{KindTokensPerDay, 300}, {KindCostPerMonth, 2000}} {
		if st := peekLocal(t, l, team, w.k); st.Used != w.used {
			t.Errorf("%s after RaiseTo: %+v, want used %d", w.k, st, w.used)
		}
	}
	withDayCost := team
	withDayCost.Limits.CostPerDayMicros = 9000
	if st := peekLocal(t, l, withDayCost, KindCostPerDay); st.Used != 0 {
		t.Errorf("cost_per_day, which had no budget when raised: used %d, want 0", st.Used)
	}
}
