// Package jsonscan walks JSON held in a []byte without allocating: it finds
// the span of each value, iterates an object's members or an array's elements
// ([Iter], or by position with [Member], [Element] and [Skip] on hot paths),
// and reads the few scalar shapes the gateway's decoders need (integers,
// strings, emptiness of a string).
//
// Values are handled as spans: a value is the sub-slice of the input that holds
// its JSON text exactly ("abc" with its quotes, {…}, 12, null), with no
// surrounding whitespace. Nothing is copied; every returned slice aliases the
// input.
//
// The scanner validates the JSON grammar of every value it steps over
// (RFC 8259: string escapes, control characters, number syntax, literals,
// matching brackets, commas and colons) and reports malformed input as false or
// [ErrSyntax]; it never panics and always makes progress. UTF-8 validity of
// string bytes is not checked (bytes >= 0x80 pass through, as in
// encoding/json's scanner). Nesting deeper than [MaxDepth] is rejected as
// malformed.
//
// Keys and strings are returned raw, with escapes still in them. Keys with
// escapes are not treated as non-matching: [Equal] and [Iter.KeyIs] compare a
// raw string against a literal by decoding escapes on the fly, so "\u0074ype"
// matches "type" as it does for encoding/json, without a buffer. (Only raw
// bytes that are not valid UTF-8 differ: encoding/json would read them as
// U+FFFD.) [AppendUnescape] decodes into a caller-owned buffer.
package jsonscan

import (
	"encoding/binary"
	"errors"
	"math"
	"math/bits"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// ErrSyntax reports malformed JSON.
var ErrSyntax = errors.New("jsonscan: malformed JSON")

// MaxDepth is the deepest nesting of arrays and objects the scanner accepts.
// Deeper input is reported as malformed; no LLM wire object comes near it, and
// the bound keeps skipping iterative with a fixed-size stack.
const MaxDepth = 512

// Kind is the type of a JSON value, read from its first byte.
type Kind uint8

// The kinds of JSON values. KindInvalid is returned for an empty span or one that
// cannot start a value.
const (
	KindInvalid Kind = iota
	KindNull
	KindBool
	KindNumber
	KindString
	KindArray
	KindObject
)

// KindOf returns the kind of the value span v from its first byte; it does not
// validate the rest of v.
func KindOf(v []byte) Kind {
	if len(v) == 0 {
		return KindInvalid
	}
	switch c := v[0]; {
	case c == '"':
		return KindString
	case c == '{':
		return KindObject
	case c == '[':
		return KindArray
	case c == 'n':
		return KindNull
	case c == 't' || c == 'f':
		return KindBool
	case c == '-' || (c >= '0' && c <= '9'):
		return KindNumber
	}
	return KindInvalid
}

// Next returns the first JSON value in b, after optional leading whitespace,
// and the bytes after it. ok is false when b does not start with a valid value.
func Next(b []byte) (v, rest []byte, ok bool) {
	i := skipWS(b, 0)
	end, ok := skipValue(b, i, MaxDepth)
	if !ok {
		return nil, nil, false
	}
	return b[i:end], b[end:], true
}

// Value returns the single JSON value b holds, without the whitespace around
// it. ok is false when b is not exactly one valid value (empty, malformed, or
// followed by anything but whitespace).
func Value(b []byte) (v []byte, ok bool) {
	v, rest, ok := Next(b)
	if !ok || skipWS(rest, 0) != len(rest) {
		return nil, false
	}
	return v, true
}

// String returns the raw contents of the string value v, between its quotes
// and with escapes not decoded. ok is false when v is not a string span.
func String(v []byte) (s []byte, ok bool) {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return nil, false
	}
	return v[1 : len(v)-1], true
}

// NonEmptyString reports whether v is a string value that decodes to at least
// one character. Every escape decodes to a character, so "\u0000" is non-empty
// and only "" is empty.
func NonEmptyString(v []byte) bool {
	return len(v) > 2 && v[0] == '"' && v[len(v)-1] == '"'
}

