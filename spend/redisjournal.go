package spend

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/tollgate-llm/tollgate/internal/atomicfile"
	"github.com/tollgate-llm/tollgate/internal/jsonl"
)

// The journal of a Redis ledger (RedisOptions.Journal) makes a kill lose
// nothing that Add returned for, though Add only aggregates in memory and
// the flusher sends batches every FlushInterval. It is JSON lines of three
// kinds, each appended with one write:
//
//   - an entry per Add, before the Add counts, in the Local journal's form
//     (journal.go): {"seq":7,"at":...,"day":...,...,"cost_micros":4500};
//   - a cut, written by the flusher when it cuts the pending rows into
//     batches and before it sends them: the batches' ids in order, the
//     hash tag they go under, and the entries they hold, those numbered
//     after "after" up to "last" (every Add has a seq, so a cut holds a
//     range), with the MaxPending the rows were folded under:
//     {"cut":["r:n:4","r:n:5"],"tag":"{tollgate:spend}","after":6,"last":9,"max":100000};
//   - applied, once Redis applied batches (and the own part holding them
//     was saved): {"applied":["r:n:4"]}.
//
// NewRedis replays it: a cut with batches not known applied is rebuilt
// from its entries, folded and split as the flusher did, under the same
// ids, and queued; Redis's batch markers make a batch applied before the
// kill (its applied record not yet written) a no-op. Entries after the
// last cut go back to pending. Replay is thus exact: nothing lost, nothing
// counted twice.
//
// Two files hold it: the journal and the journal+".prev". Each time the
// flusher cuts with every earlier batch applied and recorded, the previous
// file is removed and the journal becomes it: its entries are all in the
// batches just cut, whose cut record starts the new journal. So the files
// hold about two flush intervals. Close removes both once everything was
// applied, or written to the spill file (whose batches a cut record names
// first, so a start that finds both sends each id once).
const redisJournalPrev = ".prev"

// redisJournalMax bounds the journal files while Redis cannot take
// batches, when the journal does not rotate: beyond it, with a spill file,
// the flusher spills (cuts pending, with its cut record, and writes every
// unapplied batch to the spill file) and rotates, so the files hold the
// Adds since (about redisJournalMax at most, each time) and the spill
// file the rest, under their ids.
const redisJournalMax = 64 << 20

// cutLine and appliedLine are the JSON forms of a cut and an applied
// record.
type cutLine struct {
	Cut   []string `json:"cut"`
	Tag   string   `json:"tag"`
	After uint64   `json:"after"`
	Last  uint64   `json:"last"`
	Max   int      `json:"max"`
}

type appliedLine struct {
	Applied []string `json:"applied"`
}

// redisRecord is one decoded line of a Redis journal: exactly one of its
// fields is set.
type redisRecord struct {
	entry   *Entry
	cut     *cutLine
	applied []string
}

// parseRedisLine decodes and checks one line of a Redis journal, newline
// included. The kind is told by the first key, which the writer puts first.
func parseRedisLine(line []byte) (redisRecord, error) {
	switch {
	case bytes.HasPrefix(line, []byte(`{"seq":`)):
		e, err := parseEntry(line)
		if err != nil {
			return redisRecord{}, err
		}
		return redisRecord{entry: &e}, nil
	case bytes.HasPrefix(line, []byte(`{"cut":`)):
		var c cutLine
		if err := atomicfile.DecodeJSON(line, &c); err != nil {
			return redisRecord{}, err
		}
		if err := checkIDs(c.Cut); err != nil {
			return redisRecord{}, err
		}
		if err := checkTag(c.Tag); err != nil {
			return redisRecord{}, err
		}
		if c.Last <= c.After {
			return redisRecord{}, fmt.Errorf("cut of seqs after %d up to %d holds none", c.After, c.Last)
		}
		if c.Max <= 0 {
			return redisRecord{}, fmt.Errorf("cut with max %d", c.Max)
		}
		return redisRecord{cut: &c}, nil
	case bytes.HasPrefix(line, []byte(`{"applied":`)):
		var a appliedLine
		if err := atomicfile.DecodeJSON(line, &a); err != nil {
			return redisRecord{}, err
		}
		if err := checkIDs(a.Applied); err != nil {
			return redisRecord{}, err
		}
		return redisRecord{applied: a.Applied}, nil
	}
	return redisRecord{}, errors.New(`not an entry ("seq"), a cut ("cut") nor an applied record ("applied")`)
}

// checkIDs refuses an empty list, an empty id and a repeated one (a repeat
// would be skipped as applied: its rows lost).
func checkIDs(ids []string) error {
	if len(ids) == 0 {
		return errors.New("no batch ids")
	}
	for i, id := range ids {
		if id == "" || slices.Contains(ids[:i], id) {
			return fmt.Errorf("empty or repeated batch id %q", id)
		}
	}
	return nil
}

