package deploy_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
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

	"github.com/pelletier/go-toml/v2"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/mockllm"
)

// replica is one `gateway serve` process of the rolling-restart test.
type replica struct {
	name, addr string
	cmd        *exec.Cmd
	out        bytes.Buffer
	exited     chan struct{}
	err        error // the process's exit, once exited is closed
	// ready is what the balancer believes of /readyz, as an endpoints
	// controller would from the readiness probe.
	ready atomic.Bool
	// streams counts the streams the balancer sent here, in each phase.
	streams [2]atomic.Int64
}

// startReplica runs bin serve with the config doc from its own working
// directory and waits until /readyz answers 200. When the test ends a
// process still running gets SIGTERM, then SIGKILL after grace.
func startReplica(t *testing.T, name, bin, doc, addr string, grace time.Duration) *replica {
	t.Helper()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "gateway.toml")
	if err := os.WriteFile(cfgPath, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	r := &replica{name: name, addr: addr, exited: make(chan struct{})}
	r.cmd = exec.Command(bin, "serve", "-config", cfgPath)
	r.cmd.Dir = dir
	r.cmd.Stdout, r.cmd.Stderr = &r.out, &r.out
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.err = r.cmd.Wait(); close(r.exited) }()
	t.Cleanup(func() {
		_ = r.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-r.exited:
		case <-time.After(grace):
			_ = r.cmd.Process.Kill()
			<-r.exited
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, r.out.String())
		}
	})
	deadline := time.Now().Add(gatewayWait)
	for {
		select {
		case <-r.exited:
			t.Fatalf("%s exited: %v", name, r.err)
		default:
		}
		if resp, err := http.Get("http://" + addr + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				r.ready.Store(true)
				return r
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready after %v", name, gatewayWait)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// balancer sends each stream to the next replica it believes ready, round
// robin, as a Service's endpoints do. A poller per replica reads /readyz
// every period and takes the replica out after failureThreshold failures
// in a row, as the kubelet's readiness probe does.
type balancer struct {
	replicas []*replica
	next     atomic.Uint64
}

func (b *balancer) pick() *replica {
	for range len(b.replicas) {
		r := b.replicas[b.next.Add(1)%uint64(len(b.replicas))]
		if r.ready.Load() {
			return r
		}
	}
	return nil
}

func (b *balancer) poll(ctx context.Context, r *replica, period time.Duration, failureThreshold int) {
	client := &http.Client{Timeout: period}
	fails := 0
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		resp, err := client.Get("http://" + r.addr + "/readyz")
		ok := err == nil && resp.StatusCode == http.StatusOK
		if err == nil {
			resp.Body.Close()
		}
		if ok {
			fails = 0
			r.ready.Store(true)
		} else if fails++; fails >= failureThreshold {
			r.ready.Store(false)
		}
	}
}

// streamResult is how one stream ended, as its client saw it.
type streamResult struct {
	replica string
	phase   int
	status  int
	chunks  int  // content events
	done    bool // data: [DONE] seen
	err     error
}

// runStream sends one streamed chat completion to r and reads it to the
// end, calling firstChunk once its first content event arrives.
func runStream(ctx context.Context, client *http.Client, r *replica, phase int, firstChunk func()) streamResult {
	res := streamResult{replica: r.name, phase: phase}
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+r.addr+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		res.err = err
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		res.err = err
		return res
	}
	defer resp.Body.Close()
	res.status = resp.StatusCode
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "data: [DONE]":
			res.done = true
		case strings.HasPrefix(line, "data: ") && strings.Contains(line, `"content":"`) && !strings.Contains(line, `"content":""`):
			if res.chunks++; res.chunks == 1 && firstChunk != nil {
				firstChunk()
			}
		}
	}
	res.err = sc.Err()
	return res
}

