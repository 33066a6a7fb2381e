package conversation

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-llm/tollgate/internal/redistest"
)

// TestClusterStoresKeepToOneSlot runs two stores on two cluster clients, as
// two gateways would: turns recorded on both, an outcome, a link, an
// eviction (MaxActive) and idle ends. Every script runs on the master of
// the conversations' hash tag and touches that slot only, and every key
// carries the tag.
func TestClusterStoresKeepToOneSlot(t *testing.T) {
	c := redistest.StartCluster(t)
	stop := c.MonitorScripts(t)
	clock := newFakeClock()
	var ends endCounter
	opts := RedisOptions{Options: Options{Now: clock.Now, OnEnd: ends.onEnd, MaxActive: 8}, Prefix: "tollgate:"}
	r1, r2 := newTestRedis(t, c.Client(t), opts), newTestRedis(t, c.Client(t), opts)
	ctx := context.Background()
	for i := range 10 {
		k := Key("", fmt.Sprint(i))
		r1.Record(Turn{Key: k, At: clock.Now(), CostMicros: 1})
		r2.Record(Turn{Key: k, At: clock.Now(), CostMicros: 2})
	}
	k := Key("", "0")
	if _, err := r1.SetOutcome(ctx, k, Outcome{Completed: true, At: clock.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := r2.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r2.Link(ctx, "resp_1", k); err != nil {
		t.Fatal(err)
	}
	if got, err := r1.Resolve(ctx, "resp_1"); err != nil || got != k {
		t.Errorf("Resolve = %q, %v", got, err)
	}
	if _, err := r1.Cost(ctx, k); err != nil {
		t.Fatal(err)
	}
	clock.Advance(testIdle)
	r1.tick(ctx)
	r2.tick(ctx)
	ends.mu.Lock()
	if len(ends.n) != 10 {
		t.Errorf("%d conversations ended (evicted or idle), want 10", len(ends.n))
	}
	ends.mu.Unlock()

	master := c.MasterOf("tollgate:conv:{c}:active")
	runs := stop()
	if len(runs) < 5 {
		t.Fatalf("%d script runs, want the batches, the outcome, the gets and the idle pops", len(runs))
	}
	for _, r := range runs {
		if x := r.CrossSlot(); len(x) > 0 || r.Node != master {
			t.Errorf("a script on %s (the tag's master: %s) declared %q and touched %q of other slots", r.Node, master, r.Declared, x)
		}
	}
	err := c.Client(t).ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		iter := m.Scan(ctx, 0, "*", 100).Iterator()
		for iter.Next(ctx) {
			if k := iter.Val(); !strings.HasPrefix(k, "tollgate:conv:{c}:") || m.Options().Addr != master {
				t.Errorf("key %q on %s: want every key under tollgate:conv:{c}:, on %s", k, m.Options().Addr, master)
			}
		}
		return iter.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
}
