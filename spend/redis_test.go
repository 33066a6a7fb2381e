package spend

import (
	"context"
	"errors"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// newRedis returns a Redis ledger closed in t.Cleanup. A long interval
// leaves flushing to the test unless it asks otherwise.
func newRedis(t *testing.T, c redis.UniversalClient, opts RedisOptions) *Redis {
	t.Helper()
	if opts.FlushInterval == 0 {
		opts.FlushInterval = time.Hour
	}
	r, err := NewRedis(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func flush(t *testing.T, l Ledger) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

// degradedLog records OnDegraded calls.
type degradedLog struct {
	mu     sync.Mutex
	events []bool
}

func (d *degradedLog) record(b bool) {
	d.mu.Lock()
	d.events = append(d.events, b)
	d.mu.Unlock()
}

func (d *degradedLog) get() []bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.events)
}

// waitFor polls cond every 5 ms, at most 2000 times.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 2000 {
		if cond() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

func TestRedisQuery(t *testing.T) {
	srv := startRedisServer(t, false)
	r := newRedis(t, srv.Client(t), RedisOptions{})
	adds := sampleAdds()
	for _, a := range adds {
		r.Add(a.k, a.t, time.Time{})
	}
	// Query reads Redis only: before a flush it sees nothing.
	if rows, err := r.Query(context.Background(), Filter{}); err != nil || len(rows) != 0 {
		t.Fatalf("Query before Flush = %d rows, %v; want 0 rows", len(rows), err)
	}
	if p := r.Pending(); p != len(expectRows(adds, Filter{})) {
		t.Fatalf("Pending = %d, want %d", p, len(expectRows(adds, Filter{})))
	}
	flush(t, r)
	if p := r.Pending(); p != 0 {
		t.Fatalf("Pending after Flush = %d", p)
	}
	checkQueries(t, r, adds)

	// Keys carry one hash tag, so a Cluster puts them in one slot.
	keys, err := srv.Client(t).Keys(context.Background(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if !strings.HasPrefix(k, "{tollgate:spend}:") {
			t.Errorf("key %q lacks the {tollgate:spend} hash tag", k)
		}
	}
}

func TestRedisPrefix(t *testing.T) {
	srv := startRedisServer(t, false)
	c := srv.Client(t)
	a := newRedis(t, c, RedisOptions{Prefix: "a:"})
	b := newRedis(t, c, RedisOptions{Prefix: "b:"})
	k := Key{Day: "2026-11-30", KeyID: "k"}
	a.Add(k, Totals{Requests: 1}, time.Time{})
	b.Add(k, Totals{Requests: 5}, time.Time{})
	flush(t, a)
	flush(t, b)
	for _, x := range []struct {
		l    *Redis
		want int64
	}{{a, 1}, {b, 5}} {
		rows, err := x.l.Query(context.Background(), Filter{})
		if err != nil || len(rows) != 1 || rows[0].Requests != x.want {
			t.Fatalf("prefix %s: rows %+v, %v; want one row of %d requests", x.l.tag, rows, err, x.want)
		}
	}
}

// TestRedisKillUnderLoad adds from many goroutines while redis-server is
// killed (SIGKILL) and restarted: the ledger must end up with exactly the
// sum of every Add, none lost while Redis was down and none doubled by
// batches re-sent after their answers were lost.
func TestRedisKillUnderLoad(t *testing.T) {
	srv := startRedisServer(t, true)
	var deg degradedLog
	// Failing fast, as the gateway's client does (govern.go): go-redis's
	// default retries and dial retries would take seconds to notice.
	c := srv.ClientWith(t, redis.Options{MaxRetries: -1, DialerRetries: 1})
	r := newRedis(t, c, RedisOptions{FlushInterval: 2 * time.Millisecond, OnDegraded: deg.record})

	// Bounded even if the stop never comes; high enough that the adds go on
	// through the outage on a slow machine.
	const workers, maxAdds = 8, 2_000_000
	stop := make(chan struct{})
	sums := make([]map[Key]Totals, workers)
	var added atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		sums[w] = map[Key]Totals{}
		wg.Go(func() {
			for i := range maxAdds {
				if i%64 == 0 {
					select {
					case <-stop:
						return
					default:
					}
					time.Sleep(100 * time.Microsecond)
				}
				k := Key{Day: []string{"2026-11-30", "2026-12-01"}[i%2], KeyID: string(rune('a' + w)),
					Team: []string{"t1", "t2", "t3"}[i%3], Model: []string{"m1", "m2"}[(i/2)%2]}
				d := Totals{Requests: 1, Input: int64(i%1000 + 1), Output: int64(w + 1), CacheRead: int64(i % 3),
					CacheWrite: int64(i % 5), Reasoning: int64(i % 2), CostMicros: int64(i%997 + w)}
				r.Add(k, d, time.Time{})
				s := sums[w][k]
				s.Add(d)
				sums[w][k] = s
				added.Add(1)
			}
		})
	}
	total := func() int64 {
		rows, err := r.Query(context.Background(), Filter{})
		if err != nil {
			return 0
		}
		return sumRows(rows).Requests
	}
	waitFor(t, "batches to reach Redis", func() bool { return total() > 0 })
	srv.Kill()
	waitFor(t, "OnDegraded(true)", func() bool { return slices.Contains(deg.get(), true) })
	before := added.Load()
	waitFor(t, "adds while Redis is down", func() bool { return added.Load() > before+1000 })
	srv.Start()
	waitFor(t, "OnDegraded(false)", func() bool { return slices.Contains(deg.get(), false) })
	close(stop)
	wg.Wait()
	flush(t, r)

	want := map[Key]Totals{}
	for _, s := range sums {
		for k, v := range s {
			x := want[k]
			x.Add(v)
			want[k] = x
		}
	}
	rows, err := r.Query(context.Background(), Filter{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[Key]Totals{}
	for _, row := range rows {
		got[row.Key] = row.Totals
	}
	if !maps.Equal(got, want) {
		t.Fatalf("after kill and restart:\n got %+v\nwant %+v", got, want)
	}
	if ev := deg.get(); len(ev) < 2 || !ev[0] || ev[len(ev)-1] {
		t.Fatalf("OnDegraded calls %v, want true first and false last", ev)
	}
	t.Logf("%d adds, %d rows, degraded events %v", added.Load(), len(rows), deg.get())
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
}

// loseReply is a hook that, when armed, lets the next script call run on
// Redis and then reports it as failed, as a timeout after Redis applied it
// would. It records each script call's batch marker key.
type loseReply struct {
	armed   atomic.Bool
	mu      sync.Mutex
	markers []string
}

func (h *loseReply) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *loseReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *loseReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if name := cmd.Name(); name != "evalsha" && name != "eval" || err != nil {
			return err // not a script, or one that did not run (NOSCRIPT)
		}
		if args := cmd.Args(); len(args) > 3 {
			h.mu.Lock()
			h.markers = append(h.markers, args[3].(string))
			h.mu.Unlock()
		}
		if h.armed.CompareAndSwap(true, false) {
			err = errors.New("injected: reply lost after Redis applied the script")
			cmd.SetErr(err)
		}
		return err
	}
}

func (h *loseReply) calls() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.markers)
}

