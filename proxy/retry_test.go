package proxy

import (
	"bytes"
	"context"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/internal/retryhint"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
)

// retryJustBelowOne is the largest float64 below 1, the top of rnd's range.
var retryJustBelowOne = math.Nextafter(1, 0)

// defaultRetryPolicy is the policy of an [upstreams.retry] table left to
// its defaults (config.DefaultUpstream, where they are chosen and
// documented).
func defaultRetryPolicy() retryPolicy { return policyFrom(config.DefaultUpstream().Retry) }

// wait is waitWithin with the whole of p.maxWait remaining: exact for the
// first retry only.
func (p retryPolicy) wait(retry int, h http.Header, now time.Time, rnd func() float64) (time.Duration, bool) {
	return p.waitWithin(retry, h, now, p.maxWait, rnd)
}

func retryConstRnd(v float64) func() float64 { return func() float64 { return v } }

func TestBackoffScheduleGrowthAndCap(t *testing.T) {
	p := defaultRetryPolicy()
	// Upper bounds written out by hand: 250ms·2^retry, capped at 8s.
	caps := []struct {
		retry int
		cap   time.Duration
	}{
		{0, 250 * time.Millisecond},
		{1, 500 * time.Millisecond},
		{2, time.Second},
		{3, 2 * time.Second},
		{4, 4 * time.Second},
		{5, 8 * time.Second},
		{6, 8 * time.Second},
		{40, 8 * time.Second},
		{1000, 8 * time.Second},
		{1 << 40, 8 * time.Second},
		{math.MaxInt, 8 * time.Second},
		{-3, 250 * time.Millisecond}, // a negative count is treated as the first retry
	}
	for _, c := range caps {
		if got := p.backoffCap(c.retry); got != c.cap {
			t.Errorf("backoffCap(%d) = %v, want %v", c.retry, got, c.cap)
		}
		if got := p.backoff(c.retry, retryConstRnd(0)); got != 0 {
			t.Errorf("backoff(%d, rnd=0) = %v, want 0 (full jitter starts at 0)", c.retry, got)
		}
		if got := p.backoff(c.retry, retryConstRnd(0.5)); got != c.cap/2 {
			t.Errorf("backoff(%d, rnd=0.5) = %v, want %v", c.retry, got, c.cap/2)
		}
		top := p.backoff(c.retry, retryConstRnd(retryJustBelowOne))
		if top >= c.cap || top < c.cap-time.Microsecond {
			t.Errorf("backoff(%d, rnd→1) = %v, want just below %v", c.retry, top, c.cap)
		}
	}
}

func TestBackoffJitterBounds(t *testing.T) {
	p := defaultRetryPolicy()
	for retry := range 8 {
		hi := p.backoffCap(retry)
		prev := time.Duration(-1)
		// The delay is monotone in rnd and stays in [0, cap) over [0, 1).
		for i := range 1001 {
			r := float64(i) / 1000
			if i == 1000 {
				r = retryJustBelowOne
			}
			d := p.backoff(retry, retryConstRnd(r))
			if d < 0 || d >= hi {
				t.Fatalf("backoff(%d, %v) = %v, outside [0, %v)", retry, r, d, hi)
			}
			if d < prev {
				t.Fatalf("backoff(%d, %v) = %v < %v at a smaller rnd", retry, r, d, prev)
			}
			prev = d
		}
	}
}

