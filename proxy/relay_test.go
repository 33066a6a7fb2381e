package proxy

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
)

// Transcripts from wire.md §7.
const (
	openAIRole  = `data: {"id":"chatcmpl-tg0001","object":"chat.completion.chunk","created":1767225600,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null,"obfuscation":"q3Zp"}` + "\n\n"
	openAITok1  = `data: {"id":"chatcmpl-tg0001","object":"chat.completion.chunk","created":1767225600,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"Oslo"},"logprobs":null,"finish_reason":null}],"usage":null,"obfuscation":"x9"}` + "\n\n"
	openAITok2  = `data: {"id":"chatcmpl-tg0001","object":"chat.completion.chunk","created":1767225600,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":" is the capital of Norway."},"logprobs":null,"finish_reason":null}],"usage":null,"obfuscation":"Lk"}` + "\n\n"
	openAIStop  = `data: {"id":"chatcmpl-tg0001","object":"chat.completion.chunk","created":1767225600,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null,"obfuscation":"aZ7"}` + "\n\n"
	openAIUsage = `data: {"id":"chatcmpl-tg0001","object":"chat.completion.chunk","created":1767225600,"model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":19,"completion_tokens":8,"total_tokens":27,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"obfuscation":"p"}` + "\n\n"
	openAIDone  = "data: [DONE]\n\n"

	anthropicText = "event: message_start\n" +
		`data: {"type":"message_start","message":{"id":"msg_tg0001","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":21,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}}}` + "\n\n" +
		"event: content_block_start\n" + `data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}` + "\n\n" +
		"event: ping\n" + `data: {"type":"ping"}` + "\n\n" +
		"event: content_block_delta\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Oslo"}}` + "\n\n" +
		"event: content_block_delta\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" is the capital of Norway."}}` + "\n\n" +
		"event: content_block_stop\n" + `data: {"type":"content_block_stop","index":0}` + "\n\n" +
		"event: message_delta\n" + `data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":9}}` + "\n\n" +
		"event: message_stop\n" + `data: {"type":"message_stop"}` + "\n\n"
)

// split cuts s into pieces of n bytes, so events straddle reads.
func split(s string, n int) [][]byte {
	var out [][]byte
	for len(s) > n {
		out = append(out, []byte(s[:n]))
		s = s[n:]
	}
	return append(out, []byte(s))
}

func TestRelayByteFidelity(t *testing.T) {
	full := openAIRole + openAITok1 + openAITok2 + openAIStop + openAIUsage + openAIDone
	bigContent := strings.Repeat("x", 1<<20)
	big := `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"` + bigContent + `"},"finish_reason":null}]}` + "\n\n"
	malformed := `data: {"id":"chatcmpl-tg0001","choices":[{"delta":{"content":` + "\n\n"
	cr := strings.ReplaceAll(openAIRole+openAITok1+openAITok2+openAIStop+openAIDone, "\n", "\r")
	crlfAnthropic := strings.ReplaceAll(anthropicText, "\n", "\r\n")

	tests := []struct {
		name      string
		path      string
		upstream  string
		pieces    int
		askUsage  bool   // the caller sets include_usage itself
		want      string // what the client must receive
		tokens    int    // token-bearing events the record must count
		output    int64  // output tokens in the record
		estimated bool
		terminal  bool
	}{
		{name: "client asked for usage: unchanged", path: "/v1/chat/completions", upstream: full, pieces: 7,
			askUsage: true, want: full, tokens: 2, output: 8, terminal: true},
		{name: "usage chunk added by the gateway is withheld", path: "/v1/chat/completions", upstream: full, pieces: 13,
			want: openAIRole + openAITok1 + openAITok2 + openAIStop + openAIDone, tokens: 2, output: 8, terminal: true},
		{name: "malformed event relayed as sent", path: "/v1/chat/completions",
			upstream: openAIRole + openAITok1 + malformed + openAITok2 + openAIStop + openAIUsage + openAIDone, pieces: 5,
			askUsage: true, want: openAIRole + openAITok1 + malformed + openAITok2 + openAIStop + openAIUsage + openAIDone,
			tokens: 2, output: 8, terminal: true},
		{name: "1 MiB event", path: "/v1/chat/completions", upstream: openAIRole + big + openAIStop + openAIDone,
			pieces: 7 << 10, askUsage: true, want: openAIRole + big + openAIStop + openAIDone, tokens: 1, output: 1,
			estimated: true, terminal: true},
		{name: "CR-only line ends", path: "/v1/chat/completions", upstream: cr, pieces: 3, askUsage: true,
			want: cr, tokens: 2, output: 2, estimated: true, terminal: true},
		{name: "anthropic CRLF", path: "/v1/messages", upstream: crlfAnthropic, pieces: 11, want: crlfAnthropic,
			tokens: 2, output: 9, terminal: true},
		{name: "comments and keep-alives", path: "/v1/messages",
			upstream: ": keep-alive\n\n" + anthropicText[:200] + anthropicText[200:] + ": bye\n\n", pieces: 64,
			want: ": keep-alive\n\n" + anthropicText + ": bye\n\n", tokens: 2, output: 9, terminal: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			up := &rawUpstream{pieces: split(tc.upstream, tc.pieces)}
			srv := httptest.NewServer(up)
			defer srv.Close()
			tg := newTestGateway(t, srv.URL, func(c *config.Config) { c.Server.MaxEventBytes = 4 << 20 })
			body := `{"model":"m","stream":true,"max_tokens":100,"messages":[]}`
			if tc.askUsage {
				body = `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[]}`
			}
			resp, got := post(t, tg.URL+tc.path, body, nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, got)
			}
			if !bytes.Equal(got, []byte(tc.want)) {
				t.Fatalf("client received %d bytes, want %d\n got: %.300q\nwant: %.300q", len(got), len(tc.want), got, tc.want)
			}
			sent, _ := up.request()
			switch {
			case tc.path != "/v1/chat/completions" || tc.askUsage:
				if string(sent) != body {
					t.Errorf("the request body was changed: upstream got %s", sent)
				}
			case !bytes.Contains(sent, []byte(`"stream_options":{"include_usage":true}`)):
				t.Errorf("include_usage was not added: upstream got %s", sent)
			}
			rec := tg.record(t)
			if rec.TokenEvents != tc.tokens || rec.Usage.Output != tc.output || rec.Estimated != tc.estimated ||
				rec.TerminalSeen != tc.terminal || rec.Outcome != llm.OutcomeOK {
				t.Errorf("record: token events %d output %d estimated %v terminal %v outcome %s; want %d %d %v %v ok",
					rec.TokenEvents, rec.Usage.Output, rec.Estimated, rec.TerminalSeen, rec.Outcome,
					tc.tokens, tc.output, tc.estimated, tc.terminal)
			}
			if rec.BytesOut != int64(len(tc.want)) {
				t.Errorf("record counts %d bytes out, client got %d", rec.BytesOut, len(tc.want))
			}
			if rec.Timing.FirstTokenOut.IsZero() || rec.Timing.FirstTokenOut.Before(rec.Timing.FirstToken) {
				t.Errorf("first token out %v before first token read %v", rec.Timing.FirstTokenOut, rec.Timing.FirstToken)
			}
		})
	}
}

