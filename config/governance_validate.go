package config

import (
	"fmt"
	"maps"
	"math"
	"net"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/tollgate-llm/tollgate/llm"
)

const (
	// maxLimit bounds integer limits (rpm, tpm, concurrency, tokens per
	// day) so that limiters may scale them (to milli-tokens, per-second
	// rates) in an int64 without overflow; no real limit comes near it.
	maxLimit = 1_000_000_000_000_000
	// maxCostUSD bounds cost budgets: 1e9 USD is 1e15 micro-dollars, well
	// inside an int64 ledger.
	maxCostUSD = 1e9
	// maxPriceUSDPerMTok catches prices written in the wrong unit: the
	// dearest models cost a few hundred dollars per million tokens.
	maxPriceUSDPerMTok = 1e6
	// minAdminToken is the shortest admin token accepted, in characters.
	minAdminToken = 16
	// reservedName is the label value of requests without a team (or
	// key); a team or key named so could not be told apart from them.
	reservedName = "none"
)

// sha256RE is a lowercase hex SHA-256, after normalize.
var sha256RE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// validateGovernance checks the governance tables (governance.go).
func (c *Config) validateGovernance(v *validator) {
	c.RateLimit.validate(v)
	c.Redis.validate(v)
	c.Spend.validate(v)
	c.Ownership.validate(v)
	c.Admin.validate(v)
	c.validateRuntimeKeys(v)

	patterns := c.validateModels(v)
	// Without a price every request costs 0, so a cost budget would never
	// be spent: a silent no-op that looks like protection.
	priced := len(c.Models) > 0

	teams := make(map[string]int, len(c.Teams))
	for i := range c.Teams {
		t := &c.Teams[i]
		key := "teams[" + strconv.Itoa(i) + "]"
		v.uniqueName(key+".name", t.Name, "teams", i, teams)
		for j, p := range t.Models {
			mk := fmt.Sprintf("%s.models[%d]", key, j)
			switch {
			case slices.Index(t.Models, p) < j:
				v.add(mk, "%q is listed twice", p)
			case !patterns[p]:
				v.add(mk, "%q is not the pattern of any [[models]] table; add one (with its prices) or remove it", p)
			}
		}
		t.Limits.validate(v, key, priced)
		v.costLimit(key+".max_cost_per_conversation_usd", t.MaxCostPerConversationUSD, priced)
		if t.MaxCostPerConversationUSD != nil && !c.Conversations.Enabled {
			v.add(key+".max_cost_per_conversation_usd", "needs [conversations] enabled = true: without it no conversation is tracked and the budget would never be spent")
		}
		for _, class := range slices.Sorted(maps.Keys(t.ClassRPM)) {
			ck := key + ".class_rpm." + class
			if !slices.Contains(llm.RequestClasses, class) {
				v.add(ck, "%q is not a request class (one of %q)", class, llm.RequestClasses)
				continue
			}
			n := t.ClassRPM[class]
			v.limit(ck, &n)
		}
	}

	keys := make(map[string]int, len(c.Keys))
	sums := make(map[string]int, len(c.Keys))
	for i := range c.Keys {
		k := &c.Keys[i]
		key := "keys[" + strconv.Itoa(i) + "]"
		v.uniqueName(key+".name", k.Name, "keys", i, keys)
		// The value is never printed: a key pasted here by mistake would
		// end up in the error.
		switch {
		case k.SHA256 == "":
			v.add(key+".sha256", "is required: the key's SHA-256 in hex, as `gateway hash-key` prints it")
		case !sha256RE.MatchString(k.SHA256):
			v.add(key+".sha256", "is not a SHA-256 in hex (64 characters 0-9, a-f; this one has %d); the key itself never goes in this file: put the output of `gateway hash-key` here",
				utf8.RuneCountInString(k.SHA256))
		default:
			if j, dup := sums[k.SHA256]; dup {
				v.add(key+".sha256", "is already the sha256 of keys[%d] (%q): one key cannot have two names", j, c.Keys[j].Name)
			} else {
				sums[k.SHA256] = i
			}
		}
		if k.Team != "" && c.Team(k.Team) == nil {
			v.add(key+".team", "%q is not the name of any [[teams]] table; add the team or remove team from the key", k.Team)
		}
		k.Limits.validate(v, key, priced)
	}
}

