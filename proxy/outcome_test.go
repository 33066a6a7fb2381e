package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
)

// timeoutErr is a net.Error that timed out, as a dialer's deadline
// gives.
type timeoutErr struct{}

func (timeoutErr) Error() string { return "i/o timeout" }

func (timeoutErr) Timeout() bool { return true }

func (timeoutErr) Temporary() bool { return true }

// TestConnectTimeoutIsConnectError: a dial that runs out of
// connect_timeout_seconds is a connect error (502 upstream_unreachable, the
// attempt's result connect_error), not an upstream timeout (504 "timeout"):
// the dial is judged before the timeout.
func TestConnectTimeoutIsConnectError(t *testing.T) {
	t.Run("real dial", func(t *testing.T) {
		// A 1 ns connect timeout expires before the dial starts: the
		// dialer returns its own *net.OpError "dial ... i/o timeout",
		// without touching the listening upstream.
		var hits atomic.Int32
		us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
		defer us.Close()
		tg := newTestGateway(t, us.URL, func(c *config.Config) {
			c.Upstreams[0].ConnectTimeoutSeconds = 1e-9
			c.Upstreams[0].Retry.MaxAttempts = 1
		})
		if d := config.Seconds(tg.gw.Config().Upstreams[0].ConnectTimeoutSeconds); d <= 0 {
			t.Fatalf("connect timeout %v: the dialer would have none", d)
		}
		resp, body := post(t, tg.URL+"/v1/chat/completions", plainChat, nil)
		rec := tg.record(t)
		if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), "upstream_unreachable") {
			t.Errorf("caller got %d %s; want 502 upstream_unreachable", resp.StatusCode, body)
		}
		wantAttempts(t, rec, "mock:0:connect_error")
		if rec.Outcome != llm.OutcomeUpstreamUnreachable || hits.Load() != 0 {
			t.Errorf("record outcome %s, upstream hits %d; want upstream_unreachable, 0", rec.Outcome, hits.Load())
		}
	})
	t.Run("classification", func(t *testing.T) {
		g := relayGateway(t, 0)
		cases := []struct {
			name    string
			err     error
			cause   error
			result  string
			outcome llm.Outcome
		}{
			{"dial timeout", &net.OpError{Op: "dial", Net: "tcp", Err: timeoutErr{}}, nil,
				resultConnectError, llm.OutcomeUpstreamUnreachable},
			{"dial refused", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, nil,
				resultConnectError, llm.OutcomeUpstreamUnreachable},
			{"read timeout", &net.OpError{Op: "read", Net: "tcp", Err: timeoutErr{}}, nil,
				resultTimeout, llm.OutcomeUpstreamTimeout},
			{"header phase", &net.OpError{Op: "dial", Net: "tcp", Err: timeoutErr{}}, errHeaderTimeout,
				resultHeaderTimeout, llm.OutcomeUpstreamTimeout},
		}
		for _, c := range cases {
			ex := &exchange{g: g, gen: g.gen.Load(), r: httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)}
			at := &attemptState{up: g.gen.Load().upstreams[0]}
			ctx, cancel := context.WithCancelCause(context.Background())
			if c.cause != nil {
				cancel(c.cause)
			}
			res := ex.noResponse(ctx, at, c.err)
			cancel(nil)
			if res.result != c.result || !res.retryable || res.fail == nil || res.fail.outcome != c.outcome {
				t.Errorf("%s: result %s retryable %v outcome %v; want %s, retryable, %s",
					c.name, res.result, res.retryable, res.fail != nil && res.fail.outcome == c.outcome, c.result, c.outcome)
			}
		}
	})
}

// TestCommittedFirstTokenCutLabelled: a stream committed at once (no
// retry left) and cut by the first-token timer is recorded as
// first_token_timeout, as a held one is.
func TestCommittedFirstTokenCutLabelled(t *testing.T) {
	m := mockllm.New(mockllm.Options{OutputTokens: 2})
	us := httptest.NewServer(m)
	defer us.Close()
	tg := newTestGateway(t, us.URL, func(c *config.Config) {
		c.Upstreams[0].Retry.MaxAttempts = 1
		c.Upstreams[0].FirstTokenTimeoutSeconds = 0.05
	})
	post(t, tg.URL+"/v1/chat/completions", streamChat, map[string]string{"X-Mock-Fault": "hang=0"})
	rec := tg.record(t)
	if rec.AttemptCount != 1 || rec.Attempts[0].Result != resultFirstTokenTimeout {
		t.Fatalf("attempts %v, want one first_token_timeout", attemptList(rec))
	}
}

