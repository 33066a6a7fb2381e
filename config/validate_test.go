package config

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
)

// up is a valid upstream taking lines 1-3, so line numbers below are easy to
// read.
const up = `[[upstreams]]
name = "a"
base_url = "http://127.0.0.1:1"
`

// TestBadConfigs is the table of bad files and the problems they must report,
// each with the file, the line and the key.
func TestBadConfigs(t *testing.T) {
	cases := []struct {
		name string
		doc  string
		env  map[string]string
		want []string
	}{
		// Decoding: unknown keys, wrong types, bad TOML.
		{"unknown key", up + "base_ur = \"x\"\n",
			nil, []string{`config: gateway.toml:4: upstreams[0].base_ur: unknown key; did you mean "base_url"?`}},
		{"unknown key in second upstream", up + up + "timeout = 3\n",
			nil, []string{`gateway.toml:7: upstreams[1].timeout: unknown key; did you mean "timeout_seconds"?`}},
		{"unknown keys all reported", "[server]\nlisten = \":1\"\nport = 8080\n[log]\nlvl = \"x\"\n" + up,
			nil, []string{`gateway.toml:3: server.port: unknown key`, `gateway.toml:5: log.lvl: unknown key; did you mean "level"?`}},
		{"unknown table", up + "[upstream]\nname = \"x\"\n",
			nil, []string{`gateway.toml:4: upstream: unknown table; did you mean "upstreams"?`}},
		{"key in the file", up + "api_key = \"sk-x\"\n",
			nil, []string{`gateway.toml:4: upstreams[0].api_key: unknown key; keys stay out of the file`}},
		{"string for integer", up + "[server]\nmax_body_bytes = \"32MiB\"\n",
			nil, []string{`gateway.toml:5: server.max_body_bytes: must be an integer, not a string`}},
		{"float for integer", up + "max_idle_conns = 1.5\n",
			nil, []string{`gateway.toml:4: upstreams[0].max_idle_conns: must be an integer, not a float`}},
		{"string for boolean", up + "include_usage = \"yes\"\n",
			nil, []string{`gateway.toml:4: upstreams[0].include_usage: must be a boolean (true or false), not a string`}},
		{"string for array", up + "dialects = \"openai\"\n",
			nil, []string{`gateway.toml:4: upstreams[0].dialects: must be an array of strings, not a string`}},
		{"bad array element", up + "[metrics]\nlatency_buckets = [0, \"500\"]\n",
			nil, []string{`gateway.toml:5: metrics.latency_buckets: each element must be an integer, not a string`}},
		{"bad label value", up + "[metrics.labels]\nenv = 1\n",
			nil, []string{`gateway.toml:5: metrics.labels.env: must be a string, not an integer`}},
		{"table for value", up + "[log]\nlevel = { a = 1 }\n",
			nil, []string{`gateway.toml:5: log.level: must be a string, not an inline table`}},
		{"integer overflow", up + "[server]\nmax_body_bytes = 99999999999999999999\n",
			nil, []string{`gateway.toml:5: server.max_body_bytes: `}},
		{"syntax error", up + "[server]\nlisten = \n",
			nil, []string{`gateway.toml:5:10: invalid TOML: `}},
		{"duplicate key", up + "name = \"b\"\n",
			nil, []string{`gateway.toml:4: name: key name is already defined`}},
		{"duplicate table", "[log]\n[log]\n" + up,
			nil, []string{`gateway.toml:2: log: table log already exists`}},

		// Validation, [server].
		{"listen without port", up + "[server]\nlisten = \"8080\"\n",
			nil, []string{`gateway.toml:5: server.listen: "8080" is not host:port`}},
		{"listen bad port", up + "[server]\nlisten = \":http\"\n",
			nil, []string{`gateway.toml:5: server.listen: ":http": port "http" is not a number`}},
		{"listen port too big", up + "[server]\nlisten = \":65536\"\n",
			nil, []string{`server.listen: ":65536": port "65536"`}},
		{"sizes and timeouts", up + "[server]\nmax_body_bytes = 0\nmax_event_bytes = -1\nread_header_timeout_seconds = 0\nidle_timeout_seconds = -2\ndrain_timeout_seconds = nan\n",
			nil, []string{
				`gateway.toml:5: server.max_body_bytes: must be greater than 0, not 0`,
				`gateway.toml:6: server.max_event_bytes: must be greater than 0, not -1`,
				`gateway.toml:7: server.read_header_timeout_seconds: must be greater than 0, not 0`,
				`gateway.toml:8: server.idle_timeout_seconds: must be greater than 0, not -2`,
				`gateway.toml:9: server.drain_timeout_seconds: must be a number, not nan`,
			}},
		{"header limits", up + "[server]\nmax_header_bytes = 0\n",
			nil, []string{`gateway.toml:5: server.max_header_bytes: must be greater than 0, not 0`}},
		{"header limit too big", up + "[server]\nmax_header_bytes = 16777217\n",
			nil, []string{`gateway.toml:5: server.max_header_bytes: 16777217 is more than 16777216 (16 MiB)`}},
		{"negative shutdown delay", up + "[server]\nshutdown_delay_seconds = -1\n",
			nil, []string{`gateway.toml:5: server.shutdown_delay_seconds: must be 0 (off) or more, not -1`}},
		{"timeout overflows a duration", up + "timeout_seconds = 1e300\n",
			nil, []string{`gateway.toml:4: upstreams[0].timeout_seconds: 1e+300 is too large`}},
		{"infinite timeout", up + "connect_timeout_seconds = inf\n",
			nil, []string{`gateway.toml:4: upstreams[0].connect_timeout_seconds: +Inf is too large`}},

		// [auth].
		{"auth keys mode without keys", up + "[auth]\nmode = \"keys\"\n",
			nil, []string{`gateway.toml:5: auth.mode: "keys" admits only callers whose key is listed in [[keys]], and there is none; add a [[keys]] table`}},
		{"auth unknown mode", up + "[auth]\nmode = \"none\"\n",
			nil, []string{`gateway.toml:5: auth.mode: "none" is not a mode; use "passthrough" or "keys"`}},

		// [[upstreams]].
		{"no upstream", "[server]\nlisten = \":1\"\n",
			nil, []string{`config: gateway.toml: at least one [[upstreams]] is required`}},
		{"empty file", "",
			nil, []string{`config: gateway.toml: at least one [[upstreams]] is required`}},
		{"missing name and url", "[[upstreams]]\ndialects = [\"openai\"]\n",
			nil, []string{`gateway.toml:1: upstreams[0].name: is required`, `gateway.toml:1: upstreams[0].base_url: is required`}},
		{"bad name", "[[upstreams]]\nname = \"Open AI\"\nbase_url = \"http://h\"\n",
			nil, []string{`gateway.toml:2: upstreams[0].name: "Open AI" may hold only a-z, 0-9, _ and -`}},
		{"duplicate name", up + up,
			nil, []string{`gateway.toml:5: upstreams[1].name: "a" is already the name of upstreams[0]`}},
		{"scheme", "[[upstreams]]\nname = \"a\"\nbase_url = \"ftp://h\"\n",
			nil, []string{`gateway.toml:3: upstreams[0].base_url: "ftp://h": scheme must be http or https`}},
		{"no scheme", "[[upstreams]]\nname = \"a\"\nbase_url = \"api.openai.com\"\n",
			nil, []string{`gateway.toml:3: upstreams[0].base_url: "api.openai.com": scheme must be http or https`}},
		{"no host", "[[upstreams]]\nname = \"a\"\nbase_url = \"http:///v2\"\n",
			nil, []string{`upstreams[0].base_url: "http:///v2" has no host`}},
		{"query", "[[upstreams]]\nname = \"a\"\nbase_url = \"http://h/?x=1\"\n",
			nil, []string{`upstreams[0].base_url: "http://h/?x=1" must not have a query`}},
		{"fragment", "[[upstreams]]\nname = \"a\"\nbase_url = \"http://h/#x\"\n",
			nil, []string{`upstreams[0].base_url: "http://h/#x" must not have a fragment`}},
		{"credentials in url", "[[upstreams]]\nname = \"a\"\nbase_url = \"https://u:pw@h\"\n",
			nil, []string{`upstreams[0].base_url: "https://u:xxxxx@h" holds credentials`}},
		{"v1 suffix", "[[upstreams]]\nname = \"a\"\nbase_url = \"https://api.openai.com/v1/\"\n",
			nil, []string{`gateway.toml:3: upstreams[0].base_url: "https://api.openai.com/v1" ends in /v1; leave it out`}},
		{"unparsable url", "[[upstreams]]\nname = \"a\"\nbase_url = \"http://[::1\"\n",
			nil, []string{`gateway.toml:3: upstreams[0].base_url: "http://[::1" is not a URL: missing ']' in host`}},
		{"port out of range", "[[upstreams]]\nname = \"a\"\nbase_url = \"http://h:65536\"\n",
			nil, []string{`gateway.toml:3: upstreams[0].base_url: "http://h:65536": port "65536" is not a number from 0 to 65535`}},
		{"empty dialects", up + "dialects = []\n",
			nil, []string{`gateway.toml:4: upstreams[0].dialects: must list at least one of "openai", "anthropic"`}},
		{"unknown and repeated dialects", up + "dialects = [\"openai\", \"gemini\", \"openai\"]\n",
			nil, []string{
				`gateway.toml:4: upstreams[0].dialects[1]: "gemini" is not a dialect; use "openai" or "anthropic"`,
				`gateway.toml:4: upstreams[0].dialects[2]: "openai" is listed twice`,
			}},
		{"api_key_env holds a key", up + "api_key_env = \"sk-abc123\"\n",
			nil, []string{`gateway.toml:4: upstreams[0].api_key_env: is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*); give the variable's name, not the key itself`}},
		{"api_key_env unset", up + "api_key_env = \"MY_KEY\"\n",
			map[string]string{"OTHER": "x"}, []string{`gateway.toml:4: upstreams[0].api_key_env: environment variable MY_KEY is not set or is empty`}},
		{"h2c on an https upstream", "[[upstreams]]\nname = \"tls\"\nbase_url = \"https://api.openai.com\"\nh2c = true\n",
			nil, []string{`gateway.toml:4: upstreams[0].h2c: is for http:// upstreams (HTTP/2 without TLS); an https:// base_url negotiates HTTP/2 by itself, so leave h2c out`}},
		{"upstream sizes", up + "timeout_seconds = 0\nconnect_timeout_seconds = -1\nmax_idle_conns = 0\n",
			nil, []string{
				`gateway.toml:4: upstreams[0].timeout_seconds: must be greater than 0, not 0`,
				`gateway.toml:5: upstreams[0].connect_timeout_seconds: must be greater than 0, not -1`,
				`gateway.toml:6: upstreams[0].max_idle_conns: must be greater than 0, not 0`,
			}},
		{"inline upstream", "upstreams = [\n  { name = \"a\", base_url = \"http://h\" },\n  { name = \"B\", base_url = \"http://h\" },\n]\n",
			nil, []string{`gateway.toml:3: upstreams[1].name: "B" may hold only`}},

		// [metrics].
		{"buckets empty", up + "[metrics]\nlatency_buckets = []\n",
			nil, []string{`gateway.toml:5: metrics.latency_buckets: must list at least one edge, starting at 0`}},
		{"buckets start", up + "[metrics]\nlatency_buckets = [100, 200]\n",
			nil, []string{`gateway.toml:5: metrics.latency_buckets: must start at 0, not 100`}},
		{"buckets order", up + "[metrics]\nlatency_buckets = [0, 500, 500, 100]\n",
			nil, []string{
				`gateway.toml:5: metrics.latency_buckets[2]: must be strictly ascending: 500 follows 500`,
				`gateway.toml:5: metrics.latency_buckets[3]: must be strictly ascending: 100 follows 500`,
			}},
		{"labels", up + "[metrics.labels]\nenv = \"prod\"\n\"bad-name\" = \"x\"\n__meta = \"x\"\nteam = \"x\"\nle = \"x\"\n",
			nil, []string{
				`gateway.toml:8: metrics.labels.team: "team" is one of tollgate's own labels`,
				`gateway.toml:6: metrics.labels.bad-name: "bad-name" is not a Prometheus label name`,
				`gateway.toml:7: metrics.labels.__meta: "__meta": names starting with __ are reserved by Prometheus`,
				`gateway.toml:9: metrics.labels.le: "le" is one of tollgate's own labels`,
			}},
		{"dotted label keys", up + "[metrics]\nlabels.model = \"x\"\n",
			nil, []string{`gateway.toml:5: metrics.labels.model: "model" is one of tollgate's own labels`}},
		{"quoted label key", up + "[metrics.labels]\n\"a b\" = \"x\"\n",
			nil, []string{`gateway.toml:5: metrics.labels."a b": "a b" is not a Prometheus label name`}},
		{"models", up + "[metrics]\nmodels = [\"gpt-4o\", \"\"]\nmax_models = 0\n",
			nil, []string{
				`gateway.toml:5: metrics.models[1]: must not be empty`,
				`gateway.toml:6: metrics.max_models: must be at least 1, not 0`,
			}},

		// [slo] and [log].
		{"slo negative", up + "[slo]\nttft_ms = -1\ntpot_ms = -0.5\ne2el_ms = -inf\n",
			nil, []string{
				`gateway.toml:5: slo.ttft_ms: must be 0 (off) or more, not -1`,
				`gateway.toml:6: slo.tpot_ms: must be 0 (off) or more, not -0.5`,
				`gateway.toml:7: slo.e2el_ms: must be 0 (off) or more, not -Inf`,
			}},
		{"log", up + "[log]\nlevel = \"trace\"\nformat = \"xml\"\n",
			nil, []string{
				`gateway.toml:5: log.level: "trace" is not a level; use "debug", "info", "warn" or "error"`,
				`gateway.toml:6: log.format: "xml" is not a format; use "json" or "text"`,
			}},
	}
	cases = append(cases, governanceCases...)
	cases = append(cases, resilienceCases...)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.doc), "gateway.toml", fakeEnv(tc.env))
			if err == nil {
				t.Fatalf("Parse accepted:\n%s\n%+v", tc.doc, c)
			}
			if c != nil {
				t.Errorf("Parse returned a config with an error")
			}
			lines := errLines(err)
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error lacks %q; got:\n%v", want, err)
				}
			}
			// Every problem is its own line, says which file it is in and
			// starts with the package prefix.
			for _, l := range lines {
				if !strings.HasPrefix(l, "config: gateway.toml") {
					t.Errorf("problem %q lacks the prefix and file name", l)
				}
			}
			if len(lines) < len(tc.want) {
				t.Errorf("%d problems reported, want at least %d:\n%v", len(lines), len(tc.want), err)
			}
		})
	}
}

