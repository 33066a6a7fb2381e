package proxy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"runtime/debug"

	"github.com/tollgate-llm/tollgate/llm"
)

// contextKey is a pointer type so a key fits in an interface without
// allocating, as in chi's middleware.
type contextKey struct{ name string }

func (k *contextKey) String() string { return "tollgate context value " + k.name }

var requestIDKey = &contextKey{"request-id"}

// requestIDHeader carries the gateway's request id back to the caller, and
// up to the upstream so both logs can be joined. It is not X-Request-Id,
// which upstreams use for their own ids.
const requestIDHeader = "X-Tollgate-Request-Id"

// requestID takes the caller's X-Tollgate-Request-Id when it is short and
// plain, or makes a random one, and puts it in the context and the response.
func (g *Gateway) requestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(requestIDHeader)
		if !validRequestID(id) {
			id = newRequestID()
		}
		w.Header().Set(requestIDHeader, id)
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), requestIDKey, id)))
	})
}

// requestIDFrom returns the request id in ctx, or "".
func requestIDFrom(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey).(string)
	return id
}

// newRequestID is "tg_" and 24 random hex digits, built in one allocation.
func newRequestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	var id [3 + 2*len(b)]byte
	copy(id[:], "tg_")
	hex.Encode(id[3:], b[:])
	return string(id[:])
}

func validRequestID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// recoverer turns a panic into a logged 500, except http.ErrAbortHandler,
// which it re-panics so the server aborts the connection as intended.
func (g *Gateway) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			rec := recover()
			if rec == nil {
				return
			}
			if rec == http.ErrAbortHandler {
				panic(rec)
			}
			g.log.Error("panic serving request", "request_id", requestIDFrom(r.Context()),
				"path", r.URL.Path, "panic", rec, "stack", string(debug.Stack()))
			writeError(w, errorDialect(r, llm.DialectNone), requestIDFrom(r.Context()), &apiError{
				Status: http.StatusInternalServerError, Kind: "server_error", AnthropicKind: "api_error",
				Msg: "internal error in the gateway"})
		}()
		next.ServeHTTP(w, r)
	})
}
