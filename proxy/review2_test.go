package proxy

// Regression tests for the second review of issue 4 (commit "Second review:
// shutdown mid-retry answers 503, passthrough 429s spare the breaker,
// cheaper idle timer"): a request cut by the drain timeout while it waits to
// retry gets a 503 in its dialect, a passthrough caller's 429s and a
// client-type error event do not open the breaker, a stream that was only an
// error event is not billed, and a fallback is counted from the upstream
// last attempted. Each failed on the parent commit.

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/metrics"
	"github.com/tollgate-llm/tollgate/spend"
)

// r2Wait polls cond until it holds, for at most 10 s; it decides nothing
// about speed, it only bounds a wait for an event of another goroutine.
func r2Wait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// r2Metric is metricValue with an absent series read as 0, for deltas.
func r2Metric(t *testing.T, tg *testGateway, name string, labels map[string]string) float64 {
	t.Helper()
	return max(metricValue(t, tg, name, labels), 0)
}

// r2Upstream is an upstream that answers every request with a fixed status
// and body, counting the requests by the Authorization they carried; a
// request carrying okAuth gets a plain chat completion instead.
type r2Upstream struct {
	status int
	header map[string]string
	body   string // for /v1/chat/completions
	aBody  string // for /v1/messages
	okAuth string

	mu    sync.Mutex
	hits  map[string]int
	total int
	first chan struct{} // closed at the first request
}

func newR2Upstream(status int, body, aBody string) *r2Upstream {
	return &r2Upstream{status: status, body: body, aBody: aBody, hits: map[string]int{}, first: make(chan struct{})}
}

