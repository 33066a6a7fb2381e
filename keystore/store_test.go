package keystore

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/internal/redistest"
)

// TestMain fails the package if a test leaves a goroutine behind (a
// watcher not closed, a Redis client not closed).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// stores are the stores every behaviour runs against.
var stores = []struct {
	name string
	open func(t *testing.T) Store
}{
	{"LocalMemory", func(t *testing.T) Store { return openLocal(t, "") }},
	{"LocalFile", func(t *testing.T) Store { return openLocal(t, filepath.Join(t.TempDir(), "keys.json")) }},
	{"Redis", func(t *testing.T) Store { return NewRedis(redistest.Start(t).Client(t), "test:") }},
	// A real Cluster: the keys, the version and the audit list share one
	// slot, or the change script would be refused (CROSSSLOT).
	{"RedisCluster", func(t *testing.T) Store { return NewRedis(redistest.StartCluster(t).Client(t), "test:") }},
}

func openLocal(t *testing.T, file string) *Local {
	t.Helper()
	l, err := NewLocal(file)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func newKey(t *testing.T, name, team string) (Key, string) {
	t.Helper()
	secret, sum, err := Secret()
	if err != nil {
		t.Fatal(err)
	}
	rpm := int64(60)
	return Key{Key: config.Key{Name: name, SHA256: sum, Team: team, Limits: config.Limits{RPM: &rpm}},
		Labels: map[string]string{"email": name + "@example.com"}, Created: t0, CreatedBy: "ops"}, secret
}

func event(action string, k Key) Event {
	return Event{Time: t0, Actor: "ops", Action: action, Name: k.Name, Team: k.Team, SHA256: k.SHA256}
}

func snapshot(t *testing.T, s Store) Snapshot {
	t.Helper()
	snap, err := s.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

func version(t *testing.T, s Store) int64 {
	t.Helper()
	v, err := s.Version(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestStoreBehaviours: create, a second create of the name refused, revoke,
// re-create over the revoked one (its hash retired), rotate; every change
// bumps the version and writes an audit event, newest first.
func TestStoreBehaviours(t *testing.T) {
	ctx := context.Background()
	for _, sc := range stores {
		t.Run(sc.name, func(t *testing.T) {
			s := sc.open(t)
			if v := version(t, s); v != 0 {
				t.Fatalf("empty store at version %d", v)
			}
			alice, _ := newKey(t, "alice", "red")
			if err := s.Create(ctx, alice, event("create", alice)); err != nil {
				t.Fatal(err)
			}
			bob, _ := newKey(t, "bob", "")
			if err := s.Create(ctx, bob, event("create", bob)); err != nil {
				t.Fatal(err)
			}
			again, _ := newKey(t, "alice", "blue")
			if err := s.Create(ctx, again, event("create", again)); !errors.Is(err, ErrExists) {
				t.Fatalf("second create of alice: %v, want ErrExists", err)
			}
			snap := snapshot(t, s)
			if snap.Version != 2 || len(snap.Keys) != 2 || snap.Keys[0].Name != "alice" || snap.Keys[1].Name != "bob" {
				t.Fatalf("snapshot %+v", snap)
			}
			got := snap.Keys[0]
			if got.SHA256 != alice.SHA256 || got.Team != "red" || got.RPM == nil || *got.RPM != 60 ||
				got.Labels["email"] != "alice@example.com" || !got.Created.Equal(t0) || got.Status(t0) != "active" {
				t.Errorf("alice read back as %+v", got)
			}

			revoked, err := s.Update(ctx, "alice", func(k *Key) error { k.Revoked, k.RevokedBy = t0, "ops"; return nil },
				func(k Key) Event { return event("revoke", k) })
			if err != nil || revoked.Status(t0) != "revoked" {
				t.Fatalf("revoke: %+v, %v", revoked, err)
			}
			if _, err := s.Update(ctx, "carol", func(*Key) error { return nil }, func(k Key) Event { return event("revoke", k) }); !errors.Is(err, ErrNotFound) {
				t.Errorf("update of a name nobody has: %v, want ErrNotFound", err)
			}
			refuse := errors.New("refused")
			if _, err := s.Update(ctx, "bob", func(*Key) error { return refuse }, func(k Key) Event { return event("revoke", k) }); !errors.Is(err, refuse) {
				t.Errorf("a change that fails: %v", err)
			}
			if v := version(t, s); v != 3 {
				t.Errorf("version %d after create, create, revoke (and two changes refused), want 3", v)
			}

			// A revoked name may be issued again; the old secret is retired.
			if err := s.Create(ctx, again, event("create", again)); err != nil {
				t.Fatalf("create over the revoked alice: %v", err)
			}
			_, newSum, _ := Secret()
			rotated, err := s.Update(ctx, "alice", func(k *Key) error { Rotate(k, newSum, t0); return nil },
				func(k Key) Event { return event("rotate", k) })
			if err != nil {
				t.Fatal(err)
			}
			if rotated.SHA256 != newSum || len(rotated.Retired) != 2 || rotated.Retired[0] != alice.SHA256 ||
				rotated.Retired[1] != again.SHA256 || rotated.Team != "blue" {
				t.Errorf("rotated alice %+v: want the new hash, both old ones retired, oldest first", rotated)
			}
			evs, err := s.Audit(ctx, 100)
			if err != nil {
				t.Fatal(err)
			}
			var actions []string
			for _, e := range evs {
				actions = append(actions, e.Action+":"+e.Name)
			}
			want := []string{"rotate:alice", "create:alice", "revoke:alice", "create:bob", "create:alice"}
			if len(actions) != len(want) {
				t.Fatalf("audit %v, want %v", actions, want)
			}
			for i := range want {
				if actions[i] != want[i] {
					t.Fatalf("audit %v, want %v", actions, want)
				}
			}
			if evs[0].SHA256 != newSum || evs[2].SHA256 != alice.SHA256 {
				t.Errorf("audit hashes %+v", evs[:3])
			}
			if evs, _ := s.Audit(ctx, 2); len(evs) != 2 || evs[0].Action != "rotate" {
				t.Errorf("audit limited to 2: %+v", evs)
			}
		})
	}
}

// TestStoreConcurrentChanges: changes of one key from many goroutines all
// take effect (compare-and-set retries, or the mutex), each once.
func TestStoreConcurrentChanges(t *testing.T) {
	ctx := context.Background()
	for _, sc := range stores {
		t.Run(sc.name, func(t *testing.T) {
			s := sc.open(t)
			k, _ := newKey(t, "alice", "")
			if err := s.Create(ctx, k, event("create", k)); err != nil {
				t.Fatal(err)
			}
			const n = 8
			var wg sync.WaitGroup
			for range n {
				wg.Go(func() {
					_, sum, _ := Secret()
					if _, err := s.Update(ctx, "alice", func(k *Key) error { Rotate(k, sum, t0); return nil },
						func(k Key) Event { return event("rotate", k) }); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			snap := snapshot(t, s)
			if snap.Version != n+1 || len(snap.Keys[0].Retired) != MaxRetired {
				t.Errorf("after %d rotations: version %d, %d retired; want %d and %d", n, snap.Version,
					len(snap.Keys[0].Retired), n+1, MaxRetired)
			}
			if evs, _ := s.Audit(ctx, 100); len(evs) != n+1 {
				t.Errorf("%d audit events, want %d", len(evs), n+1)
			}
		})
	}
}

// TestLocalFileSurvivesReopen: the file holds the keys, the version and the
// audit log; a corrupt file is an error, not an empty store.
func TestLocalFileSurvivesReopen(t *testing.T) {
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "keys.json")
	l, err := NewLocal(file)
	if err != nil {
		t.Fatal(err)
	}
	k, _ := newKey(t, "alice", "red")
	if err := l.Create(ctx, k, event("create", k)); err != nil {
		t.Fatal(err)
	}
	_ = l.Close()
	if _, err := l.Version(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Version after Close: %v", err)
	}
	snap, err := ReadLocalSnapshot(file)
	if err != nil || snap.Version != 1 || len(snap.Keys) != 1 || snap.Keys[0].SHA256 != k.SHA256 {
		t.Fatalf("ReadLocalSnapshot: %+v, %v", snap, err)
	}
	l2 := openLocal(t, file)
	if v := version(t, l2); v != 1 {
		t.Errorf("reopened at version %d", v)
	}
	if evs, _ := l2.Audit(ctx, 10); len(evs) != 1 || evs[0].Name != "alice" {
		t.Errorf("reopened audit %+v", evs)
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := writeFile(bad, `{"version":1,"keys":[{"name":"x"`); err != nil {
		t.Fatal(err)
	}
	if _, err := NewLocal(bad); err == nil {
		t.Error("a corrupt file opened as a store")
	}
}

// TestLocalFailedWriteChangesNothing: a change the file cannot take is not
// kept.
func TestLocalFailedWriteChangesNothing(t *testing.T) {
	ctx := context.Background()
	l := openLocal(t, filepath.Join(t.TempDir(), "gone", "keys.json"))
	k, _ := newKey(t, "alice", "")
	if err := l.Create(ctx, k, event("create", k)); err == nil {
		t.Fatal("create into a directory that does not exist succeeded")
	}
	if snap := snapshot(t, l); snap.Version != 0 || len(snap.Keys) != 0 {
		t.Errorf("after a failed write: %+v", snap)
	}
}
