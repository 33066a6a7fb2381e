package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/stats"
)

// TestMeasurementAccuracy compares the recorded figures with mockllm's known
// schedule: token event k leaves the mock at t0 + TTFT + k·ITL, with absolute
// deadlines (no drift).
//
// Tolerances, and why:
//   - TTFT is bracketed by ground truth: it cannot be below the configured
//     TTFT (the mock cannot send earlier), and it cannot exceed the moment
//     the client reads the second token (the client starts its clock before
//     the gateway; the gateway stamps the first token right after its flush
//     and only then writes the second). The client's reading of the first
//     token itself is no bound: it may come before the gateway's goroutine,
//     back from the flush, takes its timestamp (seen on a loaded machine).
//   - TPOT and the mean ITL are (last token − first token)/(N−1), between
//     the instants the relay read those tokens, which it stamps before it
//     writes them: the first is stamped no earlier than t0 + TTFT and no
//     later than the client read it, the last no earlier than t0 + TTFT +
//     (N−1)·ITL (the mock cannot send it before) and no later than the
//     client read it. On an idle machine that brackets ITL within a
//     millisecond or so, narrow enough to catch a unit or formula error (N
//     for N−1 is 1.2 ms off here, the role chunk counted or the first token
//     misplaced far more); on a busy one it widens with the delays instead
//     of failing (a fixed ±5 ms failed beside a CPU hog: 41 ms against 25).
//   - Token counts are exact: they come from the upstream's usage.
func TestMeasurementAccuracy(t *testing.T) {
	const (
		ttft   = 150 * time.Millisecond
		itl    = 25 * time.Millisecond
		tokens = 21
	)
	mock := httptest.NewServer(mockllm.New(mockllm.Options{TTFT: ttft, ITL: itl, OutputTokens: tokens}))
	defer mock.Close()
	tg := newTestGateway(t, mock.URL, nil)

	for _, route := range []string{"/v1/chat/completions", "/v1/messages", "/v1/responses"} {
		t.Run(route, func(t *testing.T) {
			body := `{"model":"m","stream":true,"max_tokens":1000,"messages":[{"role":"user","content":"hello there"}]}`
			if route == "/v1/responses" {
				body = `{"model":"m","stream":true,"max_output_tokens":1000,"input":"hello there"}`
			}
			req, _ := http.NewRequest(http.MethodPost, tg.URL+route, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			start := time.Now()
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var clientTTFT, clientSecond, clientLast time.Duration
			last := `" tok` + strconv.Itoa(tokens) + `"`
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				line := sc.Text()
				if clientLast == 0 && strings.Contains(line, last) {
					clientLast = time.Since(start)
				}
				if clientTTFT == 0 && (strings.Contains(line, `"content":" tok1`) || strings.Contains(line, `"text":" tok1`) ||
					strings.Contains(line, `"delta":" tok1`)) {
					clientTTFT = time.Since(start)
				}
				if clientSecond == 0 && (strings.Contains(line, `"content":" tok2`) || strings.Contains(line, `"text":" tok2`) ||
					strings.Contains(line, `"delta":" tok2`)) {
					clientSecond = time.Since(start)
				}
			}
			resp.Body.Close()
			rec := tg.record(t)
			if clientTTFT == 0 || clientSecond == 0 || clientLast == 0 {
				t.Fatal("client never saw the first two tokens and the last")
			}
			if got := rec.TTFT(); got < ttft || got > clientSecond {
				t.Errorf("TTFT %v outside [%v configured, %v client saw the second token] (client saw the first at %v)",
					got, ttft, clientSecond, clientTTFT)
			}
			if up := rec.UpstreamTTFT(); up > rec.TTFT() || up <= 0 {
				t.Errorf("upstream TTFT %v not within (0, TTFT %v]", up, rec.TTFT())
			}
			checkTokenGaps(t, &rec, ttft, itl, tokens, clientTTFT, clientLast)
			if rec.ITLSum != rec.Timing.LastToken.Sub(rec.Timing.FirstToken) {
				t.Errorf("ITL gaps sum to %v, first→last token is %v", rec.ITLSum, rec.Timing.LastToken.Sub(rec.Timing.FirstToken))
			}
			if rec.Usage.Output != tokens || rec.Estimated || !rec.Usage.HasInput || rec.Usage.Input <= 0 {
				t.Errorf("usage %+v estimated %v; want %d output tokens from the upstream", rec.Usage, rec.Estimated, tokens)
			}
			if rec.Overhead() <= 0 || rec.Overhead() > rec.E2E() {
				t.Errorf("overhead %v not within (0, E2E %v]", rec.Overhead(), rec.E2E())
			}
		})
	}
}

