package config

import (
	"strings"
	"testing"
)

// fakeEnv returns a getenv that reads only vars.
func fakeEnv(vars map[string]string) func(string) string {
	return func(name string) string { return vars[name] }
}

// noEnv is an empty environment.
func noEnv(string) string { return "" }

// mustParse parses doc as gateway.toml with env, failing the test on error.
func mustParse(t *testing.T, doc string, env map[string]string) *Config {
	t.Helper()
	c, err := Parse([]byte(doc), "gateway.toml", fakeEnv(env))
	if err != nil {
		t.Fatalf("Parse:\n%v\ndocument:\n%s", err, doc)
	}
	return c
}

// minimal is the smallest valid document.
const minimal = `
[[upstreams]]
name = "a"
base_url = "http://127.0.0.1:9000"
`

// lines of err, one problem per line.
func errLines(err error) []string {
	if err == nil {
		return nil
	}
	return strings.Split(err.Error(), "\n")
}

// i64 and f64 return pointers, for optional values (limits, cache prices).
func i64(n int64) *int64     { return &n }
func f64(x float64) *float64 { return &x }
