package mockllm_test

import (
	"bytes"
	"encoding/json"
	"net/http"
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

// offeredTools are the tools each toolCase offers, in this order.
var offeredTools = []string{"get_weather", "get_time"}

// toolCase is a conversation sent with offeredTools, and the answer it must
// get.
type toolCase struct {
	name string
	// header is the X-Mock-Tool-Call header, "" for none.
	header string
	// noTools sends the conversation without tools.
	noTools bool
	// turns is the conversation, in order: "user:<text>",
	// "assistant:<text>", "call" (the assistant calls get_weather) and
	// "result" (get_weather's result).
	turns []string
	// want is the tool the answer calls, "" for a text answer.
	want string
}

// toolCases are the ways a request asks, or does not ask, for a tool call.
// A coding agent offers tools on every request and runs every call it gets
// back, then sends the result: the mock must answer that with text, or the
// agent never ends.
var toolCases = []toolCase{
	{name: "offered but not asked", turns: []string{"user:What is the weather in Bergen?"}},
	{name: "asked by header for the first tool", header: "1", turns: []string{"user:Hi."}, want: "get_weather"},
	{name: "asked by header by name", header: "get_time", turns: []string{"user:Hi."}, want: "get_time"},
	{name: "asked by header without tools", header: "1", noTools: true, turns: []string{"user:Hi."}},
	{name: "named in the last user message", turns: []string{"user:What time is it? Use get_time."}, want: "get_time"},
	{name: "named in the last user message after an answer",
		turns: []string{"user:Hi.", "assistant:Hello.", "user:Call get_weather, please."}, want: "get_weather"},
	{name: "named only in an earlier user message",
		turns: []string{"user:Use get_time.", "assistant:It is noon.", "user:Thanks, that is all."}},
	{name: "named only inside a longer name", turns: []string{"user:Is get_time_zone a tool?"}},
	{name: "named in another case", turns: []string{"user:What does GET_TIME do?"}},
	{name: "after a tool result", turns: []string{"user:Use get_weather.", "call", "result"}},
	{name: "after a tool result, asked by header", header: "1",
		turns: []string{"user:Use get_weather.", "call", "result"}},
}

// answer is what the mock decided, as a client reads it: the called tool
// and its arguments (compacted), or the text.
type answer struct {
	tool, args, text string
}

// compact returns the JSON s without insignificant space, or s itself
// when it is not JSON.
func compact(s string) string {
	var b bytes.Buffer
	if json.Compact(&b, []byte(s)) != nil {
		return s
	}
	return b.String()
}

// runToolCases sends every toolCase to a mock with ask, which returns the
// whole and the streamed answer, and checks them.
func runToolCases(t *testing.T, ask func(t *testing.T, ts *httptest.Server, tc *toolCase) (whole, streamed answer)) {
	_, ts := start(t, mockllm.Options{})
	for _, tc := range toolCases {
		t.Run(tc.name, func(t *testing.T) {
			whole, streamed := ask(t, ts, &tc)
			tc.check(t, whole, streamed)
		})
	}
}

// openAI returns an openai-go client that sends the case's header.
func (tc *toolCase) openAI(ts *httptest.Server) openai.Client {
	if tc.header == "" {
		return openAIClient(ts)
	}
	return openAIClient(ts, ooption.WithHeader("X-Mock-Tool-Call", tc.header))
}

// anthropic returns an anthropic-sdk-go client that sends the case's header.
func (tc *toolCase) anthropic(ts *httptest.Server) anthropic.Client {
	if tc.header == "" {
		return anthropicClient(ts)
	}
	return anthropicClient(ts, aoption.WithHeader("X-Mock-Tool-Call", tc.header))
}

// check compares a whole and a streamed answer with the case's.
func (tc *toolCase) check(t *testing.T, whole, streamed answer) {
	t.Helper()
	want := answer{tool: tc.want, args: compact(mockllm.ToolArguments)}
	if tc.want == "" {
		want = answer{text: mockllm.Text(16)}
	}
	for _, got := range []struct {
		how string
		a   answer
	}{{"whole", whole}, {"streamed", streamed}} {
		if got.a != want {
			t.Errorf("%s: answer %+v, want %+v", got.how, got.a, want)
		}
	}
}

// TestChatToolCallOnlyWhenAsked: Chat Completions, with openai-go.
func TestChatToolCallOnlyWhenAsked(t *testing.T) {
	runToolCases(t, func(t *testing.T, ts *httptest.Server, tc *toolCase) (answer, answer) {
		client := tc.openAI(ts)
		params := openai.ChatCompletionNewParams{Model: "gpt-4o-mini"}
		for _, turn := range tc.turns {
			var m openai.ChatCompletionMessageParamUnion
			switch role, text, _ := strings.Cut(turn, ":"); role {
			case "user":
				m = openai.UserMessage(text)
			case "assistant":
				m = openai.AssistantMessage(text)
			case "call":
				m = openai.ChatCompletionMessageParamUnion{OfAssistant: &openai.ChatCompletionAssistantMessageParam{
					ToolCalls: []openai.ChatCompletionMessageToolCallUnionParam{{
						OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{ID: "call_1",
							Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{
								Name: "get_weather", Arguments: mockllm.ToolArguments}}}}}}
			case "result":
				m = openai.ToolMessage("Rain, 9 °C.", "call_1")
			}
			params.Messages = append(params.Messages, m)
		}
		if !tc.noTools {
			for _, name := range offeredTools {
				params.Tools = append(params.Tools, openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: name}))
			}
		}
		read := func(c *openai.ChatCompletion) answer {
			if len(c.Choices) != 1 {
				t.Fatalf("%d choices", len(c.Choices))
			}
			m := c.Choices[0].Message
			a := answer{text: m.Content}
			if len(m.ToolCalls) > 0 {
				a.tool, a.args = m.ToolCalls[0].Function.Name, compact(m.ToolCalls[0].Function.Arguments)
			}
			if finish := c.Choices[0].FinishReason; (a.tool != "") != (finish == "tool_calls") || len(m.ToolCalls) > 1 {
				t.Errorf("finish %q with %d tool calls", finish, len(m.ToolCalls))
			}
			return a
		}
		whole, err := client.Chat.Completions.New(waitCtx(t), params)
		if err != nil {
			t.Fatal(err)
		}
		stream := client.Chat.Completions.NewStreaming(waitCtx(t), params)
		var acc openai.ChatCompletionAccumulator
		for stream.Next() {
			acc.AddChunk(stream.Current())
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		return read(whole), read(&acc.ChatCompletion)
	})
}

