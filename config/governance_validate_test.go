package config

import (
	"math"
	"reflect"
	"strings"
	"testing"
)

// priced is a valid [[models]] table; after up it takes lines 4-7.
const priced = `[[models]]
pattern = "gpt-4o*"
input_usd_per_mtok = 2.5
output_usd_per_mtok = 10
`

// Two SHA-256 sums of fake keys ("alice-fake" and "ci-fake").
const (
	shaA = "11c712cd20e2e20e029ed035dfaf1482e71c5f58bf571c80d4ddfc18e9c854bc"
	shaB = "8c8e789e8aa3c4d0d9aad5a8b00d81cd96937721471c59209e04a8233ad90f65"
)

// governanceCases extends TestBadConfigs with the governance tables.
var governanceCases = []struct {
	name string
	doc  string
	env  map[string]string
	want []string
}{
	// [[models]].
	{"model pattern missing", up + "[[models]]\ninput_usd_per_mtok = 1\noutput_usd_per_mtok = 1\n",
		nil, []string{`gateway.toml:4: models[0].pattern: is required: a model name, or a pattern such as "gpt-4o*"`}},
	{"model pattern syntax", up + "[[models]]\npattern = \"gpt-[4\"\ninput_usd_per_mtok = 1\noutput_usd_per_mtok = 1\n",
		nil, []string{`gateway.toml:5: models[0].pattern: "gpt-[4" is not a valid pattern: syntax error in pattern (syntax of Go's path.Match`}},
	{"model pattern trailing backslash", up + "[[models]]\npattern = 'gpt\\'\ninput_usd_per_mtok = 1\noutput_usd_per_mtok = 1\n",
		nil, []string{`gateway.toml:5: models[0].pattern: "gpt\\" is not a valid pattern`}},
	{"model pattern twice", up + priced + priced,
		nil, []string{`gateway.toml:9: models[1].pattern: "gpt-4o*" is already the pattern of models[0]; patterns must be unique`}},
	{"negative price", up + "[[models]]\npattern = \"a\"\ninput_usd_per_mtok = -1\noutput_usd_per_mtok = nan\ncache_read_usd_per_mtok = -0.5\ncache_write_usd_per_mtok = 2e6\n",
		nil, []string{
			`gateway.toml:6: models[0].input_usd_per_mtok: price must be >= 0, not -1`,
			`gateway.toml:7: models[0].output_usd_per_mtok: must be a number, not nan`,
			`gateway.toml:8: models[0].cache_read_usd_per_mtok: price must be >= 0, not -0.5`,
			`gateway.toml:9: models[0].cache_write_usd_per_mtok: 2e+06 is not a plausible price: prices are US dollars per million tokens (e.g. 2.5), at most 1e+06`,
		}},
	{"infinite price", up + "[[models]]\npattern = \"a\"\ninput_usd_per_mtok = 1\noutput_usd_per_mtok = inf\n",
		nil, []string{`gateway.toml:7: models[0].output_usd_per_mtok: +Inf is not a plausible price`}},
	{"price left out", up + "[[models]]\npattern = \"a\"\ninput_usd_per_mtok = 1\n[[models]]\npattern = \"b\"\n",
		nil, []string{
			`gateway.toml:4: models[0].output_usd_per_mtok: is required: US dollars per million tokens (write 0 for a free model)`,
			`gateway.toml:7: models[1].input_usd_per_mtok: is required`,
			`gateway.toml:7: models[1].output_usd_per_mtok: is required`,
		}},
	{"price of the wrong type", up + "[[models]]\npattern = \"a\"\ninput_usd_per_mtok = 1\noutput_usd_per_mtok = 1\ncache_read_usd_per_mtok = \"0.3\"\n",
		nil, []string{`gateway.toml:8: models[0].cache_read_usd_per_mtok: must be a number, not a string`}},

	// [[teams]].
	{"team names", up + "[[teams]]\nrpm = 1\n[[teams]]\nname = \"Research\"\n[[teams]]\nname = \"none\"\n",
		nil, []string{
			`gateway.toml:4: teams[0].name: is required`,
			`gateway.toml:7: teams[1].name: "Research" may hold only a-z, 0-9, _ and -`,
			`gateway.toml:9: teams[2].name: "none" is reserved: logs and metrics use it for requests without one; choose another name`,
		}},
	{"team twice", up + "[[teams]]\nname = \"a\"\n[[teams]]\nname = \"a\"\n",
		nil, []string{`gateway.toml:7: teams[1].name: "a" is already the name of teams[0]; names must be unique`}},
	{"team referencing a missing model pattern", up + priced + "[[teams]]\nname = \"t\"\nmodels = [\"gpt-4o*\", \"gpt-5*\", \"gpt-4o*\"]\n",
		nil, []string{
			`gateway.toml:10: teams[0].models[1]: "gpt-5*" is not the pattern of any [[models]] table; add one (with its prices) or remove it`,
			`gateway.toml:10: teams[0].models[2]: "gpt-4o*" is listed twice`,
		}},
	{"team model matching but not a pattern", up + priced + "[[teams]]\nname = \"t\"\nmodels = [\"gpt-4o-mini\"]\n",
		nil, []string{`gateway.toml:10: teams[0].models[0]: "gpt-4o-mini" is not the pattern of any [[models]] table`}},
	{"limit of zero", up + "[[teams]]\nname = \"t\"\nrpm = 0\ntpm = -5\nconcurrency = 0\ntokens_per_day = 1000000000000001\n",
		nil, []string{
			`gateway.toml:6: teams[0].rpm: a limit of 0 would refuse every request; leave the key out for no limit`,
			`gateway.toml:7: teams[0].tpm: must be greater than 0, not -5; leave the key out for no limit`,
			`gateway.toml:8: teams[0].concurrency: a limit of 0 would refuse every request`,
			`gateway.toml:9: teams[0].tokens_per_day: 1000000000000001 is too large (at most 1e15)`,
		}},
	{"limit of the wrong type", up + "[[teams]]\nname = \"t\"\nrpm = \"60\"\n",
		nil, []string{`gateway.toml:6: teams[0].rpm: must be an integer, not a string`}},
	{"fractional limit", up + "[[teams]]\nname = \"t\"\ntpm = 1.5\n",
		nil, []string{`gateway.toml:6: teams[0].tpm: must be an integer, not a float`}},
	{"misspelt limit", up + "[[teams]]\nname = \"t\"\nrpn = 5\n",
		nil, []string{`gateway.toml:6: teams[0].rpn: unknown key; did you mean "rpm"?`}},
	{"cost limits", up + priced + "[[teams]]\nname = \"t\"\ncost_per_day_usd = 0\ncost_per_month_usd = -1\n" +
		"[[keys]]\nname = \"k\"\nsha256 = \"" + shaA + "\"\ncost_per_day_usd = nan\ncost_per_month_usd = 2e9\n" +
		"[[keys]]\nname = \"l\"\nsha256 = \"" + shaB + "\"\ncost_per_day_usd = inf\n",
		nil, []string{
			`gateway.toml:10: teams[0].cost_per_day_usd: a budget of 0 would refuse every request; leave the key out for no limit`,
			`gateway.toml:11: teams[0].cost_per_month_usd: must be greater than 0, not -1; leave the key out for no limit`,
			`gateway.toml:15: keys[0].cost_per_day_usd: must be a number, not nan`,
			`gateway.toml:16: keys[0].cost_per_month_usd: 2e+09 US dollars is too large (at most 1e9)`,
			`gateway.toml:20: keys[1].cost_per_day_usd: +Inf US dollars is too large`,
		}},
	{"cost limit without models", up + "[[teams]]\nname = \"t\"\ncost_per_month_usd = 100\n[[keys]]\nname = \"k\"\nsha256 = \"" + shaA + "\"\ncost_per_day_usd = 1\n",
		nil, []string{
			`gateway.toml:6: teams[0].cost_per_month_usd: no [[models]] table gives a price, so every request would cost 0 and this budget would never be spent`,
			`gateway.toml:10: keys[0].cost_per_day_usd: no [[models]] table gives a price`,
		}},

	// [[keys]].
	{"key name and sha256 missing", up + "[[keys]]\nrpm = 5\n",
		nil, []string{`gateway.toml:4: keys[0].name: is required`, "gateway.toml:4: keys[0].sha256: is required: the key's SHA-256 in hex, as `gateway hash-key` prints it"}},
	{"key names", up + "[[keys]]\nname = \"none\"\nsha256 = \"" + shaA + "\"\n[[keys]]\nname = \"a b\"\nsha256 = \"" + shaB + "\"\n",
		nil, []string{`gateway.toml:5: keys[0].name: "none" is reserved`, `gateway.toml:8: keys[1].name: "a b" may hold only a-z, 0-9, _ and -`}},
	{"key twice", up + "[[keys]]\nname = \"k\"\nsha256 = \"" + shaA + "\"\n[[keys]]\nname = \"k\"\nsha256 = \"" + shaB + "\"\n",
		nil, []string{`gateway.toml:8: keys[1].name: "k" is already the name of keys[0]; names must be unique`}},
	{"bad hex", up + "[[keys]]\nname = \"a\"\nsha256 = \"" + strings.Repeat("g", 64) + "\"\n[[keys]]\nname = \"b\"\nsha256 = \"" + shaA[:63] + "\"\n",
		nil, []string{
			"gateway.toml:6: keys[0].sha256: is not a SHA-256 in hex (64 characters 0-9, a-f; this one has 64); the key itself never goes in this file: put the output of `gateway hash-key` here",
			`gateway.toml:9: keys[1].sha256: is not a SHA-256 in hex (64 characters 0-9, a-f; this one has 63)`,
		}},
	{"duplicate sha256", up + "[[keys]]\nname = \"alice\"\nsha256 = \"" + shaA + "\"\n[[keys]]\nname = \"bob\"\nsha256 = \"" + strings.ToUpper(shaA) + "\"\n",
		nil, []string{`gateway.toml:9: keys[1].sha256: is already the sha256 of keys[0] ("alice"): one key cannot have two names`}},
	{"unknown team on a key", up + "[[teams]]\nname = \"t\"\n[[keys]]\nname = \"k\"\nsha256 = \"" + shaA + "\"\nteam = \"tt\"\n",
		nil, []string{`gateway.toml:9: keys[0].team: "tt" is not the name of any [[teams]] table; add the team or remove team from the key`}},
	{"key limit of zero", up + "[[keys]]\nname = \"k\"\nsha256 = \"" + shaA + "\"\nconcurrency = 0\n",
		nil, []string{`gateway.toml:7: keys[0].concurrency: a limit of 0 would refuse every request`}},
	{"raw key in [[keys]]", up + "[[keys]]\nname = \"k\"\nkey = \"sk-x\"\n",
		nil, []string{"gateway.toml:6: keys[0].key: unknown key; the key itself stays out of the file: put its SHA-256 in sha256 (`gateway hash-key` prints it)"}},

	// [ratelimit].
	{"ratelimit", up + "[ratelimit]\ndefault_max_tokens = 0\non_redis_error = \"retry\"\nredis_retry_seconds = 0\n",
		nil, []string{
			`gateway.toml:5: ratelimit.default_max_tokens: must be greater than 0, not 0`,
			`gateway.toml:6: ratelimit.on_redis_error: "retry" is not a choice; use "allow" (fall back to in-process limits) or "deny" (refuse with 503)`,
			`gateway.toml:7: ratelimit.redis_retry_seconds: must be greater than 0, not 0`,
		}},

	// [redis].
	{"redis addrs", up + "[redis]\naddrs = [\"localhost\", \":6379\", \"h:0\", \"h:99999\", \"h:6379\", \"h:6379\", \"h:redis\"]\n",
		nil, []string{
			`gateway.toml:5: redis.addrs[0]: "localhost" is not host:port (e.g. "127.0.0.1:6379")`,
			`gateway.toml:5: redis.addrs[1]: ":6379" has no host`,
			`gateway.toml:5: redis.addrs[2]: "h:0": port "0" is not a number from 1 to 65535`,
			`gateway.toml:5: redis.addrs[3]: "h:99999": port "99999" is not a number from 1 to 65535`,
			`gateway.toml:5: redis.addrs[5]: "h:6379" is listed twice`,
			`gateway.toml:5: redis.addrs[6]: "h:redis": port "redis"`,
		}},
	{"redis url in addrs", up + "[redis]\naddrs = [\"redis://u:pw@h:6379\"]\n",
		nil, []string{`gateway.toml:5: redis.addrs[0]: is not host:port (e.g. "127.0.0.1:6379"); credentials go in username and password_env`}},
	{"redis cluster db", up + "[redis]\naddrs = [\"a:7000\", \"b:7000\"]\ndb = 1\n",
		nil, []string{`gateway.toml:6: redis.db: several addrs and no master_name mean Redis Cluster, which has only database 0`}},
	{"redis without addrs", up + "[redis]\nmaster_name = \"m\"\ndb = -1\nkey_prefix = \"{tg}:\"\n",
		nil, []string{
			`gateway.toml:5: redis.master_name: is set but redis.addrs is empty; list the Sentinel addresses in addrs`,
			`gateway.toml:6: redis.db: must be 0 or more, not -1`,
			`gateway.toml:7: redis.key_prefix: "{tg}:" must not hold { or }`,
		}},
	{"redis sizes", up + "[redis]\naddrs = [\"h:1\"]\nkey_prefix = \"\"\ndial_timeout_ms = 0\ntimeout_ms = -1\n",
		nil, []string{
			`gateway.toml:6: redis.key_prefix: must not be empty`,
			`gateway.toml:7: redis.dial_timeout_ms: must be greater than 0, not 0`,
			`gateway.toml:8: redis.timeout_ms: must be greater than 0, not -1`,
		}},
	{"redis password unset", up + "[redis]\naddrs = [\"h:1\"]\npassword_env = \"REDIS_PW\"\n",
		map[string]string{"OTHER": "x"}, []string{`gateway.toml:6: redis.password_env: environment variable REDIS_PW is not set or is empty`}},
	{"redis password in the file", up + "[redis]\npassword_env = \"hunter2!\"\n",
		nil, []string{`gateway.toml:5: redis.password_env: is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*); give the variable's name, not the password itself`}},
	{"redis password key", up + "[redis]\npassword = \"x\"\n",
		nil, []string{`gateway.toml:5: redis.password: unknown key; the password stays out of the file: put it in an environment variable and name it in password_env`}},

	// [spend].
	{"spend", up + "[spend]\nflush_interval_seconds = 0\n",
		nil, []string{`gateway.toml:5: spend.flush_interval_seconds: must be greater than 0, not 0`}},
	{"spend journal sync", up + "[spend]\njournal_sync_ms = -1\n",
		nil, []string{`gateway.toml:5: spend.journal_sync_ms: must be 0 (off) or more, not -1`}},

	// [admin].
	{"admin token unset", up + "[admin]\ntoken_env = \"ADMIN_TOKEN\"\n",
		nil, []string{`gateway.toml:5: admin.token_env: environment variable ADMIN_TOKEN is not set or is empty`}},
	{"admin token short", up + "[admin]\ntoken_env = \"ADMIN_TOKEN\"\n",
		map[string]string{"ADMIN_TOKEN": "fifteen-chars-x"}, []string{`gateway.toml:5: admin.token_env: admin token from $ADMIN_TOKEN is shorter than 16 characters`}},
	{"admin token name", up + "[admin]\ntoken_env = \"not a name\"\n",
		nil, []string{`gateway.toml:5: admin.token_env: is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*); give the variable's name, not the token itself`}},
	{"admin token key", up + "[admin]\ntoken = \"x\"\n",
		nil, []string{`gateway.toml:5: admin.token: unknown key; the token stays out of the file: put it in an environment variable and name it in token_env`}},
}

