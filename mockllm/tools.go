package mockllm

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/tollgate-llm/tollgate/llm"
)

// toolCallHeader asks for a tool call: "1" for the first offered tool, or
// a tool's name (package doc, Tool calls).
const toolCallHeader = "X-Mock-Tool-Call"

// pickTool decides whether the answer calls a tool, and which: it returns
// the tool's name, or "" for a text answer (package doc, Tool calls). A
// coding agent offers tools on every request and runs every call it gets,
// so a mock that called a tool whenever one was offered kept it looping
// for ever; a call is therefore only made when asked for, and never right
// after a tool result. pickTool returns an error, for a 400, when the
// X-Mock-Tool-Call header names a tool the request does not offer.
func (x *exchange) pickTool(body []byte) (string, error) {
	if len(x.req.Tools) == 0 {
		return "", nil
	}
	names := x.req.toolNames()
	asked := x.p.toolCall
	if asked != "" && asked != "1" && !slices.Contains(names, asked) {
		return "", fmt.Errorf("mockllm: header %s %q: no offered tool has that name (want 1 or one of %q)",
			toolCallHeader, asked, names)
	}
	text, toolResult := lastTurn(x.dialect, body, x.req.Input)
	switch {
	case toolResult:
		return "", nil
	case asked == "1":
		return x.req.toolName(), nil
	case asked != "":
		return asked, nil
	}
	for _, name := range names {
		if namesWord(text, name) {
			return name, nil
		}
	}
	return "", nil
}

// toolNames returns the names of the offered tools, in their order, less
// the tools without one (a Responses built-in tool such as web_search).
func (r *request) toolNames() []string {
	names := make([]string, 0, len(r.Tools))
	for _, t := range r.Tools {
		name := t.Name
		if t.Function != nil && t.Function.Name != "" {
			name = t.Function.Name
		}
		if name != "" {
			names = append(names, name)
		}
	}
	return names
}

// turn is what pickTool reads of a Chat Completions or Messages message, or
// of a Responses input item.
type turn struct {
	Type    string          `json:"type"` // Responses
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// part is a content part (Chat Completions, Responses) or block (Messages).
type part struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// lastTurn reads a request's input: the text of its last user message, and
// whether its last item is a tool result. Chat Completions and Messages
// carry it in "messages", the Responses API in "input" (a string is one
// user message).
func lastTurn(d llm.Dialect, body []byte, input json.RawMessage) (text string, toolResult bool) {
	var turns []turn
	if d == llm.DialectResponses {
		if json.Unmarshal(input, &text) == nil {
			return text, false
		}
		_ = json.Unmarshal(input, &turns)
	} else {
		var b struct {
			Messages []turn `json:"messages"`
		}
		_ = json.Unmarshal(body, &b)
		turns = b.Messages
	}
	if len(turns) == 0 {
		return "", false
	}
	if turns[len(turns)-1].isToolResult() {
		return "", true
	}
	for i := len(turns) - 1; i >= 0; i-- {
		if t := &turns[i]; t.Role == "user" && (t.Type == "" || t.Type == "message") {
			return t.text(), false
		}
	}
	return "", false
}

// isToolResult reports whether t hands a tool's result back: a Chat
// Completions message with role tool (or the older function), a Responses
// item whose type ends in _call_output (function_call_output,
// custom_tool_call_output, ...), or a Messages user message holding a
// tool_result block (which may come with text blocks, as Claude Code's
// reminders do).
func (t *turn) isToolResult() bool {
	if t.Role == "tool" || t.Role == "function" || strings.HasSuffix(t.Type, "_call_output") {
		return true
	}
	return slices.ContainsFunc(t.parts(), func(p part) bool { return p.Type == "tool_result" })
}

// parts returns t's content parts; none when the content is a string.
func (t *turn) parts() []part {
	var ps []part
	_ = json.Unmarshal(t.Content, &ps)
	return ps
}

// text returns t's text: a string content, or its text parts (Chat
// Completions and Messages "text", Responses "input_text") a line each.
func (t *turn) text() string {
	var s string
	if json.Unmarshal(t.Content, &s) == nil {
		return s
	}
	var b strings.Builder
	for _, p := range t.parts() {
		if p.Type == "text" || p.Type == "input_text" {
			b.WriteString(p.Text)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// namesWord reports whether text contains name as a word: case-sensitive,
// and not inside a longer name (no ASCII letter, digit, '_' or '-' on
// either side), so "get_weather" does not name a tool "get" nor "read-only"
// one named "read".
func namesWord(text, name string) bool {
	for i := 0; ; {
		j := strings.Index(text[i:], name)
		if j < 0 {
			return false
		}
		start, end := i+j, i+j+len(name)
		if (start == 0 || !isNameByte(text[start-1])) && (end == len(text) || !isNameByte(text[end])) {
			return true
		}
		i = start + 1
	}
}

// isNameByte reports whether c may be part of a tool name.
func isNameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}
