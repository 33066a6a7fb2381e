package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/coder/websocket"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
)

// A fake upstream that parses client events as a real server does.

// fakeWS is an upstream socket that decodes each client message with
// encoding/json (escapes decoded, binary frames accepted, as a JSON server
// would) and hands it to onMsg.
type fakeWS struct {
	mu      sync.Mutex
	hdr     http.Header
	msgs    []string
	creates atomic.Int64
	closed  chan websocket.StatusCode
	onMsg   func(ctx context.Context, c *websocket.Conn, ev map[string]any, raw []byte)
	// refuse, when set, answers the upgrade itself.
	refuse func(w http.ResponseWriter)
}

func newFakeWS() *fakeWS { return &fakeWS{closed: make(chan websocket.StatusCode, 8)} }

func (f *fakeWS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.refuse != nil {
		f.refuse(w)
		return
	}
	f.mu.Lock()
	f.hdr = r.Header.Clone()
	f.mu.Unlock()
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer c.CloseNow()
	for {
		_, msg, err := c.Read(r.Context())
		if err != nil {
			f.closed <- websocket.CloseStatus(err)
			return
		}
		f.mu.Lock()
		f.msgs = append(f.msgs, string(msg))
		f.mu.Unlock()
		var ev map[string]any
		_ = json.Unmarshal(msg, &ev)
		if ev["type"] == "response.create" {
			f.creates.Add(1)
		}
		if f.onMsg != nil {
			f.onMsg(r.Context(), c, ev, msg)
		}
	}
}

// turnEvents is a response's events, on lane (none for the default lane).
func turnEvents(id, lane string, in, out int) []string {
	sid := ""
	if lane != "" {
		sid = `,"stream_id":"` + lane + `"`
	}
	return []string{
		`{"type":"response.created","sequence_number":0` + sid + `,"response":{"id":"` + id + `","object":"response","status":"in_progress","model":"gpt-test","output":[],"usage":null}}`,
		`{"type":"response.output_text.delta","sequence_number":1` + sid + `,"item_id":"m","output_index":0,"content_index":0,"delta":"hello"}`,
		fmt.Sprintf(`{"type":"response.completed","sequence_number":2%s,"response":{"id":"%s","object":"response","status":"completed","model":"gpt-test","output":[],"usage":{"input_tokens":%d,"output_tokens":%d,"total_tokens":%d}}}`, sid, id, in, out, in+out),
	}
}

func writeAll(ctx context.Context, c *websocket.Conn, evs ...string) {
	for _, e := range evs {
		if c.Write(ctx, websocket.MessageText, []byte(e)) != nil {
			return
		}
	}
}

// answerCreates answers every response.create (decoded) with a whole turn,
// echoing its decoded stream_id.
func answerCreates(f *fakeWS) {
	var n atomic.Int64
	f.onMsg = func(ctx context.Context, c *websocket.Conn, ev map[string]any, _ []byte) {
		if ev["type"] != "response.create" {
			return
		}
		lane, _ := ev["stream_id"].(string)
		writeAll(ctx, c, turnEvents(fmt.Sprintf("resp_%d", n.Add(1)), lane, 10, 20)...)
	}
}

// keysGateway is a mode-"keys" gateway (keys alpha and beta) in front of up.
func keysGateway(t *testing.T, up http.Handler, edit func(*config.Config)) *govWorld {
	return newGovWorldWith(t, mockllm.Options{}, true, func(c *config.Config) {
		c.Upstreams[0].ResponsesWebSocket = true
		if edit != nil {
			edit(c)
		}
	}, govSetup{upstream: func(http.Handler) http.Handler { return up }})
}

func dialGW(t *testing.T, ctx context.Context, url, key string) *websocket.Conn {
	t.Helper()
	h := http.Header{}
	if key != "" {
		h.Set("Authorization", "Bearer "+key)
	}
	c, _, err := websocket.Dial(ctx, url+"/v1/responses", &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.CloseNow() })
	return c
}

// readTurn reads raw messages up to a terminal or error event.
func readTurn(t *testing.T, ctx context.Context, c *websocket.Conn) []string {
	t.Helper()
	var got []string
	for {
		_, msg, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("read after %d: %v", len(got), err)
		}
		got = append(got, string(msg))
		var ev struct{ Type string }
		_ = json.Unmarshal(msg, &ev)
		switch ev.Type {
		case "response.completed", "response.failed", "response.incomplete", "error":
			return got
		}
	}
}

func last(s []string) string {
	if len(s) == 0 {
		return ""
	}
	l := s[len(s)-1]
	if len(l) > 120 {
		l = l[:120] + "..."
	}
	return l
}

