package main

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/internal/otlptest"
	"github.com/tollgate-llm/tollgate/mockllm"
)

// TestServeTracing: with [tracing] on, /metrics has
// tollgate_tracing_dropped_spans_total, and once shutdown returns the
// request's spans have been exported: the shutdown flushes what the batch
// delay (1 s) had not sent yet.
func TestServeTracing(t *testing.T) {
	rcv := otlptest.StartHTTP(t)
	mock := httptest.NewServer(mockllm.New(mockllm.Options{OutputTokens: 3}))
	defer mock.Close()
	cfg := config.DemoConfig(mock.URL)
	cfg.Auth.RequireKey = false
	cfg.Tracing.Enabled, cfg.Tracing.Endpoint = true, rcv.Endpoint
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gw, err := startGateway(&cfg, ln, slog.New(slog.DiscardHandler), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + gw.addr
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Post(base+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	resp, err = client.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metricsText, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(metricsText), `tollgate_tracing_dropped_spans_total{reason="queue_full"} 0`) {
		t.Errorf("/metrics lacks tollgate_tracing_dropped_spans_total:\n%s", metricsText)
	}
	if err := gw.shutdown(0, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range rcv.Spans() {
		names = append(names, s.GetName())
	}
	if len(names) != 2 || !strings.Contains(strings.Join(names, ","), "chat gpt-4o-mini") {
		t.Errorf("spans exported by the shutdown: %q, want the request's and its attempt's", names)
	}
}
