package ratelimit

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func keySubject(id string, l Limits) Subject  { return Subject{Scope: ScopeKey, ID: id, Limits: l} }
func teamSubject(id string, l Limits) Subject { return Subject{Scope: ScopeTeam, ID: id, Limits: l} }

func mustAdmit(t testing.TB, l Limiter, req Request) Decision {
	t.Helper()
	d, err := l.Admit(context.Background(), req)
	if err != nil {
		t.Fatalf("Admit: %v", err)
	}
	return d
}

func peekKind(t testing.TB, l Limiter, s Subject, k Kind) State {
	t.Helper()
	sts, err := l.Peek(context.Background(), []Subject{s})
	if err != nil {
		t.Fatalf("Peek: %v", err)
	}
	for _, st := range sts {
		if st.Kind == k && st.Scope == s.Scope && st.ID == s.ID {
			return st
		}
	}
	t.Fatalf("Peek: no %v state for %v %s in %+v", k, s.Scope, s.ID, sts)
	return State{}
}

// refill returns how many units a bucket of limit per minute can have
// regained in d, plus one for the partial unit.
func refill(d time.Duration, limit int64) int64 {
	return int64(d)*limit/int64(time.Minute) + 1
}

func TestRedisRPMBurstThenRefusal(t *testing.T) {
	rl := NewRedis(startRedis(t), RedisOptions{})
	s := keySubject("a", Limits{RPM: 60}) // T = 1 s
	start := time.Now()
	var admitted int64
	var d Decision
	for range 200 {
		d = mustAdmit(t, rl, Request{Subjects: []Subject{s}})
		if !d.Allowed {
			break
		}
		admitted++
	}
	elapsed := time.Since(start)
	if admitted < 60 || admitted > 60+refill(elapsed, 60) {
		t.Fatalf("admitted %d in %v, want the burst of 60 (+%d refill)", admitted, elapsed, refill(elapsed, 60))
	}
	if d.Allowed {
		t.Fatal("never refused")
	}
	if d.Refused.Kind != KindRPM || d.Refused.Scope != ScopeKey || d.Refused.ID != "a" || d.Refused.Remaining != 0 {
		t.Fatalf("Refused = %+v", d.Refused)
	}
	// The next unit arrives within one emission interval, never the window.
	if d.RetryAfter <= 0 || d.RetryAfter > time.Second+50*time.Millisecond {
		t.Fatalf("RetryAfter = %v, want in (0, 1s]", d.RetryAfter)
	}
	if len(d.States) != 1 || d.States[0].Kind != KindRPM || d.States[0].Remaining != 0 || d.States[0].Limit != 60 {
		t.Fatalf("States = %+v", d.States)
	}
	if d.Lease != nil {
		t.Fatal("refused decision carries a lease")
	}
}

func TestRedisTPMSettleRefundAndDebt(t *testing.T) {
	rl := NewRedis(startRedis(t), RedisOptions{})
	s := keySubject("tpm", Limits{TPM: 6000}) // T = 10 ms
	start := time.Now()
	check := func(what string, want int64) {
		t.Helper()
		got := peekKind(t, rl, s, KindTPM).Remaining
		if tol := refill(time.Since(start), 6000); got < want || got > want+tol {
			t.Fatalf("%s: Remaining = %d, want %d (+%d refill)", what, got, want, tol)
		}
	}
	d := mustAdmit(t, rl, Request{Subjects: []Subject{s}, Tokens: 1000})
	if !d.Allowed || len(d.States) != 1 {
		t.Fatalf("admit: %+v", d)
	}
	check("after reserving 1000", 5000)
	if err := rl.Settle(context.Background(), d.Lease, 200, 0); err != nil {
		t.Fatal(err)
	}
	check("after settling 200 (refund 800)", 5800)

	d = mustAdmit(t, rl, Request{Subjects: []Subject{s}, Tokens: 1000})
	check("after reserving 1000 more", 4800)
	if err := rl.Settle(context.Background(), d.Lease, 10000, 0); err != nil {
		t.Fatal(err)
	}
	// 9000 beyond the reservation: the bucket is in debt.
	st := peekKind(t, rl, s, KindTPM)
	if st.Remaining != 0 || st.Used <= st.Limit || st.Reset <= time.Minute {
		t.Fatalf("after debt: %+v, want Remaining 0, Used > Limit, Reset > 1m", st)
	}
	d = mustAdmit(t, rl, Request{Subjects: []Subject{s}, Tokens: 0})
	if d.Allowed || d.Refused.Kind != KindTPM {
		t.Fatalf("bucket in debt admitted a request: %+v", d)
	}
	// Debt of 4200 tokens past a full window = 42 s at 10 ms per token.
	if want := 42 * time.Second; d.RetryAfter > want || d.RetryAfter < want-time.Since(start)-time.Second {
		t.Fatalf("RetryAfter = %v, want about %v", d.RetryAfter, want)
	}
}

func TestRedisTPMEstimateAboveLimitIsClamped(t *testing.T) {
	rl := NewRedis(startRedis(t), RedisOptions{})
	s := keySubject("big", Limits{TPM: 1000})
	d := mustAdmit(t, rl, Request{Subjects: []Subject{s}, Tokens: 50000})
	if !d.Allowed {
		t.Fatalf("estimate above the bucket refused on a full bucket: %+v", d)
	}
	if d.States[0].Remaining != 0 {
		t.Fatalf("States = %+v, want the whole bucket reserved", d.States)
	}
}

