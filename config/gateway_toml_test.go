package config

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path"
	"reflect"
	"regexp"
	"strings"
	"testing"

	toml "github.com/pelletier/go-toml/v2"
	"github.com/tollgate-llm/tollgate/llm"
)

// shippedPath is the reference configuration: every setting, at its
// default. The gateway.toml at the top of the repository is a short starter
// (starter_toml_test.go).
const shippedPath = "../docs/gateway.toml"

// readShipped returns the shipped file; the same file with its
// commented-out api_key_env lines switched on; and that one with the example
// [[routes]], [[probe.targets]], [[models]], [[teams]] and [[keys]] blocks
// switched on too.
func readShipped(t *testing.T) (doc, withKeys, withExamples string) {
	t.Helper()
	b, err := os.ReadFile(shippedPath)
	if err != nil {
		t.Fatal(err)
	}
	doc = string(b)
	withKeys = regexp.MustCompile(`(?m)^# (api_key_env = )`).ReplaceAllString(doc, "$1")
	withExamples = uncommentExamples(t, withKeys)
	// The example team's budget per conversation needs conversations on.
	on := strings.Replace(withExamples, "[conversations]\n# Turn conversation tracking on. Default false.\nenabled = false",
		"[conversations]\n# Turn conversation tracking on. Default false.\nenabled = true", 1)
	if on == withExamples {
		t.Fatal("gateway.toml's [conversations] does not start with its enabled = false")
	}
	return doc, withKeys, on
}

// exampleStartRE is the first line of an example block in gateway.toml.
var exampleStartRE = regexp.MustCompile(`^# \[\[(routes|probe\.targets|models|teams|keys)\]\]$`)

