package proxy

import (
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/tollgate-llm/tollgate/conversation"
)

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

// TestAgentHintsAreReadFromEachAgentsHeaders: Claude Code's hint headers
// (with and without the hint flag), Codex's headers and client_metadata
// (its turn metadata's request_kind, turn, parent thread and compaction
// trigger), each to the same hints; values outside the closed sets are
// "other", ids are hashed, and nothing is read from a call without them.
func TestAgentHintsAreReadFromEachAgentsHeaders(t *testing.T) {
	cases := []struct {
		name string
		h    http.Header
		meta string
		want conversation.Hints
	}{
		{"nothing", hdr("User-Agent", "curl"), "", conversation.Hints{}},
		{"claude main with tools", hdr("x-claude-code-session-id", "s", "x-claude-code-request-class", "main",
			"x-claude-code-prompt-id", "p1", "x-claude-code-prev-tool-durations", "Bash=742;Read=9;mcp%3Bx=3"),
			"", conversation.Hints{Class: "main", Prompt: keyID("p1"),
				Tools: []conversation.ToolRun{{Name: "Bash", Millis: 742}, {Name: "Read", Millis: 9}, {Name: "mcp;x", Millis: 3}}}},
		{"claude subagent without the hint flag", hdr("x-claude-code-agent-id", "agent-7"), "",
			conversation.Hints{Class: "subagent", Agent: keyID("agent-7")}},
		{"claude nested subagent", hdr("x-claude-code-agent-id", "a2", "x-claude-code-parent-agent-id", "a1",
			"x-claude-code-request-class", "subagent", "x-claude-code-agent-type", "Explore"), "",
			conversation.Hints{Class: "subagent", Agent: keyID("a2"), Parent: keyID("a1"), AgentType: "Explore"}},
		{"claude compaction and after", hdr("x-claude-code-request-class", "compaction", "x-claude-code-compaction", "auto",
			"x-claude-code-context-compacted", "manual"), "",
			conversation.Hints{Class: "compaction", Compaction: "auto", Compacted: "manual"}},
		{"claude values outside the sets", hdr("x-claude-code-request-class", "brainstorm", "x-claude-code-agent-type", "my-own-agent",
			"x-claude-code-compaction", "sideways"), "",
			conversation.Hints{Class: "other", AgentType: "other", Compaction: "other"}},
		{"codex turn over HTTP", hdr("session-id", "s", "thread-id", "t1",
			"x-codex-turn-metadata", `{"request_kind":"turn","turn_id":"turn-1","workspaces":{"/home/me/repo":{}}}`), "",
			conversation.Hints{Class: "main", Prompt: keyID("turn-1")}},
		{"codex prewarm on a socket", hdr("session-id", "s"),
			`{"session_id":"s","thread_id":"t1","x-codex-turn-metadata":"{\"request_kind\":\"prewarm\",\"turn_id\":\"turn-1\"}"}`,
			conversation.Hints{Class: "warmup", Prompt: keyID("turn-1")}},
		{"codex subagent", hdr("thread-id", "t2", "x-codex-parent-thread-id", "t1", "x-openai-subagent", "review",
			"x-codex-turn-metadata", `{"request_kind":"turn","turn_id":"turn-9"}`), "",
			conversation.Hints{Class: "subagent", Agent: keyID("t2"), Parent: keyID("t1"), AgentType: "review", Prompt: keyID("turn-9")}},
		{"codex compaction", hdr("thread-id", "t1"),
			`{"x-codex-turn-metadata":"{\"request_kind\":\"auto_compact_fallback\",\"compaction\":{\"trigger\":\"manual\"}}"}`,
			conversation.Hints{Class: "compaction", Compaction: "manual"}},
		{"codex unknown request kind", hdr("thread-id", "t1", "x-codex-turn-metadata", `{"request_kind":"connection"}`), "",
			conversation.Hints{Class: "other"}},
		{"client_metadata overrides the headers", hdr("thread-id", "t-header", "x-codex-parent-thread-id", "p"),
			`{"thread_id":"t-body","x-codex-turn-metadata":"{\"request_kind\":\"turn\"}"}`,
			conversation.Hints{Class: "subagent", Agent: keyID("t-body"), Parent: keyID("p")}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var meta []byte
			if c.meta != "" {
				meta = []byte(c.meta)
			}
			got := readAgentCall(c.h, meta, "")
			if !reflect.DeepEqual(got.hints, c.want) {
				t.Errorf("hints\n%+v\nwant\n%+v", got.hints, c.want)
			}
		})
	}
	got := readAgentCall(http.Header{}, []byte(`{"session_id":"codex-session"}`), "user@example.com")
	if got.metaSession != "codex-session" || got.endUser != keyID("user@example.com") {
		t.Errorf("session %q, end user %q", got.metaSession, got.endUser)
	}
}

