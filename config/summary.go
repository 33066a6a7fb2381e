package config

import (
	"log/slog"
	"strconv"
	"strings"

	toml "github.com/pelletier/go-toml/v2"
	"github.com/tollgate-llm/tollgate/llm"
)

// SLOTargets returns the [slo] objectives as durations; 0 leaves one
// unchecked.
func (c *Config) SLOTargets() llm.SLOTargets {
	return llm.SLOTargets{
		TTFT: Millis(c.SLO.TTFTMs),
		TPOT: Millis(c.SLO.TPOTMs),
		E2E:  Millis(c.SLO.E2ELMs),
	}
}

// SlogLevel returns the [log] level as a slog.Level (info when the level is
// not one Validate accepts).
func (l Log) SlogLevel() slog.Level {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(l.Level)); err != nil {
		return slog.LevelInfo
	}
	return lv
}

// Redacted renders the effective configuration, every default filled in, as
// TOML that Parse accepts, for `gateway check-config`. Secrets never appear:
// closing comments say which variable each upstream key, the Redis password
// and the admin token came from, shown as <secret>. Limits left out stay
// out (go-toml omits nil pointers), so they still mean "no limit".
func (c *Config) Redacted() string {
	var b strings.Builder
	b.WriteString("# Effective configuration: the file with every default filled in.\n\n")
	// Config holds only strings, numbers, booleans, pointers to numbers,
	// slices, string maps and structs, all of which go-toml encodes; the
	// Secret fields are tagged "-".
	body, err := toml.Marshal(c)
	if err != nil {
		b.WriteString("# cannot render: " + err.Error() + "\n")
	}
	b.Write(body)
	b.WriteString("\n# Secrets (read from the environment at load time):\n")
	b.WriteString("# Upstream keys:\n")
	for i := range c.Upstreams {
		u := &c.Upstreams[i]
		b.WriteString("#   upstreams[" + strconv.Itoa(i) + "] " + strconv.Quote(u.Name) + ": ")
		writeSecret(&b, u.APIKeyEnv, u.APIKey, "none; callers' own keys only")
	}
	b.WriteString("# redis password: ")
	writeSecret(&b, c.Redis.PasswordEnv, c.Redis.Password, "none")
	b.WriteString("# admin token: ")
	writeSecret(&b, c.Admin.TokenEnv, c.Admin.Token, "none; the admin API is off")
	b.WriteString("# tracing headers: ")
	writeSecret(&b, c.Tracing.HeadersEnv, c.Tracing.Headers, "none beyond OTEL_EXPORTER_OTLP_HEADERS")
	return b.String()
}

// writeSecret writes where a secret comes from, ending the line: "$X =
// <secret>", "$X is not set", or none when env is empty.
func writeSecret(b *strings.Builder, env string, s Secret, none string) {
	switch {
	case env == "":
		b.WriteString(none + "\n")
	case s == "":
		b.WriteString("$" + env + " is not set\n")
	default:
		b.WriteString("$" + env + " = " + s.String() + "\n")
	}
}
