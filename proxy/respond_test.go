package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
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
			var before sseparse.Tap // a stream that sent nothing the tap could number
			before.Reset(tc.d)
			raw := streamErrorEvent(tc.d, tc.why, &before)
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
				if evType != "error" || string(top["type"]) != `"error"` || e.Code == nil || *e.Code != tc.wantCode ||
					string(top["sequence_number"]) != "0" {
					t.Errorf("event %q data type %s code %v sequence %s, want event: error, type \"error\", "+
						"a nested error with code %q, sequence 0", evType, top["type"], e.Code, top["sequence_number"], tc.wantCode)
				}
			}
		})
	}
}

// TestResponsesErrorEndContinuesTheStream: the gateway's end of a broken
// Responses stream takes the next sequence numbers, and a response.failed
// for the response the stream created follows its error event; openai-go
// raises on the error.
func TestResponsesErrorEndContinuesTheStream(t *testing.T) {
	var tap sseparse.Tap
	tap.Reset(llm.DialectResponses)
	opening := `event: response.created` + "\n" +
		`data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_\"q","object":"response","status":"in_progress"}}` + "\n\n" +
		`event: response.output_text.delta` + "\n" +
		`data: {"type":"response.output_text.delta","sequence_number":1,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hi"}` + "\n\n"
	rd := sseparse.NewReader(strings.NewReader(opening), 0)
	for {
		ev, err := rd.Next()
		if err != nil {
			break
		}
		tap.Observe(ev, time.Now())
	}
	end := streamErrorEvent(llm.DialectResponses, llm.InterruptUpstreamEOF, &tap)
	type event struct {
		Type     string `json:"type"`
		Sequence int64  `json:"sequence_number"`
		Error    *struct {
			Code string `json:"code"`
		} `json:"error"`
		Response *struct {
			ID     string `json:"id"`
			Status string `json:"status"`
			Error  struct {
				Code string `json:"code"`
			} `json:"error"`
		} `json:"response"`
	}
	var got []event
	rd = sseparse.NewReader(bytes.NewReader(end), 0)
	for {
		ev, err := rd.Next()
		if err != nil {
			break
		}
		var e event
		if err := json.Unmarshal(ev.Data, &e); err != nil || string(ev.Type) != e.Type {
			t.Fatalf("event %q: %v %s", ev.Type, err, ev.Data)
		}
		got = append(got, e)
	}
	if len(got) != 2 || got[0].Type != "error" || got[0].Sequence != 2 || got[0].Error == nil ||
		got[0].Error.Code != "upstream_stream_broken" || got[1].Type != "response.failed" || got[1].Sequence != 3 ||
		got[1].Response == nil || got[1].Response.ID != `resp_"q` || got[1].Response.Status != "failed" ||
		got[1].Response.Error.Code != "server_error" {
		t.Fatalf("the gateway's end: %+v\n%s", got, end)
	}

	// openai-go reads the whole stream and raises on the error event.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, opening)
		_, _ = w.Write(end)
	}))
	defer srv.Close()
	c := openai.NewClient(option.WithBaseURL(srv.URL+"/v1"), option.WithAPIKey("k"), option.WithMaxRetries(0))
	stream := c.Responses.NewStreaming(context.Background(), responses.ResponseNewParams{Model: "m"})
	n := 0
	for stream.Next() {
		n++
	}
	if err := stream.Err(); err == nil || n != 2 || !strings.Contains(err.Error(), "upstream_stream_broken") {
		t.Errorf("openai-go read %d events, then %v; want the 2 events, then the error", n, err)
	}
	_ = stream.Close()
}

// TestHoldIsRecorded: a stream that another attempt could follow is held
// until its first token: its headers go out no sooner than the first token
// was read, and the record's hold (upstream first byte to headers) spans
// the wait for it. A stream no attempt could follow is not held: its
// headers go out before its first token. Both orders are causal, so no
// machine's speed changes them.
func TestHoldIsRecorded(t *testing.T) {
	const ttft = 300 * time.Millisecond
	mock := httptest.NewServer(mockllm.New(mockllm.Options{TTFT: ttft, OutputTokens: 3}))
	t.Cleanup(mock.Close)
	for _, c := range []struct {
		name    string
		retries int
		held    bool
	}{{"held", 3, true}, {"not held", 1, false}} {
		t.Run(c.name, func(t *testing.T) {
			tg := newTestGateway(t, mock.URL, func(cfg *config.Config) { cfg.Upstreams[0].Retry.MaxAttempts = c.retries })
			resp, err := http.Post(tg.URL+"/v1/chat/completions", "application/json",
				strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			rec := tg.record(t)
			tm := rec.Timing
			hold, ok := rec.Hold()
			headers, hok := rec.TimeToHeaders()
			if !ok || !hok || tm.FirstToken.IsZero() || tm.UpFirstByte.IsZero() {
				t.Fatalf("hold %v (%v), headers %v (%v), timing %+v", hold, ok, headers, hok, tm)
			}
			if c.held && (tm.HeadersOut.Before(tm.FirstToken) || hold < tm.FirstToken.Sub(tm.UpFirstByte)) {
				t.Errorf("held: headers at %v, first token read at %v, hold %v", tm.HeadersOut.Sub(tm.In), tm.FirstToken.Sub(tm.In), hold)
			}
			if !c.held && !tm.HeadersOut.Before(tm.FirstToken) {
				t.Errorf("not held: headers at %v, after the first token read at %v", tm.HeadersOut.Sub(tm.In), tm.FirstToken.Sub(tm.In))
			}
			if headers > rec.E2E() || hold > headers {
				t.Errorf("headers %v, hold %v, E2E %v", headers, hold, rec.E2E())
			}
		})
	}
}
