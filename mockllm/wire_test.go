package mockllm_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate-llm/tollgate/mockllm"
)

// isOpenAIToken reports whether an OpenAI chunk is token-bearing: it carries
// generated output, as the gateway's clocks count it.
func isOpenAIToken(t *testing.T, ev event) bool {
	if ev.data == "[DONE]" || !json.Valid([]byte(ev.data)) {
		return false
	}
	d, ok := path(obj(t, ev.data), "choices", "0", "delta").(map[string]any)
	if !ok {
		return false
	}
	if s, _ := d["content"].(string); s != "" {
		return true
	}
	if s, _ := d["reasoning_content"].(string); s != "" {
		return true
	}
	if tc, _ := d["tool_calls"].([]any); len(tc) > 0 {
		name, _ := path(tc, "0", "function", "name").(string)
		args, _ := path(tc, "0", "function", "arguments").(string)
		return name != "" || args != ""
	}
	return false
}

// isAnthropicToken reports whether an Anthropic event is token-bearing.
func isAnthropicToken(t *testing.T, ev event) bool {
	if ev.name != "content_block_delta" || !json.Valid([]byte(ev.data)) {
		return false
	}
	typ, _ := path(obj(t, ev.data), "delta", "type").(string)
	return typ != "signature_delta"
}

