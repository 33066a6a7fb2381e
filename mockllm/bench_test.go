package mockllm_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate-llm/tollgate/mockllm"
)

// BenchmarkStream measures the mock's own cost per streamed request of 64
// token events (no delays), handler only, so benchmarks of the gateway know
// how much of the machine the mock takes.
func BenchmarkStream(b *testing.B) {
	const tokens = 64
	for _, bc := range []struct{ name, path, body string }{
		{"openai", "/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hello"}]}`},
		{"anthropic", "/v1/messages", `{"model":"m","stream":true,"max_tokens":1024,"messages":[{"role":"user","content":"hello"}]}`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			m := mockllm.New(mockllm.Options{OutputTokens: tokens})
			b.ReportAllocs()
			var bytes int64
			for b.Loop() {
				req := httptest.NewRequest(http.MethodPost, bc.path, strings.NewReader(bc.body))
				rec := httptest.NewRecorder()
				m.ServeHTTP(rec, req)
				if rec.Code != 200 {
					b.Fatalf("status %d", rec.Code)
				}
				bytes += int64(rec.Body.Len())
			}
			b.ReportMetric(float64(b.N*tokens)/b.Elapsed().Seconds(), "events/s")
			b.SetBytes(bytes / int64(b.N))
		})
	}
}
