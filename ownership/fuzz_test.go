package ownership

import (
	"maps"
	"os"
	"path/filepath"
	"testing"
)

// FuzzLocalJournal feeds arbitrary bytes to NewLocal as a journal: it
// returns an error or a store, never panics; and a store it returns has
// rewritten the journal so that opening it again gives the same records.
func FuzzLocalJournal(f *testing.F) {
	f.Add([]byte(""))
	f.Add([]byte(`{"id":"resp_1","owner":"team:a","exp":0}` + "\n"))
	f.Add([]byte(`{"id":"resp_1","owner":"team:a","exp":1767225600}` + "\n" + `{"id":"resp_1","rel":true}` + "\n"))
	f.Add([]byte(`{"id":"resp_1","owner":"team:a","exp":9999999999}` + "\n" + `{"id":"resp_2","owner":"te`))
	f.Add([]byte(`{"id":"a\"b\\c","owner":"\u2028","exp":0}` + "\n" + `{"id":"x","owner":` + "\n"))
	f.Add([]byte(`{"id":"resp_1","owner":"team:a","exp":-1}` + "\n" + `{"id":"resp_2","owner":"team:b","exp":0}` + "\n"))
	f.Add([]byte(`{"id":"resp_1","owner":"team:a","exp":92233720368547758}` + "\n"))
	f.Add([]byte(`{"ID":"r","Owner":"o","Exp":1e3}` + "\n\n"))
	f.Add([]byte("\x00\x00\x00\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		clock := newFakeClock()
		file := filepath.Join(t.TempDir(), "owners.jsonl")
		if err := os.WriteFile(file, data, 0o600); err != nil {
			t.Fatal(err)
		}
		l, err := NewLocal(LocalOptions{File: file, Now: clock.Now})
		if err != nil {
			return
		}
		first := maps.Clone(l.recs)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		l2, err := NewLocal(LocalOptions{File: file, Now: clock.Now})
		if err != nil {
			t.Fatalf("reopening the rewritten journal: %v", err)
		}
		defer l2.Close()
		// The rewrite keeps whole seconds, so compare at that grain.
		if len(l2.recs) != len(first) {
			t.Fatalf("reopened with %d records, first open had %d", len(l2.recs), len(first))
		}
		for id, r := range first {
			r2, ok := l2.recs[id]
			if !ok || r2.owner != r.owner || journalExp(r2.exp) != journalExp(r.exp) {
				t.Fatalf("record %q: first %+v, reopened %+v (%v)", id, r, r2, ok)
			}
			if !r.live(clock.Now().UnixNano()) {
				t.Fatalf("expired record %q loaded", id)
			}
		}
	})
}
