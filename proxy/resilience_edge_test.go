package proxy

// End-to-end edge behaviour of upstream resilience (issue 4) through a real
// gateway and real upstreams on loopback: what is held back while a retry is
// possible, the phase timeouts, the errors never retried, the retry budget,
// renames, shaping, the rules for forwarded paths, and what the access log
// and the record say about retried requests. The SDK-level scenarios live
// in resilience_test.go. Helpers here are prefixed with edge.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
)

// edgeWait bounds every wait of these tests: reaching it is a failure, never
// a measurement.
const edgeWait = 10 * time.Second

// edgeMock starts a mockllm upstream on loopback.
func edgeMock(t *testing.T, o mockllm.Options) (*mockllm.Server, string) {
	t.Helper()
	m := mockllm.New(o)
	srv := httptest.NewServer(m)
	t.Cleanup(srv.Close)
	return m, srv.URL
}

// edgeFastRetry makes an upstream's backoff tiny, so retries cost nothing.
func edgeFastRetry(u *config.Upstream) {
	u.Retry.BaseDelayMs = 1
	u.Retry.MaxDelayMs = 1
}

// edgeGate is an SSE upstream that sends its preamble (the events that
// carry no token) at once, then waits for the test to open the gate before
// it sends the rest.
type edgeGate struct {
	preamble, rest string
	arrived        chan struct{} // closed once the first request has its preamble
	release        chan struct{}
	arrivedOnce    sync.Once
	releaseOnce    sync.Once
	requests       atomic.Int32
}

func newEdgeGate(preamble, rest string) *edgeGate {
	return &edgeGate{preamble: preamble, rest: rest, arrived: make(chan struct{}), release: make(chan struct{})}
}

func (g *edgeGate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	g.requests.Add(1)
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_, _ = io.WriteString(w, g.preamble)
	_ = rc.Flush()
	g.arrivedOnce.Do(func() { close(g.arrived) })
	select {
	case <-g.release:
	case <-r.Context().Done():
		return
	}
	_, _ = io.WriteString(w, g.rest)
	_ = rc.Flush()
}

// open lets every request through; safe to call more than once.
func (g *edgeGate) open() { g.releaseOnce.Do(func() { close(g.release) }) }

// waitArrived waits for the first request to have its preamble.
func (g *edgeGate) waitArrived(t *testing.T) {
	t.Helper()
	select {
	case <-g.arrived:
	case <-time.After(edgeWait):
		t.Fatal("the upstream never got the request")
	}
}

// edgeTapTransport wraps the gateway's upstream transport: the response
// body signals waiting when the relay, having read the first after bytes,
// asks for more. At that moment the relay has done all it will ever do with
// those bytes, since it reads again only once the previous read is handled.
type edgeTapTransport struct {
	base    *http.Transport
	after   int
	waiting chan struct{}
	once    sync.Once
}

func (tt *edgeTapTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := tt.base.RoundTrip(req)
	if err == nil {
		resp.Body = &edgeTapBody{ReadCloser: resp.Body, tt: tt}
	}
	return resp, err
}

type edgeTapBody struct {
	io.ReadCloser
	tt *edgeTapTransport
	n  int
}

func (b *edgeTapBody) Read(p []byte) (int, error) {
	if b.n >= b.tt.after {
		b.tt.once.Do(func() { close(b.tt.waiting) })
	}
	n, err := b.ReadCloser.Read(p)
	b.n += n
	return n, err
}

// edgeSpyWriter records what the gateway did to the caller's response.
type edgeSpyWriter struct {
	http.ResponseWriter
	mu     sync.Mutex
	header int      // status passed to WriteHeader, 0 before
	writes [][]byte // every Write, in order
	flush  int
}

func (s *edgeSpyWriter) WriteHeader(code int) {
	s.mu.Lock()
	if s.header == 0 {
		s.header = code
	}
	s.mu.Unlock()
	s.ResponseWriter.WriteHeader(code)
}

func (s *edgeSpyWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	s.writes = append(s.writes, append([]byte(nil), p...))
	s.mu.Unlock()
	return s.ResponseWriter.Write(p)
}

func (s *edgeSpyWriter) Flush() {
	s.mu.Lock()
	s.flush++
	s.mu.Unlock()
	_ = http.NewResponseController(s.ResponseWriter).Flush()
}

