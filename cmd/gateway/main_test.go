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
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestUsageAndHelp(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(nil, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "Commands:") {
		t.Errorf("no args: exit %d, stderr %q", code, errOut.String())
	}
	for _, c := range commands() {
		errOut.Reset()
		if code := run([]string{c.name, "-h"}, &out, &errOut); code != 0 {
			t.Errorf("%s -h: exit %d", c.name, code)
		}
		if !strings.Contains(errOut.String(), "Usage: gateway "+c.name) || len(errOut.String()) < 80 {
			t.Errorf("%s -h says too little: %q", c.name, errOut.String())
		}
	}
	errOut.Reset()
	if code := run([]string{"nope"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), `unknown command "nope"`) {
		t.Errorf("unknown command: exit %d, %q", code, errOut.String())
	}
	if code := run([]string{"serve", "-bogus"}, &out, &errOut); code != 2 {
		t.Errorf("bad flag: exit %d", code)
	}
	out.Reset()
	if code := run([]string{"version"}, &out, &errOut); code != 0 || !strings.HasPrefix(out.String(), "tollgate ") {
		t.Errorf("version: exit %d, %q", code, out.String())
	}
}

func TestCheckConfig(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.toml")
	bad := filepath.Join(dir, "bad.toml")
	os.WriteFile(good, []byte("[[upstreams]]\nname = \"a\"\nbase_url = \"http://127.0.0.1:9000\"\n"), 0o600)
	os.WriteFile(bad, []byte("[[upstreams]]\nname = \"a\"\nbase_ur = \"http://x\"\n"), 0o600)
	var out, errOut bytes.Buffer
	if code := run([]string{"check-config", "-config", good}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "ok") {
		t.Errorf("good config: exit %d, %q %q", code, out.String(), errOut.String())
	}
	errOut.Reset()
	if code := run([]string{"check-config", "-config", bad}, &out, &errOut); code != 1 ||
		!strings.Contains(errOut.String(), "bad.toml:3") || !strings.Contains(errOut.String(), "base_ur") {
		t.Errorf("bad config: exit %d, %q", code, errOut.String())
	}
	// The shipped configs pass: the starter and the reference.
	for _, file := range []string{"../../gateway.toml", "../../docs/gateway.toml"} {
		errOut.Reset()
		if code := run([]string{"check-config", "-config", file}, &out, &errOut); code != 0 {
			t.Errorf("%s: exit %d, %q", file, code, errOut.String())
		}
	}
}

