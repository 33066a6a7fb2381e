package proxy

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/tollgate-llm/tollgate/conversation"
	"github.com/tollgate-llm/tollgate/internal/jsonscan"
	"github.com/tollgate-llm/tollgate/llm"
)

// Coding agents say what each of their calls is, in headers of their own:
// Claude Code's x-claude-code-* (its session, the agent that made the call
// and the one that spawned it, and with CLAUDE_CODE_GATEWAY_HINT_HEADERS=1
// the request class, agent type, compaction, and the tools run since the
// agent's previous call), Codex's session-id, thread-id and
// x-codex-turn-metadata (on a socket, in each frame's client_metadata).
// They are client-asserted: the gateway reports them, in a session's
// breakdown and the access log, and never decides identity, limits or
// authorization by them. Every value is bounded: ids are hashed, closed sets
// keep their listed values and name the rest "other", tool names are cut
// and counted at most maxToolRuns a call.

// agentCall is what a call's agent and body say of it.
type agentCall struct {
	hints conversation.Hints
	// metaSession is the session id of the body's client_metadata (Codex),
	// for the conversation's identity ("" when none).
	metaSession string
	// endUser is the end user the body names (Messages metadata.user_id,
	// OpenAI's user or safety_identifier), hashed; "" when none.
	endUser string
}

// The agents' headers, in canonical form.
const (
	hdrClaudeAgent      = "X-Claude-Code-Agent-Id"
	hdrClaudeParent     = "X-Claude-Code-Parent-Agent-Id"
	hdrClaudeClass      = "X-Claude-Code-Request-Class"
	hdrClaudeAgentType  = "X-Claude-Code-Agent-Type"
	hdrClaudeCompaction = "X-Claude-Code-Compaction"
	hdrClaudeCompacted  = "X-Claude-Code-Context-Compacted"
	hdrClaudeTools      = "X-Claude-Code-Prev-Tool-Durations"
	hdrClaudePrompt     = "X-Claude-Code-Prompt-Id"
	hdrCodexTurnMeta    = "X-Codex-Turn-Metadata"
	hdrCodexSubagent    = "X-Openai-Subagent"
	hdrCodexParent      = "X-Codex-Parent-Thread-Id"
	hdrCodexThread      = "Thread-Id"
)

// requestClasses are the classes a call may name (llm.RequestClasses);
// "" is none said.
var requestClasses = llm.RequestClasses

// The agent types kept by name: Claude Code's built-in types and kinds,
// Codex's subagent labels.
var agentTypes = []string{"Explore", "Plan", "general-purpose", "custom", "teammate", "fork",
	"review", "compact", "memory_consolidation", "collab_spawn"}

// The compaction kinds: Claude Code's triggers, and Codex's.
var compactionKinds = []string{"auto", "manual", "reactive"}

// maxToolRuns bounds the tool runs read from one call's header (Claude Code
// sends at most 32), maxToolsHeader the header read.
const (
	maxToolRuns    = 32
	maxToolsHeader = 4096
)

// readAgentCall reads a call's hints from its headers h and, on the
// Responses API, its body's client_metadata (clientMeta, an object span;
// nil for none), and the end user from endUser (its JSON value).
func readAgentCall(h http.Header, clientMeta []byte, endUser string) agentCall {
	var c agentCall
	c.endUser = hashedID(endUser)
	hints := &c.hints
	if v := headerValue(h, hdrClaudeAgent); v != "" {
		hints.Agent, hints.Class = hashedID(v), "subagent"
		hints.Parent = hashedID(headerValue(h, hdrClaudeParent))
	}
	if v := headerValue(h, hdrClaudeClass); v != "" {
		hints.Class = oneOf(v, requestClasses)
	}
	if v := headerValue(h, hdrClaudeAgentType); v != "" {
		hints.AgentType = oneOf(v, agentTypes)
	}
	if v := headerValue(h, hdrClaudeCompaction); v != "" {
		hints.Compaction = oneOf(v, compactionKinds)
	}
	if v := headerValue(h, hdrClaudeCompacted); v != "" {
		hints.Compacted = oneOf(v, compactionKinds)
	}
	hints.Prompt = hashedID(headerValue(h, hdrClaudePrompt))
	if v := headerValue(h, hdrClaudeTools); v != "" {
		hints.Tools = toolRuns(v)
	}
	codex := codexCallOf(h, clientMeta)
	c.metaSession = codex.session
	codex.hints(hints)
	return c
}

// headerValue is h's first value of the canonical name, trimmed.
func headerValue(h http.Header, name string) string {
	if v := h[name]; len(v) > 0 {
		return strings.TrimSpace(v[0])
	}
	return ""
}

// hashedID names a client's id in a breakdown, the access log and the admin
// API without repeating it: the first 12 hex digits of its SHA-256, as key
// ids are; "" for none.
func hashedID(id string) string {
	if id == "" {
		return ""
	}
	return keyID(id)
}

// oneOf is v when set lists it, else "other".
func oneOf(v string, set []string) string {
	for _, s := range set {
		if v == s {
			return s
		}
	}
	return "other"
}

