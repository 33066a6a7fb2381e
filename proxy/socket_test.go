package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/spend"
)

// socketEvent is what a test reads of a server event on a socket.
type socketEvent struct {
	Type     string `json:"type"`
	Status   int    `json:"status"`
	Response struct {
		ID    string `json:"id"`
		Usage struct {
			Input  int64 `json:"input_tokens"`
			Output int64 `json:"output_tokens"`
		} `json:"usage"`
	} `json:"response"`
	Error struct {
		Type    string            `json:"type"`
		Code    string            `json:"code"`
		Headers map[string]string `json:"headers"`
	} `json:"error"`
	Headers map[string]string `json:"headers"`
}

// socketGateway is a gateway whose one upstream, mock, speaks the
// WebSocket mode; edit may change the config further.
func socketGateway(t *testing.T, m *mockllm.Server, edit func(*config.Config)) *testGateway {
	t.Helper()
	up := httptest.NewServer(m)
	t.Cleanup(up.Close)
	return newTestGateway(t, up.URL, func(c *config.Config) {
		c.Upstreams[0].ResponsesWebSocket = true
		if edit != nil {
			edit(c)
		}
	})
}

// connectSocket opens the official SDK's Responses WebSocket on the
// gateway with key (none when "").
func connectSocket(t *testing.T, ctx context.Context, tg *testGateway, key string) (*openai.BetaResponseConnection, error) {
	t.Helper()
	client := openai.NewClient(option.WithBaseURL(tg.URL+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
	conn, err := client.Beta.Responses.Connect(ctx, openai.BetaResponseConnectionOptions{})
	if err == nil {
		t.Cleanup(func() { _ = conn.Close() })
	}
	return conn, err
}

// openSocket opens the official SDK's Responses WebSocket on the gateway
// with key, under the test's deadline, and fails the test without one.
func openSocket(t *testing.T, tg *testGateway, key string) (context.Context, *openai.BetaResponseConnection) {
	t.Helper()
	ctx := testCtx(t)
	conn, err := connectSocket(t, ctx, tg, key)
	if err != nil {
		t.Fatal(err)
	}
	return ctx, conn
}

// sendTurn sends one raw client event and reads the events up to the
// turn's terminal or error event.
func sendTurn(t *testing.T, ctx context.Context, conn *openai.BetaResponseConnection, event string) []socketEvent {
	t.Helper()
	if err := conn.SendRaw(ctx, json.RawMessage(event)); err != nil {
		t.Fatalf("send: %v", err)
	}
	var got []socketEvent
	for {
		raw, err := conn.RecvRaw(ctx)
		if err != nil {
			t.Fatalf("receive after %d events: %v", len(got), err)
		}
		var ev socketEvent
		if err := json.Unmarshal(raw, &ev); err != nil {
			t.Fatalf("event %q: %v", raw, err)
		}
		got = append(got, ev)
		switch ev.Type {
		case "response.completed", "response.failed", "response.incomplete", "error":
			return got
		}
	}
}

const socketCreate = `{"type":"response.create","model":"gpt-4.1","input":"hi","store":false}`

// TestSocketTurnsAreMeasuredOneByOne: each response.create on one socket is
// its own request: relayed whole to the official SDK, and recorded with
// route responses, transport websocket, the upstream's usage, its token
// events and a first token no sooner than the upstream's schedule allows.
func TestSocketTurnsAreMeasuredOneByOne(t *testing.T) {
	const ttft = 20 * time.Millisecond
	m := mockllm.New(mockllm.Options{OutputTokens: 5, TTFT: ttft, ITL: time.Millisecond})
	tg := socketGateway(t, m, nil)
	ctx, conn := openSocket(t, tg, "sk-caller")
	for turn := range 3 {
		events := sendTurn(t, ctx, conn, socketCreate)
		last := events[len(events)-1]
		if events[0].Type != "response.created" || last.Type != "response.completed" || last.Response.Usage.Output != 5 {
			t.Fatalf("turn %d: %d events from %s to %s (output %d)", turn, len(events), events[0].Type, last.Type,
				last.Response.Usage.Output)
		}
		rec := tg.record(t)
		switch {
		case rec.Route != llm.RouteResponses || rec.Transport != llm.TransportWebSocket || !rec.Stream:
			t.Errorf("turn %d: route %s transport %s stream %v", turn, rec.Route, rec.Transport, rec.Stream)
		case rec.Outcome != llm.OutcomeOK || rec.Status != http.StatusOK || rec.Upstream != "mock" || rec.AttemptCount != 1:
			t.Errorf("turn %d: outcome %s status %d upstream %q attempts %d", turn, rec.Outcome, rec.Status, rec.Upstream,
				rec.AttemptCount)
		case rec.Usage.Output != 5 || !rec.Usage.HasInput || rec.TokenEvents != 5 || rec.Estimated:
			t.Errorf("turn %d: usage %+v, %d token events, estimated %v", turn, rec.Usage, rec.TokenEvents, rec.Estimated)
		case rec.TTFT() < ttft || rec.Timing.FirstTokenOut.After(rec.Timing.End) || rec.Timing.UpFirstByte.IsZero():
			t.Errorf("turn %d: TTFT %v (the upstream waits %v), first token out %v, end %v", turn, rec.TTFT(), ttft,
				rec.Timing.FirstTokenOut, rec.Timing.End)
		}
	}
	if got := m.Stats().Requests; got != 3 {
		t.Errorf("the upstream answered %d turns, want 3", got)
	}
	wantMetric(t, tg, "tollgate_websocket_connections_total", map[string]string{"result": "accepted"}, 1)
}

// TestSocketUpgradeWithoutASocketUpstreamIs426: with no upstream that
// speaks the WebSocket mode the upgrade is refused 426, which makes Codex
// and the SDKs use HTTP at once, and nothing goes upstream.
func TestSocketUpgradeWithoutASocketUpstreamIs426(t *testing.T) {
	m := mockllm.New(mockllm.Options{})
	tg := socketGateway(t, m, func(c *config.Config) { c.Upstreams[0].ResponsesWebSocket = false })
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	if _, err := connectSocket(t, ctx, tg, "sk-caller"); err == nil {
		t.Fatal("the SDK connected")
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, tg.URL+"/v1/responses", nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Error struct{ Code string } `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != http.StatusUpgradeRequired ||
		body.Error.Code != "websocket_not_supported" {
		t.Fatalf("upgrade answered %d, code %q (%v); want 426 websocket_not_supported", resp.StatusCode, body.Error.Code, err)
	}
	if n := m.Stats().Requests; n != 0 {
		t.Errorf("%d requests reached the upstream", n)
	}
	wantMetric(t, tg, "tollgate_websocket_connections_total", map[string]string{"result": "unsupported"}, 2)
}

// sessionStep is one client message of a recorded session and the server
// messages that answer it.
type sessionStep struct {
	client []byte
	server [][]byte
}

// readSession reads a recorded session (testdata/socket_session.txt).
func readSession(t *testing.T, path string) []sessionStep {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var steps []sessionStep
	for _, line := range bytes.Split(b, []byte("\n")) {
		switch {
		case bytes.HasPrefix(line, []byte("> ")):
			steps = append(steps, sessionStep{client: line[2:]})
		case bytes.HasPrefix(line, []byte("< ")) && len(steps) > 0:
			s := &steps[len(steps)-1]
			s.server = append(s.server, line[2:])
		}
	}
	return steps
}

// scriptedUpstream is an upstream socket that plays a recorded session:
// each client message it reads must be the session's next, byte for byte,
// and is answered with the server messages recorded after it.
func scriptedUpstream(t *testing.T, steps []sessionStep) (url string, got <-chan []byte) {
	t.Helper()
	ch := make(chan []byte, len(steps)+1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for i := 0; ; i++ {
			_, msg, err := c.Read(r.Context())
			if err != nil {
				return
			}
			ch <- msg
			if i >= len(steps) || !bytes.Equal(msg, steps[i].client) {
				c.Close(websocket.StatusPolicyViolation, "not the recorded session")
				return
			}
			for _, m := range steps[i].server {
				if c.Write(r.Context(), websocket.MessageText, m) != nil {
					return
				}
			}
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL, ch
}

// TestSocketSessionRelaysEveryMessageByteForByte: a recorded Codex-shaped
// session relayed through the gateway reaches each side byte for byte and
// in order (an event type the gateway does not know, escapes and non-ASCII
// text, a client event it does not know included), and each turn is
// recorded with the usage its terminal event reports.
func TestSocketSessionRelaysEveryMessageByteForByte(t *testing.T) {
	steps := readSession(t, "testdata/socket_session.txt")
	url, got := scriptedUpstream(t, steps)
	tg := newTestGateway(t, url, func(c *config.Config) { c.Upstreams[0].ResponsesWebSocket = true })
	ctx, conn := openSocket(t, tg, "sk-caller")
	for i, s := range steps {
		if err := conn.SendRaw(ctx, json.RawMessage(s.client)); err != nil {
			t.Fatal(err)
		}
		if up := await(t, got, "the upstream's read"); !bytes.Equal(up, s.client) {
			t.Fatalf("step %d: the upstream got\n%s\nwant\n%s", i, up, s.client)
		}
		for j, want := range s.server {
			raw, err := conn.RecvRaw(ctx)
			if err != nil {
				t.Fatalf("step %d, message %d: %v", i, j, err)
			}
			if !bytes.Equal(raw, want) {
				t.Fatalf("step %d, message %d: the caller got\n%s\nwant\n%s", i, j, raw, want)
			}
		}
	}
	// Each turn's record is finished off the socket: they may come in
	// either order.
	want := map[int64]llm.Usage{5120: {Input: 5120, Output: 24, CacheRead: 4096}, 5160: {Input: 5160, Output: 9, CacheRead: 5120}}
	for range 2 {
		rec := tg.record(t)
		u, w := rec.Usage, want[rec.Usage.Input]
		if u.Input != w.Input || u.Output != w.Output || u.CacheRead != w.CacheRead || rec.Outcome != llm.OutcomeOK ||
			rec.Transport != llm.TransportWebSocket || rec.Model != "gpt-5.5" {
			t.Errorf("turn record: usage %+v outcome %s transport %s model %q", u, rec.Outcome, rec.Transport, rec.Model)
		}
		delete(want, u.Input)
	}
	select {
	case rec := <-tg.recCh:
		t.Errorf("a third record (%s) for a session of two turns", rec.Route)
	case <-time.After(50 * time.Millisecond):
	}
}

// TestSocketTurnsAreAdmittedAndBilledOneByOne: in mode "keys" each turn on
// a socket is admitted under the caller's limits and billed on its own. A
// turn past the key's RPM is refused with an error event carrying 429 and
// the bucket's retry-after (at the top, where Codex reads it, and in the
// error, the SDKs' type); nothing of it goes upstream, and the socket
// serves the next turn once the bucket refills. The gateway's own key goes
// upstream on the upgrade, and the ledger holds exactly the usage the
// caller saw on the terminal events.
func TestSocketTurnsAreAdmittedAndBilledOneByOne(t *testing.T) {
	w := newGovWorld(t, mockllm.Options{OutputTokens: 4}, true, func(c *config.Config) {
		c.Upstreams[0].ResponsesWebSocket = true
		c.Keys[0].RPM = i64(2)
	})
	ctx := testCtx(t)
	if _, err := connectSocket(t, ctx, w.tg, "sk-not-a-gateway-key"); err == nil {
		t.Fatal("a key the gateway does not know opened a socket")
	}
	conn, err := connectSocket(t, ctx, w.tg, keyAlpha)
	if err != nil {
		t.Fatal(err)
	}
	create := `{"type":"response.create","model":"gpt-test","input":"hi","store":false}`
	var in, out int64
	turn := func(i int) {
		events := sendTurn(t, ctx, conn, create)
		last := events[len(events)-1]
		if last.Type != "response.completed" {
			t.Fatalf("turn %d ended %s", i, last.Type)
		}
		in, out = in+last.Response.Usage.Input, out+last.Response.Usage.Output
		if rec := w.tg.record(t); rec.KeyID != "alpha" || rec.Team != "search" || rec.CostMicros == 0 {
			t.Errorf("turn %d: key %q team %q cost %d", i, rec.KeyID, rec.Team, rec.CostMicros)
		}
	}
	turn(0)
	turn(1)
	refused := sendTurn(t, ctx, conn, create)
	e := refused[0]
	if len(refused) != 1 || e.Type != "error" || e.Status != http.StatusTooManyRequests || e.Error.Code != "rate_limit_exceeded" ||
		e.Headers["retry-after"] != "30" || e.Error.Headers["retry-after"] != "30" {
		t.Fatalf("the third turn got %d events, first %+v; want one error event, 429, retry-after 30", len(refused), e)
	}
	if rec := w.tg.record(t); rec.Outcome != llm.OutcomeRejected || rec.Rejection != llm.RejectRPM ||
		rec.Status != http.StatusTooManyRequests || rec.AttemptCount != 0 {
		t.Errorf("refused turn: outcome %s rejection %s status %d attempts %d", rec.Outcome, rec.Rejection, rec.Status,
			rec.AttemptCount)
	}
	if n := w.mock.Stats().Requests; n != 2 {
		t.Errorf("%d turns reached the upstream, want 2", n)
	}
	w.clock.Advance(time.Minute)
	turn(3)

	rows, err := w.ledger.Query(ctx, spend.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	var lin, lout, reqs int64
	for _, r := range rows {
		lin, lout, reqs = lin+r.Input, lout+r.Output, reqs+r.Requests
	}
	if lin != in || lout != out || reqs != 3 || in == 0 {
		t.Errorf("ledger %d in / %d out over %d requests; the caller saw %d / %d over 3", lin, lout, reqs, in, out)
	}
}

// TestSocketTurnTheUpstreamBreaksEndsWithAnErrorEvent: an upstream socket
// that drops mid-turn ends the turn with an error event in the API's shape
// (upstream_stream_broken) and the caller's socket with 1011, so the SDKs
// and Codex reconnect; the turn is recorded as the upstream's failure with
// the tokens relayed before the cut.
func TestSocketTurnTheUpstreamBreaksEndsWithAnErrorEvent(t *testing.T) {
	m := mockllm.New(mockllm.Options{OutputTokens: 5, ITL: time.Millisecond})
	tg := socketGateway(t, m, nil)
	ctx, conn := openSocket(t, tg, "sk-caller")
	if err := m.Inject("disconnect=2", 1); err != nil {
		t.Fatal(err)
	}
	events := sendTurn(t, ctx, conn, socketCreate)
	last := events[len(events)-1]
	if last.Type != "error" || last.Error.Code != "upstream_stream_broken" || events[0].Type != "response.created" {
		t.Fatalf("%d events, from %s to %+v; want the stream's opening, then upstream_stream_broken", len(events),
			events[0].Type, last)
	}
	if _, err := conn.RecvRaw(ctx); websocket.CloseStatus(err) != websocket.StatusInternalError {
		t.Errorf("after the error event: %v; want the socket closed with 1011", err)
	}
	rec := tg.record(t)
	if rec.Outcome != llm.OutcomeUpstreamError || rec.Interruption != llm.InterruptUpstreamEOF || rec.TokenEvents != 2 ||
		rec.Status != http.StatusOK {
		t.Errorf("record: outcome %s interruption %s, %d token events, status %d", rec.Outcome, rec.Interruption,
			rec.TokenEvents, rec.Status)
	}
}

// TestSocketCallerThatLeavesMidTurnCancelsIt: a caller that closes its
// socket mid-turn ends the turn as its own cancel, with what was relayed,
// and the gateway closes its socket to the upstream, which stops
// generating.
func TestSocketCallerThatLeavesMidTurnCancelsIt(t *testing.T) {
	m := mockllm.New(mockllm.Options{OutputTokens: 50, ITL: 20 * time.Millisecond})
	tg := socketGateway(t, m, nil)
	ctx, conn := openSocket(t, tg, "sk-caller")
	if err := conn.SendRaw(ctx, json.RawMessage(socketCreate)); err != nil {
		t.Fatal(err)
	}
	for range 5 { // created, in_progress, item and part added, a token
		if _, err := conn.RecvRaw(ctx); err != nil {
			t.Fatal(err)
		}
	}
	_ = conn.Close()
	rec := tg.record(t)
	if rec.Outcome != llm.OutcomeClientCancel || rec.Transport != llm.TransportWebSocket || rec.TokenEvents == 0 ||
		rec.TokenEvents >= 50 {
		t.Errorf("record: outcome %s transport %s, %d token events", rec.Outcome, rec.Transport, rec.TokenEvents)
	}
	if err := m.WaitCanceled(ctx, 1); err != nil {
		t.Errorf("the upstream went on generating: %v", err)
	}
}

// TestSocketMessageOverTheBodyLimitClosesWith1009: a client message larger
// than max_body_bytes closes the caller's socket with 1009 (message too
// big), as a body that size is refused over HTTP; nothing goes upstream.
func TestSocketMessageOverTheBodyLimitClosesWith1009(t *testing.T) {
	m := mockllm.New(mockllm.Options{})
	tg := socketGateway(t, m, func(c *config.Config) { c.Server.MaxBodyBytes = 4 << 10 })
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	c, _, err := websocket.Dial(ctx, tg.URL+"/v1/responses", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	big := `{"type":"response.create","model":"gpt-4.1","input":"` + strings.Repeat("x", 8<<10) + `"}`
	if err := c.Write(ctx, websocket.MessageText, []byte(big)); err != nil {
		t.Fatal(err)
	}
	_, _, err = c.Read(ctx)
	if st := websocket.CloseStatus(err); st != websocket.StatusMessageTooBig {
		t.Errorf("read after a message over the limit: %v (status %d); want 1009", err, st)
	}
	if n := m.Stats().Requests; n != 0 {
		t.Errorf("%d turns reached the upstream", n)
	}
}

// TestSocketAnswersPingsOnBothLegs: the gateway answers the caller's pings
// (the Python SDK sends one every 20 s and closes without a pong) and the
// upstream's, while the legs are otherwise silent.
func TestSocketAnswersPingsOnBothLegs(t *testing.T) {
	pinged := make(chan error, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		go func() {
			ctx, cancel := context.WithTimeout(r.Context(), testWait)
			defer cancel()
			pinged <- c.Ping(ctx)
		}()
		for {
			if _, _, err := c.Read(r.Context()); err != nil {
				return
			}
		}
	}))
	defer up.Close()
	tg := newTestGateway(t, up.URL, func(c *config.Config) { c.Upstreams[0].ResponsesWebSocket = true })
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	c, _, err := websocket.Dial(ctx, tg.URL+"/v1/responses", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	readCtx := c.CloseRead(ctx)
	if err := c.Ping(ctx); err != nil {
		t.Errorf("the caller's ping: %v", err)
	}
	if err := await(t, pinged, "the upstream's ping"); err != nil {
		t.Errorf("the upstream's ping: %v", err)
	}
	c.Close(websocket.StatusNormalClosure, "")
	<-readCtx.Done()
}

// TestSocketStoredResponsesAreTheTeams: in mode "keys" a response a turn
// on a socket creates (store true) is its team's, as one a POST creates:
// another team can neither read it over HTTP nor chain onto it over a
// socket (an error event, 404 previous_response_not_found, with nothing
// sent upstream), while its own team chains onto it on the same socket.
func TestSocketStoredResponsesAreTheTeams(t *testing.T) {
	mock, up := storedMock(t)
	tg := newTestGatewayWith(t, up, func(c *config.Config) {
		c.Auth.Mode = "keys"
		c.Upstreams[0].APIKeyEnv, c.Upstreams[0].APIKey = "UPSTREAM_KEY", upstreamKey
		c.Upstreams[0].ResponsesWebSocket = true
		c.Teams = []config.Team{{Name: "search"}, {Name: "ads"}}
		c.Keys = []config.Key{{Name: "alpha", SHA256: sha(keyAlpha), Team: "search"},
			{Name: "beta", SHA256: sha(keyBeta), Team: "ads"}}
	}, nil)
	ctx := testCtx(t)
	alpha, err := connectSocket(t, ctx, tg, keyAlpha)
	if err != nil {
		t.Fatal(err)
	}
	events := sendTurn(t, ctx, alpha, `{"type":"response.create","model":"gpt-test","input":"keep this","store":true}`)
	id := events[0].Response.ID
	if events[len(events)-1].Type != "response.completed" || id == "" {
		t.Fatalf("stored turn: %d events, first %+v", len(events), events[0])
	}
	_, err = storedClient(tg, keyBeta).Responses.Get(ctx, id, responses.ResponseGetParams{})
	wantNotFound(t, "another team's GET of a socket's response", err, "", mock, "GET", "/v1/responses/"+id)

	beta, err := connectSocket(t, ctx, tg, keyBeta)
	if err != nil {
		t.Fatal(err)
	}
	before := mock.Stats().Requests
	chain := `{"type":"response.create","model":"gpt-test","input":"more","store":true,"previous_response_id":"` + id + `"}`
	refused := sendTurn(t, ctx, beta, chain)
	if e := refused[0]; len(refused) != 1 || e.Type != "error" || e.Status != http.StatusNotFound ||
		e.Error.Code != "previous_response_not_found" {
		t.Errorf("another team's chain: %d events, first %+v", len(refused), refused[0])
	}
	if n := mock.Stats().Requests - before; n != 0 {
		t.Errorf("another team's chain reached the upstream %d times", n)
	}
	own := sendTurn(t, ctx, alpha, chain)
	if last := own[len(own)-1]; last.Type != "response.completed" {
		t.Errorf("own chain ended %+v", last)
	}
}

// TestSocketTurnPastATimeoutIsCut: a turn whose first token does not come
// within first_token_timeout, or whose events stop for idle_timeout after
// it, is cut as an SSE stream is: the caller gets an error event
// (upstream_timeout) and its socket closes 1011 (the socket cannot stop
// one turn upstream), and the record says which timeout.
func TestSocketTurnPastATimeoutIsCut(t *testing.T) {
	for _, c := range []struct {
		name   string
		mock   mockllm.Options
		edit   func(*config.Upstream)
		result string
		why    llm.Interruption
	}{
		{"first token", mockllm.Options{TTFT: 10 * time.Second},
			func(u *config.Upstream) { u.FirstTokenTimeoutSeconds = 0.1 }, resultFirstTokenTimeout, llm.InterruptTimeout},
		{"idle", mockllm.Options{OutputTokens: 3, ITL: 10 * time.Second},
			func(u *config.Upstream) { u.IdleTimeoutSeconds = 0.1 }, resultIdleTimeout, llm.InterruptIdleTimeout},
	} {
		t.Run(c.name, func(t *testing.T) {
			tg := socketGateway(t, mockllm.New(c.mock), func(cfg *config.Config) { c.edit(&cfg.Upstreams[0]) })
			ctx, conn := openSocket(t, tg, "sk-caller")
			events := sendTurn(t, ctx, conn, socketCreate)
			if last := events[len(events)-1]; last.Type != "error" || last.Error.Code != "upstream_timeout" || last.Status != 504 {
				t.Fatalf("the turn ended %+v; want an upstream_timeout error event", last)
			}
			if _, err := conn.RecvRaw(ctx); websocket.CloseStatus(err) != websocket.StatusInternalError {
				t.Errorf("after the error event: %v; want 1011", err)
			}
			rec := tg.record(t)
			if rec.Outcome != llm.OutcomeUpstreamTimeout || rec.Interruption != c.why || rec.AttemptCount != 1 ||
				rec.Attempts[0].Result != c.result {
				t.Errorf("record: outcome %s interruption %s attempts %v", rec.Outcome, rec.Interruption, attemptList(rec))
			}
		})
	}
}

// TestSocketsCloseGoingAwayOnShutdown: CloseSockets closes an idle socket
// at once with 1001 (going away, on which clients reconnect), lets a turn
// in flight finish first, and refuses nothing it has not started.
func TestSocketsCloseGoingAwayOnShutdown(t *testing.T) {
	m := mockllm.New(mockllm.Options{OutputTokens: 3, ITL: 50 * time.Millisecond})
	tg := socketGateway(t, m, nil)
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	idle, err := connectSocket(t, ctx, tg, "sk-caller")
	if err != nil {
		t.Fatal(err)
	}
	busy, err := connectSocket(t, ctx, tg, "sk-caller")
	if err != nil {
		t.Fatal(err)
	}
	if err := busy.SendRaw(ctx, json.RawMessage(socketCreate)); err != nil {
		t.Fatal(err)
	}
	if _, err := busy.RecvRaw(ctx); err != nil { // the turn is in flight
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- tg.gw.CloseSockets(ctx) }()
	if _, err := idle.RecvRaw(ctx); websocket.CloseStatus(err) != websocket.StatusGoingAway {
		t.Errorf("the idle socket: %v; want 1001", err)
	}
	var last socketEvent
	for {
		raw, err := busy.RecvRaw(ctx)
		if err != nil {
			if websocket.CloseStatus(err) != websocket.StatusGoingAway {
				t.Errorf("the busy socket after its turn: %v; want 1001", err)
			}
			break
		}
		_ = json.Unmarshal(raw, &last)
	}
	if last.Type != "response.completed" {
		t.Errorf("the turn in flight ended %q before its socket closed; want response.completed", last.Type)
	}
	if err := await(t, closed, "CloseSockets"); err != nil {
		t.Errorf("CloseSockets: %v", err)
	}
	if rec := tg.record(t); rec.Outcome != llm.OutcomeOK {
		t.Errorf("the turn in flight: %s", rec.Outcome)
	}
}

// TestSocketMeasurementAccuracy holds a WebSocket turn's figures to the
// mock's schedule with TestMeasurementAccuracy's bounds and reasons: TTFT
// between the configured TTFT and the moment the client reads the second
// token, TPOT and the mean ITL between what the mock could have sent and
// what the client had read (checkTokenGaps), the upstream's token count
// exactly.
func TestSocketMeasurementAccuracy(t *testing.T) {
	const (
		ttft   = 150 * time.Millisecond
		itl    = 25 * time.Millisecond
		tokens = 21
	)
	tg := socketGateway(t, mockllm.New(mockllm.Options{TTFT: ttft, ITL: itl, OutputTokens: tokens}), nil)
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	c, _, err := websocket.Dial(ctx, tg.URL+"/v1/responses", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	start := time.Now()
	create := `{"type":"response.create","model":"m","max_output_tokens":1000,"input":"hello there","store":false}`
	if err := c.Write(ctx, websocket.MessageText, []byte(create)); err != nil {
		t.Fatal(err)
	}
	var clientTTFT, clientSecond, clientLast time.Duration
	last := []byte(`"delta":" tok` + strconv.Itoa(tokens) + `"`)
	for {
		_, msg, err := c.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if clientLast == 0 && bytes.Contains(msg, last) {
			clientLast = time.Since(start)
		}
		switch {
		case clientTTFT == 0 && bytes.Contains(msg, []byte(`"delta":" tok1"`)):
			clientTTFT = time.Since(start)
		case clientSecond == 0 && bytes.Contains(msg, []byte(`"delta":" tok2"`)):
			clientSecond = time.Since(start)
		}
		if bytes.Contains(msg, []byte(`"type":"response.completed"`)) {
			break
		}
	}
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
	if rec.Usage.Output != tokens || rec.Estimated || !rec.Usage.HasInput {
		t.Errorf("usage %+v estimated %v; want %d output tokens from the upstream", rec.Usage, rec.Estimated, tokens)
	}
	if rec.Overhead() <= 0 || rec.Overhead() > rec.E2E() {
		t.Errorf("overhead %v not within (0, E2E %v]", rec.Overhead(), rec.E2E())
	}
}

// TestSocketChainsFromWhatItMadeUnstored: in mode "keys" a turn may chain
// from a response an earlier turn on the same socket made with store
// false, as Codex chains its turn from its prewarm: the upstream holds it
// in that connection's cache alone. Another socket, the same key's
// included, may not: the id was never recorded as anyone's.
func TestSocketChainsFromWhatItMadeUnstored(t *testing.T) {
	mock, up := storedMock(t)
	tg := newTestGatewayWith(t, up, func(c *config.Config) {
		c.Auth.Mode = "keys"
		c.Upstreams[0].APIKeyEnv, c.Upstreams[0].APIKey = "UPSTREAM_KEY", upstreamKey
		c.Upstreams[0].ResponsesWebSocket = true
		withTwoTeams(c)
	}, nil)
	ctx := testCtx(t)
	conn, err := connectSocket(t, ctx, tg, keyAlpha)
	if err != nil {
		t.Fatal(err)
	}
	warm := sendTurn(t, ctx, conn, `{"type":"response.create","model":"gpt-test","input":"hi","store":false,"generate":false}`)
	id := warm[0].Response.ID
	if warm[len(warm)-1].Type != "response.completed" || id == "" {
		t.Fatalf("warm-up: %+v", warm[len(warm)-1])
	}
	chain := `{"type":"response.create","model":"gpt-test","input":"go","store":false,"previous_response_id":"` + id + `"}`
	if got := sendTurn(t, ctx, conn, chain); got[len(got)-1].Type != "response.completed" {
		t.Errorf("chaining from the socket's own unstored response: %+v", got[len(got)-1])
	}
	other, err := connectSocket(t, ctx, tg, keyAlpha)
	if err != nil {
		t.Fatal(err)
	}
	before := mock.Stats().Requests
	if got := sendTurn(t, ctx, other, chain); got[0].Type != "error" || got[0].Status != http.StatusNotFound {
		t.Errorf("another socket chaining from it: %+v", got[0])
	}
	if n := mock.Stats().Requests - before; n != 0 {
		t.Errorf("the other socket's chain reached the upstream %d times", n)
	}
}
