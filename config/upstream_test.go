package config

import (
	"log/slog"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/llm"
)

func TestServes(t *testing.T) {
	both := Upstream{Dialects: []string{"openai", "anthropic"}}
	oai := Upstream{Dialects: []string{"openai"}}
	for _, tc := range []struct {
		u    Upstream
		d    llm.Dialect
		want bool
	}{
		{both, llm.DialectOpenAI, true},
		{both, llm.DialectAnthropic, true},
		{both, llm.DialectNone, false},
		{oai, llm.DialectOpenAI, true},
		{oai, llm.DialectAnthropic, false},
		{Upstream{}, llm.DialectOpenAI, false},
	} {
		if got := tc.u.Serves(tc.d); got != tc.want {
			t.Errorf("%v.Serves(%v) = %v, want %v", tc.u.Dialects, tc.d, got, tc.want)
		}
	}
}

func TestURL(t *testing.T) {
	for _, tc := range []struct {
		base, path, want string
	}{
		{"https://api.openai.com", "/v1/chat/completions", "https://api.openai.com/v1/chat/completions"},
		{"https://host/api", "/v1/messages", "https://host/api/v1/messages"},
		{"https://host/api/", "/v1/messages", "https://host/api/v1/messages"},
		{"http://127.0.0.1:8000", "/v1/models?limit=5", "http://127.0.0.1:8000/v1/models?limit=5"},
		{"http://127.0.0.1:8000", "v1/models", "http://127.0.0.1:8000/v1/models"},
	} {
		u := Upstream{BaseURL: tc.base}
		if got := u.URL(tc.path); got != tc.want {
			t.Errorf("URL(%q) with base %q = %q, want %q", tc.path, tc.base, got, tc.want)
		}
	}
	// Through Parse, a trailing slash in the file is removed once.
	c := mustParse(t, "[[upstreams]]\nname = \"p\"\nbase_url = \"https://host/api//\"\n", nil)
	if got, want := c.Upstreams[0].URL("/v1/messages"), "https://host/api/v1/messages"; got != want {
		t.Errorf("URL = %q, want %q", got, want)
	}
	if got, want := c.Upstreams[0].BaseURL, "https://host/api"; got != want {
		t.Errorf("BaseURL = %q, want %q", got, want)
	}
}

func TestSLOTargets(t *testing.T) {
	c := mustParse(t, minimal+"[slo]\nttft_ms = 1500\ntpot_ms = 12.5\ne2el_ms = 0\n", nil)
	want := llm.SLOTargets{TTFT: 1500 * time.Millisecond, TPOT: 12500 * time.Microsecond, E2E: 0}
	if got := c.SLOTargets(); got != want {
		t.Errorf("SLOTargets() = %+v, want %+v", got, want)
	}
}

func TestSlogLevel(t *testing.T) {
	for in, want := range map[string]slog.Level{
		"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn,
		"error": slog.LevelError, "bogus": slog.LevelInfo,
	} {
		if got := (Log{Level: in}).SlogLevel(); got != want {
			t.Errorf("SlogLevel(%q) = %v, want %v", in, got, want)
		}
	}
}

func TestSecondsMillis(t *testing.T) {
	if got := Seconds(2.5); got != 2500*time.Millisecond {
		t.Errorf("Seconds(2.5) = %v", got)
	}
	if got := Millis(0.25); got != 250*time.Microsecond {
		t.Errorf("Millis(0.25) = %v", got)
	}
}

func TestUpstreamByName(t *testing.T) {
	c := mustParse(t, minimal+"[[upstreams]]\nname = \"b\"\nbase_url = \"http://127.0.0.1:9001\"\n", nil)
	for i, name := range []string{"a", "b"} {
		if u := c.UpstreamByName(name); u != &c.Upstreams[i] {
			t.Errorf("UpstreamByName(%q) = %p, want a pointer to upstreams[%d] (%p)", name, u, i, &c.Upstreams[i])
		}
	}
	for _, name := range []string{"", "c", "A", "a "} {
		if u := c.UpstreamByName(name); u != nil {
			t.Errorf("UpstreamByName(%q) = %+v, want nil", name, u)
		}
	}
	var empty Config
	if u := empty.UpstreamByName("a"); u != nil {
		t.Errorf("empty config: UpstreamByName = %+v, want nil", u)
	}
}

func TestRouteFor(t *testing.T) {
	doc := minimal + `
[[upstreams]]
name = "b"
base_url = "http://127.0.0.1:9001"

[[routes]]
models = ["gpt-4o-mini", "o[13]-*"]
upstreams = ["b"]

[[routes]]
models = ["gpt-4o*", "claude-?-opus"]
upstreams = ["a", "b"]
rename = { b = "deploy-4o" }

[[routes]]
models = ["*"]
upstreams = ["a"]
`
	c := mustParse(t, doc, nil)
	for model, want := range map[string]int{
		"gpt-4o-mini":     0, // listed in the first route and matched by the second: the first wins
		"o1-preview":      0,
		"o3-mini":         0,
		"gpt-4o":          1,
		"gpt-4o-mini-x":   1,
		"claude-3-opus":   1,
		"claude-35-opus":  2, // ? is one character
		"GPT-4o":          2, // case counts
		"o2-x":            2,
		"":                2,
		"meta/llama-3-8b": -1, // * does not cross "/"
	} {
		got := c.RouteFor(model)
		switch {
		case want < 0 && got != nil:
			t.Errorf("RouteFor(%q) = %+v, want nil", model, got)
		case want >= 0 && got != &c.Routes[want]:
			t.Errorf("RouteFor(%q) = %+v, want routes[%d]", model, got, want)
		}
	}
	if r := c.RouteFor("gpt-4o"); r == nil || r.Rename["b"] != "deploy-4o" {
		t.Errorf("RouteFor(gpt-4o).Rename = %v", r)
	}

	// Without routes, and with a malformed pattern (a Config not validated),
	// nothing matches.
	if r := mustParse(t, minimal, nil).RouteFor("gpt-4o"); r != nil {
		t.Errorf("no routes: RouteFor = %+v, want nil", r)
	}
	bad := Config{Routes: []Route{{Models: []string{"gpt-[4"}, Upstreams: []string{"a"}}}}
	if r := bad.RouteFor("gpt-[4"); r != nil {
		t.Errorf("malformed pattern: RouteFor = %+v, want nil", r)
	}
}
