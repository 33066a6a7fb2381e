package proxy

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"testing"
)

// The gateway names a request without a usable X-Request-Id "tg_" and 24
// random hex digits, says so in the response and passes it down the
// context; a caller's own well-formed id is kept, a malformed one replaced.
func TestRequestIDIsTheCallersOrANewOne(t *testing.T) {
	g := relayGateway(t, 0)
	form := regexp.MustCompile(`^tg_[0-9a-f]{24}$`)
	seen := map[string]bool{}
	for _, tc := range []struct{ sent, want string }{
		{"", ""}, {"", ""}, {"caller-1.a_B", "caller-1.a_B"}, {"bad id", ""}, {"é", ""},
	} {
		var inCtx string
		h := g.requestID(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
			inCtx = requestIDFrom(r.Context())
		}))
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		if tc.sent != "" {
			r.Header.Set(requestIDHeader, tc.sent)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		got := w.Header().Get(requestIDHeader)
		if got != inCtx {
			t.Errorf("sent %q: response says %q, context %q", tc.sent, got, inCtx)
		}
		switch {
		case tc.want != "" && got != tc.want:
			t.Errorf("sent %q: id %q, want the caller's", tc.sent, got)
		case tc.want == "" && (!form.MatchString(got) || seen[got]):
			t.Errorf("sent %q: id %q, want a new tg_ and 24 hex digits (seen before: %v)", tc.sent, got, seen[got])
		}
		seen[got] = true
	}
}
