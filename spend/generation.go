package spend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-llm/tollgate/internal/atomicfile"
)

// A Redis that restarts without persistence comes back empty, and with it
// the day's and month's spend of every replica. So Redis's data carries a
// generation: a random id under "{<prefix>spend}:gen", written once by the
// first replica that finds none. Every batch is applied only under the
// generation its replica expects (applyScript checks it), and each replica
// keeps its own part of the ledger: what Redis applied of its batches,
// with the generation they went to (the own-state file). A replica that
// finds another generation than the one it expects, or none, knows that
// Redis lost its data: it adopts the current generation (creating it when
// there is none) and first sends its own part again as batches whose ids
// name that generation and this replica, so that each replica's part is
// added once whoever else refills, and only then what waits to be sent.
// No batch of the new generation can have been counted in the own part
// before, because batches under the old one were refused by the new data.

// ownVersion is the version of the own-state file format.
const ownVersion = 1

// errGeneration is the prefix of applyScript's refusal of a batch sent
// under another generation than Redis's.
const errGeneration = "TOLLGATE_GENERATION"

// ownFile is the JSON form of a Redis ledger's own part.
type ownFile struct {
	Version int       `json:"version"`
	SavedAt time.Time `json:"saved_at"`
	// Owner names this replica's part across restarts, in refill ids.
	Owner string `json:"owner"`
	// Generation is the generation of Redis's data that Rows went to.
	Generation string     `json:"generation"`
	Rows       []stateRow `json:"rows"`
}

// readOwn reads the own-state file; a missing file is nil.
func readOwn(name string) (*ownFile, error) {
	var of ownFile
	if found, err := atomicfile.ReadJSON("spend", "own-state file", name, &of); !found || err != nil {
		return nil, err
	}
	if of.Version != ownVersion {
		return nil, fmt.Errorf("spend: own-state file %s has version %d, want %d", name, of.Version, ownVersion)
	}
	if of.Owner == "" {
		return nil, fmt.Errorf("spend: own-state file %s is corrupt: no owner", name)
	}
	return &of, nil
}

// loadOwn sets the own part from the file (or a new owner without one).
func (r *Redis) loadOwn() error {
	r.owner = randomHex(8)
	if r.ownFile == "" {
		return nil
	}
	of, err := readOwn(r.ownFile)
	if err != nil || of == nil {
		return err
	}
	r.owner, r.gen = of.Owner, of.Generation
	for _, x := range of.Rows {
		row := x.row()
		t := row.Totals
		r.sent[row.Key] = &t
	}
	return nil
}

// ownKeepFrom returns the first day the own part keeps at now: the first
// of the previous month. A refill restores the day's and the month's
// totals (and the month before, for a request that spanned its end); older
// days are history that an empty Redis loses, as the own part would grow
// without bound if it kept them.
func ownKeepFrom(now time.Time) string {
	now = now.UTC()
	return time.Date(now.Year(), now.Month()-1, 1, 0, 0, 0, 0, time.UTC).Format(DayLayout)
}

// saveOwnLocked writes the own part when it changed (under sem), without
// the days before ownKeepFrom.
func (r *Redis) saveOwnLocked() error {
	if r.ownFile == "" || r.ownSaved == r.ownChanges {
		return nil
	}
	r.sentMu.Lock()
	from := ownKeepFrom(time.Now())
	for k := range r.sent {
		if k.Day < from {
			delete(r.sent, k)
		}
	}
	of := ownFile{Version: ownVersion, SavedAt: time.Now().UTC(), Owner: r.owner, Generation: r.gen,
		Rows: make([]stateRow, 0, len(r.sent))}
	for k, t := range r.sent {
		of.Rows = append(of.Rows, toStateRow(Row{Key: k, Totals: *t}))
	}
	changes := r.ownChanges
	r.sentMu.Unlock()
	data, err := json.Marshal(of)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(r.ownFile, data); err != nil {
		return fmt.Errorf("spend: writing own-state file %s: %w", r.ownFile, err)
	}
	r.ownSaved = changes
	return nil
}

