package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestRedisHugeUsage settles, charges and admits usage far beyond what the
// scripts' doubles print as integers (1e17 and more made INCRBY fail with
// "value is not an integer"): every call succeeds, the budgets count the
// clamped maximum, and the TPM bucket is pinned shut rather than wrapped
// open.
func TestRedisHugeUsage(t *testing.T) {
	rl := NewRedis(startRedis(t), RedisOptions{})
	ctx := context.Background()
	key := keySubject("huge", Limits{TPM: 6000, Concurrency: 5, TokensPerDay: math.MaxInt64, CostPerDayMicros: 1e18})
	team := teamSubject("huge", Limits{CostPerMonthMicros: math.MaxInt64})
	req := Request{Subjects: []Subject{key, team}, Tokens: 1000, CostMicros: 100}

	d := mustAdmit(t, rl, req)
	if err := rl.Settle(ctx, d.Lease, 1e17, math.MaxInt64); err != nil {
		t.Fatalf("Settle of huge usage: %v", err)
	}
	for _, w := range []struct {
		s Subject
		k Kind
	}{{key, KindTokensPerDay}, {key, KindCostPerDay}, {team, KindCostPerMonth}} {
		if st := peekKind(t, rl, w.s, w.k); st.Used != maxScriptArg {
			t.Fatalf("%v %v after a huge settlement: %+v, want the clamp %d", w.s.Scope, w.k, st, int64(maxScriptArg))
		}
	}
	if st := peekKind(t, rl, key, KindTPM); st.Remaining != 0 || st.Reset < 100*365*24*time.Hour {
		t.Fatalf("TPM after a huge settlement: %+v, want pinned shut", st)
	}
	if st := peekKind(t, rl, key, KindConcurrency); st.Used != 0 {
		t.Fatalf("concurrency %+v, want the lease released", st)
	}
	if err := rl.Charge(ctx, []Subject{team}, time.Now(), 0, 1e18, "huge-charge"); err != nil {
		t.Fatalf("Charge of huge usage: %v", err)
	}
	if st := peekKind(t, rl, team, KindCostPerMonth); st.Used != 2*maxScriptArg {
		t.Fatalf("cost per month after a huge charge: %+v, want %d", st, int64(2*maxScriptArg))
	}
	// An admission with the largest estimate the proxy can send is answered
	// (refused by the pinned TPM bucket), not failed.
	d, err := rl.Admit(ctx, Request{Subjects: []Subject{key}, Tokens: math.MaxInt64, CostMicros: math.MaxInt64})
	if err != nil || d.Allowed || d.Refused.Kind != KindTPM {
		t.Fatalf("Admit of a huge estimate: %+v, %v; want refused by TPM", d, err)
	}
}

