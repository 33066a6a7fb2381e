package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/andybalholm/brotli"
	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
)

// encodeBody applies the codings to body in the order named, as a client
// sending "Content-Encoding: <codings, joined>" does.
func encodeBody(tb testing.TB, body []byte, codings ...string) []byte {
	tb.Helper()
	for _, c := range codings {
		var buf bytes.Buffer
		var w io.WriteCloser
		switch c {
		case "gzip":
			w = gzip.NewWriter(&buf)
		case "zstd":
			zw, err := zstd.NewWriter(&buf, zstd.WithEncoderConcurrency(1))
			if err != nil {
				tb.Fatal(err)
			}
			w = zw
		case "br":
			w = brotli.NewWriter(&buf)
		default:
			tb.Fatalf("no encoder for %q", c)
		}
		if _, err := w.Write(body); err != nil {
			tb.Fatal(err)
		}
		if err := w.Close(); err != nil {
			tb.Fatal(err)
		}
		body = buf.Bytes()
	}
	return body
}

// tappedRequest is what an upstream got.
type tappedRequest struct {
	path   string
	body   []byte
	header http.Header
	length int64 // the request's Content-Length, -1 when it had none
}

// tapUpstream keeps every request it gets, then lets next answer it.
type tapUpstream struct {
	next http.Handler
	mu   sync.Mutex
	got  []tappedRequest
}

func (u *tapUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.got = append(u.got, tappedRequest{path: r.URL.Path, body: b, header: r.Header.Clone(), length: r.ContentLength})
	u.mu.Unlock()
	r.Body = io.NopCloser(bytes.NewReader(b))
	u.next.ServeHTTP(w, r)
}

func (u *tapUpstream) requests() []tappedRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]tappedRequest(nil), u.got...)
}

// tapMock starts mockllm behind a tapUpstream on loopback.
func tapMock(t *testing.T) (*tapUpstream, string) {
	t.Helper()
	tap := &tapUpstream{next: mockllm.New(mockllm.Options{OutputTokens: 5})}
	srv := httptest.NewServer(tap)
	t.Cleanup(srv.Close)
	return tap, srv.URL
}

// sendEncoded posts body with one Content-Encoding header line per
// element of lines, and the headers of hdr.
func sendEncoded(t *testing.T, url string, body []byte, lines []string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	h := http.Header{"Content-Encoding": lines}
	for k, v := range hdr {
		h.Set(k, v)
	}
	return postHeader(t, url, body, h)
}

var antHeaders = map[string]string{"anthropic-version": "2023-06-01"}

