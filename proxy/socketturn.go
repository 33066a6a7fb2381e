package proxy

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/tollgate-llm/tollgate/internal/jsonscan"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/sseparse"
)

// A turn is one response.create on a socket (socket.go): an exchange of
// route responses, transport websocket, with its own record. It meets the
// checks a POST /v1/responses meets after its body is read (checkTurn:
// inspection, stored-object ownership, conversation, admission); a refusal
// is an error event in the API's shape, and the socket stays open. An
// admitted turn goes upstream on the socket's own connection as one attempt
// (no retry: the upstream's socket holds the turn's state), and the events
// the upstream answers on its lane are its own until its terminal event
// (response.completed, .failed or .incomplete) or an error event: each is
// timed by the tap, written to the caller at once, and ends the turn there.

// turn is a response.create in flight on a socket.
type turn struct {
	s    *socket
	ex   *exchange
	at   attemptState
	st   *streamState
	ev   sseparse.Event // the tap's view of the event in hand
	lane string
	// start is when the turn went upstream; events counts those relayed.
	// lastEvent (unix nanoseconds) and tokenSeen are read by the
	// watchdog (socket.check) too.
	start  time.Time
	events int
	// headAt is when the turn became the first of its lane, which the
	// upstream answers first: its timeouts run from there (under
	// socket.mu).
	headAt    time.Time
	lastEvent atomic.Int64
	tokenSeen atomic.Bool
	// claim records the new stored response as the caller's (mode
	// "keys"); claimSeen: its answer is in. withheld: the response is
	// another team's, and the rest of its events are dropped.
	claim     *storedClaim
	claimSeen bool
	withheld  bool
}

// create starts a turn for the response.create msg: checked and, when
// admitted, queued on its lane and sent upstream.
func (s *socket) create(ctx context.Context, msg []byte) {
	g := s.g
	gen := g.begin()
	tw := &turnWriter{c: s.client, ctx: ctx, h: http.Header{}}
	if validStreamID(msg) { // the gateway's error events name the turn's lane
		tw.lane = string(streamID(msg))
	}
	ex := g.newExchange(gen, tw, s.r, llm.RouteResponses,
		llm.DialectResponses, nil, newRequestID())
	inflight := g.metrics.Inflight(llm.RouteResponses)
	inflight.Inc()
	msg, rf := ex.checkTurn(msg, s.key, s.madeHere)
	if !rf.ok() {
		ex.refuse(rf)
		s.finish(ex, gen, inflight)
		return
	}
	t := &turn{s: s, ex: ex, lane: string(streamID(msg))}
	t.at = attemptState{up: s.up, callerKeyUp: s.callerKeyUp}
	t.at.claim, t.at.link = ex.claims(), ex.linksResponse()
	frame := ex.bodyFor(&t.at, socketTarget(ex.targets(ex.rec.Model), s.up), msg)
	t.st = g.getStreamState()
	t.st.tap.Reset(llm.DialectResponses)
	if t.lane != "" {
		s.named.Store(true)
	}
	// Once queued, the turn is upstreamPump's: its start and the moment
	// its request goes (handed to the socket, a write's time before it is
	// written) are set first.
	t.start = g.now()
	t.at.learned.sent = t.start
	s.mu.Lock()
	if s.turnsEnded { // upstreamPump has ended the turns: none is queued after
		s.mu.Unlock()
		g.putStreamState(t.st)
		if s.turnsEndedBy == errUpstreamClosed {
			ex.fail(errUpstreamFailed(), llm.OutcomeUpstreamError)
		} else {
			ex.clientGone()
		}
		s.finish(ex, gen, inflight)
		return
	}
	if len(s.lanes[t.lane]) == 0 {
		t.headAt = t.start
	}
	s.lanes[t.lane] = append(s.lanes[t.lane], t)
	s.watch(t.start)
	s.mu.Unlock()
	if err := s.conn.Write(ctx, websocket.MessageText, frame); err != nil {
		s.end(errUpstreamClosed, s.client, err)
	}
}

// socketTarget is the route's target on up, the socket's upstream, for a
// turn's model (its rename); up as it is when the route does not list it.
func socketTarget(targets []target, up *upstream) target {
	for _, t := range targets {
		if t.up == up {
			return t
		}
	}
	return target{up: up}
}

