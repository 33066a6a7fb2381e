package proxy

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// BenchmarkDecodeBody measures decoding a 64 KiB chat request sent in each
// coding, with the gateway's pooled decoders (decodeBody) and with a new
// decoder per body (what the pools save).
func BenchmarkDecodeBody(b *testing.B) {
	plain := []byte(`{"model":"gpt-test","messages":[{"role":"user","content":"` +
		strings.Repeat("a prompt of the usual sort, with code and prose in it; ", 1200)[:64<<10] + `"}]}`)
	chunks := sync.Pool{New: func() any { c := make([]byte, relayBufSize); return &c }}
	fresh := map[string]func(io.Reader) (io.Reader, error){
		"gzip": func(r io.Reader) (io.Reader, error) { return gzip.NewReader(r) },
		"zstd": func(r io.Reader) (io.Reader, error) {
			return zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
				zstd.WithDecoderMaxWindow(zstdMaxWindow), zstd.WithDecoderMaxMemory(zstdMaxWindow))
		},
		"br": func(r io.Reader) (io.Reader, error) { return brotli.NewReader(r), nil },
	}
	for _, name := range []string{"gzip", "zstd", "br"} {
		enc := encodeBody(b, plain, name)
		b.Run(name+"/pooled", func(b *testing.B) {
			h := http.Header{"Content-Encoding": {name}}
			b.SetBytes(int64(len(plain)))
			b.ReportAllocs()
			for b.Loop() {
				codings, n, _ := requestCodings(h)
				body, aerr := decodeBody(enc, codings[:n], name, 32<<20, &chunks)
				if aerr != nil || len(body) != len(plain) {
					b.Fatalf("%d bytes, %v", len(body), aerr)
				}
			}
		})
		b.Run(name+"/new-decoder", func(b *testing.B) {
			b.SetBytes(int64(len(plain)))
			b.ReportAllocs()
			for b.Loop() {
				d, err := fresh[name](bytes.NewReader(enc))
				if err != nil {
					b.Fatal(err)
				}
				body, err := readUnsized(d, 32<<20, &chunks)
				if err != nil || len(body) != len(plain) {
					b.Fatalf("%d bytes, %v", len(body), err)
				}
			}
		})
	}
}
