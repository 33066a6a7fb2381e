package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/metrics"
	"github.com/tollgate-llm/tollgate/sseparse"
)

// A stream starts on a pooled buffer of streamBufSize: a token event is a
// few hundred bytes, and a held stream keeps its buffer for as long as it
// is open, so this is most of what an open stream costs the relay. When it
// fills (opening events held back for a retry, or one large event such as a
// Responses stream's response.completed) the stream moves to a pooled
// buffer of relayBufSize, which also bounds the hold; an event larger than
// that grows a private buffer, up to max_event_bytes, dropped after the
// stream instead of going back to a pool.
const (
	streamBufSize = 4 << 10
	relayBufSize  = 32 << 10
)

// streamState is the per-stream parser state, pooled (per Gateway, since the
// framer carries the gateway's max_event_bytes) so that a stream costs no
// allocation for its framer and tap.
type streamState struct {
	fr  *sseparse.Framer
	tap sseparse.Tap
	itl itlTee
}

// itlTee sends each inter-token gap to the Prometheus histogram at once and
// keeps it for the live windows (when sink is set), which get the gaps of a
// read after its events are flushed (drain): the windows' lock is shared by
// every stream of a route and model, and waiting on it must not delay a
// token. The histogram's child is resolved at the first gap, once per
// stream, so a stream with fewer than two tokens creates no ITL series. It
// lives in the pooled streamState, so it costs no allocation per stream.
type itlTee struct {
	metrics *metrics.Metrics
	prom    llm.Observer // nil until the first gap
	sink    StatsSink
	route   llm.Route
	model   string
	n       int
	pending [64]time.Duration
}

// Observe takes a gap in seconds, as the tap reports it.
func (t *itlTee) Observe(v float64) {
	if t.prom == nil {
		t.prom = t.metrics.ITL(t.route, t.model)
	}
	t.prom.Observe(v)
	if t.sink == nil {
		return
	}
	if t.n == len(t.pending) { // a read of more than 64 token events
		t.drain()
	}
	t.pending[t.n] = time.Duration(v * float64(time.Second))
	t.n++
}

// drain hands the kept gaps to the live windows.
func (t *itlTee) drain() {
	if t.n > 0 {
		t.sink.ObserveITLs(t.route, t.model, t.pending[:t.n])
		t.n = 0
	}
}

func (g *Gateway) getStreamState() *streamState {
	if s, ok := g.states.Get().(*streamState); ok {
		s.fr.Reset()
		return s
	}
	return &streamState{fr: sseparse.NewFramer(g.gen.Load().cfg.Server.MaxEventBytes)}
}

func (g *Gateway) putStreamState(s *streamState) {
	s.tap.ITL = nil
	s.itl = itlTee{}
	g.states.Put(s)
}

// errEventTooLarge marks a stream cut because one event outgrew
// max_event_bytes.
var errEventTooLarge = errors.New("proxy: upstream event exceeds max_event_bytes")

// errIDConflict ends a committed stream whose response.created names a
// response another team owns (claimID): that event is not written.
var errIDConflict = errors.New("proxy: the stream names a stored response another team owns")

// maxHold bounds how long a stream's opening events are held back waiting
// for its first token (see relay).
const maxHold = 10 * time.Second

// terminalGrace is how long the relay keeps reading after the terminal
// marker has reached the caller, waiting for the upstream's end of body (so
// the connection can be reused) before it stops: a caller such as curl reads
// until the gateway ends the response.
const terminalGrace = time.Second

