package conversation

import (
	"time"

	"github.com/tollgate-llm/tollgate/llm"
)

// What a session's breakdown adds up to: the figures the admin report, the
// metrics and /stats show of a session. Each is decided here, once, so that
// the three agree.

// ClassNone is the class of a call that named none, among the classes a
// call may be in (llm.RequestClasses, ClassNone).
const ClassNone = "none"

// ClassLabel is class as a member of that closed set: class itself when
// llm.RequestClasses lists it, ClassNone for "" (or ClassNone),
// llm.ClassOther for anything else (Overflow included).
func ClassLabel(class string) string {
	if class == "" || class == ClassNone {
		return ClassNone
	}
	for _, c := range llm.RequestClasses {
		if class == c {
			return c
		}
	}
	return llm.ClassOther
}

// IsSession reports whether c is a coding agent's session rather than a
// plain conversation: at least one of its calls said something of itself
// (a request class, an agent, a user prompt, a tool run or a compaction).
// The sessions' figures (metrics, /stats) are over these only, so that
// conversations whose calls carry no agent's hints do not dilute them.
func (c *Conversation) IsSession() bool {
	if c.AgentSession {
		return true
	}
	b := &c.Breakdown
	if b.Prompts > 0 || len(b.Agents) > 0 || len(b.Tools) > 0 || len(b.Compactions) > 0 {
		return true
	}
	for class := range b.Classes {
		if class != ClassNone {
			return true
		}
	}
	return false
}

// SubagentCostShare is the share of c's cost its subagents' calls (class
// "subagent") took: 0 without any, or without cost.
func (c *Conversation) SubagentCostShare() float64 {
	sub := c.Breakdown.Classes["subagent"]
	if sub == nil || c.CostMicros <= 0 {
		return 0
	}
	return float64(sub.CostMicros) / float64(c.CostMicros)
}

// CompactionCalls is the calls of b that compacted the context, of every
// kind.
func (b *Breakdown) CompactionCalls() int64 {
	var n int64
	for _, k := range b.Compactions {
		n += k.Calls
	}
	return n
}

// TimeSplit is where a session's time went: its wall time from its first
// call's arrival to its last call's end (0 when no call said when it
// arrived), the model's (the calls' summed E2E, and of it their TTFTs), the
// tools' (the durations the agents reported), and the rest (the user, the
// client), which is the wall time less the model's and the tools', at
// least 0: parallel calls and tools (subagents, parallel tool calls)
// overlap, so the parts may add up to more than the wall time.
type TimeSplit struct {
	Wall, Model, TTFT, Tool, Other time.Duration
}

// TimeSplit returns c's time split.
func (c *Conversation) TimeSplit() TimeSplit {
	var s TimeSplit
	var model, ttft, tool int64
	for _, calls := range c.Breakdown.Classes {
		model += calls.E2EMicros
		ttft += calls.TTFTMicros
	}
	for _, t := range c.Breakdown.Tools {
		tool += t.Millis
	}
	s.Model = time.Duration(model) * time.Microsecond
	s.TTFT = time.Duration(ttft) * time.Microsecond
	s.Tool = time.Duration(tool) * time.Millisecond
	if !c.Start.IsZero() {
		s.Wall = c.Last.Sub(c.Start)
	}
	s.Other = max(0, s.Wall-s.Model-s.Tool)
	return s
}

// Shares returns the model's, the tools' and the rest's shares of the
// session's time, each over Model + Tool + Other: the wall time or, when
// calls and tools overlap past it, their sum; so each is from 0 to 1 and
// the three add up to 1. All are 0 for a session without any time.
func (s TimeSplit) Shares() (model, tool, other float64) {
	total := float64(s.Model + s.Tool + s.Other)
	if total <= 0 {
		return 0, 0, 0
	}
	return float64(s.Model) / total, float64(s.Tool) / total, float64(s.Other) / total
}
