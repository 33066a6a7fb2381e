package ownership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/tollgate-llm/tollgate/internal/atomicfile"
	"github.com/tollgate-llm/tollgate/internal/jsonl"
)

const (
	// compactSlack is how many journal lines beyond twice the records the
	// journal may hold before it is rewritten.
	compactSlack = 4096
	// minSweep is the fewest records at which a Claim sweeps expired ones.
	minSweep = 1024
)

// ErrClosed is returned by a Local's methods after Close.
var ErrClosed = errors.New("ownership: store is closed")

// LocalOptions configure a Local store. The zero value keeps the records in
// memory only.
type LocalOptions struct {
	File   string           // journal path; "" keeps records in memory only. Its directory must exist.
	Now    func() time.Time // nil: time.Now (tests inject a clock)
	Logger *slog.Logger     // nil: discard
}

// Local is a Store kept in the process: a map from id to owner and expiry
// under a mutex. With a journal file, it survives a restart: every Claim
// that changes or renews a record and every Release that removes one
// appends one JSON line to the file with a single write before returning,
// so a process that crashes loses nothing a Claim acknowledged. The file is
// not fsynced per line: a machine crash can lose what was still in the page
// cache (Close syncs it). A failed write fails the Claim and the record is
// not kept: a refused request is better than an owner nobody recorded.
//
// The journal is rewritten with only the live records when it is opened and
// whenever it holds more than twice as many lines as records plus 4096. It
// must belong to one Local in one process.
//
// Expiry is kept to the nanosecond in memory and to the second, rounded up,
// in the journal, so a reloaded record may live up to a second longer.
type Local struct {
	file string
	now  func() time.Time
	log  *slog.Logger

	mu      sync.Mutex
	closed  bool
	recs    map[string]record
	owners  map[string]string // interned owners: many records share one
	sweepAt int               // len(recs) at which the next Claim of a new id sweeps

	// The journal; nil f with file set means it must be rewritten before
	// the next line (a reopen failed).
	f       *os.File
	broken  bool  // a failed write may have left a torn line that could not be cut
	size    int64 // bytes in the journal
	lines   int   // lines in the journal
	retryAt int   // after a failed rewrite, lines before the next attempt
	buf     []byte
}

// record is an id's owner and expiry in unix nanoseconds, 0 for none.
type record struct {
	owner string
	exp   int64
}

func (r record) live(now int64) bool { return r.exp == 0 || r.exp > now }

var _ Store = (*Local)(nil)

// NewLocal returns a Local store holding the live records of opts.File, if
// it exists, and rewrites the file with only those before opening it for
// appending. A journal line that cannot be decoded is an error, except a
// torn last line, which a crash in the middle of a write leaves and which is
// ignored with a warning.
func NewLocal(opts LocalOptions) (*Local, error) {
	l := &Local{
		file:    opts.File,
		now:     opts.Now,
		log:     opts.Logger,
		recs:    make(map[string]record),
		owners:  make(map[string]string),
		sweepAt: minSweep,
	}
	if l.now == nil {
		l.now = time.Now
	}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	if l.file == "" {
		return l, nil
	}
	if err := l.loadJournal(); err != nil {
		return nil, err
	}
	if err := l.compactLocked(); err != nil {
		return nil, err
	}
	return l, nil
}

// Claim implements Store. A claim that changes the journal's record writes
// one line before it returns; a renewal that leaves the journal's expiry,
// in whole seconds, as it was writes none.
func (l *Local) Claim(ctx context.Context, id, owner string, ttl time.Duration) (string, error) {
	if err := checkID(id); err != nil {
		return "", err
	}
	if err := checkOwner(owner); err != nil {
		return "", err
	}
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("ownership: claim: %w", err)
	}
	now := l.now().UnixNano()
	exp := expiry(now, ttl)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return "", ErrClosed
	}
	cur, held := l.recs[id]
	held = held && cur.live(now)
	if held && cur.owner != owner {
		return cur.owner, nil
	}
	if held && cur.exp == exp {
		return owner, nil
	}
	if l.file != "" && !(held && journalExp(cur.exp) == journalExp(exp)) {
		l.buf = appendClaimLine(l.buf[:0], id, owner, exp)
		if err := l.appendLocked(l.buf); err != nil {
			return "", err
		}
	}
	o := cur.owner
	if !held {
		o = l.intern(owner)
	}
	// A fresh copy of the id: the map keeps the key of the last assignment,
	// and the caller's id may point into a whole upstream body.
	l.recs[strings.Clone(id)] = record{owner: o, exp: exp}
	// Memory must not fill with expired records: once the map has doubled
	// since the last sweep (and holds at least minSweep), a Claim sweeps
	// them, which costs O(1) per Claim amortised.
	if len(l.recs) >= l.sweepAt {
		l.sweepLocked(now)
	}
	l.maybeCompactLocked()
	return owner, nil
}