func (u *r2Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	auth := r.Header.Get("Authorization")
	u.mu.Lock()
	u.hits[auth]++
	u.total++
	if u.total == 1 {
		close(u.first)
	}
	u.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if u.okAuth != "" && auth == u.okAuth {
		_, _ = io.WriteString(w, `{"id":"chatcmpl-r2","object":"chat.completion","created":1,"model":"gpt-4o-mini",`+
			`"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],`+
			`"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
		return
	}
	for k, v := range u.header {
		w.Header().Set(k, v)
	}
	w.WriteHeader(u.status)
	body := u.body
	if strings.HasPrefix(r.URL.Path, "/v1/messages") {
		body = u.aBody
	}
	_, _ = io.WriteString(w, body)
}

func (u *r2Upstream) count(auth string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.hits[auth]
}

func (u *r2Upstream) requests() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.total
}

// r2Answer is what one caller of TestReview2ShutdownDuringBackoff saw.
type r2Answer struct {
	status int
	header http.Header
	body   []byte
	chunks int // SDK stream events received
	err    error
}

// TestReview2ShutdownDuringBackoff: a request sleeping before its retry (the
// upstream asked for 3 s) when the server cancels its base context with
// ErrShutdown gets a 503 with Retry-After, in its dialect
// (gateway_shutting_down / overloaded_error), and both official SDKs,
// streamed or not, see a parseable API error instead of an empty success.
// The record's outcome is gateway_shutdown, with that 503.
func TestReview2ShutdownDuringBackoff(t *testing.T) {
	const (
		oaiBody = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`
		antBody = `{"model":"claude-test","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`
	)
	oaiParams := openai.ChatCompletionNewParams{Model: "gpt-4o-mini",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}
	antParams := anthropic.MessageNewParams{Model: "claude-test", MaxTokens: 16,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}}

	cases := []struct {
		name      string
		anthropic bool
		ask       func(ctx context.Context, url string) r2Answer
		check     func(t *testing.T, a r2Answer)
	}{
		{"raw_openai", false, func(ctx context.Context, url string) r2Answer {
			return r2Post(ctx, url+"/v1/chat/completions", oaiBody)
		}, func(t *testing.T, a r2Answer) {
			r2WantShutdownAnswer(t, a)
			var e struct {
				Error struct{ Type, Code, Message string }
			}
			if err := json.Unmarshal(a.body, &e); err != nil || e.Error.Code != "gateway_shutting_down" ||
				e.Error.Type != "server_error" || e.Error.Message == "" {
				t.Errorf("body %q (%v); want an OpenAI error with code gateway_shutting_down", a.body, err)
			}
		}},
		{"raw_anthropic", true, func(ctx context.Context, url string) r2Answer {
			return r2Post(ctx, url+"/v1/messages", antBody)
		}, func(t *testing.T, a r2Answer) {
			r2WantShutdownAnswer(t, a)
			var e struct {
				Type  string
				Error struct{ Type, Message string }
			}
			if err := json.Unmarshal(a.body, &e); err != nil || e.Type != "error" ||
				e.Error.Type != "overloaded_error" || e.Error.Message == "" {
				t.Errorf("body %q (%v); want an Anthropic error of type overloaded_error", a.body, err)
			}
		}},
		{"openai_sdk", false, func(ctx context.Context, url string) r2Answer {
			c := openai.NewClient(option.WithBaseURL(url+"/v1"), option.WithAPIKey("sk-r2"), option.WithMaxRetries(0))
			comp, err := c.Chat.Completions.New(ctx, oaiParams)
			if err == nil && comp != nil {
				return r2Answer{chunks: len(comp.Choices)}
			}
			return r2Answer{err: err}
		}, r2WantOpenAIShutdownError},
		{"openai_sdk_stream", false, func(ctx context.Context, url string) r2Answer {
			c := openai.NewClient(option.WithBaseURL(url+"/v1"), option.WithAPIKey("sk-r2"), option.WithMaxRetries(0))
			s := c.Chat.Completions.NewStreaming(ctx, oaiParams)
			var a r2Answer
			for s.Next() {
				a.chunks++
			}
			a.err = s.Err()
			_ = s.Close()
			return a
		}, r2WantOpenAIShutdownError},
		{"anthropic_sdk", true, func(ctx context.Context, url string) r2Answer {
			c := anthropic.NewClient(aoption.WithBaseURL(url), aoption.WithAPIKey("sk-ant-r2"), aoption.WithMaxRetries(0))
			m, err := c.Messages.New(ctx, antParams)
			if err == nil && m != nil {
				return r2Answer{chunks: len(m.Content)}
			}
			return r2Answer{err: err}
		}, r2WantAnthropicShutdownError},
		{"anthropic_sdk_stream", true, func(ctx context.Context, url string) r2Answer {
			c := anthropic.NewClient(aoption.WithBaseURL(url), aoption.WithAPIKey("sk-ant-r2"), aoption.WithMaxRetries(0))
			s := c.Messages.NewStreaming(ctx, antParams)
			var a r2Answer
			for s.Next() {
				a.chunks++
			}
			a.err = s.Err()
			_ = s.Close()
			return a
		}, r2WantAnthropicShutdownError},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			up := newR2Upstream(http.StatusTooManyRequests,
				`{"error":{"message":"Rate limit reached, slow down","type":"requests","param":null,"code":"rate_limit_exceeded"}}`,
				`{"type":"error","error":{"type":"rate_limit_error","message":"Number of requests has exceeded your rate limit"}}`)
			up.header = map[string]string{"Retry-After": "3"}
			us := httptest.NewServer(up)
			defer us.Close()
			tg := newTestGateway(t, us.URL, nil)
			// The server as cmd/gateway builds it: every request's context
			// derives from a base context cancelled with ErrShutdown when the
			// drain timeout runs out.
			base, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			srv := httptest.NewUnstartedServer(tg.gw.Handler())
			srv.Config.BaseContext = func(net.Listener) context.Context { return base }
			srv.Start()
			defer srv.Close()

			ctx, cancelCaller := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancelCaller()
			got := make(chan r2Answer, 1)
			go func() { got <- c.ask(ctx, srv.URL) }()

			select {
			case <-up.first:
			case <-ctx.Done():
				t.Fatal("the upstream never saw the request")
			}
			// The retry is counted just before the gateway sleeps for it: from
			// then on the request waits out the upstream's 3 s.
			r2Wait(t, "the retry to be counted", func() bool {
				return r2Metric(t, tg, "tollgate_upstream_retries_total", map[string]string{"upstream": "mock"}) >= 1
			})
			cancel(ErrShutdown)
			var a r2Answer
			select {
			case a = <-got:
			case <-ctx.Done():
				t.Fatal("the caller got no answer")
			}
			c.check(t, a)

			rec := tg.record(t)
			if rec.Outcome != llm.OutcomeShutdown || rec.Status != http.StatusServiceUnavailable {
				t.Errorf("record outcome %s status %d, want gateway_shutdown 503", rec.Outcome, rec.Status)
			}
			wantAttempts(t, rec, "mock:429:rate_limited")
			if n := up.requests(); n != 1 {
				t.Errorf("upstream saw %d requests, want 1: no retry after the shutdown", n)
			}
		})
	}
}

