package bench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tollgate-llm/tollgate/bench"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// runTimeout bounds every run; it is a deadlock guard, not a timing assertion.
const runTimeout = 20 * time.Second

// The schedule of the timing tests: mockllm writes token k at
// t0 + ttft + k·itl with no jitter, and t0 (the request's arrival at the
// mock) is after the client's start.
const (
	schedTTFT   = 50 * time.Millisecond
	schedITL    = 5 * time.Millisecond
	schedTokens = 20
	// schedLast is the earliest the last token can be read after the start.
	schedLast = schedTTFT + (schedTokens-1)*schedITL
)

const testKey = "sk-bench-test-secret-4242"

// startMock serves a mock on loopback for the test's lifetime.
func startMock(t testing.TB, opts mockllm.Options) (*mockllm.Server, *httptest.Server) {
	t.Helper()
	m := mockllm.New(opts)
	ts := httptest.NewServer(m)
	t.Cleanup(ts.Close)
	return m, ts
}

func runCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), runTimeout)
	t.Cleanup(cancel)
	return ctx
}

func msDur(v float64) time.Duration { return time.Duration(math.Round(v * float64(time.Millisecond))) }

func TestScheduleFigures(t *testing.T) {
	for _, d := range []llm.Dialect{llm.DialectOpenAI, llm.DialectAnthropic, llm.DialectResponses} {
		t.Run(d.String(), func(t *testing.T) {
			m, ts := startMock(t, mockllm.Options{TTFT: schedTTFT, ITL: schedITL,
				OutputTokens: schedTokens, RequireKey: testKey})
			const n = 40
			res, err := bench.Run(runCtx(t), bench.Config{
				BaseURL: ts.URL, Dialect: d, Model: "mock-1", APIKey: testKey,
				Requests: n, Concurrency: 4, MaxTokens: 64,
			})
			if err != nil {
				t.Fatal(err)
			}
			all := res.Summary(bench.ClassAll)
			if all == nil || all.Requests != n || all.Succeeded != n || all.Errors.Total() != 0 {
				t.Fatalf("all = %+v, want %d successes", all, n)
			}
			if got := m.Stats().Requests; got != n {
				t.Errorf("mock saw %d requests, want %d", got, n)
			}
			if peak := m.Stats().PeakInFlight; peak > 4 {
				t.Errorf("peak in flight %d, over the concurrency 4", peak)
			}
			classes := 0
			for _, c := range []string{bench.ClassShort, bench.ClassMedium, bench.ClassLong} {
				if s := res.Summary(c); s != nil {
					classes += s.Requests
				}
			}
			if classes != n {
				t.Errorf("classes hold %d requests, want %d", classes, n)
			}

			for _, s := range res.Samples {
				if s.OutputTokens != schedTokens || s.Estimated || s.TokenEvents != schedTokens {
					t.Errorf("sample %d: output %d (estimated %v), %d events; want %d reported",
						s.Index, s.OutputTokens, s.Estimated, s.TokenEvents, schedTokens)
				}
				if len(s.ITL) != schedTokens-1 || !s.HasTPOT {
					t.Errorf("sample %d: %d gaps, TPOT %v; want %d gaps and a TPOT", s.Index, len(s.ITL), s.HasTPOT, schedTokens-1)
				}
				// Lower bounds from the schedule, for every request.
				if s.TTFT < schedTTFT {
					t.Errorf("sample %d: TTFT %v before the schedule's %v", s.Index, s.TTFT, schedTTFT)
				}
				if last := s.TTFT + (schedTokens-1)*s.TPOT; last < schedLast-(schedTokens-1) {
					// TPOT is rounded down to the nanosecond: allow 19 ns.
					t.Errorf("sample %d: last token at %v, before the schedule's %v", s.Index, last, schedLast)
				}
				if s.E2E < schedLast {
					t.Errorf("sample %d: E2E %v before the schedule's last token %v", s.Index, s.E2E, schedLast)
				}
				// The gaps add up to last − first = 19·TPOT (to rounding).
				var sum time.Duration
				for _, g := range s.ITL {
					sum += g
				}
				if diff := sum - (schedTokens-1)*s.TPOT; diff < 0 || diff >= schedTokens-1 {
					t.Errorf("sample %d: ITL sum %v, 19·TPOT %v", s.Index, sum, (schedTokens-1)*s.TPOT)
				}
			}

			if all.ITL.Count != n*(schedTokens-1) || all.TTFT.Count != n || all.TPOT.Count != n || all.E2E.Count != n {
				t.Errorf("counts TTFT %d TPOT %d ITL %d E2E %d, want %d, %d, %d, %d",
					all.TTFT.Count, all.TPOT.Count, all.ITL.Count, all.E2E.Count, n, n, n*(schedTokens-1), n)
			}
			if all.OutputTokens != n*schedTokens || all.EstimatedOutput != 0 {
				t.Errorf("output tokens %d (%d estimated), want %d", all.OutputTokens, all.EstimatedOutput, n*schedTokens)
			}
			if all.InputTokens <= 0 {
				t.Errorf("input tokens %d, want the usage's", all.InputTokens)
			}
			// How close the figures come to the schedule depends on how idle
			// the machine is: BenchmarkScheduleFigures measures it. Here,
			// the bounds no load can break (every sample's, above).
			t.Logf("TTFT %+v; TPOT %+v; ITL %+v; E2E %+v", all.TTFT, all.TPOT, all.ITL, all.E2E)
			if med := msDur(all.TTFT.Median); med < schedTTFT {
				t.Errorf("median TTFT %v, before the schedule's %v", med, schedTTFT)
			}
			if !(all.TTFT.Median <= all.TTFT.P95 && all.TTFT.P95 <= all.TTFT.P99) {
				t.Errorf("TTFT percentiles out of order: %+v", all.TTFT)
			}
			// Every request succeeded and no SLO is set: all are good.
			if all.Goodput.Good != n || all.Goodput.Ratio != 1 {
				t.Errorf("goodput %+v, want all %d good", all.Goodput, n)
			}
			if all.OutputTokensPerSecond <= 0 || all.RequestsPerSecond <= 0 {
				t.Errorf("throughput %v tok/s, %v req/s", all.OutputTokensPerSecond, all.RequestsPerSecond)
			}

			checkWire(t, m, d)
			checkReports(t, res)
		})
	}
}

