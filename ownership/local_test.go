package ownership

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func journalPath(t *testing.T) string { return filepath.Join(t.TempDir(), "owners.jsonl") }

// fillJournal claims and releases a mix of records through l: a
// permanent one, one with a ttl, a renewed one, a released one and one
// that a second owner failed to take.
func fillJournal(t *testing.T, l *Local) {
	t.Helper()
	ctx := context.Background()
	claim(t, l, "resp_perm", "team:a", 0)
	claim(t, l, "resp_ttl", "team:b", time.Hour)
	claim(t, l, "resp_renew", "team:a", time.Minute)
	claim(t, l, "resp_renew", "team:a", 3*time.Hour)
	claim(t, l, "conv_gone", "key:k1", 0)
	if err := l.Release(ctx, "conv_gone", "key:k1"); err != nil {
		t.Fatal(err)
	}
	if got, err := l.Claim(ctx, "resp_perm", "team:b", 0); err != nil || got != "team:a" {
		t.Fatalf("Claim by team:b = %q, %v", got, err)
	}
}

// checkFilled checks what fillJournal left, and that the ttls still run
// from the original claims.
func checkFilled(t *testing.T, l *Local, clock *fakeClock) {
	t.Helper()
	wantOwner(t, l, "resp_perm", "team:a")
	wantOwner(t, l, "resp_ttl", "team:b")
	wantOwner(t, l, "resp_renew", "team:a")
	wantOwner(t, l, "conv_gone", "")
	clock.Advance(time.Hour + time.Second) // the journal keeps whole seconds, rounded up
	wantOwner(t, l, "resp_ttl", "")
	wantOwner(t, l, "resp_renew", "team:a")
	clock.Advance(2 * time.Hour)
	wantOwner(t, l, "resp_renew", "")
	wantOwner(t, l, "resp_perm", "team:a")
}

func TestLocalRecordsSurviveCloseAndReopen(t *testing.T) {
	file, clock := journalPath(t), newFakeClock()
	l := newLocal(t, file, clock)
	fillJournal(t, l)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	checkFilled(t, newLocal(t, file, clock), clock)
}

func TestLocalRecordsSurviveCrashWithoutClose(t *testing.T) {
	file, clock := journalPath(t), newFakeClock()
	l := newLocal(t, file, clock) // never closed before the second opens: a crashed process
	fillJournal(t, l)
	checkFilled(t, newLocal(t, file, clock), clock)
}

func TestLocalOddStringsSurviveJournal(t *testing.T) {
	file, clock := journalPath(t), newFakeClock()
	l := newLocal(t, file, clock)
	vals := []string{`a"b`, `c\d`, `\"`, "{tag}", "\u2028", "名前", "<&>", strings.Repeat(`"`, MaxLen)}
	for i, v := range vals {
		claim(t, l, v, oddOwner(i, v), 0)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l2 := newLocal(t, file, clock)
	for i, v := range vals {
		wantOwner(t, l2, v, oddOwner(i, v))
	}
}

// oddOwner is a distinct owner for vals[i] that starts with v's first rune.
func oddOwner(i int, v string) string { return string([]rune(v)[0]) + strconv.Itoa(i) }

func TestLocalJournalLinesAreDocumentedJSON(t *testing.T) {
	file, clock := journalPath(t), newFakeClock()
	l := newLocal(t, file, clock)
	claim(t, l, "resp_1", "team:a", 90*time.Minute+time.Millisecond)
	claim(t, l, "resp_2", "team:b", 0)
	if err := l.Release(context.Background(), "resp_1", "team:a"); err != nil {
		t.Fatal(err)
	}
	exp := clock.Now().Add(90*time.Minute).Unix() + 1 // rounded up to the second
	want := []map[string]any{
		{"id": "resp_1", "owner": "team:a", "exp": float64(exp)},
		{"id": "resp_2", "owner": "team:b", "exp": float64(0)},
		{"id": "resp_1", "rel": true},
	}
	lines := journalLines(t, file)
	if len(lines) != len(want) {
		t.Fatalf("journal has %d lines, want %d:\n%s", len(lines), len(want), strings.Join(lines, "\n"))
	}
	for i, line := range lines {
		var got map[string]any
		if err := json.Unmarshal([]byte(line), &got); err != nil {
			t.Fatalf("line %d %q: %v", i+1, line, err)
		}
		if len(got) != len(want[i]) {
			t.Fatalf("line %d = %v, want %v", i+1, got, want[i])
		}
		for k, v := range want[i] {
			if got[k] != v {
				t.Fatalf("line %d = %v, want %v", i+1, got, want[i])
			}
		}
	}
	st, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("journal mode %v, want 0600", st.Mode().Perm())
	}
}

