package config

import (
	"reflect"
	"testing"

	"github.com/tollgate-llm/tollgate/llm"
)

// probeCases extends TestBadConfigs with the [probe] table. up (lines 1-3)
// is upstream "a", serving both dialects.
var probeCases = []struct {
	name string
	doc  string
	env  map[string]string
	want []string
}{
	{"probe values", up + "[probe]\ninterval_seconds = 0\nrequests = 0\nconcurrency = 0\nmax_tokens = 0\ntimeout_seconds = -1\nprompt = \"\"\n",
		nil, []string{
			`gateway.toml:5: probe.interval_seconds: must be greater than 0, not 0`,
			`gateway.toml:6: probe.requests: must be from 1 to 1000, not 0`,
			`gateway.toml:7: probe.concurrency: must be at least 1, not 0`,
			`gateway.toml:8: probe.max_tokens: must be at least 1, not 0`,
			`gateway.toml:9: probe.timeout_seconds: must be greater than 0, not -1`,
			`gateway.toml:10: probe.prompt: must not be empty`,
		}},
	{"probe interval under a second", up + "[probe]\ninterval_seconds = 0.5\n",
		nil, []string{`gateway.toml:5: probe.interval_seconds: must be at least 1, not 0.5`}},
	{"probe interval nan", up + "[probe]\ninterval_seconds = nan\ntimeout_seconds = inf\n",
		nil, []string{
			`gateway.toml:5: probe.interval_seconds: must be a number, not nan`,
			`gateway.toml:6: probe.timeout_seconds: +Inf is too large`,
		}},
	{"too many probe requests", up + "[probe]\nrequests = 1001\nconcurrency = 1001\n",
		nil, []string{`gateway.toml:5: probe.requests: must be from 1 to 1000, not 1001`}},
	{"probe round longer than its interval", up + "[probe]\ninterval_seconds = 30\nrequests = 5\ntimeout_seconds = 11\n",
		nil, []string{`gateway.toml:7: probe.timeout_seconds: a round of 5 requests, 2 at a time, may take 3 × 11 = 33 s, longer than interval_seconds (30), where it is cut: lower timeout_seconds or requests, or raise concurrency or interval_seconds`}},
	{"probe on without a target", up + "[probe]\nenabled = true\n",
		nil, []string{`gateway.toml:5: probe.enabled: the probe needs at least one [[probe.targets]] table`}},
	{"probe targets", up + "[probe]\nenabled = true\n[[probe.targets]]\nmodel = \"m\"\n[[probe.targets]]\nupstream = \"b\"\n" +
		"[[probe.targets]]\nupstream = \"a\"\nmodel = \"m\"\ndialect = \"gemini\"\n",
		nil, []string{
			`gateway.toml:6: probe.targets[0].upstream: is required: the name of the [[upstreams]] table to probe`,
			`gateway.toml:9: probe.targets[1].upstream: "b" is not the name of any [[upstreams]] table`,
			`gateway.toml:8: probe.targets[1].model: is required: the model to ask for`,
			`gateway.toml:13: probe.targets[2].dialect: "gemini" is not a dialect; use "openai", "anthropic" or "responses"`,
		}},
	{"probe dialect the upstream does not serve", up + "dialects = [\"openai\"]\n[[probe.targets]]\nupstream = \"a\"\nmodel = \"m\"\ndialect = \"anthropic\"\n",
		nil, []string{`gateway.toml:8: probe.targets[0].dialect: "anthropic" is not served by upstream "a" (its dialects: [openai])`}},
	{"probe of the Responses API on an upstream that serves only anthropic", up + "dialects = [\"anthropic\"]\n[[probe.targets]]\nupstream = \"a\"\nmodel = \"m\"\ndialect = \"responses\"\n",
		nil, []string{`gateway.toml:8: probe.targets[0].dialect: "responses" is not served by upstream "a" (its dialects: [anthropic])`}},
	{"probe of the Responses API with too few tokens", up + "[probe]\nmax_tokens = 8\n[[probe.targets]]\nupstream = \"a\"\nmodel = \"m\"\ndialect = \"responses\"\n",
		nil, []string{`gateway.toml:9: probe.targets[0].dialect: the Responses API wants max_output_tokens of at least 16; probe.max_tokens is 8`}},
	{"probe target twice", up + "[[probe.targets]]\nupstream = \"a\"\nmodel = \"m\"\n[[probe.targets]]\nupstream = \"a\"\nmodel = \"m\"\ndialect = \"anthropic\"\n",
		nil, []string{`gateway.toml:7: probe.targets[1]: upstream "a" and model "m" are already probed by probe.targets[0]`}},
	{"probe target inline", up + "[probe]\ntargets = [{ upstream = \"x\", model = \"m\" }]\n",
		nil, []string{`gateway.toml:5: probe.targets[0].upstream: "x" is not the name of any [[upstreams]] table`}},
	{"misspelt probe key", up + "[probe]\ninterval = 60\n",
		nil, []string{`gateway.toml:5: probe.interval: unknown key; did you mean "interval_seconds"?`}},
	{"misspelt probe target key", up + "[[probe.targets]]\nupstream = \"a\"\nmodels = \"m\"\n",
		nil, []string{`gateway.toml:6: probe.targets[0].models: unknown key; did you mean "model"?`}},
	{"probe value of the wrong type", up + "[probe]\nenabled = \"yes\"\nrequests = 2.5\n",
		nil, []string{`gateway.toml:5: probe.enabled: must be a boolean (true or false), not a string`}},
}