func TestErrorFields(t *testing.T) {
	tests := []struct {
		name, body, typ, code string
	}{
		{"openai insufficient_quota",
			`{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`,
			"insufficient_quota", "insufficient_quota"},
		{"openai rate limit", `{"error":{"message":"slow down","type":"requests","param":null,"code":"rate_limit_exceeded"}}`,
			"requests", "rate_limit_exceeded"},
		{"openai null code", `{"error":{"message":"boom","type":"server_error","param":null,"code":null}}`, "server_error", ""},
		{"anthropic", `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_1"}`,
			"overloaded_error", ""},
		{"vllm numeric code", `{"error":{"object":"error","message":"boom","type":"InternalServerError","param":null,"code":500}}`,
			"InternalServerError", "500"},
		{"numeric type", `{"error":{"type":429}}`, "429", ""},
		{"fields in any order with spaces", "{ \"error\" : { \"code\" : \"c\" ,\n \"type\" : \"t\" } }", "t", "c"},
		{"bool type ignored", `{"error":{"type":true,"code":["x"]}}`, "", ""},
		{"missing error", `{"detail":"not found"}`, "", ""},
		{"string error", `{"error":"boom"}`, "", ""},
		{"null error", `{"error":null}`, "", ""},
		{"array error", `{"error":[{"type":"x"}]}`, "", ""},
		{"top-level type only", `{"type":"error"}`, "", ""},
		{"not JSON", `<html>502 Bad Gateway</html>`, "", ""},
		{"truncated", `{"error":{"type":"insufficient_quota"`, "", ""},
		{"empty", ``, "", ""},
		{"array body", `[{"error":{"type":"x"}}]`, "", ""},
		// JSON escapes are decoded: an escaped quota error is still one
		// (and so never retried).
		{"escaped", `{"error":{"type":"insufficient\u005fquota","code":"billing_hard_limit_reached\u0021"}}`,
			"insufficient_quota", "billing_hard_limit_reached!"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			typ, code := errorFields([]byte(tc.body))
			if typ != tc.typ || code != tc.code {
				t.Errorf("errorFields(%q) = (%q, %q), want (%q, %q)", tc.body, typ, code, tc.typ, tc.code)
			}
		})
	}
}

func TestErrorEventStatus(t *testing.T) {
	tests := []struct {
		typ  string
		want int
	}{
		{"overloaded_error", 529},
		{"api_error", 500},
		{"server_error", 500},
		{"internal_server_error", 500},
		{"InternalServerError", 500},
		{"rate_limit_error", 429},
		{"rate_limit_exceeded", 429},
		{"timeout_error", 504},
		{"not_found_error", 404},
		{"request_too_large", 413},
		{"service_unavailable", 503},
		{"ServiceUnavailableError", 503},
		{"503", 503},
		{"400", 400},
		{"599", 599},
		{"399", 0},
		{"600", 0},
		{"200", 0},
		{"5OO", 0},
		{"invalid_request_error", 400},
		{"insufficient_quota", 0},
		// The Responses API's codes in response.failed.
		{"invalid_prompt", 400},
		{"invalid_image", 400},
		{"image_too_large", 400},
		{"failed_to_download_image", 400},
		{"bio_policy", 400},
		{"data_residency_mismatch", 400},
		{"context_length_exceeded", 400},
		{"vector_store_timeout", 504},
		{"Overloaded_Error", 0},
		{"", 0},
	}
	for _, tc := range tests {
		if got := errorEventStatus(tc.typ); got != tc.want {
			t.Errorf("errorEventStatus(%q) = %d, want %d", tc.typ, got, tc.want)
		}
	}
	if got := errorEventStatus(""); got != 0 {
		t.Errorf("errorEventStatus(nil) = %d, want 0", got)
	}
}

func TestStatusResult(t *testing.T) {
	tests := []struct {
		status int
		want   string
	}{
		{400, resultClientError},
		{401, resultClientError},
		{404, resultClientError},
		{409, resultClientError},
		{413, resultClientError},
		{408, resultTimeout},
		{429, resultRateLimited},
		{500, resultServerError},
		{501, resultServerError},
		{502, resultServerError},
		{503, resultServerError},
		{504, resultTimeout},
		{529, resultOverloaded},
		{599, resultServerError},
	}
	for _, tc := range tests {
		if got := statusResult(tc.status); got != tc.want {
			t.Errorf("statusResult(%d) = %q, want %q", tc.status, got, tc.want)
		}
	}
}

// The ending table: every way an exchange can end that the gateway tells
// apart — the caller's or the attempt's context cause (none, caller gone,
// shutdown, header / first-token / idle / attempt timeout), an upstream read
// error, a caller that hangs up, a terminal marker relayed or not, the
// opening held (another attempt could follow) or committed, an error event
// seen, streamed or not — run through real sockets, with the outcome,
// interruption, attempt results, error type, status and the breaker's
// verdicts each one gives. It pins what the classifiers decide, so that
// moving them cannot change a verdict.

