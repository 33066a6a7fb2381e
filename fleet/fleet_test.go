package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-llm/tollgate/internal/redistest"
)

// testInterval is short so that tests wait little; testTTL is long enough
// that a loaded machine's late heartbeat drops no live replica.
const testInterval, testTTL = 20 * time.Millisecond, 300 * time.Millisecond

func newTestFleet(t *testing.T, c redis.UniversalClient, id string) *Fleet {
	t.Helper()
	f, err := New(context.Background(), c, Options{ID: id, Interval: testInterval, TTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close(context.Background()) })
	return f
}

// waitLive waits (bounded) until f counts want replicas.
func waitLive(t *testing.T, f *Fleet, want int) {
	t.Helper()
	for range 500 {
		if f.Live() == want {
			return
		}
		time.Sleep(testInterval / 2)
	}
	t.Fatalf("replica %s counts %d replicas, want %d", f.ID(), f.Live(), want)
}

// TestFleetCountsTheReplicasThatBeat: three replicas count three; one that
// closes is gone from the others' count at their next heartbeat; one that
// stopped beating without leaving (a crash) counts until its TTL passes.
func TestFleetCountsTheReplicasThatBeat(t *testing.T) {
	srv := redistest.Start(t)
	a := newTestFleet(t, srv.Client(t), "a")
	b := newTestFleet(t, srv.Client(t), "b")
	c := newTestFleet(t, srv.Client(t), "c")
	waitLive(t, a, 3)
	waitLive(t, c, 3)
	if err := b.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	waitLive(t, a, 2)

	// A replica that crashed just now: its last heartbeat is Redis's now.
	ctl := srv.Client(t)
	now, err := ctl.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := ctl.ZAdd(context.Background(), "tollgate:fleet",
		redis.Z{Score: float64(now.UnixMicro()), Member: "crashed"}).Err(); err != nil {
		t.Fatal(err)
	}
	waitLive(t, a, 3)
	waitLive(t, a, 2) // once its TTL has passed
	if a.Beats() < 3 {
		t.Fatalf("a beat %d times", a.Beats())
	}
}

// TestFleetKeepsTheLastCountWhileRedisIsDown: with Redis gone, the count is
// the fleet as it was, not 1 (which would hand each replica the whole
// limit); when Redis returns the count is read again.
func TestFleetKeepsTheLastCountWhileRedisIsDown(t *testing.T) {
	srv := redistest.Start(t)
	opts := redis.Options{MaxRetries: -1, DialerRetries: 1}
	a := newTestFleet(t, srv.ClientWith(t, opts), "a")
	b := newTestFleet(t, srv.ClientWith(t, opts), "b")
	waitLive(t, a, 2)
	srv.Kill()
	before := a.Beats()
	time.Sleep(10 * testInterval)
	if a.Beats() != before {
		t.Fatalf("heartbeats counted while Redis was down: %d then %d", before, a.Beats())
	}
	if a.Live() != 2 || b.Live() != 2 {
		t.Fatalf("counts while Redis is down: %d and %d, want the last ones, 2", a.Live(), b.Live())
	}
	srv.Start()
	for range 500 {
		if a.Beats() > before {
			break
		}
		time.Sleep(testInterval / 2)
	}
	waitLive(t, a, 2)
}

// TestFleetStartsAtOneWithoutRedis: a replica that never reached Redis
// counts itself alone.
func TestFleetStartsAtOneWithoutRedis(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.ClientWith(t, redis.Options{MaxRetries: -1, DialerRetries: 1})
	srv.Kill()
	f := newTestFleet(t, c, "")
	if f.Live() != 1 || f.Beats() != 0 {
		t.Fatalf("Live %d, Beats %d without Redis", f.Live(), f.Beats())
	}
	if len(f.ID()) != 16 {
		t.Fatalf("random id %q", f.ID())
	}
}

func TestNewRefusesAPrefixThatMovesTheHashTag(t *testing.T) {
	srv := redistest.Start(t)
	if _, err := New(context.Background(), srv.Client(t), Options{Prefix: "a{b}"}); err == nil {
		t.Fatal("a prefix with braces was accepted")
	}
	if _, err := New(context.Background(), nil, Options{}); err == nil {
		t.Fatal("a nil client was accepted")
	}
}

// TestRecentKeepsTheFleetFromBefore: once two of three replicas are gone
// from the heartbeats (as after a Redis restarted empty, before the others
// beat again), Live counts one and Recent still three.
func TestRecentKeepsTheFleetFromBefore(t *testing.T) {
	srv := redistest.Start(t)
	a := newTestFleet(t, srv.Client(t), "a")
	b := newTestFleet(t, srv.Client(t), "b")
	c := newTestFleet(t, srv.Client(t), "c")
	waitLive(t, a, 3)
	for _, f := range []*Fleet{b, c} {
		if err := f.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	waitLive(t, a, 1)
	if got := a.Recent(); got != 3 {
		t.Errorf("Recent = %d after two replicas left, want the 3 of before", got)
	}
}
