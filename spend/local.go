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

// stateVersion is the version of the state file format.
const stateVersion = 1

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
	// Logger receives background flush errors; nil discards them.
	Logger *slog.Logger
	// Now stamps the state file's saved_at; nil means time.Now.
	Now func() time.Time
}

// Local is a Ledger kept in the process: a map under a mutex, written to a
// state file atomically (temporary file, fsync, rename, fsync of the
// directory) every FlushInterval when it changed, and on Flush and Close.
type Local struct {
	file     string
	interval time.Duration
	log      *slog.Logger
	now      func() time.Time

	mu      sync.Mutex
	rows    map[Key]*Totals // pointers, so Add to an existing row does not allocate
	changes uint64          // Adds so far, to tell whether a write is due

	writeMu sync.Mutex // serialises state file writes
	saved   uint64     // changes covered by the last write; under writeMu

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
}

var _ Ledger = (*Local)(nil)

// NewLocal returns a Local ledger holding the rows of opts.StateFile if it
// exists. A state file that cannot be read or decoded is an error: the
// ledger is never silently reset. With a state file, one goroutine writes it
// periodically until Close.
func NewLocal(opts LocalOptions) (*Local, error) {
	l := &Local{
		file:     opts.StateFile,
		interval: opts.FlushInterval,
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
	l.stop, l.done = make(chan struct{}), make(chan struct{})
	go l.flusher()
	return l, nil
}

// stateFile is the JSON form of the state file.
type stateFile struct {
	Version int        `json:"version"`
	SavedAt time.Time  `json:"saved_at"`
	Rows    []stateRow `json:"rows"`
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
	if st.Version != stateVersion {
		return fmt.Errorf("spend: state file %s has version %d, want %d", l.file, st.Version, stateVersion)
	}
	for i, r := range st.Rows {
		if _, err := time.Parse(DayLayout, r.Day); err != nil {
			return fmt.Errorf("spend: state file %s is corrupt: row %d: day %q: %w", l.file, i, r.Day, err)
		}
		k := Key{Day: r.Day, KeyID: r.KeyID, Team: r.Team, Model: r.Model}
		t := l.rows[k]
		if t == nil {
			t = new(Totals)
			l.rows[k] = t
		}
		t.Add(Totals{Requests: r.Requests, Input: r.Input, Output: r.Output, CacheRead: r.CacheRead,
			CacheWrite: r.CacheWrite, Reasoning: r.Reasoning, CostMicros: r.CostMicros})
	}
	return nil
}

// Add records t under k. It takes a mutex and allocates only for a new row.
func (l *Local) Add(k Key, t Totals) {
	l.mu.Lock()
	r := l.rows[k]
	if r == nil {
		r = new(Totals)
		l.rows[k] = r
	}
	r.Add(t)
	l.changes++
	l.mu.Unlock()
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

// Flush writes the state file if anything changed since the last write. It
// is a no-op without a state file.
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
	changes := l.changes
	if changes == l.saved {
		l.mu.Unlock()
		return nil
	}
	rows := make([]Row, 0, len(l.rows))
	for k, t := range l.rows {
		rows = append(rows, Row{Key: k, Totals: *t})
	}
	l.mu.Unlock()

	// Sorted rows make the file stable and diffable.
	sortRows(rows)
	st := stateFile{Version: stateVersion, SavedAt: l.now().UTC(), Rows: make([]stateRow, len(rows))}
	for i, r := range rows {
		st.Rows[i] = stateRow{Day: r.Day, Team: r.Team, KeyID: r.KeyID, Model: r.Model,
			Requests: r.Requests, Input: r.Input, Output: r.Output, CacheRead: r.CacheRead,
			CacheWrite: r.CacheWrite, Reasoning: r.Reasoning, CostMicros: r.CostMicros}
	}
	data, err := json.MarshalIndent(st, "", " ")
	if err != nil {
		return fmt.Errorf("spend: encoding state file: %w", err)
	}
	if err := writeAtomic("state file", l.file, append(data, '\n')); err != nil {
		return err
	}
	l.saved = changes
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

// flusher writes the state file every interval until Close.
func (l *Local) flusher() {
	defer close(l.done)
	tick := time.NewTicker(l.interval)
	defer tick.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-tick.C:
			if err := l.Flush(context.Background()); err != nil {
				l.log.Error("spend: periodic write of the state file failed; will retry", "err", err)
			}
		}
	}
}

// Close stops the periodic writer and writes the state file one last time.
// Later calls return the first call's result. Adds after Close stay in
// memory and are written only by an explicit Flush.
func (l *Local) Close() error {
	l.closeOnce.Do(func() {
		if l.stop != nil {
			close(l.stop)
			<-l.done
		}
		l.closeErr = l.Flush(context.Background())
	})
	return l.closeErr
}