// checkTokenGaps holds rec's TPOT and mean ITL, over tokens−1 gaps of a
// mock scheduled at ttft and itl, to the bracket TestMeasurementAccuracy
// explains: the first token stamped between ttft and clientFirst (when
// the client read it), the last between ttft + (tokens−1)·itl and
// clientLast, all from the client's start of the request.
func checkTokenGaps(t *testing.T, rec *llm.Record, ttft, itl time.Duration, tokens int, clientFirst, clientLast time.Duration) {
	t.Helper()
	gaps := time.Duration(tokens - 1)
	lo := (ttft + gaps*itl - clientFirst) / gaps
	hi := (clientLast - ttft) / gaps
	tpot, ok := rec.TPOT()
	if !ok || tpot < lo || tpot > hi {
		t.Errorf("TPOT %v (ok=%v) outside [%v, %v] (schedule %v)", tpot, ok, lo, hi, itl)
	}
	if rec.ITLCount != tokens-1 {
		t.Fatalf("ITL count %d, want %d", rec.ITLCount, tokens-1)
	}
	if mean := rec.ITLSum / time.Duration(rec.ITLCount); mean < lo || mean > hi {
		t.Errorf("mean ITL %v outside [%v, %v] (schedule %v)", mean, lo, hi, itl)
	}
}

// TestNoUsageIsEstimated: an upstream that never reports usage is counted from
// its events and flagged estimated.
func TestNoUsageIsEstimated(t *testing.T) {
	mock := httptest.NewServer(mockllm.New(mockllm.Options{OutputTokens: 9}))
	defer mock.Close()
	tg := newTestGateway(t, mock.URL, nil)
	resp, answer := post(t, tg.URL+"/v1/chat/completions", `{"model":"m","stream":true}`,
		map[string]string{"X-Mock-No-Usage": "1"})
	if resp.StatusCode != 200 || !strings.Contains(string(answer), "[DONE]") {
		t.Fatalf("status %d body %q", resp.StatusCode, answer)
	}
	rec := tg.record(t)
	if !rec.Estimated || rec.Usage.Output != 9 || rec.Outcome != llm.OutcomeOK {
		t.Fatalf("record usage %+v estimated %v outcome %s; want 9 estimated output tokens", rec.Usage, rec.Estimated, rec.Outcome)
	}
	// No usage at all: the input is the prompt estimate it was billed, and
	// the input bucket comes from it.
	const body = `{"model":"m","stream":true}`
	if !rec.InputEstimated || rec.Usage.Input != int64(len(body)+3)/4 || rec.InputBucket != "0-500" {
		t.Errorf("input %d (estimated %v), bucket %q; want the estimate %d and 0-500",
			rec.Usage.Input, rec.InputEstimated, rec.InputBucket, (len(body)+3)/4)
	}
}

