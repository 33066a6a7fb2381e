package conversation

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// defaultMaxPending is RedisOptions.MaxPending's default.
	defaultMaxPending = 100_000
	// maxBatchConvs bounds the conversations one batch script applies, so
	// a big backlog does not block Redis in one long script.
	maxBatchConvs = 500
	// idlePop is how many idle conversations one idle script ends.
	idlePop = 200
	// markerTTL is how long Redis remembers an applied batch or idle pop:
	// far longer than any retry of the same one.
	markerTTL = 24 * time.Hour
	// flushTimeout bounds one background tick.
	flushTimeout = 10 * time.Second
	// closeTimeout bounds the final flush of Close; closeRetryFor is how
	// long it keeps trying, every closeRetryEvery, while it fails (go-redis
	// refuses to dial for a moment after a pool's worth of dials failed).
	closeTimeout    = 5 * time.Second
	closeRetryFor   = 1500 * time.Millisecond
	closeRetryEvery = 250 * time.Millisecond
)

// RedisOptions configure a Redis store. The zero value is usable.
type RedisOptions struct {
	Options
	// Prefix starts every key; empty means "tollgate:". The keys are
	// Prefix+"conv:{c}:…": the hash tag puts them all in one Redis Cluster
	// slot, so that a script may touch several conversations.
	Prefix string
	// Logger receives flush failures, recoveries and drops. Default
	// slog.Default().
	Logger *slog.Logger
	// MaxPending bounds the conversations whose turns wait in memory to be
	// sent; zero or less means 100000. Past it, a turn of another
	// conversation is dropped, counted by Dropped and logged. The batches
	// being retried while Redis is unreachable (cut when pending was at
	// most MaxPending) come on top, so memory holds at most twice as many.
	MaxPending int
}

// Redis is a Store shared by every gateway replica through Redis.
//
// Record never does I/O: it folds the turn into this replica's pending
// delta of its conversation, under a mutex. A goroutine sends the pending
// deltas every Interval, in batches that a Lua script applies exactly
// once, even when a batch is sent again after its reply was lost (a marker
// key per batch id, with a TTL of a day). A batch that fails (Redis down)
// is kept and sent again as is before anything newer; meanwhile new turns
// keep aggregating in pending, bounded by MaxPending. After sending, the
// same tick ends the conversations idle for IdleTimeout: a script pops them
// atomically, so exactly one replica hands each to OnEnd.
//
// Layout: every key is under Prefix+"conv:{c}:", one Redis Cluster slot
// (so all conversations live on one Cluster node). Per conversation a hash
// (counters, first and last turn in µs, team, outcome) and a list of its
// first MaxTTFTs TTFTs; a sorted set of the active conversations scored by
// when their last turn was recorded; a key per linked response (its id
// hashed, see linkKey) with a TTL of twice IdleTimeout (linkLifetime). The scripts enforce
// MaxActive: past it the lowest-scored conversations are removed, and the
// replica whose batch removed them calls OnEnd(c, EndEvicted), from the
// call that sent it (its loop, Flush, SetOutcome or Close), outside its
// locks. The scores are this replica's Options.Now when a turn was
// recorded, so the replicas' clocks must agree to well within IdleTimeout.
//
// Times are kept to the microsecond. Get, Cost and SetOutcome add this
// replica's unsent turns to what Redis holds (not other replicas'), and
// wait for a send in progress. Turns still unsent when Close gives up
// (Redis unreachable for its few seconds) are lost.
type Redis struct {
	client     redis.UniversalClient
	opts       Options
	tag        string
	log        *slog.Logger
	maxPending int

	mu      sync.Mutex
	pending map[string]*delta
	dropped atomic.Int64

	// sem admits one send at a time and guards the fields below it.
	sem      chan struct{}
	queue    []*batch          // cut from pending, not yet known applied, in order
	queued   map[string]queued // the conversations of queue
	degraded bool              // the last send failed
	logged   int64             // Dropped when last logged
	popMu    sync.Mutex        // one idle pop at a time; guards popID
	popID    string            // an idle pop whose reply was lost, to send again

	ctx       context.Context // cancelled by Close, to stop the goroutine
	cancel    context.CancelFunc
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
}

var _ Store = (*Redis)(nil)

