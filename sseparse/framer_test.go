package sseparse

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
)

// refEvent is a dispatched event as plain values, for comparisons.
type refEvent struct {
	Type, Data, ID string
	Retry          int64
}

func (e refEvent) String() string {
	return fmt.Sprintf("{type %q data %q id %q retry %d}", e.Type, e.Data, e.ID, e.Retry)
}

func toRef(ev *Event) refEvent {
	return refEvent{Type: string(ev.Type), Data: string(ev.Data), ID: string(ev.ID), Retry: ev.Retry}
}

// refParse is the reference: a direct transcription of WHATWG §9.2.5 and
// §9.2.6 over a whole stream held in memory, written for obviousness rather
// than speed. Beyond the spec it reports the size of every block (raw bytes of
// its field and comment lines, the closing blank line excluded) and of the
// unfinished block at EOF, and whether such a block was pending; Retry is the
// value of a retry field in the event's own block, -1 if none.
func refParse(stream []byte) (events []refEvent, blockSizes []int, pending bool) {
	s := strings.TrimPrefix(string(stream), "\uFEFF")
	var data, typ, id string
	retry := int64(-1)
	block, inBlock := 0, false
	for {
		i := strings.IndexAny(s, "\r\n")
		if i < 0 {
			// EOF: an unterminated last line is not processed, and the
			// pending event is discarded.
			if inBlock || len(s) > 0 {
				blockSizes = append(blockSizes, block+len(s))
				pending = true
			}
			return events, blockSizes, pending
		}
		line := s[:i]
		end := i + 1
		if s[i] == '\r' && i+1 < len(s) && s[i+1] == '\n' {
			end = i + 2
		}
		s = s[end:]

		if line == "" {
			blockSizes = append(blockSizes, block)
			block, inBlock = 0, false
			if data != "" {
				events = append(events, refEvent{Type: typ, Data: strings.TrimSuffix(data, "\n"), ID: id, Retry: retry})
			}
			data, typ, retry = "", "", -1
			continue
		}
		block += end
		inBlock = true
		if line[0] == ':' {
			continue
		}
		name, value, found := strings.Cut(line, ":")
		if found {
			value = strings.TrimPrefix(value, " ")
		}
		switch name {
		case "event":
			typ = value
		case "data":
			data += value + "\n"
		case "id":
			if !strings.Contains(value, "\x00") {
				id = value
			}
		case "retry":
			if value != "" && strings.Trim(value, "0123456789") == "" {
				n, err := strconv.ParseInt(value, 10, 64)
				if err != nil {
					n = math.MaxInt64 // only digits, so the error is a range error
				}
				retry = n
			}
		}
	}
}

// relayResult is what the relay emulation saw.
type relayResult struct {
	events     []refEvent
	boundaries int
	out        []byte // block bytes "written to the client"
	leftover   []byte // bytes held at EOF
	pending    bool
	err        error
}

// relay drives a Framer the way the proxy does: reads land in a raw buffer,
// Push runs on the unconsumed part, each block's raw bytes are written out at
// its boundary, and the unwritten tail moves to the front before the next
// read. chunks are the reads. each, if non-nil, sees every boundary's event.
func relay(t testing.TB, f *Framer, chunks [][]byte, each func(ev *Event)) relayResult {
	t.Helper()
	var r relayResult
	var raw []byte
	blockStart, pos := 0, 0
	for _, c := range chunks {
		raw = append(raw, c...)
		for {
			n, boundary, err := f.Push(raw[pos:])
			if n < 0 || n > len(raw)-pos {
				t.Fatalf("Push returned n=%d for %d bytes", n, len(raw)-pos)
			}
			pos += n
			if err != nil {
				r.err = err
				return r
			}
			if !boundary {
				if pos < len(raw) && n > 0 {
					// Push stopped with bytes left and no boundary: those must
					// be a partial line.
					if bytes.ContainsAny(raw[pos:], "\r\n") {
						t.Fatalf("Push left a complete line unconsumed: %q", raw[pos:])
					}
				}
				break
			}
			r.boundaries++
			r.out = append(r.out, raw[blockStart:pos]...)
			ev := f.Event()
			if ev != nil {
				r.events = append(r.events, toRef(ev))
			}
			if each != nil {
				each(ev)
			}
			blockStart = pos
		}
		m := copy(raw, raw[blockStart:])
		raw = raw[:m]
		pos -= blockStart
		blockStart = 0
	}
	r.leftover = raw
	r.pending = f.inEvent() || pos < len(raw)
	return r
}