const (
	pinRole = `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n"
	pinTok  = `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}` + "\n\n"
	pinStop = `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\n"
	pinUse  = `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}` + "\n\n"
	pinDone = "data: [DONE]\n\n"
	pinErr  = `data: {"error":{"message":"boom","type":"server_error","param":null,"code":null}}` + "\n\n"
	pinQuot = `data: {"error":{"message":"no money","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}` + "\n\n"

	pinMsgStart = "event: message_start\n" + `data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[],"stop_reason":null,"usage":{"input_tokens":5,"output_tokens":1}}}` + "\n\n"
	pinMsgTok   = "event: content_block_delta\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}` + "\n\n"
	pinMsgDelta = "event: message_delta\n" + `data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":2}}` + "\n\n"
	pinMsgStop  = "event: message_stop\n" + `data: {"type":"message_stop"}` + "\n\n"
	pinMsgErr   = "event: error\n" + `data: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}` + "\n\n"

	pinChat       = `{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
	pinChatPlain  = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`
	pinMessages   = `{"model":"claude-x","stream":true,"max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`
	pinChatAnswer = `{"id":"c1","object":"chat.completion","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}`
)

// pinUp is what the upstream does with its n-th request (from 0).
type pinUp func(u *pinUpstream, w http.ResponseWriter, r *http.Request, n int)

type pinUpstream struct {
	script  pinUp
	n       atomic.Int32
	stalled chan struct{}
}

func (u *pinUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	u.script(u, w, r, int(u.n.Add(1)-1))
}

// signal tells the test the upstream reached its stall point.
func (u *pinUpstream) signal() {
	select {
	case u.stalled <- struct{}{}:
	default:
	}
}

// stall signals, then waits for the gateway to drop the request.
func (u *pinUpstream) stall(r *http.Request) {
	u.signal()
	select {
	case <-r.Context().Done():
	case <-time.After(10 * time.Second):
	}
}

func pinSSE(w http.ResponseWriter, events ...string) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	pinWrite(w, events...)
}

func pinWrite(w http.ResponseWriter, events ...string) {
	for _, e := range events {
		_, _ = io.WriteString(w, e)
		_ = http.NewResponseController(w).Flush()
	}
}

func pinJSON(w http.ResponseWriter, status int, body string, hdr ...string) {
	for i := 0; i+1 < len(hdr); i += 2 {
		w.Header().Set(hdr[i], hdr[i+1])
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, body)
}

// pinPartialJSON starts a JSON answer larger than the server's write
// buffers, so that the caller has its headers while the body is unfinished.
func pinPartialJSON(w http.ResponseWriter, status int) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	pinWrite(w, `{"id":"`+strings.Repeat("x", 16<<10))
}

// pinAbort cuts the connection: the gateway's read of the body fails.
func pinAbort() { panic(http.ErrAbortHandler) }

type pinWant struct {
	outcome   llm.Outcome
	interrupt llm.Interruption
	results   []string // the record's attempts, in order
	errType   string
	status    int
	// verdicts is the breaker's count of judged attempts, unhealthy the
	// count of those judged failures.
	verdicts, unhealthy int
}

type pinCase struct {
	name     string
	path     string // "" = /v1/chat/completions
	body     string // "" = pinChat
	attempts int    // max_attempts: 1 = committed at once, 2 = held
	edit     func(*config.Upstream)
	up       pinUp
	// caller is what ends the exchange from the caller's side, "WHAT@WHEN":
	// WHAT is "leave" (the caller cancels its request) or "shutdown" (the
	// server's base context is cancelled with ErrShutdown); WHEN is "stall"
	// (the upstream stalls), "headers" (the caller has the answer's headers
	// and the upstream stalls), "token" (the caller read the first token) or
	// "retry" (the gateway waits to retry). "" reads the whole answer.
	caller string
	want   pinWant
}

func pinTimeouts(header, first, idle, total float64) func(*config.Upstream) {
	return func(u *config.Upstream) {
		u.HeaderTimeoutSeconds, u.FirstTokenTimeoutSeconds, u.IdleTimeoutSeconds = header, first, idle
		if total > 0 {
			u.TimeoutSeconds = total
		}
	}
}

func pinStream(events ...string) pinUp {
	return func(_ *pinUpstream, w http.ResponseWriter, _ *http.Request, _ int) { pinSSE(w, events...) }
}

func pinStall(events ...string) pinUp {
	return func(u *pinUpstream, w http.ResponseWriter, r *http.Request, _ int) {
		if len(events) > 0 {
			pinSSE(w, events...)
		}
		u.stall(r)
	}
}

func pinAnswer(status int, body string) pinUp {
	return func(_ *pinUpstream, w http.ResponseWriter, _ *http.Request, _ int) { pinJSON(w, status, body) }
}

// pinCases is the ending table: streams, timers and callers, answers.
func pinCases() []pinCase {
	return slices.Concat(pinStreamCases(), pinTimerCases(), pinAnswerCases())
}

var (
	pinWhole     = pinStream(pinRole, pinTok, pinStop, pinUse, pinDone)
	pinBig       = "data: " + strings.Repeat("x", 70<<10) + "\n\n"
	pinServerErr = `{"error":{"message":"down","type":"server_error","code":null}}`
)

func pinOK(st int) pinWant {
	return pinWant{outcome: llm.OutcomeOK, results: []string{"ok"}, status: st, verdicts: 1}
}