// A body in each coding the gateway decodes, alone, with identity, or two
// on top of each other, reaches the upstream as the JSON it encoded,
// without a Content-Encoding and with the decoded length; the upstream
// parses it and its answer is measured (mockllm counts a quarter of the
// body's bytes as input tokens, so the record's input shows what it read).
func TestEncodedBodyReachesTheUpstreamDecoded(t *testing.T) {
	tap, upURL := tapMock(t)
	tg := newTestGateway(t, upURL, nil)
	cases := []struct {
		name  string
		lines []string // Content-Encoding as sent
		apply []string // the codings applied, in order
	}{
		{"gzip", []string{"gzip"}, []string{"gzip"}},
		{"x-gzip", []string{"x-gzip"}, []string{"gzip"}},
		{"zstd", []string{"zstd"}, []string{"zstd"}},
		{"br", []string{"br"}, []string{"br"}},
		{"identity", []string{"identity"}, nil},
		{"upper case and spaces", []string{"  ZSTD "}, []string{"zstd"}},
		{"identity beside zstd", []string{"identity, zstd"}, []string{"zstd"}},
		{"gzip then br", []string{"gzip, br"}, []string{"gzip", "br"}},
		{"br then zstd on two lines", []string{"br", "zstd"}, []string{"br", "zstd"}},
	}
	dialects := []struct {
		name, path, body string
		hdr              map[string]string
		stream           bool
	}{
		{"openai stream", "/v1/chat/completions", streamChat, nil, true},
		{"anthropic", "/v1/messages", `{"model":"claude-test","max_tokens":64,"messages":[{"role":"user","content":"` +
			strings.Repeat("compressible prompt ", 200) + `"}]}`, antHeaders, false},
	}
	for _, d := range dialects {
		for _, tc := range cases {
			t.Run(d.name+"/"+tc.name, func(t *testing.T) {
				n := len(tap.requests())
				resp, b := sendEncoded(t, tg.URL+d.path, encodeBody(t, []byte(d.body), tc.apply...), tc.lines, d.hdr)
				rec := tg.record(t)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d: %s", resp.StatusCode, b)
				}
				got := tap.requests()
				if len(got) != n+1 {
					t.Fatalf("the upstream got %d requests, want 1", len(got)-n)
				}
				up := got[n]
				if ce := up.header.Values("Content-Encoding"); len(ce) != 0 {
					t.Errorf("the upstream got Content-Encoding %q with a decoded body", ce)
				}
				if up.length != int64(len(up.body)) {
					t.Errorf("the upstream got Content-Length %d for %d bytes", up.length, len(up.body))
				}
				if d.stream {
					// The gateway asked for usage: the body differs by that member.
					var sent, recv map[string]json.RawMessage
					if err := json.Unmarshal(up.body, &recv); err != nil {
						t.Fatalf("the upstream got no JSON: %v: %q", err, up.body)
					}
					_ = json.Unmarshal([]byte(d.body), &sent)
					if !bytes.Equal(sent["messages"], recv["messages"]) || !bytes.Equal(sent["model"], recv["model"]) {
						t.Errorf("the upstream got %s, want the messages of %s", up.body, d.body)
					}
				} else if string(up.body) != d.body {
					t.Errorf("the upstream got %q, want the body as encoded", up.body)
				}
				if rec.Outcome != llm.OutcomeOK || rec.Status != http.StatusOK {
					t.Errorf("record: outcome %s, status %d", rec.Outcome, rec.Status)
				}
				if want := int64(mockllm.InputTokens(up.body)); rec.Usage.Input != want || rec.Usage.Output != 5 {
					t.Errorf("record usage %+v, want input %d (what the upstream read) and output 5", rec.Usage, want)
				}
			})
		}
	}
}

// compressingMiddleware compresses an SDK's request body as Codex does
// ("Content-Encoding: zstd").
func compressingMiddleware(t *testing.T, coding string) func(*http.Request, func(*http.Request) (*http.Response, error)) (*http.Response, error) {
	return func(req *http.Request, next func(*http.Request) (*http.Response, error)) (*http.Response, error) {
		if req.Body == nil {
			return next(req)
		}
		plain, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
		enc := encodeBody(t, plain, coding)
		req.Body = io.NopCloser(bytes.NewReader(enc))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(enc)), nil }
		req.ContentLength = int64(len(enc))
		req.Header.Set("Content-Encoding", coding)
		return next(req)
	}
}

