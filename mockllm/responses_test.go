package mockllm_test

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	ooption "github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/responses"

	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/sseparse"
)

// openai-go's Responses client reads the mock's answers, streamed and not,
// as it reads the real API's: the same final response either way, text or
// function call, with reasoning and a cut by max_output_tokens, and usage
// equal to the plan.
func TestResponsesSDK(t *testing.T) {
	tests := []struct {
		name      string
		tools     bool
		maxTokens int64
		hdr       []string
		// want
		text, status        string
		out, cached, reason int64
	}{
		{name: "text", text: words(" tok", 1, 16), status: "completed", out: 16},
		{name: "text chunked cached", hdr: []string{"X-Mock-Output-Tokens", "7", "X-Mock-Tokens-Per-Chunk", "3",
			"X-Mock-Cached-Tokens", "64"}, text: words(" tok", 1, 7), status: "completed", out: 7, cached: 64},
		{name: "reasoning", hdr: []string{"X-Mock-Output-Tokens", "4", "X-Mock-Reasoning-Tokens", "3"},
			text: words(" tok", 1, 4), status: "completed", out: 7, reason: 3},
		{name: "incomplete", maxTokens: 16, hdr: []string{"X-Mock-Output-Tokens", "20"},
			text: words(" tok", 1, 16), status: "incomplete", out: 16},
		{name: "function call", tools: true, hdr: []string{"X-Mock-Tool-Call", "get_weather"}, status: "completed", out: 16},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, ts := start(t, mockllm.Options{})
			var opts []ooption.RequestOption
			for i := 0; i+1 < len(tc.hdr); i += 2 {
				opts = append(opts, ooption.WithHeader(tc.hdr[i], tc.hdr[i+1]))
			}
			client := openAIClient(ts, opts...)
			params := responses.ResponseNewParams{
				Model: "gpt-4.1",
				Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("What is the weather in Bergen?")},
			}
			if tc.maxTokens > 0 {
				params.MaxOutputTokens = openai.Int(tc.maxTokens)
			}
			if tc.tools {
				params.Tools = []responses.ToolUnionParam{{OfFunction: &responses.FunctionToolParam{
					Name: "get_weather", Parameters: map[string]any{"type": "object"}}}}
			}
			plain, err := client.Responses.New(waitCtx(t), params)
			if err != nil {
				t.Fatal(err)
			}
			streamed, deltas, kinds := streamResponse(t, client, params)
			for _, r := range []*responses.Response{plain, streamed} {
				checkResponse(t, r, tc.tools, tc.text, tc.status, tc.out, tc.cached, tc.reason)
			}
			// The input differs by the stream flag's bytes (the mock counts
			// input from the body's length); the rest is the same answer.
			if plain.OutputText() != streamed.OutputText() || plain.Usage.OutputTokens != streamed.Usage.OutputTokens ||
				plain.Usage.OutputTokensDetails.ReasoningTokens != streamed.Usage.OutputTokensDetails.ReasoningTokens ||
				len(plain.Output) != len(streamed.Output) {
				t.Errorf("streamed and plain answers differ: %q / %q, usage %s / %s",
					streamed.OutputText(), plain.OutputText(), streamed.Usage.RawJSON(), plain.Usage.RawJSON())
			}
			if !tc.tools && deltas != tc.text {
				t.Errorf("the deltas add up to %q, want %q", deltas, tc.text)
			}
			if kinds[0] != "response.created" || kinds[1] != "response.in_progress" ||
				kinds[len(kinds)-1] != "response."+tc.status {
				t.Errorf("event types %v", kinds)
			}
		})
	}
}

