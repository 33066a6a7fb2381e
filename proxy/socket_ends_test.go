package proxy

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/ratelimit"
)

// TestSocketDrainTimeoutCutClosesGoingAway: the drain timeout's cut (ErrShutdown) mid-turn.
func TestSocketDrainTimeoutCutClosesGoingAway(t *testing.T) {
	m := mockllm.New(mockllm.Options{OutputTokens: 100, ITL: 50 * time.Millisecond})
	up := httptest.NewServer(m)
	t.Cleanup(up.Close)
	tg := newTestGateway(t, up.URL, func(c *config.Config) { c.Upstreams[0].ResponsesWebSocket = true })
	base, shutdown := context.WithCancelCause(context.Background())
	defer shutdown(nil)
	srv := httptest.NewUnstartedServer(tg.gw.Handler())
	srv.Config.BaseContext = func(net.Listener) context.Context { return base }
	srv.Start()
	t.Cleanup(srv.Close)
	ctx := testCtx(t)
	c := dialGW(t, ctx, srv.URL, "sk-caller")
	writeAll(ctx, c, socketCreate)
	for range 5 {
		if _, _, err := c.Read(ctx); err != nil {
			t.Fatal(err)
		}
	}
	shutdown(ErrShutdown)
	var err error
	var msgs []string
	for {
		var msg []byte
		if _, msg, err = c.Read(ctx); err != nil {
			break
		}
		msgs = append(msgs, string(msg))
	}
	rec := tg.record(t)
	t.Logf("caller: %d more messages (last %s), then %v (status %d)", len(msgs), last(msgs), err, websocket.CloseStatus(err))
	t.Logf("record: outcome %s interruption %s", rec.Outcome, rec.Interruption)
	if websocket.CloseStatus(err) != websocket.StatusGoingAway {
		t.Errorf("the drain timeout's cut closed the caller with %d, not 1001", websocket.CloseStatus(err))
	}
	if rec.Outcome != llm.OutcomeShutdown {
		t.Errorf("record outcome %s, want %s", rec.Outcome, llm.OutcomeShutdown)
	}
}

// CloseSockets while a create waits in admission

type gateLimiter struct {
	ratelimit.Limiter
	arrived, release chan struct{}
	once             sync.Once
}

func (g *gateLimiter) Admit(ctx context.Context, req ratelimit.Request) (ratelimit.Decision, error) {
	g.once.Do(func() {
		close(g.arrived)
		<-g.release
	})
	return g.Limiter.Admit(ctx, req)
}

func TestSocketClosedDuringAdmissionIsAShutdown(t *testing.T) {
	up := newFakeWS()
	answerCreates(up)
	gl := &gateLimiter{Limiter: ratelimit.NewLocal(ratelimit.LocalOptions{}), arrived: make(chan struct{}), release: make(chan struct{})}
	w := newGovWorldWith(t, mockllm.Options{}, false, func(c *config.Config) {
		c.Upstreams[0].ResponsesWebSocket = true
		c.Keys[0].RPM = i64(100)
	}, govSetup{limiter: gl, upstream: func(http.Handler) http.Handler { return up }})
	ctx := testCtx(t)
	c := dialGW(t, ctx, w.tg.URL, keyAlpha)
	writeAll(ctx, c, `{"type":"response.create","model":"gpt-test","input":"hi","store":false}`)
	<-gl.arrived
	closed := make(chan error, 1)
	go func() { closed <- w.tg.gw.CloseSockets(ctx) }()
	time.Sleep(100 * time.Millisecond)
	close(gl.release)
	var msgs []string
	var err error
	for {
		var msg []byte
		if _, msg, err = c.Read(ctx); err != nil {
			break
		}
		msgs = append(msgs, string(msg))
	}
	rec := w.tg.record(t)
	t.Logf("caller: %v then %v; record: outcome %s status %d", msgs, websocket.CloseStatus(err), rec.Outcome, rec.Status)
	if rec.Outcome == llm.OutcomeClientCancel {
		t.Errorf("a turn the gateway's shutdown ended is recorded as the caller's cancel")
	}
	await(t, closed, "CloseSockets")
}