// TestClientCancelStopsUpstream: a client that leaves mid-stream cancels the
// upstream request, and the record keeps the tokens produced so far.
func TestClientCancelStopsUpstream(t *testing.T) {
	m := mockllm.New(mockllm.Options{ITL: 20 * time.Millisecond, OutputTokens: 500})
	mock := httptest.NewServer(m)
	defer mock.Close()
	tg := newTestGateway(t, mock.URL, nil)
	for i, route := range []string{"/v1/chat/completions", "/v1/messages"} {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, tg.URL+route,
			strings.NewReader(`{"model":"m","stream":true,"max_tokens":1000}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(resp.Body)
		seen := 0
		for sc.Scan() && seen < 3 {
			if strings.Contains(sc.Text(), " tok") {
				seen++
			}
		}
		cancel()
		resp.Body.Close()
		wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := m.WaitCanceled(wctx, int64(i+1)); err != nil {
			t.Fatalf("%s: the upstream never saw the cancel: %v", route, err)
		}
		wcancel()
		rec := tg.record(t)
		if rec.Outcome != llm.OutcomeClientCancel || rec.Interruption != llm.InterruptClientCancel {
			t.Errorf("%s: outcome %s interruption %s", route, rec.Outcome, rec.Interruption)
		}
		if rec.TokenEvents < 3 || rec.Usage.Output < 3 || rec.Usage.Output >= 500 {
			t.Errorf("%s: tokens so far %d (output %d); want at least the 3 seen, fewer than 500", route, rec.TokenEvents, rec.Usage.Output)
		}
	}
}

// errorShape decodes either dialect's error body.
type errorShape struct {
	Type  string `json:"type"`
	Error struct {
		Type    string  `json:"type"`
		Message string  `json:"message"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func TestBadInput(t *testing.T) {
	m := mockllm.New(mockllm.Options{})
	mock := httptest.NewServer(m)
	defer mock.Close()
	tg := newTestGateway(t, mock.URL, func(c *config.Config) {
		c.Server.MaxBodyBytes = 1024
		c.Auth.RequireKey = true
	})
	key := map[string]string{"Authorization": "Bearer sk-x"}
	antKey := map[string]string{"x-api-key": "sk-ant-x", "anthropic-version": "2023-06-01"}
	big := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("a", 2000) + `"}]}`
	tests := []struct {
		name, path, body string
		hdr              map[string]string
		status           int
		anthropic        bool
		errType, msg     string
	}{
		{"invalid json openai", "/v1/chat/completions", `{"model":`, key, 400, false, "invalid_request_error", "not valid JSON"},
		{"invalid json anthropic", "/v1/messages", `{"model":`, antKey, 400, true, "invalid_request_error", "not valid JSON"},
		{"missing model openai", "/v1/chat/completions", `{"messages":[]}`, key, 400, false, "invalid_request_error", `"model"`},
		{"missing model anthropic", "/v1/messages", `{"max_tokens":5}`, antKey, 400, true, "invalid_request_error", `"model"`},
		{"body over limit openai", "/v1/chat/completions", big, key, 413, false, "invalid_request_error", "limit"},
		{"body over limit anthropic", "/v1/messages", big, antKey, 413, true, "request_too_large", "limit"},
		{"missing key", "/v1/chat/completions", `{"model":"m"}`, nil, 401, false, "invalid_request_error", "missing API key"},
		{"missing key anthropic", "/v1/messages", `{"model":"m"}`, map[string]string{"anthropic-version": "2023-06-01"}, 401, true, "authentication_error", "missing API key"},
		{"malformed authorization", "/v1/chat/completions", `{"model":"m"}`, map[string]string{"Authorization": "Token abc"}, 401, false, "invalid_request_error", "malformed Authorization"},
		{"unknown route", "/v2/chat", `{}`, key, 404, false, "invalid_request_error", "unknown route"},
		{"unknown route anthropic client", "/nope", `{}`, antKey, 404, true, "not_found_error", "unknown route"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := post(t, tg.URL+tc.path, tc.body, tc.hdr)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
			}
			var e errorShape
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("error body is not JSON: %q", body)
			}
			if tc.anthropic && e.Type != "error" || !tc.anthropic && e.Type != "" {
				t.Errorf("wrong dialect: %s", body)
			}
			if e.Error.Type != tc.errType || !strings.Contains(e.Error.Message, tc.msg) {
				t.Errorf("error %+v, want type %q and message containing %q", e.Error, tc.errType, tc.msg)
			}
			if strings.Contains(string(body), "sk-") {
				t.Errorf("the error echoes a key: %s", body)
			}
		})
	}
	if n := m.Stats().Requests; n != 0 {
		t.Errorf("%d bad requests reached the upstream", n)
	}
	// Every bad request was recorded as such, unknown routes included.
	for range len(tests) {
		if rec := tg.record(t); rec.Outcome != llm.OutcomeBadRequest {
			t.Errorf("record outcome %s, want bad_request", rec.Outcome)
		}
	}
}