// Int returns the value of the number v when it is an integer in JSON syntax
// (an optional minus, then 0 or digits without a leading zero) that fits in an
// int64. Fractions and exponents (1.0, 1e3) are not integers here: token
// counts are sent as plain integers, and guessing at others would hide a
// misbehaving upstream.
func Int(v []byte) (int64, bool) {
	neg := false
	if len(v) > 0 && v[0] == '-' {
		neg = true
		v = v[1:]
	}
	if len(v) == 0 || (v[0] == '0' && len(v) > 1) {
		return 0, false
	}
	var n uint64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		if n > (1<<63)/10 {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
		if n > 1<<63 {
			return 0, false
		}
	}
	if neg {
		return -int64(n), true // -(1<<63) wraps to itself, which is MinInt64
	}
	if n > 1<<63-1 {
		return 0, false
	}
	return int64(n), true
}

// Equal reports whether the raw string contents s (as returned by [String] or
// [Iter.Key]) decode to lit. Escapes are decoded on the fly without a buffer;
// a malformed escape never matches. Bytes that are not escapes are compared
// as they are, without UTF-8 validation.
func Equal(s []byte, lit string) bool {
	if !hasBackslash(s) {
		return string(s) == lit
	}
	j := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c != '\\' {
			if j >= len(lit) || lit[j] != c {
				return false
			}
			i++
			j++
			continue
		}
		r, n := unescape(s[i:])
		if n == 0 {
			return false
		}
		i += n
		if r < utf8.RuneSelf {
			if j >= len(lit) || lit[j] != byte(r) {
				return false
			}
			j++
			continue
		}
		var buf [utf8.UTFMax]byte
		w := utf8.EncodeRune(buf[:], r)
		if len(lit)-j < w {
			return false
		}
		for k := 0; k < w; k++ {
			if lit[j+k] != buf[k] {
				return false
			}
		}
		j += w
	}
	return j == len(lit)
}

// AppendUnescape appends the decoded form of the raw string contents s to dst
// and returns the extended buffer. Unpaired surrogates decode to U+FFFD, as in
// encoding/json; a malformed escape is copied through unchanged (it cannot
// occur in contents that came from a validated value).
func AppendUnescape(dst, s []byte) []byte {
	for i := 0; i < len(s); {
		j := i
		for j < len(s) && s[j] != '\\' {
			j++
		}
		dst = append(dst, s[i:j]...)
		if j == len(s) {
			break
		}
		r, n := unescape(s[j:])
		if n == 0 {
			dst = append(dst, '\\')
			i = j + 1
			continue
		}
		dst = utf8.AppendRune(dst, r)
		i = j + n
	}
	return dst
}

// Get returns the value of key in the object span obj. When the key occurs
// more than once the last occurrence wins, as in encoding/json. ok is false
// when the key is absent or obj is not a well-formed object.
func Get(obj []byte, key string) (v []byte, ok bool) {
	it := Object(obj)
	for it.Next() {
		if it.KeyIs(key) {
			v = it.Value()
		}
	}
	if it.Err() != nil || v == nil {
		return nil, false
	}
	return v, true
}

// Iter steps through the members of an object or the elements of an array.
// The zero Iter yields nothing and reports ErrSyntax.
//
// Values are stepped over lazily: Next finds where the current value starts,
// and only Value, or the following Next, scans to its end. Enter instead walks
// into the current object or array with a child iterator; once the child has
// reached the closing bracket, the parent resumes right after it, so a
// document walked by descending is scanned once rather than once per level.
//
// Everything stepped over is validated, so once Next has returned false, Err
// tells whether the whole container was well-formed. Results gathered during
// the walk must be discarded when it reports an error: a malformed value can
// come after the members already seen, or inside the current one (Value then
// returns nil).
//
// Typical use:
//
//	it := jsonscan.Object(b)
//	for it.Next() {
//		switch {
//		case it.KeyIs("usage") && it.Kind() == jsonscan.KindObject:
//			u := it.Enter()
//			for u.Next() { … }
//		case it.KeyIs("id"):
//			id = it.Value()
//		}
//	}
//	if it.Err() != nil { … }
type Iter struct {
	b      []byte
	parent *Iter // for a child made by Enter: the iterator to resume
	open   int   // index of the opening bracket in b
	start  int   // first byte of the current value
	end    int   // just past the current value; -1 while unknown or none
	key    []byte
	depth  int // nesting of this container: 1 for Object(b) and Array(b)
	keyEsc bool
	obj    bool
	state  iterState
}

type iterState uint8

const (
	iterBad   iterState = iota // not started on a container, or malformed
	iterFirst                  // after the opening bracket
	iterAfter                  // a value is current
	iterDone                   // closed cleanly
)

