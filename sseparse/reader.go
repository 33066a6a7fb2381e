package sseparse

import (
	"fmt"
	"io"
)

// readerInitialSize is the starting size of a Reader's buffer; it doubles as
// needed up to the event cap.
const readerInitialSize = 4 << 10

// maxEmptyReads bounds successive (0, nil) reads, as bufio does, so a broken
// io.Reader cannot spin Next forever.
const maxEmptyReads = 100

// Reader is a pull-style event reader for clients, tests and the load
// generator. Unlike a bare Framer it owns its read buffer. It is not safe for
// concurrent use.
type Reader struct {
	rd         io.Reader
	f          Framer
	buf        []byte
	start, end int // unconsumed bytes are buf[start:end]
	rerr       error
	truncated  bool
}

// NewReader returns a Reader of the events in rd, rejecting events larger
// than maxEventSize bytes (zero or less means DefaultMaxEventSize).
func NewReader(rd io.Reader, maxEventSize int) *Reader {
	r := &Reader{rd: rd, buf: make([]byte, readerInitialSize)}
	r.f.init(maxEventSize)
	return r
}

// Reset makes r read a new stream from rd, keeping its buffers and cap.
func (r *Reader) Reset(rd io.Reader) {
	r.rd = rd
	r.f.Reset()
	r.start, r.end = 0, 0
	r.rerr = nil
	r.truncated = false
}

// Next returns the next dispatched event. The event is valid until the next
// call. At the end of the stream it returns io.EOF; an event without its
// terminating blank line is discarded there, as WHATWG requires, and
// Truncated reports it. Other read errors are returned wrapped, and an event
// over the size cap gives an error wrapping ErrEventTooLarge; both are final.
func (r *Reader) Next() (*Event, error) {
	for {
		if r.start < r.end {
			n, boundary, err := r.f.Push(r.buf[r.start:r.end])
			r.start += n
			if err != nil {
				return nil, err
			}
			if boundary {
				if ev := r.f.Event(); ev != nil {
					return ev, nil
				}
				continue
			}
			// No complete line is left in the buffer: read more.
		}
		if r.rerr != nil {
			if r.rerr == io.EOF {
				r.truncated = r.start < r.end || r.f.inEvent()
			}
			return nil, r.rerr
		}
		r.fill()
	}
}

// Truncated reports whether bytes of an unfinished event were pending when
// Next returned io.EOF: the stream ended in the middle of an event.
func (r *Reader) Truncated() bool { return r.truncated }

// fill moves the unconsumed tail to the front of the buffer, grows the buffer
// if the tail fills it, and reads once. Errors are kept in r.rerr.
func (r *Reader) fill() {
	if r.start > 0 {
		r.end = copy(r.buf, r.buf[r.start:r.end])
		r.start = 0
	}
	if r.end == len(r.buf) {
		// The framer fails once a partial line exceeds the cap, before the
		// buffer fills, so a full buffer is always smaller than cap+1 bytes,
		// and cap+1 is as far as it needs to grow.
		buf := make([]byte, min(2*len(r.buf), r.f.max+1))
		copy(buf, r.buf[:r.end])
		r.buf = buf
	}
	for range maxEmptyReads {
		n, err := r.rd.Read(r.buf[r.end:])
		if n < 0 || n > len(r.buf)-r.end {
			r.rerr = fmt.Errorf("sseparse: reader returned invalid count %d", n)
			return
		}
		r.end += n
		if err != nil {
			if err != io.EOF {
				err = fmt.Errorf("sseparse: reading event stream: %w", err)
			}
			r.rerr = err
			return
		}
		if n > 0 {
			return
		}
	}
	r.rerr = fmt.Errorf("sseparse: reading event stream: %w", io.ErrNoProgress)
}
