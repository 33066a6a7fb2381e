package spend

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
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
	// maxOverflowRows bounds the overflow rows (one per day) beyond
	// MaxPending; only a caller passing many distinct days can reach it.
	maxOverflowRows = 64
	// maxBatchRows bounds the rows one script applies, so a big backlog
	// does not block Redis in one long script.
	maxBatchRows = 1000
	// batchTTL is how long Redis remembers an applied batch id: far longer
	// than any retry of the same batch.
	batchTTL = 7 * 24 * time.Hour
	// flushTimeout bounds one background flush.
	flushTimeout = 10 * time.Second
	// closeTimeout bounds the final flush of Close.
	closeTimeout = 5 * time.Second
	// closeRetryFor is how long Close keeps trying its final flush, every
	// closeRetryEvery: go-redis refuses to dial for up to a second once a
	// pool's worth of dials failed, so a replica stopping just after Redis
	// came back would otherwise spill (or lose) spend Redis could take.
	closeRetryFor   = 1500 * time.Millisecond
	closeRetryEvery = 250 * time.Millisecond
)

// Overflow names the key, team and model of the rows that hold, per day,
// the deltas of new rows that came once MaxPending rows were waiting.
const Overflow = "(overflow)"

// RedisOptions configure a Redis ledger. The zero value is usable.
type RedisOptions struct {
	// Prefix starts every key; empty means "tollgate:". Every spend key
	// carries the hash tag "{<prefix>spend}", so a batch's keys share one
	// Redis Cluster slot.
	Prefix string
	// FlushInterval is how often pending deltas are sent; zero or less
	// means 2 s.
	FlushInterval time.Duration
	// ReplicaID names this replica in batch ids; empty means random. A
	// random nonce is added in any case, so a restarted replica with the
	// same id never reuses an id.
	ReplicaID string
	// Logger receives flush failures, recoveries and overflows; nil discards
	// them.
	Logger *slog.Logger
	// OnDegraded, if set, is called with true when a flush fails after
	// succeeding (or at the first failure) and with false when a flush
	// succeeds again. It is called from the flushing goroutine and must not
	// call Flush or Close.
	OnDegraded func(degraded bool)
	// MaxPending bounds the distinct rows waiting in memory; zero or less
	// means 100000. Beyond it, a new row's delta goes to its day's Overflow
	// row; beyond maxOverflowRows more, it is dropped, counted by Dropped
	// and logged.
	MaxPending int
	// SpillFile, if set, keeps what Close could not write to Redis: Close
	// writes every unwritten batch, with its id, to this file (JSON, mode
	// 0600, replaced atomically), and NewRedis sends the file's batches
	// again with their ids, so none is lost and none is counted twice, and
	// removes the file once they are all in Redis. Empty means Close keeps
	// unwritten deltas in memory only, and they are lost with the process.
	//
	// The path must belong to one replica (for example a per-pod volume or
	// a name that includes the host name): two live ledgers sharing one
	// file would overwrite or remove each other's batches. Its directory
	// must exist.
	SpillFile string
	// OwnFile, if set, keeps this replica's own part of the ledger (what
	// Redis applied of its batches, and the generation of Redis's data they
	// went to) across restarts, written atomically after every flush that
	// sent something; empty keeps it in memory. A replica refills an empty
	// Redis from it (generation.go). Like SpillFile, it belongs to one
	// replica.
	OwnFile string
	// Journal, if set, is a file (and Journal+".prev") where every Add is
	// appended with one write before it counts, and every cut into batches
	// and every batch applied is recorded, so that a process killed with
	// spend not yet written to Redis loses none of it: NewRedis sends it
	// under the same batch ids, so none is counted twice (redisjournal.go).
	// Empty keeps unsent deltas in memory only. Like SpillFile, it belongs
	// to one replica, and its directory must exist.
	Journal string
	// JournalSync is how often the journal is fsynced when it was written
	// since, against a crash of the machine, which loses up to JournalSync
	// of Adds; a killed process loses nothing either way. Zero or less
	// syncs it only when it is replaced and at Close.
	JournalSync time.Duration
	// OnRefill, if set, is called when this replica refills a Redis that
	// lost its data (or first adopts a generation), with its own rows
	// (perhaps none) and an id unique to this refill and replica, before
	// the rows are sent and before the ledger can be whole: for the limits'
	// budgets, whose counters were lost too, and their rate buckets. It may
	// be called again with the same id if the refill is cut short, so it
	// must apply each id once (raising a rate bucket twice raises it once).
	OnRefill func(ctx context.Context, rows []Row, id string) error
	// OnDataLost, if set, is called with true when this replica finds that
	// Redis lost its data and with false once the ledger is whole again:
	// every replica's own part is back (see Replicas), not only this one's.
	OnDataLost func(lost bool)
	// OnWhole, if set, is called with the generation of Redis's data once
	// this replica knows the ledger there is whole under it: when it first
	// adopts a generation, and after a loss once the fleet has refilled
	// it. The limiter decides admissions on Redis only under that
	// generation (ratelimit.Redis.SetGeneration). It is called from the
	// flushing goroutine and must be quick.
	OnWhole func(gen string)
	// Replicas, if set, is how many replicas share Redis (the fleet as it
	// was before a loss): after Redis lost its data, the ledger is whole
	// again once that many have sent their own parts back, or after
	// RefillWait. Nil means 1: whole once this replica's part is back.
	Replicas func() int
	// RefillWait bounds the wait for the other replicas' parts after a
	// loss; a replica that has not sent its part by then is taken as gone
	// (it sends it when it starts again, from its OwnFile). Zero or less
	// means two flush intervals plus 3 s: every live replica checks the
	// generation once per interval, and its heartbeat expires in 3 s.
	RefillWait time.Duration
}

