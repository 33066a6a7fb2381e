package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/internal/jsonscan"
	"github.com/tollgate-llm/tollgate/llm"
)

// The Responses API's WebSocket mode (GET /v1/responses with Upgrade:
// websocket; wire.md §10): one socket carries many turns, each a
// response.create client event answered by the events a POST /v1/responses
// stream carries, one JSON object per text message. The gateway joins the
// caller's socket to one of its own to an upstream that speaks it
// (responses_websocket) and relays every message the moment it is read,
// either way; each response.create is one exchange (socketturn.go), with its
// own record, admission and bill. The socket itself is not a request: its
// upgrade is counted in websocket_connections_total, and refused (before the
// 101) with an ordinary HTTP error in the Responses API's shape.
//
// The library is github.com/coder/websocket: context-aware, it answers pings
// on both legs while the pumps read, reassembles fragmented messages, bounds
// message sizes, and is what the official Go SDK's Responses WebSocket
// client is built on.

// responsesGet serves GET /v1/responses: a WebSocket upgrade, or else a
// forwarded GET.
func (g *Gateway) responsesGet(w http.ResponseWriter, r *http.Request) {
	if isSocketUpgrade(r) {
		g.serveSocket(w, r)
		return
	}
	g.forwardHandler(w, r)
}

// isSocketUpgrade reports whether r asks to open a WebSocket.
func isSocketUpgrade(r *http.Request) bool {
	return r.Method == http.MethodGet && strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
}

// socket is one caller's WebSocket joined to the gateway's own to an
// upstream. The caller's messages are read by serveSocket's goroutine
// (clientPump), the upstream's by another (upstreamPump); writes on either
// leg may come from both, which the library allows.
type socket struct {
	g   *Gateway
	gen *generation
	r   *http.Request // the upgrade, its context the socket's
	// key: the keys the upgrade carried, hashed once when it opened;
	// they identify each turn again, under its configuration.
	key    presented
	up     *upstream
	client *websocket.Conn
	conn   *websocket.Conn // to the upstream
	// callerKeyUp: the caller's key went upstream on the upgrade.
	callerKeyUp bool
	// strict: the caller is metered (mode "keys", or a [[keys]] entry):
	// only client events the gateway knows go upstream (clientPump).
	strict bool
	// lanes holds the turns in flight per stream_id ("" the default lane),
	// oldest first: the upstream answers each lane's turns in order.
	// turnsEnded is set once upstreamPump, the only goroutine that touches
	// a turn in flight, has ended them: no turn is queued after.
	// turnsEndedBy is why they ended.
	mu           sync.Mutex
	lanes        map[string][]*turn
	turnsEnded   bool
	turnsEndedBy error
	// madeIDs are the last responses the socket's turns created (made).
	madeIDs []string
	// named is set once a turn names a lane (stream_id): until then every
	// event is the default lane's, and not searched for one.
	named atomic.Bool
	// upgradeHeaders are the headers of the upstream's 101.
	upgradeHeaders http.Header
	// watchdog fires at the earliest deadline of the turns in flight (see
	// watch); cutCtx is cancelled, with the timeout's error, when one is
	// missed. away: the gateway closes the socket (closeWhenIdle), once
	// no turn is in flight; nil until then.
	watchdog *time.Timer
	// graceClose closes the caller's leg of a cut socket (check).
	graceClose *time.Timer
	cutCtx     context.Context
	cut        context.CancelCauseFunc
	away       *goingAway
	// ended is set by the first pump to see the socket end. cancel ends
	// the pumps' context; cancelTurns the turns' (s.r's, a parent of the
	// pumps'), only when the caller left, so that a turn the upstream
	// broke is not taken for one its caller gave up on.
	ended       atomic.Bool
	cancel      context.CancelCauseFunc
	cancelTurns context.CancelCauseFunc
}

// Why a socket ended, as the cause of its context.
var (
	errClientClosed   = errors.New("proxy: the caller closed the socket")
	errUpstreamClosed = errors.New("proxy: the upstream closed the socket")
)