// successor makes a turn of a response no response.create asked for:
// after response.steer, the upstream ends the steered response
// (incomplete, reason steered) and creates its successor on the same lane
// by itself. Only a caller the gateway does not meter may steer
// (clientPump), so the successor is measured and recorded, and billed to
// the socket's key, without admission. nil when msg is not a
// response.created; called on upstreamPump's goroutine.
func (s *socket) successor(ctx context.Context, msg []byte, lane string, at time.Time) *turn {
	if typ, _ := clientEvent(msg); typ != "response.created" {
		return nil
	}
	g := s.g
	gen := g.begin()
	tw := &turnWriter{c: s.client, ctx: ctx, h: http.Header{}, lane: lane}
	ex := g.newExchange(gen, tw, s.r, llm.RouteResponses, llm.DialectResponses, nil, newRequestID())
	ex.followTurn(s.key, responseModel(msg))
	g.metrics.Inflight(llm.RouteResponses).Inc()
	t := &turn{s: s, ex: ex, lane: lane, start: at, headAt: at}
	t.at = attemptState{up: s.up, callerKeyUp: s.callerKeyUp}
	t.at.learned.sent = at
	t.st = g.getStreamState()
	t.st.tap.Reset(llm.DialectResponses)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lanes[lane] = append(s.lanes[lane], t) // endTurns, which empties lanes, runs on this goroutine, after
	s.watch(at)
	return t
}

// responseModel is the model a response.created names ("" for none).
func responseModel(msg []byte) string {
	obj, ok := jsonscan.Value(msg)
	if !ok {
		return ""
	}
	r, ok := jsonscan.Get(obj, "response")
	if !ok {
		return ""
	}
	m, ok := jsonscan.Get(r, "model")
	if !ok {
		return ""
	}
	s, _ := jsonscan.String(m)
	return string(s)
}

// relay writes one upstream event (msg, read at readAt) to the caller,
// through the turn of its lane when one is in flight; false when the caller
// is gone.
func (s *socket) relay(ctx context.Context, msg []byte, readAt time.Time) bool {
	var lane []byte
	if s.named.Load() {
		lane = streamID(msg)
	}
	s.mu.Lock()
	var t *turn
	if q := s.lanes[string(lane)]; len(q) > 0 {
		t = q[0]
	}
	s.mu.Unlock()
	if t == nil && !s.strict {
		t = s.successor(ctx, msg, string(lane), readAt)
	}
	if t == nil { // not a turn's: a connection-level event
		return s.client.Write(ctx, websocket.MessageText, msg) == nil
	}
	ok, done := t.event(msg, readAt)
	if done || !ok {
		s.pop(t)
		t.end(s, nil, !ok)
		s.mu.Lock()
		away := s.away
		idle := away != nil && len(s.lanes) == 0
		s.mu.Unlock()
		if idle {
			s.goAway(*away)
		}
	}
	return ok
}

// deadline is when the turn is late: its first token first_token_timeout
// after it became its lane's first, then each event idle_timeout after the
// last, the whole turn timeout_seconds after it became first; zero when up
// sets none. Called with socket.mu held.
func (t *turn) deadline(up *upstream) time.Time {
	d, _ := t.due(up)
	return d
}

// missed names the deadline the turn missed (see deadline).
func (t *turn) missed(up *upstream) error {
	_, why := t.due(up)
	return why
}

// due is the turn's earliest deadline and the timeout it stands for.
func (t *turn) due(up *upstream) (time.Time, error) {
	var at time.Time
	var why error
	take := func(d time.Time, e error) {
		if at.IsZero() || d.Before(at) {
			at, why = d, e
		}
	}
	if up.timeout > 0 {
		take(t.headAt.Add(up.timeout), errAttemptTimeout)
	}
	switch {
	case !t.tokenSeen.Load() && up.firstToken > 0:
		take(t.headAt.Add(up.firstToken), errFirstTokenTimeout)
	case t.tokenSeen.Load() && up.idle > 0:
		take(time.Unix(0, t.lastEvent.Load()).Add(up.idle), errIdleTimeout)
	}
	return at, why
}

// pop takes t, ended, off its lane.
func (s *socket) pop(t *turn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.lanes[t.lane]
	for i, u := range q {
		if u == t {
			s.lanes[t.lane] = append(q[:i:i], q[i+1:]...)
			break
		}
	}
	if next := s.lanes[t.lane]; len(next) == 0 {
		delete(s.lanes, t.lane)
	} else if next[0].headAt.IsZero() {
		next[0].headAt = s.g.now()
		s.watch(next[0].headAt)
	}
}

