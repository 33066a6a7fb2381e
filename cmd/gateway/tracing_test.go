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

	"os"
	"path/filepath"

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
	gw := startTraced(t, &cfg, rcv.Endpoint)
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

// TestServeShutdownSavesLedgerBeforeWaitingOnCollector: with a collector
// that accepts and never answers, shutdown must not hold the ledger's last
// save (spend state) behind the 5 s it gives the spans: money first, traces
// after.
func TestServeShutdownSavesLedgerBeforeWaitingOnCollector(t *testing.T) {
	rcv := otlptest.StartHTTP(t)
	rcv.Stall()
	mock := httptest.NewServer(mockllm.New(mockllm.Options{OutputTokens: 3}))
	defer mock.Close()
	dir := t.TempDir()
	state := filepath.Join(dir, "spend.json")
	cfg := config.DemoConfig(mock.URL)
	cfg.Auth.RequireKey = false
	cfg.Spend.StateFile = state
	cfg.Spend.FlushIntervalSeconds = 3600
	gw := startTraced(t, &cfg, rcv.Endpoint)
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Post("http://"+gw.addr+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	before, _ := os.Stat(state)
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- gw.shutdown(0, 2*time.Second) }()
	saved := time.Duration(-1)
	for deadline := time.Now().Add(8 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if fi, err := os.Stat(state); err == nil && (before == nil || !fi.ModTime().Equal(before.ModTime())) {
			saved = time.Since(start)
			break
		}
	}
	<-done
	t.Logf("shutdown took %v; spend state saved after %v", time.Since(start), saved)
	if saved < 0 || saved > 2*time.Second {
		t.Errorf("the spend state was saved %v into the shutdown (-1: never), behind the stalled collector", saved)
	}
}

// startTraced starts a gateway on cfg, exporting its traces to endpoint,
// on a free loopback port; the test shuts it down.
func startTraced(t *testing.T, cfg *config.Config, endpoint string) *runningGateway {
	t.Helper()
	cfg.Tracing.Enabled, cfg.Tracing.Endpoint = true, endpoint
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gw, err := startGateway(cfg, ln, slog.New(slog.DiscardHandler), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return gw
}