// serveSocket opens the socket's two legs and relays between them until
// either ends. Refusals before the 101 are HTTP errors in the Responses
// API's shape: a missing or unknown key (401), no upstream that speaks the
// WebSocket mode (426, on which Codex and the SDKs use HTTP at once), the
// upstream's own refusal (relayed), an unreachable upstream (502).
func (g *Gateway) serveSocket(w http.ResponseWriter, r *http.Request) {
	g.open.Add(1)
	defer g.open.Add(-1)
	// The generation is held while the socket opens (its keys, upstream
	// and limits); once open, it is no request: each turn holds the
	// generation it runs under, and an idle socket keeps no reload's
	// requests-begun-before-it from ending.
	gen := g.begin()
	held := true
	release := func() {
		if held {
			held = false
			gen.end()
		}
	}
	defer release()
	s := &socket{g: g, gen: gen, lanes: map[string][]*turn{}}
	if e, result := s.identify(r); e != nil {
		g.metrics.Socket(result)
		writeError(w, llm.DialectResponses, requestIDFrom(r.Context()), e)
		return
	}
	turnCtx, cancelTurns := context.WithCancelCause(r.Context())
	defer cancelTurns(nil)
	ctx, cancel := context.WithCancelCause(turnCtx)
	defer cancel(nil)
	s.cancel, s.cancelTurns, s.r = cancel, cancelTurns, r.WithContext(turnCtx)
	s.cutCtx, s.cut = context.WithCancelCause(context.Background())
	defer s.cut(nil)
	resp, e, result := s.dial(ctx, r)
	if e != nil || resp != nil {
		g.metrics.Socket(result)
		if resp != nil { // the upstream's own refusal, as it came
			relayRefusal(w, resp, gen.gov.keysMode)
			return
		}
		writeError(w, llm.DialectResponses, requestIDFrom(r.Context()), e)
		return
	}
	defer s.conn.CloseNow()
	copyUpgradeHeaders(w.Header(), s.upgradeHeaders, gen.gov.keysMode)
	// The library's origin check stays on: a page in a browser may open a
	// socket to the gateway only from the gateway's own host.
	client, err := websocket.Accept(w, r, nil)
	if err != nil {
		g.metrics.Socket("bad_request") // Accept answered it
		return
	}
	s.client = client
	defer client.CloseNow()
	if !g.sockets.add(s) { // the gateway closed its sockets meanwhile
		g.metrics.Socket("shutting_down")
		s.goAway(awayShutdown)
		return
	}
	defer g.sockets.remove(s)
	if !slices.Contains(g.gen.Load().upstreams, s.up) {
		// A reload replaced the upstream while this socket dialled it, and
		// its scan (reconfigured) ran before the socket was added.
		go s.closeWhenIdle(awayReload)
	}
	g.metrics.Socket("accepted")
	open := g.metrics.SocketsOpen()
	open.Inc()
	defer open.Dec()
	client.SetReadLimit(int64(gen.cfg.Server.MaxBodyBytes))
	s.conn.SetReadLimit(int64(gen.cfg.Server.MaxEventBytes))
	release()
	// The pumps read and write without a deadline context: the library
	// arms one per frame for a context that can end (an allocation each).
	// The socket's end is theirs instead: when its context ends (the
	// gateway cut it, or it ended), both legs close, which ends the pumps.
	stop := context.AfterFunc(ctx, func() {
		s.stopWatchdog()
		if s.ended.Load() {
			return // end or goAway closes the legs, each with its status
		}
		if errors.Is(context.Cause(ctx), ErrShutdown) {
			s.goAway(awayShutdown) // 1001 to the caller, as the docs promise; bounded by the library
			return
		}
		_ = s.client.CloseNow()
		_ = s.conn.CloseNow()
	})
	defer stop()
	frames := context.WithoutCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.upstreamPump(frames)
	}()
	s.clientPump(frames)
	<-done
	s.mu.Lock()
	if s.graceClose != nil {
		s.graceClose.Stop()
	}
	s.mu.Unlock()
}

// identify checks the keys the upgrade carries as a POST's are checked
// (governance.identify): in mode "keys" the key must be one of the
// gateway's; with require_key, present.
func (s *socket) identify(r *http.Request) (*apiError, string) {
	s.key = readKeys(r.Header)
	c, k, aerr := s.gen.gov.identify(s.key)
	if aerr != nil {
		return aerr, "unauthorized"
	}
	s.callerKeyUp = c.present && !s.gen.gov.keysMode
	s.strict = s.gen.gov.keysMode || k != nil
	return nil, ""
}

