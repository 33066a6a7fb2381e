package redistest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// NodeTimeout is the cluster's cluster-node-timeout: how long a master must
// be unreachable before the other masters mark it failed and its replica
// takes over. Redis's default, 15 s, would make every failover test wait
// that long; 1 s is still far more than a live node of a loaded test
// machine goes without answering the cluster bus.
const NodeTimeout = time.Second

// slots is the number of Redis Cluster hash slots.
const slots = 16384

// Cluster is a Redis Cluster of three masters, each with one replica: six
// Servers on free loopback ports. A test can kill a master and wait for its
// replica to take over. Every node is killed in t.Cleanup.
type Cluster struct {
	t     testing.TB
	nodes []*Server
}

// StartCluster starts six nodes, joins them with redis-cli --cluster create
// (three masters, one replica each) and waits until the cluster is healthy
// (see WaitHealthy). It fails the test, as Start does, when redis-server or
// redis-cli is missing.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	need(t, "redis-server", "redis-server")
	need(t, "redis-cli", "redis-tools")
	dir := t.TempDir()
	c := &Cluster{t: t}
	for i := range 6 {
		// Each node has a directory of its own: a replica writes the copy
		// its master sends it there (dump.rdb).
		nodeDir := filepath.Join(dir, strconv.Itoa(i))
		if err := os.Mkdir(nodeDir, 0o700); err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, Start(t, withArgs(
			"--dir", nodeDir,
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			// The bus port is picked too: the default, port + 10000, can be
			// past 65535 or taken.
			"--cluster-port", strconv.Itoa(freePort(t)),
			"--cluster-node-timeout", strconv.FormatInt(NodeTimeout.Milliseconds(), 10),
			// A replica takes over however long ago it last heard from its
			// master: the tests kill masters on purpose.
			"--cluster-replica-validity-factor", "0",
			// The replicas' first sync streams the (empty) data set instead
			// of writing it to disk first.
			"--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0",
		)))
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	c.WaitHealthy()
	c.waitStreaming()
	return c
}

// waitStreaming waits until every master's replica acknowledges a write.
// A replica reports its link up as soon as it has loaded its first copy,
// but after a diskless sync its master streams it writes only once the
// replica's first acknowledgement arrives, up to a second later: a master
// killed before then takes every write with it.
func (c *Cluster) waitStreaming() {
	c.t.Helper()
	var masters []clusterNode
	if err := c.withLive(func(_ context.Context, _ *Server, _ *redis.Client, view []clusterNode) error {
		for _, v := range view {
			if v.is("master") && len(v.slots) > 0 {
				masters = append(masters, v)
			}
		}
		return nil
	}, true); err != nil {
		c.t.Fatalf("cluster masters: %v", err)
	}
	for _, m := range masters {
		key := keyIn(m.slots[0][0])
		cl := redis.NewClient(&redis.Options{Addr: m.addr, MaxRetries: -1, PoolSize: 1,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
		c.waitFor("the replica of "+m.addr+" to acknowledge a write", func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			conn := cl.Conn() // WAIT counts the writes of its connection
			defer conn.Close()
			if err := conn.Set(ctx, key, "1", 0).Err(); err != nil {
				return err
			}
			defer conn.Del(ctx, key)
			if n, err := conn.Wait(ctx, 1, 2*time.Second).Result(); err != nil {
				return err
			} else if n < 1 {
				return errors.New("no replica acknowledged the write")
			}
			return nil
		})
		_ = cl.Close()
	}
}

// keyIn returns a key whose hash slot is slot.
func keyIn(slot int) string {
	for i := 0; ; i++ {
		if k := "redistest:streaming:" + strconv.Itoa(i); Slot(k) == slot {
			return k
		}
	}
}

// Addrs are the six nodes' host:port, as [redis] addrs lists them; killed
// nodes included.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.Addr()
	}
	return out
}

// Client returns a cluster client of the nodes with the options the
// gateway sets (cmd/gateway's openBackends): no command retries, one dial
// attempt. It is closed in t.Cleanup.
func (c *Cluster) Client(t testing.TB, hooks ...redis.Hook) *redis.ClusterClient {
	return c.ClientWith(t, redis.ClusterOptions{}, hooks...)
}

