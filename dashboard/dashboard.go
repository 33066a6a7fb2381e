// Package dashboard serves the gateway's live dashboard: one page and its
// script and stylesheet, embedded in the binary, that chart what /stats and
// /stats/series report. It needs no network beyond the gateway itself, so
// it works offline and behind a firewall.
package dashboard

import (
	"embed"
	"net/http"
	"strings"
)

//go:embed assets/index.html assets/app.js assets/app.css
var assets embed.FS

// files maps each served path, relative to where the page is mounted, to
// its asset and content type.
var files = map[string]struct{ name, contentType string }{
	"":         {"assets/index.html", "text/html; charset=utf-8"},
	"/app.js":  {"assets/app.js", "text/javascript; charset=utf-8"},
	"/app.css": {"assets/app.css", "text/css; charset=utf-8"},
}

// csp allows the page nothing but its own origin: no CDN, no inline script,
// no third-party request. Images may be data: URLs, for the empty favicon
// that keeps the browser from asking the gateway for /favicon.ico (a 404
// that would count as a request).
const csp = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; " +
	"connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the page at prefix (e.g. "/dashboard") and its assets at
// prefix+"/app.js" and prefix+"/app.css". The page fetches stats and
// stats/series relative to its own URL, so prefix must be a sibling of
// /stats.
func Handler(prefix string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "dashboard: method not allowed", http.StatusMethodNotAllowed)
			return
		}
		rest := r.URL.Path[min(len(prefix), len(r.URL.Path)):]
		if rest == "/" {
			// The page's relative URLs need it at prefix, not prefix/.
			// Relative, so that it holds behind a proxy that strips a path
			// prefix (http.Redirect would make it absolute).
			w.Header().Set("Location", "../"+prefix[strings.LastIndex(prefix, "/")+1:])
			w.WriteHeader(http.StatusMovedPermanently)
			return
		}
		f, ok := files[rest]
		if !ok {
			http.NotFound(w, r)
			return
		}
		body, err := assets.ReadFile(f.name)
		if err != nil {
			// Embedded at build time: cannot happen.
			http.Error(w, "dashboard: "+err.Error(), http.StatusInternalServerError)
			return
		}
		h := w.Header()
		h.Set("Content-Type", f.contentType)
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Content-Security-Policy", csp)
		h.Set("Referrer-Policy", "no-referrer")
		if r.Method == http.MethodHead {
			return
		}
		_, _ = w.Write(body)
	})
}
