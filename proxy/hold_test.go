package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/mockllm"
)

// TestHoldIsRecorded: a stream that another attempt could follow is held
// until its first token: its headers go out no sooner than the first token
// was read, and the record's hold (upstream first byte to headers) spans
// the wait for it. A stream no attempt could follow is not held: its
// headers go out before its first token. Both orders are causal, so no
// machine's speed changes them.
func TestHoldIsRecorded(t *testing.T) {
	const ttft = 300 * time.Millisecond
	mock := httptest.NewServer(mockllm.New(mockllm.Options{TTFT: ttft, OutputTokens: 3}))
	t.Cleanup(mock.Close)
	for _, c := range []struct {
		name    string
		retries int
		held    bool
	}{{"held", 3, true}, {"not held", 1, false}} {
		t.Run(c.name, func(t *testing.T) {
			tg := newTestGateway(t, mock.URL, func(cfg *config.Config) { cfg.Upstreams[0].Retry.MaxAttempts = c.retries })
			resp, err := http.Post(tg.URL+"/v1/chat/completions", "application/json",
				strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			rec := tg.record(t)
			tm := rec.Timing
			hold, ok := rec.Hold()
			headers, hok := rec.TimeToHeaders()
			if !ok || !hok || tm.FirstToken.IsZero() || tm.UpFirstByte.IsZero() {
				t.Fatalf("hold %v (%v), headers %v (%v), timing %+v", hold, ok, headers, hok, tm)
			}
			if c.held && (tm.HeadersOut.Before(tm.FirstToken) || hold < tm.FirstToken.Sub(tm.UpFirstByte)) {
				t.Errorf("held: headers at %v, first token read at %v, hold %v", tm.HeadersOut.Sub(tm.In), tm.FirstToken.Sub(tm.In), hold)
			}
			if !c.held && !tm.HeadersOut.Before(tm.FirstToken) {
				t.Errorf("not held: headers at %v, after the first token read at %v", tm.HeadersOut.Sub(tm.In), tm.FirstToken.Sub(tm.In))
			}
			if headers > rec.E2E() || hold > headers {
				t.Errorf("headers %v, hold %v, E2E %v", headers, hold, rec.E2E())
			}
		})
	}
}
