package mockllm

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"hash/fnv"
	"math"
	"net/http"
	"strconv"

	"github.com/tollgate-llm/tollgate/internal/jsonscan"
	"github.com/tollgate-llm/tollgate/llm"
)

// openAIMalformed is the broken event of the malformed= fault: JSON cut off.
const openAIMalformed = "data: {\"id\":\n\n"

// openAIErrorEvent is the error OpenAI sends mid-stream, after the first
// tokens (the status is 200 by then).
const openAIErrorEvent = `data: {"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}` + "\n\n"

// chunkHead appends the start of a chat.completion.chunk event, up to and
// including the opening bracket of choices.
func (x *exchange) chunkHead(b []byte) []byte {
	b = append(b, `data: {"id":"`...)
	b = append(b, x.id...)
	b = append(b, `","object":"chat.completion.chunk","created":`...)
	b = strconv.AppendInt(b, x.created, 10)
	b = append(b, `,"model":`...)
	b = append(b, x.model...)
	return append(b, `,"system_fingerprint":"fp_mock","service_tier":"default","choices":[`...)
}

const (
	choiceHead = `{"index":0,"delta":`
	choiceTail = `,"logprobs":null,"finish_reason":null}],"usage":null}` + "\n\n"
)

// finishReason returns the OpenAI finish_reason of the plan.
func (pl *plan) openAIFinish() string {
	switch {
	case pl.truncated:
		return "length"
	case pl.tool != "":
		return "tool_calls"
	}
	return "stop"
}

// streamOpenAI writes a chat.completion.chunk stream, text or tool calls,
// framed and ended with [DONE] as the real API does.
func (x *exchange) streamOpenAI() outcome {
	pl := &x.plan
	x.startStream()
	x.buf = x.chunkHead(x.buf)
	x.buf = append(x.buf, choiceHead+`{"role":"assistant","content":""}`+choiceTail...)
	if !x.emit() {
		return outcomeCanceled
	}
	malformed := func() { x.buf = append(x.buf, openAIMalformed...) }
	errorEvent := func() { x.buf = append(x.buf, openAIErrorEvent...) }

	total := pl.events()
	for k := range total {
		if !x.faults(k, false, malformed, errorEvent) {
			return x.endOutcome()
		}
		if !x.waitUntil(x.sched.deadline(k)) {
			return outcomeCanceled
		}
		x.buf = x.chunkHead(x.buf)
		x.buf = append(x.buf, choiceHead...)
		if k < pl.reasoningEvents {
			x.buf = append(x.buf, `{"reasoning_content":"`...)
			x.buf = pl.appendReasoning(x.buf, k)
			x.buf = append(x.buf, `"}`...)
		} else if j := k - pl.reasoningEvents; pl.tool == "" {
			x.buf = append(x.buf, `{"content":"`...)
			x.buf = pl.appendAnswer(x.buf, j)
			x.buf = append(x.buf, `"}`...)
		} else if j == 0 {
			x.buf = append(x.buf, `{"tool_calls":[{"index":0,"id":"`...)
			x.buf = append(x.buf, x.toolID...)
			x.buf = append(x.buf, `","type":"function","function":{"name":`...)
			x.buf = jsonscan.AppendString(x.buf, pl.tool)
			x.buf = append(x.buf, `,"arguments":`...)
			x.buf = jsonscan.AppendString(x.buf, pl.toolArgs[0])
			x.buf = append(x.buf, `}}]}`...)
		} else {
			x.buf = append(x.buf, `{"tool_calls":[{"index":0,"function":{"arguments":`...)
			x.buf = jsonscan.AppendString(x.buf, pl.toolArgs[j])
			x.buf = append(x.buf, `}}]}`...)
		}
		x.buf = append(x.buf, choiceTail...)
		if !x.emit() {
			return outcomeCanceled
		}
	}
	if !x.faults(total, true, malformed, errorEvent) {
		return x.endOutcome()
	}

	x.buf = x.chunkHead(x.buf)
	x.buf = append(x.buf, choiceHead+`{},"logprobs":null,"finish_reason":"`...)
	x.buf = append(x.buf, pl.openAIFinish()...)
	x.buf = append(x.buf, `"}],"usage":null}`+"\n\n"...)
	if x.req.StreamOptions != nil && x.req.StreamOptions.IncludeUsage && !x.p.noUsage {
		x.buf = x.chunkHead(x.buf)
		x.buf = append(x.buf, `],"usage":`...)
		x.buf = x.appendOpenAIUsage(x.buf)
		x.buf = append(x.buf, "}\n\n"...)
	}
	x.buf = append(x.buf, "data: [DONE]\n\n"...)
	if !x.emit() {
		return outcomeCanceled
	}
	return outcomeCompleted
}

