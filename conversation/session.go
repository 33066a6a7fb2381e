package conversation

import (
	"time"
)

// A coding agent's session is a conversation whose turns say more of
// themselves: which request class a call is (the main loop, a subagent, a
// compaction, ...), which agent of the session made it and which agent
// spawned that one, the user prompt it serves, the tools the agent ran
// since its previous call and for how long. The agents send these in their
// own headers (see the proxy's agent hints); they are client-asserted and
// kept for reporting only. A conversation keeps them as a Breakdown: the
// calls by class, by agent (the tree), by tool, by compaction kind, and
// the distinct prompts. Every part is bounded: past its cap, further
// members are counted under Overflow.

// The bounds of a Breakdown's parts.
const (
	// MaxAgents bounds the agents a conversation keeps apart (a session
	// that spawns more folds the rest under Overflow).
	MaxAgents = 64
	// MaxTools bounds the tools a conversation keeps apart.
	MaxTools = 64
	// MaxPrompts bounds the distinct user prompts counted; past it,
	// PromptsCapped is set and Prompts stops growing.
	MaxPrompts = 1024
	// MaxClasses and MaxCompactionKinds bound closed sets (with their
	// "other").
	MaxClasses         = 16
	MaxCompactionKinds = 8
	// MaxMemberLen bounds a member's name in bytes (an agent id is hashed
	// before it gets here, a tool name is cut).
	MaxMemberLen = 64
)

// Overflow is the member that stands for those past a part's cap.
const Overflow = "~"

// Calls are the figures of a set of calls: how many, how many failed,
// their cost, and their summed E2E and TTFT (the model's share of a
// session's time).
type Calls struct {
	Calls      int64 `json:"calls"`
	Errors     int64 `json:"errors"`
	CostMicros int64 `json:"cost_micros"`
	// E2E and TTFT are sums over the calls, in microseconds.
	E2EMicros  int64 `json:"e2e_us"`
	TTFTMicros int64 `json:"ttft_us"`
}

func (c *Calls) add(o Calls) {
	c.Calls += o.Calls
	c.Errors += o.Errors
	c.CostMicros += o.CostMicros
	c.E2EMicros += o.E2EMicros
	c.TTFTMicros += o.TTFTMicros
}

// Agent is one agent of a session: the agent that spawned it ("" for one
// spawned by the main loop, or not said), the type the agent reported,
// and its calls.
type Agent struct {
	Parent string `json:"parent,omitempty"`
	Type   string `json:"type,omitempty"`
	Calls
}

// Tool is one tool's runs, as the agent reported them: how many and how
// long, summed.
type Tool struct {
	Runs   int64 `json:"runs"`
	Millis int64 `json:"ms"`
}

// Compactions are a session's compactions of one kind: the calls that
// compacted, the input tokens they summarised (the context before), and
// the input tokens of the first main call after each (the context after).
type Compactions struct {
	Calls        int64 `json:"calls"`
	TokensBefore int64 `json:"tokens_before"`
	// After counts the calls that reported the compaction as done, whose
	// input tokens are TokensAfter.
	After       int64 `json:"after"`
	TokensAfter int64 `json:"tokens_after"`
}

// Breakdown is what a conversation's turns said of themselves. Its maps are
// nil until a turn fills them.
type Breakdown struct {
	// Classes are the calls by request class ("main", "subagent", ...;
	// "none" for a call that named none).
	Classes map[string]*Calls `json:"classes,omitempty"`
	// Agents are the session's agents by id (a hash of the agent's own
	// id); the main loop is not one.
	Agents map[string]*Agent `json:"agents,omitempty"`
	// Tools are the tools the agents reported running, by name.
	Tools map[string]*Tool `json:"tools,omitempty"`
	// Compactions are by kind ("auto", "manual", "reactive", "other").
	Compactions map[string]*Compactions `json:"compactions,omitempty"`
	// Prompts counts the distinct user prompts (Claude Code's prompt id,
	// Codex's turn id) the calls served: the session's user turns.
	Prompts       int64 `json:"prompts"`
	PromptsCapped bool  `json:"prompts_capped,omitempty"`
	// prompts are the prompt ids seen (Local; a Redis store keeps them
	// in Redis).
	prompts map[string]struct{}
}

// Hints are what a turn's agent said of it: all optional.
type Hints struct {
	// Class is the request class, from a closed set ("" is "none").
	Class string
	// Agent is the agent's id, hashed (""for the main loop), Parent the
	// spawning agent's, AgentType the type it reported.
	Agent, Parent, AgentType string
	// Compaction is set on a call that compacts the context (its kind);
	// Compacted on the first main call after a compaction (the kind done).
	Compaction, Compacted string
	// Prompt is the user prompt the call serves, hashed.
	Prompt string
	// Tools are the tools run since the agent's previous call.
	Tools []ToolRun
}

// ToolRun is one tool run an agent reported.
type ToolRun struct {
	Name   string
	Millis int64
}

