package probe

import (
	"bytes"
	"context"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/metrics"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/proxy"
)

// TestMain fails the package if a test leaves a goroutine behind: Run must
// end every round's requests before it returns.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The gateway is the Prober cmd/gateway wires in.
var _ Prober = (*proxy.Gateway)(nil)

// waitTimeout bounds every wait in these tests; it is a deadlock guard, not
// a timing assertion.
const waitTimeout = 20 * time.Second

// fakeClock is a Clock the test moves by hand. After registers a waiter
// that Advance fires once its time has come.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []waiter
	changed chan struct{} // closed and replaced when a waiter is added
}

type waiter struct {
	at time.Time
	ch chan time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), changed: make(chan struct{})}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.waiters = append(c.waiters, waiter{at: c.now.Add(d), ch: ch})
	close(c.changed)
	c.changed = make(chan struct{})
	return ch
}

// Advance moves the clock by d and fires the waiters whose time has come.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if w.at.After(c.now) {
			kept = append(kept, w)
			continue
		}
		w.ch <- c.now
	}
	c.waiters = kept
}

// pending returns how many waiters have not fired yet.
func (c *fakeClock) pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiters)
}

// waitPending blocks until n waiters are pending: the scheduler's targets
// are all between rounds.
func (c *fakeClock) waitPending(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(waitTimeout)
	for {
		c.mu.Lock()
		got, ch := len(c.waiters), c.changed
		c.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("%d of %d targets waiting for their next round after %v", got, n, waitTimeout)
		}
	}
}

// world is a gateway in front of a mockllm, with the probe's metrics on a
// real registry and a scheduler on a fake clock.
type world struct {
	mock  *mockllm.Server
	reg   *prometheus.Registry
	gw    *proxy.Gateway
	cfg   config.Config
	clock *fakeClock
	sched *Scheduler
}

// newWorld builds a world; edit may change the [probe] table, whose default
// here is one target (mock, model m), 6 requests, 2 at a time, each given
// 10 s, every minute.
func newWorld(t *testing.T, mo mockllm.Options, edit func(*config.Config)) *world {
	t.Helper()
	return newWorldWith(t, mo, edit, true)
}

// newWorldWith builds a world, its configuration validated or not.
func newWorldWith(t *testing.T, mo mockllm.Options, edit func(*config.Config), validate bool) *world {
	t.Helper()
	w := &world{mock: mockllm.New(mo), reg: prometheus.NewRegistry(), clock: newFakeClock()}
	up := httptest.NewServer(w.mock)
	t.Cleanup(up.Close)
	w.cfg = config.DemoConfig(up.URL)
	w.cfg.Metrics.NativeHistograms = false
	w.cfg.Probe.Enabled = true
	w.cfg.Probe.IntervalSeconds = 60
	w.cfg.Probe.Requests = 6
	w.cfg.Probe.Concurrency = 2
	w.cfg.Probe.TimeoutSeconds = 10 // rounds of up to 5 waves fit the interval
	w.cfg.Probe.Targets = []config.ProbeTarget{{Upstream: "mock", Model: "m"}}
	if edit != nil {
		edit(&w.cfg)
	}
	if validate {
		if err := w.cfg.Validate(); err != nil {
			t.Fatal(err)
		}
	}
	m, err := metrics.New(w.reg, &w.cfg)
	if err != nil {
		t.Fatal(err)
	}
	transport := &http.Transport{}
	t.Cleanup(transport.CloseIdleConnections)
	w.gw, err = proxy.New(proxy.Options{Config: &w.cfg, Metrics: m, Logger: slog.New(slog.DiscardHandler),
		Transport: transport})
	if err != nil {
		t.Fatal(err)
	}
	// Every first round comes 3 s after Run.
	w.sched, err = New(&w.cfg, w.gw, m, Options{Logger: slog.New(slog.DiscardHandler), Clock: w.clock,
		Rand: func() float64 { return 0.5 }})
	if err != nil || w.sched == nil {
		t.Fatalf("New: %v %v", w.sched, err)
	}
	return w
}

// run starts the scheduler and returns a function that stops it and waits
// for Run to return.
func (w *world) run(t *testing.T) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		w.sched.Run(ctx)
		close(done)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(waitTimeout):
				t.Fatal("Run did not return after its context was cancelled")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// series returns the probe family name's series of model m, by their
