package sseparse

import (
	"bytes"

	"github.com/tollgate-llm/tollgate/internal/jsonscan"
	"github.com/tollgate-llm/tollgate/llm"
)

// Observation is what one event told us. The decoders fill it in place so
// that decoding allocates nothing.
//
// Data that is not one well-formed JSON object yields an empty observation:
// a client SDK fails on such an event too, and a half-read chunk must not
// count. For Anthropic the `event:` name alone still marks an error or the
// terminal message_stop.
type Observation struct {
	// TokenBearing reports whether the event carries generated output (what
	// the TTFT and ITL clocks count): OpenAI non-empty content, refusal,
	// reasoning, reasoning_content, tool-call or function-call name or
	// arguments; Anthropic content_block_delta with non-empty
	// text_delta.text, input_json_delta.partial_json or
	// thinking_delta.thinking.
	TokenBearing bool
	// Tokens counts the token-bearing deltas in the event: for OpenAI one per
	// choice whose delta is token-bearing, for Anthropic 1. It estimates
	// output tokens when the upstream reports no usage. Tokens > 0 exactly
	// when TokenBearing.
	Tokens int
	// UsageOnly marks the OpenAI chunk whose usage is an object and whose
	// choices are [], null or absent: the chunk stream_options.include_usage
	// asks for.
	UsageOnly bool
	// Error reports an error event: OpenAI data with a top-level "error"
	// object or string; Anthropic `event: error` (or data type "error").
	Error bool
	// ErrorType is error.type, or error.code when the type is absent, null or
	// empty; nil for a string error or when neither is there. It aliases the
	// event: raw JSON string contents (escapes not decoded), or the digits of
	// a numeric code (vLLM sends "code": 500).
	ErrorType []byte
	// Terminal reports the end-of-stream marker: OpenAI `data: [DONE]`,
	// Anthropic message_stop, Responses response.completed,
	// response.incomplete and response.failed (the last also an Error).
	Terminal bool
	// Incomplete marks a Responses stream cut short by the upstream
	// (response.incomplete), IncompleteReason its
	// incomplete_details.reason (max_output_tokens, content_filter) as raw
	// JSON string contents aliasing the event.
	Incomplete       bool
	IncompleteReason []byte
	// Sequence is a Responses event's sequence_number (HasSequence false
	// without one); ResponseID is the response id response.created names,
	// as raw JSON string contents aliasing the event.
	Sequence    int64
	HasSequence bool
	ResponseID  []byte

	usage usageReport
}

// usageReport holds the usage fields one event reported, as sent: OpenAI
// input is prompt_tokens (cache included), Anthropic input is input_tokens
// (cache excluded). normalize turns it into llm.Usage.
type usageReport struct {
	input, output, cacheRead, cacheWrite, reasoning int64
	has                                             usageField
}

type usageField uint8

const (
	hasInput usageField = 1 << iota
	hasOutput
	hasCacheRead
	hasCacheWrite
	hasReasoning
	hasObject // a well-formed usage object was present
)

func (u *usageReport) setInt(dst *int64, f usageField, v []byte) {
	if n, ok := jsonscan.Int(v); ok && n >= 0 {
		*dst = n
		u.has |= f
	}
}

// normalize applies the dialect's usage rules: OpenAI prompt_tokens already
// includes cached_tokens; Anthropic input_tokens excludes the cache reads and
// writes, which are added.
func (u *usageReport) normalize(d llm.Dialect) llm.Usage {
	out := llm.Usage{
		Output:     u.output,
		CacheRead:  u.cacheRead,
		CacheWrite: u.cacheWrite,
		Reasoning:  u.reasoning,
		HasOutput:  u.has&hasOutput != 0,
	}
	if d == llm.DialectAnthropic {
		out.Input = u.input + u.cacheRead + u.cacheWrite
		out.HasInput = u.has&(hasInput|hasCacheRead|hasCacheWrite) != 0
	} else {
		out.Input = u.input
		out.HasInput = u.has&hasInput != 0
	}
	return out
}