func TestRedisKeyTeamRefusalReservesNothing(t *testing.T) {
	rl := NewRedis(startRedis(t), RedisOptions{})
	key := keySubject("k1", Limits{RPM: 60, TPM: 60000, Concurrency: 10, TokensPerDay: 1e6, CostPerDayMicros: 1e6})
	team := teamSubject("t1", Limits{Concurrency: 1})
	req := Request{Subjects: []Subject{key, team}, Tokens: 100, CostMicros: 7}
	first := mustAdmit(t, rl, req)
	if !first.Allowed {
		t.Fatalf("first: %+v", first)
	}
	// start is taken before the first Peek: the tolerance below must cover
	// all the refill between the two Peeks' Redis times.
	start := time.Now()
	before, err := rl.Peek(context.Background(), []Subject{key, team})
	if err != nil {
		t.Fatal(err)
	}
	d := mustAdmit(t, rl, req)
	if d.Allowed {
		t.Fatal("team concurrency cap of 1 admitted a second request")
	}
	if d.Refused.Scope != ScopeTeam || d.Refused.ID != "t1" || d.Refused.Kind != KindConcurrency ||
		d.Refused.Used != 1 || d.RetryAfter != ConcurrencyRetryAfter {
		t.Fatalf("refusal = %+v after %v", d.Refused, d.RetryAfter)
	}
	after, err := rl.Peek(context.Background(), []Subject{key, team})
	if err != nil {
		t.Fatal(err)
	}
	if len(before) != len(after) || len(after) != 6 {
		t.Fatalf("Peek: %d states before, %d after, want 6", len(before), len(after))
	}
	for i := range before {
		b, a := before[i], after[i]
		tol := int64(0)
		if !b.Kind.Budget() && b.Kind != KindConcurrency {
			tol = refill(time.Since(start), b.Limit) + 1
		}
		if a.Kind != b.Kind || a.Remaining < b.Remaining || a.Remaining > b.Remaining+tol {
			t.Fatalf("refused admission left a reservation: before %+v, after %+v", b, a)
		}
	}
	// The key's RPM after the undo is in Decision.States as it is now.
	if len(d.States) != 2 || d.States[0].Kind != KindRPM || d.States[0].Remaining < 59 {
		t.Fatalf("States = %+v", d.States)
	}
	if err := rl.Settle(context.Background(), first.Lease, 100, 7); err != nil {
		t.Fatal(err)
	}
	if d := mustAdmit(t, rl, req); !d.Allowed {
		t.Fatalf("after settle: %+v", d)
	}
}

