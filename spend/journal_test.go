package spend

import (
	"bytes"
	"context"
	"errors"

	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// logBuffer collects a logger's text output, safe for the flusher's use.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// fakeClock is a settable clock for the journal's age.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// journalOpts are the options of a journaled ledger on file that writes
// only when told.
func journalOpts(file string, clock *fakeClock, replayed *[]Entry) LocalOptions {
	o := LocalOptions{StateFile: file, FlushInterval: time.Hour, Journal: true, Now: clock.Now}
	if replayed != nil {
		o.OnReplay = func(e Entry) { *replayed = append(*replayed, e) }
	}
	return o
}

// killCopy copies what a process killed now would leave on disk (the state
// file, or state when it is not nil, and both journal files, as the kernel
// holds them) into a new directory, and returns the state file's path
// there. The ledger that wrote them keeps running, as if it were another
// process's.
func killCopy(t *testing.T, file string, state []byte) string {
	t.Helper()
	dir := t.TempDir()
	for _, suffix := range []string{"", journalSuffix, prevSuffix} {
		b, err := os.ReadFile(file + suffix)
		if suffix == "" && state != nil {
			b, err = state, nil
		}
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(file)+suffix), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, filepath.Base(file))
}

func addAt(l *Local, adds []add, at time.Time) {
	for i, a := range adds {
		l.Add(a.k, a.t, at.Add(time.Duration(i)*time.Millisecond))
	}
}

