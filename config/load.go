package config

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	toml "github.com/pelletier/go-toml/v2"
)

// Default returns the configuration used for every key a file leaves out.
// It has no upstream: a usable configuration names at least one. It has no
// [[models]], [[teams]] or [[keys]] and no Redis: nothing is priced or
// limited, and spend is kept in the process and its state file.
func Default() Config {
	return Config{
		Server: Server{
			Listen:                   ":8080",
			MaxBodyBytes:             32 << 20,
			MaxEventBytes:            16 << 20,
			MaxHeaderBytes:           64 << 10,
			ReadHeaderTimeoutSeconds: 10,
			IdleTimeoutSeconds:       120,
			DrainTimeoutSeconds:      30,
			StreamErrorEvents:        true,
		},
		Auth: Auth{
			Mode:       "passthrough",
			RequireKey: true,
		},
		Metrics: Metrics{
			LatencyBuckets:   []int64{0, 500, 2000, 8000, 32000},
			Labels:           map[string]string{},
			Models:           []string{},
			MaxModels:        100,
			ModelsFromPrices: true,
			NativeHistograms: true,
		},
		SLO: SLO{
			TTFTMs: 2000,
			TPOTMs: 100,
			E2ELMs: 0,
		},
		Log: Log{
			Level:     "info",
			Format:    "json",
			AccessLog: true,
		},
		Admin: Admin{}, // no token_env: the admin API is off
		RateLimit: RateLimit{
			DefaultMaxTokens:  4096,
			OnRedisError:      "allow",
			RedisRetrySeconds: 1,
		},
		Redis: Redis{
			Addrs:         []string{},
			KeyPrefix:     "tollgate:",
			DialTimeoutMs: 500,
			SpillDir:      ".",
			TimeoutMs:     250,
		},
		Spend: Spend{
			StateFile:            "tollgate-spend.json",
			FlushIntervalSeconds: 2,
			JournalSyncMs:        100,
		},
		Ownership: Ownership{
			ResponseTTLHours: 720,
			StateFile:        "tollgate-ownership.jsonl",
		},
		RuntimeKeys: RuntimeKeys{
			StateFile:      "tollgate-keys.json",
			PollIntervalMs: 250,
		},
		Probe:         defaultProbe(),
		Tracing:       defaultTracing(),
		Conversations: defaultConversations(),
	}
}

// DefaultUpstream returns the defaults of one [[upstreams]] table; its Name
// and BaseURL are empty.
func DefaultUpstream() Upstream {
	return Upstream{
		Dialects:              []string{"openai", "anthropic"},
		TimeoutSeconds:        600,
		ConnectTimeoutSeconds: 10,
		IncludeUsage:          true,
		MaxIdleConns:          256,
		HeaderTimeoutSeconds:  30,
		IdleTimeoutSeconds:    300,
		QueueSize:             64,
		QueueTimeoutSeconds:   10,
		Retry: Retry{
			MaxAttempts:        3,
			BaseDelayMs:        250,
			MaxDelayMs:         8000,
			Multiplier:         2,
			MaxWaitSeconds:     30,
			Statuses:           []int{408, 409, 429, 500, 502, 503, 504, 529},
			BudgetRatio:        0.2,
			BudgetMinPerSecond: 1,
		},
		Breaker: Breaker{
			Enabled:             true,
			ConsecutiveFailures: 5,
			FailureRatio:        0.5,
			MinRequests:         20,
			WindowSeconds:       10,
			CooldownSeconds:     5,
			HalfOpenProbes:      2,
		},
	}
}

// DemoConfig returns Default() with one upstream, named "mock", at baseURL
// serving both dialects, and with [spend] state_file and [redis] spill_dir
// "" so that spend stays in memory: the demo writes no file. `gateway demo` points it at its
// in-process mock; it needs no keys (mode "passthrough", no [[keys]]).
func DemoConfig(baseURL string) Config {
	c := Default()
	u := DefaultUpstream()
	u.Name = "mock"
	u.BaseURL = baseURL
	c.Upstreams = []Upstream{u}
	c.Spend.StateFile = ""
	c.Ownership.StateFile = ""
	c.RuntimeKeys.StateFile = ""
	c.Conversations.StateFile = ""
	c.Redis.SpillDir = ""
	c.normalize()
	return c
}

// Load reads, decodes and validates the file at path, reading upstream keys
// from the process environment. Every error names the file, and the line
// where one is known.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		// The *PathError already names the path.
		return nil, fmt.Errorf("config: %w", err)
	}
	return Parse(data, path, os.Getenv)
}