// governanceDoc is a valid document using every governance table.
const governanceDoc = up + priced + `
[[models]]
pattern = "claude-*"
input_usd_per_mtok = 3
output_usd_per_mtok = 15
cache_write_usd_per_mtok = 3.75

[[teams]]
name = "research"
models = ["gpt-4o*"]
rpm = 100

[[teams]]
name = "ops"

[[keys]]
name = "alice"
sha256 = "` + "11C712CD20E2E20E029ED035DFAF1482E71C5F58BF571C80D4DDFC18E9C854BC" + `"
team = "research"
cost_per_day_usd = 5

[[keys]]
name = "ci"
sha256 = "` + shaB + `"
`

func TestGovernanceParse(t *testing.T) {
	c := mustParse(t, governanceDoc, nil)
	if got := c.Keys[0].SHA256; got != shaA {
		t.Errorf("keys[0].sha256 = %q, want it lowercased to %q", got, shaA)
	}
	if c.Teams[1].Models != nil {
		t.Errorf("teams[1].models = %#v, want nil (any model)", c.Teams[1].Models)
	}
	if c.Models[0].CacheReadUSDPerMTok != nil || c.Models[1].CacheWriteUSDPerMTok == nil || *c.Models[1].CacheWriteUSDPerMTok != 3.75 {
		t.Errorf("cache prices = %v %v, want nil and 3.75", c.Models[0].CacheReadUSDPerMTok, c.Models[1].CacheWriteUSDPerMTok)
	}

	if tm := c.Team("research"); tm != &c.Teams[0] {
		t.Errorf("Team(research) = %p, want &c.Teams[0]", tm)
	}
	if tm := c.Team("none"); tm != nil {
		t.Errorf("Team(none) = %+v, want nil", tm)
	}
	for _, sum := range []string{shaA, strings.ToUpper(shaA)} {
		if k := c.KeyBySHA256(sum); k != &c.Keys[0] {
			t.Errorf("KeyBySHA256(%s) = %p, want &c.Keys[0]", sum, k)
		}
	}
	if k := c.KeyBySHA256(shaB); k != &c.Keys[1] {
		t.Errorf("KeyBySHA256(shaB) = %p, want &c.Keys[1]", k)
	}
	if k := c.KeyBySHA256(strings.Repeat("0", 64)); k != nil {
		t.Errorf("KeyBySHA256(unknown) = %+v, want nil", k)
	}
	if k := c.KeyBySHA256(""); k != nil {
		t.Errorf("KeyBySHA256(\"\") = %+v, want nil", k)
	}
	if c.UsesRedis() {
		t.Error("UsesRedis() with no addrs")
	}
	c.Redis.Addrs = []string{"h:1"}
	if !c.UsesRedis() {
		t.Error("UsesRedis() = false with an addr")
	}

	// Keys mode admits this configuration: it has keys.
	keys := mustParse(t, strings.Replace(governanceDoc, up, up+"[auth]\nmode = \"keys\"\n", 1), nil)
	if keys.Auth.Mode != "keys" {
		t.Errorf("mode = %q", keys.Auth.Mode)
	}
}

