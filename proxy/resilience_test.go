package proxy

import (
	"bytes"
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
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/spend"
)

// The issue 4 must-show scenarios end to end: real loopback mockllm
// upstreams, the gateway on its own loopback server, and the official SDKs
// with their own retries off, so that what an SDK sees is what the gateway
// did.

// resTokens is the answer length of every mock in these tests.
const resTokens = 5

// resSetup describes a resilience world.
type resSetup struct {
	// upstreams are [[upstreams]] names in file order; each is served by a
	// fresh mockllm, except dead.
	upstreams []string
	// dead names the upstream whose base_url is a closed loopback port.
	dead string
	// edit changes the config after the upstreams are built.
	edit func(c *config.Config)
	// clock runs the gateway on a hand-moved clock.
	clock bool
	// ledger gives the gateway a spend ledger and prices for the test
	// models.
	ledger bool
}

// resWorld is a gateway in front of mockllm upstreams.
type resWorld struct {
	tg     *testGateway
	mocks  map[string]*mockllm.Server
	clock  *fakeClock
	ledger *spend.Local
}

// closedPortURL returns the URL of a loopback port nobody listens on.
func closedPortURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return "http://" + addr
}

func newResWorld(t *testing.T, s resSetup) *resWorld {
	t.Helper()
	w := &resWorld{mocks: map[string]*mockllm.Server{}}
	urls := map[string]string{}
	for _, name := range s.upstreams {
		if name == s.dead {
			urls[name] = closedPortURL(t)
			continue
		}
		m := mockllm.New(mockllm.Options{OutputTokens: resTokens, ITL: time.Millisecond})
		srv := httptest.NewServer(m)
		t.Cleanup(srv.Close)
		w.mocks[name] = m
		urls[name] = srv.URL
	}
	if s.clock {
		w.clock = newFakeClock()
	}
	if s.ledger {
		l := newLocalLedger(t)
		w.ledger = l
	}
	w.tg = newTestGatewayWith(t, urls[s.upstreams[0]], func(c *config.Config) {
		c.Upstreams = c.Upstreams[:0]
		for _, name := range s.upstreams {
			u := config.DefaultUpstream()
			u.Name, u.BaseURL = name, urls[name]
			// Short backoff: the schedule itself is retry_test.go's.
			u.Retry.BaseDelayMs, u.Retry.MaxDelayMs = 5, 20
			// The loopback mocks stand for replicas of one server, so the
			// SDKs' keys may follow a fallback (TestEdgeCallerKeyScope
			// covers the default).
			u.CallerKeysOnFallback = true
			c.Upstreams = append(c.Upstreams, u)
		}
		if s.ledger {
			c.Models = []config.Model{
				{Pattern: "gpt-test*", InputUSDPerMTok: 2.5, OutputUSDPerMTok: 10},
				{Pattern: "claude-test*", InputUSDPerMTok: 3, OutputUSDPerMTok: 15},
			}
		}
		if s.edit != nil {
			s.edit(c)
		}
	}, func(o *Options) {
		if w.clock != nil {
			o.Now = w.clock.Now
		}
		if w.ledger != nil {
			o.Ledger = w.ledger
		}
	})
	return w
}

// upstreamCfg returns the named upstream of c, for edit funcs.
func upstreamCfg(t *testing.T, c *config.Config, name string) *config.Upstream {
	t.Helper()
	u := c.UpstreamByName(name)
	if u == nil {
		t.Fatalf("no upstream %q", name)
	}
	return u
}

// inject queues a fault on the named mock.
func (w *resWorld) inject(t *testing.T, name, spec string, n int) {
	t.Helper()
	if err := w.mocks[name].Inject(spec, n); err != nil {
		t.Fatal(err)
	}
}

// requests is how many requests the named mock received.
func (w *resWorld) requests(name string) int64 { return w.mocks[name].Stats().Requests }

// metric is metricValue on the world's registry.
func (w *resWorld) metric(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	return metricValue(t, w.tg, name, labels)
}

// sdkKind is one way a caller asks: an official SDK, streamed or not.
type sdkKind struct {
	name      string
	anthropic bool
	stream    bool
}

func (k sdkKind) route() llm.Route {
	if k.anthropic {
		return llm.RouteMessages
	}
	return llm.RouteChatCompletions
}

var (
	kindOpenAI          = sdkKind{name: "openai"}
	kindOpenAIStream    = sdkKind{name: "openai_stream", stream: true}
	kindAnthropic       = sdkKind{name: "anthropic", anthropic: true}
	kindAnthropicStream = sdkKind{name: "anthropic_stream", anthropic: true, stream: true}
	// allKinds are the callers of the recoverable scenarios: the OpenAI SDK
	// streamed and not, and the Anthropic SDK streamed.
	allKinds = []sdkKind{kindOpenAI, kindOpenAIStream, kindAnthropicStream}
	// streamKinds are both SDKs, streamed.
	streamKinds = []sdkKind{kindOpenAIStream, kindAnthropicStream}
)

