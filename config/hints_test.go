package config

import "testing"

func TestEditDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{{"", "", 0}, {"abc", "", 3}, {"base_ur", "base_url", 1}, {"kitten", "sitting", 3}, {"lvl", "level", 2}} {
		if got := editDistance(tc.a, tc.b); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

// TestHint: the key probably meant (a key it begins, else the nearest
// within two edits), where a secret goes instead, or nothing.
func TestHint(t *testing.T) {
	for _, c := range []struct {
		key  []string
		want string
	}{
		{[]string{"upstreams", "base_ur"}, `; did you mean "base_url"?`},
		{[]string{"upstreams", "timeout"}, `; did you mean "timeout_seconds"?`},
		{[]string{"log", "LEVL"}, `; did you mean "level"?`},
		{[]string{"upstream"}, `; did you mean "upstreams"?`},
		{[]string{"upstreams", "api_key"}, "; keys stay out of the file: put the key in an environment variable and name it in api_key_env"},
		{[]string{"server", "port"}, ""},         // nothing near
		{[]string{"nosuch", "base_ur"}, ""},      // no such table
		{[]string{"upstreams", "name", "x"}, ""}, // not a table
		{nil, ""},
	} {
		if got := hint(c.key); got != c.want {
			t.Errorf("hint(%q) = %q, want %q", c.key, got, c.want)
		}
	}
}
