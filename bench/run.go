// Package bench is tollgate's load generator: it streams requests to an
// OpenAI- or Anthropic-compatible endpoint (a tollgate gateway or any other)
// and measures, on the client side, the figures the gateway exports, by the
// gateway's own definitions:
//
//   - TTFT: the first token-bearing event read − the request's start (just
//     before the POST, as vLLM's `st`). Token-bearing is decided by the
//     gateway's own decoders (sseparse), so a role-only chunk, message_start
//     or ping does not stop the clock. vLLM starts it at the first chunk with
//     choices, role-only included; this TTFT is the later, stricter one.
//   - ITL: every gap between consecutive token-bearing events (vLLM's
//     per-chunk convention), pooled over requests.
//   - TPOT: (last token − first token) / (output_tokens − 1), only with two
//     or more output tokens; output_tokens from the server's usage (OpenAI
//     requests set stream_options.include_usage), else the count of
//     token-bearing deltas (the sample says it was estimated).
//   - E2E: the last byte read − the start.
//
// An event's instant is that of the read that brought its last byte.
// Statistics are vLLM's: mean, and percentiles by linear interpolation
// (numpy.percentile's default), in milliseconds, over successful requests.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-llm/tollgate/llm"
)

// Config is one benchmark run.
type Config struct {
	// BaseURL is the endpoint's root, e.g. http://127.0.0.1:8080; the
	// dialect's /v1/... path is appended. A trailing "/v1" (the SDKs'
	// base_url convention) is accepted and not doubled.
	BaseURL string
	// Dialect picks the API: DialectOpenAI posts to /v1/chat/completions,
	// DialectAnthropic to /v1/messages, DialectResponses to /v1/responses.
	Dialect llm.Dialect
	// Model is the model named in every request.
	Model string
	// APIKey is sent as a Bearer token (OpenAI) or as x-api-key with
	// anthropic-version (Anthropic); empty sends none. It is never printed.
	APIKey string
	// Requests is the total number of requests; it must be positive.
	Requests int
	// Concurrency bounds the requests in flight. Zero or less means 1 in
	// fixed-concurrency mode, and no bound (beyond Requests) with Rate.
	Concurrency int
	// Rate, when positive, sends requests at this mean rate per second with
	// Poisson arrivals (exponential gaps, as vLLM's --request-rate); a
	// request that arrives while Concurrency are in flight waits for a slot,
	// and the wait is its QueueWait. Zero sends at fixed concurrency: each
	// request as soon as a slot frees.
	Rate float64
	// MaxTokens caps each answer (max_completion_tokens, or max_tokens on
	// Anthropic). Zero means 256.
	MaxTokens int
	// Prompts is the prompt set; nil means BuiltinPrompts.
	Prompts PromptSet
	// SLO are the goodput targets; a zero target is not checked.
	SLO llm.SLOTargets
	// Timeout bounds each attempt, from the POST to the last byte. A retry
	// hint longer than Timeout ends the request with its error instead of
	// waiting. Zero means 5 minutes.
	Timeout time.Duration
	// Seed orders the prompts and draws the Poisson arrivals, so two runs
	// with one Seed send the same prompts at the same offsets.
	Seed int64
	// Client sends the requests. Nil means a client with its own transport
	// pooled to Concurrency, closed when Run returns. Its Timeout should be
	// zero: Timeout bounds each attempt, and a client timeout would cut
	// streams.
	Client *http.Client
	// Progress, when non-nil, receives a one-line progress bar, redrawn at
	// most ten times a second and ended with a newline.
	Progress io.Writer

	// Turns, above 1, makes each of the Concurrency workers run
	// conversations of Turns requests in sequence (see conversation.go);
	// Requests still bounds the requests, so the last conversation is cut
	// short when Requests is no multiple of Turns. Zero means 1: every request stands alone. Turns above 1
	// and Rate are exclusive: a conversation's next turn follows its answer,
	// not an arrival process.
	Turns int
	// ConversationHeader names the header that carries a conversation's id
	// on every turn on the Chat Completions and Messages dialects; empty
	// means DefaultConversationHeader. The Responses dialect sends none: its
	// turns chain through previous_response_id.
	ConversationHeader string
	// RunID prefixes the conversation ids, "<RunID>-<n>" with n from 1, so
	// that two runs do not continue each other's conversations at the
	// gateway; empty means a random one.
	RunID string
}

