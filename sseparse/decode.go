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
	// TokenBearing reports whether the event carries generated output
	// (DESIGN 3.1): OpenAI non-empty content, refusal, reasoning,
	// reasoning_content, tool-call or function-call name or arguments;
	// Anthropic content_block_delta with non-empty text_delta.text,
	// input_json_delta.partial_json or thinking_delta.thinking.
	TokenBearing bool
	// Tokens counts the token-bearing deltas in the event: for OpenAI one per
	// choice whose delta is token-bearing, for Anthropic 1. It estimates
	// output tokens when the upstream reports no usage. Tokens > 0 exactly
	// when TokenBearing.
	Tokens int
	// UsageOnly marks the OpenAI chunk whose usage is an object and whose
	// choices are [], null or absent: the include_usage chunk (wire.md 1.4).
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
	// Anthropic message_stop.
	Terminal bool

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

// normalize applies the dialect's rules (wire.md 1.4, 2.4): OpenAI
// prompt_tokens already includes cached_tokens; Anthropic input_tokens
// excludes the cache reads and writes, which are added.
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
	noChoices := true
	it := jsonscan.Object(ev.Data)
	for it.Next() {
		switch {
		case it.KeyIs("choices"):
			o.Tokens, noChoices = 0, true
			switch it.Kind() {
			case jsonscan.KindArray:
				ch := it.Enter()
				for ch.Next() {
					noChoices = false
					if openAIChoiceBearing(&ch) {
						o.Tokens++
					}
				}
			case jsonscan.KindNull:
			default:
				noChoices = false
			}
		case it.KeyIs("usage"):
			o.usage = usageReport{}
			if it.Kind() == jsonscan.KindObject {
				u := it.Enter()
				o.usage = openAIUsage(&u)
			}
		case it.KeyIs("error"):
			o.Error, o.ErrorType = false, nil
			switch it.Kind() {
			case jsonscan.KindObject:
				e := it.Enter()
				o.Error, o.ErrorType = true, errorTypeOf(ev.Data, &e)
			case jsonscan.KindString:
				o.Error = true
			}
		}
	}
	if it.Err() != nil {
		*o = Observation{} // what was gathered may rest on a broken chunk
		return
	}
	o.TokenBearing = o.Tokens > 0
	o.UsageOnly = noChoices && o.usage.has&hasObject != 0
}

// openAIChoiceBearing reports whether the current element of choices carries
// output in its delta. Like the helpers below it walks its value to the end
// (no early return), so that the parent resumes without scanning it again.
func openAIChoiceBearing(ch *jsonscan.Iter) bool {
	if ch.Kind() != jsonscan.KindObject {
		return false
	}
	bearing := false
	c := ch.Enter()
	for c.Next() {
		if c.KeyIs("delta") {
			bearing = false
			if c.Kind() == jsonscan.KindObject {
				d := c.Enter()
				bearing = openAIDeltaBearing(&d)
			}
		}
	}
	return bearing
}

func openAIDeltaBearing(d *jsonscan.Iter) bool {
	bearing := false
	for d.Next() {
		switch {
		case d.KeyIs("content"), d.KeyIs("refusal"), d.KeyIs("reasoning"), d.KeyIs("reasoning_content"):
			if jsonscan.NonEmptyString(d.Value()) {
				bearing = true
			}
		case d.KeyIs("tool_calls"):
			if d.Kind() != jsonscan.KindArray {
				continue
			}
			calls := d.Enter()
			for calls.Next() {
				if calls.Kind() != jsonscan.KindObject {
					continue
				}
				call := calls.Enter()
				for call.Next() {
					if call.KeyIs("function") && functionBearing(&call) {
						bearing = true
					}
				}
			}
		case d.KeyIs("function_call"):
			if functionBearing(d) {
				bearing = true
			}
		}
	}
	return bearing
}

// functionBearing reports whether the current value, a tool call's function
// or the deprecated function_call, has a non-empty name or arguments fragment.
func functionBearing(parent *jsonscan.Iter) bool {
	if parent.Kind() != jsonscan.KindObject {
		return false
	}
	bearing := false
	fn := parent.Enter()
	for fn.Next() {
		if (fn.KeyIs("name") || fn.KeyIs("arguments")) && jsonscan.NonEmptyString(fn.Value()) {
			bearing = true
		}
	}
	return bearing
}