// ClientWith is Client with options; Addrs, MaxRetries and DialerRetries
// are set here.
func (c *Cluster) ClientWith(t testing.TB, opts redis.ClusterOptions, hooks ...redis.Hook) *redis.ClusterClient {
	opts.Addrs, opts.MaxRetries, opts.DialerRetries = c.Addrs(), -1, 1
	if opts.MaintNotificationsConfig == nil { // as the gateway's (govern.go)
		opts.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	}
	cc := redis.NewClusterClient(&opts)
	for _, h := range hooks {
		cc.AddHook(h)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// MasterOf returns the address of the master serving key's slot.
func (c *Cluster) MasterOf(key string) string {
	c.t.Helper()
	var addr string
	slot := Slot(key)
	err := c.withLive(func(_ context.Context, n *Server, _ *redis.Client, view []clusterNode) error {
		for _, v := range view {
			if v.is("master") && !v.failing() && v.serves(slot) {
				addr = v.addr
				return nil
			}
		}
		return fmt.Errorf("%s knows no live master of slot %d", n.Addr(), slot)
	}, true)
	if err != nil {
		c.t.Fatalf("master of %q: %v", key, err)
	}
	return addr
}

// KillMaster kills the master at addr with SIGKILL, as a crash would, and
// returns the address of its replica, which will take its slots over
// (WaitFailover). It loses whatever the master had not yet sent to the
// replica: Redis replicates asynchronously.
func (c *Cluster) KillMaster(addr string) (replica string) {
	c.t.Helper()
	replica = c.ReplicaOf(addr)
	c.Node(addr).Kill()
	return replica
}

// ReplicaOf returns the address of a live replica of the master at addr.
func (c *Cluster) ReplicaOf(addr string) string {
	c.t.Helper()
	var replica string
	err := c.withLive(func(_ context.Context, _ *Server, _ *redis.Client, view []clusterNode) error {
		i := slices.IndexFunc(view, func(v clusterNode) bool { return v.addr == addr })
		if i < 0 || !view[i].is("master") {
			return fmt.Errorf("%s is not a master", addr)
		}
		for _, v := range view {
			if v.master == view[i].id && !v.failing() {
				replica = v.addr
				return nil
			}
		}
		return fmt.Errorf("master %s has no live replica", addr)
	}, true)
	if err != nil {
		c.t.Fatalf("replica of %s: %v", addr, err)
	}
	return replica
}

// WaitFailover waits until replica serves slots as a master and the cluster
// is healthy again, and returns how long that took.
func (c *Cluster) WaitFailover(replica string) time.Duration {
	c.t.Helper()
	start := time.Now()
	c.waitFor("the replica "+replica+" to take over", func() error {
		if err := c.healthy(); err != nil {
			return err
		}
		return c.withLive(func(_ context.Context, n *Server, _ *redis.Client, view []clusterNode) error {
			i := slices.IndexFunc(view, func(v clusterNode) bool { return v.addr == replica })
			if i < 0 || !view[i].is("master") || len(view[i].slots) == 0 {
				return fmt.Errorf("%s does not see %s as a master with slots yet", n.Addr(), replica)
			}
			return nil
		}, false)
	})
	return time.Since(start)
}

// WaitHealthy waits until every live node reports cluster_state:ok and sees
// all 16384 slots served by live masters that it does not suspect, every
// other live node as the replica of one of them, and every killed node
// marked failed; and until every live replica is in sync with its master.
func (c *Cluster) WaitHealthy() {
	c.t.Helper()
	c.waitFor("the cluster to be healthy", c.healthy)
}

// waitFor polls check every 20 ms until it returns nil, for at most 60 s.
func (c *Cluster) waitFor(what string, check func() error) {
	c.t.Helper()
	var err error
	for range 3000 {
		if err = check(); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatalf("timed out after 60 s waiting for %s: %v", what, err)
}

// healthy returns nil if the cluster is healthy (see WaitHealthy), else
// what is not yet.
func (c *Cluster) healthy() error {
	dead := map[string]bool{}
	for _, n := range c.nodes {
		if n.cmd == nil {
			dead[n.Addr()] = true
		}
	}
	return c.withLive(func(ctx context.Context, n *Server, cl *redis.Client, view []clusterNode) error {
		info, err := cl.ClusterInfo(ctx).Result()
		if err != nil {
			return err
		}
		for _, want := range []string{"cluster_state:ok", "cluster_slots_ok:" + strconv.Itoa(slots)} {
			if !hasLine(info, want) {
				return fmt.Errorf("%s: CLUSTER INFO lacks %s", n.Addr(), want)
			}
		}
		covered := 0
		liveMasters := map[string]bool{}
		for _, v := range view {
			switch {
			case dead[v.addr] && !v.is("fail"):
				return fmt.Errorf("%s does not mark the killed %s failed", n.Addr(), v.addr)
			case dead[v.addr]:
			case v.failing():
				return fmt.Errorf("%s suspects the live %s", n.Addr(), v.addr)
			case v.is("master") && len(v.slots) == 0:
				// Every master of this cluster has slots: a node seen so
				// is a replica the view has not heard of as such yet.
				return fmt.Errorf("%s sees %s as a master without slots", n.Addr(), v.addr)
			case v.is("master"):
				liveMasters[v.id] = true
				for _, r := range v.slots {
					covered += r[1] - r[0] + 1
				}
			}
		}
		for _, v := range view {
			if !dead[v.addr] && v.is("slave") && !liveMasters[v.master] {
				return fmt.Errorf("%s sees the replica %s of no live master", n.Addr(), v.addr)
			}
		}
		if covered != slots {
			return fmt.Errorf("%s sees %d slots on live masters", n.Addr(), covered)
		}
		if repl, err := cl.Info(ctx, "replication").Result(); err != nil {
			return err
		} else if hasLine(repl, "role:slave") && !hasLine(repl, "master_link_status:up") {
			return fmt.Errorf("replica %s is not in sync with its master", n.Addr())
		}
		return nil
	}, false)
}

// withLive calls f with a client of each live node in turn, that node's
// CLUSTER NODES and a context of a second: until one succeeds when untilOne
// is set, else until one fails.
func (c *Cluster) withLive(f func(context.Context, *Server, *redis.Client, []clusterNode) error, untilOne bool) error {
	var errs []error
	for _, n := range c.nodes {
		if n.cmd == nil {
			continue
		}
		cl := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1, DialTimeout: time.Second})
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		view, err := nodesOf(ctx, cl)
		if err == nil {
			err = f(ctx, n, cl, view)
		}
		cancel()
		_ = cl.Close()
		switch {
		case err == nil && untilOne:
			return nil
		case err != nil && !untilOne:
			return err
		case err != nil:
			errs = append(errs, err)
		}
	}
	if untilOne {
		return errors.Join(append(errs, errors.New("no live node answered"))...)
	}
	return nil
}

// Node returns the node at addr, for a client of that node alone.
func (c *Cluster) Node(addr string) *Server {
	c.t.Helper()
	for _, n := range c.nodes {
		if n.Addr() == addr {
			return n
		}
	}
	c.t.Fatalf("no cluster node at %s", addr)
	return nil
}

func hasLine(text, line string) bool {
	return slices.Contains(strings.Split(strings.ReplaceAll(text, "\r", ""), "\n"), line)
}

// clusterNode is one line of CLUSTER NODES.
type clusterNode struct {
	id, addr string
	flags    []string
	master   string   // the master's id, for a replica; else "-"
	slots    [][2]int // ranges served, for a master
}

func (v clusterNode) is(flag string) bool { return slices.Contains(v.flags, flag) }

// failing reports whether the node that gave the view suspects v (pfail,
// shown "fail?") or the cluster agreed that v failed.
func (v clusterNode) failing() bool { return v.is("fail") || v.is("fail?") }

func (v clusterNode) serves(slot int) bool {
	for _, r := range v.slots {
		if slot >= r[0] && slot <= r[1] {
			return true
		}
	}
	return false
}

// nodesOf reads and parses cl's CLUSTER NODES: "<id> <ip:port@cport>
// <flags> <master> <ping-sent> <pong-recv> <epoch> <link-state> <slot>...",
// where a slot is "n" or "a-b" (or "[n->-id]" while it migrates, skipped).
func nodesOf(ctx context.Context, cl *redis.Client) ([]clusterNode, error) {
	text, err := cl.ClusterNodes(ctx).Result()
	if err != nil {
		return nil, err
	}
	var out []clusterNode
	for line := range strings.Lines(text) {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		v := clusterNode{id: f[0], addr: addr, flags: strings.Split(f[2], ","), master: f[3]}
		for _, s := range f[8:] {
			if strings.HasPrefix(s, "[") {
				continue
			}
			lo, hi, isRange := strings.Cut(s, "-")
			if !isRange {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 != nil || err2 != nil {
				return nil, fmt.Errorf("CLUSTER NODES: bad slot %q in %q", s, line)
			}
			v.slots = append(v.slots, [2]int{a, b})
		}
		out = append(out, v)
	}
	return out, nil
}
