package ratelimit

import (
	"testing"
	"time"
)

func TestTightest(t *testing.T) {
	st := func(scope Scope, k Kind, rem int64, reset time.Duration) State {
		return State{Scope: scope, ID: scope.String(), Kind: k, Limit: 1000, Remaining: rem, Reset: reset}
	}
	cases := []struct {
		name             string
		sts              []State
		wantReq, wantTok int // indexes into sts, -1 for nil
	}{
		{"none", nil, -1, -1},
		{"no rates", []State{st(ScopeKey, KindConcurrency, 0, 0), st(ScopeKey, KindTokensPerDay, 0, time.Hour)}, -1, -1},
		{"rpm only", []State{st(ScopeKey, KindRPM, 7, time.Second)}, 0, -1},
		{"least remaining across subjects", []State{
			st(ScopeKey, KindRPM, 5, time.Second), st(ScopeKey, KindTPM, 900, time.Second),
			st(ScopeTeam, KindRPM, 3, 2*time.Second), st(ScopeTeam, KindTPM, 4000, time.Minute),
		}, 2, 1},
		{"tie goes to the longest reset", []State{
			st(ScopeKey, KindTPM, 0, 10*time.Second), st(ScopeTeam, KindTPM, 0, 30*time.Second),
			st(ScopeKey, KindRPM, 4, 3*time.Second), st(ScopeTeam, KindRPM, 4, time.Second),
		}, 2, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, tok := Decision{States: c.sts}.Tightest()
			for _, x := range []struct {
				name string
				got  *State
				want int
			}{{"req", req, c.wantReq}, {"tok", tok, c.wantTok}} {
				if x.want < 0 {
					if x.got != nil {
						t.Fatalf("%s = %+v, want nil", x.name, *x.got)
					}
					continue
				}
				if x.got != &c.sts[x.want] {
					t.Fatalf("%s = %+v, want %+v", x.name, x.got, c.sts[x.want])
				}
			}
		})
	}
}

// TestRefusedDecisionHasStates: a refusal carries every subject's RPM and
// TPM state as it is after the refusal, on both backends, so that a 429
// gets rate-limit headers.
func TestRefusedDecisionHasStates(t *testing.T) {
	backends := []struct {
		name string
		l    func(t *testing.T) Limiter
	}{
		{"local", func(t *testing.T) Limiter { return NewLocal(LocalOptions{}) }},
		{"redis", func(t *testing.T) Limiter { return NewRedis(startRedis(t), RedisOptions{}) }},
	}
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			l := be.l(t)
			defer l.Close()
			key := keySubject("r", Limits{RPM: 2, TPM: 1000})
			team := teamSubject("r", Limits{RPM: 100, TPM: 5000})
			req := Request{Subjects: []Subject{key, team}, Tokens: 100}
			start := time.Now()
			for range 2 {
				if d := mustAdmit(t, l, req); !d.Allowed {
					t.Fatalf("refused early: %+v", d)
				}
			}
			d := mustAdmit(t, l, req)
			if d.Allowed || d.Refused.Kind != KindRPM || d.Refused.Scope != ScopeKey {
				t.Fatalf("third: %+v", d)
			}
			want := []struct {
				scope Scope
				kind  Kind
				rem   int64
			}{{ScopeKey, KindRPM, 0}, {ScopeKey, KindTPM, 800}, {ScopeTeam, KindRPM, 98}, {ScopeTeam, KindTPM, 4800}}
			if len(d.States) != len(want) {
				t.Fatalf("States = %+v", d.States)
			}
			for i, w := range want {
				s := d.States[i]
				tol := refill(time.Since(start), s.Limit)
				if s.Scope != w.scope || s.Kind != w.kind || s.Remaining < w.rem || s.Remaining > w.rem+tol {
					t.Fatalf("state %d = %+v, want %v %v remaining %d (+%d)", i, s, w.scope, w.kind, w.rem, tol)
				}
			}
			req2, tok := d.Tightest()
			if req2 != &d.States[0] || tok != &d.States[1] {
				t.Fatalf("Tightest = %+v, %+v", req2, tok)
			}
		})
	}
}

