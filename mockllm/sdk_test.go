package mockllm_test

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"net/http/httptest"
	"strings"
	"testing"

	anthropic "github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	ooption "github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"

	"github.com/tollgate-llm/tollgate/mockllm"
)

func openAIClient(ts *httptest.Server, opts ...ooption.RequestOption) openai.Client {
	return openai.NewClient(append([]ooption.RequestOption{
		ooption.WithBaseURL(ts.URL + "/v1/"), ooption.WithAPIKey("sk-test"),
		ooption.WithHTTPClient(ts.Client()), ooption.WithMaxRetries(0),
	}, opts...)...)
}

func anthropicClient(ts *httptest.Server, opts ...aoption.RequestOption) anthropic.Client {
	return anthropic.NewClient(append([]aoption.RequestOption{
		aoption.WithBaseURL(ts.URL), aoption.WithAPIKey("sk-ant-test"),
		aoption.WithHTTPClient(ts.Client()), aoption.WithMaxRetries(0),
	}, opts...)...)
}

func TestOpenAISDK(t *testing.T) {
	const model = "gpt-4o-mini"
	tests := []struct {
		name      string
		tools     bool
		maxTokens int64
		hdr       []string
		// want
		content string
		finish  string
		out     int64
		cached  int64
		reason  int64
	}{
		{name: "text", content: words(" tok", 1, 16), finish: "stop", out: 16},
		{name: "text chunked cached", hdr: []string{"X-Mock-Output-Tokens", "7", "X-Mock-Tokens-Per-Chunk", "3",
			"X-Mock-Cached-Tokens", "64"}, content: words(" tok", 1, 7), finish: "stop", out: 7, cached: 64},
		{name: "reasoning", hdr: []string{"X-Mock-Output-Tokens", "4", "X-Mock-Reasoning-Tokens", "3"},
			content: words(" tok", 1, 4), finish: "stop", out: 7, reason: 3},
		{name: "length", maxTokens: 5, content: words(" tok", 1, 5), finish: "length", out: 5},
		{name: "tool call", tools: true, hdr: []string{"X-Mock-Tool-Call", "1"}, finish: "tool_calls", out: 16},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, ts := start(t, mockllm.Options{})
			var opts []ooption.RequestOption
			for i := 0; i+1 < len(tc.hdr); i += 2 {
				opts = append(opts, ooption.WithHeader(tc.hdr[i], tc.hdr[i+1]))
			}
			client := openAIClient(ts, opts...)
			params := openai.ChatCompletionNewParams{
				Model:    model,
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("What is the weather in Bergen?")},
			}
			if tc.maxTokens > 0 {
				params.MaxCompletionTokens = openai.Int(tc.maxTokens)
			}
			if tc.tools {
				params.Tools = []openai.ChatCompletionToolUnionParam{
					openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "get_weather"}),
					openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "other_tool"}),
				}
			}

			// Whole.
			whole, err := client.Chat.Completions.New(t.Context(), params)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			wholeBody := lastBody(t, m, "/v1/chat/completions")

			// Streamed.
			params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
			stream := client.Chat.Completions.NewStreaming(t.Context(), params)
			var acc openai.ChatCompletionAccumulator
			chunks := 0
			for stream.Next() {
				if !acc.AddChunk(stream.Current()) {
					t.Fatalf("accumulator refused chunk %d", chunks)
				}
				chunks++
			}
			if err := stream.Err(); err != nil {
				t.Fatalf("stream: %v", err)
			}
			streamBody := lastBody(t, m, "/v1/chat/completions")

			for _, c := range []struct {
				name string
				cc   openai.ChatCompletion
				body []byte
			}{{"whole", *whole, wholeBody}, {"streamed", acc.ChatCompletion, streamBody}} {
				if len(c.cc.Choices) != 1 {
					t.Fatalf("%s: %d choices", c.name, len(c.cc.Choices))
				}
				ch := c.cc.Choices[0]
				if c.cc.Model != model {
					t.Errorf("%s: model %q, want %q", c.name, c.cc.Model, model)
				}
				if ch.Message.Content != tc.content {
					t.Errorf("%s: content %q, want %q", c.name, ch.Message.Content, tc.content)
				}
				if ch.FinishReason != tc.finish {
					t.Errorf("%s: finish %q, want %q", c.name, ch.FinishReason, tc.finish)
				}
				u := c.cc.Usage
				wantPrompt := baseTokens(c.body) + tc.cached
				if u.PromptTokens != wantPrompt || u.CompletionTokens != tc.out || u.TotalTokens != wantPrompt+tc.out {
					t.Errorf("%s: usage %d/%d/%d, want %d/%d/%d", c.name, u.PromptTokens, u.CompletionTokens,
						u.TotalTokens, wantPrompt, tc.out, wantPrompt+tc.out)
				}
				if u.PromptTokensDetails.CachedTokens != tc.cached {
					t.Errorf("%s: cached %d, want %d", c.name, u.PromptTokensDetails.CachedTokens, tc.cached)
				}
				if u.CompletionTokensDetails.ReasoningTokens != tc.reason {
					t.Errorf("%s: reasoning %d, want %d", c.name, u.CompletionTokensDetails.ReasoningTokens, tc.reason)
				}
				if !tc.tools {
					if len(ch.Message.ToolCalls) != 0 {
						t.Errorf("%s: unexpected tool calls %v", c.name, ch.Message.ToolCalls)
					}
					continue
				}
				if len(ch.Message.ToolCalls) != 1 {
					t.Fatalf("%s: %d tool calls, want 1", c.name, len(ch.Message.ToolCalls))
				}
				call := ch.Message.ToolCalls[0]
				if call.Function.Name != "get_weather" || call.Type != "function" || call.ID == "" {
					t.Errorf("%s: tool call %+v", c.name, call)
				}
				var args map[string]string
				if err := json.Unmarshal([]byte(call.Function.Arguments), &args); err != nil {
					t.Fatalf("%s: arguments %q: %v", c.name, call.Function.Arguments, err)
				}
				if len(args) != 1 || args["city"] != "Bergen" {
					t.Errorf("%s: arguments %v", c.name, args)
				}
			}
			if whole.ID == acc.ID || acc.ID == "" {
				t.Errorf("ids: whole %q, stream %q: want distinct, non-empty", whole.ID, acc.ID)
			}
		})
	}
}