// endOutcome is the outcome when faults ended the body.
func (x *exchange) endOutcome() outcome {
	if x.ended && x.ctx.Err() == nil {
		return outcomeCompleted
	}
	return outcomeCanceled
}

// appendOpenAIUsage appends the usage object, prompt_tokens including the
// cached ones as OpenAI counts them.
func (x *exchange) appendOpenAIUsage(b []byte) []byte {
	prompt := int64(x.input + x.p.cachedTokens)
	completion := int64(x.plan.output())
	b = append(b, `{"prompt_tokens":`...)
	b = strconv.AppendInt(b, prompt, 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, completion, 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, prompt+completion, 10)
	b = append(b, `,"prompt_tokens_details":{"cached_tokens":`...)
	b = strconv.AppendInt(b, int64(x.p.cachedTokens), 10)
	b = append(b, `,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":`...)
	b = strconv.AppendInt(b, int64(x.plan.reasoning), 10)
	return append(b, `,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}`...)
}

// The non-streamed chat.completion object, as the API returns it.
type (
	chatCompletion struct {
		ID                string          `json:"id"`
		Object            string          `json:"object"`
		Created           int64           `json:"created"`
		Model             string          `json:"model"`
		Choices           []chatChoice    `json:"choices"`
		Usage             json.RawMessage `json:"usage"`
		ServiceTier       string          `json:"service_tier"`
		SystemFingerprint string          `json:"system_fingerprint"`
	}
	chatChoice struct {
		Index        int         `json:"index"`
		Message      chatMessage `json:"message"`
		Logprobs     *struct{}   `json:"logprobs"`
		FinishReason string      `json:"finish_reason"`
	}
	chatMessage struct {
		Role             string         `json:"role"`
		Content          *string        `json:"content"`
		ReasoningContent *string        `json:"reasoning_content,omitempty"`
		Refusal          *string        `json:"refusal"`
		ToolCalls        []chatToolCall `json:"tool_calls,omitempty"`
		Annotations      []struct{}     `json:"annotations"`
	}
	chatToolCall struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	}
)

func (x *exchange) openAICompletion() []byte {
	pl := &x.plan
	msg := chatMessage{Role: "assistant", Annotations: []struct{}{}}
	if pl.reasoning > 0 {
		r := pl.reasoningText()
		msg.ReasoningContent = &r
	}
	if pl.tool != "" && pl.answerEvents > 0 {
		var tc chatToolCall
		tc.ID, tc.Type = x.toolID, "function"
		tc.Function.Name, tc.Function.Arguments = pl.tool, pl.toolText()
		msg.ToolCalls = []chatToolCall{tc}
	} else {
		c := pl.answerText()
		msg.Content = &c
	}
	cc := chatCompletion{
		ID: x.id, Object: "chat.completion", Created: x.created, Model: x.req.Model,
		Choices:     []chatChoice{{Message: msg, FinishReason: pl.openAIFinish()}},
		Usage:       x.appendOpenAIUsage(nil),
		ServiceTier: "default", SystemFingerprint: "fp_mock",
	}
	return mustJSON(cc)
}

// serveModels answers GET /v1/models in the OpenAI list shape.
func (s *Server) serveModels(w http.ResponseWriter, reqID string) outcome {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	list := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list"}
	for _, id := range []string{"mock-gpt", "mock-claude"} {
		list.Data = append(list.Data, model{ID: id, Object: "model", Created: 1767225600, OwnedBy: "mockllm"})
	}
	return writeJSON(w, llm.DialectOpenAI, reqID, mustJSON(list))
}

// embeddingDims is the default embedding length.
const embeddingDims = 8