// TestFallbackNoCallerCanUse: the setup, passthrough (the
// default, every caller brings its key) with fallback b at another host
// than a: check-config says ok and warns that no caller can use b, naming
// the ways out, and the gateway logs the same warning at start.
func TestFallbackNoCallerCanUse(t *testing.T) {
	file := filepath.Join(t.TempDir(), "gateway.toml")
	doc := "[[upstreams]]\nname = \"a\"\nbase_url = \"http://127.0.0.1:9000\"\n" +
		"[[upstreams]]\nname = \"b\"\nbase_url = \"http://127.0.0.2:9000\"\n"
	if err := os.WriteFile(file, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"check-config", "-config", file}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if s := out.String(); !strings.Contains(s, "warning: upstreams[1]: \"b\" is only ever a fallback") ||
		!strings.Contains(s, "no caller can use it") || !strings.Contains(s, "caller_keys_on_fallback = true") {
		t.Errorf("check-config printed no warning about b:\n%s", s)
	}

	cfg, err := config.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var logBuf syncBuffer
	rg, err := startGateway(cfg, ln, slog.New(slog.NewTextHandler(&logBuf, nil)), slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := rg.shutdown(0, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if s := logBuf.String(); !strings.Contains(s, "level=WARN") || !strings.Contains(s, `\"b\" is only ever a fallback`) {
		t.Errorf("the start log has no warning about b:\n%s", s)
	}
}

// TestGracefulShutdown: an open stream finishes within the drain timeout;
// one that would outlast it is cancelled, and shutdown returns.
func TestGracefulShutdown(t *testing.T) {
	mock := httptest.NewServer(mockllm.New(mockllm.Options{ITL: 10 * time.Millisecond, OutputTokens: 30}))
	defer mock.Close()

	for _, tc := range []struct {
		name    string
		drain   time.Duration
		tokens  string
		wantAll bool
		outcome llm.Outcome
	}{
		{"stream finishes during drain", 5 * time.Second, "30", true, llm.OutcomeOK},
		{"stream cancelled at drain timeout", 200 * time.Millisecond, "100000", false, llm.OutcomeShutdown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.DemoConfig(mock.URL)
			cfg.Auth.RequireKey = false
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			recs := make(chan llm.Record, 4)
			gw, err := startGateway(&cfg, ln, slog.New(slog.DiscardHandler), nil, func(r *llm.Record) { recs <- *r })
			if err != nil {
				t.Fatal(err)
			}
			req, _ := http.NewRequest(http.MethodPost, "http://"+gw.addr+"/v1/chat/completions",
				strings.NewReader(`{"model":"m","stream":true}`))
			req.Header.Set("X-Mock-Output-Tokens", tc.tokens)
			client := &http.Client{Transport: &http.Transport{}}
			defer client.CloseIdleConnections()
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(resp.Body)
			if _, err := br.ReadString('\n'); err != nil { // the stream is open
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			var shutdownErr error
			wg.Add(1)
			go func() {
				defer wg.Done()
				shutdownErr = gw.shutdown(0, tc.drain)
			}()
			rest, _ := io.ReadAll(br)
			resp.Body.Close()
			wg.Wait()
			if shutdownErr != nil {
				t.Errorf("shutdown: %v", shutdownErr)
			}
			if done := strings.Contains(string(rest), "[DONE]"); done != tc.wantAll {
				t.Errorf("stream complete = %v, want %v", done, tc.wantAll)
			}
			select {
			case rec := <-recs:
				if rec.Outcome != tc.outcome {
					t.Errorf("outcome %s, want %s", rec.Outcome, tc.outcome)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("no record")
			}
			// No new connections after shutdown.
			if c, err := net.DialTimeout("tcp", gw.addr, time.Second); err == nil {
				c.Close()
				t.Error("the listener still accepts connections")
			}
		})
	}
}

// TestDemoShape: in every 32 requests of the burst, each team sends every
// API, streamed and not, in every prompt size, so every team has figures of
// every kind on the dashboard.
func TestDemoShape(t *testing.T) {
	type combo struct {
		chat, stream bool
		size         int
	}
	seen := map[string]map[combo]int{}
	for i := range 32 {
		key, chat, stream, size := demoShape(i)
		if seen[key] == nil {
			seen[key] = map[combo]int{}
		}
		seen[key][combo{chat, stream, size}]++
	}
	if len(seen) != len(demoKeys) {
		t.Fatalf("keys used: %d, want %d", len(seen), len(demoKeys))
	}
	for key, combos := range seen {
		if want := 2 * 2 * len(demoSizes); len(combos) != want {
			t.Errorf("%s sends %d of the %d API × stream × size combinations: %v", key, len(combos), want, combos)
		}
	}
}

func TestDemo(t *testing.T) {
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- run([]string{"demo", "-listen", "127.0.0.1:0", "-requests", "8", "-concurrency", "4",
			"-ttft", "20ms", "-itl", "2ms", "-tokens", "8", "-duration", "10ms"}, &out, &errOut)
	}()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("demo exit %d: %s", code, errOut.String())
		}
	case <-ctx.Done():
		t.Fatal("demo did not stop by itself")
	}
	s := out.String()
	// One upstream failure is injected (the 6th request); the gateway
	// retries it and no caller sees an error.
	for _, want := range []string{"TTFT", "TPOT", "ITL (per gap)", "E2E", "requests: 8 (ok=8)", "/metrics",
		"upstream failures injected into the fake upstream: 1;", "callers saw 0 errors", "tollgate_probe_*"} {
		if !strings.Contains(s, want) {
			t.Errorf("demo output lacks %q:\n%s", want, s)
		}
	}
}