func TestAnthropicSDK(t *testing.T) {
	const model = "claude-sonnet-4-5"
	tests := []struct {
		name      string
		tools     bool
		maxTokens int64
		hdr       []string
		// want
		blocks  []string // content block types
		text    string
		think   string
		stop    anthropic.StopReason
		out     int64
		cached  int64
		toolArg bool
		city    string // the tool call's argument; "" for ToolArguments'
	}{
		{name: "text", maxTokens: 1024, blocks: []string{"text"}, text: words(" tok", 1, 16), stop: "end_turn", out: 16},
		{name: "text chunked cached", maxTokens: 1024,
			hdr:    []string{"X-Mock-Output-Tokens", "10", "X-Mock-Tokens-Per-Chunk", "4", "X-Mock-Cached-Tokens", "2048"},
			blocks: []string{"text"}, text: words(" tok", 1, 10), stop: "end_turn", out: 10, cached: 2048},
		{name: "max tokens", maxTokens: 3, blocks: []string{"text"}, text: words(" tok", 1, 3), stop: "max_tokens", out: 3},
		{name: "thinking then tool", tools: true, maxTokens: 1024,
			hdr:    []string{"X-Mock-Reasoning-Tokens", "5", "X-Mock-Tool-Call", "get_weather"},
			blocks: []string{"thinking", "tool_use"}, think: words(" think", 1, 5), stop: "tool_use", out: 21, toolArg: true},
		{name: "tool with the arguments asked for", tools: true, maxTokens: 1024,
			hdr:    []string{"X-Mock-Tool-Call", "get_weather", "X-Mock-Tool-Arguments", `{"city": "Tromsø"}`},
			blocks: []string{"tool_use"}, stop: "tool_use", out: 16, toolArg: true, city: "Tromsø"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, ts := start(t, mockllm.Options{})
			var opts []aoption.RequestOption
			for i := 0; i+1 < len(tc.hdr); i += 2 {
				opts = append(opts, aoption.WithHeader(tc.hdr[i], tc.hdr[i+1]))
			}
			client := anthropicClient(ts, opts...)
			params := anthropic.MessageNewParams{
				Model:     model,
				MaxTokens: tc.maxTokens,
				Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Weather in Bergen?"))},
			}
			if tc.tools {
				params.Tools = []anthropic.ToolUnionParam{{OfTool: &anthropic.ToolParam{
					Name: "get_weather", InputSchema: anthropic.ToolInputSchemaParam{Properties: map[string]any{}},
				}}}
			}

			whole, err := client.Messages.New(t.Context(), params)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			wholeBody := lastBody(t, m, "/v1/messages")

			stream := client.Messages.NewStreaming(t.Context(), params)
			var acc anthropic.Message
			for stream.Next() {
				if err := acc.Accumulate(stream.Current()); err != nil {
					t.Fatalf("Accumulate: %v", err)
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatalf("stream: %v", err)
			}
			streamBody := lastBody(t, m, "/v1/messages")

			for _, c := range []struct {
				name string
				msg  anthropic.Message
				body []byte
			}{{"whole", *whole, wholeBody}, {"streamed", acc, streamBody}} {
				if string(c.msg.Model) != model || c.msg.Role != "assistant" || c.msg.ID == "" {
					t.Errorf("%s: model %q role %q id %q", c.name, c.msg.Model, c.msg.Role, c.msg.ID)
				}
				if c.msg.StopReason != tc.stop {
					t.Errorf("%s: stop %q, want %q", c.name, c.msg.StopReason, tc.stop)
				}
				u := c.msg.Usage
				if u.InputTokens != baseTokens(c.body) || u.CacheReadInputTokens != tc.cached ||
					u.CacheCreationInputTokens != 0 || u.OutputTokens != tc.out {
					t.Errorf("%s: usage in %d cache %d/%d out %d, want %d %d/0 %d", c.name, u.InputTokens,
						u.CacheReadInputTokens, u.CacheCreationInputTokens, u.OutputTokens,
						baseTokens(c.body), tc.cached, tc.out)
				}
				if len(c.msg.Content) != len(tc.blocks) {
					t.Fatalf("%s: %d blocks, want %v", c.name, len(c.msg.Content), tc.blocks)
				}
				for i, b := range c.msg.Content {
					if b.Type != tc.blocks[i] {
						t.Errorf("%s: block %d type %q, want %q", c.name, i, b.Type, tc.blocks[i])
					}
					switch b.Type {
					case "text":
						if b.Text != tc.text {
							t.Errorf("%s: text %q, want %q", c.name, b.Text, tc.text)
						}
					case "thinking":
						if b.Thinking != tc.think || b.Signature == "" {
							t.Errorf("%s: thinking %q signature %q, want %q", c.name, b.Thinking, b.Signature, tc.think)
						}
					case "tool_use":
						var in map[string]string
						if err := json.Unmarshal(b.Input, &in); err != nil {
							t.Fatalf("%s: input %q: %v", c.name, b.Input, err)
						}
						city := tc.city
						if city == "" {
							city = "Bergen"
						}
						if b.Name != "get_weather" || b.ID == "" || len(in) != 1 || in["city"] != city {
							t.Errorf("%s: tool_use name %q id %q input %v", c.name, b.Name, b.ID, in)
						}
					}
				}
			}
		})
	}
}