// pinStreamCases: how a stream ends, committed or held.
func pinStreamCases() []pinCase {
	return []pinCase{
		{name: "stream whole", attempts: 1, up: pinWhole, want: pinOK(200)},
		{name: "stream whole, held", attempts: 2, up: pinWhole, want: pinOK(200)},
		{name: "stream whole, anthropic", path: "/v1/messages", body: pinMessages, attempts: 1,
			up: pinStream(pinMsgStart, pinMsgTok, pinMsgDelta, pinMsgStop), want: pinOK(200)},
		{name: "eof after token, committed", attempts: 1, up: pinStream(pinRole, pinTok),
			want: pinWant{outcome: llm.OutcomeUpstreamError, interrupt: llm.InterruptUpstreamEOF,
				results: []string{"stream_broken"}, status: 200, verdicts: 2, unhealthy: 1}},
		{name: "eof after token, held", attempts: 2, up: pinStream(pinRole, pinTok),
			want: pinWant{outcome: llm.OutcomeUpstreamError, interrupt: llm.InterruptUpstreamEOF,
				results: []string{"stream_broken"}, status: 200, verdicts: 2, unhealthy: 1}},
		{name: "read error after token", attempts: 1,
			up: func(_ *pinUpstream, w http.ResponseWriter, _ *http.Request, _ int) {
				pinSSE(w, pinRole, pinTok)
				pinAbort()
			},
			want: pinWant{outcome: llm.OutcomeUpstreamError, interrupt: llm.InterruptUpstreamEOF,
				results: []string{"stream_broken"}, status: 200, verdicts: 2, unhealthy: 1}},
		{name: "eof before token, committed", attempts: 1, up: pinStream(pinRole),
			want: pinWant{outcome: llm.OutcomeUpstreamError, interrupt: llm.InterruptUpstreamEOF,
				results: []string{"stream_broken"}, status: 200, verdicts: 1, unhealthy: 1}},
		{name: "eof before token, held", attempts: 2, up: pinStream(pinRole),
			want: pinWant{outcome: llm.OutcomeUpstreamError, interrupt: llm.InterruptUpstreamEOF,
				results: []string{"stream_broken", "stream_broken"}, status: 200, verdicts: 2, unhealthy: 2}},
		{name: "read error before token, held", attempts: 2,
			up: func(_ *pinUpstream, w http.ResponseWriter, _ *http.Request, _ int) { pinSSE(w, pinRole); pinAbort() },
			want: pinWant{outcome: llm.OutcomeUpstreamError, interrupt: llm.InterruptUpstreamEOF,
				results: []string{"stream_broken", "stream_broken"}, status: 200, verdicts: 2, unhealthy: 2}},
		{name: "held failure, then success", attempts: 2,
			up: func(u *pinUpstream, w http.ResponseWriter, r *http.Request, n int) {
				if n == 0 {
					pinSSE(w, pinRole)
					return
				}
				pinWhole(u, w, r, n)
			},
			want: pinWant{outcome: llm.OutcomeOK, results: []string{"stream_broken", "ok"}, status: 200, verdicts: 2, unhealthy: 1}},
		{name: "error event first, committed", attempts: 1, up: pinStream(pinErr),
			want: pinWant{outcome: llm.OutcomeUpstreamError, interrupt: llm.InterruptUpstreamErrorEvent,
				results: []string{"error_event"}, errType: "server_error", status: 200, verdicts: 1, unhealthy: 1}},
		{name: "error event first, held", attempts: 2, up: pinStream(pinErr),
			want: pinWant{outcome: llm.OutcomeUpstreamError, interrupt: llm.InterruptUpstreamErrorEvent,
				results: []string{"error_event", "error_event"}, errType: "server_error", status: 200, verdicts: 2, unhealthy: 2}},
		{name: "quota error event first, held", attempts: 2, up: pinStream(pinQuot),
			want: pinWant{outcome: llm.OutcomeUpstreamError, interrupt: llm.InterruptUpstreamErrorEvent,
				results: []string{"error_event"}, errType: "insufficient_quota", status: 200, verdicts: 1}},
		{name: "overloaded event first, anthropic, held", path: "/v1/messages", body: pinMessages, attempts: 2,
			up: pinStream(pinMsgStart, pinMsgErr),
			want: pinWant{outcome: llm.OutcomeUpstreamError, interrupt: llm.InterruptUpstreamErrorEvent,
				results: []string{"error_event", "error_event"}, errType: "overloaded_error", status: 200, verdicts: 2, unhealthy: 2}},
		{name: "error event after token", attempts: 1, up: pinStream(pinRole, pinTok, pinErr),
			want: pinWant{outcome: llm.OutcomeUpstreamError, interrupt: llm.InterruptUpstreamErrorEvent,
				results: []string{"error_event"}, errType: "server_error", status: 200, verdicts: 2, unhealthy: 1}},
		{name: "error event, then done", attempts: 1, up: pinStream(pinRole, pinTok, pinErr, pinDone),
			want: pinWant{outcome: llm.OutcomeUpstreamError, interrupt: llm.InterruptUpstreamErrorEvent,
				results: []string{"error_event"}, errType: "server_error", status: 200, verdicts: 2, unhealthy: 1}},
		{name: "event too large, committed", attempts: 1, up: pinStream(pinRole, pinTok, pinBig, pinDone),
			want: pinWant{outcome: llm.OutcomeUpstreamError, interrupt: llm.InterruptProtocolError,
				results: []string{"stream_broken"}, errType: "event_too_large", status: 200, verdicts: 2, unhealthy: 1}},
		// A preamble that fills the relay buffer is committed, so this one
		// is not retried.
		{name: "event too large before token", attempts: 2, up: pinStream(pinRole, pinBig, pinDone),
			want: pinWant{outcome: llm.OutcomeUpstreamError, interrupt: llm.InterruptProtocolError,
				results: []string{"stream_broken"}, errType: "event_too_large", status: 200, verdicts: 1, unhealthy: 1}},
	}
}

