package proxy

import (
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/tollgate-llm/tollgate/llm"
)

// checkEdge refuses a request the gateway must not pass on, before it reads
// anything else of it: a path that is not canonical, or headers larger than
// server.max_header_bytes.
func (ex *exchange) checkEdge() (*apiError, llm.Rejection) {
	r := ex.r
	if why := nonCanonical(r.URL); why != "" {
		return errNonCanonicalPath(why), llm.RejectNonCanonicalPath
	}
	if n, limit := headerBytes(r.Header), ex.g.cfg.Server.MaxHeaderBytes; n > limit {
		return errHeadersTooLarge(limit), llm.RejectHeadersTooLarge
	}
	return nil, llm.RejectNone
}

// nonCanonical says why a path is not one the gateway forwards, or "" when
// it is. The upstream receives the path as sent, so anything an upstream
// (or a proxy in front of it) could resolve to another path than the one
// the gateway routed and judged is refused: dot segments, empty segments,
// backslashes, semicolons (path parameters: Java servers read "..;" as
// ".."), control bytes, a percent sign or invalid UTF-8 once decoded (a
// second decoding would change it), and any escape but the standard one
// for the decoded path: encoded dots, slashes or backslashes, and an
// escaped letter such as /v1/respons%65s, which reaches another route here
// than the one the upstream serves. Otherwise GET /v1/../metrics or
// /v1/%2e%2e/admin reaches an internal endpoint of a self-hosted upstream
// that only the gateway fronts.
func nonCanonical(u *url.URL) string {
	lower := strings.ToLower(u.EscapedPath())
	for _, enc := range [...]string{"%2e", "%2f", "%5c"} {
		if strings.Contains(lower, enc) {
			return "it holds an encoded dot, slash or backslash (" + enc + ")"
		}
	}
	if u.RawPath != "" {
		// net/url keeps RawPath only when the escaping differs from the
		// standard one of the decoded path.
		return "it escapes characters that need no escape"
	}
	p := u.Path
	switch {
	case strings.IndexByte(p, '\\') >= 0:
		return "it holds a backslash"
	case strings.IndexByte(p, ';') >= 0:
		return "it holds a semicolon"
	case strings.IndexByte(p, '%') >= 0:
		return "it holds an escaped percent sign"
	case !utf8.ValidString(p):
		return "it is not valid UTF-8"
	case !strings.HasPrefix(p, "/"):
		return "it does not start with /"
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; c < 0x20 || c == 0x7f {
			return "it holds a control character"
		}
	}
	for _, seg := range strings.Split(p[1:], "/") {
		switch seg {
		case "":
			return "it has an empty segment"
		case ".", "..":
			return "it has a dot segment"
		}
	}
	return ""
}

// headerBytes is the size of h as sent: each line's name, ": ", value and
// CRLF.
func headerBytes(h http.Header) int {
	n := 0
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}
