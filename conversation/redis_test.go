package conversation

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-llm/tollgate/internal/redistest"
)

// sumOf is what turns add up to, per conversation: the figures that do not
// depend on the order in which replicas' batches reached Redis (TTFTs are
// compared as a count and a sum).
type sumOf struct {
	turns, errors, cost, input, ttftCount int64
	ttftSum                               time.Duration
	first, last                           time.Time
	// mainCost is the cost of the turns of class "main"; prompts the
	// distinct prompts the turns named.
	mainCost int64
	prompts  map[string]bool
}

func (s *sumOf) add(t Turn) {
	if s.turns == 0 || t.At.Before(s.first) {
		s.first = t.At
	}
	if s.turns == 0 || t.At.After(s.last) {
		s.last = t.At
	}
	s.turns++
	if t.Error {
		s.errors++
	}
	s.cost += t.CostMicros
	s.input += t.Tokens.Input
	if t.Hints.Class == "main" {
		s.mainCost += t.CostMicros
	}
	if t.Hints.Prompt != "" {
		if s.prompts == nil {
			s.prompts = map[string]bool{}
		}
		s.prompts[t.Hints.Prompt] = true
	}
	if s.ttftCount < MaxTTFTs {
		s.ttftCount++
		s.ttftSum += t.TTFT
	}
}

// check reports how c differs from s ("" when it does not).
func (s *sumOf) check(c Conversation) string {
	var sum time.Duration
	for _, v := range c.TTFTs {
		sum += v
	}
	var mainCost int64
	if m := c.Breakdown.Classes["main"]; m != nil {
		mainCost = m.CostMicros
	}
	if mainCost != s.mainCost {
		return fmt.Sprintf("main calls cost %d, want %d", mainCost, s.mainCost)
	}
	if c.Turns != s.turns || c.Errors != s.errors || c.CostMicros != s.cost || c.Tokens.Input != s.input ||
		!c.First.Equal(s.first) || !c.Last.Equal(s.last) || int64(len(c.TTFTs)) != s.ttftCount {
		return fmt.Sprintf("turns %d errors %d cost %d input %d first %v last %v ttfts %d; want %d %d %d %d %v %v %d",
			c.Turns, c.Errors, c.CostMicros, c.Tokens.Input, c.First, c.Last, len(c.TTFTs),
			s.turns, s.errors, s.cost, s.input, s.first, s.last, s.ttftCount)
	}
	// With more turns than MaxTTFTs, which are kept depends on the order
	// the batches arrived in.
	if s.turns <= MaxTTFTs && sum != s.ttftSum {
		return fmt.Sprintf("TTFTs sum to %v, want %v", sum, s.ttftSum)
	}
	return ""
}

// endCounter counts OnEnd calls per conversation across stores.
type endCounter struct {
	mu   sync.Mutex
	n    map[string]int
	last map[string]Conversation
}

func (e *endCounter) onEnd(c Conversation, _ Reason) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n == nil {
		e.n, e.last = map[string]int{}, map[string]Conversation{}
	}
	e.n[c.Key]++
	e.last[c.Key] = c
}