func TestBackoffBadInputs(t *testing.T) {
	p := defaultRetryPolicy()
	cases := []struct {
		name  string
		p     retryPolicy
		retry int
		rnd   float64
		want  time.Duration
	}{
		{"rnd negative", p, 0, -0.5, 0},
		{"rnd NaN", p, 0, math.NaN(), 0},
		{"rnd one", p, 0, 1, 250*time.Millisecond - 1},
		{"rnd above one", p, 0, 7, 250*time.Millisecond - 1},
		{"rnd +Inf", p, 0, math.Inf(1), 250*time.Millisecond - 1},
		{"zero policy", retryPolicy{}, 3, 0.5, 0},
		{"base above max", retryPolicy{base: time.Minute, max: time.Second, multiplier: 2}, 0, 0.5, 500 * time.Millisecond},
		{"multiplier NaN", retryPolicy{base: time.Second, max: 4 * time.Second, multiplier: math.NaN()}, 1, 0.5, 2 * time.Second},
		{"multiplier one", retryPolicy{base: time.Second, max: 4 * time.Second, multiplier: 1}, 9, 0.5, 500 * time.Millisecond},
	}
	for _, c := range cases {
		if got := c.p.backoff(c.retry, retryConstRnd(c.rnd)); got != c.want {
			t.Errorf("%s: backoff(%d) = %v, want %v", c.name, c.retry, got, c.want)
		}
	}
	// A huge multiplier saturates instead of overflowing at any retry.
	big := retryPolicy{base: time.Second, max: time.Hour, multiplier: 1e300}
	for _, retry := range []int{1, 2, 1000} {
		if got := big.backoffCap(retry); got != time.Hour {
			t.Errorf("multiplier 1e300: backoffCap(%d) = %v, want 1h", retry, got)
		}
	}
}

func TestRetryWait(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	p := defaultRetryPolicy() // 3 attempts, budget 30s, max 8s
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i+1 < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	cases := []struct {
		name      string
		retry     int
		h         http.Header
		remaining time.Duration
		want      time.Duration
		wantOK    bool
	}{
		{"backoff first retry", 0, hdr(), 30 * time.Second, 125 * time.Millisecond, true},
		{"backoff second retry", 1, hdr(), 30 * time.Second, 250 * time.Millisecond, true},
		{"attempts spent", 2, hdr(), 30 * time.Second, 0, false},
		{"attempts spent with hint", 5, hdr("Retry-After", "1"), 30 * time.Second, 0, false},
		{"hint below max", 0, hdr("Retry-After", "5"), 30 * time.Second, 5 * time.Second, true},
		{"hint above max is honoured", 0, hdr("Retry-After", "20"), 30 * time.Second, 20 * time.Second, true},
		{"hint equal to budget", 0, hdr("Retry-After", "30"), 30 * time.Second, 30 * time.Second, true},
		{"hint above budget: no retry", 0, hdr("Retry-After", "31"), 30 * time.Second, 31 * time.Second, false},
		{"hint ms above budget: no retry", 0, hdr("Retry-After-Ms", "30001"), 30 * time.Second, 30001 * time.Millisecond, false},
		{"saturated hint: no retry", 0, hdr("Retry-After", "1e300"), 30 * time.Second, retryhint.Max, false},
		{"hint above what is left", 1, hdr("Retry-After", "2"), time.Second, 2 * time.Second, false},
		{"backoff above what is left", 1, hdr(), 100 * time.Millisecond, 250 * time.Millisecond, false},
		{"nothing left", 0, hdr(), -time.Second, 0, false},
		{"past date retries now", 0, hdr("Retry-After", "Sun, 01 Mar 2026 11:59:00 GMT"), 30 * time.Second, 0, true},
		{"garbage hint uses backoff", 0, hdr("Retry-After", "later"), 30 * time.Second, 125 * time.Millisecond, true},
	}
	for _, c := range cases {
		got, ok := p.waitWithin(c.retry, c.h, now, c.remaining, retryConstRnd(0.5))
		if got != c.want || ok != c.wantOK {
			t.Errorf("%s: waitWithin = %v, %v; want %v, %v", c.name, got, ok, c.want, c.wantOK)
		}
	}
	// wait is waitWithin with the whole budget.
	if got, ok := p.wait(0, hdr("Retry-After", "31"), now, retryConstRnd(0.5)); ok {
		t.Errorf("wait with a 31s hint and a 30s budget = %v, true; want no retry", got)
	}
	if got, ok := p.wait(0, hdr("Retry-After", "29"), now, retryConstRnd(0.5)); !ok || got != 29*time.Second {
		t.Errorf("wait with a 29s hint = %v, %v; want 29s, true", got, ok)
	}
	if got, ok := (retryPolicy{}).wait(0, hdr(), now, retryConstRnd(0.5)); ok {
		t.Errorf("zero policy wait = %v, true; want no retry", got)
	}
}

