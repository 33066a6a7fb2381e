package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/internal/redistest"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/ratelimit"
	"github.com/tollgate-llm/tollgate/spend"
)

func messageParams(maxTokens int64) anthropic.MessageNewParams {
	return anthropic.MessageNewParams{
		Model:     "claude-test",
		MaxTokens: maxTokens,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("How many moons has Saturn?"))},
	}
}

// TestKeysMode: in mode "keys" a configured key is admitted and replaced
// by the upstream's own key; unknown, missing and malformed keys get 401 in
// the caller's dialect and never reach the upstream.
func TestKeysMode(t *testing.T) {
	w := newGovWorld(t, mockllm.Options{OutputTokens: 5}, false, nil)
	ctx := testCtx(t)

	if _, err := w.openai(keyAlpha).Chat.Completions.New(ctx, chatParams(0)); err != nil {
		t.Fatalf("OpenAI SDK with a gateway key: %v", err)
	}
	if rec := w.tg.record(t); rec.KeyID != "alpha" || rec.Team != "search" {
		t.Errorf("record key %q team %q, want alpha search", rec.KeyID, rec.Team)
	}
	if _, err := w.anthropic(keyBeta).Messages.New(ctx, messageParams(16)); err != nil {
		t.Fatalf("Anthropic SDK with a gateway key: %v", err)
	}
	if rec := w.tg.record(t); rec.KeyID != "beta" || rec.Team != "ads" {
		t.Errorf("record key %q team %q, want beta ads", rec.KeyID, rec.Team)
	}
	reqs := w.mock.Requests()
	if len(reqs) != 2 {
		t.Fatalf("upstream got %d requests, want 2", len(reqs))
	}
	if got := reqs[0].Header.Get("Authorization"); got != "Bearer "+upstreamKey || reqs[0].Header.Get("X-Api-Key") != "" {
		t.Errorf("OpenAI request went upstream with Authorization %q, x-api-key %q", got, reqs[0].Header.Get("X-Api-Key"))
	}
	if got := reqs[1].Header.Get("X-Api-Key"); got != upstreamKey || reqs[1].Header.Get("Authorization") != "" {
		t.Errorf("Anthropic request went upstream with x-api-key %q, Authorization %q", got, reqs[1].Header.Get("Authorization"))
	}

	// Unknown key, through both SDKs.
	_, err := w.openai("tg-not-a-key-999").Chat.Completions.New(ctx, chatParams(0))
	var oe *openai.Error
	if !errors.As(err, &oe) || oe.StatusCode != http.StatusUnauthorized || oe.Code != "invalid_api_key" {
		t.Errorf("OpenAI SDK, unknown key: %v", err)
	} else if strings.Contains(oe.Message, "tg-not-a-key-999") {
		t.Errorf("error message reveals the key: %q", oe.Message)
	}
	_, err = w.anthropic("tg-not-a-key-999").Messages.New(ctx, messageParams(16))
	var ae *anthropic.Error
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusUnauthorized || ae.Type() != "authentication_error" {
		t.Errorf("Anthropic SDK, unknown key: %v", err)
	}
	// Missing and malformed keys, as raw requests.
	for name, hdr := range map[string]map[string]string{
		"missing":   nil,
		"malformed": {"Authorization": "Basic dXNlcjpwYXNz"},
		"empty":     {"Authorization": "Bearer "},
	} {
		resp, body := post(t, w.tg.URL+"/v1/chat/completions", `{"model":"gpt-test","messages":[]}`, hdr)
		if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), `"invalid_api_key"`) {
			t.Errorf("%s key: %d %s", name, resp.StatusCode, body)
		}
	}
	if n := len(w.mock.Requests()); n != 2 {
		t.Errorf("upstream got %d requests, want still 2", n)
	}
}

// TestRateLimit429 follows an RPM limit on a frozen clock: admitted
// responses carry the limit's headers, the refusal is a 429 each SDK parses
// as a rate-limit error with the exact Retry-After of the bucket, other teams
// are untouched, and the refill admits again.
func TestRateLimit429(t *testing.T) {
	w := newGovWorld(t, mockllm.Options{OutputTokens: 3}, true, func(c *config.Config) {
		c.Keys[0].RPM = i64(2)
	})
	ctx := testCtx(t)
	oc := w.openai(keyAlpha)
	for i, wantRemaining := range []string{"1", "0"} {
		var resp *http.Response
		if _, err := oc.Chat.Completions.New(ctx, chatParams(0), option.WithResponseInto(&resp)); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if got := resp.Header.Get("X-Ratelimit-Remaining-Requests"); got != wantRemaining ||
			resp.Header.Get("X-Ratelimit-Limit-Requests") != "2" {
			t.Errorf("request %d: x-ratelimit-*-requests limit %q remaining %q, want 2 %s", i,
				resp.Header.Get("X-Ratelimit-Limit-Requests"), got, wantRemaining)
		}
	}
	// 2 per minute: the next token arrives 30 s after the bucket emptied.
	_, err := oc.Chat.Completions.New(ctx, chatParams(0))
	var oe *openai.Error
	if !errors.As(err, &oe) || oe.StatusCode != http.StatusTooManyRequests || oe.Code != "rate_limit_exceeded" {
		t.Fatalf("OpenAI SDK, third request: %v", err)
	}
	h := oe.Response.Header
	if h.Get("Retry-After") != "30" || h.Get("Retry-After-Ms") != "30000" {
		t.Errorf("Retry-After %q, retry-after-ms %q; want 30, 30000", h.Get("Retry-After"), h.Get("Retry-After-Ms"))
	}
	if h.Get("X-Ratelimit-Remaining-Requests") != "0" || h.Get("X-Ratelimit-Reset-Requests") != "1m0s" {
		t.Errorf("429 headers: remaining %q reset %q; want 0, 1m0s", h.Get("X-Ratelimit-Remaining-Requests"),
			h.Get("X-Ratelimit-Reset-Requests"))
	}
	if !strings.Contains(oe.Message, `key "alpha"`) || !strings.Contains(oe.Message, "RPM") {
		t.Errorf("message does not say which limit: %q", oe.Message)
	}

	// The same key through the Anthropic SDK: same bucket, Anthropic headers.
	_, err = w.anthropic(keyAlpha).Messages.New(ctx, messageParams(16))
	var ae *anthropic.Error
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusTooManyRequests || ae.Type() != "rate_limit_error" {
		t.Fatalf("Anthropic SDK, refused: %v", err)
	}
	ah := ae.Response.Header
	wantReset := w.clock.Now().Add(time.Minute).Format(time.RFC3339)
	if ah.Get("Anthropic-Ratelimit-Requests-Remaining") != "0" || ah.Get("Anthropic-Ratelimit-Requests-Limit") != "2" ||
		ah.Get("Anthropic-Ratelimit-Requests-Reset") != wantReset || ah.Get("Retry-After") != "30" {
		t.Errorf("Anthropic 429 headers: %v (want reset %s)", ah, wantReset)
	}

	// Another team is untouched.
	if _, err := w.openai(keyBeta).Chat.Completions.New(ctx, chatParams(0)); err != nil {
		t.Errorf("beta (other team) refused: %v", err)
	}
	// 30 s later one request passes again.
	w.clock.Advance(30 * time.Second)
	if _, err := oc.Chat.Completions.New(ctx, chatParams(0)); err != nil {
		t.Errorf("after the refill: %v", err)
	}
	if got := metricValue(t, w.tg, "tollgate_ratelimit_rejections_total",
		map[string]string{"scope": "key", "limit": "rpm", "team": "search"}); got != 2 {
		t.Errorf("tollgate_ratelimit_rejections_total{key,rpm,search} = %v, want 2", got)
	}
	if n := len(w.mock.Requests()); n != 4 {
		t.Errorf("upstream got %d requests, want 4 (refused ones never reach it)", n)
	}
}

// attempt is one HTTP attempt an SDK made.
type attempt struct {
	status int
	sent   time.Time
	done   time.Time
}

type attemptLog struct {
	mu sync.Mutex
	as []attempt
}

func (l *attemptLog) add(a attempt) {
	l.mu.Lock()
	l.as = append(l.as, a)
	l.mu.Unlock()
}

func (l *attemptLog) get() []attempt {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]attempt(nil), l.as...)
}

func (l *attemptLog) openai(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
	a := attempt{sent: time.Now()}
	resp, err := next(req)
	a.done = time.Now()
	if resp != nil {
		a.status = resp.StatusCode
	}
	l.add(a)
	return resp, err
}

