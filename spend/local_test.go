package spend

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

func newLocal(t *testing.T, opts LocalOptions) *Local {
	t.Helper()
	l, err := NewLocal(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func TestLocalQuery(t *testing.T) {
	l := newLocal(t, LocalOptions{})
	adds := sampleAdds()
	for _, a := range adds {
		l.Add(a.k, a.t, time.Time{})
	}
	checkQueries(t, l, adds)
	if err := l.Flush(context.Background()); err != nil {
		t.Fatalf("memory-only Flush: %v", err)
	}
}

func TestLocalRestart(t *testing.T) {
	file := filepath.Join(t.TempDir(), "spend.json")
	adds := sampleAdds()
	l, err := NewLocal(LocalOptions{StateFile: file, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range adds[:100] {
		l.Add(a.k, a.t, time.Time{})
	}
	before, err := l.Query(context.Background(), Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	l2 := newLocal(t, LocalOptions{StateFile: file, FlushInterval: time.Hour})
	after, err := l2.Query(context.Background(), Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(before, after) {
		t.Fatalf("after restart:\n got %+v\nwant %+v", after, before)
	}
	// The reloaded ledger keeps counting on top of what it loaded.
	for _, a := range adds[100:] {
		l2.Add(a.k, a.t, time.Time{})
	}
	checkQueries(t, l2, adds)
	if err := l2.Close(); err != nil {
		t.Fatal(err)
	}
	l3 := newLocal(t, LocalOptions{StateFile: file})
	checkQueries(t, l3, adds)
}

func TestLocalConcurrentAdds(t *testing.T) {
	l := newLocal(t, LocalOptions{StateFile: filepath.Join(t.TempDir(), "s.json"), FlushInterval: time.Millisecond})
	const workers, per = 16, 3000
	keys := []Key{{Day: "2026-01-01", KeyID: "a"}, {Day: "2026-01-01", KeyID: "b"}, {Day: "2026-01-02", KeyID: "a"}}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range per {
				l.Add(keys[(w+i)%len(keys)], Totals{Requests: 1, Input: int64(i), CostMicros: int64(w)}, time.Time{})
			}
		})
	}
	wg.Wait()
	var want Totals
	for w := range workers {
		for i := range per {
			want.Add(Totals{Requests: 1, Input: int64(i), CostMicros: int64(w)})
		}
	}
	rows, err := l.Query(context.Background(), Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if got := sumRows(rows); got != want || len(rows) != len(keys) {
		t.Fatalf("sum of %d rows = %+v, want %d rows %+v", len(rows), got, len(keys), want)
	}
}

func TestLocalBadStateFile(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"garbage":       "not json",
		"empty":         "",
		"truncated":     `{"version":1,"rows":[{"day":"2026-01-01"`,
		"wrong version": `{"version":3,"rows":[]}`,
		"no version":    `{"rows":[]}`,
		"bad day":       `{"version":1,"rows":[{"day":"01/02/2026","requests":1}]}`,
		"unknown field": `{"version":1,"rows":[{"day":"2026-01-01","dollars":1.5}]}`,
		"trailing data": `{"version":1,"rows":[]} {}`,
		"wrong type":    `{"version":1,"rows":[{"day":"2026-01-01","requests":"1"}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			file := filepath.Join(dir, strings.ReplaceAll(name, " ", "_")+".json")
			if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			l, err := NewLocal(LocalOptions{StateFile: file})
			if err == nil {
				_ = l.Close()
				t.Fatal("NewLocal accepted a bad state file")
			}
			if !strings.Contains(err.Error(), file) || !strings.HasPrefix(err.Error(), "spend: ") {
				t.Fatalf("error %q does not name the file %s", err, file)
			}
			// The bad file is left alone for a human to look at.
			if b, _ := os.ReadFile(file); string(b) != content {
				t.Fatal("the bad state file was changed")
			}
		})
	}
}

// dirNames lists the names in dir.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func TestLocalAtomicWrite(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "spend.json")
	l := newLocal(t, LocalOptions{StateFile: file, FlushInterval: time.Hour,
		Now: func() time.Time { return time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC) }})
	l.Add(Key{Day: "2026-11-30", KeyID: "k", Team: "t", Model: "m"}, Totals{Requests: 1, CostMicros: 5}, time.Time{})
	if err := l.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if names := dirNames(t, dir); !reflect.DeepEqual(names, []string{"spend.json"}) {
		t.Fatalf("dir holds %v, want only spend.json", names)
	}
	var st struct {
		Version int    `json:"version"`
		SavedAt string `json:"saved_at"`
		Rows    []struct {
			Day        string `json:"day"`
			CostMicros int64  `json:"cost_micros"`
		} `json:"rows"`
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	if st.Version != 2 || st.SavedAt != "2026-11-30T12:00:00Z" || len(st.Rows) != 1 || st.Rows[0].CostMicros != 5 {
		t.Fatalf("state file = %s", b)
	}
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("state file mode %v (%v), want 0600", fi.Mode(), err)
	}

	// A write that fails (the path is now a non-empty directory, so the
	// rename fails) returns an error and leaves no temporary file behind.
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(file, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	l.Add(Key{Day: "2026-11-30"}, Totals{Requests: 1}, time.Time{})
	if err := l.Flush(context.Background()); err == nil || !strings.Contains(err.Error(), file) {
		t.Fatalf("Flush onto a directory: error %v, want one naming %s", err, file)
	}
	if names := dirNames(t, dir); !reflect.DeepEqual(names, []string{"spend.json"}) {
		t.Fatalf("after a failed write dir holds %v, want only spend.json (the directory)", names)
	}
	// The change is still pending: once the path is free, Flush writes it.
	if err := os.RemoveAll(file); err != nil {
		t.Fatal(err)
	}
	if err := l.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	l2 := newLocal(t, LocalOptions{StateFile: file})
	rows, err := l2.Query(context.Background(), Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if got := sumRows(rows); got.Requests != 2 || got.CostMicros != 5 {
		t.Fatalf("after retry the file holds %+v, want 2 requests and 5 µ$", got)
	}
}

func TestLocalPeriodicFlush(t *testing.T) {
	file := filepath.Join(t.TempDir(), "spend.json")
	l := newLocal(t, LocalOptions{StateFile: file, FlushInterval: 5 * time.Millisecond})
	l.Add(Key{Day: "2026-11-30", KeyID: "k"}, Totals{Requests: 3, CostMicros: 42}, time.Time{})
	// Bounded wait (1000 × 10 ms) for the flusher, without Flush or Close.
	for range 1000 {
		if b, err := os.ReadFile(file); err == nil {
			var st struct {
				Rows []struct {
					Requests   int64 `json:"requests"`
					CostMicros int64 `json:"cost_micros"`
				} `json:"rows"`
			}
			if err := json.Unmarshal(b, &st); err != nil {
				t.Fatalf("periodic write produced a bad file: %v\n%s", err, b)
			}
			if len(st.Rows) != 1 || st.Rows[0].Requests != 3 || st.Rows[0].CostMicros != 42 {
				t.Fatalf("periodic write: %s", b)
			}
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the state file was not written by the periodic flush")
}

func TestLocalFlushCancelled(t *testing.T) {
	l := newLocal(t, LocalOptions{StateFile: filepath.Join(t.TempDir(), "s.json"), FlushInterval: time.Hour})
	l.Add(Key{Day: "2026-11-30"}, Totals{Requests: 1}, time.Time{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.Flush(ctx); err == nil {
		t.Fatal("Flush with a cancelled context succeeded")
	}
	if err := l.Close(); err != nil {
		t.Fatalf("Close after a cancelled Flush: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}
