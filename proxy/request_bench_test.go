package proxy

import (
	"bytes"
	"io"
	"net/http"
	"sync"
	"testing"
)

// BenchmarkReadBody measures reading one request body whole, with a
// Content-Length and without one (chunked), under the default 32 MiB limit.
// The body hides io.WriterTo, as a server request's body does.
func BenchmarkReadBody(b *testing.B) {
	for _, size := range []struct {
		name string
		n    int
	}{{"1KiB", 1 << 10}, {"64KiB", 64 << 10}, {"4MiB", 4 << 20}} {
		for _, sized := range []bool{true, false} {
			name := size.name + "/content-length"
			if !sized {
				name = size.name + "/chunked"
			}
			b.Run(name, func(b *testing.B) {
				payload := bytes.Repeat([]byte("a"), size.n)
				rd := bytes.NewReader(payload)
				r := &http.Request{Method: http.MethodPost, Body: io.NopCloser(struct{ io.Reader }{rd}), ContentLength: -1}
				if sized {
					r.ContentLength = int64(size.n)
				}
				chunks := sync.Pool{New: func() any { c := make([]byte, relayBufSize); return &c }}
				b.SetBytes(int64(size.n))
				b.ReportAllocs()
				for b.Loop() {
					rd.Reset(payload)
					body, aerr := readBody(r, 32<<20, &chunks)
					if aerr != nil || len(body) != size.n {
						b.Fatalf("read %d bytes (%v), want %d", len(body), aerr, size.n)
					}
				}
			})
		}
	}
}