// mergeFields copies the fields o reported over u, field by field: Anthropic
// usage is cumulative and message_delta may repeat only some fields.
func (u *usageReport) mergeFields(o *usageReport) {
	if o.has&hasInput != 0 {
		u.input = o.input
	}
	if o.has&hasOutput != 0 {
		u.output = o.output
	}
	if o.has&hasCacheRead != 0 {
		u.cacheRead = o.cacheRead
	}
	if o.has&hasCacheWrite != 0 {
		u.cacheWrite = o.cacheWrite
	}
	if o.has&hasReasoning != 0 {
		u.reasoning = o.reasoning
	}
	u.has |= o.has
}

var doneMarker = []byte("[DONE]")

// DecodeOpenAI decodes one Chat Completions chunk into o, resetting it first.
// `data: [DONE]` is matched by prefix, as the Python and Go SDKs do. A nil ev
// leaves o empty. When a top-level key (choices, usage, error) repeats, the
// last one counts, as in encoding/json; inside a delta any non-empty output
// field makes it token-bearing.
func DecodeOpenAI(ev *Event, o *Observation) {
	*o = Observation{}
	if ev == nil {
		return
	}
	if bytes.HasPrefix(ev.Data, doneMarker) {
		o.Terminal = true
		return
	}
	if !decodeOpenAIChunk(ev.Data, o) {
		*o = Observation{} // what was gathered may rest on a broken chunk
		return
	}
	o.TokenBearing = o.Tokens > 0
}

// decodeOpenAIChunk reads the chunk b into o and reports whether b is one
// well-formed JSON object.
//
// This runs for every token the relay forwards, so the chunk is walked once
// by position (jsonscan.Member, Element, Skip) down to the deltas: that takes
// about a third less time than a walk with Iters, whose state goes through
// memory at every member. Values read rarely (error, tool calls) are read
// with Iters over their spans once Skip has validated them; usage, once per
// stream but most of its chunk, gets a walk of its own.
func decodeOpenAIChunk(b []byte, o *Observation) bool {
	i := jsonscan.SkipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i++
	noChoices := true
	for first := true; ; first = false {
		key, esc, v, more, ok := jsonscan.Member(b, i, first)
		if !ok {
			return false
		}
		if !more {
			o.UsageOnly = noChoices && o.usage.has&hasObject != 0
			return jsonscan.SkipWS(b, v) == len(b)
		}
		switch {
		case jsonscan.KeyEq(key, esc, "choices"):
			if b[v] == '[' {
				var n int
				i, n, o.Tokens, ok = openAIChoices(b, v)
				noChoices = n == 0
			} else {
				i, ok = jsonscan.Skip(b, v, 1)
				o.Tokens, noChoices = 0, b[v] == 'n' // null
			}
		case jsonscan.KeyEq(key, esc, "usage"):
			o.usage = usageReport{}
			if b[v] == '{' {
				i, o.usage, ok = openAIUsage(b, v, 2)
			} else {
				i, ok = jsonscan.Skip(b, v, 1)
			}
		case jsonscan.KeyEq(key, esc, "error"):
			o.Error, o.ErrorType = false, nil
			if i, ok = jsonscan.Skip(b, v, 1); ok {
				switch b[v] {
				case '{':
					e := jsonscan.Object(b[v:i])
					o.Error, o.ErrorType = true, errorTypeOf(b[v:i], &e)
				case '"':
					o.Error = true
				}
			}
		default:
			i, ok = jsonscan.Skip(b, v, 1)
		}
		if !ok {
			return false
		}
	}
}

// openAIChoices walks the choices array that starts at b[i] and returns the
// index past it, the number of its elements, and how many of them carry
// output in their delta.
func openAIChoices(b []byte, i int) (end, n, tokens int, ok bool) {
	i++
	for first := true; ; first = false {
		v, more, ok := jsonscan.Element(b, i, first)
		if !ok || !more {
			return v, n, tokens, ok
		}
		n++
		if b[v] == '{' {
			var bearing bool
			if i, bearing, ok = openAIChoice(b, v); bearing {
				tokens++
			}
		} else {
			i, ok = jsonscan.Skip(b, v, 2)
		}
		if !ok {
			return 0, 0, 0, false
		}
	}
}

