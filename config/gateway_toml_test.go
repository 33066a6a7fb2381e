package config

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"

	toml "github.com/pelletier/go-toml/v2"
	"github.com/tollgate-llm/tollgate/llm"
)

// shippedPath is the example configuration at the top of the repository.
const shippedPath = "../gateway.toml"

// readShipped returns the shipped file, and the same file with its
// commented-out api_key_env lines switched on.
func readShipped(t *testing.T) (doc, withKeys string) {
	t.Helper()
	b, err := os.ReadFile(shippedPath)
	if err != nil {
		t.Fatal(err)
	}
	doc = string(b)
	withKeys = regexp.MustCompile(`(?m)^# (api_key_env = )`).ReplaceAllString(doc, "$1")
	return doc, withKeys
}

// envNamed returns an environment that sets every variable the document
// names in api_key_env.
func envNamed(t *testing.T, doc string) map[string]string {
	t.Helper()
	var raw struct {
		Upstreams []struct {
			APIKeyEnv string `toml:"api_key_env"`
		} `toml:"upstreams"`
	}
	if err := toml.Unmarshal([]byte(doc), &raw); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, u := range raw.Upstreams {
		if u.APIKeyEnv != "" {
			env[u.APIKeyEnv] = "sk-fake-" + u.APIKeyEnv
		}
	}
	return env
}

// TestShippedConfig keeps gateway.toml true: it must parse and validate as
// shipped, and with its api_key_env lines uncommented when those variables
// are set.
func TestShippedConfig(t *testing.T) {
	doc, withKeys := readShipped(t)
	if doc == withKeys {
		t.Fatal("gateway.toml has no commented-out api_key_env example")
	}
	if !strings.Contains(doc, "gateway check-config -config gateway.toml") {
		t.Error("gateway.toml does not say how to check it")
	}

	for name, d := range map[string]string{"as shipped": doc, "keys on": withKeys} {
		t.Run(name, func(t *testing.T) {
			env := envNamed(t, d)
			c, err := Parse([]byte(d), "gateway.toml", fakeEnv(env))
			if err != nil {
				t.Fatal(err)
			}
			for _, u := range c.Upstreams {
				if u.APIKeyEnv != "" && u.APIKey.Reveal() != env[u.APIKeyEnv] {
					t.Errorf("upstream %s: key not read from %s", u.Name, u.APIKeyEnv)
				}
			}
			if name == "keys on" && len(env) != 2 {
				t.Errorf("uncommented file names %d key variables, want 2 (OpenAI and Anthropic)", len(env))
			}
		})
	}

	// Without the variables, the uncommented file must fail and say which.
	_, err := Parse([]byte(withKeys), "gateway.toml", noEnv)
	if err == nil || !strings.Contains(err.Error(), "OPENAI_API_KEY is not set") {
		t.Errorf("uncommented file without env: %v", err)
	}
}

// TestShippedConfigShowsDefaults checks that every table but [[upstreams]]
// holds exactly the defaults, that the upstreams route OpenAI and Anthropic
// requests to their own providers, and that every key of the schema is
// written out.
func TestShippedConfigShowsDefaults(t *testing.T) {
	doc, withKeys := readShipped(t)
	c := mustParse(t, doc, nil)
	def := Default()
	def.Upstreams = c.Upstreams
	if !reflect.DeepEqual(*c, def) {
		t.Errorf("gateway.toml differs from Default():\n%+v\nwant\n%+v", *c, def)
	}

	if len(c.Upstreams) != 2 {
		t.Fatalf("gateway.toml has %d upstreams, want 2", len(c.Upstreams))
	}
	up := DefaultUpstream()
	for i, want := range []struct{ name, url, dialect string }{
		{"openai", "https://api.openai.com", "openai"},
		{"anthropic", "https://api.anthropic.com", "anthropic"},
	} {
		u := c.Upstreams[i]
		if u.Name != want.name || u.BaseURL != want.url || !reflect.DeepEqual(u.Dialects, []string{want.dialect}) {
			t.Errorf("upstreams[%d] = %s %s %v, want %s %s [%s]", i, u.Name, u.BaseURL, u.Dialects, want.name, want.url, want.dialect)
		}
		if u.TimeoutSeconds != up.TimeoutSeconds || u.ConnectTimeoutSeconds != up.ConnectTimeoutSeconds ||
			u.IncludeUsage != up.IncludeUsage || u.MaxIdleConns != up.MaxIdleConns {
			t.Errorf("upstreams[%d] does not show the upstream defaults: %+v", i, u)
		}
	}
	if u := c.UpstreamFor(llm.DialectOpenAI); u == nil || u.Name != "openai" {
		t.Errorf("OpenAI requests go to %+v", u)
	}
	if u := c.UpstreamFor(llm.DialectAnthropic); u == nil || u.Name != "anthropic" {
		t.Errorf("Anthropic requests go to %+v", u)
	}

	// Every key of the schema is present, and commented.
	var raw map[string]any
	if err := toml.Unmarshal([]byte(withKeys), &raw); err != nil {
		t.Fatal(err)
	}
	for _, path := range schemaKeys(reflect.TypeFor[Config](), nil) {
		v := any(raw)
		for _, part := range path {
			switch x := v.(type) {
			case map[string]any:
				v = x[part]
			case []any: // an array of tables: check its first element
				v = x[0].(map[string]any)[part]
			}
			if v == nil {
				t.Errorf("gateway.toml lacks %s", strings.Join(path, "."))
				break
			}
		}
		key := path[len(path)-1]
		if !regexp.MustCompile(`(?m)^#.*\n(# ?)?`+regexp.QuoteMeta(key)+` = `).MatchString(doc) &&
			!regexp.MustCompile(`(?m)^#.*\n\[\[?`+regexp.QuoteMeta(strings.Join(path, "."))+`\]`).MatchString(doc) {
			t.Errorf("gateway.toml: %s has no comment above it", strings.Join(path, "."))
		}
	}
}

// schemaKeys lists every key path of the TOML schema rooted at t.
func schemaKeys(t reflect.Type, prefix []string) [][]string {
	var out [][]string
	for f := range t.Fields() {
		name := tomlName(f)
		if name == "" || name == "-" {
			continue
		}
		path := append(append([]string(nil), prefix...), name)
		out = append(out, path)
		if ft := tableElem(f.Type); ft.Kind() == reflect.Struct {
			out = append(out, schemaKeys(ft, path)...)
		}
	}
	return out
}
