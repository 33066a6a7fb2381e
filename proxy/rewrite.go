package proxy

import (
	"encoding/json"
	"unicode/utf8"

	"github.com/tollgate-llm/tollgate/internal/jsonscan"
	"github.com/tollgate-llm/tollgate/llm"
)

// bodyFor returns the body sent to target t: the model renamed when its
// route says so, and (OpenAI streams) usage asked for when the upstream
// allows it and the caller did not. at.suppressUsage follows.
func (ex *exchange) bodyFor(at *attemptState, t target, body []byte) []byte {
	if t.model != "" {
		if nb, ok := setModel(body, t.model); ok {
			body = nb
		}
	}
	at.suppressUsage = false
	if ex.rec.Dialect == llm.DialectOpenAI && ex.info.Stream && t.up.cfg.IncludeUsage && !ex.info.IncludeUsage {
		if nb, ok := addIncludeUsage(body); ok {
			body = nb
			at.suppressUsage = true
		}
	}
	return body
}

// setModel returns body with every top-level "model" member's value
// replaced by the JSON string of name, every other byte as the caller sent
// it.
func setModel(body []byte, name string) ([]byte, bool) {
	obj, ok := jsonscan.Value(body)
	if !ok || jsonscan.KindOf(obj) != jsonscan.KindObject {
		return body, false
	}
	if !utf8.ValidString(name) { // json.Marshal would turn it into U+FFFD
		return body, false
	}
	q, err := json.Marshal(name) // JSON's escapes, not Go's (\x00, \a, \U…)
	if err != nil {
		return body, false
	}
	out := make([]byte, 0, len(body)+len(q))
	prev := 0
	it := jsonscan.Object(obj)
	for it.Next() {
		if it.KeyIs("model") {
			v := it.Value()
			at := cap(body) - cap(v)
			out = append(out, body[prev:at]...)
			out = append(out, q...)
			prev = at + len(v)
		}
	}
	if it.Err() != nil || prev == 0 {
		return body, false
	}
	return append(out, body[prev:]...), true
}

// includeUsageMember is what the gateway adds to an OpenAI streaming request
// so the upstream reports usage; the usage-only chunk it brings is kept from the caller.
const includeUsageMember = `"include_usage":true`

// addIncludeUsage returns body with stream_options.include_usage set to true,
// editing the bytes minimally: every other byte stays as the caller sent it.
// ok is false when the body cannot be edited safely (then it goes upstream
// unchanged and the stream's tokens are counted from its events).
func addIncludeUsage(body []byte) (out []byte, ok bool) {
	obj, ok := jsonscan.Value(body)
	if !ok || jsonscan.KindOf(obj) != jsonscan.KindObject {
		return body, false
	}
	var opts []byte
	members := 0
	top := jsonscan.Object(obj)
	for top.Next() {
		members++
		if top.KeyIs("stream_options") {
			opts = top.Value() // the last one wins, as in encoding/json
		}
	}
	if top.Err() != nil {
		return body, false
	}
	// offset of a sub-slice of body within body.
	offset := func(s []byte) int { return cap(body) - cap(s) }
	splice := func(at, cut int, insert string) []byte {
		out := make([]byte, 0, len(body)+len(insert))
		out = append(out, body[:at]...)
		out = append(out, insert...)
		return append(out, body[at+cut:]...)
	}
	switch jsonscan.KindOf(opts) {
	case jsonscan.KindInvalid: // no stream_options: add one before the closing brace
		sep := ","
		if members == 0 {
			sep = ""
		}
		return splice(offset(obj)+len(obj)-1, 0, sep+`"stream_options":{`+includeUsageMember+`}`), true
	case jsonscan.KindNull:
		return splice(offset(opts), len(opts), "{"+includeUsageMember+"}"), true
	case jsonscan.KindObject:
		var cur []byte
		n := 0
		it := jsonscan.Object(opts)
		for it.Next() {
			n++
			if it.KeyIs("include_usage") {
				cur = it.Value()
			}
		}
		if it.Err() != nil {
			return body, false
		}
		if cur != nil {
			return splice(offset(cur), len(cur), "true"), true
		}
		sep := ","
		if n == 0 {
			sep = ""
		}
		return splice(offset(opts)+1, 0, includeUsageMember+sep), true
	}
	return body, false
}
