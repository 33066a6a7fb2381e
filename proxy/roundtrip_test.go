package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/metrics"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/spend"
)

// The retry and fallback loop end to end: real loopback mockllm upstreams,
// the gateway on its own loopback server, and the official SDKs with their
// own retries off, so that what an SDK sees is what the gateway did.

// TestResilience429ThenSuccess: an upstream 429 with retry-after-ms is
// retried after at least the hint, and the SDK sees one whole answer.
func TestResilience429ThenSuccess(t *testing.T) {
	for _, k := range allKinds {
		t.Run(k.name, func(t *testing.T) {
			w := newResWorld(t, resSetup{upstreams: []string{"mock"}})
			w.inject(t, "mock", "status=429;retry-after-ms=50", 1)
			wantSuccess(t, k, w.call(t, k, nil))
			if st := w.mocks["mock"].Stats(); st.Requests != 2 || st.Injected != 1 {
				t.Errorf("mock saw %d requests (%d injected), want 2 (1)", st.Requests, st.Injected)
			}
			rec := w.tg.record(t)
			if rec.Outcome != llm.OutcomeOK || rec.Status != http.StatusOK || rec.Upstream != "mock" {
				t.Errorf("record outcome %s status %d upstream %q", rec.Outcome, rec.Status, rec.Upstream)
			}
			wantAttempts(t, rec, "mock:429:rate_limited", "mock:200:ok")
			if rec.RetryWait < 50*time.Millisecond {
				t.Errorf("retry wait %v, below the upstream's 50 ms hint", rec.RetryWait)
			}
			wantMetric(t, w.tg, "tollgate_upstream_retries_total", map[string]string{"upstream": "mock", "reason": "rate_limited"}, 1)
			wantMetric(t, w.tg, "tollgate_upstream_attempts_total", map[string]string{"upstream": "mock", "result": "rate_limited"}, 1)
			wantMetric(t, w.tg, "tollgate_upstream_attempts_total", map[string]string{"upstream": "mock", "result": "ok"}, 1)
			if logs := w.tg.logs.String(); !strings.Contains(logs, `"result":"rate_limited"`) || !strings.Contains(logs, `"attempt_count":2`) {
				t.Errorf("the access log does not list both attempts: %s", logs)
			}
		})
	}
}

// TestResilience529FallsBack: a 529 on the first upstream goes to the next
// one, at once when the first allows one attempt, after its attempts when
// it allows more; the SDK sees one answer, served by the backup.
func TestResilience529FallsBack(t *testing.T) {
	t.Run("one attempt", func(t *testing.T) {
		for _, k := range allKinds {
			t.Run(k.name, func(t *testing.T) {
				w := newResWorld(t, resSetup{upstreams: []string{"primary", "backup"}, edit: func(c *config.Config) {
					upstreamCfg(t, c, "primary").Retry.MaxAttempts = 1
				}})
				w.inject(t, "primary", "status=529", 1)
				wantSuccess(t, k, w.call(t, k, nil))
				if p, b := w.requests("primary"), w.requests("backup"); p != 1 || b != 1 {
					t.Errorf("primary saw %d requests, backup %d; want 1 and 1", p, b)
				}
				rec := w.tg.record(t)
				if rec.Upstream != "backup" || rec.Outcome != llm.OutcomeOK {
					t.Errorf("record upstream %q outcome %s, want backup ok", rec.Upstream, rec.Outcome)
				}
				wantAttempts(t, rec, "primary:529:overloaded", "backup:200:ok")
				wantMetric(t, w.tg, "tollgate_upstream_fallbacks_total",
					map[string]string{"from": "primary", "to": "backup", "reason": "overloaded"}, 1)
			})
		}
	})
	t.Run("three attempts", func(t *testing.T) {
		for _, k := range streamKinds {
			t.Run(k.name, func(t *testing.T) {
				w := newResWorld(t, resSetup{upstreams: []string{"primary", "backup"}})
				// Overloaded for as long as the test lasts: only the
				// policy's max_attempts (3) ends the retries. A header
				// fault would not do: the gateway sends it to the backup
				// too.
				w.inject(t, "primary", "status=529", 100)
				wantSuccess(t, k, w.call(t, k, nil))
				if st := w.mocks["primary"].Stats(); st.Requests != 3 || st.Injected != 3 {
					t.Errorf("primary saw %d requests (%d injected), want 3", st.Requests, st.Injected)
				}
				if b := w.requests("backup"); b != 1 {
					t.Errorf("backup saw %d requests, want 1", b)
				}
				rec := w.tg.record(t)
				if rec.Upstream != "backup" || rec.Outcome != llm.OutcomeOK {
					t.Errorf("record upstream %q outcome %s, want backup ok", rec.Upstream, rec.Outcome)
				}
				wantAttempts(t, rec, "primary:529:overloaded", "primary:529:overloaded", "primary:529:overloaded",
					"backup:200:ok")
				if rec.RetryWait <= 0 {
					t.Errorf("retry wait %v: the two retries on primary did not back off", rec.RetryWait)
				}
				wantMetric(t, w.tg, "tollgate_upstream_fallbacks_total",
					map[string]string{"from": "primary", "to": "backup", "reason": "overloaded"}, 1)
				// Two retries on primary, and the fallback after the third
				// attempt.
				wantMetric(t, w.tg, "tollgate_upstream_retries_total",
					map[string]string{"upstream": "primary", "reason": "overloaded"}, 3)
				wantMetric(t, w.tg, "tollgate_upstream_attempts_total",
					map[string]string{"upstream": "primary", "result": "overloaded"}, 3)
			})
		}
	})
	t.Run("route order and rename", func(t *testing.T) {
		// The file lists backup first; the route puts primary first and
		// renames the model for backup.
		w := newResWorld(t, resSetup{upstreams: []string{"backup", "primary"}, edit: func(c *config.Config) {
			upstreamCfg(t, c, "primary").Retry.MaxAttempts = 1
			c.Routes = []config.Route{{Models: []string{"gpt-test*", "claude-test*"}, Upstreams: []string{"primary", "backup"},
				Rename: map[string]string{"backup": "backup-model"}}}
		}})
		for _, k := range []sdkKind{kindOpenAIStream, kindAnthropicStream} {
			w.inject(t, "primary", "status=529", 1)
			wantSuccess(t, k, w.call(t, k, nil))
			rec := w.tg.record(t)
			wantAttempts(t, rec, "primary:529:overloaded", "backup:200:ok")
			reqs := w.mocks["backup"].Requests()
			var sent struct{ Model string }
			if err := json.Unmarshal(reqs[len(reqs)-1].Body, &sent); err != nil || sent.Model != "backup-model" {
				t.Errorf("%s: backup got model %q (%v), want the route's rename", k.name, sent.Model, err)
			}
		}
		if p, b := w.requests("primary"), w.requests("backup"); p != 2 || b != 2 {
			t.Errorf("primary saw %d requests, backup %d; want 2 and 2", p, b)
		}
		wantMetric(t, w.tg, "tollgate_upstream_fallbacks_total",
			map[string]string{"from": "primary", "to": "backup", "reason": "overloaded"}, 2)
	})
}