// TestSocketUpstreamEndingsAreRecorded: upstream-ended turns: error before output, failed, incomplete.
func TestSocketUpstreamEndingsAreRecorded(t *testing.T) {
	cases := []struct {
		name string
		evs  []string
	}{
		{"error 429 first", []string{`{"type":"error","status":429,"error":{"type":"tokens","code":"rate_limit_exceeded","message":"slow down"},"headers":{"retry-after":"5"}}`}},
		{"failed", []string{
			`{"type":"response.created","sequence_number":0,"response":{"id":"resp_f","status":"in_progress","output":[],"usage":null}}`,
			`{"type":"response.failed","sequence_number":1,"response":{"id":"resp_f","status":"failed","error":{"code":"server_error","message":"boom"},"output":[],"usage":{"input_tokens":7,"output_tokens":0,"total_tokens":7}}}`}},
		{"incomplete", []string{
			`{"type":"response.created","sequence_number":0,"response":{"id":"resp_i","status":"in_progress","output":[],"usage":null}}`,
			`{"type":"response.output_text.delta","sequence_number":1,"item_id":"m","output_index":0,"content_index":0,"delta":"a"}`,
			`{"type":"response.incomplete","sequence_number":2,"response":{"id":"resp_i","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"output":[],"usage":{"input_tokens":7,"output_tokens":3,"total_tokens":10}}}`}},
		{"error status_code 503 mid-turn", []string{
			`{"type":"response.created","sequence_number":0,"response":{"id":"resp_e","status":"in_progress","output":[],"usage":null}}`,
			`{"type":"error","status_code":503,"error":{"type":"server_error","code":"server_overloaded","message":"x"}}`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			up := newFakeWS()
			up.onMsg = func(ctx context.Context, c *websocket.Conn, ev map[string]any, _ []byte) {
				if ev["type"] == "response.create" {
					writeAll(ctx, c, tc.evs...)
				}
			}
			w := keysGateway(t, up, nil)
			ctx := testCtx(t)
			c := dialGW(t, ctx, w.tg.URL, keyAlpha)
			writeAll(ctx, c, `{"type":"response.create","model":"gpt-test","input":"hi","store":false}`)
			got := readTurn(t, ctx, c)
			rec := w.tg.record(t)
			t.Logf("caller last %s", last(got))
			t.Logf("record: outcome %s status %d interruption %s error %q incomplete %q usage %+v cost %d attempts %v",
				rec.Outcome, rec.Status, rec.Interruption, rec.ErrorType, rec.IncompleteReason, rec.Usage, rec.CostMicros, attemptList(rec))
			// the socket must still serve the next turn
			up.onMsg = nil
			answerCreates(up)
			writeAll(ctx, c, `{"type":"response.create","model":"gpt-test","input":"hi","store":false}`)
			if l := last(readTurn(t, ctx, c)); !strings.Contains(l, "response.completed") {
				t.Errorf("next turn ended %s", l)
			}
			w.tg.record(t)
		})
	}
}

// TestSocketUpgradeNeverAnsweredIsBoundedAndDialledOnce: an upstream that
// accepts the connection and never answers the upgrade gets one dial, bounded
// by its connect and header timeouts (1.3 s here): the caller gets a 502
// long before the test's own deadline would end its wait.
func TestSocketUpgradeNeverAnsweredIsBoundedAndDialledOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	tg := newTestGateway(t, "http://"+ln.Addr().String(), func(c *config.Config) {
		c.Upstreams[0].ResponsesWebSocket = true
		c.Upstreams[0].HeaderTimeoutSeconds = 0.3
		c.Upstreams[0].ConnectTimeoutSeconds = 1
	})
	ctx := testCtx(t)
	_, resp, err := websocket.Dial(ctx, tg.URL+"/v1/responses", nil)
	if resp == nil || resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("upgrade to an upstream that never answers: %v; want the gateway's 502 within its dial bound", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(conns) != 1 {
		t.Errorf("the gateway opened %d connections to the upstream, want 1", len(conns))
	}
}