// The official SDKs, their bodies compressed on the way out (zstd as
// Codex sends them, gzip), stream their answer through the gateway, which
// measures it.
func TestSDKsWithCompressedBodies(t *testing.T) {
	tap, upURL := tapMock(t)
	tg := newTestGateway(t, upURL, nil)
	for _, coding := range []string{"zstd", "gzip", "br"} {
		t.Run("openai/"+coding, func(t *testing.T) {
			c := openai.NewClient(option.WithBaseURL(tg.URL+"/v1"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0),
				option.WithMiddleware(compressingMiddleware(t, coding)))
			s := c.Chat.Completions.NewStreaming(testCtx(t), openai.ChatCompletionNewParams{
				Model:    "gpt-test",
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say something, compressed.")},
			})
			var text strings.Builder
			for s.Next() {
				for _, ch := range s.Current().Choices {
					text.WriteString(ch.Delta.Content)
				}
			}
			if err := s.Err(); err != nil || text.Len() == 0 {
				t.Fatalf("stream: %q, %v", text.String(), err)
			}
			_ = s.Close()
			wantMeasured(t, tg.record(t), tap)
		})
		t.Run("anthropic/"+coding, func(t *testing.T) {
			c := anthropic.NewClient(aoption.WithBaseURL(tg.URL), aoption.WithAPIKey("sk-ant-test"), aoption.WithMaxRetries(0),
				aoption.WithMiddleware(compressingMiddleware(t, coding)))
			s := c.Messages.NewStreaming(testCtx(t), anthropic.MessageNewParams{
				Model:     "claude-test",
				MaxTokens: 64,
				Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Say something, compressed."))},
			})
			var msg anthropic.Message
			for s.Next() {
				if err := msg.Accumulate(s.Current()); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Err(); err != nil || messageText(&msg) == "" {
				t.Fatalf("stream: %q, %v", messageText(&msg), err)
			}
			_ = s.Close()
			wantMeasured(t, tg.record(t), tap)
		})
	}
}

// wantMeasured checks that rec is a measured stream whose input is what
// the upstream's last request held.
func wantMeasured(t *testing.T, rec llm.Record, tap *tapUpstream) {
	t.Helper()
	got := tap.requests()
	up := got[len(got)-1]
	if !json.Valid(up.body) || up.header.Get("Content-Encoding") != "" {
		t.Errorf("the upstream got %q with Content-Encoding %q", up.body, up.header.Get("Content-Encoding"))
	}
	if rec.Outcome != llm.OutcomeOK || !rec.Stream || rec.Timing.FirstTokenOut.IsZero() {
		t.Errorf("record: outcome %s, stream %v, first token out %v", rec.Outcome, rec.Stream, rec.Timing.FirstTokenOut)
	}
	if want := int64(mockllm.InputTokens(up.body)); rec.Usage.Input != want || rec.Usage.Output != 5 {
		t.Errorf("record usage %+v, want input %d and output 5", rec.Usage, want)
	}
}

// zeros is an endless reader of zero bytes that allocates nothing.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// zstdBomb is n zero bytes, zstd-compressed by a streaming encoder at its
// default level and window (8 MiB): about 112 KiB for 1 GiB. The zeros go
// through the encoder in pieces, never whole in memory.
func zstdBomb(tb testing.TB, n int64) []byte {
	tb.Helper()
	var buf bytes.Buffer
	zw, err := zstd.NewWriter(&buf, zstd.WithEncoderConcurrency(1))
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := io.CopyN(zw, zeros{}, n); err != nil {
		tb.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// zstdRawFrame is a zstd frame (RFC 8878 §3.1.1) holding content in one
// raw block, whose header asks for a window of 1<<windowLog bytes and
// declares no content size, as a streaming encoder writes it.
func zstdRawFrame(windowLog byte, content []byte) []byte {
	f := []byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, (windowLog - 10) << 3} // magic, descriptor, window
	h := 1 | len(content)<<3                                         // last block, raw
	f = append(f, byte(h), byte(h>>8), byte(h>>16))
	return append(f, content...)
}

// A zstd bomb, 1 GiB of zeros in about 112 KiB, is refused 413 in the
// caller's dialect without its decoded size ever being in memory: the
// heap the request allocated, from its start to its record, stays under
// twice max_body_bytes (what was decoded up to the limit, the decoder's 8
// MiB window and the rest of the exchange). As in
// TestOversizedChunkedBodyCostsAboutItsLimit, the running total of heap
// allocated bounds from above what the request held at any moment.
func TestZstdBombIsRefusedWithinTwiceTheLimit(t *testing.T) {
	const limit = 16 << 20
	bomb := zstdBomb(t, 1<<30)
	tap, upURL := tapMock(t)
	tg := newTestGateway(t, upURL, func(c *config.Config) { c.Server.MaxBodyBytes = limit })
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	send := func(body []byte, enc string) (*http.Response, []byte) {
		req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, tg.URL+"/v1/chat/completions", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if enc != "" {
			req.Header.Set("Content-Encoding", enc)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	// One request first, so that one-time costs (the connection, metric
	// children, the access log's handler) are not counted. It is not
	// compressed: the zstd decoder the bomb gets is a new one, counted.
	if resp, b := send([]byte(plainChat), ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("warm-up: %d %s", resp.StatusCode, b)
	}
	tg.record(t)
	upstreamBefore := len(tap.requests())

	before := heapAllocated()
	resp, b := send(bomb, "zstd")
	rec := tg.record(t)
	spent := heapAllocated() - before

	var e errorShape
	if resp.StatusCode != http.StatusRequestEntityTooLarge || json.Unmarshal(b, &e) != nil || e.Type != "" ||
		e.Error.Code == nil || *e.Error.Code != "request_too_large" || !strings.Contains(e.Error.Message, `once decoded (Content-Encoding "zstd")`) {
		t.Errorf("answer %d %s, want 413 request_too_large in OpenAI's dialect, naming the encoding", resp.StatusCode, b)
	}
	if rec.Status != http.StatusRequestEntityTooLarge || rec.Outcome != llm.OutcomeBadRequest {
		t.Errorf("record: status %d, outcome %s; want 413, bad_request", rec.Status, rec.Outcome)
	}
	if n := len(tap.requests()) - upstreamBefore; n != 0 {
		t.Errorf("the upstream got %d requests", n)
	}
	if bound := uint64(2 * limit); spent > bound {
		t.Errorf("refusing a %d-byte zstd bomb of 1 GiB allocated %d bytes (%.2f× the %d-byte limit), want under 2×",
			len(bomb), spent, float64(spent)/limit, limit)
	} else {
		t.Logf("refusing a %d-byte zstd bomb of 1 GiB allocated %d bytes, %.2f× the limit", len(bomb), spent, float64(spent)/limit)
	}
}

// A body the gateway cannot decode gets an error in the caller's dialect
// that names the encoding, and nothing goes upstream: 415 (with the
// codings it decodes in Accept-Encoding) for a coding it does not know or
// too many of them, 400 for data that is not what its coding says, 413 for
// a body that decodes past the limit.
func TestUndecodableBodiesAreRefusedInTheCallersDialect(t *testing.T) {
	tap, upURL := tapMock(t)
	const limit = 4096
	tg := newTestGateway(t, upURL, func(c *config.Config) { c.Server.MaxBodyBytes = limit })
	chat := []byte(plainChat)
	gz := encodeBody(t, chat, "gzip")
	zs := encodeBody(t, chat, "zstd")
	big := encodeBody(t, []byte(`{"model":"gpt-test","messages":[{"role":"user","content":"`+strings.Repeat("a", 2*limit)+`"}]}`), "gzip")
	gzbr := encodeBody(t, []byte(strings.Repeat(plainChat, 20)), "gzip", "br")
	// Empty gzip members, each a valid gzip stream of nothing, past the
	// limit once br is undone and nothing once gzip is too.
	emptyMembers := encodeBody(t, bytes.Repeat(encodeBody(t, nil, "gzip"), 2*limit/20), "br")
	cases := []struct {
		name   string
		body   []byte
		lines  []string
		status int
		code   string
		msg    []string // substrings of the message
	}{
		{"deflate", chat, []string{"deflate"}, 415, "unsupported_content_encoding", []string{`"deflate"`, "gzip, zstd, br"}},
		{"unknown beside a known one", gz, []string{"gzip, compress"}, 415, "unsupported_content_encoding", []string{`"gzip, compress"`, `("compress" is not`}},
		{"three layers", gz, []string{"gzip, gzip", "gzip"}, 415, "unsupported_content_encoding", []string{"at most 2"}},
		{"gzip header on plain JSON", chat, []string{"gzip"}, 400, "invalid_content_encoding", []string{"not valid gzip data", `"gzip"`}},
		{"zstd header on gzip data", gz, []string{"zstd"}, 400, "invalid_content_encoding", []string{"not valid zstd data"}},
		{"br header on zstd data", zs, []string{"br"}, 400, "invalid_content_encoding", []string{"not valid br data"}},
		{"truncated zstd", zs[:len(zs)-6], []string{"zstd"}, 400, "invalid_content_encoding", []string{"not valid zstd data"}},
		{"gzip with trailing garbage", append(bytes.Clone(gz), "garbage"...), []string{"gzip"}, 400, "invalid_content_encoding", []string{"not valid gzip data"}},
		{"stacked in the wrong order", encodeBody(t, chat, "gzip", "br"), []string{"br, gzip"}, 400, "invalid_content_encoding", []string{"not valid gzip data", `"br, gzip"`}},
		{"the lower layer cut short", gzbr[:len(gzbr)-4], []string{"gzip, br"}, 400, "invalid_content_encoding", []string{"not valid br data", `"gzip, br"`}},
		{"zstd window over 8 MiB", zstdRawFrame(24, chat), []string{"zstd"}, 400, "invalid_content_encoding", []string{"RFC 9659"}},
		{"a lower layer decodes past the limit", emptyMembers, []string{"gzip, br"}, 413, "request_too_large", []string{"once decoded"}},
		{"decodes past the limit", big, []string{"gzip"}, 413, "request_too_large", []string{"limit of 4096 bytes once decoded", `"gzip"`}},
	}
	for _, tc := range cases {
		for _, d := range []struct {
			name, path string
			hdr        map[string]string
		}{{"openai", "/v1/chat/completions", nil}, {"anthropic", "/v1/messages", antHeaders}} {
			t.Run(tc.name+"/"+d.name, func(t *testing.T) {
				n := len(tap.requests())
				resp, b := sendEncoded(t, tg.URL+d.path, tc.body, tc.lines, d.hdr)
				rec := tg.record(t)
				if resp.StatusCode != tc.status {
					t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, b)
				}
				var e errorShape
				if err := json.Unmarshal(b, &e); err != nil {
					t.Fatalf("error body is not JSON: %q", b)
				}
				if d.name == "anthropic" {
					want := "invalid_request_error"
					if tc.status == 413 {
						want = "request_too_large"
					}
					if e.Type != "error" || e.Error.Type != want {
						t.Errorf("not Anthropic's %s error: %s", want, b)
					}
				} else if e.Type != "" || e.Error.Code == nil || *e.Error.Code != tc.code {
					t.Errorf("not OpenAI's %s error: %s", tc.code, b)
				}
				for _, m := range tc.msg {
					if !strings.Contains(e.Error.Message, m) {
						t.Errorf("message %q does not hold %q", e.Error.Message, m)
					}
				}
				if ae := resp.Header.Get("Accept-Encoding"); (tc.status == 415) != (ae == supportedCodings) {
					t.Errorf("Accept-Encoding %q on a %d", ae, tc.status)
				}
				if rec.Status != tc.status || rec.Outcome != llm.OutcomeBadRequest {
					t.Errorf("record: status %d, outcome %s", rec.Status, rec.Outcome)
				}
				if got := len(tap.requests()) - n; got != 0 {
					t.Errorf("the upstream got %d requests", got)
				}
			})
		}
	}
}

// On another /v1/* path, a body the gateway meters (a POST naming a model)
// goes upstream decoded, as on the dialect routes; a body it does not read
// goes upstream as the caller sent it, Content-Encoding and all; and one it
// cannot decode goes as sent too, unmetered, unless the caller is governed,
// who must be metered and so gets the error.
func TestForwardedBodiesGoUpstreamAsSentUnlessMetered(t *testing.T) {
	embed := []byte(`{"model":"text-embedding-test","input":"` + strings.Repeat("to embed ", 50) + `"}`)
	notJSON := []byte(strings.Repeat("plain upload bytes\n", 40))
	cases := []struct {
		name, path string
		keys       bool // mode "keys": the caller is governed
		body       []byte
		enc        string // Content-Encoding as sent
		status     int
		metered    bool // the upstream gets the body decoded, the record its model
	}{
		{"metered embeddings", "/v1/embeddings", false, encodeBody(t, embed, "zstd"), "zstd", 200, true},
		{"metered embeddings, governed", "/v1/embeddings", true, encodeBody(t, embed, "gzip", "br"), "gzip, br", 200, true},
		{"a body that is no model request", "/v1/uploads", false, encodeBody(t, notJSON, "gzip"), "gzip", 200, false},
		{"unknown coding, not governed", "/v1/embeddings", false, embed, "deflate", 200, false},
		{"corrupt, not governed", "/v1/embeddings", false, embed, "zstd", 200, false},
		{"unknown coding, governed", "/v1/embeddings", true, embed, "deflate", 415, false},
		{"corrupt, governed", "/v1/embeddings", true, embed, "br", 400, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// An encoded body is answered here: mockllm would refuse it.
			tap := &tapUpstream{next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("Content-Encoding") != "" {
					w.Header().Set("Content-Type", "application/json")
					_, _ = io.WriteString(w, `{"object":"list","data":[]}`)
					return
				}
				mockllm.New(mockllm.Options{}).ServeHTTP(w, r)
			})}
			srv := httptest.NewServer(tap)
			defer srv.Close()
			tg := newTestGateway(t, srv.URL, func(c *config.Config) {
				if tc.keys {
					c.Auth.Mode = "keys"
					c.Teams = []config.Team{{Name: "search"}}
					c.Keys = []config.Key{{Name: "alpha", SHA256: sha(keyAlpha), Team: "search"}}
				}
			})
			resp, b := sendEncoded(t, tg.URL+tc.path, tc.body, []string{tc.enc}, map[string]string{"Authorization": "Bearer " + keyAlpha})
			rec := tg.record(t)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, b)
			}
			got := tap.requests()
			if tc.status != http.StatusOK {
				if len(got) != 0 {
					t.Errorf("the upstream got %d requests", len(got))
				}
				var e errorShape
				if json.Unmarshal(b, &e) != nil || !strings.Contains(e.Error.Message, strconv.Quote(tc.enc)) {
					t.Errorf("the error does not name %q: %s", tc.enc, b)
				}
				return
			}
			if len(got) != 1 {
				t.Fatalf("the upstream got %d requests, want 1", len(got))
			}
			up := got[0]
			if tc.metered {
				if !bytes.Equal(up.body, embed) || up.header.Get("Content-Encoding") != "" || up.length != int64(len(embed)) {
					t.Errorf("the upstream got %q (%d bytes, Content-Encoding %q), want the decoded body",
						up.body, up.length, up.header.Get("Content-Encoding"))
				}
				if rec.Model != "text-embedding-test" || !rec.Usage.HasInput {
					t.Errorf("record: model %q, usage %+v; want the metered embedding's", rec.Model, rec.Usage)
				}
				return
			}
			if !bytes.Equal(up.body, tc.body) || up.header.Get("Content-Encoding") != tc.enc || up.length != int64(len(tc.body)) {
				t.Errorf("the upstream got %d bytes with Content-Encoding %q, want the %d sent with %q",
					len(up.body), up.header.Get("Content-Encoding"), len(tc.body), tc.enc)
			}
			if rec.Model != "" {
				t.Errorf("record model %q for a body the gateway did not read", rec.Model)
			}
		})
	}
}