func TestRedisAmbiguousFailure(t *testing.T) {
	srv := startRedisServer(t, false)
	hook := &loseReply{}
	var deg degradedLog
	r := newRedis(t, srv.Client(t, hook), RedisOptions{OnDegraded: deg.record})
	kA := Key{Day: "2026-11-30", KeyID: "a", Team: "t", Model: "m"}
	kB := Key{Day: "2026-11-30", KeyID: "b", Team: "t", Model: "m"}
	r.Add(kA, Totals{Requests: 1, Input: 10, CostMicros: 100}, time.Time{})

	hook.armed.Store(true)
	if err := r.Flush(context.Background()); err == nil {
		t.Fatal("Flush succeeded although its reply was lost")
	}
	// Redis did apply the batch: the failure is ambiguous.
	rows, err := r.Query(context.Background(), Filter{})
	if err != nil || len(rows) != 1 || rows[0].Requests != 1 {
		t.Fatalf("after the lost reply Redis holds %+v, %v; want the batch applied once", rows, err)
	}
	if r.Pending() != 1 {
		t.Fatalf("Pending = %d, want 1 (the unconfirmed batch)", r.Pending())
	}
	// New adds, to A's row and a new row, go to a later batch.
	r.Add(kA, Totals{Requests: 1, Input: 5, CostMicros: 50}, time.Time{})
	r.Add(kB, Totals{Requests: 1, Input: 7, CostMicros: 70}, time.Time{})
	flush(t, r)

	rows, err = r.Query(context.Background(), Filter{})
	if err != nil {
		t.Fatal(err)
	}
	want := []Row{{kA, Totals{Requests: 2, Input: 15, CostMicros: 150}}, {kB, Totals{Requests: 1, Input: 7, CostMicros: 70}}}
	if !reflect.DeepEqual(rows, want) {
		t.Fatalf("rows %+v, want %+v", rows, want)
	}
	calls := hook.calls()
	if len(calls) != 3 || calls[0] != calls[1] || calls[2] == calls[1] {
		t.Fatalf("script calls with markers %q; want a retry with the same id, then a new id", calls)
	}
	if ev := deg.get(); !reflect.DeepEqual(ev, []bool{true, false}) {
		t.Fatalf("OnDegraded calls %v, want [true false]", ev)
	}
}