func TestSDKErrors(t *testing.T) {
	_, ts := start(t, mockllm.Options{})
	t.Run("openai 429", func(t *testing.T) {
		client := openAIClient(ts, ooption.WithHeader("X-Mock-Fault", "status=429;retry-after=1"))
		_, err := client.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
			Model: "m", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		})
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) {
			t.Fatalf("err %v, want *openai.Error", err)
		}
		if apiErr.StatusCode != 429 || apiErr.Code != "rate_limit_exceeded" || apiErr.Message == "" {
			t.Errorf("got status %d code %q message %q", apiErr.StatusCode, apiErr.Code, apiErr.Message)
		}
	})
	t.Run("openai insufficient_quota", func(t *testing.T) {
		client := openAIClient(ts, ooption.WithHeader("X-Mock-Fault", "status=429;type=insufficient_quota;code=insufficient_quota"))
		_, err := client.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
			Model: "m", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		})
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.Code != "insufficient_quota" || apiErr.Type != "insufficient_quota" {
			t.Errorf("err %v", err)
		}
	})
	t.Run("tool arguments that are not an object", func(t *testing.T) {
		client := anthropicClient(ts, aoption.WithHeader("X-Mock-Tool-Arguments", `["Bergen"]`))
		_, err := client.Messages.New(t.Context(), anthropic.MessageNewParams{
			Model: "m", MaxTokens: 10,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))},
		})
		var apiErr *anthropic.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || !strings.Contains(apiErr.Error(), "X-Mock-Tool-Arguments") {
			t.Errorf("err %v; want a 400 naming the header", err)
		}
	})
	t.Run("anthropic 529", func(t *testing.T) {
		client := anthropicClient(ts, aoption.WithHeader("X-Mock-Fault", "status=529"))
		_, err := client.Messages.New(t.Context(), anthropic.MessageNewParams{
			Model: "m", MaxTokens: 10,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))},
		})
		var apiErr *anthropic.Error
		if !errors.As(err, &apiErr) {
			t.Fatalf("err %v, want *anthropic.Error", err)
		}
		if apiErr.StatusCode != 529 || apiErr.Type() != "overloaded_error" {
			t.Errorf("got status %d type %q", apiErr.StatusCode, apiErr.Type())
		}
	})
	t.Run("anthropic error event", func(t *testing.T) {
		client := anthropicClient(ts, aoption.WithHeader("X-Mock-Fault", "error-event=2"))
		stream := client.Messages.NewStreaming(t.Context(), anthropic.MessageNewParams{
			Model: "m", MaxTokens: 10,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))},
		})
		var acc anthropic.Message
		for stream.Next() {
			if err := acc.Accumulate(stream.Current()); err != nil {
				t.Fatal(err)
			}
		}
		var apiErr *anthropic.Error
		if !errors.As(stream.Err(), &apiErr) || apiErr.Type() != "overloaded_error" {
			t.Errorf("stream err %v, want overloaded_error", stream.Err())
		}
		if len(acc.Content) != 1 || acc.Content[0].Text != words(" tok", 1, 2) {
			t.Errorf("content before the error: %+v", acc.Content)
		}
	})
	t.Run("openai error event", func(t *testing.T) {
		client := openAIClient(ts, ooption.WithHeader("X-Mock-Fault", "error-event=1"))
		stream := client.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{
			Model: "m", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		})
		for stream.Next() {
		}
		if stream.Err() == nil {
			t.Error("stream ended without an error")
		}
	})
}

