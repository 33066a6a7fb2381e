package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/llm"
)

// TestSweepRuleFindsKnee applies the sweep's rule to levels of known
// figures: the knee schedule of sweep_test.go (four slots, 100 ms to the
// first token, a queued request's first token at 235 ms or later) as a
// mock would serve it, without the clock. Levels up to the slots pass, the
// level past them breaks on its P99 and its goodput, and the saturation
// point is the highest level that passed. The timed run of the same
// schedule is BenchmarkSweepKnee.
func TestSweepRuleFindsKnee(t *testing.T) {
	cfg := Config{BaseURL: "http://127.0.0.1:1", Dialect: llm.DialectOpenAI, Model: "m", Requests: 24,
		SLO: llm.SLOTargets{TTFT: 170 * time.Millisecond}}
	// level builds the level of concurrency c: queued of its 24 requests
	// wait for a slot (TTFT 240 ms), the others start at once (105 ms).
	level := func(c, queued int) SweepLevel {
		samples := make([]Sample, cfg.Requests)
		for i := range samples {
			ttft := 105.0
			if i < queued {
				ttft = 240
			}
			samples[i] = sample(ttft, 5, ttft+35, 8)
		}
		c0 := cfg
		c0.Concurrency = c
		return sweepLevel(c, newResult(c0, time.Unix(1000, 0), time.Second, samples), cfg, DefaultSweepTarget)
	}
	sr := &SweepResult{Target: DefaultSweepTarget, SLOTTFTMs: 170}
	for _, lv := range []SweepLevel{level(1, 0), level(2, 0), level(4, 0), level(8, 20)} {
		sr.add(lv)
	}
	for i, want := range []bool{true, true, true, false} {
		if l := sr.Levels[i]; l.Pass != want || l.Requests != 24 || l.Succeeded != 24 {
			t.Errorf("level %d: pass %v (%q), %d of %d; want pass %v, 24 of 24", l.Concurrency, l.Pass, l.Broke,
				l.Succeeded, l.Requests, want)
		}
	}
	if top := sr.Levels[3]; top.Broke != "goodput,ttft_p99" || top.TTFTP99 != 240 {
		t.Errorf("level 8 broke %q with P99 %.2f; want goodput,ttft_p99 at 240", top.Broke, top.TTFTP99)
	}
	if sr.Saturation != 4 || sr.FirstBreak != 8 {
		t.Errorf("saturation %d, first break %d; want 4 and 8", sr.Saturation, sr.FirstBreak)
	}
	var b strings.Builder
	if err := sr.WriteTable(&b); err != nil || !strings.Contains(b.String(), "saturation: concurrency 4 (first break at 8)") {
		t.Errorf("table (%v):\n%s", err, b.String())
	}

	// One slow first request at concurrency 1 (a cold connection on a busy
	// machine) breaks that level alone: saturation is still the highest
	// level that passed, and the first break is reported as it was.
	sr = &SweepResult{Target: DefaultSweepTarget}
	for _, lv := range []SweepLevel{level(1, 1), level(2, 0), level(4, 0), level(8, 20)} {
		sr.add(lv)
	}
	if sr.Saturation != 4 || sr.FirstBreak != 1 {
		t.Errorf("with a slow first request: saturation %d, first break %d; want 4 and 1", sr.Saturation, sr.FirstBreak)
	}
}