func TestUpstreamFaults(t *testing.T) {
	m := mockllm.New(mockllm.Options{OutputTokens: 8})
	mock := httptest.NewServer(m)
	defer mock.Close()
	// What the upstream sends, relayed as it is: no retry, no breaker
	// (resilience_test.go covers those).
	tg := newTestGateway(t, mock.URL, func(c *config.Config) {
		c.Upstreams[0].Retry.MaxAttempts = 1
		c.Upstreams[0].Breaker.Enabled = false
	})

	t.Run("error status passes through", func(t *testing.T) {
		resp, body := post(t, tg.URL+"/v1/chat/completions", `{"model":"m","stream":true}`,
			map[string]string{"X-Mock-Fault": "status=429;retry-after=7"})
		var e errorShape
		if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "7" || json.Unmarshal(body, &e) != nil ||
			e.Error.Type == "" {
			t.Fatalf("status %d retry-after %q body %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
		rec := tg.record(t)
		if rec.Outcome != llm.OutcomeUpstreamError || rec.Status != 429 || rec.ErrorType != e.Error.Type {
			t.Errorf("record outcome %s status %d error type %q", rec.Outcome, rec.Status, rec.ErrorType)
		}
	})
	t.Run("anthropic 529 passes through", func(t *testing.T) {
		resp, body := post(t, tg.URL+"/v1/messages", `{"model":"m","max_tokens":10,"stream":true}`,
			map[string]string{"X-Mock-Fault": "status=529"})
		if resp.StatusCode != 529 || !strings.Contains(string(body), "overloaded_error") {
			t.Fatalf("status %d body %s", resp.StatusCode, body)
		}
		if rec := tg.record(t); rec.ErrorType != "overloaded_error" {
			t.Errorf("error type %q", rec.ErrorType)
		}
	})
	t.Run("disconnect mid-stream", func(t *testing.T) {
		for _, route := range []string{"/v1/chat/completions", "/v1/messages"} {
			_, body := post(t, tg.URL+route, `{"model":"m","max_tokens":10,"stream":true}`,
				map[string]string{"X-Mock-Fault": "disconnect=3"})
			if strings.Contains(string(body), "[DONE]") || strings.Contains(string(body), "message_stop") {
				t.Errorf("%s: a terminal marker was invented: %q", route, body)
			}
			// The stream ends with the gateway's error event, after the
			// tokens that were relayed.
			tail := string(openAIBrokenEvent)
			if route == "/v1/messages" {
				tail = string(anthropicBrokenEvent)
			}
			if !strings.HasSuffix(string(body), tail) || !strings.Contains(string(body), "tok3") {
				t.Errorf("%s: stream does not end with the in-band error after the relayed tokens: %q", route, body)
			}
			rec := tg.record(t)
			if rec.Outcome != llm.OutcomeUpstreamError || rec.Interruption != llm.InterruptUpstreamEOF ||
				rec.TokenEvents != 3 || rec.Usage.Output != 3 || !rec.Estimated {
				t.Errorf("%s: outcome %s interruption %s tokens %d output %d estimated %v", route, rec.Outcome,
					rec.Interruption, rec.TokenEvents, rec.Usage.Output, rec.Estimated)
			}
		}
	})
	t.Run("error event mid-stream", func(t *testing.T) {
		for _, route := range []string{"/v1/chat/completions", "/v1/messages"} {
			_, body := post(t, tg.URL+route, `{"model":"m","max_tokens":10,"stream":true}`,
				map[string]string{"X-Mock-Fault": "error-event=2"})
			if !strings.Contains(string(body), "error") {
				t.Errorf("%s: the error event was not relayed: %q", route, body)
			}
			rec := tg.record(t)
			if rec.Outcome != llm.OutcomeUpstreamError || rec.Interruption != llm.InterruptUpstreamErrorEvent ||
				rec.ErrorType == "" || rec.TokenEvents != 2 {
				t.Errorf("%s: outcome %s interruption %s error type %q tokens %d", route, rec.Outcome,
					rec.Interruption, rec.ErrorType, rec.TokenEvents)
			}
		}
	})
	t.Run("malformed event does not stop the stream", func(t *testing.T) {
		_, body := post(t, tg.URL+"/v1/chat/completions", `{"model":"m","stream":true}`,
			map[string]string{"X-Mock-Fault": "malformed=2"})
		if !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
			t.Errorf("stream did not complete: %q", body)
		}
		if rec := tg.record(t); rec.Outcome != llm.OutcomeOK || rec.Usage.Output != 8 {
			t.Errorf("outcome %s output %d", rec.Outcome, rec.Usage.Output)
		}
	})
}

func TestUpstreamUnreachableAndTimeout(t *testing.T) {
	// A port with nothing listening.
	tg := newTestGateway(t, closedPortURL(t), nil)
	resp, body := post(t, tg.URL+"/v1/messages", `{"model":"m","max_tokens":5}`, nil)
	var e errorShape
	if resp.StatusCode != 502 || json.Unmarshal(body, &e) != nil || e.Type != "error" || e.Error.Type != "api_error" {
		t.Fatalf("unreachable: status %d body %s", resp.StatusCode, body)
	}
	if rec := tg.record(t); rec.Outcome != llm.OutcomeUpstreamUnreachable {
		t.Errorf("outcome %s", rec.Outcome)
	}

	mock := httptest.NewServer(mockllm.New(mockllm.Options{}))
	defer mock.Close()
	tg2 := newTestGateway(t, mock.URL, func(c *config.Config) { c.Upstreams[0].TimeoutSeconds = 0.2 })
	resp, body = post(t, tg2.URL+"/v1/chat/completions", `{"model":"m"}`, map[string]string{"X-Mock-Fault": "stall=5000"})
	if resp.StatusCode != 504 || json.Unmarshal(body, &e) != nil || e.Error.Code == nil || *e.Error.Code != "upstream_timeout" {
		t.Fatalf("timeout: status %d body %s", resp.StatusCode, body)
	}
	if rec := tg2.record(t); rec.Outcome != llm.OutcomeUpstreamTimeout {
		t.Errorf("outcome %s", rec.Outcome)
	}
}

func TestBaseURLPrefixAndForwarding(t *testing.T) {
	m := mockllm.New(mockllm.Options{OutputTokens: 4})
	mux := http.NewServeMux()
	mux.Handle("/api/", http.StripPrefix("/api", m))
	mock := httptest.NewServer(mux)
	defer mock.Close()
	tg := newTestGateway(t, mock.URL+"/api", nil)

	resp, body := post(t, tg.URL+"/v1/chat/completions", `{"model":"m"}`, nil)
	if resp.StatusCode != 200 || !strings.Contains(string(body), "chat.completion") {
		t.Fatalf("prefixed upstream: %d %s", resp.StatusCode, body)
	}
	tg.record(t)

	// Other /v1/* paths are forwarded unchanged, query string included.
	get := func(url string) (int, string) {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	gs, gb := get(tg.URL + "/v1/models?limit=5")
	ds, db := get(mock.URL + "/api/v1/models?limit=5")
	if gs != 200 || gs != ds || gb != db {
		t.Fatalf("forwarded /v1/models: %d %q; direct %d %q", gs, gb, ds, db)
	}
	rec := tg.record(t)
	if rec.Route != llm.RouteOther || rec.E2E() <= 0 || rec.Outcome != llm.OutcomeOK {
		t.Errorf("forwarded record route %s e2e %v outcome %s", rec.Route, rec.E2E(), rec.Outcome)
	}
	reqs := m.Requests()
	if last := reqs[len(reqs)-1]; last.Path != "/v1/models" || last.Query != "limit=5" {
		t.Errorf("upstream saw %s?%s", last.Path, last.Query)
	}
	resp, body = post(t, tg.URL+"/v1/messages/count_tokens", `{"model":"m","messages":[]}`,
		map[string]string{"anthropic-version": "2023-06-01"})
	if resp.StatusCode != 200 || !strings.Contains(string(body), "input_tokens") {
		t.Errorf("count_tokens: %d %s", resp.StatusCode, body)
	}
	tg.record(t)
}

func TestUpstreamRequestHeadersAndKeys(t *testing.T) {
	m := mockllm.New(mockllm.Options{OutputTokens: 2})
	mock := httptest.NewServer(m)
	defer mock.Close()
	tg := newTestGateway(t, mock.URL, func(c *config.Config) { c.Upstreams[0].APIKey = "sk-upstream-own" })

	// Passthrough: the caller's key goes up unchanged; hop-by-hop headers do not.
	_, _ = post(t, tg.URL+"/v1/chat/completions", `{"model":"m"}`, map[string]string{
		"Authorization": "Bearer sk-caller-1", "Connection": "X-Hop", "X-Hop": "1", "X-Forwarded-For": "6.6.6.6",
		"Openai-Organization": "org-1"})
	rec := tg.record(t)
	reqs := m.Requests()
	h := reqs[len(reqs)-1].Header
	if h.Get("Authorization") != "Bearer sk-caller-1" || h.Get("X-Hop") != "" || h.Get("X-Forwarded-For") != "" ||
		h.Get("Openai-Organization") != "org-1" || h.Get(requestIDHeader) != rec.RequestID {
		t.Errorf("upstream headers %v", h)
	}
	if rec.KeyID != keyID("sk-caller-1") {
		t.Errorf("key id %q", rec.KeyID)
	}
	// The upstream's own request id is kept for joining with its logs.
	if rec.UpstreamRequestID == "" || !strings.Contains(tg.logs.String(), `"upstream_request_id":"`+rec.UpstreamRequestID+`"`) {
		t.Errorf("upstream request id %q not recorded/logged", rec.UpstreamRequestID)
	}
	// No caller key and require_key off: the upstream's own key, in the
	// dialect's header.
	_, _ = post(t, tg.URL+"/v1/messages", `{"model":"m","max_tokens":3}`, nil)
	tg.record(t)
	reqs = m.Requests()
	if h := reqs[len(reqs)-1].Header; h.Get("X-Api-Key") != "sk-upstream-own" || h.Get("Authorization") != "" {
		t.Errorf("upstream key not used: %v", h)
	}
	// Keys never reach the access log.
	if logs := tg.logs.String(); strings.Contains(logs, "sk-caller-1") || strings.Contains(logs, "sk-upstream-own") ||
		!strings.Contains(logs, rec.KeyID) {
		t.Errorf("access log: %s", logs)
	}
}

func TestMetricsExposed(t *testing.T) {
	mock := httptest.NewServer(mockllm.New(mockllm.Options{OutputTokens: 5, ITL: time.Millisecond}))
	defer mock.Close()
	tg := newTestGateway(t, mock.URL, func(c *config.Config) { c.Metrics.Labels = map[string]string{"env": "test"} })
	post(t, tg.URL+"/v1/chat/completions", `{"model":"gpt-x","stream":true}`, nil)
	post(t, tg.URL+"/v1/messages", `{"model":"claude-x","max_tokens":9}`, nil)
	tg.record(t)
	tg.record(t)
	for name, want := range map[string]int{
		"tollgate_time_to_first_token_seconds":   1, // streamed only
		"tollgate_request_duration_seconds":      2,
		"tollgate_inter_token_latency_seconds":   1,
		"tollgate_time_per_output_token_seconds": 1,
		"tollgate_requests_total":                2,
		"tollgate_goodput_requests_total":        2,
	} {
		n, err := testutil.GatherAndCount(tg.registry, name)
		if err != nil || n != want {
			t.Errorf("%s: %d series (err %v), want %d", name, n, err, want)
		}
	}
	resp, err := http.Get(tg.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`tollgate_tokens_total{env="test",estimated="false",model="gpt-x",route="chat_completions",team="none",type="output"} 5`,
		`tollgate_inter_token_latency_seconds_count{env="test",model="gpt-x",route="chat_completions"} 4`,
		`tollgate_requests_total{code="200",env="test",model="claude-x",outcome="ok",route="messages",team="none"} 1`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestHealthAndReady(t *testing.T) {
	tg := newTestGateway(t, "http://127.0.0.1:1", nil)
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200} {
		resp, err := http.Get(tg.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s = %d", path, resp.StatusCode)
		}
	}
	tg.gw.Drain()
	resp, err := http.Get(tg.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 {
		t.Errorf("/readyz while draining = %d", resp.StatusCode)
	}
}

// TestStatsLimitedInFlight: /stats serves at most statsInFlight requests at
// once; one more gets 503 with Retry-After instead of queueing work.
func TestStatsLimitedInFlight(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, statsInFlight)
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
	})
	h := limitInFlight(slow, statsInFlight)
	var wg sync.WaitGroup
	for range statsInFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/stats", nil))
		}()
	}
	for range statsInFlight {
		<-entered
	}
	rr := httptest.NewRecorder()
	h.ServeHTTP(rr, httptest.NewRequest(http.MethodGet, "/stats", nil))
	close(release)
	wg.Wait()
	if rr.Code != http.StatusServiceUnavailable || rr.Header().Get("Retry-After") != "1" {
		t.Fatalf("request over the limit: %d, Retry-After %q; want 503 with Retry-After 1", rr.Code, rr.Header().Get("Retry-After"))
	}
	rr = httptest.NewRecorder()
	h.ServeHTTP(rr, httptest.NewRequest(http.MethodGet, "/stats", nil))
	if rr.Code != http.StatusOK {
		t.Errorf("after the others finished: %d, want 200", rr.Code)
	}
}