// relay forwards an SSE body event by event. Each read from the upstream is
// split into complete events by the framer; every complete event is written
// to the client unchanged and the batch is flushed once, so an event is never
// held back after its closing blank line has been read. The one exception is
// the usage-only chunk the gateway asked for on the caller's behalf, which is
// observed but not written.
//
// With hold set (another attempt could follow), the response headers and the
// events that carry no token are held back until the first token-bearing,
// usage or terminal event, so that an error event or a stall before the
// first token can still be retried elsewhere. The hold is bounded by one
// relay buffer and by maxHold (or the first-token timeout, if longer).
func (ex *exchange) relay(ctx context.Context, at *attemptState, resp *http.Response, hold bool, pt *phaseTimer) attemptResult {
	g := ex.g
	st := g.getStreamState()
	defer g.putStreamState(st)
	st.tap.Reset(ex.rec.Dialect)
	if ex.kind.caller() { // a probe's gaps are no user's figure
		st.itl = itlTee{metrics: g.metrics, sink: g.stats, route: ex.rec.Route, model: ex.modelLabel}
		st.tap.ITL = &st.itl
		defer st.itl.drain() // runs before putStreamState
	}
	sp := g.streamBufs.Get().(*[]byte)
	defer g.streamBufs.Put(sp)
	l := relayLoop{ex: ex, at: at, st: st, resp: resp, rc: *http.NewResponseController(ex.w), ctx: ctx,
		pt: pt, buf: *sp, suppress: at.suppressUsage}
	defer func() {
		if l.big != nil { // a private buffer grown past it is dropped
			g.bufPool.Put(l.big)
		}
		if l.claim != nil {
			ex.endClaim(l.claim)
		}
	}()
	if !hold {
		l.commit()
		// Send the headers now: a caller waiting for a slow first token
		// should see the stream open.
		if err := l.rc.Flush(); err != nil {
			return l.endStream(nil, err)
		}
	}
	l.holdStart, l.holdCap = g.now(), max(maxHold, at.up.firstToken)
	for {
		if res, done := l.step(); done {
			return res
		}
	}
}

// relayLoop is the state of one relayed stream, on the relay's stack.
type relayLoop struct {
	ex   *exchange
	at   *attemptState
	st   *streamState
	resp *http.Response
	rc   http.ResponseController // a value: a pointer would escape with the timer
	ctx  context.Context
	pt   *phaseTimer
	buf  []byte
	big  *[]byte // the pooled relayBufSize buffer, once the stream needed it
	// buf[start:end] is not yet written; the framer has consumed buf[:pos];
	// buf[start:writeEnd] holds complete events to write; buf[:heldEnd] are
	// the complete events held back while nothing is committed. The bytes
	// of an incomplete event stay in the buffer until it completes.
	start, pos, end, writeEnd, heldEnd int
	// committed: the headers went to the caller, the answer is its own.
	committed, firstOut, suppress bool
	// lfPending: the last block ended with a CR at the end of a read, so an
	// LF opening the next read is the rest of that CRLF (the framer swallows
	// it) and belongs to that block. prevWithheld: that block was the
	// withheld usage chunk.
	lfPending, prevWithheld bool
	holdStart               time.Time
	holdCap                 time.Duration
	// claim is the new response's owner and link being recorded
	// (claimStream), nil before response.created; claimSeen: the relay
	// has read the answer of a claim it went on without.
	claim     *storedClaim
	claimSeen bool
	// The events of the current read: how many were relayed, whether the
	// first token is among them, whether any bytes were written.
	events              int
	firstInBatch, wrote bool
}

// step reads once from the upstream and relays the read's complete events;
// done says the stream ended, and res how.
func (l *relayLoop) step() (res attemptResult, done bool) {
	g := l.ex.g
	if l.end == len(l.buf) {
		if res, done := l.makeRoom(); done {
			return res, true
		}
	}
	n, rerr := l.resp.Body.Read(l.buf[l.end:])
	now := g.now()
	l.end += n
	if n > 0 {
		l.pt.touchAt(now)
		if !l.committed && now.Sub(l.holdStart) >= l.holdCap {
			// Held long enough: let the upstream's keep-alives and pings
			// reach the caller (and its proxies) again.
			if err := l.commitHeld(now); err != nil {
				return l.endStream(nil, err), true
			}
		}
	}
	l.writeEnd = l.start
	if !l.committed {
		l.writeEnd = l.heldEnd // the held events come before this read's
	}
	l.joinCRLF()
	l.events, l.firstInBatch, l.wrote = 0, false, false
	for l.pos < l.end {
		res, done, more := l.event(now)
		if done {
			return res, true
		}
		if !more {
			break
		}
	}
	if err := l.flush(now, l.events, l.firstInBatch, l.wrote); err != nil {
		return l.endStream(nil, err), true
	}
	if l.start == l.end && l.committed { // nothing pending: offer the next read the whole buffer
		l.start, l.pos, l.end = 0, 0, 0
	}
	if rerr != nil {
		return l.readEnded(rerr), true
	}
	return attemptResult{}, false
}

