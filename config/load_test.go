package config

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestDefault checks Default against the defaults documented in config.go.
func TestDefault(t *testing.T) {
	c := Default()
	want := Config{
		Server: Server{Listen: ":8080", MaxBodyBytes: 32 * 1024 * 1024, MaxEventBytes: 16 * 1024 * 1024, MaxHeaderBytes: 64 << 10,
			ReadHeaderTimeoutSeconds: 10, IdleTimeoutSeconds: 120, DrainTimeoutSeconds: 30, StreamErrorEvents: true},
		Auth: Auth{Mode: "passthrough", RequireKey: true},
		Metrics: Metrics{LatencyBuckets: []int64{0, 500, 2000, 8000, 32000}, Labels: map[string]string{},
			Models: []string{}, MaxModels: 100, ModelsFromPrices: true, NativeHistograms: true},
		SLO:         SLO{TTFTMs: 2000, TPOTMs: 100, E2ELMs: 0},
		Log:         Log{Level: "info", Format: "json", AccessLog: true},
		RateLimit:   RateLimit{DefaultMaxTokens: 4096, OnRedisError: "allow", RedisRetrySeconds: 1},
		Redis:       Redis{Addrs: []string{}, KeyPrefix: "tollgate:", DialTimeoutMs: 500, TimeoutMs: 250, SpillDir: "."},
		Spend:       Spend{StateFile: "tollgate-spend.json", FlushIntervalSeconds: 2, JournalSyncMs: 100},
		Ownership:   Ownership{ResponseTTLHours: 720, StateFile: "tollgate-ownership.jsonl"},
		RuntimeKeys: RuntimeKeys{StateFile: "tollgate-keys.json", PollIntervalMs: 250},
		Probe: Probe{Enabled: false, IntervalSeconds: 300, Requests: 10, Concurrency: 2, MaxTokens: 16,
			TimeoutSeconds: 60, Prompt: "Reply with the single word: ok"},
		Tracing: Tracing{Protocol: "http/protobuf", SampleRatio: 1, ServiceName: "tollgate", QueueSize: 2048,
			ExportTimeoutSeconds: 10},
		Conversations: Conversations{Header: "X-Conversation-Id", Identity: DefaultIdentity, IdleTimeoutSeconds: 1800, MaxActive: 100000,
			StateFile: "tollgate-conversations.json", FlushIntervalSeconds: 1},
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("Default() =\n%+v\nwant\n%+v", c, want)
	}
	if c.UsesRedis() || len(c.Models)+len(c.Teams)+len(c.Keys) != 0 {
		t.Error("Default() uses Redis or holds models, teams or keys")
	}
	wantUp := Upstream{Dialects: []string{"openai", "anthropic"}, TimeoutSeconds: 600,
		ConnectTimeoutSeconds: 10, IncludeUsage: true, MaxIdleConns: 256,
		HeaderTimeoutSeconds: 30, FirstTokenTimeoutSeconds: 0, IdleTimeoutSeconds: 300,
		MaxConcurrent: 0, RequestsPerSecond: 0, QueueSize: 64, QueueTimeoutSeconds: 10,
		Retry: Retry{MaxAttempts: 3, BaseDelayMs: 250, MaxDelayMs: 8000, Multiplier: 2, MaxWaitSeconds: 30,
			Statuses: []int{408, 409, 429, 500, 502, 503, 504, 529}, BudgetRatio: 0.2, BudgetMinPerSecond: 1},
		Breaker: Breaker{Enabled: true, ConsecutiveFailures: 5, FailureRatio: 0.5, MinRequests: 20,
			WindowSeconds: 10, CooldownSeconds: 5, HalfOpenProbes: 2},
	}
	if u := DefaultUpstream(); !reflect.DeepEqual(u, wantUp) {
		t.Errorf("DefaultUpstream() = %+v, want %+v", u, wantUp)
	}
	// Each call returns a fresh statuses list.
	u := DefaultUpstream()
	u.Retry.Statuses[0] = 999
	if DefaultUpstream().Retry.Statuses[0] != 408 {
		t.Error("DefaultUpstream() shares its statuses between calls")
	}
	// Default has no upstream, so it is not usable on its own.
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "config: at least one [[upstreams]] is required") {
		t.Errorf("Default().Validate() = %v, want the missing-upstream error", err)
	}
	// Each call returns fresh slices and maps.
	c.Metrics.LatencyBuckets[1] = 7
	c.Metrics.Labels["x"] = "y"
	c.Redis.Addrs = append(c.Redis.Addrs[:0:0], "x")
	if d := Default(); d.Metrics.LatencyBuckets[1] != 500 || len(d.Metrics.Labels) != 0 || len(d.Redis.Addrs) != 0 {
		t.Error("Default() shares its slices or maps between calls")
	}
}