// checkWire checks what the mock received: a streamed request in the
// dialect, with the key where the dialect wants it.
func checkWire(t *testing.T, m *mockllm.Server, d llm.Dialect) {
	t.Helper()
	reqs := m.Requests()
	if len(reqs) == 0 {
		t.Fatal("mock recorded no request")
	}
	r := reqs[0]
	var body map[string]any
	if err := json.Unmarshal(r.Body, &body); err != nil {
		t.Fatalf("request body: %v", err)
	}
	if body["stream"] != true || body["model"] != "mock-1" {
		t.Errorf("body stream %v model %v", body["stream"], body["model"])
	}
	switch d {
	case llm.DialectOpenAI:
		if r.Path != "/v1/chat/completions" || r.Header.Get("Authorization") != "Bearer "+testKey {
			t.Errorf("path %q, authorization %q", r.Path, r.Header.Get("Authorization"))
		}
		so, _ := body["stream_options"].(map[string]any)
		if so["include_usage"] != true || body["max_completion_tokens"] != 64.0 {
			t.Errorf("stream_options %v, max_completion_tokens %v", body["stream_options"], body["max_completion_tokens"])
		}
	case llm.DialectAnthropic:
		if r.Path != "/v1/messages" || r.Header.Get("x-api-key") != testKey ||
			r.Header.Get("anthropic-version") != "2023-06-01" || r.Header.Get("Authorization") != "" {
			t.Errorf("path %q, headers %v", r.Path, r.Header)
		}
		if body["max_tokens"] != 64.0 {
			t.Errorf("max_tokens %v", body["max_tokens"])
		}
	}
}

