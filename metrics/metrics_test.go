package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tollgate-llm/tollgate/config"
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
	for _, tc := range []struct{ in, want string }{
		{"gpt-4o", "gpt-4o"}, {"", "none"}, {"a", "a"}, {"b", "b"}, {"c", "other"}, {"a", "a"},
		{"gpt-4o", "gpt-4o"}, {"bad\nname", "other"}, {strings.Repeat("x", 200), "other"},
	} {
		if got := m.Model(tc.in); got != tc.want {
			t.Errorf("Model(%.20q) = %q, want %q", tc.in, got, tc.want)
		}
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
	m.Observe(rec, m.Model(rec.Model))
	want := `
# HELP tollgate_tokens_total Tokens by type (input, output, cache_read, cache_write, reasoning); estimated=true when counted from events because the upstream reported no usage.
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