// The dial is bounded by the connect timeout, or by the attempt's total
// timeout when that is shorter or the connect timeout is off, since the
// attempt's context carries no deadline for the dialer to read.
func TestDialTimeoutIsTheShorterOfConnectAndTotal(t *testing.T) {
	for _, c := range []struct {
		connect, total float64
		want           time.Duration
	}{
		{10, 600, 10 * time.Second},
		{10, 5, 5 * time.Second},
		{0, 5, 5 * time.Second},
		{10, 0, 10 * time.Second},
		{0, 0, 0},
	} {
		u := &config.Upstream{ConnectTimeoutSeconds: c.connect, TimeoutSeconds: c.total}
		if got := dialTimeout(u); got != c.want {
			t.Errorf("connect %v s, total %v s: dial timeout %v, want %v", c.connect, c.total, got, c.want)
		}
	}
}

// TestClaudeCodeStartProbesAreAnsweredNotCounted: HEAD / and HEAD
// /api/hello, which Claude Code sends at every start (wire.md §11.1), get
// 200 with no body from the gateway itself, and leave no record: nothing
// in the access log, tollgate_requests_total or /stats, and nothing
// upstream. A Claude-Code-shaped start (the probes, then a streamed
// POST /v1/messages?beta=true through the Anthropic SDK) on one
// connection counts that one message alone. GET / is still a 404.
func TestClaudeCodeStartProbesAreAnsweredNotCounted(t *testing.T) {
	mock, mockURL := mockUpstream(t, mockllm.Options{OutputTokens: 4})
	live := stats.New(nil)
	tg := newTestGatewayWith(t, mockURL, nil, func(o *Options) { o.Stats = live })
	// One connection: the server handles its requests one after another,
	// so a probe's record, were there one, would be finished before the
	// message's.
	tr := &http.Transport{MaxConnsPerHost: 1}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}
	ctx := testCtx(t)

	for _, path := range []string{"/", "/api/hello"} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodHead, tg.URL+path, nil)
		req.Header.Set("X-Api-Key", "sk-ant-claude-code")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || len(body) != 0 || resp.ContentLength > 0 {
			t.Errorf("HEAD %s: %d, %d bytes, Content-Length %d; want 200 and no body", path, resp.StatusCode,
				len(body), resp.ContentLength)
		}
	}
	c := anthropic.NewClient(aoption.WithBaseURL(tg.URL), aoption.WithAPIKey("sk-ant-claude-code"),
		aoption.WithHTTPClient(client), aoption.WithMaxRetries(0), aoption.WithQuery("beta", "true"))
	s := c.Beta.Messages.NewStreaming(ctx, anthropic.BetaMessageNewParams{Model: "claude-test", MaxTokens: 16,
		Messages: []anthropic.BetaMessageParam{anthropic.NewBetaUserMessage(anthropic.NewBetaTextBlock("hi"))}})
	var msg anthropic.BetaMessage
	for s.Next() {
		if err := msg.Accumulate(s.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Err(); err != nil || len(msg.Content) == 0 {
		t.Fatalf("the message after the probes: %v, %d blocks", err, len(msg.Content))
	}
	if rec := tg.record(t); rec.Route != llm.RouteMessages || rec.Outcome != llm.OutcomeOK {
		t.Errorf("first record: route %s outcome %s, want the message's", rec.Route, rec.Outcome)
	}
	tg.mu.Lock()
	n := len(tg.recs)
	tg.mu.Unlock()
	if n != 1 {
		t.Errorf("%d records, want the message's alone", n)
	}
	if reqs := mock.Requests(); len(reqs) != 1 || reqs[0].Path != "/v1/messages" || reqs[0].Query != "beta=true" {
		t.Errorf("upstream got %d requests, want the message alone", len(reqs))
	}
	if lines := strings.Count(tg.logs.String(), "\n"); lines != 1 {
		t.Errorf("%d access-log lines, want 1: %s", lines, tg.logs)
	}
	if got := metricValue(t, tg, "tollgate_requests_total", map[string]string{"outcome": "bad_request"}); got > 0 {
		t.Errorf("tollgate_requests_total{outcome=bad_request} = %v, want none", got)
	}
	wantMetric(t, tg, "tollgate_requests_total", map[string]string{"route": "messages", "outcome": "ok"}, 1)
	resp, err := client.Get(tg.URL + "/stats?window=1m&merge=route,model,team")
	if err != nil {
		t.Fatal(err)
	}
	var rep stats.Report
	err = json.NewDecoder(resp.Body).Decode(&rep)
	resp.Body.Close()
	if err != nil || len(rep.Windows) != 1 || len(rep.Windows[0].Groups) != 1 {
		t.Fatalf("/stats: %v, %+v", err, rep.Windows)
	}
	if f := rep.Windows[0].Groups[0].Figures; f.Requests != 1 || f.Outcomes["bad_request"] != 0 || f.Outcomes["ok"] != 1 {
		t.Errorf("/stats counts %d requests, outcomes %v; want the message alone", f.Requests, f.Outcomes)
	}

	// GET / and a POST to /api/hello are not probes: the 404 they always were.
	for _, m := range []string{http.MethodGet, http.MethodPost} {
		for _, path := range []string{"/", "/api/hello"} {
			res := sendRequest(ctx, m, tg.URL+path, "application/json", "{}", nil)
			if res.err != nil || res.resp.StatusCode != http.StatusNotFound || !strings.Contains(string(res.body), `"unknown_url"`) {
				t.Errorf("%s %s: %v %v %s", m, path, res.err, res.resp, res.body)
			}
			if rec := tg.record(t); rec.Outcome != llm.OutcomeBadRequest {
				t.Errorf("%s %s recorded as %s, want bad_request", m, path, rec.Outcome)
			}
		}
	}
}