// TestResilienceConnectionRefused: an upstream nobody listens on is tried
// max_attempts times, then the request falls back; with no upstream left
// the SDK gets a parseable 502 in its dialect.
func TestResilienceConnectionRefused(t *testing.T) {
	t.Run("fallback", func(t *testing.T) {
		for _, k := range allKinds {
			t.Run(k.name, func(t *testing.T) {
				w := newResWorld(t, resSetup{upstreams: []string{"primary", "backup"}, dead: "primary"})
				wantSuccess(t, k, w.call(t, k, nil))
				if b := w.requests("backup"); b != 1 {
					t.Errorf("backup saw %d requests, want 1", b)
				}
				rec := w.tg.record(t)
				if rec.Upstream != "backup" || rec.Outcome != llm.OutcomeOK {
					t.Errorf("record upstream %q outcome %s, want backup ok", rec.Upstream, rec.Outcome)
				}
				wantAttempts(t, rec, "primary:0:connect_error", "primary:0:connect_error", "primary:0:connect_error",
					"backup:200:ok")
				wantMetric(t, w.tg, "tollgate_upstream_fallbacks_total",
					map[string]string{"from": "primary", "to": "backup", "reason": "connect_error"}, 1)
			})
		}
	})
	t.Run("no upstream left", func(t *testing.T) {
		for _, k := range []sdkKind{kindOpenAI, kindOpenAIStream, kindAnthropic, kindAnthropicStream} {
			t.Run(k.name, func(t *testing.T) {
				w := newResWorld(t, resSetup{upstreams: []string{"dead"}, dead: "dead"})
				a := w.call(t, k, nil)
				if k.anthropic {
					var ae *anthropic.Error
					if !errors.As(a.err, &ae) || ae.StatusCode != http.StatusBadGateway || ae.Type() != "api_error" {
						t.Errorf("Anthropic SDK: %v; want a 502 api_error", a.err)
					}
				} else {
					var oe *openai.Error
					if !errors.As(a.err, &oe) || oe.StatusCode != http.StatusBadGateway || oe.Code != "upstream_unreachable" {
						t.Errorf("OpenAI SDK: %v; want a 502 upstream_unreachable", a.err)
					}
				}
				rec := w.tg.record(t)
				if rec.Outcome != llm.OutcomeUpstreamUnreachable || rec.Status != http.StatusBadGateway {
					t.Errorf("record outcome %s status %d", rec.Outcome, rec.Status)
				}
				wantAttempts(t, rec, "dead:0:connect_error", "dead:0:connect_error", "dead:0:connect_error")
				wantMetric(t, w.tg, "tollgate_upstream_retries_skipped_total",
					map[string]string{"upstream": "dead", "why": "attempts"}, 1)
			})
		}
	})
}

// TestResilienceStallBeforeHeaders: an upstream that sends no headers
// within header_timeout is cut and the request retried; the stalled
// request is cancelled upstream. A non-streamed answer has no header phase:
// the attempt's total timeout cuts it instead.
func TestResilienceStallBeforeHeaders(t *testing.T) {
	for _, k := range []sdkKind{kindOpenAIStream, kindAnthropicStream, kindOpenAI} {
		t.Run(k.name, func(t *testing.T) {
			w := newResWorld(t, resSetup{upstreams: []string{"mock"}, edit: func(c *config.Config) {
				// Well below the 3 s stall, well above a healthy answer's
				// headers (or, non-streamed, its whole body) on a loaded
				// machine.
				c.Upstreams[0].HeaderTimeoutSeconds = 0.5
				if !k.stream {
					c.Upstreams[0].TimeoutSeconds = 1.5
				}
			}})
			w.inject(t, "mock", "stall=3000", 1)
			wantSuccess(t, k, w.call(t, k, nil))
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := w.mocks["mock"].WaitCanceled(ctx, 1); err != nil {
				t.Errorf("the stalled request was not cancelled upstream: %v", err)
			}
			if n := w.requests("mock"); n != 2 {
				t.Errorf("mock saw %d requests, want 2", n)
			}
			rec := w.tg.record(t)
			if rec.Outcome != llm.OutcomeOK {
				t.Errorf("record outcome %s", rec.Outcome)
			}
			cut := "header_timeout"
			if !k.stream {
				cut = "timeout"
			}
			wantAttempts(t, rec, "mock:0:"+cut, "mock:200:ok")
			wantMetric(t, w.tg, "tollgate_upstream_retries_total", map[string]string{"upstream": "mock", "reason": cut}, 1)
		})
	}
}

// TestResilienceDeathMidStream: an upstream that dies after tokens were
// relayed is not retried; the SDK gets the tokens, then the gateway's
// in-band error; the interruption is counted and the tokens so far billed.
func TestResilienceDeathMidStream(t *testing.T) {
	for _, k := range streamKinds {
		t.Run(k.name, func(t *testing.T) {
			w := newResWorld(t, resSetup{upstreams: []string{"mock"}, ledger: true})
			a := w.call(t, k, map[string]string{"X-Mock-Fault": "disconnect=3"})
			if a.text != mockllm.Text(3) {
				t.Errorf("tokens before the cut: %q, want %q", a.text, mockllm.Text(3))
			}
			if k.anthropic {
				var ae *anthropic.Error
				if !errors.As(a.err, &ae) || ae.Type() != "api_error" {
					t.Errorf("Anthropic SDK stream error %v; want an api_error", a.err)
				}
			} else {
				var se *ssestream.StreamError
				if !errors.As(a.err, &se) {
					t.Fatalf("OpenAI SDK stream error %v (%T); want the gateway's error event", a.err, a.err)
				}
				var ev struct {
					Error struct{ Type, Code string }
				}
				if err := json.Unmarshal(se.Event.Data, &ev); err != nil || ev.Error.Code != "upstream_stream_broken" ||
					ev.Error.Type != "server_error" {
					t.Errorf("error event %s (%v); want code upstream_stream_broken", se.Event.Data, err)
				}
			}
			if n := w.requests("mock"); n != 1 {
				t.Errorf("mock saw %d requests, want 1: bytes were sent, no retry", n)
			}
			rec := w.tg.record(t)
			if rec.Outcome != llm.OutcomeUpstreamError || rec.Interruption != llm.InterruptUpstreamEOF ||
				rec.Status != http.StatusOK || rec.Usage.Output != 3 {
				t.Errorf("record outcome %s interruption %s status %d output %d", rec.Outcome, rec.Interruption,
					rec.Status, rec.Usage.Output)
			}
			wantAttempts(t, rec, "mock:200:stream_broken")
			wantMetric(t, w.tg, "tollgate_stream_interruptions_total",
				map[string]string{"route": k.route().String(), "cause": "upstream_eof"}, 1)

			// Billed: the three tokens relayed, and the input the upstream
			// reported (Anthropic's message_start) or else the gateway's
			// prompt estimate of what the caller sent (OpenAI's usage comes
			// at the end, which never came).
			rows, err := w.ledger.Query(context.Background(), spend.Filter{})
			if err != nil {
				t.Fatal(err)
			}
			wantIn := int64(len(a.body)+3) / 4
			if k.anthropic {
				reqs := w.mocks["mock"].Requests()
				wantIn = int64(mockllm.InputTokens(reqs[0].Body))
			}
			if len(rows) != 1 || rows[0].Requests != 1 || rows[0].Output != 3 || rows[0].Input != wantIn ||
				rows[0].CostMicros <= 0 || rows[0].CostMicros != rec.CostMicros {
				t.Errorf("ledger %+v; want one request, 3 output and %d input tokens, cost %d µ$", rows, wantIn, rec.CostMicros)
			}
		})
	}
}

