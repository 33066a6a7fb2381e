package config

import "testing"

// TestDocIndex: every key path, array tables and inline arrays included,
// has the line that first sets it, and a path the document does not set
// takes its nearest parent's.
func TestDocIndex(t *testing.T) {
	idx := indexDoc([]byte(`[server]
listen = ":8080"

[[upstreams]]
name = "a"

[[upstreams]]
name = "b"
retry = { max_attempts = 2 }
models = ["x", "y"]
"odd.key" = 1
`))
	if idx.syntaxErr {
		t.Fatal("a valid document marked invalid")
	}
	for path, want := range map[string]int{
		"server":                          1,
		"server.listen":                   2,
		"upstreams[0]":                    4,
		"upstreams[0].name":               5,
		"upstreams[1]":                    7,
		"upstreams[1].name":               8,
		"upstreams[1].retry.max_attempts": 9,
		"upstreams[1].models[1]":          10,
		`upstreams[1]."odd.key"`:          11,
		"upstreams[1].base_url":           7, // unset: its table's line
		"log.level":                       0, // no parent set either
	} {
		if got := idx.line(path); got != want {
			t.Errorf("line(%q) = %d, want %d", path, got, want)
		}
	}
	// go-toml reports keys without array indexes; the line says which
	// element they are in.
	for _, c := range []struct {
		key  []string
		line int
		want string
	}{
		{[]string{"upstreams", "nme"}, 5, "upstreams[0].nme"},
		{[]string{"upstreams", "nme"}, 8, "upstreams[1].nme"},
		{[]string{"server", "port"}, 2, "server.port"},
	} {
		if got := idx.keyPath(c.key, c.line); got != c.want {
			t.Errorf("keyPath(%q, %d) = %q, want %q", c.key, c.line, got, c.want)
		}
	}
}

// TestDocIndexSyntaxError: an invalid document is flagged, and what came
// before the error is still indexed.
func TestDocIndexSyntaxError(t *testing.T) {
	idx := indexDoc([]byte("[server]\nlisten = \":8080\"\nbad = \n"))
	if !idx.syntaxErr {
		t.Error("an invalid document not marked invalid")
	}
	if got := idx.line("server.listen"); got != 2 {
		t.Errorf("line(server.listen) = %d, want 2", got)
	}
}

func TestKeyPathParts(t *testing.T) {
	for _, c := range []struct{ path, part, joined string }{
		{"", "server", "server"},
		{"upstreams[0]", "base_url", "upstreams[0].base_url"},
		{"teams[1]", "a.b", `teams[1]."a.b"`},
		{`x."a[0]"`, "y", `x."a[0]".y`},
	} {
		if got := joinKey(c.path, c.part); got != c.joined {
			t.Errorf("joinKey(%q, %q) = %q, want %q", c.path, c.part, got, c.joined)
		}
		if got := parentKey(c.joined); got != c.path {
			t.Errorf("parentKey(%q) = %q, want %q", c.joined, got, c.path)
		}
	}
	if got := parentKey("upstreams[0]"); got != "upstreams" {
		t.Errorf(`parentKey("upstreams[0]") = %q, want "upstreams"`, got)
	}
}