// Object returns an iterator over the members of the object b holds. b must
// be exactly one object with optional whitespace around it; otherwise the
// iteration ends with ErrSyntax.
func Object(b []byte) Iter { return newIter(b, '{') }

// Array returns an iterator over the elements of the array b holds, under the
// same rules as Object.
func Array(b []byte) Iter { return newIter(b, '[') }

func newIter(b []byte, open byte) Iter {
	i := skipWS(b, 0)
	if !at(b, i, open) {
		return Iter{}
	}
	return Iter{b: b, open: i, end: -1, depth: 1, obj: open == '{', state: iterFirst}
}

// Enter returns an iterator over the current value when it is an object or an
// array (see Kind), and an iterator that yields nothing and reports ErrSyntax
// otherwise. The child is valid while it (the parent) stays on this value:
// advance the child, then the parent. If the child is left before its end,
// the parent's next step scans the value again from its start.
func (it *Iter) Enter() Iter {
	if it.state != iterAfter || it.depth >= MaxDepth {
		return Iter{}
	}
	s := it.start
	c := it.b[s]
	if c != '{' && c != '[' {
		return Iter{}
	}
	return Iter{b: it.b, parent: it, open: s, end: -1, depth: it.depth + 1, obj: c == '{', state: iterFirst}
}

// Kind returns the kind of the current value from its first byte, without
// scanning it; KindInvalid when there is no current value.
func (it *Iter) Kind() Kind {
	if it.state != iterAfter {
		return KindInvalid
	}
	return KindOf(it.b[it.start:])
}

// Next advances to the next member or element and reports whether there is
// one. It returns false at the end of the container and on malformed input.
//
// The body is the fast path for the usual step in compact JSON: a comma
// after the current value, then a key without escapes, a colon and the next
// value, with no whitespace. A string value is stepped over inline, any
// other costs one call. Every other step (the first, the last, whitespace,
// escapes) goes to nextSlow, which handles all cases; splitting them keeps
// the fast path short and free of the calls that make the compiler spill
// registers.
func (it *Iter) Next() bool {
	b := it.b
	var i int
	switch it.state {
	case iterAfter:
		if i = it.end; i < 0 {
			s := it.start
			if b[s] != '"' {
				var ok bool
				if i, ok = skipValue(it.b, s, MaxDepth-it.depth); !ok {
					return it.fail()
				}
				b = it.b
			} else if i = plainRun(b, s+1); at(b, i, '"') {
				i++
			} else {
				return it.nextSlow()
			}
			it.end = i
		}
		if !at(b, i, ',') {
			return it.nextSlow()
		}
		i++
	case iterFirst:
		i = it.open + 1
	default:
		return false
	}
	// A key (in an object) or a value (in an array) starts at b[i].
	if !it.obj {
		if i >= len(b) || b[i] <= ' ' || b[i] == ']' {
			return it.nextSlow()
		}
		it.start, it.end, it.state = i, -1, iterAfter
		return true
	}
	if !at(b, i, '"') {
		return it.nextSlow()
	}
	end := plainRun(b, i+1)
	// end < 0 cannot be; saying so lets the compiler drop three bounds checks.
	if end < 0 || end >= len(b)-2 || b[end] != '"' || b[end+1] != ':' || b[end+2] <= ' ' {
		return it.nextSlow()
	}
	// Slicing it.b, not the local b, lets escape analysis see a
	// self-assignment, so iterators stay on the stack.
	it.key, it.keyEsc = it.b[i+1:end], false
	it.start, it.end, it.state = end+2, -1, iterAfter
	return true
}

// nextSlow is Next for every case.
func (it *Iter) nextSlow() bool {
	b := it.b
	closer := byte(']')
	if it.obj {
		closer = '}'
	}
	var i int
	switch it.state {
	case iterFirst:
		if i = skipWS(b, it.open+1); at(b, i, closer) {
			return it.close(i + 1)
		}
	case iterAfter:
		if i = it.end; i < 0 {
			ok := true
			if i, ok = skipValue(b, it.start, MaxDepth-it.depth); !ok {
				return it.fail()
			}
		}
		if i = skipWS(b, i); at(b, i, closer) {
			return it.close(i + 1)
		}
		if !at(b, i, ',') {
			return it.fail()
		}
		// A closer right after the comma ("[1,]") fails below, where a
		// key or a value must start.
		i = skipWS(b, i+1)
	default:
		return false
	}
	if it.obj {
		if !at(b, i, '"') {
			return it.fail()
		}
		end, esc, ok := skipString(b, i)
		if !ok {
			return it.fail()
		}
		it.key, it.keyEsc = it.b[i+1:end-1], esc
		if i = skipWS(b, end); !at(b, i, ':') {
			return it.fail()
		}
		i = skipWS(b, i+1)
	}
	if i >= len(b) {
		return it.fail()
	}
	it.start, it.end = i, -1
	it.state = iterAfter
	return true
}

