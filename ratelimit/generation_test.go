package ratelimit

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// TestFailoverEmptyRedisDecidesNothingUntilRefilled: a key has used half
// its RPM and all of its tokens per day when Redis restarts empty. The
// admissions that follow find another generation of data than the one the
// limiter was told is whole: Redis decides none of them (the fallback does,
// from what Redis last said, so the budget stays spent), and the refill is
// started. Once the test has refilled the budget, as the spend ledger's
// refill does, and named the new generation, the probe raises Redis's RPM
// bucket to the fallback's before its admission: Redis starts where the
// key stood, not full.
func TestFailoverEmptyRedisDecidesNothingUntilRefilled(t *testing.T) {
	srv := startRedisServer(t) // no persistence: a restart empties it
	client := srv.clientWith(t, noRetry)
	ctx := context.Background()
	primary := NewRedis(client, RedisOptions{GenerationKey: "gen"})
	if err := client.Set(ctx, "gen", "g1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	primary.SetGeneration("g1")
	var kicks atomic.Int64
	f := newTestFailover(t, FailoverOptions{Primary: primary, Fallback: NewLocal(LocalOptions{}),
		RetryAfter: time.Millisecond, OnDataLost: func() { kicks.Add(1) }})
	key := keySubject("spent", Limits{RPM: 60, TokensPerDay: 1000})
	req := Request{Subjects: []Subject{key}, Tokens: 10}

	for i := range 30 {
		d := mustAdmit(t, f, req)
		if !d.Allowed || d.Lease.issuer != primary {
			t.Fatalf("healthy admission %d: %+v", i, d)
		}
		mustSettle(t, f, d.Lease, 1000/30+1, 0) // 30 × 34 tokens: the day's 1000 are spent
	}
	if d := mustAdmit(t, f, req); d.Allowed || !d.Refused.Spent() {
		t.Fatalf("after 1020 tokens: %+v, want the budget spent", d)
	}

	srv.restart()
	admitted := 0
	for range 20 {
		d := mustAdmit(t, f, req)
		if d.Allowed {
			admitted++
			t.Errorf("admitted after Redis restarted empty, by %v", map[bool]string{true: "Redis", false: "the fallback"}[d.Lease.issuer == primary])
			mustSettle(t, f, d.Lease, 10, 0)
		}
		time.Sleep(2 * time.Millisecond) // past RetryAfter: each admission may probe
	}
	if !f.Degraded() || kicks.Load() == 0 {
		t.Fatalf("degraded %v, refills started %d: the empty Redis was not noticed", f.Degraded(), kicks.Load())
	}
	if _, err := primary.Admit(ctx, req); !errors.Is(err, ErrDataLost) {
		t.Fatalf("Redis admission before the refill: %v, want ErrDataLost", err)
	}

	// The refill: the budget charged again, the generation named.
	if err := primary.Charge(ctx, []Subject{key}, time.Now(), 1020, 0, "refill"); err != nil {
		t.Fatal(err)
	}
	if err := client.Set(ctx, "gen", "g2", 0).Err(); err != nil {
		t.Fatal(err)
	}
	primary.SetGeneration("g2")
	time.Sleep(2 * time.Millisecond)
	if d := mustAdmit(t, f, req); d.Allowed || f.Degraded() {
		t.Fatalf("the probe after the refill: %+v, degraded %v; want Redis back, refusing", d, f.Degraded())
	}
	// The key had used 31 of its 60 requests (30 admitted and one refused
	// by the budget, which counts no request) before the restart; Redis's
	// bucket holds that again, give or take its refill since.
	if st := peekKind(t, primary, key, KindRPM); st.Remaining > 31 {
		t.Errorf("Redis's RPM after the refill: %d remaining, want at most 31 (the bucket came back full)", st.Remaining)
	}
	if admitted > 0 {
		t.Fatalf("%d admitted past a spent budget", admitted)
	}
}

// TestFailoverReturnChargesTheFallbacksRates: during an outage the
// fallback admits the rest of a key's RPM; when Redis returns, the probe
// raises Redis's bucket to the fallback's before it admits, so Redis,
// whose bucket had refilled meanwhile, does not admit those requests
// again.
func TestFailoverReturnChargesTheFallbacksRates(t *testing.T) {
	srv := startPersistentRedisServer(t)
	primary := NewRedis(srv.clientWith(t, noRetry), RedisOptions{})
	f := newTestFailover(t, FailoverOptions{Primary: primary, Fallback: NewLocal(LocalOptions{}), RetryAfter: time.Millisecond})
	key := keySubject("rate", Limits{RPM: 60})
	req := Request{Subjects: []Subject{key}}
	for i := range 30 {
		if d := mustAdmit(t, f, req); !d.Allowed || d.Lease.issuer != primary {
			t.Fatalf("healthy admission %d: %+v", i, d)
		}
	}
	srv.kill()
	onFallback := 0
	for range 60 {
		d := mustAdmit(t, f, req)
		if !d.Allowed {
			break
		}
		if d.Lease.issuer != f.fallback {
			t.Fatalf("admitted by Redis while it is down")
		}
		onFallback++
	}
	if onFallback < 29 {
		t.Fatalf("the fallback admitted %d, want the 30 left", onFallback)
	}
	srv.restart()
	time.Sleep(2 * time.Millisecond)
	again := 0
	for range 10 {
		if d := mustAdmit(t, f, req); d.Allowed {
			again++
		}
	}
	if f.Degraded() {
		t.Fatal("still degraded after Redis returned")
	}
	// Refill since the fallback emptied the bucket: a request a second.
	if again > 1 {
		t.Errorf("Redis admitted %d right after the outage: the fallback's %d were not charged to its bucket", again, onFallback)
	}
}

// TestFailoverFlapsDoubleTheProbesWait: a primary that fails again soon
// after it returned is probed only after twice RetryAfter, then four
// times; one that stays up for the flap window starts from RetryAfter
// again.
func TestFailoverFlapsDoubleTheProbesWait(t *testing.T) {
	srv := startPersistentRedisServer(t)
	var h countHook
	primary := NewRedis(srv.clientWith(t, noRetry, &h), RedisOptions{})
	clock := &localClock{t: lt0}
	f := newTestFailover(t, FailoverOptions{Primary: primary, Fallback: NewLocal(LocalOptions{}),
		RetryAfter: time.Second, Now: clock.Now})
	req := Request{Subjects: []Subject{keySubject("flap", Limits{RPM: 1000})}}
	at := lt0
	// outage kills Redis, fails an admission, restarts Redis and checks
	// that no probe comes before wait and one comes then.
	outage := func(wait time.Duration) {
		t.Helper()
		srv.kill()
		mustAdmit(t, f, req)
		if !f.Degraded() {
			t.Fatal("not degraded after Redis died")
		}
		srv.restart()
		at = at.Add(wait - time.Millisecond)
		clock.Set(at)
		n := h.n.Load()
		if d := mustAdmit(t, f, req); d.Lease.issuer != f.fallback || h.n.Load() != n {
			t.Fatalf("%v after the failure: a probe before %v", wait-time.Millisecond, wait)
		}
		at = at.Add(time.Millisecond)
		clock.Set(at)
		if d := mustAdmit(t, f, req); d.Lease.issuer != primary || f.Degraded() {
			t.Fatalf("%v after the failure: no probe, or it failed", wait)
		}
	}
	outage(time.Second)
	outage(2 * time.Second) // failed again at once: a flap
	outage(4 * time.Second)
	at = at.Add(flapWindowFactor * time.Second)
	clock.Set(at)
	outage(time.Second) // up for the whole window: no flap
}
