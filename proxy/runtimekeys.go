package proxy

import (
	"crypto/sha256"
	"time"

	"github.com/tollgate-llm/tollgate/keystore"
)

// runtimeIndex is the runtime keys (package keystore) as one configuration
// sees them: the keys that admit callers, by the hash of their secret, and
// the hashes refused with a reason a caller holding one may be told.
// It is built whole when the keys or the configuration change, and never
// changed afterwards.
type runtimeIndex struct {
	version int64
	keys    map[[sha256.Size]byte]*keyEntry
	refused map[[sha256.Size]byte]refusedKey
	// clashes are the runtime keys a [[keys]] table of the same name
	// hides: the file wins.
	clashes []string
}

// refusedKey says why a runtime key's secret no longer admits its caller.
type refusedKey struct {
	name string
	why  string // "revoked", "replaced", "orphaned" (its team is gone), "shadowed" (a [[keys]] name)
	at   time.Time
	team string
}

// newRuntimeIndex indexes snap for gv. A runtime key whose name a [[keys]]
// table has is shadowed by it (the file wins, as documented); one whose team
// this configuration does not have admits nobody until the team is back.
func newRuntimeIndex(gv *governance, snap keystore.Snapshot) *runtimeIndex {
	idx := &runtimeIndex{version: snap.Version, keys: make(map[[sha256.Size]byte]*keyEntry, len(snap.Keys)),
		refused: map[[sha256.Size]byte]refusedKey{}}
	configNames := make(map[string]bool, len(gv.keys))
	for _, k := range gv.keys {
		configNames[k.name] = true
	}
	for i := range snap.Keys {
		k := &snap.Keys[i]
		for _, old := range k.Retired {
			if sum, ok := decodeSum(old); ok {
				idx.refused[sum] = refusedKey{name: k.Name, why: "replaced", at: k.Rotated}
			}
		}
		sum, ok := decodeSum(k.SHA256)
		if !ok {
			continue
		}
		switch {
		case configNames[k.Name]:
			idx.clashes = append(idx.clashes, k.Name)
			idx.refused[sum] = refusedKey{name: k.Name, why: "shadowed"}
			continue
		case !k.Revoked.IsZero():
			idx.refused[sum] = refusedKey{name: k.Name, why: "revoked", at: k.Revoked}
			continue
		}
		e, err := gv.newKeyEntry(&k.Key)
		if err != nil {
			idx.refused[sum] = refusedKey{name: k.Name, why: "orphaned", team: k.Team}
			continue
		}
		e.expires = k.Expires
		idx.keys[sum] = e
	}
	return idx
}

// refuseKey is the 401 of a key that admits nobody. The caller presented
// this very secret, so telling it that its key was revoked, replaced or has
// expired tells it nothing about any other key: a runtime key is 192
// random bits, so a key cannot be guessed to learn whether it exists. The
// message names the key by its hash prefix only, as every refusal does; a
// developer whose apiKeyHelper gets it knows to ask for a new key rather
// than to look for a typo.
func (gv *governance) refuseKey(c credential) *apiError {
	if idx := gv.runtime.Load(); idx != nil {
		if k := idx.keys[c.sum]; k != nil && !k.expires.IsZero() && !gv.now().Before(k.expires) {
			return errUnauthorized("API key (id " + c.id() + ") expired at " + k.expires.UTC().Format(time.RFC3339) +
				": ask for a new one")
		}
		if r, ok := idx.refused[c.sum]; ok {
			switch r.why {
			case "revoked":
				return errUnauthorized("API key (id " + c.id() + ") was revoked at " + r.at.UTC().Format(time.RFC3339) +
					": ask for a new one")
			case "replaced":
				return errUnauthorized("API key (id " + c.id() + ") was replaced by a new one: use the new key")
			}
			// A shadowed or orphaned key is the operators' mistake, and
			// theirs to find in the log: the caller is told no more than
			// for an unknown key.
		}
	}
	return errUnknownKey(c.id())
}

// SetRuntimeKeys makes snap the runtime keys every request from now on is
// identified by (keystore.Watcher hands each new version here); requests in
// flight keep the key they were admitted with, so a revoked key's streams
// already open finish. It holds the reload lock, so a reload and a change
// of keys never cross: each new configuration is built with the latest
// keys.
func (g *Gateway) SetRuntimeKeys(snap keystore.Snapshot) {
	g.reloadMu.Lock()
	defer g.reloadMu.Unlock()
	g.runtimeKeys = snap
	gv := g.gen.Load().gov
	idx := newRuntimeIndex(gv, snap)
	gv.runtime.Store(idx)
	g.log.Info("runtime keys loaded", "version", snap.Version, "keys", len(snap.Keys), "admitting", len(idx.keys))
	for _, name := range idx.clashes {
		g.log.Warn("runtime key shadowed by a [[keys]] table of the same name, which wins: revoke it", "name", name)
	}
}
