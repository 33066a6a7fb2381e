//go:build unix

package redistest

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// TestClusterFailoverLosesWhatTheReplicaHadNotReceived: writers increment a
// counter through pipelines on its master, asking now and then for the
// replica's acknowledgement (WAIT 1). The replica stalls for half a second,
// as behind a congested link, and the master dies while its writes to the
// replica wait in its buffers. The promoted replica holds every increment
// it acknowledged and no more than were sent, but not every increment the
// master acknowledged: Redis replicates asynchronously.
func TestClusterFailoverLosesWhatTheReplicaHadNotReceived(t *testing.T) {
	c := StartCluster(t)
	ctx := context.Background()
	const key, writers, batch = "{counter}", 4, 50
	pad := strings.Repeat("p", 256) // makes the replication stream outgrow the sockets' buffers
	master := c.MasterOf(key)
	// Without the maintenance-notification handshake, whose fallback in
	// go-redis v9.23 races when the writers' connections dial at once.
	mc := redis.NewClient(&redis.Options{Addr: master, MaxRetries: -1, PoolSize: writers,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
	defer mc.Close()
	type tally struct{ sent, acked, waited int64 }
	tallies := make([]tally, writers)
	var isStalled atomic.Bool // until the replica stalls, writers ask for its acknowledgement
	started := make(chan struct{}, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			conn := mc.Conn() // WAIT counts the writes of its connection
			defer conn.Close()
			tl := &tallies[w]
			// Until the kill breaks the connection; bounded: 100,000 rounds.
			for round := range 100_000 {
				tl.sent += batch
				_, err := conn.Pipelined(ctx, func(p redis.Pipeliner) error {
					for range batch {
						p.Incr(ctx, key)
						p.Set(ctx, key+"pad", pad, 0)
					}
					return nil
				})
				if err != nil {
					return
				}
				tl.acked += batch
				if round == 0 {
					started <- struct{}{}
				}
				if round%10 == 9 && !isStalled.Load() {
					if n, err := conn.Wait(ctx, 1, time.Second).Result(); err != nil {
						return
					} else if n >= 1 {
						tl.waited = tl.acked
					}
				}
			}
			t.Errorf("writer %d: 100,000 rounds and the master still alive", w)
		})
	}
	for range writers {
		<-started
	}
	time.Sleep(200 * time.Millisecond)
	replica := c.ReplicaOf(master)
	isStalled.Store(true)
	resume := c.Stall(replica)
	time.Sleep(500 * time.Millisecond) // below the node timeout: nobody suspects the replica
	if got := c.KillMaster(master); got != replica {
		t.Fatalf("the master's replica is %s, not %s", got, replica)
	}
	resume()
	wg.Wait()
	took := c.WaitFailover(replica)
	var sum tally
	for _, tl := range tallies {
		sum.sent, sum.acked, sum.waited = sum.sent+tl.sent, sum.acked+tl.acked, sum.waited+tl.waited
	}
	rc := redis.NewClient(&redis.Options{Addr: replica})
	defer rc.Close()
	got, err := rc.Get(ctx, key).Int64()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("increments sent %d, acknowledged by the master %d, by the replica (WAIT) %d; the replica, promoted in %v, holds %d: %d acknowledged increments lost",
		sum.sent, sum.acked, sum.waited, took.Round(time.Millisecond), got, sum.acked-got)
	if got < sum.waited || got > sum.sent {
		t.Fatalf("the promoted replica holds %d, want between the %d it acknowledged and the %d sent", got, sum.waited, sum.sent)
	}
	if got >= sum.acked {
		t.Fatalf("the promoted replica holds %d of %d acknowledged increments: the stall lost nothing, the test shows nothing", got, sum.acked)
	}
}
