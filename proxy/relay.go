package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/sseparse"
)

// relayBufSize is the size of a pooled relay buffer. An SSE event larger than
// this grows a private buffer, up to max_event_bytes, that is dropped after
// the stream instead of going back to the pool.
const relayBufSize = 32 << 10

// streamState is the per-stream parser state, pooled so that a stream costs
// no allocation for its framer and tap.
type streamState struct {
	fr  *sseparse.Framer
	tap sseparse.Tap
}

var streamStates sync.Pool

func (g *Gateway) getStreamState() *streamState {
	if s, ok := streamStates.Get().(*streamState); ok {
		s.fr.Reset()
		return s
	}
	return &streamState{fr: sseparse.NewFramer(g.cfg.Server.MaxEventBytes)}
}

func (g *Gateway) putStreamState(s *streamState) {
	s.tap.ITL = nil
	streamStates.Put(s)
}

// errEventTooLarge marks a stream cut because one event outgrew
// max_event_bytes.
var errEventTooLarge = errors.New("proxy: upstream event exceeds max_event_bytes")

// relay forwards an SSE body event by event. Each read from the upstream is
// split into complete events by the framer; every complete event is written
// to the client unchanged and the batch is flushed once, so an event is never
// held back after its closing blank line has been read. The one exception is
// the usage-only chunk the gateway asked for on the caller's behalf (DESIGN
// 3.3), which is observed but not written.
//
// The bytes of an incomplete event stay in the buffer until it completes.
func (ex *exchange) relay(ctx context.Context, cancel context.CancelFunc, body io.Reader) {
	g := ex.g
	st := g.getStreamState()
	defer g.putStreamState(st)
	st.tap.Reset(ex.rec.Dialect)
	st.tap.ITL = g.metrics.ITL(ex.rec.Route, ex.modelLabel)

	bp := g.bufPool.Get().(*[]byte)
	buf := *bp
	defer func() {
		if cap(buf) == relayBufSize {
			*bp = buf
			g.bufPool.Put(bp)
		}
	}()

	rc := http.NewResponseController(ex.w)
	ex.w.WriteHeader(ex.rec.Status)
	// Send the headers now: a caller waiting for a slow first token should
	// see the stream open.
	if err := rc.Flush(); err != nil {
		ex.streamEnded(ctx, cancel, st, nil, err)
		return
	}

	maxEvent := g.cfg.Server.MaxEventBytes
	suppress := ex.info.suppressUsage
	var (
		start, pos, end int // unwritten bytes are buf[start:end]; the framer has consumed up to pos
		firstOut        bool
	)
	ex.terminalOut = false
	for {
		if end == len(buf) {
			if start > 0 { // move the pending event to the front
				n := copy(buf, buf[start:end])
				pos -= start
				start, end = 0, n
			} else { // one event larger than the buffer
				if len(buf) >= maxEvent+relayBufSize {
					ex.streamEnded(ctx, cancel, st, errEventTooLarge, nil)
					return
				}
				nb := make([]byte, min(2*len(buf), maxEvent+relayBufSize))
				copy(nb, buf[:end])
				buf = nb
			}
		}
		n, rerr := body.Read(buf[end:])
		now := g.now()
		end += n

		writeEnd := start // end of the complete events not yet written
		events := 0
		firstInBatch := false
		for pos < end {
			c, boundary, ferr := st.fr.Push(buf[pos:end])
			if ferr != nil {
				ex.streamEnded(ctx, cancel, st, errEventTooLarge, nil)
				return
			}
			blockStart := writeEnd
			pos += c
			if !boundary {
				break
			}
			if ev := st.fr.Event(); ev != nil {
				obs := st.tap.Observe(ev, now)
				if suppress && obs.UsageOnly {
					// Write what came before the withheld chunk, skip it.
					if blockStart > start {
						if werr := ex.write(buf[start:blockStart]); werr != nil {
							ex.streamEnded(ctx, cancel, st, nil, werr)
							return
						}
					}
					start, writeEnd = pos, pos
					continue
				}
				if obs.TokenBearing && !firstOut {
					firstOut, firstInBatch = true, true
				}
				events++
			}
			writeEnd = pos
		}
		if writeEnd > start {
			if werr := ex.write(buf[start:writeEnd]); werr != nil {
				ex.streamEnded(ctx, cancel, st, nil, werr)
				return
			}
			if werr := rc.Flush(); werr != nil {
				ex.streamEnded(ctx, cancel, st, nil, werr)
				return
			}
			start = writeEnd
			ex.terminalOut = st.tap.TerminalSeen()
			done := g.now()
			if firstInBatch {
				ex.rec.Timing.FirstTokenOut = done
			}
			ex.rec.RelayOverhead += time.Duration(events) * done.Sub(now)
		}
		if rerr != nil {
			if rerr == io.EOF {
				rerr = nil
			}
			if rerr == nil && end > start {
				// Bytes of an unterminated final event: the upstream broke
				// off mid-event. Per WHATWG they are discarded by any
				// client; pass them on anyway so nothing the upstream sent
				// is lost, and do not count them.
				if werr := ex.write(buf[start:end]); werr == nil {
					_ = rc.Flush()
				}
			}
			ex.streamEnded(ctx, cancel, st, rerr, nil)
			return
		}
	}
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
	switch {
	case (writeErr != nil || ex.r.Context().Err() != nil) && ex.terminalOut && !errorEvent:
		// The caller left after it had the whole answer (SDKs stop reading
		// at [DONE] and close the connection): a success.
		cancel()
		ex.rec.Outcome = llm.OutcomeOK
	case writeErr != nil || ex.r.Context().Err() != nil:
		// The caller left: stop the upstream now rather than when the
		// handler returns.
		cancel()
		ex.rec.Outcome = llm.OutcomeClientCancel
		ex.rec.Interruption = llm.InterruptClientCancel
	case errors.Is(readErr, errEventTooLarge):
		ex.g.log.Warn("upstream event too large; stream cut", "request_id", ex.rec.RequestID,
			"upstream", ex.up.cfg.Name, "limit_bytes", ex.g.cfg.Server.MaxEventBytes)
		ex.rec.Outcome = llm.OutcomeUpstreamError
		ex.rec.Interruption = llm.InterruptProtocolError
		if ex.rec.ErrorType == "" {
			ex.rec.ErrorType = "event_too_large"
		}
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		ex.rec.Outcome = llm.OutcomeUpstreamTimeout
		ex.rec.Interruption = llm.InterruptTimeout
	case errorEvent:
		ex.rec.Outcome = llm.OutcomeUpstreamError
	case readErr != nil || !ex.rec.TerminalSeen:
		// The body broke or ended without [DONE] / message_stop: a
		// truncated stream, never a success (STYLE 12).
		ex.rec.Outcome = llm.OutcomeUpstreamError
		ex.rec.Interruption = llm.InterruptUpstreamEOF
		if readErr != nil {
			ex.g.log.Warn("upstream stream broke", "request_id", ex.rec.RequestID,
				"upstream", ex.up.cfg.Name, "err", readErr)
		}
	default:
		ex.rec.Outcome = llm.OutcomeOK
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
		ex.rec.Outcome = llm.OutcomeClientCancel
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
