package spend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/tollgate-llm/tollgate/internal/atomicfile"
)

// stateVersion is the version of the state file format: 2 adds seq (1 is
// read as seq 0).
const stateVersion = 2

// defaultFlushInterval is [spend] flush_interval_seconds' default.
const defaultFlushInterval = 2 * time.Second

// LocalOptions configure a Local ledger. The zero value keeps the ledger in
// memory only.
type LocalOptions struct {
	// StateFile is where the ledger is kept across restarts; "" keeps it in
	// memory only. Its directory must exist.
	StateFile string
	// FlushInterval is how often the state file is written when something
	// changed; zero or less means 2 s.
	FlushInterval time.Duration
	// Journal, with a StateFile, appends every Add to StateFile+".journal"
	// before it counts, so that a process that dies between two state
	// writes loses nothing it added (see Local). false keeps the ledger in
	// the state file only: a crash loses the Adds since its last write.
	Journal bool
	// JournalSync is how often the journal is fsynced when it was written
	// since, against a crash of the machine (a power failure): one that
	// loses what the kernel had not written to disk loses up to
	// JournalSync of Adds. A process that is killed loses nothing either
	// way. Zero or less syncs it only when it is replaced and at Close.
	JournalSync time.Duration
	// OnReplay, with a Journal, receives every line NewLocal reads from the
	// journal files, those the state file already holds too, in the order
	// they were added, before NewLocal returns: at least the Adds of the
	// last minute, with their admission times (cmd/gateway restores the
	// in-process rate limits from them). nil: not called.
	OnReplay func(Entry)
	// Logger receives background flush errors; nil discards them.
	Logger *slog.Logger
	// Now stamps the state file's saved_at; nil means time.Now.
	Now func() time.Time
}

// Local is a Ledger kept in the process: a map under a mutex, written to a
// state file atomically (temporary file, fsync, rename, fsync of the
// directory) every FlushInterval when it changed, and on Flush and Close.
//
// With a journal, every Add is first appended to it as one line, with one
// write(2) under the mutex into the kernel's page cache (no buffer in the
// process, no fsync on the way), so an Add that returned is in the file
// even if the process is killed the next instant; the journal is fsynced
// every JournalSync. A start loads the state file, then adds the journal's
// lines numbered after the state file's seq (the last Add it holds), so
// nothing counts twice. Lines are removed only once a state file holding
// them was written, and not before they are a minute old (see journal.go).
// What Add is never called for, a request admitted but not yet billed when
// the process died, is in neither. A journal write that fails is logged and
// the Add counts in memory: the next state write holds it.
type Local struct {
	file     string
	interval time.Duration
	sync     time.Duration
	log      *slog.Logger
	now      func() time.Time

	mu   sync.Mutex
	rows map[Key]*Totals // pointers, so Add to an existing row does not allocate
	seq  uint64          // the last Add's number, across restarts with a state file
	j    *journal        // nil without one; its fields are under mu

	writeMu sync.Mutex // serialises state file writes
	saved   uint64     // seq held by the state file on disk; written under writeMu and mu

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
}

var _ Ledger = (*Local)(nil)

// NewLocal returns a Local ledger holding the rows of opts.StateFile if it
// exists, and with a journal the Adds its journal holds beyond them. A state
// file that cannot be read or decoded is an error, and so is a journal line
// that does not decode, but for a torn last line (a crash in the middle of
// its write), which is ignored with a warning: the ledger is never silently
// reset. With a state file, one goroutine writes it periodically (and
// fsyncs the journal) until Close.
func NewLocal(opts LocalOptions) (*Local, error) {
	l := &Local{
		file:     opts.StateFile,
		interval: opts.FlushInterval,
		sync:     opts.JournalSync,
		log:      opts.Logger,
		now:      opts.Now,
		rows:     make(map[Key]*Totals),
	}
	if l.interval <= 0 {
		l.interval = defaultFlushInterval
	}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	if l.now == nil {
		l.now = time.Now
	}
	if l.file == "" {
		return l, nil
	}
	if err := l.load(); err != nil {
		return nil, err
	}
	if opts.Journal {
		l.j = &journal{name: l.file + journalSuffix, prev: l.file + prevSuffix, keep: journalKeep}
		if err := l.replayJournal(opts.OnReplay); err != nil {
			return nil, err
		}
	}
	l.stop, l.done = make(chan struct{}), make(chan struct{})
	go l.flusher()
	return l, nil
}

// stateFile is the JSON form of the state file.
type stateFile struct {
	Version int       `json:"version"`
	SavedAt time.Time `json:"saved_at"`
	// Seq is the number of the last Add the rows hold.
	Seq  uint64     `json:"seq"`
	Rows []stateRow `json:"rows"`
}

type stateRow struct {
	Day        string `json:"day"`
	Team       string `json:"team"`
	KeyID      string `json:"key_id"`
	Model      string `json:"model"`
	Requests   int64  `json:"requests"`
	Input      int64  `json:"input"`
	Output     int64  `json:"output"`
	CacheRead  int64  `json:"cache_read"`
	CacheWrite int64  `json:"cache_write"`
	Reasoning  int64  `json:"reasoning"`
	CostMicros int64  `json:"cost_micros"`
}