func (s *edgeSpyWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func (s *edgeSpyWriter) snapshot() (header int, writes [][]byte, flushes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.header, append([][]byte(nil), s.writes...), s.flush
}

// edgeResult is a response read to its end by a client goroutine.
type edgeResult struct {
	resp *http.Response
	body []byte
	err  error
}

// edgeSend sends a request and returns its response with the body read.
func edgeSend(ctx context.Context, method, url, ctype, body string, hdr map[string]string) edgeResult {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return edgeResult{err: err}
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return edgeResult{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return edgeResult{resp: resp, body: b, err: err}
}

// edgeAwait waits for a client goroutine's result.
func edgeAwait(t *testing.T, ch <-chan edgeResult) edgeResult {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("request: %v", r.err)
		}
		return r
	case <-time.After(edgeWait):
		t.Fatal("no response")
		return edgeResult{}
	}
}

// edgeStreams are the two dialects' streamed requests with an upstream
// stream cut into its preamble and the rest.
var edgeStreams = []struct {
	name, path, body string
	preamble, rest   string
}{
	{"openai", "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
		openAIRole, openAITok1 + openAITok2 + openAIStop + openAIDone},
	{"anthropic", "/v1/messages", `{"model":"m","stream":true,"max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`,
		anthropicText[:strings.Index(anthropicText, "event: content_block_delta")],
		anthropicText[strings.Index(anthropicText, "event: content_block_delta"):]},
}

// TestEdgeHoldUntilFirstToken: while another attempt is possible, the
// caller gets nothing, not even the response headers, until the first
// token: the upstream has sent its preamble and stalls, and the moment the
// relay asks the upstream for more (it has handled the preamble) the
// gateway has not called WriteHeader, Write or Flush on the caller's
// response. This is observed on the gateway's side through a spy writer and
// a tapped upstream body, so no sleep or timer decides the result. Once the
// upstream sends its first token the caller gets the preamble and the token
// together.
func TestEdgeHoldUntilFirstToken(t *testing.T) {
	for _, tc := range edgeStreams {
		t.Run(tc.name, func(t *testing.T) {
			gate := newEdgeGate(tc.preamble, tc.rest)
			defer gate.open()
			up := httptest.NewServer(gate)
			defer up.Close()
			base := &http.Transport{}
			defer base.CloseIdleConnections()
			tap := &edgeTapTransport{base: base, after: len(tc.preamble), waiting: make(chan struct{})}
			tg := newTestGatewayWith(t, up.URL, nil, func(o *Options) { o.Transport = tap })
			var spy atomic.Pointer[edgeSpyWriter]
			h := tg.gw.Handler()
			front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				s := &edgeSpyWriter{ResponseWriter: w}
				spy.Store(s)
				h.ServeHTTP(s, r)
			}))
			defer front.Close()

			done := make(chan edgeResult, 1)
			go func() {
				done <- edgeSend(context.Background(), http.MethodPost, front.URL+tc.path, "application/json", tc.body, nil)
			}()
			select {
			case <-tap.waiting:
			case <-time.After(edgeWait):
				t.Fatal("the relay never read the upstream's preamble")
			}
			header, writes, flushes := spy.Load().snapshot()
			if header != 0 || len(writes) != 0 || flushes != 0 {
				t.Errorf("before the first token the gateway sent the caller: status %d, %d writes (%q), %d flushes",
					header, len(writes), writes, flushes)
			}
			select {
			case r := <-done:
				t.Fatalf("the caller had its response before the first token (err %v)", r.err)
			default:
			}

			gate.open()
			r := edgeAwait(t, done)
			if r.resp.StatusCode != http.StatusOK || !strings.HasPrefix(r.resp.Header.Get("Content-Type"), "text/event-stream") {
				t.Errorf("status %d content-type %q", r.resp.StatusCode, r.resp.Header.Get("Content-Type"))
			}
			if string(r.body) != tc.preamble+tc.rest {
				t.Errorf("caller got %q\nwant %q", r.body, tc.preamble+tc.rest)
			}
			_, writes, _ = spy.Load().snapshot()
			if len(writes) == 0 || !bytes.HasPrefix(writes[0], []byte(tc.preamble)) || len(writes[0]) == len(tc.preamble) {
				t.Errorf("the first write to the caller should be the preamble with the first token; got %d writes, first %q", len(writes), edgeFirst(writes))
			}
			if rec := tg.record(t); rec.Outcome != llm.OutcomeOK || rec.AttemptCount != 1 || rec.TokenEvents != 2 {
				t.Errorf("record outcome %s attempts %d token events %d", rec.Outcome, rec.AttemptCount, rec.TokenEvents)
			}
		})
	}
}

func edgeFirst(b [][]byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b[0]
}