// TestResilienceErrorEventFirst: a retryable error event before the first
// token counts as before the first byte and is retried, the failed
// attempt's opening events held back; after tokens it reaches the SDK as
// the upstream sent it, with no retry.
func TestResilienceErrorEventFirst(t *testing.T) {
	t.Run("first event", func(t *testing.T) {
		for _, k := range streamKinds {
			t.Run(k.name, func(t *testing.T) {
				w := newResWorld(t, resSetup{upstreams: []string{"mock"}})
				// Anthropic's is an overloaded_error, OpenAI's a server_error.
				w.inject(t, "mock", "error-event=0", 1)
				wantSuccess(t, k, w.call(t, k, nil))
				if n := w.requests("mock"); n != 2 {
					t.Errorf("mock saw %d requests, want 2", n)
				}
				rec := w.tg.record(t)
				if rec.Outcome != llm.OutcomeOK || rec.Interruption != llm.InterruptNone {
					t.Errorf("record outcome %s interruption %s", rec.Outcome, rec.Interruption)
				}
				wantAttempts(t, rec, "mock:200:error_event", "mock:200:ok")
				wantMetric(t, w.tg, "tollgate_upstream_retries_total", map[string]string{"upstream": "mock", "reason": "error_event"}, 1)
			})
		}
	})
	t.Run("after tokens", func(t *testing.T) {
		for _, k := range streamKinds {
			t.Run(k.name, func(t *testing.T) {
				w := newResWorld(t, resSetup{upstreams: []string{"mock"}})
				w.inject(t, "mock", "error-event=2", 1)
				a := w.call(t, k, nil)
				if a.text != mockllm.Text(2) {
					t.Errorf("tokens before the error: %q, want %q", a.text, mockllm.Text(2))
				}
				if k.anthropic {
					var ae *anthropic.Error
					if !errors.As(a.err, &ae) || ae.Type() != "overloaded_error" {
						t.Errorf("Anthropic SDK stream error %v; want the upstream's overloaded_error", a.err)
					}
				} else {
					var se *ssestream.StreamError
					if !errors.As(a.err, &se) {
						t.Fatalf("OpenAI SDK stream error %v (%T); want the upstream's error event", a.err, a.err)
					}
					var ev struct {
						Error struct{ Type string }
					}
					if err := json.Unmarshal(se.Event.Data, &ev); err != nil || ev.Error.Type != "server_error" ||
						strings.Contains(string(se.Event.Data), "upstream_stream_broken") {
						t.Errorf("error event %s (%v); want the upstream's server_error", se.Event.Data, err)
					}
				}
				if n := w.requests("mock"); n != 1 {
					t.Errorf("mock saw %d requests, want 1: tokens were sent, no retry", n)
				}
				// One attempt, committed. Its outcome races the SDK's close
				// against the upstream's end of body (see
				// TestResilienceErrorEventThenCallerLeaves), so only what
				// does not depend on that race is checked here.
				rec := w.tg.record(t)
				if rec.AttemptCount != 1 || rec.Attempts[0].Status != http.StatusOK || rec.Status != http.StatusOK ||
					rec.TokenEvents != 2 {
					t.Errorf("record attempts %v status %d token events %d; want one 200 attempt, 2 tokens",
						attemptList(rec), rec.Status, rec.TokenEvents)
				}
			})
		}
	})
}

// errorThenHold is an upstream that streams body and then keeps the
// connection open until the gateway leaves (at most 5 s): the upstream's
// end of body comes after the caller's close, always.
type errorThenHold struct{ body string }

func (u errorThenHold) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, u.body)
	_ = http.NewResponseController(w).Flush()
	select {
	case <-r.Context().Done():
	case <-time.After(5 * time.Second):
	}
}

// TestResilienceErrorEventThenCallerLeaves: the SDKs stop and close the
// connection as soon as they read an error event. The upstream's error,
// already relayed, is what ended the exchange: the record must say so
// whether the caller's close or the upstream's end of body comes first
// (the rule TestRelayErrorEventThenDoneThenClientLeaves states for vLLM's
// error-then-[DONE]), and the breaker must count the failure.
func TestResilienceErrorEventThenCallerLeaves(t *testing.T) {
	anthropicBody := "event: message_start\n" +
		`data: {"type":"message_start","message":{"id":"msg_hold","type":"message","role":"assistant","model":"claude-test","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":9,"output_tokens":1}}}` + "\n\n" +
		"event: content_block_start\n" +
		`data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}` + "\n\n" +
		"event: content_block_delta\n" +
		`data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Oslo"}}` + "\n\n" +
		"event: error\n" +
		`data: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}` + "\n\n"
	openAIBody := openAIRole + openAITok1 +
		`data: {"error":{"message":"boom","type":"server_error","param":null,"code":null}}` + "\n\n"
	for _, k := range streamKinds {
		t.Run(k.name, func(t *testing.T) {
			body := openAIBody
			if k.anthropic {
				body = anthropicBody
			}
			up := httptest.NewServer(errorThenHold{body: body})
			t.Cleanup(up.Close)
			tg := newTestGateway(t, up.URL, func(c *config.Config) { c.Upstreams[0].Retry.BaseDelayMs = 5 })
			w := &resWorld{tg: tg}
			a := w.call(t, k, nil)
			if a.err == nil || a.text != "Oslo" {
				t.Fatalf("SDK: text %q error %v; want the token, then the upstream's error", a.text, a.err)
			}
			rec := tg.record(t)
			if rec.Outcome != llm.OutcomeUpstreamError || rec.Interruption != llm.InterruptUpstreamErrorEvent {
				t.Errorf("record outcome %s interruption %s; want upstream_error / upstream_error_event",
					rec.Outcome, rec.Interruption)
			}
			wantAttempts(t, rec, "mock:200:error_event")
			wantMetric(t, w.tg, "tollgate_stream_interruptions_total",
				map[string]string{"route": k.route().String(), "cause": "upstream_error_event"}, 1)
		})
	}
}

