package spend

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-llm/tollgate/internal/redistest"
)

// crashFiles are a Redis ledger's files in one directory: journal, own part
// and spill file.
type crashFiles struct{ dir string }

func (c crashFiles) opts() RedisOptions {
	return RedisOptions{Journal: filepath.Join(c.dir, "spend.journal"), OwnFile: filepath.Join(c.dir, "own.json"),
		SpillFile: filepath.Join(c.dir, "spill.json"), ReplicaID: "rep"}
}

// snapshot copies every file of c into a new directory: what a process
// killed at this instant leaves on disk (the kernel keeps what write(2)
// returned for).
func (c crashFiles) snapshot(t *testing.T) crashFiles {
	t.Helper()
	to := crashFiles{dir: t.TempDir()}
	names, err := filepath.Glob(filepath.Join(c.dir, "*"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		data, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to.dir, filepath.Base(name)), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return to
}

// crashAt is a faults hook that, at the nth batch script (from 1), calls
// at before running it (before) or after it ran (after), and from then on
// is down: the process is dead to Redis.
type crashAt struct {
	faults
	n     int
	after bool
	at    func()
	runs  atomic.Int32
}

func (h *crashAt) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	run := h.faults.ProcessHook(next)
	return func(ctx context.Context, cmd redis.Cmder) error {
		script := cmd.Name() == "evalsha" || cmd.Name() == "eval"
		if h.down.Load() || !script || int(h.runs.Add(1)) != h.n {
			return run(ctx, cmd)
		}
		if !h.after {
			h.at()
			h.down.Store(true)
			return run(ctx, cmd)
		}
		err := run(ctx, cmd)
		h.at()
		h.down.Store(true)
		return err
	}
}

// TestRedisJournalKilledLosesNothing kills a journaled Redis ledger at each
// point of a flush (a copy of its files taken at that instant, the ledger
// then abandoned to Redis) and starts a new one on the copy: Redis ends
// with exactly the sum of every Add, nothing lost and nothing twice, and
// the own part agrees.
func TestRedisJournalKilledLosesNothing(t *testing.T) {
	applied := sampleAdds()                                // flushed and recorded before the kill
	cut := manyAdds(maxBatchRows+5, "b")                   // two batches, cut at the flush the kill cuts short
	later := append(manyAdds(3, "c"), sampleAdds()[:5]...) // added during that flush, after the cut
	for _, tc := range []struct {
		name  string
		n     int  // the batch script at which the kill happens; 0: before the cut
		after bool // after that script ran
	}{
		{"before the cut", 0, false},
		{"after the cut, before any batch is applied", 1, false},
		{"between the two batches", 2, false},
		{"after a batch is applied, before its applied record", 1, true},
		{"after both are applied, before their applied record", 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := startRedisServer(t, false)
			files := crashFiles{dir: t.TempDir()}
			var copied crashFiles
			var r1 *Redis
			h := &crashAt{after: tc.after, at: func() {
				addAll(r1, later)
				copied = files.snapshot(t)
			}}
			opts := files.opts()
			opts.FlushInterval = time.Hour
			r1, err := NewRedis(srv.Client(t, h), opts)
			if err != nil {
				t.Fatal(err)
			}
			addAll(r1, applied)
			flush(t, r1)
			addAll(r1, cut)
			if tc.n == 0 {
				h.at()
				h.down.Store(true)
			} else {
				h.n = int(h.runs.Load()) + tc.n
				// It fails, or succeeds when the kill came after its last
				// script: the copy was taken at the kill either way.
				_ = r1.Flush(context.Background())
				if copied.dir == "" {
					t.Fatal("the flush did not reach the kill")
				}
			}
			// The dead process's memory goes with it; its files stay.
			defer func() { _ = r1.Close() }()

			r2 := newRedis(t, srv.Client(t), copied.opts())
			flush(t, r2)
			all := slices.Concat(applied, cut, later)
			sameRows(t, r2, all)
			own, err := r2.QueryOwn(context.Background(), Filter{})
			if err != nil || !reflect.DeepEqual(own, expectRows(all, Filter{})) {
				t.Fatalf("own part after the replay differs from what was added (%v)", err)
			}
			// Everything is in Redis: Close removes the journal.
			if err := r2.Close(); err != nil {
				t.Fatal(err)
			}
			mustNotExist(t, copied.opts().Journal)
			mustNotExist(t, copied.opts().Journal+redisJournalPrev)
			r3 := newRedis(t, srv.Client(t), copied.opts())
			if r3.Pending() != 0 {
				t.Fatalf("a start after a clean Close has %d rows to send", r3.Pending())
			}
		})
	}
}

// TestRedisJournalRotates: the journal files hold only what the last
// flushes touched, not every Add since the start.
func TestRedisJournalRotates(t *testing.T) {
	srv := startRedisServer(t, false)
	files := crashFiles{dir: t.TempDir()}
	r := newRedis(t, srv.Client(t), files.opts())
	var size int64
	for i := range 6 {
		addAll(r, sampleAdds())
		flush(t, r)
		if i == 1 {
			size = journalBytes(t, files.opts().Journal)
		}
	}
	if got := journalBytes(t, files.opts().Journal); got > size*3/2 {
		t.Fatalf("journal files hold %d bytes after six flushes, %d after two: they grow", got, size)
	}
	copied := files.snapshot(t)
	r2 := newRedis(t, srv.Client(t), copied.opts())
	if r2.Pending() != 0 {
		t.Fatalf("a start on the files of a ledger that flushed everything has %d rows to send", r2.Pending())
	}
}

func journalBytes(t *testing.T, name string) int64 {
	t.Helper()
	var n int64
	for _, f := range []string{name, name + redisJournalPrev} {
		if fi, err := os.Stat(f); err == nil {
			n += fi.Size()
		}
	}
	return n
}