func TestParseMinimalGetsDefaults(t *testing.T) {
	c := mustParse(t, minimal, nil)
	want := Default()
	up := DefaultUpstream()
	up.Name, up.BaseURL = "a", "http://127.0.0.1:9000"
	want.Upstreams = []Upstream{up}
	if !reflect.DeepEqual(*c, want) {
		t.Errorf("Parse(minimal) =\n%+v\nwant\n%+v", *c, want)
	}
}

// TestUpstreamDefaultsPerTable checks that each [[upstreams]] table gets the
// default of exactly the keys it leaves out, whichever form the array takes.
// The "set" upstream sets every key, most to the zero value, which must not
// be taken for a key left out.
func TestUpstreamDefaultsPerTable(t *testing.T) {
	docs := map[string]string{
		"array tables": `
[[upstreams]]
name = "set"
base_url = "http://127.0.0.1:1"
dialects = ["anthropic"]
timeout_seconds = 5
connect_timeout_seconds = 0.5
include_usage = false
max_idle_conns = 3
h2c = true
header_timeout_seconds = 0
first_token_timeout_seconds = 20
idle_timeout_seconds = 0
max_concurrent = 8
requests_per_second = 2.5
queue_size = 0
queue_timeout_seconds = 1

[upstreams.retry]
max_attempts = 1
base_delay_ms = 100
max_delay_ms = 100
multiplier = 1
max_wait_seconds = 0
statuses = []
budget_ratio = 0
budget_min_per_second = 0

[upstreams.breaker]
enabled = false
consecutive_failures = 0
failure_ratio = 0
min_requests = 0
window_seconds = 0
cooldown_seconds = 0
half_open_probes = 0

[[upstreams]]
name = "unset"
base_url = "http://127.0.0.1:2"
`,
		"inline": `
upstreams = [
  { name = "set", base_url = "http://127.0.0.1:1", dialects = ["anthropic"], timeout_seconds = 5, connect_timeout_seconds = 0.5, include_usage = false, max_idle_conns = 3, h2c = true, header_timeout_seconds = 0, first_token_timeout_seconds = 20, idle_timeout_seconds = 0, max_concurrent = 8, requests_per_second = 2.5, queue_size = 0, queue_timeout_seconds = 1, retry = { max_attempts = 1, base_delay_ms = 100, max_delay_ms = 100, multiplier = 1, max_wait_seconds = 0, statuses = [], budget_ratio = 0, budget_min_per_second = 0 }, breaker = { enabled = false, consecutive_failures = 0, failure_ratio = 0, min_requests = 0, window_seconds = 0, cooldown_seconds = 0, half_open_probes = 0 } },
  { name = "unset", base_url = "http://127.0.0.1:2" },
]
`,
	}
	for name, doc := range docs {
		t.Run(name, func(t *testing.T) {
			c := mustParse(t, doc, nil)
			if len(c.Upstreams) != 2 {
				t.Fatalf("got %d upstreams, want 2", len(c.Upstreams))
			}
			set := Upstream{Name: "set", BaseURL: "http://127.0.0.1:1", Dialects: []string{"anthropic"},
				TimeoutSeconds: 5, ConnectTimeoutSeconds: 0.5, IncludeUsage: false, MaxIdleConns: 3, H2C: true,
				FirstTokenTimeoutSeconds: 20, MaxConcurrent: 8, RequestsPerSecond: 2.5, QueueTimeoutSeconds: 1,
				Retry: Retry{MaxAttempts: 1, BaseDelayMs: 100, MaxDelayMs: 100, Multiplier: 1, Statuses: []int{}}}
			if !reflect.DeepEqual(c.Upstreams[0], set) {
				t.Errorf("upstreams[0] = %+v, want %+v", c.Upstreams[0], set)
			}
			unset := DefaultUpstream()
			unset.Name, unset.BaseURL = "unset", "http://127.0.0.1:2"
			if !reflect.DeepEqual(c.Upstreams[1], unset) {
				t.Errorf("upstreams[1] = %+v, want %+v", c.Upstreams[1], unset)
			}
		})
	}
}