func (l *attemptLog) anthropic(req *http.Request, next aoption.MiddlewareNext) (*http.Response, error) {
	return l.openai(req, next)
}

// TestSDKsWaitTheGatewaysRetryAfter: a concurrency refusal says "retry in
// 1 s"; each official SDK, allowed one retry, waits at least that long and
// then succeeds once the slot is free.
func TestSDKsWaitTheGatewaysRetryAfter(t *testing.T) {
	w := newGovWorld(t, mockllm.Options{TTFT: 300 * time.Millisecond, OutputTokens: 3}, false, func(c *config.Config) {
		c.Keys[0].Concurrency = i64(1)
	})
	ctx := testCtx(t)
	hold := func() chan error {
		done := make(chan error, 1)
		go func() {
			_, err := w.openai(keyAlpha).Chat.Completions.New(ctx, chatParams(0))
			done <- err
		}()
		if _, err := w.mock.WaitStats(ctx, func(s mockllm.Stats) bool { return s.InFlight == 1 }); err != nil {
			t.Fatal(err)
		}
		return done
	}
	check := func(name string, log *attemptLog, err error, held chan error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := <-held; err != nil {
			t.Fatalf("%s: held request: %v", name, err)
		}
		as := log.get()
		if len(as) != 2 || as[0].status != http.StatusTooManyRequests || as[1].status != http.StatusOK {
			t.Fatalf("%s: attempts %+v, want 429 then 200", name, as)
		}
		if gap := as[1].sent.Sub(as[0].done); gap < time.Second {
			t.Errorf("%s retried after %v, before the gateway's Retry-After of 1s", name, gap)
		}
	}

	held := hold()
	var ol attemptLog
	_, err := w.openai(keyAlpha, option.WithMaxRetries(1), option.WithMiddleware(ol.openai)).
		Chat.Completions.New(ctx, chatParams(0))
	check("OpenAI SDK", &ol, err, held)

	held = hold()
	var al attemptLog
	_, err = w.anthropic(keyAlpha, aoption.WithMaxRetries(1), aoption.WithMiddleware(al.anthropic)).
		Messages.New(ctx, messageParams(16))
	check("Anthropic SDK", &al, err, held)
}

// TestBudgetSpentIsNotRetried: a spent token budget answers 429
// insufficient_quota with x-should-retry: false and no Retry-After, and the
// SDKs, with their default retries, do not retry it.
func TestBudgetSpentIsNotRetried(t *testing.T) {
	w := newGovWorld(t, mockllm.Options{OutputTokens: 1000}, true, func(c *config.Config) {
		c.Teams[0].TokensPerDay = i64(200)
	})
	ctx := testCtx(t)
	// The first request's estimate (about 15 prompt tokens + 190) is over
	// the budget of 200: a budget not yet spent admits it, reserving what
	// is left, and the real usage spends the budget.
	if _, err := w.openai(keyAlpha).Chat.Completions.New(ctx, chatParams(190)); err != nil {
		t.Fatalf("first request: %v", err)
	}
	var ol attemptLog
	_, err := w.openai(keyAlpha, option.WithMaxRetries(2), option.WithMiddleware(ol.openai)).
		Chat.Completions.New(ctx, chatParams(150))
	var oe *openai.Error
	if !errors.As(err, &oe) || oe.StatusCode != http.StatusTooManyRequests || oe.Code != "insufficient_quota" ||
		oe.Type != "insufficient_quota" {
		t.Fatalf("spent budget: %v", err)
	}
	if h := oe.Response.Header; h.Get("X-Should-Retry") != "false" || h.Get("Retry-After") != "" {
		t.Errorf("x-should-retry %q, retry-after %q; want false and none", h.Get("X-Should-Retry"), h.Get("Retry-After"))
	}
	if !strings.Contains(oe.Message, "not a rate limit") || !strings.Contains(oe.Message, `team "search"`) {
		t.Errorf("message: %q", oe.Message)
	}
	if n := len(ol.get()); n != 1 {
		t.Errorf("OpenAI SDK made %d attempts, want 1", n)
	}
	var al attemptLog
	_, err = w.anthropic(keyAlpha, aoption.WithMaxRetries(2), aoption.WithMiddleware(al.anthropic)).
		Messages.New(ctx, messageParams(150))
	var ae *anthropic.Error
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("Anthropic, spent budget: %v", err)
	}
	if n := len(al.get()); n != 1 {
		t.Errorf("Anthropic SDK made %d attempts, want 1", n)
	}
	// The other team still has its budget.
	if _, err := w.openai(keyBeta).Chat.Completions.New(ctx, chatParams(150)); err != nil {
		t.Errorf("other team: %v", err)
	}
}

// holdGate holds the upstream requests that carry X-Test-Hold until
// released, so that a test knows which requests are in flight.
type holdGate struct {
	arrived atomic.Int64
	release chan struct{}
	once    sync.Once
}

func (g *holdGate) open() { g.once.Do(func() { close(g.release) }) }

func (g *holdGate) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Test-Hold") != "" {
			g.arrived.Add(1)
			select {
			case <-g.release:
			case <-r.Context().Done():
			}
		}
		next.ServeHTTP(w, r)
	})
}

