// Package keystore keeps the gateway keys issued at runtime ("runtime
// keys"): each key's name, team, limits, expiry and labels with the SHA-256
// of its secret (never the secret), whether it was revoked, and an audit log
// of every change. Two stores implement Store: Redis, shared by every
// replica, and Local, in the process with a state file. Every change bumps
// a version counter, which a Watcher polls so that each replica reloads the
// keys, and only the keys, when they changed.
package keystore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/tollgate-llm/tollgate/config"
)

// Key is one runtime key: a [[keys]] table (name, sha256, team, limits)
// issued at runtime, with what a table in a file does not need.
type Key struct {
	config.Key
	// Labels are the issuer's notes (owner's email, cost centre); never
	// a metric label.
	Labels map[string]string `json:"labels,omitempty"`
	// Created is when the key was issued, CreatedBy who issued it.
	Created   time.Time `json:"created"`
	CreatedBy string    `json:"created_by,omitempty"`
	// Expires is when the key stops working; zero: never.
	Expires time.Time `json:"expires,omitzero"`
	// Revoked is when the key was revoked (zero: it was not), RevokedBy by
	// whom.
	Revoked   time.Time `json:"revoked,omitzero"`
	RevokedBy string    `json:"revoked_by,omitempty"`
	// Rotated is when the key last got a new secret (zero: never).
	Rotated time.Time `json:"rotated,omitzero"`
	// Retired are the SHA-256 of the secrets this key had before, newest
	// last (at most MaxRetired): a caller still presenting one is told the
	// key was replaced rather than that it is unknown.
	Retired []string `json:"retired,omitempty"`
}

// MaxRetired is how many former secrets' hashes a key keeps.
const MaxRetired = 8

// Status says whether k admits callers at now: "active", "revoked" or
// "expired".
func (k *Key) Status(now time.Time) string {
	switch {
	case !k.Revoked.IsZero():
		return "revoked"
	case !k.Expires.IsZero() && !now.Before(k.Expires):
		return "expired"
	}
	return "active"
}

// retire keeps sum among k's former secrets, dropping the oldest past
// MaxRetired.
func (k *Key) retire(sum string) {
	k.Retired = append(k.Retired, sum)
	if n := len(k.Retired); n > MaxRetired {
		k.Retired = slices.Clone(k.Retired[n-MaxRetired:])
	}
}

// Snapshot is every runtime key at one version of the store, sorted by
// name.
type Snapshot struct {
	Version int64
	Keys    []Key
}

// Event is one change in the audit log. It names the key and the SHA-256
// of its secret, never the secret.
type Event struct {
	Time time.Time `json:"time"`
	// Actor is who made the change, as the admin API was told
	// (X-Tollgate-Actor), and Remote the address it came from: the admin
	// token is one secret shared by every operator, so the actor is what
	// they say they are.
	Actor  string `json:"actor"`
	Remote string `json:"remote,omitempty"`
	// Action is "create", "revoke" or "rotate".
	Action string `json:"action"`
	Name   string `json:"name"`
	Team   string `json:"team,omitempty"`
	// SHA256 is the hash of the secret the change issued (create, rotate)
	// or ended (revoke).
	SHA256 string `json:"sha256"`
}

// MaxAudit is how many audit events a store keeps, newest first.
const MaxAudit = 10000

// Store keeps the runtime keys.
type Store interface {
	// Version is the store's version: it changes with every change of
	// the keys. It is the one read a Watcher makes per poll.
	Version(ctx context.Context) (int64, error)
	// Snapshot returns every key with the version they are at.
	Snapshot(ctx context.Context) (Snapshot, error)
	// Create stores k, unless a key of that name exists that is not
	// revoked (ErrExists); a revoked one is replaced, and its secret's
	// hash kept among k's retired. ev is written to the audit log with
	// it, in one step.
	Create(ctx context.Context, k Key, ev Event) error
	// Update applies change to the key named name (ErrNotFound when there
	// is none) and stores the result with ev, in one step; change's error
	// is returned as it is, and nothing is stored then. ev is built from
	// the changed key.
	Update(ctx context.Context, name string, change func(*Key) error, ev func(Key) Event) (Key, error)
	// Audit returns up to limit events, newest first.
	Audit(ctx context.Context, limit int) ([]Event, error)
	// Close releases the store.
	Close() error
}

var (
	// ErrExists is Create's error for a name taken by a key not revoked.
	ErrExists = errors.New("keystore: a runtime key of that name exists")
	// ErrNotFound is Update's error for a name no key has.
	ErrNotFound = errors.New("keystore: no runtime key of that name")
)

// Secret makes a new key's secret from crypto/rand, "tg-" and 48 hex digits
// (192 bits, as `gateway hash-key -generate` makes), and its SHA-256 in hex.
func Secret() (secret, sum string, err error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", "", fmt.Errorf("keystore: reading random bytes: %w", err)
	}
	secret = "tg-" + hex.EncodeToString(b)
	s := sha256.Sum256([]byte(secret))
	return secret, hex.EncodeToString(s[:]), nil
}

// replaced is what Create stores for k over cur, a revoked key of its name
// (nil: none): k, with cur's secrets among k's retired.
func replaced(k Key, cur *Key) Key {
	if cur == nil {
		return k
	}
	k.Retired = slices.Clone(cur.Retired)
	k.retire(cur.SHA256)
	return k
}

// Rotate gives k a new secret, sum its hash, at now, keeping the old one's
// hash among its retired.
func Rotate(k *Key, sum string, now time.Time) {
	k.retire(k.SHA256)
	k.SHA256 = sum
	k.Rotated = now
}