// r2Post sends body to url and reads the whole answer.
func r2Post(ctx context.Context, url, body string) r2Answer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return r2Answer{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk-r2")
	req.Header.Set("X-Api-Key", "sk-ant-r2")
	req.Header.Set("Anthropic-Version", "2023-06-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return r2Answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return r2Answer{status: resp.StatusCode, header: resp.Header, body: b, err: err}
}

func r2WantShutdownAnswer(t *testing.T, a r2Answer) {
	t.Helper()
	if a.err != nil {
		t.Fatalf("request failed: %v", a.err)
	}
	if a.status != http.StatusServiceUnavailable {
		t.Errorf("status %d body %q, want 503", a.status, a.body)
	}
	if s, err := strconv.Atoi(a.header.Get("Retry-After")); err != nil || s < 1 {
		t.Errorf("Retry-After %q, want a whole number of seconds ≥ 1", a.header.Get("Retry-After"))
	}
}

func r2WantOpenAIShutdownError(t *testing.T, a r2Answer) {
	t.Helper()
	var e *openai.Error
	if !errors.As(a.err, &e) {
		t.Fatalf("OpenAI SDK: %d chunks/choices, error %v (%T); want an API error", a.chunks, a.err, a.err)
	}
	if e.StatusCode != http.StatusServiceUnavailable || e.Code != "gateway_shutting_down" || e.Type != "server_error" {
		t.Errorf("OpenAI SDK error: status %d type %q code %q; want 503 server_error gateway_shutting_down",
			e.StatusCode, e.Type, e.Code)
	}
	if a.chunks != 0 {
		t.Errorf("OpenAI SDK stream yielded %d chunks before the error, want 0", a.chunks)
	}
}

func r2WantAnthropicShutdownError(t *testing.T, a r2Answer) {
	t.Helper()
	var e *anthropic.Error
	if !errors.As(a.err, &e) {
		t.Fatalf("Anthropic SDK: %d events/blocks, error %v (%T); want an API error", a.chunks, a.err, a.err)
	}
	if e.StatusCode != http.StatusServiceUnavailable || e.Type() != "overloaded_error" {
		t.Errorf("Anthropic SDK error: status %d type %q; want 503 overloaded_error", e.StatusCode, e.Type())
	}
	if a.chunks != 0 {
		t.Errorf("Anthropic SDK stream yielded %d events before the error, want 0", a.chunks)
	}
}

// r2Breaker is a breaker that opens at the second failure in a row and stays
// open for the test.
var r2Breaker = config.Breaker{Enabled: true, ConsecutiveFailures: 2, FailureRatio: 0.5, MinRequests: 20,
	WindowSeconds: 10, CooldownSeconds: 60, HalfOpenProbes: 1}

// TestReview2Passthrough429SparesBreaker: in passthrough the caller's own
// key goes upstream, so a 429 (a plain rate limit, not a quota) is that
// account's limit: three of them in a row leave a consecutive_failures 2
// breaker closed, and another caller still reaches the upstream. In mode
// "keys" the gateway's own upstream key got the same 429s: they are the
// upstream's trouble and open the breaker.
func TestReview2Passthrough429SparesBreaker(t *testing.T) {
	const rateLimited = `{"error":{"message":"Rate limit reached for gpt-4o-mini","type":"requests","param":null,"code":"rate_limit_exceeded"}}`
	state := func(t *testing.T, tg *testGateway) float64 {
		t.Helper()
		return metricValue(t, tg, "tollgate_upstream_circuit_state", map[string]string{"upstream": "mock"})
	}
	edit := func(c *config.Config) {
		u := &c.Upstreams[0]
		u.Retry.MaxAttempts = 1
		u.Breaker = r2Breaker
	}

	t.Run("passthrough", func(t *testing.T) {
		up := newR2Upstream(http.StatusTooManyRequests, rateLimited, "")
		up.okAuth = "Bearer sk-b"
		us := httptest.NewServer(up)
		defer us.Close()
		tg := newTestGateway(t, us.URL, edit)
		for i := range 3 {
			resp, b := post(t, tg.URL+"/v1/chat/completions", holdChatPlain, map[string]string{"Authorization": "Bearer sk-a"})
			if resp.StatusCode != http.StatusTooManyRequests {
				t.Errorf("sk-a call %d: %d %s, want the upstream's 429", i+1, resp.StatusCode, b)
			}
			wantAttempts(t, tg.record(t), "mock:429:rate_limited")
		}
		if s := state(t, tg); s != metrics.CircuitClosed {
			t.Errorf("circuit state %v after 3 passthrough 429s, want closed", s)
		}
		if n := up.count("Bearer sk-a"); n != 3 {
			t.Errorf("upstream saw %d requests with sk-a, want 3", n)
		}
		resp, b := post(t, tg.URL+"/v1/chat/completions", holdChatPlain, map[string]string{"Authorization": "Bearer sk-b"})
		tg.record(t)
		if resp.StatusCode != http.StatusOK || up.count("Bearer sk-b") != 1 {
			t.Errorf("another caller: %d %s, upstream saw it %d times; want 200 from the upstream", resp.StatusCode, b,
				up.count("Bearer sk-b"))
		}
	})

	t.Run("keys_mode", func(t *testing.T) {
		up := newR2Upstream(http.StatusTooManyRequests, rateLimited, "")
		us := httptest.NewServer(up)
		defer us.Close()
		tg := newTestGateway(t, us.URL, func(c *config.Config) {
			edit(c)
			c.Auth.Mode = "keys"
			c.Upstreams[0].APIKeyEnv, c.Upstreams[0].APIKey = "UPSTREAM_KEY", upstreamKey
			c.Keys = []config.Key{{Name: "alpha", SHA256: sha(keyAlpha)}, {Name: "beta", SHA256: sha(keyBeta)}}
		})
		for range 2 {
			resp, b := post(t, tg.URL+"/v1/chat/completions", holdChatPlain, map[string]string{"Authorization": "Bearer " + keyAlpha})
			if resp.StatusCode != http.StatusTooManyRequests {
				t.Errorf("alpha: %d %s, want the upstream's 429", resp.StatusCode, b)
			}
			wantAttempts(t, tg.record(t), "mock:429:rate_limited")
		}
		if s := state(t, tg); s != metrics.CircuitOpen {
			t.Errorf("circuit state %v after 2 429s on the gateway's key, want open", s)
		}
		resp, b := post(t, tg.URL+"/v1/chat/completions", holdChatPlain, map[string]string{"Authorization": "Bearer " + keyBeta})
		wantAttempts(t, tg.record(t), "mock:0:breaker_open")
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("beta with the circuit open: %d %s, want 503", resp.StatusCode, b)
		}
		if n, want := up.count("Bearer "+upstreamKey), 2; n != want || up.requests() != want {
			t.Errorf("upstream saw %d requests (%d with the gateway's key), want %d", up.requests(), n, want)
		}
	})
}