// breakLeases turns s's lease set into a string, so that every script that
// touches it fails with WRONGTYPE: an error reply that blames the data, not
// Redis's availability.
func breakLeases(t *testing.T, c *redis.Client, s Subject) {
	t.Helper()
	k := NewRedis(c, RedisOptions{}).keys(s).leases
	if err := c.Set(context.Background(), k, "not a zset", 0).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestFailoverErrorReplyIsNotAnOutage: an error reply of Redis (here
// WRONGTYPE on one subject's keys) neither marks the primary down nor
// stays queued. The admission it fails is answered by the fallback while
// other subjects keep using Redis; the settlement or replay it fails is
// dropped and counted, and the replay goes on with the next operation.
func TestFailoverErrorReplyIsNotAnOutage(t *testing.T) {
	srv := startPersistentRedisServer(t)
	client := srv.clientWith(t, noRetry)
	primary := NewRedis(client, RedisOptions{})
	clock := &localClock{t: lt0}
	var tr transitions
	f := newTestFailover(t, FailoverOptions{Primary: primary, Fallback: NewLocal(LocalOptions{}),
		Now: clock.Now, OnDegraded: tr.record})
	ctx := context.Background()
	lim := Limits{Concurrency: 5, TokensPerDay: 1e6}
	broken, fine := keySubject("broken", lim), keySubject("fine", lim)

	breakLeases(t, client, broken)
	if d := mustAdmit(t, f, Request{Subjects: []Subject{broken}, Tokens: 10}); !d.Allowed || d.Lease.issuer != f.fallback {
		t.Fatalf("admission failing with WRONGTYPE: %+v, want the fallback's", d)
	}
	if d := mustAdmit(t, f, Request{Subjects: []Subject{fine}, Tokens: 10}); d.Lease.issuer != primary {
		t.Fatal("the next admission of another subject did not use Redis")
	}
	// The undo of the failed admission fails the same way: it is dropped.
	deadline := time.Now().Add(waitFor)
	for f.Dropped() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the undo was never replayed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if f.Degraded() || f.Faults() != 2 || f.Dropped() != 1 {
		t.Fatalf("after an error reply: degraded %v, faults %d, dropped %d; want false, 2, 1",
			f.Degraded(), f.Faults(), f.Dropped())
	}

	// A settlement that fails with an error reply is dropped at once.
	late := keySubject("late", lim)
	d := mustAdmit(t, f, Request{Subjects: []Subject{late}, Tokens: 10})
	breakLeases(t, client, late)
	if err := f.Settle(ctx, d.Lease, 5, 0); err == nil {
		t.Fatal("Settle failing with WRONGTYPE reported no error")
	}
	if f.Degraded() || f.Pending() != 0 || f.Dropped() != 2 || f.Faults() != 3 {
		t.Fatalf("after a failed Settle: degraded %v, pending %d, dropped %d, faults %d",
			f.Degraded(), f.Pending(), f.Dropped(), f.Faults())
	}

	// During an outage both settlements are queued; the replay drops the
	// one Redis refuses and applies the other.
	bad, good := keySubject("bad", lim), keySubject("good", lim)
	a := mustAdmit(t, f, Request{Subjects: []Subject{bad}, Tokens: 10})
	b := mustAdmit(t, f, Request{Subjects: []Subject{good}, Tokens: 10})
	srv.kill()
	mustSettle(t, f, a.Lease, 5, 0)
	mustSettle(t, f, b.Lease, 5, 0)
	if !f.Degraded() || f.Pending() != 2 {
		t.Fatalf("outage: degraded %v, pending %d", f.Degraded(), f.Pending())
	}
	srv.restart()
	breakLeases(t, client, bad)
	if err := f.Retry(ctx); err == nil {
		t.Fatal("Retry reported no error for the refused settlement")
	}
	if f.Degraded() || f.Pending() != 0 || f.Dropped() != 3 || f.Faults() != 4 {
		t.Fatalf("after the replay: degraded %v, pending %d, dropped %d, faults %d",
			f.Degraded(), f.Pending(), f.Dropped(), f.Faults())
	}
	if st := peekKind(t, primary, good, KindConcurrency); st.Used != 0 {
		t.Fatalf("the good settlement was not replayed: %+v", st)
	}
	if st := peekKind(t, primary, good, KindTokensPerDay); st.Used != 5 {
		t.Fatalf("tokens per day %+v, want 5", st)
	}
	tr.check(t, true, false)
}

// replyErr is an error reply as go-redis returns it (redis.Error).
type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}

var _ redis.Error = replyErr("")

func TestOperationFault(t *testing.T) {
	for _, c := range []struct {
		err   error
		fault bool
	}{
		{nil, false},
		{replyErr("ERR value is not an integer or out of range script: 1f, on @user_script:56."), true},
		{replyErr("WRONGTYPE Operation against a key holding the wrong kind of value"), true},
		{replyErr("ERR user_script:3: Script attempted to access nonexistent global variable 'x'"), true},
		{replyErr("BUSYKEY Target key name already exists."), true},
		{replyErr("BUSYGROUP Consumer Group name already exists"), true},
		{replyErr("CROSSSLOT Keys in request don't hash to the same slot"), true},
		{fmt.Errorf("ratelimit: redis settle: %w", errBadReply), true},
		// Redis 6 wraps errors raised inside scripts.
		{replyErr("ERR Error running script (call to f_3c6b): @user_script:12: @user_script: 12: -READONLY You can't write against a read only replica."), false},
		{replyErr("ERR Error running script (call to f_3c6b): @user_script:5: -OOM command not allowed when used memory > 'maxmemory'."), false},
		{replyErr("ERR Error running script (call to f_3c6b): @user_script:5: WRONGTYPE Operation against a key holding the wrong kind of value"), true},
		{replyErr("LOADING Redis is loading the dataset in memory"), false},
		{replyErr("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSCRIPT."), false},
		{replyErr("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."), false},
		{replyErr("CLUSTERDOWN The cluster is down"), false},
		{replyErr("TRYAGAIN Multiple keys request during rehashing of slot"), false},
		{replyErr("READONLY You can't write against a read only replica."), false},
		{replyErr("NOREPLICAS Not enough good replicas to write."), false},
		{replyErr("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk."), false},
		{replyErr("OOM command not allowed when used memory > 'maxmemory'."), false},
		{replyErr("NOAUTH Authentication required."), false},
		{replyErr("ERR max number of clients reached"), false},
		{fmt.Errorf("ratelimit: redis admit: %w", replyErr("LOADING Redis is loading the dataset in memory")), false},
		{&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, false},
		{context.DeadlineExceeded, false},
		{redis.ErrClosed, false},
		{redis.ErrPoolTimeout, false},
		{io.EOF, false},
	} {
		if got := operationFault(c.err); got != c.fault {
			t.Errorf("operationFault(%v) = %v, want %v", c.err, got, c.fault)
		}
	}
}

// TestFailoverUnavailableReplyIsAnOutage turns the real Redis into a
// replica of a master that does not answer: its READONLY reply to the
// admission script, and then its MASTERDOWN reply, are outages that send
// the traffic to the fallback until it is a master again.
func TestFailoverUnavailableReplyIsAnOutage(t *testing.T) {
	srv := startRedisServer(t)
	admin := srv.client(t)
	primary := NewRedis(srv.clientWith(t, noRetry), RedisOptions{})
	clock := &localClock{t: lt0}
	var tr transitions
	f := newTestFailover(t, FailoverOptions{Primary: primary, Fallback: NewLocal(LocalOptions{}),
		Now: clock.Now, OnDegraded: tr.record})
	ctx := context.Background()
	req := Request{Subjects: []Subject{keySubject("replica", Limits{Concurrency: 5})}}
	mustSettle(t, f, mustAdmit(t, f, req).Lease, 0, 0)

	// Port 1 on loopback refuses: the replica never reaches its master.
	if err := admin.Do(ctx, "REPLICAOF", "127.0.0.1", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := primary.Admit(ctx, req); !redis.IsReadOnlyError(err) {
		t.Fatalf("Admit on a replica: %v, want READONLY (the test proves nothing otherwise)", err)
	}
	if d := mustAdmit(t, f, req); d.Lease.issuer != f.fallback || !f.Degraded() {
		t.Fatalf("Admit on a replica: issuer %v, degraded %v; want the fallback, degraded", d.Lease.issuer, f.Degraded())
	}
	if err := admin.ConfigSet(ctx, "replica-serve-stale-data", "no").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := primary.Peek(ctx, req.Subjects); !redis.IsMasterDownError(err) {
		t.Fatalf("Peek on a replica without stale data: %v, want MASTERDOWN", err)
	}
	clock.Set(lt0.Add(DefaultFailoverRetryAfter))
	if _, err := f.Peek(ctx, req.Subjects); err != nil || !f.Degraded() {
		t.Fatalf("probe by Peek on MASTERDOWN: %v, degraded %v", err, f.Degraded())
	}
	if err := admin.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	clock.Set(lt0.Add(2 * DefaultFailoverRetryAfter))
	if d := mustAdmit(t, f, req); d.Lease.issuer != primary || f.Degraded() {
		t.Fatalf("Admit on a master again: issuer %v, degraded %v", d.Lease.issuer, f.Degraded())
	}
	if f.Faults() != 0 {
		t.Fatalf("faults %d, want 0: unavailability is no fault", f.Faults())
	}
	tr.check(t, true, false)
}

// TestRedisBusyReplyIsAnOutage: a script that runs past busy-reply-threshold
// makes Redis answer BUSY to every other client, which is an outage.
func TestRedisBusyReplyIsAnOutage(t *testing.T) {
	srv := startRedisServer(t)
	admin := srv.client(t)
	ctx := context.Background()
	if err := admin.ConfigSet(ctx, "busy-reply-threshold", "50").Err(); err != nil {
		t.Fatal(err)
	}
	primary := NewRedis(srv.clientWith(t, noRetry), RedisOptions{})
	busyClient := srv.client(t)
	busy := make(chan error, 1)
	go func() { busy <- busyClient.Eval(ctx, busyScript, nil, 1000).Err() }()
	var err error
	deadline := time.Now().Add(waitFor)
	for {
		_, err = primary.Peek(ctx, []Subject{keySubject("busy", Limits{RPM: 10})})
		if err != nil && strings.HasPrefix(err.Error(), "ratelimit: redis peek: BUSY ") || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err == nil || !strings.Contains(err.Error(), ": BUSY ") || operationFault(err) {
		t.Fatalf("Peek while a script runs too long: %v, fault %v; want BUSY, an outage", err, operationFault(err))
	}
	if err := <-busy; err != nil {
		t.Fatal(err)
	}
}
