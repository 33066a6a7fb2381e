package ratelimit

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-llm/tollgate/internal/redistest"
)

// clusterPrefix returns a key prefix under which the subjects' hash tags
// are served by one master (same) or each by another (!same), so that a
// test chooses whether a request spans masters.
func clusterPrefix(t *testing.T, c *redistest.Cluster, same bool, subjects ...Subject) string {
	t.Helper()
	for i := range 100 {
		prefix := "c" + strconv.Itoa(i) + ":rl:"
		r := NewRedis(nil, RedisOptions{Prefix: prefix})
		masters := map[string]bool{}
		for _, s := range subjects {
			masters[c.MasterOf(r.keys(s).base)] = true
		}
		if same && len(masters) == 1 || !same && len(masters) == len(subjects) {
			return prefix
		}
	}
	t.Fatalf("no prefix of 100 puts %d subjects on the masters wanted (same: %v)", len(subjects), same)
	return ""
}

// TestClusterFailoverUndoesTimedOutAdmission is
// TestFailoverUndoesTimedOutAdmission through a ClusterClient, whose
// subjects share a master that a script keeps busy. A ClusterClient sends a
// timed-out command again (up to MaxRedirects times, whatever MaxRetries
// says): the busy master would then run the admission several times, and
// the undo of its lease take back one of them.
func TestClusterFailoverUndoesTimedOutAdmission(t *testing.T) {
	c := redistest.StartCluster(t)
	prefix := clusterPrefix(t, c, true, keySubject("slow", Limits{}), teamSubject("slow", Limits{}))
	client := c.ClientWith(t, redis.ClusterOptions{ReadTimeout: 100 * time.Millisecond})
	busy := c.Node(c.MasterOf("{" + prefix + "key:slow}"))
	undoesTimedOutAdmission(t, client, prefix, busy)
}

// TestClusterTwoLimitersShareLimits runs two limiters on two cluster
// clients, as two gateways would, with each request's key and team on two
// masters: an RPM limit and a concurrency cap hold across them, and a token
// budget is held exactly.
func TestClusterTwoLimitersShareLimits(t *testing.T) {
	c := redistest.StartCluster(t)

	t.Run("rpm and concurrency", func(t *testing.T) {
		key := keySubject("shared", Limits{RPM: 120}) // T = 500 ms
		team := teamSubject("shared", Limits{Concurrency: 4})
		opts := RedisOptions{Prefix: clusterPrefix(t, c, false, key, team)}
		replicasShareLimits(t, []redis.UniversalClient{c.Client(t), c.Client(t)}, opts, key, team)
	})

	t.Run("budget held exactly", func(t *testing.T) {
		const each, n = 37, 100 // n requests of each tokens fill the budget
		key := keySubject("budget", Limits{TokensPerDay: n * each})
		team := teamSubject("budget", Limits{CostPerMonthMicros: 1 << 40})
		opts := RedisOptions{Prefix: clusterPrefix(t, c, false, key, team)}
		req := Request{Subjects: []Subject{key, team}, Tokens: each, CostMicros: 5}
		lims := []*Redis{NewRedis(c.Client(t), opts), NewRedis(c.Client(t), opts)}
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for _, rl := range lims {
			for range 8 {
				wg.Go(func() {
					// Until the budget refuses; bounded.
					for range 1000 {
						d, err := rl.Admit(context.Background(), req)
						if err != nil {
							t.Errorf("Admit: %v", err)
							return
						}
						if !d.Allowed {
							if d.Refused.Kind != KindTokensPerDay {
								t.Errorf("refused by %v, want the token budget", d.Refused.Kind)
							}
							return
						}
						admitted.Add(1)
						if err := rl.Settle(context.Background(), d.Lease, each, 5); err != nil {
							t.Errorf("Settle: %v", err)
							return
						}
					}
					t.Error("1000 admissions and the budget never refused")
				})
			}
		}
		wg.Wait()
		if got := admitted.Load(); got != n {
			t.Errorf("admitted %d requests of %d tokens, want the budget's %d", got, each, n)
		}
		for _, rl := range lims {
			if st := peekKind(t, rl, key, KindTokensPerDay); st.Used != n*each || st.Remaining != 0 {
				t.Errorf("tokens per day %+v, want %d used", st, n*each)
			}
			if st := peekKind(t, rl, team, KindCostPerMonth); st.Used != admitted.Load()*5 {
				t.Errorf("team cost per month %+v, want %d used", st, admitted.Load()*5)
			}
		}
	})
}