// result label (or "" when they have none).
func (w *world) series(t *testing.T, name, model string) map[string]*dto.Metric {
	t.Helper()
	mfs, err := w.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.Metric{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["model"] == model {
				out[labels["result"]] = m
			}
		}
	}
	return out
}

func (w *world) results(t *testing.T, model string) map[string]float64 {
	out := map[string]float64{}
	for r, m := range w.series(t, "tollgate_probe_requests_total", model) {
		if v := m.GetCounter().GetValue(); v > 0 {
			out[r] = v
		}
	}
	return out
}

func (w *world) gauge(t *testing.T, name, model string) float64 {
	return w.series(t, name, model)[""].GetGauge().GetValue()
}

func (w *world) histogram(t *testing.T, name, model string) *dto.Histogram {
	return w.series(t, name, model)[""].GetHistogram()
}

// TestRoundAgainstHealthyUpstream: one round of n requests against a
// healthy upstream gives n ok results, n TTFT, TPOT and E2E observations no
// faster than the upstream's TTFT, a success ratio of 1 stamped with the
// clock's time, and never more than the configured concurrency in flight.
func TestRoundAgainstHealthyUpstream(t *testing.T) {
	const ttft = 60 * time.Millisecond
	w := newWorld(t, mockllm.Options{TTFT: ttft, ITL: time.Millisecond, OutputTokens: 4}, nil)
	if r := w.gauge(t, "tollgate_probe_success_ratio", "m"); !math.IsNaN(r) {
		t.Errorf("success ratio %v before the first round, want NaN", r)
	}
	w.run(t)
	w.clock.waitPending(t, 1)
	w.clock.Advance(3 * time.Second)
	w.clock.waitPending(t, 1) // the round is over: waiting for the next
	roundAt := w.clock.Now()

	if got := w.results(t, "m"); len(got) != 1 || got["ok"] != 6 {
		t.Errorf("results %v, want 6 ok", got)
	}
	for _, name := range []string{"tollgate_probe_ttft_seconds", "tollgate_probe_tpot_seconds", "tollgate_probe_e2e_seconds"} {
		h := w.histogram(t, name, "m")
		if h.GetSampleCount() != 6 {
			t.Errorf("%s: %d observations, want 6", name, h.GetSampleCount())
		}
		if name == "tollgate_probe_tpot_seconds" {
			continue
		}
		// Each is at least the upstream's TTFT: none in the buckets up to
		// 50 ms.
		for _, b := range h.GetBucket() {
			if b.GetUpperBound() <= 0.05 && b.GetCumulativeCount() != 0 {
				t.Errorf("%s: %d observations ≤ %v s, under the upstream's TTFT of %v", name,
					b.GetCumulativeCount(), b.GetUpperBound(), ttft)
			}
		}
	}
	if r := w.gauge(t, "tollgate_probe_success_ratio", "m"); r != 1 {
		t.Errorf("success ratio %v, want 1", r)
	}
	if ts := w.gauge(t, "tollgate_probe_last_round_timestamp_seconds", "m"); ts != float64(roundAt.Unix()) {
		t.Errorf("last round at %v, want %v", ts, roundAt.Unix())
	}
	st := w.mock.Stats()
	if st.Requests != 6 || st.PeakInFlight > 2 {
		t.Errorf("upstream saw %d requests, at most %d at once; want 6, at most 2", st.Requests, st.PeakInFlight)
	}
}

// TestRoundWithFaults: k injected failures among n requests give exactly k
// failures with the attempt's result, no retry, and a success ratio of
// (n−k)/n; only successes reach the latency histograms.
func TestRoundWithFaults(t *testing.T) {
	w := newWorld(t, mockllm.Options{OutputTokens: 4}, func(c *config.Config) { c.Probe.Requests = 10 })
	if err := w.mock.Inject("status=529", 3); err != nil {
		t.Fatal(err)
	}
	w.run(t)
	w.clock.waitPending(t, 1)
	w.clock.Advance(3 * time.Second)
	w.clock.waitPending(t, 1)

	if got := w.results(t, "m"); len(got) != 2 || got["ok"] != 7 || got["overloaded"] != 3 {
		t.Errorf("results %v, want 7 ok and 3 overloaded", got)
	}
	if n := w.mock.Stats().Requests; n != 10 {
		t.Errorf("upstream saw %d requests, want 10 (no retry)", n)
	}
	if r := w.gauge(t, "tollgate_probe_success_ratio", "m"); r != 0.7 {
		t.Errorf("success ratio %v, want 0.7", r)
	}
	if c := w.histogram(t, "tollgate_probe_e2e_seconds", "m").GetSampleCount(); c != 7 {
		t.Errorf("E2E observations %d, want 7 (successes only)", c)
	}
}