// makeRoom frees the full buffer for the next read: the stream's first
// buffer gives way to a pooled relayBufSize one when it is full of held
// events or of one unfinished event; a preamble that fills that is
// committed rather than grown, a pending event moves to the front, and one
// event larger than the buffer grows a private one up to max_event_bytes.
func (l *relayLoop) makeRoom() (attemptResult, bool) {
	if l.big == nil && (!l.committed || l.start == 0) {
		// The stream's first buffer is full of held or unfinished events:
		// move to the larger pooled one, keeping the bytes where they are.
		l.big = l.ex.g.bufPool.Get().(*[]byte)
		copy(*l.big, l.buf[:l.end])
		l.buf = *l.big
		return attemptResult{}, false
	}
	if !l.committed {
		if err := l.commitHeld(l.ex.g.now()); err != nil {
			return l.endStream(nil, err), true
		}
	}
	if l.start > 0 {
		n := copy(l.buf, l.buf[l.start:l.end])
		l.pos -= l.start
		l.start, l.end = 0, n
		return attemptResult{}, false
	}
	maxEvent := l.ex.gen.cfg.Server.MaxEventBytes
	if len(l.buf) >= maxEvent+relayBufSize {
		return l.endStream(errEventTooLarge, nil), true
	}
	nb := make([]byte, min(2*len(l.buf), maxEvent+relayBufSize))
	copy(nb, l.buf[:l.end])
	l.buf = nb
	return attemptResult{}, false
}

// joinCRLF gives an LF that opens this read to the block the previous read
// ended with a CR.
func (l *relayLoop) joinCRLF() {
	if !l.lfPending || l.pos >= l.end {
		return
	}
	l.lfPending = false
	if l.buf[l.pos] == '\n' {
		if l.prevWithheld {
			l.start = l.pos + 1
		}
		l.writeEnd = l.pos + 1
		if !l.committed {
			l.heldEnd = l.pos + 1
		}
	}
}

// event frames the read's next event and observes it: relayed, held,
// withheld (the usage chunk the gateway asked for) or the end of a held
// stream. more is false when the read holds no complete event any more.
func (l *relayLoop) event(now time.Time) (res attemptResult, done, more bool) {
	ex := l.ex
	blockStart := l.writeEnd
	c, boundary, ferr := l.st.fr.Push(l.buf[l.pos:l.end])
	l.pos += c
	if ferr != nil {
		if !l.committed {
			return l.endHeld(stop{tooLarge: true}, l.buf[:l.heldEnd]), true, false
		}
		// Deliver the complete events before the oversized one.
		if err := l.flush(now, l.events, l.firstInBatch, l.wrote); err != nil {
			return l.endStream(nil, err), true, false
		}
		return l.endStream(errEventTooLarge, nil), true, false
	}
	if !boundary {
		return attemptResult{}, false, false
	}
	withheld := false
	if ev := l.st.fr.Event(); ev != nil {
		obs := l.st.tap.Observe(ev, now)
		ex.traceEvent(ev)
		if l.claimWatched() && l.conflict(obs) {
			return l.endConflict(now)
		}
		if !l.committed {
			switch {
			case obs.Error:
				return l.endHeld(stop{errorEvent: true, errType: string(obs.ErrorType)}, l.buf[:l.pos]), true, false
			case obs.TokenBearing || obs.UsageOnly || obs.Terminal:
				l.commit()
			}
		}
		switch {
		case l.suppress && obs.UsageOnly:
			withheld = true
		case obs.TokenBearing && !l.firstOut:
			l.firstOut, l.firstInBatch = true, true
			l.pt.firstToken()
			// The upstream answers: a long stream must not hold a
			// half-open probe slot to its end (a later break is still
			// counted, see attemptWith).
			l.at.tk.done(true)
			l.at.tkEarly = true
			l.events++
		default:
			l.events++
		}
	}
	if withheld {
		// Write what came before the withheld chunk, skip it.
		if blockStart > l.start {
			if err := ex.write(l.buf[l.start:blockStart]); err != nil {
				return l.endStream(nil, err), true, false
			}
			l.wrote = true
		}
		l.start = l.pos
	}
	l.writeEnd = l.pos
	if !l.committed {
		l.heldEnd = l.pos
	}
	l.prevWithheld = withheld
	l.lfPending = l.pos == l.end && l.buf[l.pos-1] == '\r'
	return attemptResult{}, false, true
}