// openAIChoice walks the choice object that starts at b[i] and reports
// whether its delta (the last one, should it repeat) carries output.
func openAIChoice(b []byte, i int) (end int, bearing, ok bool) {
	i++
	for first := true; ; first = false {
		key, esc, v, more, ok := jsonscan.Member(b, i, first)
		if !ok || !more {
			return v, bearing, ok
		}
		isDelta := jsonscan.KeyEq(key, esc, "delta")
		if isDelta && b[v] == '{' {
			i, bearing, ok = openAIDelta(b, v)
		} else {
			if isDelta {
				bearing = false
			}
			i, ok = jsonscan.Skip(b, v, 3)
		}
		if !ok {
			return 0, false, false
		}
	}
}

// openAIDelta walks the delta object that starts at b[i] and reports whether
// it carries output.
func openAIDelta(b []byte, i int) (end int, bearing, ok bool) {
	i++
	for first := true; ; first = false {
		key, esc, v, more, ok := jsonscan.Member(b, i, first)
		if !ok || !more {
			return v, bearing, ok
		}
		if i, ok = jsonscan.Skip(b, v, 4); !ok {
			return 0, false, false
		}
		switch val := b[v:i]; {
		case jsonscan.KeyEq(key, esc, "content"), jsonscan.KeyEq(key, esc, "refusal"),
			jsonscan.KeyEq(key, esc, "reasoning"), jsonscan.KeyEq(key, esc, "reasoning_content"):
			bearing = bearing || jsonscan.NonEmptyString(val)
		case jsonscan.KeyEq(key, esc, "tool_calls"):
			bearing = bearing || toolCallsBearing(val)
		case jsonscan.KeyEq(key, esc, "function_call"):
			if jsonscan.KindOf(val) == jsonscan.KindObject {
				fn := jsonscan.Object(val)
				bearing = functionBearing(&fn) || bearing
			}
		}
	}
}

// toolCallsBearing reports whether a delta's tool_calls value v, already
// validated, has a call whose function carries a name or arguments.
func toolCallsBearing(v []byte) bool {
	bearing := false
	calls := jsonscan.Array(v)
	for calls.Next() {
		if calls.Kind() != jsonscan.KindObject {
			continue
		}
		call := calls.Enter()
		for call.Next() {
			if call.KeyIs("function") && call.Kind() == jsonscan.KindObject {
				fn := call.Enter()
				if functionBearing(&fn) {
					bearing = true
				}
			}
		}
	}
	return bearing
}

// functionBearing reports whether the object fn walks, a tool call's function
// or the deprecated function_call, has a non-empty name or arguments
// fragment. It walks fn to its end, so that a parent resumes without
// scanning the object again.
func functionBearing(fn *jsonscan.Iter) bool {
	bearing := false
	for fn.Next() {
		if (fn.KeyIs("name") || fn.KeyIs("arguments")) && jsonscan.NonEmptyString(fn.Value()) {
			bearing = true
		}
	}
	return bearing
}

// openAIUsage reads the usage object that starts at b[i], nested depth levels
// deep (2 for a chunk's usage), and returns the index just past it. ok is
// false, with an empty report, when it is malformed.
func openAIUsage(b []byte, i, depth int) (end int, u usageReport, ok bool) {
	i++
	for first := true; ; first = false {
		key, esc, v, more, ok := jsonscan.Member(b, i, first)
		if !ok {
			return 0, usageReport{}, false
		}
		if !more {
			u.has |= hasObject
			return v, u, true
		}
		promptDetails := jsonscan.KeyEq(key, esc, "prompt_tokens_details")
		if (promptDetails || jsonscan.KeyEq(key, esc, "completion_tokens_details")) && b[v] == '{' {
			i, ok = openAIUsageDetails(b, v, depth+1, promptDetails, &u)
		} else if i, ok = jsonscan.Skip(b, v, depth); ok {
			switch val := b[v:i]; {
			case jsonscan.KeyEq(key, esc, "prompt_tokens"):
				u.setInt(&u.input, hasInput, val)
			case jsonscan.KeyEq(key, esc, "completion_tokens"):
				u.setInt(&u.output, hasOutput, val)
			}
		}
		if !ok {
			return 0, usageReport{}, false
		}
	}
}