func TestRedisConcurrencySettleAndExpiry(t *testing.T) {
	rl := NewRedis(startRedis(t), RedisOptions{LeaseTTL: 100 * time.Millisecond})
	s := keySubject("c", Limits{Concurrency: 2})
	req := Request{Subjects: []Subject{s}}
	a, b := mustAdmit(t, rl, req), mustAdmit(t, rl, req)
	if !a.Allowed || !b.Allowed || a.Lease.ID == b.Lease.ID {
		t.Fatalf("a=%+v b=%+v", a, b)
	}
	if d := mustAdmit(t, rl, req); d.Allowed || d.Refused.Kind != KindConcurrency {
		t.Fatalf("third: %+v", d)
	}
	if err := rl.Settle(context.Background(), a.Lease, 0, 0); err != nil {
		t.Fatal(err)
	}
	c := mustAdmit(t, rl, req)
	if !c.Allowed {
		t.Fatalf("after Settle: %+v", c)
	}
	if st := peekKind(t, rl, s, KindConcurrency); st.Used != 2 || st.Remaining != 0 {
		t.Fatalf("Peek = %+v", st)
	}
	// b and c are never settled, as if their replica died: their leases
	// expire after LeaseTTL. Poll, bounded.
	deadline := time.Now().Add(10 * time.Second)
	for peekKind(t, rl, s, KindConcurrency).Used != 0 {
		if time.Now().After(deadline) {
			t.Fatal("leases of a dead replica never expired")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for range 2 {
		if d := mustAdmit(t, rl, req); !d.Allowed {
			t.Fatalf("after expiry: %+v", d)
		}
	}
}

func TestRedisBudgets(t *testing.T) {
	client := startRedis(t)
	rl := NewRedis(client, RedisOptions{})
	s := keySubject("b", Limits{TokensPerDay: 1000, CostPerMonthMicros: 500})
	req := func(tok, cost int64) Request { return Request{Subjects: []Subject{s}, Tokens: tok, CostMicros: cost} }

	first := mustAdmit(t, rl, req(600, 100))
	if !first.Allowed {
		t.Fatalf("first: %+v", first)
	}
	day, dayLeft := dayWindow(first.Lease.At)
	got, err := client.Get(context.Background(), "{tollgate:rl:key:b}:tpd:"+day).Int64()
	if err != nil || got != 600 {
		t.Fatalf("day counter %s = %d, %v; want 600", day, got, err)
	}
	if ttl := client.PTTL(context.Background(), "{tollgate:rl:key:b}:tpd:"+day).Val(); ttl < dayLeft || ttl > dayLeft+25*time.Hour {
		t.Fatalf("day counter TTL %v, want the window (%v) plus a day", ttl, dayLeft)
	}
	// 400 tokens are left: the second request reserves them, clamped, and
	// Redis keeps the clamped hold under its lease.
	second := mustAdmit(t, rl, req(600, 100))
	if !second.Allowed {
		t.Fatalf("second: %+v", second)
	}
	holdKey := "{tollgate:rl:key:b}:hold:" + second.Lease.ID
	if v, err := client.Get(context.Background(), holdKey).Result(); err != nil || v != "400 0 100" {
		t.Fatalf("hold %q, %v; want the clamped reservations %q", v, err, "400 0 100")
	}
	if h := second.Lease.holds[0]; h != (hold{tpd: 400, cpm: 100, kept: true}) {
		t.Fatalf("lease holds %+v", second.Lease.holds)
	}
	// The day has nothing left, but only reserved: a held budget, retried
	// soon, not a spent one.
	d := mustAdmit(t, rl, req(1, 0))
	if d.Allowed || d.Refused.Kind != KindTokensPerDay || d.Refused.Used != 0 || d.Refused.Reserved != 1000 ||
		d.Refused.Remaining != 0 || d.Refused.Spent() {
		t.Fatalf("held day: %+v", d)
	}
	if d.RetryAfter <= 0 || d.RetryAfter > time.Minute {
		t.Fatalf("RetryAfter = %v, want at most a minute", d.RetryAfter)
	}
	for _, k := range []string{"tpd:" + day + ":res", "cpm:" + first.Lease.At.Format("2006-01") + ":res"} {
		if ttl := client.PTTL(context.Background(), "{tollgate:rl:key:b}:"+k).Val(); ttl < dayLeft || ttl > 32*24*time.Hour {
			t.Fatalf("reserved counter %s TTL %v, want its window plus a day", k, ttl)
		}
	}
	// Real usage 100: 500 tokens go back to the day; the cost of 500 is 400
	// beyond the reservation and is charged in full.
	if err := rl.Settle(context.Background(), first.Lease, 100, 500); err != nil {
		t.Fatal(err)
	}
	if st := peekKind(t, rl, s, KindTokensPerDay); st.Used != 100 || st.Reserved != 400 {
		t.Fatalf("tokens per day after settle: %+v, want 100 used and 400 reserved", st)
	}
	if st := peekKind(t, rl, s, KindCostPerMonth); st.Used != 500 || st.Reserved != 100 || st.Remaining != 0 {
		t.Fatalf("cost per month after settle: %+v, want 500 used and 100 reserved (past the limit)", st)
	}
	// The month's cost is now spent: even a zero estimate waits for the next
	// month.
	d = mustAdmit(t, rl, req(1, 0))
	if d.Allowed || d.Refused.Kind != KindCostPerMonth || d.Refused.Remaining != 0 {
		t.Fatalf("spent month: %+v", d)
	}
	_, monthLeft := monthWindow(time.Now())
	if diff := d.RetryAfter - monthLeft; diff < -time.Minute || diff > time.Minute {
		t.Fatalf("RetryAfter = %v, want about %v (end of month)", d.RetryAfter, monthLeft)
	}
	mustSettle(t, rl, second.Lease, 0, 0)
	if n := client.Exists(context.Background(), holdKey).Val(); n != 0 {
		t.Fatal("the hold outlived its lease's settlement")
	}
	if st := peekKind(t, rl, s, KindTokensPerDay); st.Used != 100 || st.Reserved != 0 {
		t.Fatalf("tokens per day after the clamped lease's settle: %+v, want 100", st)
	}
}

func TestRedisSettleTwiceIsOnce(t *testing.T) {
	rl := NewRedis(startRedis(t), RedisOptions{})
	s := keySubject("s2", Limits{TokensPerDay: 1000, Concurrency: 5})
	d := mustAdmit(t, rl, Request{Subjects: []Subject{s}, Tokens: 300})
	other := mustAdmit(t, rl, Request{Subjects: []Subject{s}, Tokens: 300})
	for range 2 {
		if err := rl.Settle(context.Background(), d.Lease, 50, 0); err != nil {
			t.Fatal(err)
		}
	}
	if st := peekKind(t, rl, s, KindTokensPerDay); st.Used != 50 || st.Reserved != 300 {
		t.Fatalf("%+v, want 50 settled + 300 open", st)
	}
	if st := peekKind(t, rl, s, KindConcurrency); st.Used != 1 {
		t.Fatalf("open leases = %d, want 1", st.Used)
	}
	if other.Lease == nil {
		t.Fatal("no lease")
	}
	if err := rl.Settle(context.Background(), nil, 0, 0); err == nil {
		t.Fatal("Settle(nil) succeeded")
	}
}

// TestRedisReplicasShareLimits runs three limiters (three replicas) on one
// server under concurrent load: the RPM limit holds across them (burst plus
// what refilled while the test ran) and the concurrency cap is never passed.
func TestRedisReplicasShareLimits(t *testing.T) {
	srv := startRedisServer(t)
	s := keySubject("shared", Limits{RPM: 120, Concurrency: 4}) // T = 500 ms
	replicasShareLimits(t, []redis.UniversalClient{srv.client(t), srv.client(t), srv.client(t)}, RedisOptions{}, s, s)
}

// replicasShareLimits runs one limiter per client, each with 40 goroutines
// admitting requests for the subjects rpm and conc (one subject or two):
// the RPM limit of rpm holds across them (burst plus what refilled while
// the test ran) and the concurrency cap of conc is never passed.
func replicasShareLimits(t *testing.T, clients []redis.UniversalClient, opts RedisOptions, rpm, conc Subject) {
	t.Helper()
	req := Request{Subjects: []Subject{rpm}}
	if conc.Scope != rpm.Scope || conc.ID != rpm.ID {
		req.Subjects = append(req.Subjects, conc)
	}
	limit, concLimit := rpm.Limits.RPM, conc.Limits.Concurrency
	var admitted, open, maxOpen, attempts atomic.Int64
	var errs atomic.Int64
	// Run for 1.5 s, and on a slow machine on until the burst was taken
	// (bounded): the bounds below use the actual elapsed time.
	deadline := time.Now().Add(1500 * time.Millisecond)
	hardDeadline := time.Now().Add(15 * time.Second)
	start := time.Now()
	var wg sync.WaitGroup
	for _, c := range clients {
		rl := NewRedis(c, opts)
		for range 40 {
			wg.Go(func() {
				for (time.Now().Before(deadline) || admitted.Load() < limit && time.Now().Before(hardDeadline)) && attempts.Add(1) < 200000 {
					d, err := rl.Admit(context.Background(), req)
					if err != nil {
						t.Errorf("Admit: %v", err)
						errs.Add(1)
						return
					}
					if !d.Allowed {
						continue
					}
					admitted.Add(1)
					n := open.Add(1)
					for m := maxOpen.Load(); n > m && !maxOpen.CompareAndSwap(m, n); m = maxOpen.Load() {
					}
					time.Sleep(time.Millisecond)
					open.Add(-1)
					if err := rl.Settle(context.Background(), d.Lease, 0, 0); err != nil {
						t.Errorf("Settle: %v", err)
						errs.Add(1)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	if errs.Load() != 0 {
		t.Fatalf("%d Redis errors", errs.Load())
	}
	t.Logf("%d limiters admitted %d of %d requests in %v", len(clients), admitted.Load(), attempts.Load(),
		elapsed.Round(time.Millisecond))
	if got, most := admitted.Load(), limit+refill(elapsed, limit); got < limit || got > most {
		t.Fatalf("admitted %d in %v, want between the burst %d and %d", got, elapsed, limit, most)
	}
	if m := maxOpen.Load(); m > concLimit || m < 1 {
		t.Fatalf("%d requests open at once, cap %d", m, concLimit)
	}
}

// TestRedisAgreesWithLocal runs one sequence through both backends; within
// it no bucket refills by a whole unit (T = 6 s for RPM), so the decisions
// and remaining counts must match.
func TestRedisAgreesWithLocal(t *testing.T) {
	rl := NewRedis(startRedis(t), RedisOptions{})
	loc := NewLocal(LocalOptions{})
	s := keySubject("x", Limits{RPM: 10, TPM: 1000, Concurrency: 3, TokensPerDay: 2500})
	team := teamSubject("y", Limits{TPM: 700})
	type step struct {
		tokens, settle int64 // settle < 0: keep the lease open
	}
	steps := []step{{100, -1}, {300, 50}, {500, 900}, {200, -1}, {1, 0}, {0, -1}, {400, 400}, {300, -1}, {50, 50}, {10, 10}, {10, 10}}
	for i, st := range steps {
		req := Request{Subjects: []Subject{s, team}, Tokens: st.tokens}
		dr, dl := mustAdmit(t, rl, req), mustAdmit(t, loc, req)
		if dr.Allowed != dl.Allowed || dr.Refused.Kind != dl.Refused.Kind || dr.Refused.Scope != dl.Refused.Scope {
			t.Fatalf("step %d: redis %+v, local %+v", i, dr, dl)
		}
		if len(dr.States) != len(dl.States) {
			t.Fatalf("step %d: states redis %+v, local %+v", i, dr.States, dl.States)
		}
		for j := range dr.States {
			a, b := dr.States[j], dl.States[j]
			if a.Kind != b.Kind || a.Remaining < b.Remaining-1 || a.Remaining > b.Remaining+1 {
				t.Fatalf("step %d state %d: redis %+v, local %+v", i, j, a, b)
			}
		}
		if dr.Allowed && st.settle >= 0 {
			if err := rl.Settle(context.Background(), dr.Lease, st.settle, 0); err != nil {
				t.Fatal(err)
			}
			if err := loc.Settle(context.Background(), dl.Lease, st.settle, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	pr, err := rl.Peek(context.Background(), []Subject{s, team})
	if err != nil {
		t.Fatal(err)
	}
	pl, err := loc.Peek(context.Background(), []Subject{s, team})
	if err != nil {
		t.Fatal(err)
	}
	if len(pr) != len(pl) {
		t.Fatalf("Peek: redis %+v, local %+v", pr, pl)
	}
	for j := range pr {
		a, b := pr[j], pl[j]
		if a.Kind != b.Kind || a.Scope != b.Scope || a.Limit != b.Limit || a.Remaining < b.Remaining-1 || a.Remaining > b.Remaining+1 {
			t.Fatalf("Peek %d: redis %+v, local %+v", j, a, b)
		}
	}
}

// TestRedisLuaCalendar checks the scripts' hand-written calendar against
// dayWindow and monthWindow across leap years, month ends and centuries.
func TestRedisLuaCalendar(t *testing.T) {
	client := startRedis(t)
	sc := redis.NewScript(luaCommon + `
local now = tonumber(ARGV[1])
local day, day_end, month, month_end = windows(now)
return {day, day_end - now, month, month_end - now}
`)
	var instants []time.Time
	for _, d := range []string{"1970-01-01", "1999-12-31", "2000-02-28", "2000-02-29", "2000-03-01",
		"2024-02-29", "2025-02-28", "2025-12-31", "2026-01-01", "2100-02-28", "2100-03-01", "2240-12-31"} {
		day, err := time.Parse("2006-01-02", d)
		if err != nil {
			t.Fatal(err)
		}
		instants = append(instants, day, day.Add(time.Microsecond), day.Add(24*time.Hour-time.Microsecond), day.Add(13*time.Hour+7*time.Second))
	}
	for d := time.Date(2023, 1, 1, 5, 0, 0, 0, time.UTC); d.Year() < 2029; d = d.Add(97 * time.Hour) {
		instants = append(instants, d)
	}
	for _, at := range instants {
		res, err := sc.Run(context.Background(), client, []string{"{cal}"}, at.UnixMicro()).Slice()
		if err != nil || len(res) != 4 {
			t.Fatalf("%v: %v %v", at, res, err)
		}
		day, dayLeft := dayWindow(at)
		month, monthLeft := monthWindow(at)
		if res[0] != day || res[1] != dayLeft.Microseconds() || res[2] != month || res[3] != monthLeft.Microseconds() {
			t.Fatalf("%v: lua %v, go %s %d %s %d", at, res, day, dayLeft.Microseconds(), month, monthLeft.Microseconds())
		}
	}
}

// TestRedisRestart kills Redis: Admit reports an error (the caller's policy
// decides), and after a restart (empty, with no cached scripts) it works
// again through the EVAL fallback, also in a pipeline.
func TestRedisRestart(t *testing.T) {
	srv := startRedisServer(t)
	rl := NewRedis(srv.client(t), RedisOptions{})
	req := Request{Subjects: []Subject{keySubject("r", Limits{RPM: 10}), teamSubject("r", Limits{RPM: 10})}}
	if d := mustAdmit(t, rl, req); !d.Allowed {
		t.Fatal(d)
	}
	srv.kill()
	if _, err := rl.Admit(context.Background(), req); err == nil {
		t.Fatal("Admit with Redis down returned no error")
	}
	srv.restart()
	d := mustAdmit(t, rl, req)
	if !d.Allowed || d.States[0].Remaining != 9 {
		t.Fatalf("after restart: %+v", d)
	}
	if err := rl.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := rl.Admit(context.Background(), req); err != ErrClosed {
		t.Fatalf("after Close: %v", err)
	}
}

// countHook counts round trips: one per command outside a pipeline, one per
// pipeline.
type countHook struct{ n atomic.Int64 }

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(1); return next(ctx, cmds) }
}

func TestRedisOneRoundTripPerAdmit(t *testing.T) {
	srv := startRedisServer(t)
	var h countHook
	rl := NewRedis(srv.client(t, &h), RedisOptions{})
	key := keySubject("rt", Limits{RPM: 1e6, TPM: 1e9, Concurrency: 100, TokensPerDay: 1e12})
	team := teamSubject("rt", Limits{RPM: 1e6, CostPerMonthMicros: 1e12})
	for _, subjects := range [][]Subject{{key}, {key, team}} {
		req := Request{Subjects: subjects, Tokens: 10, CostMicros: 10}
		mustAdmit(t, rl, req) // loads the script (EVALSHA, then EVAL)
		h.n.Store(0)
		d := mustAdmit(t, rl, req)
		if !d.Allowed {
			t.Fatal(d)
		}
		if n := h.n.Load(); n != 1 {
			t.Fatalf("%d subjects: %d round trips per Admit, want 1", len(subjects), n)
		}
	}
}

// BenchmarkRedisAdmitSettle measures an Admit and its Settle for a key and
// its team: two round trips, each a pipeline of two scripts. redis-µs/op is
// the time Redis spent in the scripts (INFO commandstats), the rest is the
// round trips and the client; compare with BenchmarkRedisRoundTrip.
func BenchmarkRedisAdmitSettle(b *testing.B) {
	srv := startRedisServer(b)
	var h countHook
	client := srv.client(b, &h)
	rl := NewRedis(client, RedisOptions{})
	req := Request{Subjects: []Subject{
		keySubject("bench", Limits{RPM: 1e9, TPM: 1e12, Concurrency: 1e6, TokensPerDay: 1e15}),
		teamSubject("bench", Limits{RPM: 1e9, CostPerDayMicros: 1e15}),
	}, Tokens: 100, CostMicros: 10}
	ctx := context.Background()
	warm := mustAdmit(b, rl, req)
	if err := rl.Settle(ctx, warm.Lease, 100, 10); err != nil {
		b.Fatal(err)
	}
	var admitTrips int64
	if err := client.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		before := h.n.Load()
		d, err := rl.Admit(ctx, req)
		if err != nil || !d.Allowed {
			b.Fatal(d, err)
		}
		admitTrips += h.n.Load() - before
		if err := rl.Settle(ctx, d.Lease, 90, 9); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(admitTrips)/float64(b.N), "admit-roundtrips/op")
	b.ReportMetric(float64(scriptMicros(b, client))/float64(b.N), "redis-µs/op")
}

// scriptMicros returns the µs Redis spent in EVALSHA and EVAL since the last
// CONFIG RESETSTAT.
func scriptMicros(b *testing.B, c *redis.Client) int64 {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total int64
	for _, line := range strings.Split(info, "\n") {
		if !strings.HasPrefix(line, "cmdstat_evalsha:") && !strings.HasPrefix(line, "cmdstat_eval:") {
			continue
		}
		for _, f := range strings.Split(strings.TrimSpace(line[strings.IndexByte(line, ':')+1:]), ",") {
			if v, ok := strings.CutPrefix(f, "usec="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					b.Fatalf("commandstats %q: %v", line, err)
				}
				total += n
			}
		}
	}
	return total
}

// BenchmarkRedisRoundTrip is the floor under BenchmarkRedisAdmitSettle, in
// the same harness: a PING, a trivial script alone and two in a pipeline
// (one round trip each), then an Admit and a Settle of a key and its team
// alone. On a loopback where a PING takes as long as an Admit minus its
// scripts' redis-µs, the round trip is the cost, not the limiter.
func BenchmarkRedisRoundTrip(b *testing.B) {
	srv := startRedisServer(b)
	c := srv.client(b)
	ctx := context.Background()
	trivial := redis.NewScript(`return {1, 2, 3}`)
	if err := trivial.Run(ctx, c, []string{"{b}"}).Err(); err != nil {
		b.Fatal(err)
	}
	rl := NewRedis(c, RedisOptions{})
	req := Request{Subjects: []Subject{
		keySubject("bench", Limits{RPM: 1e9, TPM: 1e12, Concurrency: 1e9, TokensPerDay: 1e15}),
		teamSubject("bench", Limits{RPM: 1e9, CostPerDayMicros: 1e15}),
	}, Tokens: 100, CostMicros: 10}
	mustSettle(b, rl, mustAdmit(b, rl, req).Lease, 100, 10)
	b.Run("ping", func(b *testing.B) {
		for b.Loop() {
			if err := c.Ping(ctx).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("evalsha-trivial", func(b *testing.B) {
		for b.Loop() {
			if err := trivial.EvalSha(ctx, c, []string{"{b}"}).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("pipeline2-trivial", func(b *testing.B) {
		for b.Loop() {
			cmds, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
				trivial.EvalSha(ctx, p, []string{"{b}"})
				trivial.EvalSha(ctx, p, []string{"{c}"})
				return nil
			})
			if err != nil || len(cmds) != 2 {
				b.Fatal(err)
			}
		}
	})
	b.Run("admit", func(b *testing.B) {
		for b.Loop() {
			if d, err := rl.Admit(ctx, req); err != nil || !d.Allowed {
				b.Fatal(d, err)
			}
		}
	})
	b.Run("settle", func(b *testing.B) {
		leases := make([]*Lease, b.N)
		for i := range leases {
			leases[i] = mustAdmit(b, rl, req).Lease
		}
		b.ResetTimer()
		for i := range b.N {
			if err := rl.Settle(ctx, leases[i], 90, 9); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestRedisLeaseLifetime: the lease set outlives its newest lease by a day,
// a settlement that comes after LeaseTTL still applies once, long-dead
// leases are pruned when the set's TTL is extended, and a refund into a
// budget counter that has meanwhile vanished leaves no negative counter.
func TestRedisLeaseLifetime(t *testing.T) {
	client := startRedis(t)
	ctx := context.Background()
	rl := NewRedis(client, RedisOptions{LeaseTTL: 50 * time.Millisecond})
	s := keySubject("life", Limits{Concurrency: 5, TokensPerDay: 1e6})
	leases := "{tollgate:rl:key:life}:leases"

	d := mustAdmit(t, rl, Request{Subjects: []Subject{s}, Tokens: 1000})
	if ttl := client.PTTL(ctx, leases).Val(); ttl < 24*time.Hour+50*time.Millisecond {
		t.Fatalf("lease set TTL %v, want at least LeaseTTL + 1 day", ttl)
	}
	deadline := time.Now().Add(waitFor)
	for peekKind(t, rl, s, KindConcurrency).Used != 0 { // the lease expires
		if time.Now().After(deadline) {
			t.Fatal("lease never expired")
		}
		time.Sleep(10 * time.Millisecond)
	}
	mustSettle(t, rl, d.Lease, 400, 0)
	if st := peekKind(t, rl, s, KindTokensPerDay); st.Used != 400 {
		t.Fatalf("settlement after LeaseTTL: %+v, want 400 used", st)
	}

	// A lease of a replica that died two days ago, and a set whose TTL is
	// due for extension: the next admission prunes it.
	dead := time.Now().Add(-48 * time.Hour).UnixMicro()
	if err := client.ZAdd(ctx, leases, redis.Z{Score: float64(dead), Member: "dead"}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := client.PExpire(ctx, leases, time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	d = mustAdmit(t, rl, Request{Subjects: []Subject{s}, Tokens: 1000})
	if err := client.ZScore(ctx, leases, "dead").Err(); err != redis.Nil {
		t.Fatalf("dead lease not pruned: %v", err)
	}
	if ttl := client.PTTL(ctx, leases).Val(); ttl < 24*time.Hour {
		t.Fatalf("lease set TTL %v after extension", ttl)
	}

	day, _ := dayWindow(d.Lease.At)
	if err := client.Del(ctx, "{tollgate:rl:key:life}:tpd:"+day).Err(); err != nil {
		t.Fatal(err)
	}
	mustSettle(t, rl, d.Lease, 10, 0) // a refund of 990 into a missing counter
	if n := client.Exists(ctx, "{tollgate:rl:key:life}:tpd:"+day).Val(); n != 0 {
		t.Fatalf("refund created the counter: %q", client.Get(ctx, "{tollgate:rl:key:life}:tpd:"+day).Val())
	}
	if st := peekKind(t, rl, s, KindTokensPerDay); st.Used != 0 {
		t.Fatalf("tokens per day %+v, want 0", st)
	}
}

// TestRedisAgreesWithLocalBudgets runs one pseudo-random sequence of
// admissions and settlements of a key and its team through both backends:
// budgets involve no clock within a window, so every decision and every
// budget's usage must be equal, through clamped reservations, refusals of
// spent budgets and settlements above and below the reservations.
func TestRedisAgreesWithLocalBudgets(t *testing.T) {
	rl := NewRedis(startRedis(t), RedisOptions{})
	loc := NewLocal(LocalOptions{})
	key := keySubject("xb", Limits{TokensPerDay: 20000, CostPerDayMicros: 30000})
	team := teamSubject("yb", Limits{TokensPerDay: 30000, CostPerMonthMicros: 40000})
	subjects := []Subject{key, team}
	rng := rand.New(rand.NewPCG(7, 11))
	type open struct{ r, l *Lease }
	var leases []open
	var clamped, refused int
	for i := range 120 {
		if len(leases) > 0 && rng.IntN(2) == 0 {
			j := rng.IntN(len(leases))
			tok, cost := rng.Int64N(1500), rng.Int64N(2000)
			mustSettle(t, rl, leases[j].r, tok, cost)
			mustSettle(t, loc, leases[j].l, tok, cost)
			leases = append(leases[:j], leases[j+1:]...)
		} else {
			req := Request{Subjects: subjects, Tokens: rng.Int64N(6000), CostMicros: rng.Int64N(8000)}
			before := peekKind(t, loc, key, KindTokensPerDay)
			dr, dl := mustAdmit(t, rl, req), mustAdmit(t, loc, req)
			if dr.Allowed != dl.Allowed || dr.Refused.Kind != dl.Refused.Kind || dr.Refused.Scope != dl.Refused.Scope ||
				dr.Refused.Used != dl.Refused.Used || dr.Refused.Reserved != dl.Refused.Reserved {
				t.Fatalf("step %d: redis %+v, local %+v", i, dr, dl)
			}
			if dl.Allowed {
				leases = append(leases, open{dr.Lease, dl.Lease})
				if req.Tokens > before.Remaining {
					clamped++
				}
			} else {
				refused++
			}
		}
		pr, err := rl.Peek(context.Background(), subjects)
		if err != nil {
			t.Fatal(err)
		}
		pl, err := loc.Peek(context.Background(), subjects)
		if err != nil {
			t.Fatal(err)
		}
		if len(pr) != len(pl) || len(pl) != 4 {
			t.Fatalf("step %d: Peek redis %+v, local %+v", i, pr, pl)
		}
		for j := range pr {
			a, b := pr[j], pl[j]
			if a.Kind != b.Kind || a.Scope != b.Scope || a.Used != b.Used || a.Reserved != b.Reserved ||
				a.Remaining != b.Remaining {
				t.Fatalf("step %d, state %d: redis %+v, local %+v", i, j, a, b)
			}
		}
	}
	if clamped == 0 || refused == 0 {
		t.Fatalf("the sequence never clamped (%d) or never refused (%d): it tests nothing", clamped, refused)
	}
	t.Logf("%d clamped admissions, %d refusals", clamped, refused)
}

// TestRedisAdmitErrorReturnsAttemptedLease loses the replies of admissions
// that Redis ran: Admit fails but returns the lease it attempted, whose
// Settle with zero usage takes back the slot, the TPM reservation and the
// budget reservations (a clamped one exactly, from the hold Redis kept),
// while the request stays counted in RPM. The undo of an admission that
// never ran changes nothing, and a request limited by RPM alone gets no
// lease, having nothing to undo.
func TestRedisAdmitErrorReturnsAttemptedLease(t *testing.T) {
	srv := startRedisServer(t)
	var loss lossHook
	client := srv.clientWith(t, noRetry, &loss)
	rl := NewRedis(client, RedisOptions{})
	ctx := context.Background()
	key := keySubject("att", Limits{RPM: 600, TPM: 60000, Concurrency: 2, TokensPerDay: 2000})
	team := teamSubject("att", Limits{CostPerMonthMicros: 1000})
	req := Request{Subjects: []Subject{key, team}, Tokens: 1000, CostMicros: 300}
	mustSettle(t, rl, mustAdmit(t, rl, req).Lease, 1500, 800) // loads the scripts; 500 tokens, 200 µ$ left
	start := time.Now()
	before, err := rl.Peek(ctx, req.Subjects)
	if err != nil {
		t.Fatal(err)
	}

	loss.lose.Store(1)
	d, err := rl.Admit(ctx, req)
	if !errors.Is(err, errReplyLost) || d.Allowed || d.Lease == nil || d.Lease.holds != nil {
		t.Fatalf("Admit with a lost reply: %+v, %v; want an attempted lease and the error", d, err)
	}
	if st := peekKind(t, rl, key, KindConcurrency); st.Used != 1 {
		t.Fatalf("the admission did not run: %+v", st)
	}
	if v := client.Get(ctx, "{tollgate:rl:team:att}:hold:"+d.Lease.ID).Val(); v != "0 0 200" {
		t.Fatalf("team hold %q, want the clamped cost", v)
	}
	mustSettle(t, rl, d.Lease, 0, 0)
	after, err := rl.Peek(ctx, req.Subjects)
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range after {
		b := before[i]
		want := b.Remaining
		if a.Kind == KindRPM {
			want-- // the request stays counted
		}
		tol := int64(0)
		if a.Kind == KindRPM || a.Kind == KindTPM {
			tol = refill(time.Since(start), a.Limit)
		}
		if a.Kind != b.Kind || a.Remaining < want || a.Remaining > want+tol {
			t.Fatalf("after the undo: %+v, before the admission %+v", a, b)
		}
	}
	if n := client.Exists(ctx, "{tollgate:rl:key:att}:hold:"+d.Lease.ID, "{tollgate:rl:team:att}:hold:"+d.Lease.ID).Val(); n != 0 {
		t.Fatalf("%d holds outlived the undo", n)
	}

	// An admission that never reached Redis: its undo is a no-op.
	srv.kill()
	d, err = rl.Admit(ctx, req)
	if err == nil || d.Lease == nil {
		t.Fatalf("Admit with Redis down: %+v, %v", d, err)
	}
	srv.restart()
	mustSettle(t, rl, mustAdmit(t, rl, req).Lease, 0, 0) // a restart flushed the data and scripts
	mustSettle(t, rl, d.Lease, 0, 0)
	if st := peekKind(t, rl, key, KindConcurrency); st.Used != 0 {
		t.Fatalf("concurrency %+v", st)
	}

	rpmOnly := Request{Subjects: []Subject{keySubject("att-rpm", Limits{RPM: 10})}}
	loss.lose.Store(1)
	if d, err := rl.Admit(ctx, rpmOnly); err == nil || d.Lease != nil {
		t.Fatalf("RPM-only admission with a lost reply: %+v, %v; want no lease", d, err)
	}
}

// TestRedisChargeOnce: Charge adds usage to the budgets of every subject
// that has them, in one round trip, once per id; other subjects cost
// nothing, and a charge for windows long expired is ignored.
func TestRedisChargeOnce(t *testing.T) {
	srv := startRedisServer(t)
	var h countHook
	client := srv.client(t, &h)
	rl := NewRedis(client, RedisOptions{})
	ctx := context.Background()
	key := keySubject("ch", Limits{RPM: 10, TokensPerDay: 1e6, CostPerDayMicros: 1e6})
	team := teamSubject("ch", Limits{CostPerMonthMicros: 1e6})
	both := []Subject{key, team}
	check := func(what string, tpd, cpd, cpm int64) {
		t.Helper()
		if st := peekKind(t, rl, key, KindTokensPerDay); st.Used != tpd {
			t.Fatalf("%s: tokens per day %+v, want %d", what, st, tpd)
		}
		if st := peekKind(t, rl, key, KindCostPerDay); st.Used != cpd {
			t.Fatalf("%s: cost per day %+v, want %d", what, st, cpd)
		}
		if st := peekKind(t, rl, team, KindCostPerMonth); st.Used != cpm {
			t.Fatalf("%s: cost per month %+v, want %d", what, st, cpm)
		}
	}
	if err := rl.Charge(ctx, both, time.Now(), 500, 50, "c1"); err != nil {
		t.Fatal(err)
	}
	check("first charge", 500, 50, 50)
	h.n.Store(0)
	if err := rl.Charge(ctx, both, time.Now(), 500, 50, "c1"); err != nil {
		t.Fatal(err)
	}
	if n := h.n.Load(); n != 1 {
		t.Fatalf("%d round trips for a key and its team, want 1", n)
	}
	check("the same id again", 500, 50, 50)
	if err := rl.Charge(ctx, both, time.Now(), 100, 0, "c2"); err != nil {
		t.Fatal(err)
	}
	check("another id", 600, 50, 50)
	if ttl := client.PTTL(ctx, "{tollgate:rl:team:ch}:charge:c1").Val(); ttl <= 24*time.Hour {
		t.Fatalf("cost-per-month charge marker TTL %v, want the month's counter's", ttl)
	}

	h.n.Store(0)
	if err := rl.Charge(ctx, []Subject{keySubject("rates", Limits{RPM: 10, TPM: 1000})}, time.Now(), 500, 50, "c3"); err != nil {
		t.Fatal(err)
	}
	if n := h.n.Load(); n != 0 {
		t.Fatalf("%d round trips to charge a subject without budgets", n)
	}
	old := time.Now().AddDate(0, -3, 0)
	if err := rl.Charge(ctx, both, old, 500, 50, "c4"); err != nil {
		t.Fatal(err)
	}
	day, _ := dayWindow(old)
	if n := client.Exists(ctx, "{tollgate:rl:key:ch}:tpd:"+day, "{tollgate:rl:key:ch}:charge:c4").Val(); n != 0 {
		t.Fatalf("a charge three months late left %d keys", n)
	}
	if err := rl.Charge(ctx, both, time.Now(), 1, 1, ""); err == nil {
		t.Fatal("Charge without an id succeeded")
	}
}

// TestRedisHeldBudgetRetryAfter: on Redis a held budget's RetryAfter comes
// from the oldest live lease of the subject admitted in the window (its
// score in the lease set less LeaseTTL) and the typical duration this
// replica has seen, within [1 s, 1 min] and not past the lease's expiry.
// Leases that outlived LeaseTTL (their replicas died, or their settlements
// wait for a replay) leave no estimate, and the wait is the longest, a
// minute. Each budget kind, since each has its own window.
func TestRedisHeldBudgetRetryAfter(t *testing.T) {
	if _, left := dayWindow(time.Now()); left < 5*time.Minute {
		t.Skip("the UTC day ends within 5 minutes: its end would bound the waits")
	}
	client := startRedis(t)
	for _, tc := range []struct {
		k   Kind
		lim Limits
		req Request
	}{
		{KindTokensPerDay, Limits{TokensPerDay: 1000}, Request{Tokens: 1000}},
		{KindCostPerDay, Limits{CostPerDayMicros: 1000}, Request{CostMicros: 1000}},
		{KindCostPerMonth, Limits{CostPerMonthMicros: 1000}, Request{CostMicros: 1000}},
	} {
		t.Run(tc.k.String(), func(t *testing.T) {
			prefix := "held:" + tc.k.String() + ":"
			limiter := func(ttl time.Duration) *Redis {
				return NewRedis(client, RedisOptions{Prefix: prefix, LeaseTTL: ttl})
			}
			req := tc.req
			req.Subjects = []Subject{teamSubject("B", tc.lim)}
			// held refuses on rl and returns the wait and the instants
			// between which Redis refused.
			held := func(rl *Redis, step string) (wait time.Duration, from, to time.Time) {
				t.Helper()
				from = time.Now()
				d := mustAdmit(t, rl, req)
				to = time.Now()
				if d.Allowed || d.Refused.Kind != tc.k || d.Refused.Spent() || d.Refused.Reserved != 1000 {
					t.Fatalf("%s: %+v, want held by 1000 reserved", step, d)
				}
				return d.RetryAfter, from, to
			}
			// until checks that a refusal between from and to waited until
			// end, to the µs.
			until := func(step string, wait time.Duration, from, to, end time.Time) {
				t.Helper()
				if wait > end.Sub(from) || wait < end.Sub(to)-time.Microsecond {
					t.Fatalf("%s: RetryAfter %v, want %v less the refusal's own time", step, wait, end.Sub(from))
				}
			}

			rl := limiter(0)
			a := mustAdmit(t, rl, req)
			if w, _, _ := held(rl, "no request has ended yet"); w != time.Second {
				t.Fatalf("no estimate: RetryAfter %v, want 1s", w)
			}
			rl.typical.ns.Store(int64(30 * time.Second))
			w, from, to := held(rl, "typical 30s")
			until("a expected 30s after its admission", w, from, to, a.Lease.At.Add(30*time.Second))
			rl.typical.ns.Store(int64(time.Hour))
			if w, _, _ := held(rl, "typical 1h"); w != time.Minute {
				t.Fatalf("typical 1h: RetryAfter %v, want the cap of 1m", w)
			}
			mustSettle(t, rl, a.Lease, 0, 0)
			if got := rl.typical.get(); got <= 0 || got >= time.Hour {
				t.Fatalf("typical duration %v after a settlement, want it moved from 1h", got)
			}

			// A lease expiring in 5 s bounds the wait.
			short := limiter(5 * time.Second)
			short.typical.ns.Store(int64(30 * time.Second))
			b := mustAdmit(t, short, req)
			w, from, to = held(short, "expiring lease")
			until("b expires 5s after its admission", w, from, to, b.Lease.At.Add(5*time.Second))
			mustSettle(t, short, b.Lease, 0, 0)

			// Once the only lease has expired, nothing is known to end.
			gone := limiter(time.Millisecond)
			mustAdmit(t, gone, req)
			deadline := time.Now().Add(waitFor)
			for client.ZCount(context.Background(), "{"+prefix+"team:B}:leases",
				"("+strconv.FormatInt(time.Now().UnixMicro(), 10), "+inf").Val() != 0 {
				if time.Now().After(deadline) {
					t.Fatal("the lease never expired")
				}
				time.Sleep(5 * time.Millisecond)
			}
			if w, _, _ := held(gone, "expired lease"); w != time.Minute {
				t.Fatalf("only an expired lease holds it: RetryAfter %v, want 1m", w)
			}
		})
	}
}

// TestRedisRaiseTo: RaiseTo brings a budget's counters up to the figures
// given in one script, idempotently (two replicas raising to the same
// figures raise once), never lowers them, and leaves a window without a
// budget alone.
func TestRedisRaiseTo(t *testing.T) {
	rl := NewRedis(startRedis(t), RedisOptions{})
	defer rl.Close()
	ctx := context.Background()
	now := time.Now()
	team := Subject{Scope: ScopeTeam, ID: "raised", Limits: Limits{TokensPerDay: 1000, CostPerMonthMicros: 8000}}
	for _, fig := range [][3]int64{{300, 5000, 2000}, {300, 5000, 2000}, {100, 0, 1000}} {
		if err := rl.RaiseTo(ctx, team, now, fig[0], fig[1], fig[2]); err != nil {
			t.Fatal(err)
		}
	}
	withDayCost := team
	withDayCost.Limits.CostPerDayMicros = 9000
	sts, err := rl.Peek(ctx, []Subject{withDayCost})
	if err != nil {
		t.Fatal(err)
	}
	want := map[Kind]int64{KindTokensPerDay: 300, KindCostPerDay: 0, KindCostPerMonth: 2000}
	for _, st := range sts {
		if w, ok := want[st.Kind]; ok && st.Used != w {
			t.Errorf("%s after RaiseTo: used %d, want %d", st.Kind, st.Used, w)
		}
		delete(want, st.Kind)
	}
	if len(want) != 0 {
		t.Errorf("budgets missing from Peek: %v", want)
	}
}