func TestRedisTwoReplicas(t *testing.T) {
	srv := startRedisServer(t, false)
	r1 := newRedis(t, srv.Client(t), RedisOptions{ReplicaID: "same", FlushInterval: time.Millisecond})
	r2 := newRedis(t, srv.Client(t), RedisOptions{ReplicaID: "same", FlushInterval: time.Millisecond})
	adds := sampleAdds()
	addConcurrently(adds, 0, r1, r2)
	flush(t, r1)
	flush(t, r2)
	checkQueries(t, r1, adds)
	checkQueries(t, r2, adds)
}

// addConcurrently adds adds through the ledgers, from two goroutines per
// ledger, each taking every fourth add (every other with one ledger), with
// pause after each.
func addConcurrently(adds []add, pause time.Duration, ls ...*Redis) {
	var wg sync.WaitGroup
	workers := append(slices.Clone(ls), ls...)
	for i, l := range workers {
		wg.Go(func() {
			for j, a := range adds {
				if j%len(workers) == i {
					l.Add(a.k, a.t, time.Time{})
					time.Sleep(pause)
				}
			}
		})
	}
	wg.Wait()
}

func TestRedisDegraded(t *testing.T) {
	srv := startRedisServer(t, true)
	var deg degradedLog
	c := srv.Client(t)
	r := newRedis(t, c, RedisOptions{OnDegraded: deg.record})
	k := Key{Day: "2026-11-30", KeyID: "k"}
	r.Add(k, Totals{Requests: 1}, time.Time{})
	// A caller giving up says nothing about Redis: no degraded call.
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Flush(cancelled); err == nil {
		t.Fatal("Flush with a cancelled context succeeded")
	}
	if ev := deg.get(); len(ev) != 0 {
		t.Fatalf("OnDegraded calls %v after a cancelled Flush, want none", ev)
	}
	flush(t, r)
	srv.Kill()
	r.Add(k, Totals{Requests: 2}, time.Time{})
	for range 3 {
		if err := r.Flush(context.Background()); err == nil || !strings.HasPrefix(err.Error(), "spend: ") {
			t.Fatalf("Flush with Redis down: %v, want a spend: error", err)
		}
	}
	r.Add(k, Totals{Requests: 4}, time.Time{})
	if ev := deg.get(); !reflect.DeepEqual(ev, []bool{true}) {
		t.Fatalf("OnDegraded calls %v, want [true] once", ev)
	}
	if r.Pending() != 2 { // the failed batch, and the row added since
		t.Fatalf("Pending = %d, want 2", r.Pending())
	}
	srv.Start()
	// go-redis stops dialling after PoolSize (10*GOMAXPROCS) failed dials
	// and probes once a second: wait, bounded, until the client dials again.
	for i := 0; c.Ping(context.Background()).Err() != nil; i++ {
		if i == 100 {
			t.Fatal("client did not reconnect to the restarted Redis")
		}
		time.Sleep(50 * time.Millisecond)
	}
	flush(t, r)
	if ev := deg.get(); !reflect.DeepEqual(ev, []bool{true, false}) {
		t.Fatalf("OnDegraded calls %v, want [true false]", ev)
	}
	rows, err := r.Query(context.Background(), Filter{})
	if err != nil || len(rows) != 1 || rows[0].Requests != 7 {
		t.Fatalf("rows %+v, %v; want 7 requests", rows, err)
	}
}

