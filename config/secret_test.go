package config

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

const (
	rawKey           = "sk-live-DO-NOT-PRINT-0123456789"
	rawRedisPassword = "redis-DO-NOT-PRINT-password"
	rawAdminToken    = "admin-DO-NOT-PRINT-token-0123456789"
)

func TestSecretForms(t *testing.T) {
	s := Secret(rawKey)
	if got := s.Reveal(); got != rawKey {
		t.Fatalf("Reveal() = %q, want the raw value", got)
	}
	j, err := s.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	txt, err := s.MarshalText()
	if err != nil {
		t.Fatal(err)
	}
	forms := map[string]string{
		"String":      s.String(),
		"GoString":    s.GoString(),
		"MarshalJSON": string(j),
		"MarshalText": string(txt),
		"LogValue":    s.LogValue().String(),
	}
	for name, got := range forms {
		if strings.Contains(got, rawKey) || !strings.Contains(got, "<secret>") {
			t.Errorf("%s = %q, want <secret>", name, got)
		}
	}

	var empty Secret
	if got := empty.String(); got != "" {
		t.Errorf("empty String() = %q, want \"\"", got)
	}
	if j, _ := empty.MarshalJSON(); string(j) != `""` {
		t.Errorf("empty MarshalJSON() = %s, want \"\"", j)
	}
}

// withSecret returns a valid config whose upstream holds rawKey, with a
// Redis password and an admin token.
func withSecret(t *testing.T) *Config {
	t.Helper()
	doc := `
[[upstreams]]
name = "openai"
base_url = "https://api.openai.com"
api_key_env = "OPENAI_API_KEY"

[redis]
addrs = ["127.0.0.1:6379"]
password_env = "REDIS_PASSWORD"

[admin]
token_env = "ADMIN_TOKEN"
`
	c, err := Parse([]byte(doc), "gateway.toml", fakeEnv(map[string]string{
		"OPENAI_API_KEY": rawKey, "REDIS_PASSWORD": rawRedisPassword, "ADMIN_TOKEN": rawAdminToken,
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Upstreams[0].APIKey.Reveal() != rawKey || c.Redis.Password.Reveal() != rawRedisPassword ||
		c.Admin.Token.Reveal() != rawAdminToken {
		t.Fatal("the secrets were not read from the environment")
	}
	return c
}

// TestStringMustNotRevealCredentials prints and encodes a config holding a
// key in every way a log line or an error might, after Prometheus's test of
// the same name.
func TestStringMustNotRevealCredentials(t *testing.T) {
	c := withSecret(t)
	u := c.Upstreams[0]

	outputs := map[string]string{}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%d"} {
		outputs["Config "+verb] = fmt.Sprintf(verb, *c)
		outputs["*Config "+verb] = fmt.Sprintf(verb, c)
		outputs["Upstream "+verb] = fmt.Sprintf(verb, u)
		outputs["*Upstream "+verb] = fmt.Sprintf(verb, &u)
		outputs["[]Upstream "+verb] = fmt.Sprintf(verb, c.Upstreams)
		outputs["Secret "+verb] = fmt.Sprintf(verb, u.APIKey)
	}
	outputs["Sprint"] = fmt.Sprint(c, u, u.APIKey)
	outputs["error %v"] = fmt.Errorf("config: %v", u).Error()

	for name, v := range map[string]any{"Config": c, "Upstream": u} {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("json %s: %v", name, err)
		}
		outputs["json "+name] = string(b)
		b, err = xml.Marshal(u.APIKey)
		if err != nil {
			t.Fatalf("xml: %v", err)
		}
		outputs["xml Secret"] = string(b)
	}

	for _, h := range []struct {
		name string
		new  func(*bytes.Buffer) slog.Handler
	}{
		{"slog json", func(b *bytes.Buffer) slog.Handler { return slog.NewJSONHandler(b, nil) }},
		{"slog text", func(b *bytes.Buffer) slog.Handler { return slog.NewTextHandler(b, nil) }},
	} {
		var buf bytes.Buffer
		log := slog.New(h.new(&buf))
		log.Info("loaded", "config", c, "upstream", u, "key", u.APIKey, slog.Any("up", &u))
		outputs[h.name] = buf.String()
	}
	outputs["Redacted"] = c.Redacted()

	outputs["Redis %+v"] = fmt.Sprintf("%+v", c.Redis)
	outputs["Admin %#v"] = fmt.Sprintf("%#v", c.Admin)
	for name, out := range outputs {
		for _, secret := range []string{rawKey, rawRedisPassword, rawAdminToken} {
			if strings.Contains(out, secret) {
				t.Errorf("%s reveals %q:\n%s", name, secret, out)
			}
		}
	}
	// The forms that show the field at all must show it redacted, so that
	// a reader knows a key is set.
	for _, name := range []string{"Config %+v", "Upstream %#v", "Secret %d", "json Config", "slog json", "slog text", "Redacted"} {
		// encoding/json escapes < and > in a Marshaler's output.
		out := strings.ReplaceAll(strings.ReplaceAll(outputs[name], `\u003c`, "<"), `\u003e`, ">")
		if !strings.Contains(out, "<secret>") {
			t.Errorf("%s does not show <secret>:\n%s", name, outputs[name])
		}
	}
}

// TestErrorsMustNotRevealCredentials checks that validation errors about an
// upstream that holds a key never print it.
func TestErrorsMustNotRevealCredentials(t *testing.T) {
	doc := `
[[upstreams]]
name = "Bad Name"
base_url = "ftp://user:` + rawKey + `@host/v1?x#y"
api_key_env = "OPENAI_API_KEY"
`
	_, err := Parse([]byte(doc), "gateway.toml", fakeEnv(map[string]string{"OPENAI_API_KEY": rawKey}))
	if err == nil {
		t.Fatal("Parse accepted a bad config")
	}
	if strings.Contains(err.Error(), rawKey) {
		t.Errorf("error reveals the key: %v", err)
	}
	var fe *fieldError
	if !errors.As(err, &fe) {
		t.Errorf("error %T holds no fieldError", err)
	}
}