// pinTimerCases: the phase and attempt timers, a caller that leaves, a
// shutdown.
func pinTimerCases() []pinCase {
	return []pinCase{
		{name: "header timeout", attempts: 1, edit: pinTimeouts(0.15, 0, 0, 0), up: pinStall(),
			want: pinWant{outcome: llm.OutcomeUpstreamTimeout, results: []string{"header_timeout"}, status: 504, verdicts: 1, unhealthy: 1}},
		{name: "header timeout, retried", attempts: 2, edit: pinTimeouts(0.15, 0, 0, 0), up: pinStall(),
			want: pinWant{outcome: llm.OutcomeUpstreamTimeout, results: []string{"header_timeout", "header_timeout"}, status: 504, verdicts: 2, unhealthy: 2}},
		{name: "first-token timeout, committed", attempts: 1, edit: pinTimeouts(0, 0.15, 0, 0), up: pinStall(pinRole),
			want: pinWant{outcome: llm.OutcomeUpstreamTimeout, interrupt: llm.InterruptTimeout,
				results: []string{"first_token_timeout"}, status: 200, verdicts: 1, unhealthy: 1}},
		{name: "first-token timeout, held", attempts: 2, edit: pinTimeouts(0, 0.15, 0, 0), up: pinStall(pinRole),
			want: pinWant{outcome: llm.OutcomeUpstreamTimeout, interrupt: llm.InterruptTimeout,
				results: []string{"first_token_timeout", "first_token_timeout"}, status: 200, verdicts: 2, unhealthy: 2}},
		{name: "idle timeout", attempts: 1, edit: pinTimeouts(0, 0, 0.15, 0), up: pinStall(pinRole, pinTok),
			want: pinWant{outcome: llm.OutcomeUpstreamTimeout, interrupt: llm.InterruptIdleTimeout,
				results: []string{"idle_timeout"}, status: 200, verdicts: 2, unhealthy: 1}},
		{name: "idle timeout, held", attempts: 2, edit: pinTimeouts(0, 0, 0.15, 0), up: pinStall(pinRole, pinTok),
			want: pinWant{outcome: llm.OutcomeUpstreamTimeout, interrupt: llm.InterruptIdleTimeout,
				results: []string{"idle_timeout"}, status: 200, verdicts: 2, unhealthy: 1}},
		{name: "attempt timeout mid-stream", attempts: 1, edit: pinTimeouts(0, 0, 0, 0.3), up: pinStall(pinRole, pinTok),
			want: pinWant{outcome: llm.OutcomeUpstreamTimeout, interrupt: llm.InterruptTimeout,
				results: []string{"timeout"}, status: 200, verdicts: 2, unhealthy: 1}},
		{name: "attempt timeout before token, held", attempts: 2, edit: pinTimeouts(0, 0, 0, 0.3), up: pinStall(pinRole),
			want: pinWant{outcome: llm.OutcomeUpstreamTimeout, interrupt: llm.InterruptTimeout,
				results: []string{"timeout", "timeout"}, status: 200, verdicts: 2, unhealthy: 2}},
		{name: "attempt timeout before headers", attempts: 1, edit: pinTimeouts(0, 0, 0, 0.3), up: pinStall(),
			want: pinWant{outcome: llm.OutcomeUpstreamTimeout, results: []string{"timeout"}, status: 504, verdicts: 1, unhealthy: 1}},
		{name: "attempt timeout in a plain body", body: pinChatPlain, attempts: 1, edit: pinTimeouts(0, 0, 0, 0.3),
			up: func(u *pinUpstream, w http.ResponseWriter, r *http.Request, _ int) {
				pinPartialJSON(w, 200)
				u.stall(r)
			},
			want: pinWant{outcome: llm.OutcomeUpstreamTimeout, results: []string{"timeout"}, status: 200, verdicts: 1, unhealthy: 1}},
		{name: "caller leaves before headers", attempts: 1, caller: "leave@stall", up: pinStall(),
			want: pinWant{outcome: llm.OutcomeClientCancel, results: []string{"client_gone"}, status: 499}},
		{name: "caller leaves while held", attempts: 2, caller: "leave@stall", up: pinStall(pinRole),
			want: pinWant{outcome: llm.OutcomeClientCancel, results: []string{"client_gone"}, status: 499}},
		{name: "caller leaves mid-stream", attempts: 1, caller: "leave@token", up: pinStall(pinRole, pinTok),
			want: pinWant{outcome: llm.OutcomeClientCancel, interrupt: llm.InterruptClientCancel,
				results: []string{"client_gone"}, status: 200, verdicts: 1}},
		{name: "caller hangs up while tokens flow", attempts: 2, caller: "leave@token",
			up: func(_ *pinUpstream, w http.ResponseWriter, r *http.Request, _ int) {
				pinSSE(w, pinRole, pinTok)
				for i := 0; i < 400 && r.Context().Err() == nil; i++ {
					time.Sleep(5 * time.Millisecond)
					pinWrite(w, pinTok)
				}
			},
			want: pinWant{outcome: llm.OutcomeClientCancel, interrupt: llm.InterruptClientCancel,
				results: []string{"client_gone"}, status: 200, verdicts: 1}},
		{name: "caller leaves in a plain body", body: pinChatPlain, attempts: 1, caller: "leave@headers",
			up: func(u *pinUpstream, w http.ResponseWriter, r *http.Request, _ int) {
				pinPartialJSON(w, 200)
				u.stall(r)
			},
			want: pinWant{outcome: llm.OutcomeClientCancel, results: []string{"client_gone"}, status: 200}},
		{name: "caller leaves during the retry wait", attempts: 2, caller: "leave@retry",
			edit: func(u *config.Upstream) { u.Retry.MaxWaitSeconds = 30 },
			up: func(_ *pinUpstream, w http.ResponseWriter, _ *http.Request, _ int) {
				pinJSON(w, 429, `{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}`, "Retry-After", "5")
			},
			want: pinWant{outcome: llm.OutcomeClientCancel, results: []string{"rate_limited"}, status: 499, verdicts: 1, unhealthy: 1}},
		{name: "shutdown mid-stream", attempts: 1, caller: "shutdown@token", up: pinStall(pinRole, pinTok),
			want: pinWant{outcome: llm.OutcomeShutdown, interrupt: llm.InterruptShutdown,
				results: []string{"client_gone"}, status: 200, verdicts: 1}},
		{name: "shutdown before headers", attempts: 1, caller: "shutdown@stall", up: pinStall(),
			want: pinWant{outcome: llm.OutcomeShutdown, results: []string{"client_gone"}, status: 503}},
		{name: "shutdown during the retry wait", attempts: 2, caller: "shutdown@retry",
			edit: func(u *config.Upstream) { u.Retry.MaxWaitSeconds = 30 },
			up: func(_ *pinUpstream, w http.ResponseWriter, _ *http.Request, _ int) {
				pinJSON(w, 429, `{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}`, "Retry-After", "5")
			},
			want: pinWant{outcome: llm.OutcomeShutdown, results: []string{"rate_limited"}, status: 503, verdicts: 1, unhealthy: 1}},
		{name: "terminal relayed, upstream holds the body open", attempts: 1,
			up: pinStall(pinRole, pinTok, pinStop, pinUse, pinDone), want: pinOK(200)},
	}
}

