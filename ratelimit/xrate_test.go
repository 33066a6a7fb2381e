package ratelimit

import (
	"math/rand/v2"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// TestLocalMatchesXTimeRate is a differential test against the reference
// the package doc names: for RPM and TPM buckets, Local admits exactly when a
// golang.org/x/time/rate.Limiter with the same rate (limit per minute) and
// burst (limit) allows, step by step on the same synthetic clock, over random
// gaps and costs. Gaps are random nanoseconds, so no step sits on a refill
// boundary where rate's float64 arithmetic and Local's integer arithmetic
// could round apart.
func TestLocalMatchesXTimeRate(t *testing.T) {
	start := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name  string
		limit int64
		kind  Kind
	}{
		{"rpm 60", 60, KindRPM},
		{"rpm 1000", 1000, KindRPM},
		{"tpm 10000", 10000, KindTPM},
		{"tpm 200000", 200000, KindTPM},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(tc.limit), 7))
			l, clock := newTestLocal(t, start)
			ref := rate.NewLimiter(rate.Limit(float64(tc.limit)/60), int(tc.limit))
			var lim Limits
			if tc.kind == KindRPM {
				lim.RPM = tc.limit
			} else {
				lim.TPM = tc.limit
			}
			subj := lkey("k", lim)
			now := start
			var admitted, refused int
			for step := range 5000 {
				// Mostly gaps averaging a quarter of a refill interval (the bucket
				// drains at four times its rate), rarely long ones (it
				// refills), up to a whole window.
				gap := time.Duration(rng.Int64N(int64(time.Minute) / tc.limit / 2))
				if rng.IntN(2000) == 0 {
					gap = time.Duration(rng.Int64N(int64(time.Minute)))
				}
				now = now.Add(gap)
				clock.Set(now)
				n := int64(1)
				if tc.kind == KindTPM {
					n = 1 + rng.Int64N(tc.limit/10)
				}
				want := ref.AllowN(now, int(n))
				dec := ladmit(t, l, Request{Subjects: []Subject{subj}, Tokens: n})
				if dec.Allowed != want {
					t.Fatalf("step %d at +%v, cost %d: Local allowed=%v, x/time/rate allowed=%v", step,
						now.Sub(start), n, dec.Allowed, want)
				}
				if dec.Allowed {
					admitted++
					lsettle(t, l, dec.Lease, n, 0) // used exactly what it reserved
				} else {
					refused++
				}
			}
			if admitted == 0 || refused == 0 {
				t.Fatalf("admitted %d, refused %d: the sequence never reached the limit", admitted, refused)
			}
		})
	}
}