// Parse decodes the TOML document data over Default(), strictly: unknown keys
// and values of the wrong type are errors. It then fills the defaults of each
// [[upstreams]] table for the keys that table leaves out, normalizes values
// (see normalize), reads each api_key_env, [redis] password_env and [admin]
// token_env through getenv (os.Getenv when nil), and validates the result.
//
// name is the file name used in error messages, which read
// "config: <name>:<line>: <key>: <problem>". The error joins every problem
// found (see errors.Join); decoding problems stop before validation.
func Parse(data []byte, name string, getenv func(string) string) (*Config, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	// Editors on Windows may start the file with a byte order mark, which
	// TOML does not allow.
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))

	c := Default()
	dec := toml.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return nil, decodeError(err, name, indexDoc(data))
	}

	// The typed decode cannot tell a key set to its zero value from a key
	// left out, and each [[upstreams]] table starts from a zero Upstream, so
	// a second, untyped decode says which keys each table holds.
	var raw map[string]any
	if err := toml.Unmarshal(data, &raw); err != nil {
		return nil, decodeError(err, name, indexDoc(data))
	}
	fillUpstreamDefaults(c.Upstreams, raw["upstreams"])

	c.normalize()
	c.resolveSecrets(getenv)
	errs := missingPrices(raw["models"])
	if err := c.Validate(); err != nil {
		errs = append(errs, unjoin(err)...)
	}
	if len(errs) > 0 {
		return nil, locate(errors.Join(errs...), name, indexDoc(data))
	}
	return &c, nil
}

// missingPrices reports each [[models]] table that leaves out its input or
// output price: the typed decode would take it as 0, pricing the model as
// free without a word. raw is the decoded "models" value.
func missingPrices(raw any) []error {
	tables, _ := raw.([]any)
	var errs []error
	for i, t := range tables {
		present, _ := t.(map[string]any)
		for _, k := range []string{"input_usd_per_mtok", "output_usd_per_mtok"} {
			if _, ok := present[k]; !ok {
				errs = append(errs, &fieldError{
					key: "models[" + strconv.Itoa(i) + "]." + k,
					msg: "is required: US dollars per million tokens (write 0 for a free model)",
				})
			}
		}
	}
	return errs
}

// unjoin returns the errors that errors.Join joined in err, or err alone.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// fillUpstreamDefaults sets, in each upstream, the default of every key its
// table in the file leaves out, key by key inside its [upstreams.retry] and
// [upstreams.breaker] tables too. raw is the decoded "upstreams" value: an
// array of tables, whether written as [[upstreams]] or inline. A key given
// as an empty array ("statuses = []") is present, so it stays empty.
func fillUpstreamDefaults(ups []Upstream, raw any) {
	tables, _ := raw.([]any)
	def := DefaultUpstream()
	for i := range ups {
		var present map[string]any
		if i < len(tables) {
			present, _ = tables[i].(map[string]any)
		}
		u := &ups[i]
		// Slices are cloned so that no two upstreams share a backing array.
		fill(present, "dialects", &u.Dialects, slices.Clone(def.Dialects))
		fill(present, "timeout_seconds", &u.TimeoutSeconds, def.TimeoutSeconds)
		fill(present, "connect_timeout_seconds", &u.ConnectTimeoutSeconds, def.ConnectTimeoutSeconds)
		fill(present, "include_usage", &u.IncludeUsage, def.IncludeUsage)
		fill(present, "max_idle_conns", &u.MaxIdleConns, def.MaxIdleConns)
		fill(present, "h2c", &u.H2C, def.H2C)
		fill(present, "header_timeout_seconds", &u.HeaderTimeoutSeconds, def.HeaderTimeoutSeconds)
		fill(present, "first_token_timeout_seconds", &u.FirstTokenTimeoutSeconds, def.FirstTokenTimeoutSeconds)
		fill(present, "idle_timeout_seconds", &u.IdleTimeoutSeconds, def.IdleTimeoutSeconds)
		fill(present, "max_concurrent", &u.MaxConcurrent, def.MaxConcurrent)
		fill(present, "requests_per_second", &u.RequestsPerSecond, def.RequestsPerSecond)
		fill(present, "queue_size", &u.QueueSize, def.QueueSize)
		fill(present, "queue_timeout_seconds", &u.QueueTimeoutSeconds, def.QueueTimeoutSeconds)

		retry, _ := present["retry"].(map[string]any)
		r, dr := &u.Retry, &def.Retry
		fill(retry, "max_attempts", &r.MaxAttempts, dr.MaxAttempts)
		fill(retry, "base_delay_ms", &r.BaseDelayMs, dr.BaseDelayMs)
		fill(retry, "max_delay_ms", &r.MaxDelayMs, dr.MaxDelayMs)
		fill(retry, "multiplier", &r.Multiplier, dr.Multiplier)
		fill(retry, "max_wait_seconds", &r.MaxWaitSeconds, dr.MaxWaitSeconds)
		fill(retry, "statuses", &r.Statuses, slices.Clone(dr.Statuses))
		fill(retry, "budget_ratio", &r.BudgetRatio, dr.BudgetRatio)
		fill(retry, "budget_min_per_second", &r.BudgetMinPerSecond, dr.BudgetMinPerSecond)

		breaker, _ := present["breaker"].(map[string]any)
		b, db := &u.Breaker, &def.Breaker
		fill(breaker, "enabled", &b.Enabled, db.Enabled)
		fill(breaker, "consecutive_failures", &b.ConsecutiveFailures, db.ConsecutiveFailures)
		fill(breaker, "failure_ratio", &b.FailureRatio, db.FailureRatio)
		fill(breaker, "min_requests", &b.MinRequests, db.MinRequests)
		fill(breaker, "window_seconds", &b.WindowSeconds, db.WindowSeconds)
		fill(breaker, "cooldown_seconds", &b.CooldownSeconds, db.CooldownSeconds)
		fill(breaker, "half_open_probes", &b.HalfOpenProbes, db.HalfOpenProbes)
	}
}

