package mockllm

import (
	"encoding/json"
	"strconv"

	"github.com/tollgate-llm/tollgate/internal/jsonscan"
)

// anthropicMalformed is the broken event of the malformed= fault: JSON cut off.
const anthropicMalformed = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":\n\n"

// anthropicErrorEvent is the mid-stream error Anthropic sends when overloaded.
const anthropicErrorEvent = "event: error\ndata: " +
	`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}` + "\n\n"

// anthropicStop returns the stop_reason of the plan.
func (pl *plan) anthropicStop() string {
	switch {
	case pl.truncated:
		return "max_tokens"
	case pl.tool != "":
		return "tool_use"
	}
	return "end_turn"
}

// appendEvent appends "event: name\ndata: " for an event whose JSON follows.
func appendEvent(b []byte, name string) []byte {
	b = append(b, "event: "...)
	b = append(b, name...)
	return append(b, "\ndata: "...)
}

// appendAnthropicUsage appends the usage counts with output tokens out.
func (x *exchange) appendAnthropicUsage(b []byte, out int) []byte {
	b = append(b, `{"input_tokens":`...)
	b = strconv.AppendInt(b, int64(x.input), 10)
	b = append(b, `,"cache_creation_input_tokens":0,"cache_read_input_tokens":`...)
	b = strconv.AppendInt(b, int64(x.p.cachedTokens), 10)
	b = append(b, `,"output_tokens":`...)
	b = strconv.AppendInt(b, int64(out), 10)
	return append(b, '}')
}

// appendBlockStart appends content_block_start for block index: a thinking
// block, or else the answer's text or tool_use block.
func (x *exchange) appendBlockStart(b []byte, index int, thinking bool) []byte {
	b = appendEvent(b, "content_block_start")
	b = append(b, `{"type":"content_block_start","index":`...)
	b = strconv.AppendInt(b, int64(index), 10)
	switch {
	case thinking:
		b = append(b, `,"content_block":{"type":"thinking","thinking":"","signature":""}}`...)
	case x.plan.tool != "":
		b = append(b, `,"content_block":{"type":"tool_use","id":"`...)
		b = append(b, x.toolID...)
		b = append(b, `","name":`...)
		b = jsonscan.AppendString(b, x.plan.tool)
		b = append(b, `,"input":{}}}`...)
	default:
		b = append(b, `,"content_block":{"type":"text","text":""}}`...)
	}
	return append(b, "\n\n"...)
}

func appendBlockStop(b []byte, index int) []byte {
	b = appendEvent(b, "content_block_stop")
	b = append(b, `{"type":"content_block_stop","index":`...)
	b = strconv.AppendInt(b, int64(index), 10)
	return append(b, "}\n\n"...)
}

func appendDeltaHead(b []byte, index int) []byte {
	b = appendEvent(b, "content_block_delta")
	b = append(b, `{"type":"content_block_delta","index":`...)
	b = strconv.AppendInt(b, int64(index), 10)
	return append(b, `,"delta":{"type":"`...)
}

