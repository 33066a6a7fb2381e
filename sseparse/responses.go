package sseparse

import (
	"bytes"

	"github.com/tollgate-llm/tollgate/internal/jsonscan"
	"github.com/tollgate-llm/tollgate/llm"
)

// responsesKind is the closed set of Responses API event types the decoder
// acts on.
type responsesKind uint8

const (
	rkOther       responsesKind = iota
	rkDelta                     // a *.delta event that carries generated output when its delta is a non-empty string
	rkLegacyDelta               // response.reasoning.delta, response.reasoning_summary.delta: an object delta
	rkItemAdded                 // response.output_item.added: a tool call's generated name
	rkCreated                   // response.created: names the response
	rkCompleted                 // response.completed
	rkIncomplete                // response.incomplete
	rkFailed                    // response.failed
	rkError                     // error
)

// responsesKindOf names an event type. The token-bearing deltas are the
// SDKs' (openai-python's ResponseStreamEvent, 2026-08) plus the legacy
// reasoning names (whose delta was an object); any other type ending in
// ".delta" whose delta is a non-empty string counts too, so that a new kind of output is not missed,
// except the shell tool's output, which is no model output.
func responsesKindOf(t []byte) responsesKind {
	switch string(t) {
	case "response.output_text.delta", "response.refusal.delta",
		"response.function_call_arguments.delta", "response.custom_tool_call_input.delta",
		"response.mcp_call_arguments.delta", "response.code_interpreter_call_code.delta",
		"response.shell_call_command.delta",
		"response.reasoning_summary_text.delta", "response.reasoning_text.delta",
		"response.audio.delta", "response.audio.transcript.delta":
		return rkDelta
	case "response.reasoning.delta", "response.reasoning_summary.delta":
		return rkLegacyDelta
	case "response.shell_call_output_content.delta":
		return rkOther
	case "response.output_item.added":
		return rkItemAdded
	case "response.created":
		return rkCreated
	case "response.completed":
		return rkCompleted
	case "response.incomplete":
		return rkIncomplete
	case "response.failed":
		return rkFailed
	case "error":
		return rkError
	}
	if bytes.HasSuffix(t, []byte(".delta")) {
		return rkDelta
	}
	return rkOther
}

// responsesEvent holds the spans of the top-level members the decoder reads.
type responsesEvent struct {
	typ, delta, item, response, err, code, seq []byte
}

// DecodeResponses decodes one Responses API stream event into o, resetting
// it first. It dispatches on the data's "type", as the SDKs do (the
// `event:` name is the same on the wire). Token-bearing: a delta of
// generated output with a non-empty string delta, and the
// response.output_item.added of a function, custom tool or MCP call, whose
// generated name comes with it. Terminal: response.completed,
// response.incomplete (Incomplete, with its reason) and response.failed
// (also an error, typed by its error.code); usage comes from the terminal
// event's response.usage. Every event's sequence_number is read, and
// response.created's response id. An `error` event (by its data's type or its
// `event:` name) is an error typed by its nested error.code (or type), or by
// its flat code. There is no [DONE] on this API:
// it, keepalive and every status event observe nothing. A nil ev leaves o
// empty.
func DecodeResponses(ev *Event, o *Observation) {
	*o = Observation{}
	if ev == nil {
		return
	}
	var e responsesEvent
	if !e.read(ev.Data) {
		// A half-read event must not count; the event name alone still
		// says "error".
		o.Error = bytes.Equal(ev.Type, []byte("error"))
		return
	}
	kind := rkOther
	if s, ok := jsonscan.String(e.typ); ok && bytes.IndexByte(s, '\\') < 0 {
		kind = responsesKindOf(s)
	} else if ok {
		var buf [64]byte // every name acted on is shorter
		if len(s) <= len(buf) {
			kind = responsesKindOf(jsonscan.AppendUnescape(buf[:0], s))
		}
	}
	if bytes.Equal(ev.Type, []byte("error")) {
		kind = rkError // the event name says so, whatever the data's type
	}
	o.Sequence, o.HasSequence = jsonscan.Int(e.seq)
	switch kind {
	case rkCreated:
		if jsonscan.KindOf(e.response) == jsonscan.KindObject {
			id, _ := jsonscan.Get(e.response, "id")
			o.ResponseID, _ = jsonscan.String(id)
		}
	case rkLegacyDelta:
		o.TokenBearing = jsonscan.NonEmptyString(e.delta) || nonEmptyContainer(e.delta)
	case rkDelta:
		o.TokenBearing = jsonscan.NonEmptyString(e.delta)
	case rkItemAdded:
		o.TokenBearing = toolCallNamed(e.item)
	case rkCompleted, rkIncomplete, rkFailed:
		o.Terminal = true
		responseEnd(e.response, kind, o)
	case rkError:
		o.Error = true
		o.ErrorType = flatErrorType(e.err, e.code)
	}
	if o.TokenBearing {
		o.Tokens = 1
	}
}