// FuzzDecodeBody runs the decoding path on arbitrary bytes under each
// stack of codings sel picks (none, one, two). It never panics; it
// returns a body no larger than the limit, or a 400, 413 or 415; and
// bytes encoded by a real encoder come back exactly (differential: the
// encoders against the decoders), or 413 when past the limit.
//
// The committed seeds (testdata/fuzz/FuzzDecodeBody) hold real streams of
// each coding, a small zstd bomb, a zstd frame asking for a 16 MiB window,
// truncated and padded streams, and stacks in both orders.
func FuzzDecodeBody(f *testing.F) {
	const limit = 1 << 16
	chunks := chunkPool()
	names := []string{"gzip", "zstd", "br"}
	// sel's bits 6-7 say how many layers (0 to 2, 3 being 0), bits 0-1
	// and 2-3 which coding each is, in the order applied.
	stack := func(sel byte) []string {
		s := make([]string, int(sel>>6)%3)
		for i := range s {
			s[i] = names[int((sel>>(2*i))&3)%3]
		}
		return s
	}
	decode := func(data []byte, cs []string) ([]byte, *apiError) {
		h := http.Header{"Content-Encoding": {strings.Join(cs, ", ")}}
		codings, n, aerr := requestCodings(h)
		if aerr != nil {
			return nil, aerr
		}
		if n != len(cs) {
			f.Fatalf("%d codings read from %q", n, cs)
		}
		return decodeBody(data, codings[:n], contentEncoding(h), limit, chunks)
	}
	f.Fuzz(func(t *testing.T, data []byte, sel byte) {
		cs := stack(sel)
		if len(cs) == 0 {
			return
		}
		body, aerr := decode(data, cs)
		switch {
		case aerr == nil && len(body) > limit:
			t.Fatalf("%d bytes decoded past the %d limit", len(body), limit)
		case aerr != nil && aerr.Status != 400 && aerr.Status != 413:
			t.Fatalf("status %d: %s", aerr.Status, aerr.Msg)
		}
		// Round trip: the codings applied in order, then undone.
		enc := encodeBody(t, data, cs...)
		body, aerr = decode(enc, cs)
		switch {
		case len(data) > limit:
			if aerr == nil || aerr.Status != http.StatusRequestEntityTooLarge {
				t.Fatalf("%d bytes past the limit: %v", len(data), aerr)
			}
		case aerr != nil:
			t.Fatalf("round trip of %d bytes through %q: %v", len(data), cs, aerr)
		case !bytes.Equal(body, data):
			t.Fatalf("round trip through %q changed the bytes", cs)
		}
	})
}