// TestValidateCollectsAll checks that one run reports every problem, not the
// first, and that each problem is a separate wrapped error.
func TestValidateCollectsAll(t *testing.T) {
	c := DemoConfig("http://127.0.0.1:1")
	c.Server.Listen = "x"
	c.Auth.Mode = "keys"
	c.Upstreams = append(c.Upstreams, c.Upstreams[0])
	c.Metrics.MaxModels = 0
	c.SLO.TPOTMs = -1
	c.Log.Format = "yaml"
	err := c.Validate()
	keys := []string{"server.listen", "auth.mode", "upstreams[1].name", "metrics.max_models", "slo.tpot_ms", "log.format"}
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		t.Fatalf("Validate() = %v (%T), want joined errors", err, err)
	}
	if got := len(joined.Unwrap()); got != len(keys) {
		t.Errorf("%d problems, want %d:\n%v", got, len(keys), err)
	}
	for _, k := range keys {
		if !strings.Contains(err.Error(), "config: "+k+": ") {
			t.Errorf("no problem names %s:\n%v", k, err)
		}
	}
	var fe *fieldError
	if !errors.As(err, &fe) {
		t.Error("errors.As finds no fieldError")
	}
}

func TestValidateAcceptsEdges(t *testing.T) {
	c := DemoConfig("https://h:8443/api/")
	c.Server.Listen = "[::1]:0"
	c.SLO = SLO{}
	c.Metrics.LatencyBuckets = []int64{0}
	c.Metrics.Labels = map[string]string{"env": "prod", "_scene": "chat", "Region2": "eu"}
	c.Upstreams[0].Dialects = []string{"anthropic"}
	c.Upstreams[0].TimeoutSeconds = math.SmallestNonzeroFloat64
	for _, level := range []string{"debug", "info", "warn", "error"} {
		c.Log.Level = level
		if err := c.Validate(); err != nil {
			t.Errorf("level %s: %v", level, err)
		}
	}
}

func ExampleConfig_Validate() {
	c := DemoConfig("http://127.0.0.1:9000")
	c.Upstreams[0].Dialects = []string{"openai", "gemini"}
	c.Log.Level = "trace"
	fmt.Println(c.Validate())
	// Output:
	// config: upstreams[0].dialects[1]: "gemini" is not a dialect; use "openai" or "anthropic"
	// config: log.level: "trace" is not a level; use "debug", "info", "warn" or "error"
}