// claimWatched reports whether the stream's events must be looked at for
// its new response's claim: one is still to start, or one the relay went
// on without has not answered yet. Small enough to inline, so a stream
// with no claim pays two compares per event.
func (l *relayLoop) claimWatched() bool {
	return l.at.claim != storedNone || l.at.link || l.claim != nil && l.claim.deferred && !l.claimSeen
}

// conflict reports whether the stream must end before the event obs
// describes because its new response is another team's. At
// response.created the response is claimed (claimStream: before the event
// is written, the caller must not hold the id of a response its team does
// not own yet); a claim the relay went on without is asked again at each
// later event, without waiting.
func (l *relayLoop) conflict(obs *sseparse.Observation) bool {
	ex := l.ex
	if l.claim != nil {
		if !l.claim.deferred || l.claimSeen {
			return false
		}
		conflict, ok := l.claim.result()
		l.claimSeen = ok
		return conflict
	}
	if l.at.claim == storedNone && !l.at.link {
		return false
	}
	switch {
	case len(obs.ResponseID) > 0:
		l.claim = ex.claimStream(l.at, string(l.st.tap.ResponseID()))
		conflict, _ := l.claim.result()
		return conflict
	case obs.TokenBearing:
		l.at.claim, l.at.link = storedNone, false
		ex.g.log.Warn("stream without response.created before its first token: its owner is not recorded",
			"request_id", ex.rec.RequestID)
	}
	return false
}

// endConflict ends a stream whose new response another team owns: held,
// nothing of it reaches the caller; committed (a long opening, or a claim
// the relay went on without), the events before this one go, then an
// error event ends it.
func (l *relayLoop) endConflict(now time.Time) (res attemptResult, done, more bool) {
	if !l.committed {
		return l.endHeld(stop{conflict: true}, nil), true, false
	}
	if err := l.flush(now, l.events, l.firstInBatch, l.wrote); err != nil {
		return l.endStream(nil, err), true, false
	}
	return l.endStream(errIDConflict, nil), true, false
}

// commit sends the headers: from here on the answer is the caller's.
func (l *relayLoop) commit() {
	l.committed = true
	l.ex.prepareHeaders(l.resp.Header)
	l.ex.sseHeaders()
	l.ex.writeHeader(l.resp.StatusCode)
}

// commitHeld commits and sends the events held so far.
func (l *relayLoop) commitHeld(at time.Time) error {
	l.commit()
	l.writeEnd = l.heldEnd
	return l.flush(at, 0, false, true)
}

// flush writes the complete events of a read (events of them relayed,
// firstInBatch if the first token is among them, wrote if bytes were
// written already) and flushes once. Overhead counts each event from its
// read to this flush.
func (l *relayLoop) flush(readAt time.Time, events int, firstInBatch, wrote bool) error {
	ex := l.ex
	if !l.committed {
		return nil
	}
	if l.writeEnd > l.start {
		if err := ex.write(l.buf[l.start:l.writeEnd]); err != nil {
			return err
		}
		l.start, wrote = l.writeEnd, true
	}
	if !wrote {
		return nil
	}
	if err := l.rc.Flush(); err != nil {
		return err
	}
	done := ex.g.now()
	l.at.lastFlush = done
	if l.st.itl.sink != nil {
		l.st.itl.drain() // after the flush: off the token's path
	}
	if firstInBatch {
		l.at.learned.firstTokenOut = done
	}
	l.at.learned.relayOverhead += time.Duration(events) * done.Sub(readAt)
	if !l.at.terminalOut && l.st.tap.TerminalSeen() {
		l.at.terminalOut = true
		l.pt.graceAt(done, terminalGrace)
	}
	return nil
}