// pinAnswerCases: error answers, plain answers, forwarded paths.
func pinAnswerCases() []pinCase {
	embed := `{"model":"e","input":"hi"}`
	return []pinCase{
		{name: "500, committed", attempts: 1, up: pinAnswer(500, pinServerErr),
			want: pinWant{outcome: llm.OutcomeUpstreamError, results: []string{"server_error"}, errType: "server_error",
				status: 500, verdicts: 1, unhealthy: 1}},
		{name: "500, retried", attempts: 2, up: pinAnswer(500, pinServerErr),
			want: pinWant{outcome: llm.OutcomeUpstreamError, results: []string{"server_error", "server_error"}, errType: "server_error",
				status: 500, verdicts: 2, unhealthy: 2}},
		{name: "429 quota, not retried", attempts: 2,
			up: pinAnswer(429, `{"error":{"message":"no money","type":"insufficient_quota","code":"insufficient_quota"}}`),
			want: pinWant{outcome: llm.OutcomeUpstreamError, results: []string{"rate_limited"}, errType: "insufficient_quota",
				status: 429, verdicts: 1}},
		{name: "400", attempts: 2, up: pinAnswer(400, `{"error":{"message":"bad","type":"invalid_request_error","code":null}}`),
			want: pinWant{outcome: llm.OutcomeUpstreamError, results: []string{"client_error"}, errType: "invalid_request_error",
				status: 400, verdicts: 1}},
		{name: "500 body broken, committed", attempts: 1,
			up: func(_ *pinUpstream, w http.ResponseWriter, _ *http.Request, _ int) {
				pinPartialJSON(w, 500)
				pinAbort()
			},
			want: pinWant{outcome: llm.OutcomeUpstreamError, results: []string{"server_error"}, status: 500, verdicts: 1, unhealthy: 1}},
		{name: "plain answer", body: pinChatPlain, attempts: 2, up: pinAnswer(200, pinChatAnswer), want: pinOK(200)},
		{name: "plain answer not JSON", body: pinChatPlain, attempts: 2, up: pinAnswer(200, `<html>proxy error</html>`),
			want: pinWant{outcome: llm.OutcomeUpstreamError, interrupt: llm.InterruptProtocolError,
				results: []string{"stream_broken"}, errType: "invalid_json", status: 200, verdicts: 1, unhealthy: 1}},
		{name: "plain answer broken", body: pinChatPlain, attempts: 2,
			up: func(_ *pinUpstream, w http.ResponseWriter, _ *http.Request, _ int) {
				pinPartialJSON(w, 200)
				pinAbort()
			},
			want: pinWant{outcome: llm.OutcomeUpstreamError, results: []string{"stream_broken"}, status: 200, verdicts: 1, unhealthy: 1}},
		{name: "stream answered as JSON", attempts: 2, up: pinAnswer(200, pinChatAnswer), want: pinOK(200)},
		{name: "plain Responses answer that failed", path: "/v1/responses", body: `{"model":"gpt-4o-mini","input":"hi"}`, attempts: 2,
			up: pinAnswer(200, `{"id":"resp_1","object":"response","status":"failed","error":{"code":"server_error","message":"x"},"output":[],"usage":null}`),
			want: pinWant{outcome: llm.OutcomeUpstreamError, results: []string{"error_event"}, errType: "server_error",
				status: 200, verdicts: 1, unhealthy: 1}},
		{name: "plain Responses answer, quota failure", path: "/v1/responses", body: `{"model":"gpt-4o-mini","input":"hi"}`, attempts: 2,
			up: pinAnswer(200, `{"id":"resp_1","object":"response","status":"failed","error":{"code":"insufficient_quota","message":"x"},"output":[],"usage":null}`),
			want: pinWant{outcome: llm.OutcomeUpstreamError, results: []string{"error_event"}, errType: "insufficient_quota",
				status: 200, verdicts: 1}},
		{name: "Responses stream that failed", path: "/v1/responses", body: `{"model":"gpt-4o-mini","input":"hi","stream":true}`, attempts: 1,
			up: pinStream("event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"status\":\"in_progress\"}}\n\n",
				"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"server_error\",\"code\":\"server_error\",\"message\":\"x\"}}\n\n"),
			want: pinWant{outcome: llm.OutcomeUpstreamError, interrupt: llm.InterruptUpstreamErrorEvent,
				results: []string{"error_event"}, errType: "server_error", status: 200, verdicts: 1, unhealthy: 1}},
		{name: "plain request answered as a stream", body: pinChatPlain, attempts: 1, up: pinWhole, want: pinOK(200)},
		{name: "connection closed before an answer", attempts: 2,
			up: func(*pinUpstream, http.ResponseWriter, *http.Request, int) { pinAbort() },
			want: pinWant{outcome: llm.OutcomeUpstreamError, results: []string{"connection_error", "connection_error"},
				status: 502, verdicts: 2, unhealthy: 2}},
		{name: "forwarded 200", path: "/v1/embeddings", body: embed, attempts: 2,
			up: pinAnswer(200, `{"object":"list","data":[],"usage":{"prompt_tokens":2,"total_tokens":2}}`), want: pinOK(200)},
		{name: "forwarded 500, not repeated", path: "/v1/embeddings", body: embed, attempts: 2, up: pinAnswer(500, pinServerErr),
			want: pinWant{outcome: llm.OutcomeUpstreamError, results: []string{"server_error"}, errType: "server_error",
				status: 500, verdicts: 1, unhealthy: 1}},
		{name: "forwarded stream", path: "/v1/files", body: `{"purpose":"x"}`, attempts: 1,
			up: pinStream("data: a\n\n", "data: b\n\n"), want: pinOK(200)},
	}
}

