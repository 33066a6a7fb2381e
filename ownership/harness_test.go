package ownership

import (
	"bufio"
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-llm/tollgate/internal/redistest"
)

// fakeClock is a clock that moves only when told.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
}

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

// subject is a Store under test with what the behaviour table needs to
// make time pass and to see a record's expiry.
type subject struct {
	Store
	// shortTTL is a ttl that lapse can wait out.
	shortTTL time.Duration
	// lapse returns once id, claimed with shortTTL, has expired: Local
	// advances its clock, Redis polls Owner for up to 2 s.
	lapse func(t *testing.T, id string)
	// remaining is the time left on id's record; expires is false when it
	// has no expiry, and the test fails when there is no record.
	remaining func(t *testing.T, id string) (left time.Duration, expires bool)
}

// storeCase makes a fresh subject of one kind.
type storeCase struct {
	name string
	make func(t *testing.T) *subject
}

// storeCases are the stores every behaviour runs against.
var storeCases = []storeCase{
	{"Local", func(t *testing.T) *subject {
		return localSubject(t, filepath.Join(t.TempDir(), "owners.jsonl"))
	}},
	{"LocalMemory", func(t *testing.T) *subject { return localSubject(t, "") }},
	{"Redis", redisSubject},
}

func localSubject(t *testing.T, file string) *subject {
	t.Helper()
	clock := newFakeClock()
	l := newLocal(t, file, clock)
	return &subject{
		Store:    l,
		shortTTL: time.Minute,
		lapse: func(t *testing.T, id string) {
			t.Helper()
			clock.Advance(time.Minute + time.Nanosecond)
		},
		remaining: func(t *testing.T, id string) (time.Duration, bool) {
			t.Helper()
			l.mu.Lock()
			r, ok := l.recs[id]
			l.mu.Unlock()
			if !ok {
				t.Fatalf("no record for %q", id)
			}
			if r.exp == 0 {
				return 0, false
			}
			return time.Duration(r.exp - clock.Now().UnixNano()), true
		},
	}
}

func redisSubject(t *testing.T) *subject {
	t.Helper()
	return redisClientSubject(t, redistest.Start(t).Client(t), "test:own:")
}

// redisClientSubject is a Redis store on c, under prefix.
func redisClientSubject(t *testing.T, c redis.UniversalClient, prefix string) *subject {
	t.Helper()
	r := NewRedis(c, prefix)
	return &subject{
		Store:    r,
		shortTTL: 50 * time.Millisecond,
		lapse: func(t *testing.T, id string) {
			t.Helper()
			waitFor(t, "the record of "+id+" to expire", func() bool {
				o, err := r.Owner(context.Background(), id)
				return err == nil && o == ""
			})
		},
		remaining: func(t *testing.T, id string) (time.Duration, bool) {
			t.Helper()
			d, err := c.PTTL(context.Background(), prefix+id).Result()
			if err != nil {
				t.Fatal(err)
			}
			switch d { // go-redis passes Redis's -2 (no key) and -1 (no expiry) through as is
			case -2:
				t.Fatalf("no record for %q", id)
			case -1:
				return 0, false
			}
			return d, true
		},
	}
}

// newLocal opens a Local on file with clock, closed in t.Cleanup.
func newLocal(t testing.TB, file string, clock *fakeClock, log ...*slog.Logger) *Local {
	t.Helper()
	opts := LocalOptions{File: file, Now: clock.Now}
	if len(log) > 0 {
		opts.Logger = log[0]
	}
	l, err := NewLocal(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// waitFor polls cond every 5 ms for up to 2 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 400 {
		if cond() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("timed out after 2 s waiting for %s", what)
}

// claim claims and fails the test on an error or another holder.
func claim(t *testing.T, s Store, id, owner string, ttl time.Duration) {
	t.Helper()
	got, err := s.Claim(context.Background(), id, owner, ttl)
	if err != nil {
		t.Fatalf("Claim(%q, %q): %v", id, owner, err)
	}
	if got != owner {
		t.Fatalf("Claim(%q, %q) = %q, want the claim to take", id, owner, got)
	}
}

// wantOwner fails the test unless Owner(id) is want.
func wantOwner(t *testing.T, s Store, id, want string) {
	t.Helper()
	got, err := s.Owner(context.Background(), id)
	if err != nil {
		t.Fatalf("Owner(%q): %v", id, err)
	}
	if got != want {
		t.Fatalf("Owner(%q) = %q, want %q", id, got, want)
	}
}

// journalLines returns the lines of file, without their newlines.
func journalLines(t testing.TB, file string) []string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return lines
}

// logBuffer collects a logger's output.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }
