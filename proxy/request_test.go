package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	rtmetrics "runtime/metrics"
	"strings"
	"sync"
	"testing"
	"testing/iotest"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
)

func TestAddIncludeUsage(t *testing.T) {
	tests := []struct {
		name, in, want string
		ok             bool
	}{
		{"absent", `{"model":"m","stream":true}`,
			`{"model":"m","stream":true,"stream_options":{"include_usage":true}}`, true},
		{"absent, whitespace and trailing newline kept", "{ \"model\" : \"m\", \"stream\": true }\n",
			"{ \"model\" : \"m\", \"stream\": true ,\"stream_options\":{\"include_usage\":true}}\n", true},
		{"null", `{"stream_options":null,"model":"m"}`,
			`{"stream_options":{"include_usage":true},"model":"m"}`, true},
		{"empty object", `{"model":"m","stream_options":{}}`,
			`{"model":"m","stream_options":{"include_usage":true}}`, true},
		{"other member kept", `{"model":"m","stream_options":{"include_obfuscation":false}}`,
			`{"model":"m","stream_options":{"include_usage":true,"include_obfuscation":false}}`, true},
		{"false flipped", `{"model":"m","stream_options":{"include_usage":false,"x":1}}`,
			`{"model":"m","stream_options":{"include_usage":true,"x":1}}`, true},
		{"escaped and nested look-alikes untouched",
			`{"messages":[{"content":"\"stream_options\":{}"}],"model":"m"}`,
			`{"messages":[{"content":"\"stream_options\":{}"}],"model":"m","stream_options":{"include_usage":true}}`, true},
		{"unicode kept byte for byte", `{"model":"m","messages":[{"content":"Ωmega \u00e9"}]}`,
			`{"model":"m","messages":[{"content":"Ωmega \u00e9"}],"stream_options":{"include_usage":true}}`, true},
		{"wrong type left alone", `{"model":"m","stream_options":"x"}`, `{"model":"m","stream_options":"x"}`, false},
		{"not an object", `[1]`, `[1]`, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := addIncludeUsage([]byte(tc.in))
			if ok != tc.ok || string(got) != tc.want {
				t.Fatalf("addIncludeUsage(%s) = %s, %v; want %s, %v", tc.in, got, ok, tc.want, tc.ok)
			}
			if ok {
				var v struct {
					StreamOptions struct {
						IncludeUsage bool `json:"include_usage"`
					} `json:"stream_options"`
				}
				if err := json.Unmarshal(got, &v); err != nil || !v.StreamOptions.IncludeUsage {
					t.Fatalf("result does not decode with include_usage true: %v", err)
				}
			}
		})
	}
}