// TestRefusedRetryDoesNotWait: a retry the budget or the breaker will
// refuse is refused before the Retry-After wait, not after it: the caller
// gets the upstream's 429 at once, not after sleeping the 1.5 s hint, and
// the record shows no wait.
func TestRefusedRetryDoesNotWait(t *testing.T) {
	const errBody = `{"error":{"message":"slow down","type":"requests","param":null,"code":"rate_limit_exceeded"}}`
	cases := []struct {
		name string
		edit func(u *config.Upstream)
		why  string
	}{
		{"empty budget", func(u *config.Upstream) {
			u.Retry.BudgetRatio, u.Retry.BudgetMinPerSecond = 0, 0
		}, skipBudget},
		{"breaker opened by the attempt", func(u *config.Upstream) {
			u.Breaker.ConsecutiveFailures = 1
		}, skipBreakerOpen},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var hits atomic.Int32
			us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				hits.Add(1)
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Retry-After-Ms", "1500")
				w.WriteHeader(http.StatusTooManyRequests)
				_, _ = io.WriteString(w, errBody)
			}))
			defer us.Close()
			tg := newTestGateway(t, us.URL, func(cfg *config.Config) { c.edit(&cfg.Upstreams[0]) })
			resp, body := post(t, tg.URL+"/v1/chat/completions", plainChat, nil)
			rec := tg.record(t)
			if resp.StatusCode != http.StatusTooManyRequests || string(body) != errBody {
				t.Errorf("caller got %d %q; want the upstream's 429", resp.StatusCode, body)
			}
			if rec.RetryWait != 0 {
				t.Errorf("record retry wait %v for a retry that was not taken; want 0", rec.RetryWait)
			}
			if hits.Load() != 1 {
				t.Errorf("upstream hits %d, want 1", hits.Load())
			}
			wantAttempts(t, rec, "mock:429:rate_limited")
			if v := metricValue(t, tg, "tollgate_upstream_retries_skipped_total",
				map[string]string{"upstream": "mock", "why": c.why}); v != 1 {
				t.Errorf("retries skipped {why=%q} = %v, want 1", c.why, v)
			}
		})
	}
}