// TestRollingRestartLosesNoStream plays one step of a rolling update with
// the chart's timings: two gateway processes behind a round-robin balancer
// that follows /readyz, 100 streams open on them, then SIGTERM to one while
// 100 more start, paced. The stopped replica must keep accepting through
// its shutdown delay (the balancer sends it the first stream after SIGTERM,
// and more until its readiness fails), finish every stream it holds within
// its drain (each outlasts the delay), and exit cleanly; every one of the
// 200 streams must arrive whole. Only counts are asserted, none of the
// times.
func TestRollingRestartLosesNoStream(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two gateways and 200 streams")
	}
	helmBin := needHelm(t)
	objs := decodeManifests(t, renderChart(t, helmBin, ""))
	d := get[*appsv1.Deployment](t, objs, "Deployment "+chartFullname)
	rendered := get[*corev1.ConfigMap](t, objs, "ConfigMap "+chartFullname).Data["gateway.toml"]
	chartCfg, err := config.Parse([]byte(rendered), "gateway.toml", func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	delay, drain := chartCfg.Server.ShutdownDelaySeconds, chartCfg.Server.DrainTimeoutSeconds
	grace := time.Duration(*d.Spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second
	probe := d.Spec.Template.Spec.Containers[0].ReadinessProbe
	if delay <= 0 {
		t.Fatalf("the chart's shutdown_delay_seconds is %v: a replica would close at once, and streams sent before the balancer notices would be refused", delay)
	}

	// Streams of 100 tokens lasting 3 s longer than the shutdown delay, so
	// that A still holds streams when it closes its listener and drains
	// (8 s with the chart's 5 s delay, inside its 30 s drain).
	const tokens = 100
	itl := (time.Duration(delay*float64(time.Second)) + 3*time.Second) / tokens
	up := httptest.NewServer(mockllm.New(mockllm.Options{TTFT: 100 * time.Millisecond, ITL: itl,
		OutputTokens: tokens, Seed: 1}))
	t.Cleanup(up.Close)

	// Each replica serves the chart's rendered config with its own port
	// and the fake upstream, keyless; every other setting, the timings
	// among them, is the chart's.
	bin := gatewayBinary(t)
	replicaConfig := func(addr string) string {
		var m map[string]any
		if err := toml.Unmarshal([]byte(rendered), &m); err != nil {
			t.Fatal(err)
		}
		m["server"].(map[string]any)["listen"] = addr
		m["auth"] = map[string]any{"mode": "passthrough", "require_key": false}
		m["upstreams"] = []map[string]any{{"name": "mock", "base_url": up.URL}}
		m["log"] = map[string]any{"level": "info", "access_log": false}
		b, err := toml.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	addrA, addrB := freeAddr(t), freeAddr(t)
	a := startReplica(t, "replica A", bin, replicaConfig(addrA), addrA, grace)
	b := startReplica(t, "replica B", bin, replicaConfig(addrB), addrB, grace)
	lb := &balancer{replicas: []*replica{a, b}}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pollCtx, stopPolling := context.WithCancel(ctx)
	var polling sync.WaitGroup
	for _, r := range lb.replicas {
		// A quarter of a second between reads, the probe's failure
		// threshold: the balancer takes a stopping replica out well
		// inside its shutdown delay, as a Service does at once.
		polling.Go(func() { lb.poll(pollCtx, r, 250*time.Millisecond, int(probe.FailureThreshold)) })
	}
	defer polling.Wait()
	defer stopPolling()

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	defer client.CloseIdleConnections()
	const perPhase = 100
	results := make(chan streamResult, 2*perPhase)
	var streams sync.WaitGroup
	start := func(phase int, started *sync.WaitGroup, to *replica) bool {
		r := to
		if r == nil {
			r = lb.pick()
		}
		if r == nil {
			results <- streamResult{phase: phase, err: fmt.Errorf("no replica ready")}
			return false
		}
		r.streams[phase].Add(1)
		var once sync.Once
		streams.Go(func() {
			res := runStream(ctx, client, r, phase, func() {
				if started != nil {
					once.Do(started.Done)
				}
			})
			if started != nil {
				once.Do(started.Done) // ended without a chunk: counted lost below
			}
			results <- res
		})
		return true
	}

	// Phase 0: 100 streams open on both replicas, each past its first
	// token, before A is told to stop.
	var firstTokens sync.WaitGroup
	for range perPhase {
		firstTokens.Add(1)
		if !start(0, &firstTokens, nil) {
			firstTokens.Done()
		}
	}
	firstTokens.Wait()
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Phase 1: 100 more, 10 ms apart, while A drains. The first goes to A,
	// as from a balancer that has not yet noticed; the next ones too until
	// the poller sees A's /readyz fail.
	for i := range perPhase {
		var to *replica
		if i == 0 {
			to = a
		}
		start(1, nil, to)
		time.Sleep(10 * time.Millisecond)
	}
	streams.Wait()
	close(results)

	var lost, total int
	for res := range results {
		total++
		if res.err != nil || res.status != http.StatusOK || res.chunks != tokens || !res.done {
			lost++
			if lost <= 5 {
				t.Errorf("phase %d stream on %s: status %d, %d of %d chunks, [DONE] %v, error %v",
					res.phase, res.replica, res.status, res.chunks, tokens, res.done, res.err)
			}
		}
	}
	select {
	case <-a.exited:
	case <-time.After(grace):
		t.Fatalf("replica A still running %v after SIGTERM, its termination grace", grace)
	}
	t.Logf("chart timings: shutdown_delay_seconds %v, drain_timeout_seconds %v, terminationGracePeriodSeconds %v", delay, drain, grace.Seconds())
	t.Logf("streams on A: %d open at SIGTERM, %d sent after it; on B: %d and %d; lost %d of %d",
		a.streams[0].Load(), a.streams[1].Load(), b.streams[0].Load(), b.streams[1].Load(), lost, total)
	if total != 2*perPhase || lost != 0 {
		t.Errorf("%d of %d streams lost", lost, total)
	}
	if a.streams[0].Load() == 0 {
		t.Error("no stream was open on A when it was stopped: the test proves nothing")
	}
	if a.err != nil {
		t.Errorf("replica A exited with %v", a.err)
	}
	if out := a.out.String(); strings.Contains(out, "drain timeout reached") {
		t.Error("replica A cancelled streams at its drain timeout")
	}
	if !b.ready.Load() {
		t.Error("replica B is no longer ready")
	}
}