// fill sets *dst to def when the table present (nil when the file has no
// such table) lacks key.
func fill[T any](present map[string]any, key string, dst *T, def T) {
	if _, ok := present[key]; !ok {
		*dst = def
	}
}

// normalize puts values that have several spellings into one form: base_url
// without a trailing slash, sha256 in lowercase, and empty [[models]],
// [[teams]], [[keys]], [[routes]], team models lists and route rename tables
// as nil, so that a configuration reads back from Redacted() equal to itself
// ("teams = []" decodes to an empty, non-nil slice). Retry statuses are
// left alone: Parse never leaves them nil (absent, they take the default
// list; "statuses = []" decodes to an empty, non-nil slice, meaning that no
// status is retried), so they read back equal as they are. Each
// [[probe.targets]] table without a dialect gets its upstream's first.
func (c *Config) normalize() {
	for i := range c.Upstreams {
		// "https://host/" and "https://host" are the same endpoint; URL
		// appends "/v1/..." and must not produce "//v1".
		c.Upstreams[i].BaseURL = strings.TrimRight(c.Upstreams[i].BaseURL, "/")
	}
	for i := range c.Keys {
		// sha256sum prints lowercase, but other tools print uppercase; the
		// proxy compares against hex.EncodeToString, which is lowercase.
		c.Keys[i].SHA256 = strings.ToLower(c.Keys[i].SHA256)
	}
	for i := range c.Teams {
		if len(c.Teams[i].Models) == 0 {
			c.Teams[i].Models = nil
		}
	}
	for i := range c.Routes {
		if len(c.Routes[i].Rename) == 0 {
			c.Routes[i].Rename = nil
		}
	}
	if len(c.Models) == 0 {
		c.Models = nil
	}
	if len(c.Routes) == 0 {
		c.Routes = nil
	}
	if len(c.Teams) == 0 {
		c.Teams = nil
	}
	if len(c.Keys) == 0 {
		c.Keys = nil
	}
	c.normalizeProbe()
}

// resolveSecrets reads each upstream's key, the Redis password and the admin
// token from the variables that api_key_env, password_env and token_env
// name. Invalid names are left for Validate to report.
func (c *Config) resolveSecrets(getenv func(string) string) {
	for i := range c.Upstreams {
		u := &c.Upstreams[i]
		u.APIKey = Secret(readEnv(getenv, u.APIKeyEnv))
	}
	c.Redis.Password = Secret(readEnv(getenv, c.Redis.PasswordEnv))
	c.Admin.Token = Secret(readEnv(getenv, c.Admin.TokenEnv))
	c.Tracing.Headers = Secret(readEnv(getenv, c.Tracing.HeadersEnv))
}

// readEnv returns the value of the variable name, or "" when name is empty or
// not a variable name, so that getenv is asked only for variables the file
// names.
func readEnv(getenv func(string) string, name string) string {
	if name == "" || !envNameRE.MatchString(name) {
		return ""
	}
	return getenv(name)
}

// locate adds the file name and, where the index knows it, the line of the
// offending key to each problem Validate reported.
func locate(err error, name string, idx *docIndex) error {
	errs := unjoin(err)
	out := make([]error, 0, len(errs))
	for _, e := range errs {
		var fe *fieldError
		if !errors.As(e, &fe) {
			out = append(out, e)
			continue
		}
		located := *fe
		located.file = name
		located.line = idx.line(fe.key)
		out = append(out, &located)
	}
	return errors.Join(out...)
}