// errSocketUnsupported answers an upgrade no upstream of the gateway can
// take.
func errSocketUnsupported() *apiError {
	return &apiError{Status: http.StatusUpgradeRequired, Kind: "invalid_request_error", Code: "websocket_not_supported",
		Msg: "no upstream of this gateway speaks the Responses API's WebSocket mode; use HTTP: POST /v1/responses"}
}

// dial opens the gateway's socket to the first upstream of the Responses
// API's route that speaks the WebSocket mode and accepts the upgrade,
// passing over one whose breaker refuses requests while another does not.
// It returns the upstream's response when it refused the upgrade (relayed
// as it came), or the gateway's error, or neither once s.conn is open.
func (s *socket) dial(ctx context.Context, r *http.Request) (*http.Response, *apiError, string) {
	targets := s.gen.routing.targets(llm.DialectOpenAI, "")
	var tried bool
	skipped := make([]bool, len(targets))
	for pass := 0; pass < 2; pass++ { // the second pass takes breakers that refuse
		for i, t := range targets {
			up := t.up
			switch {
			case !up.cfg.ResponsesWebSocket:
				continue
			case s.callerKeyUp && !config.CallerKeyMayGo(targets[0].up.origin, up.origin, up.cfg.CallerKeysOnFallback):
				continue // a caller's key goes only where its route starts
			case pass == 0 && up.breaker != nil:
				if _, refused := up.breaker.refusing(); refused {
					skipped[i] = true
					continue
				}
			case pass == 1 && !skipped[i]:
				continue // tried on the first pass already
			}
			tried = true
			resp, err := s.dialUpstream(ctx, r, up)
			switch {
			case err == nil:
				s.up = up
				return nil, nil, ""
			case resp != nil:
				return resp, nil, "upstream_refused"
			case ctx.Err() != nil:
				return nil, errUpstreamUnreachable(), "upstream_unreachable"
			}
			s.g.log.Warn("upstream WebSocket unreachable", "request_id", requestIDFrom(r.Context()),
				"upstream", up.cfg.Name, "err", err)
		}
		if !tried {
			return nil, errSocketUnsupported(), "unsupported"
		}
	}
	return nil, errUpstreamUnreachable(), "upstream_unreachable"
}

// dialUpstream opens the socket to up with the caller's headers (less
// hop-by-hop and WebSocket handshake headers, which each leg negotiates on
// its own) and, unless the caller's key goes upstream, up's own key. On a
// refused upgrade the response is returned with its body (at most 1 KiB,
// all the library keeps).
func (s *socket) dialUpstream(ctx context.Context, r *http.Request, up *upstream) (*http.Response, error) {
	h := upstreamRequestHeaders(r.Header)
	for k := range h {
		if strings.HasPrefix(k, "Sec-Websocket-") {
			delete(h, k)
		}
	}
	h.Set(requestIDHeader, requestIDFrom(r.Context()))
	if !s.callerKeyUp {
		h.Del("Authorization")
		h.Del("X-Api-Key")
		if s.gen.gov.keysMode {
			h.Del("Openai-Organization")
			h.Del("Openai-Project")
		}
		if k := up.cfg.APIKey.Reveal(); k != "" {
			setUpstreamKey(h, llm.DialectResponses, k)
		}
	}
	u := up.cfg.URL(r.URL.EscapedPath())
	if r.URL.RawQuery != "" {
		u += "?" + r.URL.RawQuery
	}
	dctx, cancel := context.WithTimeout(ctx, socketDialWait(up))
	defer cancel()
	conn, resp, err := websocket.Dial(dctx, u, &websocket.DialOptions{HTTPClient: socketClient(up), HTTPHeader: h})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			return resp, err
		}
		return nil, err
	}
	s.conn = conn
	s.upgradeHeaders = resp.Header
	return nil, nil
}

// socketDialWait bounds opening the socket to up: its connect timeout, and
// its header timeout for the 101 (or, that one off, its attempt timeout).
func socketDialWait(up *upstream) time.Duration {
	wait := up.headerTimeout
	if wait <= 0 {
		wait = up.timeout
	}
	if wait <= 0 {
		wait = time.Minute
	}
	return connectTimeout(up) + wait
}

// connectTimeout is up's bound on dialling and the TLS handshake.
func connectTimeout(up *upstream) time.Duration { return config.Seconds(up.cfg.ConnectTimeoutSeconds) }