// TestSocketEmptyStreamIDIsRefusedBeforeItReachesALane: an immediate error for a create queued behind a turn.
func TestSocketEmptyStreamIDIsRefusedBeforeItReachesALane(t *testing.T) {
	release := make(chan struct{})
	up := newFakeWS()
	up.onMsg = func(ctx context.Context, c *websocket.Conn, ev map[string]any, _ []byte) {
		if ev["type"] != "response.create" {
			return
		}
		if sid, named := ev["stream_id"]; named && sid == "" {
			// invalid_stream_id: no lane to queue it on, so answered at once
			writeAll(ctx, c, `{"type":"error","status":400,"error":{"type":"invalid_request_error","code":"invalid_stream_id","message":"stream_id must be non-empty","param":"stream_id"}}`)
			return
		}
		evs := turnEvents("resp_A", "", 10, 20)
		writeAll(ctx, c, evs[0])
		go func() {
			<-release
			writeAll(ctx, c, evs[1:]...)
		}()
	}
	tg := newTestGateway(t, serveUp(t, up), func(c *config.Config) { c.Upstreams[0].ResponsesWebSocket = true })
	ctx := testCtx(t)
	c := dialGW(t, ctx, tg.URL, "sk-caller")
	writeAll(ctx, c, `{"type":"response.create","model":"model-A","input":"A"}`)
	if _, _, err := c.Read(ctx); err != nil { // A's response.created
		t.Fatal(err)
	}
	writeAll(ctx, c, `{"type":"response.create","model":"model-B","input":"B","stream_id":""}`)
	a := readTurn(t, ctx, c) // the caller's SDK sees the error
	close(release)
	b := readTurn(t, ctx, c)
	r1, r2 := tg.record(t), tg.record(t)
	t.Logf("caller: %s then %s", last(a), last(b))
	for _, r := range []llm.Record{r1, r2} {
		t.Logf("record of %s: outcome %s error %q usage out %d", r.Model, r.Outcome, r.ErrorType, r.Usage.Output)
		if r.Model == "model-A" && r.Outcome != llm.OutcomeOK {
			t.Errorf("turn A, which the upstream completed with 20 tokens, recorded %s (%s)", r.Outcome, r.ErrorType)
		}
		if r.Model == "model-B" && r.Usage.Output != 0 {
			t.Errorf("turn B, refused by the upstream, billed A's %d output tokens", r.Usage.Output)
		}
	}
}

// TestSocketCallersCloseStatusReachesTheUpstream: close codes.
func TestSocketCallersCloseStatusReachesTheUpstream(t *testing.T) {
	up := newFakeWS()
	tg := newTestGateway(t, serveUp(t, up), func(c *config.Config) { c.Upstreams[0].ResponsesWebSocket = true })
	ctx := testCtx(t)
	counts := map[websocket.StatusCode]int{}
	for range 20 {
		c := dialGW(t, ctx, tg.URL, "sk-caller")
		c.Close(4000, "bye")
		counts[await(t, up.closed, "the upstream's close")]++
	}
	t.Logf("the upstream saw, for 20 caller closes with 4000: %v", counts)
	if counts[4000] != 20 {
		t.Errorf("the caller's close status reached the upstream %d of 20 times", counts[4000])
	}
}

