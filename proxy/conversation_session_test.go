package proxy

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/conversation"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
)

// claudeCall is one call of a recorded Claude Code session: the headers
// Claude Code 2.1.283 sends with CLAUDE_CODE_GATEWAY_HINT_HEADERS=1 (the
// session's, a subagent's and its parent's, the class, type, compaction
// and tool durations), and the end user of its body's metadata.
type claudeCall struct {
	hdr map[string]string
}

// claudeSession is a main loop serving two prompts, which spawns an
// Explore subagent (itself spawning a general-purpose one), runs tools,
// compacts its context and goes on after it, with a title request on the
// side.
var claudeSession = []claudeCall{
	{map[string]string{"x-claude-code-request-class": "main", "x-claude-code-prompt-id": "prompt-1"}},
	{map[string]string{"x-claude-code-request-class": "auxiliary"}},
	{map[string]string{"x-claude-code-request-class": "main", "x-claude-code-prompt-id": "prompt-1",
		"x-claude-code-prev-tool-durations": "Bash=742;Read=9"}},
	{map[string]string{"x-claude-code-request-class": "subagent", "x-claude-code-agent-id": "agent-explore",
		"x-claude-code-agent-type": "Explore", "x-claude-code-prompt-id": "prompt-1"}},
	{map[string]string{"x-claude-code-request-class": "subagent", "x-claude-code-agent-id": "agent-explore",
		"x-claude-code-agent-type": "Explore", "x-claude-code-prompt-id": "prompt-1",
		"x-claude-code-prev-tool-durations": "Grep=31;Glob=4"}},
	{map[string]string{"x-claude-code-request-class": "subagent", "x-claude-code-agent-id": "agent-helper",
		"x-claude-code-parent-agent-id": "agent-explore", "x-claude-code-agent-type": "general-purpose",
		"x-claude-code-prompt-id": "prompt-1"}},
	{map[string]string{"x-claude-code-request-class": "main", "x-claude-code-prompt-id": "prompt-1",
		"x-claude-code-prev-tool-durations": "Task=5210"}},
	{map[string]string{"x-claude-code-request-class": "compaction", "x-claude-code-compaction": "auto",
		"x-claude-code-prompt-id": "prompt-2"}},
	{map[string]string{"x-claude-code-request-class": "main", "x-claude-code-context-compacted": "auto",
		"x-claude-code-prompt-id": "prompt-2"}},
	{map[string]string{"x-claude-code-request-class": "main", "x-claude-code-prompt-id": "prompt-2",
		"x-claude-code-prev-tool-durations": "Edit=12;Bash=1500"}},
}

