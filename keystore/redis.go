package keystore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// Redis is a Store in Redis, shared by every replica: a hash of the keys
// (name → JSON), a version counter and the audit list, under one Cluster
// hash tag so that a change of all three is one script on one node.
// Changes are compare-and-set: a change reads the key, changes it, and
// writes it only if nobody wrote it since (else it reads again), so two
// operators revoking and rotating one key at once both take effect, in some
// order.
type Redis struct {
	c                 redis.UniversalClient
	recs, ver, events string
}

var _ Store = (*Redis)(nil)

// NewRedis returns a store on c with keys under prefix (e.g. "tollgate:").
// Closing it does not close c.
func NewRedis(c redis.UniversalClient, prefix string) *Redis {
	// The {keys} hash tag puts the three in one Cluster slot: a script
	// may touch them all. There is one set of runtime keys, so one slot
	// holds no more than it must.
	return &Redis{c: c, recs: prefix + "keys:{keys}:recs", ver: prefix + "keys:{keys}:ver",
		events: prefix + "keys:{keys}:audit"}
}

// swapScript writes ARGV[3] as field ARGV[1] of the keys hash if its value
// is still ARGV[2] ("" for none), bumps the version, and pushes ARGV[4] on
// the audit list (kept to ARGV[5] entries); it returns the new version, or
// -1 when the field changed.
var swapScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then cur = '' end
if cur ~= ARGV[2] then return -1 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
local v = redis.call('INCR', KEYS[2])
redis.call('LPUSH', KEYS[3], ARGV[4])
redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[5]) - 1)
return v
`)

// snapshotScript returns the version and every field of the keys hash, read
// at one instant.
var snapshotScript = redis.NewScript(`
return {redis.call('GET', KEYS[2]) or '0', redis.call('HGETALL', KEYS[1])}
`)

// maxSwaps bounds a change's compare-and-set attempts: each conflict is
// another operator's change of the same key, so a few suffice.
const maxSwaps = 16

// Version implements Store: one GET.
func (r *Redis) Version(ctx context.Context) (int64, error) {
	v, err := r.c.Get(ctx, r.ver).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("keystore: reading the version: %w", err)
	}
	return v, nil
}

// Snapshot implements Store.
func (r *Redis) Snapshot(ctx context.Context) (Snapshot, error) {
	res, err := snapshotScript.Run(ctx, r.c, []string{r.recs, r.ver}).Slice()
	if err != nil {
		return Snapshot{}, fmt.Errorf("keystore: reading the keys: %w", err)
	}
	if len(res) != 2 {
		return Snapshot{}, fmt.Errorf("keystore: reading the keys: %d replies, want 2", len(res))
	}
	vs, _ := res[0].(string)
	v, err := strconv.ParseInt(vs, 10, 64)
	if err != nil {
		return Snapshot{}, fmt.Errorf("keystore: the version %q is not a number", vs)
	}
	fields, _ := res[1].([]any)
	snap := Snapshot{Version: v, Keys: make([]Key, 0, len(fields)/2)}
	for i := 0; i+1 < len(fields); i += 2 {
		name, _ := fields[i].(string)
		doc, _ := fields[i+1].(string)
		var k Key
		if err := json.Unmarshal([]byte(doc), &k); err != nil {
			return Snapshot{}, fmt.Errorf("keystore: runtime key %q is corrupt in Redis: %w", name, err)
		}
		k.Name = name
		snap.Keys = append(snap.Keys, k)
	}
	sort.Slice(snap.Keys, func(i, j int) bool { return snap.Keys[i].Name < snap.Keys[j].Name })
	return snap, nil
}

// get returns the stored JSON of the key named name, "" when there is none.
func (r *Redis) get(ctx context.Context, name string) (string, error) {
	doc, err := r.c.HGet(ctx, r.recs, name).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("keystore: reading runtime key %q: %w", name, err)
	}
	return doc, nil
}

// swap writes k over old (the JSON read, "" for none) with ev; ok is false
// when the key changed since old was read.
func (r *Redis) swap(ctx context.Context, old string, k Key, ev Event) (ok bool, err error) {
	doc, err := json.Marshal(&k)
	if err != nil {
		return false, fmt.Errorf("keystore: encoding runtime key %q: %w", k.Name, err)
	}
	line, err := json.Marshal(&ev)
	if err != nil {
		return false, fmt.Errorf("keystore: encoding an audit event: %w", err)
	}
	v, err := swapScript.Run(ctx, r.c, []string{r.recs, r.ver, r.events}, k.Name, old, doc, line, MaxAudit).Int64()
	if err != nil {
		return false, fmt.Errorf("keystore: writing runtime key %q: %w", k.Name, err)
	}
	return v >= 0, nil
}

// Create implements Store.
func (r *Redis) Create(ctx context.Context, k Key, ev Event) error {
	for range maxSwaps {
		old, err := r.get(ctx, k.Name)
		if err != nil {
			return err
		}
		var cur *Key
		if old != "" {
			cur = new(Key)
			if err := json.Unmarshal([]byte(old), cur); err != nil {
				return fmt.Errorf("keystore: runtime key %q is corrupt in Redis: %w", k.Name, err)
			}
			if cur.Revoked.IsZero() {
				return ErrExists
			}
		}
		ok, err := r.swap(ctx, old, replaced(k, cur), ev)
		if err != nil || ok {
			return err
		}
	}
	return fmt.Errorf("keystore: runtime key %q kept changing under %d attempts to create it", k.Name, maxSwaps)
}

// Update implements Store.
func (r *Redis) Update(ctx context.Context, name string, change func(*Key) error, ev func(Key) Event) (Key, error) {
	for range maxSwaps {
		old, err := r.get(ctx, name)
		if err != nil {
			return Key{}, err
		}
		if old == "" {
			return Key{}, ErrNotFound
		}
		var k Key
		if err := json.Unmarshal([]byte(old), &k); err != nil {
			return Key{}, fmt.Errorf("keystore: runtime key %q is corrupt in Redis: %w", name, err)
		}
		if err := change(&k); err != nil {
			return Key{}, err
		}
		k.Name = name
		ok, err := r.swap(ctx, old, k, ev(k))
		if err != nil {
			return Key{}, err
		}
		if ok {
			return k, nil
		}
	}
	return Key{}, fmt.Errorf("keystore: runtime key %q kept changing under %d attempts to change it", name, maxSwaps)
}

// Audit implements Store.
func (r *Redis) Audit(ctx context.Context, limit int) ([]Event, error) {
	if limit <= 0 {
		return nil, nil
	}
	lines, err := r.c.LRange(ctx, r.events, 0, int64(limit)-1).Result()
	if err != nil {
		return nil, fmt.Errorf("keystore: reading the audit log: %w", err)
	}
	out := make([]Event, 0, len(lines))
	for _, l := range lines {
		var ev Event
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			return nil, fmt.Errorf("keystore: an audit event is corrupt in Redis: %w", err)
		}
		out = append(out, ev)
	}
	return out, nil
}

// Close implements Store; the client is its owner's to close.
func (r *Redis) Close() error { return nil }
