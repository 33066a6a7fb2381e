package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
)

// weatherQuestion is the prompt of these tests; with tools it names the
// tool, which is how the mock is asked for a call to it.
func weatherQuestion(tools bool) string {
	if tools {
		return "What is the weather in Bergen? Use get_weather."
	}
	return "What is the weather in Bergen?"
}

// openAIResult is the comparable part of an OpenAI answer.
type openAIResult struct {
	Content      string
	FinishReason string
	ToolName     string
	ToolArgs     map[string]any
	Prompt       int64
	Completion   int64
}

func openAIParams(tools bool) openai.ChatCompletionNewParams {
	p := openai.ChatCompletionNewParams{
		Model:    "gpt-test",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(weatherQuestion(tools))},
	}
	if tools {
		p.Tools = []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
			Name: "get_weather",
			Parameters: shared.FunctionParameters{"type": "object",
				"properties": map[string]any{"city": map[string]any{"type": "string"}}},
		})}
	}
	return p
}

func fromOpenAIMessage(t *testing.T, c *openai.ChatCompletion) openAIResult {
	t.Helper()
	if len(c.Choices) != 1 {
		t.Fatalf("%d choices", len(c.Choices))
	}
	ch := c.Choices[0]
	r := openAIResult{Content: ch.Message.Content, FinishReason: ch.FinishReason,
		Prompt: c.Usage.PromptTokens, Completion: c.Usage.CompletionTokens}
	if len(ch.Message.ToolCalls) > 0 {
		tc := ch.Message.ToolCalls[0]
		r.ToolName = tc.Function.Name
		if err := json.Unmarshal([]byte(tc.Function.Arguments), &r.ToolArgs); err != nil {
			t.Fatalf("tool arguments %q: %v", tc.Function.Arguments, err)
		}
	}
	return r
}

// openAIRun asks base once non-streamed and once streamed, and returns both
// results (the streamed one accumulated by the SDK).
func openAIRun(t *testing.T, base string, tools, askUsage bool) (plain, streamed openAIResult) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	client := openai.NewClient(option.WithBaseURL(base+"/v1"), option.WithAPIKey("sk-test-openai"),
		option.WithMaxRetries(0))
	p := openAIParams(tools)
	c, err := client.Chat.Completions.New(ctx, p)
	if err != nil {
		t.Fatalf("non-streamed: %v", err)
	}
	plain = fromOpenAIMessage(t, c)

	if askUsage {
		p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	}
	stream := client.Chat.Completions.NewStreaming(ctx, p)
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		chunk := stream.Current()
		if !askUsage && len(chunk.Choices) == 0 {
			t.Errorf("caller that did not ask for usage received a chunk without choices: %s", chunk.RawJSON())
		}
		acc.AddChunk(chunk)
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	_ = stream.Close()
	streamed = fromOpenAIMessage(t, &acc.ChatCompletion)
	return plain, streamed
}

func TestOpenAISDKThroughGateway(t *testing.T) {
	mock := httptest.NewServer(mockllm.New(mockllm.Options{OutputTokens: 12, TokensPerChunk: 2}))
	defer mock.Close()
	tg := newTestGateway(t, mock.URL, nil)

	for _, tc := range []struct {
		name            string
		tools, askUsage bool
	}{{"text", false, false}, {"text with usage", false, true}, {"tool call", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			directPlain, directStream := openAIRun(t, mock.URL, tc.tools, tc.askUsage)
			gwPlain, gwStream := openAIRun(t, tg.URL, tc.tools, tc.askUsage)
			if !reflect.DeepEqual(gwPlain, directPlain) {
				t.Errorf("non-streamed through the gateway %+v, direct %+v", gwPlain, directPlain)
			}
			if !reflect.DeepEqual(gwStream, directStream) {
				t.Errorf("streamed through the gateway %+v, direct %+v", gwStream, directStream)
			}
			// The accumulated stream equals the non-streamed answer (usage
			// only when asked for; the mock derives prompt tokens from the
			// body's length, which "stream":true changes).
			want := gwPlain
			want.Prompt = gwStream.Prompt
			if !tc.askUsage {
				want.Completion = 0
			}
			if !reflect.DeepEqual(gwStream, want) {
				t.Errorf("streamed %+v, non-streamed %+v", gwStream, want)
			}
			if tc.tools && (gwStream.ToolName != "get_weather" || gwStream.ToolArgs["city"] != "Bergen") {
				t.Errorf("tool call lost: %+v", gwStream)
			}
			// The gateway saw exact usage for both requests, even where the
			// caller did not ask for it.
			for i := range 2 {
				rec := tg.record(t)
				if rec.Outcome != llm.OutcomeOK || rec.Usage.Output != 12 || rec.Estimated || !rec.Usage.HasInput {
					t.Errorf("record %+v; want ok, 12 output tokens, not estimated", rec)
				}
				if i == 0 && rec.Usage.Input != gwPlain.Prompt || i == 1 && tc.askUsage && rec.Usage.Input != gwStream.Prompt {
					t.Errorf("record %d input tokens %d; the upstream said %d / %d", i, rec.Usage.Input, gwPlain.Prompt, gwStream.Prompt)
				}
			}
		})
	}
}