// TestBudgetHeldByRequestsInFlightIsRetried: team "search" has 20000 tokens
// a day, and its requests ask for max_tokens 4096, so five in flight reserve
// the whole budget. While they run, the next requests get a retryable 429
// (rate_limit_exceeded, rate_limit_error in Anthropic's dialect, with
// Retry-After and without x-should-retry: false) whose message gives used and
// reserved apart, and the official SDKs, with their default two retries,
// succeed once those end. When the real usage reaches the limit, the next
// request gets the final insufficient_quota, which the SDKs do not retry. On
// the Local limiter (on a frozen clock) and on Redis.
func TestBudgetHeldByRequestsInFlightIsRetried(t *testing.T) {
	for _, backend := range []string{"local", "redis"} {
		t.Run(backend, func(t *testing.T) {
			gate := &holdGate{release: make(chan struct{})}
			setup := govSetup{upstream: gate.wrap}
			if backend == "redis" {
				if time.Until(time.Now().UTC().Truncate(24*time.Hour).Add(24*time.Hour)) < 5*time.Minute {
					t.Skip("the UTC day ends within 5 minutes, and the budget with it")
				}
				setup.limiter = ratelimit.NewRedis(redistest.Start(t).Client(t), ratelimit.RedisOptions{})
			}
			const limit = 20000
			w := newGovWorldWith(t, mockllm.Options{OutputTokens: 100}, backend == "local", func(c *config.Config) {
				c.Teams[0].TokensPerDay = i64(limit)
			}, setup)
			// Registered after the world's, so run before them: a failing
			// test lets the held requests go before the servers close.
			t.Cleanup(gate.open)
			ctx := testCtx(t)
			team := ratelimit.Subject{Scope: ratelimit.ScopeTeam, ID: "search", Limits: ratelimit.Limits{TokensPerDay: limit}}
			peek := func() ratelimit.State {
				t.Helper()
				sts, err := w.limiter.Peek(ctx, []ratelimit.Subject{team})
				if err != nil || len(sts) != 1 {
					t.Fatalf("Peek: %v %v", sts, err)
				}
				return sts[0]
			}
			const sdkRetries = 2 // both SDKs' default

			// Five requests in flight hold the day's 20000 tokens.
			var wg sync.WaitGroup
			errs := make(chan error, 20)
			for range 5 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := w.openai(keyAlpha, option.WithHeader("X-Test-Hold", "1")).Chat.Completions.New(ctx, chatParams(4096))
					errs <- err
				}()
			}
			waitFor(t, "five requests in flight", func() bool { return gate.arrived.Load() == 5 })
			if st := peek(); st.Used != 0 || st.Reserved != limit {
				t.Fatalf("with five in flight: %+v", st)
			}

			// The next request, without retries, sees the refusal as it is.
			_, err := w.openai(keyAlpha).Chat.Completions.New(ctx, chatParams(4096))
			var oe *openai.Error
			if !errors.As(err, &oe) || oe.StatusCode != http.StatusTooManyRequests || oe.Code != "rate_limit_exceeded" {
				t.Fatalf("OpenAI SDK, budget held: %v", err)
			}
			h := oe.Response.Header
			if h.Get("X-Should-Retry") == "false" || h.Get("Retry-After") != "1" || h.Get("Retry-After-Ms") == "" {
				t.Errorf("held: x-should-retry %q, retry-after %q, retry-after-ms %q; want a retry in 1 s",
					h.Get("X-Should-Retry"), h.Get("Retry-After"), h.Get("Retry-After-Ms"))
			}
			if backend == "local" && h.Get("Retry-After-Ms") != "1000" {
				t.Errorf("held, nothing settled yet: retry-after-ms %q, want 1000", h.Get("Retry-After-Ms"))
			}
			for _, want := range []string{`team "search"`, "tokens per day", "Limit 20000", "Used 0", "Reserved 20000",
				"not spent"} {
				if !strings.Contains(oe.Message, want) {
					t.Errorf("held: message %q does not say %q", oe.Message, want)
				}
			}
			_, err = w.anthropic(keyAlpha).Messages.New(ctx, messageParams(4096))
			var ae *anthropic.Error
			if !errors.As(err, &ae) || ae.StatusCode != http.StatusTooManyRequests || ae.Type() != "rate_limit_error" ||
				ae.Response.Header.Get("X-Should-Retry") == "false" {
				t.Fatalf("Anthropic SDK, budget held: %v", err)
			}

			// Five more through both SDKs, with their default retries: the
			// first attempt of each is refused, and each succeeds once the
			// five in flight end.
			var log attemptLog
			for i := range 5 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if i%2 == 0 {
						_, err := w.openai(keyAlpha, option.WithMaxRetries(sdkRetries), option.WithMiddleware(log.openai)).
							Chat.Completions.New(ctx, chatParams(4096))
						errs <- err
						return
					}
					_, err := w.anthropic(keyAlpha, aoption.WithMaxRetries(sdkRetries), aoption.WithMiddleware(log.anthropic)).
						Messages.New(ctx, messageParams(4096))
					errs <- err
				}()
			}
			waitFor(t, "five refusals", func() bool { return len(log.get()) >= 5 })
			gate.open()
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Errorf("a request failed while the budget was only reserved: %v", err)
				}
			}
			as := log.get()
			var refusals int
			for _, a := range as {
				if a.status == http.StatusTooManyRequests {
					refusals++
				}
			}
			if refusals < 5 || len(as) != 5+refusals {
				t.Errorf("attempts %+v: want each of the five refused first, then admitted", as)
			}
			if st := peek(); st.Reserved != 0 || st.Used == 0 || st.Used >= limit {
				t.Fatalf("after ten requests of 100 tokens: %+v", st)
			}

			// Requests that really use 4000 tokens each spend the budget; the
			// one after that is refused for good, and not retried.
			for i := 0; ; i++ {
				if i == 10 {
					t.Fatalf("ten requests of 4000 tokens did not spend %d: %+v", limit, peek())
				}
				used := peek().Used
				var log attemptLog
				_, err := w.openai(keyAlpha, option.WithMaxRetries(sdkRetries), option.WithMiddleware(log.openai),
					option.WithHeader("X-Mock-Output-Tokens", "4000")).Chat.Completions.New(ctx, chatParams(4096))
				if used < limit {
					if err != nil {
						t.Fatalf("request %d, %d of %d used: %v", i, used, limit, err)
					}
					continue
				}
				if !errors.As(err, &oe) || oe.StatusCode != http.StatusTooManyRequests || oe.Code != "insufficient_quota" ||
					oe.Response.Header.Get("X-Should-Retry") != "false" || len(log.get()) != 1 {
					t.Fatalf("spent (%d of %d used): %v after %d attempts", used, limit, err, len(log.get()))
				}
				break
			}
			_, err = w.anthropic(keyAlpha, aoption.WithMaxRetries(sdkRetries)).Messages.New(ctx, messageParams(4096))
			if !errors.As(err, &ae) || ae.StatusCode != http.StatusTooManyRequests ||
				ae.Response.Header.Get("X-Should-Retry") != "false" || !strings.Contains(ae.Error(), "Budget spent") {
				t.Fatalf("Anthropic SDK, spent budget: %v", err)
			}
		})
	}
}

// TestRemainingTokensFollowSettlement: on a frozen clock, the remaining
// tokens an admitted response shows are the limit less the real usage of
// the earlier requests and this request's reservation.
func TestRemainingTokensFollowSettlement(t *testing.T) {
	const tpm, maxTok = 100000, 40
	w := newGovWorld(t, mockllm.Options{OutputTokens: 25}, true, func(c *config.Config) {
		c.Teams[0].TPM = i64(tpm)
	})
	ctx := testCtx(t)
	var used int64
	for i := range 3 {
		var resp *http.Response
		c, err := w.openai(keyAlpha).Chat.Completions.New(ctx, chatParams(maxTok), option.WithResponseInto(&resp))
		if err != nil {
			t.Fatal(err)
		}
		body := w.mock.Requests()[i].Body
		reserved := int64(len(body)+3)/4 + maxTok
		want := strconv.FormatInt(tpm-used-reserved, 10)
		if got := resp.Header.Get("X-Ratelimit-Remaining-Tokens"); got != want {
			t.Errorf("request %d: remaining tokens %s, want %s (limit %d - used %d - reserved %d)", i, got, want,
				tpm, used, reserved)
		}
		used += c.Usage.PromptTokens + c.Usage.CompletionTokens
		w.tg.record(t)
	}
	if used == 0 {
		t.Fatal("no usage reported")
	}
}

// TestModelNotAllowed: a team limited to model patterns gets 403 in its
// dialect for another model.
func TestModelNotAllowed(t *testing.T) {
	w := newGovWorld(t, mockllm.Options{OutputTokens: 3}, false, func(c *config.Config) {
		c.Teams[0].Models = []string{"claude-test*"}
	})
	ctx := testCtx(t)
	_, err := w.openai(keyAlpha).Chat.Completions.New(ctx, chatParams(0))
	var oe *openai.Error
	if !errors.As(err, &oe) || oe.StatusCode != http.StatusForbidden || oe.Code != "model_not_allowed" {
		t.Errorf("gpt-test for a claude-only team: %v", err)
	}
	if _, err := w.anthropic(keyAlpha).Messages.New(ctx, messageParams(16)); err != nil {
		t.Errorf("claude-test: %v", err)
	}
	if _, err := w.openai(keyBeta).Chat.Completions.New(ctx, chatParams(0)); err != nil {
		t.Errorf("another team: %v", err)
	}
}