// TestMessagesToolCallOnlyWhenAsked: Anthropic Messages, with
// anthropic-sdk-go. A tool result comes back, as Claude Code sends it, in a
// user message that also holds text, here naming a tool: the result still
// gets text.
func TestMessagesToolCallOnlyWhenAsked(t *testing.T) {
	runToolCases(t, func(t *testing.T, ts *httptest.Server, tc *toolCase) (answer, answer) {
		client := tc.anthropic(ts)
		params := anthropic.MessageNewParams{Model: "claude-sonnet-4-5", MaxTokens: 1024}
		for _, turn := range tc.turns {
			var m anthropic.MessageParam
			switch role, text, _ := strings.Cut(turn, ":"); role {
			case "user":
				m = anthropic.NewUserMessage(anthropic.NewTextBlock(text))
			case "assistant":
				m = anthropic.NewAssistantMessage(anthropic.NewTextBlock(text))
			case "call":
				m = anthropic.NewAssistantMessage(anthropic.NewToolUseBlock("toolu_1",
					map[string]any{"city": "Bergen"}, "get_weather"))
			case "result":
				m = anthropic.NewUserMessage(anthropic.NewToolResultBlock("toolu_1", "Rain, 9 °C.", false),
					anthropic.NewTextBlock("<system-reminder>get_time is also there.</system-reminder>"))
			}
			params.Messages = append(params.Messages, m)
		}
		if !tc.noTools {
			for _, name := range offeredTools {
				params.Tools = append(params.Tools, anthropic.ToolUnionParamOfTool(
					anthropic.ToolInputSchemaParam{Properties: map[string]any{}}, name))
			}
		}
		read := func(m *anthropic.Message) answer {
			if len(m.Content) != 1 {
				t.Fatalf("%d content blocks", len(m.Content))
			}
			b := m.Content[0]
			a := answer{text: b.Text}
			if b.Type == "tool_use" {
				a.tool, a.args = b.Name, compact(string(b.Input))
			}
			if (a.tool != "") != (m.StopReason == "tool_use") {
				t.Errorf("stop %q with a %s block", m.StopReason, b.Type)
			}
			return a
		}
		whole, err := client.Messages.New(waitCtx(t), params)
		if err != nil {
			t.Fatal(err)
		}
		stream := client.Messages.NewStreaming(waitCtx(t), params)
		var acc anthropic.Message
		for stream.Next() {
			if err := acc.Accumulate(stream.Current()); err != nil {
				t.Fatal(err)
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		return read(whole), read(&acc)
	})
}

// TestResponsesToolCallOnlyWhenAsked: the Responses API, with openai-go.
func TestResponsesToolCallOnlyWhenAsked(t *testing.T) {
	runToolCases(t, func(t *testing.T, ts *httptest.Server, tc *toolCase) (answer, answer) {
		client := tc.openAI(ts)
		var input responses.ResponseInputParam
		for _, turn := range tc.turns {
			var it responses.ResponseInputItemUnionParam
			switch role, text, _ := strings.Cut(turn, ":"); role {
			case "user":
				it = responses.ResponseInputItemParamOfMessage(text, responses.EasyInputMessageRoleUser)
			case "assistant":
				it = responses.ResponseInputItemParamOfMessage(text, responses.EasyInputMessageRoleAssistant)
			case "call":
				it = responses.ResponseInputItemParamOfFunctionCall(mockllm.ToolArguments, "call_1", "get_weather")
			case "result":
				it = responses.ResponseInputItemParamOfFunctionCallOutput("Rain, 9 °C.")
				it.OfFunctionCallOutput.CallID = openai.String("call_1")
			}
			input = append(input, it)
		}
		params := responses.ResponseNewParams{Model: "gpt-4.1", Store: openai.Bool(false),
			Input: responses.ResponseNewParamsInputUnion{OfInputItemList: input}}
		if !tc.noTools {
			for _, name := range offeredTools {
				params.Tools = append(params.Tools, responses.ToolUnionParam{OfFunction: &responses.FunctionToolParam{
					Name: name, Parameters: map[string]any{"type": "object"}}})
			}
		}
		read := func(r *responses.Response) answer {
			if len(r.Output) != 1 {
				t.Fatalf("%d output items", len(r.Output))
			}
			a := answer{text: r.OutputText()}
			if it := r.Output[0]; it.Type == "function_call" {
				a.tool, a.args = it.Name, compact(it.Arguments.OfString)
			}
			return a
		}
		whole, err := client.Responses.New(waitCtx(t), params)
		if err != nil {
			t.Fatal(err)
		}
		streamed, _, _ := streamResponse(t, client, params)
		return read(whole), read(streamed)
	})
}

// An X-Mock-Tool-Call header naming no offered tool is a typo, answered
// with a 400 in the route's dialect, as other bad X-Mock-* headers are.
func TestToolCallHeaderNamingNoOfferedToolIsABadRequest(t *testing.T) {
	m, ts := start(t, mockllm.Options{})
	for _, c := range []struct{ path, body, outerType string }{
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],` +
			`"tools":[{"type":"function","function":{"name":"get_weather"}}]}`, ""},
		{"/v1/messages", `{"model":"c","max_tokens":10,"messages":[{"role":"user","content":"hi"}],` +
			`"tools":[{"name":"get_weather","input_schema":{"type":"object"}}]}`, "error"},
		{"/v1/responses", `{"model":"m","input":"hi","tools":[{"type":"function","name":"get_weather","parameters":{}}]}`, ""},
	} {
		t.Run(c.path, func(t *testing.T) {
			resp := post(t, ts, c.path, c.body, "X-Mock-Tool-Call", "get_wether")
			var e struct {
				Type  string `json:"type"` // Anthropic's "error"
				Error struct {
					Type, Message string
				} `json:"error"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusBadRequest || e.Type != c.outerType || e.Error.Type != "invalid_request_error" ||
				!strings.Contains(e.Error.Message, `"get_wether"`) || !strings.Contains(e.Error.Message, "get_weather") {
				t.Errorf("status %d, error %+v", resp.StatusCode, e.Error)
			}
		})
	}
	if st := m.Stats(); st.BadRequests != 3 || st.Completed != 0 {
		t.Errorf("stats %+v, want 3 bad requests", st)
	}
}