// Defaults for the zero fields of Config.
const (
	defaultMaxTokens = 256
	defaultTimeout   = 5 * time.Minute
)

// runner holds one run's settled configuration.
type runner struct {
	cfg    Config
	url    string
	client *http.Client
	start  time.Time
}

// promptBody is a prompt encoded once for the run, or one turn of a
// conversation encoded for that turn.
type promptBody struct {
	index int
	class string
	body  []byte
	// conversation is the ConversationHeader value to send; "" sends none.
	conversation string
}

// endpoint returns the request URL for base and dialect.
func endpoint(base string, d llm.Dialect) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		// *url.Error quotes the whole URL, credentials included: name
		// only what is wrong.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return "", fmt.Errorf("bench: base URL is not a URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return "", fmt.Errorf("bench: base URL %q: want http:// or https:// and a host", u.Redacted())
	}
	path := strings.TrimSuffix(strings.TrimSuffix(u.Path, "/"), "/v1")
	switch d {
	case llm.DialectAnthropic:
		u.Path = path + "/v1/messages"
	case llm.DialectResponses:
		u.Path = path + "/v1/responses"
	default:
		u.Path = path + "/v1/chat/completions"
	}
	u.RawPath = ""
	return u.String(), nil
}

// settle validates cfg and fills its defaults.
func settle(cfg Config) (Config, string, error) {
	if cfg.Dialect != llm.DialectOpenAI && cfg.Dialect != llm.DialectAnthropic && cfg.Dialect != llm.DialectResponses {
		return cfg, "", fmt.Errorf("bench: dialect %q: want openai, anthropic or responses", cfg.Dialect)
	}
	u, err := endpoint(cfg.BaseURL, cfg.Dialect)
	if err != nil {
		return cfg, "", err
	}
	if cfg.Model == "" {
		return cfg, "", errors.New("bench: no model")
	}
	if cfg.Requests <= 0 {
		return cfg, "", fmt.Errorf("bench: requests %d: want at least 1", cfg.Requests)
	}
	if cfg.Rate < 0 || cfg.Rate != cfg.Rate {
		return cfg, "", fmt.Errorf("bench: rate %v: want 0 or more requests per second", cfg.Rate)
	}
	if cfg.MaxTokens < 0 {
		return cfg, "", fmt.Errorf("bench: max tokens %d: want 0 (default) or more", cfg.MaxTokens)
	}
	if cfg.Timeout < 0 {
		return cfg, "", fmt.Errorf("bench: timeout %v: want 0 (default) or more", cfg.Timeout)
	}
	if err := settleTurns(&cfg); err != nil {
		return cfg, "", err
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 1
		if cfg.Rate > 0 {
			cfg.Concurrency = cfg.Requests
		}
	}
	cfg.Concurrency = min(cfg.Concurrency, cfg.Requests)
	if cfg.MaxTokens == 0 {
		cfg.MaxTokens = defaultMaxTokens
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = defaultTimeout
	}
	if cfg.Prompts == nil {
		cfg.Prompts = BuiltinPrompts()
	}
	if len(cfg.Prompts) == 0 {
		return cfg, "", errors.New("bench: empty prompt set")
	}
	for i, p := range cfg.Prompts {
		switch p.Class {
		case ClassShort, ClassMedium, ClassLong:
		default:
			return cfg, "", fmt.Errorf("bench: prompt %d: class %q: want short, medium or long", i, p.Class)
		}
		if len(p.Messages) == 0 {
			return cfg, "", fmt.Errorf("bench: prompt %d: no messages", i)
		}
	}
	return cfg, u, nil
}

