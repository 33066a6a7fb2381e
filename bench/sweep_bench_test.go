package bench_test

import (
	"testing"

	"github.com/tollgate-llm/tollgate/bench"
	"github.com/tollgate-llm/tollgate/mockllm"
)

// BenchmarkSweepKnee times the knee schedule of sweep_test.go: on an idle
// machine the sweep finds saturation at 4 (the mock's slots) and the first
// break at 8, reported as the metrics saturation and first_break. A busy
// machine can push an unqueued first token past the 170 ms SLO (240 ms was
// seen beside a CPU hog), which is why this is a benchmark and not a test.
//
//	go test -run '^$' -bench SweepKnee -benchtime 1x ./bench/
func BenchmarkSweepKnee(b *testing.B) {
	_, ts := startMock(b, mockllm.Options{TTFT: kneeTTFT, ITL: kneeITL, OutputTokens: kneeTokens, MaxConcurrent: kneeSlots})
	var sr *bench.SweepResult
	for b.Loop() {
		var err error
		if sr, err = bench.Sweep(b.Context(), kneeConfig(ts.URL), []int{1, 2, 4, 8}, bench.SweepOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(sr.Saturation), "saturation")
	b.ReportMetric(float64(sr.FirstBreak), "first_break")
}
