// Package sseparse frames Server-Sent Events by the WHATWG rules, decodes the
// OpenAI and Anthropic streaming dialects into token, usage and error
// observations, and timestamps them for the gateway's latency figures.
//
// Everything here sits on the relay's per-event path and allocates nothing per
// event once its buffers have grown to the stream's event size: the [Framer]
// works on the caller's bytes and copies only field values, the decoders walk
// the JSON in place (internal/jsonscan), and the [Tap] keeps its results in
// plain fields.
//
// The framer works on bytes, not decoded text: it splits lines on ASCII CR and
// LF only (which never occur inside a UTF-8 multi-byte sequence) and passes
// every other byte through unchanged, so invalid UTF-8 is not replaced by
// U+FFFD as a browser would do.
package sseparse

import (
	"bytes"
	"errors"
	"fmt"
)

// DefaultMaxEventSize is the event size cap NewFramer and NewReader use when
// given zero or less. It matches config's max_event_bytes default (16 MiB).
const DefaultMaxEventSize = 16 << 20

// ErrEventTooLarge reports an event whose raw bytes exceed the framer's cap.
// Errors returned by Push and Next wrap it with the sizes involved.
var ErrEventTooLarge = errors.New("sseparse: event exceeds size limit")

// Event is one dispatched SSE event. Its slices alias the framer's buffers and
// stay valid only until the next Push (or Next).
type Event struct {
	// Type is the value of the last `event:` field; empty means the default
	// type "message".
	Type []byte
	// Data is the event's data lines joined with LF, the final LF removed.
	Data []byte
	// ID is the last event ID. It persists across events (WHATWG: the
	// last-event-ID buffer is not reset on dispatch) and is empty until an
	// `id:` field sets it.
	ID []byte
	// Retry is the reconnection time in milliseconds from a `retry:` field in
	// this event's block, or -1 if the block had none.
	Retry int64
}

// bom is the UTF-8 encoding of U+FEFF, skipped once at the start of a stream.
var bom = []byte{0xEF, 0xBB, 0xBF}

// shrinkAbove is the capacity above which Reset drops a buffer instead of
// keeping it, so that one huge event does not pin memory in a pooled framer.
const shrinkAbove = 64 << 10

// Framer splits an event stream into events. It keeps no copy of the input:
// the caller owns the raw bytes and re-presents an unconsumed partial line
// with more bytes appended (see Push). Only field values are copied, into
// buffers that are reused from event to event.
//
// The size of an event is the number of raw bytes of its block: every line
// after the previous blank line up to its own blank line, line ends included
// (the closing blank line itself is not counted, so the size does not depend
// on how a CRLF there was split). An event larger than the cap, or a partial
// line that would make it so, stops the framer with an error wrapping
// ErrEventTooLarge. Comment and unknown-field lines count: the relay holds
// every byte of a block until its boundary.
//
// A Framer is not safe for concurrent use.
type Framer struct {
	max   int
	data  []byte // data buffer: values of data fields, each followed by LF
	typ   []byte // event type buffer
	id    []byte // last event ID buffer
	retry int64
	block int // raw bytes of the current block consumed so far

	pendingCR  bool // the last byte consumed was a CR at the end of p
	bomDone    bool
	dispatched bool // the latest Push dispatched ev
	ev         Event
	err        error
}

// NewFramer returns a framer that rejects events larger than maxEventSize
// bytes; zero or less means DefaultMaxEventSize.
func NewFramer(maxEventSize int) *Framer {
	f := &Framer{}
	f.init(maxEventSize)
	return f
}

func (f *Framer) init(maxEventSize int) {
	if maxEventSize <= 0 {
		maxEventSize = DefaultMaxEventSize
	}
	f.max = maxEventSize
	f.Reset()
}

// Reset prepares the framer for a new stream, keeping its size cap and its
// buffers (except one grown above 64 KiB, which is released).
func (f *Framer) Reset() {
	*f = Framer{
		max:   f.max,
		data:  keep(f.data),
		typ:   keep(f.typ),
		id:    keep(f.id),
		retry: -1,
	}
}

func keep(b []byte) []byte {
	if cap(b) > shrinkAbove {
		return nil
	}
	return b[:0]
}