// toolRuns parses Claude Code's x-claude-code-prev-tool-durations:
// "<name>=<ms>;<name>=<ms>", names percent-encoded, at most maxToolRuns
// entries of the first maxToolsHeader bytes; malformed entries are skipped.
func toolRuns(v string) []conversation.ToolRun {
	if len(v) > maxToolsHeader {
		v = v[:maxToolsHeader]
	}
	var runs []conversation.ToolRun
	for entry := range strings.SplitSeq(v, ";") {
		if len(runs) == maxToolRuns {
			break
		}
		name, ms, ok := strings.Cut(strings.TrimSpace(entry), "=")
		n, err := strconv.ParseInt(ms, 10, 64)
		if !ok || err != nil || n < 0 || name == "" {
			continue
		}
		if dec, err := url.PathUnescape(name); err == nil {
			name = dec
		}
		if runs == nil {
			runs = make([]conversation.ToolRun, 0, min(maxToolRuns, strings.Count(v, ";")+1))
		}
		runs = append(runs, conversation.ToolRun{Name: name, Millis: n})
	}
	return runs
}

// codexCall is what Codex says of a call: in headers over HTTP, and in the
// body's client_metadata (flat string keys, its canonical copy), which on a
// socket is all a turn carries.
type codexCall struct {
	session, thread, parent, subagent string
	// kind, turn and trigger are x-codex-turn-metadata's request_kind,
	// turn_id and compaction.trigger.
	kind, turn, trigger string
	seen                bool
}

// codexCallOf reads Codex's headers, then client_metadata's keys over them.
func codexCallOf(h http.Header, clientMeta []byte) codexCall {
	var c codexCall
	c.thread = headerValue(h, hdrCodexThread)
	c.parent = headerValue(h, hdrCodexParent)
	c.subagent = headerValue(h, hdrCodexSubagent)
	meta := headerValue(h, hdrCodexTurnMeta)
	c.seen = c.thread != "" || meta != ""
	it := jsonscan.Object(clientMeta)
	for len(clientMeta) > 0 && it.Next() {
		var dst *string
		switch {
		case it.KeyIs("session_id"):
			dst = &c.session
		case it.KeyIs("thread_id"):
			dst = &c.thread
		case it.KeyIs("x-codex-parent-thread-id"):
			dst = &c.parent
		case it.KeyIs("x-openai-subagent"):
			dst = &c.subagent
		case it.KeyIs("x-codex-turn-metadata"):
			dst = &meta
		default:
			continue
		}
		if s, ok := jsonText(it.Value()); ok {
			*dst, c.seen = s, true
		}
	}
	if meta != "" {
		c.readTurnMetadata([]byte(meta))
	}
	return c
}

// readTurnMetadata reads x-codex-turn-metadata's JSON: request_kind,
// turn_id, parent_thread_id and compaction.trigger. Its other fields
// (local paths, git remotes) are never kept.
func (c *codexCall) readTurnMetadata(meta []byte) {
	it := jsonscan.Object(meta)
	for it.Next() {
		switch {
		case it.KeyIs("request_kind"):
			c.kind, _ = jsonText(it.Value())
		case it.KeyIs("turn_id"):
			c.turn, _ = jsonText(it.Value())
		case it.KeyIs("parent_thread_id") && c.parent == "":
			c.parent, _ = jsonText(it.Value())
		case it.KeyIs("compaction") && it.Kind() == jsonscan.KindObject:
			if v, ok := jsonscan.Get(it.Value(), "trigger"); ok {
				c.trigger, _ = jsonText(v)
			}
		}
	}
}

// hints folds what Codex said into h, where Claude Code's headers left it
// empty: a thread with a parent is a subagent (the agent, its parent
// thread its parent), request_kind the class, turn_id the prompt.
func (c *codexCall) hints(h *conversation.Hints) {
	if !c.seen {
		return
	}
	if h.Agent == "" && c.parent != "" && c.thread != "" {
		h.Agent, h.Parent = hashedID(c.thread), hashedID(c.parent)
	}
	if h.AgentType == "" && c.subagent != "" {
		h.AgentType = oneOf(c.subagent, agentTypes)
	}
	if h.Prompt == "" {
		h.Prompt = hashedID(c.turn)
	}
	if h.Class != "" && h.Class != "subagent" {
		return
	}
	switch c.kind {
	case "":
		if h.Class == "" && c.subagent == "compact" {
			h.Class = "compaction"
		}
	case "turn":
		if h.Class == "" {
			h.Class = "main"
			if c.parent != "" || c.subagent != "" {
				h.Class = "subagent"
			}
		}
	case "prewarm":
		h.Class = "warmup"
	case "compaction", "auto_compact_fallback":
		h.Class = "compaction"
		if h.Compaction == "" {
			h.Compaction = "auto"
			if c.trigger != "" {
				h.Compaction = oneOf(c.trigger, compactionKinds)
			}
		}
	case "memory":
		h.Class = "auxiliary"
	default:
		h.Class = "other"
	}
}
