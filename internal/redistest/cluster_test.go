package redistest

import (
	"context"
	"errors"
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

// TestClusterMonitorShowsTheSlotsAScriptTouches: Slot agrees with CLUSTER
// KEYSLOT, also for keys whose braces are not a hash tag, and
// MonitorScripts sees the keys a script reaches beyond those it declared:
// Redis 7.0 runs such a script when its node holds both slots.
func TestClusterMonitorShowsTheSlotsAScriptTouches(t *testing.T) {
	c := StartCluster(t)
	ctx := context.Background()
	client := c.Client(t)
	for _, k := range []string{"", "a", "{a}", "{a}x", "x{a}y", "{}a", "{a", "a}{b}", "{{a}}", "tollgate:spend", "\xff\x00"} {
		want, err := client.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := Slot(k); got != int(want) {
			t.Errorf("Slot(%q) = %d, CLUSTER KEYSLOT says %d", k, got, want)
		}
	}

	var tags []string // two hash tags of one master
	for i := 0; len(tags) < 2 && i < 100; i++ {
		tag := "{x" + strconv.Itoa(i) + "}"
		if len(tags) == 0 || c.MasterOf(tag) == c.MasterOf(tags[0]) {
			tags = append(tags, tag)
		}
	}
	stop := c.MonitorScripts(t)
	const reach = "redis.call('SET', KEYS[1], 'a\" \\\\ \\n'); redis.call('TIME'); return redis.call('GET', ARGV[1])"
	if err := client.Eval(ctx, reach, []string{tags[0] + "a"}, tags[1]+"b").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("a script reaching another slot of its node: %v; want it to run (nil reply)", err)
	}
	if err := client.Eval(ctx, reach, []string{tags[0] + "a"}, tags[0]+"b").Err(); !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	runs := stop()
	if len(runs) != 2 {
		t.Fatalf("monitor saw %d script runs, want 2: %+v", len(runs), runs)
	}
	if got := runs[0].CrossSlot(); len(got) != 1 || got[0] != tags[1]+"b" || len(runs[0].Touched) != 2 {
		t.Errorf("first run %+v: cross-slot %q, want %q", runs[0], got, tags[1]+"b")
	}
	if got := runs[1].CrossSlot(); len(got) != 0 || len(runs[1].Touched) != 2 {
		t.Errorf("second run %+v: cross-slot %q, want none", runs[1], got)
	}
}
