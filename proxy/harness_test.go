package proxy

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/conversation"
	"github.com/tollgate-llm/tollgate/internal/jsonlog"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/metrics"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/ratelimit"
	"github.com/tollgate-llm/tollgate/spend"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testGateway is a gateway on a loopback httptest server, with the records it
// finished.
type testGateway struct {
	URL      string
	gw       *Gateway
	srv      *httptest.Server
	registry *prometheus.Registry
	logs     *bytes.Buffer // access log
	mu       sync.Mutex
	recs     []llm.Record
	recCh    chan llm.Record
}

// newTestGateway starts a gateway in front of upstreamURL. edit may change
// the config before the gateway is built.
func newTestGateway(t testing.TB, upstreamURL string, edit func(*config.Config)) *testGateway {
	t.Helper()
	return newTestGatewayWith(t, upstreamURL, edit, nil)
}

// newTestGatewayWith is newTestGateway with a hook that may set more
// Options (a limiter, a ledger, a clock) before the gateway is built.
func newTestGatewayWith(t testing.TB, upstreamURL string, edit func(*config.Config), opts func(*Options)) *testGateway {
	t.Helper()
	cfg := testConfig(t, upstreamURL, edit)
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	tg := &testGateway{registry: reg, logs: &bytes.Buffer{}, recCh: make(chan llm.Record, 1024)}
	var logMu sync.Mutex
	access := slog.New(jsonlog.NewHandler(lockedWriter{&logMu, tg.logs}, nil)) // as the gateway writes it
	o := Options{
		Config: &cfg, Metrics: m, Gatherer: reg,
		Logger:    slog.New(slog.DiscardHandler),
		AccessLog: access,
		OnRecord: func(r *llm.Record) {
			tg.mu.Lock()
			tg.recs = append(tg.recs, *r)
			tg.mu.Unlock()
			tg.recCh <- *r
		},
	}
	if opts != nil {
		opts(&o)
	}
	gw, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	tg.gw = gw
	tg.srv = httptest.NewServer(gw.Handler())
	tg.URL = tg.srv.URL
	t.Cleanup(func() {
		tg.srv.Close()
		closeIdleUpstreams(gw)
	})
	return tg
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// record waits for the next finished record.
func (tg *testGateway) record(t testing.TB) llm.Record {
	t.Helper()
	return await(t, tg.recCh, "a finished record")
}

// testConfig is the demo config in front of upstreamURL, with no key
// required, changed by edit (when not nil) and validated.
func testConfig(tb testing.TB, upstreamURL string, edit func(*config.Config)) config.Config {
	tb.Helper()
	cfg := config.DemoConfig(upstreamURL)
	cfg.Auth.RequireKey = false
	if edit != nil {
		edit(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		tb.Fatalf("config: %v", err)
	}
	return cfg
}

// closeIdleUpstreams closes the idle connections of g's upstream
// transports, so no connection outlives its test.
func closeIdleUpstreams(g *Gateway) {
	for _, u := range g.gen.Load().upstreams {
		if tr, ok := u.transport.(*http.Transport); ok {
			tr.CloseIdleConnections()
		}
	}
}

// bareGateway builds a Gateway (no server, no access log) in front of
// upstreamURL; edit may change the config first.
func bareGateway(tb testing.TB, upstreamURL string, edit func(*config.Config)) *Gateway {
	tb.Helper()
	return bareGatewayWith(tb, upstreamURL, edit, nil)
}

// bareGatewayWith is bareGateway with a hook that may set more Options (a
// clock, say) before the gateway is built.
func bareGatewayWith(tb testing.TB, upstreamURL string, edit func(*config.Config), opts func(*Options)) *Gateway {
	tb.Helper()
	cfg := testConfig(tb, upstreamURL, edit)
	m, err := metrics.New(prometheus.NewRegistry(), &cfg)
	if err != nil {
		tb.Fatal(err)
	}
	o := Options{Config: &cfg, Metrics: m, Logger: slog.New(slog.DiscardHandler)}
	if opts != nil {
		opts(&o)
	}
	g, err := New(o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { closeIdleUpstreams(g) })
	return g
}

// newLocalLedger returns an in-memory spend ledger closed in t.Cleanup.
func newLocalLedger(t testing.TB) *spend.Local {
	t.Helper()
	l, err := spend.NewLocal(spend.LocalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// fakeClock is a clock tests move by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// testWait bounds every wait of these tests: reaching it is a failure, never
// a measurement.
const testWait = 10 * time.Second

// await returns the next value from ch, failing the test if none comes
// within testWait; what names the awaited event.
func await[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(testWait):
		t.Fatalf("gave up waiting for %s", what)
		var zero T
		return zero
	}
}

// waitFor polls cond until it holds, for at most testWait; it decides
// nothing about speed, it only bounds a wait for an event of another
// goroutine.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testWait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// post sends a JSON body and returns the response with its whole body read.
func post(t *testing.T, url, body string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	h := http.Header{}
	for k, v := range hdr {
		h.Set(k, v)
	}
	return postHeader(t, url, []byte(body), h)
}

// postHeader is post with the request's headers given as they are sent:
// a header with several values goes as several lines.
func postHeader(t *testing.T, url string, body []byte, h http.Header) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, vv := range h {
		req.Header[k] = vv
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading body: %v", err)
	}
	return resp, b
}

// sendResult is a response read to its end by a client goroutine.
type sendResult struct {
	resp *http.Response
	body []byte
	err  error
}

// sendRequest sends a request and returns its response with the body read.
func sendRequest(ctx context.Context, method, url, ctype, body string, hdr map[string]string) sendResult {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return sendResult{err: err}
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return sendResult{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return sendResult{resp: resp, body: b, err: err}
}

// awaitResult waits for a client goroutine's result.
func awaitResult(t *testing.T, ch <-chan sendResult) sendResult {
	t.Helper()
	r := await(t, ch, "a response")
	if r.err != nil {
		t.Fatalf("request: %v", r.err)
	}
	return r
}

// streamChat is a streamed chat request that does not ask for usage, so the
// gateway asks for it and withholds the usage-only chunk.
const streamChat = `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}`

// plainChat is the same request, not streamed.
const plainChat = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`

// Gateway keys of the governance tests. Only their hashes go in the config.
const (
	keyAlpha    = "tg-test-alpha-0123456789"
	keyBeta     = "tg-test-beta-0123456789"
	upstreamKey = "sk-upstream-own-key"
)

func sha(k string) string {
	s := sha256.Sum256([]byte(k))
	return hex.EncodeToString(s[:])
}

func i64(v int64) *int64 { return &v }

func f64(v float64) *float64 { return &v }

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// rawUpstream serves body verbatim as an SSE stream, writing it in the given
// pieces (flushing after each), and records the request it got.
type rawUpstream struct {
	pieces      [][]byte
	contentType string
	status      int // 200 when 0
	mu          sync.Mutex
	lastBody    []byte
	lastHeader  http.Header
}

func (u *rawUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.lastBody, u.lastHeader = b, r.Header.Clone()
	u.mu.Unlock()
	ct := u.contentType
	if ct == "" {
		ct = "text/event-stream"
	}
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(cmp.Or(u.status, http.StatusOK))
	rc := http.NewResponseController(w)
	for _, p := range u.pieces {
		if _, err := w.Write(p); err != nil {
			return
		}
		_ = rc.Flush()
	}
}

func (u *rawUpstream) request() ([]byte, http.Header) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.lastBody, u.lastHeader
}

// fixedUpstream is an upstream that answers every request with a fixed status
// and body, counting the requests by the Authorization they carried; a
// request carrying okAuth gets a plain chat completion instead.
type fixedUpstream struct {
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

func newFixedUpstream(status int, body, aBody string) *fixedUpstream {
	return &fixedUpstream{status: status, body: body, aBody: aBody, hits: map[string]int{}, first: make(chan struct{})}
}

func (u *fixedUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
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
		_, _ = io.WriteString(w, `{"id":"chatcmpl-fixed","object":"chat.completion","created":1,"model":"gpt-4o-mini",`+
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

func (u *fixedUpstream) count(auth string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.hits[auth]
}

func (u *fixedUpstream) requests() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.total
}

// gateUpstream is an SSE upstream that sends its preamble (the events that
// carry no token) at once, then waits for the test to open the gate before
// it sends the rest.
type gateUpstream struct {
	preamble, rest string
	arrived        chan struct{} // closed once the first request has its preamble
	release        chan struct{}
	arrivedOnce    sync.Once
	releaseOnce    sync.Once
	requests       atomic.Int32
}

func newGateUpstream(preamble, rest string) *gateUpstream {
	return &gateUpstream{preamble: preamble, rest: rest, arrived: make(chan struct{}), release: make(chan struct{})}
}

func (g *gateUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
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
func (g *gateUpstream) open() { g.releaseOnce.Do(func() { close(g.release) }) }

// waitArrived waits for the first request to have its preamble.
func (g *gateUpstream) waitArrived(t *testing.T) {
	t.Helper()
	await(t, g.arrived, "the upstream to get the request")
}

// mockUpstream starts a mockllm upstream on loopback.
func mockUpstream(t testing.TB, o mockllm.Options) (*mockllm.Server, string) {
	t.Helper()
	m := mockllm.New(o)
	srv := httptest.NewServer(m)
	t.Cleanup(srv.Close)
	return m, srv.URL
}

// fastRetry makes an upstream's backoff tiny, so retries cost nothing.
func fastRetry(u *config.Upstream) {
	u.Retry.BaseDelayMs = 1
	u.Retry.MaxDelayMs = 1
}

// closedPortURL returns the URL of a loopback port nobody listens on.
func closedPortURL(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		tb.Fatal(err)
	}
	return "http://" + addr
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

// tightBreaker is a breaker that opens at the second failure in a row and stays
// open for the test.
var tightBreaker = config.Breaker{Enabled: true, ConsecutiveFailures: 2, FailureRatio: 0.5, MinRequests: 20,
	WindowSeconds: 10, CooldownSeconds: 60, HalfOpenProbes: 1}

// Transcripts of real upstream streams, one event per constant.
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

// chunkEvent is an OpenAI stream chunk with the given delta.
func chunkEvent(delta string) string {
	return `data: {"id":"chatcmpl-fixed","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini",` +
		`"choices":[{"index":0,"delta":` + delta + `,"finish_reason":null}]}` + "\n\n"
}

// errorEvent is an OpenAI in-stream error event of the given type.
func errorEvent(typ, code string) string {
	return `data: {"error":{"message":"stream error","type":"` + typ + `","param":null,"code":"` + code + `"}}` + "\n\n"
}

// eventPieces splits events into the pieces of a rawUpstream.
func eventPieces(events ...string) [][]byte {
	out := make([][]byte, len(events))
	for i, e := range events {
		out[i] = []byte(e)
	}
	return out
}

// openAIStream returns an OpenAI stream of n token chunks, split one event per
// piece, ending with the usage chunk and [DONE].
func openAIStream(n int) [][]byte {
	pieces := [][]byte{[]byte(openAIRole)}
	for i := range n {
		pieces = append(pieces, fmt.Appendf(nil,
			`data: {"id":"chatcmpl-b","object":"chat.completion.chunk","created":1767225600,"model":"gpt-4o-mini","system_fingerprint":"fp_b","choices":[{"index":0,"delta":{"content":" tok%d"},"logprobs":null,"finish_reason":null}],"usage":null,"obfuscation":"x9"}`+"\n\n", i))
	}
	return append(pieces, []byte(openAIStop), []byte(openAIUsage), []byte(openAIDone))
}

// responsesStream is a Responses API stream of n text deltas, one event a
// piece: the recorded stream's opening and closing events around them.
func responsesStream(t testing.TB, n int) [][]byte {
	t.Helper()
	b, err := os.ReadFile("../sseparse/testdata/transcripts/9.9.sse")
	if err != nil {
		t.Fatal(err)
	}
	events := strings.SplitAfter(string(b), "\n\n")
	var pieces [][]byte
	for _, e := range events[:4] {
		pieces = append(pieces, []byte(e))
	}
	for i := range n {
		pieces = append(pieces, fmt.Appendf(nil, "event: response.output_text.delta\n"+
			`data: {"type":"response.output_text.delta","sequence_number":%d,"item_id":"msg_045d","output_index":0,"content_index":0,"delta":" tok%d","logprobs":[],"obfuscation":"mvkAadO"}`+"\n\n", 4+i, i))
	}
	for _, e := range events[8:12] {
		pieces = append(pieces, []byte(e))
	}
	return pieces
}

// firstDiff describes where got first differs from want.
func firstDiff(got []byte, want string) string {
	i := 0
	for i < min(len(got), len(want)) && got[i] == want[i] {
		i++
	}
	return fmt.Sprintf("got %d bytes, want %d; first difference at %d: got %q, want %q",
		len(got), len(want), i, got[i:min(i+24, len(got))], want[i:min(i+24, len(want))])
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

// metricValue returns the value of the counter or gauge series name with
// exactly the given labels (constant labels aside), or -1 when it is absent.
func metricValue(t testing.TB, tg *testGateway, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := tg.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue series
				}
			}
			if m.Counter != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

// wantMetric checks the value of a metric series (see metricValue).
func wantMetric(t *testing.T, tg *testGateway, name string, labels map[string]string, want float64) {
	t.Helper()
	if got := metricValue(t, tg, name, labels); got != want {
		t.Errorf("%s %v = %v, want %v", name, labels, got, want)
	}
}

// recWriter is a ResponseWriter that records the status, what was written
// and how much of it had been flushed.
type recWriter struct {
	h       http.Header
	status  int // the first status written (200 once a Write comes first)
	written []byte
	flushed int // len(written) at the last Flush
}

func (w *recWriter) Header() http.Header { return w.h }

func (w *recWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	w.written = append(w.written, p...)
	return len(p), nil
}

func (w *recWriter) WriteHeader(s int) {
	if w.status == 0 {
		w.status = s
	}
}

func (w *recWriter) Flush() { w.flushed = len(w.written) }

// discardWriter is a ResponseWriter that drops the body and counts flushes.
type discardWriter struct {
	h       http.Header
	flushes int
}

func (d *discardWriter) Header() http.Header { return d.h }

func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }

func (d *discardWriter) WriteHeader(int) {}

func (d *discardWriter) Flush() { d.flushes++ }

var _ http.Flusher = (*discardWriter)(nil)

// scriptReader serves reads in order (a read larger than p is served in
// parts, as a socket would) and calls before(i) before serving read i.
type scriptReader struct {
	reads  [][]byte
	i      int
	before func(i int)
	// recordSizes keeps len(p) of every Read call in sizes (off where a
	// run must not allocate).
	recordSizes bool
	sizes       []int
}

func (s *scriptReader) Read(p []byte) (int, error) {
	if s.recordSizes {
		s.sizes = append(s.sizes, len(p))
	}
	if s.i == len(s.reads) {
		if s.before != nil {
			s.before(s.i)
		}
		return 0, io.EOF
	}
	if s.before != nil {
		s.before(s.i)
	}
	n := copy(p, s.reads[s.i])
	if n == len(s.reads[s.i]) {
		s.i++
	} else {
		s.reads[s.i] = s.reads[s.i][n:]
	}
	return n, nil
}

// relayGateway is a bare gateway for driving the relay in process, with
// max_event_bytes set when maxEvent > 0.
func relayGateway(t *testing.T, maxEvent int) *Gateway {
	t.Helper()
	return bareGateway(t, "http://127.0.0.1:1", func(c *config.Config) {
		if maxEvent > 0 {
			c.Server.MaxEventBytes = maxEvent
		}
	})
}

// sseHeader is the header of every upstream stream a relayRig relays.
var sseHeader = http.Header{"Content-Type": {"text/event-stream"}}

// relayRig drives the relay (the SSE loop of one attempt) in process, with
// no sockets and no upstream request: it builds an exchange of g for a chat
// completion in dialect d and relays an upstream event stream to w. It is
// the one place the tests call ex.relay. The exchange, the upstream
// response and the phase timer live in the rig and are reused from one run
// to the next, so a run adds no allocation of its own (the relay's
// benchmarks and its allocation test count on that).
type relayRig struct {
	g *Gateway
	w http.ResponseWriter
	r *http.Request // the caller's request; a POST to /v1/chat/completions when nil
	d llm.Dialect
	// suppress withholds the usage chunk, as when the gateway asked for
	// the usage the caller did not.
	suppress bool
	// hold relays as when another attempt could follow: the opening
	// events wait for the first token.
	hold bool
	// ctx and cancel are the exchange's context and how the relay ends
	// it (the phase timer's cancel calls cancel); when ctx is nil, each run
	// derives one from the request's.
	ctx    context.Context
	cancel context.CancelFunc

	ex   exchange
	at   attemptState
	resp http.Response
	pt   phaseTimer
}

// run relays body as the upstream's stream through a fresh exchange,
// rg.ex, and returns the attempt's result.
func (rg *relayRig) run(body io.Reader) attemptResult {
	if rg.r == nil {
		rg.r = httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	}
	rg.ex = exchange{g: rg.g, gen: rg.g.gen.Load(), w: rg.w, r: rg.r, modelLabel: "m"}
	rg.at = attemptState{up: rg.g.gen.Load().upstreams[0]}
	rg.ex.rec.Route, rg.ex.rec.Dialect, rg.ex.rec.Status = llm.RouteChatCompletions, rg.d, http.StatusOK
	rg.ex.rec.Timing.In = rg.g.now()
	rg.at.suppressUsage = rg.suppress
	rg.resp = http.Response{StatusCode: http.StatusOK, Header: sseHeader, Body: io.NopCloser(body)}
	defer rg.pt.stop() // as the attempt does after its relay
	ctx := rg.ctx
	if ctx == nil {
		var stop context.CancelCauseFunc
		ctx, stop = context.WithCancelCause(rg.r.Context())
		defer stop(nil)
		rg.pt.cancel = stop
	} else if rg.pt.cancel == nil {
		rg.pt.cancel = func(error) {
			if rg.cancel != nil {
				rg.cancel()
			}
		}
	}
	rg.pt.init(rg.pt.cancel, rg.pt.idle, 0, nil) // no total timeout
	res := rg.ex.relay(ctx, &rg.at, &rg.resp, rg.hold, &rg.pt)
	rg.ex.last = &rg.at // as tryUpstream keeps the attempt's state
	rg.ex.closeRecord() // as finish does
	return res
}

// relayStream relays body through a fresh exchange of g (see relayRig),
// from the caller's request r (nil: a plain POST) to w, and returns the
// exchange and the attempt's result.
func relayStream(g *Gateway, w http.ResponseWriter, r *http.Request, d llm.Dialect, suppress, hold bool, body io.Reader) (*exchange, attemptResult) {
	rg := &relayRig{g: g, w: w, r: r, d: d, suppress: suppress, hold: hold}
	res := rg.run(body)
	return &rg.ex, res
}

// relayBench replays one OpenAI stream through a relayRig, one event per
// read, from buffers it reuses: what a run costs is the relay's own cost.
type relayBench struct {
	relayRig
	src  [][]byte
	body scriptReader
}

// newRelayBench is a relayBench of a stream of events token chunks, its
// gateway recording native histograms when native is set. The phase
// timer's idle timeout (rb.pt.idle) is off until the caller sets it.
func newRelayBench(tb testing.TB, events int, native bool) *relayBench {
	tb.Helper()
	g := bareGateway(tb, "http://127.0.0.1:1", func(c *config.Config) { c.Metrics.NativeHistograms = native })
	rb := &relayBench{src: openAIStream(events)}
	rb.relayRig = relayRig{g: g, w: &discardWriter{h: http.Header{}}, d: llm.DialectOpenAI, suppress: true,
		ctx: context.Background(), cancel: func() {}}
	rb.r = httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	return rb
}

// run relays the whole stream once; rb.ex holds its record.
func (rb *relayBench) run() {
	rb.body.reads = append(rb.body.reads[:0], rb.src...)
	rb.body.i = 0
	rb.relayRig.run(&rb.body)
}

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
			// SDKs' keys may follow a fallback (TestCallerKeyScope
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

// inject queues a fault on the named mock.
func (w *resWorld) inject(t *testing.T, name, spec string, n int) {
	t.Helper()
	if err := w.mocks[name].Inject(spec, n); err != nil {
		t.Fatal(err)
	}
}

// requests is how many requests the named mock received.
func (w *resWorld) requests(name string) int64 { return w.mocks[name].Stats().Requests }

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

// govWorld is a gateway with keys, teams, a limiter (Local unless told
// otherwise) and a memory ledger in front of a mockllm.
type govWorld struct {
	tg      *testGateway
	mock    *mockllm.Server
	limiter ratelimit.Limiter
	ledger  *spend.Local
	clock   *fakeClock // nil: real time
	// conv is the conversation store when the world's config turns
	// [conversations] on; outcomes are what the gateway's OnOutcome got.
	conv     *conversation.Local
	outcomes chan postedOutcome
}

// postedOutcome is one call of Options.OnOutcome.
type postedOutcome struct {
	team       string
	o          conversation.Outcome
	costMicros int64
}

// newGovWorld builds a world: two teams ("search" and "ads") with keys
// alpha and beta, mode "keys", prices for gpt-test* and claude-test*. edit
// may set limits.
func newGovWorld(t *testing.T, mo mockllm.Options, frozen bool, edit func(*config.Config)) *govWorld {
	t.Helper()
	return newGovWorldWith(t, mo, frozen, edit, govSetup{})
}

// govSetup is what newGovWorldWith may change in a world.
type govSetup struct {
	// limiter replaces the Local limiter on the world's clock; the world
	// closes it.
	limiter ratelimit.Limiter
	// upstream wraps the mockllm's handler.
	upstream func(http.Handler) http.Handler
	// options may set more Options, after the world's own.
	options func(*Options)
}

// newGovWorldWith is newGovWorld with another limiter or upstream.
func newGovWorldWith(t *testing.T, mo mockllm.Options, frozen bool, edit func(*config.Config), setup govSetup) *govWorld {
	t.Helper()
	w := &govWorld{}
	if frozen {
		w.clock = newFakeClock()
	}
	mo.RequireKey = upstreamKey
	w.mock = mockllm.New(mo)
	var h http.Handler = w.mock
	if setup.upstream != nil {
		h = setup.upstream(h)
	}
	up := httptest.NewServer(h)
	t.Cleanup(up.Close)
	var now func() time.Time
	if w.clock != nil {
		now = w.clock.Now
	}
	w.limiter = setup.limiter
	if w.limiter == nil {
		w.limiter = ratelimit.NewLocal(ratelimit.LocalOptions{Now: now})
	}
	t.Cleanup(func() { _ = w.limiter.Close() })
	w.ledger = newLocalLedger(t)
	w.tg = newTestGatewayWith(t, up.URL, func(c *config.Config) {
		c.Auth.Mode = "keys"
		c.Upstreams[0].APIKeyEnv = "UPSTREAM_KEY"
		c.Upstreams[0].APIKey = upstreamKey
		c.Models = []config.Model{
			{Pattern: "gpt-test*", InputUSDPerMTok: 2.5, OutputUSDPerMTok: 10, CacheReadUSDPerMTok: f64(1.25)},
			{Pattern: "claude-test*", InputUSDPerMTok: 3, OutputUSDPerMTok: 15},
		}
		withTwoTeams(c)
		if edit != nil {
			edit(c)
		}
	}, func(o *Options) {
		o.Limiter, o.Ledger = w.limiter, w.ledger
		if now != nil {
			o.Now = now
		}
		if cc := o.Config.Conversations; cc.Enabled {
			w.conv = newConversations(t, cc, now)
			w.outcomes = make(chan postedOutcome, 16)
			o.Conversations = w.conv
			o.OnOutcome = func(team string, oc conversation.Outcome, cost int64) {
				w.outcomes <- postedOutcome{team, oc, cost}
			}
		}
		if setup.options != nil {
			setup.options(o)
		}
	})
	return w
}

// withTwoTeams gives c the teams "search" and "ads", whose keys are alpha
// (keyAlpha) and beta (keyBeta).
func withTwoTeams(c *config.Config) {
	c.Teams = []config.Team{{Name: "search"}, {Name: "ads"}}
	c.Keys = []config.Key{
		{Name: "alpha", SHA256: sha(keyAlpha), Team: "search"},
		{Name: "beta", SHA256: sha(keyBeta), Team: "ads"},
	}
}

// newConversations is an in-memory conversation store for cc, closed in
// t.Cleanup.
func newConversations(t testing.TB, cc config.Conversations, now func() time.Time) *conversation.Local {
	t.Helper()
	l, err := conversation.NewLocal(conversation.LocalOptions{Options: conversation.Options{
		IdleTimeout: cc.IdleTimeout(), MaxActive: cc.MaxActive, Interval: cc.FlushInterval(), Now: now}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func (w *govWorld) openai(key string, opts ...option.RequestOption) *openai.Client {
	c := openai.NewClient(append([]option.RequestOption{option.WithBaseURL(w.tg.URL + "/v1"),
		option.WithAPIKey(key), option.WithMaxRetries(0)}, opts...)...)
	return &c
}

func (w *govWorld) anthropic(key string, opts ...aoption.RequestOption) *anthropic.Client {
	c := anthropic.NewClient(append([]aoption.RequestOption{aoption.WithBaseURL(w.tg.URL),
		aoption.WithAPIKey(key), aoption.WithMaxRetries(0)}, opts...)...)
	return &c
}

func chatParams(maxTokens int64) openai.ChatCompletionNewParams {
	p := openai.ChatCompletionNewParams{
		Model:    "gpt-test",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("How many moons has Jupiter?")},
	}
	if maxTokens > 0 {
		p.MaxTokens = openai.Int(maxTokens)
	}
	return p
}

// circuitState is the upstream's tollgate_upstream_circuit_state (see
// metrics.CircuitClosed, CircuitOpen, CircuitHalfOpen), -1 when absent.
func circuitState(t *testing.T, tg *testGateway, upstream string) float64 {
	t.Helper()
	return metricValue(t, tg, "tollgate_upstream_circuit_state", map[string]string{"upstream": upstream})
}

// rawRequest writes request (a whole HTTP/1.1 request) to addr as it is,
// so no client library cleans its path, and reads the answer.
func rawRequest(t *testing.T, addr, request string) (*http.Response, []byte) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, request); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

// errorCode reads the code of an OpenAI error body ("" if none), or the
// type of an Anthropic one.
func errorCode(body []byte) (openAICode, anthropicType string) {
	var e struct {
		Type  string `json:"type"`
		Error struct {
			Code *string `json:"code"`
			Type string  `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil {
		return "", ""
	}
	if e.Type == "error" {
		return "", e.Error.Type
	}
	if e.Error.Code != nil {
		return *e.Error.Code, ""
	}
	return "", ""
}