func TestRetryableStatus(t *testing.T) {
	p := defaultRetryPolicy()
	cases := []struct {
		status        int
		typ, code     string
		wantRetryable bool
	}{
		{429, "requests", "rate_limit_exceeded", true},
		{429, "tokens", "rate_limit_exceeded", true},
		{429, "rate_limit_error", "", true},
		{429, "insufficient_quota", "insufficient_quota", false},
		{429, "insufficient_quota", "", false}, // older OpenAI answers had code null
		{429, "", "insufficient_quota", false},
		{429, "insufficient_quota", "credit_balance_exhausted", false},
		{429, "insufficient_quota", "organization_spend_limit_exceeded", false},
		{429, "insufficient_quota", "project_spend_limit_exceeded", false},
		{429, "insufficient_quota", "organization_usage_limit_exceeded", false},
		{429, "", "credit_balance_exhausted", false},
		{500, "server_error", "", true},
		{500, "api_error", "", true},
		{502, "", "", true},
		{503, "server_error", "", true},
		{504, "timeout_error", "", true},
		{529, "overloaded_error", "", true},
		{408, "", "", true},
		{409, "", "", true},
		// In the status set but a type that cannot succeed on retry.
		{500, "billing_error", "", false},
		{503, "permission_error", "", false},
		{529, "authentication_error", "", false},
		{409, "invalid_request_error", "", false},
		// Not in the status set.
		{400, "invalid_request_error", "context_length_exceeded", false},
		{401, "authentication_error", "", false},
		{401, "invalid_request_error", "invalid_api_key", false},
		{402, "billing_error", "", false},
		{403, "permission_error", "", false},
		{404, "not_found_error", "", false},
		{413, "request_too_large", "", false},
		{501, "", "", false},
		{200, "", "", false},
		{0, "", "", false},
	}
	for _, c := range cases {
		if got := retryableStatus(p, c.status, c.typ, c.code); got != c.wantRetryable {
			t.Errorf("retryableStatus(%d, %q, %q) = %v, want %v", c.status, c.typ, c.code, got, c.wantRetryable)
		}
	}
	custom := retryPolicy{statuses: map[int]bool{501: true}}
	if !retryableStatus(custom, 501, "", "") || retryableStatus(custom, 503, "", "") {
		t.Error("retryableStatus does not follow the policy's own status set")
	}
}

// retryClock is a settable clock for retryBudget.
type retryClock struct{ t time.Time }

func (c *retryClock) now() time.Time          { return c.t }
func (c *retryClock) advance(d time.Duration) { c.t = c.t.Add(d) }

// retryDrain takes retries until one is refused (bounded) and returns how many.
func retryDrain(b *retryBudget) int {
	n := 0
	for n < 1_000_000 && b.tryRetry() {
		n++
	}
	return n
}

func TestRetryBudgetEnforced(t *testing.T) {
	cases := []struct {
		name     string
		ratio    float64
		floor    float64 // per second, over a 10 s window
		requests int
		want     int
	}{
		{"share plus floor", 0.2, 0.5, 100, 20 + 5},
		{"share only", 0.2, 0, 100, 20},
		{"floor only, no traffic", 0.2, 1, 0, 10},
		{"floor with the documented default", 0.2, 10, 100, 20 + 100},
		{"a fraction of a retry allows one (2 < 2.4)", 0.2, 0, 12, 3},
		{"nothing allowed", 0, 0, 1000, 0},
		{"negative inputs mean zero", -1, -1, 50, 0},
	}
	for _, c := range cases {
		clk := &retryClock{t: time.Unix(1_700_000_000, 0)}
		b := newRetryBudget(c.ratio, c.floor, 10*time.Second, clk.now)
		for range c.requests {
			b.recordRequest()
		}
		if got := retryDrain(b); got != c.want {
			t.Errorf("%s: %d retries allowed, want %d", c.name, got, c.want)
		}
		if b.tryRetry() {
			t.Errorf("%s: a retry was allowed after the budget was spent", c.name)
		}
	}
}