func TestLimitsIsZero(t *testing.T) {
	if !(Limits{}).IsZero() {
		t.Error("Limits{}.IsZero() = false")
	}
	// Each limit alone, even a bad 0, makes Limits non-zero: IsZero tells
	// "no key written", not "no effect".
	for name, l := range map[string]Limits{
		"rpm":                {RPM: i64(0)},
		"tpm":                {TPM: i64(1)},
		"concurrency":        {Concurrency: i64(1)},
		"tokens_per_day":     {TokensPerDay: i64(1)},
		"cost_per_day_usd":   {CostPerDayUSD: f64(0)},
		"cost_per_month_usd": {CostPerMonthUSD: f64(1)},
		"count_tokens_rpm":   {CountTokensRPM: i64(1)},
	} {
		if l.IsZero() {
			t.Errorf("Limits{%s}.IsZero() = true", name)
		}
	}
	// IsZero must look at every field: a limit added to Limits and left out
	// of IsZero would read as "no limit".
	n := reflect.TypeFor[Limits]().NumField()
	if n != 7 {
		t.Errorf("Limits has %d fields; update IsZero and this test", n)
	}
}

func TestUSDToMicros(t *testing.T) {
	for _, tc := range []struct {
		usd  float64
		want int64
	}{
		{0, 0},
		{1, 1_000_000},
		{0.000001, 1},
		{0.0000004, 0},
		{0.0000005, 1}, // rounds half away from zero
		{2.5, 2_500_000},
		{0.1 + 0.2, 300_000}, // 0.30000000000000004
		{-1.25, -1_250_000},
		{maxCostUSD, 1_000_000_000_000_000},
	} {
		if got := USDToMicros(tc.usd); got != tc.want {
			t.Errorf("USDToMicros(%g) = %d, want %d", tc.usd, got, tc.want)
		}
	}
}