// TestSpendEqualsUsage: the ledger's tokens per key equal, to the token, the
// usage the upstream reported to the SDKs, streamed and not, in both
// dialects; its cost is the priced sum; a stream the caller cancels is billed
// for what was relayed.
func TestSpendEqualsUsage(t *testing.T) {
	w := newGovWorld(t, mockllm.Options{OutputTokens: 12, ITL: 2 * time.Millisecond}, false, nil)
	ctx := testCtx(t)
	type sum struct{ in, out, reqs int64 }
	want := map[string]*sum{"alpha": {}, "beta": {}}
	for i := range 6 {
		key, name := keyAlpha, "alpha"
		if i%2 == 1 {
			key, name = keyBeta, "beta"
		}
		s := want[name]
		p := chatParams(int64(5 + i))
		c, err := w.openai(key).Chat.Completions.New(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		s.in, s.out, s.reqs = s.in+c.Usage.PromptTokens, s.out+c.Usage.CompletionTokens, s.reqs+1

		p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		st := w.openai(key).Chat.Completions.NewStreaming(ctx, p)
		var acc openai.ChatCompletionAccumulator
		for st.Next() {
			acc.AddChunk(st.Current())
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
		s.in, s.out, s.reqs = s.in+acc.Usage.PromptTokens, s.out+acc.Usage.CompletionTokens, s.reqs+1

		m, err := w.anthropic(key).Messages.New(ctx, messageParams(int64(4+i)))
		if err != nil {
			t.Fatal(err)
		}
		s.in, s.out, s.reqs = s.in+m.Usage.InputTokens, s.out+m.Usage.OutputTokens, s.reqs+1

		// A stream whose caller did not ask for usage: the gateway asks
		// for it and withholds the usage chunk, so the SDK never sees it.
		// What the upstream reported follows from the body it got
		// (mockllm.InputTokens) and max_tokens (below the mock's 12).
		p.StreamOptions = openai.ChatCompletionStreamOptionsParam{}
		st = w.openai(key).Chat.Completions.NewStreaming(ctx, p)
		for st.Next() {
			if len(st.Current().Choices) == 0 {
				t.Error("the usage chunk the gateway asked for reached the caller")
			}
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
		reqs := w.mock.Requests()
		sent := reqs[len(reqs)-1].Body
		if !strings.Contains(string(sent), `"include_usage":true`) {
			t.Fatalf("the gateway did not ask for usage: %s", sent)
		}
		s.in, s.out, s.reqs = s.in+int64(mockllm.InputTokens(sent)), s.out+p.MaxTokens.Value, s.reqs+1
	}
	for range 24 {
		w.tg.record(t)
	}

	// A stream cancelled after its third event: billed for what the gateway
	// relayed (Anthropic reports the input at the start).
	cctx, cancel := context.WithCancel(ctx)
	st := w.anthropic(keyAlpha).Messages.NewStreaming(cctx, messageParams(12))
	for n := 0; st.Next(); n++ {
		if n == 3 {
			cancel()
			break
		}
	}
	_ = st.Close()
	cancel()
	rec := w.tg.record(t)
	if rec.Outcome != llm.OutcomeClientCancel || !rec.Usage.HasInput || rec.Usage.Output == 0 {
		t.Fatalf("cancelled stream recorded %v with usage %+v", rec.Outcome, rec.Usage)
	}
	want["alpha"].in += rec.Usage.Input
	want["alpha"].out += rec.Usage.Output
	want["alpha"].reqs++

	rows, err := w.ledger.Query(ctx, spend.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*sum{}
	var cost int64
	for _, r := range rows {
		s := got[r.KeyID]
		if s == nil {
			s = &sum{}
			got[r.KeyID] = s
		}
		s.in, s.out, s.reqs = s.in+r.Input, s.out+r.Output, s.reqs+r.Requests
		wantTeam := map[string]string{"alpha": "search", "beta": "ads"}[r.KeyID]
		if r.Team != wantTeam || r.Day != "2026-11-30" && r.Day != time.Now().UTC().Format(time.DateOnly) {
			t.Errorf("row %+v: team or day wrong", r.Key)
		}
		cost += r.CostMicros
	}
	for k, s := range want {
		if g := got[k]; g == nil || *g != *s {
			t.Errorf("%s: ledger %+v, upstream usage %+v", k, g, s)
		}
	}
	// $2.50/$10 per Mtok for gpt-test, $3/$15 for claude-test: every
	// request costs something, and the total is what the records billed.
	var billed int64
	w.tg.mu.Lock()
	for _, r := range w.tg.recs {
		billed += r.CostMicros
	}
	w.tg.mu.Unlock()
	if cost == 0 || cost != billed {
		t.Errorf("ledger cost %d µ$, records billed %d µ$", cost, billed)
	}
}

// TestPassthroughNamedKey: in mode "passthrough" a caller key listed in
// [[keys]] gets its name, team and limits while the key itself still goes
// upstream; an unlisted key passes under its hash id, with no team.
func TestPassthroughNamedKey(t *testing.T) {
	mock := mockllm.New(mockllm.Options{OutputTokens: 3})
	up := httptest.NewServer(mock)
	t.Cleanup(up.Close)
	lim := ratelimit.NewLocal(ratelimit.LocalOptions{})
	t.Cleanup(func() { _ = lim.Close() })
	tg := newTestGatewayWith(t, up.URL, func(c *config.Config) {
		c.Teams = []config.Team{{Name: "search", Limits: config.Limits{RPM: i64(1)}}}
		c.Keys = []config.Key{{Name: "alpha", SHA256: sha(keyAlpha), Team: "search"}}
	}, func(o *Options) { o.Limiter = lim })
	hdr := map[string]string{"Authorization": "Bearer " + keyAlpha}
	body := `{"model":"gpt-test","messages":[{"role":"user","content":"hi"}]}`
	if resp, b := post(t, tg.URL+"/v1/chat/completions", body, hdr); resp.StatusCode != http.StatusOK {
		t.Fatalf("listed key: %d %s", resp.StatusCode, b)
	}
	if rec := tg.record(t); rec.KeyID != "alpha" || rec.Team != "search" {
		t.Errorf("listed key recorded as %q / %q", rec.KeyID, rec.Team)
	}
	if got := mock.Requests()[0].Header.Get("Authorization"); got != "Bearer "+keyAlpha {
		t.Errorf("passthrough sent %q upstream, want the caller's own key", got)
	}
	if resp, b := post(t, tg.URL+"/v1/chat/completions", body, hdr); resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("team RPM 1, second request: %d %s", resp.StatusCode, b)
	}
	tg.record(t)
	other := map[string]string{"Authorization": "Bearer sk-someone-else"}
	if resp, b := post(t, tg.URL+"/v1/chat/completions", body, other); resp.StatusCode != http.StatusOK {
		t.Fatalf("unlisted key: %d %s", resp.StatusCode, b)
	}
	if rec := tg.record(t); rec.KeyID != keyID("sk-someone-else") || rec.Team != "" {
		t.Errorf("unlisted key recorded as %q / %q", rec.KeyID, rec.Team)
	}
}

// fakeAPI is an upstream for the /v1/* paths mockllm does not speak: it
// answers every POST with an OpenAI-style embeddings body and usage, along
// with the upstream account's own rate-limit and organisation headers.
type fakeAPI struct {
	mu   sync.Mutex
	reqs []*http.Request
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.reqs = append(f.reqs, r.Clone(context.Background()))
	f.mu.Unlock()
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Ratelimit-Limit-Tokens", "30000000")
	h.Set("X-Ratelimit-Remaining-Requests", "9999")
	h.Set("Anthropic-Ratelimit-Tokens-Limit", "400000")
	h.Set("Openai-Organization", "org-upstream-account")
	h.Set("Anthropic-Organization-Id", "upstream-org-uuid")
	if r.Method == http.MethodGet {
		_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"gpt-test","object":"model"}]}`))
		return
	}
	if r.URL.Path == "/v1/audio/speech" { // an answer with no usage in it
		h.Set("Content-Type", "audio/mpeg")
		_, _ = w.Write([]byte("ID3 not really audio"))
		return
	}
	_, _ = w.Write([]byte(`{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,0.2]}],` +
		`"model":"text-embed-test","usage":{"prompt_tokens":11,"total_tokens":11}}`))
}

func (f *fakeAPI) requests() []*http.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*http.Request(nil), f.reqs...)
}

// TestForwardedPathsAreGoverned: in mode "keys", other /v1/* paths cannot
// get around a key's limits, its team's models or the ledger: a POST naming
// a model is admitted, checked and billed like a dialect request; a stream
// there is refused (it could not be metered); GET /v1/models and
// count_tokens pass unmetered but still need a gateway key. The upstream
// account's rate-limit and organisation headers never reach the caller,
// and the caller cannot choose the upstream organisation.
func TestForwardedPathsAreGoverned(t *testing.T) {
	api := &fakeAPI{}
	up := httptest.NewServer(api)
	t.Cleanup(up.Close)
	lim := ratelimit.NewLocal(ratelimit.LocalOptions{})
	t.Cleanup(func() { _ = lim.Close() })
	ledger := newLocalLedger(t)
	tg := newTestGatewayWith(t, up.URL, func(c *config.Config) {
		c.Auth.Mode = "keys"
		c.Upstreams[0].APIKeyEnv, c.Upstreams[0].APIKey = "UPSTREAM_KEY", upstreamKey
		c.Models = []config.Model{
			{Pattern: "text-embed-*", InputUSDPerMTok: 0.02, OutputUSDPerMTok: 0},
			{Pattern: "claude-test*", InputUSDPerMTok: 3, OutputUSDPerMTok: 15},
		}
		c.Teams = []config.Team{{Name: "search"}, {Name: "ads", Models: []string{"claude-test*"}}}
		c.Keys = []config.Key{
			{Name: "alpha", SHA256: sha(keyAlpha), Team: "search", Limits: config.Limits{RPM: i64(3)}},
			{Name: "beta", SHA256: sha(keyBeta), Team: "ads"},
		}
	}, func(o *Options) { o.Limiter, o.Ledger = lim, ledger })
	embed := `{"model":"text-embed-test","input":"hello"}`
	alpha := map[string]string{"Authorization": "Bearer " + keyAlpha, "OpenAI-Organization": "org-caller-choice"}

	resp, body := post(t, tg.URL+"/v1/embeddings", embed, alpha)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("embeddings: %d %s", resp.StatusCode, body)
	}
	h := resp.Header
	if h.Get("X-Ratelimit-Limit-Requests") != "3" || h.Get("X-Ratelimit-Remaining-Requests") != "2" ||
		h.Get("X-Ratelimit-Limit-Tokens") != "" || h.Get("Anthropic-Ratelimit-Tokens-Limit") != "" ||
		h.Get("Openai-Organization") != "" || h.Get("Anthropic-Organization-Id") != "" {
		t.Errorf("headers mix the upstream account with the key's own: %v", h)
	}
	got := api.requests()[0].Header
	if got.Get("Authorization") != "Bearer "+upstreamKey || got.Get("Openai-Organization") != "" {
		t.Errorf("upstream got Authorization %q, OpenAI-Organization %q", got.Get("Authorization"), got.Get("Openai-Organization"))
	}
	if rec := tg.record(t); rec.Model != "text-embed-test" || rec.Usage.Input != 11 || rec.CostMicros != 0 {
		// 11 tokens at $0.02 per Mtok round to 0 µ$.
		t.Errorf("record: model %q usage %+v cost %d", rec.Model, rec.Usage, rec.CostMicros)
	}
	rows, err := ledger.Query(context.Background(), spend.Filter{Model: "text-embed-test"})
	if err != nil || len(rows) != 1 || rows[0].Input != 11 || rows[0].Requests != 1 || rows[0].KeyID != "alpha" {
		t.Errorf("ledger: %+v %v", rows, err)
	}

	// An answer without usage is billed its estimate, never nothing.
	speech := `{"model":"text-embed-speech","input":"say this aloud, please"}`
	if resp, body := post(t, tg.URL+"/v1/audio/speech", speech, map[string]string{"Authorization": "Bearer " + keyBeta}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("speech for a team held to claude-test*: %d %s", resp.StatusCode, body)
	}
	tg.record(t)
	if resp, body := post(t, tg.URL+"/v1/audio/speech", speech, alpha); resp.StatusCode != http.StatusOK {
		t.Fatalf("speech: %d %s", resp.StatusCode, body)
	}
	if rec := tg.record(t); !rec.Estimated || !rec.InputEstimated || rec.Usage.Input != int64(len(speech)+3)/4 || rec.Usage.Output != 0 {
		// The record carries what was billed: the prompt estimate, and
		// max_tokens (none here) as output.
		t.Errorf("speech record: estimated %v/%v, usage %+v; want the billed estimate", rec.InputEstimated, rec.Estimated, rec.Usage)
	}
	rows, err = ledger.Query(context.Background(), spend.Filter{Model: "text-embed-speech"})
	if err != nil || len(rows) != 1 || rows[0].Input != int64(len(speech)+3)/4 || rows[0].Requests != 1 {
		t.Errorf("speech in the ledger: %+v %v; want the prompt estimate %d", rows, err, (len(speech)+3)/4)
	}
	// The key's RPM counts here too: embeddings, speech, embeddings, then
	// refused.
	post(t, tg.URL+"/v1/embeddings", embed, alpha)
	tg.record(t)
	if resp, body := post(t, tg.URL+"/v1/embeddings", embed, alpha); resp.StatusCode != http.StatusTooManyRequests ||
		!strings.Contains(string(body), "rate_limit_exceeded") {
		t.Errorf("fourth request with RPM 3: %d %s", resp.StatusCode, body)
	}
	tg.record(t)
	// A team held to claude-test* cannot embed with another model.
	beta := map[string]string{"Authorization": "Bearer " + keyBeta}
	if resp, body := post(t, tg.URL+"/v1/embeddings", embed, beta); resp.StatusCode != http.StatusForbidden {
		t.Errorf("embeddings with a model outside the team's patterns: %d %s", resp.StatusCode, body)
	}
	tg.record(t)
	// A stream on a path the gateway cannot meter.
	if resp, body := post(t, tg.URL+"/v1/completions", `{"model":"claude-test","stream":true,"prompt":"hi"}`, beta); resp.StatusCode != http.StatusBadRequest ||
		!strings.Contains(string(body), "unmetered_request") {
		t.Errorf("forwarded stream in keys mode: %d %s", resp.StatusCode, body)
	}
	tg.record(t)
	// count_tokens and GET /v1/models are not metered, but need a key.
	for _, k := range []map[string]string{alpha, beta} {
		if resp, body := post(t, tg.URL+"/v1/messages/count_tokens", `{"model":"gpt-other","messages":[]}`, k); resp.StatusCode != http.StatusOK {
			t.Errorf("count_tokens: %d %s", resp.StatusCode, body)
		}
		tg.record(t)
	}
	req, _ := http.NewRequest(http.MethodGet, tg.URL+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer tg-unknown")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /v1/models with an unknown key: %v %v", resp.StatusCode, err)
	} else {
		resp.Body.Close()
	}
	tg.record(t)
	if n := len(api.requests()); n != 5 {
		t.Errorf("upstream got %d requests, want 5 (2 embeddings, 1 speech, 2 count_tokens)", n)
	}
}

// TestCostBudgetRefusesUnpricedModels: a model with no price would cost 0
// and slip past a cost budget, so a subject with one may not use it.
func TestCostBudgetRefusesUnpricedModels(t *testing.T) {
	w := newGovWorld(t, mockllm.Options{OutputTokens: 3}, false, func(c *config.Config) {
		c.Teams[0].CostPerDayUSD = f64(10)
	})
	ctx := testCtx(t)
	p := chatParams(0)
	p.Model = "unpriced-model"
	_, err := w.openai(keyAlpha).Chat.Completions.New(ctx, p)
	var oe *openai.Error
	if !errors.As(err, &oe) || oe.StatusCode != http.StatusForbidden || oe.Code != "model_not_priced" {
		t.Errorf("unpriced model under a cost budget: %v", err)
	}
	if _, err := w.openai(keyAlpha).Chat.Completions.New(ctx, chatParams(0)); err != nil {
		t.Errorf("priced model: %v", err)
	}
	if _, err := w.openai(keyBeta).Chat.Completions.New(ctx, p); err != nil {
		t.Errorf("unpriced model without a cost budget: %v", err)
	}
}

// TestNoWayAroundMetering: there is no way around the metering of governed
// callers — an escaped path that decodes to
// count_tokens, bodies the metering cannot read (a string "stream", a
// model nested elsewhere, no model), background requests, field names that
// differ only in case, and in mode "keys" the upstream account's shared
// resources (files, batches). A passthrough key with limits cannot send an
// unmetered stream either; one without limits can.
func TestNoWayAroundMetering(t *testing.T) {
	api := &fakeAPI{}
	up := httptest.NewServer(api)
	t.Cleanup(up.Close)
	newGW := func(mode string) *testGateway {
		lim := ratelimit.NewLocal(ratelimit.LocalOptions{})
		t.Cleanup(func() { _ = lim.Close() })
		return newTestGatewayWith(t, up.URL, func(c *config.Config) {
			c.Auth.Mode = mode
			c.Upstreams[0].APIKeyEnv, c.Upstreams[0].APIKey = "UPSTREAM_KEY", upstreamKey
			c.Models = []config.Model{{Pattern: "claude-test*", InputUSDPerMTok: 3, OutputUSDPerMTok: 15}}
			c.Teams = []config.Team{{Name: "ads", Models: []string{"claude-test*"}, Limits: config.Limits{RPM: i64(100)}}}
			c.Keys = []config.Key{{Name: "beta", SHA256: sha(keyBeta), Team: "ads"}}
		}, func(o *Options) { o.Limiter = lim })
	}
	beta := map[string]string{"Authorization": "Bearer " + keyBeta}
	send := func(tg *testGateway, method, path, body string, hdr map[string]string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, tg.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		tg.record(t)
		return resp.StatusCode, string(b)
	}

	keys := newGW("keys")
	for _, tc := range []struct {
		method, path, body string
		status             int
		code               string
	}{
		{"POST", "/v1/chat/completions%3Fx=/count_tokens", `{"model":"gpt-forbidden","stream":true}`, 400, "unmetered_request"},
		{"POST", "/v1/chat/completions%3Fx=/count_tokens", `{"model":"gpt-forbidden"}`, 403, "model_not_allowed"},
		{"POST", "/v1/completions", `{"model":"claude-test","stream":"true","prompt":"hi"}`, 400, "unmetered_request"},
		{"POST", "/v1/responses", `{"model":"claude-test","stream":"true","input":"hi"}`, 400, `\"stream\" must be a boolean`},
		{"POST", "/v1/responses", `{"model":"claude-test","background":true,"input":"hi"}`, 400, "unmetered_request"},
		{"POST", "/v1/messages/batches", `{"requests":[{"custom_id":"a","params":{"model":"gpt-forbidden"}}]}`, 400, "cannot meter"}, // Anthropic dialect: no code field
		{"POST", "/v1/embeddings", `{"model":"gpt-forbidden","MODEL":"claude-test","input":"x"}`, 400, "ambiguous_field"},
		{"POST", "/v1/embeddings", `{"model":"claude-test","\u0053tream":true,"input":"x"}`, 400, "ambiguous_field"},
		{"POST", "/v1/embeddings", `not json`, 400, "unmetered_request"},
		{"GET", "/v1/files", ``, 403, "not_available"},
		{"DELETE", "/v1/files/file-123", ``, 403, "not_available"},
		{"GET", "/v1/batches/b-1", ``, 403, "not_available"},
		{"GET", "/v1/models%2F..%2Ffiles", ``, 400, "invalid_path"}, // refused before anything else
		{"POST", "/v1/messages/count_tokens?beta=true", `{"model":"gpt-other","messages":[]}`, 200, ""},
		{"GET", "/v1/models/gpt-test", ``, 200, ""},
		{"POST", "/v1/embeddings", `{"model":"claude-test-embed","input":"x"}`, 200, ""},
	} {
		code, body := send(keys, tc.method, tc.path, tc.body, beta)
		if code != tc.status || !strings.Contains(body, tc.code) {
			t.Errorf("keys mode: %s %s %s: %d %s, want %d %s", tc.method, tc.path, tc.body, code, body, tc.status, tc.code)
		}
	}
	// Chat completions with a case-variant model on the dialect route too.
	if code, body := send(keys, "POST", "/v1/chat/completions", `{"model":"gpt-forbidden","MODEL":"claude-test","messages":[]}`, beta); code != 400 ||
		!strings.Contains(body, "ambiguous_field") {
		t.Errorf("dialect route with a case-variant model: %d %s", code, body)
	}
	for _, r := range api.requests() {
		if strings.Contains(r.URL.Path, "count_tokens") && strings.Contains(r.URL.Path, "chat") {
			t.Errorf("the escaped path reached the upstream as %q", r.URL.Path)
		}
	}
	if n := len(api.requests()); n != 3 {
		t.Errorf("upstream got %d requests, want 3 (count_tokens, GET model, embeddings)", n)
	}

	// Passthrough: a listed key with limits is metered strictly; another is not.
	pass := newGW("passthrough")
	if code, body := send(pass, "POST", "/v1/completions", `{"model":"claude-test","stream":true,"prompt":"hi"}`, beta); code != 400 {
		t.Errorf("passthrough key with limits, forwarded stream: %d %s", code, body)
	}
	if code, body := send(pass, "PUT", "/v1/chat/completions", `{"model":"gpt-forbidden","stream":true}`, beta); code != 400 {
		t.Errorf("passthrough key with limits, PUT: %d %s", code, body)
	}
	if code, body := send(pass, "POST", "/v1/chat/completions", `{"model":"claude-test","stream":true,"stream_options":{"include_usage":false,"INCLUDE_USAGE":true},"messages":[]}`, beta); code != 400 ||
		!strings.Contains(body, "ambiguous_field") {
		t.Errorf("case variant inside stream_options: %d %s", code, body)
	}
	other := map[string]string{"Authorization": "Bearer sk-unlisted"}
	if code, body := send(pass, "POST", "/v1/completions", `{"model":"gpt-anything","stream":true,"prompt":"hi"}`, other); code != 200 {
		t.Errorf("passthrough key without limits, forwarded stream: %d %s", code, body)
	}
	if code, body := send(pass, "GET", "/v1/files", ``, other); code != 200 {
		t.Errorf("passthrough GET /v1/files: %d %s", code, body)
	}

	// A listed key whose team is held to models but has no limits is
	// governed too: no unmetered stream around its model list.
	modelsOnly := newTestGatewayWith(t, up.URL, func(c *config.Config) {
		c.Models = []config.Model{{Pattern: "claude-test*", InputUSDPerMTok: 3, OutputUSDPerMTok: 15}}
		c.Teams = []config.Team{{Name: "ads", Models: []string{"claude-test*"}}}
		c.Keys = []config.Key{{Name: "beta", SHA256: sha(keyBeta), Team: "ads"}}
	}, nil)
	if code, body := send(modelsOnly, "POST", "/v1/completions", `{"model":"gpt-forbidden","stream":true}`, beta); code != 400 {
		t.Errorf("team held to models, forwarded stream: %d %s", code, body)
	}
}

