package proxy

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/sseparse"
)

// The error event that ends a broken stream is one complete SSE event that
// the dialect's SDK raises on: OpenAI a data payload whose only top-level
// member is an error object, Anthropic an `event: error` whose data has
// type "error" and an error object. The gateway's own tap reads it as an
// error event too.
func TestStreamErrorEvent(t *testing.T) {
	tests := []struct {
		d        llm.Dialect
		why      llm.Interruption
		wantType string // error.type
		wantCode string // OpenAI error.code
	}{
		{llm.DialectOpenAI, llm.InterruptIdleTimeout, "server_error", "upstream_timeout"},
		{llm.DialectOpenAI, llm.InterruptTimeout, "server_error", "upstream_timeout"},
		{llm.DialectOpenAI, llm.InterruptUpstreamEOF, "server_error", "upstream_stream_broken"},
		{llm.DialectOpenAI, llm.InterruptProtocolError, "server_error", "upstream_stream_broken"},
		{llm.DialectAnthropic, llm.InterruptIdleTimeout, "timeout_error", ""},
		{llm.DialectAnthropic, llm.InterruptTimeout, "timeout_error", ""},
		{llm.DialectAnthropic, llm.InterruptUpstreamEOF, "api_error", ""},
		{llm.DialectAnthropic, llm.InterruptProtocolError, "api_error", ""},
		{llm.DialectResponses, llm.InterruptIdleTimeout, "server_error", "upstream_timeout"},
		{llm.DialectResponses, llm.InterruptTimeout, "server_error", "upstream_timeout"},
		{llm.DialectResponses, llm.InterruptUpstreamEOF, "server_error", "upstream_stream_broken"},
		{llm.DialectResponses, llm.InterruptProtocolError, "server_error", "upstream_stream_broken"},
	}
	for _, tc := range tests {
		t.Run(tc.d.String()+"/"+tc.why.String(), func(t *testing.T) {
			raw := streamErrorEvent(tc.d, tc.why)
			rd := sseparse.NewReader(bytes.NewReader(raw), 0)
			ev, err := rd.Next()
			if err != nil {
				t.Fatalf("%q is not an SSE event: %v", raw, err)
			}
			evType, data := string(ev.Type), append([]byte(nil), ev.Data...)
			var tap sseparse.Tap
			tap.Reset(tc.d)
			obs := tap.Observe(ev, time.Now())
			tapType := tc.wantType
			if tc.d == llm.DialectResponses {
				tapType = tc.wantCode // the Responses API names an error by its code
			}
			if !obs.Error || string(obs.ErrorType) != tapType || obs.Terminal || obs.TokenBearing {
				t.Errorf("tap reads it as error=%v type=%q terminal=%v token=%v", obs.Error, obs.ErrorType, obs.Terminal, obs.TokenBearing)
			}
			if _, err := rd.Next(); err == nil || rd.Truncated() {
				t.Errorf("more than one event, or an unterminated one, in %q", raw)
			}
			type apiErr struct {
				Type    string  `json:"type"`
				Message string  `json:"message"`
				Code    *string `json:"code"`
			}
			var top map[string]json.RawMessage
			if err := json.Unmarshal(data, &top); err != nil {
				t.Fatalf("data is not a JSON object: %v: %s", err, data)
			}
			var e apiErr
			if err := json.Unmarshal(top["error"], &e); err != nil {
				t.Fatalf("no error object in %s: %v", data, err)
			}
			if e.Type != tc.wantType || e.Message == "" {
				t.Errorf("error type %q message %q, want type %q and a message", e.Type, e.Message, tc.wantType)
			}
			switch tc.d {
			case llm.DialectOpenAI:
				if evType != "" || len(top) != 1 {
					t.Errorf("event type %q, members %d: want a default event whose data holds only error", evType, len(top))
				}
				if e.Code == nil || *e.Code != tc.wantCode {
					t.Errorf("error.code %v, want %q", e.Code, tc.wantCode)
				}
			case llm.DialectAnthropic:
				if evType != "error" || string(top["type"]) != `"error"` {
					t.Errorf("event %q data type %s, want event: error with type \"error\"", evType, top["type"])
				}
			case llm.DialectResponses:
				// The nested form, which all three SDKs raise on.
				if evType != "error" || string(top["type"]) != `"error"` || e.Code == nil || *e.Code != tc.wantCode {
					t.Errorf("event %q data type %s code %v, want event: error, type \"error\", a nested error with code %q",
						evType, top["type"], e.Code, tc.wantCode)
				}
			}
		})
	}
}
