package ratelimit

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-llm/tollgate/internal/redistest"
)

// waitFor bounds every poll in these tests; it is a deadlock guard, not a
// timing assertion.
const waitFor = 10 * time.Second

// transitions records OnDegraded calls.
type transitions struct {
	mu  sync.Mutex
	got []bool
}

func (tr *transitions) record(d bool) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.got = append(tr.got, d)
}

func (tr *transitions) check(t *testing.T, want ...bool) {
	t.Helper()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if len(tr.got) != len(want) {
		t.Fatalf("OnDegraded calls %v, want %v", tr.got, want)
	}
	for i := range want {
		if tr.got[i] != want[i] {
			t.Fatalf("OnDegraded calls %v, want %v", tr.got, want)
		}
	}
}

// lossHook lets a command run on Redis and then replaces its reply with an
// error, as a connection that breaks after the write would: the caller
// cannot tell whether the command was applied.
type lossHook struct{ lose atomic.Int64 }

var errReplyLost = errors.New("test: reply lost")

func (h *lossHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *lossHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if h.lose.Add(-1) >= 0 {
			cmd.SetErr(errReplyLost)
			return errReplyLost
		}
		return err
	}
}
func (h *lossHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if h.lose.Add(-1) >= 0 {
			for _, c := range cmds {
				c.SetErr(errReplyLost)
			}
			return errReplyLost
		}
		return err
	}
}

// gateHook counts round trips and, when armed, holds the next one until
// released, so that a test can act while a probe is in flight.
type gateHook struct {
	n       atomic.Int64
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func newGateHook() *gateHook {
	return &gateHook{entered: make(chan struct{}, 1), release: make(chan struct{})}
}

func (h *gateHook) pass() {
	h.n.Add(1)
	if h.armed.CompareAndSwap(true, false) {
		h.entered <- struct{}{}
		<-h.release
	}
}

func (h *gateHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *gateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.pass(); return next(ctx, cmd) }
}
func (h *gateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.pass(); return next(ctx, cmds) }
}

// noRetry is the test clients' option: a dead server fails a call at once
// instead of after go-redis's retries and dial retries (5 × 100ms by
// default).
var noRetry = redis.Options{MaxRetries: -1, DialerRetries: 1}