// delta is one conversation's turns not yet in Redis. Times are µs since
// the epoch; seen is when its last turn was recorded (Options.Now).
type delta struct {
	team              string
	turns, errors     int64
	tokens            Tokens
	cost              int64
	first, last, seen int64
	ttfts             []time.Duration
	// start is the first turn's arrival in µs (0: none said); keyID and
	// user the first named; bd the turns' breakdown, its prompts those of
	// these turns (Redis counts each prompt once across batches).
	start       int64
	keyID, user string
	agent       bool
	bd          Breakdown
}

func (d *delta) add(t *Turn, at, seen int64) {
	if d.turns == 0 {
		d.team, d.first, d.last = t.Team, at, at
	}
	d.turns++
	if t.Error {
		d.errors++
	}
	d.tokens.Add(t.Tokens)
	d.cost += t.CostMicros
	d.first, d.last, d.seen = min(d.first, at), max(d.last, at), max(d.seen, seen)
	if len(d.ttfts) < MaxTTFTs {
		d.ttfts = append(d.ttfts, t.TTFT)
	}
	if !t.Start.IsZero() && (d.start == 0 || t.Start.UnixMicro() < d.start) {
		d.start = t.Start.UnixMicro()
	}
	if d.keyID == "" {
		d.keyID = t.KeyID
	}
	if d.user == "" {
		d.user = t.User
	}
	d.agent = d.agent || t.AgentSession
	d.bd.addTurn(&t.Hints, callOf(t), t.Tokens.Input)
}

// foldInto adds d to c (key's figures), as the batch script would.
func (d *delta) foldInto(c *Conversation, key string) {
	first, last := time.UnixMicro(d.first).UTC(), time.UnixMicro(d.last).UTC()
	if c.Turns == 0 {
		c.Key, c.Team, c.First, c.Last = key, d.team, first, last
	}
	c.Turns += d.turns
	c.Errors += d.errors
	c.Tokens.Add(d.tokens)
	c.CostMicros += d.cost
	if first.Before(c.First) {
		c.First = first
	}
	if last.After(c.Last) {
		c.Last = last
	}
	if room := MaxTTFTs - len(c.TTFTs); room > 0 {
		c.TTFTs = append(c.TTFTs, d.ttfts[:min(room, len(d.ttfts))]...)
	}
	if d.start != 0 {
		c.Start = sessionStart(c.Start, time.UnixMicro(d.start).UTC())
	}
	if c.KeyID == "" {
		c.KeyID = d.keyID
	}
	if c.User == "" {
		c.User = d.user
	}
	c.AgentSession = c.AgentSession || d.agent
	c.Breakdown.merge(&d.bd)
}

// batch is one batch script call; its id and arguments never change once
// built, so a retry sends exactly what the first attempt sent.
type batch struct {
	id   string
	keys []string
	args []any
	// convs are the conversations it carries.
	convs []string
}

// queued is a conversation's delta in a queued batch.
type queued struct {
	b *batch
	d *delta
}

// NewRedis returns a Redis store on client, which it does not own: Close
// leaves the client open. It starts one goroutine, stopped by Close.
func NewRedis(client redis.UniversalClient, opts RedisOptions) (*Redis, error) {
	if client == nil {
		return nil, errors.New("conversation: NewRedis needs a Redis client")
	}
	opts.fill()
	if opts.Prefix == "" {
		opts.Prefix = "tollgate:"
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MaxPending <= 0 {
		opts.MaxPending = defaultMaxPending
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Redis{client: client, opts: opts.Options, tag: opts.Prefix + "conv:{c}", log: opts.Logger,
		maxPending: opts.MaxPending, pending: make(map[string]*delta), sem: make(chan struct{}, 1),
		queued: make(map[string]queued), ctx: ctx, cancel: cancel, done: make(chan struct{})}
	go r.run()
	return r, nil
}

func (r *Redis) hashKey(key string) string  { return r.tag + ":c:" + key }
func (r *Redis) ttftKey(key string) string  { return r.tag + ":t:" + key }
func (r *Redis) activeKey() string          { return r.tag + ":active" }
func (r *Redis) markerKey(id string) string { return r.tag + ":b:" + id }
func (r *Redis) linkKey(responseID string) string {
	return r.tag + ":l:" + linkKey(responseID)
}

func randomID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b)
}

// Record implements Store: it folds t into its conversation's pending
// delta, allocating only for a conversation with none.
func (r *Redis) Record(t Turn) {
	if t.Key == "" {
		return
	}
	seen, at := r.opts.Now().UnixMicro(), t.At.UnixMicro()
	r.mu.Lock()
	d := r.pending[t.Key]
	if d == nil {
		if len(r.pending) >= r.maxPending {
			r.mu.Unlock()
			r.dropped.Add(1)
			return
		}
		d = &delta{}
		r.pending[t.Key] = d
	}
	d.add(&t, at, seen)
	r.mu.Unlock()
}

