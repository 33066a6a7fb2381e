package config

import (
	"net/url"
	"path"
	"strings"

	"github.com/tollgate-llm/tollgate/llm"
)

// Serves reports whether the upstream lists dialect d. It is false for
// llm.DialectNone, which is not a dialect an upstream declares.
func (u *Upstream) Serves(d llm.Dialect) bool {
	if d == llm.DialectNone {
		return false
	}
	if d == llm.DialectResponses {
		d = llm.DialectOpenAI // OpenAI's upstreams serve its Responses API
	}
	name := d.String()
	for _, s := range u.Dialects {
		if s == name {
			return true
		}
	}
	return false
}

// Origin returns scheme://host[:port] of the base URL, lowercased; the URL
// itself when it does not parse (Validate refuses such URLs). A
// passthrough caller's own key stays with an origin (CallerKeyMayGo).
func (u *Upstream) Origin() string {
	p, err := url.Parse(u.BaseURL)
	if err != nil || p.Host == "" {
		return u.BaseURL
	}
	return strings.ToLower(p.Scheme + "://" + p.Host)
}

// CallerKeyMayGo reports whether a passthrough caller's own key may go to
// an upstream at origin, on a route whose first upstream is at first: only
// to that origin, so that a key for one provider never reaches another's
// endpoint, unless the upstream accepts callers' keys
// (caller_keys_on_fallback: replicas of one server). An upstream it refuses
// is skipped for that caller (attempt result key_scope). This is what
// key_scope protects: the caller's credential, which belongs to the
// provider the route names first.
func CallerKeyMayGo(first, origin string, acceptsCallerKeys bool) bool {
	return origin == first || acceptsCallerKeys
}

// URL returns the upstream address for path, which starts with "/v1/" and may
// carry a query: base_url "https://host/api" with "/v1/messages" gives
// "https://host/api/v1/messages".
func (u *Upstream) URL(path string) string {
	base := strings.TrimRight(u.BaseURL, "/")
	if !strings.HasPrefix(path, "/") {
		return base + "/" + path
	}
	return base + path
}

// UpstreamByName returns the upstream named name, or nil when there is none.
// The pointer refers into c.Upstreams.
func (c *Config) UpstreamByName(name string) *Upstream {
	for i := range c.Upstreams {
		if c.Upstreams[i].Name == name {
			return &c.Upstreams[i]
		}
	}
	return nil
}

// RouteFor returns the first route with a pattern that matches model, or nil
// when none does (the request then goes to every upstream serving its
// dialect, in file order). Patterns match as path.Match does, so * does not
// cross a "/". The pointer refers into c.Routes.
func (c *Config) RouteFor(model string) *Route {
	if i := c.RouteIndex(model); i >= 0 {
		return &c.Routes[i]
	}
	return nil
}

// RouteIndex returns the index in c.Routes of the route RouteFor returns, or
// -1.
func (c *Config) RouteIndex(model string) int {
	for i := range c.Routes {
		for _, p := range c.Routes[i].Models {
			// Validate rejects malformed patterns; one in a Config built
			// without it matches nothing.
			if ok, _ := path.Match(p, model); ok {
				return i
			}
		}
	}
	return -1
}