func TestRelayEventTooLarge(t *testing.T) {
	huge := "data: " + strings.Repeat("y", 300<<10) + "\n\n"
	up := &rawUpstream{pieces: split(openAIRole+openAITok1+huge+openAIDone, 4096)}
	srv := httptest.NewServer(up)
	defer srv.Close()
	tg := newTestGateway(t, srv.URL, func(c *config.Config) { c.Server.MaxEventBytes = 64 << 10 })
	resp, got := post(t, tg.URL+"/v1/chat/completions", `{"model":"m","stream":true}`, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	// Everything before the oversized event arrived; nothing was invented.
	if !bytes.HasPrefix(got, []byte(openAIRole+openAITok1)) || bytes.Contains(got, []byte("[DONE]")) {
		t.Fatalf("client received %.200q", got)
	}
	rec := tg.record(t)
	if rec.Outcome != llm.OutcomeUpstreamError || rec.Interruption != llm.InterruptProtocolError || rec.TokenEvents != 1 {
		t.Fatalf("record outcome %s interruption %s tokens %d", rec.Outcome, rec.Interruption, rec.TokenEvents)
	}
}

func TestRelayTruncatedStream(t *testing.T) {
	// The upstream ends the body without [DONE] and in the middle of an event.
	up := &rawUpstream{pieces: [][]byte{[]byte(openAIRole + openAITok1 + `data: {"choi`)}}
	srv := httptest.NewServer(up)
	defer srv.Close()
	for _, errorEvents := range []bool{true, false} {
		tg := newTestGateway(t, srv.URL, func(c *config.Config) {
			c.Server.StreamErrorEvents = errorEvents
			c.Upstreams[0].Retry.MaxAttempts = 1
		})
		_, got := post(t, tg.URL+"/v1/chat/completions", `{"model":"m","stream":true}`, nil)
		// With stream error events the unterminated bytes are dropped (the
		// error event would be glued to them) and the error event ends
		// the stream; without, they pass as the upstream sent them.
		want := openAIRole + openAITok1 + string(openAIBrokenEvent)
		if !errorEvents {
			want = openAIRole + openAITok1 + `data: {"choi`
		}
		if string(got) != want {
			t.Fatalf("stream_error_events=%v: client received %q", errorEvents, got)
		}
		rec := tg.record(t)
		if rec.Outcome != llm.OutcomeUpstreamError || rec.Interruption != llm.InterruptUpstreamEOF ||
			rec.TerminalSeen || rec.Usage.Output != 1 || !rec.Estimated {
			t.Fatalf("record %+v", rec)
		}
	}
}