// streamResponse reads a streamed answer with the SDK: the final response
// from its terminal event, the text deltas joined, and the event types in
// order (checking that sequence numbers count from 0 by 1).
func streamResponse(t *testing.T, client openai.Client, params responses.ResponseNewParams) (*responses.Response, string, []string) {
	t.Helper()
	stream := client.Responses.NewStreaming(waitCtx(t), params)
	defer stream.Close()
	var (
		final  *responses.Response
		deltas strings.Builder
		kinds  []string
	)
	for stream.Next() {
		ev := stream.Current()
		if ev.SequenceNumber != int64(len(kinds)) {
			t.Errorf("event %d (%s) has sequence_number %d", len(kinds), ev.Type, ev.SequenceNumber)
		}
		kinds = append(kinds, ev.Type)
		switch ev.Type {
		case "response.output_text.delta":
			deltas.WriteString(ev.Delta)
		case "response.completed", "response.incomplete":
			r := ev.Response
			final = &r
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if final == nil {
		t.Fatalf("no terminal event in %v", kinds)
	}
	return final, deltas.String(), kinds
}

func checkResponse(t *testing.T, r *responses.Response, tool bool, text, status string, out, cached, reason int64) {
	t.Helper()
	u := r.Usage
	if string(r.Status) != status || r.Object != "response" || !strings.HasPrefix(r.ID, "resp_") ||
		u.OutputTokens != out || u.InputTokensDetails.CachedTokens != cached ||
		u.OutputTokensDetails.ReasoningTokens != reason || u.TotalTokens != u.InputTokens+u.OutputTokens ||
		u.InputTokens <= cached {
		t.Errorf("response %s: status %s, usage %s", r.ID, r.Status, u.RawJSON())
	}
	if status == "incomplete" && r.IncompleteDetails.Reason != "max_output_tokens" {
		t.Errorf("incomplete_details %s", r.IncompleteDetails.RawJSON())
	}
	if !tool {
		if r.OutputText() != text {
			t.Errorf("output text %q, want %q", r.OutputText(), text)
		}
		return
	}
	var calls int
	for _, item := range r.Output {
		if item.Type == "function_call" {
			calls++
			if item.Name != "get_weather" || item.Arguments.OfString != mockllm.ToolArguments || item.CallID == "" {
				t.Errorf("function call %s", item.RawJSON())
			}
		}
	}
	if calls != 1 {
		t.Errorf("%d function calls in %s", calls, r.RawJSON())
	}
}

// The mock's Responses stream, read by the gateway's own decoder: one
// token-bearing event per planned event (the added function call counts as
// its first), usage on the terminal event only, no [DONE].
func TestResponsesStreamDecodes(t *testing.T) {
	for _, c := range []struct {
		name       string
		body       string
		hdr        []string
		events     int
		out, think int64
	}{
		{"text", `{"model":"m","input":"hi","stream":true}`,
			[]string{"X-Mock-Output-Tokens", "9", "X-Mock-Tokens-Per-Chunk", "2"}, 5, 9, 0},
		{"reasoning", `{"model":"m","input":"hi","stream":true}`,
			[]string{"X-Mock-Output-Tokens", "3", "X-Mock-Reasoning-Tokens", "4"}, 7, 7, 4},
		{"function call", `{"model":"m","input":"hi","stream":true,"tools":[{"type":"function","name":"f","parameters":{}}]}`,
			[]string{"X-Mock-Output-Tokens", "6", "X-Mock-Tool-Call", "f"}, 6, 6, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, ts := start(t, mockllm.Options{})
			resp := post(t, ts, "/v1/responses", c.body, c.hdr...)
			raw, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			var tap sseparse.Tap
			tap.Reset(llm.DialectResponses)
			rd := sseparse.NewReader(bytes.NewReader(raw), 0)
			for {
				ev, err := rd.Next()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				tap.Observe(ev, time.Now())
			}
			u, ok := tap.Usage()
			if resp.StatusCode != http.StatusOK || tap.TokenEvents() != c.events || !tap.TerminalSeen() || tap.ErrorSeen() ||
				!ok || u.Output != c.out || u.Reasoning != c.think || bytes.Contains(raw, []byte("[DONE]")) {
				t.Errorf("status %d, %d token events (want %d), terminal %v, error %v, usage %+v (%v)",
					resp.StatusCode, tap.TokenEvents(), c.events, tap.TerminalSeen(), tap.ErrorSeen(), u, ok)
			}
		})
	}
}

// A stream fault on this API ends as api.openai.com ends a failing stream:
// the nested error event, then response.failed; the SDK raises on the
// error. A bad max_output_tokens is the API's 400.
func TestResponsesErrors(t *testing.T) {
	_, ts := start(t, mockllm.Options{})
	resp := post(t, ts, "/v1/responses", `{"model":"m","input":"hi","stream":true}`, "X-Mock-Fault", "error-event=2")
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var tap sseparse.Tap
	tap.Reset(llm.DialectResponses)
	rd := sseparse.NewReader(bytes.NewReader(raw), 0)
	var names []string
	for {
		ev, err := rd.Next()
		if err != nil {
			break
		}
		names = append(names, string(ev.Type))
		tap.Observe(ev, time.Now())
	}
	var rec llm.Record
	tap.Fill(&rec)
	if tap.TokenEvents() != 2 || !tap.ErrorSeen() || !tap.TerminalSeen() || rec.ErrorType != "server_error" ||
		!slices.Equal(names[len(names)-2:], []string{"error", "response.failed"}) {
		t.Errorf("failing stream: events %v, record %+v", names, rec)
	}

	client := openAIClient(ts, ooption.WithHeader("X-Mock-Fault", "error-event=1"))
	stream := client.Responses.NewStreaming(waitCtx(t), responses.ResponseNewParams{Model: "m",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}})
	for stream.Next() {
	}
	var streamErr *ssestream.StreamError
	if err := stream.Err(); !errors.As(err, &streamErr) || !strings.Contains(err.Error(), "server_error") {
		t.Errorf("the SDK's stream error: %v", err)
	}
	stream.Close()

	var apiErr *openai.Error
	plainClient := openAIClient(ts)
	_, err := plainClient.Responses.New(waitCtx(t), responses.ResponseNewParams{Model: "m",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}, MaxOutputTokens: openai.Int(8)})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Param != "max_output_tokens" {
		t.Errorf("max_output_tokens 8: %v", err)
	}
	_, err = plainClient.Responses.New(waitCtx(t), responses.ResponseNewParams{
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || apiErr.Param != "model" ||
		apiErr.Code != "missing_required_parameter" {
		t.Errorf("no model: %v", err)
	}
	resp = post(t, ts, "/v1/responses", `{"model":"m","input":"hi","stream_options":{"include_obfuscation":false}}`)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("stream_options without stream: %d", resp.StatusCode)
	}
}