func TestLocalNoLineForAnUnchangedClaim(t *testing.T) {
	file, clock := journalPath(t), newFakeClock()
	l := newLocal(t, file, clock)
	claim(t, l, "resp_1", "team:a", time.Hour)
	claim(t, l, "resp_1", "team:a", time.Hour) // same clock: the same expiry
	if got, _ := l.Claim(context.Background(), "resp_1", "team:b", time.Hour); got != "team:a" {
		t.Fatalf("Claim by team:b = %q", got)
	}
	if n := len(journalLines(t, file)); n != 1 {
		t.Fatalf("journal has %d lines, want 1", n)
	}
	clock.Advance(2 * time.Second)
	claim(t, l, "resp_1", "team:a", time.Hour) // a renewal
	if n := len(journalLines(t, file)); n != 2 {
		t.Fatalf("after a renewal the journal has %d lines, want 2", n)
	}
}

func TestLocalTornLastLineIsIgnored(t *testing.T) {
	good := `{"id":"resp_1","owner":"team:a","exp":0}` + "\n"
	for name, tail := range map[string]string{
		"no trailing newline":       `{"id":"resp_2","owner":"te`,
		"complete but no newline":   `{"id":"resp_2","owner":"team:b","exp":0}`,
		"invalid JSON on last line": `{"id":"resp_2","owner` + "\n",
		"NUL bytes":                 "\x00\x00\x00\x00",
	} {
		t.Run(name, func(t *testing.T) {
			file, clock := journalPath(t), newFakeClock()
			if err := os.WriteFile(file, []byte(good+tail), 0o600); err != nil {
				t.Fatal(err)
			}
			var logs logBuffer
			l := newLocal(t, file, clock, logs.logger())
			wantOwner(t, l, "resp_1", "team:a")
			wantOwner(t, l, "resp_2", "")
			if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "torn last line") {
				t.Fatalf("no warning about the torn line; log:\n%s", logs.String())
			}
			// The torn tail is gone from the file, so lines appended now
			// do not join it into a corrupt middle line.
			claim(t, l, "resp_3", "team:c", 0)
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			var logs2 logBuffer
			l2 := newLocal(t, file, clock, logs2.logger())
			wantOwner(t, l2, "resp_1", "team:a")
			wantOwner(t, l2, "resp_3", "team:c")
			if logs2.String() != "" {
				t.Fatalf("reopening logged:\n%s", logs2.String())
			}
		})
	}
}

func TestLocalCorruptMiddleLineIsAnError(t *testing.T) {
	good := `{"id":"resp_1","owner":"team:a","exp":0}` + "\n"
	for name, bad := range map[string]string{
		"invalid JSON":     `{"id":"resp_2",` + "\n",
		"unknown field":    `{"id":"resp_2","owner":"team:b","exp":0,"x":1}` + "\n",
		"no owner":         `{"id":"resp_2","exp":0}` + "\n",
		"control in id":    `{"id":"resp\u0001","owner":"team:b","exp":0}` + "\n",
		"negative expiry":  `{"id":"resp_2","owner":"team:b","exp":-5}` + "\n",
		"release w/ owner": `{"id":"resp_2","owner":"team:b","rel":true}` + "\n",
		"empty line":       "\n",
		"two documents":    `{"id":"a","owner":"b","exp":0}{"id":"c","owner":"d","exp":0}` + "\n",
		"overlong line":    `{"id":"` + strings.Repeat("x", maxLine) + `","owner":"b","exp":0}` + "\n",
	} {
		t.Run(name, func(t *testing.T) {
			file := journalPath(t)
			data := []byte(good + bad + good)
			if err := os.WriteFile(file, data, 0o600); err != nil {
				t.Fatal(err)
			}
			l, err := NewLocal(LocalOptions{File: file})
			if err == nil {
				l.Close()
				t.Fatal("NewLocal accepted a corrupt journal")
			}
			if !strings.Contains(err.Error(), "line 2") {
				t.Fatalf("error %q does not name line 2", err)
			}
			after, rerr := os.ReadFile(file)
			if rerr != nil {
				t.Fatal(rerr)
			}
			if !bytes.Equal(after, data) {
				t.Fatal("NewLocal changed a journal it refused")
			}
		})
	}
}