// TestGovernanceAcceptsEdges checks the limits of each rule from the
// accepting side.
func TestGovernanceAcceptsEdges(t *testing.T) {
	doc := up + `
[auth]
mode = "keys"

[redis]
addrs = ["[::1]:6379", "sentinel-2.internal:26379"]
master_name = "main"
db = 15
password_env = "REDIS_PW"
key_prefix = "t"
dial_timeout_ms = 0.5
timeout_ms = 1

[ratelimit]
default_max_tokens = 1
on_redis_error = "deny"
redis_retry_seconds = 0.001

[spend]
state_file = ""
flush_interval_seconds = 0.01

[admin]
token_env = "ADMIN_TOKEN"

[[models]]
pattern = "exact-name"
input_usd_per_mtok = 0
output_usd_per_mtok = 1e6
cache_read_usd_per_mtok = 0
cache_write_usd_per_mtok = 1e6

[[models]]
pattern = 'a\*[b-c]?'
input_usd_per_mtok = 0.000001
output_usd_per_mtok = 0

[[teams]]
name = "a_b-1"
models = ["exact-name", 'a\*[b-c]?']
rpm = 1
tpm = 1000000000000000
concurrency = 1
tokens_per_day = 1
cost_per_day_usd = 0.000001
cost_per_month_usd = 1e9

[[keys]]
name = "0"
sha256 = "` + shaA + `"
team = "a_b-1"
rpm = 1000000000000000
`
	// 16 characters exactly, counted as characters, not bytes.
	env := map[string]string{"REDIS_PW": "p", "ADMIN_TOKEN": "ééééééééééééééé1"}
	c := mustParse(t, doc, env)
	if c.Redis.Password.Reveal() != "p" || c.Admin.Token.Reveal() != env["ADMIN_TOKEN"] {
		t.Errorf("secrets not read: password %v, token %v", c.Redis.Password, c.Admin.Token)
	}
	// A single address may use any database.
	c.Redis.Addrs, c.Redis.MasterName = c.Redis.Addrs[:1], ""
	if err := c.Validate(); err != nil {
		t.Errorf("one address with db 15: %v", err)
	}
	// Prices may be exactly 0 and exactly the bound; the bound itself is
	// what the constants say.
	if maxPriceUSDPerMTok != 1e6 || maxCostUSD != 1e9 || maxLimit != 1e15 || minAdminToken != 16 {
		t.Error("bounds differ from the documented ones")
	}
	c.Models[0].OutputUSDPerMTok = math.Nextafter(1e6, math.Inf(1))
	if err := c.Validate(); err == nil {
		t.Error("a price just above 1e6 was accepted")
	}
}

