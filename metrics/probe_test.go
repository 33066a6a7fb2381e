package metrics

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tollgate-llm/tollgate/config"
)

// newProbeTest returns Metrics with the probe on for two targets of "mock".
func newProbeTest(t *testing.T, enabled bool) (*Metrics, *prometheus.Registry) {
	t.Helper()
	return newTest(t, func(c *config.Config) {
		c.Metrics.Labels = map[string]string{"env": "test"}
		c.Probe.Enabled = enabled
		c.Probe.IntervalSeconds = 30
		c.Probe.Targets = []config.ProbeTarget{{Upstream: "mock", Model: "a"}, {Upstream: "mock", Model: "b"}}
	})
}

// probeFamilies are the probe's series names, as gathered.
var probeFamilies = []string{"tollgate_probe_requests_total", "tollgate_probe_ttft_seconds",
	"tollgate_probe_tpot_seconds", "tollgate_probe_e2e_seconds", "tollgate_probe_success_ratio",
	"tollgate_probe_last_round_timestamp_seconds", "tollgate_probe_interval_seconds"}

// TestProbeSeriesArePreCreated checks that every target's probe series
// exist before the first round, the gauges NaN (no alert threshold matches
// NaN) but for the interval, and that a disabled probe exports none.
func TestProbeSeriesArePreCreated(t *testing.T) {
	_, reg := newProbeTest(t, true)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "tollgate_probe_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			got[mf.GetName()]++
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["upstream"] != "mock" || (labels["model"] != "a" && labels["model"] != "b") || labels["env"] != "test" {
				t.Errorf("%s: labels %v", mf.GetName(), labels)
			}
			switch mf.GetName() {
			case "tollgate_probe_success_ratio", "tollgate_probe_last_round_timestamp_seconds":
				if v := m.GetGauge().GetValue(); !math.IsNaN(v) {
					t.Errorf("%s%v = %v before any round, want NaN", mf.GetName(), labels, v)
				}
			case "tollgate_probe_interval_seconds":
				if v := m.GetGauge().GetValue(); v != 30 {
					t.Errorf("%s = %v, want 30", mf.GetName(), v)
				}
			case "tollgate_probe_requests_total":
				if labels["result"] != "ok" || m.GetCounter().GetValue() != 0 {
					t.Errorf("%s%v = %v, want result ok at 0", mf.GetName(), labels, m.GetCounter().GetValue())
				}
			default:
				if c := m.GetHistogram().GetSampleCount(); c != 0 {
					t.Errorf("%s%v has %d samples before any round", mf.GetName(), labels, c)
				}
			}
		}
	}
	for _, name := range probeFamilies {
		if got[name] != 2 {
			t.Errorf("%s: %d series, want 2 (one per target)", name, got[name])
		}
	}

	_, off := newProbeTest(t, false)
	if n, err := testutil.GatherAndCount(off, probeFamilies...); err != nil || n != 0 {
		t.Errorf("probe off: %d probe series (%v), want none", n, err)
	}
}