// anthropicResult is the comparable part of an Anthropic answer.
type anthropicResult struct {
	Blocks     []string // "text:..." or "tool_use:name:{json}"
	StopReason string
	Input      int64
	Output     int64
}

func fromAnthropicMessage(t *testing.T, m *anthropic.Message) anthropicResult {
	t.Helper()
	r := anthropicResult{StopReason: string(m.StopReason), Input: m.Usage.InputTokens, Output: m.Usage.OutputTokens}
	for _, b := range m.Content {
		switch b.Type {
		case "text":
			r.Blocks = append(r.Blocks, "text:"+b.Text)
		case "tool_use":
			var args map[string]any
			if err := json.Unmarshal(b.Input, &args); err != nil {
				t.Fatalf("tool input %s: %v", b.Input, err)
			}
			norm, _ := json.Marshal(args)
			r.Blocks = append(r.Blocks, "tool_use:"+b.Name+":"+string(norm))
		default:
			r.Blocks = append(r.Blocks, b.Type)
		}
	}
	return r
}

func anthropicRun(t *testing.T, base string, tools bool) (plain, streamed anthropicResult) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	client := anthropic.NewClient(aoption.WithBaseURL(base), aoption.WithAPIKey("sk-ant-test"), aoption.WithMaxRetries(0))
	p := anthropic.MessageNewParams{
		Model:     "claude-test",
		MaxTokens: 1024,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(weatherQuestion(tools)))},
	}
	if tools {
		p.Tools = []anthropic.ToolUnionParam{anthropic.ToolUnionParamOfTool(anthropic.ToolInputSchemaParam{
			Properties: map[string]any{"city": map[string]any{"type": "string"}}}, "get_weather")}
	}
	m, err := client.Messages.New(ctx, p)
	if err != nil {
		t.Fatalf("non-streamed: %v", err)
	}
	plain = fromAnthropicMessage(t, m)
	stream := client.Messages.NewStreaming(ctx, p)
	var acc anthropic.Message
	for stream.Next() {
		if err := acc.Accumulate(stream.Current()); err != nil {
			t.Fatalf("accumulate: %v", err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	_ = stream.Close()
	streamed = fromAnthropicMessage(t, &acc)
	return plain, streamed
}

func TestAnthropicSDKThroughGateway(t *testing.T) {
	mock := httptest.NewServer(mockllm.New(mockllm.Options{OutputTokens: 10}))
	defer mock.Close()
	tg := newTestGateway(t, mock.URL, nil)
	for _, tools := range []bool{false, true} {
		name := map[bool]string{false: "text", true: "tool call"}[tools]
		t.Run(name, func(t *testing.T) {
			directPlain, directStream := anthropicRun(t, mock.URL, tools)
			gwPlain, gwStream := anthropicRun(t, tg.URL, tools)
			if !reflect.DeepEqual(gwPlain, directPlain) || !reflect.DeepEqual(gwStream, directStream) {
				t.Errorf("through the gateway %+v / %+v; direct %+v / %+v", gwPlain, gwStream, directPlain, directStream)
			}
			want := gwPlain
			want.Input = gwStream.Input // the mock's prompt count follows the body length
			if !reflect.DeepEqual(gwStream, want) {
				t.Errorf("streamed %+v, non-streamed %+v", gwStream, gwPlain)
			}
			if len(gwStream.Blocks) == 0 {
				t.Fatal("no content")
			}
			if tools && gwStream.Blocks[0] != `tool_use:get_weather:{"city":"Bergen"}` {
				t.Errorf("tool call lost: %+v", gwStream)
			}
			for _, want := range []anthropicResult{gwPlain, gwStream} {
				rec := tg.record(t)
				if rec.Outcome != llm.OutcomeOK || rec.Usage.Output != want.Output || rec.Estimated ||
					rec.Usage.Input != want.Input {
					t.Errorf("record %+v; want ok with usage %d/%d", rec, want.Input, want.Output)
				}
			}
		})
	}
}

// responsesResult is the comparable part of a Responses API answer.
type responsesResult struct {
	Status, Text       string
	ToolName, ToolArgs string
	Input, Output      int64
	Cached, Reasoning  int64
	Items              []string
}

func fromResponse(r *responses.Response) responsesResult {
	out := responsesResult{Status: string(r.Status), Text: r.OutputText(), Input: r.Usage.InputTokens,
		Output: r.Usage.OutputTokens, Cached: r.Usage.InputTokensDetails.CachedTokens,
		Reasoning: r.Usage.OutputTokensDetails.ReasoningTokens}
	for _, item := range r.Output {
		out.Items = append(out.Items, item.Type)
		if item.Type == "function_call" {
			out.ToolName, out.ToolArgs = item.Name, item.Arguments.OfString
		}
	}
	return out
}

// responsesRun asks base once non-streamed and once streamed, and returns
// both answers (the streamed one as its terminal event carries it) and the
// text the streamed deltas add up to.
func responsesRun(t *testing.T, base string, tools bool) (plain, streamed responsesResult, deltas string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	client := openai.NewClient(option.WithBaseURL(base+"/v1"), option.WithAPIKey("sk-test-openai"),
		option.WithMaxRetries(0), option.WithHeader("X-Mock-Reasoning-Tokens", "4"),
		option.WithHeader("X-Mock-Cached-Tokens", "32"))
	p := responses.ResponseNewParams{Model: "gpt-test",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(weatherQuestion(tools))}}
	if tools {
		p.Tools = []responses.ToolUnionParam{{OfFunction: &responses.FunctionToolParam{Name: "get_weather",
			Parameters: map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}}}}}
	}
	r, err := client.Responses.New(ctx, p)
	if err != nil {
		t.Fatalf("non-streamed: %v", err)
	}
	plain = fromResponse(r)
	stream := client.Responses.NewStreaming(ctx, p)
	var b strings.Builder
	var final *responses.Response
	for stream.Next() {
		switch ev := stream.Current(); ev.Type {
		case "response.output_text.delta":
			b.WriteString(ev.Delta)
		case "response.completed", "response.incomplete":
			final = &ev.Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	_ = stream.Close()
	if final == nil {
		t.Fatal("the stream had no terminal event")
	}
	return plain, fromResponse(final), b.String()
}

// openai-go's Responses client through the gateway gets what it gets
// directly, streamed and not, text, reasoning and function calls; the
// gateway records exact usage (cached and reasoning tokens too) and a
// stream's first token.
func TestResponsesSDKThroughGateway(t *testing.T) {
	mock := httptest.NewServer(mockllm.New(mockllm.Options{OutputTokens: 12, TokensPerChunk: 2}))
	defer mock.Close()
	tg := newTestGateway(t, mock.URL, nil)
	for _, tools := range []bool{false, true} {
		t.Run(map[bool]string{false: "text", true: "function call"}[tools], func(t *testing.T) {
			directPlain, directStream, directDeltas := responsesRun(t, mock.URL, tools)
			gwPlain, gwStream, gwDeltas := responsesRun(t, tg.URL, tools)
			if !reflect.DeepEqual(gwPlain, directPlain) || !reflect.DeepEqual(gwStream, directStream) || gwDeltas != directDeltas {
				t.Errorf("through the gateway %+v / %+v / %q\ndirect %+v / %+v / %q",
					gwPlain, gwStream, gwDeltas, directPlain, directStream, directDeltas)
			}
			if gwStream.Status != "completed" || gwStream.Output != 16 || gwStream.Reasoning != 4 || gwStream.Cached != 32 ||
				!tools && (gwDeltas != gwStream.Text || gwStream.Text == "") ||
				tools && (gwStream.ToolName != "get_weather" || !strings.Contains(gwStream.ToolArgs, "Bergen")) {
				t.Errorf("streamed answer %+v (deltas %q)", gwStream, gwDeltas)
			}
			for i, want := range []responsesResult{gwPlain, gwStream} {
				rec := tg.record(t)
				if rec.Route != llm.RouteResponses || rec.Outcome != llm.OutcomeOK || rec.Estimated || rec.InputEstimated ||
					rec.Usage.Input != want.Input || rec.Usage.Output != want.Output || rec.Usage.CacheRead != want.Cached ||
					rec.Usage.Reasoning != want.Reasoning || rec.Stream != (i == 1) || i == 1 && rec.Timing.FirstTokenOut.IsZero() {
					t.Errorf("record %d: %+v; want ok on route responses with usage %+v", i, rec, want)
				}
			}
		})
	}
}

// A Responses stream the upstream breaks after its first tokens ends, for
// the caller, with the nested error event all three SDKs raise on (never a
// synthesized response.completed); openai-go's stream reports it.
func TestResponsesStreamBrokenIsAnErrorForTheSDK(t *testing.T) {
	mock := httptest.NewServer(mockllm.New(mockllm.Options{OutputTokens: 8}))
	defer mock.Close()
	tg := newTestGateway(t, mock.URL, func(c *config.Config) { c.Upstreams[0].Retry.MaxAttempts = 1 })
	client := openai.NewClient(option.WithBaseURL(tg.URL+"/v1"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0),
		option.WithHeader("X-Mock-Fault", "disconnect=3"))
	stream := client.Responses.NewStreaming(testCtx(t), responses.ResponseNewParams{Model: "gpt-test",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}})
	var kinds []string
	for stream.Next() {
		kinds = append(kinds, stream.Current().Type)
	}
	var se *ssestream.StreamError
	if err := stream.Err(); !errors.As(err, &se) || !strings.Contains(err.Error(), "upstream_stream_broken") ||
		slices.Contains(kinds, "response.completed") {
		t.Errorf("broken stream: events %v, error %v", kinds, err)
	}
	_ = stream.Close()
	if rec := tg.record(t); rec.Outcome != llm.OutcomeUpstreamError || rec.Interruption != llm.InterruptUpstreamEOF ||
		rec.TokenEvents != 3 {
		t.Errorf("record %+v", rec)
	}
}