// checkReports checks that both reports carry the figures and not the key.
func checkReports(t *testing.T, res *bench.Result) {
	t.Helper()
	var tb, jb bytes.Buffer
	if err := res.WriteTable(&tb); err != nil {
		t.Fatal(err)
	}
	if err := res.WriteJSON(&jb); err != nil {
		t.Fatal(err)
	}
	for name, out := range map[string]string{"table": tb.String(), "json": jb.String()} {
		if strings.Contains(out, testKey) {
			t.Errorf("%s output contains the API key", name)
		}
	}
	table := tb.String()
	all := res.Summary(bench.ClassAll)
	for _, want := range []string{"TTFT median ms", "TPOT P99 ms", "ITL mean ms", "E2E P95 ms", "goodput", "all",
		strconv.FormatFloat(all.TTFT.Median, 'f', 2, 64), strconv.FormatFloat(all.ITL.P99, 'f', 2, 64)} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}

	var doc struct {
		Run struct {
			Requests int    `json:"requests"`
			Dialect  string `json:"dialect"`
		} `json:"run"`
		Summaries []bench.Summary `json:"summaries"`
		Samples   []struct {
			TTFTMs float64   `json:"ttft_ms"`
			ITLMs  []float64 `json:"itl_ms"`
			Output int64     `json:"output_tokens"`
		} `json:"samples"`
	}
	if err := json.Unmarshal(jb.Bytes(), &doc); err != nil {
		t.Fatalf("JSON report: %v", err)
	}
	if doc.Run.Requests != res.Info.Requests || doc.Run.Dialect != res.Info.Dialect {
		t.Errorf("JSON run %+v", doc.Run)
	}
	if len(doc.Summaries) != len(res.Summaries) || len(doc.Samples) != len(res.Samples) {
		t.Fatalf("JSON has %d summaries, %d samples; want %d, %d",
			len(doc.Summaries), len(doc.Samples), len(res.Summaries), len(res.Samples))
	}
	last := doc.Summaries[len(doc.Summaries)-1]
	if last.Class != bench.ClassAll || last.TTFT != all.TTFT || last.ITL.Count != all.ITL.Count {
		t.Errorf("JSON all summary %+v, want %+v", last, *all)
	}
	s0 := res.Samples[0]
	if got := doc.Samples[0]; msDur(got.TTFTMs) != s0.TTFT || len(got.ITLMs) != len(s0.ITL) || got.Output != s0.OutputTokens {
		t.Errorf("JSON sample 0 %+v, want TTFT %v, %d gaps", got, s0.TTFT, len(s0.ITL))
	}
}

func TestGoodputAgainstSchedule(t *testing.T) {
	_, ts := startMock(t, mockllm.Options{TTFT: schedTTFT, ITL: schedITL, OutputTokens: schedTokens})
	const n = 8
	cases := []struct {
		name string
		slo  llm.SLOTargets
		good int
		// broke counts per target, and the first target broken by all.
		ttft, tpot, e2e int
		first           llm.SLO
	}{
		// The run's own bound: every request that completes meets it,
		// however busy the machine.
		{"all pass", llm.SLOTargets{TTFT: runTimeout, TPOT: runTimeout, E2E: runTimeout}, n, 0, 0, 0, llm.SLOMet},
		// Under the schedule's lower bounds: no request can meet them.
		{"all fail", llm.SLOTargets{TTFT: schedTTFT - 10*time.Millisecond, E2E: schedLast - 10*time.Millisecond}, 0, n, 0, n, llm.SLOTTFT},
		{"e2e only", llm.SLOTargets{E2E: schedLast - 10*time.Millisecond}, 0, 0, 0, n, llm.SLOE2E},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, err := bench.Run(runCtx(t), bench.Config{BaseURL: ts.URL, Dialect: llm.DialectOpenAI,
				Model: "m", Requests: n, Concurrency: 4, SLO: c.slo})
			if err != nil {
				t.Fatal(err)
			}
			g := res.Summary(bench.ClassAll).Goodput
			if g.Good != c.good || g.BrokeTTFT != c.ttft || g.BrokeTPOT != c.tpot || g.BrokeE2E != c.e2e {
				t.Errorf("goodput %+v, want good %d, broke %d/%d/%d", g, c.good, c.ttft, c.tpot, c.e2e)
			}
			if want := float64(c.good) / n; g.Ratio != want {
				t.Errorf("ratio %v, want %v", g.Ratio, want)
			}
			for _, s := range res.Samples {
				if got := s.Goodput(c.slo); got != c.first {
					t.Errorf("sample %d: first broken %v, want %v", s.Index, got, c.first)
				}
			}
		})
	}
}