// newClient returns a client whose transport keeps a connection per request
// in flight, so that connection setup is paid once, not per request.
func newClient(concurrency int) (*http.Client, *http.Transport) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = concurrency
	tr.MaxIdleConnsPerHost = concurrency
	// Compression would make the transport buffer through gzip, and servers
	// do not compress event streams anyway.
	tr.DisableCompression = true
	return &http.Client{Transport: tr}, tr
}

// arrivals returns n Poisson arrival offsets at rate per second: the first at
// zero, then exponential gaps of mean 1/rate.
func arrivals(rng *rand.Rand, rate float64, n int) []time.Duration {
	out := make([]time.Duration, n)
	var t float64
	for i := 1; i < n; i++ {
		t += rng.ExpFloat64() / rate
		out[i] = time.Duration(t * float64(time.Second))
	}
	return out
}

// Run sends cfg.Requests requests and returns their samples and summaries.
// It returns an error without a result when cfg is invalid. When ctx ends
// during the run, requests in flight are cancelled, none is sent after, and
// Run returns what it measured together with an error wrapping ctx's. After
// the third request answered 401 it sends no more, lets those in flight
// finish, and returns what it measured with an *UnauthorizedError; so it
// does when every request sent was answered 401, however few.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg, u, err := settle(cfg)
	if err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg, url: u, client: cfg.Client}
	if r.client == nil {
		var tr *http.Transport
		r.client, tr = newClient(cfg.Concurrency)
		defer tr.CloseIdleConnections()
	}

	bodies := make([]promptBody, len(cfg.Prompts))
	for i := range cfg.Prompts {
		b, err := requestBody(cfg.Dialect, cfg.Model, cfg.MaxTokens, &cfg.Prompts[i])
		if err != nil {
			return nil, fmt.Errorf("bench: prompt %d: %w", i, err)
		}
		bodies[i] = promptBody{index: i, class: cfg.Prompts[i].Class, body: b}
	}
	rng := rand.New(rand.NewPCG(uint64(cfg.Seed), 0x62656e6368)) // "bench"
	order := rng.Perm(len(bodies))
	var at []time.Duration
	if cfg.Rate > 0 {
		at = arrivals(rng, cfg.Rate, cfg.Requests)
	}

	samples := make([]Sample, cfg.Requests)
	var prog progress
	prog.total = cfg.Requests
	stopProgress := prog.start(cfg.Progress)

	r.start = time.Now()
	var sent int
	// A 401 will not fix itself: after unauthorizedStop of them, no more
	// requests are sent (those in flight finish).
	var unauthorized atomic.Int64
	refused := make(chan struct{})
	stopped := func() bool {
		select {
		case <-refused:
			return true
		default:
			return ctx.Err() != nil
		}
	}
	record := func(i int, s Sample) {
		samples[i] = s
		prog.done(s.Err == "")
		if s.Err == ErrUnauthorized && unauthorized.Add(1) == unauthorizedStop {
			close(refused) // Add returns unauthorizedStop once
		}
	}
	if cfg.Turns > 1 {
		sent = r.conversations(ctx, bodies, order, stopped, record)
	} else {
		sent = r.dispatch(ctx, at, bodies, order, refused, stopped, record)
	}
	duration := time.Since(r.start)
	stopProgress()

	res := newResult(cfg, r.start, duration, samples[:sent])
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("bench: run interrupted after %d of %d requests: %w", sent, cfg.Requests, err)
	}
	// Whether or not every request was sent (the third 401 may be the
	// last request), a run the endpoint refused is no measurement.
	if n := int(unauthorized.Load()); n >= unauthorizedStop || n > 0 && n == sent {
		return res, &UnauthorizedError{Answers: n, Sent: sent, Requests: cfg.Requests}
	}
	return res, nil
}

