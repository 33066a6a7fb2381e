package mockllm

import (
	"strconv"

	"github.com/tollgate-llm/tollgate/internal/jsonscan"
)

// The Responses API (POST /v1/responses), streamed and not, in the shapes
// api.openai.com sends: named events whose data carries the same type and a
// sequence_number counting from 0, no [DONE], usage only on the terminal
// event. Reasoning goes out as a reasoning item with a streamed summary, a
// tool call as a function_call item (its added event names the tool, the
// arguments follow as deltas), and a generation cut by max_output_tokens
// ends with response.incomplete.

// responsesMalformed is the broken event of the malformed= fault.
const responsesMalformed = "event: response.output_text.delta\ndata: {\"type\":\n\n"

// respEvent starts an event named name: its `event:` line and its data up
// to the sequence number; the caller appends the rest of the data and
// closes it with respEnd.
func (x *exchange) respEvent(name string) {
	x.evStart, x.evSeq = len(x.buf), x.respSeq
	x.buf = append(x.buf, "event: "...)
	x.buf = append(x.buf, name...)
	x.buf = append(x.buf, "\ndata: {\"type\":\""...)
	x.buf = append(x.buf, name...)
	x.buf = append(x.buf, `","sequence_number":`...)
	x.buf = strconv.AppendInt(x.buf, x.respSeq, 10)
	x.respSeq++
}

// respEnd closes the event respEvent started. A replay drops it again when
// the client asked to resume after its sequence number.
func (x *exchange) respEnd() {
	x.buf = append(x.buf, "}\n\n"...)
	if x.replay && x.evSeq <= x.skip {
		x.buf = x.buf[:x.evStart]
	}
}

// itemIDs are the ids of the reasoning, message and function-call items.
func (x *exchange) itemIDs() (rs, msg, fc string) {
	n := pad(x.seq)
	return "rs_mock" + n, "msg_mock" + n, "fc_mock" + n
}

// streamResponses writes a Responses API event stream.
func (x *exchange) streamResponses() outcome {
	pl := &x.plan
	x.startStream()
	// A background response is created queued.
	created := "in_progress"
	if x.req.Background {
		created = "queued"
	}
	x.respEvent("response.created")
	x.buf = append(x.buf, `,"response":`...)
	x.buf = x.appendResponse(x.buf, created, false)
	x.respEnd()
	x.respEvent("response.in_progress")
	x.buf = append(x.buf, `,"response":`...)
	x.buf = x.appendResponse(x.buf, "in_progress", false)
	x.respEnd()
	if !x.emit() {
		return outcomeCanceled
	}
	malformed := func() { x.buf = append(x.buf, responsesMalformed...) }
	errorEvent := func() { x.appendResponsesFailure() }
	rs, msg, fc := x.itemIDs()
	total := pl.events()
	for k := range total {
		if !x.faults(k, false, malformed, errorEvent) {
			return x.endOutcome()
		}
		if !x.waitUntil(x.sched.deadline(k)) {
			return outcomeCanceled
		}
		switch j := k - pl.reasoningEvents; {
		case k < pl.reasoningEvents:
			if k == 0 {
				x.openReasoning(rs)
			}
			x.respEvent("response.reasoning_summary_text.delta")
			x.buf = append(x.buf, `,"item_id":"`+rs+`","output_index":0,"summary_index":0,"delta":"`...)
			x.buf = pl.appendReasoning(x.buf, k)
			x.buf = append(x.buf, '"')
			x.respEnd()
		case pl.tool == "":
			if j == 0 {
				x.closeReasoning(rs)
				x.openMessage(msg)
			}
			x.respEvent("response.output_text.delta")
			x.buf = append(x.buf, `,"item_id":"`+msg+`","output_index":`...)
			x.buf = strconv.AppendInt(x.buf, int64(x.outputIndex()), 10)
			x.buf = append(x.buf, `,"content_index":0,"delta":"`...)
			x.buf = pl.appendAnswer(x.buf, j)
			x.buf = append(x.buf, `","logprobs":[],"obfuscation":"`...)
			x.buf = append(x.buf, "mvkAadO"[:1+k%7]...)
			x.buf = append(x.buf, '"')
			x.respEnd()
		default:
			if j == 0 {
				// The added item names the tool: the call's first token.
				x.closeReasoning(rs)
				x.respEvent("response.output_item.added")
				x.buf = append(x.buf, `,"output_index":`...)
				x.buf = strconv.AppendInt(x.buf, int64(x.outputIndex()), 10)
				x.buf = append(x.buf, `,"item":`...)
				x.buf = x.appendCall(x.buf, fc, "in_progress", "")
				x.respEnd()
				if pl.toolArgs[0] == "" {
					break
				}
			}
			x.respEvent("response.function_call_arguments.delta")
			x.buf = append(x.buf, `,"item_id":"`+fc+`","output_index":`...)
			x.buf = strconv.AppendInt(x.buf, int64(x.outputIndex()), 10)
			x.buf = append(x.buf, `,"delta":`...)
			x.buf = jsonscan.AppendString(x.buf, pl.toolArgs[j])
			x.respEnd()
		}
		if !x.emit() {
			return outcomeCanceled
		}
	}
	if !x.faults(total, true, malformed, errorEvent) {
		return x.endOutcome()
	}
	x.closeReasoning(rs)
	x.closeAnswer(msg, fc)
	status, name := "completed", "response.completed"
	if pl.truncated {
		status, name = "incomplete", "response.incomplete"
	}
	final := x.appendResponse(nil, status, true)
	x.keep(final, false)
	x.respEvent(name)
	x.buf = append(x.buf, `,"response":`...)
	x.buf = append(x.buf, final...)
	x.respEnd()
	if !x.emit() {
		return outcomeCanceled
	}
	return outcomeCompleted
}

