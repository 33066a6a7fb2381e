package config

import (
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	toml "github.com/pelletier/go-toml/v2"
)

// starterPath is the short configuration at the top of the repository: the
// one the README starts from and the container image serves.
const starterPath = "../gateway.toml"

// TestStarterConfig: the starter parses and validates as it is, and with
// its commented-out example switched on; it names the reference file; and
// every key it sets, examples included, is a key of the reference
// (docs/gateway.toml), where its default and meaning are written.
func TestStarterConfig(t *testing.T) {
	b, err := os.ReadFile(starterPath)
	if err != nil {
		t.Fatal(err)
	}
	starter := string(b)
	if !strings.Contains(starter, "docs/gateway.toml") {
		t.Error("the starter gateway.toml does not point to docs/gateway.toml")
	}
	if !strings.Contains(starter, "gateway check-config -config gateway.toml") {
		t.Error("the starter gateway.toml does not say how to check it")
	}
	withExamples := uncommentExamples(t, starter)
	if withExamples == starter {
		t.Error("the starter gateway.toml has no commented-out example")
	}
	for name, d := range map[string]string{"as shipped": starter, "examples on": withExamples} {
		t.Run(name, func(t *testing.T) {
			if _, err := Parse([]byte(d), "gateway.toml", noEnv); err != nil {
				t.Fatal(err)
			}
		})
	}

	// Every key the starter sets is documented in the reference.
	_, _, refExamples := readShipped(t)
	var ref, raw map[string]any
	if err := toml.Unmarshal([]byte(refExamples), &ref); err != nil {
		t.Fatal(err)
	}
	if err := toml.Unmarshal([]byte(withExamples), &raw); err != nil {
		t.Fatal(err)
	}
	paths := keyPaths(raw, nil)
	if len(paths) == 0 {
		t.Fatal("the starter gateway.toml sets no key")
	}
	for _, p := range paths {
		if !holds(ref, p) {
			t.Errorf("the starter sets %s, which docs/gateway.toml does not have", strings.Join(p, "."))
		}
	}
}

// TestStarterServesAsTheReference: the starter, as shipped, is the
// reference file as shipped (two passthrough upstreams, OpenAI and
// Anthropic, every other setting at its default), so an image or a gateway
// started on either behaves the same.
func TestStarterServesAsTheReference(t *testing.T) {
	b, err := os.ReadFile(starterPath)
	if err != nil {
		t.Fatal(err)
	}
	doc, _, _ := readShipped(t)
	starter, ref := mustParse(t, string(b), nil), mustParse(t, doc, nil)
	if !reflect.DeepEqual(*starter, *ref) {
		t.Errorf("the starter's configuration differs from the reference's:\n%+v\nwant\n%+v", *starter, *ref)
	}
}

// keyPaths lists the key paths a decoded TOML document sets, in sorted
// order; an array of tables contributes the keys of each of its tables.
func keyPaths(v any, prefix []string) [][]string {
	var out [][]string
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			p := append(append([]string(nil), prefix...), k)
			out = append(out, p)
			out = append(out, keyPaths(x[k], p)...)
		}
	case []any:
		for _, e := range x {
			if _, ok := e.(map[string]any); ok {
				out = append(out, keyPaths(e, prefix)...)
			}
		}
	}
	return out
}
