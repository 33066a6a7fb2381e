package proxy

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate-llm/tollgate/llm"
)

func TestAddIncludeUsage(t *testing.T) {
	tests := []struct {
		name, in, want string
		ok             bool
	}{
		{"absent", `{"model":"m","stream":true}`,
			`{"model":"m","stream":true,"stream_options":{"include_usage":true}}`, true},
		{"absent, whitespace and trailing newline kept", "{ \"model\" : \"m\", \"stream\": true }\n",
			"{ \"model\" : \"m\", \"stream\": true ,\"stream_options\":{\"include_usage\":true}}\n", true},
		{"null", `{"stream_options":null,"model":"m"}`,
			`{"stream_options":{"include_usage":true},"model":"m"}`, true},
		{"empty object", `{"model":"m","stream_options":{}}`,
			`{"model":"m","stream_options":{"include_usage":true}}`, true},
		{"other member kept", `{"model":"m","stream_options":{"include_obfuscation":false}}`,
			`{"model":"m","stream_options":{"include_usage":true,"include_obfuscation":false}}`, true},
		{"false flipped", `{"model":"m","stream_options":{"include_usage":false,"x":1}}`,
			`{"model":"m","stream_options":{"include_usage":true,"x":1}}`, true},
		{"escaped and nested look-alikes untouched",
			`{"messages":[{"content":"\"stream_options\":{}"}],"model":"m"}`,
			`{"messages":[{"content":"\"stream_options\":{}"}],"model":"m","stream_options":{"include_usage":true}}`, true},
		{"unicode kept byte for byte", `{"model":"m","messages":[{"content":"Ωmega \u00e9"}]}`,
			`{"model":"m","messages":[{"content":"Ωmega \u00e9"}],"stream_options":{"include_usage":true}}`, true},
		{"wrong type left alone", `{"model":"m","stream_options":"x"}`, `{"model":"m","stream_options":"x"}`, false},
		{"not an object", `[1]`, `[1]`, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := addIncludeUsage([]byte(tc.in))
			if ok != tc.ok || string(got) != tc.want {
				t.Fatalf("addIncludeUsage(%s) = %s, %v; want %s, %v", tc.in, got, ok, tc.want, tc.ok)
			}
			if ok {
				var v struct {
					StreamOptions struct {
						IncludeUsage bool `json:"include_usage"`
					} `json:"stream_options"`
				}
				if err := json.Unmarshal(got, &v); err != nil || !v.StreamOptions.IncludeUsage {
					t.Fatalf("result does not decode with include_usage true: %v", err)
				}
			}
		})
	}
}