// A background stream that called a tool because its header asked streams
// again with the same call: the GET that replays it carries no header, and
// the replay goes by the original request's.
func TestToolCallAskedByHeaderReplaysTheSame(t *testing.T) {
	_, ts := start(t, mockllm.Options{OutputTokens: 4})
	resp := post(t, ts, "/v1/responses", `{"model":"m","input":"hi","stream":true,"background":true,`+
		`"tools":[{"type":"function","name":"get_weather","parameters":{}}]}`, "X-Mock-Tool-Call", "1")
	orig := readAllEvents(t, resp)
	var id string
	for _, ev := range orig {
		if ev.name == "response.output_item.added" && path(obj(t, ev.data), "item", "name") != "get_weather" {
			t.Fatalf("the original did not call the tool: %s", ev.data)
		}
		if ev.name == "response.completed" {
			id, _ = path(obj(t, ev.data), "response", "id").(string)
		}
	}
	if id == "" {
		t.Fatalf("no response.completed in %v", orig)
	}
	again := readAllEvents(t, do(t, waitCtx(t), ts, http.MethodGet, "/v1/responses/"+id+"?stream=true", ""))
	if len(again) != len(orig) {
		t.Fatalf("replay: %d events, want %d", len(again), len(orig))
	}
	for i := range again {
		if again[i] != orig[i] {
			t.Errorf("event %d: %s\nwant %s", i, again[i].data, orig[i].data)
		}
	}
}
