package redistest

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestClusterFailoverPromotesTheReplica: the cluster comes up as three
// masters sharing the slots, each with one replica; a key its replica
// acknowledged (WAIT) survives the SIGKILL of its master, because the
// replica takes over the master's slots, and the cluster client finds it
// there.
func TestClusterFailoverPromotesTheReplica(t *testing.T) {
	start := time.Now()
	c := StartCluster(t)
	t.Logf("6 nodes started, joined and healthy in %v", time.Since(start).Round(time.Millisecond))
	ctx := context.Background()

	cl := redis.NewClient(&redis.Options{Addr: c.Addrs()[0]})
	defer cl.Close()
	view, err := nodesOf(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	replicas := map[string]int{} // master id → replicas
	masters := map[string]bool{} // addresses
	for _, v := range view {
		if v.is("master") {
			masters[v.addr] = true
		} else {
			replicas[v.master]++
		}
	}
	if len(view) != 6 || len(masters) != 3 || len(replicas) != 3 {
		t.Fatalf("nodes %+v: want 3 masters with a replica each", view)
	}
	for id, n := range replicas {
		if n != 1 {
			t.Errorf("master %s has %d replicas", id, n)
		}
	}
	seen := map[string]bool{}
	for i := range 64 {
		m := c.MasterOf("k" + strconv.Itoa(i))
		if !masters[m] {
			t.Fatalf("MasterOf says %s, not a master", m)
		}
		seen[m] = true
	}
	if len(seen) != 3 {
		t.Errorf("64 keys on %d masters, want the 3", len(seen))
	}

	const key = "survivor"
	master := c.MasterOf(key)
	// WAIT applies to the writes of its connection: one connection, then.
	mc := redis.NewClient(&redis.Options{Addr: master})
	defer mc.Close()
	conn := mc.Conn()
	defer conn.Close()
	if err := conn.Set(ctx, key, "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := conn.Wait(ctx, 1, 5*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 = %d, %v; want the replica's acknowledgement", n, err)
	}

	client := c.Client(t)
	replica := c.KillMaster(master)
	took := c.WaitFailover(replica)
	t.Logf("master %s killed; replica %s serves its slots and the cluster is ok after %v", master, replica,
		took.Round(time.Millisecond))
	if took > 20*NodeTimeout {
		t.Errorf("failover took %v, more than 20 node timeouts", took)
	}
	if got := c.MasterOf(key); got != replica {
		t.Fatalf("after the failover %q is served by %s, want the promoted replica %s", key, got, replica)
	}
	// The client learns the new layout from the first redirections it
	// meets, so its first tries may fail: bounded, 100 × 20 ms.
	var got string
	fails := 0
	for ; fails < 100; fails++ {
		if got, err = client.Get(ctx, key).Result(); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil || got != "v" {
		t.Fatalf("GET %s after the failover = %q, %v; want the acknowledged value", key, got, err)
	}
	t.Logf("the cluster client read it after %d failed tries", fails)
}