// TestToolDurationsAreBounded: at most 32 runs from at most 4 KiB, the
// malformed entries skipped.
func TestToolDurationsAreBounded(t *testing.T) {
	runs := toolRuns(strings.Repeat("Read=1;", 100))
	if len(runs) != maxToolRuns {
		t.Errorf("%d runs, want %d", len(runs), maxToolRuns)
	}
	runs = toolRuns("=5;Bash;Grep=x;Edit=-3;Write=7; Glob = 2")
	if !reflect.DeepEqual(runs, []conversation.ToolRun{{Name: "Write", Millis: 7}}) {
		t.Errorf("runs %+v", runs)
	}
	if runs := toolRuns(strings.Repeat("x", maxToolsHeader) + "=1"); len(runs) != 0 {
		t.Errorf("an entry past the header's cap: %+v", runs)
	}
}

// FuzzAgentHints: any headers and client_metadata give hints whose every
// value is bounded: hashed ids of 12 hex digits, closed-set values, at most
// maxToolRuns tool runs of non-negative durations.
func FuzzAgentHints(f *testing.F) {
	f.Add("main", "Bash=742;Read=9", `{"request_kind":"turn","turn_id":"t"}`, `{"thread_id":"t","session_id":"s"}`)
	f.Add("subagent", "%ZZ=1;a%3Db=2", `{"compaction":{"trigger":"auto"},"request_kind":"compaction"}`, `{"x-codex-turn-metadata":"{}"}`)
	f.Add("", strings.Repeat("T=1;", 40), `{"request_kind":`, `[]`)
	f.Fuzz(func(t *testing.T, class, tools, turnMeta, clientMeta string) {
		h := hdr("x-claude-code-request-class", class, "x-claude-code-prev-tool-durations", tools,
			"x-codex-turn-metadata", turnMeta, "thread-id", class, "x-codex-parent-thread-id", tools,
			"x-claude-code-agent-type", class, "x-claude-code-compaction", class)
		got := readAgentCall(h, []byte(clientMeta), tools).hints
		for _, id := range []string{got.Agent, got.Parent, got.Prompt} {
			if id != "" && (len(id) != 12 || strings.Trim(id, "0123456789abcdef") != "") {
				t.Errorf("id %q is not a hash", id)
			}
		}
		sets := []struct {
			v   string
			set []string
		}{{got.Class, requestClasses}, {got.AgentType, agentTypes}, {got.Compaction, compactionKinds}, {got.Compacted, compactionKinds}}
		for _, s := range sets {
			if s.v != "" && s.v != "other" && oneOf(s.v, s.set) != s.v {
				t.Errorf("%q is outside its set %q", s.v, s.set)
			}
		}
		if len(got.Tools) > maxToolRuns {
			t.Errorf("%d tool runs", len(got.Tools))
		}
		for _, r := range got.Tools {
			if r.Millis < 0 || r.Name == "" || len(r.Name) > maxToolsHeader {
				t.Errorf("tool run %+v", r)
			}
		}
	})
}

// BenchmarkAgentHints reads a call's hints: none (a plain SDK call's
// headers), Claude Code's hint headers, Codex's on a socket (the frame's
// client_metadata with its turn metadata).
func BenchmarkAgentHints(b *testing.B) {
	plain := hdr("User-Agent", "OpenAI/Go 3.98.0", "X-Stainless-Lang", "go")
	claude := hdr("X-Claude-Code-Session-Id", "0b9e7c1e-6a52-4d1c-9c6e-3b1f3f0d2a77",
		"X-Claude-Code-Request-Class", "subagent", "X-Claude-Code-Agent-Id", "7b7f0a52-1c38-4c2e-9d2e-5b1b2e3c4d5e",
		"X-Claude-Code-Agent-Type", "Explore", "X-Claude-Code-Prompt-Id", "1f4e0c9a-3b7d-4d58-a1a2-9e3c2b1a0f00",
		"X-Claude-Code-Prev-Tool-Durations", "Bash=742;Read=9;Grep=31")
	codexMeta := []byte(`{"session_id":"s-1","thread_id":"s-1","turn_id":"t-1","x-codex-turn-metadata":` +
		`"{\"request_kind\":\"turn\",\"turn_id\":\"t-1\",\"workspaces\":{\"/home/dev/repo\":{\"associated_remote_urls\":{\"origin\":\"git@github.com:acme/app.git\"},\"has_changes\":true}}}"}`)
	for _, c := range []struct {
		name string
		h    http.Header
		meta []byte
	}{{"none", plain, nil}, {"claude-code", claude, nil}, {"codex-socket", hdr("Session-Id", "s-1"), codexMeta}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = readAgentCall(c.h, c.meta, "")
			}
		})
	}
}