// Owner implements Store. An expired record is deleted here.
func (l *Local) Owner(ctx context.Context, id string) (string, error) {
	if err := checkID(id); err != nil {
		return "", err
	}
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("ownership: owner: %w", err)
	}
	now := l.now().UnixNano()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return "", ErrClosed
	}
	r, ok := l.recs[id]
	if !ok {
		return "", nil
	}
	if !r.live(now) {
		delete(l.recs, id)
		return "", nil
	}
	return r.owner, nil
}

// Release implements Store. Removing a record writes one line before it
// returns; if that write fails the record is kept and the error returned.
func (l *Local) Release(ctx context.Context, id, owner string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if err := checkOwner(owner); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("ownership: release: %w", err)
	}
	now := l.now().UnixNano()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	r, ok := l.recs[id]
	if !ok {
		return nil
	}
	if !r.live(now) {
		delete(l.recs, id)
		return nil
	}
	if r.owner != owner {
		return nil
	}
	if l.file != "" {
		l.buf = appendReleaseLine(l.buf[:0], id)
		if err := l.appendLocked(l.buf); err != nil {
			return err
		}
	}
	delete(l.recs, id)
	l.maybeCompactLocked()
	return nil
}

// Close implements Store: it syncs and closes the journal. Later calls
// return ErrClosed; a second Close returns nil.
func (l *Local) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	l.recs, l.owners = nil, nil
	if l.f == nil {
		return nil
	}
	err := l.f.Sync()
	err = errors.Join(err, l.f.Close())
	l.f = nil
	if err != nil {
		return fmt.Errorf("ownership: closing journal %s: %w", l.file, err)
	}
	return nil
}

// expiry is the unix-nanosecond expiry of a claim at now for ttl; 0 for
// none. It saturates rather than overflows, and is never 0 for a ttl.
func expiry(now int64, ttl time.Duration) int64 {
	if ttl <= 0 {
		return 0
	}
	if now > math.MaxInt64-int64(ttl) {
		return math.MaxInt64
	}
	return max(now+int64(ttl), 1)
}

// intern returns the store's copy of owner, so records of one owner share
// one string and none points into a caller's larger buffer.
func (l *Local) intern(owner string) string {
	if o, ok := l.owners[owner]; ok {
		return o
	}
	o := strings.Clone(owner)
	l.owners[o] = o
	return o
}

// sweepLocked deletes expired records, rebuilds the interned owners from
// the live ones and sets the size of the next sweep.
func (l *Local) sweepLocked(now int64) {
	owners := make(map[string]string, len(l.owners))
	for id, r := range l.recs {
		if !r.live(now) {
			delete(l.recs, id)
			continue
		}
		owners[r.owner] = r.owner
	}
	l.owners = owners
	l.sweepAt = max(2*len(l.recs), minSweep)
}

// appendLocked writes line to the journal with one write. A write that
// fails after writing part of the line cuts the journal back to its old
// size; if that fails too, the journal is rewritten before the next line.
func (l *Local) appendLocked(line []byte) error {
	if l.f == nil || l.broken {
		if err := l.compactLocked(); err != nil {
			return err
		}
	}
	whole, err := jsonl.Append(l.f, l.size, line)
	if err != nil {
		l.broken = !whole
		return fmt.Errorf("ownership: writing journal %s: %w", l.file, err)
	}
	l.size += int64(len(line))
	l.lines++
	return nil
}

// maybeCompactLocked rewrites the journal once it holds more than
// 2×records+compactSlack lines. A failed rewrite is logged and tried again
// compactSlack lines later; the old journal is still whole and in use.
func (l *Local) maybeCompactLocked() {
	if l.file == "" || l.lines <= 2*len(l.recs)+compactSlack || l.lines < l.retryAt {
		return
	}
	if err := l.compactLocked(); err != nil {
		l.retryAt = l.lines + compactSlack
		l.log.Warn("ownership: rewriting the journal failed", "file", l.file, "error", err)
	}
}

// compactLocked drops expired records and replaces the journal with one
// line per live record (atomically: a crash leaves the old or the new
// file), then opens it for appending.
func (l *Local) compactLocked() error {
	l.sweepLocked(l.now().UnixNano())
	buf := make([]byte, 0, len(l.recs)*96)
	for id, r := range l.recs {
		buf = appendClaimLine(buf, id, r.owner, r.exp)
	}
	if err := atomicfile.Write(l.file, buf); err != nil {
		return fmt.Errorf("ownership: rewriting journal %s: %w", l.file, err)
	}
	// The old descriptor, if any, names the replaced file: never write to it again.
	if l.f != nil {
		_ = l.f.Close()
		l.f = nil
	}
	f, err := os.OpenFile(l.file, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("ownership: opening journal %s: %w", l.file, err)
	}
	l.f, l.broken = f, false
	l.size, l.lines, l.retryAt = int64(len(buf)), len(l.recs), 0
	return nil
}
