package llm

import (
	"testing"
	"time"
)

func TestFigures(t *testing.T) {
	t0 := time.Unix(0, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	r := Record{
		Stream: true,
		Timing: Timing{In: at(0), UpSent: at(2), FirstToken: at(100), FirstTokenOut: at(101), LastToken: at(190), End: at(200)},
		Usage:  Usage{Output: 10, HasOutput: true},
		// 3 events, 1 ms each between read and flush.
		RelayOverhead: 3 * time.Millisecond,
	}
	if got := r.TTFT(); got != 101*time.Millisecond {
		t.Errorf("TTFT = %v", got)
	}
	if got := r.UpstreamTTFT(); got != 98*time.Millisecond {
		t.Errorf("upstream TTFT = %v", got)
	}
	if got := r.E2E(); got != 200*time.Millisecond {
		t.Errorf("E2E = %v", got)
	}
	if got, ok := r.TPOT(); !ok || got != 10*time.Millisecond { // 90 ms over 9 gaps
		t.Errorf("TPOT = %v, %v", got, ok)
	}
	if got := r.Overhead(); got != 5*time.Millisecond {
		t.Errorf("overhead = %v", got)
	}
	r.Usage.Output = 1
	if _, ok := r.TPOT(); ok {
		t.Error("TPOT defined for one output token")
	}
	var empty Record
	if empty.TTFT() != 0 || empty.E2E() != 0 || empty.Overhead() != 0 {
		t.Error("missing moments give non-zero figures")
	}
}

func TestClassify(t *testing.T) {
	t0 := time.Unix(0, 0)
	mk := func(ttft, last, end time.Duration, out int64, o Outcome, stream bool) *Record {
		return &Record{Stream: stream, Outcome: o, Usage: Usage{Output: out},
			Timing: Timing{In: t0, FirstToken: t0.Add(ttft), FirstTokenOut: t0.Add(ttft), LastToken: t0.Add(last), End: t0.Add(end)}}
	}
	slo := SLOTargets{TTFT: 500 * time.Millisecond, TPOT: 50 * time.Millisecond, E2E: 2 * time.Second}
	tests := []struct {
		name string
		r    *Record
		want SLO
	}{
		{"met", mk(400*time.Millisecond, 900*time.Millisecond, time.Second, 11, OutcomeOK, true), SLOMet},
		{"ttft exactly at target is met", mk(500*time.Millisecond, 900*time.Millisecond, time.Second, 11, OutcomeOK, true), SLOMet},
		{"ttft broken first", mk(600*time.Millisecond, 5*time.Second, 9*time.Second, 11, OutcomeOK, true), SLOTTFT},
		{"tpot", mk(100*time.Millisecond, 1100*time.Millisecond, 1200*time.Millisecond, 11, OutcomeOK, true), SLOTPOT},
		{"e2e", mk(100*time.Millisecond, 200*time.Millisecond, 3*time.Second, 11, OutcomeOK, true), SLOE2E},
		{"failed", mk(100*time.Millisecond, 200*time.Millisecond, 300*time.Millisecond, 11, OutcomeUpstreamError, true), SLOFailed},
		{"non-streamed: only e2e", &Record{Outcome: OutcomeOK, Timing: Timing{In: t0, End: t0.Add(time.Second)}}, SLOMet},
		{"stream without a token: no ttft to judge", &Record{Stream: true, Outcome: OutcomeOK, Timing: Timing{In: t0, End: t0.Add(time.Second)}}, SLOMet},
	}
	for _, tc := range tests {
		if got := slo.Classify(tc.r); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
	if got := (SLOTargets{}).Classify(mk(time.Hour, 2*time.Hour, 3*time.Hour, 5, OutcomeOK, true)); got != SLOMet {
		t.Errorf("no targets: %s", got)
	}
}

func TestBuckets(t *testing.T) {
	b := NewBuckets([]int64{0, 500, 2000})
	for n, want := range map[int64]string{0: "0-500", 499: "0-500", 500: "500-2000", 1999: "500-2000", 2000: "2000+", 1 << 40: "2000+", -1: "unknown"} {
		if got := b.Label(n); got != want {
			t.Errorf("Label(%d) = %q, want %q", n, got, want)
		}
	}
	if got := b.Labels(); len(got) != 3 || got[2] != "2000+" {
		t.Errorf("Labels = %v", got)
	}
	if (Buckets{}).Label(5) != "unknown" {
		t.Error("empty buckets")
	}
}

func TestNames(t *testing.T) {
	for _, o := range Outcomes() {
		if o.String() == "unknown" || o.String() == "" {
			t.Errorf("outcome %d has no name", o)
		}
	}
	if d, ok := ParseDialect("anthropic"); !ok || d != DialectAnthropic || d.String() != "anthropic" {
		t.Error("ParseDialect(anthropic)")
	}
	if _, ok := ParseDialect("Anthropic"); ok {
		t.Error("dialect names are case-sensitive")
	}
	for i := InterruptUpstreamEOF; i <= InterruptShutdown; i++ {
		if i.String() == "" {
			t.Errorf("interruption %d has no name", i)
		}
	}
}
