package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tollgate-llm/tollgate/internal/redistest"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/ratelimit"
)

// degradedSpan is when a gateway's limiter was first and last seen on its
// fallback.
type degradedSpan struct{ first, last time.Time }

// TestClusterMasterFailoverMidLoad: two gateways on a real Redis Cluster
// (three masters, three replicas; [redis] addrs lists the six nodes) serve a
// concurrent load while the master that holds key a's limit and the spend
// ledger is killed (SIGKILL) and its replica takes over. Meanwhile the
// gateways admit with their in-process limiters (on_redis_error = "allow")
// and keep spend in memory. Afterwards both are back on Redis with nothing
// queued; every key's spend equals what the upstream reported, to the token
// (nothing lost, nothing counted twice); and key a was admitted no more than
// its RPM bucket on Redis, plus each gateway's own bucket over the time it
// fell back, plus one request per client worker that the dead master may
// have admitted without passing it on to its replica. Once the gateways
// stop, none of their goroutines is left.
func TestClusterMasterFailoverMidLoad(t *testing.T) {
	before := goleak.IgnoreCurrent()
	c := redistest.StartCluster(t)
	mock := mockllm.New(mockllm.Options{OutputTokens: 1000, RequireKey: upKey})
	up := httptest.NewServer(mock)
	t.Cleanup(up.Close)

	// A prefix under which key a's limit and the ledger share a master.
	var prefix string
	for i := 0; prefix == "" && i < 100; i++ {
		p := "f" + strconv.Itoa(i) + ":"
		if c.MasterOf("{"+p+"spend}") == c.MasterOf("{"+p+"rl:key:a}") {
			prefix = p
		}
	}
	if prefix == "" {
		t.Fatal("no prefix of 100 puts key a's limit and the ledger on one master")
	}
	const rpm, workersA, workersB = 600, 6, 2
	cfg := govConfig(up.URL)
	cfg.Redis.Addrs = c.Addrs()
	cfg.Redis.KeyPrefix = prefix
	cfg.Keys[0].RPM = p64(rpm)
	cfg.Keys[1].RPM = p64(1_000_000) // admitted through Redis too, never refused
	reps := []*replica{startReplica(t, cfg), startReplica(t, cfg)}
	// Each knows the other before the load, so that its fallback takes its
	// share (a replica's first heartbeat may find it alone).
	waitFleet(t, reps)
	lims := make([]*ratelimit.Failover, len(reps))
	for i, r := range reps {
		lims[i] = r.rg.gov.limiter.(*ratelimit.Failover)
	}

	// The load runs until done, bounded by 90 s and 200,000 requests a key;
	// a 5 ms poll notes when each gateway is on its fallback.
	var done atomic.Bool
	hardStop := time.Now().Add(90 * time.Second)
	stop := func() bool { return done.Load() || time.Now().After(hardStop) }
	resA, resB := &loadResult{firstSend: time.Now()}, &loadResult{firstSend: time.Now()}
	spans := make([]degradedSpan, len(reps))
	var wg sync.WaitGroup
	wg.Go(func() { resA.run(reps, testKeyA, workersA, 200_000, stop) })
	wg.Go(func() { resB.run(reps, testKeyB, workersB, 200_000, stop) })
	wg.Go(func() {
		for !stop() {
			for i, l := range lims {
				if l.Degraded() {
					if spans[i].first.IsZero() {
						spans[i].first = time.Now()
					}
					spans[i].last = time.Now()
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	t.Cleanup(func() { done.Store(true); wg.Wait() }) // before the replicas stop
	waitUntil := func(what string, d time.Duration, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(d); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out after %v waiting for %s", d, what)
			}
		}
	}

	waitUntil("key a's bucket to empty", 30*time.Second, func() bool { return resA.firstLimited.Load() != 0 })
	time.Sleep(500 * time.Millisecond) // Redis alone limits key a for a while
	master := c.MasterOf("{" + prefix + "spend}")
	killedAt := time.Now()
	replica := c.KillMaster(master)
	took := c.WaitFailover(replica)
	waitUntil("both gateways back on Redis with nothing queued", 10*time.Second, func() bool {
		for _, l := range lims {
			if l.Degraded() || l.Pending() > 0 {
				return false
			}
		}
		return true
	})
	recoveredAt := time.Now()
	time.Sleep(time.Second) // on Redis again, under load
	done.Store(true)
	wg.Wait()

	if n := resA.other.Load() + resB.other.Load(); n != 0 {
		t.Fatalf("%d answers were neither 200 nor 429: with on_redis_error = \"allow\" a failover refuses nothing", n)
	}
	if n := resB.limited.Load(); n != 0 {
		t.Errorf("key b, far under its limit, got %d 429s", n)
	}
	for i, s := range spans {
		if s.first.IsZero() {
			t.Fatalf("gateway %d never fell back: the test proves nothing", i)
		}
	}

	// Spend: the ledger against the upstream's usage.
	if err := reps[1].stop(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := reps[0].rg.gov.ledger.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	want := map[string]*usageSum{}
	var during, okA int64 // key a's admissions, and those between the kill and the recovery
	for _, r := range reps {
		billed(r.records(), want)
		for _, rec := range r.records() {
			if rec.Team == "red" && rec.Status == http.StatusOK && rec.Route != llm.RouteOther {
				okA++
				if !rec.Timing.In.Before(killedAt) && rec.Timing.In.Before(recoveredAt) {
					during++
				}
			}
		}
	}
	sameSums(t, "after the failover", spendByKey(t, reps[0].url), want)

	// Limits: the fleet admits what one bucket of the RPM admits over the
	// run, whoever decides: Redis, or the gateways' fallbacks on their
	// shares of its state, whose admissions Redis's bucket counts when
	// they return (and so does each return of a flapping failover). Beyond
	// it: one request per gateway for the rounding of the shares, and one
	// per client worker that the dead master may have admitted without
	// passing it on to its replica.
	due := float64(rpm) + float64(rpm)*time.Duration(resA.lastAnswer.Load()-resA.firstSend.UnixNano()).Minutes()
	active := time.Unix(0, resA.lastSend.Load()).Sub(resA.firstSend)
	bound := due + 1 + float64(len(reps)) + workersA
	for i, s := range spans {
		t.Logf("gateway %d on its fallback from %v to %v after the kill", i, s.first.Sub(killedAt).Round(time.Millisecond),
			s.last.Sub(killedAt).Round(time.Millisecond))
	}
	t.Logf("failover: master %s killed, replica %s took over in %v, gateways back on Redis %v after the kill",
		master, replica, took.Round(time.Millisecond), recoveredAt.Sub(killedAt).Round(time.Millisecond))
	// The bucket was empty at the kill (the load keeps it so): what was
	// due between the kill and the recovery is its refill.
	dueDuring := float64(rpm) * recoveredAt.Sub(killedAt).Minutes()
	t.Logf("key a (RPM %d): %d admitted (%d between the kill and the recovery, where %.1f were due: %.2f×), %d refused, over %v; %.0f due (%.3f×), bound %.0f",
		rpm, resA.ok.Load(), during, dueDuring, float64(during)/dueDuring, resA.limited.Load(), active.Round(time.Millisecond),
		due, float64(resA.ok.Load())/due, bound)
	t.Logf("key b: %d admitted; billed: a %+v, b %+v", resB.ok.Load(), *want["a"], *want["b"])
	if okA != resA.ok.Load() {
		t.Errorf("the gateways recorded %d admissions of key a, the clients saw %d", okA, resA.ok.Load())
	}
	if got := float64(resA.ok.Load()); got > bound {
		t.Errorf("key a: %.0f admitted, more than its buckets held (%.0f)", got, bound)
	}
	if resA.ok.Load() < rpm {
		t.Errorf("key a: %d admitted, less than its burst %d: the load never used the bucket", resA.ok.Load(), rpm)
	}

	if err := reps[0].stop(); err != nil {
		t.Fatal(err)
	}
	up.Close()
	// go-redis redials a dead node once a second until its pool closes, so
	// the last such goroutine may end a second after the gateways closed
	// their clients. Bounded: 300 × 10 ms.
	for i := 0; i < 300 && goleak.Find(before) != nil; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	goleak.VerifyNone(t, before)
}
