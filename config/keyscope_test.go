package config

import (
	"strings"
	"testing"
)

// TestKeyScopeWarnings: in passthrough mode with require_key (the
// defaults), an upstream that is only ever a fallback at another origin
// than the first, without caller_keys_on_fallback, is named with the way
// out; a fallback at the same origin, one that accepts callers' keys, one
// that is first somewhere, mode "keys" and keyless callers are not.
func TestKeyScopeWarnings(t *testing.T) {
	const b = `
[[upstreams]]
name = "b"
base_url = "http://127.0.0.1:9001"
`
	for _, c := range []struct {
		name, doc string
		warn      bool
	}{
		{"fallback at another origin", minimal + b, true},
		{"fallback at another origin, in a route", minimal + b + "[[routes]]\nmodels = [\"*\"]\nupstreams = [\"a\", \"b\"]\n", true},
		{"fallback at the same origin", minimal + "[[upstreams]]\nname = \"b\"\nbase_url = \"http://127.0.0.1:9000/other\"\n", false},
		{"fallback that accepts callers' keys", minimal + b + "caller_keys_on_fallback = true\n", false},
		{"first in a route", minimal + b + "[[routes]]\nmodels = [\"m*\"]\nupstreams = [\"b\", \"a\"]\n", false},
		{"another dialect", minimal + "dialects = [\"openai\"]\n" + b + "dialects = [\"anthropic\"]\n", false},
		{"keyless callers", "[auth]\nrequire_key = false\n" + minimal + b, false},
		{"mode keys", "[auth]\nmode = \"keys\"\n[[keys]]\nname = \"k\"\nsha256 = \"" + strings.Repeat("a", 64) + "\"\n" + minimal + "api_key_env = \"A_KEY\"\n" + b + "api_key_env = \"B_KEY\"\n", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := mustParse(t, c.doc, map[string]string{"A_KEY": "sk-a", "B_KEY": "sk-b"})
			w := cfg.Warnings()
			if !c.warn {
				if len(w) != 0 {
					t.Fatalf("warnings %q, want none", w)
				}
				return
			}
			if len(w) != 1 || !strings.HasPrefix(w[0], `upstreams[1]: "b" is only ever a fallback at another origin (http://127.0.0.1:9001)`) ||
				!strings.Contains(w[0], "caller_keys_on_fallback = true") || !strings.Contains(w[0], `mode = "keys"`) {
				t.Fatalf("warnings %q, want one naming b and the ways out", w)
			}
		})
	}
}