func TestEndingTable(t *testing.T) {
	for _, c := range pinCases() {
		t.Run(c.name, func(t *testing.T) {
			got, want := runPinCase(t, c), c.want
			if got.outcome != want.outcome || got.interrupt != want.interrupt || !slices.Equal(got.results, want.results) ||
				got.errType != want.errType || got.status != want.status ||
				got.verdicts != want.verdicts || got.unhealthy != want.unhealthy {
				t.Errorf("ending\n got: outcome %s, interruption %s, attempts %v, error type %q, status %d, verdicts %d (%d unhealthy)\nwant: outcome %s, interruption %s, attempts %v, error type %q, status %d, verdicts %d (%d unhealthy)",
					got.outcome, got.interrupt, got.results, got.errType, got.status, got.verdicts, got.unhealthy,
					want.outcome, want.interrupt, want.results, want.errType, want.status, want.verdicts, want.unhealthy)
			}
		})
	}
	t.Run("connection refused", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		tg := newTestGateway(t, "http://"+addr, func(c *config.Config) {
			c.Upstreams[0].Retry.MaxAttempts = 2
			c.Upstreams[0].Retry.BaseDelayMs, c.Upstreams[0].Retry.MaxDelayMs = 1, 1
		})
		resp, _ := post(t, tg.URL+"/v1/chat/completions", pinChat, nil)
		rec := tg.record(t)
		if resp.StatusCode != 502 || rec.Outcome != llm.OutcomeUpstreamUnreachable ||
			!slices.Equal(pinResults(rec), []string{"connect_error", "connect_error"}) {
			t.Errorf("refused: status %d, outcome %s, attempts %v; want 502, upstream_unreachable, [connect_error connect_error]",
				resp.StatusCode, rec.Outcome, pinResults(rec))
		}
	})
}