// openAIUsageDetails reads into u the prompt_tokens_details (prompt) or
// completion_tokens_details object that starts at b[i], nested depth levels
// deep, and returns the index just past it.
func openAIUsageDetails(b []byte, i, depth int, prompt bool, u *usageReport) (end int, ok bool) {
	i++
	for first := true; ; first = false {
		key, esc, v, more, ok := jsonscan.Member(b, i, first)
		if !ok || !more {
			return v, ok
		}
		if i, ok = jsonscan.Skip(b, v, depth); !ok {
			return 0, false
		}
		switch val := b[v:i]; {
		case prompt && jsonscan.KeyEq(key, esc, "cached_tokens"):
			u.setInt(&u.cacheRead, hasCacheRead, val)
		case prompt && jsonscan.KeyEq(key, esc, "cache_write_tokens"):
			u.setInt(&u.cacheWrite, hasCacheWrite, val)
		case !prompt && jsonscan.KeyEq(key, esc, "reasoning_tokens"):
			u.setInt(&u.reasoning, hasReasoning, val)
		}
	}
}

// anthropicUsage reads a Usage or MessageDeltaUsage object: message_start's
// or message_delta's usage.
func anthropicUsage(it *jsonscan.Iter) (u usageReport) {
	for it.Next() {
		switch {
		case it.KeyIs("input_tokens"):
			u.setInt(&u.input, hasInput, it.Value())
		case it.KeyIs("output_tokens"):
			u.setInt(&u.output, hasOutput, it.Value())
		case it.KeyIs("cache_read_input_tokens"):
			u.setInt(&u.cacheRead, hasCacheRead, it.Value())
		case it.KeyIs("cache_creation_input_tokens"):
			u.setInt(&u.cacheWrite, hasCacheWrite, it.Value())
		}
	}
	if it.Err() != nil {
		return usageReport{}
	}
	u.has |= hasObject
	return u
}

// errorTypeOf returns error.type, else error.code, of the error object it
// walks, as a sub-slice of data (the buffer the iteration started on): a
// slice taken from the iterator itself would make escape analysis move the
// iterators to the heap once it is stored in the Observation.
func errorTypeOf(data []byte, it *jsonscan.Iter) []byte {
	typOff, typLen, codeOff, codeLen := -1, 0, -1, 0
	var codeKind jsonscan.Kind
	for it.Next() {
		switch {
		case it.KeyIs("type"):
			typOff, typLen = it.Offset(), len(it.Value())
		case it.KeyIs("code"):
			codeOff, codeLen, codeKind = it.Offset(), len(it.Value()), it.Kind()
		}
	}
	if it.Err() != nil {
		return nil
	}
	if typOff >= 0 {
		if s, ok := jsonscan.String(data[typOff : typOff+typLen]); ok && len(s) > 0 {
			return s
		}
	}
	if codeOff >= 0 {
		code := data[codeOff : codeOff+codeLen]
		if s, ok := jsonscan.String(code); ok && len(s) > 0 {
			return s
		}
		if codeKind == jsonscan.KindNumber {
			return code
		}
	}
	return nil
}

// anthropicKind is the closed set of Anthropic event types the decoder acts on.
type anthropicKind uint8

const (
	akOther   anthropicKind = iota
	akDefault               // no `event:` name, or "message": look at the data's type
	akMessageStart
	akContentBlockDelta
	akMessageDelta
	akMessageStop
	akError
)

func anthropicKindOf(name []byte) anthropicKind {
	switch string(name) {
	case "", "message":
		return akDefault
	case "message_start":
		return akMessageStart
	case "content_block_delta":
		return akContentBlockDelta
	case "message_delta":
		return akMessageDelta
	case "message_stop":
		return akMessageStop
	case "error":
		return akError
	}
	return akOther
}

