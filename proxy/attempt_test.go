package proxy

// Unit tests of the pieces of attempt.go and upstream.go that decide an
// attempt's fate: the model rename, the reading of error bodies and error
// events, the retry decision, the routing table, the phase timer and the
// in-band error event that ends a broken stream.

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
)

// TestHeaderPhaseFollowsRequest: the header timeout applies to streamed
// requests only, whatever an earlier attempt answered. A non-streamed
// request whose first attempt got a stream (that broke before its first
// token) must not put its second attempt under header_timeout_seconds:
// the slow but healthy non-streamed answer is no header timeout.
func TestHeaderPhaseFollowsRequest(t *testing.T) {
	const answer = `{"id":"chatcmpl-tg0002","object":"chat.completion","created":1767225600,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"Oslo"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}`
	var hits atomic.Int32
	us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if hits.Add(1) == 1 {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, openAIRole) // and the body ends: no token
			return
		}
		// A non-streamed answer's headers come with its body: slower than
		// the header timeout, which must not apply here. (The wait only
		// gives the parent's wrongly armed timer time to fire.)
		select {
		case <-r.Context().Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, answer)
	}))
	defer us.Close()
	tg := newTestGateway(t, us.URL, func(c *config.Config) {
		u := &c.Upstreams[0]
		u.HeaderTimeoutSeconds = 0.001
		fastRetry(u)
	})
	resp, body := post(t, tg.URL+"/v1/chat/completions", plainChat, nil)
	rec := tg.record(t)
	if resp.StatusCode != http.StatusOK || string(body) != answer {
		t.Errorf("caller got %d %q; want the second attempt's answer", resp.StatusCode, body)
	}
	wantAttempts(t, rec, "mock:200:stream_broken", "mock:200:ok")
	if rec.Stream || hits.Load() != 2 {
		t.Errorf("record stream %v, upstream hits %d; want false, 2", rec.Stream, hits.Load())
	}
}

// gzipUpstream compresses its answer when the request allows it.
func gzipUpstream(t *testing.T, ct string, pieces []string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", ct)
		var out io.Writer = w
		var zw *gzip.Writer
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.Header().Set("Content-Encoding", "gzip")
			zw = gzip.NewWriter(w)
			out = zw
		} else {
			t.Errorf("upstream was not offered gzip (Accept-Encoding %q)", r.Header.Get("Accept-Encoding"))
		}
		rc := http.NewResponseController(w)
		for _, p := range pieces {
			_, _ = io.WriteString(out, p)
			if zw != nil {
				_ = zw.Flush()
			}
			_ = rc.Flush()
		}
		if zw != nil {
			_ = zw.Close()
		}
	})
}

// A gzip-speaking upstream: the caller asked for gzip, the gateway let the
// transport negotiate it, and the caller must get plain, identical bytes
// without a Content-Encoding header.
func TestGzipUpstream(t *testing.T) {
	jsonBody := `{"id":"chatcmpl-1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`
	sse := []string{openAIRole, openAITok1, openAITok2, openAIStop + openAIUsage, openAIDone}
	tests := []struct {
		name, ct, body string
		pieces         []string
		want           string
		stream         bool
	}{
		{"json", "application/json", `{"model":"m","messages":[]}`, []string{jsonBody}, jsonBody, false},
		{"sse", "text/event-stream", `{"model":"m","stream":true,"messages":[]}`, sse,
			openAIRole + openAITok1 + openAITok2 + openAIStop + openAIDone, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(gzipUpstream(t, tc.ct, tc.pieces))
			defer srv.Close()
			tg := newTestGateway(t, srv.URL, nil)
			req, _ := http.NewRequest(http.MethodPost, tg.URL+"/v1/chat/completions", strings.NewReader(tc.body))
			req.Header.Set("Accept-Encoding", "gzip") // the caller's own: must not reach the upstream
			resp, err := (&http.Client{Transport: &http.Transport{DisableCompression: true}}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if ce := resp.Header.Get("Content-Encoding"); ce != "" {
				t.Errorf("client got Content-Encoding %q", ce)
			}
			if !bytes.Equal(got, []byte(tc.want)) {
				t.Errorf("client got %.200q", got)
			}
			rec := tg.record(t)
			if rec.Outcome != llm.OutcomeOK || rec.Usage.Output != 7 && !tc.stream || tc.stream && rec.Usage.Output != 8 {
				t.Errorf("record outcome %s output %d", rec.Outcome, rec.Usage.Output)
			}
		})
	}
}

// lateWroteTransport reproduces a race of net/http's HTTP/1 transport: its
// write loop reports WroteRequest from its own goroutine, after the request
// was flushed, and RoundTrip may already have returned the answer's headers
// by then. Here the report reaches the gateway's trace only when the
// response body is first read, so always after RoundTrip returned.
type lateWroteTransport struct {
	inner http.RoundTripper
}

