package conversation

import (
	"context"
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

// ended collects what a store hands to OnEnd.
type ended struct {
	mu  sync.Mutex
	got []endedConv
}

type endedConv struct {
	c   Conversation
	why Reason
}

func (e *ended) onEnd(c Conversation, why Reason) {
	e.mu.Lock()
	e.got = append(e.got, endedConv{c, why})
	e.mu.Unlock()
}

func (e *ended) list() []endedConv {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]endedConv(nil), e.got...)
}

// ticker is a store whose periodic work (sending turns, ending idle
// conversations, writing its file) a test can run now.
type ticker interface {
	Store
	tick(ctx context.Context)
}

// subject is a store under test, on a fake clock, with what it ended.
type subject struct {
	ticker
	clock *fakeClock
	ended *ended
	// reopen closes the store and opens it again on the same state (file
	// or Redis), as a restarted gateway would; nil when the store keeps
	// nothing across a restart.
	reopen func(t *testing.T) *subject
}

// storeCase makes a fresh subject of one kind with opts (its clock and
// OnEnd are the subject's).
type storeCase struct {
	name string
	make func(t *testing.T, opts Options) *subject
}

// storeCases are the stores every behaviour runs against.
var storeCases = []storeCase{
	{"Local", func(t *testing.T, opts Options) *subject {
		return localSubject(t, filepath.Join(t.TempDir(), "conversations.json"), opts, newFakeClock())
	}},
	{"LocalMemory", func(t *testing.T, opts Options) *subject {
		return localSubject(t, "", opts, newFakeClock())
	}},
	{"Redis", redisSubject},
}

// testIdle is the idle timeout the behaviours run with.
const testIdle = 10 * time.Minute

func localSubject(t *testing.T, file string, opts Options, clock *fakeClock) *subject {
	t.Helper()
	s := &subject{clock: clock, ended: &ended{}}
	opts.Now, opts.OnEnd = clock.Now, s.ended.onEnd
	if opts.IdleTimeout == 0 {
		opts.IdleTimeout = testIdle
	}
	// The background loop never runs on its own within a test: tick does.
	opts.Interval = time.Hour
	l, err := NewLocal(LocalOptions{Options: opts, File: file})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = l.Close()
		}
	})
	s.ticker = l
	if file != "" {
		s.reopen = func(t *testing.T) *subject {
			t.Helper()
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			closed = true
			return localSubject(t, file, opts, clock)
		}
	}
	return s
}

// redisSubject is a Redis store on a redis-server of its own; reopen
// closes it and opens a new one on the same server and prefix.
func redisSubject(t *testing.T, opts Options) *subject {
	t.Helper()
	srv := redistest.Start(t)
	return redisSubjectOn(t, srv.Client(t), "test:", opts, newFakeClock())
}

func redisSubjectOn(t *testing.T, client redis.UniversalClient, prefix string, opts Options, clock *fakeClock) *subject {
	t.Helper()
	s := &subject{clock: clock, ended: &ended{}}
	opts.Now, opts.OnEnd = clock.Now, s.ended.onEnd
	if opts.IdleTimeout == 0 {
		opts.IdleTimeout = testIdle
	}
	opts.Interval = time.Hour // tick runs the periodic work
	r, err := NewRedis(client, RedisOptions{Options: opts, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = r.Close()
		}
	})
	s.ticker = r
	s.reopen = func(t *testing.T) *subject {
		t.Helper()
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		closed = true
		return redisSubjectOn(t, client, prefix, opts, clock)
	}
	return s
}

// forEachStore runs body against every store kind.
func forEachStore(t *testing.T, opts Options, body func(t *testing.T, s *subject)) {
	for _, sc := range storeCases {
		t.Run(sc.name, func(t *testing.T) {
			body(t, sc.make(t, opts))
		})
	}
}

// turn is a turn of conversation key at the subject's clock, with n input
// and 2n output tokens costing n micro-dollars.
func (s *subject) turn(key string, n int64) Turn {
	return Turn{Key: key, Team: "research", At: s.clock.Now(),
		Tokens:     Tokens{Input: n, Output: 2 * n, CacheRead: n / 2, Reasoning: n / 4},
		CostMicros: n, TTFT: time.Duration(n) * time.Millisecond}
}

func (s *subject) get(t *testing.T, key string) Conversation {
	t.Helper()
	c, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("Get(%s): %v", key, err)
	}
	return c
}
