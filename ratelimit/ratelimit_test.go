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

// TestBudgetReservesWhatIsLeft: on both backends a budget admits while its
// window's usage is below the limit, reserving the estimate clamped to what
// is left (per budget: the team's cost per day and per month reserve
// differently), refuses only once spent, and Settle charges the real usage,
// also past the limit.
func TestBudgetReservesWhatIsLeft(t *testing.T) {
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
			key := keySubject("b", Limits{TokensPerDay: 2000})
			team := teamSubject("b", Limits{CostPerDayMicros: 5_000_000, CostPerMonthMicros: 3_000_000})
			req := func(tok, cost int64) Request {
				return Request{Subjects: []Subject{key, team}, Tokens: tok, CostMicros: cost}
			}
			used := func(step string, tpd, cpd, cpm int64) {
				t.Helper()
				for _, w := range []struct {
					s    Subject
					k    Kind
					want int64
				}{{key, KindTokensPerDay, tpd}, {team, KindCostPerDay, cpd}, {team, KindCostPerMonth, cpm}} {
					st := peekKind(t, l, w.s, w.k)
					if st.Used != w.want || st.Remaining != max(st.Limit-w.want, 0) {
						t.Fatalf("%s: %v %v %+v, want used %d", step, w.s.Scope, w.k, st, w.want)
					}
				}
			}
			spent := func(step string) {
				t.Helper()
				d := mustAdmit(t, l, req(0, 0))
				if d.Allowed || !d.Refused.Kind.Budget() || d.Refused.Remaining != 0 ||
					d.RetryAfter != d.Refused.Reset || d.RetryAfter <= 0 || d.RetryAfter > 31*24*time.Hour {
					t.Fatalf("%s: a spent budget gave %+v", step, d)
				}
			}

			// The example: 2600 estimated against 2000 a day.
			a := mustAdmit(t, l, req(2600, 4_000_000))
			if !a.Allowed {
				t.Fatalf("first request refused for its estimate: %+v", a)
			}
			used("first reserved", 2000, 4_000_000, 3_000_000)
			spent("after the first")
			mustSettle(t, l, a.Lease, 700, 1_000_000)
			used("first settled", 700, 1_000_000, 1_000_000)

			b := mustAdmit(t, l, req(2600, 4_000_000))
			if !b.Allowed {
				t.Fatalf("second request refused: %+v", b)
			}
			used("second reserved", 2000, 5_000_000, 3_000_000)
			spent("after the second")
			// 200 tokens and $0.50 beyond the clamped reservations: charged.
			mustSettle(t, l, b.Lease, 1500, 2_500_000)
			used("second settled", 2200, 3_500_000, 3_500_000)
			spent("past the limit")
		})
	}
}