// TestSocketRefusedUpgradeKeepsTheUpstreamAccountsHeaders: a refused upgrade relays the upstream account's headers in mode keys.
func TestSocketRefusedUpgradeKeepsTheUpstreamAccountsHeaders(t *testing.T) {
	up := newFakeWS()
	up.refuse = func(w http.ResponseWriter) {
		w.Header().Set("X-Ratelimit-Limit-Requests", "10000")
		w.Header().Set("X-Ratelimit-Remaining-Tokens", "12")
		w.Header().Set("Openai-Organization", "org-upstream-account")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"error":{"message":"Rate limit reached for org-upstream-account","type":"requests","code":"rate_limit_exceeded"}}`))
	}
	w := keysGateway(t, up, nil)
	ctx := testCtx(t)
	_, resp, err := websocket.Dial(ctx, w.tg.URL+"/v1/responses",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + keyAlpha}}})
	if err == nil || resp == nil {
		t.Fatalf("dial: %v", err)
	}
	t.Logf("status %d, headers %v", resp.StatusCode, resp.Header)
	for _, k := range []string{"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Tokens", "Openai-Organization"} {
		if v := resp.Header.Get(k); v != "" {
			t.Errorf("mode keys: the caller got the upstream account's %s: %s", k, v)
		}
	}
}

func serveUp(t *testing.T, h http.Handler) string {
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s.URL
}

// TestSocketMeteredCallerCannotSpellACreateAnotherWay: in mode "keys"
// every message an upstream's JSON decoder could take for a create is
// admitted as one. A create with an escaped type is admitted (here refused
// by the key's RPM of 1, after one plain turn); a message with a second
// "type" key in another case, or of a type the gateway does not forward
// (response.steer, whose successor no create asked for), is answered with
// an error event and goes nowhere; a binary frame closes the socket 1003.
func TestSocketMeteredCallerCannotSpellACreateAnotherWay(t *testing.T) {
	up := newFakeWS()
	answerCreates(up)
	w := keysGateway(t, up, func(c *config.Config) { c.Keys[0].RPM = i64(1) })
	ctx := testCtx(t)
	c := dialGW(t, ctx, w.tg.URL, keyAlpha)
	send := func(msg string) []string {
		t.Helper()
		if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		return readTurn(t, ctx, c)
	}
	if got := last(send(`{"type":"response.create","model":"gpt-test","input":"hi"}`)); !strings.Contains(got, `"response.completed"`) {
		t.Fatalf("the plain turn ended %s", got)
	}
	if got := last(send(`{"type":"response\u002ecreate","model":"gpt-test","input":"hi"}`)); !strings.Contains(got, `"status":429`) {
		t.Errorf("a create with an escaped type, past the key's RPM: %s; want the 429 of its admission", got)
	}
	for _, msg := range []string{
		`{"type":"response.processed","TYPE":"response.create","model":"gpt-test","input":"hi"}`,
		`{"type":"response.steer","previous_response_id":"resp_1","input":"go on"}`,
		`["response.create"]`,
	} {
		if got := last(send(msg)); !strings.Contains(got, `"unsupported_client_event"`) {
			t.Errorf("%s: %s; want an unsupported_client_event error event", msg, got)
		}
	}
	if n := up.creates.Load(); n != 1 {
		t.Errorf("the upstream decoded %d creates, want the one admitted", n)
	}
	if err := c.Write(ctx, websocket.MessageBinary, []byte(`{"type":"response.create"}`)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Read(ctx); websocket.CloseStatus(err) != websocket.StatusUnsupportedData {
		t.Errorf("after a binary frame: %v; want 1003", err)
	}
}

// TestSocketTurnWithAnUnusableStreamIDIsRefused: a create whose stream_id
// is not what the API accepts, or is written with escapes (the upstream's
// events would name the lane otherwise than the gateway filed the turn),
// is refused 400 invalid_stream_id before admission.
func TestSocketTurnWithAnUnusableStreamIDIsRefused(t *testing.T) {
	up := newFakeWS()
	answerCreates(up)
	w := keysGateway(t, up, nil)
	ctx := testCtx(t)
	c := dialGW(t, ctx, w.tg.URL, keyAlpha)
	for _, lane := range []string{`"l\u0061ne"`, `""`, `"a b"`, `7`} {
		msg := `{"type":"response.create","model":"gpt-test","input":"hi","stream_id":` + lane + `}`
		if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		if got := last(readTurn(t, ctx, c)); !strings.Contains(got, "stream_id must be") || !strings.Contains(got, `"status":400`) {
			t.Errorf("stream_id %s: %s", lane, got)
		}
	}
	if n := up.creates.Load(); n != 0 {
		t.Errorf("%d refused turns reached the upstream", n)
	}
}

// TestSocketGatewaysErrorEventsNameTheTurnsLane: an error event the
// gateway writes for a turn on a named lane (a refusal, a broken stream)
// carries the turn's stream_id, as the upstream's events do, so that a
// client running lanes side by side knows whose turn failed.
func TestSocketGatewaysErrorEventsNameTheTurnsLane(t *testing.T) {
	up := newFakeWS()
	up.onMsg = func(ctx context.Context, c *websocket.Conn, ev map[string]any, _ []byte) {
		if ev["type"] == "response.create" { // its opening, then the socket drops
			writeAll(ctx, c, turnEvents("resp_1", "side", 10, 20)[:2]...)
			c.CloseNow()
		}
	}
	w := keysGateway(t, up, func(c *config.Config) { c.Keys[0].RPM = i64(1) })
	ctx := testCtx(t)
	c := dialGW(t, ctx, w.tg.URL, keyAlpha)
	create := `{"type":"response.create","model":"gpt-test","input":"hi","stream_id":"side"}`
	if err := c.Write(ctx, websocket.MessageText, []byte(create)); err != nil {
		t.Fatal(err)
	}
	events := readTurn(t, ctx, c)
	if got := events[len(events)-1]; !strings.Contains(got, `"upstream_stream_broken"`) || !strings.Contains(got, `"stream_id":"side"`) {
		t.Errorf("the broken turn ended %s; want upstream_stream_broken on lane side", got)
	}
	c = dialGW(t, ctx, w.tg.URL, keyAlpha)
	if err := c.Write(ctx, websocket.MessageText, []byte(create)); err != nil {
		t.Fatal(err)
	}
	if got := readTurn(t, ctx, c)[0]; !strings.Contains(got, `"status":429`) || !strings.Contains(got, `"stream_id":"side"`) {
		t.Errorf("the refused turn got %s; want a 429 on lane side", got)
	}
}

// TestSocketUpstreamMessageOverTheEventLimitIsAProtocolError: an upstream
// message over max_event_bytes ends the turn as an SSE event that size
// does: a protocol error typed event_too_large.
func TestSocketUpstreamMessageOverTheEventLimitIsAProtocolError(t *testing.T) {
	up := newFakeWS()
	up.onMsg = func(ctx context.Context, c *websocket.Conn, ev map[string]any, _ []byte) {
		if ev["type"] == "response.create" {
			evs := turnEvents("resp_1", "", 10, 20)
			writeAll(ctx, c, evs[0], `{"type":"response.output_text.delta","delta":"`+strings.Repeat("x", 8<<10)+`"}`)
		}
	}
	tg := newTestGateway(t, serveUp(t, up), func(c *config.Config) {
		c.Upstreams[0].ResponsesWebSocket = true
		c.Server.MaxEventBytes = 4 << 10
	})
	ctx := testCtx(t)
	c := dialGW(t, ctx, tg.URL, "sk-caller")
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"response.create","model":"m","input":"hi"}`)); err != nil {
		t.Fatal(err)
	}
	readTurn(t, ctx, c)
	rec := tg.record(t)
	if rec.Outcome != llm.OutcomeUpstreamError || rec.Interruption != llm.InterruptProtocolError || rec.ErrorType != "event_too_large" {
		t.Errorf("record: outcome %s interruption %s error type %q", rec.Outcome, rec.Interruption, rec.ErrorType)
	}
}