func TestOpenAIStreamWire(t *testing.T) {
	tests := []struct {
		name         string
		body         string
		n, tpc       int
		noUsage      bool
		wantUsage    bool
		wantMaxToken int // 0: no limit
	}{
		{name: "no usage asked", body: `{"model":"gpt-x","stream":true}`, n: 5, tpc: 1},
		{name: "usage asked", body: `{"model":"gpt-x","stream":true,"stream_options":{"include_usage":true}}`, n: 5, tpc: 1, wantUsage: true},
		{name: "usage asked but server has none", body: `{"model":"gpt-x","stream":true,"stream_options":{"include_usage":true}}`, n: 5, tpc: 1, noUsage: true},
		{name: "usage false", body: `{"model":"gpt-x","stream":true,"stream_options":{"include_usage":false}}`, n: 3, tpc: 1},
		{name: "chunks of 3", body: `{"model":"gpt-x","stream":true,"stream_options":{"include_usage":true}}`, n: 10, tpc: 3, wantUsage: true},
		{name: "max_tokens", body: `{"model":"gpt-x","stream":true,"max_tokens":4}`, n: 10, tpc: 1, wantMaxToken: 4},
		{name: "max_completion_tokens wins", body: `{"model":"gpt-x","stream":true,"max_tokens":1,"max_completion_tokens":6}`, n: 10, tpc: 2, wantMaxToken: 6},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, ts := start(t, mockllm.Options{OutputTokens: tc.n, TokensPerChunk: tc.tpc})
			hdr := []string{}
			if tc.noUsage {
				hdr = append(hdr, "X-Mock-No-Usage", "1")
			}
			resp := post(t, ts, "/v1/chat/completions", tc.body, hdr...)
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" ||
				resp.Header.Get("Cache-Control") != "no-cache" || resp.Header.Get("x-request-id") == "" {
				t.Fatalf("status %d headers %v", resp.StatusCode, resp.Header)
			}
			evs := readAllEvents(t, resp)
			produced, finish := tc.n, "stop"
			if tc.wantMaxToken > 0 && tc.wantMaxToken < tc.n {
				produced, finish = tc.wantMaxToken, "length"
			}
			nTok := (produced + tc.tpc - 1) / tc.tpc
			want := 1 + nTok + 1 + 1 // role, tokens, finish, [DONE]
			if tc.wantUsage {
				want++
			}
			if len(evs) != want {
				t.Fatalf("%d events, want %d: %v", len(evs), want, evs)
			}
			for i, ev := range evs {
				if ev.name != "" {
					t.Errorf("event %d has an event: line %q; OpenAI sends none", i, ev.name)
				}
			}
			if evs[len(evs)-1].data != "[DONE]" {
				t.Errorf("last event %q, want [DONE]", evs[len(evs)-1].data)
			}
			var id string
			for i, ev := range evs[:len(evs)-1] {
				c := obj(t, ev.data)
				if i == 0 {
					id, _ = c["id"].(string)
				}
				if c["id"] != id || c["object"] != "chat.completion.chunk" || c["model"] != "gpt-x" {
					t.Errorf("chunk %d: id %v object %v model %v", i, c["id"], c["object"], c["model"])
				}
				u, has := c["usage"]
				isUsage := tc.wantUsage && i == len(evs)-2
				switch {
				case !has:
					t.Errorf("chunk %d has no usage key", i)
				case isUsage && u == nil:
					t.Errorf("usage chunk %d has usage null", i)
				case !isUsage && u != nil:
					t.Errorf("chunk %d: usage %v, want null", i, u)
				}
			}
			// The role-only chunk, then the tokens in order.
			if d := path(obj(t, evs[0].data), "choices", "0", "delta"); fmt.Sprint(d) != "map[content: role:assistant]" {
				t.Errorf("first delta %v, want role-only with empty content", d)
			}
			var text strings.Builder
			for j := range nTok {
				ev := evs[1+j]
				if !isOpenAIToken(t, ev) {
					t.Fatalf("event %d is not a token event: %s", 1+j, ev.data)
				}
				got, _ := path(obj(t, ev.data), "choices", "0", "delta", "content").(string)
				if want := words(" tok", j*tc.tpc+1, min((j+1)*tc.tpc, produced)); got != want {
					t.Errorf("token event %d: %q, want %q", j, got, want)
				}
				text.WriteString(got)
			}
			if text.String() != mockllm.Text(produced) {
				t.Errorf("text %q, want Text(%d)", text.String(), produced)
			}
			fin := obj(t, evs[1+nTok].data)
			if path(fin, "choices", "0", "finish_reason") != finish || fmt.Sprint(path(fin, "choices", "0", "delta")) != "map[]" {
				t.Errorf("finish chunk %s, want empty delta and %q", evs[1+nTok].data, finish)
			}
			if tc.wantUsage {
				uc := obj(t, evs[len(evs)-2].data)
				if ch, _ := uc["choices"].([]any); ch == nil || len(ch) != 0 {
					t.Errorf("usage chunk choices %v, want []", uc["choices"])
				}
				prompt := baseTokens(lastBody(t, m, "/v1/chat/completions"))
				if num(path(uc, "usage", "prompt_tokens")) != prompt ||
					num(path(uc, "usage", "completion_tokens")) != int64(produced) ||
					num(path(uc, "usage", "total_tokens")) != prompt+int64(produced) {
					t.Errorf("usage %v, want %d+%d", uc["usage"], prompt, produced)
				}
			}
		})
	}
}

