package main

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/internal/redistest"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/proxy"
)

// rateAfter bounds what a bucket of limit per minute, empty when res's
// last refused request was sent (it refused that one), can admit until
// after's last answer: its refill over that span, one request for the
// partial one, and one per replica for the rounding of the fallback's
// shares (docs/redis.md).
func rateAfter(limit int64, res, after *loadResult, replicas int) float64 {
	span := time.Duration(after.lastAnswer.Load() - res.lastLimitedSend.Load())
	return float64(limit)*span.Minutes() + 1 + float64(replicas)
}

// adminWatch polls /admin/spend on one replica while a test runs and
// counts the answers that were not flagged partial and yet held less of a
// key's requests than were billed before Redis lost its data, and the
// largest redis_data gauge seen on any replica.
type adminWatch struct {
	unflagged, partial, answers atomic.Int64
	maxGauge                    atomic.Int64
	stop                        chan struct{}
	done                        sync.WaitGroup
}

func watchAdmin(t *testing.T, reps []*replica, key string, floor int64) *adminWatch {
	w := &adminWatch{stop: make(chan struct{})}
	w.done.Add(1)
	go func() {
		defer w.done.Done()
		for i := 0; i < 3000; i++ { // bounded: 3000 × ≥ 5 ms
			select {
			case <-w.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			for _, r := range reps {
				if g := gaugeValue(t, r, "tollgate_degraded", "redis_data"); int64(g) > w.maxGauge.Load() {
					w.maxGauge.Store(int64(g))
				}
			}
			body, err := adminGet(reps[0].url+"/admin/spend?key="+key, testAdmin)
			if err != nil {
				continue // Redis down: a 503 says so
			}
			var rep proxy.SpendReport
			if json.Unmarshal(body, &rep) != nil {
				continue
			}
			w.answers.Add(1)
			if rep.Partial {
				w.partial.Add(1)
				continue
			}
			if rep.Total.Requests < floor {
				w.unflagged.Add(1)
			}
		}
	}()
	return w
}

func (w *adminWatch) end() { close(w.stop); w.done.Wait() }

// TestEmptyRedisAdmitsNothingPastTheLimits: three gateways share a Redis
// without persistence. Team blue has spent its tokens for the day and key
// a has emptied its RPM bucket when Redis restarts empty. Under load, the
// fleet then admits nothing for blue and no more for a than its bucket
// refilled since its last refusal: no admission decides on Redis until
// every replica's spend is back and the buckets are raised to where the
// fleet stood. Meanwhile /admin/spend never answers a ledger that misses
// what was billed without flagging it partial.
func TestEmptyRedisAdmitsNothingPastTheLimits(t *testing.T) {
	srv, cfg := redisGovConfig(t, mockllm.Options{OutputTokens: 9})
	// The default flush interval: a replica that waited for its next flush
	// to notice would decide on the emptied Redis for up to 2 s.
	cfg.Spend.FlushIntervalSeconds = 2
	const rpm = 600
	cfg.Keys[0].RPM = p64(rpm)
	const budget = 2000 // about 50 requests of 37 tokens
	cfg.Teams[1].TokensPerDay = p64(budget)
	reps := []*replica{startReplica(t, cfg), startReplica(t, cfg), startReplica(t, cfg)}
	waitFleet(t, reps)
	a1 := load(t, reps, testKeyA, 6, 30*time.Second, 200*time.Millisecond, 5000)
	b1 := load(t, reps, testKeyB, 3, 30*time.Second, 100*time.Millisecond, 500)
	if a1.limited.Load() == 0 || b1.limited.Load() == 0 || b1.ok.Load() == 0 {
		t.Fatalf("the limits never refused: a %d, b %d 429s", a1.limited.Load(), b1.limited.Load())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, r := range reps {
		if err := r.rg.gov.ledger.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	billedB := b1.ok.Load()

	srv.Restart()
	w := watchAdmin(t, reps, "b", billedB)
	var wg sync.WaitGroup
	var b2 *loadResult
	wg.Add(1)
	go func() { defer wg.Done(); b2 = load(t, reps, testKeyB, 2, 3*time.Second, 0, 3000) }()
	a2 := load(t, reps, testKeyA, 6, 3*time.Second, 0, 20000)
	wg.Wait()
	w.end()

	usedB := b1.input.Load() + b1.output.Load() + b2.input.Load() + b2.output.Load()
	bound := rateAfter(rpm, a1, a2, len(reps))
	dueA := float64(rpm) + float64(rpm)*time.Duration(a2.lastAnswer.Load()-a1.firstSend.UnixNano()).Minutes()
	t.Logf("after Redis restarted empty: blue admitted %d (%d refused), its day at %d of %d tokens (%.3f×); "+
		"key a admitted %d where its bucket held at most %.1f, %d over the run where %.0f were due (%.3f×)",
		b2.ok.Load(), b2.limited.Load(), usedB, budget, float64(usedB)/float64(budget),
		a2.ok.Load(), bound, a1.ok.Load()+a2.ok.Load(), dueA, float64(a1.ok.Load()+a2.ok.Load())/dueA)
	t.Logf("/admin/spend: %d answers, %d partial, %d unflagged with less than was billed; redis_data gauge reached %d",
		w.answers.Load(), w.partial.Load(), w.unflagged.Load(), w.maxGauge.Load())
	if b2.ok.Load() != 0 {
		t.Errorf("team blue's spent budget admitted %d requests after Redis restarted empty", b2.ok.Load())
	}
	if got := float64(a2.ok.Load()); got > bound {
		t.Errorf("key a: %.0f admitted after Redis restarted empty, more than its bucket refilled (%.1f)", got, bound)
	}
	if a2.other.Load() != 0 || b2.other.Load() != 0 || a2.ok.Load() == 0 {
		t.Errorf("after the restart: a %d ok / %d other, b %d other", a2.ok.Load(), a2.other.Load(), b2.other.Load())
	}
	if w.unflagged.Load() != 0 {
		t.Errorf("/admin/spend answered %d times with less than was billed, not flagged partial", w.unflagged.Load())
	}
}

// TestOutageReturnChargesTheFallback: Redis (persistent) dies for 3 s
// under load while key a's bucket is empty. The fallbacks admit their
// shares of the refill; when Redis returns, its bucket, which refilled
// meanwhile, is raised to theirs before it admits again: over the outage
// and after it, the fleet admits no more than the bucket refilled since
// its last refusal before the outage.
func TestOutageReturnChargesTheFallback(t *testing.T) {
	srv, cfg := redisGovConfig(t, mockllm.Options{OutputTokens: 9}, redistest.Persistent())
	const rpm = 600
	cfg.Keys[0].RPM = p64(rpm)
	reps := []*replica{startReplica(t, cfg), startReplica(t, cfg), startReplica(t, cfg)}
	waitFleet(t, reps)
	a1 := load(t, reps, testKeyA, 6, 30*time.Second, 200*time.Millisecond, 5000)
	if a1.limited.Load() == 0 {
		t.Fatal("the RPM never refused")
	}
	srv.Kill()
	out := load(t, reps, testKeyA, 6, 3*time.Second, 0, 20000)
	srv.Start()
	after := load(t, reps, testKeyA, 6, 4*time.Second, 0, 40000)
	for i, r := range reps {
		if g := gaugeValue(t, r, "tollgate_degraded", "ratelimit"); g != 0 {
			t.Errorf("replica %d still degraded 4 s after Redis returned", i)
		}
	}
	bound := rateAfter(rpm, a1, after, len(reps))
	got := out.ok.Load() + after.ok.Load()
	dueA := float64(rpm) + float64(rpm)*time.Duration(after.lastAnswer.Load()-a1.firstSend.UnixNano()).Minutes()
	total := a1.ok.Load() + got
	t.Logf("outage of %v: the fallbacks admitted %d, Redis after its return %d; %d in all where the bucket refilled at most %.1f; "+
		"%d over the run where %.0f were due (%.3f×)", time.Duration(after.firstSend.UnixNano()-out.firstSend.UnixNano()).Round(time.Millisecond),
		out.ok.Load(), after.ok.Load(), got, bound, total, dueA, float64(total)/dueA)
	if float64(got) > bound {
		t.Errorf("key a: %d admitted during and after the outage, more than its bucket refilled (%.1f): "+
			"what the fallback admitted was admitted again", got, bound)
	}
	if out.ok.Load() == 0 || out.other.Load() != 0 || after.other.Load() != 0 {
		t.Errorf("outage: %d ok, %d other; after: %d other", out.ok.Load(), out.other.Load(), after.other.Load())
	}
}