// socketClient is the HTTP/1.1 client a socket to up is dialled with (an
// upgrade cannot ride an HTTP/2 connection): one connection per socket,
// dialled within up's connect timeout.
func socketClient(up *upstream) *http.Client {
	d := &net.Dialer{Timeout: connectTimeout(up), KeepAlive: 30 * time.Second}
	return &http.Client{Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, DialContext: d.DialContext,
		TLSHandshakeTimeout: connectTimeout(up), DisableCompression: true, MaxIdleConns: -1}}
}

// relayRefusal sends the caller the upstream's refusal of the upgrade: its
// status, headers and the part of its body the library kept.
func relayRefusal(w http.ResponseWriter, resp *http.Response, keysMode bool) {
	copyResponseHeaders(w.Header(), resp.Header)
	if keysMode {
		deleteUpstreamAccountHeaders(w.Header(), true)
	}
	w.WriteHeader(resp.StatusCode)
	if resp.Body != nil {
		_, _ = io.Copy(w, io.LimitReader(resp.Body, 1<<10))
	}
}

// copyUpgradeHeaders puts the headers of the upstream's 101 (Codex reads
// x-codex-turn-state, x-models-etag, openai-model, x-reasoning-included
// there) on the caller's, less hop-by-hop and handshake headers; in mode
// "keys", less the upstream account's rate-limit headers too.
func copyUpgradeHeaders(dst, src http.Header, keysMode bool) {
	copyResponseHeaders(dst, src)
	for k := range dst {
		if strings.HasPrefix(k, "Sec-Websocket-") {
			delete(dst, k)
		}
	}
	if keysMode {
		deleteUpstreamAccountHeaders(dst, true)
	}
}

// clientPump reads the caller's messages until the socket ends: each
// response.create starts a turn (socketturn.go), every other message goes
// upstream untouched. When the caller closes, the upstream leg is closed
// with the caller's status.
func (s *socket) clientPump(ctx context.Context) {
	for {
		typ, msg, err := s.client.Read(ctx)
		if err != nil {
			s.end(errClientClosed, s.conn, err)
			return
		}
		if typ != websocket.MessageText { // the API's client events are JSON text
			_ = s.client.Close(websocket.StatusUnsupportedData, "client events are JSON text messages")
			continue
		}
		event, ok := clientEvent(msg)
		if ok && event == "response.create" {
			s.create(ctx, msg)
			continue
		}
		if s.strict && !(ok && forwardedEvent(event)) {
			s.refuseEvent(ctx, event)
			continue
		}
		if err := s.conn.Write(ctx, typ, msg); err != nil {
			s.end(errUpstreamClosed, s.client, err)
			return
		}
	}
}

// upstreamPump reads the upstream's messages until the socket ends, each
// relayed at once, through the turn it belongs to when there is one.
// The turns in flight end here too, on this goroutine: those the
// upstream left unfinished before the caller's leg is closed (each gets an
// error event), those of a caller that left after its leg ended.
func (s *socket) upstreamPump(ctx context.Context) {
	for {
		var bp *[]byte
		typ, msg, err := readMessage(ctx, s.conn, func() []byte {
			bp = s.g.bufPool.Get().(*[]byte) // only once a message comes: an idle socket holds none
			return (*bp)[:0]
		})
		if err != nil {
			if bp != nil {
				s.g.bufPool.Put(bp)
			}
			if s.ended.Load() { // the caller left, or the gateway shuts down
				s.endTurns(errClientClosed, nil)
				return
			}
			s.endTurns(errUpstreamClosed, err)
			s.end(errUpstreamClosed, s.client, err)
			return
		}
		readAt := s.g.now()
		ok := true
		if typ == websocket.MessageText {
			ok = s.relay(ctx, msg, readAt)
		} else {
			ok = s.client.Write(ctx, typ, msg) == nil
		}
		s.g.bufPool.Put(bp) // a message that outgrew it grew a copy, dropped
		if !ok {
			s.end(errClientClosed, s.conn, nil)
			s.endTurns(errClientClosed, nil)
			return
		}
	}
}

// readMessage reads c's next message into the buffer buf returns once it
// begins, growing it (a copy) for a message larger than its capacity, up
// to the connection's read limit.
func readMessage(ctx context.Context, c *websocket.Conn, buffer func() []byte) (websocket.MessageType, []byte, error) {
	typ, r, err := c.Reader(ctx)
	if err != nil {
		return 0, nil, err
	}
	buf := buffer()
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		switch {
		case err == io.EOF:
			return typ, buf, nil
		case err != nil:
			return 0, nil, err
		}
	}
}