// Dropped returns how many turns were dropped because MaxPending
// conversations were waiting to be sent.
func (r *Redis) Dropped() int64 { return r.dropped.Load() }

func (r *Redis) acquire(ctx context.Context) error {
	select {
	case r.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *Redis) release() { <-r.sem }

// Flush implements Store: it sends every pending turn now.
func (r *Redis) Flush(ctx context.Context) error {
	ev, err := r.flush(ctx)
	r.end(ev, EndEvicted)
	return err
}

// flush sends the queue, then cuts pending into batches and sends them,
// returning the conversations the batches evicted.
func (r *Redis) flush(ctx context.Context) ([]Conversation, error) {
	if err := r.acquire(ctx); err != nil {
		return nil, fmt.Errorf("conversation: flush: %w", err)
	}
	defer r.release()
	ev, err := r.flushLocked(ctx)
	r.noteResultLocked(err)
	return ev, err
}

// flushLocked is flush under sem. Pending is cut only once the queue is
// empty, so during an outage turns keep aggregating in pending instead of
// piling up as batches.
func (r *Redis) flushLocked(ctx context.Context) ([]Conversation, error) {
	ev, err := r.sendQueueLocked(ctx)
	if err != nil || !r.cutLocked() {
		return ev, err
	}
	more, err := r.sendQueueLocked(ctx)
	return append(ev, more...), err
}

// cutLocked moves the pending deltas into new batches behind the queue,
// reporting whether there were any.
func (r *Redis) cutLocked() bool {
	r.mu.Lock()
	cut := r.pending
	if len(cut) == 0 {
		r.mu.Unlock()
		return false
	}
	r.pending = make(map[string]*delta, len(cut))
	r.mu.Unlock()
	var b *batch
	for key, d := range cut {
		if b == nil || len(b.convs) == maxBatchConvs {
			b = r.newBatch()
			r.queue = append(r.queue, b)
		}
		b.add(r, key, d)
		r.queued[key] = queued{b, d}
	}
	return true
}

func (r *Redis) newBatch() *batch {
	id := randomID()
	return &batch{id: id, keys: []string{r.markerKey(id), r.activeKey()},
		args: []any{int64(markerTTL / time.Second), r.opts.MaxActive, MaxTTFTs, r.tag}}
}

// add appends conversation key's delta d to b (see batchScript).
func (b *batch) add(r *Redis, key string, d *delta) {
	b.convs = append(b.convs, key)
	b.keys = append(b.keys, r.hashKey(key), r.ttftKey(key))
	t := d.tokens
	b.args = append(b.args, key, d.turns, d.errors, t.Input, t.Output, t.CacheRead, t.CacheWrite, t.Reasoning,
		d.cost, d.first, d.last, d.seen, d.team, len(d.ttfts))
	for _, v := range d.ttfts {
		b.args = append(b.args, int64(v))
	}
	agent := 0
	if d.agent {
		agent = 1
	}
	b.args = append(b.args, d.start, d.keyID, d.user, agent)
	b.args = appendBreakdown(b.args, &d.bd)
}

// sendQueueLocked sends the queued batches in order, stopping at the first
// failure, and returns what they evicted.
func (r *Redis) sendQueueLocked(ctx context.Context) ([]Conversation, error) {
	var evicted []Conversation
	for len(r.queue) > 0 {
		b := r.queue[0]
		res, err := batchScript.Run(ctx, r.client, b.keys, b.args...).Slice()
		if err != nil {
			return evicted, fmt.Errorf("conversation: writing a batch of %d conversations to Redis: %w", len(b.convs), err)
		}
		if len(res) != 2 {
			return evicted, fmt.Errorf("conversation: batch script replied %d values, want 2", len(res))
		}
		ev, err := parseRecords(res[1])
		if err != nil {
			// Applied, but what it evicted is unreadable: keep going
			// rather than send it again forever.
			r.log.Error("conversation: unreadable evicted conversations from Redis", "err", err)
		}
		if len(ev) > 0 {
			// The marker held them for a resend; this replica has them now.
			_ = r.client.SetArgs(ctx, b.keys[0], "1", redis.SetArgs{Mode: "XX", KeepTTL: true}).Err()
		}
		if applied, _ := res[0].(int64); applied == 0 {
			r.log.Info("conversation: batch was already applied; an earlier attempt had succeeded")
		}
		evicted = append(evicted, ev...)
		for _, key := range b.convs {
			delete(r.queued, key)
		}
		r.queue[0] = nil
		r.queue = r.queue[1:]
	}
	r.queue = nil
	return evicted, nil
}

// noteResultLocked logs a send's failure once, its recovery, and drops.
func (r *Redis) noteResultLocked(err error) {
	switch {
	case err != nil && !errors.Is(err, context.Canceled) && !r.degraded:
		r.degraded = true
		r.log.Error("conversation: cannot write to Redis; turns wait in memory", "err", err)
	case err == nil && r.degraded:
		r.degraded = false
		r.log.Info("conversation: writing to Redis again")
	}
	if d := r.dropped.Load(); d != r.logged {
		r.logged = d
		r.log.Error("conversation: too many conversations waiting for Redis; TURNS WERE DROPPED",
			"max_pending", r.maxPending, "dropped_turns_total", d)
	}
}

// end hands each conversation to OnEnd.
func (r *Redis) end(cs []Conversation, why Reason) {
	for _, c := range cs {
		r.opts.OnEnd(c, why)
	}
}

// run ticks every Interval until Close.
func (r *Redis) run() {
	defer close(r.done)
	t := time.NewTicker(r.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(r.ctx, flushTimeout)
			r.tick(ctx)
			cancel()
		}
	}
}