// outputIndex is the index of the answer's item: after the reasoning item,
// if there is one.
func (x *exchange) outputIndex() int {
	if x.plan.reasoningEvents > 0 {
		return 1
	}
	return 0
}

// openReasoning starts the reasoning item and its summary part.
func (x *exchange) openReasoning(rs string) {
	x.respEvent("response.output_item.added")
	x.buf = append(x.buf, `,"output_index":0,"item":{"id":"`+rs+`","type":"reasoning","summary":[]}`...)
	x.respEnd()
	x.respEvent("response.reasoning_summary_part.added")
	x.buf = append(x.buf, `,"item_id":"`+rs+`","output_index":0,"summary_index":0,"part":{"type":"summary_text","text":""}`...)
	x.respEnd()
}

// closeReasoning ends the reasoning item, once, when there is one.
func (x *exchange) closeReasoning(rs string) {
	pl := &x.plan
	if pl.reasoningEvents == 0 || x.reasoningClosed {
		return
	}
	x.reasoningClosed = true
	text := pl.reasoningText()
	x.respEvent("response.reasoning_summary_text.done")
	x.buf = append(x.buf, `,"item_id":"`+rs+`","output_index":0,"summary_index":0,"text":`...)
	x.buf = jsonscan.AppendString(x.buf, text)
	x.respEnd()
	x.respEvent("response.reasoning_summary_part.done")
	x.buf = append(x.buf, `,"item_id":"`+rs+`","output_index":0,"summary_index":0,"part":{"type":"summary_text","text":`...)
	x.buf = jsonscan.AppendString(x.buf, text)
	x.buf = append(x.buf, '}')
	x.respEnd()
	x.respEvent("response.output_item.done")
	x.buf = append(x.buf, `,"output_index":0,"item":`...)
	x.buf = x.appendReasoningItem(x.buf, rs)
	x.respEnd()
}

// openMessage starts the message item and its output_text part.
func (x *exchange) openMessage(msg string) {
	idx := strconv.Itoa(x.outputIndex())
	x.respEvent("response.output_item.added")
	x.buf = append(x.buf, `,"output_index":`+idx+`,"item":{"id":"`+msg+`","type":"message","status":"in_progress","content":[],"role":"assistant"}`...)
	x.respEnd()
	x.respEvent("response.content_part.added")
	x.buf = append(x.buf, `,"item_id":"`+msg+`","output_index":`+idx+`,"content_index":0,"part":{"type":"output_text","annotations":[],"logprobs":[],"text":""}`...)
	x.respEnd()
}

