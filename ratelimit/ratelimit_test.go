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
