package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/sseparse"
)

// relayBufSize is the size of a pooled relay buffer. An SSE event larger than
// this grows a private buffer, up to max_event_bytes, that is dropped after
// the stream instead of going back to the pool.
const relayBufSize = 32 << 10

// streamState is the per-stream parser state, pooled (per Gateway, since the
// framer carries the gateway's max_event_bytes) so that a stream costs no
// allocation for its framer and tap.
type streamState struct {
	fr  *sseparse.Framer
	tap sseparse.Tap
	itl itlTee
}

// itlTee sends each inter-token gap to the Prometheus histogram at once and
// keeps it for the live windows, which get the gaps of a read after its
// events are flushed (drain): the windows' lock is shared by every stream of
// a route and model, and waiting on it must not delay a token. It lives in
// the pooled streamState, so it costs no allocation per stream.
type itlTee struct {
	prom    llm.Observer
	sink    StatsSink
	route   llm.Route
	model   string
	n       int
	pending [64]time.Duration
}

// Observe takes a gap in seconds, as the tap reports it.
func (t *itlTee) Observe(v float64) {
	t.prom.Observe(v)
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
	return &streamState{fr: sseparse.NewFramer(g.cfg.Server.MaxEventBytes)}
}

func (g *Gateway) putStreamState(s *streamState) {
	s.tap.ITL = nil
	s.itl = itlTee{}
	g.states.Put(s)
}