// TestUnavailableRetryAfterFromSkippedBreakers: the 503 of a request
// whose every upstream was skipped (a breaker open, a full queue: no
// bypass, since not every breaker refused it) advertises the cooldown of the
// breakers it skipped, not that of an upstream its key may not go to.
func TestUnavailableRetryAfterFromSkippedBreakers(t *testing.T) {
	clk := newFakeClock()
	primary := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusInternalServerError)
	}))
	defer primary.Close()
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusInternalServerError)
	}))
	defer other.Close()
	tg := newTestGatewayWith(t, primary.URL, func(cfg *config.Config) {
		u := &cfg.Upstreams[0]
		u.Retry.MaxAttempts = 1
		u.Breaker.ConsecutiveFailures, u.Breaker.CooldownSeconds = 1, 30
		// A replica at the primary's origin, without a breaker, whose
		// rate lets one request through and refuses the next at once.
		rep := config.DefaultUpstream()
		rep.Name, rep.BaseURL = "replica", primary.URL
		rep.Retry.MaxAttempts = 1
		rep.Breaker.Enabled = false
		rep.RequestsPerSecond, rep.QueueSize = 0.001, 0
		b := config.DefaultUpstream()
		b.Name, b.BaseURL = "other", other.URL
		b.Retry.MaxAttempts = 1
		b.Breaker.ConsecutiveFailures, b.Breaker.CooldownSeconds = 1, 2
		cfg.Upstreams = append(cfg.Upstreams, rep, b)
	}, func(o *Options) { o.Now = clk.Now })
	// A keyless request opens both breakers (mock, the primary, then the
	// last fallback) and takes the replica's turn.
	post(t, tg.URL+"/v1/chat/completions", plainChat, nil)
	wantAttempts(t, tg.record(t), "mock:500:server_error", "replica:500:server_error", "other:500:server_error")
	// A caller with a key may only go to the primary and the replica
	// (another origin for the third): its 503 must say 30 s, not the other
	// upstream's 2 s.
	resp, body := post(t, tg.URL+"/v1/chat/completions", plainChat, map[string]string{"Authorization": "Bearer sk-caller"})
	wantAttempts(t, tg.record(t), "mock:0:breaker_open", "replica:0:queue_full", "other:0:key_scope")
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "30" {
		t.Fatalf("status %d Retry-After %q body %s; want 503 with Retry-After 30", resp.StatusCode,
			resp.Header.Get("Retry-After"), body)
	}
	// The same in the Anthropic dialect: its overloaded_error.
	resp, body = post(t, tg.URL+"/v1/messages", `{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`,
		map[string]string{"X-Api-Key": "sk-ant-caller", "Anthropic-Version": "2023-06-01"})
	wantAttempts(t, tg.record(t), "mock:0:breaker_open", "replica:0:queue_full", "other:0:key_scope")
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "30" ||
		!strings.Contains(string(body), `"type":"overloaded_error"`) {
		t.Errorf("Anthropic caller: status %d Retry-After %q body %s; want 503 overloaded_error with Retry-After 30",
			resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
}

// rawAnswer is what one caller of TestShutdownDuringBackoff saw.
type rawAnswer struct {
	status int
	header http.Header
	body   []byte
	chunks int // SDK stream events received
	err    error
}

// TestShutdownDuringBackoff: a request sleeping before its retry (the
// upstream asked for 3 s) when the server cancels its base context with
// ErrShutdown gets a 503 with Retry-After, in its dialect
// (gateway_shutting_down / overloaded_error), and both official SDKs,
// streamed or not, see a parseable API error instead of an empty success.
// The record's outcome is gateway_shutdown, with that 503.
func TestShutdownDuringBackoff(t *testing.T) {
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
		ask       func(ctx context.Context, url string) rawAnswer
		check     func(t *testing.T, a rawAnswer)
	}{
		{"raw_openai", false, func(ctx context.Context, url string) rawAnswer {
			return askRaw(ctx, url+"/v1/chat/completions", oaiBody)
		}, func(t *testing.T, a rawAnswer) {
			wantShutdownAnswer(t, a)
			var e struct {
				Error struct{ Type, Code, Message string }
			}
			if err := json.Unmarshal(a.body, &e); err != nil || e.Error.Code != "gateway_shutting_down" ||
				e.Error.Type != "server_error" || e.Error.Message == "" {
				t.Errorf("body %q (%v); want an OpenAI error with code gateway_shutting_down", a.body, err)
			}
		}},
		{"raw_anthropic", true, func(ctx context.Context, url string) rawAnswer {
			return askRaw(ctx, url+"/v1/messages", antBody)
		}, func(t *testing.T, a rawAnswer) {
			wantShutdownAnswer(t, a)
			var e struct {
				Type  string
				Error struct{ Type, Message string }
			}
			if err := json.Unmarshal(a.body, &e); err != nil || e.Type != "error" ||
				e.Error.Type != "overloaded_error" || e.Error.Message == "" {
				t.Errorf("body %q (%v); want an Anthropic error of type overloaded_error", a.body, err)
			}
		}},
		{"openai_sdk", false, func(ctx context.Context, url string) rawAnswer {
			c := openai.NewClient(option.WithBaseURL(url+"/v1"), option.WithAPIKey("sk-shutdown"), option.WithMaxRetries(0))
			comp, err := c.Chat.Completions.New(ctx, oaiParams)
			if err == nil && comp != nil {
				return rawAnswer{chunks: len(comp.Choices)}
			}
			return rawAnswer{err: err}
		}, wantOpenAIShutdownError},
		{"openai_sdk_stream", false, func(ctx context.Context, url string) rawAnswer {
			c := openai.NewClient(option.WithBaseURL(url+"/v1"), option.WithAPIKey("sk-shutdown"), option.WithMaxRetries(0))
			s := c.Chat.Completions.NewStreaming(ctx, oaiParams)
			var a rawAnswer
			for s.Next() {
				a.chunks++
			}
			a.err = s.Err()
			_ = s.Close()
			return a
		}, wantOpenAIShutdownError},
		{"anthropic_sdk", true, func(ctx context.Context, url string) rawAnswer {
			c := anthropic.NewClient(aoption.WithBaseURL(url), aoption.WithAPIKey("sk-ant-shutdown"), aoption.WithMaxRetries(0))
			m, err := c.Messages.New(ctx, antParams)
			if err == nil && m != nil {
				return rawAnswer{chunks: len(m.Content)}
			}
			return rawAnswer{err: err}
		}, wantAnthropicShutdownError},
		{"anthropic_sdk_stream", true, func(ctx context.Context, url string) rawAnswer {
			c := anthropic.NewClient(aoption.WithBaseURL(url), aoption.WithAPIKey("sk-ant-shutdown"), aoption.WithMaxRetries(0))
			s := c.Messages.NewStreaming(ctx, antParams)
			var a rawAnswer
			for s.Next() {
				a.chunks++
			}
			a.err = s.Err()
			_ = s.Close()
			return a
		}, wantAnthropicShutdownError},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			up := newFixedUpstream(http.StatusTooManyRequests,
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
			got := make(chan rawAnswer, 1)
			go func() { got <- c.ask(ctx, srv.URL) }()

			select {
			case <-up.first:
			case <-ctx.Done():
				t.Fatal("the upstream never saw the request")
			}
			// The retry is counted just before the gateway sleeps for it: from
			// then on the request waits out the upstream's 3 s.
			waitFor(t, "the retry to be counted", func() bool {
				return metricValue(t, tg, "tollgate_upstream_retries_total", map[string]string{"upstream": "mock"}) >= 1
			})
			cancel(ErrShutdown)
			var a rawAnswer
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

// askRaw sends body to url and reads the whole answer.
func askRaw(ctx context.Context, url, body string) rawAnswer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return rawAnswer{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk-shutdown")
	req.Header.Set("X-Api-Key", "sk-ant-shutdown")
	req.Header.Set("Anthropic-Version", "2023-06-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return rawAnswer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return rawAnswer{status: resp.StatusCode, header: resp.Header, body: b, err: err}
}

func wantShutdownAnswer(t *testing.T, a rawAnswer) {
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

func wantOpenAIShutdownError(t *testing.T, a rawAnswer) {
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

func wantAnthropicShutdownError(t *testing.T, a rawAnswer) {
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

// TestFallbackMetricsFromLastAttempt: a request that fails on a, skips
// b (circuit open) and succeeds on c counts one fallback a→c for a's
// server_error and one retry of a, and no fallback b→c; a request whose
// caller gets the last failure, with no attempt after it, counts no retry.
func TestFallbackMetricsFromLastAttempt(t *testing.T) {
	breakerB := func(c *config.Config) {
		for i := range c.Upstreams {
			c.Upstreams[i].Retry.MaxAttempts = 1
		}
		b := upstreamCfg(t, c, "b")
		b.Breaker = tightBreaker
		b.Breaker.ConsecutiveFailures = 1
	}
	retries := func(t *testing.T, w *resWorld) float64 {
		t.Helper()
		return max(metricValue(t, w.tg, "tollgate_upstream_retries_total", map[string]string{"upstream": "a", "reason": "server_error"}), 0)
	}

	t.Run("a_then_skipped_b_then_c", func(t *testing.T) {
		// The gateway's clock never moves: b stays open once opened.
		w := newResWorld(t, resSetup{upstreams: []string{"a", "b", "c"}, clock: true, edit: breakerB})
		w.inject(t, "a", "status=500", 1)
		w.inject(t, "b", "status=500", 1)
		wantSuccess(t, kindOpenAI, w.call(t, kindOpenAI, nil))
		wantAttempts(t, w.tg.record(t), "a:500:server_error", "b:500:server_error", "c:200:ok")
		if s := circuitState(t, w.tg, "b"); s != metrics.CircuitOpen {
			t.Fatalf("b's circuit state %v, want open", s)
		}
		fallback := func(from, to, reason string) float64 {
			return max(metricValue(t, w.tg, "tollgate_upstream_fallbacks_total", map[string]string{"from": from, "to": to, "reason": reason}), 0)
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

// TestFirstTokenTimeoutRetried: an upstream that opens its stream but
// sends no token within first_token_timeout is abandoned before the caller
// got a byte, and the retry answers; the caller sees one clean stream (one
// preamble, not the held one of the failed attempt).
func TestFirstTokenTimeoutRetried(t *testing.T) {
	tests := []struct {
		name, path, body, preambleMark, terminal string
	}{
		{"openai", "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			`"role":"assistant"`, "data: [DONE]\n\n"},
		{"anthropic", "/v1/messages", `{"model":"m","stream":true,"max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`,
			"event: message_start", "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mock, url := mockUpstream(t, mockllm.Options{OutputTokens: 3})
			tg := newTestGateway(t, url, func(c *config.Config) {
				c.Upstreams[0].FirstTokenTimeoutSeconds = 0.2
				fastRetry(&c.Upstreams[0])
			})
			if err := mock.Inject("hang=0", 1); err != nil {
				t.Fatal(err)
			}
			resp, body := post(t, tg.URL+tc.path, tc.body, nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			if n := strings.Count(string(body), tc.preambleMark); n != 1 {
				t.Errorf("caller got %d preambles (%q), want 1", n, tc.preambleMark)
			}
			for _, tok := range []string{" tok1", " tok2", " tok3"} {
				if !strings.Contains(string(body), tok) {
					t.Errorf("caller's stream lacks %q", tok)
				}
			}
			if !strings.HasSuffix(string(body), tc.terminal) {
				t.Errorf("stream does not end with its terminal event: %q", body)
			}
			rec := tg.record(t)
			if got, want := attemptList(rec), []string{"mock:200:first_token_timeout", "mock:200:ok"}; !slices.Equal(got, want) {
				t.Errorf("attempts %v, want %v", got, want)
			}
			if rec.Outcome != llm.OutcomeOK || rec.Interruption != llm.InterruptNone {
				t.Errorf("outcome %s interruption %s", rec.Outcome, rec.Interruption)
			}
			if st := mock.Stats(); st.Requests != 2 {
				t.Errorf("mock saw %d requests, want 2", st.Requests)
			}
			ctx, cancel := context.WithTimeout(context.Background(), testWait)
			defer cancel()
			if err := mock.WaitCanceled(ctx, 1); err != nil {
				t.Errorf("the hung attempt was never cut: %v", err)
			}
		})
	}
}

// TestOverheadExcludesRetries: the gateway's overhead of a retried
// request leaves out the failed attempt and the wait before the retry. The
// wait is the upstream's retry-after-ms, honoured exactly, so the recorded
// figures can be compared with each other: the raw time to the last
// attempt's request includes the wait, the overhead does not.
func TestOverheadExcludesRetries(t *testing.T) {
	mock, url := mockUpstream(t, mockllm.Options{OutputTokens: 2})
	tg := newTestGateway(t, url, nil)
	if err := mock.Inject("status=429;retry-after-ms=50", 1); err != nil {
		t.Fatal(err)
	}
	resp, body := post(t, tg.URL+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	rec := tg.record(t)
	const wait = 50 * time.Millisecond
	if rec.AttemptCount != 2 || rec.RetryWait != wait {
		t.Fatalf("attempts %d retry wait %v, want 2 attempts and a %v wait", rec.AttemptCount, rec.RetryWait, wait)
	}
	if rec.Retrying < rec.RetryWait {
		t.Errorf("retrying %v is shorter than the retry wait %v it includes", rec.Retrying, rec.RetryWait)
	}
	if toSent := rec.Timing.UpSent.Sub(rec.Timing.In); toSent < rec.RetryWait {
		t.Errorf("arrival to the last request sent %v, shorter than the wait %v", toSent, rec.RetryWait)
	}
	// The overhead is what is left of arrival → last request sent once the
	// retrying is taken out (an identity on the recorded figures, not a
	// timing): it must not contain the wait.
	want := rec.Timing.UpSent.Sub(rec.Timing.In) - rec.Retrying + rec.RelayOverhead
	if oh := rec.Overhead(); oh != max(want, rec.RelayOverhead) || oh < 0 ||
		rec.Timing.UpSent.Sub(rec.Timing.In)-oh+rec.RelayOverhead < rec.RetryWait {
		t.Errorf("overhead %v includes the retry (wait %v, retrying %v)", oh, rec.RetryWait, rec.Retrying)
	}
}

// TestCallerKeyScope: in passthrough mode a caller's own key goes only to
// upstreams at the origin of its route's first upstream, unless the fallback
// accepts caller keys; a keyless caller falls back freely (the upstream's own
// key, if any, is what goes there).
func TestCallerKeyScope(t *testing.T) {
	for _, c := range []struct {
		name        string
		key         string
		acceptsKeys bool
		wantStatus  int
		wantBackup  int64
	}{
		{"caller key, backup at another origin: skipped", "sk-caller-1", false, 529, 0},
		{"caller key, backup accepts caller keys", "sk-caller-1", true, 200, 1},
		{"no caller key: fallback", "", false, 200, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			primary := mockllm.New(mockllm.Options{OutputTokens: 2})
			ps := httptest.NewServer(primary)
			defer ps.Close()
			backup := mockllm.New(mockllm.Options{OutputTokens: 2})
			bs := httptest.NewServer(backup)
			defer bs.Close()
			tg := newTestGateway(t, ps.URL, func(cfg *config.Config) {
				cfg.Upstreams[0].Name = "primary"
				cfg.Upstreams[0].Retry.MaxAttempts = 1
				b := config.DefaultUpstream()
				b.Name, b.BaseURL, b.CallerKeysOnFallback = "backup", bs.URL, c.acceptsKeys
				cfg.Upstreams = append(cfg.Upstreams, b)
			})
			if err := primary.Inject("status=529", 1); err != nil {
				t.Fatal(err)
			}
			hdr := map[string]string{}
			if c.key != "" {
				hdr["Authorization"] = "Bearer " + c.key
			}
			resp, body := post(t, tg.URL+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, hdr)
			if resp.StatusCode != c.wantStatus {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.wantStatus, body)
			}
			if n := backup.Stats().Requests; n != c.wantBackup {
				t.Errorf("backup saw %d requests, want %d", n, c.wantBackup)
			}
			rec := tg.record(t)
			if c.wantBackup == 0 {
				// The backup was never a candidate: the primary's answer
				// is relayed as the last attempt's, without being held.
				if rec.AttemptCount != 1 || rec.Attempts[0].Result != resultOverloaded {
					t.Errorf("attempts %+v, want the primary's 529 alone", rec.Attempts[:rec.AttemptCount])
				}
			}
			for _, r := range backup.Requests() {
				if strings.Contains(r.Header.Get("Authorization"), "sk-caller") && !c.acceptsKeys {
					t.Errorf("the caller's key reached the backup")
				}
			}
		})
	}
}

// TestOnlyUpstreamOpenCircuitStillServes: with the default breaker and one
// upstream, two requests that the upstream fails open its circuit. Once the
// upstream is healthy again, the next requests reach it and succeed (the
// first sent in bypass, whose success half-opens the circuit; the second a
// probe that closes it), instead of the gateway refusing every caller with
// its own 503 for the cooldown.
func TestOnlyUpstreamOpenCircuitStillServes(t *testing.T) {
	w := newResWorld(t, resSetup{upstreams: []string{"mock"}, clock: true})
	// 3 attempts, then 2: the fifth failure in a row opens the circuit and
	// the breaker holds back the last retry.
	w.inject(t, "mock", "status=500", 5)
	for i := range 2 {
		a := w.call(t, kindOpenAI, nil)
		var oe *openai.Error
		if !errors.As(a.err, &oe) || oe.StatusCode != http.StatusInternalServerError {
			t.Fatalf("failing request %d: %v; want the upstream's 500", i+1, a.err)
		}
		w.tg.record(t)
	}
	if s := circuitState(t, w.tg, "mock"); s != metrics.CircuitOpen {
		t.Fatalf("circuit state %v after 5 failures in a row, want open", s)
	}
	hits := w.requests("mock")
	// The gateway's clock stands still: without the upstream's answers the
	// circuit would stay open for the whole test.
	for i, k := range []sdkKind{kindOpenAI, kindAnthropicStream, kindOpenAIStream} {
		wantSuccess(t, k, w.call(t, k, nil))
		rec := w.tg.record(t)
		wantAttempts(t, rec, "mock:200:ok")
		if n := w.requests("mock"); n != hits+int64(i)+1 {
			t.Errorf("after healthy request %d the upstream saw %d requests, want %d", i+1, n, hits+int64(i)+1)
		}
		if got, want := rec.Attempts[0].BreakerBypass, i == 0; got != want {
			t.Errorf("healthy request %d: breaker bypass %v, want %v", i+1, got, want)
		}
		line := accessLogLine(t, w.tg, rec.RequestID)
		if got, want := strings.Contains(string(line["attempts"]), `"breaker_bypass":true`), i == 0; got != want {
			t.Errorf("healthy request %d: access-log attempts %s; breaker_bypass shown %v, want %v", i+1, line["attempts"], got, want)
		}
		if want := []float64{metrics.CircuitHalfOpen, metrics.CircuitClosed, metrics.CircuitClosed}[i]; circuitState(t, w.tg, "mock") != want {
			t.Errorf("after healthy request %d the circuit state is %v, want %v", i+1, circuitState(t, w.tg, "mock"), want)
		}
	}
	wantMetric(t, w.tg, "tollgate_upstream_breaker_bypass_total", map[string]string{"upstream": "mock"}, 1)
	wantMetric(t, w.tg, "tollgate_upstream_retries_skipped_total", map[string]string{"upstream": "mock", "why": "breaker_open"}, 1)
}

// TestBypassAttemptNotRetried: a request sent in bypass to an upstream that
// still fails gets one attempt there: its retry, like any retry to an open
// upstream, is held back by the breaker (before any wait), and it falls back
// nowhere, so the caller gets the upstream's failure as it came, not the
// gateway's 503; the circuit stays open.
func TestBypassAttemptNotRetried(t *testing.T) {
	w := newResWorld(t, resSetup{upstreams: []string{"a", "b"}, clock: true, edit: func(c *config.Config) {
		for _, name := range []string{"a", "b"} {
			u := upstreamCfg(t, c, name)
			u.Breaker = tightBreaker
			u.Breaker.ConsecutiveFailures = 1
		}
	}})
	// One request opens both: a's 500 (retry held back: a is open), then b's.
	w.inject(t, "a", "status=500", 3)
	w.inject(t, "b", "status=500", 1)
	if a := w.call(t, kindOpenAI, nil); a.err == nil {
		t.Fatal("the SDK saw a success, want b's 500")
	}
	wantAttempts(t, w.tg.record(t), "a:500:server_error", "b:500:server_error")
	skipped := metricValue(t, w.tg, "tollgate_upstream_retries_skipped_total", map[string]string{"upstream": "a", "why": "breaker_open"})
	for _, k := range []sdkKind{kindOpenAI, kindAnthropicStream} {
		a := w.call(t, k, nil)
		rec := w.tg.record(t)
		if a.err == nil || rec.Status != http.StatusInternalServerError {
			t.Fatalf("%s: error %v, status %d; want a's 500", k.name, a.err, rec.Status)
		}
		// a and b opened at the same instant: a, first in route order.
		wantAttempts(t, rec, "a:500:server_error")
		if !rec.Attempts[0].BreakerBypass || rec.RetryWait != 0 {
			t.Errorf("%s: bypass %v, retry wait %v; want a bypass and no wait", k.name, rec.Attempts[0].BreakerBypass, rec.RetryWait)
		}
	}
	if n, m := w.requests("a"), w.requests("b"); n != 3 || m != 1 {
		t.Errorf("a saw %d requests, b %d; want 3 and 1", n, m)
	}
	wantMetric(t, w.tg, "tollgate_upstream_retries_skipped_total", map[string]string{"upstream": "a", "why": "breaker_open"}, skipped+2)
	for _, name := range []string{"a", "b"} {
		if s := circuitState(t, w.tg, name); s != metrics.CircuitOpen {
			t.Errorf("%s's circuit state %v, want open", name, s)
		}
	}
}

// TestOpenUpstreamSkippedWhileAnotherServes: with one upstream open and the
// next one healthy, the open one is still skipped without being asked (no
// bypass), and the request is a fallback to the healthy one, as before.
func TestOpenUpstreamSkippedWhileAnotherServes(t *testing.T) {
	w := newResWorld(t, resSetup{upstreams: []string{"primary", "backup"}, clock: true, edit: func(c *config.Config) {
		u := upstreamCfg(t, c, "primary")
		u.Retry.MaxAttempts = 1
		u.Breaker = tightBreaker
		u.Breaker.ConsecutiveFailures = 1
	}})
	w.inject(t, "primary", "status=500", 1)
	wantSuccess(t, kindOpenAI, w.call(t, kindOpenAI, nil))
	wantAttempts(t, w.tg.record(t), "primary:500:server_error", "backup:200:ok")
	if s := circuitState(t, w.tg, "primary"); s != metrics.CircuitOpen {
		t.Fatalf("primary's circuit state %v, want open", s)
	}
	for _, k := range allKinds {
		wantSuccess(t, k, w.call(t, k, nil))
		rec := w.tg.record(t)
		wantAttempts(t, rec, "primary:0:breaker_open", "backup:200:ok")
		if rec.Upstream != "backup" || rec.Attempts[1].BreakerBypass {
			t.Errorf("%s: answered by %q, bypass %v; want backup, no bypass", k.name, rec.Upstream, rec.Attempts[1].BreakerBypass)
		}
	}
	if n := w.requests("primary"); n != 1 {
		t.Errorf("primary saw %d requests, want its one failure: an open upstream is skipped while another serves", n)
	}
	wantMetric(t, w.tg, "tollgate_upstream_fallbacks_total",
		map[string]string{"from": "primary", "to": "backup", "reason": "breaker_open"}, float64(len(allKinds)))
	for _, name := range []string{"primary", "backup"} {
		wantMetric(t, w.tg, "tollgate_upstream_breaker_bypass_total", map[string]string{"upstream": name}, 0)
	}
}

// TestAllOpenLongestOpenServes: with both upstreams open, the request goes
// to the one whose circuit opened first, though it comes second in the
// route; its success closes that circuit, and the next request goes to it
// as a fallback from the still open first one.
func TestAllOpenLongestOpenServes(t *testing.T) {
	w := newResWorld(t, resSetup{upstreams: []string{"a", "b"}, clock: true, edit: func(c *config.Config) {
		for _, name := range []string{"a", "b"} {
			u := upstreamCfg(t, c, name)
			u.Retry.MaxAttempts = 1
			u.Breaker = tightBreaker // two failures in a row, 60 s cooldown, one probe
		}
		upstreamCfg(t, c, "b").Breaker.ConsecutiveFailures = 1
	}})
	// b opens first: a fails once (still closed), then b.
	w.inject(t, "a", "status=500", 2)
	w.inject(t, "b", "status=500", 1)
	if a := w.call(t, kindOpenAI, nil); a.err == nil {
		t.Fatal("the SDK saw a success, want b's 500")
	}
	wantAttempts(t, w.tg.record(t), "a:500:server_error", "b:500:server_error")
	// 2 s later a opens: its second failure, relayed (b is skipped).
	w.clock.Advance(2 * time.Second)
	if a := w.call(t, kindOpenAI, nil); a.err == nil {
		t.Fatal("the SDK saw a success, want a's 500")
	}
	wantAttempts(t, w.tg.record(t), "a:500:server_error", "b:0:breaker_open")
	for _, name := range []string{"a", "b"} {
		if s := circuitState(t, w.tg, name); s != metrics.CircuitOpen {
			t.Fatalf("%s's circuit state %v, want open", name, s)
		}
	}
	aHits, bHits := w.requests("a"), w.requests("b")
	wantSuccess(t, kindOpenAIStream, w.call(t, kindOpenAIStream, nil))
	rec := w.tg.record(t)
	wantAttempts(t, rec, "b:200:ok")
	if rec.Upstream != "b" || !rec.Attempts[0].BreakerBypass {
		t.Errorf("answered by %q, bypass %v; want b, the one open longest, in bypass", rec.Upstream, rec.Attempts[0].BreakerBypass)
	}
	if w.requests("a") != aHits || w.requests("b") != bHits+1 {
		t.Errorf("a saw %d more requests, b %d more; want 0 and 1", w.requests("a")-aHits, w.requests("b")-bHits)
	}
	wantMetric(t, w.tg, "tollgate_upstream_breaker_bypass_total", map[string]string{"upstream": "b"}, 1)
	wantMetric(t, w.tg, "tollgate_upstream_breaker_bypass_total", map[string]string{"upstream": "a"}, 0)
	if s := circuitState(t, w.tg, "b"); s != metrics.CircuitClosed {
		t.Errorf("b's circuit state %v after its bypass succeeded (half_open_probes 1), want closed", s)
	}
	// b is closed again: an ordinary fallback from a, still open.
	wantSuccess(t, kindAnthropicStream, w.call(t, kindAnthropicStream, nil))
	rec = w.tg.record(t)
	wantAttempts(t, rec, "a:0:breaker_open", "b:200:ok")
	if rec.Attempts[1].BreakerBypass {
		t.Error("a fallback to a closed circuit marked breaker_bypass")
	}
}

// TestBypassOnlyWhereTheKeyMayGo: a passthrough caller's key goes only to
// its route's first origin, in bypass too. With both upstreams open, the one
// at another origin open longest, a keyless request goes there and a keyed
// one to the first upstream.
func TestBypassOnlyWhereTheKeyMayGo(t *testing.T) {
	w := newResWorld(t, resSetup{upstreams: []string{"primary", "other"}, clock: true, edit: func(c *config.Config) {
		for _, name := range []string{"primary", "other"} {
			u := upstreamCfg(t, c, name)
			u.Retry.MaxAttempts = 1
			u.Breaker = tightBreaker
		}
		upstreamCfg(t, c, "other").Breaker.ConsecutiveFailures = 1
		upstreamCfg(t, c, "other").CallerKeysOnFallback = false
	}})
	w.inject(t, "primary", "status=500", 2)
	w.inject(t, "other", "status=500", 1)
	// Keyless requests (an empty Authorization: the SDKs always send one).
	keyless := map[string]string{"Authorization": ""}
	w.call(t, kindOpenAI, keyless)
	wantAttempts(t, w.tg.record(t), "primary:500:server_error", "other:500:server_error")
	w.clock.Advance(time.Second)
	w.call(t, kindOpenAI, keyless)
	wantAttempts(t, w.tg.record(t), "primary:500:server_error", "other:0:breaker_open")

	// other opened first, but the SDK's key may not go there.
	wantSuccess(t, kindOpenAI, w.call(t, kindOpenAI, nil))
	rec := w.tg.record(t)
	wantAttempts(t, rec, "primary:200:ok")
	if !rec.Attempts[0].BreakerBypass {
		t.Error("the keyed request's attempt on primary is not marked breaker_bypass")
	}
	if n := w.requests("other"); n != 1 {
		t.Errorf("other saw %d requests, want 1: the caller's key must not reach it", n)
	}
	// primary's bypass success closed it (one probe). Two keyless
	// failures open it again, later than other: the next keyless request
	// goes to other, open longest.
	w.inject(t, "primary", "status=500", 2)
	for range 2 {
		w.call(t, kindOpenAI, keyless)
		w.tg.record(t)
	}
	if s := circuitState(t, w.tg, "primary"); s != metrics.CircuitOpen {
		t.Fatalf("primary's circuit state %v, want open", s)
	}
	wantSuccess(t, kindOpenAI, w.call(t, kindOpenAI, keyless))
	rec = w.tg.record(t)
	wantAttempts(t, rec, "other:200:ok")
	if !rec.Attempts[0].BreakerBypass {
		t.Error("the keyless request's attempt on other is not marked breaker_bypass")
	}
}

// TestRecordTakesUpstreamFactsFromTheLastAttemptOnly: the record's
// upstream, upstream request id and stream form are the last attempt's. An
// attempt that got no answer, after attempts that got one with an id, leaves
// the id empty: the earlier upstream's id beside the later upstream's name
// would send an operator to the wrong provider log.
func TestRecordTakesUpstreamFactsFromTheLastAttemptOnly(t *testing.T) {
	for _, k := range []sdkKind{kindOpenAI, kindAnthropicStream} {
		t.Run(k.name, func(t *testing.T) {
			w := newResWorld(t, resSetup{upstreams: []string{"primary", "dead"}, dead: "dead"})
			w.inject(t, "primary", "status=500", 100)
			if a := w.call(t, k, nil); a.err == nil {
				t.Fatal("the call succeeded; want the dead upstream's 502")
			}
			rec := w.tg.record(t)
			if rec.AttemptCount < 2 || rec.Attempts[0].Upstream != "primary" || rec.Attempts[0].Status != 500 {
				t.Fatalf("attempts %v: want primary's 500s first", attemptList(rec))
			}
			if rec.Upstream != "dead" || rec.UpstreamRequestID != "" || rec.Status != http.StatusBadGateway {
				t.Errorf("record upstream %q, upstream request id %q, status %d; want dead, none, 502",
					rec.Upstream, rec.UpstreamRequestID, rec.Status)
			}
			if rec.Stream != k.stream {
				t.Errorf("record stream %v for a request that asked %v", rec.Stream, k.stream)
			}
		})
	}
}

// panicBody panics at its first Read: a bug in the gateway's reading of an
// upstream answer, after the attempt has its response.
type panicBody struct{ io.ReadCloser }

func (panicBody) Read([]byte) (int, error) { panic("a bug while reading the upstream answer") }

// panicTransport gives every answer a panicBody.
type panicTransport struct{ http.RoundTripper }

func (t panicTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.RoundTripper.RoundTrip(r)
	if err == nil {
		resp.Body = panicBody{resp.Body}
	}
	return resp, err
}

// TestAttemptEndedByAPanicIsTheRecordsLast: an attempt a panic ends is
// still the exchange's last: the record names its upstream and its
// request id, not an earlier attempt's.
func TestAttemptEndedByAPanicIsTheRecordsLast(t *testing.T) {
	w := newResWorld(t, resSetup{upstreams: []string{"primary", "secondary"}, ledger: true, edit: func(c *config.Config) {
		c.Upstreams[0].Retry.MaxAttempts, c.Upstreams[1].Retry.MaxAttempts = 1, 1
	}})
	w.inject(t, "primary", "status=500", 100)
	for _, u := range w.tg.gw.gen.Load().upstreams {
		if u.cfg.Name == "secondary" {
			u.transport = panicTransport{u.transport}
		}
	}
	resp, err := http.Post(w.tg.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"gpt-test","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	rec := w.tg.record(t)
	if rec.Upstream != "secondary" || rec.UpstreamRequestID == "" || rec.Timing.UpFirstByte.IsZero() {
		t.Errorf("record upstream %q, upstream request id %q, first byte %v; want the panicking attempt's (secondary)",
			rec.Upstream, rec.UpstreamRequestID, rec.Timing.UpFirstByte)
	}
}
