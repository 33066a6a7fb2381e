package conversation

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"
)

// sessionTurns are a coding agent's session: a main loop serving two user
// prompts with tool steps, a subagent (and one it spawned) with its own
// tools, a compaction and the main call after it, an auxiliary call with
// no prompt, and a call that names no class.
func sessionTurns(s *subject, key string) []Turn {
	base := s.turn(key, 100)
	mk := func(n int64, h Hints) Turn {
		tu := base
		tu.Tokens = Tokens{Input: 1000 * n, Output: n}
		tu.CostMicros, tu.TTFT, tu.E2E = n, time.Duration(n)*time.Millisecond, time.Duration(10*n)*time.Millisecond
		tu.Start = base.At.Add(time.Duration(n) * time.Second)
		tu.KeyID, tu.User = "dev-alice", "u-1f2e"
		tu.Hints = h
		return tu
	}
	return []Turn{
		mk(1, Hints{Class: "main", Prompt: "p1"}),
		mk(2, Hints{Class: "main", Prompt: "p1", Tools: []ToolRun{{"Bash", 742}, {"Read", 9}}}),
		mk(3, Hints{Class: "subagent", Agent: "a1", AgentType: "Explore", Prompt: "p1"}),
		mk(4, Hints{Class: "subagent", Agent: "a1", Prompt: "p1", Tools: []ToolRun{{"Grep", 30}}}),
		mk(5, Hints{Class: "subagent", Agent: "a2", Parent: "a1", AgentType: "general-purpose", Prompt: "p1"}),
		mk(6, Hints{Class: "compaction", Compaction: "auto", Prompt: "p2"}),
		mk(7, Hints{Class: "main", Compacted: "auto", Prompt: "p2"}),
		mk(8, Hints{Class: "main", Prompt: "p2", Tools: []ToolRun{{"Bash", 100}, {"mcp|odd name", 5}}}),
		mk(9, Hints{Class: "auxiliary"}),
		mk(10, Hints{}),
	}
}

// sameBreakdown compares two conversations' figures but for the stores'
// own record of which prompts they saw.
func sameBreakdown(got, want Conversation) bool {
	got.Breakdown.prompts, want.Breakdown.prompts = nil, nil
	return reflect.DeepEqual(got, want)
}

func TestSessionBreakdownFoldsLikeItsTurns(t *testing.T) {
	forEachStore(t, Options{}, func(t *testing.T, s *subject) {
		ctx := context.Background()
		k := Key("team:research", "session-1")
		var want Conversation
		for i, tu := range sessionTurns(s, k) {
			s.Record(tu)
			want.add(&tu)
			if i == 4 {
				s.tick(ctx) // two batches: a prompt of both counts once
			}
		}
		s.tick(ctx)
		got := s.get(t, k)
		if !sameBreakdown(got, want) {
			t.Errorf("conversation =\n%+v\nwant\n%+v", got, want)
		}
		bd := got.Breakdown
		if c := bd.Classes["main"]; c == nil || c.Calls != 4 || c.CostMicros != 1+2+7+8 || c.E2EMicros != 180_000 {
			t.Errorf("main calls %+v", c)
		}
		if c := bd.Classes["none"]; c == nil || c.Calls != 1 {
			t.Errorf("calls without a class %+v", c)
		}
		if a := bd.Agents["a2"]; a == nil || a.Parent != "a1" || a.Type != "general-purpose" || a.Calls.Calls != 1 {
			t.Errorf("agent a2 %+v", a)
		}
		if a := bd.Agents["a1"]; a == nil || a.Parent != "" || a.Type != "Explore" || a.Calls.Calls != 2 || a.CostMicros != 7 {
			t.Errorf("agent a1 %+v", a)
		}
		if tl := bd.Tools["Bash"]; tl == nil || tl.Runs != 2 || tl.Millis != 842 {
			t.Errorf("Bash %+v", tl)
		}
		if tl := bd.Tools["mcp_odd_name"]; tl == nil || tl.Millis != 5 {
			t.Errorf("a tool name with the separator: %+v", bd.Tools)
		}
		if c := bd.Compactions["auto"]; c == nil || *c != (Compactions{Calls: 1, TokensBefore: 6000, After: 1, TokensAfter: 7000}) {
			t.Errorf("compactions %+v", c)
		}
		if bd.Prompts != 2 || bd.PromptsCapped {
			t.Errorf("prompts %d (capped %v), want 2", bd.Prompts, bd.PromptsCapped)
		}
		if got.KeyID != "dev-alice" || got.User != "u-1f2e" || !got.Start.Equal(s.clock.Now().Add(time.Second)) {
			t.Errorf("key %q user %q start %v", got.KeyID, got.User, got.Start)
		}

		if s.reopen == nil {
			return
		}
		// A restart keeps which prompts were counted.
		s = s.reopen(t)
		again := sessionTurns(s, k)[0]
		s.Record(again)
		s.tick(ctx)
		if got := s.get(t, k); got.Breakdown.Prompts != 2 || got.Turns != want.Turns+1 {
			t.Errorf("after a restart, a known prompt again: prompts %d turns %d", got.Breakdown.Prompts, got.Turns)
		}
	})
}