// TestSocketHandshakeHeadersStayOnTheirLeg: headers between the legs.
func TestSocketHandshakeHeadersStayOnTheirLeg(t *testing.T) {
	up := newFakeWS()
	w := keysGateway(t, up, nil)
	ctx := testCtx(t)
	h := http.Header{}
	h.Set("Authorization", "Bearer "+keyAlpha)
	h.Set("Sec-WebSocket-Protocol", "openai-insecure-api-key."+keyAlpha)
	h.Set("Openai-Organization", "org-caller")
	h.Set("X-Api-Key", keyAlpha)
	c, resp, err := websocket.Dial(ctx, w.tg.URL+"/v1/responses?api_key="+keyAlpha, &websocket.DialOptions{HTTPHeader: h,
		CompressionMode: websocket.CompressionContextTakeover})
	if err != nil {
		t.Logf("dial: %v", err)
	} else {
		defer c.CloseNow()
		t.Logf("101 to the caller: %v", resp.Header)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	for k, vv := range up.hdr {
		for _, v := range vv {
			if strings.Contains(v, keyAlpha) {
				t.Errorf("the caller's key reached the upstream in %s: %s", k, v)
			}
		}
	}
	t.Logf("upstream upgrade headers: %v", up.hdr)
}

// CloseSockets on idle sockets: 1001 every time?

// CloseSockets closes idle sockets one after another

// TestSocketEndsUnderStressLeaveNothingOpen: stress: turns racing the socket's end from either side.
func TestSocketEndsUnderStressLeaveNothingOpen(t *testing.T) {
	m := mockllm.New(mockllm.Options{OutputTokens: 8, ITL: 2 * time.Millisecond})
	up := httptest.NewServer(m)
	t.Cleanup(up.Close)
	tg := newTestGateway(t, up.URL, func(c *config.Config) {
		c.Upstreams[0].ResponsesWebSocket = true
		c.Upstreams[0].FirstTokenTimeoutSeconds = 0.05
	})
	ctx := testCtx(t)
	_ = m.Inject("disconnect=3", 15)
	_ = m.Inject("ttft=200ms", 10) // trips the first-token watchdog
	var wg sync.WaitGroup
	var sent, refusedSends int64
	var smu sync.Mutex
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, _, err := websocket.Dial(ctx, tg.URL+"/v1/responses", nil)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.CloseNow()
			rctx, rcancel := context.WithCancel(ctx)
			defer rcancel()
			go func() {
				for {
					if _, _, err := c.Read(rctx); err != nil {
						return
					}
				}
			}()
			n := 1 + i%4
			for j := range n {
				body := socketCreate
				if j%2 == 1 {
					body = strings.Replace(socketCreate, `"store":false`, `"store":false,"stream_id":"l`+string(rune('a'+j))+`"`, 1)
				}
				if c.Write(ctx, websocket.MessageText, []byte(body)) != nil {
					smu.Lock()
					refusedSends++
					smu.Unlock()
					break
				}
				smu.Lock()
				sent++
				smu.Unlock()
			}
			time.Sleep(time.Duration(i%7) * 3 * time.Millisecond)
			switch i % 3 {
			case 0:
				c.Close(websocket.StatusNormalClosure, "")
			case 1:
				c.CloseNow()
			default:
				time.Sleep(100 * time.Millisecond)
				c.Close(websocket.StatusNormalClosure, "")
			}
		}()
	}
	go func() {
		time.Sleep(40 * time.Millisecond)
		cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		_ = tg.gw.CloseSockets(cctx)
	}()
	wg.Wait()
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := tg.gw.Wait(wctx); err != nil {
		t.Errorf("Wait: %v", err)
	}
	waitFor(t, "the inflight gauge to drain", func() bool {
		return metricValue(t, tg, "tollgate_inflight_requests", map[string]string{"route": "responses"}) == 0
	})
	n0 := len(tg.recCh)
	t.Logf("at Wait's return: open %d, %d records", tg.gw.open.Load(), n0)
	time.Sleep(time.Second)
	outcomes := map[llm.Outcome]int{}
	n := len(tg.recCh)
	t.Logf("requests the mock counted: %d", m.Stats().Requests)
	for range n {
		outcomes[(<-tg.recCh).Outcome]++
	}
	t.Logf("sent %d creates (%d sends failed); %d records: %v; open sockets gauge %v", sent, refusedSends, n, outcomes,
		metricValue(t, tg, "tollgate_websocket_connections_open", nil))
}

// TestSocketTurnCutBeforeAnyEventGetsItsErrorEvent: an upstream message over max_event_bytes; a silent upstream.
func TestSocketTurnCutBeforeAnyEventGetsItsErrorEvent(t *testing.T) {
	up := newFakeWS() // reads the create, answers nothing
	tg := newTestGateway(t, serveUp(t, up), func(c *config.Config) {
		c.Upstreams[0].ResponsesWebSocket = true
		c.Upstreams[0].FirstTokenTimeoutSeconds = 0.2
	})
	ctx := testCtx(t)
	c := dialGW(t, ctx, tg.URL, "sk-caller")
	writeAll(ctx, c, socketCreate)
	var msgs []string
	var err error
	for {
		var m []byte
		if _, m, err = c.Read(ctx); err != nil {
			break
		}
		msgs = append(msgs, string(m))
	}
	rec := tg.record(t)
	t.Logf("caller: %v; closed %d", msgs, websocket.CloseStatus(err))
	t.Logf("record: outcome %s status %d interruption %s attempts %v", rec.Outcome, rec.Status, rec.Interruption, attemptList(rec))
	if len(msgs) == 0 {
		t.Errorf("a turn cut by first_token_timeout before any event got no upstream_timeout error event")
	}
}

