package proxy

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// coding is a content coding the gateway decodes in a request body (RFC
// 9110 §8.4.1).
type coding uint8

const (
	codingNone coding = iota
	codingGzip
	codingZstd
	codingBrotli
)

func (c coding) String() string {
	switch c {
	case codingGzip:
		return "gzip"
	case codingZstd:
		return "zstd"
	case codingBrotli:
		return "br"
	}
	return "identity"
}

// maxCodings is how many content codings, one on top of the other, a
// request body may carry. One is what clients send (Codex sends zstd);
// two leaves room for a proxy that compressed an already compressed body.
// Each layer costs a decoder, so a long list is refused rather than run.
const maxCodings = 2

// supportedCodings names the codings decoded, for the 415's message and
// its Accept-Encoding (RFC 9110 §15.5.16: the codings that would have been
// accepted).
const supportedCodings = "gzip, zstd, br"

// zstdMaxWindow is the largest zstd window the gateway decodes: RFC 9659
// §3 caps the window of the "zstd" content coding at 8 MiB (decoders must
// support that much, encoders must not ask for more). A streaming zstd
// decoder holds a buffer of its frame's window from the start, whatever
// the body's size, so without this cap a few bytes could ask for
// gigabytes; it also caps a frame whose content size is declared (a
// single-segment frame's window is that size).
const zstdMaxWindow = 8 << 20

// requestCodings reads the Content-Encoding of a request: the codings in
// the order they were applied, identity left out (RFC 9110 §8.4: a list,
// possibly over several header lines; tokens are case-insensitive; x-gzip
// is gzip, §8.4.1.3). n is 0 for a body sent as is. A coding the gateway
// does not decode, or more than maxCodings of them, is refused with 415.
// A request without the header costs a map lookup and no allocation.
func requestCodings(h http.Header) (codings [maxCodings]coding, n int, aerr *apiError) {
	lines := h["Content-Encoding"]
	for _, line := range lines {
		for rest := line; rest != ""; {
			var tok string
			tok, rest, _ = strings.Cut(rest, ",")
			tok = strings.TrimSpace(tok)
			var c coding
			switch {
			case tok == "" || strings.EqualFold(tok, "identity"):
				continue
			case strings.EqualFold(tok, "gzip") || strings.EqualFold(tok, "x-gzip"):
				c = codingGzip
			case strings.EqualFold(tok, "zstd"):
				c = codingZstd
			case strings.EqualFold(tok, "br"):
				c = codingBrotli
			default:
				return codings, 0, errUnsupportedEncoding(contentEncoding(h), quoteHeader(tok)+" is not a coding the gateway decodes")
			}
			if n == maxCodings {
				return codings, 0, errUnsupportedEncoding(contentEncoding(h),
					"the gateway decodes at most "+strconv.Itoa(maxCodings)+" codings on top of each other")
			}
			codings[n] = c
			n++
		}
	}
	return codings, n, nil
}

// contentEncoding is the request's Content-Encoding as sent (its lines
// joined), for an error message.
func contentEncoding(h http.Header) string { return strings.Join(h["Content-Encoding"], ", ") }

// decodeBody undoes the codings of raw, the last applied first, and
// returns the body they encoded: at most limit bytes, read into chunks
// (readUnsized), and no layer gives more than limit bytes either. So a
// decompression bomb costs about limit and the decoders' state (gzip 32
// KiB, br at most its 16 MiB window, zstd at most zstdMaxWindow), never
// its decoded size, and is refused 413 once past limit; corrupt data is
// refused 400, naming the coding that failed. enc is the header as sent,
// for the messages.
func decodeBody(raw []byte, codings []coding, enc string, limit int64, chunks *sync.Pool) ([]byte, *apiError) {
	var layers [maxCodings]decodeLayer
	defer func() {
		for i := range layers {
			layers[i].release()
		}
	}()
	var src io.Reader = bytes.NewReader(raw)
	for i := len(codings) - 1; i >= 0; i-- {
		l := &layers[i]
		l.c, l.left = codings[i], limit
		if err := l.open(src); err != nil {
			return nil, decodeFailure(err, codings[i], enc, limit)
		}
		src = l
	}
	body, err := readUnsized(src, limit, chunks)
	if err != nil {
		return nil, decodeFailure(err, codings[0], enc, limit)
	}
	return body, nil
}