// dataKind maps the data's "type" value to a kind. Escaped names are decoded
// into a small stack buffer; none of the names we act on is longer than it,
// so a longer one is simply "other".
func dataKind(v []byte) anthropicKind {
	s, ok := jsonscan.String(v)
	if !ok {
		return akOther
	}
	if bytes.IndexByte(s, '\\') >= 0 {
		var buf [32]byte
		if len(s) > len(buf) {
			return akOther
		}
		s = jsonscan.AppendUnescape(buf[:0], s)
	}
	if k := anthropicKindOf(s); k != akDefault {
		return k
	}
	return akOther
}

// DecodeAnthropic decodes one Messages stream event into o, resetting it
// first. It dispatches on ev.Type; when Type is empty or "message" it falls
// back to the data's "type". Usage from message_start carries the input
// fields only (its initial output_tokens is a placeholder, never counted:
// message_delta carries the cumulative count). A nil ev leaves o empty.
// Events other than message_start, content_block_delta, message_delta and
// error are not parsed at all.
func DecodeAnthropic(ev *Event, o *Observation) {
	*o = Observation{}
	if ev == nil {
		return
	}
	kind := anthropicKindOf(ev.Type)
	if kind == akDefault {
		// Real upstreams always name their events; this costs one more pass.
		kind = akOther
		if v, ok := jsonscan.Get(ev.Data, "type"); ok {
			kind = dataKind(v)
		}
	}
	switch kind {
	case akMessageStop:
		o.Terminal = true
		return
	case akOther:
		return
	case akError:
		o.Error = true
	}
	if !decodeAnthropicEvent(ev.Data, kind, o) {
		*o = Observation{Error: o.Error} // the event name alone still says "error"
		return
	}
	if o.TokenBearing {
		o.Tokens = 1
	}
}

// decodeAnthropicEvent reads the data b of an event of the given kind into o
// and reports whether b is one well-formed JSON object. Like
// decodeOpenAIChunk it walks b once by position, down to the delta of a
// content_block_delta (the event of every token); the members read once per
// stream are read with Iters over their spans.
func decodeAnthropicEvent(b []byte, kind anthropicKind, o *Observation) bool {
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
		switch {
		case kind == akContentBlockDelta && jsonscan.KeyEq(key, esc, "delta"):
			o.TokenBearing = false
			if b[v] == '{' {
				i, o.TokenBearing, ok = anthropicDelta(b, v)
			} else {
				i, ok = jsonscan.Skip(b, v, 1)
			}
		case kind == akError && jsonscan.KeyEq(key, esc, "error"):
			o.ErrorType = nil
			if i, ok = jsonscan.Skip(b, v, 1); ok && b[v] == '{' {
				e := jsonscan.Object(b[v:i])
				o.ErrorType = errorTypeOf(b[v:i], &e)
			}
		case kind == akMessageStart && jsonscan.KeyEq(key, esc, "message") && b[v] == '{':
			o.usage = usageReport{}
			i, ok = anthropicMessage(b, v, &o.usage)
		case kind == akMessageDelta && jsonscan.KeyEq(key, esc, "usage"):
			o.usage = usageReport{}
			if i, ok = jsonscan.Skip(b, v, 1); ok && b[v] == '{' {
				u := jsonscan.Object(b[v:i])
				o.usage = anthropicUsage(&u)
			}
		default:
			i, ok = jsonscan.Skip(b, v, 1)
		}
		if !ok {
			return false
		}
	}
}

// anthropicMessage walks the message object of a message_start that starts at
// b[i] and reads its usage into u: the input fields only, as its initial
// output_tokens is a placeholder, never counted.
func anthropicMessage(b []byte, i int, u *usageReport) (end int, ok bool) {
	i++
	for first := true; ; first = false {
		key, esc, v, more, ok := jsonscan.Member(b, i, first)
		if !ok || !more {
			return v, ok
		}
		if i, ok = jsonscan.Skip(b, v, 2); !ok {
			return 0, false
		}
		if jsonscan.KeyEq(key, esc, "usage") {
			*u = usageReport{}
			if b[v] == '{' {
				it := jsonscan.Object(b[v:i])
				*u = anthropicUsage(&it)
				u.has &^= hasOutput
			}
		}
	}
}