// TestClaudeCodeSessionIsOneConversationWithItsBreakdown: a Claude Code
// session's calls, sent through the Anthropic SDK with the headers Claude
// Code sends, are one conversation named by x-claude-code-session-id with
// no configuration but the conversation layer on: each record names it,
// its source, class and agent; the admin API shows its calls by class (cost
// = Σ of their records), the agent tree, the tools, the compaction's
// tokens before and after, two user turns and where its time went.
func TestClaudeCodeSessionIsOneConversationWithItsBreakdown(t *testing.T) {
	w := newGovWorld(t, mockllm.Options{OutputTokens: 3}, false, func(c *config.Config) {
		conversationsOn(c)
		c.Admin.TokenEnv, c.Admin.Token = "ADMIN_TOKEN", adminToken
	})
	ctx := testCtx(t)
	const session = "0b9e7c1e-6a52-4d1c-9c6e-3b1f3f0d2a77"
	byClass := map[string]int64{}
	var cost int64
	var inputs []int64
	for i, call := range claudeSession {
		opts := []aoption.RequestOption{aoption.WithHeader("x-claude-code-session-id", session)}
		for k, v := range call.hdr {
			opts = append(opts, aoption.WithHeader(k, v))
		}
		p := messageParams(16)
		p.Metadata = anthropic.MetadataParam{UserID: anthropic.String(`{"device_id":"d1","account_uuid":"","session_id":"` + session + `"}`)}
		if _, err := w.anthropic(keyAlpha, opts...).Messages.New(ctx, p); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		rec := w.tg.record(t)
		if rec.Conversation != conversation.Key("team:search", session) || rec.ConversationSource != "x-claude-code-session-id" ||
			rec.RequestClass != call.hdr["x-claude-code-request-class"] {
			t.Errorf("call %d: conversation %q from %q, class %q", i, rec.Conversation, rec.ConversationSource, rec.RequestClass)
		}
		if id := call.hdr["x-claude-code-agent-id"]; (id != "") != (rec.Agent != "") || rec.Agent != "" && rec.Agent != keyID(id) {
			t.Errorf("call %d: agent %q for %q", i, rec.Agent, id)
		}
		byClass[rec.RequestClass] += rec.CostMicros
		cost += rec.CostMicros
		inputs = append(inputs, rec.Usage.Input)
	}

	admin := map[string]string{"Authorization": "Bearer " + adminToken}
	var rep ConversationReport
	status, body := send(t, "GET", w.tg.URL+"/admin/conversations/"+session+"?team=search", "", admin)
	if status != http.StatusOK || json.Unmarshal(body, &rep) != nil {
		t.Fatalf("admin GET: %d %s", status, body)
	}
	s := rep.Session
	if rep.Turns != int64(len(claudeSession)) || rep.CostMicros != cost || rep.KeyID != "alpha" ||
		rep.User != keyID(`{"device_id":"d1","account_uuid":"","session_id":"`+session+`"}`) {
		t.Errorf("session turns %d cost %d key %q user %q", rep.Turns, rep.CostMicros, rep.KeyID, rep.User)
	}
	for class, want := range byClass {
		if got := s.Classes[class]; got.CostMicros != want {
			t.Errorf("class %s cost %d, its records %d", class, got.CostMicros, want)
		}
	}
	if s.Classes["main"].Calls != 5 || s.Classes["subagent"].Calls != 3 || s.Classes["compaction"].Calls != 1 ||
		s.Classes["auxiliary"].Calls != 1 || len(s.Classes) != 4 {
		t.Errorf("classes %+v", s.Classes)
	}
	explore, helper := keyID("agent-explore"), keyID("agent-helper")
	if len(s.Agents) != 2 {
		t.Fatalf("agents %+v", s.Agents)
	}
	for _, a := range s.Agents {
		switch a.ID {
		case explore:
			if a.Parent != "" || a.Type != "Explore" || a.Calls.Calls != 2 {
				t.Errorf("the Explore agent %+v", a)
			}
		case helper:
			if a.Parent != explore || a.Type != "general-purpose" || a.Calls.Calls != 1 {
				t.Errorf("the helper agent %+v (parent should be %s)", a, explore)
			}
		default:
			t.Errorf("agent %+v", a)
		}
	}
	if s.Tools["Bash"] != (conversation.Tool{Runs: 2, Millis: 2242}) || s.Tools["Task"].Millis != 5210 || len(s.Tools) != 6 {
		t.Errorf("tools %+v", s.Tools)
	}
	if c := s.Compactions["auto"]; c.Calls != 1 || c.TokensBefore != inputs[7] || c.After != 1 || c.TokensAfter != inputs[8] {
		t.Errorf("compaction %+v; inputs %v", c, inputs)
	}
	if s.UserTurns != 2 {
		t.Errorf("%d user turns, want 2", s.UserTurns)
	}
	if share := float64(byClass["subagent"]) / float64(cost); s.SubagentCostShare != share {
		t.Errorf("subagent cost share %v, want %v", s.SubagentCostShare, share)
	}
	tm := s.Time
	if tm.ToolSeconds != 7.508 || tm.ModelSeconds <= 0 || tm.TTFTSeconds > tm.ModelSeconds || tm.WallSeconds < tm.ModelSeconds-1e-3 {
		t.Errorf("time %+v", tm)
	}
}