// TestSocketCreateAfterTheUpstreamDroppedIsTheUpstreamsFailure: a create admitted just as the upstream drops.
func TestSocketCreateAfterTheUpstreamDroppedIsTheUpstreamsFailure(t *testing.T) {
	up := newFakeWS()
	drop := make(chan struct{})
	up.onMsg = func(ctx context.Context, c *websocket.Conn, ev map[string]any, _ []byte) {}
	gl := &gateLimiter{Limiter: ratelimit.NewLocal(ratelimit.LocalOptions{}), arrived: make(chan struct{}), release: make(chan struct{})}
	w := newGovWorldWith(t, mockllm.Options{}, false, func(c *config.Config) {
		c.Upstreams[0].ResponsesWebSocket = true
		c.Keys[0].RPM = i64(100)
	}, govSetup{limiter: gl, upstream: func(http.Handler) http.Handler {
		return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			cc, err := websocket.Accept(rw, r, nil)
			if err != nil {
				return
			}
			<-drop
			cc.CloseNow() // the upstream goes away
		})
	}})
	_ = up
	ctx := testCtx(t)
	c := dialGW(t, ctx, w.tg.URL, keyAlpha)
	writeAll(ctx, c, `{"type":"response.create","model":"gpt-test","input":"hi","store":false}`)
	<-gl.arrived
	close(drop)
	_, _, err := c.Read(ctx)
	t.Logf("caller: %v", err)
	close(gl.release)
	rec := w.tg.record(t)
	t.Logf("record: outcome %s status %d", rec.Outcome, rec.Status)
	if rec.Outcome == llm.OutcomeClientCancel {
		t.Errorf("a turn the upstream's drop ended is recorded as the caller's cancel")
	}
}

// an upgrade after CloseSockets

// TestSocketLeavesAReconfiguredUpstream: a reload that keeps a socket's
// upstream as it was leaves the socket open and serving, and its
// requests-begun-before-it end though the socket stays open (an idle socket
// is no request); a reload that changes the upstream closes each socket on
// it with 1012 once no turn is in flight (the turn in flight finishes
// whole first), and a new socket serves the next turn.
func TestSocketLeavesAReconfiguredUpstream(t *testing.T) {
	m := mockllm.New(mockllm.Options{OutputTokens: 3, ITL: 50 * time.Millisecond})
	tg := socketGateway(t, m, nil)
	reload := func(edit func(*config.Config)) <-chan struct{} {
		t.Helper()
		next := *tg.gw.Config()
		next.Upstreams = slices.Clone(next.Upstreams)
		edit(&next)
		ended, err := tg.gw.Reload(&next)
		if err != nil {
			t.Fatal(err)
		}
		return ended
	}
	ctx, idle := openSocket(t, tg, "sk-caller")
	busy, err := connectSocket(t, ctx, tg, "sk-caller")
	if err != nil {
		t.Fatal(err)
	}

	ended := reload(func(c *config.Config) { c.Log.Level = "warn" })
	await(t, ended, "the requests begun before a reload that kept the upstream, with an idle socket open")
	if evs := sendTurn(t, ctx, idle, socketCreate); evs[len(evs)-1].Type != "response.completed" {
		t.Fatalf("a turn after a reload that kept the upstream ended %q", evs[len(evs)-1].Type)
	}
	tg.record(t)

	if err := busy.SendRaw(ctx, json.RawMessage(socketCreate)); err != nil {
		t.Fatal(err)
	}
	if _, err := busy.RecvRaw(ctx); err != nil { // the turn is in flight
		t.Fatal(err)
	}
	reload(func(c *config.Config) { c.Upstreams[0].TimeoutSeconds++ })
	if _, err := idle.RecvRaw(ctx); websocket.CloseStatus(err) != websocket.StatusServiceRestart {
		t.Errorf("the idle socket after its upstream changed: %v; want 1012", err)
	}
	var last socketEvent
	for {
		raw, err := busy.RecvRaw(ctx)
		if err != nil {
			if websocket.CloseStatus(err) != websocket.StatusServiceRestart {
				t.Errorf("the busy socket after its turn: %v; want 1012", err)
			}
			break
		}
		_ = json.Unmarshal(raw, &last)
	}
	if last.Type != "response.completed" {
		t.Errorf("the turn in flight ended %q before its socket closed; want response.completed", last.Type)
	}
	if rec := tg.record(t); rec.Outcome != llm.OutcomeOK {
		t.Errorf("the turn in flight: %s", rec.Outcome)
	}
	_, next := openSocket(t, tg, "sk-caller")
	if evs := sendTurn(t, ctx, next, socketCreate); evs[len(evs)-1].Type != "response.completed" {
		t.Errorf("a turn on a new socket after the reload ended %q", evs[len(evs)-1].Type)
	}
	tg.record(t)
}
