// Package jsonscan walks JSON held in a []byte without allocating: it finds
// the span of each value, iterates an object's members or an array's elements,
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
	i      int   // where to read next while no value is current
	start  int   // first byte of the current value
	end    int   // just past the current value; -1 until it is known
	key    []byte
	open   int // for a child: index of its opening bracket in b
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
	if i >= len(b) || b[i] != open {
		return Iter{}
	}
	return Iter{b: b, i: i + 1, end: -1, depth: 1, obj: open == '{', state: iterFirst}
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
	return Iter{b: it.b, parent: it, i: s + 1, end: -1, open: s, depth: it.depth + 1, obj: c == '{', state: iterFirst}
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
func (it *Iter) Next() bool {
	b := it.b
	var i int
	switch it.state {
	case iterFirst:
		i = it.i
	case iterAfter:
		if it.end < 0 && !it.skipCurrent() {
			return false
		}
		i = it.end
	default:
		return false
	}
	closer := byte(']')
	if it.obj {
		closer = '}'
	}
	i = skipWS(b, i)
	if i >= len(b) {
		return it.fail()
	}
	switch {
	case b[i] == closer:
		// A closer right after a comma ("[1,]") cannot get here: the comma
		// branch below goes straight on to read a value, which fails.
		return it.close(i + 1)
	case it.state == iterAfter:
		if b[i] != ',' {
			return it.fail()
		}
		i = skipWS(b, i+1)
	}
	if it.obj {
		if i >= len(b) || b[i] != '"' {
			return it.fail()
		}
		end, esc, ok := skipString(b, i)
		if !ok {
			return it.fail()
		}
		// Slicing it.b, not the local b, lets escape analysis see a
		// self-assignment, so iterators stay on the stack.
		it.key, it.keyEsc = it.b[i+1:end-1], esc
		i = skipWS(b, end)
		if i >= len(b) || b[i] != ':' {
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

// skipCurrent scans to the end of the current value.
func (it *Iter) skipCurrent() bool {
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
	it.state = iterDone
	it.key = nil
	return false
}

func (it *Iter) fail() bool {
	it.state = iterBad
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
		return string(it.key) == lit
	}
	return Equal(it.key, lit)
}

// Value returns the current value's span, scanning to its end if needed. It
// returns nil when there is no current value or the value is malformed (the
// iteration then ends with ErrSyntax).
func (it *Iter) Value() []byte {
	if it.state != iterAfter || (it.end < 0 && !it.skipCurrent()) {
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

// skipValue returns the index just past the value starting exactly at b[i],
// which may nest arrays and objects at most budget levels deep.
func skipValue(b []byte, i, budget int) (int, bool) {
	if i >= len(b) {
		return 0, false
	}
	switch c := b[i]; c {
	case '"':
		end, _, ok := skipString(b, i)
		return end, ok
	case '{', '[':
		return skipContainer(b, i, budget)
	default:
		return skipScalar(b, i)
	}
}

// skipScalar steps over a number or a literal starting at b[i].
func skipScalar(b []byte, i int) (int, bool) {
	switch b[i] {
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
	if i < len(b) && b[i] == '-' {
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
	if i < len(b) && b[i] == '.' {
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
func skipString(b []byte, i int) (end int, esc, ok bool) {
	j := i + 1
	for {
		// Eight bytes at a time while none of them needs a look: most of a
		// chunk's bytes are plain string contents.
		for j+8 <= len(b) && !hasSpecial(binary.LittleEndian.Uint64(b[j:])) {
			j += 8
		}
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
	}
}

// hasSpecial reports whether any of the eight bytes in x is a quote, a
// backslash or a control character, with the usual SWAR tests: (v-0x01…) &^ v
// & 0x80… is non-zero exactly when some byte of v is zero, and (x-0x20…) &^ x
// & 0x80… exactly when some byte of x is below 0x20.
func hasSpecial(x uint64) bool {
	const lo, hi = 0x0101010101010101, 0x8080808080808080
	q := x ^ (lo * '"')
	bs := x ^ (lo * '\\')
	return ((x-lo*0x20)&^x|(q-lo)&^q|(bs-lo)&^bs)&hi != 0
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
func skipContainer(b []byte, i, budget int) (int, bool) {
	var objs [MaxDepth / 64]uint64
	depth := 0
	push := func(c byte) bool {
		if depth >= budget {
			return false
		}
		if c == '{' {
			objs[depth/64] |= 1 << (depth % 64)
		} else {
			objs[depth/64] &^= 1 << (depth % 64)
		}
		depth++
		return true
	}
	inObj := func() bool { return objs[(depth-1)/64]&(1<<((depth-1)%64)) != 0 }

	const (
		stFirst = iota // just opened: a value or the closer
		stElem         // after a comma: a value
		stAfter        // after a value: a comma or the closer
	)
	if !push(b[i]) {
		return 0, false
	}
	i++
	state := stFirst
	for {
		i = skipWS(b, i)
		if i >= len(b) {
			return 0, false
		}
		c := b[i]
		closer := byte(']')
		if inObj() {
			closer = '}'
		}
		if c == closer && state != stElem {
			depth--
			i++
			if depth == 0 {
				return i, true
			}
			state = stAfter
			continue
		}
		if state == stAfter {
			if c != ',' {
				return 0, false
			}
			i++
			state = stElem
			continue
		}
		if inObj() {
			if c != '"' {
				return 0, false
			}
			end, _, ok := skipString(b, i)
			if !ok {
				return 0, false
			}
			i = skipWS(b, end)
			if i >= len(b) || b[i] != ':' {
				return 0, false
			}
			i = skipWS(b, i+1)
			if i >= len(b) {
				return 0, false
			}
			c = b[i]
		}
		switch c {
		case '{', '[':
			if !push(c) {
				return 0, false
			}
			i++
			state = stFirst
		case '"':
			end, _, ok := skipString(b, i)
			if !ok {
				return 0, false
			}
			i, state = end, stAfter
		default:
			end, ok := skipScalar(b, i)
			if !ok {
				return 0, false
			}
			i, state = end, stAfter
		}
	}
}