// event relays one of the turn's events: observed by the tap, its new
// response claimed for the caller's team, written. ok is false when the
// caller is gone; done when the event ends the turn.
func (t *turn) event(msg []byte, readAt time.Time) (ok, done bool) {
	ex := t.ex
	if t.events == 0 {
		t.at.learned.firstByte = readAt
		ex.servedBy(http.StatusOK)
		if ex.kind.caller() {
			t.st.itl = itlTee{metrics: ex.g.metrics, sink: ex.g.stats, route: ex.rec.Route, model: ex.modelLabel}
			t.st.tap.ITL = &t.st.itl
		}
	}
	t.events++
	t.lastEvent.Store(readAt.UnixNano())
	t.ev.Data = msg
	obs := t.st.tap.Observe(&t.ev, readAt)
	if obs.TokenBearing && !t.tokenSeen.Load() {
		// From here the idle timeout applies, which may be sooner than
		// the deadline the watchdog is armed for.
		t.tokenSeen.Store(true)
		t.s.mu.Lock()
		t.s.watch(readAt)
		t.s.mu.Unlock()
	}
	done = t.st.tap.TerminalSeen() || obs.Error
	if t.conflict(obs) {
		t.withheld = true
		ex.writeHeader(http.StatusOK)
		ok = ex.write(storedConflictEvent) == nil
		return ok, done
	}
	if t.withheld {
		return true, done
	}
	if len(obs.ResponseID) > 0 { // the caller's to chain from on this socket
		t.s.made(t.st.tap.ResponseID())
	}
	if !ex.out.sent() {
		ex.writeHeader(eventStatus(msg, obs.Error))
	}
	if ex.write(msg) != nil {
		return false, true
	}
	now := ex.g.now()
	if obs.TokenBearing && t.at.learned.firstTokenOut.IsZero() {
		t.at.learned.firstTokenOut = now
	}
	t.at.learned.relayOverhead += now.Sub(readAt)
	t.at.lastFlush = now
	if t.st.itl.sink != nil {
		t.st.itl.drain()
	}
	t.at.terminalOut = done && !obs.Error
	return true, done
}

// conflict reports whether the response this event creates, or one whose
// claim was still in flight at an earlier event, is another team's (see
// relayLoop.conflict): the relay waits at most claimWait for its claim.
func (t *turn) conflict(obs *sseparse.Observation) bool {
	switch {
	case t.withheld:
		return false
	case t.claim != nil:
		if !t.claim.deferred || t.claimSeen {
			return false
		}
		conflict, seen := t.claim.result()
		t.claimSeen = seen
		return conflict
	case (t.at.claim != storedNone || t.at.link) && len(obs.ResponseID) > 0:
		t.claim = t.ex.claimStream(&t.at, string(t.st.tap.ResponseID()))
		conflict, _ := t.claim.result()
		return conflict
	}
	return false
}

// storedConflictEvent ends a turn whose new response names one another
// team owns: nothing more of it reaches the caller.
var storedConflictEvent = []byte(`{"type":"error","status":502,"error":{"type":"server_error","code":"stored_id_conflict",` +
	`"message":"the upstream's response names a stored response another team owns; it was withheld","param":null}}`)

// eventStatus is the status a turn's first event stands for: an error
// event's own (status, or status_code as Codex also reads it), else 200.
func eventStatus(msg []byte, isError bool) int {
	if !isError {
		return http.StatusOK
	}
	if obj, ok := jsonscan.Value(msg); ok {
		for _, k := range []string{"status", "status_code"} {
			if v, ok := jsonscan.Get(obj, k); ok {
				if n, ok := jsonscan.Int(v); ok && n >= 400 && n <= 599 {
					return int(n)
				}
			}
		}
	}
	return http.StatusOK
}

// end ends the turn: the upstream's read error (readErr) or the caller's
// departure (gone) decide how, with what the tap read; the attempt goes on
// the trip and the record is finished off the socket's goroutines.
func (t *turn) end(s *socket, readErr error, gone bool) {
	ex := t.ex
	st := stop{stage: stageStream, ctx: s.cutCtx, err: readErr, terminalOut: t.at.terminalOut,
		errorEvent: t.st.tap.ErrorSeen(), conflict: t.withheld,
		tooLarge: errors.Is(readErr, websocket.ErrMessageTooBig)} // over max_event_bytes
	if gone {
		st.writeErr = errClientClosed
	}
	t.at.learned.form = formStream
	t.at.learned.tally, t.at.learned.tallied = t.st.tap.Summary(), true
	if st.errorEvent {
		st.errType = t.at.learned.tally.ErrorType
	}
	e := ex.classify(&t.at, st)
	ex.ended(e)
	ex.attempted(&t.at, t.start, ex.out.status, e.result, false)
	if t.claim != nil {
		ex.endClaim(t.claim)
	}
	ex.g.putStreamState(t.st)
	t.st = nil
	s.finish(ex, ex.gen, ex.g.metrics.Inflight(llm.RouteResponses))
}