// TestRejectionOf: every limit kind is recorded under the name the
// ratelimit_rejections_total metric gives it, so /stats and the metrics
// agree.
func TestRejectionOf(t *testing.T) {
	for k := ratelimit.KindRPM; k <= ratelimit.KindCostPerMonth; k++ {
		r := rejectionOf(k)
		if r == llm.RejectNone || r == llm.RejectOther || r.String() != k.String() {
			t.Errorf("kind %s recorded as %q", k, r)
		}
	}
	if r := rejectionOf(ratelimit.Kind(200)); r != llm.RejectOther {
		t.Errorf("unknown kind recorded as %q", r)
	}
}

// A governed caller streams on the Responses API: admitted, its tokens
// reserved from max_output_tokens and billed from the terminal event's
// usage (the ledger equals what the SDK read), then refused with a 429 the
// SDK parses; a background request is refused with a message saying why.
func TestResponsesStreamGoverned(t *testing.T) {
	w := newGovWorld(t, mockllm.Options{OutputTokens: 5}, true, func(c *config.Config) {
		c.Keys[0].RPM = i64(2)
	})
	ctx := testCtx(t)
	oc := w.openai(keyAlpha)
	p := responses.ResponseNewParams{Model: "gpt-test-1",
		Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("hello there")},
		MaxOutputTokens: openai.Int(64)}
	var in, out int64
	for i := range 2 {
		stream := oc.Responses.NewStreaming(ctx, p)
		var final *responses.Response
		for stream.Next() {
			if ev := stream.Current(); ev.Type == "response.completed" {
				final = &ev.Response
			}
		}
		if err := stream.Err(); err != nil || final == nil {
			t.Fatalf("stream %d: %v (terminal %v)", i, err, final != nil)
		}
		_ = stream.Close()
		in, out = in+final.Usage.InputTokens, out+final.Usage.OutputTokens
		rec := w.tg.record(t)
		if rec.Outcome != llm.OutcomeOK || rec.Team != "search" || rec.Usage.Output != final.Usage.OutputTokens ||
			rec.CostMicros == 0 || rec.Timing.FirstTokenOut.IsZero() {
			t.Errorf("stream %d record %+v", i, rec)
		}
	}
	rows, err := w.ledger.Query(ctx, spend.Filter{Team: "search"})
	if err != nil || len(rows) != 1 || rows[0].Requests != 2 || rows[0].Input != in || rows[0].Output != out {
		t.Errorf("ledger %+v %v; want 2 requests, %d in, %d out as the SDK read", rows, err, in, out)
	}
	stream := oc.Responses.NewStreaming(ctx, p)
	for stream.Next() {
	}
	var oe *openai.Error
	if err := stream.Err(); !errors.As(err, &oe) || oe.StatusCode != http.StatusTooManyRequests ||
		oe.Code != "rate_limit_exceeded" || oe.Response.Header.Get("X-Ratelimit-Remaining-Requests") != "0" {
		t.Errorf("third stream with RPM 2: %v", err)
	}
	_ = stream.Close()
	if rec := w.tg.record(t); rec.Outcome != llm.OutcomeRejected || rec.Rejection != llm.RejectRPM {
		t.Errorf("refused stream record %+v", rec)
	}

	p.Background = openai.Bool(true)
	_, err = w.openai(keyBeta).Responses.New(ctx, p)
	if !errors.As(err, &oe) || oe.StatusCode != http.StatusBadRequest || oe.Code != "unmetered_request" ||
		!strings.Contains(oe.Message, "background") {
		t.Errorf("background request of a governed key: %v", err)
	}
	w.tg.record(t)
}