func newTestFailover(t *testing.T, o FailoverOptions) *Failover {
	t.Helper()
	f, err := NewFailover(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return f
}

func mustSettle(t testing.TB, l Limiter, ls *Lease, tokens, cost int64) {
	t.Helper()
	if err := l.Settle(context.Background(), ls, tokens, cost); err != nil {
		t.Fatalf("Settle: %v", err)
	}
}

// TestFailoverAllowOutage kills Redis between admissions: admissions go on
// from the fallback without a single Redis call until RetryAfter, the probe
// after a restart brings the primary back, and the settlements queued during
// the outage are replayed so that Redis's concurrency count and TPM bucket
// end where they would have without the outage, and its tokens per day count
// what the fallback admitted too. The fallback runs on the real clock, as
// Redis does, so that its leases' budget windows are Redis's current ones.
func TestFailoverAllowOutage(t *testing.T) {
	srv := startPersistentRedisServer(t)
	var h countHook
	primary := NewRedis(srv.clientWith(t, noRetry, &h), RedisOptions{})
	clock := &localClock{t: lt0}
	var tr transitions
	f := newTestFailover(t, FailoverOptions{
		Primary: primary, Fallback: NewLocal(LocalOptions{}),
		RetryAfter: time.Second, Now: clock.Now, OnDegraded: tr.record,
	})
	ctx := context.Background()
	key := keySubject("fo", Limits{TPM: 6000, Concurrency: 3, TokensPerDay: 1_000_000}) // 100 tokens/s
	req := Request{Subjects: []Subject{key}, Tokens: 1000}

	start := time.Now()
	a, b := mustAdmit(t, f, req), mustAdmit(t, f, req)
	if !a.Allowed || !b.Allowed || a.Lease.issuer != primary || b.Lease.issuer != primary {
		t.Fatalf("healthy admissions: %+v %+v", a, b)
	}
	tr.check(t)

	srv.kill()
	// The first failure is a Settle: it marks the primary down and keeps the
	// settlement.
	if err := f.Settle(ctx, a.Lease, 300, 0); err != nil {
		t.Fatalf("Settle during the outage: %v", err)
	}
	if !f.Degraded() || f.Pending() != 1 {
		t.Fatalf("after a failed Settle: degraded %v, pending %d", f.Degraded(), f.Pending())
	}
	tr.check(t, true)

	h.n.Store(0)
	for i := range 5 {
		d := mustAdmit(t, f, req)
		if !d.Allowed || d.Lease.issuer != f.fallback {
			t.Fatalf("outage admission %d: %+v", i, d)
		}
		mustSettle(t, f, d.Lease, 100, 0)
	}
	mustSettle(t, f, b.Lease, 500, 0) // a primary lease, while the primary is down
	if f.Pending() != 7 {
		t.Fatalf("pending %d, want 2 settlements and 5 charges", f.Pending())
	}
	if st := peekKind(t, f, key, KindConcurrency); st.Used != 0 {
		t.Fatalf("Peek while degraded: %+v, want the fallback's state", st)
	}
	if n := h.n.Load(); n != 0 {
		t.Fatalf("%d Redis calls while degraded before RetryAfter", n)
	}

	srv.restart()
	clock.Set(lt0.Add(time.Second - time.Millisecond))
	if d := mustAdmit(t, f, req); d.Lease.issuer != f.fallback || h.n.Load() != 0 {
		t.Fatalf("before RetryAfter: issuer %v, %d Redis calls", d.Lease.issuer, h.n.Load())
	} else {
		mustSettle(t, f, d.Lease, 0, 0)
	}
	clock.Set(lt0.Add(time.Second))
	probe := mustAdmit(t, f, req)
	if !probe.Allowed || probe.Lease.issuer != primary || f.Degraded() {
		t.Fatalf("probe after restart: %+v, degraded %v", probe, f.Degraded())
	}
	tr.check(t, true, false)

	// The replay runs in the background: poll Redis, bounded.
	deadline := time.Now().Add(waitFor)
	for f.Pending() != 0 || peekKind(t, primary, key, KindConcurrency).Used != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("queued settlements never replayed: pending %d, Redis %+v", f.Pending(),
				peekKind(t, primary, key, KindConcurrency))
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Reserved 3×1000, settled to 300 and 500 with the probe still open,
	// and 5×100 charged from the fallback.
	if st := peekKind(t, primary, key, KindTokensPerDay); st.Used != 1300 || st.Reserved != 1000 {
		t.Fatalf("tokens per day %+v, want 1300 used and the probe's 1000 reserved", st)
	}
	st := peekKind(t, primary, key, KindTPM)
	if tol := refill(time.Since(start), 6000); st.Remaining < 4200 || st.Remaining > 4200+tol {
		t.Fatalf("TPM %+v, want 4200 remaining (+%d refill)", st, tol)
	}
	mustSettle(t, f, probe.Lease, 0, 0)
	if st := peekKind(t, f, key, KindConcurrency); st.Used != 0 {
		t.Fatalf("Redis concurrency after all settled: %+v", st)
	}
	if f.Dropped() != 0 {
		t.Fatalf("dropped %d", f.Dropped())
	}
	tr.check(t, true, false)
}

// TestFailoverDeny refuses with ErrUnavailable while Redis is down, from
// the very call that found it down, and without Redis calls afterwards.
func TestFailoverDeny(t *testing.T) {
	srv := startRedisServer(t)
	var h countHook
	clock := &localClock{t: lt0}
	var tr transitions
	f := newTestFailover(t, FailoverOptions{
		Primary: NewRedis(srv.clientWith(t, noRetry, &h), RedisOptions{}),
		Deny:    true, Now: clock.Now, OnDegraded: tr.record,
	})
	key := keySubject("deny", Limits{RPM: 100})
	req := Request{Subjects: []Subject{key}}
	if d := mustAdmit(t, f, req); !d.Allowed {
		t.Fatal(d)
	}
	srv.kill()
	if _, err := f.Admit(context.Background(), req); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Admit with Redis down: %v, want ErrUnavailable", err)
	}
	tr.check(t, true)
	h.n.Store(0)
	for range 3 {
		if _, err := f.Admit(context.Background(), req); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Admit while degraded: %v", err)
		}
		if _, err := f.Peek(context.Background(), []Subject{key}); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Peek while degraded: %v", err)
		}
	}
	if n := h.n.Load(); n != 0 {
		t.Fatalf("%d Redis calls while degraded before RetryAfter", n)
	}
	srv.restart()
	clock.Set(lt0.Add(DefaultFailoverRetryAfter))
	if d := mustAdmit(t, f, req); !d.Allowed || f.Degraded() {
		t.Fatalf("after restart: %+v, degraded %v", d, f.Degraded())
	}
	tr.check(t, true, false)
}