// closeAnswer ends the message or function-call item, when the plan
// generated one.
func (x *exchange) closeAnswer(msg, fc string) {
	pl := &x.plan
	if pl.answerEvents == 0 {
		return
	}
	idx := strconv.Itoa(x.outputIndex())
	if pl.tool != "" {
		x.respEvent("response.function_call_arguments.done")
		x.buf = append(x.buf, `,"item_id":"`+fc+`","output_index":`+idx+`,"name":`...)
		x.buf = jsonscan.AppendString(x.buf, pl.tool)
		x.buf = append(x.buf, `,"arguments":`...)
		x.buf = jsonscan.AppendString(x.buf, pl.toolText())
		x.respEnd()
		x.respEvent("response.output_item.done")
		x.buf = append(x.buf, `,"output_index":`+idx+`,"item":`...)
		x.buf = x.appendCall(x.buf, fc, "completed", pl.toolText())
		x.respEnd()
		return
	}
	text := pl.answerText()
	x.respEvent("response.output_text.done")
	x.buf = append(x.buf, `,"item_id":"`+msg+`","output_index":`+idx+`,"content_index":0,"text":`...)
	x.buf = jsonscan.AppendString(x.buf, text)
	x.buf = append(x.buf, `,"logprobs":[]`...)
	x.respEnd()
	x.respEvent("response.content_part.done")
	x.buf = append(x.buf, `,"item_id":"`+msg+`","output_index":`+idx+`,"content_index":0,"part":`...)
	x.buf = appendOutputText(x.buf, text)
	x.respEnd()
	x.respEvent("response.output_item.done")
	x.buf = append(x.buf, `,"output_index":`+idx+`,"item":`...)
	x.buf = x.appendMessage(x.buf, msg, "completed")
	x.respEnd()
}

// appendResponsesFailure appends how api.openai.com ends a stream that
// fails mid-way (recorded): an error event in the nested form, then
// response.failed with the error and no usage.
func (x *exchange) appendResponsesFailure() {
	failed := x.appendFailedResponse(nil)
	x.keep(failed, true)
	x.respEvent("error")
	x.buf = append(x.buf, `,"error":{"type":"server_error","code":"server_error","message":"The server had an error while processing your request. Sorry about that!","param":null}`...)
	x.respEnd()
	x.respEvent("response.failed")
	x.buf = append(x.buf, `,"response":`...)
	x.buf = append(x.buf, failed...)
	x.respEnd()
}

// appendFailedResponse appends the response object of a failed stream: the
// error, no output and no usage.
func (x *exchange) appendFailedResponse(b []byte) []byte {
	b = x.appendResponseHead(b, "failed")
	return append(b, `,"error":{"code":"server_error","message":"The server had an error while processing your request. Sorry about that!"},"incomplete_details":null,"output":[],"usage":null}`...)
}

