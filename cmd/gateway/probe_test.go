package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/mockllm"
)

// syncBuffer is a bytes.Buffer safe for the access log's writes and the
// test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestServeRunsProbe wires the probe as serve does: started after the
// listener, its first round comes within seconds on the wall clock, shows
// in /metrics and the access log (labelled), not in the user figures; a
// shutdown while a round's requests hang upstream cancels them and returns
// (goleak in TestMain checks nothing stays behind).
func TestServeRunsProbe(t *testing.T) {
	mock := mockllm.New(mockllm.Options{OutputTokens: 4})
	up := httptest.NewServer(mock)
	defer up.Close()
	cfg := config.DemoConfig(up.URL)
	cfg.Probe.Enabled, cfg.Probe.IntervalSeconds, cfg.Probe.Requests, cfg.Probe.Concurrency = true, 3, 3, 1
	cfg.Probe.TimeoutSeconds = 1 // a round of 3 × 1 s fits its 3 s
	cfg.Probe.Targets = []config.ProbeTarget{{Upstream: "mock", Model: "probe-model"}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var access syncBuffer
	gw, err := startGateway(&cfg, ln, slog.New(slog.DiscardHandler), slog.New(slog.NewJSONHandler(&access, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = gw.shutdown(0, 5*time.Second)
		}
	}()
	gw.startProbe()

	// The first round: 3 requests, within 1 to 5 s.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := mock.WaitStats(ctx, func(s mockllm.Stats) bool { return s.Completed >= 3 }); err != nil {
		t.Fatalf("no probe round within 20 s: %v", err)
	}
	var okSeries string
	for okSeries == "" && ctx.Err() == nil {
		for l := range strings.Lines(scrape(t, "http://"+gw.addr+"/metrics")) {
			if strings.HasPrefix(l, `tollgate_probe_requests_total{model="probe-model",result="ok",upstream="mock"} 3`) {
				okSeries = l
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if okSeries == "" {
		t.Fatal("/metrics never showed the round's 3 ok probe requests")
	}
	metricsText := scrape(t, "http://"+gw.addr+"/metrics")
	if strings.Contains(metricsText, "tollgate_requests_total{") {
		t.Errorf("probe requests counted in tollgate_requests_total:\n%s", grepLines(metricsText, "tollgate_requests_total"))
	}
	probes := 0
	for l := range strings.Lines(access.String()) {
		var e map[string]any
		if json.Unmarshal([]byte(l), &e) == nil && e["probe"] == true && e["model"] == "probe-model" {
			probes++
		}
	}
	if probes < 3 {
		t.Errorf("%d access-log lines marked probe, want at least 3:\n%s", probes, access.String())
	}

	// The next rounds hang upstream; shutdown cancels them.
	if err := mock.Inject("hang=0", 100); err != nil {
		t.Fatal(err)
	}
	if _, err := mock.WaitStats(ctx, func(s mockllm.Stats) bool { return s.Injected >= 1 }); err != nil {
		t.Fatalf("no later round reached the upstream: %v", err)
	}
	stopped = true
	if err := gw.shutdown(0, 5*time.Second); err != nil {
		t.Errorf("shutdown: %v", err)
	}
	if err := mock.WaitCanceled(ctx, 1); err != nil {
		t.Errorf("the hanging probe request was not cancelled: %v", err)
	}
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func grepLines(s, substr string) string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if strings.Contains(sc.Text(), substr) {
			out = append(out, sc.Text())
		}
	}
	return strings.Join(out, "\n")
}