// skipCurrent scans to the end of the current value. It reports false when
// there is no current value, and fails the iteration when the value is
// malformed.
func (it *Iter) skipCurrent() bool {
	if it.state != iterAfter {
		return false
	}
	end, ok := skipValue(it.b, it.start, MaxDepth-it.depth)
	if !ok {
		return it.fail()
	}
	it.end = end
	return true
}

// close ends the container at its closing bracket (end is just past it).
func (it *Iter) close(end int) bool {
	if p := it.parent; p != nil {
		// Hand the end to the parent if it still sits on the value this
		// iterator walked.
		if p.state == iterAfter && p.end < 0 && p.start == it.open {
			p.end = end
		}
	} else if skipWS(it.b, end) != len(it.b) {
		return it.fail()
	}
	it.state, it.end = iterDone, -1
	it.key = nil
	return false
}

func (it *Iter) fail() bool {
	it.state, it.end = iterBad, -1
	it.key = nil
	return false
}

// Key returns the current member's key as raw string contents (escapes not
// decoded); nil for array elements.
func (it *Iter) Key() []byte { return it.key }

// KeyIs reports whether the current member's key decodes to lit. Keys without
// escapes are compared directly; keys with escapes are decoded on the fly
// (see [Equal]).
func (it *Iter) KeyIs(lit string) bool {
	if !it.keyEsc {
		// Inlined: with a constant lit the comparison compiles to a
		// length test and a few word compares.
		return string(it.key) == lit
	}
	return Equal(it.key, lit)
}

// Value returns the current value's span, scanning to its end if needed. It
// returns nil when there is no current value or the value is malformed (the
// iteration then ends with ErrSyntax).
func (it *Iter) Value() []byte {
	// end >= 0 only while a value is current (close and fail reset it), so
	// one test serves both; it keeps Value small enough to be inlined.
	if it.end < 0 && !it.skipCurrent() {
		return nil
	}
	return it.b[it.start:it.end]
}

// Offset returns the index at which the current value starts in the buffer
// given to Object or Array (iterators made by Enter share that buffer), or -1
// when there is no current value. With len(Value()) it locates the value for
// byte-level edits, and it lets a caller keep a value's position without
// keeping a slice derived from the iterator, which would make escape analysis
// move the iterators to the heap.
func (it *Iter) Offset() int {
	if it.state != iterAfter {
		return -1
	}
	return it.start
}

// Err returns ErrSyntax if the container was malformed (or the iterator was
// not started on a container of the right kind), and nil otherwise. It is
// meaningful once Next has returned false.
func (it *Iter) Err() error {
	if it.state == iterBad {
		return ErrSyntax
	}
	return nil
}

// skipWS returns the index of the first non-whitespace byte at or after i.
func skipWS(b []byte, i int) int {
	if i < len(b) && b[i] > ' ' {
		return i // compact JSON: the common case
	}
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// at reports whether b[i] is c, and false when i is out of range. The
// unsigned test lets the compiler drop the bounds check on b[i].
func at(b []byte, i int, c byte) bool {
	return uint(i) < uint(len(b)) && b[i] == c
}

// skipValue returns the index just past the value starting exactly at b[i],
// which may nest arrays and objects at most budget levels deep.
func skipValue(b []byte, i, budget int) (int, bool) {
	if i >= len(b) {
		return 0, false
	}
	switch b[i] {
	case '"':
		if j := plainRun(b, i+1); at(b, j, '"') {
			return j + 1, true
		}
		end, _, ok := finishString(b, i+1)
		return end, ok
	case '{', '[':
		return skipContainer(b, i, budget)
	case 't':
		return skipLiteral(b, i, "true")
	case 'f':
		return skipLiteral(b, i, "false")
	case 'n':
		return skipLiteral(b, i, "null")
	}
	return skipNumber(b, i)
}

func skipLiteral(b []byte, i int, lit string) (int, bool) {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return 0, false
	}
	return i + len(lit), true
}