func (l lateWroteTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	outer := httptrace.ContextClientTrace(req.Context())
	var (
		mu    sync.Mutex
		wrote *httptrace.WroteRequestInfo
	)
	// A context with the same cancellation but only this trace, so the
	// gateway's WroteRequest runs only when this transport passes it on.
	ctx, cancel := context.WithCancel(context.Background())
	stop := context.AfterFunc(req.Context(), cancel)
	inner := &httptrace.ClientTrace{
		WroteRequest: func(info httptrace.WroteRequestInfo) {
			mu.Lock()
			wrote = &info
			mu.Unlock()
		},
		GotFirstResponseByte: outer.GotFirstResponseByte,
	}
	resp, err := l.inner.RoundTrip(req.Clone(httptrace.WithClientTrace(ctx, inner)))
	if err != nil {
		stop()
		cancel()
		return nil, err
	}
	resp.Body = &lateWroteBody{ReadCloser: resp.Body, deliver: func() {
		mu.Lock()
		defer mu.Unlock()
		if wrote != nil {
			outer.WroteRequest(*wrote)
		}
	}, done: func() { stop(); cancel() }}
	return resp, nil
}

type lateWroteBody struct {
	io.ReadCloser
	once    sync.Once
	deliver func()
	done    func()
}

func (b *lateWroteBody) Read(p []byte) (int, error) {
	b.once.Do(b.deliver)
	return b.ReadCloser.Read(p)
}

func (b *lateWroteBody) Close() error {
	err := b.ReadCloser.Close()
	b.done()
	return err
}

// TestUpSentReportedAfterRoundTrip: a request whose "written" moment is
// reported after RoundTrip returned still gets it, so its overhead and
// upstream TTFT are figured (on a loaded machine the report comes late
// for a few percent of streams).
func TestUpSentReportedAfterRoundTrip(t *testing.T) {
	mock := httptest.NewServer(mockllm.New(mockllm.Options{OutputTokens: 4}))
	defer mock.Close()
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	tg := newTestGatewayWith(t, mock.URL, nil, func(o *Options) {
		o.Transport = lateWroteTransport{inner: base}
	})
	for _, body := range []string{
		`{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`,
	} {
		resp, _ := post(t, tg.URL+"/v1/chat/completions", body, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		rec := tg.record(t)
		if rec.Timing.UpSent.IsZero() || rec.Timing.UpSent.Before(rec.Timing.In) {
			t.Errorf("stream=%v: UpSent %v (arrival %v): the late report was lost", rec.Stream, rec.Timing.UpSent, rec.Timing.In)
		}
		if rec.Stream && rec.UpstreamTTFT() <= 0 {
			t.Errorf("stream: upstream TTFT %v", rec.UpstreamTTFT())
		}
	}
}

// TestEventStreamContentTypes: an answer is relayed as a stream when its
// media type is text/event-stream in any case and with any parameters,
// malformed ones included, and not when the type only starts the same.
func TestEventStreamContentTypes(t *testing.T) {
	for ct, want := range map[string]bool{
		"text/event-stream":                true,
		"text/event-stream; charset=utf-8": true,
		"text/event-stream;charset=utf-8":  true,
		"TEXT/Event-Stream; charset=UTF-8": true,
		" text/event-stream":               true,
		"text/event-stream;;":              true,
		"text/event-stream; =bad":          true,
		"text/event-stream x":              true,
		"text/event-streamx":               false,
		"text/event-streaming; a=b":        false,
		"application/json":                 false,
		"text/plain; q=text/event-stream":  false,
		"":                                 false,
	} {
		if got := isEventStream(ct); got != want {
			t.Errorf("isEventStream(%q) = %v, want %v", ct, got, want)
		}
	}
}

// TestUnaskedStreamDoesNotTimeTheNextAttemptsFirstToken: an upstream that
// answers a non-streamed request with an event stream gets only the total
// timeout (no first-token timer), and a retry after it fails is judged by
// the caller's request again, not by what the failed attempt got: its slow
// first token is not cut by first_token_timeout_seconds.
func TestUnaskedStreamDoesNotTimeTheNextAttemptsFirstToken(t *testing.T) {
	var n atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		if n.Add(1) == 1 { // an error event before any token: retried
			_, _ = io.WriteString(w, errorEvent("server_error", "boom"))
			return
		}
		w.(http.Flusher).Flush()
		time.Sleep(150 * time.Millisecond) // past the first-token timeout below
		_, _ = io.WriteString(w, chunkEvent(`{"content":"hi"}`)+"data: [DONE]\n\n")
	}))
	defer up.Close()
	tg := newTestGateway(t, up.URL, func(c *config.Config) {
		c.Upstreams[0].Retry.MaxAttempts = 2
		fastRetry(&c.Upstreams[0])
		c.Upstreams[0].FirstTokenTimeoutSeconds = 0.05
	})
	resp, body := post(t, tg.URL+"/v1/chat/completions",
		`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`, nil)
	rec := tg.record(t)
	if resp.StatusCode != http.StatusOK || rec.Outcome != llm.OutcomeOK {
		t.Errorf("status %d, outcome %v, attempts %v: %s", resp.StatusCode, rec.Outcome, attemptList(rec), body)
	}
	wantAttempts(t, rec, "mock:200:error_event", "mock:200:ok")
}
