package config

import (
	"math"
	"strings"
)

// IsZero reports whether no limit is set.
func (l Limits) IsZero() bool {
	return l.RPM == nil && l.TPM == nil && l.Concurrency == nil && l.TokensPerDay == nil &&
		l.CostPerDayUSD == nil && l.CostPerMonthUSD == nil && l.CountTokensRPM == nil
}

// USDToMicros converts US dollars to whole micro-dollars, the unit of the
// spend ledger and of limiters' cost budgets, rounding to the nearest (halves
// away from zero). usd must be finite and below about 9.2e12 in magnitude;
// validated budgets (at most 1e9 USD) fit with room to spare.
func USDToMicros(usd float64) int64 { return int64(math.Round(usd * 1e6)) }

// Team returns the [[teams]] table named name, or nil when there is none. It
// scans c.Teams and the pointer refers into it: fine at startup, but the
// proxy should build its own map for the request path.
func (c *Config) Team(name string) *Team {
	for i := range c.Teams {
		if c.Teams[i].Name == name {
			return &c.Teams[i]
		}
	}
	return nil
}

// KeyBySHA256 returns the [[keys]] table whose sha256 is hexsum (hex, either
// case), or nil when there is none. Like Team it scans c.Keys; the proxy
// should index the keys once rather than call it per request.
func (c *Config) KeyBySHA256(hexsum string) *Key {
	// ToLower returns its argument unchanged, without allocating, when it
	// is already lowercase.
	hexsum = strings.ToLower(hexsum)
	for i := range c.Keys {
		if c.Keys[i].SHA256 == hexsum {
			return &c.Keys[i]
		}
	}
	return nil
}

// UsesRedis reports whether [redis] names any address, so that limits and
// spend are shared through Redis rather than kept in the process.
func (c *Config) UsesRedis() bool { return len(c.Redis.Addrs) > 0 }