// serveEmbeddings answers POST /v1/embeddings with unit vectors derived from
// a hash of each input, so equal inputs embed equally.
func (s *Server) serveEmbeddings(w http.ResponseWriter, reqID string, body []byte) outcome {
	var req struct {
		Model          string          `json:"model"`
		Input          json.RawMessage `json:"input"`
		Dimensions     *int            `json:"dimensions"`
		EncodingFormat string          `json:"encoding_format"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return s.badRequest(w, llm.DialectOpenAI, reqID, "mockllm: invalid JSON body: "+err.Error())
	}
	if req.Model == "" {
		return s.badRequest(w, llm.DialectOpenAI, reqID, "you must provide a model parameter")
	}
	inputs, err := embeddingInputs(req.Input)
	if err != nil {
		return s.badRequest(w, llm.DialectOpenAI, reqID, err.Error())
	}
	dims := embeddingDims
	if req.Dimensions != nil {
		if *req.Dimensions < 1 || *req.Dimensions > 4096 {
			return s.badRequest(w, llm.DialectOpenAI, reqID, "mockllm: dimensions must be in [1, 4096]")
		}
		dims = *req.Dimensions
	}
	type item struct {
		Object    string `json:"object"`
		Index     int    `json:"index"`
		Embedding any    `json:"embedding"`
	}
	out := struct {
		Object string `json:"object"`
		Data   []item `json:"data"`
		Model  string `json:"model"`
		Usage  struct {
			PromptTokens int `json:"prompt_tokens"`
			TotalTokens  int `json:"total_tokens"`
		} `json:"usage"`
	}{Object: "list", Model: req.Model}
	for i, in := range inputs {
		v := embed(in, dims)
		var e any = v
		if req.EncodingFormat == "base64" {
			raw := make([]byte, 0, 4*len(v))
			for _, f := range v {
				raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(f))
			}
			e = base64.StdEncoding.EncodeToString(raw)
		}
		out.Data = append(out.Data, item{Object: "embedding", Index: i, Embedding: e})
		out.Usage.PromptTokens += InputTokens(in)
	}
	out.Usage.TotalTokens = out.Usage.PromptTokens
	return writeJSON(w, llm.DialectOpenAI, reqID, mustJSON(out))
}

// embeddingInputs splits input (a string, an array of strings, an array of
// token ids or an array of such arrays) into the items to embed.
func embeddingInputs(raw json.RawMessage) ([][]byte, error) {
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return [][]byte{[]byte(one)}, nil
	}
	var many []json.RawMessage
	if err := json.Unmarshal(raw, &many); err != nil || len(many) == 0 {
		return nil, errInput
	}
	var num json.Number
	if json.Unmarshal(many[0], &num) == nil {
		return [][]byte{raw}, nil // one array of token ids
	}
	out := make([][]byte, len(many))
	for i, m := range many {
		var s string
		if json.Unmarshal(m, &s) == nil {
			out[i] = []byte(s)
		} else {
			out[i] = m
		}
	}
	return out, nil
}

var errInput = errors.New("mockllm: input must be a string, an array of strings or an array of token arrays")

// embed derives a unit vector of n dimensions from in.
func embed(in []byte, n int) []float32 {
	h := fnv.New64a()
	h.Write(in)
	seed := h.Sum64()
	v := make([]float32, n)
	var norm float64
	for i := range v {
		// splitmix64 steps give well-spread values from one hash.
		seed += 0x9e3779b97f4a7c15
		z := seed
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		z ^= z >> 31
		f := float64(z>>11)/float64(1<<53)*2 - 1
		v[i] = float32(f)
		norm += f * f
	}
	if norm = math.Sqrt(norm); norm > 0 {
		for i := range v {
			v[i] = float32(float64(v[i]) / norm)
		}
	}
	return v
}

// writeJSON writes a 200 JSON body.
func writeJSON(w http.ResponseWriter, d llm.Dialect, reqID string, body []byte) outcome {
	h := w.Header()
	setHeaders(h, d, reqID, "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write(body); err != nil {
		return outcomeCanceled
	}
	return outcomeCompleted
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil { // the mock's own types always marshal
		panic("mockllm: marshal: " + err.Error())
	}
	return b
}