// TestUpstreamNestedDefaults checks that a [upstreams.retry] or
// [upstreams.breaker] table, in any of TOML's spellings, keeps the default
// of each key it leaves out.
func TestUpstreamNestedDefaults(t *testing.T) {
	def := DefaultUpstream()
	cases := []struct {
		name, body string
		want       func(u *Upstream)
	}{
		{"retry table with one key", "[upstreams.retry]\nmax_attempts = 1\n",
			func(u *Upstream) { u.Retry.MaxAttempts = 1 }},
		{"breaker table with one key", "[upstreams.breaker]\nenabled = false\n",
			func(u *Upstream) { u.Breaker.Enabled = false }},
		{"empty tables", "[upstreams.retry]\n[upstreams.breaker]\n",
			func(*Upstream) {}},
		{"dotted keys", "retry.multiplier = 1.5\nbreaker.cooldown_seconds = 1\n",
			func(u *Upstream) { u.Retry.Multiplier = 1.5; u.Breaker.CooldownSeconds = 1 }},
		{"inline tables", "retry = { max_delay_ms = 500, budget_ratio = 0.5 }\nbreaker = { min_requests = 3 }\n",
			func(u *Upstream) { u.Retry.MaxDelayMs = 500; u.Retry.BudgetRatio = 0.5; u.Breaker.MinRequests = 3 }},
		{"explicit empty statuses", "[upstreams.retry]\nstatuses = []\n",
			func(u *Upstream) { u.Retry.Statuses = []int{} }},
		{"own statuses", "[upstreams.retry]\nstatuses = [429, 503]\n",
			func(u *Upstream) { u.Retry.Statuses = []int{429, 503} }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := mustParse(t, minimal+tc.body, nil)
			want := DefaultUpstream()
			want.Name, want.BaseURL = "a", "http://127.0.0.1:9000"
			tc.want(&want)
			if got := c.Upstreams[0]; !reflect.DeepEqual(got, want) {
				t.Errorf("upstreams[0] =\n%+v\nwant\n%+v", got, want)
			}
		})
	}

	// "statuses = []" means no retried status, not "the default".
	c := mustParse(t, minimal+"[upstreams.retry]\nstatuses = []\n", nil)
	if s := c.Upstreams[0].Retry.Statuses; s == nil || len(s) != 0 {
		t.Errorf("statuses = %#v, want an empty, non-nil list", s)
	}

	// Upstreams filled with defaults share no slice.
	c = mustParse(t, minimal+"[[upstreams]]\nname = \"b\"\nbase_url = \"http://127.0.0.1:9001\"\n", nil)
	c.Upstreams[0].Retry.Statuses[0] = 999
	c.Upstreams[0].Dialects[0] = "x"
	if b := c.Upstreams[1]; b.Retry.Statuses[0] != def.Retry.Statuses[0] || b.Dialects[0] != def.Dialects[0] {
		t.Errorf("upstreams share default slices: upstreams[1] = %+v", b)
	}
}