// validateModels checks the [[models]] tables and returns the set of their
// patterns.
func (c *Config) validateModels(v *validator) map[string]bool {
	patterns := make(map[string]bool, len(c.Models))
	seen := make(map[string]int, len(c.Models))
	for i := range c.Models {
		m := &c.Models[i]
		key := "models[" + strconv.Itoa(i) + "]"
		switch _, err := path.Match(m.Pattern, ""); {
		case m.Pattern == "":
			v.add(key+".pattern", `is required: a model name, or a pattern such as "gpt-4o*"`)
		case err != nil:
			v.add(key+".pattern", `%q is not a valid pattern: %v (syntax of Go's path.Match: *, ?, [a-z], \ escapes)`, m.Pattern, err)
		default:
			if j, dup := seen[m.Pattern]; dup {
				v.add(key+".pattern", "%q is already the pattern of models[%d]; patterns must be unique (the first match prices a model)", m.Pattern, j)
			} else {
				seen[m.Pattern] = i
			}
			patterns[m.Pattern] = true
		}
		v.price(key+".input_usd_per_mtok", m.InputUSDPerMTok)
		v.price(key+".output_usd_per_mtok", m.OutputUSDPerMTok)
		if m.CacheReadUSDPerMTok != nil {
			v.price(key+".cache_read_usd_per_mtok", *m.CacheReadUSDPerMTok)
		}
		if m.CacheWriteUSDPerMTok != nil {
			v.price(key+".cache_write_usd_per_mtok", *m.CacheWriteUSDPerMTok)
		}
	}
	return patterns
}

// price checks a price in US dollars per million tokens.
func (v *validator) price(key string, x float64) {
	switch {
	case math.IsNaN(x):
		v.add(key, "must be a number, not nan")
	case x < 0:
		v.add(key, "price must be >= 0, not %g", x)
	case x > maxPriceUSDPerMTok:
		v.add(key, "%g is not a plausible price: prices are US dollars per million tokens (e.g. 2.5), at most %g", x, maxPriceUSDPerMTok)
	}
}

// uniqueName checks the name of the i-th table of an array of tables
// (teams, keys) and records it in seen.
func (v *validator) uniqueName(key, name, table string, i int, seen map[string]int) {
	switch {
	case name == "":
		v.add(key, "is required")
	case !nameRE.MatchString(name):
		v.add(key, "%q may hold only a-z, 0-9, _ and - (it becomes a metric label value)", name)
	case name == reservedName:
		v.add(key, "%q is reserved: logs and metrics use it for requests without one; choose another name", name)
	default:
		if j, dup := seen[name]; dup {
			v.add(key, "%q is already the name of %s[%d]; names must be unique", name, table, j)
		} else {
			seen[name] = i
		}
	}
}

// validate checks the limits of the table at key; priced tells whether any
// [[models]] table exists.
func (l *Limits) validate(v *validator, key string, priced bool) {
	v.limit(key+".rpm", l.RPM)
	v.limit(key+".tpm", l.TPM)
	v.limit(key+".concurrency", l.Concurrency)
	v.limit(key+".tokens_per_day", l.TokensPerDay)
	v.costLimit(key+".cost_per_day_usd", l.CostPerDayUSD, priced)
	v.costLimit(key+".cost_per_month_usd", l.CostPerMonthUSD, priced)
	v.limit(key+".count_tokens_rpm", l.CountTokensRPM)
}

func (v *validator) limit(key string, n *int64) {
	switch {
	case n == nil:
	case *n == 0:
		v.add(key, "a limit of 0 would refuse every request; leave the key out for no limit")
	case *n < 0:
		v.add(key, "must be greater than 0, not %d; leave the key out for no limit", *n)
	case *n > maxLimit:
		v.add(key, "%d is too large (at most 1e15); leave the key out for no limit", *n)
	}
}