// chunksAt splits s at the given offsets.
func chunksAt(s []byte, offsets ...int) [][]byte {
	var out [][]byte
	prev := 0
	for _, o := range offsets {
		out = append(out, s[prev:o])
		prev = o
	}
	return append(out, s[prev:])
}

// conformance holds the vectors of the WHATWG SSE parsing rules a robust
// parser must follow, and a few more edge cases.
var conformance = []struct {
	name    string
	in      string
	want    []refEvent
	pending bool
}{
	{"lf", "data: a\n\n", []refEvent{{Data: "a", Retry: -1}}, false},
	{"crlf no space", "data:a\r\n\r\n", []refEvent{{Data: "a", Retry: -1}}, false},
	{"lone cr", "data: a\r\rdata: b\r\r", []refEvent{{Data: "a", Retry: -1}, {Data: "b", Retry: -1}}, false},
	{"mixed endings", "data: a\r\ndata: b\rdata: c\n\r\n", []refEvent{{Data: "a\nb\nc", Retry: -1}}, false},
	{"multi line", "data: a\ndata: b\n\n", []refEvent{{Data: "a\nb", Retry: -1}}, false},
	{"data without colon", "data\n\n", []refEvent{{Data: "", Retry: -1}}, false},
	{"data then empty", "data\ndata\n\n", []refEvent{{Data: "\n", Retry: -1}}, false},
	{"comment only", ": ping\n\n", nil, false},
	{"event without data", "event: x\n\n", nil, false},
	{"id without data", "id: 7\n\n", nil, false},
	{"bom", "\xEF\xBB\xBFdata: a\n\n", []refEvent{{Data: "a", Retry: -1}}, false},
	{"second bom is a field name", "\xEF\xBB\xBF\xEF\xBB\xBFdata: a\n\n", nil, false},
	{"case sensitive", "Data: a\n\n", nil, false},
	{"two spaces keep one", "data:  a\n\n", []refEvent{{Data: " a", Retry: -1}}, false},
	{"colon in value", "data: {\"a\":1}\n\n", []refEvent{{Data: `{"a":1}`, Retry: -1}}, false},
	{"trailing space in name", "data : a\n\n", nil, false},
	{"unterminated line at eof", "data: a", nil, true},
	{"unterminated event at eof", "data: a\n", nil, true},
	{"retry not digits", "retry: 10x\ndata: a\n\n", []refEvent{{Data: "a", Retry: -1}}, false},
	{"retry digits", "retry: 1500\ndata: a\n\n", []refEvent{{Data: "a", Retry: 1500}}, false},
	{"retry empty", "retry:\ndata: a\n\n", []refEvent{{Data: "a", Retry: -1}}, false},
	{"retry huge saturates", "retry: 99999999999999999999\ndata: a\n\n", []refEvent{{Data: "a", Retry: math.MaxInt64}}, false},
	{"retry only for its block", "retry: 5\ndata: a\n\ndata: b\n\n", []refEvent{{Data: "a", Retry: 5}, {Data: "b", Retry: -1}}, false},
	{"id with nul ignored", "id: a\x00b\ndata: x\n\n", []refEvent{{Data: "x", Retry: -1}}, false},
	{"id persists", "id: 1\ndata: a\n\ndata: b\n\nid\ndata: c\n\n",
		[]refEvent{{Data: "a", ID: "1", Retry: -1}, {Data: "b", ID: "1", Retry: -1}, {Data: "c", Retry: -1}}, false},
	{"id set by undispatched block", "id: 9\n\ndata: a\n\n", []refEvent{{Data: "a", ID: "9", Retry: -1}}, false},
	{"type reset after dispatch", "event: x\ndata: a\n\ndata: b\n\n", []refEvent{{Type: "x", Data: "a", Retry: -1}, {Data: "b", Retry: -1}}, false},
	{"type reset after empty block", "event: x\n\ndata: b\n\n", []refEvent{{Data: "b", Retry: -1}}, false},
	{"last event field wins", "event: x\nevent: y\ndata: a\n\n", []refEvent{{Type: "y", Data: "a", Retry: -1}}, false},
	{"unknown field ignored", "foo: bar\ndata: a\n\n", []refEvent{{Data: "a", Retry: -1}}, false},
	{"leading blank lines", "\n\r\n\rdata: a\n\n", []refEvent{{Data: "a", Retry: -1}}, false},
	{"cr at eof ends line", "data: a\r\r", []refEvent{{Data: "a", Retry: -1}}, false},
	{"empty stream", "", nil, false},
	{"partial bom at eof", "\xEF\xBB", nil, true},
	{"non-utf8 passes through", "data: \xff\xfe\n\n", []refEvent{{Data: "\xff\xfe", Retry: -1}}, false},
}

