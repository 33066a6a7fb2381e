package spend

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/internal/jsonl"
)

// redisJournalOf is a Redis journal as a ledger writes it: the entries of
// adds, a cut of the first cutAt of them into one batch, and that batch
// applied when applied is set.
func redisJournalOf(adds []add, cutAt int, applied bool) []byte {
	var b []byte
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC).UnixNano()
	for i, a := range adds {
		b = appendEntry(b, uint64(i+1), at, a.k, a.t)
		if i+1 == cutAt {
			b = append(b, `{"cut":["rep:n:1"],"tag":"{tollgate:spend}","after":0,"last":`...)
			b = strconv.AppendInt(b, int64(cutAt), 10)
			b = append(b, ",\"max\":100000}\n"...)
			if applied {
				b = append(b, `{"applied":["rep:n:1"]}`+"\n"...)
			}
		}
	}
	return b
}

// FuzzRedisJournal feeds arbitrary bytes to a Redis ledger's journal
// reader and replay (the same bytes cut in two as the previous file and
// the journal): they return an error, a *jsonl.CorruptError for a bad
// middle line, or a queue and pending rows, never panic; and a second
// replay of the files the first left (its torn tail cut off) rebuilds the
// same batches, under the same ids, and the same pending rows.
func FuzzRedisJournal(f *testing.F) {
	adds := sampleAdds()[:6]
	// Entries, a cut of four, later entries; the same applied; the cut
	// in the previous file; a torn last line; nothing.
	f.Add(redisJournalOf(adds, 4, false), 0)
	f.Add(redisJournalOf(adds, 4, true), 0)
	f.Add(redisJournalOf(adds, 4, false), 800)
	f.Add(redisJournalOf(adds, 4, false)[:900], 0)
	f.Add([]byte(""), 0)
	// A cut whose entries are gone (rotated away once applied), cuts out
	// of order, a repeated id, an unknown record.
	f.Add([]byte(`{"cut":["a","b"],"tag":"{x:spend}","after":5,"last":9,"max":3}`+"\n"), 0)
	f.Add([]byte(`{"cut":["a"],"tag":"{x:spend}","after":0,"last":2,"max":3}`+"\n"+`{"cut":["b"],"tag":"{x:spend}","after":1,"last":3,"max":3}`+"\n"), 0)
	f.Add([]byte(`{"applied":["a","a"]}`+"\n"+`{"what":1}`+"\n"), 0)
	// testdata/fuzz/FuzzRedisJournal holds a cut folded under a small
	// MaxPending, a rotated pair with a torn applied record, and a cut
	// missing an entry whose write failed, each named for what it is.
	f.Fuzz(func(t *testing.T, data []byte, split int) {
		name := filepath.Join(t.TempDir(), "spend.journal")
		split = min(max(split, 0), len(data))
		if err := os.WriteFile(name+redisJournalPrev, data[:split], 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(name, data[split:], 0o600); err != nil {
			t.Fatal(err)
		}
		first, err := replayForFuzz(name)
		if err != nil {
			var ce *jsonl.CorruptError
			if errors.As(err, &ce) && ce.File != name && ce.File != name+redisJournalPrev {
				t.Fatalf("corrupt line reported in %s, not one of the journal files", ce.File)
			}
			return
		}
		second, err := replayForFuzz(name)
		if err != nil {
			t.Fatalf("a second replay of the files the first left fails: %v", err)
		}
		if !reflect.DeepEqual(first, second) {
			t.Fatalf("a second replay differs:\n%+v\n%+v", second, first)
		}
	})
}

// fuzzReplay is what a replay rebuilt: queued batch ids and rows, pending.
type fuzzReplay struct {
	IDs     []string
	Rows    [][]Row
	Pending map[Key]Totals
}

// replayForFuzz runs a Redis ledger's journal replay on name, without a
// client or a flusher, and closes the journal it opened.
func replayForFuzz(name string) (fuzzReplay, error) {
	r := &Redis{log: slog.New(slog.DiscardHandler), maxPending: 4, pending: make(map[Key]*Totals),
		tag: "{tollgate:spend}", j: &journal{name: name, prev: name + redisJournalPrev}}
	rp, err := r.readRedisJournal(name)
	if err != nil {
		return fuzzReplay{}, err
	}
	err = r.replayJournal(rp, 0)
	if r.j.f != nil {
		_ = r.j.f.Close()
	}
	if err != nil {
		return fuzzReplay{}, err
	}
	out := fuzzReplay{Pending: map[Key]Totals{}}
	for _, b := range r.queue {
		out.IDs = append(out.IDs, b.id)
		out.Rows = append(out.Rows, slices.Clone(b.rows))
	}
	for k, t := range r.pending {
		out.Pending[k] = *t
	}
	return out, nil
}