// TestObserveProbe checks that every result is counted but only successes
// reach the latency histograms, and that a round sets its gauges.
func TestObserveProbe(t *testing.T) {
	m, reg := newProbeTest(t, true)
	m.ObserveProbe("mock", "a", ProbeSample{Result: "ok", TTFT: 120 * time.Millisecond, HasTTFT: true,
		TPOT: 9 * time.Millisecond, HasTPOT: true, E2E: 400 * time.Millisecond})
	m.ObserveProbe("mock", "a", ProbeSample{Result: "ok", E2E: 50 * time.Millisecond}) // no token
	m.ObserveProbe("mock", "a", ProbeSample{Result: "overloaded", TTFT: time.Millisecond, HasTTFT: true,
		E2E: 2 * time.Millisecond})
	m.ObserveProbe("mock", "a", ProbeSample{Result: "breaker_open"})
	want := `
# HELP tollgate_probe_requests_total Synthetic probe requests, by result: ok, or why one failed (an attempt result: rate_limited, overloaded, server_error, client_error, connect_error, connection_error, header_timeout, first_token_timeout, idle_timeout, error_event, stream_broken; the upstream's timeout (408, 504, its timeout_seconds); breaker_open, queue_full, queue_timeout when nothing was sent; auth_error when the upstream refused the probe's key (401, 403); probe_timeout when the probe's own timeout_seconds or its round ran out; internal_error when the gateway failed).
# TYPE tollgate_probe_requests_total counter
tollgate_probe_requests_total{env="test",model="a",result="breaker_open",upstream="mock"} 1
tollgate_probe_requests_total{env="test",model="a",result="ok",upstream="mock"} 2
tollgate_probe_requests_total{env="test",model="a",result="overloaded",upstream="mock"} 1
tollgate_probe_requests_total{env="test",model="b",result="ok",upstream="mock"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "tollgate_probe_requests_total"); err != nil {
		t.Error(err)
	}
	counts := map[string]uint64{}
	sums := map[string]float64{}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		for _, mm := range mf.GetMetric() {
			if h := mm.GetHistogram(); h != nil && strings.HasPrefix(mf.GetName(), "tollgate_probe_") {
				for _, l := range mm.GetLabel() {
					if l.GetName() == "model" && l.GetValue() == "a" {
						counts[mf.GetName()] = h.GetSampleCount()
						sums[mf.GetName()] = h.GetSampleSum()
					}
				}
			}
		}
	}
	for name, want := range map[string]uint64{"tollgate_probe_ttft_seconds": 1, "tollgate_probe_tpot_seconds": 1,
		"tollgate_probe_e2e_seconds": 2} {
		if counts[name] != want {
			t.Errorf("%s count %d, want %d (successes only)", name, counts[name], want)
		}
	}
	if s := sums["tollgate_probe_e2e_seconds"]; math.Abs(s-0.45) > 1e-9 {
		t.Errorf("E2E sum %v, want 0.45", s)
	}

	at := time.Unix(1700000000, 500_000_000)
	m.ProbeRound("mock", "a", 0.75, at)
	want = `
# HELP tollgate_probe_success_ratio Share of the requests of a target's last finished probe round that succeeded; NaN before the first round.
# TYPE tollgate_probe_success_ratio gauge
tollgate_probe_success_ratio{env="test",model="a",upstream="mock"} 0.75
tollgate_probe_success_ratio{env="test",model="b",upstream="mock"} NaN
# HELP tollgate_probe_last_round_timestamp_seconds Unix time at which a target's last probe round finished; NaN before the first round.
# TYPE tollgate_probe_last_round_timestamp_seconds gauge
tollgate_probe_last_round_timestamp_seconds{env="test",model="a",upstream="mock"} 1.7000000005e+09
tollgate_probe_last_round_timestamp_seconds{env="test",model="b",upstream="mock"} NaN
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"tollgate_probe_success_ratio", "tollgate_probe_last_round_timestamp_seconds"); err != nil {
		t.Error(err)
	}
}

// A probe target a reload removes is no longer probed: its gauges go, or
// the stalled-probe alert (time() - last_round > 3 * interval) would fire
// for it until a restart. A target the reload keeps keeps its figures.
func TestReconfigureRemovesTheSeriesOfADroppedProbeTarget(t *testing.T) {
	m, reg := newProbeTest(t, true)
	m.ProbeRound("mock", "a", 1, time.Now())
	m.ProbeRound("mock", "b", 1, time.Now())
	next := config.Default()
	next.Upstreams = []config.Upstream{{Name: "mock", BaseURL: "http://127.0.0.1:9"}}
	next.Probe.Enabled = true
	next.Probe.IntervalSeconds = 30
	next.Probe.Targets = []config.ProbeTarget{{Upstream: "mock", Model: "a"}} // "b" dropped
	m.Reconfigure(&next)
	for _, name := range []string{"tollgate_probe_last_round_timestamp_seconds", "tollgate_probe_interval_seconds", "tollgate_probe_success_ratio"} {
		if n, err := testutil.GatherAndCount(reg, name); err != nil || n != 1 {
			t.Errorf("%s: %d series after the reload dropped target mock/b (err %v), want 1 (mock/a only)", name, n, err)
		}
	}
	if v := testutil.ToFloat64(m.probeSuccess.WithLabelValues("mock", "a")); v != 1 {
		t.Errorf("the kept target's success ratio: %v, want its last round's 1", v)
	}
	next.Probe.Enabled = false
	m.Reconfigure(&next)
	if n, _ := testutil.GatherAndCount(reg, "tollgate_probe_last_round_timestamp_seconds"); n != 0 {
		t.Errorf("%d last-round series with the probe off, want 0", n)
	}
}