// TestServeBinarySIGTERM runs the real binary: `gateway serve` with a config
// file, a stream in flight, then SIGTERM. The stream must finish, the access
// log must have its line, and the process must exit 0.
func TestServeBinarySIGTERM(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildGateway(t)
	mock := httptest.NewServer(mockllm.New(mockllm.Options{ITL: 20 * time.Millisecond, OutputTokens: 25}))
	defer mock.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cfgPath := filepath.Join(t.TempDir(), "gateway.toml")
	cfg := "[server]\nlisten = \"" + addr + "\"\ndrain_timeout_seconds = 10\n\n[[upstreams]]\nname = \"mock\"\nbase_url = \"" + mock.URL + "\"\n"
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, "serve", "-config", cfgPath)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// The default [spend] state_file is relative to the working directory.
	workDir := t.TempDir()
	cmd.Dir = workDir
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()

	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	var resp *http.Response
	for deadline := time.Now().Add(10 * time.Second); ; {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions",
			strings.NewReader(`{"model":"m","stream":true}`))
		req.Header.Set("Authorization", "Bearer sk-signal-test")
		if resp, err = client.Do(req); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway never answered: %v\n%s", err, stderr.String())
		}
		time.Sleep(20 * time.Millisecond) // waiting for the process to listen, not timing anything
	}
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(br)
	resp.Body.Close()
	if err != nil || !strings.Contains(string(rest), "data: [DONE]") {
		t.Fatalf("stream did not finish during the drain (err %v): %q", err, rest)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("gateway exit: %v\n%s", err, stderr.String())
	}
	log := stdout.String()
	if !strings.Contains(log, `"outcome":"ok"`) || !strings.Contains(log, `"output_tokens":25`) {
		t.Errorf("access log: %s", log)
	}
	if strings.Contains(log+stderr.String(), "sk-signal-test") {
		t.Error("the caller's key reached a log")
	}
	if !strings.Contains(stderr.String(), "stopped") {
		t.Errorf("no clean stop in the log: %s", stderr.String())
	}
	// The spend of the stream was written to the state file at shutdown.
	state, err := os.ReadFile(filepath.Join(workDir, "tollgate-spend.json"))
	if err != nil {
		t.Fatalf("no state file after shutdown: %v", err)
	}
	var saved struct {
		Rows []struct {
			KeyID    string `json:"key_id"`
			Requests int64  `json:"requests"`
			Output   int64  `json:"output"`
		} `json:"rows"`
	}
	if err := json.Unmarshal(state, &saved); err != nil || len(saved.Rows) != 1 || saved.Rows[0].Output != 25 ||
		saved.Rows[0].Requests != 1 || strings.Contains(string(state), "sk-signal-test") {
		t.Errorf("state file: %s", state)
	}
}

// TestShutdownDelayKeepsServing: during the shutdown delay /readyz answers
// 503 while requests are still served; after it the listener closes.
func TestShutdownDelayKeepsServing(t *testing.T) {
	mock := httptest.NewServer(mockllm.New(mockllm.Options{OutputTokens: 3}))
	defer mock.Close()
	cfg := config.DemoConfig(mock.URL)
	cfg.Auth.RequireKey = false
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gw, err := startGateway(&cfg, ln, slog.New(slog.DiscardHandler), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- gw.shutdown(2*time.Second, time.Second) }()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	base := "http://" + gw.addr
	for i := 0; ; i++ { // wait until shutdown has begun (Drain is its first step)
		if i == 10000 {
			t.Fatal("/readyz never answered 503")
		}
		resp, err := client.Get(base + "/readyz")
		if err != nil {
			t.Fatalf("/readyz during the delay: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable {
			break
		}
	}
	resp, err := client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m"}`))
	if err != nil {
		t.Fatalf("request during the shutdown delay: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "tok3") {
		t.Fatalf("request during the shutdown delay: %d %s", resp.StatusCode, body)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if c, err := net.DialTimeout("tcp", gw.addr, time.Second); err == nil {
		c.Close()
		t.Error("the listener still accepts connections after the delay")
	}
}

// TestServeBoundsHeaders: a header block far past max_header_bytes is cut
// by the listener itself (431) before the handler reads it, and one just past
// the limit gets the handler's 431 in the caller's dialect; neither reaches
// the upstream.
func TestServeBoundsHeaders(t *testing.T) {
	var upstreamHits atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upstreamHits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"object":"list","data":[]}`)
	}))
	t.Cleanup(up.Close)
	cfg := config.DemoConfig(up.URL)
	cfg.Server.MaxHeaderBytes = 8 << 10
	r := startReplica(t, cfg)
	for _, c := range []struct {
		size      int
		inDialect bool
	}{{12 << 10, true}, {64 << 10, false}} {
		req, err := http.NewRequest(http.MethodGet, r.url+"/v1/models", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Big", strings.Repeat("b", c.size))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge ||
			c.inDialect != strings.Contains(string(body), `"code":"headers_too_large"`) {
			t.Errorf("%d header bytes: %d %q, want 431 (in dialect: %v)", c.size, resp.StatusCode, body, c.inDialect)
		}
	}
	if n := upstreamHits.Load(); n != 0 {
		t.Errorf("the upstream got %d requests, want none", n)
	}
}