func TestOpenAIReasoningAndToolWire(t *testing.T) {
	_, ts := start(t, mockllm.Options{OutputTokens: 6})
	resp := post(t, ts, "/v1/chat/completions",
		`{"model":"m","stream":true,"tools":[{"type":"function","function":{"name":"get_weather"}}]}`,
		"X-Mock-Reasoning-Tokens", "3", "X-Mock-Tool-Call", "1")
	evs := readAllEvents(t, resp)
	var tokens []event
	for _, ev := range evs {
		if isOpenAIToken(t, ev) {
			tokens = append(tokens, ev)
		}
	}
	// 3 reasoning events, then the tool call's header and 5 argument fragments.
	if len(tokens) != 3+6 {
		t.Fatalf("%d token events, want 9", len(tokens))
	}
	var reasoning strings.Builder
	for i := range 3 {
		got, _ := path(obj(t, tokens[i].data), "choices", "0", "delta", "reasoning_content").(string)
		if want := " think" + strconv.Itoa(i+1); got != want {
			t.Errorf("reasoning event %d: %q, want %q", i, got, want)
		}
		reasoning.WriteString(got)
	}
	if reasoning.String() != mockllm.ReasoningText(3) {
		t.Errorf("reasoning %q, want ReasoningText(3)", reasoning.String())
	}
	head := path(obj(t, tokens[3].data), "choices", "0", "delta", "tool_calls", "0").(map[string]any)
	if num(head["index"]) != 0 || head["type"] != "function" || !strings.HasPrefix(head["id"].(string), "call_") ||
		path(head, "function", "name") != "get_weather" || path(head, "function", "arguments") != "" {
		t.Errorf("tool call header %v", head)
	}
	var args strings.Builder
	for _, ev := range tokens[4:] {
		tc := path(obj(t, ev.data), "choices", "0", "delta", "tool_calls", "0").(map[string]any)
		if _, has := tc["id"]; has || path(tc, "function", "name") != nil || num(tc["index"]) != 0 {
			t.Errorf("fragment carries header fields: %v", tc)
		}
		args.WriteString(path(tc, "function", "arguments").(string))
	}
	if args.String() != `{"city": "Bergen"}` {
		t.Errorf("arguments %q", args.String())
	}
	fin := obj(t, evs[len(evs)-2].data)
	if path(fin, "choices", "0", "finish_reason") != "tool_calls" {
		t.Errorf("finish %v, want tool_calls", evs[len(evs)-2].data)
	}
}

func TestAnthropicStreamWire(t *testing.T) {
	tests := []struct {
		name      string
		n, tpc, r int
		cached    int
		maxTokens int
	}{
		{name: "text", n: 4, tpc: 1},
		{name: "chunks", n: 7, tpc: 3, cached: 100},
		{name: "thinking", n: 3, tpc: 1, r: 2},
		{name: "thinking cut", n: 3, tpc: 1, r: 4, maxTokens: 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, ts := start(t, mockllm.Options{OutputTokens: tc.n, TokensPerChunk: tc.tpc})
			maxTokens := 1000
			if tc.maxTokens > 0 {
				maxTokens = tc.maxTokens
			}
			resp := post(t, ts, "/v1/messages", `{"model":"claude-x","stream":true,"max_tokens":`+strconv.Itoa(maxTokens)+`}`,
				"X-Mock-Reasoning-Tokens", strconv.Itoa(tc.r), "X-Mock-Cached-Tokens", strconv.Itoa(tc.cached))
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" || resp.Header.Get("request-id") == "" {
				t.Fatalf("status %d headers %v", resp.StatusCode, resp.Header)
			}
			evs := readAllEvents(t, resp)

			r := min(tc.r, maxTokens)
			n := min(tc.n, maxTokens-r)
			stop := "end_turn"
			if n < tc.n {
				stop = "max_tokens"
			}
			// Build the expected sequence of event names.
			want := []string{"message_start", "content_block_start", "ping"}
			if r > 0 {
				for range (r + tc.tpc - 1) / tc.tpc {
					want = append(want, "content_block_delta")
				}
				want = append(want, "content_block_delta", "content_block_stop") // signature, stop
				if n > 0 {
					want = append(want, "content_block_start")
				}
			}
			for range (n + tc.tpc - 1) / tc.tpc {
				want = append(want, "content_block_delta")
			}
			if n > 0 {
				want = append(want, "content_block_stop")
			}
			want = append(want, "message_delta", "message_stop")

			var got []string
			for _, ev := range evs {
				got = append(got, ev.name)
				if typ := obj(t, ev.data)["type"]; typ != ev.name {
					t.Errorf("event %q carries type %v", ev.name, typ)
				}
			}
			if strings.Join(got, ",") != strings.Join(want, ",") {
				t.Fatalf("events\n got %v\nwant %v", got, want)
			}

			base := baseTokens(lastBody(t, m, "/v1/messages"))
			start := obj(t, evs[0].data)
			if path(start, "message", "model") != "claude-x" || path(start, "message", "stop_reason") != nil ||
				fmt.Sprint(path(start, "message", "content")) != "[]" {
				t.Errorf("message_start %s", evs[0].data)
			}
			if num(path(start, "message", "usage", "input_tokens")) != base ||
				num(path(start, "message", "usage", "cache_read_input_tokens")) != int64(tc.cached) ||
				num(path(start, "message", "usage", "output_tokens")) != 1 {
				t.Errorf("message_start usage %v, want input %d cache_read %d output 1",
					path(start, "message", "usage"), base, tc.cached)
			}
			md := obj(t, evs[len(evs)-2].data)
			if path(md, "delta", "stop_reason") != stop || num(path(md, "usage", "output_tokens")) != int64(r+n) {
				t.Errorf("message_delta %s, want %s and output %d", evs[len(evs)-2].data, stop, r+n)
			}

			var thinking, text strings.Builder
			for _, ev := range evs {
				if !isAnthropicToken(t, ev) {
					continue
				}
				d := obj(t, ev.data)
				switch path(d, "delta", "type") {
				case "thinking_delta":
					thinking.WriteString(path(d, "delta", "thinking").(string))
				case "text_delta":
					text.WriteString(path(d, "delta", "text").(string))
				}
			}
			if thinking.String() != words(" think", 1, r) || text.String() != words(" tok", 1, n) {
				t.Errorf("thinking %q text %q", thinking.String(), text.String())
			}
		})
	}
}