// endTurns ends every turn in flight when the socket ends (why, with the
// ending leg's error err), on upstreamPump's goroutine: a turn the upstream
// left unfinished gets an error event first, while the caller is there to
// read it.
func (s *socket) endTurns(why, err error) {
	s.mu.Lock()
	lanes := s.lanes
	s.lanes, s.turnsEnded, s.turnsEndedBy = nil, true, why
	s.mu.Unlock()
	for _, q := range lanes {
		for _, t := range q {
			if why == errUpstreamClosed {
				if ev, status := socketBrokenEvent, http.StatusBadGateway; !t.withheld {
					if cutOf(s.cutCtx) != cutNone {
						ev, status = socketTimeoutEvent, http.StatusGatewayTimeout
					}
					if !t.ex.out.sent() {
						t.ex.writeHeader(status)
					}
					_ = t.ex.write(ev)
				}
				t.end(s, err, false)
				continue
			}
			t.end(s, nil, true)
		}
	}
}

// socketBrokenEvent ends a turn whose upstream socket closed before its
// terminal event, as an SSE stream cut there ends (streamErrorEvent).
var socketBrokenEvent = []byte(`{"type":"error","status":502,"error":{"type":"server_error","code":"upstream_stream_broken",` +
	`"message":"` + msgBroken + `","param":null}}`)

// socketTimeoutEvent ends a turn the watchdog cut (see socket.watch).
var socketTimeoutEvent = []byte(`{"type":"error","status":504,"error":{"type":"server_error","code":"upstream_timeout",` +
	`"message":"` + msgTimedOut + `","param":null}}`)

// finish finishes a turn's exchange off the socket's goroutines (settling
// its lease may wait on Redis), counted open so that Gateway.Wait waits
// for its bill.
func (s *socket) finish(ex *exchange, gen *generation, inflight interface{ Dec() }) {
	g := s.g
	g.open.Add(1)
	go func() {
		defer g.open.Add(-1)
		defer gen.end()
		defer inflight.Dec()
		ex.finish()
	}()
}

// clientEvent returns a client event's type (its escapes decoded); ok is
// false unless the message is a JSON object with exactly one key that any
// JSON decoder could take for "type" (case aside: Go's, for one, matches
// keys without case), whose value is a string. Another reading of the
// same message must not find a create the gateway did not.
func clientEvent(msg []byte) (typ string, ok bool) {
	it := jsonscan.Object(msg)
	var n int
	var v []byte
	var key [8]byte
	for it.Next() {
		k := it.Key()
		if bytes.IndexByte(k, '\\') >= 0 {
			k = jsonscan.AppendUnescape(key[:0], k)
		}
		if bytes.EqualFold(k, []byte("type")) {
			n++
			v = it.Value()
		}
	}
	if it.Err() != nil || n != 1 {
		return "", false
	}
	s, ok := jsonscan.String(v)
	if !ok {
		return "", false
	}
	if bytes.IndexByte(s, '\\') >= 0 {
		s = jsonscan.AppendUnescape(nil, s)
	}
	return string(s), true
}