// load reads the state file into l.rows; a missing file is an empty ledger.
func (l *Local) load() error {
	data, err := os.ReadFile(l.file)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("spend: reading state file %s: %w", l.file, err)
	}
	var st stateFile
	if err := atomicfile.DecodeJSON(data, &st); err != nil {
		return fmt.Errorf("spend: state file %s is corrupt: %w", l.file, err)
	}
	if st.Version != stateVersion && st.Version != 1 {
		return fmt.Errorf("spend: state file %s has version %d, want %d", l.file, st.Version, stateVersion)
	}
	l.seq, l.saved = st.Seq, st.Seq
	for i, r := range st.Rows {
		row, err := r.checkedRow()
		if err != nil {
			return fmt.Errorf("spend: state file %s is corrupt: row %d: %w", l.file, i, err)
		}
		l.addLocked(row.Key, row.Totals)
	}
	return nil
}

// checkedRow is r's row, its day checked.
func (r stateRow) checkedRow() (Row, error) {
	if _, err := time.Parse(DayLayout, r.Day); err != nil {
		return Row{}, fmt.Errorf("day %q: %w", r.Day, err)
	}
	return r.row(), nil
}

// Add records t under k. It takes a mutex and allocates only for a new
// row; with a journal, it first appends t's line there with one write
// (about a microsecond, no fsync) and records admitted (the zero time:
// now) for OnReplay.
func (l *Local) Add(k Key, t Totals, admitted time.Time) {
	l.mu.Lock()
	l.seq++
	if l.j != nil && !l.j.closed {
		l.appendLocked(k, t, admitted)
	}
	l.addLocked(k, t)
	l.mu.Unlock()
}

// addLocked adds t to k's row.
func (l *Local) addLocked(k Key, t Totals) {
	r := l.rows[k]
	if r == nil {
		r = new(Totals)
		l.rows[k] = r
	}
	r.Add(t)
}

// Query returns the matching rows sorted by day, team, key and model.
func (l *Local) Query(ctx context.Context, f Filter) ([]Row, error) {
	if err := f.validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("spend: query: %w", err)
	}
	var rows []Row
	l.mu.Lock()
	for k, t := range l.rows {
		if f.match(k) {
			rows = append(rows, Row{Key: k, Totals: *t})
		}
	}
	l.mu.Unlock()
	sortRows(rows)
	return rows, nil
}

// Flush writes the state file if anything changed since the last write,
// and first, with a journal, replaces the journal if it is due (see
// journal.go). It is a no-op without a state file.
func (l *Local) Flush(ctx context.Context) error {
	if l.file == "" {
		return nil
	}
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("spend: flush: %w", err)
	}
	l.mu.Lock()
	seq := l.seq
	if seq == l.saved {
		l.mu.Unlock()
		return nil
	}
	// Rotated here, with the snapshot, the journal files hold nothing
	// beyond seq: once the state file is written, both are in it.
	retired := l.rotateLocked()
	rows := make([]Row, 0, len(l.rows))
	for k, t := range l.rows {
		rows = append(rows, Row{Key: k, Totals: *t})
	}
	l.mu.Unlock()
	if retired != nil {
		l.j.retire(retired)
	}

	// Sorted rows make the file stable and diffable.
	sortRows(rows)
	st := stateFile{Version: stateVersion, SavedAt: l.now().UTC(), Seq: seq, Rows: make([]stateRow, len(rows))}
	for i, r := range rows {
		st.Rows[i] = toStateRow(r)
	}
	data, err := json.MarshalIndent(st, "", " ")
	if err != nil {
		return fmt.Errorf("spend: encoding state file: %w", err)
	}
	if err := writeAtomic("state file", l.file, append(data, '\n')); err != nil {
		return err
	}
	l.mu.Lock()
	l.saved = seq
	l.mu.Unlock()
	return nil
}

// writeAtomic replaces name, a file described as what in errors, with data
// (atomicfile.Write: a crash leaves the old file or the new one).
func writeAtomic(what, name string, data []byte) error {
	if err := atomicfile.Write(name, data); err != nil {
		return fmt.Errorf("spend: writing %s %s: %w", what, name, err)
	}
	return nil
}

// flusher writes the state file every interval, and fsyncs the journal
// every sync, until Close.
func (l *Local) flusher() {
	defer close(l.done)
	tick := time.NewTicker(l.interval)
	defer tick.Stop()
	var syncC <-chan time.Time
	if l.j != nil && l.sync > 0 {
		st := time.NewTicker(l.sync)
		defer st.Stop()
		syncC = st.C
	}
	for {
		select {
		case <-l.stop:
			return
		case <-tick.C:
			if err := l.Flush(context.Background()); err != nil {
				l.log.Error("spend: periodic write of the state file failed; will retry", "err", err)
			}
		case <-syncC:
			if err := l.syncJournal(); err != nil {
				l.log.Error("spend: fsync of the journal failed; will retry", "err", err)
			}
		}
	}
}

// Close stops the periodic writer, writes the state file one last time and
// syncs and closes the journal. Later calls return the first call's result.
// Adds after Close stay in memory and are written only by an explicit Flush
// (not to the journal).
func (l *Local) Close() error {
	l.closeOnce.Do(func() {
		if l.stop != nil {
			close(l.stop)
			<-l.done
		}
		l.closeErr = l.Flush(context.Background())
		if l.j != nil {
			l.closeErr = errors.Join(l.closeErr, l.closeJournal())
		}
	})
	return l.closeErr
}
