package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/conversation"
	"github.com/tollgate-llm/tollgate/llm"
)

func newTest(t *testing.T, edit func(*config.Config)) (*Metrics, *prometheus.Registry) {
	t.Helper()
	cfg := config.DemoConfig("http://127.0.0.1:1")
	cfg.Metrics.NativeHistograms = false
	if edit != nil {
		edit(&cfg)
	}
	reg := prometheus.NewRegistry()
	m, err := New(reg, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m, reg
}

func TestModelLabelIsBounded(t *testing.T) {
	m, _ := newTest(t, func(c *config.Config) {
		c.Metrics.Models = []string{"gpt-4o"}
		c.Metrics.MaxModels = 3
	})
	// Before any upstream served them, names have no label of their own,
	// however many requests name them; the configured one has its own.
	for _, name := range []string{"a", "b", "c", "a"} {
		if got := m.Model(name); got != "other" {
			t.Errorf("Model(%q) before it was served = %q, want other", name, got)
		}
	}
	if got := m.Model("gpt-4o"); got != "gpt-4o" {
		t.Errorf("Model(configured) = %q", got)
	}
	for _, tc := range []struct {
		in, want string
		served   bool
	}{
		{"gpt-4o", "gpt-4o", true}, {"", "none", true}, {"", "none", false}, {"a", "a", true}, {"a", "a", false},
		{"b", "b", true}, {"c", "other", true}, {"c", "other", false}, {"a", "a", true},
		{"gpt-4o", "gpt-4o", false}, {"bad\nname", "other", true}, {strings.Repeat("x", 200), "other", true},
	} {
		got := m.Model(tc.in)
		if tc.served {
			got = m.ModelServed(tc.in)
		}
		if got != tc.want {
			t.Errorf("served=%v %.20q: label %q, want %q", tc.served, tc.in, got, tc.want)
		}
	}
}

// TestModelLabelFollowsPrices: with [[models]] patterns, only a served name
// matching one takes a label of its own; [metrics] models are labelled
// whatever they match, and models_from_prices = false lets any served name
// take one.
func TestModelLabelFollowsPrices(t *testing.T) {
	prices := func(c *config.Config) {
		c.Models = []config.Model{{Pattern: "gpt-4o*", InputUSDPerMTok: 1, OutputUSDPerMTok: 1},
			{Pattern: "claude-?", InputUSDPerMTok: 1, OutputUSDPerMTok: 1}}
		c.Metrics.Models = []string{"local-free"}
	}
	m, _ := newTest(t, prices)
	for in, want := range map[string]string{"gpt-4o": "gpt-4o", "gpt-4o-mini": "gpt-4o-mini", "claude-3": "claude-3",
		"claude-35": "other", "hostile": "other", "local-free": "local-free", "GPT-4O": "other"} {
		if got := m.ModelServed(in); got != want {
			t.Errorf("ModelServed(%q) = %q, want %q", in, got, want)
		}
	}
	if got := m.Model("hostile"); got != "other" {
		t.Errorf("a refused name took a label: %q", got)
	}

	m, _ = newTest(t, func(c *config.Config) { prices(c); c.Metrics.ModelsFromPrices = false })
	if got := m.ModelServed("hostile"); got != "hostile" {
		t.Errorf("models_from_prices = false: ModelServed(hostile) = %q", got)
	}
}

func TestObserveStreamedRecord(t *testing.T) {
	m, reg := newTest(t, func(c *config.Config) { c.Metrics.Labels = map[string]string{"scene": "chat"} })
	t0 := time.Unix(1000, 0)
	rec := &llm.Record{
		Route: llm.RouteChatCompletions, Model: "gpt", Upstream: "mock", Stream: true, Status: 200,
		Timing: llm.Timing{In: t0, UpSent: t0.Add(time.Millisecond), FirstToken: t0.Add(100 * time.Millisecond),
			FirstTokenOut: t0.Add(101 * time.Millisecond), LastToken: t0.Add(190 * time.Millisecond),
			End: t0.Add(200 * time.Millisecond)},
		Usage:       llm.Usage{Input: 600, Output: 10, CacheRead: 100, Reasoning: 2, HasInput: true, HasOutput: true},
		InputBucket: "500-2000", Outcome: llm.OutcomeOK, Goodput: llm.SLOMet, Interruption: llm.InterruptNone,
	}
	m.Observe(rec, m.ModelServed(rec.Model))
	want := `
# HELP tollgate_tokens_total Tokens by type (input, output, cache_read, cache_write, reasoning); input includes cache_read and cache_write, output includes reasoning; estimated=true when the upstream reported no usage: output counted from events (or max_tokens billed for a forwarded answer), input estimated from the prompt.
# TYPE tollgate_tokens_total counter
tollgate_tokens_total{estimated="false",model="gpt",route="chat_completions",scene="chat",team="none",type="cache_read"} 100
tollgate_tokens_total{estimated="false",model="gpt",route="chat_completions",scene="chat",team="none",type="input"} 600
tollgate_tokens_total{estimated="false",model="gpt",route="chat_completions",scene="chat",team="none",type="output"} 10
tollgate_tokens_total{estimated="false",model="gpt",route="chat_completions",scene="chat",team="none",type="reasoning"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "tollgate_tokens_total"); err != nil {
		t.Error(err)
	}
	// TTFT 101 ms lands in the (0.1, 0.15] bucket; TPOT 90ms/9 = 10 ms in (0.0075, 0.01].
	checkBucket(t, reg, "tollgate_time_to_first_token_seconds", 0.1, 0, 0.15, 1)
	checkBucket(t, reg, "tollgate_time_per_output_token_seconds", 0.0075, 0, 0.01, 1)
	if n := testutil.CollectAndCount(m.interrupts); n != 0 {
		t.Errorf("%d interruption series for a clean stream", n)
	}

	// A cancelled stream without usage: estimated output, an interruption,
	// and no input tokens invented.
	rec2 := *rec
	rec2.Usage = llm.Usage{Output: 3}
	rec2.Estimated = true
	rec2.Outcome, rec2.Interruption, rec2.Status, rec2.Goodput = llm.OutcomeClientCancel, llm.InterruptClientCancel, 499, llm.SLOFailed
	m.Observe(&rec2, "gpt")
	if v := testutil.ToFloat64(m.tokens.WithLabelValues("chat_completions", "gpt", "none", "output", "true")); v != 3 {
		t.Errorf("estimated output tokens = %v, want 3", v)
	}
	if v := testutil.ToFloat64(m.interrupts.WithLabelValues("chat_completions", "client_cancel")); v != 1 {
		t.Errorf("client_cancel interruptions = %v", v)
	}
	if v := testutil.ToFloat64(m.requests.WithLabelValues("chat_completions", "gpt", "none", "499", "client_cancel")); v != 1 {
		t.Errorf("499 requests = %v", v)
	}
	if v := testutil.ToFloat64(m.goodput.WithLabelValues("chat_completions", "gpt", "none", "failed")); v != 1 {
		t.Errorf("failed goodput = %v", v)
	}
}

// checkBucket asserts that histogram name has count c1 at bound le1 and c2 at le2.
func checkBucket(t *testing.T, reg *prometheus.Registry, name string, le1 float64, c1 uint64, le2 float64, c2 uint64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		got := map[float64]uint64{}
		for _, b := range mf.GetMetric()[0].GetHistogram().GetBucket() {
			got[b.GetUpperBound()] = b.GetCumulativeCount()
		}
		if got[le1] != c1 || got[le2] != c2 {
			t.Errorf("%s: bucket %v=%d %v=%d, want %d %d", name, le1, got[le1], le2, got[le2], c1, c2)
		}
		return
	}
	t.Errorf("%s not gathered", name)
}

func TestStatusCodeLabels(t *testing.T) {
	for code, want := range map[int]string{200: "200", 499: "499", 529: "529", 0: "000", 42: "000", 700: "000"} {
		if got := statusCode(code); got != want {
			t.Errorf("statusCode(%d) = %q", code, got)
		}
	}
	if a := testing.AllocsPerRun(100, func() { _ = statusCode(429) }); a != 0 {
		t.Errorf("statusCode allocates %v", a)
	}
}

func TestDuplicateRegistrationFails(t *testing.T) {
	cfg := config.DemoConfig("http://127.0.0.1:1")
	reg := prometheus.NewRegistry()
	if _, err := New(reg, &cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := New(reg, &cfg); err == nil {
		t.Error("registering twice on one registry succeeded")
	}
}

// newUpstreamTest returns Metrics for two upstreams, "mock" and "backup".
func newUpstreamTest(t *testing.T) (*Metrics, *prometheus.Registry) {
	t.Helper()
	return newTest(t, func(c *config.Config) {
		backup := c.Upstreams[0]
		backup.Name = "backup"
		c.Upstreams = append(c.Upstreams, backup)
	})
}

func TestUpstreamSeriesArePreCreated(t *testing.T) {
	_, reg := newUpstreamTest(t)
	want := `
# HELP tollgate_upstream_attempts_total Attempts sent to an upstream, by result (ok, client_error, rate_limited, overloaded, server_error, connect_error, connection_error, header_timeout, first_token_timeout, idle_timeout, error_event, stream_broken, timeout, client_gone).
# TYPE tollgate_upstream_attempts_total counter
tollgate_upstream_attempts_total{result="ok",upstream="backup"} 0
tollgate_upstream_attempts_total{result="ok",upstream="mock"} 0
# HELP tollgate_upstream_breaker_bypass_total Attempts sent to an upstream although its circuit breaker refused them (open, or half-open with every probe slot taken), because the breaker of every upstream the request could use refused it: the one open longest gets the request, once.
# TYPE tollgate_upstream_breaker_bypass_total counter
tollgate_upstream_breaker_bypass_total{upstream="backup"} 0
tollgate_upstream_breaker_bypass_total{upstream="mock"} 0
# HELP tollgate_upstream_circuit_state An upstream's circuit breaker: 0 closed, 1 half-open, 2 open.
# TYPE tollgate_upstream_circuit_state gauge
tollgate_upstream_circuit_state{upstream="backup"} 0
tollgate_upstream_circuit_state{upstream="mock"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"tollgate_upstream_attempts_total", "tollgate_upstream_breaker_bypass_total", "tollgate_upstream_circuit_state",
		"tollgate_upstream_circuit_transitions_total", "tollgate_upstream_retries_total"); err != nil {
		t.Error(err)
	}
}

func TestUpstreamCountersMove(t *testing.T) {
	m, reg := newUpstreamTest(t)
	m.UpstreamAttempt("mock", "rate_limited")
	m.UpstreamAttempt("mock", "rate_limited")
	m.UpstreamAttempt("backup", "ok")
	m.UpstreamRetry("mock", "rate_limited")
	m.UpstreamRetrySkipped("mock", "budget")
	m.UpstreamRetrySkipped("mock", "budget")
	m.UpstreamRetrySkipped("backup", "queue_full")
	m.UpstreamFallback("mock", "backup", "rate_limited")
	m.UpstreamFallback("mock", "backup", "breaker_open")
	m.UpstreamFallback("mock", "backup", "breaker_open")
	m.SetQueueWaiting("mock", 3)
	m.SetQueueWaiting("mock", 1)
	m.UpstreamBreakerBypass("mock")

	for _, tc := range []struct {
		name string
		c    prometheus.Collector
		want float64
	}{
		{"attempts mock rate_limited", m.attempts.WithLabelValues("mock", "rate_limited"), 2},
		{"attempts mock ok", m.attempts.WithLabelValues("mock", "ok"), 0},
		{"attempts backup ok", m.attempts.WithLabelValues("backup", "ok"), 1},
		{"retries mock rate_limited", m.retries.WithLabelValues("mock", "rate_limited"), 1},
		{"skipped mock budget", m.retriesSkipped.WithLabelValues("mock", "budget"), 2},
		{"skipped backup queue_full", m.retriesSkipped.WithLabelValues("backup", "queue_full"), 1},
		{"fallbacks rate_limited", m.fallbacks.WithLabelValues("mock", "backup", "rate_limited"), 1},
		{"fallbacks breaker_open", m.fallbacks.WithLabelValues("mock", "backup", "breaker_open"), 2},
		{"queue waiting mock", m.queueWaiting.WithLabelValues("mock"), 1},
		{"breaker bypass mock", m.breakerBypass.WithLabelValues("mock"), 1},
		{"breaker bypass backup", m.breakerBypass.WithLabelValues("backup"), 0},
	} {
		if got := testutil.ToFloat64(tc.c); got != tc.want {
			t.Errorf("%s = %v, want %v", tc.name, got, tc.want)
		}
	}
	if n := testutil.CollectAndCount(m.fallbacks); n != 2 {
		t.Errorf("%d fallback series, want 2", n)
	}

	// 120 ms lands in the (0.1, 0.15] bucket; 4 s in (3, 5].
	m.RetryWait("backup", 120*time.Millisecond)
	m.QueueWait("mock", 4*time.Second)
	checkBucket(t, reg, "tollgate_upstream_retry_wait_seconds", 0.1, 0, 0.15, 1)
	checkBucket(t, reg, "tollgate_upstream_queue_wait_seconds", 3, 0, 5, 1)
	if n := testutil.CollectAndCount(m.retryWait); n != 1 {
		t.Errorf("%d retry wait series, want 1", n)
	}
}

func TestCircuitTransitionsCountOnlyChanges(t *testing.T) {
	m, reg := newUpstreamTest(t)
	for _, s := range []struct {
		upstream string
		state    int
	}{
		{"mock", CircuitClosed}, // already closed: no transition
		{"mock", CircuitOpen},
		{"mock", CircuitOpen},
		{"mock", CircuitHalfOpen},
		{"mock", CircuitOpen},
		{"mock", CircuitHalfOpen},
		{"mock", CircuitClosed},
		{"mock", CircuitClosed},
		{"backup", CircuitHalfOpen},
		{"backup", 7},  // not a state: ignored
		{"backup", -1}, // likewise
		{"unlisted", CircuitOpen},
	} {
		m.SetCircuitState(s.upstream, s.state)
	}
	want := `
# HELP tollgate_upstream_circuit_state An upstream's circuit breaker: 0 closed, 1 half-open, 2 open.
# TYPE tollgate_upstream_circuit_state gauge
tollgate_upstream_circuit_state{upstream="backup"} 1
tollgate_upstream_circuit_state{upstream="mock"} 0
tollgate_upstream_circuit_state{upstream="unlisted"} 2
# HELP tollgate_upstream_circuit_transitions_total Circuit breaker state changes, by the state entered (closed, half_open, open).
# TYPE tollgate_upstream_circuit_transitions_total counter
tollgate_upstream_circuit_transitions_total{to="closed",upstream="mock"} 1
tollgate_upstream_circuit_transitions_total{to="half_open",upstream="backup"} 1
tollgate_upstream_circuit_transitions_total{to="half_open",upstream="mock"} 2
tollgate_upstream_circuit_transitions_total{to="open",upstream="mock"} 2
tollgate_upstream_circuit_transitions_total{to="open",upstream="unlisted"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"tollgate_upstream_circuit_state", "tollgate_upstream_circuit_transitions_total"); err != nil {
		t.Error(err)
	}
}

func TestUpstreamHotPathsDoNotAllocate(t *testing.T) {
	m, _ := newUpstreamTest(t)
	// The first call of each creates its series; only later calls count.
	for name, f := range map[string]func(){
		"UpstreamAttempt":      func() { m.UpstreamAttempt("mock", "ok") },
		"UpstreamRetry":        func() { m.UpstreamRetry("mock", "server_error") },
		"UpstreamRetrySkipped": func() { m.UpstreamRetrySkipped("mock", "budget") },
		"UpstreamFallback":     func() { m.UpstreamFallback("mock", "backup", "timeout") },
		"SetCircuitState":      func() { m.SetCircuitState("mock", CircuitClosed) },
		"QueueWait":            func() { m.QueueWait("mock", time.Millisecond) },
		"RetryWait":            func() { m.RetryWait("mock", time.Millisecond) },
		"SetQueueWaiting":      func() { m.SetQueueWaiting("mock", 2) },
	} {
		f()
		if a := testing.AllocsPerRun(100, f); a != 0 {
			t.Errorf("%s allocates %v times on an existing series", name, a)
		}
	}
}

func BenchmarkUpstreamAttempt(b *testing.B) {
	cfg := config.DemoConfig("http://127.0.0.1:1")
	m, err := New(prometheus.NewRegistry(), &cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		m.UpstreamAttempt("mock", "ok")
	}
}

// TestOwnLabelsRefusedAsConstantLabels checks that every label name a
// tollgate series carries is refused by config validation as a constant
// label: otherwise check-config passes and metrics.New fails at startup
// with a duplicate label name.
func TestOwnLabelsRefusedAsConstantLabels(t *testing.T) {
	cfg := config.DemoConfig("http://127.0.0.1:1")
	reg := prometheus.NewRegistry()
	m, err := New(reg, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Touch the series that exist only once used, so Gather lists them.
	m.UpstreamRetry("mock", "rate_limited")
	m.UpstreamRetrySkipped("mock", "budget")
	m.UpstreamFallback("mock", "mock", "overloaded")
	m.RetryWait("mock", time.Millisecond)
	m.QueueWait("mock", time.Millisecond)
	m.SetQueueWaiting("mock", 1)
	m.Rejected("key", "rpm", "none")
	m.SetCircuitState("mock", CircuitOpen)
	m.ConversationEnded(conversation.Conversation{Team: "t", Turns: 1, Errors: 1}, conversation.EndEvicted)
	m.ConversationEnded(conversation.Conversation{Team: "t", Turns: 1, Breakdown: conversation.Breakdown{
		Classes: map[string]*conversation.Calls{"main": {Calls: 1}}}}, conversation.EndIdle)
	m.ConversationOutcome("t", conversation.Outcome{Completed: true}, 1)
	rec := llm.Record{Route: llm.RouteChatCompletions, Stream: true, Status: 200, Interruption: llm.InterruptUpstreamEOF}
	m.Observe(&rec, "m")
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		for _, metric := range mf.GetMetric() {
			for _, lp := range metric.GetLabel() {
				names[lp.GetName()] = true
			}
		}
	}
	if len(names) < 10 {
		t.Fatalf("only %d label names gathered: %v", len(names), names)
	}
	for name := range names {
		c := cfg
		c.Metrics.Labels = map[string]string{name: "x"}
		if err := c.Validate(); err == nil {
			t.Errorf("constant label %q (a label of tollgate's own series) passes validation", name)
		}
	}
}

// TestRefusalsAreCountedApart: a refused request (population refused) is
// counted by reason and timed in its own histogram, and is in neither the
// E2E histogram nor goodput; a model call is in both, and a forward in E2E
// (its own route) but not goodput.
func TestRefusalsAreCountedApart(t *testing.T) {
	m, _ := newTest(t, nil)
	at := time.Unix(1700000000, 0)
	rec := func(route llm.Route, p llm.Population, slo llm.SLO, rej llm.Rejection) *llm.Record {
		r := &llm.Record{Route: route, Population: p, Goodput: slo, Rejection: rej, Status: 200, Outcome: llm.OutcomeOK}
		r.Timing.In, r.Timing.End = at, at.Add(3*time.Millisecond)
		return r
	}
	m.Observe(rec(llm.RouteMessages, llm.PopRefused, llm.SLOExcluded, llm.RejectUnauthorized), "other")
	m.Observe(rec(llm.RouteMessages, llm.PopRefused, llm.SLOExcluded, llm.RejectUnauthorized), "other")
	m.Observe(rec(llm.RouteMessages, llm.PopModelCall, llm.SLOMet, llm.RejectNone), "other")
	m.Observe(rec(llm.RouteOther, llm.PopForward, llm.SLOExcluded, llm.RejectNone), "other")
	if got := testutil.ToFloat64(m.refusals.WithLabelValues("unauthorized", "none")); got != 2 {
		t.Errorf("refusals{unauthorized} = %v, want 2", got)
	}
	if n := testutil.CollectAndCount(m.refusalTime); n != 1 {
		t.Errorf("refusal histogram series %d", n)
	}
	if e2e, goodput := testutil.CollectAndCount(m.duration), testutil.CollectAndCount(m.goodput); e2e != 2 || goodput != 1 {
		t.Errorf("E2E series %d, goodput series %d; want the model call's and the forward's E2E, the model call's goodput", e2e, goodput)
	}
}