func TestRetries(t *testing.T) {
	t.Run("429 recovered", func(t *testing.T) {
		m, ts := startMock(t, mockllm.Options{OutputTokens: 4})
		if err := m.Inject("status=429;retry-after-ms=10", 3); err != nil {
			t.Fatal(err)
		}
		res, err := bench.Run(runCtx(t), bench.Config{BaseURL: ts.URL, Dialect: llm.DialectOpenAI,
			Model: "m", Requests: 4, Concurrency: 1})
		if err != nil {
			t.Fatal(err)
		}
		all := res.Summary(bench.ClassAll)
		if all.Succeeded != 4 || all.Errors.Total() != 0 {
			t.Fatalf("succeeded %d, errors %+v; want 4 and none", all.Succeeded, all.Errors)
		}
		if all.Retries != (bench.Retries{RateLimited: 3, Recovered: 1}) {
			t.Errorf("retries %+v, want 3 rate-limited, 1 recovered", all.Retries)
		}
		s := res.Samples[0]
		if s.Attempts != 4 || s.Retried429 != 3 || s.Status != 200 {
			t.Errorf("sample 0: %d attempts, %d retried 429s, status %d", s.Attempts, s.Retried429, s.Status)
		}
		// The hint is honoured: three waits of at least 10 ms.
		if s.RetryWait < 30*time.Millisecond {
			t.Errorf("retry wait %v, want at least 3×10 ms", s.RetryWait)
		}
		if got := m.Stats().Requests; got != 7 {
			t.Errorf("mock saw %d requests, want 4 + 3 retries", got)
		}
	})
	t.Run("429 exhausted", func(t *testing.T) {
		m, ts := startMock(t, mockllm.Options{OutputTokens: 4})
		if err := m.Inject("status=429;retry-after-ms=1", 4); err != nil {
			t.Fatal(err)
		}
		res, err := bench.Run(runCtx(t), bench.Config{BaseURL: ts.URL, Dialect: llm.DialectAnthropic,
			Model: "m", Requests: 2, Concurrency: 1})
		if err != nil {
			t.Fatal(err)
		}
		all := res.Summary(bench.ClassAll)
		if all.Errors.RateLimited != 1 || all.Errors.Total() != 1 || all.Succeeded != 1 {
			t.Errorf("errors %+v, succeeded %d; want one rate-limited failure", all.Errors, all.Succeeded)
		}
		if all.Retries != (bench.Retries{RateLimited: 3}) {
			t.Errorf("retries %+v, want 3 rate-limited", all.Retries)
		}
		s := res.Samples[0]
		if s.Err != bench.ErrRateLimited || s.Attempts != 4 || s.Status != 429 || s.ErrorType == "" {
			t.Errorf("sample 0: %+v", s)
		}
		// A failure gives no latency sample.
		if all.TTFT.Count != 1 || all.ITL.Count != 3 {
			t.Errorf("TTFT count %d, ITL count %d; want the success's only", all.TTFT.Count, all.ITL.Count)
		}
	})
	// A spent budget (tollgate's insufficient_quota, OpenAI's own) comes
	// as a 429 with x-should-retry: false; the SDKs do not retry it, and
	// neither does bench: retrying would only multiply the refusals.
	t.Run("429 that says not to retry", func(t *testing.T) {
		var calls atomic.Int32
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Should-Retry", "false")
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, `{"error":{"message":"budget spent","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`)
		}))
		defer ts.Close()
		res, err := bench.Run(runCtx(t), bench.Config{BaseURL: ts.URL, Dialect: llm.DialectOpenAI,
			Model: "m", Requests: 3, Concurrency: 1})
		if err != nil {
			t.Fatal(err)
		}
		all := res.Summary(bench.ClassAll)
		if all.Errors.RateLimited != 3 || all.Retries != (bench.Retries{}) {
			t.Errorf("errors %+v, retries %+v; want 3 refusals and no retry", all.Errors, all.Retries)
		}
		if got := calls.Load(); got != 3 {
			t.Errorf("the server saw %d requests, want 3 (one each)", got)
		}
		if s := res.Samples[0]; s.Attempts != 1 || s.ErrorType != "insufficient_quota" {
			t.Errorf("sample 0: %d attempts, error type %q", s.Attempts, s.ErrorType)
		}
	})
	t.Run("5xx recovered", func(t *testing.T) {
		m, ts := startMock(t, mockllm.Options{OutputTokens: 4})
		if err := m.Inject("status=503;retry-after-ms=5", 2); err != nil {
			t.Fatal(err)
		}
		res, err := bench.Run(runCtx(t), bench.Config{BaseURL: ts.URL, Dialect: llm.DialectOpenAI,
			Model: "m", Requests: 1})
		if err != nil {
			t.Fatal(err)
		}
		all := res.Summary(bench.ClassAll)
		if all.Succeeded != 1 || all.Retries != (bench.Retries{ServerError: 2, Recovered: 1}) {
			t.Errorf("succeeded %d, retries %+v", all.Succeeded, all.Retries)
		}
	})
}