func TestAnthropicToolWire(t *testing.T) {
	_, ts := start(t, mockllm.Options{OutputTokens: 4})
	resp := post(t, ts, "/v1/messages", `{"model":"c","max_tokens":100,"stream":true,"tools":[{"name":"get_weather","input_schema":{"type":"object"}}]}`,
		"X-Mock-Tool-Call", "get_weather")
	evs := readAllEvents(t, resp)
	cb := obj(t, evs[1].data)
	if path(cb, "content_block", "type") != "tool_use" || path(cb, "content_block", "name") != "get_weather" ||
		fmt.Sprint(path(cb, "content_block", "input")) != "map[]" {
		t.Errorf("content_block_start %s", evs[1].data)
	}
	var frags []string
	for _, ev := range evs {
		if isAnthropicToken(t, ev) {
			d := obj(t, ev.data)
			if path(d, "delta", "type") != "input_json_delta" {
				t.Errorf("delta %s", ev.data)
			}
			frags = append(frags, path(d, "delta", "partial_json").(string))
		}
	}
	if len(frags) != 4 || strings.Join(frags, "") != mockllm.ToolArguments {
		t.Errorf("fragments %q", frags)
	}
	if md := obj(t, evs[len(evs)-2].data); path(md, "delta", "stop_reason") != "tool_use" {
		t.Errorf("message_delta %s", evs[len(evs)-2].data)
	}
}