// TestTrueBooleans checks that every boolean whose default is true stays true
// when its key is absent and becomes false only when the file says false.
func TestTrueBooleans(t *testing.T) {
	cases := []struct {
		table, key string
		get        func(*Config) bool
	}{
		{"[auth]", "require_key", func(c *Config) bool { return c.Auth.RequireKey }},
		{"[metrics]", "native_histograms", func(c *Config) bool { return c.Metrics.NativeHistograms }},
		{"[log]", "access_log", func(c *Config) bool { return c.Log.AccessLog }},
		{"[[upstreams]]", "include_usage", func(c *Config) bool { return c.Upstreams[0].IncludeUsage }},
		{"[server]", "stream_error_events", func(c *Config) bool { return c.Server.StreamErrorEvents }},
		{"[upstreams.breaker]", "enabled", func(c *Config) bool { return c.Upstreams[0].Breaker.Enabled }},
	}
	up := "[[upstreams]]\nname = \"a\"\nbase_url = \"http://127.0.0.1:1\"\n"
	for _, tc := range cases {
		t.Run(tc.key, func(t *testing.T) {
			for _, v := range []string{"", "true", "false"} {
				doc := up
				if tc.table != "[[upstreams]]" {
					doc += tc.table + "\n" // the table is present, the key may not be
				}
				if v != "" {
					doc += tc.key + " = " + v + "\n"
				}
				got := tc.get(mustParse(t, doc, nil))
				if want := v != "false"; got != want {
					t.Errorf("%s %s = %q: got %v, want %v", tc.table, tc.key, v, got, want)
				}
			}
		})
	}
}