// TestEdgeNoHoldWithoutRetry: with no other attempt possible (max_attempts
// 1, one upstream), the headers and the preamble go out before the first
// token. The upstream sends its first token only once the caller has read
// the preamble, so a gateway that held it would deadlock; the caller's
// deadline turns that into a failure instead of a hang.
func TestEdgeNoHoldWithoutRetry(t *testing.T) {
	for _, tc := range edgeStreams {
		t.Run(tc.name, func(t *testing.T) {
			gate := newEdgeGate(tc.preamble, tc.rest)
			defer gate.open()
			up := httptest.NewServer(gate)
			defer up.Close()
			tg := newTestGateway(t, up.URL, func(c *config.Config) { c.Upstreams[0].Retry.MaxAttempts = 1 })

			ctx, cancel := context.WithTimeout(context.Background(), edgeWait)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, tg.URL+tc.path, strings.NewReader(tc.body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("no response headers before the first token (the gateway held them with no retry possible): %v", err)
			}
			defer resp.Body.Close()
			pre := make([]byte, len(tc.preamble))
			if _, err := io.ReadFull(resp.Body, pre); err != nil {
				t.Fatalf("reading the preamble before the first token: %v", err)
			}
			if string(pre) != tc.preamble {
				t.Errorf("preamble %q, want %q", pre, tc.preamble)
			}
			gate.open()
			rest, err := io.ReadAll(resp.Body)
			if err != nil || string(rest) != tc.rest {
				t.Errorf("rest %q (%v), want %q", rest, err, tc.rest)
			}
			if rec := tg.record(t); rec.Outcome != llm.OutcomeOK || rec.AttemptCount != 1 {
				t.Errorf("record outcome %s attempts %d", rec.Outcome, rec.AttemptCount)
			}
		})
	}
}

// edgeAttempts lists a record's attempts as "upstream/status/result".
func edgeAttempts(rec llm.Record) []string {
	var out []string
	for _, a := range rec.Attempts[:min(rec.AttemptCount, llm.MaxRecordedAttempts)] {
		out = append(out, a.Upstream+"/"+strconv.Itoa(a.Status)+"/"+a.Result)
	}
	return out
}

func edgeSameList(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestEdgeFirstTokenTimeoutRetried: an upstream that opens its stream but
// sends no token within first_token_timeout is abandoned before the caller
// got a byte, and the retry answers; the caller sees one clean stream (one
// preamble, not the held one of the failed attempt).
func TestEdgeFirstTokenTimeoutRetried(t *testing.T) {
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
			mock, url := edgeMock(t, mockllm.Options{OutputTokens: 3})
			tg := newTestGateway(t, url, func(c *config.Config) {
				c.Upstreams[0].FirstTokenTimeoutSeconds = 0.2
				edgeFastRetry(&c.Upstreams[0])
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
			if got, want := edgeAttempts(rec), []string{"mock/200/first_token_timeout", "mock/200/ok"}; !edgeSameList(got, want) {
				t.Errorf("attempts %v, want %v", got, want)
			}
			if rec.Outcome != llm.OutcomeOK || rec.Interruption != llm.InterruptNone {
				t.Errorf("outcome %s interruption %s", rec.Outcome, rec.Interruption)
			}
			if st := mock.Stats(); st.Requests != 2 {
				t.Errorf("mock saw %d requests, want 2", st.Requests)
			}
			ctx, cancel := context.WithTimeout(context.Background(), edgeWait)
			defer cancel()
			if err := mock.WaitCanceled(ctx, 1); err != nil {
				t.Errorf("the hung attempt was never cut: %v", err)
			}
		})
	}
}

