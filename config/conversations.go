package config

import "time"

// Conversations is the [conversations] table: turns, tokens and cost per
// conversation, the outcome the application reports for it, and an
// optional budget per conversation (a team's max_cost_per_conversation_usd).
// Off by default. It is read at start only: a reload does not change it.
type Conversations struct {
	// Enabled turns conversation tracking on. Default false.
	Enabled bool `toml:"enabled"`
	// Header is the request header that names a request's conversation.
	// The W3C baggage entry session.id (OpenTelemetry's session
	// convention) is read when the header is absent. Default
	// "X-Conversation-Id".
	Header string `toml:"header"`
	// IdleTimeoutSeconds ends a conversation that has had no turn for this
	// long; its figures are observed then. Default 1800.
	IdleTimeoutSeconds float64 `toml:"idle_timeout_seconds"`
	// MaxActive bounds the conversations kept at once; past it the one idle
	// longest is evicted (counted, not observed). Default 100000.
	MaxActive int `toml:"max_active"`
	// StateFile keeps the active conversations across restarts without
	// Redis: written every FlushIntervalSeconds and at shutdown, read at
	// start. One gateway per file. "" keeps them in memory only. Unused
	// with Redis. Default "tollgate-conversations.json".
	StateFile string `toml:"state_file"`
	// FlushIntervalSeconds is how often turns are sent to Redis (batched,
	// each applied once) or the state file is written, and how often ended
	// conversations are looked for. Default 1.
	FlushIntervalSeconds float64 `toml:"flush_interval_seconds"`
}

// IdleTimeout returns IdleTimeoutSeconds as a duration.
func (c *Conversations) IdleTimeout() time.Duration { return Seconds(c.IdleTimeoutSeconds) }

// FlushInterval returns FlushIntervalSeconds as a duration.
func (c *Conversations) FlushInterval() time.Duration { return Seconds(c.FlushIntervalSeconds) }

func defaultConversations() Conversations {
	return Conversations{
		Header:               "X-Conversation-Id",
		IdleTimeoutSeconds:   1800,
		MaxActive:            100_000,
		StateFile:            "tollgate-conversations.json",
		FlushIntervalSeconds: 1,
	}
}

// maxActiveConversations bounds max_active: each conversation kept costs a
// few hundred bytes.
const maxActiveConversations = 10_000_000

func (c *Conversations) validate(v *validator) {
	if !validHeaderName(c.Header) {
		v.add("conversations.header", "%q is not a header name (letters, digits and !#$%%&'*+-.^_`|~)", c.Header)
	}
	v.duration("conversations.idle_timeout_seconds", c.IdleTimeoutSeconds, time.Millisecond, false)
	v.duration("conversations.flush_interval_seconds", c.FlushIntervalSeconds, time.Millisecond, false)
	switch {
	case c.MaxActive < 1:
		v.add("conversations.max_active", "must be at least 1, not %d", c.MaxActive)
	case c.MaxActive > maxActiveConversations:
		v.add("conversations.max_active", "%d is too many (at most %d)", c.MaxActive, maxActiveConversations)
	}
}

// validHeaderName reports whether s is an HTTP token (RFC 9110 field-name).
func validHeaderName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '!' || c == '#' || c == '$' || c == '%' || c == '&' || c == '\'' || c == '*' ||
			c == '+' || c == '-' || c == '.' || c == '^' || c == '_' || c == '`' || c == '|' || c == '~':
		default:
			return false
		}
	}
	return s != ""
}
