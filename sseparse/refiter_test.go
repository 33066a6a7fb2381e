package sseparse

import (
	"bytes"

	"github.com/tollgate-llm/tollgate/internal/jsonscan"
	"github.com/tollgate-llm/tollgate/llm"
)

// The decoders as they were before they walked events by position (with
// Iters throughout), kept as references: FuzzDecodeOpenAI and
// FuzzDecodeAnthropic check that old and new agree on every input, including
// those encoding/json cannot serve as a reference for (duplicate keys,
// invalid UTF-8, deep nesting).

func refIterOpenAI(ev *Event, o *Observation) {
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
					if refIterChoiceBearing(&ch) {
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
				o.usage = refIterOpenAIUsage(&u)
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

func refIterChoiceBearing(ch *jsonscan.Iter) bool {
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
				bearing = refIterDeltaBearing(&d)
			}
		}
	}
	return bearing
}

func refIterDeltaBearing(d *jsonscan.Iter) bool {
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
					if call.KeyIs("function") && refIterFunctionBearing(&call) {
						bearing = true
					}
				}
			}
		case d.KeyIs("function_call"):
			if refIterFunctionBearing(d) {
				bearing = true
			}
		}
	}
	return bearing
}

func refIterFunctionBearing(parent *jsonscan.Iter) bool {
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

func refIterOpenAIUsage(it *jsonscan.Iter) (u usageReport) {
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

func refIterUsageFromBody(body []byte, d llm.Dialect) (llm.Usage, bool) {
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
			u = refIterOpenAIUsage(&child)
		}
	}
	out := u.normalize(d)
	return out, out.HasInput || out.HasOutput
}

func refIterAnthropic(ev *Event, o *Observation) {
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
					o.TokenBearing = refIterAnthropicDeltaBearing(&d)
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

func refIterAnthropicDeltaBearing(it *jsonscan.Iter) bool {
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