func TestParseFullConfig(t *testing.T) {
	doc := `
[server]
listen = "127.0.0.1:9999"
max_body_bytes = 1048576
max_event_bytes = 65536
max_header_bytes = 8192
read_header_timeout_seconds = 2.5
idle_timeout_seconds = 30
drain_timeout_seconds = 5
stream_error_events = false

[auth]
mode = "passthrough"
require_key = false

[[upstreams]]
name = "openai"
base_url = "https://api.openai.com/"
api_key_env = "OPENAI_API_KEY"
dialects = ["openai"]
timeout_seconds = 120
connect_timeout_seconds = 3
include_usage = false
max_idle_conns = 64
header_timeout_seconds = 15
first_token_timeout_seconds = 60
idle_timeout_seconds = 0
max_concurrent = 100
requests_per_second = 12.5
queue_size = 0
queue_timeout_seconds = 2

[upstreams.retry]
max_attempts = 5
base_delay_ms = 100
max_delay_ms = 2000
multiplier = 3
max_wait_seconds = 0
statuses = [429, 503]
budget_ratio = 0.5
budget_min_per_second = 0

[upstreams.breaker]
enabled = true
consecutive_failures = 3
failure_ratio = 0.25
min_requests = 10
window_seconds = 30
cooldown_seconds = 2.5
half_open_probes = 1

[[upstreams]]
name = "local-vllm_2"
base_url = "http://10.0.0.5:8000/proxy"
dialects = ["openai", "anthropic"]

[upstreams.retry]
statuses = []

[upstreams.breaker]
enabled = false
min_requests = 0

[[routes]]
models = ["gpt-4o*", "o3"]
upstreams = ["openai", "local-vllm_2"]

[routes.rename]
local-vllm_2 = "Qwen/Qwen2.5-72B"

[[routes]]
models = ["local/*"]
upstreams = ["local-vllm_2"]

[metrics]
latency_buckets = [0, 1000, 4000]
models = ["gpt-4o", "claude-sonnet-4-5"]
max_models = 20
models_from_prices = false
native_histograms = false

[metrics.labels]
env = "prod"
scene = "chat"

[slo]
ttft_ms = 500
tpot_ms = 50.5
e2el_ms = 30000

[log]
level = "debug"
format = "text"
access_log = false

[admin]
token_env = "TOLLGATE_ADMIN_TOKEN"

[ratelimit]
default_max_tokens = 1024
on_redis_error = "deny"
redis_retry_seconds = 0.5

[redis]
addrs = ["10.0.0.1:26379", "10.0.0.2:26379"]
master_name = "mymaster"
username = "tollgate"
password_env = "REDIS_PASSWORD"
db = 2
tls = true
key_prefix = "tg:"
dial_timeout_ms = 300
timeout_ms = 100
spill_dir = "/var/lib/tollgate"

[spend]
state_file = "/var/lib/tollgate/spend.json"
flush_interval_seconds = 5
journal_sync_ms = 0

[ownership]
response_ttl_hours = 24
conversation_ttl_hours = 2160.5
state_file = "/var/lib/tollgate/owners.jsonl"

[runtime_keys]
state_file = "/var/lib/tollgate/keys.json"
poll_interval_ms = 100

[[models]]
pattern = "gpt-4o-mini*"
input_usd_per_mtok = 0.15
output_usd_per_mtok = 0.6
cache_read_usd_per_mtok = 0.075

[[models]]
pattern = "claude-sonnet-4*"
input_usd_per_mtok = 3
output_usd_per_mtok = 15
cache_read_usd_per_mtok = 0.3
cache_write_usd_per_mtok = 3.75

[[models]]
pattern = "local/*"
input_usd_per_mtok = 0
output_usd_per_mtok = 0

[[teams]]
name = "research"
models = ["gpt-4o-mini*", "claude-sonnet-4*"]
rpm = 600
tpm = 2000000
concurrency = 32
tokens_per_day = 50000000
cost_per_day_usd = 100
cost_per_month_usd = 2000.5
max_cost_per_conversation_usd = 1.5

[[teams]]
name = "ops"
models = []

[[keys]]
name = "alice"
sha256 = "11C712CD20E2E20E029ED035DFAF1482E71C5F58BF571C80D4DDFC18E9C854BC"
team = "research"
rpm = 60
cost_per_day_usd = 12.5

[[keys]]
name = "ci"
sha256 = "8c8e789e8aa3c4d0d9aad5a8b00d81cd96937721471c59209e04a8233ad90f65"

[probe]
enabled = true
interval_seconds = 60
requests = 5
concurrency = 1
max_tokens = 8
timeout_seconds = 10.5
prompt = "Say hi"

[[probe.targets]]
upstream = "openai"
model = "gpt-4o-mini"

[[probe.targets]]
upstream = "local-vllm_2"
model = "Qwen/Qwen2.5-72B"
dialect = "anthropic"

[tracing]
enabled = true
protocol = "grpc"
endpoint = "otel-collector:4317"
insecure = true
headers_env = "OTLP_HEADERS"
sample_ratio = 0.25
service_name = "tollgate-eu"
capture_content = true
queue_size = 100
export_timeout_seconds = 2.5

[conversations]
enabled = true
header = "X-Session"
idle_timeout_seconds = 600
max_active = 5000
state_file = "/var/lib/tollgate/conversations.json"
flush_interval_seconds = 0.5
`
	env := map[string]string{
		"OPENAI_API_KEY":       "sk-test-1",
		"TOLLGATE_ADMIN_TOKEN": "admin-token-0123456789",
		"REDIS_PASSWORD":       "redis-pw-secret",
		"OTLP_HEADERS":         "authorization=Bearer otlp-secret",
	}
	c := mustParse(t, doc, env)
	second := DefaultUpstream()
	second.Name, second.BaseURL = "local-vllm_2", "http://10.0.0.5:8000/proxy"
	second.Retry.Statuses = []int{}
	second.Breaker.Enabled, second.Breaker.MinRequests = false, 0
	want := Config{
		Server: Server{Listen: "127.0.0.1:9999", MaxBodyBytes: 1 << 20, MaxEventBytes: 1 << 16, MaxHeaderBytes: 8192,
			ReadHeaderTimeoutSeconds: 2.5, IdleTimeoutSeconds: 30, DrainTimeoutSeconds: 5, StreamErrorEvents: false},
		Auth: Auth{Mode: "passthrough", RequireKey: false},
		Upstreams: []Upstream{{
			Name: "openai", BaseURL: "https://api.openai.com", APIKeyEnv: "OPENAI_API_KEY",
			APIKey: "sk-test-1", Dialects: []string{"openai"}, TimeoutSeconds: 120,
			ConnectTimeoutSeconds: 3, IncludeUsage: false, MaxIdleConns: 64,
			HeaderTimeoutSeconds: 15, FirstTokenTimeoutSeconds: 60, IdleTimeoutSeconds: 0,
			MaxConcurrent: 100, RequestsPerSecond: 12.5, QueueSize: 0, QueueTimeoutSeconds: 2,
			Retry: Retry{MaxAttempts: 5, BaseDelayMs: 100, MaxDelayMs: 2000, Multiplier: 3, MaxWaitSeconds: 0,
				Statuses: []int{429, 503}, BudgetRatio: 0.5, BudgetMinPerSecond: 0},
			Breaker: Breaker{Enabled: true, ConsecutiveFailures: 3, FailureRatio: 0.25, MinRequests: 10,
				WindowSeconds: 30, CooldownSeconds: 2.5, HalfOpenProbes: 1},
		}, second},
		Routes: []Route{
			{Models: []string{"gpt-4o*", "o3"}, Upstreams: []string{"openai", "local-vllm_2"},
				Rename: map[string]string{"local-vllm_2": "Qwen/Qwen2.5-72B"}},
			{Models: []string{"local/*"}, Upstreams: []string{"local-vllm_2"}},
		},
		Metrics: Metrics{LatencyBuckets: []int64{0, 1000, 4000},
			Labels: map[string]string{"env": "prod", "scene": "chat"},
			Models: []string{"gpt-4o", "claude-sonnet-4-5"}, MaxModels: 20, NativeHistograms: false},
		SLO:       SLO{TTFTMs: 500, TPOTMs: 50.5, E2ELMs: 30000},
		Log:       Log{Level: "debug", Format: "text", AccessLog: false},
		Admin:     Admin{TokenEnv: "TOLLGATE_ADMIN_TOKEN", Token: "admin-token-0123456789"},
		RateLimit: RateLimit{DefaultMaxTokens: 1024, OnRedisError: "deny", RedisRetrySeconds: 0.5},
		Redis: Redis{Addrs: []string{"10.0.0.1:26379", "10.0.0.2:26379"}, MasterName: "mymaster",
			Username: "tollgate", PasswordEnv: "REDIS_PASSWORD", Password: "redis-pw-secret", DB: 2, TLS: true,
			KeyPrefix: "tg:", DialTimeoutMs: 300, TimeoutMs: 100, SpillDir: "/var/lib/tollgate"},
		Spend: Spend{StateFile: "/var/lib/tollgate/spend.json", FlushIntervalSeconds: 5, JournalSyncMs: 0},
		Ownership: Ownership{ResponseTTLHours: 24, ConversationTTLHours: 2160.5,
			StateFile: "/var/lib/tollgate/owners.jsonl"},
		RuntimeKeys: RuntimeKeys{StateFile: "/var/lib/tollgate/keys.json", PollIntervalMs: 100},
		Models: []Model{
			{Pattern: "gpt-4o-mini*", InputUSDPerMTok: 0.15, OutputUSDPerMTok: 0.6, CacheReadUSDPerMTok: f64(0.075)},
			{Pattern: "claude-sonnet-4*", InputUSDPerMTok: 3, OutputUSDPerMTok: 15,
				CacheReadUSDPerMTok: f64(0.3), CacheWriteUSDPerMTok: f64(3.75)},
			{Pattern: "local/*"},
		},
		Teams: []Team{
			{Name: "research", Models: []string{"gpt-4o-mini*", "claude-sonnet-4*"}, Limits: Limits{
				RPM: i64(600), TPM: i64(2000000), Concurrency: i64(32), TokensPerDay: i64(50000000),
				CostPerDayUSD: f64(100), CostPerMonthUSD: f64(2000.5)}, MaxCostPerConversationUSD: f64(1.5)},
			{Name: "ops"},
		},
		Keys: []Key{
			{Name: "alice", SHA256: "11c712cd20e2e20e029ed035dfaf1482e71c5f58bf571c80d4ddfc18e9c854bc", Team: "research",
				Limits: Limits{RPM: i64(60), CostPerDayUSD: f64(12.5)}},
			{Name: "ci", SHA256: "8c8e789e8aa3c4d0d9aad5a8b00d81cd96937721471c59209e04a8233ad90f65"},
		},
		// The first target's dialect is its upstream's first.
		Probe: Probe{Enabled: true, IntervalSeconds: 60, Requests: 5, Concurrency: 1, MaxTokens: 8,
			TimeoutSeconds: 10.5, Prompt: "Say hi", Targets: []ProbeTarget{
				{Upstream: "openai", Model: "gpt-4o-mini", Dialect: "openai"},
				{Upstream: "local-vllm_2", Model: "Qwen/Qwen2.5-72B", Dialect: "anthropic"},
			}},
		Tracing: Tracing{Enabled: true, Protocol: "grpc", Endpoint: "otel-collector:4317", Insecure: true,
			HeadersEnv: "OTLP_HEADERS", Headers: "authorization=Bearer otlp-secret", SampleRatio: 0.25,
			ServiceName: "tollgate-eu", CaptureContent: true, QueueSize: 100, ExportTimeoutSeconds: 2.5},
		Conversations: Conversations{Enabled: true, Header: "X-Session", Identity: DefaultIdentity, IdleTimeoutSeconds: 600, MaxActive: 5000,
			StateFile: "/var/lib/tollgate/conversations.json", FlushIntervalSeconds: 0.5},
	}
	if !reflect.DeepEqual(*c, want) {
		t.Fatalf("Parse =\n%+v\nwant\n%+v", *c, want)
	}

	// Redacted is TOML that parses back to the same configuration, limits
	// left out still left out.
	red := c.Redacted()
	again := mustParse(t, red, env)
	if !reflect.DeepEqual(again, c) {
		t.Errorf("Parse(Redacted()) =\n%+v\nwant\n%+v\nRedacted:\n%s", *again, *c, red)
	}
	for _, secret := range env {
		if strings.Contains(red, secret) {
			t.Errorf("Redacted() reveals %q:\n%s", secret, red)
		}
	}
	for _, want := range []string{
		"# redis password: $REDIS_PASSWORD = <secret>\n",
		"# admin token: $TOLLGATE_ADMIN_TOKEN = <secret>\n",
		"# tracing headers: $OTLP_HEADERS = <secret>\n",
	} {
		if !strings.Contains(red, want) {
			t.Errorf("Redacted() lacks %q:\n%s", want, red)
		}
	}
}