func TestOtherRoutesSDK(t *testing.T) {
	_, ts := start(t, mockllm.Options{})
	oc := openAIClient(ts)

	t.Run("models", func(t *testing.T) {
		page, err := oc.Models.List(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Data) == 0 || page.Data[0].ID == "" || page.Data[0].Object != "model" {
			t.Errorf("models %+v", page.Data)
		}
	})
	t.Run("embeddings", func(t *testing.T) {
		inputs := []string{"alpha", "beta", "alpha"}
		params := openai.EmbeddingNewParams{
			Model: "text-embedding-3-small",
			Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: inputs},
		}
		res, err := oc.Embeddings.New(t.Context(), params)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Data) != 3 {
			t.Fatalf("%d embeddings, want 3", len(res.Data))
		}
		var wantTokens int64
		for i, d := range res.Data {
			wantTokens += baseTokens([]byte(inputs[i]))
			if d.Index != int64(i) || len(d.Embedding) == 0 {
				t.Errorf("item %d: index %d, %d dims", i, d.Index, len(d.Embedding))
			}
			var norm float64
			for _, f := range d.Embedding {
				norm += f * f
			}
			if math.Abs(norm-1) > 1e-3 {
				t.Errorf("item %d: squared norm %v, want 1", i, norm)
			}
		}
		if !equalFloats(res.Data[0].Embedding, res.Data[2].Embedding) || equalFloats(res.Data[0].Embedding, res.Data[1].Embedding) {
			t.Error("equal inputs must embed equally and different ones differently")
		}
		if res.Usage.PromptTokens != wantTokens || res.Usage.TotalTokens != wantTokens {
			t.Errorf("usage %+v, want %d", res.Usage, wantTokens)
		}

		// base64 carries the same little-endian float32 values.
		resp := post(t, ts, "/v1/embeddings", `{"model":"e","input":"alpha","encoding_format":"base64","dimensions":5}`)
		var raw struct {
			Data []struct {
				Embedding string `json:"embedding"`
			} `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil || len(raw.Data) != 1 {
			t.Fatalf("decode: %v %+v", err, raw)
		}
		bin, err := base64.StdEncoding.DecodeString(raw.Data[0].Embedding)
		if err != nil || len(bin) != 5*4 {
			t.Fatalf("base64 %q: %v", raw.Data[0].Embedding, err)
		}
		var norm float64
		for i := range 5 {
			f := float64(math.Float32frombits(binary.LittleEndian.Uint32(bin[4*i:])))
			norm += f * f
		}
		if math.Abs(norm-1) > 1e-3 {
			t.Errorf("base64 vector squared norm %v, want 1", norm)
		}
	})
	t.Run("count tokens", func(t *testing.T) {
		m, ts := start(t, mockllm.Options{})
		ac := anthropicClient(ts)
		res, err := ac.Messages.CountTokens(t.Context(), anthropic.MessageCountTokensParams{
			Model:    "claude-sonnet-4-5",
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hello there"))},
		})
		if err != nil {
			t.Fatal(err)
		}
		if want := baseTokens(lastBody(t, m, "/v1/messages/count_tokens")); res.InputTokens != want {
			t.Errorf("input tokens %d, want %d", res.InputTokens, want)
		}
	})
	t.Run("responses input tokens", func(t *testing.T) {
		m, ts := start(t, mockllm.Options{})
		oc := openAIClient(ts)
		res, err := oc.Responses.InputTokens.Count(t.Context(), responses.InputTokenCountParams{
			Input: responses.InputTokenCountParamsInputUnion{OfString: openai.String("hello there")}})
		if err != nil {
			t.Fatal(err)
		}
		if want := baseTokens(lastBody(t, m, "/v1/responses/input_tokens")); res.InputTokens != want || want <= 0 {
			t.Errorf("input tokens %d, want %d", res.InputTokens, want)
		}
		if res.Object != "response.input_tokens" {
			t.Errorf("object %q", res.Object)
		}
	})
}

func equalFloats(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