func (v *validator) costLimit(key string, x *float64, priced bool) {
	switch {
	case x == nil:
	case math.IsNaN(*x):
		v.add(key, "must be a number, not nan")
	case *x == 0:
		v.add(key, "a budget of 0 would refuse every request; leave the key out for no limit")
	case *x < 0:
		v.add(key, "must be greater than 0, not %g; leave the key out for no limit", *x)
	case *x > maxCostUSD:
		v.add(key, "%g US dollars is too large (at most 1e9); leave the key out for no limit", *x)
	case !priced:
		v.add(key, "no [[models]] table gives a price, so every request would cost 0 and this budget would never be spent; add [[models]] tables with the prices of the models you use")
	}
}

func (r *RateLimit) validate(v *validator) {
	v.positive("ratelimit.default_max_tokens", r.DefaultMaxTokens)
	switch r.OnRedisError {
	case "allow", "deny":
	default:
		v.add("ratelimit.on_redis_error", `%q is not a choice; use "allow" (fall back to in-process limits) or "deny" (refuse with 503)`, r.OnRedisError)
	}
	v.duration("ratelimit.redis_retry_seconds", r.RedisRetrySeconds, time.Second, false)
}

func (r *Redis) validate(v *validator) {
	for i, a := range r.Addrs {
		key := fmt.Sprintf("redis.addrs[%d]", i)
		if strings.Contains(a, "@") {
			// A URL with a password: do not print it.
			v.add(key, `is not host:port (e.g. "127.0.0.1:6379"); credentials go in username and password_env`)
			continue
		}
		host, port, err := net.SplitHostPort(a)
		switch {
		case err != nil:
			v.add(key, `%q is not host:port (e.g. "127.0.0.1:6379")`, a)
		case host == "":
			v.add(key, `%q has no host (e.g. "127.0.0.1:6379")`, a)
		case !validPort(port):
			v.add(key, "%q: port %q is not a number from 1 to 65535", a, port)
		case slices.Index(r.Addrs, a) < i:
			v.add(key, "%q is listed twice", a)
		}
	}
	if r.MasterName != "" && len(r.Addrs) == 0 {
		v.add("redis.master_name", "is set but redis.addrs is empty; list the Sentinel addresses in addrs")
	}
	v.envVar("redis.password_env", r.PasswordEnv, r.Password, "password")
	switch {
	case r.DB < 0:
		v.add("redis.db", "must be 0 or more, not %d", r.DB)
	case r.DB != 0 && len(r.Addrs) > 1 && r.MasterName == "":
		v.add("redis.db", "several addrs and no master_name mean Redis Cluster, which has only database 0; leave db out, or set master_name for Sentinel")
	}
	switch {
	case r.KeyPrefix == "":
		v.add("redis.key_prefix", `must not be empty: it keeps tollgate's keys apart from other data in the same Redis (default "tollgate:")`)
	case strings.ContainsAny(r.KeyPrefix, "{}"):
		// Redis Cluster hashes only the first {...} of a key: braces here
		// would replace the per-key and per-team hash tags tollgate sets.
		v.add("redis.key_prefix", "%q must not hold { or }: tollgate sets the Redis Cluster hash tags itself", r.KeyPrefix)
	}
	v.duration("redis.dial_timeout_ms", r.DialTimeoutMs, time.Millisecond, false)
	v.duration("redis.timeout_ms", r.TimeoutMs, time.Millisecond, false)
}

// validPort reports whether port is a decimal number from 1 to 65535.
func validPort(port string) bool {
	n, err := strconv.ParseUint(port, 10, 16)
	return err == nil && n > 0
}

func (s *Spend) validate(v *validator) {
	v.duration("spend.flush_interval_seconds", s.FlushIntervalSeconds, time.Second, false)
	v.duration("spend.journal_sync_ms", s.JournalSyncMs, time.Millisecond, true)
}

func (o *Ownership) validate(v *validator) {
	v.duration("ownership.response_ttl_hours", o.ResponseTTLHours, time.Hour, false)
	v.duration("ownership.conversation_ttl_hours", o.ConversationTTLHours, time.Hour, true)
}

func (a *Admin) validate(v *validator) {
	if !v.envVar("admin.token_env", a.TokenEnv, a.Token, "token") {
		return
	}
	if utf8.RuneCountInString(a.Token.Reveal()) < minAdminToken {
		v.add("admin.token_env", "admin token from $%s is shorter than %d characters; use a long random value (e.g. openssl rand -hex 32)", a.TokenEnv, minAdminToken)
	}
}