// dispatch sends the requests of a single-turn run, each as soon as a slot
// frees (or at its arrival in at, when set), until Requests are sent or the
// run stops, and returns how many it sent once they have all ended.
func (r *runner) dispatch(ctx context.Context, at []time.Duration, bodies []promptBody, order []int,
	refused <-chan struct{}, stopped func() bool, record func(int, Sample)) int {
	slots := make(chan struct{}, r.cfg.Concurrency)
	var wg sync.WaitGroup
	sent := 0
	timer := time.NewTimer(0)
	<-timer.C
dispatch:
	for i := range r.cfg.Requests {
		arrival := r.start
		if at != nil {
			arrival = r.start.Add(at[i])
			if d := time.Until(arrival); d > 0 {
				timer.Reset(d)
				select {
				case <-timer.C:
				case <-ctx.Done():
					timer.Stop()
					break dispatch
				case <-refused:
					timer.Stop()
					break dispatch
				}
			}
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			break dispatch
		case <-refused:
			break dispatch
		}
		if stopped() { // several cases were ready; do not send after the end
			<-slots
			break dispatch
		}
		var queued time.Duration
		if at != nil {
			queued = max(time.Since(arrival), 0)
		}
		p := &bodies[order[i%len(order)]]
		sent++
		wg.Go(func() {
			defer func() { <-slots }()
			record(i, r.do(ctx, i, p, queued, nil))
		})
	}
	wg.Wait()
	return sent
}

// unauthorizedStop is how many 401 answers stop a run: enough not to stop on
// one odd answer, few enough not to flood an endpoint with a bad key.
const unauthorizedStop = 3

// UnauthorizedError reports a run that the endpoint refused: Run stopped it
// after unauthorizedStop answers 401, or every request it sent was answered
// 401. The key is missing or rejected, and retrying will not change that.
// The result returned with it holds the requests sent.
type UnauthorizedError struct {
	Answers  int // requests answered 401
	Sent     int // requests sent before the stop
	Requests int // requests planned
}

func (e *UnauthorizedError) Error() string {
	if e.Sent == e.Requests {
		return fmt.Sprintf("bench: %d of the %d requests sent were answered 401 Unauthorized: the endpoint rejects the API key or wants one",
			e.Answers, e.Sent)
	}
	return fmt.Sprintf("bench: stopped after %d requests were answered 401 Unauthorized (%d of %d sent): the endpoint rejects the API key or wants one",
		e.Answers, e.Sent, e.Requests)
}

// progress counts finished requests for the progress bar.
type progress struct {
	total    int
	finished atomic.Int64
	failed   atomic.Int64
}

func (p *progress) done(ok bool) {
	if !ok {
		p.failed.Add(1)
	}
	p.finished.Add(1)
}

// progressWidth is the bar's width in cells.
const progressWidth = 30

// line renders the bar after elapsed.
func (p *progress) line(elapsed time.Duration) string {
	n, failed := int(p.finished.Load()), int(p.failed.Load())
	filled := progressWidth * n / max(p.total, 1)
	return fmt.Sprintf("\rbench [%s%s] %d/%d  errors %d  %.1fs ",
		strings.Repeat("#", filled), strings.Repeat(".", progressWidth-filled),
		n, p.total, failed, elapsed.Seconds())
}

// start draws the bar on w every 100 ms until the returned stop is called,
// which draws it a last time and ends the line. A nil w draws nothing.
func (p *progress) start(w io.Writer) (stop func()) {
	if w == nil {
		return func() {}
	}
	began := time.Now()
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				// Progress is best effort: a failing terminal must not
				// fail the run.
				_, _ = io.WriteString(w, p.line(time.Since(began)))
			case <-quit:
				_, _ = io.WriteString(w, p.line(time.Since(began))+"\n")
				return
			}
		}
	}()
	return func() {
		close(quit)
		<-done
	}
}