// TestSecretsAbsentFromGovernanceErrors puts secrets where users put them
// by mistake and checks that no error prints them.
func TestSecretsAbsentFromGovernanceErrors(t *testing.T) {
	for name, doc := range map[string]string{
		"key in sha256":       up + "[[keys]]\nname = \"k\"\nsha256 = \"" + rawKey + "\"\n",
		"password in addrs":   up + "[redis]\naddrs = [\"redis://user:" + rawKey + "@h:6379\"]\n",
		"password in env key": up + "[redis]\npassword_env = \"" + rawKey + "\"\n",
		"token in env key":    up + "[admin]\ntoken_env = \"" + rawKey + "\"\n",
		"key as a key":        up + "[[keys]]\nname = \"k\"\nkey = \"" + rawKey + "\"\n",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(doc), "gateway.toml", noEnv)
			if err == nil {
				t.Fatal("Parse accepted the document")
			}
			if strings.Contains(err.Error(), rawKey) {
				t.Errorf("error reveals the secret: %v", err)
			}
		})
	}

	// A short admin token and a bad config around a set password: the
	// values stay out of the error.
	const token, password = "short-TOKEN-val", "redis-PASSWORD-value"
	doc := up + "[admin]\ntoken_env = \"T\"\n[redis]\naddrs = [\"h:1\"]\npassword_env = \"P\"\ndb = -1\n"
	_, err := Parse([]byte(doc), "gateway.toml", fakeEnv(map[string]string{"T": token, "P": password}))
	if err == nil || !strings.Contains(err.Error(), "shorter than 16") || !strings.Contains(err.Error(), "redis.db") {
		t.Fatalf("err = %v, want the short token and the db", err)
	}
	for _, s := range []string{token, password} {
		if strings.Contains(err.Error(), s) {
			t.Errorf("error reveals %q: %v", s, err)
		}
	}
}

