package config

import "testing"

// TestFieldErrorText: "config: <file>:<line>:<col>: <key>: <problem>", each
// part left out when unknown, the column only with a line.
func TestFieldErrorText(t *testing.T) {
	for _, c := range []struct {
		e    fieldError
		want string
	}{
		{fieldError{msg: "bad"}, "config: bad"},
		{fieldError{key: "log.level", msg: "bad"}, "config: log.level: bad"},
		{fieldError{file: "gateway.toml", msg: "bad"}, "config: gateway.toml: bad"},
		{fieldError{file: "gateway.toml", line: 3, key: "server.listen", msg: "bad"}, "config: gateway.toml:3: server.listen: bad"},
		{fieldError{file: "gateway.toml", line: 3, col: 7, msg: "bad"}, "config: gateway.toml:3:7: bad"},
		{fieldError{file: "gateway.toml", col: 7, msg: "bad"}, "config: gateway.toml: bad"},
		{fieldError{line: 3, key: "k", msg: "bad"}, "config: k: bad"}, // no file, no line
	} {
		if got := c.e.Error(); got != c.want {
			t.Errorf("%+v: %q, want %q", c.e, got, c.want)
		}
	}
}
