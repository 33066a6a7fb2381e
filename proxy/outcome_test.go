package proxy

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

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
		if d := config.Seconds(tg.gw.cfg.Upstreams[0].ConnectTimeoutSeconds); d <= 0 {
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
			ex := &exchange{g: g, r: httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil), up: g.upstreams[0]}
			ctx, cancel := context.WithCancelCause(context.Background())
			if c.cause != nil {
				cancel(c.cause)
			}
			res := ex.noResponse(ctx, c.err)
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
		{"invalid_request_error", 0},
		{"insufficient_quota", 0},
		{"Overloaded_Error", 0},
		{"", 0},
	}
	for _, tc := range tests {
		if got := errorEventStatus([]byte(tc.typ)); got != tc.want {
			t.Errorf("errorEventStatus(%q) = %d, want %d", tc.typ, got, tc.want)
		}
	}
	if got := errorEventStatus(nil); got != 0 {
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