// An answer max_output_tokens cut short (response.incomplete) is a success
// with its reason on the record and in the access log, streamed or not.
func TestResponsesIncompleteIsOK(t *testing.T) {
	mock := httptest.NewServer(mockllm.New(mockllm.Options{OutputTokens: 20}))
	defer mock.Close()
	tg := newTestGateway(t, mock.URL, nil)
	client := openai.NewClient(option.WithBaseURL(tg.URL+"/v1"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0))
	p := responses.ResponseNewParams{Model: "gpt-test", MaxOutputTokens: openai.Int(16),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}}
	r, err := client.Responses.New(testCtx(t), p)
	if err != nil || r.Status != "incomplete" {
		t.Fatalf("non-streamed: %v (status %v)", err, r)
	}
	stream := client.Responses.NewStreaming(testCtx(t), p)
	var last string
	for stream.Next() {
		last = stream.Current().Type
	}
	if err := stream.Err(); err != nil || last != "response.incomplete" {
		t.Fatalf("streamed: %v, last event %q", err, last)
	}
	_ = stream.Close()
	for i := range 2 {
		rec := tg.record(t)
		if rec.Outcome != llm.OutcomeOK || rec.IncompleteReason != "max_output_tokens" || rec.Usage.Output != 16 {
			t.Errorf("record %d: outcome %s, incomplete reason %q, output %d", i, rec.Outcome, rec.IncompleteReason, rec.Usage.Output)
		}
	}
	if n := strings.Count(tg.logs.String(), `"incomplete_reason":"max_output_tokens"`); n != 2 {
		t.Errorf("%d access-log lines carry the incomplete reason, want 2", n)
	}
}