func TestLocalExpiredRecordsAreNotLoaded(t *testing.T) {
	file, clock := journalPath(t), newFakeClock()
	now := clock.Now().Unix()
	journal := `{"id":"resp_past","owner":"team:a","exp":` + strconv.FormatInt(now-1, 10) + "}\n" +
		`{"id":"resp_now","owner":"team:a","exp":` + strconv.FormatInt(now, 10) + "}\n" +
		`{"id":"resp_future","owner":"team:a","exp":` + strconv.FormatInt(now+1, 10) + "}\n" +
		`{"id":"resp_far","owner":"team:a","exp":` + strconv.FormatInt(1<<62, 10) + "}\n"
	if err := os.WriteFile(file, []byte(journal), 0o600); err != nil {
		t.Fatal(err)
	}
	l := newLocal(t, file, clock)
	l.mu.Lock()
	n := len(l.recs)
	l.mu.Unlock()
	if n != 2 {
		t.Fatalf("%d records loaded, want 2", n)
	}
	wantOwner(t, l, "resp_future", "team:a")
	wantOwner(t, l, "resp_far", "team:a")
	lines := journalLines(t, file)
	if len(lines) != 2 || strings.Contains(strings.Join(lines, "\n"), "resp_past") {
		t.Fatalf("compacted journal:\n%s", strings.Join(lines, "\n"))
	}
}