// read walks the event's data once, validating it whole, and keeps the
// spans of the members the decoder reads; false when b is not one
// well-formed JSON object. When a key repeats, the last one counts.
func (e *responsesEvent) read(b []byte) bool {
	i := jsonscan.SkipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i++
	for first := true; ; first = false {
		key, esc, v, more, ok := jsonscan.Member(b, i, first)
		if !ok {
			return false
		}
		if !more {
			return jsonscan.SkipWS(b, v) == len(b)
		}
		if i, ok = jsonscan.Skip(b, v, 1); !ok {
			return false
		}
		switch val := b[v:i]; {
		case jsonscan.KeyEq(key, esc, "type"):
			e.typ = val
		case jsonscan.KeyEq(key, esc, "delta"):
			e.delta = val
		case jsonscan.KeyEq(key, esc, "item"):
			e.item = val
		case jsonscan.KeyEq(key, esc, "response"):
			e.response = val
		case jsonscan.KeyEq(key, esc, "error"):
			e.err = val
		case jsonscan.KeyEq(key, esc, "code"):
			e.code = val
		case jsonscan.KeyEq(key, esc, "sequence_number"):
			e.seq = val
		}
	}
}

// toolCallNamed reports whether item, an output item just added, is a call
// whose name the model generated: a function_call, custom_tool_call or
// mcp_call with a non-empty name.
func toolCallNamed(item []byte) bool {
	if jsonscan.KindOf(item) != jsonscan.KindObject {
		return false
	}
	typ, name := span{-1, 0}, span{-1, 0}
	it := jsonscan.Object(item)
	for it.Next() {
		switch {
		case it.KeyIs("type"):
			typ = span{it.Offset(), len(it.Value())}
		case it.KeyIs("name"):
			name = span{it.Offset(), len(it.Value())}
		}
	}
	s, ok := jsonscan.String(typ.of(item))
	if it.Err() != nil || !ok || !jsonscan.NonEmptyString(name.of(item)) {
		return false
	}
	return jsonscan.Equal(s, "function_call") || jsonscan.Equal(s, "custom_tool_call") || jsonscan.Equal(s, "mcp_call")
}

// responseEnd reads a terminal event's response object: its usage, and for
// response.incomplete the reason, for response.failed the error code.
func responseEnd(resp []byte, kind responsesKind, o *Observation) {
	if kind == rkFailed {
		o.Error = true
	}
	o.Incomplete = kind == rkIncomplete
	if jsonscan.KindOf(resp) != jsonscan.KindObject {
		return
	}
	details, failure := span{-1, 0}, span{-1, 0}
	it := jsonscan.Object(resp)
	for it.Next() {
		switch {
		case it.KeyIs("usage") && it.Kind() == jsonscan.KindObject:
			u := it.Enter()
			o.usage = responsesUsage(&u)
		case kind == rkIncomplete && it.KeyIs("incomplete_details"):
			details = span{it.Offset(), len(it.Value())}
		case kind == rkFailed && it.KeyIs("error"):
			failure = span{it.Offset(), len(it.Value())}
		}
	}
	if it.Err() != nil {
		o.usage = usageReport{}
		return
	}
	if d := details.of(resp); jsonscan.KindOf(d) == jsonscan.KindObject {
		if r, ok := jsonscan.Get(d, "reason"); ok {
			o.IncompleteReason, _ = jsonscan.String(r)
		}
	}
	if f := failure.of(resp); jsonscan.KindOf(f) == jsonscan.KindObject {
		o.ErrorType = codeOrType(f)
	}
}

// responsesUsage reads a Responses usage object: input_tokens (cached
// included), output_tokens (reasoning included), and their details.
func responsesUsage(it *jsonscan.Iter) (u usageReport) {
	u.has = hasObject
	for it.Next() {
		switch {
		case it.KeyIs("input_tokens"):
			u.setInt(&u.input, hasInput, it.Value())
		case it.KeyIs("output_tokens"):
			u.setInt(&u.output, hasOutput, it.Value())
		case it.KeyIs("input_tokens_details") && it.Kind() == jsonscan.KindObject:
			d := it.Enter()
			for d.Next() {
				switch {
				case d.KeyIs("cached_tokens"):
					u.setInt(&u.cacheRead, hasCacheRead, d.Value())
				case d.KeyIs("cache_write_tokens"):
					u.setInt(&u.cacheWrite, hasCacheWrite, d.Value())
				}
			}
		case it.KeyIs("output_tokens_details") && it.Kind() == jsonscan.KindObject:
			d := it.Enter()
			for d.Next() {
				if d.KeyIs("reasoning_tokens") {
					u.setInt(&u.reasoning, hasReasoning, d.Value())
				}
			}
		}
	}
	if it.Err() != nil {
		return usageReport{}
	}
	return u
}