func TestErrorKinds(t *testing.T) {
	cases := []struct {
		name    string
		inject  string
		times   int
		timeout time.Duration
		check   func(e bench.Errors) bool
		kind    bench.ErrorKind
	}{
		{"400 not retried", "status=400", 1, 0, func(e bench.Errors) bool { return e.Status[400] == 1 }, bench.ErrStatus},
		{"500 after retries", "status=500;retry-after-ms=1", 4, 0, func(e bench.Errors) bool { return e.Status[500] == 1 }, bench.ErrStatus},
		{"error event", "error-event=3", 1, 0, func(e bench.Errors) bool { return e.StreamError == 1 }, bench.ErrStreamError},
		{"disconnect", "disconnect=3", 1, 0, func(e bench.Errors) bool { return e.Truncated == 1 }, bench.ErrTruncated},
		{"hang", "hang=2", 1, 300 * time.Millisecond, func(e bench.Errors) bool { return e.Timeout == 1 }, bench.ErrTimeout},
		{"stall", "stall=2000", 1, 300 * time.Millisecond, func(e bench.Errors) bool { return e.Timeout == 1 }, bench.ErrTimeout},
	}
	for _, c := range cases {
		for _, d := range []llm.Dialect{llm.DialectOpenAI, llm.DialectAnthropic} {
			t.Run(c.name+"/"+d.String(), func(t *testing.T) {
				m, ts := startMock(t, mockllm.Options{OutputTokens: 6})
				if err := m.Inject(c.inject, c.times); err != nil {
					t.Fatal(err)
				}
				res, err := bench.Run(runCtx(t), bench.Config{BaseURL: ts.URL, Dialect: d,
					Model: "m", Requests: 2, Concurrency: 1, Timeout: c.timeout})
				if err != nil {
					t.Fatal(err)
				}
				all := res.Summary(bench.ClassAll)
				if !c.check(all.Errors) || all.Errors.Total() != 1 || all.Succeeded != 1 {
					t.Errorf("errors %+v, succeeded %d", all.Errors, all.Succeeded)
				}
				if s := res.Samples[0]; s.Err != c.kind || s.OK() || s.Goodput(llm.SLOTargets{}) != llm.SLOFailed {
					t.Errorf("sample 0 error %q, want %q", s.Err, c.kind)
				}
				if s := res.Samples[1]; !s.OK() || s.OutputTokens != 6 {
					t.Errorf("sample 1 after the fault: %+v", s)
				}
			})
		}
	}
}