// newTestRedis is a Redis store on client for the tests of this file,
// closed in t.Cleanup; its loop does not tick on its own (Interval 1 h).
func newTestRedis(t *testing.T, client redis.UniversalClient, opts RedisOptions) *Redis {
	t.Helper()
	if opts.Interval == 0 {
		opts.Interval = time.Hour
	}
	if opts.IdleTimeout == 0 {
		opts.IdleTimeout = testIdle
	}
	if opts.Prefix == "" {
		opts.Prefix = "test:"
	}
	r, err := NewRedis(client, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func TestRedisReplicasCountEveryTurnOnce(t *testing.T) {
	srv := redistest.Start(t)
	clock := newFakeClock()
	var ends endCounter
	opts := RedisOptions{Options: Options{Now: clock.Now, OnEnd: ends.onEnd, Interval: 2 * time.Millisecond}}
	stores := []*Redis{newTestRedis(t, srv.Client(t), opts), newTestRedis(t, srv.Client(t), opts)}
	ctx := context.Background()

	const convs, perWorker, workers = 20, 150, 4
	keys := make([]string, convs)
	for i := range keys {
		keys[i] = Key("team:research", fmt.Sprint("conv-", i))
	}
	var mu sync.Mutex
	want := map[string]*sumOf{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := stores[w%2] // two workers per store, their loops flushing meanwhile
			for i := range perWorker {
				tu := Turn{Key: keys[(i*7+w)%convs], Team: "research", At: clock.Now().Add(time.Duration(i) * time.Millisecond),
					Tokens: Tokens{Input: int64(i + 1)}, CostMicros: int64(w*1000 + i), TTFT: time.Duration(i+1) * time.Microsecond,
					Error: i%5 == 0, Hints: Hints{Class: []string{"main", "subagent", "main"}[i%3], Prompt: fmt.Sprint("p", i%11)}}
				// Counted before it is recorded, so a Get never sees more.
				mu.Lock()
				if want[tu.Key] == nil {
					want[tu.Key] = &sumOf{}
				}
				want[tu.Key].add(tu)
				mu.Unlock()
				s.Record(tu)
				if i%40 == 0 {
					// Reads while the loops flush: never a turn twice.
					c, err := s.Get(ctx, tu.Key)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					if c.Turns > want[tu.Key].turns {
						t.Errorf("Get during flushes: %d turns, only %d recorded", c.Turns, want[tu.Key].turns)
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	// Once the other store has sent its turns, a store's Get and Cost (what
	// Redis holds plus its own pending turns) are the whole conversation.
	for i, s := range stores {
		if err := stores[1-i].Flush(ctx); err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if diff := want[k].check(s.get(t, k)); diff != "" {
				t.Errorf("store %d, %s: %s", i, k, diff)
			}
			if cost, err := s.Cost(ctx, k); err != nil || cost != want[k].cost {
				t.Errorf("store %d: Cost = %d, %v; want %d", i, cost, err, want[k].cost)
			}
		}
	}
	clock.Advance(testIdle)
	var tw sync.WaitGroup
	for _, s := range stores {
		tw.Add(1)
		go func() { defer tw.Done(); s.tick(ctx) }()
	}
	tw.Wait()
	for _, s := range stores { // their loops may be ending some too
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	ends.mu.Lock()
	defer ends.mu.Unlock()
	for _, k := range keys {
		if ends.n[k] != 1 {
			t.Errorf("%s ended %d times, want once", k, ends.n[k])
			continue
		}
		if diff := want[k].check(ends.last[k]); diff != "" {
			t.Errorf("ended %s: %s", k, diff)
		}
		// Each prompt counts once, whichever replicas sent it.
		if got := ends.last[k].Breakdown.Prompts; got != int64(len(want[k].prompts)) {
			t.Errorf("ended %s: %d prompts, want %d", k, got, len(want[k].prompts))
		}
	}
}

// get is Get that fails the test on an error.
func (r *Redis) get(t *testing.T, key string) Conversation {
	t.Helper()
	c, err := r.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("Get(%s): %v", key, err)
	}
	return c
}

// loseReply is a hook that, when armed, lets the next script call whose
// first key ends with suffix run on Redis and then reports it as failed, as
// a timeout after Redis applied it would.
type loseReply struct {
	suffix string
	armed  atomic.Bool
	lost   atomic.Int32
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
		if args := cmd.Args(); len(args) < 4 || !strings.Contains(fmt.Sprint(args[3]), h.suffix) {
			return err
		}
		if h.armed.CompareAndSwap(true, false) {
			h.lost.Add(1)
			err = errors.New("injected: reply lost after Redis ran the script")
			cmd.SetErr(err)
		}
		return err
	}
}

func TestRedisBatchSentAgainAfterALostReplyAppliesOnce(t *testing.T) {
	srv := redistest.Start(t)
	hook := &loseReply{suffix: ":b:"} // the batch script's first key is its marker
	clock := newFakeClock()
	r := newTestRedis(t, srv.Client(t, hook), RedisOptions{Options: Options{Now: clock.Now}})
	other := newTestRedis(t, srv.Client(t), RedisOptions{Options: Options{Now: clock.Now}})
	ctx := context.Background()
	k := Key("", "lost-reply")
	r.Record(Turn{Key: k, At: clock.Now(), CostMicros: 5, TTFT: time.Millisecond})
	hook.armed.Store(true)
	if err := r.Flush(ctx); err == nil {
		t.Fatal("Flush with its reply lost succeeded")
	}
	if hook.lost.Load() != 1 {
		t.Fatal("the hook lost no reply")
	}
	// Redis applied it; the replica does not know: its Get must not add the
	// batch again, and another replica sees it already.
	if c := r.get(t, k); c.Turns != 1 || c.CostMicros != 5 {
		t.Errorf("Get after the lost reply: %d turns, cost %d; want 1, 5", c.Turns, c.CostMicros)
	}
	if c, err := r.Cost(ctx, k); err != nil || c != 5 {
		t.Errorf("Cost after the lost reply = %d, %v; want 5", c, err)
	}
	if c := other.get(t, k); c.Turns != 1 {
		t.Errorf("other replica: %d turns, want 1", c.Turns)
	}
	r.Record(Turn{Key: k, At: clock.Now(), CostMicros: 7})
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if c := other.get(t, k); c.Turns != 2 || c.CostMicros != 12 || len(c.TTFTs) != 2 {
		t.Errorf("after the batch was sent again: %+v; want 2 turns, cost 12", c)
	}
}

func TestRedisIdlePopWithALostReplyEndsOnce(t *testing.T) {
	srv := redistest.Start(t)
	hook := &loseReply{suffix: ":active"} // the idle script's first key
	clock := newFakeClock()
	var ends endCounter
	r := newTestRedis(t, srv.Client(t, hook), RedisOptions{Options: Options{Now: clock.Now, OnEnd: ends.onEnd}})
	ctx := context.Background()
	k := Key("", "idle")
	r.Record(Turn{Key: k, At: clock.Now(), CostMicros: 3})
	r.tick(ctx)
	clock.Advance(testIdle)
	hook.armed.Store(true)
	r.tick(ctx) // Redis ended it; the reply is lost
	if hook.lost.Load() != 1 {
		t.Fatal("the hook lost no reply")
	}
	r.tick(ctx)
	r.tick(ctx)
	ends.mu.Lock()
	defer ends.mu.Unlock()
	if ends.n[k] != 1 || ends.last[k].CostMicros != 3 {
		t.Errorf("ended %d times (%+v), want once with cost 3", ends.n[k], ends.last[k])
	}
}

func TestRedisThreeReplicasEndEachIdleConversationOnce(t *testing.T) {
	srv := redistest.Start(t)
	clock := newFakeClock()
	var ends endCounter
	opts := RedisOptions{Options: Options{Now: clock.Now, OnEnd: ends.onEnd}}
	stores := make([]*Redis, 3)
	for i := range stores {
		stores[i] = newTestRedis(t, srv.Client(t), opts)
	}
	ctx := context.Background()
	const n = 300 // more than one idle pop
	want := map[string]*sumOf{}
	for i := range n {
		k := Key("team:t", fmt.Sprint(i))
		want[k] = &sumOf{}
		for j := range 1 + i%3 { // turns of one conversation on several replicas
			tu := Turn{Key: k, Team: "t", At: clock.Now(), CostMicros: int64(i + j), TTFT: time.Millisecond}
			stores[(i+j)%3].Record(tu)
			want[k].add(tu)
		}
	}
	for _, s := range stores {
		if err := s.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(testIdle)
	var wg sync.WaitGroup
	for _, s := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 3 {
				s.tick(ctx)
			}
		}()
	}
	wg.Wait()
	ends.mu.Lock()
	defer ends.mu.Unlock()
	if len(ends.n) != n {
		t.Errorf("%d conversations ended, want %d", len(ends.n), n)
	}
	for k, w := range want {
		if ends.n[k] != 1 {
			t.Errorf("%s ended %d times, want once", k, ends.n[k])
		} else if diff := w.check(ends.last[k]); diff != "" {
			t.Errorf("%s: %s", k, diff)
		}
	}
}

func TestRedisDownRecordGoesOnAndTurnsAreSentOnceBack(t *testing.T) {
	srv := redistest.Start(t)
	clock := newFakeClock()
	r := newTestRedis(t, srv.Client(t), RedisOptions{Options: Options{Now: clock.Now}})
	ctx := context.Background()
	k, k2 := Key("", "outage"), Key("", "during")
	r.Record(Turn{Key: k, At: clock.Now(), CostMicros: 1})
	srv.Kill()
	// The first batch fails and is kept.
	if err := r.Flush(ctx); err == nil {
		t.Fatal("Flush with Redis down succeeded")
	}
	// Record does no I/O: turns keep aggregating while Redis is down.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 1000 {
			r.Record(Turn{Key: k, At: clock.Now(), CostMicros: 1})
			r.Record(Turn{Key: k2, At: clock.Now(), CostMicros: 2})
		}
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second): // a liveness bound, not a timing
		t.Fatal("Record blocked while Redis was down")
	}
	r.tick(ctx) // fails, ends nothing
	srv.Start() // an empty Redis: only the resent batches fill it
	var err error
	for range 40 { // go-redis may refuse to dial for a moment after failed dials
		if err = r.Flush(ctx); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	other := newTestRedis(t, srv.Client(t), RedisOptions{Options: Options{Now: clock.Now}})
	if c := other.get(t, k); c.Turns != 1001 || c.CostMicros != 1001 {
		t.Errorf("%d turns, cost %d; want 1001, 1001", c.Turns, c.CostMicros)
	}
	if c := other.get(t, k2); c.Turns != 1000 || c.CostMicros != 2000 {
		t.Errorf("%d turns, cost %d; want 1000, 2000", c.Turns, c.CostMicros)
	}
}

func TestRedisMaxPendingDropsAndCountsTurns(t *testing.T) {
	srv := redistest.Start(t)
	clock := newFakeClock()
	r := newTestRedis(t, srv.Client(t), RedisOptions{Options: Options{Now: clock.Now}, MaxPending: 3})
	ctx := context.Background()
	var keys []string
	for i := range 5 {
		keys = append(keys, Key("", fmt.Sprint(i)))
		r.Record(Turn{Key: keys[i], At: clock.Now(), CostMicros: 1})
	}
	r.Record(Turn{Key: keys[0], At: clock.Now(), CostMicros: 1}) // a waiting conversation still takes turns
	if d := r.Dropped(); d != 2 {
		t.Errorf("Dropped = %d, want 2", d)
	}
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if c := r.get(t, keys[0]); c.Turns != 2 {
		t.Errorf("kept conversation: %d turns, want 2", c.Turns)
	}
	if _, err := r.Get(ctx, keys[4]); !errors.Is(err, ErrUnknown) {
		t.Errorf("dropped conversation: %v, want ErrUnknown", err)
	}
	// Sent, so there is room again.
	r.Record(Turn{Key: keys[4], At: clock.Now(), CostMicros: 1})
	if c := r.get(t, keys[4]); c.Turns != 1 || r.Dropped() != 2 {
		t.Errorf("after the flush: %d turns, %d dropped", c.Turns, r.Dropped())
	}
}

func TestRedisSetOutcomeSeesTurnsOnlyThisReplicaHas(t *testing.T) {
	srv := redistest.Start(t)
	clock := newFakeClock()
	r := newTestRedis(t, srv.Client(t), RedisOptions{Options: Options{Now: clock.Now}})
	other := newTestRedis(t, srv.Client(t), RedisOptions{Options: Options{Now: clock.Now}})
	ctx := context.Background()
	k := Key("", "fresh")
	r.Record(Turn{Key: k, At: clock.Now(), CostMicros: 4})
	c, err := r.SetOutcome(ctx, k, Outcome{Completed: true, At: clock.Now()})
	if err != nil || c.Turns != 1 || c.Outcome == nil {
		t.Fatalf("SetOutcome = %+v, %v", c, err)
	}
	if _, err := other.SetOutcome(ctx, k, Outcome{At: clock.Now()}); !errors.Is(err, ErrOutcomeSet) {
		t.Errorf("other replica's outcome: %v, want ErrOutcomeSet", err)
	}
}

func TestRedisResponseLinksAreHashed(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	r := newTestRedis(t, client, RedisOptions{})
	ctx := context.Background()
	if err := r.Link(ctx, "resp_secret_id", Key("", "c")); err != nil {
		t.Fatal(err)
	}
	keys, err := client.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 {
		t.Fatalf("keys %v, want one link", keys)
	}
	for _, k := range keys {
		if strings.Contains(k, "resp_secret_id") {
			t.Errorf("raw response id in key %q", k)
		}
		if ttl := client.PTTL(ctx, k).Val(); ttl <= 0 || ttl > linkLifetime(testIdle) {
			t.Errorf("link TTL %v, want (0, %v]", ttl, linkLifetime(testIdle))
		}
	}
}

func TestRedisEvictionWithALostReplyEndsOnce(t *testing.T) {
	srv := redistest.Start(t)
	hook := &loseReply{suffix: ":b:"}
	clock := newFakeClock()
	var ends endCounter
	client := srv.Client(t, hook)
	r := newTestRedis(t, client, RedisOptions{Options: Options{Now: clock.Now, OnEnd: ends.onEnd, MaxActive: 1}})
	ctx := context.Background()
	a, b := Key("", "a"), Key("", "b")
	r.Record(Turn{Key: a, At: clock.Now(), CostMicros: 3})
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	r.Record(Turn{Key: b, At: clock.Now(), CostMicros: 1})
	hook.armed.Store(true)
	if err := r.Flush(ctx); err == nil || hook.lost.Load() != 1 {
		t.Fatalf("Flush with its reply lost: %v (%d lost)", err, hook.lost.Load())
	}
	// Redis evicted a; the batch sent again returns it, and only once.
	for range 2 {
		if err := r.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	ends.mu.Lock()
	defer ends.mu.Unlock()
	if len(ends.n) != 1 || ends.n[a] != 1 || ends.last[a].CostMicros != 3 {
		t.Errorf("ended %v, want a once with cost 3", ends.n)
	}
	if _, err := r.Get(ctx, a); !errors.Is(err, ErrUnknown) {
		t.Errorf("evicted conversation still answers: %v", err)
	}
	// Once received, the marker no longer keeps the evicted records.
	markers, err := client.Keys(ctx, "test:conv:{c}:b:*").Result()
	if err != nil || len(markers) != 2 {
		t.Fatalf("markers %q, %v; want the two batches'", markers, err)
	}
	for _, m := range markers {
		if v := client.Get(ctx, m).Val(); v != "1" {
			t.Errorf("marker %s holds %q, want 1", m, v)
		}
		if ttl := client.TTL(ctx, m).Val(); ttl <= 0 {
			t.Errorf("marker %s has TTL %v", m, ttl)
		}
	}
}

func TestRedisCloseWithRedisDownReportsTheLostTurns(t *testing.T) {
	srv := redistest.Start(t)
	r, err := NewRedis(srv.Client(t), RedisOptions{Options: Options{Interval: time.Hour}, Prefix: "test:"})
	if err != nil {
		t.Fatal(err)
	}
	r.Record(Turn{Key: Key("", "lost"), At: time.Now(), CostMicros: 1})
	srv.Kill()
	if err := r.Close(); err == nil || !strings.Contains(err.Error(), "1 conversations") {
		t.Errorf("Close with Redis down: %v, want an error naming 1 conversation", err)
	}
}