func TestBadInput(t *testing.T) {
	tests := []struct {
		name, method, path, body string
		hdr                      []string
		status                   int
		anthropic                bool
		msgHas                   string
	}{
		{"openai bad json", "POST", "/v1/chat/completions", `{"model":`, nil, 400, false, "JSON"},
		{"openai no model", "POST", "/v1/chat/completions", `{"messages":[]}`, nil, 400, false, "model"},
		{"openai wrong type", "POST", "/v1/chat/completions", `{"model":"m","stream":"yes"}`, nil, 400, false, "JSON"},
		{"openai stream_options without stream", "POST", "/v1/chat/completions", `{"model":"m","stream_options":{"include_usage":true}}`, nil, 400, false, "stream_options"},
		{"openai max_tokens 0", "POST", "/v1/chat/completions", `{"model":"m","max_tokens":0}`, nil, 400, false, "max_tokens"},
		{"openai GET", "GET", "/v1/chat/completions", ``, nil, 405, false, "GET"},
		{"unknown route", "POST", "/v1/completions", `{}`, nil, 404, false, "/v1/completions"},
		{"anthropic bad json", "POST", "/v1/messages", `nope`, nil, 400, true, "JSON"},
		{"anthropic no model", "POST", "/v1/messages", `{"max_tokens":5}`, nil, 400, true, "model"},
		{"anthropic no max_tokens", "POST", "/v1/messages", `{"model":"c"}`, nil, 400, true, "max_tokens"},
		{"anthropic max_tokens 0", "POST", "/v1/messages", `{"model":"c","max_tokens":0}`, nil, 400, true, "max_tokens"},
		{"anthropic PUT", "PUT", "/v1/messages", `{}`, nil, 405, true, "PUT"},
		{"count_tokens no model", "POST", "/v1/messages/count_tokens", `{}`, nil, 400, true, "model"},
		{"models POST", "POST", "/v1/models", `{}`, nil, 405, false, "POST"},
		{"embeddings bad input", "POST", "/v1/embeddings", `{"model":"e","input":42}`, nil, 400, false, "input"},
		{"bad ttft", "POST", "/v1/chat/completions", `{"model":"m"}`, []string{"X-Mock-TTFT-Ms", "-1"}, 400, false, "X-Mock-TTFT-Ms"},
		{"bad itl", "POST", "/v1/messages", `{"model":"c","max_tokens":5}`, []string{"X-Mock-ITL-Ms", "fast"}, 400, true, "X-Mock-ITL-Ms"},
		{"zero output", "POST", "/v1/chat/completions", `{"model":"m"}`, []string{"X-Mock-Output-Tokens", "0"}, 400, false, "X-Mock-Output-Tokens"},
		{"zero per chunk", "POST", "/v1/chat/completions", `{"model":"m"}`, []string{"X-Mock-Tokens-Per-Chunk", "0"}, 400, false, "Per-Chunk"},
		{"negative cached", "POST", "/v1/chat/completions", `{"model":"m"}`, []string{"X-Mock-Cached-Tokens", "-3"}, 400, false, "Cached"},
		{"bad no-usage", "POST", "/v1/chat/completions", `{"model":"m"}`, []string{"X-Mock-No-Usage", "maybe"}, 400, false, "No-Usage"},
		{"unknown fault", "POST", "/v1/chat/completions", `{"model":"m"}`, []string{"X-Mock-Fault", "explode=1"}, 400, false, "explode"},
		{"status 200", "POST", "/v1/messages", `{"model":"c","max_tokens":5}`, []string{"X-Mock-Fault", "status=200"}, 400, true, "status"},
		{"negative disconnect", "POST", "/v1/chat/completions", `{"model":"m"}`, []string{"X-Mock-Fault", "disconnect=-1"}, 400, false, "disconnect"},
		{"retry-after alone", "POST", "/v1/chat/completions", `{"model":"m"}`, []string{"X-Mock-Fault", "retry-after=3"}, 400, false, "status"},
		{"stall not a number", "POST", "/v1/chat/completions", `{"model":"m"}`, []string{"X-Mock-Fault", "stall=soon"}, 400, false, "stall"},
		{"empty fault value", "POST", "/v1/chat/completions", `{"model":"m"}`, []string{"X-Mock-Fault", "malformed="}, 400, false, "malformed"},
		{"error-event without stream", "POST", "/v1/chat/completions", `{"model":"m"}`, []string{"X-Mock-Fault", "error-event=1"}, 400, false, "stream"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, ts := start(t, mockllm.Options{})
			resp := do(t, t.Context(), ts, tc.method, tc.path, tc.body, tc.hdr...)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("content type %q", ct)
			}
			var b map[string]any
			if err := json.NewDecoder(resp.Body).Decode(&b); err != nil {
				t.Fatal(err)
			}
			msg := checkErrorShape(t, b, tc.anthropic, resp)
			if !strings.Contains(msg, tc.msgHas) {
				t.Errorf("message %q does not mention %q", msg, tc.msgHas)
			}
			if tc.status == 405 && resp.Header.Get("Allow") == "" {
				t.Error("405 without Allow")
			}
			st, err := m.WaitStats(waitCtx(t), func(s mockllm.Stats) bool { return s.BadRequests == 1 })
			if err != nil {
				t.Errorf("stats %+v: %v", st, err)
			}
		})
	}
}