// addTurn folds one turn's hints into b: its call figures, its input
// tokens for a compaction's before and after.
func (b *Breakdown) addTurn(h *Hints, call Calls, input int64) {
	class := cleanName(h.Class)
	if class == "" {
		class = ClassNone
	}
	addCalls(&b.Classes, class, MaxClasses, call)
	if h.Agent != "" {
		a := member(&b.Agents, cleanName(h.Agent), MaxAgents)
		if a.Parent == "" {
			a.Parent = cleanName(h.Parent)
		}
		if a.Type == "" {
			a.Type = cleanName(h.AgentType)
		}
		a.Calls.add(call)
	}
	for _, t := range h.Tools {
		if t.Name == "" {
			continue
		}
		tool := member(&b.Tools, cleanName(t.Name), MaxTools)
		tool.Runs++
		tool.Millis += max(t.Millis, 0)
	}
	if h.Compaction != "" {
		c := member(&b.Compactions, cleanName(h.Compaction), MaxCompactionKinds)
		c.Calls++
		c.TokensBefore += input
	}
	if h.Compacted != "" {
		c := member(&b.Compactions, cleanName(h.Compacted), MaxCompactionKinds)
		c.After++
		c.TokensAfter += input
	}
	if h.Prompt != "" {
		b.addPrompt(cleanName(h.Prompt))
	}
}

// cleanName is name as a Breakdown member: at most MaxMemberLen bytes,
// with '|' (Redis's field separator, redis_breakdown.go), '~' (Overflow's)
// and bytes outside printable ASCII as '_'. It allocates only when it
// changes name.
func cleanName(name string) string {
	if len(name) > MaxMemberLen {
		name = name[:MaxMemberLen]
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x21 || c > 0x7d || c == '|' {
			b := []byte(name)
			for j := i; j < len(b); j++ {
				if c := b[j]; c < 0x21 || c > 0x7d || c == '|' {
					b[j] = '_'
				}
			}
			return string(b)
		}
	}
	return name
}

// addPrompt counts prompt once, up to MaxPrompts.
func (b *Breakdown) addPrompt(prompt string) {
	if _, seen := b.prompts[prompt]; seen {
		return
	}
	if len(b.prompts) >= MaxPrompts {
		b.PromptsCapped = true
		return
	}
	if b.prompts == nil {
		b.prompts = make(map[string]struct{})
	}
	b.prompts[prompt] = struct{}{}
	b.Prompts = int64(len(b.prompts))
}

// merge adds o's figures to b (a Redis store's unsent turns onto what Redis
// holds): the counters add, a member's attributes are kept when b has
// them, and the prompts add as counted (a prompt counted on both sides
// counts twice: o's distinct prompts are not known to b).
func (b *Breakdown) merge(o *Breakdown) {
	for name, c := range o.Classes {
		addCalls(&b.Classes, name, MaxClasses, *c)
	}
	for name, a := range o.Agents {
		m := member(&b.Agents, name, MaxAgents)
		if m.Parent == "" {
			m.Parent = a.Parent
		}
		if m.Type == "" {
			m.Type = a.Type
		}
		m.Calls.add(a.Calls)
	}
	for name, t := range o.Tools {
		m := member(&b.Tools, name, MaxTools)
		m.Runs += t.Runs
		m.Millis += t.Millis
	}
	for name, c := range o.Compactions {
		m := member(&b.Compactions, name, MaxCompactionKinds)
		m.Calls += c.Calls
		m.TokensBefore += c.TokensBefore
		m.After += c.After
		m.TokensAfter += c.TokensAfter
	}
	b.Prompts += o.Prompts
	b.PromptsCapped = b.PromptsCapped || o.PromptsCapped
}

// clone copies b deeply.
func (b *Breakdown) clone() Breakdown {
	out := Breakdown{Prompts: b.Prompts, PromptsCapped: b.PromptsCapped}
	out.Classes = cloneMap(b.Classes)
	out.Agents = cloneMap(b.Agents)
	out.Tools = cloneMap(b.Tools)
	out.Compactions = cloneMap(b.Compactions)
	if b.prompts != nil {
		out.prompts = make(map[string]struct{}, len(b.prompts))
		for p := range b.prompts {
			out.prompts[p] = struct{}{}
		}
	}
	return out
}

func cloneMap[T any](m map[string]*T) map[string]*T {
	if m == nil {
		return nil
	}
	out := make(map[string]*T, len(m))
	for k, v := range m {
		c := *v
		out[k] = &c
	}
	return out
}

func addCalls(m *map[string]*Calls, name string, limit int, c Calls) {
	member(m, name, limit).add(c)
}

// member returns m's member name, adding it (or, past limit members, the
// Overflow member) when it is new.
func member[T any](m *map[string]*T, name string, limit int) *T {
	if *m == nil {
		*m = make(map[string]*T)
	}
	if v, ok := (*m)[name]; ok {
		return v
	}
	if len(*m) >= limit {
		name = Overflow
		if v, ok := (*m)[name]; ok {
			return v
		}
	}
	v := new(T)
	(*m)[name] = v
	return v
}

// callOf is a turn's figures as one call.
func callOf(t *Turn) Calls {
	c := Calls{Calls: 1, CostMicros: t.CostMicros, E2EMicros: t.E2E.Microseconds(), TTFTMicros: t.TTFT.Microseconds()}
	if t.Error {
		c.Errors = 1
	}
	return c
}

// sessionStart is the earlier of two starts, the zero time being none.
func sessionStart(a, b time.Time) time.Time {
	switch {
	case a.IsZero():
		return b
	case b.IsZero() || a.Before(b):
		return a
	}
	return b
}