// TestTokenCountsHaveTheirOwnBucket: a token count (Anthropic's
// POST /v1/messages/count_tokens, the Responses API's
// POST /v1/responses/input_tokens) is its own request class. In mode
// "keys" it goes upstream with the gateway's key, under its own rate
// (count_tokens_rpm) and nothing else: a burst of counts takes nothing
// from the key's RPM or its budgets, a count past its own rate is refused
// 429 with Retry-After in the caller's dialect, and a count is never billed
// nor counted as tokens used. A Responses count needs no model.
func TestTokenCountsHaveTheirOwnBucket(t *testing.T) {
	w := newGovWorld(t, mockllm.Options{OutputTokens: 3}, true, func(c *config.Config) {
		c.Keys[0].RPM = i64(1)
		c.Keys[0].TokensPerDay = i64(1000)
		c.Keys[0].CountTokensRPM = i64(2)
	})
	ctx := testCtx(t)
	ac := w.anthropic(keyAlpha)
	count := anthropic.MessageCountTokensParams{Model: "claude-test",
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("How many moons has Saturn?"))}}
	got, err := ac.Messages.CountTokens(ctx, count)
	if err != nil || got.InputTokens <= 0 {
		t.Fatalf("count: %v (%+v)", err, got)
	}
	oc := w.openai(keyAlpha, option.WithMaxRetries(0))
	inputCount := responses.InputTokenCountParams{
		Input: responses.InputTokenCountParamsInputUnion{OfString: openai.String("How many moons has Saturn?")}}
	counted, err := oc.Responses.InputTokens.Count(ctx, inputCount)
	if err != nil || counted.InputTokens <= 0 {
		t.Fatalf("Responses count: %v (%+v)", err, counted)
	}
	for i, rec := range []llm.Record{w.tg.record(t), w.tg.record(t)} {
		if rec.Route != llm.RouteCountTokens || rec.Status != http.StatusOK || rec.CostMicros != 0 || rec.Usage.HasInput {
			t.Errorf("count %d: route %s status %d cost %d usage %+v", i, rec.Route, rec.Status, rec.CostMicros, rec.Usage)
		}
	}
	_, err = ac.Messages.CountTokens(ctx, count)
	var ae *anthropic.Error
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusTooManyRequests || ae.Response.Header.Get("Retry-After") != "30" {
		t.Fatalf("the third count: %v; want 429 after its own bucket of 2 a minute, Retry-After 30", err)
	}
	if rec := w.tg.record(t); rec.Rejection != llm.RejectRPM || rec.Route != llm.RouteCountTokens {
		t.Errorf("refused count: rejection %s route %s", rec.Rejection, rec.Route)
	}
	_, err = oc.Responses.InputTokens.Count(ctx, inputCount)
	var oe *openai.Error
	if !errors.As(err, &oe) || oe.StatusCode != http.StatusTooManyRequests || oe.Code != "rate_limit_exceeded" || oe.Type != "requests" {
		t.Fatalf("the fourth count, a Responses one: %v (type %q); want an OpenAI-shaped 429 from the same bucket", err, oe.Type)
	}
	w.tg.record(t)
	// The key's own RPM of 1 is whole: the counts took nothing from it.
	if _, err := ac.Messages.New(ctx, messageParams(16)); err != nil {
		t.Fatalf("a message after the counts: %v", err)
	}
	rows, err := w.ledger.Query(ctx, spend.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Requests != 1 {
		t.Errorf("ledger %+v; want the one message only", rows)
	}
}

