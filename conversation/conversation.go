// Package conversation keeps the figures of each conversation the gateway
// serves: its turns (requests), tokens by type, cost, errors, first and
// last turn, its team, the TTFT of each turn, and the outcome the
// application reports for it. A conversation that has had no turn for the
// idle timeout ends and is handed, once, to Options.OnEnd: that is where
// the per-conversation distributions (turns, cost, tokens, duration) are
// observed.
//
// Two stores implement Store: Local keeps the conversations in the process
// (with a state file across restarts), and Redis shares them between
// replicas, batching turns like the spend ledger so that each counts once
// and one replica ends each conversation.
package conversation

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"time"
)

// Key names the conversation id names for owner (the caller's team, or its
// key without a team; "" for callers without a [[keys]] entry): the hex of
// the first 16 bytes of SHA-256(owner NUL id). Stores, logs and the admin
// API know a conversation only by its Key, so the id the application chose
// is never written anywhere, and two teams sending the same id have two
// conversations.
func Key(owner, id string) string {
	h := sha256.New()
	h.Write([]byte(owner))
	h.Write([]byte{0})
	h.Write([]byte(id))
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:16])
}

// MaxIDLen is the longest conversation id accepted, in bytes.
const MaxIDLen = 512

// ValidID reports whether id can name a conversation: not empty, at most
// MaxIDLen bytes, no control characters.
func ValidID(id string) bool {
	if id == "" || len(id) > MaxIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c < 0x20 || c == 0x7f {
			return false
		}
	}
	return true
}

// Tokens are a conversation's tokens by type. Input includes CacheRead and
// CacheWrite, Output includes Reasoning (as in llm.Usage).
type Tokens struct {
	Input      int64 `json:"input"`
	Output     int64 `json:"output"`
	CacheRead  int64 `json:"cache_read"`
	CacheWrite int64 `json:"cache_write"`
	Reasoning  int64 `json:"reasoning"`
}

// Add adds o to t.
func (t *Tokens) Add(o Tokens) {
	t.Input += o.Input
	t.Output += o.Output
	t.CacheRead += o.CacheRead
	t.CacheWrite += o.CacheWrite
	t.Reasoning += o.Reasoning
}

// Turn is one request of a conversation, as it ended.
type Turn struct {
	// Key is the conversation's Key.
	Key string
	// Team is the caller's team, "" without one.
	Team string
	// At is when the turn ended (t_end).
	At         time.Time
	Tokens     Tokens
	CostMicros int64
	// TTFT is the turn's time to first token; 0 when it had none (an
	// error, a non-streamed answer).
	TTFT time.Duration
	// Error marks a turn that did not succeed.
	Error bool
	// Start is when the turn arrived (t_in), E2E how long it took.
	Start time.Time
	E2E   time.Duration
	// KeyID is the caller's key (its [[keys]] name or key id); User the
	// end user the request named (hashed), "" when none.
	KeyID, User string
	// Hints are what the turn's agent said of it (session.go).
	Hints Hints
	// AgentSession: a coding agent's own session header named the
	// conversation (Claude Code's, Codex's), so it is a session whether
	// or not the call carried hints.
	AgentSession bool
}

// MaxTTFTs bounds the per-turn TTFTs a conversation keeps: its first
// MaxTTFTs turns'.
const MaxTTFTs = 64

// Conversation is one conversation's figures.
type Conversation struct {
	Key string `json:"key"`
	// Team is the team of its first turn ("" without one).
	Team       string `json:"team"`
	Turns      int64  `json:"turns"`
	Errors     int64  `json:"errors"`
	Tokens     Tokens `json:"tokens"`
	CostMicros int64  `json:"cost_micros"`
	// First and Last are when its first and last turns ended.
	First time.Time `json:"first"`
	Last  time.Time `json:"last"`
	// TTFTs are its first MaxTTFTs turns' TTFTs, in turn order (0: none).
	TTFTs []time.Duration `json:"ttfts"`
	// Outcome is what the application reported, nil until it does.
	Outcome *Outcome `json:"outcome,omitempty"`
	// Start is when its first turn arrived (zero when no turn said).
	Start time.Time `json:"start,omitzero"`
	// KeyID and User are the first key and end user its turns named.
	KeyID string `json:"key_id,omitempty"`
	User  string `json:"user,omitempty"`
	// Breakdown is what its turns said of themselves (session.go).
	Breakdown Breakdown `json:"breakdown"`
	// AgentSession: a turn's conversation was named by a coding agent's
	// own session header (Turn.AgentSession).
	AgentSession bool `json:"agent_session,omitempty"`
}

// Duration is the time from its first turn's end to its last's.
func (c *Conversation) Duration() time.Duration { return c.Last.Sub(c.First) }