// TestSocketSteeredSuccessorIsATurnOfItsOwn: after response.steer the
// upstream ends the steered response (incomplete, reason steered) and
// creates a successor on the same lane by itself. For a caller the
// gateway does not meter (who alone may steer), the successor is recorded
// as a turn of its own, with its model and its usage, not relayed unseen.
func TestSocketSteeredSuccessorIsATurnOfItsOwn(t *testing.T) {
	up := newFakeWS()
	up.onMsg = func(ctx context.Context, c *websocket.Conn, ev map[string]any, _ []byte) {
		if ev["type"] != "response.create" {
			return
		}
		first := turnEvents("resp_1", "", 10, 1)
		writeAll(ctx, c, first[0], first[1],
			`{"type":"response.incomplete","sequence_number":2,"response":{"id":"resp_1","object":"response","status":"incomplete","incomplete_details":{"reason":"steered"},"model":"gpt-test","output":[],"usage":{"input_tokens":10,"output_tokens":1,"total_tokens":11}}}`)
		writeAll(ctx, c, turnEvents("resp_2", "", 30, 40)...)
	}
	tg := newTestGateway(t, serveUp(t, up), func(c *config.Config) { c.Upstreams[0].ResponsesWebSocket = true })
	ctx := testCtx(t)
	c := dialGW(t, ctx, tg.URL, "sk-caller")
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"response.create","model":"gpt-test","input":"hi"}`)); err != nil {
		t.Fatal(err)
	}
	readTurn(t, ctx, c)
	if got := last(readTurn(t, ctx, c)); !strings.Contains(got, `"response.completed"`) {
		t.Fatalf("the successor ended %s", got)
	}
	recs := map[int64]llm.Record{}
	for range 2 {
		r := tg.record(t)
		recs[r.Usage.Output] = r
	}
	if r := recs[1]; r.IncompleteReason != "steered" || r.Usage.Input != 10 {
		t.Errorf("the steered response: %+v", r.Usage)
	}
	if r := recs[40]; r.Usage.Input != 30 || r.Model != "gpt-test" || r.Transport != llm.TransportWebSocket ||
		r.Outcome != llm.OutcomeOK || r.TTFT() <= 0 {
		t.Errorf("the successor: usage %+v model %q transport %s outcome %s TTFT %v", r.Usage, r.Model, r.Transport,
			r.Outcome, r.TTFT())
	}
}