// TestEdgeIdleTimeoutMidStream: a stream that goes silent after 3 tokens is
// cut by idle_timeout; the caller has the 3 tokens and then the gateway's
// timeout error event in its dialect (none with stream_error_events off),
// never a terminal marker; nothing is retried after bytes were sent.
func TestEdgeIdleTimeoutMidStream(t *testing.T) {
	tests := []struct {
		name, path, body, terminal string
		route                      llm.Route
		errorEvents                bool
		wantEnd                    []byte
	}{
		{"openai", "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			"[DONE]", llm.RouteChatCompletions, true, openAITimeoutEvent},
		{"anthropic", "/v1/messages", `{"model":"m","stream":true,"max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`,
			"message_stop", llm.RouteMessages, true, anthropicTimeoutEvent},
		{"openai without error events", "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			"[DONE]", llm.RouteChatCompletions, false, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mock, url := edgeMock(t, mockllm.Options{OutputTokens: 5})
			tg := newTestGateway(t, url, func(c *config.Config) {
				c.Upstreams[0].IdleTimeoutSeconds = 0.2
				c.Server.StreamErrorEvents = tc.errorEvents
				edgeFastRetry(&c.Upstreams[0])
			})
			resp, body := post(t, tg.URL+tc.path, tc.body, map[string]string{"X-Mock-Fault": "hang=3"})
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			s := string(body)
			if !strings.Contains(s, " tok3") || strings.Contains(s, " tok4") || strings.Contains(s, tc.terminal) {
				t.Errorf("caller's stream should hold tok1..tok3 and no terminal marker: %q", s)
			}
			if tc.errorEvents && !strings.HasSuffix(s, string(tc.wantEnd)) {
				t.Errorf("stream does not end with the gateway's timeout event %q:\n%q", tc.wantEnd, s)
			}
			if !tc.errorEvents {
				if strings.Contains(s, "error") {
					t.Errorf("error event sent with stream_error_events off: %q", s)
				}
				if i := strings.LastIndex(s, "data: "); i < 0 || !strings.Contains(s[i:], " tok3") {
					t.Errorf("stream should end with the tok3 chunk: %q", s)
				}
			}
			rec := tg.record(t)
			if rec.Outcome != llm.OutcomeUpstreamTimeout || rec.Interruption != llm.InterruptIdleTimeout || rec.TokenEvents != 3 {
				t.Errorf("record outcome %s interruption %s token events %d", rec.Outcome, rec.Interruption, rec.TokenEvents)
			}
			if got, want := edgeAttempts(rec), []string{"mock/200/idle_timeout"}; !edgeSameList(got, want) {
				t.Errorf("attempts %v, want %v", got, want)
			}
			if v := metricValue(t, tg, "tollgate_stream_interruptions_total",
				map[string]string{"route": tc.route.String(), "cause": "idle_timeout"}); v != 1 {
				t.Errorf("stream_interruptions_total{cause=idle_timeout} = %v, want 1", v)
			}
			if v := metricValue(t, tg, "tollgate_upstream_attempts_total",
				map[string]string{"upstream": "mock", "result": "idle_timeout"}); v != 1 {
				t.Errorf("upstream_attempts_total{result=idle_timeout} = %v, want 1", v)
			}
			if st := mock.Stats(); st.Requests != 1 {
				t.Errorf("mock saw %d requests, want 1 (no retry after bytes were sent)", st.Requests)
			}
		})
	}
}

// TestEdgeInsufficientQuotaNotRetried: a 429 whose type or code is
// insufficient_quota goes to the caller at once, retries on or not.
func TestEdgeInsufficientQuotaNotRetried(t *testing.T) {
	for _, spec := range []string{
		"status=429;type=insufficient_quota;code=insufficient_quota",
		"status=429;code=insufficient_quota",
		"status=429;type=insufficient_quota",
	} {
		t.Run(spec, func(t *testing.T) {
			mock, url := edgeMock(t, mockllm.Options{OutputTokens: 2})
			tg := newTestGateway(t, url, func(c *config.Config) { edgeFastRetry(&c.Upstreams[0]) })
			if err := mock.Inject(spec, 1); err != nil {
				t.Fatal(err)
			}
			resp, body := post(t, tg.URL+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil)
			if resp.StatusCode != http.StatusTooManyRequests || !bytes.Contains(body, []byte("insufficient_quota")) {
				t.Errorf("caller got %d %s, want the upstream's 429 insufficient_quota", resp.StatusCode, body)
			}
			if st := mock.Stats(); st.Requests != 1 {
				t.Errorf("mock saw %d requests, want 1", st.Requests)
			}
			rec := tg.record(t)
			if got, want := edgeAttempts(rec), []string{"mock/429/rate_limited"}; !edgeSameList(got, want) {
				t.Errorf("attempts %v, want %v", got, want)
			}
			if rec.RetryWait != 0 || rec.Outcome != llm.OutcomeUpstreamError {
				t.Errorf("retry wait %v outcome %s", rec.RetryWait, rec.Outcome)
			}
		})
	}
}

// edgeStep is one scripted upstream answer.
type edgeStep struct {
	status int
	hdr    map[string]string
	body   string
}

// edgeScript is an upstream that answers the n-th request (1-based) on each
// path with respond(n, r), and counts requests per path.
type edgeScript struct {
	respond func(n int, r *http.Request) edgeStep
	mu      sync.Mutex
	counts  map[string]int
}

func (s *edgeScript) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	s.mu.Lock()
	if s.counts == nil {
		s.counts = map[string]int{}
	}
	s.counts[r.URL.Path]++
	n := s.counts[r.URL.Path]
	s.mu.Unlock()
	st := s.respond(n, r)
	w.Header().Set("Content-Type", "application/json")
	for k, v := range st.hdr {
		w.Header().Set(k, v)
	}
	w.WriteHeader(st.status)
	_, _ = io.WriteString(w, st.body)
}

