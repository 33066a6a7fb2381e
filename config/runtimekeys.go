package config

import (
	"errors"
	"time"
)

// RuntimeKeys is the [runtime_keys] table: gateway keys issued while the
// gateway runs (POST /admin/keys, `gateway keys create`) rather than listed
// in [[keys]], kept in a store every replica reads (Redis when [redis] is
// set, else StateFile), so that a key issued or revoked on one replica holds
// on every other within PollIntervalMs without a reload.
type RuntimeKeys struct {
	// Enabled turns runtime keys on. It needs [auth] mode = "keys": a
	// runtime key is a gateway key, never one that goes upstream. Default
	// false.
	Enabled bool `toml:"enabled"`
	// StateFile, without Redis, is the file the runtime keys (their
	// SHA-256, never the key) and their audit log are kept in, rewritten
	// atomically at every change. "" keeps them in memory only: a restart
	// forgets every runtime key. Unused with Redis. Default
	// "tollgate-keys.json".
	StateFile string `toml:"state_file"`
	// PollIntervalMs is how often each replica asks the store whether the
	// keys changed (one read of a version counter); a change is seen
	// within this interval plus one read of the keys. At most 1000.
	// Default 250.
	PollIntervalMs float64 `toml:"poll_interval_ms"`
}

// PollInterval is PollIntervalMs as a duration.
func (r *RuntimeKeys) PollInterval() time.Duration { return Millis(r.PollIntervalMs) }

// maxPollIntervalMs keeps the stated bound: a key issued or revoked holds
// on every replica within a second.
const maxPollIntervalMs = 1000

func (c *Config) validateRuntimeKeys(v *validator) {
	r := &c.RuntimeKeys
	v.duration("runtime_keys.poll_interval_ms", r.PollIntervalMs, time.Millisecond, false)
	if r.PollIntervalMs > maxPollIntervalMs {
		v.add("runtime_keys.poll_interval_ms", "%g is above %d: a revoked key must be refused on every replica within a second", r.PollIntervalMs, maxPollIntervalMs)
	}
	if r.Enabled && c.Auth.Mode != "keys" {
		v.add("runtime_keys.enabled", `needs [auth] mode = "keys": a runtime key is a gateway key, and in mode %q callers' keys go upstream`, c.Auth.Mode)
	}
}

// CheckRuntimeKey checks a runtime key's name, team and limits against c as
// [[keys]] tables are checked: a name of a-z, 0-9, _ and -, not "none" and
// not the name of a [[keys]] table (which would win over it); a team that
// is a [[teams]] name; limits > 0, cost budgets only with prices. Its
// SHA-256 is the gateway's to make and is not checked. Each problem is
// "<field>: <problem>", all of them joined.
func (c *Config) CheckRuntimeKey(k *Key) error {
	var v validator
	v.uniqueName("name", k.Name, "keys", 0, map[string]int{})
	for i := range c.Keys {
		if c.Keys[i].Name == k.Name {
			v.add("name", "%q is the name of a [[keys]] table in gateway.toml, which would win over it; choose another name", k.Name)
		}
	}
	if k.Team != "" && c.Team(k.Team) == nil {
		v.add("team", "%q is not a [[teams]] name", k.Team)
	}
	k.Limits.validate(&v, "", len(c.Models) > 0)
	errs := make([]error, len(v.errs))
	for i, e := range v.errs {
		var fe *fieldError
		if errors.As(e, &fe) {
			key := fe.key
			if len(key) > 0 && key[0] == '.' {
				key = key[1:]
			}
			errs[i] = errors.New(key + ": " + fe.msg)
			continue
		}
		errs[i] = e
	}
	return errors.Join(errs...)
}