// pinResults lists the results of a record's attempts.
func pinResults(rec llm.Record) []string {
	var out []string
	for _, a := range rec.Attempts[:min(rec.AttemptCount, llm.MaxRecordedAttempts)] {
		out = append(out, a.Result)
	}
	return out
}

// runPinCase runs one case through a fresh gateway and upstream and reads
// how it ended.
func runPinCase(t *testing.T, c pinCase) pinWant {
	t.Helper()
	u := &pinUpstream{script: c.up, stalled: make(chan struct{}, 1)}
	up := httptest.NewServer(u)
	t.Cleanup(up.Close)
	tg := newTestGateway(t, up.URL, func(cfg *config.Config) {
		cfg.Server.MaxEventBytes = 64 << 10
		uc := &cfg.Upstreams[0]
		uc.Retry.MaxAttempts = c.attempts
		uc.Retry.BaseDelayMs, uc.Retry.MaxDelayMs = 1, 1
		uc.Breaker.Enabled = true
		uc.Breaker.ConsecutiveFailures, uc.Breaker.MinRequests = 100, 100
		if c.edit != nil {
			c.edit(uc)
		}
	})
	// The gateway's own server, whose base context a shutdown cancels.
	base, shutdown := context.WithCancelCause(context.Background())
	defer shutdown(nil)
	srv := httptest.NewUnstartedServer(tg.gw.Handler())
	srv.Config.BaseContext = func(net.Listener) context.Context { return base }
	srv.Start()
	t.Cleanup(srv.Close)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	what, when, _ := strings.Cut(c.caller, "@")
	end := func() {
		if what == "leave" {
			cancel()
		} else {
			shutdown(ErrShutdown)
		}
	}
	stalled := func() {
		select {
		case <-u.stalled:
		case <-time.After(10 * time.Second):
			t.Error("the upstream never stalled")
		}
	}
	done := pinCall(t, ctx, srv.URL, c, when, stalled, end)
	switch when {
	case "stall":
		stalled()
		end()
	case "retry":
		// The retry is counted just before its wait starts.
		for i := 0; i < 2000 && metricValue(t, tg, "tollgate_upstream_retries_total", map[string]string{"upstream": "mock"}) <= 0; i++ {
			time.Sleep(5 * time.Millisecond)
		}
		end()
	}
	rec := tg.record(t)
	<-done
	var w pinWant
	w.outcome, w.interrupt, w.results, w.errType, w.status = rec.Outcome, rec.Interruption, pinResults(rec), rec.ErrorType, rec.Status
	w.verdicts, w.unhealthy = breakerVerdicts(tg.gw.gen.Load().upstreams[0].breaker)
	return w
}

// pinCall sends the case's request as a caller on its own goroutine, which
// ends the exchange (end) once it has the headers and the upstream stalled,
// or once it read the first token, as when says; done closes when the
// caller is through.
func pinCall(t *testing.T, ctx context.Context, base string, c pinCase, when string, stalled, end func()) (done chan struct{}) {
	t.Helper()
	path, body := c.path, c.body
	if path == "" {
		path = "/v1/chat/completions"
	}
	if body == "" {
		body = pinChat
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	done = make(chan struct{})
	go func() {
		defer close(done)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return
		}
		defer resp.Body.Close()
		switch when {
		case "headers":
			stalled()
			end()
		case "token":
			br := bufio.NewReader(resp.Body)
			for {
				line, err := br.ReadString('\n')
				if err != nil || strings.Contains(line, `"content":"hi"`) {
					break
				}
			}
			end()
		}
		_, _ = io.Copy(io.Discard, resp.Body)
	}()
	return done
}

// breakerVerdicts counts the verdicts a breaker has taken and how many of
// them were failures.
func breakerVerdicts(b *breaker) (verdicts, failures int) {
	if b == nil {
		return 0, 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, bk := range b.buckets {
		verdicts += bk.requests
		failures += bk.failures
	}
	return verdicts, failures
}