// TestSchedule follows two targets on the fake clock: nothing before the
// first round's moment, one round each at it, nothing until one interval
// after, then one more round each.
func TestSchedule(t *testing.T) {
	w := newWorld(t, mockllm.Options{OutputTokens: 2}, func(c *config.Config) {
		c.Probe.Requests = 3
		c.Probe.Targets = append(c.Probe.Targets, config.ProbeTarget{Upstream: "mock", Model: "m2", Dialect: "anthropic"})
	})
	requests := func() int64 { return w.mock.Stats().Requests }
	w.run(t)
	w.clock.waitPending(t, 2)
	w.clock.Advance(3*time.Second - time.Millisecond)
	if p, n := w.clock.pending(), requests(); p != 2 || n != 0 {
		t.Fatalf("before the first round: %d targets waiting, %d requests; want 2, 0", p, n)
	}
	w.clock.Advance(time.Millisecond)
	w.clock.waitPending(t, 2)
	if n := requests(); n != 6 {
		t.Fatalf("after the first rounds: %d requests, want 6", n)
	}
	first := w.clock.Now()
	for _, m := range []string{"m", "m2"} {
		if ts := w.gauge(t, "tollgate_probe_last_round_timestamp_seconds", m); ts != float64(first.Unix()) {
			t.Errorf("%s: last round at %v, want %v", m, ts, first.Unix())
		}
	}

	w.clock.Advance(time.Minute - time.Millisecond)
	if p, n := w.clock.pending(), requests(); p != 2 || n != 6 {
		t.Fatalf("just before the interval: %d targets waiting, %d requests; want 2, 6", p, n)
	}
	w.clock.Advance(time.Millisecond)
	w.clock.waitPending(t, 2)
	if n := requests(); n != 12 {
		t.Errorf("after the second rounds: %d requests, want 12", n)
	}
	for _, m := range []string{"m", "m2"} {
		if got := w.results(t, m); got["ok"] != 6 {
			t.Errorf("%s: results %v, want 6 ok", m, got)
		}
		if ts := w.gauge(t, "tollgate_probe_last_round_timestamp_seconds", m); ts != float64(first.Add(time.Minute).Unix()) {
			t.Errorf("%s: last round at %v, want one interval after the first", m, ts)
		}
	}
	// Each target in its own dialect.
	seen := map[string]int{}
	for _, r := range w.mock.Requests() {
		seen[r.Path]++
	}
	if seen["/v1/chat/completions"] != 6 || seen["/v1/messages"] != 6 {
		t.Errorf("requests by path %v, want 6 each", seen)
	}
}

