package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/internal/procstat"
	"github.com/tollgate-llm/tollgate/mockllm"
)

// heldStreams is how many streams TestGatewayHoldsTenThousandStreams holds
// open at once.
const heldStreams = 10000

// barrierUpstream is mockllm behind a barrier: every request waits until
// n are in flight at once (or the test gives up), then is answered, and
// the bytes written for it are kept under its X-Test-Stream header.
type barrierUpstream struct {
	h        http.Handler
	n        int64
	inFlight atomic.Int64
	peak     atomic.Int64
	notH2    atomic.Int64
	all      chan struct{} // closed when n were in flight at once
	once     sync.Once
	giveUp   <-chan struct{}
	mu       sync.Mutex
	wrote    map[string]*bytes.Buffer
}

type keptWriter struct {
	http.ResponseWriter
	buf *bytes.Buffer
}

func (w keptWriter) Write(p []byte) (int, error) { w.buf.Write(p); return w.ResponseWriter.Write(p) }
func (w keptWriter) Flush()                      { w.ResponseWriter.(http.Flusher).Flush() }

func (u *barrierUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor != 2 {
		u.notH2.Add(1)
	}
	now := u.inFlight.Add(1)
	defer u.inFlight.Add(-1)
	for p := u.peak.Load(); now > p && !u.peak.CompareAndSwap(p, now); p = u.peak.Load() {
	}
	if now >= u.n {
		u.once.Do(func() { close(u.all) })
	}
	select {
	case <-u.all:
	case <-u.giveUp:
		http.Error(w, "the test gave up waiting for every stream", http.StatusServiceUnavailable)
		return
	}
	buf := &bytes.Buffer{}
	u.mu.Lock()
	u.wrote[r.Header.Get("X-Test-Stream")] = buf
	u.mu.Unlock()
	u.h.ServeHTTP(keptWriter{w, buf}, r)
}

// TestGatewayHoldsTenThousandStreams: the gateway binary, as its own
// process, holds 10,000 streams open at once to an h2c upstream, and each
// reaches its caller byte for byte as the upstream wrote it. The upstream
// answers none until all 10,000 are in flight at once, so the peak is
// proven there. Through HTTP/2 the gateway's streams share a few upstream
// connections, so it needs about one descriptor per stream; the test
// raises its open-file limit (the gateway inherits it) and needs 10,000
// plus room for its own clients' sockets.
func TestGatewayHoldsTenThousandStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and opens 10,000 connections")
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Max < heldStreams+500 {
		t.Skipf("the open-file hard limit is %d; %d streams need %d", lim.Max, heldStreams, heldStreams+500)
	}
	old := lim.Cur
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	defer func() { lim.Cur = old; _ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim) }()

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	up := &barrierUpstream{h: mockllm.New(mockllm.Options{OutputTokens: 8, ITL: time.Millisecond}),
		n: heldStreams, all: make(chan struct{}), giveUp: ctx.Done(), wrote: map[string]*bytes.Buffer{}}
	srv := httptest.NewUnstartedServer(up)
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	srv.Config.Protocols = &protocols
	srv.Config.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: 1000}
	srv.Start()
	defer srv.Close()

	bin := buildGateway(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	dir := t.TempDir()
	cfg := fmt.Sprintf(`[server]
listen = %q
[log]
access_log = false
[[upstreams]]
name = "mock"
base_url = %q
h2c = true
timeout_seconds = 600
header_timeout_seconds = 300
`, addr, srv.URL)
	if err := os.WriteFile(filepath.Join(dir, "gateway.toml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	gw := exec.Command(bin, "serve", "-config", "gateway.toml")
	gw.Dir, gw.Stderr = dir, &stderr
	if err := gw.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = gw.Process.Kill(); _ = gw.Wait() }()
	for deadline := time.Now().Add(10 * time.Second); ; {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway never answered: %v\n%s", err, stderr.String())
		}
		time.Sleep(20 * time.Millisecond) // waiting for the process to listen
	}
	rssIdle := procstat.StatusKiB(gw.Process.Pid, "VmRSS")

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: heldStreams, DisableCompression: true}}
	defer client.CloseIdleConnections()
	got := make([][]byte, heldStreams)
	errs := make([]error, heldStreams)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range heldStreams {
		wg.Go(func() {
			body := `{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hold"}]}`
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
			if err != nil {
				errs[i] = err
				return
			}
			req.Header.Set("X-Test-Stream", strconv.Itoa(i))
			req.Header.Set("Authorization", "Bearer sk-held-"+strconv.Itoa(i%7))
			resp, err := client.Do(req)
			if err != nil {
				errs[i] = err
				return
			}
			defer resp.Body.Close()
			got[i], errs[i] = io.ReadAll(resp.Body)
			if errs[i] == nil && resp.StatusCode != http.StatusOK {
				errs[i] = fmt.Errorf("status %d: %.200s", resp.StatusCode, got[i])
			}
		})
	}
	clientsDone := make(chan struct{})
	go func() { wg.Wait(); close(clientsDone) }()
	var rssHeld, fds int64
	held := false
	select {
	case <-up.all:
		held = true
		rssHeld = procstat.StatusKiB(gw.Process.Pid, "VmRSS")
		if ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", gw.Process.Pid)); err == nil {
			fds = int64(len(ents))
		}
	case <-clientsDone: // every stream ended before all were open: they failed
	case <-ctx.Done():
	}
	opened := time.Since(start)
	cancelIfStuck := time.AfterFunc(time.Minute, cancel) // the streams end within ms once released
	<-clientsDone
	cancelIfStuck.Stop()

	failed := 0
	for i, err := range errs {
		if err != nil {
			if failed++; failed <= 3 {
				t.Errorf("stream %d: %v", i, err)
			}
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d streams failed\ngateway stderr (last 2 KiB): %s", failed, heldStreams, tail(stderr.String(), 2048))
	}
	if p := up.peak.Load(); p != heldStreams {
		t.Errorf("the upstream saw at most %d streams in flight at once, want %d", p, heldStreams)
	}
	if n := up.notH2.Load(); n != 0 {
		t.Errorf("%d requests reached the upstream without HTTP/2", n)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	inexact := 0
	for i := range heldStreams {
		w := up.wrote[strconv.Itoa(i)]
		if errs[i] == nil && (w == nil || w.Len() == 0 || !bytes.Equal(got[i], w.Bytes())) {
			if inexact++; inexact <= 3 {
				t.Errorf("stream %d: the caller got %d bytes, not what the upstream wrote", i, len(got[i]))
			}
		}
	}
	if inexact > 0 {
		t.Errorf("%d of %d streams were not byte-exact", inexact, heldStreams)
	}
	if !held {
		return
	}
	t.Logf("%d streams open at once after %s; gateway: %d open files, RSS %d MiB idle, %d MiB with all open (%.1f KiB per stream), peak %d MiB",
		heldStreams, opened.Round(time.Millisecond), fds, rssIdle>>10, rssHeld>>10,
		float64(rssHeld-rssIdle)/heldStreams, procstat.StatusKiB(gw.Process.Pid, "VmHWM")>>10)
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