// readEnded ends the stream at the upstream's end of body or read error.
func (l *relayLoop) readEnded(rerr error) attemptResult {
	if rerr == io.EOF {
		rerr = nil
	}
	if !l.committed {
		return l.endHeld(stop{err: rerr}, l.buf[:l.heldEnd])
	}
	if rerr == nil && l.end > l.start && !l.ex.gen.cfg.Server.StreamErrorEvents {
		// Bytes of an unterminated final event: the upstream broke off
		// mid-event. Per WHATWG they are discarded by any client; pass them
		// on anyway so nothing the upstream sent is lost, and do not count
		// them. With stream error events on they are dropped instead: the
		// error event would otherwise be glued to them.
		if werr := l.ex.write(l.buf[l.start:l.end]); werr == nil {
			_ = l.rc.Flush()
		}
	}
	return l.endStream(rerr, nil)
}

// endHeld ends an attempt whose stream failed before anything reached the
// caller. Its held events are kept, with the usage the opening events
// reported (Anthropic's message_start input), to be relayed if no other
// attempt follows.
func (l *relayLoop) endHeld(s stop, held []byte) attemptResult {
	ex := l.ex
	s.stage, s.ctx = stageHeld, l.ctx
	e := ex.classify(l.at, s)
	if e.gone {
		return ex.callerLeft(e, 0)
	}
	f := &failure{status: l.resp.StatusCode, header: l.resp.Header, body: append([]byte(nil), held...), stream: true,
		outcome: e.outcome, interrupt: e.interrupt, errType: e.errType}
	f.usage, _ = l.st.tap.Usage()
	if s.conflict {
		// Nothing of it may reach the caller: the gateway's own error.
		f.header, f.body, f.apiErr = nil, nil, errStoredIDConflict()
		return attemptResult{result: e.result, status: f.status, retryable: e.retryable, healthy: e.healthy, fail: f}
	}
	if e.interrupt != llm.InterruptUpstreamErrorEvent {
		f.errorEvent = streamErrorEvent(ex.rec.Dialect, e.interrupt, &l.st.tap)
	}
	return attemptResult{result: e.result, status: f.status, retryable: e.retryable, healthy: e.healthy, fail: f}
}

// endStream ends an attempt whose stream was committed to the caller.
// readErr is the upstream's error (nil at a clean end), writeErr the
// caller's. A stream the upstream broke gets an error event in the caller's
// dialect, so its SDK raises instead of taking a cut answer for a whole
// one; never a synthetic terminal marker.
func (l *relayLoop) endStream(readErr, writeErr error) attemptResult {
	ex := l.ex
	at := l.at
	at.learned.tally, at.learned.tallied = l.st.tap.Summary(), true
	s := stop{stage: stageStream, ctx: l.ctx, err: readErr, writeErr: writeErr,
		tooLarge: errors.Is(readErr, errEventTooLarge), terminalOut: l.at.terminalOut, errorEvent: l.st.tap.ErrorSeen(),
		conflict: errors.Is(readErr, errIDConflict)}
	if s.errorEvent {
		s.errType = at.learned.tally.ErrorType
	}
	e := ex.classify(l.at, s)
	if e.gone {
		l.pt.abort() // stop the upstream now rather than when the handler returns
	}
	ex.ended(e)
	if !l.at.terminalOut && !e.gone && !s.errorEvent && ex.gen.cfg.Server.StreamErrorEvents {
		if ex.write(streamErrorEvent(ex.rec.Dialect, e.interrupt, &l.st.tap)) == nil {
			_ = l.rc.Flush()
		}
	}
	return ex.result(e, l.resp.StatusCode, true)
}