// Redis is a Ledger shared by every replica through Redis. Add aggregates in
// memory and a background goroutine sends batches every FlushInterval, each
// applied exactly once, even when sent again after a lost answer; with
// RedisOptions.SpillFile, what Close could not send is sent by the next
// NewRedis, and with RedisOptions.Journal, what a killed process had not
// sent (redisjournal.go). Query reads Redis only, so it lags this replica's Adds by up to
// FlushInterval (longer while Redis is unreachable): call Flush first for an
// exact answer.
type Redis struct {
	client     redis.UniversalClient
	tag        string
	replica    string
	interval   time.Duration
	log        *slog.Logger
	onDegraded func(bool)
	maxPending int

	mu           sync.Mutex
	pending      map[Key]*Totals
	droppedTotal Totals // sum of dropped deltas, for the log

	// The journal (redisjournal.go), under mu: jseq numbers the Adds, jcut
	// is the seq of the last one cut into batches.
	j          *journal
	jseq, jcut uint64
	jsync      time.Duration
	jprev      int64 // bytes in the previous file
	journalMax int64 // bytes both files may hold before an outage's compaction

	folded, dropped atomic.Int64
	queuedRows      atomic.Int64 // rows in queue

	// sem admits one flush at a time and guards the fields below it.
	sem           chan struct{}
	queue         []*batch // cut from pending, not yet applied, in order
	seq           uint64
	degraded      bool
	loggedFolded  int64
	loggedDropped int64
	spillFile     string
	spillOnDisk   bool     // the spill file may exist and must go once its batches are applied
	spillLeft     int      // batches at the head of queue that the spill file holds
	spillRmFailed bool     // removing the spill file failed and was logged
	applied       []string // ids of batches applied, not yet recorded in the journal
	// The own part (generation.go): sent is what Redis applied of this
	// replica's batches under generation gen; owner names the part.
	ownFile    string
	owner, gen string
	onRefill   func(context.Context, []Row, string) error
	onDataLost func(bool)
	// dataLost says that Redis lost its data and the ledger there is not
	// whole yet (from detection until noteWholeLocked); read by Incomplete.
	dataLost atomic.Bool
	// After a loss, filling says that this replica's part is back and it
	// waits, since fillSince, for the others' (generation.go); wholeSaid
	// is the generation last given to onWhole.
	onWhole    func(string)
	replicas   func() int
	refillWait time.Duration
	filling    atomic.Bool
	fillSince  time.Time
	wholeSaid  string
	// wholeGen is wholeSaid, for Incomplete.
	wholeGen atomic.Pointer[string]
	// kick asks the flusher to check the generation now (CheckNow).
	kick                 chan struct{}
	ownChanges, ownSaved uint64
	sentMu               sync.Mutex // guards sent, also for QueryOwn
	sent                 map[Key]*Totals

	ctx       context.Context // cancelled by Close, to stop the flusher
	cancel    context.CancelFunc
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
}