// openAIUsage reads a usage object (wire.md 1.4).
func openAIUsage(it *jsonscan.Iter) (u usageReport) {
	for it.Next() {
		switch {
		case it.KeyIs("prompt_tokens"):
			u.setInt(&u.input, hasInput, it.Value())
		case it.KeyIs("completion_tokens"):
			u.setInt(&u.output, hasOutput, it.Value())
		case it.KeyIs("prompt_tokens_details") && it.Kind() == jsonscan.KindObject:
			d := it.Enter()
			for d.Next() {
				switch {
				case d.KeyIs("cached_tokens"):
					u.setInt(&u.cacheRead, hasCacheRead, d.Value())
				case d.KeyIs("cache_write_tokens"):
					u.setInt(&u.cacheWrite, hasCacheWrite, d.Value())
				}
			}
		case it.KeyIs("completion_tokens_details") && it.Kind() == jsonscan.KindObject:
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
	u.has |= hasObject
	return u
}

// anthropicUsage reads a Usage or MessageDeltaUsage object (wire.md 2.4).
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
// fields only (its initial output_tokens is never counted, wire.md 2.4). A nil
// ev leaves o empty. Events other than message_start, content_block_delta,
// message_delta and error are not parsed at all.
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
	it := jsonscan.Object(ev.Data)
	for it.Next() {
		switch kind {
		case akError:
			if it.KeyIs("error") {
				o.ErrorType = nil
				if it.Kind() == jsonscan.KindObject {
					e := it.Enter()
					o.ErrorType = errorTypeOf(ev.Data, &e)
				}
			}
		case akMessageStart:
			if it.KeyIs("message") && it.Kind() == jsonscan.KindObject {
				o.usage = usageReport{}
				m := it.Enter()
				for m.Next() {
					if m.KeyIs("usage") {
						o.usage = usageReport{}
						if m.Kind() == jsonscan.KindObject {
							u := m.Enter()
							o.usage = anthropicUsage(&u)
							o.usage.has &^= hasOutput
						}
					}
				}
			}
		case akContentBlockDelta:
			if it.KeyIs("delta") {
				o.TokenBearing = false
				if it.Kind() == jsonscan.KindObject {
					d := it.Enter()
					o.TokenBearing = anthropicDeltaBearing(&d)
				}
			}
		case akMessageDelta:
			if it.KeyIs("usage") {
				o.usage = usageReport{}
				if it.Kind() == jsonscan.KindObject {
					u := it.Enter()
					o.usage = anthropicUsage(&u)
				}
			}
		}
	}
	if it.Err() != nil {
		*o = Observation{Error: o.Error} // the event name alone still says "error"
		return
	}
	if o.TokenBearing {
		o.Tokens = 1
	}
}

// anthropicDeltaBearing reports whether a content_block_delta's delta carries
// output (wire.md 2.3): signature_delta and citations_delta do not.
func anthropicDeltaBearing(it *jsonscan.Iter) bool {
	var typ, text, partial, thinking []byte
	for it.Next() {
		switch {
		case it.KeyIs("type"):
			typ = it.Value()
		case it.KeyIs("text"):
			text = it.Value()
		case it.KeyIs("partial_json"):
			partial = it.Value()
		case it.KeyIs("thinking"):
			thinking = it.Value()
		}
	}
	s, ok := jsonscan.String(typ)
	switch {
	case !ok:
		return false
	case jsonscan.Equal(s, "text_delta"):
		return jsonscan.NonEmptyString(text)
	case jsonscan.Equal(s, "input_json_delta"):
		return jsonscan.NonEmptyString(partial)
	case jsonscan.Equal(s, "thinking_delta"):
		return jsonscan.NonEmptyString(thinking)
	}
	return false
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
		child := it.Enter()
		if d == llm.DialectAnthropic {
			u = anthropicUsage(&child)
		} else {
			u = openAIUsage(&child)
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