func TestInspectRequest(t *testing.T) {
	tests := []struct {
		name    string
		d       llm.Dialect
		body    string
		want    requestInfo
		wantErr string // substring of the caller-facing message
	}{
		{name: "openai stream", d: llm.DialectOpenAI,
			body: `{"model":"gpt","stream":true,"max_completion_tokens":50,"max_tokens":9}`,
			want: requestInfo{Model: "gpt", Stream: true, MaxTokens: 50}},
		{name: "client asked for usage", d: llm.DialectOpenAI,
			body: `{"model":"gpt","stream":true,"stream_options":{"include_usage":true}}`,
			want: requestInfo{Model: "gpt", Stream: true, MaxTokens: -1, IncludeUsage: true}},
		{name: "anthropic", d: llm.DialectAnthropic, body: `{"model":"claude","max_tokens":1024,"messages":[]}`,
			want: requestInfo{Model: "claude", MaxTokens: 1024}},
		{name: "stream null", d: llm.DialectOpenAI, body: `{"model":"m","stream":null}`,
			want: requestInfo{Model: "m", MaxTokens: -1}},
		{name: "empty", d: llm.DialectOpenAI, body: ``, wantErr: "empty"},
		{name: "invalid json", d: llm.DialectOpenAI, body: `{"model":`, wantErr: "not valid JSON"},
		{name: "array", d: llm.DialectOpenAI, body: `[{"model":"m"}]`, wantErr: "JSON object"},
		{name: "missing model", d: llm.DialectAnthropic, body: `{"max_tokens":5}`, wantErr: `missing required field "model"`},
		{name: "model not string", d: llm.DialectOpenAI, body: `{"model":5}`, wantErr: `"model" must be a non-empty string`},
		{name: "empty model", d: llm.DialectOpenAI, body: `{"model":""}`, wantErr: `"model" must be a non-empty string`},
		{name: "stream not bool", d: llm.DialectOpenAI, body: `{"model":"m","stream":"yes"}`, wantErr: `"stream" must be a boolean`},
		{name: "max tokens not int", d: llm.DialectAnthropic, body: `{"model":"m","max_tokens":"x"}`, wantErr: "integer"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := inspectRequest(tc.d, []byte(tc.body))
			if tc.wantErr != "" {
				if err == nil {
					t.Fatalf("no error; want %q", tc.wantErr)
				}
				if err.Status != http.StatusBadRequest || !strings.Contains(err.Msg, tc.wantErr) {
					t.Fatalf("error %d %q; want 400 containing %q", err.Status, err.Msg, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error %v", err)
			}
			if got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestHopHeaders(t *testing.T) {
	in := http.Header{
		"Connection":        {"keep-alive, X-Secret-Hop"},
		"X-Secret-Hop":      {"1"},
		"Keep-Alive":        {"timeout=5"},
		"Te":                {"trailers"},
		"Transfer-Encoding": {"chunked"},
		"Upgrade":           {"h2c"},
		"Forwarded":         {"for=1.2.3.4"},
		"X-Forwarded-For":   {"1.2.3.4"},
		"Accept-Encoding":   {"gzip"},
		"Authorization":     {"Bearer sk-test"},
		"Anthropic-Beta":    {"a,b"},
	}
	out := upstreamRequestHeaders(in)
	for _, k := range []string{"Connection", "X-Secret-Hop", "Keep-Alive", "Te", "Transfer-Encoding", "Upgrade",
		"Forwarded", "X-Forwarded-For", "Accept-Encoding"} {
		if _, ok := out[k]; ok {
			t.Errorf("%s forwarded upstream", k)
		}
	}
	if out.Get("Authorization") != "Bearer sk-test" || out.Get("Anthropic-Beta") != "a,b" {
		t.Errorf("end-to-end headers changed: %v", out)
	}
	if v, ok := out["User-Agent"]; !ok || len(v) != 1 || v[0] != "" {
		t.Errorf("missing User-Agent should stay empty, got %q", v)
	}
	if in.Get("Connection") == "" {
		t.Error("the caller's header map was modified")
	}

	dst := http.Header{}
	copyResponseHeaders(dst, http.Header{
		"Connection": {"X-Hop"}, "X-Hop": {"1"}, "Content-Length": {"10"}, "Keep-Alive": {"x"},
		"Content-Type": {"text/event-stream"}, "X-Request-Id": {"req_1"},
	})
	for _, k := range []string{"Connection", "X-Hop", "Content-Length", "Keep-Alive"} {
		if _, ok := dst[k]; ok {
			t.Errorf("%s copied to the client", k)
		}
	}
	if dst.Get("Content-Type") != "text/event-stream" || dst.Get("X-Request-Id") != "req_1" {
		t.Errorf("end-to-end response headers lost: %v", dst)
	}
}

func TestCallerKey(t *testing.T) {
	tests := []struct {
		h             http.Header
		key           string
		ok, malformed bool
		name          string
	}{
		{http.Header{"Authorization": {"Bearer sk-1"}}, "sk-1", true, false, "bearer"},
		{http.Header{"Authorization": {"bearer  sk-1 "}}, "sk-1", true, false, "case and spaces"},
		{http.Header{"X-Api-Key": {"sk-ant"}}, "sk-ant", true, false, "x-api-key"},
		{http.Header{"Authorization": {"Basic abc"}}, "", false, true, "basic"},
		{http.Header{"Authorization": {"Bearer"}}, "", false, true, "no token"},
		{http.Header{"Authorization": {"Bearer a b"}}, "", false, true, "space in token"},
		{http.Header{}, "", false, false, "none"},
	}
	for _, tc := range tests {
		key, ok, malformed := callerKey(tc.h)
		if key != tc.key || ok != tc.ok || malformed != tc.malformed {
			t.Errorf("%s: callerKey = %q %v %v; want %q %v %v", tc.name, key, ok, malformed, tc.key, tc.ok, tc.malformed)
		}
	}
	if id := keyID("sk-secret-value"); len(id) != 12 || strings.Contains(id, "secret") {
		t.Errorf("keyID = %q", id)
	}
	if keyID("a") == keyID("b") {
		t.Error("different keys share an id")
	}
}