// streamAnthropic writes a Messages event stream in the real API's order:
// message_start, a thinking block if planned, the text or tool_use block,
// then message_delta and message_stop.
func (x *exchange) streamAnthropic() outcome {
	pl := &x.plan
	x.startStream()

	x.buf = appendEvent(x.buf, "message_start")
	x.buf = append(x.buf, `{"type":"message_start","message":{"id":"`...)
	x.buf = append(x.buf, x.id...)
	x.buf = append(x.buf, `","type":"message","role":"assistant","model":`...)
	x.buf = append(x.buf, x.model...)
	x.buf = append(x.buf, `,"content":[],"stop_reason":null,"stop_sequence":null,"usage":`...)
	x.buf = x.appendAnthropicUsage(x.buf, 1)
	x.buf = append(x.buf, "}}\n\n"...)
	if !x.emit() {
		return outcomeCanceled
	}
	// block is the open content block's index, -1 when none is open.
	block := 0
	x.buf = x.appendBlockStart(x.buf, 0, pl.reasoningEvents > 0)
	if !x.emit() {
		return outcomeCanceled
	}
	x.buf = append(x.buf, "event: ping\ndata: {\"type\":\"ping\"}\n\n"...)
	if !x.emit() {
		return outcomeCanceled
	}

	malformed := func() { x.buf = append(x.buf, anthropicMalformed...) }
	errorEvent := func() { x.buf = append(x.buf, anthropicErrorEvent...) }
	total := pl.events()
	for k := range total {
		if !x.faults(k, false, malformed, errorEvent) {
			return x.endOutcome()
		}
		if !x.waitUntil(x.sched.deadline(k)) {
			return outcomeCanceled
		}
		x.buf = appendDeltaHead(x.buf, block)
		if k < pl.reasoningEvents {
			x.buf = append(x.buf, `thinking_delta","thinking":"`...)
			x.buf = pl.appendReasoning(x.buf, k)
			x.buf = append(x.buf, "\"}}\n\n"...)
			if k == pl.reasoningEvents-1 {
				// The thinking block closes with its signature and the
				// answer block opens right after the last thinking token.
				x.buf = appendDeltaHead(x.buf, block)
				x.buf = append(x.buf, `signature_delta","signature":"`+signature+"\"}}\n\n"...)
				x.buf = appendBlockStop(x.buf, block)
				block = -1
				if pl.answerEvents > 0 {
					block = 1
					x.buf = x.appendBlockStart(x.buf, block, false)
				}
			}
		} else if j := k - pl.reasoningEvents; pl.tool == "" {
			x.buf = append(x.buf, `text_delta","text":"`...)
			x.buf = pl.appendAnswer(x.buf, j)
			x.buf = append(x.buf, "\"}}\n\n"...)
		} else {
			x.buf = append(x.buf, `input_json_delta","partial_json":`...)
			x.buf = jsonscan.AppendString(x.buf, pl.toolArgs[j])
			x.buf = append(x.buf, "}}\n\n"...)
		}
		if !x.emit() {
			return outcomeCanceled
		}
	}
	if !x.faults(total, true, malformed, errorEvent) {
		return x.endOutcome()
	}

	if block >= 0 {
		x.buf = appendBlockStop(x.buf, block)
	}
	x.buf = appendEvent(x.buf, "message_delta")
	x.buf = append(x.buf, `{"type":"message_delta","delta":{"stop_reason":"`...)
	x.buf = append(x.buf, pl.anthropicStop()...)
	x.buf = append(x.buf, `","stop_sequence":null},"usage":`...)
	x.buf = x.appendAnthropicUsage(x.buf, pl.output())
	x.buf = append(x.buf, "}\n\n"...)
	x.buf = appendEvent(x.buf, "message_stop")
	x.buf = append(x.buf, "{\"type\":\"message_stop\"}\n\n"...)
	if !x.emit() {
		return outcomeCanceled
	}
	return outcomeCompleted
}

// The non-streamed message object, as the Messages API returns it.
type (
	anthropicMessage struct {
		ID           string           `json:"id"`
		Type         string           `json:"type"`
		Role         string           `json:"role"`
		Model        string           `json:"model"`
		Content      []anthropicBlock `json:"content"`
		StopReason   string           `json:"stop_reason"`
		StopSequence *string          `json:"stop_sequence"`
		Usage        anthropicUsage   `json:"usage"`
	}
	anthropicBlock struct {
		Type      string          `json:"type"`
		Text      *string         `json:"text,omitempty"`
		Thinking  *string         `json:"thinking,omitempty"`
		Signature string          `json:"signature,omitempty"`
		ID        string          `json:"id,omitempty"`
		Name      string          `json:"name,omitempty"`
		Input     json.RawMessage `json:"input,omitempty"`
	}
	anthropicUsage struct {
		InputTokens              int    `json:"input_tokens"`
		CacheCreationInputTokens int    `json:"cache_creation_input_tokens"`
		CacheReadInputTokens     int    `json:"cache_read_input_tokens"`
		OutputTokens             int    `json:"output_tokens"`
		ServiceTier              string `json:"service_tier"`
	}
)

func (x *exchange) anthropicMessage() []byte {
	pl := &x.plan
	m := anthropicMessage{
		ID: x.id, Type: "message", Role: "assistant", Model: x.req.Model,
		Content:    []anthropicBlock{},
		StopReason: pl.anthropicStop(),
		Usage: anthropicUsage{InputTokens: x.input, CacheReadInputTokens: x.p.cachedTokens,
			OutputTokens: pl.output(), ServiceTier: "standard"},
	}
	if pl.reasoningEvents > 0 {
		t := pl.reasoningText()
		m.Content = append(m.Content, anthropicBlock{Type: "thinking", Thinking: &t, Signature: signature})
	}
	if pl.answerEvents > 0 {
		if pl.tool != "" {
			// A tool call cut off by max_tokens leaves arguments that are not
			// JSON; the block then carries an empty input, as the SDK's
			// accumulator makes of such a stream.
			in := json.RawMessage(pl.toolText())
			if !json.Valid(in) {
				in = json.RawMessage(`{}`)
			}
			m.Content = append(m.Content, anthropicBlock{Type: "tool_use", ID: x.toolID, Name: pl.tool, Input: in})
		} else {
			t := pl.answerText()
			m.Content = append(m.Content, anthropicBlock{Type: "text", Text: &t})
		}
	}
	return mustJSON(m)
}