func TestBadProbeConfigs(t *testing.T) {
	for _, tc := range probeCases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.doc), "gateway.toml", fakeEnv(tc.env))
			if err == nil {
				t.Fatalf("Parse accepted:\n%s\n%+v", tc.doc, c)
			}
			for _, want := range tc.want {
				if !containsLine(errLines(err), "config: "+want) {
					t.Errorf("error lacks %q; got:\n%v", want, err)
				}
			}
			if n := len(errLines(err)); n != len(tc.want) && tc.name != "probe value of the wrong type" {
				t.Errorf("%d problems reported, want %d:\n%v", n, len(tc.want), err)
			}
		})
	}
}

// containsLine reports whether one of lines starts with prefix.
func containsLine(lines []string, prefix string) bool {
	for _, l := range lines {
		if len(l) >= len(prefix) && l[:len(prefix)] == prefix {
			return true
		}
	}
	return false
}

// TestProbeDefaults checks the [probe] defaults of a file that leaves the
// table out, and of one that gives only a target: the target's dialect is
// its upstream's first.
func TestProbeDefaults(t *testing.T) {
	want := Probe{IntervalSeconds: 300, Requests: 10, Concurrency: 2, MaxTokens: 16, TimeoutSeconds: 60,
		Prompt: DefaultProbePrompt}
	if c := mustParse(t, minimal, nil); !reflect.DeepEqual(c.Probe, want) {
		t.Errorf("probe of a minimal file = %+v, want %+v", c.Probe, want)
	}
	c := mustParse(t, minimal+`dialects = ["anthropic", "openai"]
[probe]
enabled = true
[[probe.targets]]
upstream = "a"
model = "claude-x"
`, nil)
	want.Enabled = true
	want.Targets = []ProbeTarget{{Upstream: "a", Model: "claude-x", Dialect: "anthropic"}}
	if !reflect.DeepEqual(c.Probe, want) {
		t.Errorf("probe = %+v, want %+v", c.Probe, want)
	}
	if d := c.ProbeDialect(c.Probe.Targets[0]); d != llm.DialectAnthropic {
		t.Errorf("ProbeDialect = %v, want anthropic", d)
	}
	// A target built in code, without a dialect, still gets its
	// upstream's first; an unknown upstream gives none.
	if d := c.ProbeDialect(ProbeTarget{Upstream: "a", Model: "m"}); d != llm.DialectAnthropic {
		t.Errorf("ProbeDialect without a dialect = %v, want anthropic", d)
	}
	if d := c.ProbeDialect(ProbeTarget{Upstream: "zz", Model: "m"}); d != llm.DialectNone {
		t.Errorf("ProbeDialect of an unknown upstream = %v, want none", d)
	}
	// The effective configuration reads back equal.
	if again := mustParse(t, c.Redacted(), nil); !reflect.DeepEqual(again, c) {
		t.Errorf("Parse(Redacted()) = %+v, want %+v", again.Probe, c.Probe)
	}
}

// TestProbeAcceptsEdges checks the limits of each [probe] value, and that a
// disabled probe may list targets.
func TestProbeAcceptsEdges(t *testing.T) {
	c := DemoConfig("http://127.0.0.1:1")
	c.Probe = Probe{Enabled: true, IntervalSeconds: 1, Requests: 1000, Concurrency: 1000, MaxTokens: 1,
		TimeoutSeconds: 0.001, Prompt: "x", Targets: []ProbeTarget{
			{Upstream: "mock", Model: "m"},
			{Upstream: "mock", Model: "m2", Dialect: "anthropic"},
			{Upstream: "mock", Model: "m3", Dialect: "openai"},
		}}
	if err := c.Validate(); err != nil {
		t.Error(err)
	}
	c.Probe.Enabled = false
	if err := c.Validate(); err != nil {
		t.Errorf("disabled: %v", err)
	}
}