func TestRedisMaxPending(t *testing.T) {
	srv := startRedisServer(t, false)
	r := newRedis(t, srv.Client(t), RedisOptions{MaxPending: 2})
	d0 := "2026-01-01"
	one := Totals{Requests: 1, CostMicros: 10}
	var kept Totals
	for _, id := range []string{"a", "b", "c", "d", "a"} {
		r.Add(Key{Day: d0, KeyID: id}, one, time.Time{})
		kept.Add(one)
	}
	// 69 more days: 63 get an overflow row (d0 holds the first), 6 are dropped.
	start := time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC)
	for i := range 69 {
		r.Add(Key{Day: Day(start.AddDate(0, 0, i)), KeyID: "x"}, one, time.Time{})
		if i < maxOverflowRows-1 {
			kept.Add(one)
		}
	}
	if r.Folded() != 2+maxOverflowRows-1 || r.Dropped() != 69-(maxOverflowRows-1) {
		t.Fatalf("Folded %d, Dropped %d; want %d, %d", r.Folded(), r.Dropped(), 2+maxOverflowRows-1, 69-(maxOverflowRows-1))
	}
	err := r.Close()
	if err == nil || !strings.Contains(err.Error(), "dropped") {
		t.Fatalf("Close = %v, want an error reporting the drops", err)
	}
	rows, err := r.Query(context.Background(), Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if got := sumRows(rows); got != kept {
		t.Fatalf("Redis holds %+v, want %+v (everything not dropped)", got, kept)
	}
	d0rows, err := r.Query(context.Background(), Filter{From: d0, To: d0})
	if err != nil {
		t.Fatal(err)
	}
	wantD0 := []Row{ // sorted by team first: "" before "(overflow)"
		{Key{Day: d0, KeyID: "a"}, Totals{Requests: 2, CostMicros: 20}},
		{Key{Day: d0, KeyID: "b"}, one},
		{Key{Day: d0, KeyID: Overflow, Team: Overflow, Model: Overflow}, Totals{Requests: 2, CostMicros: 20}},
	}
	if !reflect.DeepEqual(d0rows, wantD0) {
		t.Fatalf("day %s rows %+v, want %+v", d0, d0rows, wantD0)
	}
}

func TestRedisCloseReportsUnwritten(t *testing.T) {
	srv := startRedisServer(t, false)
	r := newRedis(t, srv.Client(t), RedisOptions{})
	srv.Kill()
	r.Add(Key{Day: "2026-11-30", KeyID: "a"}, Totals{Requests: 1}, time.Time{})
	r.Add(Key{Day: "2026-11-30", KeyID: "b"}, Totals{Requests: 1}, time.Time{})
	err := r.Close()
	if err == nil || !strings.Contains(err.Error(), "2 rows not written") || strings.Contains(err.Error(), "spill") {
		t.Fatalf("Close = %v, want an error saying 2 rows are not written, and no spill file", err)
	}
	if r.Pending() != 2 {
		t.Fatalf("Pending after Close = %d, want 2", r.Pending())
	}
	if err2 := r.Close(); err2 != err {
		t.Fatalf("second Close = %v, want the first result", err2)
	}
}

func TestParseField(t *testing.T) {
	for _, k := range []Key{{}, {Team: "a:b", KeyID: "3:xyz", Model: "9:"}, {Team: "ü", KeyID: "\x00", Model: "m"}} {
		team, keyID, model, counter, err := parseField(rowPrefix(k) + fCost)
		if err != nil || team != k.Team || keyID != k.KeyID || model != k.Model || counter != fCost {
			t.Errorf("round trip of %+v = %q %q %q %q %v", k, team, keyID, model, counter, err)
		}
	}
	for _, f := range []string{"", "x", "1:", "5:ab0:0:c", "-1:a0:0:r", "0:0:"} {
		if _, _, _, _, err := parseField(f); err == nil {
			t.Errorf("parseField(%q) accepted a malformed field", f)
		}
	}
}