// end ends the socket once, with why: the other leg (other) is closed with
// the status the ending leg gave (err), or 1011 when it gave none (1000
// for a caller that left, 1001 when the gateway shuts down), which ends
// the pump reading it.
func (s *socket) end(why error, other *websocket.Conn, err error) {
	if !s.ended.CompareAndSwap(false, true) {
		return
	}
	if why == errClientClosed {
		s.cancelTurns(why)
	}
	code, reason := websocket.StatusInternalError, "the other side of the gateway's socket ended"
	var ce websocket.CloseError
	switch {
	case errors.Is(context.Cause(s.r.Context()), ErrShutdown):
		code, reason = websocket.StatusGoingAway, "the gateway is shutting down"
	case errors.As(err, &ce) && ce.Code != websocket.StatusNoStatusRcvd && ce.Code != websocket.StatusAbnormalClosure:
		code, reason = ce.Code, ce.Reason
	case why == errClientClosed:
		code, reason = websocket.StatusNormalClosure, ""
	}
	_ = other.Close(code, reason) // bounded by the library: 5 s to write, 5 s for the peer's
	s.cancel(why)
}

// watch arms the watchdog for the turns in flight at the earliest of their
// deadlines (turn.deadline). The socket has no way to stop one turn
// upstream, so a missed deadline cuts the socket, as a stuck stream cuts
// its connection: the turns in flight end as timed out, with an error
// event, and the caller's socket closes 1011. Called with mu held.
func (s *socket) watch(now time.Time) {
	var next time.Time
	for _, q := range s.lanes {
		if len(q) > 0 {
			if d := q[0].deadline(s.up); !d.IsZero() && (next.IsZero() || d.Before(next)) {
				next = d
			}
		}
	}
	if next.IsZero() {
		return
	}
	wait := max(next.Sub(now), time.Millisecond)
	if s.watchdog == nil {
		s.watchdog = time.AfterFunc(wait, s.check)
		return
	}
	s.watchdog.Reset(wait)
}

// check runs when the watchdog fires: it cuts the socket when a turn in
// flight is past a deadline, and otherwise arms the watchdog again.
func (s *socket) check() {
	now := s.g.now()
	s.mu.Lock()
	var cause error
	for _, q := range s.lanes {
		if len(q) > 0 {
			if d := q[0].deadline(s.up); !d.IsZero() && !now.Before(d) {
				cause = q[0].missed(s.up)
			}
		}
	}
	if cause == nil {
		s.watch(now)
	}
	s.mu.Unlock()
	if cause != nil {
		s.cut(cause)
		_ = s.conn.CloseNow() // upstreamPump ends the turns, then the socket
		// A caller that stopped reading holds upstreamPump in a write:
		// its leg goes too, after a grace for the turns' error events.
		s.mu.Lock()
		s.graceClose = time.AfterFunc(socketGrace, func() { _ = s.client.CloseNow() })
		s.mu.Unlock()
	}
}

// stopWatchdog stops the watchdog once the socket has ended.
func (s *socket) stopWatchdog() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.watchdog != nil {
		s.watchdog.Stop()
	}
}

// socketGrace is how long a socket a missed deadline cut waits for its
// caller to read the turns' error events before its leg is closed too.
const socketGrace = 5 * time.Second

// errSocketsClosed ends the sockets the gateway closes for a shutdown.
var errSocketsClosed = errors.New("proxy: the gateway is closing its sockets")

// socketSet is the gateway's open sockets.
type socketSet struct {
	mu      sync.Mutex
	open    map[*socket]struct{}
	closing bool
	empty   chan struct{} // closed when closing and none is open
}

// add registers s; false once the set is closing.
func (ss *socketSet) add(s *socket) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.closing {
		return false
	}
	if ss.open == nil {
		ss.open = map[*socket]struct{}{}
	}
	ss.open[s] = struct{}{}
	return true
}

// remove forgets s once it has ended.
func (ss *socketSet) remove(s *socket) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	delete(ss.open, s)
	if ss.closing && len(ss.open) == 0 && ss.empty != nil {
		close(ss.empty)
		ss.empty = nil
	}
}