// TestModelListIsTheTeams: in mode "keys" GET /v1/models lists only the
// models the caller's team may use, in the shape the upstream answered in
// (OpenAI's list, Anthropic's with its first_id and last_id), so a client's
// model picker offers nothing admission would refuse; a team held to no
// patterns sees the whole list.
func TestModelListIsTheTeams(t *testing.T) {
	const list = `{"data":[{"type":"model","id":"claude-test-1","display_name":"C"},` +
		`{"type":"model","id":"gpt-test-1","display_name":"G"},{"type":"model","id":"gpt-test-2","display_name":"G2"}],` +
		`"has_more":false,"first_id":"claude-test-1","last_id":"gpt-test-2"}`
	w := newGovWorldWith(t, mockllm.Options{}, false, func(c *config.Config) {
		c.Teams[0].Models = []string{"gpt-test*"}
	}, govSetup{upstream: func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v1/models" {
				rw.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(rw, list)
				return
			}
			h.ServeHTTP(rw, r)
		})
	}})
	ctx := testCtx(t)
	page, err := w.openai(keyAlpha).Models.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range page.Data {
		ids = append(ids, m.ID)
	}
	if !slices.Equal(ids, []string{"gpt-test-1", "gpt-test-2"}) {
		t.Errorf("team search (gpt-test*) listed %v", ids)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, w.tg.URL+"/v1/models", nil)
	req.Header.Set("X-Api-Key", keyAlpha)
	req.Header.Set("Anthropic-Version", "2023-06-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var ant struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
		FirstID string `json:"first_id"`
		LastID  string `json:"last_id"`
	}
	if err := json.Unmarshal(body, &ant); err != nil || resp.StatusCode != http.StatusOK || len(ant.Data) != 2 ||
		ant.FirstID != "gpt-test-1" || ant.LastID != "gpt-test-2" {
		t.Errorf("Anthropic-shaped list for team search: %d %s", resp.StatusCode, body)
	}
	page, err = w.openai(keyBeta).Models.List(ctx)
	if err != nil || len(page.Data) != 3 {
		t.Errorf("team ads (any model) listed %d models (%v), want 3", len(page.Data), err)
	}
}

// leftoverToken is a token a caller presents beside its gateway key and
// that no [[keys]] entry lists: an old ANTHROPIC_AUTH_TOKEN, say.
const leftoverToken = "sk-ant-oat01-leftover-token-0123"

// twoKeyGateway is a gateway in mode (keys or passthrough) whose gateway
// keys are alpha (team search) and beta (team ads), in front of a mockllm
// that takes any key, so that what went upstream can be read.
func twoKeyGateway(t *testing.T, mode string) (*testGateway, *mockllm.Server) {
	t.Helper()
	mock, url := mockUpstream(t, mockllm.Options{OutputTokens: 3})
	tg := newTestGateway(t, url, func(c *config.Config) {
		c.Auth.Mode, c.Auth.RequireKey = mode, true
		c.Upstreams[0].APIKeyEnv, c.Upstreams[0].APIKey = "UPSTREAM_KEY", upstreamKey
		withTwoTeams(c)
	})
	return tg, mock
}