func TestInspectRequest(t *testing.T) {
	tests := []struct {
		name    string
		d       llm.Dialect
		body    string
		want    requestInfo
		wantErr string // substring of the caller-facing message
	}{
		{name: "openai stream", d: llm.DialectOpenAI,
			body: `{"model":"gpt","stream":true,"max_completion_tokens":50,"max_tokens":9}`,
			want: requestInfo{Model: "gpt", Stream: true, MaxTokens: 50}},
		{name: "client asked for usage", d: llm.DialectOpenAI,
			body: `{"model":"gpt","stream":true,"stream_options":{"include_usage":true}}`,
			want: requestInfo{Model: "gpt", Stream: true, MaxTokens: -1, IncludeUsage: true}},
		{name: "anthropic", d: llm.DialectAnthropic, body: `{"model":"claude","max_tokens":1024,"messages":[]}`,
			want: requestInfo{Model: "claude", MaxTokens: 1024}},
		{name: "stream null", d: llm.DialectOpenAI, body: `{"model":"m","stream":null}`,
			want: requestInfo{Model: "m", MaxTokens: -1}},
		{name: "empty", d: llm.DialectOpenAI, body: ``, wantErr: "empty"},
		{name: "invalid json", d: llm.DialectOpenAI, body: `{"model":`, wantErr: "not valid JSON"},
		{name: "array", d: llm.DialectOpenAI, body: `[{"model":"m"}]`, wantErr: "JSON object"},
		{name: "missing model", d: llm.DialectAnthropic, body: `{"max_tokens":5}`, wantErr: `missing required field "model"`},
		{name: "model not string", d: llm.DialectOpenAI, body: `{"model":5}`, wantErr: `"model" must be a non-empty string`},
		{name: "empty model", d: llm.DialectOpenAI, body: `{"model":""}`, wantErr: `"model" must be a non-empty string`},
		{name: "stream not bool", d: llm.DialectOpenAI, body: `{"model":"m","stream":"yes"}`, wantErr: `"stream" must be a boolean`},
		{name: "max tokens not int", d: llm.DialectAnthropic, body: `{"model":"m","max_tokens":"x"}`, wantErr: "integer"},
		{name: "responses", d: llm.DialectResponses,
			body: `{"model":"gpt","input":"hi","stream":true,"max_output_tokens":64,"max_tokens":9,"background":true}`,
			want: requestInfo{Model: "gpt", Stream: true, MaxTokens: 64, Background: true}},
		{name: "responses without max_output_tokens", d: llm.DialectResponses, body: `{"model":"gpt","input":"hi"}`,
			want: requestInfo{Model: "gpt", MaxTokens: -1}},
		{name: "responses max_output_tokens not int", d: llm.DialectResponses,
			body: `{"model":"gpt","max_output_tokens":"64"}`, wantErr: "integer"},
		{name: "responses background not bool", d: llm.DialectResponses,
			body: `{"model":"gpt","background":"yes"}`, wantErr: `"background" must be a boolean`},
		{name: "responses missing model", d: llm.DialectResponses, body: `{"input":"hi"}`, wantErr: `missing required field "model"`},
		{name: "JSON whitespace around the object", d: llm.DialectOpenAI, body: " \t\r\n{\"model\":\"m\"}\n\r\t ",
			want: requestInfo{Model: "m", MaxTokens: -1}},
		{name: "vertical tab before the object", d: llm.DialectOpenAI, body: "\v{\"model\":\"m\"}", wantErr: "JSON object"},
		{name: "form feed after the object", d: llm.DialectOpenAI, body: "{\"model\":\"m\"}\f", wantErr: "not valid JSON"},
		{name: "no-break space before the object", d: llm.DialectOpenAI, body: "\u00a0{\"model\":\"m\"}", wantErr: "JSON object"},
		{name: "next-line after the object", d: llm.DialectOpenAI, body: "{\"model\":\"m\"}\u0085", wantErr: "not valid JSON"},
		{name: "escaped model", d: llm.DialectOpenAI, body: `{"model":"gpt\u002d4o"}`,
			want: requestInfo{Model: "gpt-4o", MaxTokens: -1}},
		{name: "model with invalid UTF-8", d: llm.DialectOpenAI, body: "{\"model\":\"m\xff\"}",
			want: requestInfo{Model: "m\ufffd", MaxTokens: -1}},
		// The end user and Codex's client_metadata, read for reporting.
		{name: "messages metadata.user_id", d: llm.DialectAnthropic,
			body: `{"model":"c","metadata":{"user_id":"{\"device_id\":\"ab\"}"},"user":"ignored"}`,
			want: requestInfo{Model: "c", MaxTokens: -1, endUser: `{"device_id":"ab"}`}},
		{name: "openai user", d: llm.DialectOpenAI, body: `{"model":"m","user":"u-7","safety_identifier":"s"}`,
			want: requestInfo{Model: "m", MaxTokens: -1, endUser: "u-7"}},
		{name: "openai safety_identifier", d: llm.DialectOpenAI, body: `{"model":"m","user":42,"safety_identifier":"s-1"}`,
			want: requestInfo{Model: "m", MaxTokens: -1, endUser: "s-1"}},
		{name: "responses client_metadata", d: llm.DialectResponses,
			body: `{"model":"m","client_metadata":{"session_id":"s1"}}`,
			want: requestInfo{Model: "m", MaxTokens: -1, clientMeta: []byte(`{"session_id":"s1"}`)}},
		{name: "responses client_metadata not an object", d: llm.DialectResponses,
			body: `{"model":"m","client_metadata":"s1"}`, want: requestInfo{Model: "m", MaxTokens: -1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := inspectRequest(tc.d, []byte(tc.body))
			if tc.wantErr != "" {
				if err == nil {
					t.Fatalf("no error; want %q", tc.wantErr)
				}
				if err.Status != http.StatusBadRequest || !strings.Contains(err.Msg, tc.wantErr) {
					t.Fatalf("error %d %q; want 400 containing %q", err.Status, err.Msg, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error %v", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestKeysReadFromBothHeaders: the bearer token and x-api-key are each
// read and hashed whatever the other holds, so governance.pick can choose
// between them; a malformed Authorization still leaves x-api-key readable.
func TestKeysReadFromBothHeaders(t *testing.T) {
	sk1, ant := keyHash("sk-1"), keyHash("sk-ant")
	tests := []struct {
		h    http.Header
		want presented
		name string
	}{
		{http.Header{"Authorization": {"Bearer sk-1"}}, presented{bearer: sk1}, "bearer"},
		{http.Header{"Authorization": {"bearer  sk-1 "}}, presented{bearer: sk1}, "case and spaces"},
		{http.Header{"X-Api-Key": {" sk-ant"}}, presented{apiKey: ant}, "x-api-key"},
		{http.Header{"Authorization": {"Bearer sk-1"}, "X-Api-Key": {"sk-ant"}},
			presented{bearer: sk1, apiKey: ant}, "both"},
		{http.Header{"Authorization": {"Bearer sk-1"}, "X-Api-Key": {"sk-1"}},
			presented{bearer: sk1, apiKey: sk1}, "the same key in both"},
		{http.Header{"Authorization": {"Basic abc"}}, presented{malformed: true}, "basic"},
		{http.Header{"Authorization": {"Bearer"}}, presented{malformed: true}, "no token"},
		{http.Header{"Authorization": {"Bearer a b"}}, presented{malformed: true}, "space in token"},
		{http.Header{"Authorization": {"Basic abc"}, "X-Api-Key": {"sk-ant"}},
			presented{apiKey: ant, malformed: true}, "malformed beside x-api-key"},
		{http.Header{}, presented{}, "none"},
	}
	for _, tc := range tests {
		if got := readKeys(tc.h); got != tc.want {
			t.Errorf("%s: readKeys = %+v; want %+v", tc.name, got, tc.want)
		}
	}
	if id := keyID("sk-secret-value"); len(id) != 12 || strings.Contains(id, "secret") {
		t.Errorf("keyID = %q", id)
	}
	if keyID("a") == keyID("b") {
		t.Error("different keys share an id")
	}
}

// FuzzAddIncludeUsage checks the request rewrite on arbitrary bodies: it
// never panics; when it edits, the result is valid JSON asking for usage and
// every other top-level member decodes exactly as before; when it does not,
// the body is returned unchanged.
func FuzzAddIncludeUsage(f *testing.F) {
	for _, seed := range []string{
		`{"model":"m","stream":true}`,
		`{}`,
		`{"stream_options":null}`,
		`{"stream_options":{}}`,
		`{"stream_options":{"include_usage":false,"x":[1,{"y":"}"}]}}`,
		`{"stream_options":"x"}`,
		`{"a":"\"stream_options\":{}","stream_options":{"include_usage":null}}`,
		` { "model" : "m" } `,
		`[1,2]`,
		`{"model":`,
		`{"stream_options":{},"stream_options":{"include_usage":true}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		orig := bytes.Clone(body)
		out, ok := addIncludeUsage(body)
		if !bytes.Equal(body, orig) {
			t.Fatal("the input was modified in place")
		}
		if !ok {
			if !bytes.Equal(out, body) {
				t.Fatalf("not ok but changed: %q -> %q", body, out)
			}
			return
		}
		var before, after map[string]json.RawMessage
		if json.Unmarshal(body, &before) != nil {
			// The gateway validates bodies before rewriting; an invalid one
			// may be edited but must not be made valid-looking garbage.
			return
		}
		if err := json.Unmarshal(out, &after); err != nil {
			t.Fatalf("rewrite of valid %q is invalid %q: %v", body, out, err)
		}
		var so struct {
			IncludeUsage bool `json:"include_usage"`
		}
		if err := json.Unmarshal(after["stream_options"], &so); err != nil || !so.IncludeUsage {
			t.Fatalf("rewrite %q does not ask for usage", out)
		}
		for k, v := range before {
			if k == "stream_options" {
				continue
			}
			if !bytes.Equal(v, after[k]) {
				t.Fatalf("member %q changed: %s -> %s", k, v, after[k])
			}
		}
		if _, aerr := inspectRequest(llm.DialectOpenAI, out); aerr == nil {
			if info, _ := inspectRequest(llm.DialectOpenAI, out); !info.IncludeUsage {
				t.Fatalf("inspectRequest does not see include_usage in %q", out)
			}
		}
	})
}

// zeroFill is an endless request body of one repeated byte that allocates
// nothing per read, so that what a test counts is the gateway's.
type zeroFill struct{ left int64 }

var fillBlock = bytes.Repeat([]byte("a"), 32<<10)

func (z *zeroFill) Read(p []byte) (int, error) {
	if z.left <= 0 {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), z.left)]
	n := 0
	for n < len(p) {
		n += copy(p[n:], fillBlock)
	}
	z.left -= int64(n)
	return n, nil
}

// heapAllocated is the process's running total of bytes allocated on the
// heap (what MemStats.TotalAlloc counts), read without stopping the world.
func heapAllocated() uint64 {
	s := []rtmetrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	rtmetrics.Read(s)
	return s[0].Value.Uint64()
}

// A body sent without a Content-Length, sixteen times the limit, is refused
// once the limit is passed, and reading it costs about the limit: the
// review's 64 MiB body against the 32 MiB default raised the gateway's
// peak RSS by 124 MiB, a buffer doubling past the limit.
//
// The cost is the heap allocated from the request's start to its record:
// a running total, so it bounds from above the high-water of what the
// request added to the heap, and it does not depend on when the GC runs,
// on the machine's load or on the race detector (whose shadow memory is
// not Go heap), as a sampled HeapInuse would. Everything else the exchange
// and both ends of the connection allocate fits in the fixed allowance.
func TestOversizedChunkedBodyCostsAboutItsLimit(t *testing.T) {
	const limit = 4 << 20
	up := newFixedUpstream(http.StatusOK, `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-4o-mini",`+
		`"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],`+
		`"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`, "")
	ups := httptest.NewServer(up)
	defer ups.Close()
	tg := newTestGateway(t, ups.URL, func(c *config.Config) { c.Server.MaxBodyBytes = limit })
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()

	// Two requests first, so that one-time costs (the connection, metric
	// children, the access log's handler) are not counted: one served, one
	// refused for its Content-Length before any of it is read.
	for _, body := range []string{plainChat, strings.Repeat("a", limit+1)} {
		req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, tg.URL+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		tg.record(t)
	}
	client.CloseIdleConnections()

	body := io.MultiReader(strings.NewReader(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"`),
		&zeroFill{left: 64 << 20})
	req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, tg.URL+"/v1/chat/completions", body)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = -1 // chunked
	req.Header.Set("Content-Type", "application/json")

	before := heapAllocated()
	resp, err := client.Do(req)
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), "request_too_large") {
			t.Errorf("answer %d %s, want 413 request_too_large", resp.StatusCode, b)
		}
	} // else the gateway closed the connection while the client was still sending: the record says what it sent
	rec := tg.record(t)
	spent := heapAllocated() - before

	if rec.Status != http.StatusRequestEntityTooLarge || rec.Outcome != llm.OutcomeBadRequest {
		t.Errorf("record: status %d, outcome %s; want 413, bad_request", rec.Status, rec.Outcome)
	}
	if n := up.requests(); n != 1 {
		t.Errorf("the upstream got %d requests, want only the warm-up's", n)
	}
	const allowance = 512 << 10
	if bound := uint64(limit)*5/4 + allowance; spent > bound {
		t.Errorf("refusing the body allocated %d bytes (%.2f× the %d-byte limit), want at most %d",
			spent, float64(spent)/limit, limit, bound)
	} else {
		t.Logf("refusing the body allocated %d bytes, %.2f× the limit", spent, float64(spent)/limit)
	}
}

func chunkPool() *sync.Pool {
	return &sync.Pool{New: func() any { c := make([]byte, relayBufSize); return &c }}
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// A body within the limit comes back whole, in a slice of exactly its
// length, with a Content-Length or without one and however its reads are
// cut (short reads, the last bytes with io.EOF); one byte past the limit is
// refused, and a Content-Length past it before anything is read.
func TestReadBodyReturnsBodiesWithinTheLimitWhole(t *testing.T) {
	const limit = 3*relayBufSize + 100
	pool := chunkPool()
	cuts := map[string]func(io.Reader) io.Reader{
		"plain":        func(r io.Reader) io.Reader { return struct{ io.Reader }{r} },
		"half reads":   iotest.HalfReader,
		"data and EOF": iotest.DataErrReader,
	}
	for _, n := range []int{0, 1, relayBufSize - 1, relayBufSize, relayBufSize + 1, 2*relayBufSize + 7, limit, limit + 1, 5 * relayBufSize} {
		payload := make([]byte, n)
		for i := range payload {
			payload[i] = byte(i * 7 % 251)
		}
		for _, sized := range []bool{true, false} {
			for cut, wrap := range cuts {
				t.Run(fmt.Sprintf("%d bytes/sized=%v/%s", n, sized, cut), func(t *testing.T) {
					src := &countingReader{r: wrap(bytes.NewReader(payload))}
					r := &http.Request{Method: http.MethodPost, Body: io.NopCloser(src), ContentLength: -1}
					if sized {
						r.ContentLength = int64(n)
					}
					body, aerr := readBody(r, limit, pool)
					if n > limit {
						if aerr == nil || aerr.Status != http.StatusRequestEntityTooLarge {
							t.Fatalf("a %d-byte body under a %d-byte limit: %d bytes, error %v; want 413", n, limit, len(body), aerr)
						}
						if sized && src.n != 0 {
							t.Errorf("%d bytes read of a body whose Content-Length is past the limit", src.n)
						}
						if !sized && src.n > limit+1 {
							t.Errorf("%d bytes read before refusing, want at most limit+1 = %d", src.n, limit+1)
						}
						return
					}
					if aerr != nil {
						t.Fatalf("error %v", aerr)
					}
					if !bytes.Equal(body, payload) {
						t.Fatalf("got %d bytes, differing from the %d sent at byte %d", len(body), n, firstByteDiff(body, payload))
					}
					if cap(body) != len(body) {
						t.Errorf("cap %d for %d bytes: the slice is not exactly the body", cap(body), len(body))
					}
				})
			}
		}
	}
}

func firstByteDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// A body that breaks off (the connection ends or fails before the body's
// end) is refused as unreadable, not passed on in part.
func TestReadBodyRefusesABodyThatBreaksOff(t *testing.T) {
	payload := bytes.Repeat([]byte("b"), 2*relayBufSize+3)
	broken := errors.New("connection reset")
	for _, tc := range []struct {
		name string
		body io.Reader
		cl   int64
	}{
		{"short of its Content-Length", bytes.NewReader(payload), int64(len(payload)) + 1},
		{"chunked, failing in its second chunk", io.MultiReader(bytes.NewReader(payload[:relayBufSize+5]), iotest.ErrReader(broken)), -1},
		{"with a Content-Length, failing", io.MultiReader(bytes.NewReader(payload[:10]), iotest.ErrReader(broken)), int64(len(payload))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &http.Request{Method: http.MethodPost, Body: io.NopCloser(tc.body), ContentLength: tc.cl}
			body, aerr := readBody(r, 1<<20, chunkPool())
			if aerr == nil || aerr.Status != http.StatusBadRequest || body != nil {
				t.Fatalf("%d bytes, error %v; want 400 and no body", len(body), aerr)
			}
		})
	}
}

// With a Content-Length the body costs one allocation, of its length.
func TestReadBodyWithAContentLengthAllocatesOnce(t *testing.T) {
	payload := bytes.Repeat([]byte("c"), 100<<10)
	rd := bytes.NewReader(payload)
	r := &http.Request{Method: http.MethodPost, Body: io.NopCloser(struct{ io.Reader }{rd}), ContentLength: int64(len(payload))}
	pool := chunkPool()
	if n := testing.AllocsPerRun(20, func() {
		rd.Reset(payload)
		if body, aerr := readBody(r, 1<<20, pool); aerr != nil || len(body) != len(payload) {
			t.Fatalf("%d bytes, error %v", len(body), aerr)
		}
	}); n != 1 {
		t.Fatalf("%.1f allocations per body, want 1", n)
	}
}

// A body sent without a Content-Length, of exactly the limit and spanning
// several chunks, reaches the upstream byte for byte.
func TestChunkedBodyWithinTheLimitGoesUpstreamAsSent(t *testing.T) {
	up := &rawUpstream{contentType: "application/json", pieces: [][]byte{[]byte(`{"id":"chatcmpl-1","object":"chat.completion",` +
		`"created":1,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},` +
		`"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)}}
	ups := httptest.NewServer(up)
	defer ups.Close()
	sent := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"` + strings.Repeat("x", 3*relayBufSize+11) + `"}]}`
	tg := newTestGateway(t, ups.URL, func(c *config.Config) { c.Server.MaxBodyBytes = int64(len(sent)) })
	req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, tg.URL+"/v1/chat/completions",
		struct{ io.Reader }{strings.NewReader(sent)})
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = -1 // chunked
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if rec := tg.record(t); rec.Outcome != llm.OutcomeOK {
		t.Errorf("outcome %s", rec.Outcome)
	}
	got, _ := up.request()
	if string(got) != sent {
		t.Fatalf("the upstream got %d bytes, differing from the %d sent at byte %d", len(got), len(sent), firstByteDiff(got, []byte(sent)))
	}
}

func TestNonCanonicalPathsNeverReachTheUpstream(t *testing.T) {
	up := newFixedUpstream(http.StatusOK, `{"object":"list","data":[]}`, `{}`)
	srv := httptest.NewServer(up)
	defer srv.Close()
	tg := newTestGateway(t, srv.URL, nil)
	addr := strings.TrimPrefix(tg.URL, "http://")
	for _, path := range []string{
		"/v1/../metrics",
		"/v1/chat/completions/../../metrics",
		"/v1/%2e%2e/admin",
		"/v1/%2E%2E/admin",
		"/v1/models/..%2fadmin",
		"/v1/files%2F..%2Fadmin",
		"/v1/files%5cadmin",
		"/v1/models%2ex",
		"/v1//models",
		"/v1/./models",
		"/v1/models/",
		`/v1/models\..\admin`,
		"/v1/.",
		"/v1/respons%65s/resp_1",
		"/v1/models/..;/..;/admin",
		"/v1/models;x",
		"/v1/models/%252e%252e/admin",
		"/v1/models/a%00b",
		"/v1/models/%ff",
		"/v1/mod%7Eels",
	} {
		for _, anthropic := range []bool{false, true} {
			hdr := ""
			if anthropic {
				hdr = "anthropic-version: 2023-06-01\r\n"
			}
			resp, body := rawRequest(t, addr, "GET "+path+" HTTP/1.1\r\nHost: gw\r\n"+hdr+"Connection: close\r\n\r\n")
			code, typ := errorCode(body)
			switch {
			case resp.StatusCode != http.StatusBadRequest:
				t.Errorf("GET %s: %d %s, want 400", path, resp.StatusCode, body)
			case anthropic && typ != "invalid_request_error":
				t.Errorf("GET %s (Anthropic caller): %s, want an Anthropic invalid_request_error", path, body)
			case !anthropic && code != "invalid_path":
				t.Errorf("GET %s: %s, want an OpenAI error with code invalid_path", path, body)
			}
			if rec := tg.record(t); rec.Outcome != llm.OutcomeRejected || rec.Rejection != llm.RejectNonCanonicalPath {
				t.Errorf("GET %s: record outcome %s rejection %s", path, rec.Outcome, rec.Rejection)
			}
		}
	}
	if n := up.requests(); n != 0 {
		t.Errorf("the upstream got %d requests, want none", n)
	}
	// A canonical path still goes through.
	resp, body := rawRequest(t, addr, "GET /v1/models HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
	if resp.StatusCode != http.StatusOK || up.requests() != 1 {
		t.Errorf("GET /v1/models: %d %s, upstream %d requests", resp.StatusCode, body, up.requests())
	}
	tg.record(t)
}

func TestResponsesRequestNamesItsStoredState(t *testing.T) {
	cases := []struct {
		body      string
		prev      string
		conv      string
		noStore   bool
		wantParam string // "" when the body is accepted
	}{
		{body: `{"model":"m","previous_response_id":"resp_1"}`, prev: "resp_1"},
		{body: `{"model":"m","conversation":"conv_1"}`, conv: "conv_1"},
		{body: `{"model":"m","conversation":{"id":"conv_1"}}`, conv: "conv_1"},
		{body: `{"model":"m","conversation":{"id":"conv_1","id":"conv_2"}}`, conv: "conv_2"},
		{body: `{"model":"m","conversation":{"ID":"conv_x","id":"conv_1"}}`, conv: "conv_1"},
		{body: `{"model":"m","conversation":{"i\u0064":"conv_1"}}`, conv: "conv_1"},
		{body: `{"model":"m","previous_response_id":"resp_1","previous_response_id":"resp_2"}`, prev: "resp_2"},
		{body: `{"model":"m","previous_response_id":null,"conversation":null}`},
		{body: `{"model":"m","store":false}`, noStore: true},
		{body: `{"model":"m","store":true}`},
		{body: `{"model":"m","previous_response_id":7}`, wantParam: "previous_response_id"},
		{body: `{"model":"m","conversation":{"name":"x"}}`, wantParam: "conversation"},
		{body: `{"model":"m","conversation":""}`, wantParam: "conversation"},
		{body: `{"model":"m","conversation":[1]}`, wantParam: "conversation"},
		{body: `{"model":"m","store":"no"}`, wantParam: "store"},
	}
	for _, c := range cases {
		info, aerr := inspectRequest(llm.DialectResponses, []byte(c.body))
		switch {
		case c.wantParam != "":
			if aerr == nil || aerr.Param != c.wantParam || aerr.Status != http.StatusBadRequest {
				t.Errorf("%s: %+v, want a 400 naming %s", c.body, aerr, c.wantParam)
			}
		case aerr != nil:
			t.Errorf("%s: %v", c.body, aerr)
		case info.PreviousResponseID != c.prev || info.Conversation != c.conv || info.NoStore != c.noStore:
			t.Errorf("%s: previous %q conversation %q no-store %v; want %q %q %v", c.body,
				info.PreviousResponseID, info.Conversation, info.NoStore, c.prev, c.conv, c.noStore)
		}
		fwd, ok := inspectForwarded([]byte(c.body))
		if ok != (c.wantParam == "") || ok && (fwd.PreviousResponseID != c.prev || fwd.Conversation != c.conv) {
			t.Errorf("%s forwarded: ok %v, previous %q, conversation %q", c.body, ok, fwd.PreviousResponseID, fwd.Conversation)
		}
	}
	// The upstream reads keys exactly: a case variant of a reference could
	// name another team's response than the one the gateway checked.
	for _, body := range []string{
		`{"model":"m","previous_response_id":"resp_mine","Previous_Response_ID":"resp_theirs"}`,
		`{"model":"m","CONVERSATION":"conv_theirs"}`,
	} {
		if _, _, bad := caseVariantField([]byte(body)); !bad {
			t.Errorf("%s: case variant not caught", body)
		}
	}
}

// requestFieldBodies are bodies for the one-pass field scan, with whether
// it takes them (else encoding/json reads them).
var requestFieldBodies = []struct {
	body  string
	takes bool
}{
	{`{"model":"gpt-4o","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`, true},
	{`{"Model":"a","MODEL":"b","stream":false,"Max_Tokens":1,"max_completion_tokens":2}`, true},
	{`{"model":"m","stream_options":{"include_usage":true,"Include_Usage":false,"x":1}}`, true},
	{`{"model":"m","stream_options":null}`, true},
	{`{"model":"m","input":"x","max_output_tokens":9,"background":true,"previous_response_id":"resp_1","conversation":{"id":"conv_1"},"store":false}`, true},
	{` {"model" : null , "stream" : "yes" , "max_tokens" : 1.5e3 } `, true},
	{`{"model":"m","messages":[{"content":"\u00e9\ud83d\ude00 \"quoted\""}],"nested":{"model":"no"}}`, true},
	{`{}`, true},
	{`{"mod\u0065l":"m"}`, false},          // an escaped key
	{`{"ſtream":true,"model":"m"}`, false}, // encoding/json folds ſ to s
	{`{"model":"m","stream_options":{"include_usage":true},"stream_options":{}}`, false},
	{`{"model":"m","stream_options":5}`, false},
	{`{"model":"m","stream_options":{"include_usage":tru}}`, false},
	{`{"model":"m",}`, false},
	{`{"model":"m"} x`, false},
	{"{\"model\":\"m\",\"messages\":[\"\xff\"]}", true},
}

// TestScanRequestFieldsReadsAsEncodingJSON: the one-pass scan takes the
// bodies it can be sure of and reads each of their fields as json.Unmarshal
// does; it leaves the rest to encoding/json.
func TestScanRequestFieldsReadsAsEncodingJSON(t *testing.T) {
	for _, c := range requestFieldBodies {
		got, ok := scanRequestFields([]byte(c.body))
		if ok != c.takes {
			t.Errorf("%s: taken %v, want %v", c.body, ok, c.takes)
		}
		if ok {
			sameAsEncodingJSON(t, []byte(c.body), got)
		}
	}
}

// FuzzScanRequestFieldsAsEncodingJSON: whatever body the one-pass scan
// takes, encoding/json takes too, reading every field the same.
func FuzzScanRequestFieldsAsEncodingJSON(f *testing.F) {
	for _, c := range requestFieldBodies {
		f.Add([]byte(c.body))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, ok := scanRequestFields(b); ok {
			sameAsEncodingJSON(t, b, got)
		}
	})
}

// FuzzJSONScalarsAsEncodingJSON: jsonText and jsonBool read any value as
// json.Unmarshal does into a string and a bool, their shortcuts included.
func FuzzJSONScalarsAsEncodingJSON(f *testing.F) {
	for _, seed := range []string{`"gpt-4o"`, `""`, `"a\"b"`, `"\u00e9"`, "\"\xff\"", "\"a\x01\"", `"a"b"`, `"`,
		`true`, `false`, ` true`, `null`, `1`, `tru`, `"true"`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var ws string
		werr := json.Unmarshal(raw, &ws)
		if s, ok := jsonText(raw); ok != (werr == nil) || (ok && s != ws) {
			t.Fatalf("jsonText(%q) = %q, %v; encoding/json %q, %v", raw, s, ok, ws, werr)
		}
		var wb bool
		werr = json.Unmarshal(raw, &wb)
		if b, ok := jsonBool(raw); ok != (werr == nil) || (ok && b != wb) {
			t.Fatalf("jsonBool(%q) = %v, %v; encoding/json %v, %v", raw, b, ok, wb, werr)
		}
	})
}

func sameAsEncodingJSON(t *testing.T, body []byte, got requestFields) {
	t.Helper()
	var want requestFields
	if err := json.Unmarshal(body, &want); err != nil {
		t.Fatalf("%q: scanned, but encoding/json refuses it: %v", body, err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%q:\nscanned       %s\nencoding/json %s", body, fieldsString(got), fieldsString(want))
	}
}

func fieldsString(f requestFields) string {
	s := fmt.Sprintf("model=%s stream=%s max=%s/%s/%s background=%s prev=%s conv=%s store=%s", f.Model, f.Stream,
		f.MaxTokens, f.MaxCompletionTokens, f.MaxOutputTokens, f.Background, f.PreviousResponseID, f.Conversation, f.Store)
	if f.StreamOptions != nil {
		s += fmt.Sprintf(" include_usage=%s", f.StreamOptions.IncludeUsage)
	}
	return s
}

// BenchmarkRequestFields reads a request body's fields in one jsonscan pass
// and through encoding/json, for a short chat request and one carrying a
// 100 KB prompt (the size of a retrieval-augmented request).
func BenchmarkRequestFields(b *testing.B) {
	for _, c := range []struct{ name, prompt string }{
		{"short", "hello"},
		{"100KB", strings.Repeat("Retrieved passage, with \"quotes\" and a newline\n. ", 2000)},
	} {
		content, _ := json.Marshal(c.prompt)
		body := []byte(`{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"max_tokens":256,` +
			`"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":` + string(content) + `}]}`)
		b.Run(c.name+"/scan", func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := scanRequestFields(body); !ok {
					b.Fatal("not taken")
				}
			}
		})
		b.Run(c.name+"/encoding-json", func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				var f requestFields
				if err := json.Unmarshal(body, &f); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