// anthropicDelta walks the delta object of a content_block_delta that starts
// at b[i] and reports whether it carries output:
// signature_delta and citations_delta do not.
func anthropicDelta(b []byte, i int) (end int, bearing, ok bool) {
	var typ, text, partial, thinking []byte
	i++
	for first := true; ; first = false {
		key, esc, v, more, ok := jsonscan.Member(b, i, first)
		if !ok {
			return 0, false, false
		}
		if !more {
			end = v
			break
		}
		if i, ok = jsonscan.Skip(b, v, 2); !ok {
			return 0, false, false
		}
		switch val := b[v:i]; {
		case jsonscan.KeyEq(key, esc, "type"):
			typ = val
		case jsonscan.KeyEq(key, esc, "text"):
			text = val
		case jsonscan.KeyEq(key, esc, "partial_json"):
			partial = val
		case jsonscan.KeyEq(key, esc, "thinking"):
			thinking = val
		}
	}
	s, ok := jsonscan.String(typ)
	switch {
	case !ok:
		return end, false, true
	case jsonscan.Equal(s, "text_delta"):
		return end, jsonscan.NonEmptyString(text), true
	case jsonscan.Equal(s, "input_json_delta"):
		return end, jsonscan.NonEmptyString(partial), true
	case jsonscan.Equal(s, "thinking_delta"):
		return end, jsonscan.NonEmptyString(thinking), true
	}
	return end, false, true
}

// UsageFromOpenAIBody returns the usage of a non-streamed Chat Completions
// response body (its top-level "usage"). ok is false when the body reports no
// usage. A usage object found before the body turns malformed is still used,
// so a body copy cut at a size bound keeps what it has.
func UsageFromOpenAIBody(body []byte) (llm.Usage, bool) {
	return usageFromBody(body, llm.DialectOpenAI)
}

// UsageFromAnthropicBody returns the usage of a non-streamed Messages
// response body (the Message's top-level "usage"), with Input counting cache
// reads and writes. It follows the rules of UsageFromOpenAIBody.
// output_tokens with the reasoning ones), like UsageFromOpenAIBody.
func UsageFromResponsesBody(body []byte) (llm.Usage, bool) {
	return usageFromBody(body, llm.DialectResponses)
}

func UsageFromAnthropicBody(body []byte) (llm.Usage, bool) {
	return usageFromBody(body, llm.DialectAnthropic)
}

func usageFromBody(body []byte, d llm.Dialect) (llm.Usage, bool) {
	var u usageReport
	it := jsonscan.Object(body)
	for it.Next() {
		if !it.KeyIs("usage") || it.Kind() != jsonscan.KindObject {
			continue
		}
		switch d {
		case llm.DialectAnthropic:
			child := it.Enter()
			u = anthropicUsage(&child)
		default:
			_, u, _ = openAIUsage(body, it.Offset(), 2)
		}
	}
	out := u.normalize(d)
	return out, out.HasInput || out.HasOutput
}

// ErrorTypeFromBody returns error.type (or error.code when the type is
// absent) of an error body in either dialect: OpenAI
// {"error":{"type":…,"code":…}} or Anthropic {"type":"error","error":{"type":…}}.
// It returns "" when the body holds no such error. Like the usage readers it
// tolerates a body cut short after the error object.
func ErrorTypeFromBody(body []byte) string {
	var typ []byte
	it := jsonscan.Object(body)
	for it.Next() {
		if it.KeyIs("error") && it.Kind() == jsonscan.KindObject {
			e := it.Enter()
			typ = errorTypeOf(body, &e)
		}
	}
	if len(typ) == 0 {
		return ""
	}
	return string(jsonscan.AppendUnescape(nil, typ))
}