// decodeFailure words a decoding error for the caller: 413 past the limit,
// else 400 naming the layer that failed (outer, the last layer read, when
// no layer claims the error).
func decodeFailure(err error, outer coding, enc string, limit int64) *apiError {
	if errors.Is(err, errOverLimit) {
		return errTooLargeDecoded(limit, enc)
	}
	c := outer
	var le *layerError
	if errors.As(err, &le) {
		c, err = le.c, le.err
	}
	why := err.Error()
	if c == codingZstd && (errors.Is(err, zstd.ErrWindowSizeExceeded) || errors.Is(err, zstd.ErrDecoderSizeExceeded)) {
		why += " (the gateway decodes zstd windows of up to 8 MiB, RFC 9659's limit for the zstd content coding)"
	}
	return errUndecodable(c.String(), enc, why)
}

// layerError is a decoder's error, with the coding whose layer failed.
type layerError struct {
	c   coding
	err error
}

func (e *layerError) Error() string { return e.c.String() + ": " + e.err.Error() }
func (e *layerError) Unwrap() error { return e.err }

// decodeLayer is one coding being undone: a pooled decoder over the layer
// below, giving at most left more bytes (errOverLimit past them), its
// errors marked with its coding.
type decodeLayer struct {
	c    coding
	left int64
	gz   *gzip.Reader
	zd   *zstd.Decoder
	br   *brotli.Reader
	r    io.Reader
}

// Pools of decoders: building one costs more than most bodies it decodes
// (BenchmarkDecodeBody: a zstd decoder's tables and buffers, a gzip
// reader's inflate state, a brotli reader's buffers). None holds a
// goroutine (zstd decodes synchronously at concurrency 1), so a pooled one
// the GC drops leaks nothing.
var (
	gzipReaders sync.Pool // *gzip.Reader
	zstdReaders = sync.Pool{New: func() any {
		// Options that cannot fail; lowmem grows its buffers as needed.
		d, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
			zstd.WithDecoderMaxWindow(zstdMaxWindow), zstd.WithDecoderMaxMemory(zstdMaxWindow))
		if err != nil {
			panic("proxy: zstd decoder options: " + err.Error())
		}
		return d
	}}
	brotliReaders sync.Pool // *brotli.Reader
)

// open starts the layer's decoder on src. gzip reads its header here, so
// its error can come at once.
func (l *decodeLayer) open(src io.Reader) error {
	switch l.c {
	case codingGzip:
		l.gz, _ = gzipReaders.Get().(*gzip.Reader)
		if l.gz == nil {
			l.gz = new(gzip.Reader)
		}
		l.r = l.gz
		if err := l.gz.Reset(src); err != nil {
			return l.mark(err)
		}
	case codingZstd:
		l.zd = zstdReaders.Get().(*zstd.Decoder)
		l.r = l.zd
		if err := l.zd.Reset(src); err != nil {
			return l.mark(err)
		}
	case codingBrotli:
		l.br, _ = brotliReaders.Get().(*brotli.Reader)
		if l.br == nil {
			l.br = brotli.NewReader(src)
		} else {
			_ = l.br.Reset(src) // always nil
		}
		l.r = l.br
	}
	return nil
}

func (l *decodeLayer) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	if l.left -= int64(n); l.left < 0 {
		return n, errOverLimit
	}
	if err != nil && err != io.EOF {
		err = l.mark(err)
	}
	return n, err
}

// mark gives err the layer's coding, unless it is a lower layer's error
// or the limit passing through this decoder.
func (l *decodeLayer) mark(err error) error {
	var le *layerError
	if errors.Is(err, errOverLimit) || errors.As(err, &le) {
		return err
	}
	return &layerError{c: l.c, err: err}
}

// release puts the layer's decoder back in its pool.
func (l *decodeLayer) release() {
	switch {
	case l.gz != nil:
		// Its inflate state may still point at this body until its next
		// Reset, or until the GC empties the pool: gzip.Reader has no way
		// to let go of it without reading another header.
		gzipReaders.Put(l.gz)
	case l.zd != nil:
		_ = l.zd.Reset(nil)
		zstdReaders.Put(l.zd)
	case l.br != nil:
		_ = l.br.Reset(nil)
		brotliReaders.Put(l.br)
	}
	*l = decodeLayer{}
}
