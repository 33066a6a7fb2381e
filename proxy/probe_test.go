package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/spend"
	"github.com/tollgate-llm/tollgate/stats"
)

// userFamilies are the series of user traffic, which a probe must not move.
var userFamilies = []string{
	"tollgate_requests_total", "tollgate_request_duration_seconds", "tollgate_time_to_first_token_seconds",
	"tollgate_upstream_time_to_first_token_seconds", "tollgate_time_per_output_token_seconds",
	"tollgate_inter_token_latency_seconds", "tollgate_overhead_seconds", "tollgate_tokens_total",
	"tollgate_goodput_requests_total", "tollgate_cost_usd_total", "tollgate_stream_interruptions_total",
	"tollgate_inflight_requests", "tollgate_ratelimit_rejections_total",
}

// userTotals returns, per user family, the sum of its counters and gauges
// and of its histograms' sample counts.
func userTotals(t *testing.T, tg *testGateway) map[string]float64 {
	t.Helper()
	mfs, err := tg.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, name := range userFamilies {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				out[name] += m.GetCounter().GetValue() + m.GetGauge().GetValue() +
					float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

// probeWorld is a gateway in front of one mockllm, with /stats windows and
// a ledger, whose records are kept by the test gateway.
type probeWorld struct {
	tg     *testGateway
	mock   *mockllm.Server
	stats  *stats.Windows
	ledger *spend.Local
}

func newProbeWorld(t *testing.T, mo mockllm.Options, edit func(*config.Config), opts func(*Options)) *probeWorld {
	t.Helper()
	w := &probeWorld{mock: mockllm.New(mo), stats: stats.New(nil)}
	up := httptest.NewServer(w.mock)
	t.Cleanup(up.Close)
	w.ledger = newLocalLedger(t)
	w.tg = newTestGatewayWith(t, up.URL, edit, func(o *Options) {
		o.Stats, o.Ledger = w.stats, w.ledger
		if opts != nil {
			opts(o)
		}
	})
	return w
}

func (w *probeWorld) probe(t *testing.T, target llm.ProbeTarget) llm.ProbeResult {
	t.Helper()
	res, err := w.tg.gw.Probe(testCtx(t), target)
	if err != nil {
		t.Fatalf("Probe(%+v): %v", target, err)
	}
	return res
}

// ledgerRows returns the spend ledger's rows.
func (w *probeWorld) ledgerRows(t *testing.T) int {
	t.Helper()
	rows, err := w.ledger.Query(context.Background(), spend.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	return len(rows)
}

// TestProbeHealthyUpstream sends probes in each dialect to a healthy
// upstream: every one succeeds with the mock's timing, goes upstream as a
// labelled streamed request with no key, counts as an upstream attempt, and
// leaves no trace in the user figures, /stats, the ledger or OnRecord; one
// user request afterwards does (so the checks can fail).
func TestProbeHealthyUpstream(t *testing.T) {
	const ttft, tokens, n = 30 * time.Millisecond, 6, 4
	for _, tc := range []struct {
		dialect  llm.Dialect
		path     string
		maxField string
		route    string
		max      int
	}{
		{llm.DialectOpenAI, "/v1/chat/completions", `"max_completion_tokens":8`, "chat_completions", 8},
		{llm.DialectAnthropic, "/v1/messages", `"max_tokens":8`, "messages", 8},
		{llm.DialectResponses, "/v1/responses", `"max_output_tokens":16`, "responses", 16},
	} {
		t.Run(tc.dialect.String(), func(t *testing.T) {
			w := newProbeWorld(t, mockllm.Options{TTFT: ttft, ITL: 2 * time.Millisecond, OutputTokens: tokens}, nil, nil)
			target := llm.ProbeTarget{Upstream: "mock", Model: "probe-model", Dialect: tc.dialect,
				Prompt: "Reply with \"ok\"", MaxTokens: tc.max}
			for i := range n {
				res := w.probe(t, target)
				if res.Result != "ok" || res.Status != http.StatusOK || res.OutputTokens != tokens {
					t.Fatalf("probe %d: %+v, want ok, 200, %d tokens", i, res, tokens)
				}
				if !res.HasTTFT || res.TTFT < ttft || !res.HasTPOT || res.E2E < res.TTFT {
					t.Errorf("probe %d: TTFT %v (%v), TPOT %v (%v), E2E %v; want TTFT ≥ %v ≤ E2E, a TPOT",
						i, res.TTFT, res.HasTTFT, res.TPOT, res.HasTPOT, res.E2E, ttft)
				}
			}

			reqs := w.mock.Requests()
			if len(reqs) != n {
				t.Fatalf("upstream got %d requests, want %d (one attempt each)", len(reqs), n)
			}
			for _, r := range reqs {
				body := string(r.Body)
				if r.Path != tc.path || r.Header.Get(ProbeHeader) != "1" || r.Header.Get("User-Agent") != probeUserAgent {
					t.Errorf("upstream request %s, %s %q, User-Agent %q", r.Path, ProbeHeader, r.Header.Get(ProbeHeader),
						r.Header.Get("User-Agent"))
				}
				if r.Header.Get("Authorization") != "" || r.Header.Get("X-Api-Key") != "" {
					t.Errorf("a key went upstream though none is configured: %v", r.Header)
				}
				if !strings.Contains(body, `"stream":true`) || !strings.Contains(body, tc.maxField) ||
					!strings.Contains(body, `"model":"probe-model"`) || !strings.Contains(body, `Reply with \"ok\"`) {
					t.Errorf("upstream body %s", body)
				}
				if tc.dialect == llm.DialectOpenAI && !strings.Contains(body, `"include_usage":true`) {
					t.Errorf("OpenAI probe without include_usage: %s", body)
				}
				if tc.dialect == llm.DialectAnthropic && r.Header.Get("Anthropic-Version") == "" {
					t.Error("Anthropic probe without anthropic-version")
				}
			}
			if got := metricValue(t, w.tg, "tollgate_upstream_attempts_total", map[string]string{"upstream": "mock", "result": "ok"}); got != n {
				t.Errorf("upstream attempts ok = %v, want %d: probe attempts are real attempts", got, n)
			}

			// Kept out of every user figure.
			for name, v := range userTotals(t, w.tg) {
				if v != 0 {
					t.Errorf("%s moved by %v after probes only", name, v)
				}
			}
			if g := len(w.stats.Snapshot().Windows[0].Groups); g != 0 {
				t.Errorf("/stats has %d groups after probes only", g)
			}
			if rows := w.ledgerRows(t); rows != 0 {
				t.Errorf("ledger has %d rows after probes only", rows)
			}
			w.tg.mu.Lock()
			recs := len(w.tg.recs)
			w.tg.mu.Unlock()
			if recs != 0 {
				t.Errorf("OnRecord called %d times for probes", recs)
			}
			// Labelled in the access log.
			lines := strings.Split(strings.TrimSpace(w.tg.logs.String()), "\n")
			if len(lines) != n {
				t.Fatalf("%d access-log lines, want %d:\n%s", len(lines), n, w.tg.logs)
			}
			for _, l := range lines {
				var e map[string]any
				if err := json.Unmarshal([]byte(l), &e); err != nil {
					t.Fatal(err)
				}
				if e["probe"] != true || e["upstream"] != "mock" || e["model"] != "probe-model" ||
					e["route"] != tc.route || e["outcome"] != "ok" {
					t.Errorf("access-log line %s", l)
				}
			}

			// A user request, sending the probe header itself, is counted
			// everywhere, and the header does not reach the upstream.
			body := `{"model":"user-model","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`
			hdr := map[string]string{ProbeHeader: "1", "Anthropic-Version": "2023-06-01"}
			if resp, b := post(t, w.tg.URL+tc.path, body, hdr); resp.StatusCode != http.StatusOK {
				t.Fatalf("user request: %d %s", resp.StatusCode, b)
			}
			w.tg.record(t)
			if r := w.mock.Requests()[n]; r.Header.Get(ProbeHeader) != "" {
				t.Errorf("a caller's %s reached the upstream", ProbeHeader)
			}
			if v := userTotals(t, w.tg)["tollgate_requests_total"]; v != 1 {
				t.Errorf("requests_total %v after one user request", v)
			}
			if rows := w.ledgerRows(t); rows != 1 {
				t.Errorf("ledger has %d rows after one user request", rows)
			}
			if g := len(w.stats.Snapshot().Windows[0].Groups); g == 0 {
				t.Error("/stats is empty after a user request")
			}
		})
	}
}

// TestProbeFailuresAreNotRetried injects k failures among n probes: exactly
// k fail with the attempt's result, the others succeed, and the upstream
// sees exactly n requests (no retry, although the upstream's policy would
// retry each).
func TestProbeFailuresAreNotRetried(t *testing.T) {
	const n = 6
	for _, tc := range []struct {
		fault  string
		k      int
		result string
	}{
		{"status=529", 3, resultOverloaded},
		{"status=500", 2, resultServerError},
		{"status=429;retry-after-ms=10", 1, resultRateLimited},
		{"error-event=0", 2, resultErrorEvent},
		{"disconnect=2", 1, resultStreamBroken},
		{"stall=3000", 1, resultHeaderTimeout},
	} {
		t.Run(tc.fault, func(t *testing.T) {
			w := newProbeWorld(t, mockllm.Options{OutputTokens: 4}, func(c *config.Config) {
				c.Upstreams[0].HeaderTimeoutSeconds = 0.2
			}, nil)
			if err := w.mock.Inject(tc.fault, tc.k); err != nil {
				t.Fatal(err)
			}
			results := map[string]int{}
			for range n {
				results[w.probe(t, llm.ProbeTarget{Upstream: "mock", Model: "m", Prompt: "hi", MaxTokens: 8}).Result]++
			}
			if results[tc.result] != tc.k || results["ok"] != n-tc.k || len(results) != 2 {
				t.Errorf("results %v, want %d %s and %d ok", results, tc.k, tc.result, n-tc.k)
			}
			if got := w.mock.Stats().Requests; got != n {
				t.Errorf("upstream got %d requests, want %d: a probe is never retried", got, n)
			}
			if got := metricValue(t, w.tg, "tollgate_upstream_attempts_total",
				map[string]string{"upstream": "mock", "result": tc.result}); got != float64(tc.k) {
				t.Errorf("upstream attempts %s = %v, want %d", tc.result, got, tc.k)
			}
			if got := metricValue(t, w.tg, "tollgate_upstream_retries_total", nil); got > 0 {
				t.Errorf("retries counted: %v", got)
			}
		})
	}
}

// TestProbeDoesNotFallBack probes the first upstream of a route whose first
// upstream is down: the probe reports the failure and the route's backup
// never sees it, while a user request on the same route falls back to it.
func TestProbeDoesNotFallBack(t *testing.T) {
	backup := mockllm.New(mockllm.Options{OutputTokens: 3})
	bsrv := httptest.NewServer(backup)
	t.Cleanup(bsrv.Close)
	down := closedPortURL(t) // connection refused
	w := newProbeWorld(t, mockllm.Options{}, func(c *config.Config) {
		c.Upstreams[0].BaseURL = down
		b := config.DefaultUpstream()
		b.Name, b.BaseURL = "backup", bsrv.URL
		c.Upstreams = append(c.Upstreams, b)
		c.Routes = []config.Route{{Models: []string{"m"}, Upstreams: []string{"mock", "backup"}}}
	}, nil)

	res := w.probe(t, llm.ProbeTarget{Upstream: "mock", Model: "m", Prompt: "hi", MaxTokens: 8})
	if res.Result != resultConnectError || res.Status != 0 {
		t.Errorf("probe of a down upstream: %+v, want %s", res, resultConnectError)
	}
	if got := backup.Stats().Requests; got != 0 {
		t.Fatalf("the backup got %d requests from a probe of its route's first upstream", got)
	}
	if got := metricValue(t, w.tg, "tollgate_upstream_fallbacks_total", nil); got > 0 {
		t.Errorf("fallbacks counted: %v", got)
	}
	// The backup itself is probed where it is.
	if res := w.probe(t, llm.ProbeTarget{Upstream: "backup", Model: "m", Prompt: "hi", MaxTokens: 8}); res.Result != "ok" {
		t.Errorf("probe of the backup: %+v", res)
	}
	// A user request falls back (the route would have, for the probe too).
	resp, b := post(t, w.tg.URL+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("user request: %d %s", resp.StatusCode, b)
	}
	if rec := w.tg.record(t); rec.Upstream != "backup" {
		t.Errorf("user request served by %q, want backup", rec.Upstream)
	}
}

// TestProbeBreaker: probe failures open an upstream's breaker; a probe then
// gets breaker_open without touching the upstream; after the cooldown a
// probe is the half-open request that closes the circuit again, with no
// user traffic at all.
func TestProbeBreaker(t *testing.T) {
	clock := newFakeClock()
	w := newProbeWorld(t, mockllm.Options{OutputTokens: 3}, func(c *config.Config) {
		b := &c.Upstreams[0].Breaker
		b.ConsecutiveFailures, b.CooldownSeconds, b.HalfOpenProbes = 2, 10, 1
	}, func(o *Options) { o.Now = clock.Now })
	target := llm.ProbeTarget{Upstream: "mock", Model: "m", Prompt: "hi", MaxTokens: 8}
	if err := w.mock.Inject("status=500", 2); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if res := w.probe(t, target); res.Result != resultServerError {
			t.Fatalf("probe %d: %+v, want server_error", i, res)
		}
	}
	if s := circuitState(t, w.tg, "mock"); s != 2 {
		t.Fatalf("circuit state %v after 2 failures, want 2 (open)", s)
	}
	if res := w.probe(t, target); res.Result != skipBreakerOpen || res.Status != 0 {
		t.Errorf("probe of an open circuit: %+v, want %s", res, skipBreakerOpen)
	}
	if got := w.mock.Stats().Requests; got != 2 {
		t.Errorf("upstream got %d requests, want 2: an open circuit is not probed through", got)
	}
	clock.Advance(11 * time.Second)
	if res := w.probe(t, target); res.Result != "ok" {
		t.Errorf("probe after the cooldown: %+v, want ok", res)
	}
	if s := circuitState(t, w.tg, "mock"); s != 0 {
		t.Errorf("circuit state %v after a successful half-open probe, want 0 (closed)", s)
	}
	if v := userTotals(t, w.tg)["tollgate_requests_total"]; v != 0 {
		t.Errorf("requests_total %v", v)
	}
}

// TestProbeKeysModeKeepsOutOfLimits: in mode "keys" a probe needs no
// gateway key and sends the upstream's own (the mock refuses any other),
// and probe rounds leave a key's tight limit and the ledger untouched.
func TestProbeKeysModeKeepsOutOfLimits(t *testing.T) {
	w := newGovWorld(t, mockllm.Options{OutputTokens: 3}, true, func(c *config.Config) {
		c.Keys[0].RPM = i64(1)
		c.Teams[0].Concurrency = i64(1)
	})
	for i, tc := range []struct {
		target llm.ProbeTarget
		header string
		want   string
	}{
		{llm.ProbeTarget{Upstream: "mock", Model: "gpt-test", Dialect: llm.DialectOpenAI, Prompt: "hi", MaxTokens: 8},
			"Authorization", "Bearer " + upstreamKey},
		{llm.ProbeTarget{Upstream: "mock", Model: "claude-test", Dialect: llm.DialectAnthropic, Prompt: "hi", MaxTokens: 8},
			"X-Api-Key", upstreamKey},
	} {
		for range 3 {
			res, err := w.tg.gw.Probe(testCtx(t), tc.target)
			if err != nil || res.Result != "ok" {
				t.Fatalf("probe %+v: %+v %v, want ok", tc.target, res, err)
			}
		}
		reqs := w.mock.Requests()
		if r := reqs[len(reqs)-1]; r.Header.Get(tc.header) != tc.want || r.Header.Get(ProbeHeader) != "1" {
			t.Errorf("target %d: upstream %s %q, %s %q", i, tc.header, r.Header.Get(tc.header),
				ProbeHeader, r.Header.Get(ProbeHeader))
		}
	}
	rows, err := w.ledger.Query(context.Background(), spend.Filter{})
	if err != nil || len(rows) != 0 {
		t.Errorf("ledger after probes: %d rows, %v; want none", len(rows), err)
	}
	// The key's limit of 1 RPM still admits its user request, and only one.
	ctx := testCtx(t)
	if _, err := w.openai(keyAlpha).Chat.Completions.New(ctx, chatParams(0)); err != nil {
		t.Fatalf("user request after probe rounds: %v", err)
	}
	w.tg.record(t)
	if _, err := w.openai(keyAlpha).Chat.Completions.New(ctx, chatParams(0)); err == nil {
		t.Error("a second request within the minute was admitted: the limit is not what this test thinks")
	}
	if rows, _ := w.ledger.Query(context.Background(), spend.Filter{}); len(rows) != 1 {
		t.Errorf("ledger after one user request: %d rows, want 1", len(rows))
	}
}

// TestProbeTimeoutAndCancel: a probe whose context runs out is a timeout,
// one whose context is cancelled is cancelled; neither gives the breaker a
// verdict (like a caller that gives up).
func TestProbeTimeoutAndCancel(t *testing.T) {
	w := newProbeWorld(t, mockllm.Options{OutputTokens: 3}, func(c *config.Config) {
		c.Upstreams[0].Breaker.ConsecutiveFailures = 1
	}, nil)
	target := llm.ProbeTarget{Upstream: "mock", Model: "m", Prompt: "hi", MaxTokens: 8}
	if err := w.mock.Inject("hang=0", 2); err != nil {
		t.Fatal(err)
	}
	// Long enough for the request to reach the mock on a loaded machine
	// (200 ms once was not, and the hangs then fell on later probes).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	res, err := w.tg.gw.Probe(ctx, target)
	cancel()
	if err != nil || res.Result != llm.ProbeTimeout {
		t.Errorf("probe of a hanging upstream with a timeout: %+v %v, want %s", res, err, llm.ProbeTimeout)
	}
	if n := w.mock.Stats().Injected; n != 1 {
		t.Fatalf("the timed-out probe took %d of the scripted hangs, want 1", n)
	}

	ctx, cancel = context.WithCancel(context.Background())
	go func() {
		wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer wcancel()
		// Injected, not Requests: a request cancelled between its arrival
		// and taking its fault would leave the hang to the next probe.
		_, _ = w.mock.WaitStats(wctx, func(s mockllm.Stats) bool { return s.Injected >= 2 })
		cancel()
	}()
	res, err = w.tg.gw.Probe(ctx, target)
	if err != nil || res.Result != llm.ProbeCanceled {
		t.Errorf("cancelled probe: %+v %v, want %s", res, err, llm.ProbeCanceled)
	}
	if got := metricValue(t, w.tg, "tollgate_upstream_attempts_total",
		map[string]string{"upstream": "mock", "result": resultClientGone}); got != 2 {
		t.Errorf("client_gone attempts %v, want 2", got)
	}
	if s := circuitState(t, w.tg, "mock"); s != 0 {
		t.Errorf("circuit state %v: a probe that gave up opened the breaker", s)
	}
	if res := w.probe(t, target); res.Result != "ok" {
		t.Errorf("next probe: %+v", res)
	}
}

// TestProbeBadTarget: a target that is not a configured upstream serving
// its dialect is an error, and sends nothing.
func TestProbeBadTarget(t *testing.T) {
	w := newProbeWorld(t, mockllm.Options{}, func(c *config.Config) {
		c.Upstreams[0].Dialects = []string{"anthropic"}
	}, nil)
	for _, target := range []llm.ProbeTarget{
		{Upstream: "nope", Model: "m"},
		{Upstream: "mock", Model: "m", Dialect: llm.DialectOpenAI},
		{Upstream: "mock"},
	} {
		if _, err := w.tg.gw.Probe(testCtx(t), target); !errors.Is(err, errBadProbeTarget) {
			t.Errorf("Probe(%+v) error %v, want %v", target, err, errBadProbeTarget)
		}
	}
	// DialectNone is the upstream's first dialect.
	if res := w.probe(t, llm.ProbeTarget{Upstream: "mock", Model: "m", Prompt: "hi", MaxTokens: 4}); res.Result != "ok" {
		t.Errorf("probe in the upstream's own dialect: %+v", res)
	}
	if reqs := w.mock.Requests(); len(reqs) != 1 || reqs[0].Path != "/v1/messages" {
		t.Errorf("upstream requests %d, want one to /v1/messages", len(reqs))
	}
}

// TestProbe429InPassthroughNoVerdict: in passthrough mode with require_key,
// a probe goes with the upstream's key that no caller uses, so its 429s are
// that key's limit, not the upstream's health: they must not open the
// circuit for callers who bring their own keys (five 429s would, and those
// callers would get 503). Where callers meet the same 429 (mode keys, keyless
// callers on the upstream's key, no key at all), they count.
func TestProbe429InPassthroughNoVerdict(t *testing.T) {
	for _, tc := range []struct {
		name       string
		mode       string
		requireKey bool
		key        string
		want       float64 // circuit state after five 429s
	}{
		// Every caller brings its own key: the probe's key is nobody's.
		{"passthrough require_key", "passthrough", true, "sk-gateway-probe", 0},
		// Keyless callers use the upstream's key too: its 429 is theirs.
		{"passthrough keyless callers", "passthrough", false, "sk-gateway-probe", 2},
		// No key at all (a local server): a 429 is the server's own state.
		{"passthrough no upstream key", "passthrough", true, "", 2},
		// Mode keys: the upstream's key is every caller's.
		{"keys", "keys", true, "sk-gateway-probe", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newProbeWorld(t, mockllm.Options{OutputTokens: 3}, func(c *config.Config) {
				c.Auth.Mode, c.Auth.RequireKey = tc.mode, tc.requireKey
				if tc.mode == "keys" {
					c.Keys = []config.Key{{Name: "alpha", SHA256: sha(keyAlpha)}}
				}
				if tc.key != "" {
					c.Upstreams[0].APIKeyEnv, c.Upstreams[0].APIKey = "UPSTREAM_KEY", config.Secret(tc.key)
				}
				c.Upstreams[0].Breaker.ConsecutiveFailures = 2
			}, nil)
			if err := w.mock.Inject("status=429", 5); err != nil {
				t.Fatal(err)
			}
			target := llm.ProbeTarget{Upstream: "mock", Model: "m", Prompt: "hi", MaxTokens: 8}
			for range 5 {
				if res := w.probe(t, target); res.Result != resultRateLimited && res.Result != skipBreakerOpen {
					t.Fatalf("probe: %+v, want rate_limited (or breaker_open)", res)
				}
			}
			state := circuitState(t, w.tg, "mock")
			if state != tc.want {
				t.Errorf("circuit state %v after five probe 429s, want %v", state, tc.want)
			}
		})
	}
}

// TestProbeAuthError: an upstream that refuses the probe's key (here: none,
// the upstream has no api_key_env) is result auth_error, not a vague
// client_error.
func TestProbeAuthError(t *testing.T) {
	w := newProbeWorld(t, mockllm.Options{OutputTokens: 3, RequireKey: "sk-needed"}, nil, nil)
	res := w.probe(t, llm.ProbeTarget{Upstream: "mock", Model: "m", Prompt: "hi", MaxTokens: 8})
	if res.Result != llm.ProbeAuthError || res.Status != http.StatusUnauthorized {
		t.Errorf("probe without the upstream's key: %+v, want %s and 401", res, llm.ProbeAuthError)
	}
}