func TestLocalOpeningCompactsTheJournal(t *testing.T) {
	file, clock := journalPath(t), newFakeClock()
	l := newLocal(t, file, clock)
	for range 500 {
		clock.Advance(time.Second)
		claim(t, l, "resp_1", "team:a", time.Hour)
		claim(t, l, "resp_2", "team:b", 0)
		if err := l.Release(context.Background(), "resp_2", "team:b"); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(journalLines(t, file)); n != 1500 {
		t.Fatalf("journal has %d lines before reopening, want 1500", n)
	}
	l2 := newLocal(t, file, clock)
	if n := len(journalLines(t, file)); n != 1 {
		t.Fatalf("journal has %d lines after reopening, want 1", n)
	}
	wantOwner(t, l2, "resp_1", "team:a")
	wantOwner(t, l2, "resp_2", "")
	clock.Advance(time.Hour - time.Second)
	wantOwner(t, l2, "resp_1", "team:a") // the last renewal's expiry was kept
}

func TestLocalCompactionWhileRunningShrinksTheJournal(t *testing.T) {
	file, clock := journalPath(t), newFakeClock()
	l := newLocal(t, file, clock)
	const live = 100
	for i := range live {
		claim(t, l, "conv_"+strconv.Itoa(i), "team:a", 0)
	}
	bound := 2*(live+1) + compactSlack // the live records and resp_hot
	maxSeen := 0
	for range 3 * bound {
		clock.Advance(time.Second)
		claim(t, l, "resp_hot", "team:b", time.Hour)
		maxSeen = max(maxSeen, l.lines)
	}
	if maxSeen > bound+1 {
		t.Fatalf("journal reached %d lines, want at most %d", maxSeen, bound+1)
	}
	lines := journalLines(t, file)
	if len(lines) != l.lines || len(lines) > bound {
		t.Fatalf("journal has %d lines (store counts %d), want at most %d", len(lines), l.lines, bound)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l2 := newLocal(t, file, clock)
	for i := range live {
		wantOwner(t, l2, "conv_"+strconv.Itoa(i), "team:a")
	}
	wantOwner(t, l2, "resp_hot", "team:b")
	clock.Advance(time.Hour - time.Second)
	wantOwner(t, l2, "resp_hot", "team:b")
	clock.Advance(2 * time.Second)
	wantOwner(t, l2, "resp_hot", "")
}

func TestLocalClaimsSweepExpiredRecords(t *testing.T) {
	for _, file := range []string{"", "journal"} {
		t.Run("file="+file, func(t *testing.T) {
			clock := newFakeClock()
			if file != "" {
				file = journalPath(t)
			}
			l := newLocal(t, file, clock)
			const n = 10_000
			for i := range n {
				claim(t, l, "resp_old_"+strconv.Itoa(i), "team:a", time.Minute)
			}
			clock.Advance(2 * time.Minute)
			for i := range n {
				claim(t, l, "resp_new_"+strconv.Itoa(i), "team:a", time.Minute)
			}
			l.mu.Lock()
			size := len(l.recs)
			l.mu.Unlock()
			// Without sweeping the map would hold all 2n.
			if size >= 2*n {
				t.Fatalf("map holds %d records, %d of them live", size, n)
			}
			wantOwner(t, l, "resp_new_0", "team:a")
			wantOwner(t, l, "resp_old_0", "")
		})
	}
}

func TestLocalFailedWriteFailsTheClaimAndKeepsNothing(t *testing.T) {
	file, clock := journalPath(t), newFakeClock()
	l := newLocal(t, file, clock)
	ctx := context.Background()
	claim(t, l, "resp_kept", "team:a", time.Hour)
	// Swap the journal's descriptor for a read-only one: every write fails.
	ro, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	good := l.f
	l.f = ro
	l.mu.Unlock()
	if _, err := l.Claim(ctx, "resp_new", "team:a", time.Hour); err == nil {
		t.Fatal("Claim succeeded though the journal write failed")
	}
	wantOwner(t, l, "resp_new", "")
	clock.Advance(time.Minute)
	if _, err := l.Claim(ctx, "resp_kept", "team:a", 5*time.Hour); err == nil {
		t.Fatal("renewing Claim succeeded though the journal write failed")
	}
	if err := l.Release(ctx, "resp_kept", "team:a"); err == nil {
		t.Fatal("Release succeeded though the journal write failed")
	}
	wantOwner(t, l, "resp_kept", "team:a")
	clock.Advance(time.Hour)
	wantOwner(t, l, "resp_kept", "") // the failed renewal did not extend it
	l.mu.Lock()
	l.f = good
	l.mu.Unlock()
	ro.Close()
	claim(t, l, "resp_new", "team:a", time.Hour)
	wantOwner(t, l, "resp_new", "team:a")
}

func TestLocalMissingDirectoryIsAnError(t *testing.T) {
	_, err := NewLocal(LocalOptions{File: filepath.Join(t.TempDir(), "no", "such", "owners.jsonl")})
	if err == nil {
		t.Fatal("NewLocal in a missing directory succeeded")
	}
}

func TestLocalClosedStoreReturnsErrClosed(t *testing.T) {
	l := newLocal(t, journalPath(t), newFakeClock())
	claim(t, l, "resp_1", "team:a", 0)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := l.Claim(ctx, "resp_2", "team:a", 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("Claim after Close: %v", err)
	}
	if _, err := l.Owner(ctx, "resp_1"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Owner after Close: %v", err)
	}
	if err := l.Release(ctx, "resp_1", "team:a"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Release after Close: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestLocalCancelledContextIsAnError(t *testing.T) {
	l := newLocal(t, "", newFakeClock())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.Claim(ctx, "resp_1", "team:a", 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("Claim: %v", err)
	}
	if _, err := l.Owner(ctx, "resp_1"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Owner: %v", err)
	}
	wantOwner(t, l, "resp_1", "")
}

func TestExpiryAndJournalSecondsSaturate(t *testing.T) {
	const maxInt = 1<<63 - 1
	cases := []struct {
		now  int64
		ttl  time.Duration
		want int64
	}{
		{100, 0, 0},
		{100, -1, 0},
		{100, 5, 105},
		{maxInt - 3, time.Hour, maxInt},
		{-10, 5, 1},
	}
	for _, c := range cases {
		if got := expiry(c.now, c.ttl); got != c.want {
			t.Errorf("expiry(%d, %v) = %d, want %d", c.now, c.ttl, got, c.want)
		}
	}
	for nanos, sec := range map[int64]int64{0: 0, 1: 1, 1e9: 1, 1e9 + 1: 2, maxInt: maxInt/1_000_000_000 + 1} {
		if got := journalExp(nanos); got != sec {
			t.Errorf("journalExp(%d) = %d, want %d", nanos, got, sec)
		}
	}
	if got := nanosFromJournal(maxInt / 1_000_000_000 * 2); got != maxInt {
		t.Errorf("nanosFromJournal of a huge exp = %d", got)
	}
}