// checkTag refuses a hash tag that is not "{<prefix>spend}".
func checkTag(tag string) error {
	if !strings.HasPrefix(tag, "{") || !strings.HasSuffix(tag, "spend}") {
		return fmt.Errorf("tag %q is not {<prefix>spend}", tag)
	}
	return nil
}

// redisReplay is what a Redis journal's two files hold.
type redisReplay struct {
	entries []Entry    // in seq order
	cuts    []*cutLine // in order
	applied map[string]bool
	lastSeq uint64 // the highest seq of an entry or a cut
	size    int64  // bytes of whole lines in the journal
	prev    int64  // bytes of whole lines in the previous file
}

// ids returns every batch id the journal's cuts name.
func (rp *redisReplay) ids() []string {
	var ids []string
	for _, c := range rp.cuts {
		ids = append(ids, c.Cut...)
	}
	return ids
}

// readRedisJournal reads the previous journal file, then the journal. A
// torn last line of either is ignored with a warning (the journal's is cut
// off when it is opened); a bad line elsewhere, a seq that does not
// increase or cuts that do not follow each other are errors naming the file
// and line.
func (r *Redis) readRedisJournal(name string) (*redisReplay, error) {
	rp := &redisReplay{applied: make(map[string]bool)}
	var lastEntry, lastCut uint64
	for _, file := range []string{name + redisJournalPrev, name} {
		res, err := jsonl.Read(file, 0, func(line []byte) error {
			rec, err := parseRedisLine(line)
			if err != nil {
				return err
			}
			switch {
			case rec.entry != nil:
				if rec.entry.Seq <= lastEntry {
					return fmt.Errorf("seq %d after %d", rec.entry.Seq, lastEntry)
				}
				lastEntry = rec.entry.Seq
				rp.entries = append(rp.entries, *rec.entry)
			case rec.cut != nil:
				if len(rp.cuts) > 0 && rec.cut.After != lastCut {
					return fmt.Errorf("cut of seqs after %d follows a cut up to %d", rec.cut.After, lastCut)
				}
				lastCut = rec.cut.Last
				rp.cuts = append(rp.cuts, rec.cut)
			default:
				for _, id := range rec.applied {
					rp.applied[id] = true
				}
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("spend: %w", err)
		}
		logTorn(r.log, file, res)
		rp.prev, rp.size = rp.size, res.Size
	}
	rp.lastSeq = max(lastEntry, lastCut)
	return rp, nil
}

// replayJournal queues the batches of rp's cuts that are not known applied
// (nor queued already from the spill file), rebuilt under their ids, and
// puts the entries after the last cut in pending; then it opens the
// journal. Under no lock: NewRedis calls it before the flusher starts.
func (r *Redis) replayJournal(rp *redisReplay, sync time.Duration) error {
	queued := make(map[string]bool, len(r.queue))
	for _, b := range r.queue {
		queued[b.id] = true
	}
	maxPending := r.maxPending
	defer func() { r.maxPending = maxPending }()
	var cutTo uint64
	rows, batches := 0, 0
	for _, c := range rp.cuts {
		cutTo = c.Last
		if !slices.ContainsFunc(c.Cut, func(id string) bool { return !rp.applied[id] && !queued[id] }) {
			continue
		}
		// Folded exactly as the flusher folded them before cutting.
		r.maxPending, r.pending = c.Max, make(map[Key]*Totals)
		n := 0
		for _, e := range rp.entries {
			if e.Seq > c.After && e.Seq <= c.Last {
				r.addPendingLocked(e.Key, e.Totals)
				n++
			}
		}
		if n == 0 {
			// Its entries were in a file removed once all its batches
			// were applied; only the applied record did not make it.
			continue
		}
		if want := c.Last - c.After; uint64(n) != want {
			r.log.Warn("spend: a cut in the journal misses entries whose writes had failed; those are lost",
				"file", r.j.name, "cut", c.Cut[0], "entries", n, "want", want)
		}
		parts := splitRows(r.pending)
		if len(parts) != len(c.Cut) {
			return fmt.Errorf("spend: journal %s is corrupt: cut %s names %d batches, its entries make %d",
				r.j.name, c.Cut[0], len(c.Cut), len(parts))
		}
		for i, part := range parts {
			if id := c.Cut[i]; !rp.applied[id] && !queued[id] {
				r.queue = append(r.queue, makeBatch(c.Tag, id, part))
				rows += len(part)
				batches++
			}
		}
	}
	r.maxPending, r.pending = maxPending, make(map[Key]*Totals)
	later := 0
	for _, e := range rp.entries {
		if e.Seq > cutTo {
			r.addPendingLocked(e.Key, e.Totals)
			later++
		}
	}
	r.queuedRows.Add(int64(rows))
	r.jseq, r.jcut = rp.lastSeq, cutTo
	if batches > 0 || later > 0 {
		r.log.Info("spend: spend from the journal will be written to Redis", "journal", r.j.name,
			"batches", batches, "rows", rows, "later_adds", later)
	}
	r.jsync, r.jprev = sync, rp.prev
	return r.j.openAt(rp.size, time.Now())
}

// appendEntryLocked journals one Add (under mu), before it counts.
func (r *Redis) appendEntryLocked(k Key, t Totals, admitted time.Time) {
	r.jseq++
	r.j.appendEntryLocked(r.log, r.jseq, admitted, time.Now, k, t, "a kill loses the spend not yet written to Redis")
}

// appendRecordLocked journals a cut or applied record (under mu).
func (r *Redis) appendRecordLocked(v any) {
	j := r.j
	if j.f != nil && !j.broken {
		data, err := json.Marshal(v)
		if err != nil { // plain strings and numbers: cannot fail
			panic(err)
		}
		j.buf = append(append(j.buf[:0], data...), '\n')
	}
	j.writeLocked(r.log, "a kill may lose the spend not yet written to Redis, or count a batch twice")
}

// rotateJournalLocked, at a cut with every earlier batch applied and
// recorded, makes the journal the previous file (the previous one removed:
// its batches are all applied) and starts a new one (under mu). It returns
// the file to retire once mu is released, or nil.
func (r *Redis) rotateJournalLocked() *os.File {
	j := r.j
	old := j.f
	if old != nil {
		if j.size == 0 && !j.broken {
			return nil
		}
		removed, shifted := j.shiftLocked(r.log)
		if removed {
			r.jprev = 0
		}
		if !shifted {
			return nil
		}
		j.f, r.jprev = nil, j.size
	}
	j.startLocked(r.log, time.Now())
	return old
}

// compactJournalLocked, after a failed flush (under sem), bounds the
// journal files while Redis cannot take batches: once they hold more than
// journalMax, it spills (the spill file then holds every unapplied batch,
// and the journal the cut of the pending rows into them) and rotates, the
// previous file removed: its entries are all in spilled batches. A replay
// then finds their cuts' entries gone and takes the batches from the spill
// file, under the same ids.
func (r *Redis) compactJournalLocked() {
	if r.j == nil || r.spillFile == "" {
		return
	}
	r.mu.Lock()
	big := !r.j.closed && r.j.size+r.jprev > r.journalMax
	r.mu.Unlock()
	if !big {
		return
	}
	if err := r.spillLocked(); err != nil {
		r.log.Error("spend: cannot spill to bound the journal while Redis is down; it grows", "err", err)
		return
	}
	r.mu.Lock()
	retired := r.rotateJournalLocked()
	r.mu.Unlock()
	if retired != nil {
		r.j.retire(retired)
	}
	r.log.Info("spend: Redis is down; unsent spend spilled and the journal rotated to bound it",
		"spill_file", r.spillFile, "batches", len(r.queue))
}

// recordAppliedLocked saves the own part and then journals the ids of the
// batches applied since the last record (under sem), so that a replay
// re-sends (a no-op in Redis) only batches whose own part may not be saved.
func (r *Redis) recordAppliedLocked() error {
	if r.j == nil || len(r.applied) == 0 {
		return nil
	}
	if err := r.saveOwnLocked(); err != nil {
		return err
	}
	r.mu.Lock()
	if !r.j.closed {
		r.appendRecordLocked(appliedLine{Applied: r.applied})
	}
	r.mu.Unlock()
	r.applied = r.applied[:0]
	return nil
}

// closeJournalLocked syncs and closes the journal at Close (under sem) and,
// when safe is set and nothing is left in pending, removes both files:
// what they held is in Redis or in the spill file.
func (r *Redis) closeJournalLocked(safe bool) error {
	if r.j == nil {
		return nil
	}
	err := r.recordAppliedLocked()
	err = errors.Join(err, r.j.close(&r.mu))
	r.mu.Lock()
	safe = safe && len(r.pending) == 0
	r.mu.Unlock()
	if !safe {
		return err
	}
	for _, name := range []string{r.j.prev, r.j.name} {
		if rerr := os.Remove(name); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			err = errors.Join(err, fmt.Errorf("spend: removing journal %s, whose spend is all in Redis or the spill file: %w", name, rerr))
		}
	}
	return err
}
