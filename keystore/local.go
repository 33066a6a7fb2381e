package keystore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/tollgate-llm/tollgate/internal/atomicfile"
)

// ErrClosed is returned by a Local's methods after Close.
var ErrClosed = errors.New("keystore: store is closed")

// Local is a Store kept in the process, for a gateway without Redis: the
// keys and the audit log under a mutex and, with a file, written whole to
// it at every change (atomically: a crash leaves the old file or the new
// one), before the change is acknowledged. Changes are rare (an operator
// issuing or revoking a key), so a rewrite per change costs nothing that
// matters. One process owns the file.
type Local struct {
	file string

	mu     sync.Mutex
	closed bool
	st     localState
}

// localState is the state file's document.
type localState struct {
	Version int64   `json:"version"`
	Keys    []Key   `json:"keys"`
	Audit   []Event `json:"audit"` // newest first, at most MaxAudit
}

var _ Store = (*Local)(nil)

// NewLocal opens the store kept in file ("" keeps it in memory only),
// reading what the file holds if it exists. A file that does not decode is
// an error, never silently emptied: it holds who may call the gateway.
func NewLocal(file string) (*Local, error) {
	l := &Local{file: file}
	if file == "" {
		return l, nil
	}
	if _, err := readLocal(file, &l.st); err != nil {
		return nil, err
	}
	return l, nil
}

// readLocal reads a Local store's file into st without opening the store
// (check-config lists the keys of a gateway that runs). found is false
// when there is no file.
func readLocal(file string, st *localState) (found bool, err error) {
	return atomicfile.ReadJSON("keystore", "runtime keys file", file, st)
}

// ReadLocalSnapshot is the snapshot a Local store of file holds, read
// without opening it.
func ReadLocalSnapshot(file string) (Snapshot, error) {
	var st localState
	if _, err := readLocal(file, &st); err != nil {
		return Snapshot{}, err
	}
	return Snapshot{Version: st.Version, Keys: st.Keys}, nil
}

// Version implements Store.
func (l *Local) Version(ctx context.Context) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return 0, ErrClosed
	}
	return l.st.Version, nil
}

// Snapshot implements Store. The keys are copies the caller may keep.
func (l *Local) Snapshot(ctx context.Context) (Snapshot, error) {
	if err := ctx.Err(); err != nil {
		return Snapshot{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return Snapshot{}, ErrClosed
	}
	// Keys are replaced whole, never changed in place: a shallow copy of
	// the slice is a snapshot.
	return Snapshot{Version: l.st.Version, Keys: slices.Clone(l.st.Keys)}, nil
}

// Create implements Store.
func (l *Local) Create(ctx context.Context, k Key, ev Event) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	i, found := l.find(k.Name)
	var cur *Key
	if found {
		cur = &l.st.Keys[i]
		if cur.Revoked.IsZero() {
			return ErrExists
		}
	}
	return l.commit(replaced(k, cur), ev)
}

// Update implements Store.
func (l *Local) Update(ctx context.Context, name string, change func(*Key) error, ev func(Key) Event) (Key, error) {
	if err := ctx.Err(); err != nil {
		return Key{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return Key{}, ErrClosed
	}
	i, found := l.find(name)
	if !found {
		return Key{}, ErrNotFound
	}
	k := cloneKey(l.st.Keys[i])
	if err := change(&k); err != nil {
		return Key{}, err
	}
	k.Name = name
	if err := l.commit(k, ev(k)); err != nil {
		return Key{}, err
	}
	return k, nil
}

// Audit implements Store.
func (l *Local) Audit(ctx context.Context, limit int) ([]Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, ErrClosed
	}
	return slices.Clone(l.st.Audit[:min(max(limit, 0), len(l.st.Audit))]), nil
}

// Close implements Store: later calls return ErrClosed. Every change was
// written when it was made; there is nothing to flush.
func (l *Local) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	return nil
}

// find returns the index of the key named name, or where it would go.
func (l *Local) find(name string) (int, bool) {
	return sort.Find(len(l.st.Keys), func(i int) int { return strings.Compare(name, l.st.Keys[i].Name) })
}

// commit puts k (in its place by name) and ev into a copy of the state,
// writes that to the file, and only then keeps it: a write that fails
// changes nothing.
func (l *Local) commit(k Key, ev Event) error {
	next := localState{Version: l.st.Version + 1, Keys: slices.Clone(l.st.Keys)}
	i, found := l.find(k.Name)
	if found {
		next.Keys[i] = k
	} else {
		next.Keys = slices.Insert(next.Keys, i, k)
	}
	next.Audit = make([]Event, 0, min(len(l.st.Audit)+1, MaxAudit))
	next.Audit = append(next.Audit, ev)
	next.Audit = append(next.Audit, l.st.Audit[:min(len(l.st.Audit), MaxAudit-1)]...)
	if l.file != "" {
		data, err := json.Marshal(&next)
		if err != nil {
			return fmt.Errorf("keystore: encoding the runtime keys: %w", err)
		}
		if err := atomicfile.Write(l.file, data); err != nil {
			return fmt.Errorf("keystore: writing runtime keys file %s: %w", l.file, err)
		}
	}
	l.st = next
	return nil
}

// cloneKey is a copy of k whose labels and retired hashes are its own.
func cloneKey(k Key) Key {
	if k.Labels != nil {
		labels := make(map[string]string, len(k.Labels))
		for n, v := range k.Labels {
			labels[n] = v
		}
		k.Labels = labels
	}
	k.Retired = slices.Clone(k.Retired)
	return k
}