// TestValidateCollectsGovernance checks that governance problems come with
// the others, each a separate error, when Validate runs on a Config built in
// code.
func TestValidateCollectsGovernance(t *testing.T) {
	c := DemoConfig("http://127.0.0.1:1")
	c.Log.Level = "x"
	c.Models = []Model{{Pattern: "m", InputUSDPerMTok: -1}}
	c.Teams = []Team{{Name: "t", Models: []string{"n"}, Limits: Limits{RPM: i64(0)}}}
	c.Keys = []Key{{Name: "k", SHA256: "abc", Team: "u"}}
	c.RateLimit.OnRedisError = ""
	c.Redis.KeyPrefix = ""
	c.Spend.FlushIntervalSeconds = -1
	c.Ownership.ResponseTTLHours = 0
	c.Ownership.ConversationTTLHours = -2
	err := c.Validate()
	keys := []string{"log.level", "models[0].input_usd_per_mtok", "teams[0].models[0]", "teams[0].rpm",
		"keys[0].sha256", "keys[0].team", "ratelimit.on_redis_error", "redis.key_prefix", "spend.flush_interval_seconds",
		"ownership.response_ttl_hours", "ownership.conversation_ttl_hours"}
	if got := len(unjoin(err)); got != len(keys) {
		t.Errorf("%d problems, want %d:\n%v", got, len(keys), err)
	}
	for _, k := range keys {
		if !strings.Contains(err.Error(), "config: "+k+": ") {
			t.Errorf("no problem names %s:\n%v", k, err)
		}
	}
}