func TestRetryBudgetWindowSlides(t *testing.T) {
	clk := &retryClock{t: time.Unix(1_700_000_000, 0)}
	b := newRetryBudget(0.2, 0.5, 10*time.Second, clk.now) // floor 5 per window

	for range 100 {
		b.recordRequest()
	}
	clk.advance(5 * time.Second)
	if got := retryDrain(b); got != 25 {
		t.Fatalf("at 5s: %d retries allowed, want 25", got)
	}
	// At 10s the requests of slice 0 have left the window but the retries
	// taken at 5s have not: 25 retries against a floor of 5.
	clk.advance(5 * time.Second)
	if b.tryRetry() {
		t.Fatal("at 10s: retry allowed while the window still holds 25 retries")
	}
	// 50 new requests earn 10 more, not enough to cover 25 old retries.
	for range 50 {
		b.recordRequest()
	}
	if b.tryRetry() {
		t.Fatal("at 10s: retry allowed with 25 retries against 10+5")
	}
	// At 15s the retries of slice 5 leave; the 50 requests of slice 10 stay.
	clk.advance(5 * time.Second)
	if got := retryDrain(b); got != 15 {
		t.Fatalf("at 15s: %d retries allowed, want 15", got)
	}
	// A whole window later everything has left: only the floor is there.
	clk.advance(10 * time.Second)
	if got := retryDrain(b); got != 5 {
		t.Fatalf("at 25s: %d retries allowed, want 5", got)
	}
	// Inside one slice nothing moves.
	clk.advance(999 * time.Millisecond)
	if b.tryRetry() {
		t.Fatal("retry allowed within the same slice after the floor was spent")
	}
}

func TestRetryBudgetClockGoesBack(t *testing.T) {
	clk := &retryClock{t: time.Unix(1_700_000_000, 0)}
	b := newRetryBudget(0.2, 0.1, 10*time.Second, clk.now) // floor 1
	clk.advance(30 * time.Second)
	for range 10 {
		b.recordRequest()
	}
	// A clock that jumps back must neither panic nor wipe the window.
	clk.advance(-time.Hour)
	if got := retryDrain(b); got != 3 {
		t.Fatalf("after the clock went back: %d retries allowed, want 3", got)
	}
}

func TestRetryBudgetDefaults(t *testing.T) {
	b := newRetryBudget(0, 1, 0, nil) // window 10s, time.Now
	if b.now == nil || b.slice != time.Second {
		t.Fatalf("defaults: now nil=%v, slice %v; want time.Now and 1s", b.now == nil, b.slice)
	}
	if !b.tryRetry() {
		t.Fatal("a fresh budget with a floor refused its first retry")
	}
}