// TestRedisWrongTypeFailsWhole checks that a batch meeting a key of the
// wrong type writes nothing, so that once the key is repaired the retry
// applies the whole batch.
func TestRedisWrongTypeFailsWhole(t *testing.T) {
	srv := startRedisServer(t, false)
	c := srv.Client(t)
	r := newRedis(t, c, RedisOptions{})
	ctx := context.Background()
	bad := "{tollgate:spend}:day:2026-12-01"
	if err := c.Set(ctx, bad, "oops", 0).Err(); err != nil {
		t.Fatal(err)
	}
	r.Add(Key{Day: "2026-11-30", KeyID: "a"}, Totals{Requests: 1}, time.Time{})
	r.Add(Key{Day: "2026-12-01", KeyID: "a"}, Totals{Requests: 2}, time.Time{})
	if err := r.Flush(ctx); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("Flush = %v, want a WRONGTYPE error", err)
	}
	if n, err := c.Exists(ctx, "{tollgate:spend}:day:2026-11-30", "{tollgate:spend}:days").Result(); err != nil || n != 0 {
		t.Fatalf("a failed batch wrote %d keys (%v)", n, err)
	}
	if err := c.Del(ctx, bad).Err(); err != nil {
		t.Fatal(err)
	}
	flush(t, r)
	rows, err := r.Query(ctx, Filter{})
	if err != nil || sumRows(rows).Requests != 3 || len(rows) != 2 {
		t.Fatalf("rows %+v, %v; want 2 rows, 3 requests", rows, err)
	}
}

// TestRedisAddWhileFlushingNothing: a flush that finds nothing pending must
// not read the live map after releasing its lock (caught by -race).
func TestRedisAddWhileFlushingNothing(t *testing.T) {
	srv := startRedisServer(t, false)
	r := newRedis(t, srv.Client(t), RedisOptions{FlushInterval: time.Hour})
	ctx := context.Background()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 200 {
			r.Add(Key{Day: "2026-11-30", KeyID: "k", Team: "t", Model: strconv.Itoa(i % 7)}, Totals{Requests: 1}, time.Time{})
		}
	}()
	for range 50 {
		if err := r.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := r.Query(ctx, Filter{})
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, row := range rows {
		n += row.Requests
	}
	if n != 200 {
		t.Errorf("%d requests in Redis, want 200", n)
	}
}

// TestRedisCloseJustAfterOutage: a replica stopping right after Redis came
// back still writes its spend. go-redis refuses to dial for up to a second
// once a pool's worth of dials failed (here a pool of 1), so Close's final
// flush tries again within its bound instead of giving the spend up.
func TestRedisCloseJustAfterOutage(t *testing.T) {
	srv := startRedisServer(t, true)
	c := srv.ClientWith(t, redis.Options{PoolSize: 1, MaxRetries: -1})
	r, err := NewRedis(c, RedisOptions{FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	k := Key{Day: "2026-11-30", KeyID: "k", Team: "t", Model: "m"}
	r.Add(k, Totals{Requests: 1, Input: 10}, time.Time{})
	srv.Kill()
	for range 3 {
		if err := r.Flush(context.Background()); err == nil {
			t.Fatal("Flush with Redis down succeeded")
		}
	}
	srv.Start()
	if err := r.Close(); err != nil {
		t.Fatalf("Close just after Redis came back: %v", err)
	}
	other := srv.Client(t)
	reader, err := NewRedis(other, RedisOptions{FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reader.Close() }()
	rows, err := reader.Query(context.Background(), Filter{KeyID: "k"})
	if err != nil || len(rows) != 1 || rows[0].Requests != 1 || rows[0].Input != 10 {
		t.Fatalf("Redis holds %+v (%v); want the request written at Close", rows, err)
	}
}
