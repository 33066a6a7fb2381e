package spend

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-llm/tollgate/internal/redistest"
)

// TestClusterTwoLedgersCountEachBatchOnce runs two ledgers on two cluster
// clients, as two gateways would, adding concurrently while the reply of
// one batch is lost: the batch is sent again and counted once, so both
// ledgers read exactly the sum of every Add. Every batch runs on the one
// master of the spend hash tag and touches that slot only, and every key
// carries the tag.
func TestClusterTwoLedgersCountEachBatchOnce(t *testing.T) {
	c := redistest.StartCluster(t)
	stop := c.MonitorScripts(t)
	hook := &loseReply{}
	hook.armed.Store(true)
	r1 := newRedis(t, c.Client(t, hook), RedisOptions{FlushInterval: time.Millisecond})
	r2 := newRedis(t, c.Client(t), RedisOptions{FlushInterval: time.Millisecond})
	adds := sampleAdds()
	addConcurrently(adds, 50*time.Microsecond, r1, r2) // spread over several batches
	flush(t, r1)
	flush(t, r2)
	checkQueries(t, r1, adds)
	checkQueries(t, r2, adds)

	calls := hook.calls()
	if hook.armed.Load() || len(calls) < 2 || calls[0] != calls[1] {
		t.Fatalf("first ledger's batch markers %q: want its first batch, whose reply was lost, sent again", calls)
	}

	master := c.MasterOf("{tollgate:spend}")
	runs := stop()
	if len(runs) < 3 {
		t.Fatalf("%d script runs, want at least the batch sent twice and one of the other ledger", len(runs))
	}
	for _, r := range runs {
		if x := r.CrossSlot(); len(x) > 0 || r.Node != master {
			t.Errorf("a batch on %s (the tag's master: %s) declared %q and touched %q of other slots", r.Node, master, r.Declared, x)
		}
	}
	err := c.Client(t).ForEachMaster(context.Background(), func(ctx context.Context, m *redis.Client) error {
		iter := m.Scan(ctx, 0, "*", 100).Iterator()
		for iter.Next(ctx) {
			if k := iter.Val(); !strings.HasPrefix(k, "{tollgate:spend}:") || m.Options().Addr != master {
				t.Errorf("key %q on %s: want every key under {tollgate:spend}, on %s", k, m.Options().Addr, master)
			}
		}
		return iter.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
}
