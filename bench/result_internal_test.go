package bench

import (
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/llm"
)

func TestPercentile(t *testing.T) {
	// Expected values are numpy.percentile's (method="linear").
	cases := []struct {
		in   []float64
		p    float64
		want float64
	}{
		{[]float64{1, 2, 3, 4}, 50, 2.5},
		{[]float64{1, 2, 3, 4}, 95, 3.85},
		{[]float64{1, 2, 3, 4}, 99, 3.97},
		{[]float64{7}, 99, 7},
		{[]float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 95, 9.55},
		{[]float64{0, 10}, 0, 0},
		{[]float64{0, 10}, 100, 10},
		{nil, 50, 0},
	}
	for _, c := range cases {
		if got := percentile(c.in, c.p); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("percentile(%v, %v) = %v, want %v", c.in, c.p, got, c.want)
		}
	}
	st := stats([]float64{4, 1, 3, 2})
	if math.Abs(st.P95-3.85) > 1e-9 || math.Abs(st.P99-3.97) > 1e-9 || st.Median != 2.5 || st.Mean != 2.5 || st.Count != 4 {
		t.Errorf("stats = %+v", st)
	}
}

// sample returns a successful sample with the given figures in ms.
func sample(ttft, tpot, e2e float64, tokens int64) Sample {
	return Sample{Class: ClassShort, Attempts: 1, Status: 200,
		TTFT: msd(ttft), TPOT: msd(tpot), HasTPOT: tokens >= 2, E2E: msd(e2e), OutputTokens: tokens}
}