// TestCancelStopsRun cancels Run while a round's requests hang upstream:
// Run returns, the requests are cancelled upstream, nothing is counted for
// them and the round leaves no success ratio (goleak in TestMain checks
// that no goroutine stays behind).
func TestCancelStopsRun(t *testing.T) {
	w := newWorld(t, mockllm.Options{OutputTokens: 2}, nil)
	if err := w.mock.Inject("hang=0", 6); err != nil {
		t.Fatal(err)
	}
	stop := w.run(t)
	w.clock.waitPending(t, 1)
	w.clock.Advance(3 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := w.mock.WaitStats(ctx, func(s mockllm.Stats) bool { return s.Requests >= 2 }); err != nil {
		t.Fatalf("the round's requests did not reach the upstream: %v", err)
	}
	stop()
	if err := w.mock.WaitCanceled(ctx, 2); err != nil {
		t.Errorf("the upstream did not see the probe requests cancelled: %v", err)
	}
	if n := w.mock.Stats().Requests; n != 2 {
		t.Errorf("upstream saw %d requests, want the 2 in flight only", n)
	}
	if got := w.results(t, "m"); len(got) != 0 {
		t.Errorf("results %v counted for cancelled requests", got)
	}
	if r := w.gauge(t, "tollgate_probe_success_ratio", "m"); !math.IsNaN(r) {
		t.Errorf("success ratio %v after a cut round, want still NaN", r)
	}
}

// TestNew: a disabled probe gives no Scheduler; an enabled one needs its
// parts.
func TestNew(t *testing.T) {
	cfg := config.DemoConfig("http://127.0.0.1:1")
	if s, err := New(&cfg, nil, nil, Options{}); s != nil || err != nil {
		t.Errorf("disabled: %v %v, want nil nil", s, err)
	}
	cfg.Probe.Enabled = true
	cfg.Probe.Targets = []config.ProbeTarget{{Upstream: "mock", Model: "m"}}
	if _, err := New(&cfg, nil, nil, Options{}); err == nil {
		t.Error("enabled without a Prober or Metrics: no error")
	}
}

// TestNewWarnsKeylessUpstream: a probed upstream without api_key_env is
// named in a warning at start when it is a https endpoint (its probes go
// without a key), or only an info line over plain http (a self-hosted
// keyless server); one with a key is not named.
func TestNewWarnsKeylessUpstream(t *testing.T) {
	w := newWorld(t, mockllm.Options{}, nil)
	m, err := metrics.New(prometheus.NewRegistry(), &w.cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ keyEnv, baseURL, want string }{
		{"", "https://api.example.com", "level=WARN"},
		{"", "http://vllm.internal:8000", "level=INFO"}, // a self-hosted keyless server: noted only
		{"UPSTREAM_KEY", "https://api.example.com", ""},
	} {
		cfg := w.cfg
		cfg.Upstreams = slices.Clone(cfg.Upstreams)
		cfg.Upstreams[0].APIKeyEnv, cfg.Upstreams[0].BaseURL = tc.keyEnv, tc.baseURL
		var buf bytes.Buffer
		h := slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})
		if _, err := New(&cfg, w.gw, m, Options{Logger: slog.New(h)}); err != nil {
			t.Fatal(err)
		}
		logged := buf.String()
		if tc.want == "" && logged != "" || tc.want != "" && (!strings.Contains(logged, tc.want) ||
			!strings.Contains(logged, "upstream=mock") || !strings.Contains(logged, "api_key_env")) {
			t.Errorf("api_key_env %q at %s: log %q, want %q", tc.keyEnv, tc.baseURL, logged, tc.want)
		}
	}
}

// TestRoundCutAtInterval: a round whose requests hang ends by the next
// round's start: the requests in flight count as probe_timeout (a failure
// of the round, no verdict for the breaker) and the rest are not sent,
// instead of the round lasting requests × timeout_seconds. Validation
// refuses such a configuration (a round that could outlast its interval);
// the cut is the safety net when the Scheduler gets one anyway.
func TestRoundCutAtInterval(t *testing.T) {
	w := newWorldWith(t, mockllm.Options{OutputTokens: 2}, func(c *config.Config) {
		c.Probe.IntervalSeconds = 1
		c.Probe.Requests = 6
		c.Probe.TimeoutSeconds = 60
	}, false)
	if err := w.mock.Inject("hang=0", 6); err != nil {
		t.Fatal(err)
	}
	w.run(t)
	w.clock.waitPending(t, 1)
	w.clock.Advance(3 * time.Second)
	w.clock.waitPending(t, 1) // the round is over (cut after 1 s of real time)
	if got := w.results(t, "m"); len(got) != 1 || got["probe_timeout"] != 2 {
		t.Errorf("results %v, want the 2 requests in flight as probe_timeout", got)
	}
	if n := w.mock.Stats().Requests; n != 2 {
		t.Errorf("upstream saw %d requests, want 2 (the rest of the round not sent)", n)
	}
	if r := w.gauge(t, "tollgate_probe_success_ratio", "m"); r != 0 {
		t.Errorf("success ratio %v, want 0", r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := w.mock.WaitCanceled(ctx, 2); err != nil {
		t.Errorf("the cut requests were not cancelled upstream: %v", err)
	}
}