// Push consumes complete lines from p and stops right after the first blank
// line (an event boundary), or when p holds no further complete line. It
// returns the number of bytes consumed.
//
// Bytes of an incomplete final line are not consumed: the caller keeps them
// and pushes them again with more bytes appended, so the framer itself keeps
// no copy of partial lines. A CR at the very end of p is a line end and is
// consumed; an LF at the start of the next Push is then taken as the second
// half of that CRLF, so a CRLF split across reads does not make an extra blank
// line. A UTF-8 BOM at the very start of the stream is consumed and ignored;
// while p is a strict prefix of a BOM at the start of the stream, nothing is
// consumed.
//
// At a boundary, boundary is true and Event returns the dispatched event, or
// nil when the block dispatched nothing (a comment-only block, no data lines,
// and so on; WHATWG "dispatch the event"). Otherwise Event returns nil, and
// p[n:] holds no complete line: the caller reads more before pushing again.
//
// err wraps ErrEventTooLarge when the current event, counting an unterminated
// final line in p, exceeds the size cap. The error is sticky: later calls
// return it until Reset. n then counts the lines consumed before the error.
func (f *Framer) Push(p []byte) (n int, boundary bool, err error) {
	if f.err != nil {
		return 0, false, f.err
	}
	f.dispatched = false
	if len(p) == 0 {
		return 0, false, nil
	}
	if f.pendingCR {
		f.pendingCR = false
		if p[0] == '\n' {
			// The second half of a CRLF whose CR ended the previous Push. It
			// counts toward the event only if that CR ended a field line, as
			// it would have unsplit.
			n = 1
			if f.block > 0 {
				f.block++
				if f.block > f.max {
					return n, false, f.tooLarge()
				}
			}
		}
	}
	if !f.bomDone {
		if len(p) < len(bom) && bytes.HasPrefix(bom, p) {
			return f.checkTail(0, len(p))
		}
		f.bomDone = true
		if bytes.HasPrefix(p, bom) {
			n = len(bom)
		}
	}
	for n < len(p) {
		rest := p[n:]
		e := lineEnd(rest)
		if e < 0 {
			break
		}
		adv := e + 1
		if rest[e] == '\r' {
			switch {
			case adv == len(rest):
				f.pendingCR = true
			case rest[adv] == '\n':
				adv++
			}
		}
		n += adv
		if e == 0 {
			f.dispatch()
			return n, true, nil
		}
		f.block += adv
		if f.block > f.max {
			return n, false, f.tooLarge()
		}
		f.field(rest[:e])
	}
	return f.checkTail(n, len(p)-n)
}

func (f *Framer) tooLarge() error {
	f.err = fmt.Errorf("%w: %d bytes so far, limit %d", ErrEventTooLarge, f.block, f.max)
	return f.err
}

// checkTail returns n, or the size error when an unterminated line of tail
// bytes would take the current event over the cap.
func (f *Framer) checkTail(n, tail int) (int, bool, error) {
	if f.block+tail > f.max {
		f.err = fmt.Errorf("%w: %d bytes without a line end after %d bytes of event, limit %d",
			ErrEventTooLarge, tail, f.block, f.max)
		return n, false, f.err
	}
	return n, false, nil
}

// Event returns the event dispatched by the latest Push, or nil if that Push
// dispatched none. The event stays valid until the next Push.
func (f *Framer) Event() *Event {
	if f.dispatched {
		return &f.ev
	}
	return nil
}

// inEvent reports whether the framer holds part of a block: lines consumed
// since the last blank line.
func (f *Framer) inEvent() bool { return f.block > 0 }

// dispatch ends a block (WHATWG §9.2.6, "dispatch the event").
func (f *Framer) dispatch() {
	f.block = 0
	retry := f.retry
	f.retry = -1
	typ := f.typ
	f.typ = f.typ[:0]
	if len(f.data) == 0 {
		return
	}
	// The event aliases the buffers; the next field appended overwrites them,
	// which is why an event is only valid until the next Push.
	f.ev = Event{Type: typ, Data: f.data[:len(f.data)-1], ID: f.id, Retry: retry}
	f.data = f.data[:0]
	f.dispatched = true
}

// field processes one non-empty line (WHATWG §9.2.6, "process the field").
func (f *Framer) field(line []byte) {
	if line[0] == ':' {
		return // comment
	}
	name, value := line, []byte(nil)
	if c := bytes.IndexByte(line, ':'); c >= 0 {
		name, value = line[:c], line[c+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	switch string(name) {
	case "event":
		f.typ = append(f.typ[:0], value...)
	case "data":
		f.data = append(f.data, value...)
		f.data = append(f.data, '\n')
	case "id":
		if bytes.IndexByte(value, 0) < 0 {
			f.id = append(f.id[:0], value...)
		}
	case "retry":
		if ms, ok := parseRetry(value); ok {
			f.retry = ms
		}
	}
}

// parseRetry accepts only ASCII digits, as the spec says; an empty value is
// ignored too. Values beyond int64 saturate rather than wrap.
func parseRetry(v []byte) (int64, bool) {
	if len(v) == 0 {
		return 0, false
	}
	var ms int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := int64(c - '0')
		if ms > (1<<63-1-d)/10 {
			ms = 1<<63 - 1
			continue
		}
		ms = ms*10 + d
	}
	return ms, true
}

// lineEnd returns the index of the first CR or LF in p, or -1. It searches in
// growing windows so that each line costs time in proportion to its own length
// even when one of the two bytes never occurs in the rest of a large buffer
// (an LF-only stream has no CR, a CR-only stream no LF).
func lineEnd(p []byte) int {
	w := 512
	for off := 0; off < len(p); {
		end := min(off+w, len(p))
		win := p[off:end]
		if lf := bytes.IndexByte(win, '\n'); lf >= 0 {
			win = win[:lf]
			if cr := bytes.IndexByte(win, '\r'); cr >= 0 {
				return off + cr
			}
			return off + lf
		}
		if cr := bytes.IndexByte(win, '\r'); cr >= 0 {
			return off + cr
		}
		off = end
		if w < 64<<10 {
			w *= 2
		}
	}
	return -1
}