// sdkAnswer is what the caller's SDK made of one request.
type sdkAnswer struct {
	// text is the answer's text, accumulated for a stream (what arrived
	// before an error included).
	text string
	// opens counts stream openings: OpenAI chunks carrying the assistant
	// role, Anthropic message_start events. More than one means the held
	// preamble of a failed attempt leaked into the answer.
	opens int
	// body is the request body the SDK sent.
	body []byte
	err  error
}

// bodyTap is an SDK middleware that keeps the request body it sends.
type bodyTap struct{ body []byte }

func (b *bodyTap) mw(req *http.Request, next func(*http.Request) (*http.Response, error)) (*http.Response, error) {
	switch {
	case req.GetBody != nil:
		rc, err := req.GetBody()
		if err != nil {
			return nil, err
		}
		b.body, err = io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return nil, err
		}
	case req.Body != nil:
		var err error
		if b.body, err = io.ReadAll(req.Body); err != nil {
			return nil, err
		}
		req.Body.Close()
		req.Body = io.NopCloser(bytes.NewReader(b.body))
	}
	return next(req)
}

// call asks the gateway once through the SDK of kind k, with the extra
// request headers hdr and no SDK retry.
func (w *resWorld) call(t *testing.T, k sdkKind, hdr map[string]string) sdkAnswer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var tap bodyTap
	var a sdkAnswer
	if k.anthropic {
		opts := []aoption.RequestOption{aoption.WithBaseURL(w.tg.URL), aoption.WithAPIKey("sk-ant-resilience"),
			aoption.WithMaxRetries(0), aoption.WithMiddleware(tap.mw)}
		for h, v := range hdr {
			opts = append(opts, aoption.WithHeader(h, v))
		}
		c := anthropic.NewClient(opts...)
		p := anthropic.MessageNewParams{
			Model:     "claude-test",
			MaxTokens: 64,
			Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Is the upstream well?"))},
		}
		if !k.stream {
			m, err := c.Messages.New(ctx, p)
			a.err = err
			if err == nil {
				a.text = messageText(m)
			}
		} else {
			s := c.Messages.NewStreaming(ctx, p)
			var acc anthropic.Message
			for s.Next() {
				ev := s.Current()
				if ev.Type == "message_start" {
					a.opens++
				}
				if err := acc.Accumulate(ev); err != nil {
					t.Errorf("%s: accumulate: %v", k.name, err)
				}
			}
			a.err = s.Err()
			_ = s.Close()
			a.text = messageText(&acc)
		}
	} else {
		opts := []option.RequestOption{option.WithBaseURL(w.tg.URL + "/v1"), option.WithAPIKey("sk-test-resilience"),
			option.WithMaxRetries(0), option.WithMiddleware(tap.mw)}
		for h, v := range hdr {
			opts = append(opts, option.WithHeader(h, v))
		}
		c := openai.NewClient(opts...)
		p := openai.ChatCompletionNewParams{
			Model:    "gpt-test",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Is the upstream well?")},
		}
		if !k.stream {
			comp, err := c.Chat.Completions.New(ctx, p)
			a.err = err
			if err == nil {
				if len(comp.Choices) != 1 {
					t.Fatalf("%s: %d choices", k.name, len(comp.Choices))
				}
				a.text = comp.Choices[0].Message.Content
			}
		} else {
			s := c.Chat.Completions.NewStreaming(ctx, p)
			var b strings.Builder
			for s.Next() {
				for _, ch := range s.Current().Choices {
					if ch.Delta.Role == "assistant" {
						a.opens++
					}
					b.WriteString(ch.Delta.Content)
				}
			}
			a.err = s.Err()
			_ = s.Close()
			a.text = b.String()
		}
	}
	a.body = tap.body
	return a
}

// messageText joins the text blocks of m.
func messageText(m *anthropic.Message) string {
	var b strings.Builder
	for _, blk := range m.Content {
		if blk.Type == "text" {
			b.WriteString(blk.Text)
		}
	}
	return b.String()
}

// wantSuccess checks that the SDK saw exactly one whole answer.
func wantSuccess(t *testing.T, k sdkKind, a sdkAnswer) {
	t.Helper()
	if a.err != nil {
		t.Fatalf("%s: the SDK saw an error: %v", k.name, a.err)
	}
	if want := mockllm.Text(resTokens); a.text != want {
		t.Errorf("%s: answer %q, want %q", k.name, a.text, want)
	}
	if k.stream && a.opens != 1 {
		t.Errorf("%s: the stream opened %d times, want once", k.name, a.opens)
	}
}