// tick sends the pending turns, then ends the idle conversations, popping
// them until none is left. When sending fails it ends none: this
// replica's unsent turns may keep some of them going.
func (r *Redis) tick(ctx context.Context) {
	ev, err := r.flush(ctx) // logged by noteResultLocked
	r.end(ev, EndEvicted)
	if err != nil {
		return
	}
	for {
		cs, err := r.popIdle(ctx)
		r.end(cs, EndIdle)
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				r.log.Error("conversation: ending idle conversations in Redis failed; retried next interval", "err", err)
			}
			return
		}
		if len(cs) < idlePop {
			return
		}
	}
}

// popIdle ends up to idlePop idle conversations. A pop whose reply was
// lost is sent again, under its id, before a new one.
func (r *Redis) popIdle(ctx context.Context) ([]Conversation, error) {
	r.popMu.Lock()
	defer r.popMu.Unlock()
	if r.popID == "" {
		r.popID = randomID()
	}
	marker := r.markerKey(r.popID)
	cutoff := r.opts.Now().Add(-r.opts.IdleTimeout).UnixMicro()
	res, err := idleScript.Run(ctx, r.client, []string{r.activeKey(), marker},
		cutoff, idlePop, int64(markerTTL/time.Second), r.tag).Result()
	if err != nil {
		return nil, err
	}
	r.popID = ""
	cs, err := parseRecords(res)
	if len(cs) > 0 {
		_ = r.client.SetArgs(ctx, marker, "1", redis.SetArgs{Mode: "XX", KeepTTL: true}).Err()
	}
	return cs, err
}

// Get implements Store: what Redis holds plus this replica's unsent turns.
func (r *Redis) Get(ctx context.Context, key string) (Conversation, error) {
	if err := r.acquire(ctx); err != nil {
		return Conversation{}, fmt.Errorf("conversation: get: %w", err)
	}
	defer r.release()
	keys := []string{r.hashKey(key), r.ttftKey(key)}
	q, inQueue := r.queued[key]
	if inQueue {
		keys = append(keys, r.markerKey(q.b.id))
	}
	res, err := getScript.Run(ctx, r.client, keys).Slice()
	if err != nil {
		return Conversation{}, fmt.Errorf("conversation: reading from Redis: %w", err)
	}
	if len(res) != 3 {
		return Conversation{}, fmt.Errorf("conversation: get script replied %d values, want 3", len(res))
	}
	c, err := parseRecord([]any{key, res[1], res[2]})
	if err != nil {
		return Conversation{}, err
	}
	if applied, _ := res[0].(int64); inQueue && applied == 0 {
		q.d.foldInto(&c, key)
	}
	r.foldPending(&c, key)
	if c.Turns == 0 {
		return Conversation{}, ErrUnknown
	}
	return c, nil
}

// foldPending adds key's pending delta to c.
func (r *Redis) foldPending(c *Conversation, key string) {
	r.mu.Lock()
	if d := r.pending[key]; d != nil {
		d.foldInto(c, key)
	}
	r.mu.Unlock()
}