// skipNumber steps over -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?.
func skipNumber(b []byte, i int) (int, bool) {
	if at(b, i, '-') {
		i++
	}
	if i >= len(b) {
		return 0, false
	}
	switch {
	case b[i] == '0':
		i++
	case b[i] >= '1' && b[i] <= '9':
		i = skipDigits(b, i+1)
	default:
		return 0, false
	}
	if at(b, i, '.') {
		j := skipDigits(b, i+1)
		if j == i+1 {
			return 0, false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := skipDigits(b, i)
		if j == i {
			return 0, false
		}
		i = j
	}
	return i, true
}

func skipDigits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

// strPlain marks the bytes a string may hold without further checks: not a
// quote, not a backslash, not a control character.
var strPlain = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// skipString steps over the string starting at the quote b[i]. esc reports
// whether the contents hold at least one escape.
//
// The hot paths (Iter.Next, Member, skipValue, skipContainer) spell this out
// so that plainRun is inlined there: most strings in a chunk are short keys
// and values without escapes, and for them a call costs as much as the scan.
func skipString(b []byte, i int) (end int, esc, ok bool) {
	if j := plainRun(b, i+1); at(b, j, '"') {
		return j + 1, false, true
	}
	return finishString(b, i+1)
}

// plainRun returns the index of the first quote, backslash or control byte
// at or after j, testing eight bytes at a time: the word that holds one gives
// its position straight from its mask (see specialMask). It stops at the
// first of the last fewer than eight bytes when it reaches them, so its
// result is only a candidate: the caller checks for the closing quote there
// and otherwise calls finishString.
func plainRun(b []byte, j int) int {
	// Spelled j >= 0 && j < len(b)-7 rather than j+8 <= len(b) so that the
	// compiler proves the load in bounds and drops its checks.
	for ; j >= 0 && j < len(b)-7; j += 8 {
		if m := specialMask(binary.LittleEndian.Uint64(b[j:])); m != 0 {
			return j + bits.TrailingZeros64(m)>>3
		}
	}
	return j
}

// finishString steps over the rest of a string from b[j], where j lies within
// its contents and the bytes before j are known to be plain. It decodes
// escapes and handles the last bytes of b that plainRun leaves.
func finishString(b []byte, j int) (end int, esc, ok bool) {
	for {
		for j < len(b) && strPlain[b[j]] {
			j++
		}
		if j >= len(b) {
			return 0, false, false
		}
		switch b[j] {
		case '"':
			return j + 1, esc, true
		case '\\':
			_, n := unescape(b[j:])
			if n == 0 {
				return 0, false, false
			}
			esc = true
			j += n
		default: // control character
			return 0, false, false
		}
		j = plainRun(b, j)
	}
}

// specialMask sets the high bit of the first byte of x (in memory order)
// that is a quote, a backslash or a control character, and is zero when there
// is none. It uses the usual SWAR test: (v-c…) &^ v & 0x80… marks the bytes of
// v below c. XOR with 0x02 swaps 0x20 and 0x22 and keeps 0x00-0x1f in place,
// so the bytes of y below 0x21 are exactly the control characters and '"';
// the bytes of x^'\\' below 0x01 are the backslashes. XOR with an ASCII byte
// keeps every high bit, so one &^ x serves both tests. A borrow can mark
// bytes above the first marked one, never below it: only the lowest set bit
// is exact, and it is all plainRun uses.
func specialMask(x uint64) uint64 {
	const lo, hi = 0x0101010101010101, 0x8080808080808080
	y := x ^ (lo * 0x02) // swaps 0x20 and 0x22: below 0x21 is control or '"'
	bs := x ^ (lo * '\\')
	return ((y - lo*0x21) | (bs - lo)) &^ x & hi
}

// unescape decodes the escape at the start of s (s[0] == '\\'). It returns the
// rune and the number of bytes used, or n == 0 for a malformed escape. A
// surrogate pair written as two \u escapes is joined; a lone surrogate decodes
// to U+FFFD and uses only its own six bytes.
func unescape(s []byte) (r rune, n int) {
	if len(s) < 2 {
		return 0, 0
	}
	switch s[1] {
	case '"', '\\', '/':
		return rune(s[1]), 2
	case 'b':
		return '\b', 2
	case 'f':
		return '\f', 2
	case 'n':
		return '\n', 2
	case 'r':
		return '\r', 2
	case 't':
		return '\t', 2
	case 'u':
		r1, ok := hex4(s[2:])
		if !ok {
			return 0, 0
		}
		if !utf16.IsSurrogate(r1) {
			return r1, 6
		}
		if len(s) >= 12 && s[6] == '\\' && s[7] == 'u' {
			if r2, ok := hex4(s[8:]); ok {
				if dec := utf16.DecodeRune(r1, r2); dec != utf8.RuneError {
					return dec, 12
				}
			}
		}
		return utf8.RuneError, 6
	}
	return 0, 0
}

func hex4(s []byte) (rune, bool) {
	if len(s) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range s[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

func hasBackslash(s []byte) bool {
	for _, c := range s {
		if c == '\\' {
			return true
		}
	}
	return false
}

// skipContainer steps over the array or object starting at b[i], nested at
// most budget levels deep, iteratively: a bit per level records whether that
// level is an object, so depth costs no recursion and no allocation.
//
// It is written as a small state machine with gotos rather than one loop
// around a state variable: after each value the next byte must be a comma or
// the closer, and after a comma a member or an element must follow, so every
// step goes straight to the one check that can come next. Compact JSON is
// the common case, so each step tests for the byte it expects before it
// looks for whitespace.
func skipContainer(b []byte, i, budget int) (int, bool) {
	var (
		objs   [MaxDepth / 64]uint64
		depth  uint
		closer byte
		ok     = true
	)
open: // b[i] is '{' or '['
	if int(depth) >= budget {
		return 0, false
	}
	// depth < budget <= MaxDepth, so the mask only spares a bounds check.
	if b[i] == '{' {
		closer = '}'
		objs[depth/64&(uint(len(objs))-1)] |= 1 << (depth % 64)
	} else {
		closer = ']'
		objs[depth/64&(uint(len(objs))-1)] &^= 1 << (depth % 64)
	}
	depth++
	if i = skipWS(b, i+1); at(b, i, closer) {
		goto closed
	}
member: // a member or an element starts at b[i], maybe after whitespace
	if closer == '}' {
		if !at(b, i, '"') {
			if i = skipWS(b, i); !at(b, i, '"') {
				return 0, false
			}
		}
		if j := plainRun(b, i+1); at(b, j, '"') {
			i = j + 1
		} else if i, _, ok = finishString(b, j); !ok {
			return 0, false
		}
		if !at(b, i, ':') {
			if i = skipWS(b, i); !at(b, i, ':') {
				return 0, false
			}
		}
		i++
	}
value: // a value starts at b[i], maybe after whitespace
	if i >= len(b) {
		return 0, false
	}
	switch b[i] {
	case '"':
		if j := plainRun(b, i+1); at(b, j, '"') {
			i = j + 1
		} else {
			i, _, ok = finishString(b, j)
		}
	case '{', '[':
		goto open
	case 'n':
		i, ok = skipLiteral(b, i, "null")
	case 't':
		i, ok = skipLiteral(b, i, "true")
	case 'f':
		i, ok = skipLiteral(b, i, "false")
	case ' ', '\t', '\n', '\r':
		i = skipWS(b, i)
		goto value
	default:
		i, ok = skipNumber(b, i)
	}
	if !ok {
		return 0, false
	}
after: // a value ended just before b[i]: a comma or the closer follows
	if at(b, i, ',') {
		i++
		goto member
	}
	if i = skipWS(b, i); i >= len(b) {
		return 0, false
	}
	if b[i] == ',' {
		i++
		goto member
	}
	if b[i] != closer {
		return 0, false
	}
closed: // b[i] is the closer of the innermost open container
	i++
	if depth--; depth == 0 {
		return i, true
	}
	closer = ']'
	if objs[(depth-1)/64&(uint(len(objs))-1)]&(1<<((depth-1)%64)) != 0 {
		closer = '}'
	}
	goto after
}

// AppendString appends s as a JSON string, escaped as log/slog's JSON
// handler escapes it (the gateway's logs must match it byte for byte): '"',
// '\\' and control bytes escaped, invalid UTF-8 as \ufffd, U+2028 and
// U+2029 escaped. AppendUnescape undoes it.
func AppendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		if c == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if c == '\u2028' || c == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[c&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// AppendFloat appends f, which must be finite, as encoding/json formats a
// float64 (as log/slog's JSON handler writes one): %f in [1e-6, 1e21),
// else %e with a one-digit negative exponent unpadded.
func AppendFloat(b []byte, f float64) []byte {
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}