// r2Chunk is an OpenAI stream chunk with the given delta.
func r2Chunk(delta string) string {
	return `data: {"id":"chatcmpl-r2","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini",` +
		`"choices":[{"index":0,"delta":` + delta + `,"finish_reason":null}]}` + "\n\n"
}

// r2ErrorEvent is an OpenAI in-stream error event of the given type.
func r2ErrorEvent(typ, code string) string {
	return `data: {"error":{"message":"r2 stream error","type":"` + typ + `","param":null,"code":"` + code + `"}}` + "\n\n"
}

// r2Pieces splits events into the pieces of a rawUpstream.
func r2Pieces(events ...string) [][]byte {
	out := make([][]byte, len(events))
	for i, e := range events {
		out[i] = []byte(e)
	}
	return out
}

// TestReview2CommittedClientErrorEventSparesBreaker: a stream that relayed a
// token and then carried an error event of a request type
// (invalid_request_error, context_length_exceeded) says nothing of the
// upstream's health: a consecutive_failures 1 breaker stays closed and the
// next request reaches the upstream, whether the opening was held (another
// attempt could follow) or not. A server_error event opens it.
func TestReview2CommittedClientErrorEventSparesBreaker(t *testing.T) {
	for _, attempts := range []int{1, 2} {
		for _, c := range []struct {
			typ, code string
			open      bool
		}{
			{"invalid_request_error", "context_length_exceeded", false},
			{"server_error", "", true},
		} {
			t.Run(c.typ+"/max_attempts="+strconv.Itoa(attempts), func(t *testing.T) {
				up := &rawUpstream{pieces: r2Pieces(r2Chunk(`{"role":"assistant","content":""}`),
					r2Chunk(`{"content":"Hello"}`), r2ErrorEvent(c.typ, c.code))}
				var hits atomic.Int32
				us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					hits.Add(1)
					up.ServeHTTP(w, r)
				}))
				defer us.Close()
				tg := newTestGatewayWith(t, us.URL, func(cf *config.Config) {
					u := &cf.Upstreams[0]
					u.Retry.MaxAttempts = attempts
					u.Retry.BaseDelayMs, u.Retry.MaxDelayMs = 1, 2
					u.Breaker = r2Breaker
					u.Breaker.ConsecutiveFailures = 1
				}, func(o *Options) { o.Now = newFakeClock().Now })

				resp, b := post(t, tg.URL+"/v1/chat/completions", holdChat, nil)
				rec := tg.record(t)
				if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "Hello") ||
					!strings.Contains(string(b), c.typ) {
					t.Fatalf("caller got %d %q; want the token, then the error event", resp.StatusCode, b)
				}
				if rec.Interruption != llm.InterruptUpstreamErrorEvent || rec.TokenEvents != 1 {
					t.Errorf("record interruption %s, %d tokens; want upstream_error_event after 1 token",
						rec.Interruption, rec.TokenEvents)
				}
				wantAttempts(t, rec, "mock:200:error_event")
				want := float64(metrics.CircuitClosed)
				if c.open {
					want = metrics.CircuitOpen
				}
				if s := metricValue(t, tg, "tollgate_upstream_circuit_state", map[string]string{"upstream": "mock"}); s != want {
					t.Errorf("circuit state %v after a committed %s event, want %v", s, c.typ, want)
				}
				resp, b = post(t, tg.URL+"/v1/chat/completions", holdChat, nil)
				rec = tg.record(t)
				if c.open {
					if resp.StatusCode != http.StatusServiceUnavailable || hits.Load() != 1 {
						t.Errorf("next request: %d %.80q, upstream hits %d; want 503 without reaching it", resp.StatusCode, b, hits.Load())
					}
					wantAttempts(t, rec, "mock:0:breaker_open")
				} else {
					if resp.StatusCode != http.StatusOK || hits.Load() != 2 {
						t.Errorf("next request: %d %.80q, upstream hits %d; want it to reach the upstream", resp.StatusCode, b, hits.Load())
					}
					wantAttempts(t, rec, "mock:200:error_event")
				}
			})
		}
	}
}