// TestSessionSourcesFollowTheIdentityOrder: the first source of
// [conversations] identity that names a conversation names it, and the
// record says which; a configured order puts the application's header
// first.
func TestSessionSourcesFollowTheIdentityOrder(t *testing.T) {
	cases := []struct {
		name     string
		identity []string
		hdr      map[string]string
		id, src  string
	}{
		{"Claude Code's header over the application's", nil,
			map[string]string{"X-Conversation-Id": "app-1", "x-claude-code-session-id": "cc-1"}, "cc-1", "x-claude-code-session-id"},
		{"Codex's session-id", nil, map[string]string{"session-id": "cx-1", "thread-id": "t"}, "cx-1", "session-id"},
		{"Codex's older session_id", nil, map[string]string{"session_id": "cx-0"}, "cx-0", "session_id"},
		{"baggage", nil, map[string]string{"Baggage": "session.id=b-1"}, "b-1", "baggage"},
		{"the application's header first", []string{"header", "x-claude-code-session-id"},
			map[string]string{"X-Conversation-Id": "app-1", "x-claude-code-session-id": "cc-1"}, "app-1", "x-conversation-id"},
		{"a source not listed names none", []string{"header"}, map[string]string{"session-id": "cx-1"}, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := newGovWorld(t, mockllm.Options{}, false, func(cfg *config.Config) {
				conversationsOn(cfg)
				if c.identity != nil {
					cfg.Conversations.Identity = c.identity
				}
			})
			var opts []aoption.RequestOption
			for k, v := range c.hdr {
				opts = append(opts, aoption.WithHeader(k, v))
			}
			if _, err := w.anthropic(keyAlpha, opts...).Messages.New(testCtx(t), messageParams(8)); err != nil {
				t.Fatal(err)
			}
			rec := w.tg.record(t)
			want := ""
			if c.id != "" {
				want = conversation.Key("team:search", c.id)
			}
			if rec.Conversation != want || rec.ConversationSource != c.src {
				t.Errorf("conversation %q from %q; want %q from %q", rec.Conversation, rec.ConversationSource, want, c.src)
			}
			if rec.Outcome != llm.OutcomeOK {
				t.Errorf("outcome %s", rec.Outcome)
			}
		})
	}
}

