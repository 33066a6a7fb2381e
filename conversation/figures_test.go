package conversation

import (
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/llm"
)

// figuresOf folds turns into a conversation, as a store does.
func figuresOf(turns ...Turn) Conversation {
	var c Conversation
	for i := range turns {
		c.add(&turns[i])
	}
	return c
}

// A session of a main call with tools, a subagent and a compaction: its
// time split, shares, subagent cost share and compactions are what its
// calls add up to.
func TestSessionFigures(t *testing.T) {
	t0 := time.Date(2026, 9, 1, 10, 0, 0, 0, time.UTC)
	call := func(startSec, e2eSec int, cost int64, h Hints) Turn {
		start := t0.Add(time.Duration(startSec) * time.Second)
		e2e := time.Duration(e2eSec) * time.Second
		return Turn{Key: "k", Team: "research", Start: start, E2E: e2e, At: start.Add(e2e),
			TTFT: e2e / 10, CostMicros: cost, Hints: h}
	}
	c := figuresOf(
		call(0, 10, 600, Hints{Class: "main", Prompt: "p1"}),
		call(30, 20, 300, Hints{Class: "subagent", Agent: "a1", Tools: []ToolRun{{"Bash", 15_000}}}),
		call(60, 5, 100, Hints{Class: "compaction", Compaction: "auto"}),
		call(90, 10, 0, Hints{Class: "main", Compacted: "auto", Tools: []ToolRun{{"Read", 5_000}, {"Bash", 10_000}}}),
	)
	if !c.IsSession() {
		t.Fatal("a conversation of classed calls is not a session")
	}
	s := c.TimeSplit()
	want := TimeSplit{Wall: 100 * time.Second, Model: 45 * time.Second, TTFT: 4500 * time.Millisecond,
		Tool: 30 * time.Second, Other: 25 * time.Second}
	if s != want {
		t.Errorf("time split %+v, want %+v", s, want)
	}
	if m, tl, o := s.Shares(); m != 0.45 || tl != 0.3 || o != 0.25 {
		t.Errorf("shares %v, %v, %v; want 0.45, 0.3 and 0.25 of 100 s", m, tl, o)
	}
	if got := c.SubagentCostShare(); got != 0.3 {
		t.Errorf("subagent cost share %v, want 300/1000", got)
	}
	if got := c.Breakdown.CompactionCalls(); got != 1 {
		t.Errorf("%d compactions, want 1", got)
	}

	// Calls and tools that overlap past the wall time: the shares are over
	// their sum, and the rest is 0.
	over := TimeSplit{Wall: 10 * time.Second, Model: 12 * time.Second, Tool: 4 * time.Second}
	if m, tl, o := over.Shares(); m != 0.75 || tl != 0.25 || o != 0 {
		t.Errorf("overlapping shares %v, %v, %v; want 0.75, 0.25 and 0", m, tl, o)
	}
	if m, tl, o := (TimeSplit{}).Shares(); m != 0 || tl != 0 || o != 0 {
		t.Errorf("a session without time has shares %v, %v, %v", m, tl, o)
	}
}

// A conversation whose calls said nothing of themselves is not a session;
// one hint of any kind makes it one.
func TestIsSession(t *testing.T) {
	plain := Turn{Key: "k", CostMicros: 5}
	if c := figuresOf(plain, plain); c.IsSession() || c.SubagentCostShare() != 0 {
		t.Errorf("plain conversation: session %v, subagent share %v", c.IsSession(), c.SubagentCostShare())
	}
	for name, h := range map[string]Hints{
		"class":      {Class: "auxiliary"},
		"agent":      {Agent: "a1"},
		"prompt":     {Prompt: "p"},
		"tool":       {Tools: []ToolRun{{"Bash", 1}}},
		"compaction": {Compacted: "manual"},
	} {
		hinted := plain
		hinted.Hints = h
		if c := figuresOf(plain, hinted); !c.IsSession() {
			t.Errorf("a call with a %s: not a session", name)
		}
	}
}

func TestClassLabel(t *testing.T) {
	for in, want := range map[string]string{"": "none", "none": "none", "main": "main", "warmup": "warmup",
		"other": "other", "brainstorm": "other", Overflow: "other"} {
		if got := ClassLabel(in); got != want {
			t.Errorf("ClassLabel(%q) = %q, want %q", in, got, want)
		}
	}
	for _, c := range llm.RequestClasses {
		if ClassLabel(c) != c {
			t.Errorf("listed class %q is not its own label", c)
		}
	}
}