// noteSentLocked adds an applied batch to the own part (under sem).
func (r *Redis) noteSentLocked(b *batch) {
	r.sentMu.Lock()
	defer r.sentMu.Unlock()
	for _, row := range b.rows {
		t := r.sent[row.Key]
		if t == nil {
			t = new(Totals)
			r.sent[row.Key] = t
		}
		t.Add(row.Totals)
	}
	r.ownChanges++
}

// isGeneration reports whether err is applyScript's refusal of a batch
// sent under another generation.
func isGeneration(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), errGeneration)
}

func (r *Redis) genKey(tag string) string { return tag + ":gen" }

// checkGenerationLocked reads Redis's generation and, when it is not the
// one this replica expects, refills (under sem). It is what the flusher
// runs when it has nothing to send, so that an empty Redis is noticed and
// refilled without traffic.
func (r *Redis) checkGenerationLocked(ctx context.Context) error {
	cur, err := r.client.Get(ctx, r.genKey(r.tag)).Result()
	if errors.Is(err, redis.Nil) {
		cur, err = "", nil
	}
	if err != nil {
		return fmt.Errorf("spend: reading the generation of Redis's data: %w", err)
	}
	if cur != "" && cur == r.gen {
		return nil
	}
	return r.refillLocked(ctx)
}

// refillLocked adopts Redis's current generation, creating one if Redis
// has none, and sends this replica's own part to it once (under sem).
func (r *Redis) refillLocked(ctx context.Context) error {
	key := r.genKey(r.tag)
	if err := r.client.SetNX(ctx, key, randomHex(16), 0).Err(); err != nil {
		return fmt.Errorf("spend: creating the generation of Redis's data: %w", err)
	}
	cur, err := r.client.Get(ctx, key).Result()
	if err != nil {
		return fmt.Errorf("spend: reading the generation of Redis's data: %w", err)
	}
	if cur == r.gen {
		return nil
	}
	lost := r.gen != ""
	if lost && !r.dataLost.Load() {
		r.dataLost.Store(true)
		r.log.Error("spend: Redis lost its data (its generation changed); refilling it with this replica's own spend",
			"expected", r.gen, "found", cur)
		if r.onDataLost != nil {
			r.onDataLost(true)
		}
	}
	r.sentMu.Lock()
	rows := make([]Row, 0, len(r.sent))
	for k, t := range r.sent {
		rows = append(rows, Row{Key: k, Totals: *t})
	}
	r.sentMu.Unlock()
	sortRows(rows)
	if r.onRefill != nil {
		if err := r.onRefill(ctx, rows, cur+":"+r.owner); err != nil {
			return fmt.Errorf("spend: refilling the limits' budgets: %w", err)
		}
	}
	// Deterministic ids: a refill cut short and tried again sends the same
	// batches, which Redis applies once.
	for i := 0; len(rows) > 0; i++ {
		n := min(len(rows), maxBatchRows)
		b := makeBatch(r.tag, "refill:"+cur+":"+r.owner+":"+strconv.Itoa(i), rows[:n:n])
		if err := r.applyLocked(ctx, b, cur); err != nil {
			return fmt.Errorf("spend: refilling Redis with batch %s: %w", b.id, err)
		}
		rows = rows[n:]
	}
	r.gen = cur
	r.ownChanges++
	// Each replica's part counts once in the set of those that are back.
	if err := r.client.SAdd(ctx, r.filledKey(cur), r.owner).Err(); err != nil {
		return fmt.Errorf("spend: recording this replica's refill: %w", err)
	}
	_ = r.client.Expire(ctx, r.filledKey(cur), 24*time.Hour).Err() // tidiness only
	if r.dataLost.Load() && !r.filling.Load() {
		r.filling.Store(true)
		r.fillSince = time.Now()
		r.log.Info("spend: this replica's own spend is back in Redis; waiting for the other replicas'",
			"generation", cur, "replicas", r.replicas())
	}
	return r.saveOwnLocked()
}