// codeOrType is the code of an error object e (an open string: recordings
// carry codes outside the SDK's enum), else its type: the code is what names
// the failure on this API ("rate_limit_exceeded" comes with type "tokens").
func codeOrType(e []byte) []byte {
	code, typ := span{-1, 0}, span{-1, 0}
	it := jsonscan.Object(e)
	for it.Next() {
		switch {
		case it.KeyIs("code"):
			code = span{it.Offset(), len(it.Value())}
		case it.KeyIs("type"):
			typ = span{it.Offset(), len(it.Value())}
		}
	}
	if it.Err() != nil {
		return nil
	}
	return codeOr(code.of(e), typ.of(e))
}

// codeOr is code when it is a non-empty string or a number (vLLM sends
// integers), else typ when it is a non-empty string.
func codeOr(code, typ []byte) []byte {
	if s, ok := jsonscan.String(code); ok && len(s) > 0 {
		return s
	}
	if jsonscan.KindOf(code) == jsonscan.KindNumber {
		return code
	}
	if s, ok := jsonscan.String(typ); ok && len(s) > 0 {
		return s
	}
	return nil
}

// span locates a value in the buffer an Iter walks (off -1: none). Keeping
// offsets rather than slices of the iterator's values keeps the iterator on
// the stack.
type span struct{ off, n int }

func (s span) of(b []byte) []byte {
	if s.off < 0 {
		return nil
	}
	return b[s.off : s.off+s.n]
}

// flatErrorType types an `error` event: the nested form
// {"type":"error","error":{"code","type",...}} by its error's code (or
// type), the documented flat form {"type":"error","code",...} by its code.
func flatErrorType(nested, code []byte) []byte {
	if jsonscan.KindOf(nested) == jsonscan.KindObject {
		return codeOrType(nested)
	}
	return codeOr(code, nil)
}

// nonEmptyContainer reports whether v is an object or array with at least
// one member.
func nonEmptyContainer(v []byte) bool {
	var it jsonscan.Iter
	switch jsonscan.KindOf(v) {
	case jsonscan.KindObject:
		it = jsonscan.Object(v)
	case jsonscan.KindArray:
		it = jsonscan.Array(v)
	default:
		return false
	}
	return it.Next()
}

// ResponsesAnswer is what a non-streamed Responses API body says of how it
// ended, read in one walk of the body.
type ResponsesAnswer struct {
	// Usage is the top-level usage (input_tokens with the cached ones,
	// output_tokens with the reasoning ones); HasUsage is false without it.
	Usage    llm.Usage
	HasUsage bool
	// Failed reports status "failed", Code its error's code (else type).
	Failed bool
	Code   []byte
	// IncompleteReason is incomplete_details.reason of status "incomplete".
	IncompleteReason []byte
}

// ReadResponsesAnswer reads a non-streamed Responses API body. Code and
// IncompleteReason are raw JSON string contents aliasing body. Like the
// other body readers it keeps what it found before a body cut short.
func ReadResponsesAnswer(body []byte) (a ResponsesAnswer) {
	var u usageReport
	status, details, failure := span{-1, 0}, span{-1, 0}, span{-1, 0}
	it := jsonscan.Object(body)
	for it.Next() {
		switch {
		case it.KeyIs("usage"):
			u = usageReport{}
			if it.Kind() == jsonscan.KindObject {
				child := it.Enter()
				u = responsesUsage(&child)
			}
		case it.KeyIs("status"):
			status = span{it.Offset(), len(it.Value())}
		case it.KeyIs("incomplete_details"):
			details = span{it.Offset(), len(it.Value())}
		case it.KeyIs("error"):
			failure = span{it.Offset(), len(it.Value())}
		}
	}
	a.Usage = u.normalize(llm.DialectResponses)
	a.HasUsage = a.Usage.HasInput || a.Usage.HasOutput
	st, _ := jsonscan.String(status.of(body))
	switch {
	case jsonscan.Equal(st, "failed"):
		a.Failed = true
		if e := failure.of(body); jsonscan.KindOf(e) == jsonscan.KindObject {
			a.Code = codeOrType(e)
		}
	case jsonscan.Equal(st, "incomplete"):
		if d := details.of(body); jsonscan.KindOf(d) == jsonscan.KindObject {
			r, _ := jsonscan.Get(d, "reason")
			a.IncompleteReason, _ = jsonscan.String(r)
		}
	}
	return a
}
