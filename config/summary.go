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
// TOML that Parse accepts, for `gateway check-config`. Upstream keys never
// appear: a closing comment says, for each upstream, which variable its key
// came from, shown as <secret>.
func (c *Config) Redacted() string {
	var b strings.Builder
	b.WriteString("# Effective configuration: the file with every default filled in.\n\n")
	// Config holds only strings, numbers, booleans, slices, string maps and
	// structs, all of which go-toml encodes; the Secret field is tagged "-".
	body, err := toml.Marshal(c)
	if err != nil {
		b.WriteString("# cannot render: " + err.Error() + "\n")
	}
	b.Write(body)
	b.WriteString("\n# Upstream keys (read from the environment at load time):\n")
	for i := range c.Upstreams {
		u := &c.Upstreams[i]
		b.WriteString("#   upstreams[" + strconv.Itoa(i) + "] " + strconv.Quote(u.Name) + ": ")
		switch {
		case u.APIKeyEnv == "":
			b.WriteString("none; callers' own keys only\n")
		case u.APIKey == "":
			b.WriteString("$" + u.APIKeyEnv + " is not set\n")
		default:
			b.WriteString("$" + u.APIKeyEnv + " = " + u.APIKey.String() + "\n")
		}
	}
	return b.String()
}
