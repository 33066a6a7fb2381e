package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/mockllm"
)

// TestMockUpstreamServesHTTP1AndH2C: the fake upstream answers a stream
// over HTTP/1.1 and over HTTP/2 by prior knowledge on one port, and
// carries many HTTP/2 streams at once on one connection, each whole.
func TestMockUpstreamServesHTTP1AndH2C(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := mockServer(mockllm.New(mockllm.Options{TTFT: time.Millisecond, ITL: time.Millisecond, OutputTokens: 5,
		Logger: slog.New(slog.DiscardHandler)}))
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		_ = srv.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
	}()
	url := "http://" + ln.Addr().String() + "/v1/chat/completions"

	var dials int
	var mu sync.Mutex
	dialer := &net.Dialer{}
	var h2c http.Protocols
	h2c.SetUnencryptedHTTP2(true)
	for _, c := range []struct {
		name, proto string
		tr          *http.Transport
	}{
		{"http1", "HTTP/1.1", &http.Transport{}},
		{"h2c", "HTTP/2.0", &http.Transport{Protocols: &h2c, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			mu.Lock()
			dials++
			mu.Unlock()
			return dialer.DialContext(ctx, network, addr)
		}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			client := &http.Client{Transport: c.tr}
			defer client.CloseIdleConnections()
			// One stream first opens the connection; the rest share it.
			if err := mockStream(client, url, c.proto); err != nil {
				t.Fatal(err)
			}
			const n = 20
			var wg sync.WaitGroup
			errs := make(chan error, n)
			for range n {
				wg.Go(func() { errs <- mockStream(client, url, c.proto) })
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Error(err)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if c.name == "h2c" && dials != 1 {
				t.Errorf("HTTP/2 streams, 20 at once, took %d connections, want 1 (over HTTP/1.1 they take 20)", dials)
			}
		})
	}
}

// mockStream sends one streamed chat request and checks the answer came over
// proto, as an event stream, whole (five tokens and [DONE]).
func mockStream(c *http.Client, url, proto string) error {
	resp, err := c.Post(url, "application/json", strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	switch {
	case err != nil:
		return err
	case resp.StatusCode != http.StatusOK || resp.Proto != proto:
		return fmt.Errorf("status %d over %s, want 200 over %s: %s", resp.StatusCode, resp.Proto, proto, body)
	case !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream"):
		return fmt.Errorf("content type %q", resp.Header.Get("Content-Type"))
	case strings.Count(string(body), " tok") != 5 || !strings.HasSuffix(string(body), "data: [DONE]\n\n"):
		return fmt.Errorf("not the whole stream over %s: %q", proto, body)
	}
	return nil
}