// add folds one turn into c.
func (c *Conversation) add(t *Turn) {
	if c.Turns == 0 {
		c.Key, c.Team, c.First, c.Last = t.Key, t.Team, t.At, t.At
	}
	c.Turns++
	if t.Error {
		c.Errors++
	}
	c.Tokens.Add(t.Tokens)
	c.CostMicros += t.CostMicros
	if t.At.Before(c.First) {
		c.First = t.At
	}
	if t.At.After(c.Last) {
		c.Last = t.At
	}
	if len(c.TTFTs) < MaxTTFTs {
		c.TTFTs = append(c.TTFTs, t.TTFT)
	}
	c.Start = sessionStart(c.Start, t.Start)
	if c.KeyID == "" {
		c.KeyID = t.KeyID
	}
	if c.User == "" {
		c.User = t.User
	}
	c.AgentSession = c.AgentSession || t.AgentSession
	c.Breakdown.addTurn(&t.Hints, callOf(t), t.Tokens.Input)
}

// Outcome is the application's verdict on a conversation.
type Outcome struct {
	// Completed says whether the conversation's task was done.
	Completed bool `json:"completed"`
	// Score is a quality score from 0 to 1; nil when none was given.
	Score *float64 `json:"score,omitempty"`
	// Feedback is free text from the application or its user (at most
	// MaxFeedbackLen bytes). It is kept with the conversation only, never
	// a metric label.
	Feedback string `json:"feedback,omitempty"`
	// At is when it was recorded.
	At time.Time `json:"at"`
}

// MaxFeedbackLen bounds Outcome.Feedback, in bytes.
const MaxFeedbackLen = 4096

// Reason says why a conversation ended.
type Reason uint8

const (
	// EndIdle: no turn for the idle timeout.
	EndIdle Reason = iota
	// EndEvicted: more than MaxActive conversations were kept and it had
	// been idle longest. Its figures are partial.
	EndEvicted
)

// String returns the reason's label value.
func (r Reason) String() string {
	if r == EndEvicted {
		return "evicted"
	}
	return "idle"
}

var (
	// ErrUnknown: no active conversation has that key (never seen, or ended).
	ErrUnknown = errors.New("conversation: unknown or ended conversation")
	// ErrOutcomeSet: the conversation's outcome was recorded already.
	ErrOutcomeSet = errors.New("conversation: its outcome was recorded already")
)

// Store keeps the active conversations.
type Store interface {
	// Record folds one turn into its conversation, starting it if need be.
	// It never waits for a disk or the network: a shared store batches.
	Record(t Turn)
	// Get returns an active conversation's figures (ErrUnknown if none).
	// A shared store's answer includes this replica's turns not yet sent.
	Get(ctx context.Context, key string) (Conversation, error)
	// Cost returns what an active conversation has cost so far, in
	// micro-dollars; 0 for one not seen.
	Cost(ctx context.Context, key string) (int64, error)
	// SetOutcome records o on an active conversation and returns it as it
	// is afterwards: ErrUnknown if there is none, ErrOutcomeSet (with the
	// conversation, holding the first outcome) if one was recorded.
	SetOutcome(ctx context.Context, key string, o Outcome) (Conversation, error)
	// Link records that a stored response (the Responses API's
	// previous_response_id chains) belongs to conversation key, for twice
	// the idle timeout (linkLifetime).
	Link(ctx context.Context, responseID, key string) error
	// Resolve returns the key of the conversation a response belongs to,
	// "" when none is recorded.
	Resolve(ctx context.Context, responseID string) (string, error)
	// Flush sends or writes every turn recorded so far.
	Flush(ctx context.Context) error
	// Close stops the background work, flushes one last time and releases
	// the store's resources.
	Close() error
}

// linkLifetime is how long a response stays linked to its conversation:
// twice the idle timeout, since the link is made when the turn's response
// starts and the conversation's idle time counts from when the turn ends,
// so a turn as long as the idle timeout still leaves the next turn the
// whole idle timeout to continue the chain.
func linkLifetime(idle time.Duration) time.Duration { return 2 * idle }

// Options configure a store. The zero value is usable.
type Options struct {
	// IdleTimeout ends a conversation without a turn for this long.
	// Default 30 minutes.
	IdleTimeout time.Duration
	// MaxActive bounds the conversations kept. Default 100,000.
	MaxActive int
	// Interval is how often the store writes (state file, Redis) and looks
	// for ended conversations. Default 1 s.
	Interval time.Duration
	// OnEnd receives each ended conversation, once (across replicas for a
	// shared store). It is called from the store's background goroutine,
	// or for an eviction from the call that made it (Local: Record; Redis:
	// the call that sent the batch), never under the store's lock.
	OnEnd func(c Conversation, why Reason)
	// Now is the clock (tests). Default time.Now.
	Now func() time.Time
}

func (o *Options) fill() {
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 30 * time.Minute
	}
	if o.MaxActive <= 0 {
		o.MaxActive = 100_000
	}
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.OnEnd == nil {
		o.OnEnd = func(Conversation, Reason) {}
	}
}