func TestReferenceMatchesVectors(t *testing.T) {
	// The reference is only useful if it is right: hold it to the vectors too.
	for _, tt := range conformance {
		got, _, pending := refParse([]byte(tt.in))
		if !equalEvents(got, tt.want) || pending != tt.pending {
			t.Errorf("%s: reference gives %v pending %v, want %v pending %v", tt.name, got, pending, tt.want, tt.pending)
		}
	}
}

func TestFramerConformance(t *testing.T) {
	for _, tt := range conformance {
		t.Run(tt.name, func(t *testing.T) {
			in := []byte(tt.in)
			// Whole, then split into two reads at every offset, then one byte
			// per read (which also splits every CRLF).
			splits := [][][]byte{{in}}
			for k := 0; k <= len(in); k++ {
				splits = append(splits, chunksAt(in, k))
			}
			var bytewise [][]byte
			for i := range in {
				bytewise = append(bytewise, in[i:i+1])
			}
			splits = append(splits, bytewise)
			for _, chunks := range splits {
				r := relay(t, NewFramer(1<<20), chunks, nil)
				if r.err != nil {
					t.Fatalf("chunks %q: %v", chunks, r.err)
				}
				if !equalEvents(r.events, tt.want) || r.pending != tt.pending {
					t.Fatalf("chunks %q: got %v pending %v, want %v pending %v", chunks, r.events, r.pending, tt.want, tt.pending)
				}
				if got := string(r.out) + string(r.leftover); got != tt.in {
					t.Fatalf("chunks %q: relayed bytes %q differ from input", chunks, got)
				}
			}
		})
	}
}

func TestCRLFSplitAtBoundary(t *testing.T) {
	// A CRLF split across reads: "data: a\r" then "\n\n" is one event, with
	// no spurious blank line from the split CRLF.
	f := NewFramer(0)
	n, boundary, err := f.Push([]byte("data: a\r"))
	if n != 8 || boundary || err != nil {
		t.Fatalf("first Push = %d, %v, %v", n, boundary, err)
	}
	n, boundary, err = f.Push([]byte("\n\n"))
	if n != 2 || !boundary || err != nil || f.Event() == nil || string(f.Event().Data) != "a" {
		t.Fatalf("second Push = %d, %v, %v, event %v", n, boundary, err, f.Event())
	}
	// A CR ending a blank line at the end of a read: the LF that follows
	// belongs to it and must not start a new event.
	f.Reset()
	if _, b, _ := f.Push([]byte("data: a\r\r")); !b || f.Event() == nil {
		t.Fatal("blank line ending in CR did not dispatch")
	}
	n, boundary, _ = f.Push([]byte("\n"))
	if n != 1 || boundary || f.inEvent() {
		t.Fatalf("LF after CR: n=%d boundary=%v inEvent=%v, want the LF consumed alone", n, boundary, f.inEvent())
	}
	n, boundary, _ = f.Push([]byte("\ndata: b\n\n"))
	if n != 1 || !boundary || f.Event() != nil {
		t.Fatalf("a real blank line after it: n=%d boundary=%v event=%v", n, boundary, f.Event())
	}
}