func TestSessionBreakdownIsBounded(t *testing.T) {
	forEachStore(t, Options{}, func(t *testing.T, s *subject) {
		ctx := context.Background()
		k := Key("", "many")
		for i := range MaxAgents + 10 {
			tu := s.turn(k, 1)
			tu.Hints = Hints{Class: fmt.Sprint("class-", i%(MaxClasses+4)), Agent: fmt.Sprint("agent-", i),
				Tools: []ToolRun{{fmt.Sprint("tool-", i), 1}}, Prompt: fmt.Sprint("p", i)}
			s.Record(tu)
			if i%20 == 0 {
				s.tick(ctx)
			}
		}
		s.tick(ctx)
		bd := s.get(t, k).Breakdown
		if len(bd.Agents) != MaxAgents+1 || bd.Agents[Overflow] == nil || bd.Agents[Overflow].Calls.Calls != 10 {
			t.Errorf("%d agents, overflow %+v; want %d and the overflow with 10 calls", len(bd.Agents), bd.Agents[Overflow], MaxAgents)
		}
		if len(bd.Tools) != MaxTools+1 || bd.Tools[Overflow].Runs != 10 {
			t.Errorf("%d tools, overflow %+v", len(bd.Tools), bd.Tools[Overflow])
		}
		if len(bd.Classes) != MaxClasses+1 || bd.Classes[Overflow] == nil {
			t.Errorf("%d classes", len(bd.Classes))
		}
		var calls int64
		for _, c := range bd.Classes {
			calls += c.Calls
		}
		if calls != MaxAgents+10 || bd.Prompts != MaxAgents+10 {
			t.Errorf("calls %d prompts %d; want %d each", calls, bd.Prompts, MaxAgents+10)
		}
		if MaxAgents+10 > MaxPrompts {
			t.Fatal("the test must stay under MaxPrompts")
		}
	})
}

// TestAgentSessionHeaderMakesASession: a conversation an agent's own
// session header named is a session though its calls carry no hints, in
// every store; one without either is not.
func TestAgentSessionHeaderMakesASession(t *testing.T) {
	forEachStore(t, Options{}, func(t *testing.T, s *subject) {
		ctx := context.Background()
		agent, plain := Key("", "claude-session"), Key("", "app-conversation")
		tu := s.turn(agent, 10)
		tu.AgentSession = true
		s.Record(tu)
		s.Record(s.turn(plain, 10))
		s.tick(ctx)
		if c := s.get(t, agent); !c.AgentSession || !c.IsSession() {
			t.Errorf("the agent's session: agent %v, session %v", c.AgentSession, c.IsSession())
		}
		if c := s.get(t, plain); c.AgentSession || c.IsSession() {
			t.Errorf("a plain conversation: agent %v, session %v", c.AgentSession, c.IsSession())
		}
	})
}