// filledKey names the set of the replicas whose own parts went to
// generation gen.
func (r *Redis) filledKey(gen string) string { return r.tag + ":filled:" + gen }

// noteWholeLocked tells onWhole the generation under which the ledger is
// whole, once: at once for a generation adopted without a loss, and after
// a loss once the fleet's parts are back (as many replicas as Replicas
// says have recorded theirs) or RefillWait has passed (under sem).
func (r *Redis) noteWholeLocked(ctx context.Context) error {
	if r.gen == "" {
		return nil
	}
	if r.filling.Load() {
		n, err := r.client.SCard(ctx, r.filledKey(r.gen)).Result()
		if err != nil {
			return fmt.Errorf("spend: reading which replicas refilled Redis: %w", err)
		}
		want, waited := r.replicas(), time.Since(r.fillSince)
		if n < int64(want) && waited < r.refillWait {
			return nil
		}
		r.filling.Store(false)
		r.dataLost.Store(false)
		if n < int64(want) {
			r.log.Warn("spend: not every replica sent its spend back to Redis in time; the ledger and the budgets miss theirs until they do",
				"refilled", n, "replicas", want, "waited", waited)
		} else {
			r.log.Info("spend: every replica's spend is back in Redis", "generation", r.gen, "replicas", n)
		}
		if r.onDataLost != nil {
			r.onDataLost(false)
		}
	}
	if r.wholeSaid != r.gen {
		r.wholeSaid = r.gen
		gen := r.gen
		r.wholeGen.Store(&gen)
		if r.onWhole != nil {
			r.onWhole(r.gen)
		}
	}
	return nil
}

// CheckNow asks the flusher to check Redis's generation now rather than at
// its next interval: the limiter found that Redis lost its data. It never
// blocks.
func (r *Redis) CheckNow() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Incomplete reports whether Redis's ledger misses spend: Redis lost its
// data (its generation is not the one this replica knew whole, which
// starts the refill now) and not every replica has sent its part back yet.
// /admin/spend flags its answer partial meanwhile. A generation that
// cannot be read says nothing: Query's error tells of an outage.
func (r *Redis) Incomplete(ctx context.Context) bool {
	if r.dataLost.Load() {
		return true
	}
	known := r.wholeGen.Load()
	if known == nil {
		return false
	}
	cur, err := r.client.Get(ctx, r.genKey(r.tag)).Result()
	if errors.Is(err, redis.Nil) {
		cur, err = "", nil
	}
	if err != nil || cur == *known {
		return false
	}
	r.CheckNow()
	return true
}

// Incompleter is a shared ledger that can tell when it misses spend it
// will get back (Redis.Incomplete).
type Incompleter interface {
	Incomplete(ctx context.Context) bool
}

var _ Incompleter = (*Redis)(nil)

// GenerationKey returns the key holding the generation of Redis's data for
// a ledger of prefix (RedisOptions.Prefix; empty means "tollgate:"), which
// the limiter checks before it decides on Redis.
func GenerationKey(prefix string) string {
	if prefix == "" {
		prefix = "tollgate:"
	}
	return "{" + prefix + "spend}:gen"
}

// applyLocked runs one batch under generation gen (the script's second
// argument, which batches do not carry: a spilled batch goes to whatever
// generation its sender expects when it is sent).
func (r *Redis) applyLocked(ctx context.Context, b *batch, gen string) error {
	args := make([]any, 0, len(b.args)+1)
	args = append(args, b.args[0], gen)
	args = append(args, b.args[1:]...)
	applied, err := applyScript.Run(ctx, r.client, b.keys, args...).Int()
	if err != nil {
		return err
	}
	if applied == 0 {
		r.log.Info("spend: batch was already applied; an earlier attempt had succeeded", "batch", b.id)
	}
	return nil
}