// checkErrorShape checks b is an error body of the dialect and returns its
// message.
func checkErrorShape(t *testing.T, b map[string]any, anthropic bool, resp *http.Response) string {
	t.Helper()
	e, ok := b["error"].(map[string]any)
	if !ok {
		t.Fatalf("no error object in %v", b)
	}
	msg, _ := e["message"].(string)
	typ, _ := e["type"].(string)
	if msg == "" || typ == "" {
		t.Errorf("error %v lacks message or type", e)
	}
	if anthropic {
		if b["type"] != "error" || len(b) != 3 || len(e) != 2 {
			t.Errorf("anthropic error shape %v", b)
		}
		if rid, _ := b["request_id"].(string); rid == "" || rid != resp.Header.Get("request-id") {
			t.Errorf("request_id %q, header %q", rid, resp.Header.Get("request-id"))
		}
		return msg
	}
	_, hasParam := e["param"]
	_, hasCode := e["code"]
	if len(b) != 1 || len(e) != 4 || !hasParam || !hasCode {
		t.Errorf("openai error shape %v", b)
	}
	return msg
}

func TestStatusFaults(t *testing.T) {
	tests := []struct {
		anthropic bool
		fault     string
		status    int
		typ, code string
		retry     string
	}{
		{false, "status=429;retry-after=7", 429, "requests", "rate_limit_exceeded", "7"},
		{false, "status=500", 500, "server_error", "", ""},
		{false, "status=503; retry-after=2", 503, "server_error", "", "2"},
		{false, "status=404", 404, "invalid_request_error", "model_not_found", ""},
		{true, "status=429;retry-after=3", 429, "rate_limit_error", "", "3"},
		{true, "status=529", 529, "overloaded_error", "", ""},
		{true, "status=500", 500, "api_error", "", ""},
		{true, "status=401", 401, "authentication_error", "", ""},
		{true, "status=429;type=custom_error", 429, "custom_error", "", ""},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprint(tc.anthropic, tc.fault), func(t *testing.T) {
			m, ts := start(t, mockllm.Options{})
			p, body := "/v1/chat/completions", `{"model":"m","stream":true}`
			if tc.anthropic {
				p, body = "/v1/messages", `{"model":"m","max_tokens":5,"stream":true}`
			}
			resp := post(t, ts, p, body, "X-Mock-Fault", tc.fault)
			if resp.StatusCode != tc.status || resp.Header.Get("Retry-After") != tc.retry {
				t.Fatalf("status %d retry-after %q, want %d %q", resp.StatusCode, resp.Header.Get("Retry-After"), tc.status, tc.retry)
			}
			var b map[string]any
			if err := json.NewDecoder(resp.Body).Decode(&b); err != nil {
				t.Fatal(err)
			}
			checkErrorShape(t, b, tc.anthropic, resp)
			if got := path(b, "error", "type"); got != tc.typ {
				t.Errorf("type %v, want %s", got, tc.typ)
			}
			if !tc.anthropic {
				if got, _ := path(b, "error", "code").(string); got != tc.code {
					t.Errorf("code %q, want %q", got, tc.code)
				}
			}
			if _, err := m.WaitStats(waitCtx(t), func(s mockllm.Stats) bool { return s.Faults == 1 && s.Completed == 1 }); err != nil {
				t.Errorf("stats %+v", m.Stats())
			}
		})
	}
}