// budgetBackends are the limiters the budget tests run on: both backends,
// and a Failover in front of each, whose decisions must be theirs unchanged
// (while Redis answers, and once it is down and the fallback answers).
func budgetBackends() []struct {
	name string
	l    func(t *testing.T) Limiter
} {
	return []struct {
		name string
		l    func(t *testing.T) Limiter
	}{
		{"local", func(t *testing.T) Limiter { return NewLocal(LocalOptions{}) }},
		{"redis", func(t *testing.T) Limiter { return NewRedis(startRedis(t), RedisOptions{}) }},
		{"failover on redis", func(t *testing.T) Limiter {
			return newTestFailover(t, FailoverOptions{Primary: NewRedis(startRedis(t), RedisOptions{}),
				Fallback: NewLocal(LocalOptions{})})
		}},
		{"failover on its fallback", func(t *testing.T) Limiter {
			srv := startRedisServer(t)
			client := srv.clientWith(t, noRetry)
			srv.kill()
			return newTestFailover(t, FailoverOptions{Primary: NewRedis(client, RedisOptions{}),
				Fallback: NewLocal(LocalOptions{}), RetryAfter: time.Hour})
		}},
	}
}

// TestBudgetReservesWhatIsLeft: on both backends a budget admits while its
// window holds less than the limit, reserving the estimate clamped to what
// is left (per budget: the team's cost per day and per month reserve
// differently); with nothing left it refuses as held while the settled usage
// is below the limit and as spent once it is not; and Settle charges the
// real usage, also past the limit.
func TestBudgetReservesWhatIsLeft(t *testing.T) {
	for _, be := range budgetBackends()[:2] {
		t.Run(be.name, func(t *testing.T) {
			l := be.l(t)
			defer l.Close()
			key := keySubject("b", Limits{TokensPerDay: 2000})
			team := teamSubject("b", Limits{CostPerDayMicros: 5_000_000, CostPerMonthMicros: 3_000_000})
			req := func(tok, cost int64) Request {
				return Request{Subjects: []Subject{key, team}, Tokens: tok, CostMicros: cost}
			}
			held := func(step string, tpd, cpd, cpm int64) {
				t.Helper()
				for _, w := range []struct {
					s    Subject
					k    Kind
					want int64
				}{{key, KindTokensPerDay, tpd}, {team, KindCostPerDay, cpd}, {team, KindCostPerMonth, cpm}} {
					st := peekKind(t, l, w.s, w.k)
					if st.Used+st.Reserved != w.want || st.Remaining != max(st.Limit-w.want, 0) {
						t.Fatalf("%s: %v %v %+v, want %d used and reserved", step, w.s.Scope, w.k, st, w.want)
					}
				}
			}
			refused := func(step string, spent bool) {
				t.Helper()
				d := mustAdmit(t, l, req(0, 0))
				if d.Allowed || !d.Refused.Kind.Budget() || d.Refused.Remaining != 0 || d.Refused.Spent() != spent {
					t.Fatalf("%s: %+v, want a refusal with spent %v", step, d, spent)
				}
				if spent && (d.RetryAfter != d.Refused.Reset || d.RetryAfter <= 0 || d.RetryAfter > 31*24*time.Hour) ||
					!spent && (d.RetryAfter <= 0 || d.RetryAfter > time.Minute) {
					t.Fatalf("%s: RetryAfter %v for %+v", step, d.RetryAfter, d.Refused)
				}
			}

			// The example: 2600 estimated against 2000 a day.
			a := mustAdmit(t, l, req(2600, 4_000_000))
			if !a.Allowed {
				t.Fatalf("first request refused for its estimate: %+v", a)
			}
			held("first reserved", 2000, 4_000_000, 3_000_000)
			refused("after the first", false)
			mustSettle(t, l, a.Lease, 700, 1_000_000)
			held("first settled", 700, 1_000_000, 1_000_000)

			b := mustAdmit(t, l, req(2600, 4_000_000))
			if !b.Allowed {
				t.Fatalf("second request refused: %+v", b)
			}
			held("second reserved", 2000, 5_000_000, 3_000_000)
			refused("after the second", false)
			// 200 tokens and $0.50 beyond the clamped reservations: charged.
			mustSettle(t, l, b.Lease, 1500, 2_500_000)
			held("second settled", 2200, 3_500_000, 3_500_000)
			refused("past the limit", true)
		})
	}
}