func flushOK(t *testing.T, l *Local) {
	t.Helper()
	if err := l.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestJournalKillLosesNothing: a ledger killed after a state write and
// more Adds restarts with every Add it returned from, and hands each to
// OnReplay with its admission time, in order.
func TestJournalKillLosesNothing(t *testing.T) {
	clock := newFakeClock()
	file := filepath.Join(t.TempDir(), "spend.json")
	adds := sampleAdds()
	l := newLocal(t, journalOpts(file, clock, nil))
	addAt(l, adds[:100], clock.Now())
	flushOK(t, l)
	addAt(l, adds[100:], clock.Now().Add(time.Second))

	var replayed []Entry
	l2 := newLocal(t, journalOpts(killCopy(t, file, nil), clock, &replayed))
	checkQueries(t, l2, adds)
	if len(replayed) != len(adds) {
		t.Fatalf("OnReplay got %d entries, want %d", len(replayed), len(adds))
	}
	for i, e := range replayed {
		at := clock.Now().Add(time.Duration(i) * time.Millisecond)
		if i >= 100 {
			at = clock.Now().Add(time.Second + time.Duration(i-100)*time.Millisecond)
		}
		if e.Seq != uint64(i+1) || e.Key != adds[i].k || e.Totals != adds[i].t || !e.Admitted.Equal(at) {
			t.Fatalf("entry %d = %+v, want seq %d, %+v %+v at %v", i, e, i+1, adds[i].k, adds[i].t, at)
		}
	}
}

// TestJournalCountsNothingTwice: the journal outlives the state writes
// that hold its lines (for the rate limits' sake), and every start, after a
// kill or a clean Close, adds only the lines after the state file's seq.
func TestJournalCountsNothingTwice(t *testing.T) {
	clock := newFakeClock()
	file := filepath.Join(t.TempDir(), "spend.json")
	adds := sampleAdds()
	l := newLocal(t, journalOpts(file, clock, nil))
	addAt(l, adds[:50], clock.Now())
	flushOK(t, l)
	addAt(l, adds[50:80], clock.Now())
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		var replayed []Entry
		again := newLocal(t, journalOpts(file, clock, &replayed))
		checkQueries(t, again, adds[:80])
		if len(replayed) != 80 {
			t.Fatalf("OnReplay got %d entries, want all 80 the journal holds", len(replayed))
		}
		if err := again.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// Seqs go on from the state file: a kill now replays only the new Adds.
	l3 := newLocal(t, journalOpts(file, clock, nil))
	addAt(l3, adds[80:], clock.Now())
	checkQueries(t, newLocal(t, journalOpts(killCopy(t, file, nil), clock, nil)), adds)
}

// TestJournalRotation: a state write replaces the journal once it has
// been appended to for a minute and the previous one is in a state file;
// what a restart reads always covers the last minute, and nothing is
// counted twice or lost across rotations.
func TestJournalRotation(t *testing.T) {
	clock := newFakeClock()
	file := filepath.Join(t.TempDir(), "spend.json")
	adds := sampleAdds()
	l := newLocal(t, journalOpts(file, clock, nil))
	lines := func(name string) int {
		b, err := os.ReadFile(name)
		if errors.Is(err, os.ErrNotExist) {
			return -1
		}
		if err != nil {
			t.Fatal(err)
		}
		return bytes.Count(b, []byte("\n"))
	}
	addAt(l, adds[:10], clock.Now())
	flushOK(t, l) // too young: no rotation
	if j, p := lines(file+journalSuffix), lines(file+prevSuffix); j != 10 || p != -1 {
		t.Fatalf("after a state write at 0 s: journal %d lines, previous %d; want 10, none", j, p)
	}
	clock.Advance(time.Minute)
	addAt(l, adds[10:20], clock.Now())
	flushOK(t, l)
	if j, p := lines(file+journalSuffix), lines(file+prevSuffix); j != 0 || p != 20 {
		t.Fatalf("after a state write at 60 s: journal %d lines, previous %d; want 0, 20", j, p)
	}
	addAt(l, adds[20:30], clock.Now())
	var replayed []Entry
	checkQueries(t, newLocal(t, journalOpts(killCopy(t, file, nil), clock, &replayed)), adds[:30])
	if len(replayed) != 30 {
		t.Fatalf("a kill after one rotation replays %d lines, want 30", len(replayed))
	}
	clock.Advance(time.Minute)
	addAt(l, adds[30:40], clock.Now())
	flushOK(t, l)
	if j, p := lines(file+journalSuffix), lines(file+prevSuffix); j != 0 || p != 20 {
		t.Fatalf("after a state write at 120 s: journal %d lines, previous %d; want 0, 20 (the lines of 60 s to 120 s)", j, p)
	}
	addAt(l, adds[40:], clock.Now())
	replayed = nil
	checkQueries(t, newLocal(t, journalOpts(killCopy(t, file, nil), clock, &replayed)), adds)
	if want := 20 + len(adds) - 40; len(replayed) != want || replayed[0].Seq != 21 {
		t.Fatalf("replayed %d lines from seq %d, want %d from 21", len(replayed), replayed[0].Seq, want)
	}
}

// TestJournalKeptUntilAStateFileHoldsIt: while state writes fail, the
// previous journal is kept however old, so a kill loses nothing; once one
// succeeds, rotation resumes.
func TestJournalKeptUntilAStateFileHoldsIt(t *testing.T) {
	clock := newFakeClock()
	file := filepath.Join(t.TempDir(), "spend.json")
	adds := sampleAdds()
	l := newLocal(t, journalOpts(file, clock, nil))
	addAt(l, adds[:10], clock.Now())
	flushOK(t, l)
	state, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	// The state file's path becomes a non-empty directory: writes fail
	// (and what a kill would leave is the state file read above).
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(file, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		clock.Advance(time.Minute)
		addAt(l, adds[10*i:10*i+10], clock.Now())
		if err := l.Flush(context.Background()); err == nil {
			t.Fatal("a state write onto a directory succeeded")
		}
	}
	// The first failing write rotated (the journal had no predecessor);
	// the next two could not: the previous journal is in no state file.
	if p, j := seqsOf(t, file+prevSuffix), seqsOf(t, file+journalSuffix); len(p) != 20 || p[0] != 1 || len(j) != 20 || j[0] != 21 {
		t.Fatalf("previous journal holds seqs %v, journal %v; want 1-20 and 21-40", p, j)
	}
	checkQueries(t, newLocal(t, journalOpts(killCopy(t, file, state), clock, nil)), adds[:40])

	if err := os.RemoveAll(file); err != nil {
		t.Fatal(err)
	}
	flushOK(t, l)
	clock.Advance(time.Minute)
	addAt(l, adds[40:], clock.Now())
	flushOK(t, l)
	if p, j := seqsOf(t, file+prevSuffix), seqsOf(t, file+journalSuffix); len(p) == 0 || p[0] != 21 || len(j) != 0 {
		t.Fatalf("after a state write succeeded: previous journal holds seqs %v, journal %v; want 21-%d, none", p, j, len(adds))
	}
	checkQueries(t, newLocal(t, journalOpts(killCopy(t, file, nil), clock, nil)), adds)
}

// seqsOf returns the seqs of the journal file name's lines.
func seqsOf(t *testing.T, name string) []uint64 {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for line := range bytes.Lines(b) {
		e, err := parseEntry(line)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		seqs = append(seqs, e.Seq)
	}
	return seqs
}

// journalOf returns the journal lines of adds, seqs from 1.
func journalOf(adds []add, at time.Time) []byte {
	var b []byte
	for i, a := range adds {
		b = appendEntry(b, uint64(i+1), at.UnixNano(), a.k, a.t)
	}
	return b
}

// TestJournalTornAtEveryByte: a journal cut anywhere in its last line (a
// kill or a crash in the middle of the write) opens with every whole line
// and without the torn one, warns, and cuts it off, so that the next line
// appended and the start after it are whole.
func TestJournalTornAtEveryByte(t *testing.T) {
	clock := newFakeClock()
	adds := sampleAdds()[:3]
	whole := journalOf(adds, clock.Now())
	lastStart := len(journalOf(adds[:2], clock.Now()))
	for cut := lastStart; cut <= len(whole); cut++ {
		file := filepath.Join(t.TempDir(), "spend.json")
		if err := os.WriteFile(file+journalSuffix, whole[:cut], 0o600); err != nil {
			t.Fatal(err)
		}
		var logs logBuffer
		opts := journalOpts(file, clock, nil)
		opts.Logger = logs.logger()
		l, err := NewLocal(opts)
		if err != nil {
			t.Fatalf("cut at %d of %d: %v", cut, len(whole), err)
		}
		want := adds[:2]
		if cut == len(whole) {
			want = adds
		}
		checkQueries(t, l, want)
		if torn := cut > lastStart && cut < len(whole); torn != strings.Contains(logs.String(), "torn last line") {
			t.Fatalf("cut at %d of %d: torn %v, log:\n%s", cut, len(whole), torn, logs.String())
		}
		l.Add(adds[0].k, adds[0].t, clock.Now())
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(file); err != nil { // only the journal now
			t.Fatal(err)
		}
		checkQueries(t, newLocal(t, journalOpts(file, clock, nil)), append(want[:len(want):len(want)], adds[0]))
	}
}

// TestJournalCorruptLineIsAnError: a line that does not decode, other than
// the last, stops the start with an error naming the file and the line,
// and the journal is left as it was.
func TestJournalCorruptLineIsAnError(t *testing.T) {
	clock := newFakeClock()
	adds := sampleAdds()[:3]
	good := journalOf(adds[:1], clock.Now())
	second := string(journalOf(adds[:2], clock.Now())[len(good):])
	for name, bad := range map[string]string{
		"invalid JSON":       `{"seq":2,` + "\n",
		"unknown field":      strings.Replace(second, `"seq":2,`, `"seq":2,"dollars":1,`, 1),
		"bad day":            strings.Replace(second, adds[1].k.Day, "30/11/2026", 1),
		"seq 0":              strings.Replace(second, `"seq":2,`, `"seq":0,`, 1),
		"seq going back":     strings.Replace(second, `"seq":2,`, `"seq":1,`, 1),
		"no admission time":  strings.Replace(second, `"at":`, `"at":-`, 1),
		"empty line":         "\n",
		"two documents":      strings.TrimSuffix(second, "\n") + second,
		"number for a count": strings.Replace(second, `"requests":1`, `"requests":"1"`, 1),
	} {
		t.Run(name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "spend.json")
			data := append(append(append([]byte{}, good...), bad...), journalOf(adds, clock.Now())[len(good)+len(second):]...)
			data = bytes.Replace(data, []byte(`{"seq":3,`), []byte(`{"seq":9,`), 1)
			if err := os.WriteFile(file+journalSuffix, data, 0o600); err != nil {
				t.Fatal(err)
			}
			l, err := NewLocal(journalOpts(file, clock, nil))
			if err == nil {
				l.Close()
				t.Fatal("NewLocal accepted a corrupt journal")
			}
			if !strings.Contains(err.Error(), file+journalSuffix) || !strings.Contains(err.Error(), "line 2") {
				t.Fatalf("error %q does not name %s and line 2", err, file+journalSuffix)
			}
			if after, _ := os.ReadFile(file + journalSuffix); !bytes.Equal(after, data) {
				t.Fatal("NewLocal changed a journal it refused")
			}
		})
	}
	// Seqs increase from the previous journal into the journal too.
	file := filepath.Join(t.TempDir(), "spend.json")
	if err := os.WriteFile(file+prevSuffix, journalOf(adds, clock.Now()), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file+journalSuffix, journalOf(adds, clock.Now()), 0o600); err != nil {
		t.Fatal(err)
	}
	if l, err := NewLocal(journalOpts(file, clock, nil)); err == nil || !strings.Contains(err.Error(), "seq 1 after 3") {
		if l != nil {
			l.Close()
		}
		t.Fatalf("a journal repeating its predecessor's seqs: %v", err)
	}
}