var _ Ledger = (*Redis)(nil)

// batch is one script call; its id and arguments never change once built,
// so a retry sends exactly what the first attempt sent, even from another
// process through the spill file.
type batch struct {
	id   string
	tag  string // hash tag of its keys; one from a spill file keeps its own
	rows []Row  // what it adds, kept for the spill file
	keys []string
	args []any
}

// applyScript applies one batch. KEYS[1] is the batch marker, KEYS[2] the
// days set, KEYS[3] the generation of Redis's data (generation.go) and
// KEYS[4..] the day hashes; ARGV[1] is the marker TTL in seconds, ARGV[2]
// the generation the sender expects ('*': any), then for each day hash: the day, the
// number of fields, and that many field/increment pairs. It returns 1 if it
// applied the batch, 0 if the batch had been applied before, and an error
// starting TOLLGATE_GENERATION, writing nothing, if Redis's generation is
// not the expected one (Redis lost its data since).
//
// Redis does not undo a script that fails halfway, so the key types are
// checked before anything is written: a key of the wrong type fails the
// batch whole and it can be retried once repaired. Only an HINCRBY beyond
// 2^63 (9 trillion dollars in one row) could still fail halfway.
var applyScript = redis.NewScript(`
local gen = redis.call('GET', KEYS[3])
if ARGV[2] ~= '*' and gen ~= ARGV[2] then
  return redis.error_reply('TOLLGATE_GENERATION ' .. (gen or 'none'))
end
local want = 'set'
for k = 2, #KEYS do
  if k ~= 3 then
    local t = redis.call('TYPE', KEYS[k]).ok
    if t ~= 'none' and t ~= want then
      return redis.error_reply('WRONGTYPE spend key ' .. KEYS[k] .. ' is a ' .. t)
    end
    want = 'hash'
  end
end
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then
  return 0
end
local a = 3
for k = 4, #KEYS do
  redis.call('SADD', KEYS[2], ARGV[a])
  local n = tonumber(ARGV[a + 1])
  a = a + 2
  for i = 1, n do
    redis.call('HINCRBY', KEYS[k], ARGV[a], ARGV[a + 1])
    a = a + 2
  end
end
return 1
`)