// TestClusterScriptsTouchOneSlotEach runs every path of every limiter
// script through a cluster, for a key and a team on two masters, under
// MONITOR: each script run touches the slot of its subject only, and every
// key the limiter writes carries its subject's hash tag. (Redis 7.0 would
// not refuse a script that reached another slot of its node.)
func TestClusterScriptsTouchOneSlotEach(t *testing.T) {
	c := redistest.StartCluster(t)
	ctx := context.Background()
	var loss lossHook
	client := c.Client(t, &loss)
	stop := c.MonitorScripts(t)

	key := keySubject("every", Limits{RPM: 600, TPM: 60000, Concurrency: 3, TokensPerDay: 1000, CostPerDayMicros: 1000})
	team := teamSubject("every", Limits{RPM: 600, CostPerMonthMicros: 10000})
	prefix := clusterPrefix(t, c, false, key, team)
	rl := NewRedis(client, RedisOptions{Prefix: prefix})
	req := Request{Subjects: []Subject{key, team}, Tokens: 600, CostMicros: 300}
	first := mustAdmit(t, rl, req)
	second := mustAdmit(t, rl, req) // 400 tokens left: a clamped reservation, kept under the lease
	if !first.Allowed || !second.Allowed || !second.Lease.holds[0].kept {
		t.Fatalf("admissions %+v, %+v; want the second clamped", first, second)
	}
	holdKey := "{" + prefix + "key:every}:hold:" + second.Lease.ID
	if n := client.Exists(ctx, holdKey).Val(); n != 1 {
		t.Fatalf("no hold %s", holdKey)
	}
	// The key's day is spent; the team admits, and its reservation is undone.
	if d := mustAdmit(t, rl, req); d.Allowed || d.Refused.Kind != KindTokensPerDay {
		t.Fatalf("third admission %+v, want the key's budget to refuse", d)
	}
	if _, err := rl.Peek(ctx, req.Subjects); err != nil {
		t.Fatal(err)
	}
	mustSettle(t, rl, first.Lease, 500, 100)
	mustSettle(t, rl, second.Lease, 0, 0)
	// An admission whose reply is lost: its undo finds the windows and the
	// holds from what Redis kept.
	loss.lose.Store(1)
	if d, err := rl.Admit(ctx, Request{Subjects: req.Subjects, Tokens: 100, CostMicros: 10}); err == nil || d.Lease == nil {
		t.Fatalf("Admit with a lost reply: %+v, %v", d, err)
	} else {
		mustSettle(t, rl, d.Lease, 0, 0)
	}
	if err := rl.Charge(ctx, req.Subjects, time.Now(), 10, 10, "charge-1"); err != nil {
		t.Fatal(err)
	}
	if st := peekKind(t, rl, key, KindTokensPerDay); st.Used != 510 {
		t.Fatalf("tokens per day %+v, want 500 settled + 10 charged", st)
	}

	runs := stop()
	seen := map[string]bool{}
	kinds := map[string]bool{}
	for _, r := range runs {
		if x := r.CrossSlot(); len(x) > 0 {
			t.Errorf("a script on %s declared %q and touched %q of other slots", r.Node, r.Declared, x)
		}
		seen[r.Node] = true
		for _, k := range r.Touched {
			kinds[subjectKeyKind(t, prefix, k)] = true
		}
	}
	if len(seen) != 2 {
		t.Errorf("script runs on %d masters, want the key's and the team's", len(seen))
	}
	for _, k := range []string{"rpm", "tpm", "leases", "tpd", "cpd", "cpm", "hold", "charge"} {
		if !kinds[k] {
			t.Errorf("no script touched a %s key (kinds %v): a path was not run", k, kinds)
		}
	}
	err := client.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		iter := m.Scan(ctx, 0, "*", 100).Iterator()
		for iter.Next(ctx) {
			subjectKeyKind(t, prefix, iter.Val())
		}
		return iter.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
}

// subjectKeyKind returns the kind of a limiter key of the key or the team
// "every" under prefix ("rpm", "tpd", ...), and fails the test for another
// key: one without its subject's hash tag.
func subjectKeyKind(t *testing.T, prefix, key string) string {
	t.Helper()
	rest, ok := strings.CutPrefix(key, "{"+prefix+"key:every}:")
	if !ok {
		rest, ok = strings.CutPrefix(key, "{"+prefix+"team:every}:")
	}
	if !ok {
		t.Errorf("key %q lacks its subject's hash tag", key)
	}
	kind, _, _ := strings.Cut(rest, ":")
	return kind
}

// TestClusterFailoverReturnsToThePromotedReplica kills the master of a
// subject's slot: the Failover answers from its fallback, and once the
// replica has taken over it is back on Redis within a few RetryAfter, not
// at the cluster client's next periodic reload (a minute). Its commands,
// sent once, meet no redirection that would tell the client of the new
// layout; the limiter asks for a reload after an error instead.
func TestClusterFailoverReturnsToThePromotedReplica(t *testing.T) {
	c := redistest.StartCluster(t)
	key := keySubject("moving", Limits{RPM: 6000, TPM: 1e6})
	primary := NewRedis(c.Client(t), RedisOptions{})
	f := newTestFailover(t, FailoverOptions{Primary: primary, Fallback: NewLocal(LocalOptions{}),
		RetryAfter: 100 * time.Millisecond})
	req := Request{Subjects: []Subject{key}, Tokens: 10}
	admit := func() *Lease {
		t.Helper()
		d := mustAdmit(t, f, req)
		if !d.Allowed {
			t.Fatalf("refused: %+v", d)
		}
		mustSettle(t, f, d.Lease, 10, 0)
		return d.Lease
	}
	if l := admit(); l.issuer != f.primary {
		t.Fatal("the first admission did not come from Redis")
	}
	replica := c.KillMaster(c.MasterOf(primary.keys(key).base))
	if l := admit(); l.issuer != f.fallback || !f.Degraded() {
		t.Fatalf("with the master dead: issuer %v, degraded %v; want the fallback", l.issuer, f.Degraded())
	}
	took := c.WaitFailover(replica)
	back := time.Now()
	// Bounded: 200 × 10 ms.
	for i := 0; admit().issuer != f.primary; i++ {
		if i == 200 {
			t.Fatalf("still on the fallback 2 s after the replica %s took over", replica)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("failover in %v; back on Redis %v later", took.Round(time.Millisecond), time.Since(back).Round(time.Millisecond))
	if f.Degraded() {
		t.Fatal("an admission came from Redis but the Failover says it is degraded")
	}
}