func msd(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

// record builds the llm.Record the gateway would hold for s, so that
// Sample.Goodput can be checked against llm.SLOTargets.Classify.
func record(s *Sample) *llm.Record {
	t0 := time.Unix(1000, 0)
	r := &llm.Record{Stream: true, Outcome: llm.OutcomeOK, Usage: llm.Usage{Output: s.OutputTokens}}
	if !s.OK() {
		r.Outcome = llm.OutcomeUpstreamError
	}
	r.Timing.In = t0
	r.Timing.FirstToken = t0.Add(s.TTFT)
	r.Timing.FirstTokenOut = r.Timing.FirstToken
	r.Timing.LastToken = r.Timing.FirstToken.Add(s.TPOT * time.Duration(max(s.OutputTokens-1, 0)))
	r.Timing.End = t0.Add(s.E2E)
	return r
}

func TestGoodputMixed(t *testing.T) {
	slo := llm.SLOTargets{TTFT: 100 * time.Millisecond, TPOT: 10 * time.Millisecond, E2E: time.Second}
	samples := []Sample{
		sample(50, 5, 500, 20),    // good
		sample(100, 10, 1000, 20), // good: at the targets (inclusive)
		sample(150, 5, 500, 20),   // TTFT
		sample(50, 20, 500, 20),   // TPOT
		sample(50, 5, 1500, 20),   // E2E
		sample(150, 20, 1500, 20), // all three; first TTFT
		sample(50, 0, 2000, 1),    // one token: no TPOT; E2E
		{Class: ClassLong, Err: ErrTimeout, Attempts: 1, E2E: 3 * time.Second}, // failed
		{Class: ClassLong, Err: ErrStatus, Status: 503, Attempts: 4, Retried5xx: 3},
		sample(40, 40, 400, 20), // TPOT, in class long below
	}
	samples[len(samples)-1].Class = ClassLong
	want := []llm.SLO{llm.SLOMet, llm.SLOMet, llm.SLOTTFT, llm.SLOTPOT, llm.SLOE2E, llm.SLOTTFT,
		llm.SLOE2E, llm.SLOFailed, llm.SLOFailed, llm.SLOTPOT}
	for i := range samples {
		s := &samples[i]
		if got := s.Goodput(slo); got != want[i] {
			t.Errorf("sample %d: Goodput = %v, want %v", i, got, want[i])
		}
		if got := slo.Classify(record(s)); got != s.Goodput(slo) {
			t.Errorf("sample %d: Goodput %v, llm Classify %v: the two rules differ", i, s.Goodput(slo), got)
		}
	}

	sums := summarize(samples, slo, 2*time.Second)
	if len(sums) != 3 || sums[0].Class != ClassShort || sums[1].Class != ClassLong || sums[2].Class != ClassAll {
		t.Fatalf("summaries %+v", sums)
	}
	all := sums[2]
	wantG := Goodput{Good: 2, Ratio: 0.2, PerSecond: 1, BrokeTTFT: 2, BrokeTPOT: 3, BrokeE2E: 3}
	if all.Goodput != wantG {
		t.Errorf("goodput %+v, want %+v", all.Goodput, wantG)
	}
	if all.Requests != 10 || all.Succeeded != 8 || all.Failed != 2 || all.Errors.Timeout != 1 || all.Errors.Status[503] != 1 || all.Errors.Total() != 2 {
		t.Errorf("counts %+v", all)
	}
	if all.Retries != (Retries{ServerError: 3}) {
		t.Errorf("retries %+v", all.Retries)
	}
	if all.TPOT.Count != 7 || all.TTFT.Count != 8 || all.E2E.Count != 8 {
		t.Errorf("TPOT %d, TTFT %d, E2E %d values; want 7, 8, 8", all.TPOT.Count, all.TTFT.Count, all.E2E.Count)
	}
	if all.RequestsPerSecond != 4 || all.OutputTokensPerSecond != float64(7*20+1)/2 {
		t.Errorf("throughput %v req/s, %v tok/s", all.RequestsPerSecond, all.OutputTokensPerSecond)
	}
	long := sums[1]
	if long.Requests != 3 || long.Goodput.BrokeTPOT != 1 || long.Goodput.Good != 0 || long.Failed != 2 {
		t.Errorf("long %+v", long)
	}

	var b strings.Builder
	res := &Result{SLO: slo, Summaries: sums, Samples: samples, Duration: 2 * time.Second}
	if err := res.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"2 (20.0%)", "2/3/3", "503:1 timeout:1", "TTFT ≤ 100ms", "0/3"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

func TestArrivals(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const n, rate = 20000, 50.0
	at := arrivals(rng, rate, n)
	if at[0] != 0 {
		t.Errorf("first arrival %v, want 0", at[0])
	}
	var sum, sq float64
	for i := 1; i < n; i++ {
		gap := (at[i] - at[i-1]).Seconds()
		if gap < 0 {
			t.Fatalf("arrival %d before %d", i, i-1)
		}
		sum += gap
		sq += gap * gap
	}
	// Exponential gaps: mean 1/rate and standard deviation 1/rate. With
	// 20,000 draws the standard error of the mean is 0.7 %; the seed fixes
	// the draws, so the bounds cannot flake.
	mean := sum / (n - 1)
	sd := math.Sqrt(sq/(n-1) - mean*mean)
	if math.Abs(mean*rate-1) > 0.03 || math.Abs(sd*rate-1) > 0.05 {
		t.Errorf("gaps mean %v s, sd %v s; want both near %v s", mean, sd, 1/rate)
	}
	// Same seed, same arrivals.
	again := arrivals(rand.New(rand.NewPCG(1, 2)), rate, n)
	if again[n-1] != at[n-1] {
		t.Error("arrivals differ for one seed")
	}
}

func TestRetryWait(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	h := func(kv ...string) http.Header {
		out := http.Header{}
		for i := 0; i+1 < len(kv); i += 2 {
			out.Set(kv[i], kv[i+1])
		}
		return out
	}
	exact := []struct {
		name string
		h    http.Header
		want time.Duration
	}{
		{"ms first", h("retry-after-ms", "250", "Retry-After", "3"), 250 * time.Millisecond},
		{"seconds", h("Retry-After", "2"), 2 * time.Second},
		{"fractional seconds", h("Retry-After", "0.5"), 500 * time.Millisecond},
		{"bad ms falls to seconds", h("retry-after-ms", "soon", "Retry-After", "1"), time.Second},
		{"date", h("Retry-After", now.Add(3*time.Second).Format(http.TimeFormat)), 3 * time.Second},
		{"past date", h("Retry-After", now.Add(-time.Hour).Format(http.TimeFormat)), 0},
		{"huge saturates", h("Retry-After", "1e300"), math.MaxInt64},
	}
	for _, c := range exact {
		if got := retryWait(c.h, now, 0); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	// Without a usable hint: the SDKs' backoff, 0.5 s·2^n capped at 8 s,
	// less up to 25 %.
	for retry, base := range []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 8 * time.Second, 8 * time.Second} {
		for range 20 {
			got := retryWait(h("Retry-After", "-1"), now, retry)
			if got > base || got < base*3/4 {
				t.Errorf("retry %d: backoff %v, want within [%v, %v]", retry, got, base*3/4, base)
			}
		}
	}
}

func TestProgressLine(t *testing.T) {
	p := progress{total: 40}
	for range 10 {
		p.done(true)
	}
	p.done(false)
	got := p.line(1500 * time.Millisecond)
	want := "\rbench [########......................] 11/40  errors 1  1.5s "
	if got != want {
		t.Errorf("line %q, want %q", got, want)
	}
}

// TestEndpointErrorHidesCredentials: a base URL that does not parse is
// refused without repeating it, since it may carry user:password.
func TestEndpointErrorHidesCredentials(t *testing.T) {
	_, err := endpoint("http://user:s3cret@exa mple.com:80x/", llm.DialectOpenAI)
	if err == nil {
		t.Fatal("a malformed URL was accepted")
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("the error repeats the credentials: %v", err)
	}
}