// validStreamID reports whether a create's stream_id, when it names one, is
// what the API accepts (1-256 of letters, digits, _ - .; wire.md §10.4),
// written without escapes: the lane the gateway files the turn under must be
// the one the upstream's events name.
func validStreamID(msg []byte) bool {
	obj, ok := jsonscan.Value(msg)
	if !ok {
		return false
	}
	v, ok := jsonscan.Get(obj, "stream_id")
	if !ok {
		return true
	}
	s, ok := jsonscan.String(v)
	if !ok || len(s) == 0 || len(s) > 256 {
		return false
	}
	for _, c := range s {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// streamID returns the lane (stream_id) an event names, nil for the
// default lane.
func streamID(msg []byte) []byte {
	obj, ok := jsonscan.Value(msg)
	if !ok {
		return nil
	}
	v, ok := jsonscan.Get(obj, "stream_id")
	if !ok {
		return nil
	}
	s, _ := jsonscan.String(v)
	return s
}

// turnWriter is a turn's answer as the exchange writes it (respond.go):
// each Write is one text message on the caller's socket. An error the
// gateway writes (status 400 or more, a {"error":{...}} body) goes as the
// socket's error event: {"type":"error","status":N,"error":{...}}, with its
// Retry-After, x-should-retry and rate-limit headers under "headers", at
// the top (Codex reads them there) and in the error (the SDKs' type). An
// upstream's error event goes as it came.
type turnWriter struct {
	c      *websocket.Conn
	ctx    context.Context
	h      http.Header
	status int
	// lane is the turn's stream_id, "" on the default lane: the gateway's
	// own error events carry it, as the upstream's do.
	lane string
}

func (tw *turnWriter) Header() http.Header { return tw.h }

func (tw *turnWriter) WriteHeader(status int) { tw.status = status }

func (tw *turnWriter) Write(p []byte) (int, error) {
	// Only an error may need rewriting: the relayed events of a turn that
	// is going well are not parsed again here.
	if tw.status >= 400 || tw.lane != "" && bytes.HasPrefix(p, errorEventStart) {
		typ, _ := clientEvent(p)
		switch {
		case tw.status >= 400 && typ != "error":
			p = tw.errorEvent(p)
		case typ == "error" && tw.lane != "":
			p = tw.onLane(p)
		}
	}
	if err := tw.c.Write(tw.ctx, websocket.MessageText, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// errorEventStart opens every error event the gateway writes of its own
// (socketBrokenEvent, socketTimeoutEvent, storedConflictEvent).
var errorEventStart = []byte(`{"type":"error"`)

// onLane names the turn's lane in an error event that names none (the
// gateway's own: a stream broken or timed out, a conflict); one that names
// a lane (the upstream's) goes as it is.
func (tw *turnWriter) onLane(ev []byte) []byte {
	obj, ok := jsonscan.Value(ev)
	if !ok || len(obj) < 2 {
		return ev
	}
	if _, named := jsonscan.Get(obj, "stream_id"); named {
		return ev
	}
	b := append(make([]byte, 0, len(ev)+len(tw.lane)+16), `{"stream_id":`...)
	b = jsonscan.AppendString(b, tw.lane)
	b = append(b, ',')
	return append(b, obj[1:]...)
}

// errorEvent wraps the gateway's error body as the socket's error event.
func (tw *turnWriter) errorEvent(body []byte) []byte {
	b := append(make([]byte, 0, len(body)+128), `{"type":"error","status":`...)
	b = strconv.AppendInt(b, int64(tw.status), 10)
	if tw.lane != "" {
		b = append(b, `,"stream_id":`...)
		b = jsonscan.AppendString(b, tw.lane)
	}
	inner := []byte("null")
	if obj, ok := jsonscan.Value(body); ok {
		if e, ok := jsonscan.Get(obj, "error"); ok {
			inner = e
		}
	}
	hs := tw.headersJSON()
	b = append(b, `,"error":`...)
	if len(hs) > 0 && len(inner) > 1 && inner[len(inner)-1] == '}' {
		b = append(b, inner[:len(inner)-1]...)
		b = append(b, `,"headers":`...)
		b = append(b, hs...)
		b = append(b, '}')
	} else {
		b = append(b, inner...)
	}
	if len(hs) > 0 {
		b = append(b, `,"headers":`...)
		b = append(b, hs...)
	}
	return append(b, '}')
}

// headersJSON is the error's retry and rate-limit headers as a JSON object
// of lower-case names, nil when it has none.
func (tw *turnWriter) headersJSON() []byte {
	var names []string
	for k, vv := range tw.h {
		lk := strings.ToLower(k)
		if len(vv) > 0 && (lk == "retry-after" || lk == "x-should-retry" || strings.HasPrefix(lk, "x-ratelimit-")) {
			names = append(names, k)
		}
	}
	if len(names) == 0 {
		return nil
	}
	slices.Sort(names)
	b := []byte{'{'}
	for i, k := range names {
		if i > 0 {
			b = append(b, ',')
		}
		b = jsonscan.AppendString(b, strings.ToLower(k))
		b = append(b, ':')
		b = jsonscan.AppendString(b, tw.h[k][0])
	}
	return append(b, '}')
}

// madeKeep is how many of the responses a socket made it remembers: the
// upstream keeps each lane's latest in its connection-local cache.
const madeKeep = 16

// made remembers a response the socket's turns created (its id, the tap's
// buffer), so that a later turn may chain from it whether or not it was
// stored (madeHere).
func (s *socket) made(id []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.madeIDs) == madeKeep {
		s.madeIDs = append(s.madeIDs[:0], s.madeIDs[1:]...)
	}
	s.madeIDs = append(s.madeIDs, string(id))
}

// madeHere reports whether a turn on this socket created the response id.
func (s *socket) madeHere(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Contains(s.madeIDs, id)
}