func TestEventValidUntilNextPush(t *testing.T) {
	f := NewFramer(0)
	if _, b, _ := f.Push([]byte("event: x\ndata: a\n\n")); !b {
		t.Fatal("no boundary")
	}
	ev := f.Event()
	if string(ev.Type) != "x" || string(ev.Data) != "a" || ev.Retry != -1 {
		t.Fatalf("event = %v", toRef(ev))
	}
	if f.Event() != ev {
		t.Fatal("Event changed without a Push")
	}
	if n, b, _ := f.Push([]byte("data: partial")); n != 0 || b || f.Event() != nil {
		t.Fatalf("Push of a partial line: n=%d boundary=%v event=%v", n, b, f.Event())
	}
}

func TestEventTooLarge(t *testing.T) {
	t.Run("line without end", func(t *testing.T) {
		f := NewFramer(100)
		_, _, err := f.Push(bytes.Repeat([]byte("x"), 101))
		if !errors.Is(err, ErrEventTooLarge) {
			t.Fatalf("err = %v", err)
		}
		if _, _, err2 := f.Push([]byte("data: a\n\n")); !errors.Is(err2, ErrEventTooLarge) {
			t.Fatalf("error not sticky: %v", err2)
		}
		f.Reset()
		if _, b, err := f.Push([]byte("data: a\n\n")); err != nil || !b {
			t.Fatalf("after Reset: %v %v", b, err)
		}
	})
	t.Run("line at the cap is fine", func(t *testing.T) {
		f := NewFramer(100)
		if n, _, err := f.Push(bytes.Repeat([]byte("x"), 100)); n != 0 || err != nil {
			t.Fatalf("n=%d err=%v", n, err)
		}
	})
	t.Run("data lines together", func(t *testing.T) {
		// Each line is well under the cap; together they are not.
		line := "data: " + strings.Repeat("y", 30) + "\n"
		f := NewFramer(100)
		_, _, err := f.Push([]byte(strings.Repeat(line, 3) + line + "\n"))
		if !errors.Is(err, ErrEventTooLarge) {
			t.Fatalf("err = %v", err)
		}
		// The same lines split over several pushes.
		f = NewFramer(100)
		var got error
		for range 4 {
			if _, _, got = f.Push([]byte(line)); got != nil {
				break
			}
		}
		if !errors.Is(got, ErrEventTooLarge) {
			t.Fatalf("err over pushes = %v", got)
		}
	})
	t.Run("events under the cap each", func(t *testing.T) {
		ev := "data: " + strings.Repeat("z", 80) + "\n\n" // 87 bytes + blank line
		r := relay(t, NewFramer(100), [][]byte{[]byte(strings.Repeat(ev, 50))}, nil)
		if r.err != nil || len(r.events) != 50 {
			t.Fatalf("err %v, %d events", r.err, len(r.events))
		}
	})
	t.Run("reader", func(t *testing.T) {
		rd := NewReader(strings.NewReader("data: ok\n\ndata: "+strings.Repeat("q", 5000)+"\n\n"), 1000)
		if ev, err := rd.Next(); err != nil || string(ev.Data) != "ok" {
			t.Fatalf("first event: %v", err)
		}
		if _, err := rd.Next(); !errors.Is(err, ErrEventTooLarge) {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestLargeEvent(t *testing.T) {
	payload := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	stream := append(append([]byte("data: "), payload...), "\n\n"...)
	rd := NewReader(iotest.HalfReader(bytes.NewReader(stream)), 2<<20)
	ev, err := rd.Next()
	if err != nil || !bytes.Equal(ev.Data, payload) {
		t.Fatalf("1 MiB event: err %v, %d bytes", err, len(ev.Data))
	}
	if _, err := rd.Next(); err != io.EOF || rd.Truncated() {
		t.Fatalf("end: %v truncated %v", err, rd.Truncated())
	}
	// The same event in one Push.
	r := relay(t, NewFramer(2<<20), [][]byte{stream}, nil)
	if r.err != nil || len(r.events) != 1 || len(r.events[0].Data) != len(payload) {
		t.Fatalf("relay: %v, %d events", r.err, len(r.events))
	}
	// And just over a cap of 1 MiB.
	if _, err := NewReader(bytes.NewReader(stream), 1<<20).Next(); !errors.Is(err, ErrEventTooLarge) {
		t.Fatalf("1 MiB + 6 under a 1 MiB cap: %v", err)
	}
}

func TestLineEndLongLines(t *testing.T) {
	// CR-only and LF-only streams with long lines: lineEnd must find the
	// first end wherever it is, across its search windows.
	for _, size := range []int{0, 1, 511, 512, 513, 1500, 70000, 200000} {
		for _, end := range []string{"\r", "\n", "\r\n"} {
			buf := append(bytes.Repeat([]byte("a"), size), end...)
			buf = append(buf, "bbb\n"...)
			if got := lineEnd(buf); got != size {
				t.Fatalf("size %d end %q: lineEnd = %d", size, end, got)
			}
		}
		if got := lineEnd(bytes.Repeat([]byte("a"), size)); got != -1 {
			t.Fatalf("no line end in %d bytes: got %d", size, got)
		}
	}
}

func TestReader(t *testing.T) {
	t.Run("one byte reads", func(t *testing.T) {
		in := "\xEF\xBB\xBF: c\r\nevent: e\r\ndata: 1\r\n\r\ndata: 2\r\rdata: 3\n"
		rd := NewReader(iotest.OneByteReader(strings.NewReader(in)), 0)
		var got []refEvent
		for {
			ev, err := rd.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, toRef(ev))
		}
		want := []refEvent{{Type: "e", Data: "1", Retry: -1}, {Data: "2", Retry: -1}}
		if !equalEvents(got, want) || !rd.Truncated() {
			t.Fatalf("got %v truncated %v", got, rd.Truncated())
		}
		if _, err := rd.Next(); err != io.EOF {
			t.Fatalf("Next after EOF: %v", err)
		}
	})
	t.Run("clean end", func(t *testing.T) {
		rd := NewReader(strings.NewReader("data: a\n\n"), 0)
		if _, err := rd.Next(); err != nil {
			t.Fatal(err)
		}
		if _, err := rd.Next(); err != io.EOF || rd.Truncated() {
			t.Fatalf("err %v truncated %v", err, rd.Truncated())
		}
	})
	t.Run("read error", func(t *testing.T) {
		boom := errors.New("boom")
		rd := NewReader(io.MultiReader(strings.NewReader("data: a\n\ndata: b"), iotest.ErrReader(boom)), 0)
		if ev, err := rd.Next(); err != nil || string(ev.Data) != "a" {
			t.Fatalf("first: %v", err)
		}
		if _, err := rd.Next(); !errors.Is(err, boom) {
			t.Fatalf("err = %v, want boom", err)
		}
	})
	t.Run("no progress", func(t *testing.T) {
		rd := NewReader(zeroReader{}, 0)
		if _, err := rd.Next(); !errors.Is(err, io.ErrNoProgress) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("reset", func(t *testing.T) {
		rd := NewReader(strings.NewReader("id: 1\ndata: a\n\ndata: partial"), 0)
		rd.Next()
		rd.Next()
		rd.Reset(strings.NewReader("data: b\n\n"))
		ev, err := rd.Next()
		if err != nil || string(ev.Data) != "b" || len(ev.ID) != 0 {
			t.Fatalf("after Reset: %v %v", ev, err)
		}
	})
}

type zeroReader struct{}

func (zeroReader) Read([]byte) (int, error) { return 0, nil }

// chunkReader returns its data in reads of the given sizes, cycling.
type chunkReader struct {
	data  []byte
	sizes []int
	i     int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := min(c.sizes[c.i%len(c.sizes)], len(p), len(c.data))
	c.i++
	copy(p, c.data[:n])
	c.data = c.data[n:]
	return n, nil
}

// splitSizes turns fuzz bytes into read sizes of 1 to 64 bytes.
func splitSizes(b []byte) []int {
	if len(b) == 0 {
		return []int{1 << 30}
	}
	sizes := make([]int, len(b))
	for i, c := range b {
		sizes[i] = 1 + int(c%64)
	}
	return sizes
}

func chunksBySizes(s []byte, sizes []int) [][]byte {
	var out [][]byte
	for i := 0; len(s) > 0; i++ {
		n := min(sizes[i%len(sizes)], len(s))
		out = append(out, s[:n])
		s = s[n:]
	}
	return out
}

// FuzzFramer compares the Framer, driven like the relay with reads split at
// fuzzed points, and the Reader, with the reference parser: same events, same
// pending state at EOF, every byte relayed unchanged. With a small cap, the
// framer must fail exactly when the reference sees an oversized block, after
// dispatching exactly the events before it.
func FuzzFramer(f *testing.F) {
	for _, tt := range conformance {
		f.Add([]byte(tt.in), []byte{0, 3, 1})
	}
	f.Add([]byte("data: a\r"), []byte{7})
	f.Add([]byte("event: message_start\r\ndata: {\"type\":\"message_start\"}\r\n\r\n"), []byte{10, 0, 5})
	f.Add([]byte(": keep-alive\n\ndata: {\"choices\":[]}\n\ndata: [DONE]\n\n"), []byte{1})
	f.Add([]byte("data:x\r\r\n\n\r\n"), []byte{0, 0, 0})
	f.Add([]byte("id\nretry:12\nretry: 7\ndata\n\n"), []byte{2, 63})
	f.Fuzz(func(t *testing.T, stream, split []byte) {
		want, sizes, pending := refParse(stream)
		chunks := chunksBySizes(stream, splitSizes(split))

		r := relay(t, NewFramer(len(stream)+1), chunks, nil)
		if r.err != nil {
			t.Fatalf("error under a cap larger than the stream: %v", r.err)
		}
		if !equalEvents(r.events, want) || r.pending != pending {
			t.Fatalf("framer %v pending %v; reference %v pending %v", r.events, r.pending, want, pending)
		}
		if !bytes.Equal(append(r.out, r.leftover...), stream) {
			t.Fatalf("relayed bytes differ from the stream")
		}

		rd := NewReader(&chunkReader{data: stream, sizes: splitSizes(split)}, len(stream)+1)
		var got []refEvent
		for {
			ev, err := rd.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("Reader: %v", err)
			}
			got = append(got, toRef(ev))
		}
		if !equalEvents(got, want) || rd.Truncated() != pending {
			t.Fatalf("Reader %v truncated %v; reference %v pending %v", got, rd.Truncated(), want, pending)
		}

		// A small cap: the first oversized block decides.
		limit := 8
		if len(split) > 0 {
			limit += int(split[0])
		}
		first := -1
		for i, s := range sizes {
			if s > limit {
				first = i
				break
			}
		}
		small := relay(t, NewFramer(limit), chunks, nil)
		if (first >= 0) != (small.err != nil) {
			t.Fatalf("cap %d: block sizes %v, framer error %v", limit, sizes, small.err)
		}
		if small.err != nil && !errors.Is(small.err, ErrEventTooLarge) {
			t.Fatalf("cap error %v does not wrap ErrEventTooLarge", small.err)
		}
		if first >= 0 {
			before, _, _ := refParse(blocksPrefix(stream, first))
			if !equalEvents(small.events, before) {
				t.Fatalf("cap %d: framer dispatched %v before failing, want %v", limit, small.events, before)
			}
		}
	})
}

// blocksPrefix returns the stream up to the end of its first k blocks (k
// blank lines), by the reference's own line splitting.
func blocksPrefix(stream []byte, k int) []byte {
	off := 0
	if bytes.HasPrefix(stream, bom) {
		off = len(bom)
	}
	for blank := 0; blank < k; {
		i := bytes.IndexAny(stream[off:], "\r\n")
		if i < 0 {
			break
		}
		end := off + i + 1
		if stream[off+i] == '\r' && end < len(stream) && stream[end] == '\n' {
			end++
		}
		if i == 0 {
			blank++
		}
		off = end
	}
	return stream[:off]
}

func equalEvents(a, b []refEvent) bool {
	if len(a) == 0 && len(b) == 0 {
		return true
	}
	return reflect.DeepEqual(a, b)
}