// uncommentExamples does what gateway.toml tells its reader to do with an
// example: from each commented-out "# [[routes]]", "# [[probe.targets]]",
// "# [[models]]", "# [[teams]]" or "# [[keys]]" line down to the next blank
// line, remove the "# " (or "#") in front of each line.
func uncommentExamples(t *testing.T, doc string) string {
	t.Helper()
	lines := strings.Split(doc, "\n")
	in := false
	for i, l := range lines {
		switch {
		case exampleStartRE.MatchString(l):
			in = true
		case !in:
			continue
		case l == "":
			in = false
			continue
		case !strings.HasPrefix(l, "#"):
			t.Errorf("gateway.toml:%d: %q ends an example block; end it with a blank line", i+1, l)
			in = false
			continue
		}
		lines[i] = strings.TrimPrefix(strings.TrimPrefix(l, "#"), " ")
	}
	return strings.Join(lines, "\n")
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
	doc, withKeys, withExamples := readShipped(t)
	if doc == withKeys {
		t.Fatal("gateway.toml has no commented-out api_key_env example")
	}
	if withKeys == withExamples {
		t.Fatal("gateway.toml has no commented-out [[routes]], [[probe.targets]], [[models]], [[teams]] or [[keys]] example")
	}
	if !strings.Contains(doc, "gateway check-config -config gateway.toml") {
		t.Error("gateway.toml does not say how to check it")
	}

	for name, d := range map[string]string{"as shipped": doc, "keys on": withKeys, "examples on": withExamples} {
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

// TestShippedExamples checks the example [[routes]], [[probe.targets]],
// [[models]], [[teams]] and [[keys]] blocks once switched on: they fit
// together, use every limit, the routes and the probe target name upstreams
// of the file and one route renames, and the example key's hash is the hash
// of the fake key the comment names.
func TestShippedExamples(t *testing.T) {
	doc, _, withExamples := readShipped(t)
	c, err := Parse([]byte(withExamples), "gateway.toml", fakeEnv(envNamed(t, withExamples)))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Models) < 2 || len(c.Teams) != 1 || len(c.Keys) != 1 {
		t.Fatalf("examples give %d models, %d teams, %d keys; want at least 2, 1, 1", len(c.Models), len(c.Teams), len(c.Keys))
	}
	team, key := c.Teams[0], c.Keys[0]
	if len(team.Models) == 0 || key.Team != team.Name {
		t.Errorf("the example team lists no models, or the key (team %q) is not in it (%q)", key.Team, team.Name)
	}
	for _, l := range []Limits{team.Limits, key.Limits} {
		if l.RPM == nil || l.TPM == nil || l.Concurrency == nil || l.TokensPerDay == nil || l.CostPerDayUSD == nil || l.CostPerMonthUSD == nil {
			t.Errorf("an example leaves out a limit: %+v", l)
		}
	}
	// Every model of the team is priced by its own pattern, not by an
	// earlier, broader one.
	for _, p := range team.Models {
		name := strings.TrimSuffix(p, "*") + "-x"
		for _, m := range c.Models {
			if ok, _ := path.Match(m.Pattern, name); ok {
				if m.Pattern != p {
					t.Errorf("model %q is priced by %q, listed before %q", name, m.Pattern, p)
				}
				break
			}
		}
	}
	m := regexp.MustCompile(`hash of the fake key "([^"]+)"`).FindStringSubmatch(doc)
	if m == nil {
		t.Fatal("gateway.toml does not name the fake key its example hashes")
	}
	if sum := sha256.Sum256([]byte(m[1])); hex.EncodeToString(sum[:]) != key.SHA256 {
		t.Errorf("the example sha256 is not the SHA-256 of %q", m[1])
	}
	if !strings.Contains(doc, "gateway hash-key") {
		t.Error("gateway.toml does not say how to hash a key")
	}

	// Each example route is the one its first model goes to, so no route
	// hides another, and at least one renames the model.
	if len(c.Routes) == 0 {
		t.Fatal("examples give no route")
	}
	renames := 0
	for i := range c.Routes {
		r := &c.Routes[i]
		name := r.Models[0]
		if strings.HasSuffix(name, "*") {
			name = strings.TrimSuffix(name, "*") + "-x"
		}
		if got := c.RouteFor(name); got != r {
			t.Errorf("model %q goes to %+v, not to its example route %+v", name, got, r)
		}
		renames += len(r.Rename)
	}
	if renames == 0 {
		t.Error("no example route shows rename")
	}

	// Mode "keys" accepts the examples; without them it names the problem.
	keysMode := strings.Replace(withExamples, `mode = "passthrough"`, `mode = "keys"`, 1)
	if _, err := Parse([]byte(keysMode), "gateway.toml", fakeEnv(envNamed(t, keysMode))); err != nil {
		t.Errorf("mode keys with the examples: %v", err)
	}
	_, err = Parse([]byte(strings.Replace(doc, `mode = "passthrough"`, `mode = "keys"`, 1)), "gateway.toml", noEnv)
	if err == nil || !strings.Contains(err.Error(), `auth.mode: "keys" admits only callers whose key is listed in [[keys]]`) {
		t.Errorf("mode keys without keys: %v", err)
	}
	// With runtime keys on, mode "keys" needs no [[keys]] table; in
	// passthrough, runtime keys are refused.
	runtimeOn := func(doc string) string {
		return strings.Replace(doc, "Needs [auth] mode = \"keys\". Default false.\nenabled = false",
			"Needs [auth] mode = \"keys\". Default false.\nenabled = true", 1)
	}
	if _, err := Parse([]byte(runtimeOn(strings.Replace(doc, `mode = "passthrough"`, `mode = "keys"`, 1))), "gateway.toml", noEnv); err != nil {
		t.Errorf("mode keys with runtime keys and no [[keys]]: %v", err)
	}
	if _, err := Parse([]byte(runtimeOn(doc)), "gateway.toml", noEnv); err == nil ||
		!strings.Contains(err.Error(), `runtime_keys.enabled: needs [auth] mode = "keys"`) {
		t.Errorf("runtime keys in passthrough: %v", err)
	}

	// The probe example, switched on, probes an upstream of the file in a
	// dialect it serves; on without it, the file names the problem.
	if len(c.Probe.Targets) != 1 {
		t.Fatalf("examples give %d probe targets, want 1", len(c.Probe.Targets))
	}
	probeOn := regexp.MustCompile(`(?m)^enabled = false$`)
	// [runtime_keys] stays off: it needs mode "keys" (checked below).
	keysOff := func(doc string) string {
		return strings.Replace(doc, "Needs [auth] mode = \"keys\". Default false.\nenabled = true",
			"Needs [auth] mode = \"keys\". Default false.\nenabled = false", 1)
	}
	on, err := Parse([]byte(keysOff(probeOn.ReplaceAllString(withExamples, "enabled = true"))), "gateway.toml",
		fakeEnv(envNamed(t, withExamples)))
	if err != nil {
		t.Fatalf("probe on with its example: %v", err)
	}
	if pt := on.Probe.Targets[0]; !on.Probe.Enabled || on.UpstreamByName(pt.Upstream) == nil ||
		!on.UpstreamByName(pt.Upstream).Serves(on.ProbeDialect(pt)) {
		t.Errorf("probe example %+v (enabled %v) does not probe an upstream of the file", pt, on.Probe.Enabled)
	}
	_, err = Parse([]byte(keysOff(probeOn.ReplaceAllString(doc, "enabled = true"))), "gateway.toml", noEnv)
	if err == nil || !strings.Contains(err.Error(), "probe.enabled: the probe needs at least one [[probe.targets]]") {
		t.Errorf("probe on without a target: %v", err)
	}
}

// TestShippedConfigShowsDefaults checks that every table but [[upstreams]]
// holds exactly the defaults (no routes, models, teams or keys until the
// examples are switched on), that both upstreams hold the upstream defaults
// but for their name, endpoint and dialect, that the upstreams route OpenAI
// and Anthropic requests to their own providers, and that every key of the
// schema is written out.
func TestShippedConfigShowsDefaults(t *testing.T) {
	doc, _, withExamples := readShipped(t)
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
		wantUp := up
		wantUp.Name, wantUp.BaseURL, wantUp.Dialects = u.Name, u.BaseURL, u.Dialects
		if !reflect.DeepEqual(u, wantUp) {
			t.Errorf("upstreams[%d] does not hold the upstream defaults:\n%+v\nwant\n%+v", i, u, wantUp)
		}
	}
	// Each dialect's requests go to the one upstream that serves it.
	for _, d := range []llm.Dialect{llm.DialectOpenAI, llm.DialectAnthropic} {
		var serving []string
		for _, u := range c.Upstreams {
			if u.Serves(d) {
				serving = append(serving, u.Name)
			}
		}
		if len(serving) != 1 || serving[0] != d.String() {
			t.Errorf("%v requests go to %v", d, serving)
		}
	}

	// Every key of the schema is present, and commented.
	var raw map[string]any
	if err := toml.Unmarshal([]byte(withExamples), &raw); err != nil {
		t.Fatal(err)
	}
	sections := tableSections(withExamples)
	for _, keyPath := range schemaKeys(reflect.TypeFor[Config](), nil) {
		name := strings.Join(keyPath, ".")
		if !holds(raw, keyPath) {
			t.Errorf("gateway.toml lacks %s", name)
		}
		// A key needs a comment line right above it in its own table (so
		// teams.rpm is not taken for keys.rpm); a table, above its header.
		table, key := strings.Join(keyPath[:len(keyPath)-1], "."), keyPath[len(keyPath)-1]
		if !regexp.MustCompile(`(?m)^#.*\n`+regexp.QuoteMeta(key)+` = `).MatchString(sections[table]) &&
			!regexp.MustCompile(`(?m)^#.*\n\[\[?`+regexp.QuoteMeta(name)+`\]`).MatchString(withExamples) {
			t.Errorf("gateway.toml: %s has no comment above it", name)
		}
	}
}

// tableSections splits a TOML document at its table headers and returns the
// text under each table name ("" for the top level), the sections of an
// array of tables joined.
func tableSections(doc string) map[string]string {
	headerRE := regexp.MustCompile(`^\[\[?([^\]]+)\]\]?$`)
	out := map[string]string{}
	table := ""
	for l := range strings.Lines(doc) {
		if m := headerRE.FindStringSubmatch(strings.TrimSpace(l)); m != nil {
			table = m[1]
		}
		out[table] += l
	}
	return out
}

// holds reports whether the decoded TOML value v sets the key path; in an
// array of tables, any one table may set the rest of the path.
func holds(v any, keyPath []string) bool {
	if len(keyPath) == 0 {
		return v != nil
	}
	switch x := v.(type) {
	case map[string]any:
		return holds(x[keyPath[0]], keyPath[1:])
	case []any:
		for _, e := range x {
			if holds(e, keyPath) {
				return true
			}
		}
	}
	return false
}

// schemaKeys lists every key path of the TOML schema rooted at t, the keys
// of embedded structs (Limits) under the table that embeds them.
func schemaKeys(t reflect.Type, prefix []string) [][]string {
	var out [][]string
	for f := range tomlFields(t) {
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