// errEventTooLarge marks a stream cut because one event outgrew
// max_event_bytes.
var errEventTooLarge = errors.New("proxy: upstream event exceeds max_event_bytes")

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
// the usage-only chunk the gateway asked for on the caller's behalf (DESIGN
// 3.3), which is observed but not written.
//
// With hold set (another attempt could follow), the response headers and the
// events that carry no token (OpenAI's role chunk, Anthropic's message_start
// and pings) are held back until the first token-bearing, usage or terminal
// event: until then nothing is committed to the caller, so an error event or
// a stall before the first token can still be retried elsewhere (issue 4).
// The caller's time to first token is unchanged; only the opening events
// reach it later, with that token. Held bytes never exceed one relay buffer:
// a longer preamble is committed.
//
// A hold lasts at most maxHold (or the first-token timeout, if longer): a
// stream still without a token then is committed at its next read, so the
// upstream's keep-alive comments and pings reach the caller's proxies again.
//
// The bytes of an incomplete event stay in the buffer until it completes.
func (ex *exchange) relay(ctx context.Context, cancel context.CancelFunc, resp *http.Response, hold bool, pt *phaseTimer) attemptResult {
	g := ex.g
	body := resp.Body
	st := g.getStreamState()
	defer g.putStreamState(st)
	st.tap.Reset(ex.rec.Dialect)
	if ex.probe == nil { // a probe's gaps are no user's figure
		st.tap.ITL = g.metrics.ITL(ex.rec.Route, ex.modelLabel)
		if g.stats != nil {
			st.itl = itlTee{prom: st.tap.ITL, sink: g.stats, route: ex.rec.Route, model: ex.modelLabel}
			st.tap.ITL = &st.itl
			defer st.itl.drain() // runs before putStreamState
		}
	}

	bp := g.bufPool.Get().(*[]byte)
	defer g.bufPool.Put(bp) // a stream that grew a larger buffer drops that one, not this
	buf := *bp

	rc := http.NewResponseController(ex.w)
	committed := false
	// commit sends the headers: from here on the answer is the caller's.
	commit := func() {
		committed = true
		ex.prepareHeaders(resp.Header)
		ex.sseHeaders()
		ex.headersSent = true
		ex.w.WriteHeader(ex.rec.Status)
	}
	ex.terminalOut = false
	if !hold {
		commit()
		// Send the headers now: a caller waiting for a slow first token
		// should see the stream open.
		if err := rc.Flush(); err != nil {
			ex.streamEnded(ctx, cancel, st, nil, err)
			return ex.committed(ex.rec.Status)
		}
	}

	maxEvent := g.cfg.Server.MaxEventBytes
	suppress := ex.info.suppressUsage
	var (
		// buf[start:end] is not yet written; the framer has consumed
		// buf[:pos]; buf[start:writeEnd] holds complete events to write;
		// buf[:heldEnd] are the complete events held back (hold).
		start, pos, end, writeEnd, heldEnd int
		firstOut                           bool
		// lfPending: the last block ended with a CR at the end of a read,
		// so an LF opening the next read is the rest of that CRLF (the
		// framer swallows it) and belongs to that block. prevWithheld: that
		// block was the withheld usage chunk.
		lfPending, prevWithheld bool
		stopTimer               *time.Timer
	)
	defer func() {
		if stopTimer != nil {
			stopTimer.Stop()
		}
	}()

	// flush writes the complete events of this read and flushes once.
	flush := func(readAt time.Time, events int, firstInBatch, wrote bool) error {
		if !committed {
			return nil
		}
		if writeEnd > start {
			if err := ex.write(buf[start:writeEnd]); err != nil {
				return err
			}
			start, wrote = writeEnd, true
		}
		if !wrote {
			return nil
		}
		if err := rc.Flush(); err != nil {
			return err
		}
		done := g.now()
		ex.lastFlush = done
		if st.itl.sink != nil {
			st.itl.drain() // after the flush: off the token's path
		}
		if firstInBatch {
			ex.rec.Timing.FirstTokenOut = done
		}
		ex.rec.RelayOverhead += time.Duration(events) * done.Sub(readAt)
		if !ex.terminalOut && st.tap.TerminalSeen() {
			ex.terminalOut = true
			stopTimer = time.AfterFunc(terminalGrace, cancel)
		}
		return nil
	}

	// commitHeld commits and sends the events held so far.
	commitHeld := func(at time.Time) error {
		commit()
		writeEnd = heldEnd
		return flush(at, 0, false, true)
	}
	holdStart := g.now()
	holdCap := max(maxHold, ex.up.firstToken)

	for {
		if end == len(buf) && !committed {
			// The preamble fills the buffer: commit what is held rather
			// than grow it.
			if err := commitHeld(g.now()); err != nil {
				ex.streamEnded(ctx, cancel, st, nil, err)
				return ex.committed(ex.rec.Status)
			}
		}
		if end == len(buf) {
			if start > 0 { // move the pending event to the front
				n := copy(buf, buf[start:end])
				pos -= start
				start, end = 0, n
			} else { // one event larger than the buffer
				if len(buf) >= maxEvent+relayBufSize {
					ex.streamEnded(ctx, cancel, st, errEventTooLarge, nil)
					return ex.committed(ex.rec.Status)
				}
				nb := make([]byte, min(2*len(buf), maxEvent+relayBufSize))
				copy(nb, buf[:end])
				buf = nb
			}
		}
		n, rerr := body.Read(buf[end:])
		now := g.now()
		end += n
		if n > 0 {
			pt.touchAt(now)
			if !committed && now.Sub(holdStart) >= holdCap {
				// Held long enough: let the upstream's keep-alives and
				// pings reach the caller (and its proxies) again.
				if err := commitHeld(now); err != nil {
					ex.streamEnded(ctx, cancel, st, nil, err)
					return ex.committed(ex.rec.Status)
				}
			}
		}

		writeEnd = start
		if !committed {
			writeEnd = heldEnd // the held events come before this read's
		}
		if lfPending && pos < end {
			lfPending = false
			if buf[pos] == '\n' {
				if prevWithheld {
					start = pos + 1
				}
				writeEnd = pos + 1
				if !committed {
					heldEnd = pos + 1
				}
			}
		}
		events, firstInBatch, wrote := 0, false, false
		for pos < end {
			blockStart := writeEnd
			c, boundary, ferr := st.fr.Push(buf[pos:end])
			pos += c
			if ferr != nil {
				if !committed {
					return ex.heldFailure(st, resp, buf[:heldEnd], resultStreamBroken, llm.OutcomeUpstreamError,
						llm.InterruptProtocolError, nil, true)
				}
				// Deliver the complete events before the oversized one.
				if err := flush(now, events, firstInBatch, wrote); err != nil {
					ex.streamEnded(ctx, cancel, st, nil, err)
					return ex.committed(ex.rec.Status)
				}
				ex.streamEnded(ctx, cancel, st, errEventTooLarge, nil)
				return ex.committed(ex.rec.Status)
			}
			if !boundary {
				break
			}
			withheld := false
			if ev := st.fr.Event(); ev != nil {
				obs := st.tap.Observe(ev, now)
				if !committed {
					switch {
					case obs.Error:
						return ex.heldFailure(st, resp, buf[:pos], resultErrorEvent, llm.OutcomeUpstreamError,
							llm.InterruptUpstreamErrorEvent, obs.ErrorType, false)
					case obs.TokenBearing || obs.UsageOnly || obs.Terminal:
						commit()
					}
				}
				switch {
				case suppress && obs.UsageOnly:
					withheld = true
				case obs.TokenBearing && !firstOut:
					firstOut, firstInBatch = true, true
					pt.firstToken()
					if ex.tk != nil {
						// The upstream answers: a long stream must not hold a
						// half-open probe slot to its end (a later break is
						// still counted, see roundTrip).
						ex.tk.done(true)
						ex.tkEarly = true
					}
					events++
				default:
					events++
				}
			}
			if withheld {
				// Write what came before the withheld chunk, skip it.
				if blockStart > start {
					if err := ex.write(buf[start:blockStart]); err != nil {
						ex.streamEnded(ctx, cancel, st, nil, err)
						return ex.committed(ex.rec.Status)
					}
					wrote = true
				}
				start = pos
			}
			writeEnd = pos
			if !committed {
				heldEnd = pos
			}
			prevWithheld = withheld
			lfPending = pos == end && buf[pos-1] == '\r'
		}
		if err := flush(now, events, firstInBatch, wrote); err != nil {
			ex.streamEnded(ctx, cancel, st, nil, err)
			return ex.committed(ex.rec.Status)
		}
		if start == end && committed { // nothing pending: offer the next read the whole buffer
			start, pos, end = 0, 0, 0
		}
		if rerr != nil {
			if rerr == io.EOF {
				rerr = nil
			}
			if !committed {
				return ex.heldEnd(ctx, st, resp, buf[:heldEnd])
			}
			if rerr == nil && end > start && !g.cfg.Server.StreamErrorEvents {
				// Bytes of an unterminated final event: the upstream broke
				// off mid-event. Per WHATWG they are discarded by any
				// client; pass them on anyway so nothing the upstream sent
				// is lost, and do not count them. With stream error events
				// on they are dropped instead: the error event would
				// otherwise be glued to them.
				if werr := ex.write(buf[start:end]); werr == nil {
					_ = rc.Flush()
				}
			}
			ex.streamEnded(ctx, cancel, st, rerr, nil)
			return ex.committed(ex.rec.Status)
		}
	}
}

