package ratelimit

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkLocalAdmitSettle measures one admission and its settlement for a
// key and its team. The synthetic clock advances 1µs per reading, and the
// limits are high enough that nothing is refused, so every iteration takes
// the full reserve-and-settle path.
func BenchmarkLocalAdmitSettle(b *testing.B) {
	rates := Limits{RPM: 1_000_000_000, TPM: 1_000_000_000_000, Concurrency: 1 << 30}
	all := rates
	all.TokensPerDay, all.CostPerDayMicros, all.CostPerMonthMicros = 1<<62, 1<<62, 1<<62
	for _, bc := range []struct {
		name string
		lim  Limits
	}{{"rates", rates}, {"all", all}} {
		var tick atomic.Int64
		clock := func() time.Time { return lt0.Add(time.Duration(tick.Add(1000))) }
		req := Request{Subjects: []Subject{lkey("key-hash", bc.lim), lteam("team", bc.lim)}, Tokens: 1000, CostMicros: 500}
		ctx := context.Background()
		run := func(b *testing.B, l *Local) {
			d, err := l.Admit(ctx, req)
			if err != nil || !d.Allowed {
				b.Fatalf("refused: %v %+v", err, d.Refused)
			}
			if err := l.Settle(ctx, d.Lease, 900, 450); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(bc.name, func(b *testing.B) {
			l := NewLocal(LocalOptions{Now: clock})
			defer l.Close()
			b.ReportAllocs()
			for b.Loop() {
				run(b, l)
			}
		})
		b.Run(bc.name+"/parallel", func(b *testing.B) {
			l := NewLocal(LocalOptions{Now: clock})
			defer l.Close()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					run(b, l)
				}
			})
		})
	}
}
