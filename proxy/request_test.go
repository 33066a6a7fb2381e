package proxy

import (
	"bytes"
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
		{name: "responses", d: llm.DialectResponses,
			body: `{"model":"gpt","input":"hi","stream":true,"max_output_tokens":64,"max_tokens":9,"background":true}`,
			want: requestInfo{Model: "gpt", Stream: true, MaxTokens: 64, Background: true}},
		{name: "responses without max_output_tokens", d: llm.DialectResponses, body: `{"model":"gpt","input":"hi"}`,
			want: requestInfo{Model: "gpt", MaxTokens: -1}},
		{name: "responses max_output_tokens not int", d: llm.DialectResponses,
			body: `{"model":"gpt","max_output_tokens":"64"}`, wantErr: "integer"},
		{name: "responses background not bool", d: llm.DialectResponses,
			body: `{"model":"gpt","background":"yes"}`, wantErr: `"background" must be a boolean`},
		{name: "responses missing model", d: llm.DialectResponses, body: `{"input":"hi"}`, wantErr: `missing required field "model"`},
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

// FuzzAddIncludeUsage checks the request rewrite on arbitrary bodies: it
// never panics; when it edits, the result is valid JSON asking for usage and
// every other top-level member decodes exactly as before; when it does not,
// the body is returned unchanged.
func FuzzAddIncludeUsage(f *testing.F) {
	for _, seed := range []string{
		`{"model":"m","stream":true}`,
		`{}`,
		`{"stream_options":null}`,
		`{"stream_options":{}}`,
		`{"stream_options":{"include_usage":false,"x":[1,{"y":"}"}]}}`,
		`{"stream_options":"x"}`,
		`{"a":"\"stream_options\":{}","stream_options":{"include_usage":null}}`,
		` { "model" : "m" } `,
		`[1,2]`,
		`{"model":`,
		`{"stream_options":{},"stream_options":{"include_usage":true}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		orig := bytes.Clone(body)
		out, ok := addIncludeUsage(body)
		if !bytes.Equal(body, orig) {
			t.Fatal("the input was modified in place")
		}
		if !ok {
			if !bytes.Equal(out, body) {
				t.Fatalf("not ok but changed: %q -> %q", body, out)
			}
			return
		}
		var before, after map[string]json.RawMessage
		if json.Unmarshal(body, &before) != nil {
			// The gateway validates bodies before rewriting; an invalid one
			// may be edited but must not be made valid-looking garbage.
			return
		}
		if err := json.Unmarshal(out, &after); err != nil {
			t.Fatalf("rewrite of valid %q is invalid %q: %v", body, out, err)
		}
		var so struct {
			IncludeUsage bool `json:"include_usage"`
		}
		if err := json.Unmarshal(after["stream_options"], &so); err != nil || !so.IncludeUsage {
			t.Fatalf("rewrite %q does not ask for usage", out)
		}
		for k, v := range before {
			if k == "stream_options" {
				continue
			}
			if !bytes.Equal(v, after[k]) {
				t.Fatalf("member %q changed: %s -> %s", k, v, after[k])
			}
		}
		if _, aerr := inspectRequest(llm.DialectOpenAI, out); aerr == nil {
			if info, _ := inspectRequest(llm.DialectOpenAI, out); !info.IncludeUsage {
				t.Fatalf("inspectRequest does not see include_usage in %q", out)
			}
		}
	})
}
