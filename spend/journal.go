package spend

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/tollgate-llm/tollgate/internal/atomicfile"
	"github.com/tollgate-llm/tollgate/internal/jsonl"
)

// The journal of a Local ledger is JSON lines, one per Add, appended in
// order with one write each before the Add counts:
//
//	{"seq":7,"at":1767225600123456789,"day":"2026-01-01","key_id":"alpha","team":"search",
//	 "model":"gpt-4o","requests":1,"input":1200,"output":300,"cache_read":800,
//	 "cache_write":0,"reasoning":100,"cost_micros":4500}
//
// (one line). seq numbers every Add from 1, increasing across restarts; the
// state file records the seq of the last Add its rows include, so that a
// start adds to them only the lines after it. at is when the request was
// admitted, in Unix nanoseconds.
//
// Two files hold it: StateFile+".journal", appended to, and
// StateFile+".journal.prev", the one before. At a state write, once the
// journal has been appended to for journalKeep and the previous one is in a
// state file written since, the previous one is removed and the journal
// becomes it; a new journal starts empty. Both are read at start, so what
// was billed in the last journalKeep (at least) is always there for
// OnReplay, and nothing a state file does not hold is ever removed.
const (
	journalSuffix = ".journal"
	prevSuffix    = ".journal.prev"
	// journalKeep is how long lines stay in the journal files after they
	// were appended: a minute, the window of per-minute rate limits, which
	// cmd/gateway restores from them.
	journalKeep = time.Minute
)

// Entry is one Add as the journal keeps it.
type Entry struct {
	// Seq numbers the Adds of a ledger from 1, across restarts.
	Seq uint64
	// Admitted is when the request was admitted (Ledger.Add's admitted).
	Admitted time.Time
	Key
	Totals
}

// entryLine is the JSON form of one journal line: a state file row with
// the Add's seq and admission time.
type entryLine struct {
	Seq uint64 `json:"seq"`
	At  int64  `json:"at"`
	stateRow
}

// appendEntry appends the journal line of one Add; it allocates nothing
// when b has room.
func appendEntry(b []byte, seq uint64, at int64, k Key, t Totals) []byte {
	b = append(b, `{"seq":`...)
	b = strconv.AppendUint(b, seq, 10)
	b = append(b, `,"at":`...)
	b = strconv.AppendInt(b, at, 10)
	b = append(b, `,"day":`...)
	b = jsonl.AppendString(b, k.Day)
	b = append(b, `,"key_id":`...)
	b = jsonl.AppendString(b, k.KeyID)
	b = append(b, `,"team":`...)
	b = jsonl.AppendString(b, k.Team)
	b = append(b, `,"model":`...)
	b = jsonl.AppendString(b, k.Model)
	for _, f := range [...]struct {
		name string
		v    int64
	}{{`,"requests":`, t.Requests}, {`,"input":`, t.Input}, {`,"output":`, t.Output},
		{`,"cache_read":`, t.CacheRead}, {`,"cache_write":`, t.CacheWrite}, {`,"reasoning":`, t.Reasoning},
		{`,"cost_micros":`, t.CostMicros}} {
		b = append(b, f.name...)
		b = strconv.AppendInt(b, f.v, 10)
	}
	return append(b, "}\n"...)
}

// parseEntry decodes and checks one journal line, newline included.
func parseEntry(line []byte) (Entry, error) {
	var e entryLine
	if err := atomicfile.DecodeJSON(line, &e); err != nil {
		return Entry{}, err
	}
	if e.Seq == 0 {
		return Entry{}, errors.New("seq 0 or missing")
	}
	if e.At <= 0 {
		return Entry{}, fmt.Errorf("admission time %d is not after 1970", e.At)
	}
	row, err := e.checkedRow()
	if err != nil {
		return Entry{}, err
	}
	return Entry{Seq: e.Seq, Admitted: time.Unix(0, e.At), Key: row.Key, Totals: row.Totals}, nil
}