func (s *edgeScript) count(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[path]
}

const (
	edgeChatOK    = `{"id":"chatcmpl-1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`
	edgeServerErr = `{"error":{"message":"boom","type":"server_error","param":null,"code":null}}`
	edgeBadReq    = `{"error":{"message":"bad","type":"invalid_request_error","param":null,"code":null}}`
	edgeConflict  = `{"error":{"message":"a concurrent request holds this resource; try again"}}`
)

// TestEdgeXShouldRetry: the upstream's x-should-retry wins over the status
// list both ways, as in the official SDKs.
func TestEdgeXShouldRetry(t *testing.T) {
	tests := []struct {
		name     string
		first    edgeStep
		want     int
		requests int
		attempts []string
	}{
		{"503 with x-should-retry false is not retried",
			edgeStep{503, map[string]string{"X-Should-Retry": "false"}, edgeServerErr}, 503, 1, []string{"up/503/server_error"}},
		{"400 with x-should-retry true is retried",
			edgeStep{400, map[string]string{"X-Should-Retry": "true"}, edgeConflict}, 200, 2, []string{"up/400/client_error", "up/200/ok"}},
		{"400 without it is not",
			edgeStep{400, nil, edgeConflict}, 400, 1, []string{"up/400/client_error"}},
		// shouldRetry's documented precedence: an error no retry can fix
		// is not retried even when the upstream says true (the SDKs would).
		{"400 invalid_request_error with x-should-retry true is not",
			edgeStep{400, map[string]string{"X-Should-Retry": "true"}, edgeBadReq}, 400, 1, []string{"up/400/client_error"}},
		{"429 insufficient_quota with x-should-retry true is not",
			edgeStep{429, map[string]string{"X-Should-Retry": "true"},
				`{"error":{"message":"quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`},
			429, 1, []string{"up/429/rate_limited"}},
		{"503 without it is",
			edgeStep{503, nil, edgeServerErr}, 200, 2, []string{"up/503/server_error", "up/200/ok"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			script := &edgeScript{respond: func(n int, _ *http.Request) edgeStep {
				if n == 1 {
					return tc.first
				}
				return edgeStep{200, nil, edgeChatOK}
			}}
			up := httptest.NewServer(script)
			defer up.Close()
			tg := newTestGateway(t, up.URL, func(c *config.Config) {
				c.Upstreams[0].Name = "up"
				edgeFastRetry(&c.Upstreams[0])
			})
			resp, body := post(t, tg.URL+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil)
			if resp.StatusCode != tc.want {
				t.Errorf("caller got %d %s, want %d", resp.StatusCode, body, tc.want)
			}
			if n := script.count("/v1/chat/completions"); n != tc.requests {
				t.Errorf("upstream saw %d requests, want %d", n, tc.requests)
			}
			if got := edgeAttempts(tg.record(t)); !edgeSameList(got, tc.attempts) {
				t.Errorf("attempts %v, want %v", got, tc.attempts)
			}
		})
	}
}

