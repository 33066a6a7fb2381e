package proxy

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
)

// hopHeaders are the hop-by-hop headers of RFC 9110 §7.6.1 (and the older
// RFC 2616 list that net/http/httputil also strips). They describe one
// connection, not the message, so a proxy never forwards them.
var hopHeaders = []string{
	"Connection",
	"Proxy-Connection",
	"Keep-Alive",
	"Proxy-Authenticate",
	"Proxy-Authorization",
	"Te",
	"Trailer",
	"Transfer-Encoding",
	"Upgrade",
}

// removeHopHeaders deletes the hop-by-hop headers from h, including every
// header named in its Connection header, as net/http/httputil does.
func removeHopHeaders(h http.Header) {
	deleteConnectionTokens(h, h)
	for _, k := range hopHeaders {
		h.Del(k)
	}
}

// deleteConnectionTokens deletes from dst every header that src's Connection
// header names (RFC 9110 §7.6.1): they too are hop-by-hop.
func deleteConnectionTokens(dst, src http.Header) {
	for _, f := range src["Connection"] {
		for sf := range strings.SplitSeq(f, ",") {
			if sf = canonical(sf); sf != "" {
				dst.Del(sf)
			}
		}
	}
}

func canonical(s string) string { return http.CanonicalHeaderKey(strings.TrimSpace(s)) }

// upstreamRequestHeaders builds the headers sent upstream from the caller's.
//
// Besides hop-by-hop headers it drops:
//   - Forwarded and X-Forwarded-*: the caller may not speak for a proxy it is
//     not, and LLM providers do not need the caller's address.
//   - Accept-Encoding: the gateway must read the bytes it relays, so it lets
//     the transport negotiate compression (and undo it) itself.
//   - Content-Length: set again from the body actually sent.
//   - Expect: the body is already read, and an upstream that never sends
//     100 Continue would delay the request by the transport's wait.
//   - X-Tollgate-Probe (ProbeHeader): set by the gateway on its own probes.
//
// A missing User-Agent stays missing instead of becoming Go's default.
// routingOverrides are request headers that ask a server to route by
// another path or method than the request line's.
var routingOverrides = [...]string{"X-Original-Url", "X-Rewrite-Url", "X-Http-Method-Override",
	"X-Http-Method", "X-Method-Override"}

func upstreamRequestHeaders(in http.Header) http.Header {
	out := in.Clone()
	removeHopHeaders(out)
	for k := range out {
		if k == "Forwarded" || strings.HasPrefix(k, "X-Forwarded-") {
			delete(out, k)
		}
	}
	out.Del("Accept-Encoding")
	out.Del("Content-Length")
	out.Del("Expect")
	out.Del(ProbeHeader) // upstream, it marks the gateway's own probes only
	// Headers some servers and frameworks read as the real path or method
	// (IIS, Symfony, Spring, Express middleware): the gateway judged the
	// request line, so the upstream must serve that.
	for _, k := range routingOverrides {
		out.Del(k)
	}
	if _, ok := out["User-Agent"]; !ok {
		out["User-Agent"] = []string{""}
	}
	return out
}

// copyResponseHeaders copies the upstream's response headers to the client,
// less hop-by-hop headers and Content-Length (the server sets it again, or
// uses chunked encoding, for the bytes actually written). The value slices
// are shared, not copied: src is the attempt's own response, read once, and
// the gateway replaces a header's values (Set, Del), never edits them.
func copyResponseHeaders(dst, src http.Header) {
	for k, vv := range src {
		if isHopHeader(k) || k == "Content-Length" {
			continue
		}
		dst[k] = vv
	}
	deleteConnectionTokens(dst, src)
}

func isHopHeader(k string) bool {
	for _, h := range hopHeaders {
		if k == h {
			return true
		}
	}
	return false
}

// presented is what a caller sent in the two headers a key may come in,
// each key hashed: the bearer token of Authorization and x-api-key (zero
// where absent). The keys themselves go no further than readKeys.
type presented struct {
	bearer, apiKey credential
	// malformed: an Authorization header is present but is not a
	// well-formed bearer credential (bearer is then zero).
	malformed bool
}

// readKeys reads the keys a caller presented and hashes each once (the
// same key in both headers once in all). It allocates nothing.
func readKeys(h http.Header) presented {
	var p presented
	var bearer string
	if a := h.Get("Authorization"); a != "" {
		scheme, tok, found := strings.Cut(a, " ")
		tok = strings.TrimSpace(tok)
		if found && strings.EqualFold(scheme, "Bearer") && tok != "" && printableASCII(tok) {
			bearer, p.bearer = tok, keyHash(tok)
		} else {
			p.malformed = true
		}
	}
	switch k := strings.TrimSpace(h.Get("X-Api-Key")); k {
	case "":
	case bearer:
		p.apiKey = p.bearer
	default:
		p.apiKey = keyHash(k)
	}
	return p
}

// credential is one key a caller presented, hashed once: its SHA-256 serves
// the [[keys]] lookup and, only when it is needed, its id.
type credential struct {
	sum     [sha256.Size]byte
	present bool
}

// keyHash hashes a key ("" for none: the zero credential).
func keyHash(key string) credential {
	if key == "" {
		return credential{}
	}
	return credential{sum: sha256.Sum256([]byte(key)), present: true}
}

// id identifies the key in logs, metrics and errors without revealing it:
// the first 12 hex digits of its SHA-256, "anonymous" for no key. It is
// computed on demand, since a listed key is named by its [[keys]] name
// instead.
func (c credential) id() string {
	if !c.present {
		return "anonymous"
	}
	return hex.EncodeToString(c.sum[:6])
}

// keyID is the id of a key (see credential.id).
func keyID(key string) string { return keyHash(key).id() }

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c > '~' {
			return false
		}
	}
	return true
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