// NewRedis returns a Redis ledger on client, which it does not own: Close
// leaves the client open. It starts one goroutine, stopped by Close.
//
// With opts.SpillFile naming an existing file, the file's batches are queued
// to be sent before anything else; a file that cannot be read or decoded is
// an error, as dropping it would lose spend. With opts.Journal, the
// journal's batches not known applied are queued next, under their ids,
// and its later Adds put in pending; a corrupt line before its last is an
// error naming the file and the line.
func NewRedis(client redis.UniversalClient, opts RedisOptions) (*Redis, error) {
	if opts.Prefix == "" {
		opts.Prefix = "tollgate:"
	}
	if opts.FlushInterval <= 0 {
		opts.FlushInterval = defaultFlushInterval
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.MaxPending <= 0 {
		opts.MaxPending = defaultMaxPending
	}
	if opts.ReplicaID == "" {
		opts.ReplicaID = randomHex(8)
	}
	var spilled *spillFile
	if opts.SpillFile != "" {
		var err error
		if spilled, err = readSpill(opts.SpillFile); err != nil {
			return nil, err
		}
	}
	r := &Redis{
		client:     client,
		tag:        "{" + opts.Prefix + "spend}",
		interval:   opts.FlushInterval,
		log:        opts.Logger,
		onDegraded: opts.OnDegraded,
		maxPending: opts.MaxPending,
		pending:    make(map[Key]*Totals),
		sem:        make(chan struct{}, 1),
		done:       make(chan struct{}),
		spillFile:  opts.SpillFile,
		ownFile:    opts.OwnFile,
		onRefill:   opts.OnRefill,
		onDataLost: opts.OnDataLost,
		onWhole:    opts.OnWhole,
		replicas:   opts.Replicas,
		refillWait: opts.RefillWait,
		kick:       make(chan struct{}, 1),
		sent:       make(map[Key]*Totals),
	}
	if r.replicas == nil {
		r.replicas = func() int { return 1 }
	}
	if r.refillWait <= 0 {
		r.refillWait = 2*opts.FlushInterval + 3*time.Second
	}
	var used []string // batch ids of earlier processes
	if spilled != nil {
		for _, b := range spilled.Batches {
			used = append(used, b.ID)
		}
	}
	var replay *redisReplay
	if opts.Journal != "" {
		r.j = &journal{name: opts.Journal, prev: opts.Journal + redisJournalPrev}
		r.journalMax = redisJournalMax
		var err error
		if replay, err = r.readRedisJournal(opts.Journal); err != nil {
			return nil, err
		}
		used = append(used, replay.ids()...)
	}
	nonce, err := pickNonce(opts.ReplicaID, used, func() string { return randomHex(8) })
	if err != nil {
		return nil, err
	}
	r.replica = opts.ReplicaID + ":" + nonce
	if err := r.loadOwn(); err != nil {
		return nil, err
	}
	if spilled != nil {
		r.queueSpilled(spilled)
	}
	if replay != nil {
		if err := r.replayJournal(replay, opts.JournalSync); err != nil {
			return nil, err
		}
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	go r.flusher()
	return r, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b)
}

// Add records t under k in memory; the flusher sends it. It takes a mutex
// and allocates only for a new row; with a journal, it first appends t's
// line there with one write (no fsync), with admitted (the zero time: now).
func (r *Redis) Add(k Key, t Totals, admitted time.Time) {
	r.mu.Lock()
	if r.j != nil && !r.j.closed {
		r.appendEntryLocked(k, t, admitted)
	}
	r.addPendingLocked(k, t)
	r.mu.Unlock()
}

// addPendingLocked adds t to k's pending row (under mu).
func (r *Redis) addPendingLocked(k Key, t Totals) {
	p := r.pending[k]
	if p == nil {
		p = r.newRowLocked(k)
	}
	if p != nil {
		p.Add(t)
	} else {
		r.droppedTotal.Add(t)
	}
}

// newRowLocked returns the row that receives k's first delta: a new row
// while fewer than maxPending wait, else k's day's Overflow row, else nil
// (the delta is dropped). Add never logs, to stay free of I/O; the flusher
// logs what was folded or dropped.
func (r *Redis) newRowLocked(k Key) *Totals {
	if len(r.pending) < r.maxPending {
		p := new(Totals)
		r.pending[k] = p
		return p
	}
	ok := Key{Day: k.Day, KeyID: Overflow, Team: Overflow, Model: Overflow}
	if p := r.pending[ok]; p != nil {
		r.folded.Add(1)
		return p
	}
	if len(r.pending) < r.maxPending+maxOverflowRows {
		r.folded.Add(1)
		p := new(Totals)
		r.pending[ok] = p
		return p
	}
	r.dropped.Add(1)
	return nil
}

// Pending returns the number of rows waiting to be written to Redis.
func (r *Redis) Pending() int {
	r.mu.Lock()
	n := len(r.pending)
	r.mu.Unlock()
	return n + int(r.queuedRows.Load())
}

// Folded returns how many Adds went to an Overflow row because MaxPending
// rows were waiting.
func (r *Redis) Folded() int64 { return r.folded.Load() }

// Dropped returns how many Adds were lost because MaxPending rows and every
// overflow row were waiting.
func (r *Redis) Dropped() int64 { return r.dropped.Load() }

// Flush sends every batch that failed before, then everything added so far,
// and returns the first error. It removes the spill file once every batch it
// held is in Redis. It waits for a flush in progress.
func (r *Redis) Flush(ctx context.Context) error {
	select {
	case r.sem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("spend: flush: %w", ctx.Err())
	}
	defer func() { <-r.sem }()
	err := r.flushLocked(ctx)
	if err == nil {
		err = r.saveOwnLocked()
	}
	if err == nil {
		err = r.noteWholeLocked(ctx)
	}
	err = errors.Join(err, r.recordAppliedLocked())
	r.noteResultLocked(err)
	if err != nil {
		r.compactJournalLocked()
	}
	return errors.Join(err, r.removeSpillLocked())
}

// tick is the flusher's Flush. With nothing to send, it reads Redis's
// generation instead, so that a Redis that lost its data is refilled
// without waiting for traffic.
func (r *Redis) tick(ctx context.Context) {
	select {
	case r.sem <- struct{}{}:
	case <-ctx.Done():
		return
	}
	defer func() { <-r.sem }()
	before := r.ownChanges
	err := r.flushLocked(ctx)
	if err == nil && r.ownChanges == before {
		err = r.checkGenerationLocked(ctx)
	}
	if err == nil {
		err = r.saveOwnLocked()
	}
	if err == nil {
		err = r.noteWholeLocked(ctx)
	}
	err = errors.Join(err, r.recordAppliedLocked())
	r.noteResultLocked(err)
	if err != nil {
		r.compactJournalLocked()
	}
	_ = r.removeSpillLocked() // logged there
}

// OwnQuerier is a shared ledger that can answer from this replica's own
// part of it, which is partial: the other replicas' spend is missing.
type OwnQuerier interface {
	QueryOwn(ctx context.Context, f Filter) ([]Row, error)
}

var _ OwnQuerier = (*Redis)(nil)

// QueryOwn returns this replica's own rows: what Redis applied of its
// batches, what waits to be sent, and what a spill file held; the answer
// while Redis cannot be read. It waits for a flush in progress.
func (r *Redis) QueryOwn(ctx context.Context, f Filter) ([]Row, error) {
	if err := f.validate(); err != nil {
		return nil, err
	}
	select {
	case r.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("spend: reading this replica's spend: %w", ctx.Err())
	}
	defer func() { <-r.sem }()
	acc := make(map[Key]*Totals)
	add := func(k Key, t Totals) {
		if !f.match(k) {
			return
		}
		a := acc[k]
		if a == nil {
			a = new(Totals)
			acc[k] = a
		}
		a.Add(t)
	}
	r.sentMu.Lock()
	for k, t := range r.sent {
		add(k, *t)
	}
	r.sentMu.Unlock()
	for _, b := range r.queue {
		for _, row := range b.rows {
			add(row.Key, row.Totals)
		}
	}
	r.mu.Lock()
	for k, t := range r.pending {
		add(k, *t)
	}
	r.mu.Unlock()
	rows := make([]Row, 0, len(acc))
	for k, t := range acc {
		rows = append(rows, Row{Key: k, Totals: *t})
	}
	sortRows(rows)
	return rows, nil
}

// flushLocked sends the queue, then cuts pending into new batches and sends
// them. Pending is cut only once the queue is empty, so during an outage
// deltas keep aggregating in pending (bounded by MaxPending) instead of
// piling up as batches.
func (r *Redis) flushLocked(ctx context.Context) error {
	if err := r.sendQueueLocked(ctx); err != nil {
		return err
	}
	// Its error comes back from the saveOwnLocked after the flush; until
	// it succeeds, the journal is not rotated.
	_ = r.recordAppliedLocked()
	if r.cutLocked(len(r.applied) == 0) == 0 {
		return nil
	}
	return r.sendQueueLocked(ctx)
}

// cutLocked cuts the pending rows into batches behind the queue and, with
// a journal, records the cut there before anything sends them, first
// rotating the journal when rotate is set: every batch cut before is
// applied and recorded. It returns the number of rows cut.
func (r *Redis) cutLocked(rotate bool) int {
	r.mu.Lock()
	cut := r.pending
	n := len(cut) // read under mu: with nothing cut, cut is still the live map
	if n == 0 {
		r.mu.Unlock()
		return 0
	}
	r.pending = make(map[Key]*Totals, n)
	// Counted as queued under mu, so Pending never misses the cut rows.
	r.queuedRows.Add(int64(n))
	if r.j == nil || r.j.closed {
		r.mu.Unlock()
		r.queue = append(r.queue, r.makeBatches(r.tag, cut)...)
		return n
	}
	var retired *os.File
	if rotate && len(r.queue) == 0 {
		retired = r.rotateJournalLocked()
	}
	// The cut holds the seqs up to last, all in the file just retired (or
	// the journal): an Add from now on is in the journal, with a later seq.
	after, last := r.jcut, r.jseq
	r.jcut = last
	r.mu.Unlock()
	if retired != nil {
		r.j.retire(retired)
	}
	batches := r.makeBatches(r.tag, cut)
	c := cutLine{Tag: r.tag, After: after, Last: last, Max: r.maxPending, Cut: make([]string, len(batches))}
	for i, b := range batches {
		c.Cut[i] = b.id
	}
	r.mu.Lock()
	r.appendRecordLocked(c)
	r.mu.Unlock()
	r.queue = append(r.queue, batches...)
	return n
}

// sendQueueLocked sends the queued batches in order, stopping at the first
// failure.
func (r *Redis) sendQueueLocked(ctx context.Context) error {
	refilled := false
	for len(r.queue) > 0 {
		b := r.queue[0]
		gen := r.gen
		if b.tag != r.tag {
			// A spilled batch of another prefix: its generation is
			// not this ledger's to know, nor its rows this ledger's part.
			gen = "*"
		}
		err := r.applyLocked(ctx, b, gen)
		if isGeneration(err) && !refilled {
			// Redis lost its data, or this replica has not met it yet.
			refilled = true
			if err = r.refillLocked(ctx); err == nil {
				continue
			}
		}
		if err != nil {
			return fmt.Errorf("spend: writing batch %s (%d rows) to Redis: %w", b.id, len(b.rows), err)
		}
		if b.tag == r.tag {
			r.noteSentLocked(b)
		}
		if r.j != nil {
			r.applied = append(r.applied, b.id)
		}
		r.queue[0] = nil
		r.queue = r.queue[1:]
		r.queuedRows.Add(-int64(len(b.rows)))
		if r.spillLeft > 0 {
			r.spillLeft--
		}
	}
	r.queue = nil
	return nil
}

// noteResultLocked tracks the degraded state and logs folds and drops. A
// cancelled context (Close, or a caller giving up) says nothing about Redis.
func (r *Redis) noteResultLocked(err error) {
	switch {
	case err != nil && !errors.Is(err, context.Canceled) && !r.degraded:
		r.degraded = true
		r.log.Error("spend: cannot write to Redis; deltas wait in memory", "err", err, "pending_rows", r.Pending())
		if r.onDegraded != nil {
			r.onDegraded(true)
		}
	case err == nil && r.degraded:
		r.degraded = false
		r.log.Info("spend: writing to Redis again")
		if r.onDegraded != nil {
			r.onDegraded(false)
		}
	}
	if f := r.folded.Load(); f != r.loggedFolded {
		r.log.Error("spend: too many rows waiting for Redis; new rows go to overflow rows",
			"max_pending", r.maxPending, "folded_adds_total", f)
		r.loggedFolded = f
	}
	if d := r.dropped.Load(); d != r.loggedDropped {
		r.mu.Lock()
		lost := r.droppedTotal
		r.mu.Unlock()
		r.log.Error("spend: too many rows waiting for Redis; SPEND WAS DROPPED",
			"dropped_adds_total", d, "dropped_requests", lost.Requests, "dropped_cost_micros", lost.CostMicros,
			"dropped_input", lost.Input, "dropped_output", lost.Output)
		r.loggedDropped = d
	}
}

// Counter field names inside a day hash.
const (
	fRequests   = "r"
	fInput      = "i"
	fOutput     = "o"
	fCacheRead  = "cr"
	fCacheWrite = "cw"
	fReasoning  = "rs"
	fCost       = "c"
)

// rowPrefix encodes a row's team, key and model, each length-prefixed
// ("<len>:<bytes>"), so that names may hold any byte. The counter name
// follows it to make a hash field.
func rowPrefix(k Key) string {
	var b strings.Builder
	b.Grow(len(k.Team) + len(k.KeyID) + len(k.Model) + 12)
	for _, s := range [...]string{k.Team, k.KeyID, k.Model} {
		b.WriteString(strconv.Itoa(len(s)))
		b.WriteByte(':')
		b.WriteString(s)
	}
	return b.String()
}

// parseField decodes a hash field made by rowPrefix plus a counter name.
func parseField(f string) (team, keyID, model, counter string, err error) {
	var parts [3]string
	rest := f
	for i := range parts {
		n, after, ok := strings.Cut(rest, ":")
		if !ok {
			return "", "", "", "", fmt.Errorf("spend: malformed ledger field %q", f)
		}
		l, err := strconv.Atoi(n)
		if err != nil || l < 0 || l > len(after) {
			return "", "", "", "", fmt.Errorf("spend: malformed ledger field %q", f)
		}
		parts[i], rest = after[:l], after[l:]
	}
	return parts[0], parts[1], parts[2], rest, nil
}

func dayKey(tag, day string) string { return tag + ":day:" + day }
func daysKey(tag string) string     { return tag + ":days" }

func (r *Redis) dayKey(day string) string { return dayKey(r.tag, day) }
func (r *Redis) daysKey() string          { return daysKey(r.tag) }

// makeBatches turns rows into batches under tag (splitRows), each with a
// new id.
func (r *Redis) makeBatches(tag string, rows map[Key]*Totals) []*batch {
	var out []*batch
	for _, part := range splitRows(rows) {
		r.seq++
		out = append(out, makeBatch(tag, r.replica+":"+strconv.FormatUint(r.seq, 10), part))
	}
	return out
}

// splitRows sorts rows, so one day's rows sit together and the spill file
// is stable, and splits them into parts of at most maxBatchRows: the same
// parts for the same rows, so that a journal replay rebuilds the batches
// it cut.
func splitRows(rows map[Key]*Totals) [][]Row {
	all := make([]Row, 0, len(rows))
	for k, t := range rows {
		all = append(all, Row{Key: k, Totals: *t})
	}
	sortRows(all)
	var out [][]Row
	for len(all) > 0 {
		n := min(len(all), maxBatchRows)
		out = append(out, all[:n:n])
		all = all[n:]
	}
	return out
}

// makeBatch builds the script call that adds rows under tag, marked by id.
// Rows of one day must be adjacent.
func makeBatch(tag, id string, rows []Row) *batch {
	b := &batch{id: id, tag: tag, rows: rows}
	b.keys = []string{tag + ":batch:" + id, daysKey(tag), tag + ":gen"}
	b.args = []any{int64(batchTTL / time.Second)}
	nAt := 0 // index in args of the current day's field count
	for i, row := range rows {
		if i == 0 || row.Day != rows[i-1].Day {
			b.keys = append(b.keys, dayKey(tag, row.Day))
			b.args = append(b.args, row.Day, 0)
			nAt = len(b.args) - 1
		}
		t, p := row.Totals, rowPrefix(row.Key)
		n := 1
		b.args = append(b.args, p+fRequests, t.Requests)
		for _, c := range [...]struct {
			name string
			v    int64
		}{{fInput, t.Input}, {fOutput, t.Output}, {fCacheRead, t.CacheRead},
			{fCacheWrite, t.CacheWrite}, {fReasoning, t.Reasoning}, {fCost, t.CostMicros}} {
			if c.v != 0 { // absent fields read as 0; requests always goes, so the row exists
				b.args = append(b.args, p+c.name, c.v)
				n++
			}
		}
		b.args[nAt] = b.args[nAt].(int) + n
	}
	return b
}

// Query reads the matching rows from Redis, sorted by day, team, key and
// model. It does not see deltas still waiting in this or another replica's
// memory.
func (r *Redis) Query(ctx context.Context, f Filter) ([]Row, error) {
	if err := f.validate(); err != nil {
		return nil, err
	}
	days, err := r.client.SMembers(ctx, r.daysKey()).Result()
	if err != nil {
		return nil, fmt.Errorf("spend: reading days from Redis: %w", err)
	}
	days = slices.DeleteFunc(days, func(d string) bool { return !f.matchDay(d) })
	if len(days) == 0 {
		return nil, nil
	}
	slices.Sort(days)
	pipe := r.client.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, len(days))
	for i, d := range days {
		cmds[i] = pipe.HGetAll(ctx, r.dayKey(d))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("spend: reading days from Redis: %w", err)
	}
	acc := make(map[Key]*Totals)
	for i, d := range days {
		for field, val := range cmds[i].Val() {
			team, keyID, model, counter, err := parseField(field)
			if err != nil {
				return nil, fmt.Errorf("%w in %s", err, r.dayKey(d))
			}
			k := Key{Day: d, KeyID: keyID, Team: team, Model: model}
			if !f.match(k) {
				continue
			}
			v, err := strconv.ParseInt(val, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("spend: ledger field %q in %s: %w", field, r.dayKey(d), err)
			}
			t := acc[k]
			if t == nil {
				t = new(Totals)
				acc[k] = t
			}
			switch counter {
			case fRequests:
				t.Requests = v
			case fInput:
				t.Input = v
			case fOutput:
				t.Output = v
			case fCacheRead:
				t.CacheRead = v
			case fCacheWrite:
				t.CacheWrite = v
			case fReasoning:
				t.Reasoning = v
			case fCost:
				t.CostMicros = v
			default:
				// A counter added by a newer version: skip it so this
				// version can still read the ledger.
			}
		}
	}
	rows := make([]Row, 0, len(acc))
	for k, t := range acc {
		rows = append(rows, Row{Key: k, Totals: *t})
	}
	sortRows(rows)
	return rows, nil
}