func TestRetryBudgetConcurrent(t *testing.T) {
	clk := &retryClock{t: time.Unix(1_700_000_000, 0)}
	b := newRetryBudget(0.2, 0.5, 10*time.Second, clk.now) // floor 5
	const workers, perWorker = 8, 50                       // 400 requests
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range perWorker {
				b.recordRequest()
			}
		})
	}
	wg.Wait()
	var granted atomic.Int64
	for range workers {
		wg.Go(func() {
			for range 100 {
				if b.tryRetry() {
					granted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if got := granted.Load(); got != 80+5 {
		t.Fatalf("%d retries granted concurrently, want 85", got)
	}
}

func BenchmarkRetryBackoffBudget(b *testing.B) {
	p := defaultRetryPolicy()
	clk := &retryClock{t: time.Unix(1_700_000_000, 0)}
	budget := newRetryBudget(0.2, 10, 10*time.Second, clk.now)
	var x uint64 = 0x9e3779b97f4a7c15
	rnd := func() float64 { // xorshift: deterministic and allocation-free
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		return float64(x>>11) / (1 << 53)
	}
	var sink time.Duration
	granted := 0
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		clk.advance(time.Millisecond)
		budget.recordRequest()
		sink += p.backoff(i&7, rnd)
		if budget.tryRetry() {
			granted++
		}
	}
	if granted == 0 || sink < 0 {
		b.Fatal("benchmark did no work")
	}
}

// statusBody is the body of an upstream answer with status st, naming it.
func statusBody(st int) string { return `{"answer":` + strconv.Itoa(st) + `}` }

// TestForwardedRepeatOnlyWhenNotActed: a model call on another path
// (images, embeddings) may have acted on a 500, so it is not sent again; on
// a 503 or 429 the upstream surely did not act, so it is. GET is always
// repeated. A retryable status alone does not repeat the call.
func TestForwardedRepeatOnlyWhenNotActed(t *testing.T) {
	const (
		image = `{"model":"gpt-image-1","prompt":"a toll gate at dawn"}`
		embed = `{"model":"text-embedding-3-small","input":"toll"}`
	)
	cases := []struct {
		name, method, path, body string
		statuses                 []int
		wantStatus               int
		wantHits                 int32
	}{
		{"images 500", http.MethodPost, "/v1/images/generations", image, []int{500, 200}, 500, 1},
		{"embeddings 500", http.MethodPost, "/v1/embeddings", embed, []int{500, 200}, 500, 1},
		{"images 502", http.MethodPost, "/v1/images/generations", image, []int{502, 200}, 502, 1},
		{"images 503", http.MethodPost, "/v1/images/generations", image, []int{503, 200}, 200, 2},
		{"embeddings 429", http.MethodPost, "/v1/embeddings", embed, []int{429, 200}, 200, 2},
		{"models GET 500", http.MethodGet, "/v1/models", "", []int{500, 200}, 200, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			up := &scriptUpstream{respond: func(n int, _ *http.Request) scriptStep {
				st := c.statuses[min(n, len(c.statuses))-1] // the last one repeats
				return scriptStep{st, nil, statusBody(st)}
			}}
			us := httptest.NewServer(up)
			defer us.Close()
			tg := newTestGateway(t, us.URL, func(cfg *config.Config) { fastRetry(&cfg.Upstreams[0]) })
			ctype := ""
			if c.body != "" {
				ctype = "application/json"
			}
			r := sendRequest(context.Background(), c.method, tg.URL+c.path, ctype, c.body, nil)
			if r.err != nil {
				t.Fatal(r.err)
			}
			if rec := tg.record(t); rec.AttemptCount != int(c.wantHits) {
				t.Errorf("record lists %d attempts, want %d (%v)", rec.AttemptCount, c.wantHits, attemptList(rec))
			}
			if r.resp.StatusCode != c.wantStatus || string(r.body) != statusBody(c.wantStatus) {
				t.Errorf("caller got %d %q; want %d %q", r.resp.StatusCode, r.body, c.wantStatus, statusBody(c.wantStatus))
			}
			if n := up.count(c.path); n != int(c.wantHits) {
				t.Errorf("upstream hits %d, want %d", n, c.wantHits)
			}
		})
	}
}

// TestInsufficientQuotaNotRetried: a 429 whose type or code is
// insufficient_quota goes to the caller at once, retries on or not.
func TestInsufficientQuotaNotRetried(t *testing.T) {
	for _, spec := range []string{
		"status=429;type=insufficient_quota;code=insufficient_quota",
		"status=429;code=insufficient_quota",
		"status=429;type=insufficient_quota",
	} {
		t.Run(spec, func(t *testing.T) {
			mock, url := mockUpstream(t, mockllm.Options{OutputTokens: 2})
			tg := newTestGateway(t, url, func(c *config.Config) { fastRetry(&c.Upstreams[0]) })
			if err := mock.Inject(spec, 1); err != nil {
				t.Fatal(err)
			}
			resp, body := post(t, tg.URL+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil)
			if resp.StatusCode != http.StatusTooManyRequests || !bytes.Contains(body, []byte("insufficient_quota")) {
				t.Errorf("caller got %d %s, want the upstream's 429 insufficient_quota", resp.StatusCode, body)
			}
			if st := mock.Stats(); st.Requests != 1 {
				t.Errorf("mock saw %d requests, want 1", st.Requests)
			}
			rec := tg.record(t)
			if got, want := attemptList(rec), []string{"mock:429:rate_limited"}; !slices.Equal(got, want) {
				t.Errorf("attempts %v, want %v", got, want)
			}
			if rec.RetryWait != 0 || rec.Outcome != llm.OutcomeUpstreamError {
				t.Errorf("retry wait %v outcome %s", rec.RetryWait, rec.Outcome)
			}
		})
	}
}

// scriptStep is one scripted upstream answer.
type scriptStep struct {
	status int
	hdr    map[string]string
	body   string
}

// scriptUpstream is an upstream that answers the n-th request (1-based) on each
// path with respond(n, r), and counts requests per path.
type scriptUpstream struct {
	respond func(n int, r *http.Request) scriptStep
	mu      sync.Mutex
	counts  map[string]int
}

func (s *scriptUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	s.mu.Lock()
	if s.counts == nil {
		s.counts = map[string]int{}
	}
	s.counts[r.URL.Path]++
	n := s.counts[r.URL.Path]
	s.mu.Unlock()
	st := s.respond(n, r)
	w.Header().Set("Content-Type", "application/json")
	for k, v := range st.hdr {
		w.Header().Set(k, v)
	}
	w.WriteHeader(st.status)
	_, _ = io.WriteString(w, st.body)
}

func (s *scriptUpstream) count(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[path]
}

const (
	chatOKBody     = `{"id":"chatcmpl-1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`
	serverErrBody  = `{"error":{"message":"boom","type":"server_error","param":null,"code":null}}`
	badRequestBody = `{"error":{"message":"bad","type":"invalid_request_error","param":null,"code":null}}`
	conflictBody   = `{"error":{"message":"a concurrent request holds this resource; try again"}}`
)

// TestXShouldRetry: the upstream's x-should-retry wins over the status
// list both ways, as in the official SDKs.
func TestXShouldRetry(t *testing.T) {
	tests := []struct {
		name     string
		first    scriptStep
		want     int
		requests int
		attempts []string
	}{
		{"503 with x-should-retry false is not retried",
			scriptStep{503, map[string]string{"X-Should-Retry": "false"}, serverErrBody}, 503, 1, []string{"up:503:server_error"}},
		{"400 with x-should-retry true is retried",
			scriptStep{400, map[string]string{"X-Should-Retry": "true"}, conflictBody}, 200, 2, []string{"up:400:client_error", "up:200:ok"}},
		{"400 without it is not",
			scriptStep{400, nil, conflictBody}, 400, 1, []string{"up:400:client_error"}},
		// shouldRetry's documented precedence: an error no retry can fix
		// is not retried even when the upstream says true (the SDKs would).
		{"400 invalid_request_error with x-should-retry true is not",
			scriptStep{400, map[string]string{"X-Should-Retry": "true"}, badRequestBody}, 400, 1, []string{"up:400:client_error"}},
		{"429 insufficient_quota with x-should-retry true is not",
			scriptStep{429, map[string]string{"X-Should-Retry": "true"},
				`{"error":{"message":"quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`},
			429, 1, []string{"up:429:rate_limited"}},
		{"503 without it is",
			scriptStep{503, nil, serverErrBody}, 200, 2, []string{"up:503:server_error", "up:200:ok"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			script := &scriptUpstream{respond: func(n int, _ *http.Request) scriptStep {
				if n == 1 {
					return tc.first
				}
				return scriptStep{200, nil, chatOKBody}
			}}
			up := httptest.NewServer(script)
			defer up.Close()
			tg := newTestGateway(t, up.URL, func(c *config.Config) {
				c.Upstreams[0].Name = "up"
				fastRetry(&c.Upstreams[0])
			})
			resp, body := post(t, tg.URL+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil)
			if resp.StatusCode != tc.want {
				t.Errorf("caller got %d %s, want %d", resp.StatusCode, body, tc.want)
			}
			if n := script.count("/v1/chat/completions"); n != tc.requests {
				t.Errorf("upstream saw %d requests, want %d", n, tc.requests)
			}
			if got := attemptList(tg.record(t)); !slices.Equal(got, tc.attempts) {
				t.Errorf("attempts %v, want %v", got, tc.attempts)
			}
		})
	}
}

// TestRetryAfterTooLongNotWaited: a Retry-After longer than max_wait_seconds,
// with no upstream to fall back to, is not waited for: the caller gets the
// upstream's 429 with its Retry-After, so its own SDK can decide.
func TestRetryAfterTooLongNotWaited(t *testing.T) {
	mock, url := mockUpstream(t, mockllm.Options{OutputTokens: 2})
	tg := newTestGateway(t, url, func(c *config.Config) {
		c.Upstreams[0].Retry.MaxWaitSeconds = 5
		fastRetry(&c.Upstreams[0])
	})
	if err := mock.Inject("status=429;retry-after=60", 1); err != nil {
		t.Fatal(err)
	}
	resp, body := post(t, tg.URL+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "60" {
		t.Errorf("caller got %d Retry-After %q (%s), want 429 with Retry-After 60", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if st := mock.Stats(); st.Requests != 1 {
		t.Errorf("mock saw %d requests, want 1", st.Requests)
	}
	rec := tg.record(t)
	if rec.AttemptCount != 1 || rec.RetryWait != 0 {
		t.Errorf("attempts %d retry wait %v", rec.AttemptCount, rec.RetryWait)
	}
	if v := metricValue(t, tg, "tollgate_upstream_retries_skipped_total",
		map[string]string{"upstream": "mock", "why": "wait_too_long"}); v != 1 {
		t.Errorf("retries_skipped_total{why=wait_too_long} = %v, want 1", v)
	}
}

// TestRetryBudgetSendsFailingRequestsOnce: with budget_ratio 0 and a floor of 0.2 retries a
// second over the 10 s window, two retries are allowed; the failing
// requests after them are sent once, and each refusal is counted.
func TestRetryBudgetSendsFailingRequestsOnce(t *testing.T) {
	mock, url := mockUpstream(t, mockllm.Options{OutputTokens: 2})
	tg := newTestGateway(t, url, func(c *config.Config) {
		u := &c.Upstreams[0]
		u.Retry.MaxAttempts = 2
		u.Retry.BudgetRatio = 0
		u.Retry.BudgetMinPerSecond = 0.2
		u.Breaker.Enabled = false // every attempt fails; the breaker is not under test
		fastRetry(u)
	})
	var sent []int64
	prev := int64(0)
	for range 4 {
		resp, body := post(t, tg.URL+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
			map[string]string{"X-Mock-Fault": "status=500"})
		if resp.StatusCode != http.StatusInternalServerError {
			t.Errorf("caller got %d %s, want the upstream's 500", resp.StatusCode, body)
		}
		tg.record(t)
		n := mock.Stats().Requests
		sent = append(sent, n-prev)
		prev = n
	}
	if want := []int64{2, 2, 1, 1}; len(sent) != 4 || sent[0] != want[0] || sent[1] != want[1] || sent[2] != want[2] || sent[3] != want[3] {
		t.Errorf("upstream requests per caller request %v, want %v", sent, want)
	}
	if v := metricValue(t, tg, "tollgate_upstream_retries_skipped_total",
		map[string]string{"upstream": "mock", "why": "budget"}); v != 2 {
		t.Errorf("retries_skipped_total{why=budget} = %v, want 2", v)
	}
}

// TestForwardedRetryRules: on other /v1/* paths a GET is always
// repeatable; a POST naming a model (metered: embeddings, responses...) may
// have created something upstream, so it is repeated only when the upstream
// surely did not act on it (429, 503, 529, connection refused), not on a
// 500; a POST that is no model call (a file upload) is never repeated.
func TestForwardedRetryRules(t *testing.T) {
	const embed = `{"model":"text-embedding-3-small","input":"hi"}`
	tests := []struct {
		name, method, path, ctype, body string
		first, want, requests           int
	}{
		{"embeddings 503", http.MethodPost, "/v1/embeddings", "application/json", embed, 503, 200, 2},
		{"embeddings 429", http.MethodPost, "/v1/embeddings", "application/json", embed, 429, 200, 2},
		{"embeddings 500", http.MethodPost, "/v1/embeddings", "application/json", embed, 500, 500, 1},
		{"GET models 500", http.MethodGet, "/v1/models", "", "", 500, 200, 2},
		{"file upload, not JSON, 503", http.MethodPost, "/v1/files", "application/octet-stream",
			"\x00\x01 raw file bytes, not JSON", 503, 503, 1},
		{"JSON without a model, 503", http.MethodPost, "/v1/completions", "application/json", `{"prompt":"hi"}`, 503, 503, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			script := &scriptUpstream{respond: func(n int, r *http.Request) scriptStep {
				if n == 1 {
					return scriptStep{tc.first, nil, serverErrBody}
				}
				if r.Method == http.MethodGet {
					return scriptStep{200, nil, `{"object":"list","data":[{"id":"m","object":"model"}]}`}
				}
				return scriptStep{200, nil, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1]}],` +
					`"model":"text-embedding-3-small","usage":{"prompt_tokens":2,"total_tokens":2}}`}
			}}
			up := httptest.NewServer(script)
			defer up.Close()
			tg := newTestGateway(t, up.URL, func(c *config.Config) { fastRetry(&c.Upstreams[0]) })
			ctx, cancel := context.WithTimeout(context.Background(), testWait)
			defer cancel()
			r := sendRequest(ctx, tc.method, tg.URL+tc.path, tc.ctype, tc.body, nil)
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.resp.StatusCode != tc.want {
				t.Errorf("caller got %d %s, want %d", r.resp.StatusCode, r.body, tc.want)
			}
			if n := script.count(tc.path); n != tc.requests {
				t.Errorf("upstream saw %d requests, want %d", n, tc.requests)
			}
			if rec := tg.record(t); rec.AttemptCount != tc.requests {
				t.Errorf("record lists %d attempts, want %d (%v)", rec.AttemptCount, tc.requests, attemptList(rec))
			}
		})
	}
}

func TestShouldRetry(t *testing.T) {
	def := defaultRetryPolicy()
	custom := retryPolicy{maxAttempts: 3, statuses: map[int]bool{418: true}}
	none := retryPolicy{}
	hdr := func(v string) http.Header {
		h := http.Header{}
		if v != "" {
			h.Set("X-Should-Retry", v)
		}
		return h
	}
	tests := []struct {
		name          string
		p             retryPolicy
		status        int
		should        string // X-Should-Retry
		errType, code string
		want          bool
	}{
		{"429", def, 429, "", "requests", "rate_limit_exceeded", true},
		{"408", def, 408, "", "", "", true},
		{"409", def, 409, "", "", "", true},
		{"500", def, 500, "", "server_error", "", true},
		{"502", def, 502, "", "", "", true},
		{"503", def, 503, "", "", "", true},
		{"504", def, 504, "", "", "", true},
		{"529", def, 529, "", "overloaded_error", "", true},
		{"400", def, 400, "", "invalid_request_error", "", false},
		{"401", def, 401, "", "", "invalid_api_key", false},
		{"404", def, 404, "", "", "model_not_found", false},
		{"422", def, 422, "", "", "", false},
		{"501 not listed", def, 501, "", "", "", false},
		{"503 x-should-retry false", def, 503, "false", "", "", false},
		{"429 x-should-retry false", def, 429, "false", "", "", false},
		{"400 x-should-retry true", def, 400, "true", "", "", true},
		{"501 x-should-retry true", def, 501, "true", "", "", true},
		{"x-should-retry is case sensitive like the SDKs", def, 400, "TRUE", "", "", false},
		{"x-should-retry other value ignored", def, 503, "no", "", "", true},
		{"insufficient_quota type", def, 429, "", "insufficient_quota", "", false},
		{"insufficient_quota code", def, 429, "", "requests", "insufficient_quota", false},
		{"insufficient_quota beats x-should-retry true", def, 429, "true", "insufficient_quota", "insufficient_quota", false},
		{"billing code", def, 429, "", "insufficient_quota", "credit_balance_exhausted", false},
		{"anthropic billing_error", def, 500, "", "billing_error", "", false},
		{"authentication_error on a 500", def, 500, "", "authentication_error", "", false},
		{"invalid_request_error code on a 503", def, 503, "", "", "invalid_request_error", false},
		{"custom statuses: listed", custom, 418, "", "", "", true},
		{"custom statuses: default one not listed", custom, 429, "", "", "", false},
		{"zero policy", none, 500, "", "", "", false},
		{"zero policy, x-should-retry true", none, 500, "true", "", "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := shouldRetry(tc.p, tc.status, hdr(tc.should), tc.errType, tc.code); got != tc.want {
				t.Errorf("shouldRetry(status %d, x-should-retry %q, type %q, code %q) = %v, want %v",
					tc.status, tc.should, tc.errType, tc.code, got, tc.want)
			}
		})
	}
}