// requestCodings reads the list as RFC 9110 §8.4 writes it, and refuses
// what it does not decode, before any decoding.
func TestRequestCodings(t *testing.T) {
	cases := []struct {
		lines  []string
		want   []coding
		status int
	}{
		{nil, nil, 0},
		{[]string{""}, nil, 0},
		{[]string{"identity"}, nil, 0},
		{[]string{"Gzip"}, []coding{codingGzip}, 0},
		{[]string{"gzip,,zstd"}, []coding{codingGzip, codingZstd}, 0},
		{[]string{"br", " IDENTITY ", "x-gzip"}, []coding{codingBrotli, codingGzip}, 0},
		{[]string{"gzip;q=1"}, nil, 415},
		{[]string{"zstd, zstd, zstd"}, nil, 415},
		{[]string{"compress"}, nil, 415},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%q", tc.lines), func(t *testing.T) {
			codings, n, aerr := requestCodings(http.Header{"Content-Encoding": tc.lines})
			if tc.status != 0 {
				if aerr == nil || aerr.Status != tc.status {
					t.Fatalf("error %v, want %d", aerr, tc.status)
				}
				return
			}
			if aerr != nil || fmt.Sprint(codings[:n]) != fmt.Sprint(tc.want) {
				t.Fatalf("%v, %v; want %v", codings[:n], aerr, tc.want)
			}
		})
	}
	if n := testing.AllocsPerRun(100, func() { _, _, _ = requestCodings(http.Header{}) }); n != 0 {
		t.Errorf("%v allocations reading a request without Content-Encoding", n)
	}
}