// Cost implements Store: what Redis holds plus this replica's unsent
// turns; one round trip unless a batch holding the conversation awaits
// confirmation.
func (r *Redis) Cost(ctx context.Context, key string) (int64, error) {
	if err := r.acquire(ctx); err != nil {
		return 0, fmt.Errorf("conversation: cost: %w", err)
	}
	defer r.release()
	cost, err := r.client.HGet(ctx, r.hashKey(key), "c").Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		return 0, fmt.Errorf("conversation: reading cost from Redis: %w", err)
	}
	if q, ok := r.queued[key]; ok {
		n, err := r.client.Exists(ctx, r.markerKey(q.b.id)).Result()
		if err != nil {
			return 0, fmt.Errorf("conversation: reading cost from Redis: %w", err)
		}
		if n == 0 {
			cost += q.d.cost
		}
	}
	r.mu.Lock()
	if d := r.pending[key]; d != nil {
		cost += d.cost
	}
	r.mu.Unlock()
	return cost, nil
}

// SetOutcome implements Store. It first sends this replica's pending turns,
// so that a conversation only this replica has seen is known to Redis.
func (r *Redis) SetOutcome(ctx context.Context, key string, o Outcome) (Conversation, error) {
	if err := r.acquire(ctx); err != nil {
		return Conversation{}, fmt.Errorf("conversation: set outcome: %w", err)
	}
	ev, err := r.flushLocked(ctx)
	r.noteResultLocked(err)
	var c Conversation
	if err == nil {
		c, err = r.setOutcomeLocked(ctx, key, o)
	}
	r.release()
	r.end(ev, EndEvicted)
	return c, err
}

func (r *Redis) setOutcomeLocked(ctx context.Context, key string, o Outcome) (Conversation, error) {
	js, err := json.Marshal(&o)
	if err != nil {
		return Conversation{}, fmt.Errorf("conversation: encoding outcome: %w", err)
	}
	res, err := outcomeScript.Run(ctx, r.client, []string{r.hashKey(key), r.ttftKey(key)}, js).Slice()
	if err != nil {
		return Conversation{}, fmt.Errorf("conversation: recording outcome in Redis: %w", err)
	}
	st, _ := res[0].(int64)
	if st == 0 {
		return Conversation{}, ErrUnknown
	}
	if len(res) != 3 {
		return Conversation{}, fmt.Errorf("conversation: outcome script replied %d values, want 3", len(res))
	}
	c, err := parseRecord([]any{key, res[1], res[2]})
	if err != nil {
		return Conversation{}, err
	}
	r.foldPending(&c, key)
	if st == 2 {
		return c, ErrOutcomeSet
	}
	return c, nil
}

// Link implements Store: a key per response (its id hashed) holding the
// conversation and when the link expires, with a TTL of linkLifetime.
func (r *Redis) Link(ctx context.Context, responseID, key string) error {
	life := linkLifetime(r.opts.IdleTimeout)
	exp := r.opts.Now().Add(life).UnixMicro()
	err := r.client.Set(ctx, r.linkKey(responseID), key+" "+strconv.FormatInt(exp, 10), life).Err()
	if err != nil {
		return fmt.Errorf("conversation: linking a response in Redis: %w", err)
	}
	return nil
}

// Resolve implements Store.
func (r *Redis) Resolve(ctx context.Context, responseID string) (string, error) {
	v, err := r.client.Get(ctx, r.linkKey(responseID)).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("conversation: resolving a response in Redis: %w", err)
	}
	key, exp, ok := strings.Cut(v, " ")
	us, perr := strconv.ParseInt(exp, 10, 64)
	if !ok || perr != nil {
		return "", fmt.Errorf("conversation: malformed response link in Redis")
	}
	if us <= r.opts.Now().UnixMicro() {
		return "", nil
	}
	return key, nil
}

// Close implements Store: it stops the goroutine and sends the pending
// turns, trying again for a moment while that fails, for at most a few
// seconds. Turns it could not send are lost; the error (also logged) says
// how many conversations they belonged to. Later calls return the first
// call's result.
func (r *Redis) Close() error {
	r.closeOnce.Do(func() {
		r.cancel()
		<-r.done
		ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		defer cancel()
		start := time.Now()
		ev, err := r.flush(ctx)
		r.end(ev, EndEvicted)
		for err != nil && ctx.Err() == nil && time.Since(start) < closeRetryFor {
			time.Sleep(closeRetryEvery)
			ev, err = r.flush(ctx)
			r.end(ev, EndEvicted)
		}
		if err != nil {
			n := r.unsent()
			r.log.Error("conversation: closing with turns not written to Redis; they are lost", "conversations", n, "err", err)
			r.closeErr = fmt.Errorf("conversation: closing with turns of %d conversations not written to Redis: %w", n, err)
		}
	})
	return r.closeErr
}