// TestEdgeRetryAfterTooLong: a Retry-After longer than max_wait_seconds,
// with no upstream to fall back to, is not waited for: the caller gets the
// upstream's 429 with its Retry-After, so its own SDK can decide.
func TestEdgeRetryAfterTooLong(t *testing.T) {
	mock, url := edgeMock(t, mockllm.Options{OutputTokens: 2})
	tg := newTestGateway(t, url, func(c *config.Config) {
		c.Upstreams[0].Retry.MaxWaitSeconds = 5
		edgeFastRetry(&c.Upstreams[0])
	})
	if err := mock.Inject("status=429;retry-after=60", 1); err != nil {
		t.Fatal(err)
	}
	resp, body := post(t, tg.URL+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "60" {
		t.Errorf("caller got %d Retry-After %q (%s), want 429 with Retry-After 60", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if st := mock.Stats(); st.Requests != 1 {
		t.Errorf("mock saw %d requests, want 1", st.Requests)
	}
	rec := tg.record(t)
	if rec.AttemptCount != 1 || rec.RetryWait != 0 {
		t.Errorf("attempts %d retry wait %v", rec.AttemptCount, rec.RetryWait)
	}
	if v := metricValue(t, tg, "tollgate_upstream_retries_skipped_total",
		map[string]string{"upstream": "mock", "why": "wait_too_long"}); v != 1 {
		t.Errorf("retries_skipped_total{why=wait_too_long} = %v, want 1", v)
	}
}

// TestEdgeRetryBudget: with budget_ratio 0 and a floor of 0.2 retries a
// second over the 10 s window, two retries are allowed; the failing
// requests after them are sent once, and each refusal is counted.
func TestEdgeRetryBudget(t *testing.T) {
	mock, url := edgeMock(t, mockllm.Options{OutputTokens: 2})
	tg := newTestGateway(t, url, func(c *config.Config) {
		u := &c.Upstreams[0]
		u.Retry.MaxAttempts = 2
		u.Retry.BudgetRatio = 0
		u.Retry.BudgetMinPerSecond = 0.2
		u.Breaker.Enabled = false // every attempt fails; the breaker is not under test
		edgeFastRetry(u)
	})
	var sent []int64
	prev := int64(0)
	for range 4 {
		resp, body := post(t, tg.URL+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
			map[string]string{"X-Mock-Fault": "status=500"})
		if resp.StatusCode != http.StatusInternalServerError {
			t.Errorf("caller got %d %s, want the upstream's 500", resp.StatusCode, body)
		}
		tg.record(t)
		n := mock.Stats().Requests
		sent = append(sent, n-prev)
		prev = n
	}
	if want := []int64{2, 2, 1, 1}; len(sent) != 4 || sent[0] != want[0] || sent[1] != want[1] || sent[2] != want[2] || sent[3] != want[3] {
		t.Errorf("upstream requests per caller request %v, want %v", sent, want)
	}
	if v := metricValue(t, tg, "tollgate_upstream_retries_skipped_total",
		map[string]string{"upstream": "mock", "why": "budget"}); v != 2 {
		t.Errorf("retries_skipped_total{why=budget} = %v, want 2", v)
	}
}

// TestEdgeRename: a route's rename changes only the model the upstream
// gets; the caller's record keeps the model it asked for, and a model no
// route matches goes up unchanged.
func TestEdgeRename(t *testing.T) {
	tests := []struct{ name, path, body string }{
		{"openai", "/v1/chat/completions", `{"model":"edge-1","messages":[{"role":"user","content":"hi"}],"metadata":{"model":"keep"}}`},
		{"anthropic", "/v1/messages", `{"model":"edge-1","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mock, url := edgeMock(t, mockllm.Options{OutputTokens: 2})
			tg := newTestGateway(t, url, func(c *config.Config) {
				c.Routes = []config.Route{{Models: []string{"edge-*"}, Upstreams: []string{"mock"},
					Rename: map[string]string{"mock": "deployment-7"}}}
			})
			resp, body := post(t, tg.URL+tc.path, tc.body, nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			reqs := mock.Requests()
			want := strings.Replace(tc.body, `"model":"edge-1"`, `"model":"deployment-7"`, 1)
			if len(reqs) != 1 || string(reqs[0].Body) != want {
				t.Errorf("upstream got %d requests, body %q\nwant %q", len(reqs), edgeLastBody(reqs), want)
			}
			if rec := tg.record(t); rec.Model != "edge-1" || rec.Upstream != "mock" {
				t.Errorf("record model %q upstream %q, want the caller's edge-1 on mock", rec.Model, rec.Upstream)
			}
			plain := strings.Replace(tc.body, "edge-1", "plain-1", 1)
			post(t, tg.URL+tc.path, plain, nil)
			tg.record(t)
			if reqs := mock.Requests(); string(edgeLastBody(reqs)) != plain {
				t.Errorf("unrouted model went up as %q, want %q", edgeLastBody(reqs), plain)
			}
		})
	}
}

func edgeLastBody(reqs []mockllm.Recorded) []byte {
	if len(reqs) == 0 {
		return nil
	}
	return reqs[len(reqs)-1].Body
}

// TestEdgeShapingQueueFull: with max_concurrent 1 and no queue, a request
// that arrives while the primary's one slot holds a stream goes to the
// backup (fallback reason queue_full); with no backup it gets 503 with
// Retry-After in its dialect.
func TestEdgeShapingQueueFull(t *testing.T) {
	for _, withBackup := range []bool{true, false} {
		name := "single upstream"
		if withBackup {
			name = "with backup"
		}
		t.Run(name, func(t *testing.T) {
			gate := newEdgeGate(openAIRole, openAITok1+openAIStop+openAIDone)
			defer gate.open()
			primary := httptest.NewServer(gate)
			defer primary.Close()
			mock, backupURL := edgeMock(t, mockllm.Options{OutputTokens: 2})
			tg := newTestGateway(t, primary.URL, func(c *config.Config) {
				c.Upstreams[0].Name = "primary"
				c.Upstreams[0].MaxConcurrent = 1
				c.Upstreams[0].QueueSize = 0
				if withBackup {
					b := config.DefaultUpstream()
					b.Name, b.BaseURL = "backup", backupURL
					b.CallerKeysOnFallback = true
					c.Upstreams = append(c.Upstreams, b)
				}
			})
			stream := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
			first := make(chan edgeResult, 1)
			go func() {
				first <- edgeSend(context.Background(), http.MethodPost, tg.URL+"/v1/chat/completions", "application/json", stream, nil)
			}()
			gate.waitArrived(t) // the primary's slot is taken until the gate opens

			resp, body := post(t, tg.URL+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil)
			rec := tg.record(t)
			if withBackup {
				if resp.StatusCode != http.StatusOK {
					t.Errorf("second request: %d %s, want 200 from the backup", resp.StatusCode, body)
				}
				if got, want := edgeAttempts(rec), []string{"primary/0/queue_full", "backup/200/ok"}; !edgeSameList(got, want) {
					t.Errorf("attempts %v, want %v", got, want)
				}
				if rec.Upstream != "backup" || mock.Stats().Requests != 1 {
					t.Errorf("answered by %q, backup saw %d requests", rec.Upstream, mock.Stats().Requests)
				}
				if v := metricValue(t, tg, "tollgate_upstream_fallbacks_total",
					map[string]string{"from": "primary", "to": "backup", "reason": "queue_full"}); v != 1 {
					t.Errorf("fallbacks_total{primary->backup, queue_full} = %v, want 1", v)
				}
			} else {
				ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
				if resp.StatusCode != http.StatusServiceUnavailable || err != nil || ra < 1 {
					t.Errorf("second request: %d Retry-After %q, want 503 with Retry-After >= 1", resp.StatusCode, resp.Header.Get("Retry-After"))
				}
				var e struct {
					Error struct{ Type, Code string }
				}
				if err := json.Unmarshal(body, &e); err != nil || e.Error.Code != "upstream_unavailable" {
					t.Errorf("503 body %s is not an OpenAI error with code upstream_unavailable (%v)", body, err)
				}
				if got, want := edgeAttempts(rec), []string{"primary/0/queue_full"}; !edgeSameList(got, want) {
					t.Errorf("attempts %v, want %v", got, want)
				}
				if rec.Outcome != llm.OutcomeUpstreamUnreachable {
					t.Errorf("outcome %s, want upstream_unreachable", rec.Outcome)
				}
			}
			if v := metricValue(t, tg, "tollgate_upstream_retries_skipped_total",
				map[string]string{"upstream": "primary", "why": "queue_full"}); v != 1 {
				t.Errorf("retries_skipped_total{primary, queue_full} = %v, want 1", v)
			}
			if n := gate.requests.Load(); n != 1 {
				t.Errorf("primary saw %d requests, want 1", n)
			}

			gate.open()
			r := edgeAwait(t, first)
			if r.resp.StatusCode != http.StatusOK || string(r.body) != openAIRole+openAITok1+openAIStop+openAIDone {
				t.Errorf("first request: %d %q", r.resp.StatusCode, r.body)
			}
			if rec := tg.record(t); rec.Upstream != "primary" || rec.Outcome != llm.OutcomeOK {
				t.Errorf("first request answered by %q with %s", rec.Upstream, rec.Outcome)
			}
		})
	}
}

// TestEdgeForwardedRetryRules: on other /v1/* paths a GET is always
// repeatable; a POST naming a model (metered: embeddings, responses...) may
// have created something upstream, so it is repeated only when the upstream
// surely did not act on it (429, 503, 529, connection refused), not on a
// 500; a POST that is no model call (a file upload) is never repeated.
func TestEdgeForwardedRetryRules(t *testing.T) {
	const embed = `{"model":"text-embedding-3-small","input":"hi"}`
	tests := []struct {
		name, method, path, ctype, body string
		first, want, requests           int
	}{
		{"embeddings 503", http.MethodPost, "/v1/embeddings", "application/json", embed, 503, 200, 2},
		{"embeddings 429", http.MethodPost, "/v1/embeddings", "application/json", embed, 429, 200, 2},
		{"embeddings 500", http.MethodPost, "/v1/embeddings", "application/json", embed, 500, 500, 1},
		{"GET models 500", http.MethodGet, "/v1/models", "", "", 500, 200, 2},
		{"file upload, not JSON, 503", http.MethodPost, "/v1/files", "application/octet-stream",
			"\x00\x01 raw file bytes, not JSON", 503, 503, 1},
		{"JSON without a model, 503", http.MethodPost, "/v1/responses", "application/json", `{"input":"hi"}`, 503, 503, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			script := &edgeScript{respond: func(n int, r *http.Request) edgeStep {
				if n == 1 {
					return edgeStep{tc.first, nil, edgeServerErr}
				}
				if r.Method == http.MethodGet {
					return edgeStep{200, nil, `{"object":"list","data":[{"id":"m","object":"model"}]}`}
				}
				return edgeStep{200, nil, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1]}],` +
					`"model":"text-embedding-3-small","usage":{"prompt_tokens":2,"total_tokens":2}}`}
			}}
			up := httptest.NewServer(script)
			defer up.Close()
			tg := newTestGateway(t, up.URL, func(c *config.Config) { edgeFastRetry(&c.Upstreams[0]) })
			ctx, cancel := context.WithTimeout(context.Background(), edgeWait)
			defer cancel()
			r := edgeSend(ctx, tc.method, tg.URL+tc.path, tc.ctype, tc.body, nil)
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.resp.StatusCode != tc.want {
				t.Errorf("caller got %d %s, want %d", r.resp.StatusCode, r.body, tc.want)
			}
			if n := script.count(tc.path); n != tc.requests {
				t.Errorf("upstream saw %d requests, want %d", n, tc.requests)
			}
			if rec := tg.record(t); rec.AttemptCount != tc.requests {
				t.Errorf("record lists %d attempts, want %d (%v)", rec.AttemptCount, tc.requests, edgeAttempts(rec))
			}
		})
	}
}