// journal is a Local ledger's journal files. Its fields are under the
// ledger's mu, but for syncMu, which serialises fsyncs and closes of the
// files so that neither races a rotation.
type journal struct {
	name, prev string
	keep       time.Duration

	// f is the open journal; nil after Close or a failed rotation (the
	// next state write tries again).
	f       *os.File
	closed  bool
	size    int64     // bytes in f
	broken  bool      // a failed write left a torn line that could not be cut: append no more to f
	dirty   bool      // written since the last fsync
	since   time.Time // when f started being appended to (its creation, or this process's start)
	prevSeq uint64    // the highest seq the previous file may hold; 0 when there is none
	buf     []byte    // the line being written, reused

	failing  bool  // the last append failed
	failures int64 // appends lost since the last that succeeded

	syncMu sync.Mutex
}

// replayJournal reads the previous journal and then the journal into l:
// each Add after the state file's seq is added to the rows, and every line
// goes to onReplay. Seqs must increase through both files. A torn last line
// of either is ignored with a warning and cut off the journal, so that the
// next line starts on a line of its own.
func (l *Local) replayJournal(onReplay func(Entry)) error {
	j := l.j
	last := uint64(0)
	var size int64
	for _, name := range []string{j.prev, j.name} {
		res, err := jsonl.Read(name, 0, func(line []byte) error {
			e, err := parseEntry(line)
			if err != nil {
				return err
			}
			if e.Seq <= last {
				return fmt.Errorf("seq %d after %d", e.Seq, last)
			}
			last = e.Seq
			if e.Seq > l.saved {
				l.addLocked(e.Key, e.Totals)
			}
			if onReplay != nil {
				onReplay(e)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("spend: %w", err)
		}
		logTorn(l.log, name, res)
		if name == j.prev && res.Exists {
			j.prevSeq = max(last, 1)
		}
		size = res.Size
	}
	l.seq = max(l.seq, last)
	return j.openAt(size, l.now())
}

// openAt opens the journal for appending, cutting off what follows the
// size bytes replay accepted (a torn last line), so that the next line
// starts on a line of its own.
func (j *journal) openAt(size int64, now time.Time) error {
	f, err := os.OpenFile(j.name, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("spend: opening journal %s: %w", j.name, err)
	}
	st, err := f.Stat()
	if err == nil && st.Size() > size {
		err = f.Truncate(size)
	}
	if err != nil {
		_ = f.Close()
		return fmt.Errorf("spend: cutting the torn last line off journal %s: %w", j.name, err)
	}
	j.f, j.size, j.since = f, size, now
	return nil
}

// logTorn warns about the torn last line Read ignored in name, if any.
func logTorn(log *slog.Logger, name string, res jsonl.Result) {
	t := res.Torn
	if t == nil {
		return
	}
	why := "no trailing newline"
	if t.Err != nil {
		why = t.Err.Error()
	}
	log.Warn("spend: ignoring the torn last line of a journal (a crash in the middle of its write)",
		"file", name, "line", t.Line, "bytes", t.Bytes, "error", why)
}

// appendLocked writes the journal line of an Add (seq l.seq), with one
// write, before the Add counts. A failed write is logged (once until one
// succeeds again) and the Add still counts: the state file will hold it.
func (l *Local) appendLocked(k Key, t Totals, admitted time.Time) {
	l.j.appendEntryLocked(l.log, l.seq, admitted, l.now, k, t,
		"until the next state write, a crash loses what was billed since the last")
}

// appendEntryLocked writes the line of Add number seq (admitted; the zero
// time: now()) with writeLocked.
func (j *journal) appendEntryLocked(log *slog.Logger, seq uint64, admitted time.Time, now func() time.Time, k Key, t Totals, lost string) {
	if j.f != nil && !j.broken {
		at := admitted.UnixNano()
		if admitted.IsZero() || at <= 0 {
			at = now().UnixNano()
		}
		j.buf = appendEntry(j.buf[:0], seq, at, k, t)
	}
	j.writeLocked(log, lost)
}

// writeLocked appends j.buf, one line, with one write (under the owner's
// mutex). A failed write is logged with lost, what it costs, once until a
// write succeeds again.
func (j *journal) writeLocked(log *slog.Logger, lost string) {
	var err error
	switch {
	case j.f == nil:
		err = errors.New("the journal is not open")
	case j.broken:
		err = errors.New("a failed write left a torn line that could not be cut; a new journal starts at the next rotation")
	default:
		var whole bool
		whole, err = jsonl.Append(j.f, j.size, j.buf)
		if err == nil {
			j.size += int64(len(j.buf))
			j.dirty = true
		}
		j.broken = !whole
	}
	if err == nil {
		if j.failing {
			log.Warn("spend: journal writes succeed again", "file", j.name, "lost", j.failures)
			j.failing, j.failures = false, 0
		}
		return
	}
	j.failures++
	if !j.failing {
		j.failing = true
		log.Error("spend: writing the journal failed: "+lost, "file", j.name, "err", err)
	}
}

// rotateLocked, at a state write that will hold every Add so far, makes
// the journal the previous one and starts a new one, if the journal has
// been appended to for keep (or is broken) and the previous one is in a
// state file already written. The previous one then holds nothing appended
// in the last keep (but when broken) and nothing a state file lacks. It
// also opens a journal that a failed rotation left unopened. It returns the
// file to sync and close once mu is released, or nil.
func (l *Local) rotateLocked() *os.File {
	j := l.j
	if j == nil || j.closed {
		return nil
	}
	old := j.f
	if old != nil {
		if !j.broken && (j.size == 0 || l.now().Sub(j.since) < j.keep) || j.prevSeq > l.saved {
			return nil
		}
		removed, shifted := j.shiftLocked(l.log)
		if removed {
			j.prevSeq = 0
		}
		if !shifted {
			return nil
		}
		j.prevSeq, j.f = max(l.seq, 1), nil
	}
	// The name is free: the journal was renamed away (here, or by a
	// rotation whose open failed).
	j.startLocked(l.log, l.now())
	return old
}

// shiftLocked removes the previous file and renames the journal to it
// (under the owner's mutex), logging a failure: the caller retries at its
// next rotation. removed reports that the previous file is gone, shifted
// that the journal is now the previous file (j.f, still open, to retire).
func (j *journal) shiftLocked(log *slog.Logger) (removed, shifted bool) {
	if err := os.Remove(j.prev); err != nil && !errors.Is(err, fs.ErrNotExist) {
		log.Error("spend: removing the previous journal failed; will retry", "file", j.prev, "err", err)
		return false, false
	}
	if err := os.Rename(j.name, j.prev); err != nil {
		log.Error("spend: renaming the journal failed; will retry", "file", j.name, "err", err)
		return true, false
	}
	return true, true
}

// startLocked opens a new, empty journal under j.name; a failure is logged
// and leaves j.f nil until the next rotation tries again.
func (j *journal) startLocked(log *slog.Logger, now time.Time) {
	f, err := os.OpenFile(j.name, os.O_APPEND|os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		log.Error("spend: starting a new journal failed; will retry at the next rotation", "file", j.name, "err", err)
		return
	}
	j.f, j.size, j.broken, j.dirty, j.since = f, 0, false, false, now
}

// retire syncs and closes a journal file rotateLocked replaced.
func (j *journal) retire(f *os.File) {
	j.syncMu.Lock()
	defer j.syncMu.Unlock()
	_ = f.Sync()
	_ = f.Close()
}

// syncJournal fsyncs the journal if it was written since the last sync.
func (l *Local) syncJournal() error { return l.j.sync(&l.mu) }

// sync fsyncs the journal if it was written since the last sync; mu is
// the mutex its owner appends under.
func (j *journal) sync(mu *sync.Mutex) error {
	j.syncMu.Lock()
	defer j.syncMu.Unlock()
	mu.Lock()
	f, dirty := j.f, j.dirty
	j.dirty = false
	mu.Unlock()
	if f == nil || !dirty {
		return nil
	}
	if err := f.Sync(); err != nil {
		mu.Lock()
		j.dirty = true
		mu.Unlock()
		return fmt.Errorf("spend: syncing journal %s: %w", j.name, err)
	}
	return nil
}

// closeJournal syncs and closes the journal; Adds after it are not
// journaled.
func (l *Local) closeJournal() error { return l.j.close(&l.mu) }

// close syncs and closes the journal (mu as for sync); nothing is
// appended to it after.
func (j *journal) close(mu *sync.Mutex) error {
	j.syncMu.Lock()
	defer j.syncMu.Unlock()
	mu.Lock()
	f := j.f
	j.f, j.closed = nil, true
	mu.Unlock()
	if f == nil {
		return nil
	}
	err := errors.Join(f.Sync(), f.Close())
	if err != nil {
		return fmt.Errorf("spend: closing journal %s: %w", j.name, err)
	}
	return nil
}