// TestRedactedMinimalRoundTrip checks that a configuration without models,
// teams or keys reads back from Redacted equal, although go-toml writes
// "teams = []" for its nil slices.
func TestRedactedMinimalRoundTrip(t *testing.T) {
	c := mustParse(t, minimal, nil)
	red := c.Redacted()
	if !strings.Contains(red, "teams = []") {
		t.Errorf("Redacted() does not show that there is no team:\n%s", red)
	}
	again := mustParse(t, red, nil)
	if !reflect.DeepEqual(again, c) {
		t.Errorf("Parse(Redacted()) =\n%+v\nwant\n%+v\nRedacted:\n%s", *again, *c, red)
	}
	for _, want := range []string{"# redis password: none\n", "# admin token: none; the admin API is off\n"} {
		if !strings.Contains(red, want) {
			t.Errorf("Redacted() lacks %q:\n%s", want, red)
		}
	}
}

func TestRedactedSummary(t *testing.T) {
	doc := minimal + `
[[upstreams]]
name = "b"
base_url = "http://127.0.0.1:9001"
api_key_env = "B_KEY"
`
	c := mustParse(t, doc, map[string]string{"B_KEY": "sk-b"})
	s := c.Redacted()
	for _, want := range []string{
		`listen = ':8080'`,
		`name = 'b'`,
		`api_key_env = 'B_KEY'`,
		`upstreams[1] "b": $B_KEY = <secret>`,
		`upstreams[0] "a": none`,
	} {
		if !strings.Contains(s, want) {
			t.Errorf("Redacted() lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "sk-b") {
		t.Errorf("Redacted() reveals the key:\n%s", s)
	}
}

func TestEnvSecretResolution(t *testing.T) {
	doc := `
[[upstreams]]
name = "a"
base_url = "http://127.0.0.1:1"
api_key_env = "A_KEY"

[[upstreams]]
name = "b"
base_url = "http://127.0.0.1:2"
`
	var asked []string
	getenv := func(name string) string {
		asked = append(asked, name)
		return map[string]string{"A_KEY": "sk-a", "UNRELATED": "x"}[name]
	}
	c, err := Parse([]byte(doc), "gateway.toml", getenv)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Upstreams[0].APIKey.Reveal(); got != "sk-a" {
		t.Errorf("upstreams[0] key = %q, want sk-a", got)
	}
	if got := c.Upstreams[1].APIKey; got != "" {
		t.Errorf("upstreams[1] has a key without api_key_env")
	}
	if !reflect.DeepEqual(asked, []string{"A_KEY"}) {
		t.Errorf("getenv asked for %q, want only A_KEY", asked)
	}

	for name, env := range map[string]map[string]string{
		"unset": {},
		"empty": {"A_KEY": ""},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(doc), "gateway.toml", fakeEnv(env))
			want := `config: gateway.toml:5: upstreams[0].api_key_env: environment variable A_KEY is not set or is empty`
			if err == nil || err.Error() != want {
				t.Errorf("err = %v\nwant %s", err, want)
			}
		})
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "gw.toml")
	if err := os.WriteFile(path, []byte(minimal), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Upstreams) != 1 || c.Upstreams[0].Name != "a" {
		t.Errorf("Load = %+v", c)
	}

	t.Setenv("TOLLGATE_TEST_KEY", "sk-from-env")
	withEnv := minimal + "api_key_env = \"TOLLGATE_TEST_KEY\"\n"
	if err := os.WriteFile(path, []byte(withEnv), 0o600); err != nil {
		t.Fatal(err)
	}
	if c, err := Load(path); err != nil || c.Upstreams[0].APIKey.Reveal() != "sk-from-env" {
		t.Errorf("Load did not read the key from the process environment: %v", err)
	}

	bad := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(bad, []byte(minimal+"base_ur = \"x\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(bad); err == nil || !strings.Contains(err.Error(), bad+":5: upstreams[0].base_ur: unknown key") {
		t.Errorf("Load(bad) = %v, want the path, line and key", err)
	}

	missing := filepath.Join(dir, "missing.toml")
	if _, err := Load(missing); err == nil || !strings.Contains(err.Error(), missing) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Load(missing) = %v, want a not-exist error naming the path", err)
	}
}