// edgeLogLine finds the access-log line of a request.
func edgeLogLine(t *testing.T, tg *testGateway, requestID string) map[string]json.RawMessage {
	t.Helper()
	sc := bufio.NewScanner(bytes.NewReader(tg.logs.Bytes()))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var m map[string]json.RawMessage
		if json.Unmarshal(sc.Bytes(), &m) != nil {
			continue
		}
		if string(m["request_id"]) == strconv.Quote(requestID) {
			return m
		}
	}
	t.Fatalf("no access-log line for request %s in %q", requestID, tg.logs.String())
	return nil
}

// TestEdgeAccessLogAttempts: a retried request's access-log line carries
// attempt_count and one entry per attempt with its upstream, status and
// result, and the retry wait.
func TestEdgeAccessLogAttempts(t *testing.T) {
	mock, url := edgeMock(t, mockllm.Options{OutputTokens: 2})
	tg := newTestGateway(t, url, nil)
	if err := mock.Inject("status=503;retry-after-ms=5", 1); err != nil {
		t.Fatal(err)
	}
	resp, body := post(t, tg.URL+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	rec := tg.record(t) // the access log is written before the record is handed over
	line := edgeLogLine(t, tg, rec.RequestID)
	var count int
	var attempts []attemptEntry
	var wait float64
	if err := json.Unmarshal(line["attempt_count"], &count); err != nil || count != 2 {
		t.Errorf("attempt_count %s (%v), want 2", line["attempt_count"], err)
	}
	if err := json.Unmarshal(line["attempts"], &attempts); err != nil {
		t.Fatalf("attempts %s: %v", line["attempts"], err)
	}
	want := []attemptEntry{{Upstream: "mock", Status: 503, Result: "server_error"}, {Upstream: "mock", Status: 200, Result: "ok"}}
	if len(attempts) != len(want) {
		t.Fatalf("attempts %+v, want %+v", attempts, want)
	}
	for i := range want {
		a := attempts[i]
		if a.Upstream != want[i].Upstream || a.Status != want[i].Status || a.Result != want[i].Result || a.Ms < 0 {
			t.Errorf("attempt %d: %+v, want %+v with ms >= 0", i, a, want[i])
		}
	}
	if err := json.Unmarshal(line["retry_wait_ms"], &wait); err != nil || wait != 5 {
		t.Errorf("retry_wait_ms %s (%v), want 5 (the upstream's retry-after-ms)", line["retry_wait_ms"], err)
	}
}

// TestEdgeOverheadExcludesRetries: the gateway's overhead of a retried
// request leaves out the failed attempt and the wait before the retry. The
// wait is the upstream's retry-after-ms, honoured exactly, so the recorded
// figures can be compared with each other: the raw time to the last
// attempt's request includes the wait, the overhead does not.
func TestEdgeOverheadExcludesRetries(t *testing.T) {
	mock, url := edgeMock(t, mockllm.Options{OutputTokens: 2})
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

// TestEdgeCallerKeyScope: in passthrough mode a caller's own key goes only to
// upstreams at the origin of its route's first upstream, unless the fallback
// accepts caller keys; a keyless caller falls back freely (the upstream's own
// key, if any, is what goes there).
func TestEdgeCallerKeyScope(t *testing.T) {
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