// TestReview2ErrorEventOnlyStreamNotBilled: a 200 stream whose only event
// is an error event (no token, no usage) is what an error status would
// have been: nothing is billed, in the ledger or the record, whether the
// opening was held or not. The same stream with one token before the error
// is billed (the token and the prompt estimate).
func TestReview2ErrorEventOnlyStreamNotBilled(t *testing.T) {
	errEv := r2ErrorEvent("invalid_request_error", "context_length_exceeded")
	for _, attempts := range []int{1, 3} {
		for _, c := range []struct {
			name   string
			pieces [][]byte
			tokens int
			billed bool
		}{
			{"error_only", r2Pieces(errEv), 0, false},
			{"token_then_error", r2Pieces(r2Chunk(`{"role":"assistant","content":""}`), r2Chunk(`{"content":"Hello"}`), errEv), 1, true},
		} {
			t.Run(c.name+"/max_attempts="+strconv.Itoa(attempts), func(t *testing.T) {
				us := httptest.NewServer(&rawUpstream{pieces: c.pieces})
				defer us.Close()
				ledger := newLocalLedger(t)
				tg := newTestGatewayWith(t, us.URL, func(cf *config.Config) {
					cf.Upstreams[0].Retry.MaxAttempts = attempts
					cf.Models = []config.Model{{Pattern: "gpt-*", InputUSDPerMTok: 2.5, OutputUSDPerMTok: 10}}
				}, func(o *Options) { o.Ledger = ledger })
				body := `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"` +
					strings.Repeat("x", 4000) + `"}]}`
				resp, b := post(t, tg.URL+"/v1/chat/completions", body, nil)
				rec := tg.record(t)
				if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "context_length_exceeded") {
					t.Fatalf("caller got %d %q; want the stream with its error event", resp.StatusCode, b)
				}
				if rec.Interruption != llm.InterruptUpstreamErrorEvent || rec.TokenEvents != c.tokens {
					t.Errorf("record interruption %s, %d tokens; want upstream_error_event, %d tokens",
						rec.Interruption, rec.TokenEvents, c.tokens)
				}
				rows, err := ledger.Query(context.Background(), spend.Filter{})
				if err != nil {
					t.Fatal(err)
				}
				if !c.billed {
					if rec.CostMicros != 0 || len(rows) != 0 {
						t.Errorf("an error-only stream was billed: record %d µ$ (usage %+v), ledger %+v",
							rec.CostMicros, rec.Usage, rows)
					}
					return
				}
				if rec.CostMicros <= 0 || len(rows) != 1 || rows[0].CostMicros != rec.CostMicros || rows[0].Output != 1 {
					t.Errorf("a stream with a token was not billed as such: record %d µ$, ledger %+v", rec.CostMicros, rows)
				}
			})
		}
	}
}