// TestOneKeyFromTwoHeaders follows the precedence of a key sent in
// Authorization and another in x-api-key (docs/keys.md), as Claude Code
// (ANTHROPIC_AUTH_TOKEN and ANTHROPIC_API_KEY) and an Anthropic SDK with a
// default x-api-key header send them, in both modes: the same key in both
// is that key; a gateway key wins over one that is not; two different
// gateway keys are a 401 naming both ids; with neither listed Authorization
// wins; a malformed Authorization is ignored beside a gateway key only.
// Admitted in mode keys, the upstream gets its own key alone; in
// passthrough, both headers exactly as sent.
func TestOneKeyFromTwoHeaders(t *testing.T) {
	const malformedAuth = "Basic dXNlcjpwYXNz"
	cases := []struct {
		name string
		// auth is the whole Authorization value, apiKey x-api-key's; ""
		// sends none.
		auth, apiKey string
		// keyID and team are the record's; refusedKeys and refusedPass, a
		// part of the 401's message in each mode ("" when admitted).
		keyID, team              string
		refusedKeys, refusedPass string
	}{
		{name: "same gateway key in both (apiKeyHelper)", auth: "Bearer " + keyAlpha, apiKey: keyAlpha,
			keyID: "alpha", team: "search"},
		{name: "gateway key in x-api-key, leftover token in Authorization", auth: "Bearer " + leftoverToken,
			apiKey: keyAlpha, keyID: "alpha", team: "search"},
		{name: "gateway key in Authorization, leftover token in x-api-key", auth: "Bearer " + keyBeta,
			apiKey: leftoverToken, keyID: "beta", team: "ads"},
		{name: "two different gateway keys", auth: "Bearer " + keyAlpha, apiKey: keyBeta, keyID: keyID(keyAlpha),
			refusedKeys: "conflicting API keys: Authorization carries gateway key id " + keyID(keyAlpha) +
				" and x-api-key gateway key id " + keyID(keyBeta)},
		{name: "neither a gateway key", auth: "Bearer " + leftoverToken, apiKey: "sk-ant-api03-unlisted",
			keyID: keyID(leftoverToken), refusedKeys: "invalid API key (id " + keyID(leftoverToken) + ")"},
		{name: "malformed Authorization beside a gateway key", auth: malformedAuth, apiKey: keyAlpha,
			keyID: "alpha", team: "search"},
		{name: "malformed Authorization beside a key that is not", auth: malformedAuth,
			apiKey: "sk-ant-api03-unlisted", keyID: "anonymous", refusedKeys: "malformed Authorization header",
			refusedPass: "malformed Authorization header"},
	}
	cases[3].refusedPass = cases[3].refusedKeys
	for _, mode := range []string{"keys", "passthrough"} {
		t.Run(mode, func(t *testing.T) {
			tg, mock := twoKeyGateway(t, mode)
			ctx := testCtx(t)
			for _, tc := range cases {
				refused := tc.refusedKeys
				if mode == "passthrough" {
					refused = tc.refusedPass
				}
				opts := []aoption.RequestOption{aoption.WithoutEnvironmentDefaults(), aoption.WithBaseURL(tg.URL),
					aoption.WithMaxRetries(0)}
				if tok, ok := strings.CutPrefix(tc.auth, "Bearer "); ok {
					opts = append(opts, aoption.WithAuthToken(tok)) // ANTHROPIC_AUTH_TOKEN
				} else {
					opts = append(opts, aoption.WithHeader("Authorization", tc.auth))
				}
				opts = append(opts, aoption.WithHeader("X-Api-Key", tc.apiKey)) // ANTHROPIC_API_KEY
				before := len(mock.Requests())
				c := anthropic.NewClient(opts...)
				_, err := c.Messages.New(ctx, messageParams(16))
				rec := tg.record(t)
				if rec.KeyID != tc.keyID || rec.Team != tc.team {
					t.Errorf("%s: recorded as key %q team %q, want %q %q", tc.name, rec.KeyID, rec.Team, tc.keyID, tc.team)
				}
				reqs := mock.Requests()
				if refused != "" {
					var ae *anthropic.Error
					if !errors.As(err, &ae) || ae.StatusCode != http.StatusUnauthorized || ae.Type() != "authentication_error" ||
						!strings.Contains(ae.Error(), refused) {
						t.Errorf("%s: got %v, want a 401 authentication_error saying %q", tc.name, err, refused)
					}
					if len(reqs) != before {
						t.Errorf("%s: refused, yet the upstream got the request", tc.name)
					}
					continue
				}
				if err != nil {
					t.Errorf("%s: %v", tc.name, err)
					continue
				}
				if len(reqs) != before+1 {
					t.Fatalf("%s: the upstream got %d requests, want 1", tc.name, len(reqs)-before)
				}
				h := reqs[len(reqs)-1].Header
				wantAuth, wantAPIKey := tc.auth, tc.apiKey
				if mode == "keys" {
					wantAuth, wantAPIKey = "", upstreamKey
				}
				if h.Get("Authorization") != wantAuth || h.Get("X-Api-Key") != wantAPIKey {
					t.Errorf("%s: upstream got Authorization %q, x-api-key %q; want %q, %q", tc.name,
						h.Get("Authorization"), h.Get("X-Api-Key"), wantAuth, wantAPIKey)
				}
			}

			// The conflict in the OpenAI dialect, through its SDK.
			oc := openai.NewClient(option.WithBaseURL(tg.URL+"/v1"), option.WithAPIKey(keyAlpha),
				option.WithHeader("X-Api-Key", keyBeta), option.WithMaxRetries(0))
			_, err := oc.Chat.Completions.New(ctx, chatParams(0))
			var oe *openai.Error
			if !errors.As(err, &oe) || oe.StatusCode != http.StatusUnauthorized || oe.Code != "invalid_api_key" ||
				!strings.Contains(oe.Message, cases[3].refusedKeys) {
				t.Errorf("OpenAI SDK, two different gateway keys: %v", err)
			}
			tg.record(t)

			// Keys appear nowhere but as their ids or names.
			if logs := tg.logs.String(); strings.Contains(logs, keyAlpha) || strings.Contains(logs, keyBeta) ||
				strings.Contains(logs, leftoverToken) || strings.Contains(logs, "unlisted") {
				t.Errorf("a key reached the access log: %s", logs)
			}
		})
	}
}

// TestSocketTakesTheGatewayKeyBesideALeftoverToken: the upgrade's keys are
// chosen as a POST's are (docs/keys.md, "One key from two headers"): in
// mode "keys" a gateway key in x-api-key opens the socket beside a leftover
// token in Authorization, and its turns are the key's; two different
// gateway keys are refused before the upgrade.
func TestSocketTakesTheGatewayKeyBesideALeftoverToken(t *testing.T) {
	w := newGovWorld(t, mockllm.Options{OutputTokens: 4}, false, func(c *config.Config) {
		c.Upstreams[0].ResponsesWebSocket = true
	})
	ctx := testCtx(t)
	connect := func(bearer, apiKey string) (*openai.BetaResponseConnection, error) {
		client := openai.NewClient(option.WithBaseURL(w.tg.URL+"/v1/"), option.WithAPIKey(bearer),
			option.WithHeader("X-Api-Key", apiKey), option.WithMaxRetries(0))
		conn, err := client.Beta.Responses.Connect(ctx, openai.BetaResponseConnectionOptions{})
		if err == nil {
			t.Cleanup(func() { _ = conn.Close() })
		}
		return conn, err
	}
	if _, err := connect(keyAlpha, keyBeta); err == nil {
		t.Error("two different gateway keys opened a socket")
	}
	conn, err := connect(leftoverToken, keyAlpha)
	if err != nil {
		t.Fatalf("a gateway key beside a leftover token: %v", err)
	}
	events := sendTurn(t, ctx, conn, `{"type":"response.create","model":"gpt-test","input":"hi","store":false}`)
	if last := events[len(events)-1]; last.Type != "response.completed" {
		t.Fatalf("the turn ended %s", last.Type)
	}
	if rec := w.tg.record(t); rec.KeyID != "alpha" || rec.Team != "search" {
		t.Errorf("the turn was recorded as key %q team %q, want alpha search", rec.KeyID, rec.Team)
	}
}

// TestIdentifyingAGatewayKeyAllocatesNothing: reading, hashing and naming
// a gateway key, from one header, from both, or beside a leftover token,
// allocates nothing; the hash-prefix id is made only for a key without a
// name.
func TestIdentifyingAGatewayKeyAllocatesNothing(t *testing.T) {
	lim := ratelimit.NewLocal(ratelimit.LocalOptions{})
	t.Cleanup(func() { _ = lim.Close() })
	g := governedGateway(t, config.Limits{}, config.Limits{}, lim, nil)
	for name, h := range map[string]http.Header{
		"Authorization": {"Authorization": {"Bearer " + keyAlpha}}, "x-api-key": {"X-Api-Key": {keyAlpha}},
		"both":                    {"Authorization": {"Bearer " + keyAlpha}, "X-Api-Key": {keyAlpha}},
		"beside a leftover token": {"Authorization": {"Bearer " + leftoverToken}, "X-Api-Key": {keyAlpha}},
	} {
		ex := exchange{g: g, gen: g.gen.Load()}
		if n := testing.AllocsPerRun(50, func() {
			if _, aerr := ex.identify(readKeys(h)); aerr != nil {
				t.Fatal(aerr)
			}
		}); n != 0 || ex.rec.KeyID != "alpha" {
			t.Errorf("%s: %v allocations, named %q; want 0, alpha", name, n, ex.rec.KeyID)
		}
	}
}

// TestClassRPMCapsItsClassOnly: a team's class_rpm is a bucket per request
// class on top of its rpm: past it, calls of that class are refused 429
// (with Retry-After), while its main turns and calls naming no class go on.
func TestClassRPMCapsItsClassOnly(t *testing.T) {
	w := newGovWorld(t, mockllm.Options{OutputTokens: 3}, false, func(c *config.Config) {
		c.Teams[0].ClassRPM = map[string]int64{"auxiliary": 1}
	})
	ctx := testCtx(t)
	aux := aoption.WithHeader("X-Claude-Code-Request-Class", "auxiliary")
	main := aoption.WithHeader("X-Claude-Code-Request-Class", "main")
	if _, err := w.anthropic(keyAlpha, aux).Messages.New(ctx, messageParams(8)); err != nil {
		t.Fatalf("the first auxiliary call: %v", err)
	}
	w.tg.record(t)
	_, err := w.anthropic(keyAlpha, aux, aoption.WithMaxRetries(0)).Messages.New(ctx, messageParams(8))
	var ae *anthropic.Error
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusTooManyRequests || ae.Response.Header.Get("Retry-After") == "" ||
		!strings.Contains(ae.Error(), "class:auxiliary") {
		t.Fatalf("the second auxiliary call: %v; want 429 naming the class's bucket", err)
	}
	if rec := w.tg.record(t); rec.Rejection != llm.RejectRPM || rec.RequestClass != "auxiliary" {
		t.Errorf("refused record: rejection %s class %q", rec.Rejection, rec.RequestClass)
	}
	for i, opts := range [][]aoption.RequestOption{{main}, {main}, nil} {
		if _, err := w.anthropic(keyAlpha, opts...).Messages.New(ctx, messageParams(8)); err != nil {
			t.Fatalf("call %d of another class after the cap: %v", i, err)
		}
		w.tg.record(t)
	}
}