// flusher flushes every interval until Close.
func (r *Redis) flusher() {
	defer close(r.done)
	tick := time.NewTicker(r.interval)
	defer tick.Stop()
	var syncC <-chan time.Time
	if r.j != nil && r.jsync > 0 {
		st := time.NewTicker(r.jsync)
		defer st.Stop()
		syncC = st.C
	}
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-syncC:
			if err := r.j.sync(&r.mu); err != nil {
				r.log.Error("spend: fsync of the journal failed; will retry", "err", err)
			}
		case <-tick.C:
			ctx, cancel := context.WithTimeout(r.ctx, flushTimeout)
			r.tick(ctx) // noteResultLocked logs failures
			cancel()
		case <-r.kick:
			ctx, cancel := context.WithTimeout(r.ctx, flushTimeout)
			r.tick(ctx)
			cancel()
		}
	}
}

// Close stops the flusher and flushes once more, trying again for up to
// 1.5 s while it fails (a client just back from an outage), for at most 5 s (after any
// Flush in progress). If deltas remain unwritten it writes them to the spill
// file, when there is one, and logs and returns an error saying how many
// rows and where they are. Later calls return the first call's result. Adds
// after Close stay in memory and are written only by an explicit Flush.
func (r *Redis) Close() error {
	r.closeOnce.Do(func() {
		r.cancel()
		<-r.done
		// Unconditional: the spill below must see the queue alone.
		r.sem <- struct{}{}
		defer func() { <-r.sem }()
		ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		defer cancel()
		start := time.Now()
		err := r.flushLocked(ctx)
		for err != nil && ctx.Err() == nil && time.Since(start) < closeRetryFor {
			time.Sleep(closeRetryEvery)
			err = r.flushLocked(ctx)
		}
		r.noteResultLocked(err)
		var errs []error
		spilled := false
		if err != nil {
			n := r.Pending()
			var serr error
			if r.spillFile != "" {
				serr = r.spillLocked()
				spilled = serr == nil
			}
			switch {
			case r.spillFile == "":
				r.log.Error("spend: closing with spend not written to Redis; it is lost", "pending_rows", n, "err", err)
				errs = append(errs, fmt.Errorf("spend: closing with %d rows not written to Redis: %w", n, err))
			case serr == nil:
				r.log.Warn("spend: closing with spend not written to Redis; kept in the spill file for the next start",
					"pending_rows", n, "spill_file", r.spillFile, "err", err)
				errs = append(errs, fmt.Errorf("spend: closing with %d rows not written to Redis, kept in spill file %s: %w",
					n, r.spillFile, err))
			default:
				r.log.Error("spend: closing with spend not written to Redis nor to the spill file; it is lost",
					"pending_rows", n, "err", err, "spill_err", serr)
				errs = append(errs, fmt.Errorf("spend: closing with %d rows not written to Redis: %w", n, errors.Join(err, serr)))
			}
		}
		errs = append(errs, r.removeSpillLocked(), r.saveOwnLocked(),
			r.closeJournalLocked(err == nil && len(r.queue) == 0 || spilled))
		if d := r.Dropped(); d > 0 {
			errs = append(errs, fmt.Errorf("spend: %d adds were dropped (MaxPending %d)", d, r.maxPending))
		}
		r.closeErr = errors.Join(errs...)
	})
	return r.closeErr
}