// TestReview2FallbackMetricsFromLastAttempt: a request that fails on a, skips
// b (circuit open) and succeeds on c counts one fallback a→c for a's
// server_error and one retry of a, and no fallback b→c; a request whose
// caller gets the last failure, with no attempt after it, counts no retry.
func TestReview2FallbackMetricsFromLastAttempt(t *testing.T) {
	breakerB := func(c *config.Config) {
		for i := range c.Upstreams {
			c.Upstreams[i].Retry.MaxAttempts = 1
		}
		b := upstreamCfg(t, c, "b")
		b.Breaker = r2Breaker
		b.Breaker.ConsecutiveFailures = 1
	}
	retries := func(t *testing.T, w *resWorld) float64 {
		t.Helper()
		return r2Metric(t, w.tg, "tollgate_upstream_retries_total", map[string]string{"upstream": "a", "reason": "server_error"})
	}

	t.Run("a_then_skipped_b_then_c", func(t *testing.T) {
		// The gateway's clock never moves: b stays open once opened.
		w := newResWorld(t, resSetup{upstreams: []string{"a", "b", "c"}, clock: true, edit: breakerB})
		w.inject(t, "a", "status=500", 1)
		w.inject(t, "b", "status=500", 1)
		wantSuccess(t, kindOpenAI, w.call(t, kindOpenAI, nil))
		wantAttempts(t, w.tg.record(t), "a:500:server_error", "b:500:server_error", "c:200:ok")
		if s := w.metric(t, "tollgate_upstream_circuit_state", map[string]string{"upstream": "b"}); s != metrics.CircuitOpen {
			t.Fatalf("b's circuit state %v, want open", s)
		}
		fallback := func(from, to, reason string) float64 {
			return r2Metric(t, w.tg, "tollgate_upstream_fallbacks_total", map[string]string{"from": from, "to": to, "reason": reason})
		}
		ac, bc, r0 := fallback("a", "c", "server_error"), fallback("b", "c", "breaker_open"), retries(t, w)

		w.inject(t, "a", "status=500", 1)
		wantSuccess(t, kindOpenAI, w.call(t, kindOpenAI, nil))
		wantAttempts(t, w.tg.record(t), "a:500:server_error", "b:0:breaker_open", "c:200:ok")
		if d := fallback("a", "c", "server_error") - ac; d != 1 {
			t.Errorf("fallbacks a→c server_error grew by %v, want 1", d)
		}
		if d := fallback("b", "c", "breaker_open") - bc; d != 0 {
			t.Errorf("fallbacks b→c breaker_open grew by %v, want 0: the request came to c from a", d)
		}
		if d := retries(t, w) - r0; d != 1 {
			t.Errorf("retries a server_error grew by %v, want 1", d)
		}
	})

	t.Run("single_upstream_final_failure", func(t *testing.T) {
		w := newResWorld(t, resSetup{upstreams: []string{"a"}, edit: func(c *config.Config) {
			upstreamCfg(t, c, "a").Retry.MaxAttempts = 1
		}})
		w.inject(t, "a", "status=500", 1)
		if a := w.call(t, kindOpenAI, nil); a.err == nil {
			t.Fatal("the SDK saw a success, want the upstream's 500")
		}
		wantAttempts(t, w.tg.record(t), "a:500:server_error")
		if r := retries(t, w); r != 0 {
			t.Errorf("retries a server_error = %v, want 0: nothing followed the failure", r)
		}
	})

	t.Run("a_then_skipped_b_final_failure", func(t *testing.T) {
		w := newResWorld(t, resSetup{upstreams: []string{"a", "b"}, clock: true, edit: breakerB})
		w.inject(t, "a", "status=500", 1)
		w.inject(t, "b", "status=500", 1)
		if a := w.call(t, kindOpenAI, nil); a.err == nil {
			t.Fatal("the SDK saw a success, want b's 500")
		}
		wantAttempts(t, w.tg.record(t), "a:500:server_error", "b:500:server_error")
		r0 := retries(t, w)

		w.inject(t, "a", "status=500", 1)
		if a := w.call(t, kindOpenAI, nil); a.err == nil {
			t.Fatal("the SDK saw a success, want a's 500")
		}
		wantAttempts(t, w.tg.record(t), "a:500:server_error", "b:0:breaker_open")
		if d := retries(t, w) - r0; d != 0 {
			t.Errorf("retries a server_error grew by %v, want 0: b was skipped, the caller got a's failure", d)
		}
	})
}