// TestJournalAfterAnOldStateFile: a state file of version 1 (no seq) and
// no journal, as this version finds them, start at seq 0.
func TestJournalAfterAnOldStateFile(t *testing.T) {
	clock := newFakeClock()
	file := filepath.Join(t.TempDir(), "spend.json")
	old := `{"version":1,"saved_at":"2026-11-30T00:00:00Z","rows":[{"day":"2026-11-30","team":"t","key_id":"k","model":"m",` +
		`"requests":2,"input":10,"output":5,"cache_read":0,"cache_write":0,"reasoning":0,"cost_micros":7}]}`
	if err := os.WriteFile(file, []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	l := newLocal(t, journalOpts(file, clock, nil))
	k := Key{Day: "2026-11-30", Team: "t", KeyID: "k", Model: "m"}
	l.Add(k, Totals{Requests: 1, Input: 1}, clock.Now())
	rows, err := newLocal(t, journalOpts(killCopy(t, file, nil), clock, nil)).Query(context.Background(), Filter{})
	if err != nil || len(rows) != 1 || rows[0].Totals != (Totals{Requests: 3, Input: 11, Output: 5, CostMicros: 7}) {
		t.Fatalf("rows %+v, %v", rows, err)
	}
	if got := seqsOf(t, file+journalSuffix); len(got) != 1 || got[0] != 1 {
		t.Fatalf("journal seqs %v, want [1]", got)
	}
}

// TestJournalFailedWriteStillCounts: an Add whose journal write fails
// counts in memory (the next state write holds it), is logged once, and
// the journal resumes when writes succeed.
func TestJournalFailedWriteStillCounts(t *testing.T) {
	clock := newFakeClock()
	file := filepath.Join(t.TempDir(), "spend.json")
	var logs logBuffer
	opts := journalOpts(file, clock, nil)
	opts.Logger = logs.logger()
	l := newLocal(t, opts)
	adds := sampleAdds()
	addAt(l, adds[:5], clock.Now())
	ro, err := os.Open(file + journalSuffix)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	l.mu.Lock()
	good := l.j.f
	l.j.f = ro
	l.mu.Unlock()
	addAt(l, adds[5:10], clock.Now())
	l.mu.Lock()
	l.j.f = good
	l.mu.Unlock()
	addAt(l, adds[10:], clock.Now())
	checkQueries(t, l, adds)
	if n := strings.Count(logs.String(), "writing the journal failed"); n != 1 {
		t.Fatalf("%d error lines for 5 failed writes, want 1:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "journal writes succeed again") || !strings.Contains(logs.String(), "lost=5") {
		t.Fatalf("no recovery line with the count:\n%s", logs.String())
	}
	// The journal holds all but the 5; seqs skip them.
	if seqs := seqsOf(t, file+journalSuffix); len(seqs) != len(adds)-5 || seqs[5] != 11 {
		t.Fatalf("journal seqs %v", seqs)
	}
	flushOK(t, l)
	checkQueries(t, newLocal(t, journalOpts(killCopy(t, file, nil), clock, nil)), adds)
}

// TestJournalSyncAndClose: a sync clears what was written since the last
// one, and Adds after Close are not journaled (the file is closed), nor
// logged as failed writes.
func TestJournalSyncAndClose(t *testing.T) {
	clock := newFakeClock()
	file := filepath.Join(t.TempDir(), "spend.json")
	opts := journalOpts(file, clock, nil)
	opts.JournalSync = time.Hour
	var logs logBuffer
	opts.Logger = logs.logger()
	l := newLocal(t, opts)
	l.Add(Key{Day: "2026-11-30"}, Totals{Requests: 1}, clock.Now())
	if err := l.syncJournal(); err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	dirty := l.j.dirty
	l.mu.Unlock()
	if dirty {
		t.Fatal("still dirty after a sync")
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l.Add(Key{Day: "2026-11-30"}, Totals{Requests: 1}, clock.Now())
	if err := l.syncJournal(); err != nil {
		t.Fatal(err)
	}
	if seqs := seqsOf(t, file+journalSuffix); len(seqs) != 1 || logs.String() != "" {
		t.Fatalf("journal seqs after an Add past Close: %v; log:\n%s", seqs, logs.String())
	}
}

// TestJournalAppendAllocatesNothing: an Add to an existing row writes its
// journal line from a reused buffer.
func TestJournalAppendAllocatesNothing(t *testing.T) {
	clock := newFakeClock()
	l := newLocal(t, journalOpts(filepath.Join(t.TempDir(), "spend.json"), clock, nil))
	at := clock.Now()
	l.Add(benchKey, benchTotals, at)
	if n := testing.AllocsPerRun(1000, func() { l.Add(benchKey, benchTotals, at) }); n != 0 {
		t.Fatalf("Add with a journal allocates %v times", n)
	}
}

// TestJournalBrokenIsReplaced: a journal a failed write left torn (the cut
// back failed too) gets no more lines, which would make its torn line a
// corrupt middle one; the next state write, which holds the Adds made
// meanwhile, starts a new journal at once, however young the old one.
func TestJournalBrokenIsReplaced(t *testing.T) {
	clock := newFakeClock()
	file := filepath.Join(t.TempDir(), "spend.json")
	l := newLocal(t, journalOpts(file, clock, nil))
	adds := sampleAdds()
	addAt(l, adds[:10], clock.Now())
	l.mu.Lock()
	l.j.broken = true
	l.mu.Unlock()
	addAt(l, adds[10:20], clock.Now())
	if seqs := seqsOf(t, file+journalSuffix); len(seqs) != 10 {
		t.Fatalf("a broken journal got lines: %v", seqs)
	}
	flushOK(t, l)
	addAt(l, adds[20:], clock.Now())
	if p, j := seqsOf(t, file+prevSuffix), seqsOf(t, file+journalSuffix); len(p) != 10 || len(j) != len(adds)-20 || j[0] != 21 {
		t.Fatalf("after the state write: previous journal %v, journal %v", p, j)
	}
	checkQueries(t, newLocal(t, journalOpts(killCopy(t, file, nil), clock, nil)), adds)
}
