package spend

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

// FuzzLocalJournal feeds arbitrary bytes to NewLocal as a journal (and the
// same bytes, cut in two, as a previous journal and a journal): it returns
// an error or a ledger, never panics; a ledger it returns holds exactly the
// lines it handed to OnReplay; and once closed (a state write, the torn
// tail cut off) it opens again with the same rows, nothing counted twice.
func FuzzLocalJournal(f *testing.F) {
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	adds := sampleAdds()
	// Whole lines in the journal; the same cut in the middle of the third
	// line with the first in the previous journal; nothing.
	f.Add(journalOf(adds[:3], at), 0)
	f.Add(journalOf(adds[:3], at)[:200], 90)
	f.Add([]byte(""), 0)
	// Names with every escape, invalid UTF-8, a negative cost.
	f.Add([]byte(`{"seq":1,"at":1,"day":"2026-11-30","key_id":"k\"\\","team":"\u2028","model":"\xff","requests":1,"input":0,"output":0,"cache_read":0,"cache_write":0,"reasoning":0,"cost_micros":-1}`+"\n"), 0)
	// Seqs going back; the largest seq and time, then a torn line.
	f.Add([]byte(`{"seq":2,"at":1,"day":"2026-11-30"}`+"\n"+`{"seq":1,"at":1,"day":"2026-11-30"}`+"\n"), 0)
	f.Add([]byte(`{"seq":18446744073709551615,"at":9223372036854775807,"day":"9999-12-31"}`+"\n"+`{"seq":1`), 0)
	// NUL bytes, as a crash of the machine can leave at a file's end.
	f.Add([]byte("\x00\x00\x00\n\n"), 2)
	// testdata/fuzz/FuzzLocalJournal holds a rotation's two files, torn
	// and corrupt lines in either, and odd names, each named for what it is.
	f.Fuzz(func(t *testing.T, data []byte, split int) {
		file := filepath.Join(t.TempDir(), "spend.json")
		split = min(max(split, 0), len(data))
		if err := os.WriteFile(file+prevSuffix, data[:split], 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file+journalSuffix, data[split:], 0o600); err != nil {
			t.Fatal(err)
		}
		clock := newFakeClock()
		var replayed []Entry
		l, err := NewLocal(journalOpts(file, clock, &replayed))
		if err != nil {
			return
		}
		first, err := l.Query(context.Background(), Filter{})
		if err != nil {
			t.Fatal(err)
		}
		want := map[Key]Totals{}
		for _, e := range replayed {
			s := want[e.Key]
			s.Add(e.Totals)
			want[e.Key] = s
		}
		got := map[Key]Totals{}
		for _, r := range first {
			got[r.Key] = r.Totals
		}
		if len(replayed) > 0 && !reflect.DeepEqual(got, want) {
			t.Fatalf("rows %+v, the replayed lines sum to %+v", got, want)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		var again []Entry
		l2, err := NewLocal(journalOpts(file, clock, &again))
		if err != nil {
			t.Fatalf("reopening after Close: %v", err)
		}
		defer l2.Close()
		second, err := l2.Query(context.Background(), Filter{})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(first, second) || len(again) != len(replayed) {
			t.Fatalf("reopened with %+v (%d lines), first open had %+v (%d lines)", second, len(again), first, len(replayed))
		}
	})
}