// heldFailure is an attempt whose stream failed before anything was sent to
// the caller: its held events (held) are kept, to be relayed if no other
// attempt follows. errType is the error event's type, retried by the rules
// of the status the same error has outside a stream; other failures are
// always worth another attempt.
func (ex *exchange) heldFailure(st *streamState, resp *http.Response, held []byte, result string,
	o llm.Outcome, why llm.Interruption, errType []byte, retryable bool) attemptResult {
	f := &failure{status: ex.rec.Status, header: resp.Header,
		body: append([]byte(nil), held...), stream: true, outcome: o, interrupt: why,
		errType: string(errType), upReqID: ex.rec.UpstreamRequestID}
	// Usage the opening events reported (Anthropic's message_start input),
	// billed if this failure is what the caller gets.
	f.usage, _ = st.tap.Usage()
	healthy := false
	if errType != nil || why == llm.InterruptUpstreamErrorEvent {
		status := errorEventStatus(errType)
		retryable = status != 0 && retryableStatus(ex.up.policy, status, f.errType, "")
		healthy = ex.errorEventHealthy(f.errType)
	}
	if f.errType == "" && why == llm.InterruptProtocolError {
		f.errType = "event_too_large"
	}
	return attemptResult{result: result, status: f.status, retryable: retryable, healthy: healthy, fail: f}
}

// heldEnd classifies a held stream whose body ended or broke before its
// first token.
func (ex *exchange) heldEnd(ctx context.Context, st *streamState, resp *http.Response, held []byte) attemptResult {
	if ex.r.Context().Err() != nil {
		ex.clientGone()
		return attemptResult{result: resultClientGone, done: true, healthy: true}
	}
	cause := context.Cause(ctx)
	switch {
	case errors.Is(cause, errFirstTokenTimeout):
		return ex.heldFailure(st, resp, held, resultFirstTokenTimeout, llm.OutcomeUpstreamTimeout,
			llm.InterruptTimeout, nil, true)
	case errors.Is(cause, errAttemptTimeout) || errors.Is(cause, context.DeadlineExceeded):
		return ex.heldFailure(st, resp, held, resultTimeout, llm.OutcomeUpstreamTimeout,
			llm.InterruptTimeout, nil, true)
	}
	return ex.heldFailure(st, resp, held, resultStreamBroken, llm.OutcomeUpstreamError,
		llm.InterruptUpstreamEOF, nil, true)
}

// write sends p to the client and counts it.
func (ex *exchange) write(p []byte) error {
	n, err := ex.w.Write(p)
	ex.rec.BytesOut += int64(n)
	return err
}