func TestParseByteOrderMark(t *testing.T) {
	c := mustParse(t, "\xef\xbb\xbf"+minimal, nil)
	if c.Upstreams[0].Name != "a" {
		t.Errorf("name = %q", c.Upstreams[0].Name)
	}
}

func TestDemoConfig(t *testing.T) {
	c := DemoConfig("http://127.0.0.1:7777/")
	if err := c.Validate(); err != nil {
		t.Fatalf("DemoConfig does not validate: %v", err)
	}
	if len(c.Upstreams) != 1 || c.Upstreams[0].Name != "mock" || c.Upstreams[0].BaseURL != "http://127.0.0.1:7777" {
		t.Errorf("upstreams = %+v", c.Upstreams)
	}
	// The demo writes no spend, ownership, conversation or spill file and needs no key.
	if c.Spend.StateFile != "" || c.Ownership.StateFile != "" || c.Conversations.StateFile != "" || c.Redis.SpillDir != "" ||
		c.RuntimeKeys.StateFile != "" ||
		c.Auth.Mode != "passthrough" || len(c.Keys) != 0 {
		t.Errorf("DemoConfig state_file = %q, ownership state_file = %q, spill_dir = %q, mode = %q, %d keys; "+
			"want \"\", \"\", \"\", passthrough, none",
			c.Spend.StateFile, c.Ownership.StateFile, c.Redis.SpillDir, c.Auth.Mode, len(c.Keys))
	}
	want := Default()
	want.Upstreams = c.Upstreams
	want.Spend.StateFile, want.Ownership.StateFile, want.Conversations.StateFile, want.Redis.SpillDir = "", "", "", ""
	want.RuntimeKeys.StateFile = ""
	if !reflect.DeepEqual(c, want) {
		t.Errorf("DemoConfig differs from Default() outside its upstream, state file and spill dir")
	}
	if u := c.Upstreams[0]; !u.IncludeUsage || len(u.Dialects) != 2 || u.TimeoutSeconds != 600 {
		t.Errorf("mock upstream lacks the upstream defaults: %+v", u)
	}
}