// TestRedisSettleRetryAppliesOnce loses the reply of a Settle that Redis
// applied: the retry that follows must change nothing.
func TestRedisSettleRetryAppliesOnce(t *testing.T) {
	srv := startRedisServer(t)
	var loss lossHook
	rl := NewRedis(srv.client(t, &loss), RedisOptions{})
	key := keySubject("once", Limits{TPM: 6000, Concurrency: 2, TokensPerDay: 1e6, CostPerDayMicros: 1e6})
	team := teamSubject("once", Limits{TPM: 60000, CostPerMonthMicros: 1e6})
	req := Request{Subjects: []Subject{key, team}, Tokens: 1000, CostMicros: 100}
	// Settle a first lease so that Redis has the script: a NOSCRIPT reply
	// replaced by a lost reply would hide that the script never ran.
	mustSettle(t, rl, mustAdmit(t, rl, req).Lease, 0, 0)
	d := mustAdmit(t, rl, req)
	start := time.Now()

	loss.lose.Store(1)
	if err := rl.Settle(context.Background(), d.Lease, 200, 20); !errors.Is(err, errReplyLost) {
		t.Fatalf("Settle with a lost reply: %v", err)
	}
	before, err := rl.Peek(context.Background(), []Subject{key, team})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // the retry, then a Settle of a settled lease
		mustSettle(t, rl, d.Lease, 200, 20)
	}
	after, err := rl.Peek(context.Background(), []Subject{key, team})
	if err != nil {
		t.Fatal(err)
	}
	want := map[Kind]int64{KindConcurrency: 0, KindTokensPerDay: 200, KindCostPerDay: 20, KindCostPerMonth: 20}
	if len(after) != len(before) || len(after) != 6 {
		t.Fatalf("Peek: %+v then %+v", before, after)
	}
	for i, a := range after {
		b := before[i]
		if w, ok := want[a.Kind]; ok && (a.Used != w || b.Used != w) {
			t.Fatalf("%v %v: used %d then %d, want %d (applied once)", a.Scope, a.Kind, b.Used, a.Used, w)
		}
		if tol := refill(time.Since(start), a.Limit); a.Kind == KindTPM && (a.Remaining < b.Remaining || a.Remaining > b.Remaining+tol) {
			t.Fatalf("%v TPM moved by the retry: %+v then %+v", a.Scope, b, a)
		}
	}
}