// streamEnded classifies how a relayed stream ended. readErr is the
// upstream's error (nil at a clean EOF), writeErr the client's.
func (ex *exchange) streamEnded(ctx context.Context, cancel context.CancelFunc, st *streamState, readErr, writeErr error) {
	ex.rec.Timing.End = ex.g.now()
	st.tap.Fill(&ex.rec)
	errorEvent := ex.rec.Interruption == llm.InterruptUpstreamErrorEvent
	clientGone := writeErr != nil || ex.r.Context().Err() != nil
	if clientGone {
		// Stop the upstream now rather than when the handler returns.
		cancel()
	}
	switch {
	case ex.terminalOut:
		// The caller has the whole answer, up to its terminal marker. What
		// happened after (a caller that hangs up at [DONE] as the SDKs do,
		// an upstream that holds the body open) does not change that; the
		// exchange ended with the last flush.
		ex.rec.Timing.End = ex.lastFlush
		ex.rec.Outcome = llm.OutcomeOK
		if errorEvent { // e.g. vLLM: an error event, then [DONE]
			ex.rec.Outcome = llm.OutcomeUpstreamError
		}
	case errorEvent:
		// The upstream ended the stream with an error event. The SDKs hang
		// up as soon as they read one, so a caller gone now does not make
		// it the caller's doing.
		ex.rec.Outcome = llm.OutcomeUpstreamError
	case clientGone:
		ex.rec.Outcome, ex.rec.Interruption = ex.cancelledBy()
	case errors.Is(readErr, errEventTooLarge):
		ex.g.log.Warn("upstream event too large; stream cut", "request_id", ex.rec.RequestID,
			"upstream", ex.up.cfg.Name, "limit_bytes", ex.g.cfg.Server.MaxEventBytes)
		ex.rec.Outcome = llm.OutcomeUpstreamError
		ex.rec.Interruption = llm.InterruptProtocolError
		if ex.rec.ErrorType == "" {
			ex.rec.ErrorType = "event_too_large"
		}
	case errors.Is(context.Cause(ctx), errIdleTimeout):
		ex.rec.Outcome = llm.OutcomeUpstreamTimeout
		ex.rec.Interruption = llm.InterruptIdleTimeout
	case ctx.Err() != nil && !errors.Is(context.Cause(ctx), context.Canceled):
		// The attempt's total or first-token timeout.
		ex.rec.Outcome = llm.OutcomeUpstreamTimeout
		ex.rec.Interruption = llm.InterruptTimeout
		ex.firstTokenCut = errors.Is(context.Cause(ctx), errFirstTokenTimeout)
	default:
		// The body broke or ended without [DONE] / message_stop: a
		// truncated stream, never a success (STYLE 12).
		ex.rec.Outcome = llm.OutcomeUpstreamError
		ex.rec.Interruption = llm.InterruptUpstreamEOF
		if readErr != nil {
			ex.g.log.Warn("upstream stream broke", "request_id", ex.rec.RequestID,
				"upstream", ex.up.cfg.Name, "err", readErr)
		}
	}
	// An honest end (issue 4, item 6): a stream the upstream broke gets an
	// error event in the caller's dialect, so its SDK raises instead of
	// taking a cut answer for a whole one. Never a synthetic terminal
	// marker (wire.md 1.5).
	if !ex.terminalOut && !clientGone && !errorEvent && ex.g.cfg.Server.StreamErrorEvents {
		if ex.write(streamErrorEvent(ex.rec.Dialect, ex.rec.Interruption)) == nil {
			_ = http.NewResponseController(ex.w).Flush()
		}
	}
}

// copyBody copies a body that is not relayed event by event: non-streamed
// answers, upstream errors and forwarded paths. It keeps up to capture bytes
// in ex.captured (for usage or the error type); a larger body is still
// copied whole. flush sends every read on at once (streams on forwarded
// paths).
func (ex *exchange) copyBody(ctx context.Context, body io.Reader, capture int, flush bool) {
	g := ex.g
	bp := g.bufPool.Get().(*[]byte)
	defer g.bufPool.Put(bp)
	buf := *bp
	rc := http.NewResponseController(ex.w)
	ex.headersSent = true
	ex.w.WriteHeader(ex.rec.Status)
	var readErr, writeErr error
	for {
		n, err := body.Read(buf)
		if n > 0 {
			if capture > 0 && len(ex.captured) < capture {
				ex.captured = append(ex.captured, buf[:min(n, capture-len(ex.captured))]...)
			}
			if writeErr = ex.write(buf[:n]); writeErr == nil && flush {
				writeErr = rc.Flush()
			}
			if writeErr != nil {
				break
			}
		}
		if err != nil {
			if err != io.EOF {
				readErr = err
			}
			break
		}
	}
	ex.rec.Timing.End = g.now()
	switch {
	case writeErr != nil || ex.r.Context().Err() != nil:
		ex.rec.Outcome, _ = ex.cancelledBy()
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		ex.rec.Outcome = llm.OutcomeUpstreamTimeout
	case readErr != nil:
		ex.rec.Outcome = llm.OutcomeUpstreamError
		g.log.Warn("upstream body broke", "request_id", ex.rec.RequestID, "upstream", ex.up.cfg.Name, "err", readErr)
	}
	if readErr != nil || writeErr != nil {
		if ex.captured != nil && capture > len(ex.captured) {
			ex.captured = nil // a partial body has no usable usage
		}
	}
}
