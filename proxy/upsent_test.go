package proxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"sync"
	"testing"

	"github.com/tollgate-llm/tollgate/mockllm"
)

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
// upstream TTFT are figured (they were missing for ~7% of streams on a
// loaded 2-core machine).
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