// CloseSockets closes the gateway's Responses WebSockets, which the HTTP
// server no longer tracks once upgraded, for a shutdown: each closes with
// 1001 (going away; the SDKs and Codex reconnect, to another replica) as
// soon as no turn is in flight on it, and a socket opened after it is
// closed 1001 at once (its upstream leg was dialled already). It
// returns once every socket has closed, or with ctx's error; cancelling
// the requests' base context with ErrShutdown then cuts those left.
func (g *Gateway) CloseSockets(ctx context.Context) error {
	ss := &g.sockets
	ss.mu.Lock()
	ss.closing = true
	if len(ss.open) == 0 {
		ss.mu.Unlock()
		return nil
	}
	if ss.empty == nil {
		ss.empty = make(chan struct{})
	}
	empty := ss.empty
	open := make([]*socket, 0, len(ss.open))
	for s := range ss.open {
		open = append(open, s)
	}
	ss.mu.Unlock()
	for _, s := range open {
		go s.closeWhenIdle(awayShutdown) // a close handshake may wait 5 s on a silent peer
	}
	select {
	case <-empty:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// reconfigured closes, each once no turn is in flight on it, the sockets
// whose upstream is not among ups, the upstreams of the configuration a
// reload swapped in: their upstream was changed (its address, key,
// timeouts) or removed, and a socket would otherwise stay on it for as
// long as its caller keeps it (up to the API's 60 minutes). The caller's
// next turn goes on a new socket, dialled as the configuration now says.
// It returns how many it closes.
func (ss *socketSet) reconfigured(ups []*upstream) int {
	ss.mu.Lock()
	var moved []*socket
	for s := range ss.open {
		if !slices.Contains(ups, s.up) {
			moved = append(moved, s)
		}
	}
	ss.mu.Unlock()
	for _, s := range moved {
		go s.closeWhenIdle(awayReload)
	}
	return len(moved)
}

// goingAway is why the gateway closes a socket between turns, and what
// its caller's leg is told. The SDKs' reconnect and Codex take either
// status as "open a new socket".
type goingAway struct {
	status websocket.StatusCode
	reason string
}

var (
	// awayShutdown: the gateway shuts down (CloseSockets, or its drain
	// cut the socket), so the caller reconnects, to another replica.
	awayShutdown = goingAway{websocket.StatusGoingAway, "the gateway is shutting down; reconnect"}
	// awayReload: a reload changed or removed the socket's upstream
	// (reconfigured).
	awayReload = goingAway{websocket.StatusServiceRestart, "the gateway's upstream for this socket was reconfigured; reconnect"}
)

// closeWhenIdle closes the socket now, for why, if no turn is in flight,
// or else marks it to close when its last turn ends (relay). The first
// reason given is the one the caller is told.
func (s *socket) closeWhenIdle(why goingAway) {
	s.mu.Lock()
	if s.away == nil {
		s.away = &why
	}
	idle, away := len(s.lanes) == 0, *s.away
	s.mu.Unlock()
	if idle {
		s.goAway(away)
	}
}

// goAway closes a socket with no turn in flight: the caller with why's
// status, the upstream with 1000.
func (s *socket) goAway(why goingAway) {
	if !s.ended.CompareAndSwap(false, true) {
		return
	}
	s.cancelTurns(errSocketsClosed)
	_ = s.client.Close(why.status, why.reason)
	_ = s.conn.Close(websocket.StatusNormalClosure, "")
	s.cancel(errSocketsClosed)
}

// forwardedEvent reports whether a metered caller's client event other
// than response.create goes upstream: those that make no response of their
// own. response.steer does not: a steered response is followed upstream by
// a successor no response.create asked for, which the gateway could
// neither admit nor bill.
func forwardedEvent(typ string) bool {
	return typ == "response.processed" || typ == "response.inject"
}

// refuseEvent answers a metered caller's client event that does not go
// upstream (forwardedEvent) with an error event; the socket stays open.
func (s *socket) refuseEvent(ctx context.Context, typ string) {
	msg := "this gateway meters every response: only response.create, response.processed and response.inject " +
		"go upstream, each a JSON object with one \"type\""
	if typ == "response.steer" {
		msg = "response.steer is not supported through this gateway: a steered response's successor could not be metered"
	}
	b := []byte(`{"type":"error","status":400,"error":{"type":"invalid_request_error","code":"unsupported_client_event","message":`)
	b = jsonscan.AppendString(b, msg)
	b = append(b, `,"param":"type"}}`...)
	_ = s.client.Write(ctx, websocket.MessageText, b)
}