// appendResponse appends the response object with status; with final, its
// output items and usage (and the incomplete details of a cut one).
func (x *exchange) appendResponse(b []byte, status string, final bool) []byte {
	b = x.appendResponseHead(b, status)
	if !final {
		return append(b, `,"error":null,"incomplete_details":null,"output":[],"usage":null}`...)
	}
	b = append(b, `,"error":null,"incomplete_details":`...)
	if status == "incomplete" {
		b = append(b, `{"reason":"max_output_tokens"}`...)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"output":[`...)
	b = x.appendOutput(b, status)
	b = append(b, `],"usage":`...)
	b = x.appendResponsesUsage(b)
	return append(b, '}')
}

// appendResponseHead appends the response object's fields before its
// error, output and usage: the id, status and the request's echoes (the
// previous response and the conversation only when the request names them).
func (x *exchange) appendResponseHead(b []byte, status string) []byte {
	b = append(b, `{"id":"`+x.responseID()+`","object":"response","created_at":`...)
	b = strconv.AppendInt(b, x.created, 10)
	b = append(b, `,"status":"`...)
	b = append(b, status...)
	b = append(b, `","background":`...)
	b = strconv.AppendBool(b, x.req.Background)
	b = append(b, `,"model":`...)
	b = append(b, x.model...)
	b = append(b, `,"service_tier":"default","store":`...)
	b = strconv.AppendBool(b, x.req.stores())
	b = append(b, `,"max_output_tokens":`...)
	if x.maxTokens >= 0 {
		b = strconv.AppendInt(b, x.maxTokens, 10)
	} else {
		b = append(b, "null"...)
	}
	if x.req.PreviousResponseID != "" {
		b = append(b, `,"previous_response_id":`...)
		b = jsonscan.AppendString(b, x.req.PreviousResponseID)
	}
	if x.conv != "" {
		b = append(b, `,"conversation":{"id":`...)
		b = jsonscan.AppendString(b, x.conv)
		b = append(b, '}')
	}
	return b
}

// responseID is the id of the response a Responses request creates.
func (x *exchange) responseID() string { return "resp_mock" + pad(x.seq) }

// appendOutput appends the output items: the reasoning item, then the
// message or the function call.
func (x *exchange) appendOutput(b []byte, status string) []byte {
	pl := &x.plan
	rs, msg, fc := x.itemIDs()
	sep := false
	if pl.reasoningEvents > 0 {
		b = x.appendReasoningItem(b, rs)
		sep = true
	}
	if pl.answerEvents == 0 {
		return b
	}
	if sep {
		b = append(b, ',')
	}
	if pl.tool != "" {
		return x.appendCall(b, fc, "completed", pl.toolText())
	}
	itemStatus := "completed"
	if status == "incomplete" {
		itemStatus = "incomplete"
	}
	return x.appendMessage(b, msg, itemStatus)
}

func (x *exchange) appendReasoningItem(b []byte, rs string) []byte {
	b = append(b, `{"id":"`+rs+`","type":"reasoning","summary":[{"type":"summary_text","text":`...)
	b = jsonscan.AppendString(b, x.plan.reasoningText())
	return append(b, `}]}`...)
}

func (x *exchange) appendMessage(b []byte, msg, status string) []byte {
	b = append(b, `{"id":"`+msg+`","type":"message","status":"`+status+`","content":[`...)
	b = appendOutputText(b, x.plan.answerText())
	return append(b, `],"role":"assistant"}`...)
}

func appendOutputText(b []byte, text string) []byte {
	b = append(b, `{"type":"output_text","annotations":[],"logprobs":[],"text":`...)
	b = jsonscan.AppendString(b, text)
	return append(b, '}')
}

func (x *exchange) appendCall(b []byte, fc, status, args string) []byte {
	b = append(b, `{"id":"`+fc+`","type":"function_call","status":"`+status+`","arguments":`...)
	b = jsonscan.AppendString(b, args)
	b = append(b, `,"call_id":"`...)
	b = append(b, x.toolID...)
	b = append(b, `","name":`...)
	b = jsonscan.AppendString(b, x.plan.tool)
	return append(b, '}')
}

// appendResponsesUsage appends the usage object: input_tokens including
// the cached ones, output_tokens including the reasoning ones.
func (x *exchange) appendResponsesUsage(b []byte) []byte {
	in := int64(x.input + x.p.cachedTokens)
	out := int64(x.plan.output())
	b = append(b, `{"input_tokens":`...)
	b = strconv.AppendInt(b, in, 10)
	b = append(b, `,"input_tokens_details":{"cached_tokens":`...)
	b = strconv.AppendInt(b, int64(x.p.cachedTokens), 10)
	b = append(b, `},"output_tokens":`...)
	b = strconv.AppendInt(b, out, 10)
	b = append(b, `,"output_tokens_details":{"reasoning_tokens":`...)
	b = strconv.AppendInt(b, int64(x.plan.reasoning), 10)
	b = append(b, `},"total_tokens":`...)
	b = strconv.AppendInt(b, in+out, 10)
	return append(b, '}')
}

// responsesObject is the non-streamed answer: the final response object.
func (x *exchange) responsesObject() []byte {
	status := "completed"
	if x.plan.truncated {
		status = "incomplete"
	}
	return x.appendResponse(nil, status, true)
}

// finalResponse is the response object a Responses request ends with, and
// whether it failed: a stream with the error-event fault fails (the fault
// fires at the latest after the last token event), anything else completes
// or is cut by max_output_tokens.
func (x *exchange) finalResponse() ([]byte, bool) {
	if x.req.Stream && x.p.fault.errorEvent >= 0 {
		return x.appendFailedResponse(nil), true
	}
	return x.responsesObject(), false
}