// unsent counts the conversations with turns queued or pending.
func (r *Redis) unsent() int {
	r.sem <- struct{}{}
	n := len(r.queued)
	<-r.sem
	r.mu.Lock()
	n += len(r.pending)
	r.mu.Unlock()
	return n
}

// parseRecords decodes a script's list of {key, HGETALL, LRANGE}.
func parseRecords(v any) ([]Conversation, error) {
	list, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("conversation: Redis replied %T, want a list of conversations", v)
	}
	out := make([]Conversation, 0, len(list))
	var errs []error
	for _, rec := range list {
		c, err := parseRecord(rec)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, c)
	}
	return out, errors.Join(errs...)
}

// parseRecord decodes {key, HGETALL, LRANGE}; an empty hash is a
// conversation with no turns.
func parseRecord(v any) (Conversation, error) {
	rec, ok := v.([]any)
	if !ok || len(rec) != 3 {
		return Conversation{}, fmt.Errorf("conversation: Redis replied %T for a conversation, want 3 values", v)
	}
	key, _ := rec[0].(string)
	flat, ok1 := rec[1].([]any)
	ttfts, ok2 := rec[2].([]any)
	if !ok1 || !ok2 || len(flat)%2 != 0 {
		return Conversation{}, fmt.Errorf("conversation: malformed conversation %s in Redis", key)
	}
	c := Conversation{Key: key}
	if len(flat) == 0 {
		return c, nil
	}
	for i := 0; i < len(flat); i += 2 {
		name, _ := flat[i].(string)
		val, _ := flat[i+1].(string)
		switch name {
		case "tm":
			c.Team = val
			continue
		case "kid":
			c.KeyID = val
			continue
		case "u":
			c.User = val
			continue
		case "as":
			c.AgentSession = val == "1"
			continue
		case "s":
			us, err := strconv.ParseInt(val, 10, 64)
			if err != nil {
				return Conversation{}, fmt.Errorf("conversation: field s of %s in Redis: %w", key, err)
			}
			c.Start = time.UnixMicro(us).UTC()
			continue
		}
		if ok, err := parseBreakdownField(&c, name, val); ok {
			if err != nil {
				return Conversation{}, fmt.Errorf("conversation: %s in Redis: %w", key, err)
			}
			continue
		}
		if name == "out" {
			var o Outcome
			if err := json.Unmarshal([]byte(val), &o); err != nil {
				return Conversation{}, fmt.Errorf("conversation: outcome of %s in Redis: %w", key, err)
			}
			c.Outcome = &o
			continue
		}
		var dst *int64
		switch name {
		case "n":
			dst = &c.Turns
		case "e":
			dst = &c.Errors
		case "i":
			dst = &c.Tokens.Input
		case "o":
			dst = &c.Tokens.Output
		case "cr":
			dst = &c.Tokens.CacheRead
		case "cw":
			dst = &c.Tokens.CacheWrite
		case "rs":
			dst = &c.Tokens.Reasoning
		case "c":
			dst = &c.CostMicros
		case "f", "l":
			us, err := strconv.ParseInt(val, 10, 64)
			if err != nil {
				return Conversation{}, fmt.Errorf("conversation: field %s of %s in Redis: %w", name, key, err)
			}
			if name == "f" {
				c.First = time.UnixMicro(us).UTC()
			} else {
				c.Last = time.UnixMicro(us).UTC()
			}
			continue
		default:
			continue // a field of a newer version
		}
		n, err := strconv.ParseInt(val, 10, 64)
		if err != nil {
			return Conversation{}, fmt.Errorf("conversation: field %s of %s in Redis: %w", name, key, err)
		}
		*dst = n
	}
	c.TTFTs = make([]time.Duration, 0, len(ttfts))
	for _, t := range ttfts {
		s, _ := t.(string)
		ns, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return Conversation{}, fmt.Errorf("conversation: TTFT of %s in Redis: %w", key, err)
		}
		c.TTFTs = append(c.TTFTs, time.Duration(ns))
	}
	return c, nil
}
