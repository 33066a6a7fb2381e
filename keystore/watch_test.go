package keystore

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/internal/redistest"
)

// applied collects what a watcher hands on.
type applied struct {
	mu    sync.Mutex
	snaps []Snapshot
	ch    chan Snapshot
}

func newApplied() *applied { return &applied{ch: make(chan Snapshot, 16)} }

func (a *applied) apply(s Snapshot) {
	a.mu.Lock()
	a.snaps = append(a.snaps, s)
	a.mu.Unlock()
	a.ch <- s
}

func (a *applied) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.snaps)
}

// next waits (bounded, generously) for the next snapshot handed on.
func (a *applied) next(t *testing.T) Snapshot {
	t.Helper()
	select {
	case s := <-a.ch:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal("no snapshot handed on")
		return Snapshot{}
	}
}

// TestWatcherAppliesOnTheNextTick: two replicas' stores on one Redis; a key
// created through one is handed on by the other's watcher at its next
// tick, and only then (it polls nothing between ticks); a tick with nothing
// changed hands nothing on; Close stops it (goleak).
func TestWatcherAppliesOnTheNextTick(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	writer := NewRedis(srv.Client(t), "tollgate:")
	reader := NewRedis(srv.Client(t), "tollgate:")
	tick := make(chan time.Time)
	w := NewWatcher(reader, WatchOptions{Tick: tick})
	a := newApplied()
	if err := w.Start(ctx, a.apply); err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if s := a.next(t); s.Version != 0 || len(s.Keys) != 0 {
		t.Fatalf("start handed on %+v", s)
	}

	k, _ := newKey(t, "alice", "")
	if err := writer.Create(ctx, k, event("create", k)); err != nil {
		t.Fatal(err)
	}
	if n := a.count(); n != 1 {
		t.Fatalf("%d snapshots handed on before any tick, want only the start's", n)
	}
	tick <- t0
	if s := a.next(t); s.Version != 1 || len(s.Keys) != 1 || s.Keys[0].SHA256 != k.SHA256 {
		t.Fatalf("after the tick: %+v", s)
	}
	// Nothing changed: the next tick reads the version and hands nothing
	// on. The tick after it is received only once the first is done.
	tick <- t0
	tick <- t0
	if n := a.count(); n != 2 {
		t.Errorf("%d snapshots after ticks with nothing changed, want 2", n)
	}

	// Refresh reads at once and returns once applied.
	if _, err := writer.Update(ctx, "alice", func(k *Key) error { k.Revoked = t0; return nil },
		func(k Key) Event { return event("revoke", k) }); err != nil {
		t.Fatal(err)
	}
	if err := w.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if n := a.count(); n != 3 {
		t.Fatalf("%d snapshots after Refresh, want 3", n)
	}
	if s := a.next(t); s.Keys[0].Status(t0) != "revoked" {
		t.Errorf("after Refresh: %+v", s)
	}
	w.Close()
	if err := w.Refresh(ctx); err == nil {
		t.Error("Refresh after Close succeeded")
	}
}

// TestWatcherKeepsKeysWhileStoreIsDown: with Redis stopped, ticks fail
// (logged once), nothing is handed on (the last keys stay in force), and
// once Redis is back the next tick reads the keys again.
func TestWatcherKeepsKeysWhileStoreIsDown(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t, redistest.Persistent())
	s := NewRedis(srv.Client(t), "tollgate:")
	k, _ := newKey(t, "alice", "")
	if err := s.Create(ctx, k, event("create", k)); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	var logMu sync.Mutex
	tick := make(chan time.Time)
	w := NewWatcher(s, WatchOptions{Tick: tick, Timeout: time.Second,
		Logger: slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &logMu}, nil))})
	a := newApplied()
	if err := w.Start(ctx, a.apply); err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	a.next(t)
	srv.Kill()
	for range 3 {
		tick <- t0
	}
	if err := w.Refresh(ctx); err == nil {
		t.Error("Refresh with Redis down succeeded")
	}
	logMu.Lock()
	warned := strings.Count(logs.String(), "the store cannot be read")
	logMu.Unlock()
	if warned != 1 || a.count() != 1 {
		t.Errorf("while Redis is down: %d warnings (want 1), %d snapshots (want the start's)", warned, a.count())
	}
	srv.Start()
	// The client reconnects on its own; the version is 1 as before, so
	// nothing is handed on, but the watcher says the store is back.
	for i := 0; ; i++ {
		if err := w.Refresh(ctx); err == nil {
			break
		}
		if i == 100 {
			t.Fatal("the store never answered again")
		}
		time.Sleep(50 * time.Millisecond)
	}
	logMu.Lock()
	defer logMu.Unlock()
	if !strings.Contains(logs.String(), "the store can be read again") {
		t.Errorf("no note that the store is back:\n%s", logs.String())
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