// TestCodexSessionOverTheSocketIsOneConversation: Codex's turns on one
// Responses WebSocket are its session's, named by the upgrade's session-id;
// each turn's class comes from its frame's client_metadata (its warm-up a
// "warmup", its turn "main"), and the turn id is its user turn.
func TestCodexSessionOverTheSocketIsOneConversation(t *testing.T) {
	up := httptest.NewServer(mockllm.New(mockllm.Options{OutputTokens: 3}))
	t.Cleanup(up.Close)
	tg := newTestGatewayWith(t, up.URL, func(c *config.Config) {
		c.Upstreams[0].ResponsesWebSocket = true
		conversationsOn(c)
	}, func(o *Options) { o.Conversations = newConversations(t, o.Config.Conversations, nil) })
	ctx := testCtx(t)
	client := openai.NewClient(option.WithBaseURL(tg.URL+"/v1/"), option.WithAPIKey("sk-caller"), option.WithMaxRetries(0),
		option.WithHeader("session-id", "codex-s1"), option.WithHeader("thread-id", "codex-s1"))
	conn, err := client.Beta.Responses.Connect(ctx, openai.BetaResponseConnectionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	meta := func(kind string) string {
		return `"client_metadata":{"session_id":"codex-s1","thread_id":"codex-s1","turn_id":"turn-1",` +
			`"x-codex-turn-metadata":"{\"request_kind\":\"` + kind + `\",\"turn_id\":\"turn-1\",\"workspaces\":{\"/home/dev/repo\":{}}}"}`
	}
	warm := `{"type":"response.create","model":"gpt-4.1","input":"hi","store":false,"generate":false,` + meta("prewarm") + `}`
	turn := `{"type":"response.create","model":"gpt-4.1","input":"hi","store":false,` + meta("turn") + `}`
	var key string
	for i, ev := range []string{warm, turn} {
		evs := sendTurn(t, ctx, conn, ev)
		if last := evs[len(evs)-1]; last.Type != "response.completed" {
			t.Fatalf("turn %d ended %q", i, last.Type)
		}
		rec := tg.record(t)
		want := []string{"warmup", "main"}[i]
		if rec.Conversation != conversation.Key("", "codex-s1") || rec.ConversationSource != "session-id" || rec.RequestClass != want {
			t.Errorf("turn %d: conversation %q from %q, class %q (want %s)", i, rec.Conversation, rec.ConversationSource, rec.RequestClass, want)
		}
		key = rec.Conversation
	}
	c, err := tg.gw.conv.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if c.Turns != 2 || c.Breakdown.Classes["warmup"].Calls != 1 || c.Breakdown.Classes["main"].Calls != 1 || c.Breakdown.Prompts != 1 {
		t.Errorf("session %+v classes %+v prompts %d", c, c.Breakdown.Classes, c.Breakdown.Prompts)
	}
}

// TestRecordedClaudeCodeSessionReplays: the headers of a real Claude Code
// session (testdata/claude-code-session.json: a main turn that ran an
// Explore subagent, a manual compaction, and a turn after it), sent again
// through the gateway, make the session's breakdown: the classes, the
// subagent, the Agent tool's run, the compaction's calls and their input,
// the two user prompts.
func TestRecordedClaudeCodeSessionReplays(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "claude-code-session.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Calls []struct {
			Headers map[string]string `json:"headers"`
		} `json:"calls"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	w := newGovWorld(t, mockllm.Options{OutputTokens: 3}, false, func(c *config.Config) {
		conversationsOn(c)
		c.Admin.TokenEnv, c.Admin.Token = "ADMIN_TOKEN", adminToken
	})
	ctx := testCtx(t)
	var session string
	var compactionInput int64
	for i, call := range doc.Calls {
		var opts []aoption.RequestOption
		for k, v := range call.Headers {
			opts = append(opts, aoption.WithHeader(k, v))
		}
		session = call.Headers["x-claude-code-session-id"]
		if _, err := w.anthropic(keyAlpha, opts...).Messages.New(ctx, messageParams(16)); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if rec := w.tg.record(t); rec.RequestClass == "compaction" {
			compactionInput += rec.Usage.Input
		}
	}
	var rep ConversationReport
	status, body := send(t, "GET", w.tg.URL+"/admin/conversations/"+session+"?team=search", "",
		map[string]string{"Authorization": "Bearer " + adminToken})
	if status != http.StatusOK || json.Unmarshal(body, &rep) != nil {
		t.Fatalf("admin GET: %d %s", status, body)
	}
	s := rep.Session
	if rep.Turns != 6 || s.Classes["main"].Calls != 3 || s.Classes["subagent"].Calls != 1 || s.Classes["compaction"].Calls != 2 {
		t.Errorf("turns %d, classes %+v", rep.Turns, s.Classes)
	}
	if len(s.Agents) != 1 || s.Agents[0].ID != keyID("a0c208974d88d6934") || s.Agents[0].Type != "Explore" ||
		s.Agents[0].Parent != "" || s.Agents[0].Calls.Calls != 1 {
		t.Errorf("agents %+v", s.Agents)
	}
	if s.Tools["Agent"] != (conversation.Tool{Runs: 1, Millis: 172}) || len(s.Tools) != 1 {
		t.Errorf("tools %+v", s.Tools)
	}
	if c := s.Compactions["manual"]; c.Calls != 2 || c.TokensBefore != compactionInput || compactionInput == 0 {
		t.Errorf("compactions %+v; the compaction calls' input %d", s.Compactions, compactionInput)
	}
	if s.UserTurns != 2 {
		t.Errorf("%d user turns, want the 2 prompts", s.UserTurns)
	}
}
