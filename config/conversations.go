package config

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Conversations is the [conversations] table: turns, tokens and cost per
// conversation, the outcome the application reports for it, and an
// optional budget per conversation (a team's max_cost_per_conversation_usd).
// Off by default. It is read at start only: a reload does not change it.
type Conversations struct {
	// Enabled turns conversation tracking on. Default false.
	Enabled bool `toml:"enabled"`
	// Header is the application's request header that names a request's
	// conversation: the "header" entry of Identity. Default
	// "X-Conversation-Id".
	Header string `toml:"header"`
	// Identity is the order in which a request's conversation is looked
	// for; the first that names one wins. Each entry is a request header's
	// name, or one of: "header" (Header), "baggage" (the W3C baggage entry
	// session.id, OpenTelemetry's session convention), "client_metadata"
	// (the session_id of the body's client_metadata, which Codex sends on
	// each turn of a socket), "responses" (on the Responses API, its
	// conversation, else its previous_response_id's chain). Default: the
	// coding agents' session headers, then the rest (DefaultIdentity).
	Identity []string `toml:"identity"`
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

// DefaultIdentity is Conversations.Identity's default: Claude Code's
// session header, Codex's (and its older spelling), the headers other
// clients send, then the application's header, baggage, Codex's body and
// the Responses API's own chaining.
var DefaultIdentity = append(slices.Clone(AgentSessionHeaders), "x-session-id",
	"x-session-affinity", IdentityHeader, IdentityBaggage, IdentityClientMetadata, IdentityResponses)

// AgentSessionHeaders are the headers in which coding agents name their own
// sessions: Claude Code's, Codex's (and its older spelling). A
// conversation one of them names is an agent's session.
var AgentSessionHeaders = []string{"x-claude-code-session-id", "session-id", "session_id"}

// The entries of Conversations.Identity that are not header names.
const (
	IdentityHeader         = "header"
	IdentityBaggage        = "baggage"
	IdentityClientMetadata = "client_metadata"
	IdentityResponses      = "responses"
)

func defaultConversations() Conversations {
	return Conversations{
		Identity:             slices.Clone(DefaultIdentity),
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
	if len(c.Identity) == 0 {
		v.add("conversations.identity", "must name at least one source (default %q)", DefaultIdentity)
	}
	seen := map[string]bool{}
	for i, e := range c.Identity {
		key := fmt.Sprintf("conversations.identity[%d]", i)
		switch {
		case !validHeaderName(e):
			v.add(key, "%q is neither a header name nor one of %q, %q, %q, %q", e,
				IdentityHeader, IdentityBaggage, IdentityClientMetadata, IdentityResponses)
		case seen[strings.ToLower(e)]:
			v.add(key, "%q is listed twice", e)
		}
		seen[strings.ToLower(e)] = true
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