// TestUnauthorized: a 401 is its own error kind, never retried; after the
// third one the run sends no more requests, and a run with three 401s, or
// with nothing but 401s, fails even when every request was sent.
func TestUnauthorized(t *testing.T) {
	t.Run("counted apart", func(t *testing.T) {
		_, ts := startMock(t, mockllm.Options{RequireKey: testKey})
		res, err := bench.Run(runCtx(t), bench.Config{BaseURL: ts.URL, Dialect: llm.DialectOpenAI,
			Model: "m", Requests: 3, Concurrency: 3, APIKey: "sk-wrong"})
		var ue *bench.UnauthorizedError
		if !errors.As(err, &ue) || *ue != (bench.UnauthorizedError{Answers: 3, Sent: 3, Requests: 3}) {
			t.Fatalf("error %v, want an *UnauthorizedError for 3 of 3 sent, all 401", err)
		}
		all := res.Summary(bench.ClassAll)
		if all.Errors.Unauthorized != 3 || len(all.Errors.Status) != 0 || all.Retries != (bench.Retries{}) {
			t.Errorf("errors %+v, retries %+v; want three 401s, not retried", all.Errors, all.Retries)
		}
		if s := res.Samples[0]; s.Err != bench.ErrUnauthorized || s.Status != 401 || s.Attempts != 1 {
			t.Errorf("sample 0: %+v", s)
		}
		var tb strings.Builder
		if err := res.WriteTable(&tb); err != nil || !strings.Contains(tb.String(), "401:3") {
			t.Errorf("table (%v) does not list 401:3:\n%s", err, tb.String())
		}
	})
	t.Run("fewer than three", func(t *testing.T) {
		for _, c := range []struct {
			requests, refused int
			fail              bool
		}{
			{2, 2, true},  // every request sent got a 401
			{1, 1, true},  // the same, with one request
			{4, 2, false}, // two succeeded: the key works
		} {
			m, ts := startMock(t, mockllm.Options{OutputTokens: 2})
			if err := m.Inject("status=401", c.refused); err != nil {
				t.Fatal(err)
			}
			res, err := bench.Run(runCtx(t), bench.Config{BaseURL: ts.URL, Dialect: llm.DialectOpenAI,
				Model: "m", Requests: c.requests, Concurrency: 1})
			var ue *bench.UnauthorizedError
			if got := errors.As(err, &ue); got != c.fail || err != nil && !got {
				t.Errorf("%d of %d answered 401: error %v, want an *UnauthorizedError: %v", c.refused, c.requests, err, c.fail)
			} else if got && *ue != (bench.UnauthorizedError{Answers: c.refused, Sent: c.requests, Requests: c.requests}) {
				t.Errorf("%d of %d answered 401: %+v", c.refused, c.requests, *ue)
			}
			if len(res.Samples) != c.requests || res.Summary(bench.ClassAll).Errors.Unauthorized != c.refused {
				t.Errorf("%d samples, errors %+v; want %d, %d unauthorized", len(res.Samples),
					res.Summary(bench.ClassAll).Errors, c.requests, c.refused)
			}
		}
	})
	for _, c := range []struct {
		name        string
		concurrency int
		rate        float64
		maxSent     int
	}{
		// At fixed concurrency c, when the third 401 comes back at most
		// c−1 other requests are in flight.
		{"fixed concurrency", 2, 0, 3 + 2 - 1},
		// Poisson arrivals 200 ms apart on average, against answers that
		// take a millisecond: the wait for the next arrival is cut short.
		{"poisson", 0, 5, 19},
	} {
		t.Run("stops/"+c.name, func(t *testing.T) {
			m, ts := startMock(t, mockllm.Options{RequireKey: testKey})
			const n = 20
			res, err := bench.Run(runCtx(t), bench.Config{BaseURL: ts.URL, Dialect: llm.DialectAnthropic,
				Model: "m", Requests: n, Concurrency: c.concurrency, Rate: c.rate, Seed: 3})
			var ue *bench.UnauthorizedError
			if !errors.As(err, &ue) {
				t.Fatalf("error %v, want an *UnauthorizedError", err)
			}
			got := int(m.Stats().Requests)
			if ue.Sent != got || ue.Requests != n || ue.Answers != got || len(res.Samples) != got {
				t.Errorf("error %+v, %d samples; the mock saw %d requests, all 401", ue, len(res.Samples), got)
			}
			if got < 3 || got > c.maxSent {
				t.Errorf("%d requests sent, want 3 to %d", got, c.maxSent)
			}
			if all := res.Summary(bench.ClassAll); all.Errors.Unauthorized != got {
				t.Errorf("errors %+v, want %d unauthorized", all.Errors, got)
			}
			if msg := err.Error(); !strings.Contains(msg, "401 Unauthorized") || strings.Contains(msg, testKey) {
				t.Errorf("message %q", msg)
			}
		})
	}
}