// TestBudgetHeldByReservationsIsNotSpent: a budget whose remainder the
// requests in flight hold refuses as held, with its settled usage and the
// reservations apart and a RetryAfter of at most a minute; as they settle
// it admits again, and once their real usage reaches the limit it refuses as
// spent until the window ends. Each budget kind, on every backend.
func TestBudgetHeldByReservationsIsNotSpent(t *testing.T) {
	const limit, estimate = 20000, 4216 // a prompt and max_tokens 4096
	kinds := []struct {
		k   Kind
		lim Limits
		req func(n int64) Request
	}{
		{KindTokensPerDay, Limits{TokensPerDay: limit}, func(n int64) Request { return Request{Tokens: n} }},
		{KindCostPerDay, Limits{CostPerDayMicros: limit}, func(n int64) Request { return Request{CostMicros: n} }},
		{KindCostPerMonth, Limits{CostPerMonthMicros: limit}, func(n int64) Request { return Request{CostMicros: n} }},
	}
	for _, be := range budgetBackends() {
		for _, kc := range kinds {
			t.Run(be.name+"/"+kc.k.String(), func(t *testing.T) {
				l := be.l(t)
				team := teamSubject("B", kc.lim)
				req := kc.req(estimate)
				req.Subjects = []Subject{team}
				settle := func(ls *Lease, n int64) {
					t.Helper()
					r := kc.req(n)
					mustSettle(t, l, ls, r.Tokens, r.CostMicros)
				}
				// Four reserve the estimate, the fifth the 3136 left.
				var open []*Lease
				for i := range 5 {
					d := mustAdmit(t, l, req)
					if !d.Allowed {
						t.Fatalf("request %d refused: %+v", i, d.Refused)
					}
					open = append(open, d.Lease)
				}
				d := mustAdmit(t, l, req)
				st := d.Refused
				if d.Allowed || st.Kind != kc.k || st.Scope != ScopeTeam || st.ID != "B" || st.Spent() ||
					st.Used != 0 || st.Reserved != limit || st.Remaining != 0 || st.Limit != limit {
					t.Fatalf("held by 5 requests in flight: %+v", d)
				}
				if d.RetryAfter <= 0 || d.RetryAfter > time.Minute {
					t.Fatalf("held: RetryAfter %v, want at most a minute", d.RetryAfter)
				}
				if p := peekKind(t, l, team, kc.k); p.Used != 0 || p.Reserved != limit || p.Remaining != 0 {
					t.Fatalf("Peek while held: %+v", p)
				}

				// One ends having used 100: what it did not use comes back.
				settle(open[0], 100)
				if d := mustAdmit(t, l, req); !d.Allowed {
					t.Fatalf("refused after a request in flight settled: %+v", d.Refused)
				} else {
					open = append(open[1:], d.Lease)
				}
				if p := peekKind(t, l, team, kc.k); p.Used != 100 || p.Reserved != limit-100 {
					t.Fatalf("Peek after one settled and one more reserved: %+v", p)
				}
				if d := mustAdmit(t, l, req); d.Allowed || d.Refused.Spent() || d.Refused.Used != 100 {
					t.Fatalf("held again: %+v", d)
				}

				// They end having used 4000 each: 100 + 5×4000 spends it.
				for _, ls := range open {
					settle(ls, 4000)
				}
				d = mustAdmit(t, l, req)
				st = d.Refused
				if d.Allowed || st.Kind != kc.k || !st.Spent() || st.Used != 20100 || st.Reserved != 0 ||
					d.RetryAfter != st.Reset || st.Reset <= 0 || st.Reset > 31*24*time.Hour {
					t.Fatalf("spent: %+v", d)
				}
			})
		}
	}
}