// TestFailoverReplayOfAppliedSettleIsHarmless loses a Settle's reply under
// the Failover: the settlement is queued and replayed after the probe, and
// Redis applies it once.
func TestFailoverReplayOfAppliedSettleIsHarmless(t *testing.T) {
	srv := startRedisServer(t)
	var loss lossHook
	primary := NewRedis(srv.clientWith(t, noRetry, &loss), RedisOptions{})
	clock := &localClock{t: lt0}
	f := newTestFailover(t, FailoverOptions{Primary: primary, Fallback: NewLocal(LocalOptions{}), Now: clock.Now})
	key := keySubject("lost", Limits{Concurrency: 5, TokensPerDay: 1e6})
	req := Request{Subjects: []Subject{key}, Tokens: 1000}
	mustSettle(t, f, mustAdmit(t, f, req).Lease, 0, 0) // loads the scripts
	d := mustAdmit(t, f, req)
	loss.lose.Store(1)
	mustSettle(t, f, d.Lease, 10, 0)
	if !f.Degraded() || f.Pending() != 1 {
		t.Fatalf("degraded %v, pending %d", f.Degraded(), f.Pending())
	}
	clock.Set(lt0.Add(DefaultFailoverRetryAfter))
	probe := mustAdmit(t, f, req) // reserves 1000 more
	if probe.Lease.issuer != primary {
		t.Fatal("no probe")
	}
	if err := f.Retry(context.Background()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(waitFor)
	for f.Pending() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("never replayed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st := peekKind(t, primary, key, KindTokensPerDay); st.Used != 10 || st.Reserved != 1000 {
		t.Fatalf("tokens per day %+v, want 10 settled + 1000 open", st)
	}
	if st := peekKind(t, primary, key, KindConcurrency); st.Used != 1 {
		t.Fatalf("concurrency %+v, want the probe's lease only", st)
	}
}

// TestFailoverOneProbe holds the probe in flight: meanwhile every other
// admission is answered by the fallback without touching Redis.
func TestFailoverOneProbe(t *testing.T) {
	srv := startRedisServer(t)
	gate := newGateHook()
	primary := NewRedis(srv.clientWith(t, noRetry, gate), RedisOptions{})
	clock := &localClock{t: lt0}
	f := newTestFailover(t, FailoverOptions{Primary: primary, Fallback: NewLocal(LocalOptions{}), Now: clock.Now})
	req := Request{Subjects: []Subject{keySubject("probe", Limits{RPM: 1000})}}

	srv.kill()
	if d := mustAdmit(t, f, req); d.Lease.issuer != f.fallback {
		t.Fatal("the failing call was not answered by the fallback")
	}
	srv.restart()
	clock.Set(lt0.Add(DefaultFailoverRetryAfter))
	gate.n.Store(0)
	gate.armed.Store(true)
	probed := make(chan Decision, 1)
	go func() {
		d, _ := f.Admit(context.Background(), req)
		probed <- d
	}()
	select {
	case <-gate.entered:
	case <-time.After(waitFor):
		t.Fatal("the probe never reached Redis")
	}
	for range 10 {
		if d := mustAdmit(t, f, req); d.Lease.issuer != f.fallback {
			t.Fatal("a second caller probed")
		}
	}
	if n := gate.n.Load(); n != 1 {
		t.Fatalf("%d Redis calls, want the probe's only", n)
	}
	close(gate.release)
	if d := <-probed; !d.Allowed || d.Lease.issuer != primary || f.Degraded() {
		t.Fatalf("probe: %+v, degraded %v", d, f.Degraded())
	}
}

// TestFailoverQueueBound drops settlements past MaxPending, and Close drops
// (and counts) what is still queued.
func TestFailoverQueueBound(t *testing.T) {
	srv := startRedisServer(t)
	f := newTestFailover(t, FailoverOptions{
		Primary:  NewRedis(srv.clientWith(t, noRetry), RedisOptions{}),
		Fallback: NewLocal(LocalOptions{}), MaxPending: 2,
	})
	req := Request{Subjects: []Subject{keySubject("q", Limits{Concurrency: 10})}}
	var leases []*Lease
	for range 3 {
		leases = append(leases, mustAdmit(t, f, req).Lease)
	}
	srv.kill()
	mustSettle(t, f, leases[0], 0, 0)
	mustSettle(t, f, leases[1], 0, 0)
	if err := f.Settle(context.Background(), leases[2], 0, 0); err == nil {
		t.Fatal("Settle past MaxPending reported no error")
	}
	if f.Pending() != 2 || f.Dropped() != 1 {
		t.Fatalf("pending %d, dropped %d; want 2, 1", f.Pending(), f.Dropped())
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if f.Pending() != 0 || f.Dropped() != 3 {
		t.Fatalf("after Close: pending %d, dropped %d; want 0, 3", f.Pending(), f.Dropped())
	}
	if _, err := f.Admit(context.Background(), req); !errors.Is(err, ErrClosed) {
		t.Fatalf("Admit after Close: %v", err)
	}
	if err := f.Settle(context.Background(), leases[0], 0, 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("Settle after Close: %v", err)
	}
}

// TestFailoverCloseStopsReplay closes the Failover while its replay
// goroutine works through a long queue; TestMain's goleak check fails the
// package if the goroutine outlives Close.
func TestFailoverCloseStopsReplay(t *testing.T) {
	srv := startRedisServer(t)
	clock := &localClock{t: lt0}
	f := newTestFailover(t, FailoverOptions{
		Primary:  NewRedis(srv.clientWith(t, noRetry), RedisOptions{}),
		Fallback: NewLocal(LocalOptions{}), Now: clock.Now,
	})
	req := Request{Subjects: []Subject{keySubject("close", Limits{Concurrency: 1000})}}
	var leases []*Lease
	for range 200 {
		leases = append(leases, mustAdmit(t, f, req).Lease)
	}
	srv.kill()
	for _, l := range leases {
		mustSettle(t, f, l, 0, 0)
	}
	srv.restart()
	clock.Set(lt0.Add(DefaultFailoverRetryAfter))
	mustAdmit(t, f, req) // the probe starts the replay
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if p := f.Pending(); p != 0 {
		t.Fatalf("pending %d after Close", p)
	}
}

// TestFailoverCallerContext: a cancelled caller says nothing about Redis.
// Admit returns the error without degrading; Settle keeps the settlement
// and the next successful call replays it.
func TestFailoverCallerContext(t *testing.T) {
	srv := startRedisServer(t)
	primary := NewRedis(srv.clientWith(t, noRetry), RedisOptions{})
	f := newTestFailover(t, FailoverOptions{Primary: primary, Fallback: NewLocal(LocalOptions{})})
	key := keySubject("ctx", Limits{Concurrency: 5})
	req := Request{Subjects: []Subject{key}}
	d := mustAdmit(t, f, req)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := f.Admit(ctx, req); !errors.Is(err, context.Canceled) {
		t.Fatalf("Admit with a cancelled ctx: %v", err)
	}
	if err := f.Settle(ctx, d.Lease, 0, 0); err != nil {
		t.Fatalf("Settle with a cancelled ctx: %v", err)
	}
	if f.Degraded() || f.Pending() != 1 {
		t.Fatalf("degraded %v, pending %d; want false, 1", f.Degraded(), f.Pending())
	}
	mustAdmit(t, f, req)
	deadline := time.Now().Add(waitFor)
	for f.Pending() != 0 || peekKind(t, primary, key, KindConcurrency).Used != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("never replayed: pending %d", f.Pending())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFailoverDeadlineDuringCall: a deadline that passes while Redis has
// not answered marks it down, and the same call is answered by the
// fallback.
func TestFailoverDeadlineDuringCall(t *testing.T) {
	srv := startRedisServer(t)
	gate := newGateHook()
	f := newTestFailover(t, FailoverOptions{
		Primary:  NewRedis(srv.clientWith(t, noRetry, gate), RedisOptions{}),
		Fallback: NewLocal(LocalOptions{}),
	})
	req := Request{Subjects: []Subject{keySubject("slow", Limits{RPM: 100})}}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	gate.armed.Store(true)
	go func() {
		<-gate.entered
		<-ctx.Done()
		close(gate.release)
	}()
	d, err := f.Admit(ctx, req)
	if err != nil || !d.Allowed || d.Lease.issuer != f.fallback || !f.Degraded() {
		t.Fatalf("Admit past its deadline: %+v, %v, degraded %v", d, err, f.Degraded())
	}
}

func TestNewFailoverNeedsAFallbackOrDeny(t *testing.T) {
	if f, err := NewFailover(FailoverOptions{Primary: NewLocal(LocalOptions{})}); err == nil || f != nil {
		t.Fatalf("NewFailover without a fallback in allow mode: %v, %v", f, err)
	}
	if f, err := NewFailover(FailoverOptions{Fallback: NewLocal(LocalOptions{})}); err == nil || f != nil {
		t.Fatalf("NewFailover without a primary: %v, %v", f, err)
	}
	f, err := NewFailover(FailoverOptions{Primary: NewLocal(LocalOptions{}), Deny: true})
	if err != nil {
		t.Fatalf("NewFailover in deny mode without a fallback: %v", err)
	}
	_ = f.Close()
}

// BenchmarkFailoverOverhead compares Admit+Settle of a key and its team on
// a bare limiter and on a healthy Failover around it: on Local, where the
// Failover's own cost is visible, and on Redis.
func BenchmarkFailoverOverhead(b *testing.B) {
	srv := startRedisServer(b)
	req := Request{Subjects: []Subject{
		keySubject("bench", Limits{RPM: 1e9, TPM: 1e12, Concurrency: 1e6, TokensPerDay: 1e15}),
		teamSubject("bench", Limits{RPM: 1e9, CostPerDayMicros: 1e15}),
	}, Tokens: 100, CostMicros: 10}
	failover := func(o FailoverOptions) Limiter {
		f, err := NewFailover(o)
		if err != nil {
			b.Fatal(err)
		}
		return f
	}
	run := func(b *testing.B, l Limiter) {
		defer l.Close()
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			d, err := l.Admit(ctx, req)
			if err != nil || !d.Allowed {
				b.Fatal(d, err)
			}
			if err := l.Settle(ctx, d.Lease, 90, 9); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("local", func(b *testing.B) { run(b, NewLocal(LocalOptions{})) })
	b.Run("failover-local", func(b *testing.B) {
		run(b, failover(FailoverOptions{Primary: NewLocal(LocalOptions{}), Fallback: NewLocal(LocalOptions{})}))
	})
	client := srv.client(b)
	b.Run("redis", func(b *testing.B) { run(b, NewRedis(client, RedisOptions{})) })
	b.Run("failover-redis", func(b *testing.B) {
		run(b, failover(FailoverOptions{Primary: NewRedis(client, RedisOptions{}), Fallback: NewLocal(LocalOptions{})}))
	})
}

// busyScript keeps Redis busy for ARGV[1] ms of its own clock, as a slow
// Redis would be; it stays below lua-time-limit (5 s), so other clients'
// commands wait instead of getting BUSY.
const busyScript = `
local t = redis.call('TIME')
local start = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = 0
while true do
  t = redis.call('TIME')
  n = n + 1
  if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - start >= tonumber(ARGV[1]) then return n end
end`

// sendHook closes sent when its client first sends a command.
type sendHook struct {
	once sync.Once
	sent chan struct{}
}

func (h *sendHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *sendHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.once.Do(func() { close(h.sent) })
		return next(ctx, cmd)
	}
}
func (h *sendHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestFailoverUndoesTimedOutAdmission: the limiter's client times out while
// a slow Redis still has the admission to run, and runs it afterwards. The
// Failover answers from the fallback and queues the undo of the attempted
// lease; once replayed, Redis holds no slot and its TPM and budgets are back
// where they were before the request (whose clamped reservation is taken
// back exactly). Only its RPM unit stays spent.
func TestFailoverUndoesTimedOutAdmission(t *testing.T) {
	srv := startRedisServer(t)
	opts := noRetry
	opts.ReadTimeout = 100 * time.Millisecond
	undoesTimedOutAdmission(t, srv.clientWith(t, opts), "", srv.Server)
}

// undoesTimedOutAdmission runs TestFailoverUndoesTimedOutAdmission with a
// primary on client, whose read timeout must be 100 ms, and keys under
// prefix (empty: the default), which busy serves.
func undoesTimedOutAdmission(t *testing.T, client redis.UniversalClient, prefix string, busy *redistest.Server) {
	t.Helper()
	primary := NewRedis(client, RedisOptions{Prefix: prefix})
	clock := &localClock{t: lt0}
	f := newTestFailover(t, FailoverOptions{Primary: primary, Fallback: NewLocal(LocalOptions{}), Now: clock.Now})
	ctx := context.Background()
	key := keySubject("slow", Limits{TPM: 60000, Concurrency: 2, TokensPerDay: 2000})
	team := teamSubject("slow", Limits{RPM: 600, CostPerDayMicros: 1_000_000})
	req := Request{Subjects: []Subject{key, team}, Tokens: 1000, CostMicros: 100}
	// 1500 tokens used today: the next admission reserves the 500 left.
	mustSettle(t, f, mustAdmit(t, f, req).Lease, 1500, 50)
	start := time.Now()
	before, err := primary.Peek(ctx, req.Subjects)
	if err != nil {
		t.Fatal(err)
	}

	sending := &sendHook{sent: make(chan struct{})}
	busyClient := busy.Client(t, sending)
	busyDone := make(chan error, 1)
	go func() { busyDone <- busyClient.Eval(ctx, busyScript, nil, 1500).Err() }()
	// Wait, bounded, until the busy script is sent and Redis stops
	// answering: it runs.
	<-sending.sent
	ping := busy.ClientWith(t, redis.Options{MaxRetries: -1, ReadTimeout: 50 * time.Millisecond})
	deadline := time.Now().Add(waitFor)
	for ping.Ping(ctx).Err() == nil {
		if time.Now().After(deadline) {
			t.Fatal("Redis never got busy")
		}
		time.Sleep(time.Millisecond)
	}
	d, err := f.Admit(ctx, req)
	if err != nil || !d.Allowed || d.Lease.issuer != f.fallback || !f.Degraded() || f.Pending() != 1 {
		t.Fatalf("Admit on a slow Redis: %+v, %v; degraded %v, pending %d", d, err, f.Degraded(), f.Pending())
	}
	mustSettle(t, f, d.Lease, 0, 0)
	if err := <-busyDone; err != nil {
		t.Fatal(err)
	}
	// The admission ran after its caller gave up.
	if st := peekKind(t, primary, key, KindConcurrency); st.Used != 1 {
		t.Fatalf("concurrency %+v: the timed-out admission never ran, the test proves nothing", st)
	}
	if st := peekKind(t, primary, key, KindTokensPerDay); st.Used != 1500 || st.Reserved != 500 {
		t.Fatalf("tokens per day %+v, want the clamped 500 reserved", st)
	}

	if err := f.Retry(ctx); err != nil {
		t.Fatal(err)
	}
	if f.Pending() != 0 || f.Degraded() {
		t.Fatalf("after the replay: pending %d, degraded %v", f.Pending(), f.Degraded())
	}
	after, err := primary.Peek(ctx, req.Subjects)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) || len(after) != 5 {
		t.Fatalf("Peek: %+v then %+v", before, after)
	}
	for i, a := range after {
		b := before[i]
		want, tol := b.Remaining, int64(0)
		switch a.Kind {
		case KindRPM:
			want-- // the request stays counted
			tol = refill(time.Since(start), a.Limit)
		case KindTPM:
			tol = refill(time.Since(start), a.Limit)
		}
		if a.Kind != b.Kind || a.Remaining < want || a.Remaining > want+tol {
			t.Fatalf("after the undo: %+v; before the request %+v", a, b)
		}
	}
}

// chargeLossHook is lossHook for charges only: it loses the replies of the
// first lose round trips that run chargeScript.
type chargeLossHook struct{ lose atomic.Int64 }

func charges(cmds ...redis.Cmder) bool {
	for _, c := range cmds {
		if args := c.Args(); len(args) > 1 && args[1] == chargeScript.Hash() {
			return true
		}
	}
	return false
}

func (h *chargeLossHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *chargeLossHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if charges(cmd) && h.lose.Add(-1) >= 0 {
			cmd.SetErr(errReplyLost)
			return errReplyLost
		}
		return err
	}
}
func (h *chargeLossHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if charges(cmds...) && h.lose.Add(-1) >= 0 {
			for _, c := range cmds {
				c.SetErr(errReplyLost)
			}
			return errReplyLost
		}
		return err
	}
}

// TestFailoverChargesFallbackUsage kills Redis: the usage that requests
// admitted by the fallback settle during the outage reaches Redis's budget
// counters after the restart, once, although the first replay of a charge
// loses its reply and is replayed again, and although a lease is settled
// twice. The undo of the admission that found Redis down, which never ran
// there, changes nothing.
func TestFailoverChargesFallbackUsage(t *testing.T) {
	srv := startPersistentRedisServer(t)
	var loss chargeLossHook
	client := srv.clientWith(t, noRetry, &loss)
	primary := NewRedis(client, RedisOptions{})
	clock := &localClock{t: lt0}
	// The fallback runs on the real clock, as Redis does: its leases'
	// windows are Redis's current ones.
	f := newTestFailover(t, FailoverOptions{Primary: primary, Fallback: NewLocal(LocalOptions{}), Now: clock.Now})
	ctx := context.Background()
	key := keySubject("spent", Limits{RPM: 1000, TokensPerDay: 1e6, CostPerDayMicros: 1e6})
	team := teamSubject("spent", Limits{CostPerMonthMicros: 1e6})
	req := Request{Subjects: []Subject{key, team}, Tokens: 1000, CostMicros: 100}
	mustSettle(t, f, mustAdmit(t, f, req).Lease, 100, 10)

	srv.kill()
	a, b := mustAdmit(t, f, req), mustAdmit(t, f, req)
	if a.Lease.issuer != f.fallback || b.Lease.issuer != f.fallback {
		t.Fatal("not admitted by the fallback")
	}
	mustSettle(t, f, a.Lease, 300, 30)
	mustSettle(t, f, b.Lease, 200, 20)
	mustSettle(t, f, a.Lease, 300, 30) // a second Settle charges nothing more
	if f.Pending() != 3 {
		t.Fatalf("pending %d, want an undo and 2 charges", f.Pending())
	}

	srv.restart()
	// The restart emptied the script cache: load it, so that the lost reply
	// below is the reply of a charge that ran, not of a NOSCRIPT.
	if err := chargeScript.Load(ctx, client).Err(); err != nil {
		t.Fatal(err)
	}
	loss.lose.Store(1)
	if err := f.Retry(ctx); !errors.Is(err, errReplyLost) {
		t.Fatalf("replay with a lost reply: %v", err)
	}
	if f.Pending() != 2 {
		t.Fatalf("pending %d after a lost reply, want the 2 charges", f.Pending())
	}
	for range 2 {
		if err := f.Retry(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if f.Pending() != 0 || f.Dropped() != 0 {
		t.Fatalf("pending %d, dropped %d", f.Pending(), f.Dropped())
	}
	for _, w := range []struct {
		s    Subject
		k    Kind
		used int64
	}{{key, KindTokensPerDay, 600}, {key, KindCostPerDay, 60}, {team, KindCostPerMonth, 60}} {
		if st := peekKind(t, primary, w.s, w.k); st.Used != w.used {
			t.Fatalf("%v %v after recovery: %+v, want %d", w.s.Scope, w.k, st, w.used)
		}
	}
}
