package ownership

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-llm/tollgate/internal/redistest"
)

// TestClusterStoreBehaviours runs every Store behaviour on Redis through a
// real Redis Cluster, a prefix per behaviour on one cluster; then two stores
// on two cluster clients, as two gateways would, see each other's claims
// and releases, and the records spread over every master (no hash tag holds
// them in one slot).
func TestClusterStoreBehaviours(t *testing.T) {
	c := redistest.StartCluster(t)
	client := c.Client(t)
	for i, b := range storeBehaviours {
		t.Run(b.name, func(t *testing.T) {
			b.run(t, redisClientSubject(t, client, "test:own:"+strconv.Itoa(i)+":"))
		})
	}
	t.Run("two stores share claims, spread over the masters", func(t *testing.T) {
		twoStoresShareClaims(t, c)
	})
}

// twoStoresShareClaims claims, reads and releases ids through two stores
// on two clients of c.
func twoStoresShareClaims(t *testing.T, c *redistest.Cluster) {
	a := NewRedis(c.Client(t), "tollgate:own:")
	b := NewRedis(c.Client(t), "tollgate:own:")
	ctx := context.Background()
	const n = 60
	for i := range n {
		id := "resp_" + strconv.Itoa(i)
		claim(t, a, id, "team:a", time.Hour)
		if got, err := b.Claim(ctx, id, "team:b", time.Hour); err != nil || got != "team:a" {
			t.Fatalf("Claim of %s on the other store = %q, %v; want team:a", id, got, err)
		}
		wantOwner(t, b, id, "team:a")
	}
	var masters atomic.Int64 // ForEachMaster calls in parallel
	err := c.Client(t).ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		keys, err := m.Keys(ctx, "tollgate:own:*").Result()
		if len(keys) > 0 {
			masters.Add(1)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if m := masters.Load(); m != 3 {
		t.Errorf("%d records on %d masters, want them spread over the 3", n, m)
	}
	for i := range n {
		id := "resp_" + strconv.Itoa(i)
		if err := b.Release(ctx, id, "team:b"); err != nil {
			t.Fatal(err)
		}
		wantOwner(t, a, id, "team:a")
		if err := b.Release(ctx, id, "team:a"); err != nil {
			t.Fatal(err)
		}
		wantOwner(t, a, id, "")
	}
}
