package jsonscan

// Walking by position.
//
// Member, Element and Skip are the steps an Iter takes, as plain functions of
// an index: a decoder that walks a document in one pass keeps the index in a
// local variable and calls them from its own loops. That spares what an Iter
// costs per member (its state lives in memory and every Next is a round trip
// through it), which is most of the cost of decoding a chunk on the relay's
// hot path once scanning itself is fast. Like Iter they validate everything
// they step over, so a walk that reaches the end of the document without a
// false ok has validated all of it.

// SkipWS returns the index of the first byte at or after i that is not JSON
// whitespace, or len(b).
func SkipWS(b []byte, i int) int { return skipWS(b, i) }

// Skip returns the index just past the value that starts at b[i], with no
// whitespace before it. depth is the nesting of the object or array that
// holds the value, 1 for a member of the top-level one, as for Iter: the
// value may nest MaxDepth-depth levels more. ok is false when the value is
// malformed.
func Skip(b []byte, i, depth int) (end int, ok bool) {
	return skipValue(b, i, MaxDepth-depth)
}

// Member steps to the next member of an object. With first, i is just past
// the opening brace; otherwise i is just past the previous member's value,
// and a comma must come next. It returns the member's key as raw string
// contents (esc reports escapes in it) and the index v at which the value
// starts. At the closing brace, more is false and v is the index just past
// it. ok is false on malformed input. Whitespace is allowed wherever JSON
// allows it; compact JSON takes the shortest path.
func Member(b []byte, i int, first bool) (key []byte, esc bool, v int, more, ok bool) {
	if !first {
		if !at(b, i, ',') {
			if i = skipWS(b, i); at(b, i, '}') {
				return nil, false, i + 1, false, true
			}
			if !at(b, i, ',') {
				return nil, false, 0, false, false
			}
		}
		i++
	}
	if !at(b, i, '"') {
		if i = skipWS(b, i); !at(b, i, '"') {
			if first && at(b, i, '}') {
				return nil, false, i + 1, false, true
			}
			return nil, false, 0, false, false
		}
	}
	end := plainRun(b, i+1)
	if at(b, end, '"') {
		end++
	} else if end, esc, ok = finishString(b, end); !ok {
		return nil, false, 0, false, false
	}
	colon := end
	if !at(b, colon, ':') {
		if colon = skipWS(b, colon); !at(b, colon, ':') {
			return nil, false, 0, false, false
		}
	}
	if v = skipWS(b, colon+1); v >= len(b) {
		return nil, false, 0, false, false
	}
	return b[i+1 : end-1], esc, v, true, true
}

// Element is Member for an array: it returns the index v at which the next
// element starts or, at the closing bracket, more false and the index just
// past it.
func Element(b []byte, i int, first bool) (v int, more, ok bool) {
	if !first {
		if !at(b, i, ',') {
			if i = skipWS(b, i); at(b, i, ']') {
				return i + 1, false, true
			}
			if !at(b, i, ',') {
				return 0, false, false
			}
		}
		i++
	}
	if i = skipWS(b, i); i >= len(b) {
		return 0, false, false
	}
	if b[i] == ']' {
		if first {
			return i + 1, false, true
		}
		return 0, false, false // "[1,]"
	}
	return i, true, true
}

// KeyEq reports whether key, raw string contents as Member returns them with
// esc, decodes to lit (see Equal). For a key without escapes and a constant
// lit it is inlined as a length test and a few word compares.
func KeyEq(key []byte, esc bool, lit string) bool {
	if !esc {
		return string(key) == lit
	}
	return Equal(key, lit)
}