// startOutage starts a journaled ledger (with a spill file) on a fresh
// Redis, writes before to it, then makes Redis look down through h.
func startOutage(t *testing.T) (srv *redistest.Server, h *faults, files crashFiles, r *Redis, before []add) {
	srv = startRedisServer(t, false)
	h = &faults{}
	files = crashFiles{dir: t.TempDir()}
	r = newRedis(t, srv.Client(t, h), files.opts())
	before = sampleAdds()
	addAll(r, before)
	flush(t, r)
	h.down.Store(true)
	return srv, h, files, r, before
}

// TestRedisJournalSpillAtClose: a ledger closed while Redis is down spills
// what it could not send and removes its journal, and a start sends the
// spill file's batches once; a ledger killed in the outage instead leaves
// its journal, from which a start sends the same spend once.
func TestRedisJournalSpillAtClose(t *testing.T) {
	srv, _, files, r1, before := startOutage(t)
	down := manyAdds(maxBatchRows+3, "d") // two batches that fail
	addAll(r1, down)
	if err := r1.Flush(context.Background()); err == nil {
		t.Fatal("Flush with Redis down succeeded")
	}
	pending := manyAdds(4, "p")
	addAll(r1, pending)
	killed := files.snapshot(t)
	if err := r1.Close(); err == nil || !strings.Contains(err.Error(), "spill file") {
		t.Fatalf("Close with Redis down = %v, want the spill file named", err)
	}
	mustNotExist(t, files.opts().Journal)
	mustNotExist(t, files.opts().Journal+redisJournalPrev)
	all := slices.Concat(before, down, pending)

	r2 := newRedis(t, srv.Client(t), files.opts())
	flush(t, r2)
	sameRows(t, r2, all)

	// The killed one, on an empty Redis: its own part refills what it had
	// sent, its journal the rest.
	srv2 := startRedisServer(t, false)
	r3 := newRedis(t, srv2.Client(t), killed.opts())
	flush(t, r3)
	sameRows(t, r3, all)
}

// TestRedisJournalCorrupt: a torn last line is ignored; a corrupt line
// before the last stops the start, naming the file and the line.
func TestRedisJournalCorrupt(t *testing.T) {
	srv := startRedisServer(t, false)
	files := crashFiles{dir: t.TempDir()}
	r1 := newRedis(t, startRedisServer(t, false).Client(t), files.opts())
	adds := sampleAdds()[:4]
	addAll(r1, adds)
	good := files.snapshot(t)
	journal := good.opts().Journal
	data, err := os.ReadFile(journal)
	if err != nil {
		t.Fatal(err)
	}
	torn := good.snapshot(t)
	if err := os.WriteFile(torn.opts().Journal, append(slices.Clip(data), `{"seq":5,"at":1,"da`...), 0o600); err != nil {
		t.Fatal(err)
	}
	r2 := newRedis(t, srv.Client(t), torn.opts())
	flush(t, r2)
	sameRows(t, r2, adds)

	bad := good.snapshot(t)
	lines := strings.SplitAfter(string(data), "\n")
	lines[1] = `{"cut":["x"],"tag":"{tollgate:spend}","after":0,"last":0,"max":1}` + "\n"
	if err := os.WriteFile(bad.opts().Journal, []byte(strings.Join(lines, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = NewRedis(srv.Client(t), bad.opts())
	if err == nil || !strings.Contains(err.Error(), bad.opts().Journal) || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("NewRedis on a journal with a corrupt second line = %v, want an error naming the file and line 2", err)
	}
}

// sameRows fails unless Redis holds exactly the sum of adds, saying how
// many rows and requests differ rather than printing them all.
func sameRows(t *testing.T, r *Redis, adds []add) {
	t.Helper()
	got, err := r.Query(context.Background(), Filter{})
	if err != nil {
		t.Fatal(err)
	}
	want := expectRows(adds, Filter{})
	if reflect.DeepEqual(got, want) {
		return
	}
	var g, w Totals
	for _, row := range got {
		g.Add(row.Totals)
	}
	for _, row := range want {
		w.Add(row.Totals)
	}
	t.Fatalf("Redis holds %d rows, %d requests, cost %d; want %d rows, %d requests, cost %d",
		len(got), g.Requests, g.CostMicros, len(want), w.Requests, w.CostMicros)
}

// TestRedisJournalBoundedInOutage: while Redis is down the journal cannot
// rotate, so past its bound the flusher spills and rotates it; the files
// stay bounded, and a kill then loses nothing and counts nothing twice.
func TestRedisJournalBoundedInOutage(t *testing.T) {
	srv, h, files, r1, before := startOutage(t)
	r1.journalMax = 20 << 10 // about 80 Adds
	var during []add
	for i := range 20 {
		adds := manyAdds(50, "o"+strconv.Itoa(i))
		addAll(r1, adds)
		during = append(during, adds...)
		if err := r1.Flush(context.Background()); err == nil {
			t.Fatal("Flush with Redis down succeeded")
		}
		if n := journalBytes(t, files.opts().Journal); n > 2*r1.journalMax+(20<<10) {
			t.Fatalf("after %d failed flushes the journal files hold %d bytes, bound %d", i+1, n, r1.journalMax)
		}
	}
	if _, err := os.Stat(files.opts().SpillFile); err != nil {
		t.Fatalf("no spill file after the journal outgrew its bound: %v", err)
	}
	later := manyAdds(5, "l")
	addAll(r1, later)
	killed := files.snapshot(t)
	h.down.Store(false)

	r2 := newRedis(t, srv.Client(t), killed.opts())
	flush(t, r2)
	sameRows(t, r2, slices.Concat(before, during, later))
	mustNotExist(t, killed.opts().SpillFile)
}