// attemptList renders a record's attempts as "upstream:status:result".
func attemptList(rec llm.Record) []string {
	n := min(rec.AttemptCount, llm.MaxRecordedAttempts)
	out := make([]string, n)
	for i, a := range rec.Attempts[:n] {
		out[i] = a.Upstream + ":" + strconv.Itoa(a.Status) + ":" + a.Result
	}
	return out
}

func wantAttempts(t *testing.T, rec llm.Record, want ...string) {
	t.Helper()
	if got := attemptList(rec); !slices.Equal(got, want) || rec.AttemptCount != len(want) {
		t.Errorf("attempts %v (count %d), want %v", got, rec.AttemptCount, want)
	}
}

func wantMetric(t *testing.T, w *resWorld, name string, labels map[string]string, want float64) {
	t.Helper()
	if got := w.metric(t, name, labels); got != want {
		t.Errorf("%s %v = %v, want %v", name, labels, got, want)
	}
}

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
			wantMetric(t, w, "tollgate_upstream_retries_total", map[string]string{"upstream": "mock", "reason": "rate_limited"}, 1)
			wantMetric(t, w, "tollgate_upstream_attempts_total", map[string]string{"upstream": "mock", "result": "rate_limited"}, 1)
			wantMetric(t, w, "tollgate_upstream_attempts_total", map[string]string{"upstream": "mock", "result": "ok"}, 1)
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
				wantMetric(t, w, "tollgate_upstream_fallbacks_total",
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
				wantMetric(t, w, "tollgate_upstream_fallbacks_total",
					map[string]string{"from": "primary", "to": "backup", "reason": "overloaded"}, 1)
				// Two retries on primary, and the fallback after the third
				// attempt.
				wantMetric(t, w, "tollgate_upstream_retries_total",
					map[string]string{"upstream": "primary", "reason": "overloaded"}, 3)
				wantMetric(t, w, "tollgate_upstream_attempts_total",
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
		wantMetric(t, w, "tollgate_upstream_fallbacks_total",
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
				wantMetric(t, w, "tollgate_upstream_fallbacks_total",
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
				wantMetric(t, w, "tollgate_upstream_retries_skipped_total",
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
			wantMetric(t, w, "tollgate_upstream_retries_total", map[string]string{"upstream": "mock", "reason": cut}, 1)
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
			wantMetric(t, w, "tollgate_stream_interruptions_total",
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

// TestResilienceBreakerCycle: on the gateway's clock, a breaker opens after
// its consecutive failures, makes requests skip its upstream, half-opens
// after the cooldown, and closes on a successful probe.
func TestResilienceBreakerCycle(t *testing.T) {
	breakerEdit := func(u *config.Upstream) {
		u.Retry.MaxAttempts = 1
		u.Breaker = config.Breaker{Enabled: true, ConsecutiveFailures: 2, FailureRatio: 0.5, MinRequests: 20,
			WindowSeconds: 10, CooldownSeconds: 5, HalfOpenProbes: 1}
	}
	state := func(t *testing.T, w *resWorld, name string) float64 {
		t.Helper()
		return w.metric(t, "tollgate_upstream_circuit_state", map[string]string{"upstream": name})
	}
	transitions := func(t *testing.T, w *resWorld, to string) float64 {
		t.Helper()
		return w.metric(t, "tollgate_upstream_circuit_transitions_total", map[string]string{"upstream": "primary", "to": to})
	}

	t.Run("with a backup", func(t *testing.T) {
		w := newResWorld(t, resSetup{upstreams: []string{"primary", "backup"}, clock: true, edit: func(c *config.Config) {
			breakerEdit(upstreamCfg(t, c, "primary"))
		}})
		// Two failures in a row on primary, each served by backup.
		for i, k := range []sdkKind{kindOpenAI, kindAnthropicStream} {
			w.inject(t, "primary", "status=500", 1)
			wantSuccess(t, k, w.call(t, k, nil))
			rec := w.tg.record(t)
			wantAttempts(t, rec, "primary:500:server_error", "backup:200:ok")
			if want := []float64{0, 2}[i]; state(t, w, "primary") != want {
				t.Errorf("after %d failures the circuit state is %v, want %v", i+1, state(t, w, "primary"), want)
			}
		}
		if transitions(t, w, "open") != 1 {
			t.Errorf("transitions to open: %v, want 1", transitions(t, w, "open"))
		}
		// Open: primary is skipped without being touched, until the
		// cooldown has passed.
		for _, adv := range []time.Duration{0, 4 * time.Second} {
			w.clock.Advance(adv)
			wantSuccess(t, kindOpenAIStream, w.call(t, kindOpenAIStream, nil))
			rec := w.tg.record(t)
			wantAttempts(t, rec, "primary:0:breaker_open", "backup:200:ok")
			if rec.Upstream != "backup" {
				t.Errorf("record upstream %q, want backup", rec.Upstream)
			}
		}
		if n := w.requests("primary"); n != 2 {
			t.Errorf("primary saw %d requests while open, want the 2 failures only", n)
		}
		wantMetric(t, w, "tollgate_upstream_fallbacks_total",
			map[string]string{"from": "primary", "to": "backup", "reason": "breaker_open"}, 2)
		// Past the cooldown: the next request is a probe to primary, which
		// succeeds and closes the circuit.
		w.clock.Advance(time.Second)
		wantSuccess(t, kindAnthropic, w.call(t, kindAnthropic, nil))
		rec := w.tg.record(t)
		wantAttempts(t, rec, "primary:200:ok")
		if rec.Upstream != "primary" || w.requests("primary") != 3 || w.requests("backup") != 4 {
			t.Errorf("probe served by %q; primary saw %d requests, backup %d", rec.Upstream, w.requests("primary"),
				w.requests("backup"))
		}
		if state(t, w, "primary") != 0 || transitions(t, w, "half_open") != 1 || transitions(t, w, "closed") != 1 ||
			transitions(t, w, "open") != 1 {
			t.Errorf("after the probe: state %v, transitions open %v half_open %v closed %v; want 0, 1, 1, 1",
				state(t, w, "primary"), transitions(t, w, "open"), transitions(t, w, "half_open"), transitions(t, w, "closed"))
		}
		if state(t, w, "backup") != 0 {
			t.Errorf("backup circuit state %v, want 0", state(t, w, "backup"))
		}
	})

	t.Run("no upstream left", func(t *testing.T) {
		w := newResWorld(t, resSetup{upstreams: []string{"primary"}, clock: true, edit: func(c *config.Config) {
			breakerEdit(upstreamCfg(t, c, "primary"))
		}})
		// Two failures, relayed as they came (nothing to retry on).
		w.inject(t, "primary", "status=500", 2)
		for range 2 {
			a := w.call(t, kindOpenAI, nil)
			var oe *openai.Error
			if !errors.As(a.err, &oe) || oe.StatusCode != http.StatusInternalServerError {
				t.Fatalf("failing upstream: %v; want its 500", a.err)
			}
			w.tg.record(t)
		}
		if state(t, w, "primary") != 2 {
			t.Fatalf("circuit state %v after 2 failures, want 2 (open)", state(t, w, "primary"))
		}
		retryAfter := func(h http.Header) {
			t.Helper()
			s, err := strconv.Atoi(h.Get("Retry-After"))
			if err != nil || s < 1 || s > 5 {
				t.Errorf("Retry-After %q; want whole seconds in [1, 5]", h.Get("Retry-After"))
			}
		}
		a := w.call(t, kindOpenAI, nil)
		var oe *openai.Error
		if !errors.As(a.err, &oe) || oe.StatusCode != http.StatusServiceUnavailable || oe.Code != "upstream_unavailable" {
			t.Errorf("OpenAI SDK with the circuit open: %v; want a 503 upstream_unavailable", a.err)
		} else {
			retryAfter(oe.Response.Header)
		}
		rec := w.tg.record(t)
		if rec.Status != http.StatusServiceUnavailable {
			t.Errorf("record status %d", rec.Status)
		}
		wantAttempts(t, rec, "primary:0:breaker_open")
		a = w.call(t, kindAnthropicStream, nil)
		var ae *anthropic.Error
		if !errors.As(a.err, &ae) || ae.StatusCode != http.StatusServiceUnavailable || ae.Type() != "overloaded_error" {
			t.Errorf("Anthropic SDK with the circuit open: %v; want a 503 overloaded_error", a.err)
		} else {
			retryAfter(ae.Response.Header)
		}
		w.tg.record(t)
		if n := w.requests("primary"); n != 2 {
			t.Errorf("primary saw %d requests, want the 2 failures only", n)
		}
		// After the cooldown a probe goes through and closes the circuit.
		w.clock.Advance(5 * time.Second)
		wantSuccess(t, kindOpenAIStream, w.call(t, kindOpenAIStream, nil))
		wantAttempts(t, w.tg.record(t), "primary:200:ok")
		if state(t, w, "primary") != 0 {
			t.Errorf("circuit state %v after a good probe, want 0", state(t, w, "primary"))
		}
	})
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
				wantMetric(t, w, "tollgate_upstream_retries_total", map[string]string{"upstream": "mock", "reason": "error_event"}, 1)
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
			wantMetric(t, w, "tollgate_stream_interruptions_total",
				map[string]string{"route": k.route().String(), "cause": "upstream_error_event"}, 1)
		})
	}
}