func TestConnectError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	res, err := bench.Run(runCtx(t), bench.Config{BaseURL: "http://" + addr, Dialect: llm.DialectOpenAI,
		Model: "m", Requests: 2})
	if err != nil {
		t.Fatal(err)
	}
	if e := res.Summary(bench.ClassAll).Errors; e.Connect != 2 {
		t.Errorf("errors %+v, want 2 connection failures", e)
	}
}

func TestPoisson(t *testing.T) {
	m, ts := startMock(t, mockllm.Options{TTFT: 20 * time.Millisecond, ITL: 2 * time.Millisecond, OutputTokens: 10})
	const n, limit = 30, 3
	// 200 requests/s against ~40 ms requests: about 8 would be in flight
	// without the cap, so the cap is what bounds them.
	res, err := bench.Run(runCtx(t), bench.Config{BaseURL: ts.URL, Dialect: llm.DialectOpenAI,
		Model: "m", Requests: n, Concurrency: limit, Rate: 200, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	st := m.Stats()
	if st.Requests != n || len(res.Samples) != n || res.Summary(bench.ClassAll).Succeeded != n {
		t.Errorf("mock saw %d requests, %d samples; want %d", st.Requests, len(res.Samples), n)
	}
	if st.PeakInFlight > limit {
		t.Errorf("peak in flight %d, over the cap %d", st.PeakInFlight, limit)
	}
	// (The order of the samples' start stamps is not checked: requests
	// dispatched together stamp their start in their own goroutines, in
	// whatever order the scheduler runs them.)
	queued := 0
	for _, s := range res.Samples {
		if s.QueueWait > 0 {
			queued++
		}
	}
	// With seed 7 the 30th arrival is at 135 ms, and a request takes at
	// least 20 + 9·2 = 38 ms, so three slots serve at most 3·135/38 < 11
	// requests by then: by the schedule's lower bounds, some must queue.
	if queued == 0 {
		t.Error("no request waited for a slot")
	}

	t.Run("uncapped", func(t *testing.T) {
		m, ts := startMock(t, mockllm.Options{OutputTokens: 2})
		res, err := bench.Run(runCtx(t), bench.Config{BaseURL: ts.URL, Dialect: llm.DialectOpenAI,
			Model: "m", Requests: 10, Rate: 100})
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Stats().Requests; got != 10 || res.Info.Concurrency != 10 {
			t.Errorf("mock saw %d, concurrency %d; want 10, 10", got, res.Info.Concurrency)
		}
	})
}

func TestCancel(t *testing.T) {
	m, ts := startMock(t, mockllm.Options{TTFT: 5 * time.Second})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		// Cancel once both slots are taken and waiting on the mock.
		_, _ = m.WaitStats(ctx, func(s mockllm.Stats) bool { return s.InFlight == 2 })
		cancel()
	}()
	res, err := bench.Run(ctx, bench.Config{BaseURL: ts.URL, Dialect: llm.DialectOpenAI,
		Model: "m", Requests: 10, Concurrency: 2})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	if res == nil || len(res.Samples) != 2 || res.Summary(bench.ClassAll).Errors.Canceled != 2 {
		t.Fatalf("result %+v, want the two requests sent, cancelled", res)
	}
	if err := m.WaitCanceled(runCtx(t), 2); err != nil {
		t.Errorf("the mock did not see both requests go: %v", err)
	}
}

func TestProgress(t *testing.T) {
	_, ts := startMock(t, mockllm.Options{TTFT: 30 * time.Millisecond, OutputTokens: 2})
	var buf bytes.Buffer
	_, err := bench.Run(runCtx(t), bench.Config{BaseURL: ts.URL, Dialect: llm.DialectOpenAI,
		Model: "m", Requests: 10, Concurrency: 2, Progress: &buf})
	if err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if !strings.HasSuffix(out, "\n") || strings.Count(out, "\n") != 1 {
		t.Fatalf("progress %q: want one line, ended once", out)
	}
	redraws := strings.Split(out, "\r")
	if last := redraws[len(redraws)-1]; !strings.Contains(last, " 10/10 ") || !strings.Contains(last, "errors 0") {
		t.Errorf("last redraw %q, want 10/10 and no errors", last)
	}
}

func TestConfigErrors(t *testing.T) {
	ok := bench.Config{BaseURL: "http://127.0.0.1:1", Dialect: llm.DialectOpenAI, Model: "m", Requests: 1}
	cases := []struct {
		name string
		edit func(c *bench.Config)
		want string
	}{
		{"dialect", func(c *bench.Config) { c.Dialect = llm.DialectNone }, "dialect"},
		{"url scheme", func(c *bench.Config) { c.BaseURL = "ftp://x" }, "base URL"},
		{"url", func(c *bench.Config) { c.BaseURL = "http://[::1" }, "base URL"},
		{"model", func(c *bench.Config) { c.Model = "" }, "model"},
		{"requests", func(c *bench.Config) { c.Requests = 0 }, "requests"},
		{"rate", func(c *bench.Config) { c.Rate = -1 }, "rate"},
		{"timeout", func(c *bench.Config) { c.Timeout = -1 }, "timeout"},
		{"turns", func(c *bench.Config) { c.Turns = -1 }, "turns"},
		{"turns with rate", func(c *bench.Config) { c.Turns, c.Rate = 2, 1 }, "rate with turns"},
		{"conversation header", func(c *bench.Config) { c.Turns, c.ConversationHeader = 2, "X Bad:" }, "conversation header"},
		{"conversation header clash", func(c *bench.Config) { c.Turns, c.ConversationHeader = 2, "authorization" }, "sends that header itself"},
		{"empty prompts", func(c *bench.Config) { c.Prompts = bench.PromptSet{} }, "prompt"},
		{"prompt class", func(c *bench.Config) {
			c.Prompts = bench.PromptSet{{Class: "huge", Messages: []bench.Message{{Role: "user", Content: "x"}}}}
		}, "class"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := ok
			c.edit(&cfg)
			res, err := bench.Run(t.Context(), cfg)
			if err == nil || res != nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "bench: ") {
				t.Errorf("err %v, result %v; want an error about %q", err, res, c.want)
			}
		})
	}
}

// TestBaseURLForms checks that the SDKs' ".../v1" form and a trailing slash
// reach the same route.
func TestBaseURLForms(t *testing.T) {
	m, ts := startMock(t, mockllm.Options{OutputTokens: 2})
	for _, base := range []string{ts.URL, ts.URL + "/", ts.URL + "/v1", ts.URL + "/v1/"} {
		res, err := bench.Run(runCtx(t), bench.Config{BaseURL: base, Dialect: llm.DialectAnthropic, Model: "m", Requests: 1})
		if err != nil {
			t.Fatal(err)
		}
		if !res.Samples[0].OK() {
			t.Errorf("base %q: %+v", base, res.Samples[0])
		}
	}
	paths := make([]string, 0, 4)
	for _, r := range m.Requests() {
		paths = append(paths, r.Path)
	}
	if !slices.Equal(paths, []string{"/v1/messages", "/v1/messages", "/v1/messages", "/v1/messages"}) {
		t.Errorf("paths %v", paths)
	}
}

// TestOddAnswers covers answers mockllm does not give, from a small real
// server on loopback: a 200 that is not a stream, a complete stream without
// a token, and a retry hint longer than the attempt timeout.
func TestOddAnswers(t *testing.T) {
	cases := []struct {
		name    string
		handler http.HandlerFunc
		kind    bench.ErrorKind
	}{
		{"json 200", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}]}`)
		}, bench.ErrProtocol},
		{"no token", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
			_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\ndata: [DONE]\n\n")
		}, bench.ErrNoTokens},
		{"long hint", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Retry-After", "60")
			w.WriteHeader(http.StatusTooManyRequests)
		}, bench.ErrRateLimited},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ts := httptest.NewServer(c.handler)
			t.Cleanup(ts.Close)
			res, err := bench.Run(runCtx(t), bench.Config{BaseURL: ts.URL, Dialect: llm.DialectOpenAI,
				Model: "m", Requests: 1, Timeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			s := res.Samples[0]
			if s.Err != c.kind || s.Attempts != 1 || res.Summary(bench.ClassAll).Errors.Total() != 1 {
				t.Errorf("sample %+v, want one attempt failing with %q", s, c.kind)
			}
		})
	}
}
