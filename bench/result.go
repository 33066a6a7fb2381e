package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tollgate-llm/tollgate/llm"
)

// ErrorKind names the way a request failed; it is empty for a success.
type ErrorKind string

// The ways a request fails. A failed request is counted by its kind and
// gives no latency figures.
const (
	// ErrStatus is an error answer other than 401 and 429: a 4xx, or a 5xx
	// still failing after the retries. Sample.Status has the code.
	ErrStatus ErrorKind = "status"
	// ErrUnauthorized is a 401: the key is missing or rejected. It is not
	// retried, and Run stops sending after a few (see UnauthorizedError).
	ErrUnauthorized ErrorKind = "unauthorized"
	// ErrRateLimited is a 429 still answered after the retries.
	ErrRateLimited ErrorKind = "rate_limited"
	// ErrTimeout is an attempt that outlived Config.Timeout, or a network
	// timeout.
	ErrTimeout ErrorKind = "timeout"
	// ErrStreamError is a 200 stream that carried an error event.
	ErrStreamError ErrorKind = "stream_error"
	// ErrTruncated is a 200 stream that ended or broke without its terminal
	// marker ([DONE] or message_stop).
	ErrTruncated ErrorKind = "truncated"
	// ErrProtocol is a 200 answer that was not an event stream, or an event
	// over the size cap.
	ErrProtocol ErrorKind = "protocol"
	// ErrNoTokens is a complete stream without a token-bearing event, which
	// gives no TTFT (vLLM fails such a request too).
	ErrNoTokens ErrorKind = "no_tokens"
	// ErrConnect is a request that got no answer: refused, reset, DNS.
	ErrConnect ErrorKind = "connect"
	// ErrCanceled is a request cut short because the run was cancelled.
	ErrCanceled ErrorKind = "canceled"
)

// Sample is one request as the client saw it. The latency figures time the
// request's last attempt, from its POST: an earlier attempt answered 429 or
// 5xx is a request of its own to the server (a gateway records it apart), and
// the wait before a retry is the client's choice, so both are reported apart
// (Attempts, Retried429, Retried5xx, RetryWait) rather than mixed into TTFT.
type Sample struct {
	Index  int    // request number, from 0, in dispatch order
	Class  string // input-size class of the prompt
	Prompt int    // index of the prompt in the set
	// Conversation and Turn place the request in a multi-turn run: the
	// conversation's number and the turn's, both from 1. Both are zero
	// when Config.Turns is 1.
	Conversation int
	Turn         int
	// Start is the last attempt's start, from the run's start.
	Start time.Duration
	// QueueWait is how long the request waited for a free slot after its
	// Poisson arrival (always zero at fixed concurrency).
	QueueWait time.Duration
	Attempts  int
	// Retried429 and Retried5xx count the attempts answered 429 or 5xx that
	// were retried; RetryWait is the time spent waiting between attempts.
	Retried429 int
	Retried5xx int
	RetryWait  time.Duration

	Status    int       // HTTP status of the last attempt; 0 without an answer
	Err       ErrorKind // empty for a success
	ErrorType string    // error.type (or code) from an error body or event

	// TTFT, TPOT and ITL are set for successes only; HasTPOT is false with
	// fewer than two output tokens. E2E is set for every request that was
	// sent.
	TTFT    time.Duration
	TPOT    time.Duration
	HasTPOT bool
	ITL     []time.Duration
	E2E     time.Duration

	TokenEvents  int   // token-bearing events
	InputTokens  int64 // from the usage; 0 when not reported
	OutputTokens int64 // from the usage, else TokenEvents' deltas
	Estimated    bool  // OutputTokens was counted, not reported
}

// OK reports whether the request succeeded.
func (s *Sample) OK() bool { return s.Err == "" }

// Goodput returns whether the request met every target in t, and if not,
// which it broke first, by the rules of llm.SLOTargets.Classify: a failed
// request is SLOFailed; TTFT, TPOT and E2E are checked in that order; a
// figure at its target meets it; a zero target and a missing TPOT are not
// checked.
func (s *Sample) Goodput(t llm.SLOTargets) llm.SLO {
	if !s.OK() {
		return llm.SLOFailed
	}
	ttft, tpot, e2e := s.broke(t)
	switch {
	case ttft:
		return llm.SLOTTFT
	case tpot:
		return llm.SLOTPOT
	case e2e:
		return llm.SLOE2E
	}
	return llm.SLOMet
}

// broke reports which targets a successful request broke, each on its own.
func (s *Sample) broke(t llm.SLOTargets) (ttft, tpot, e2e bool) {
	return t.TTFT > 0 && s.TTFT > t.TTFT,
		t.TPOT > 0 && s.HasTPOT && s.TPOT > t.TPOT,
		t.E2E > 0 && s.E2E > t.E2E
}

// Stats are the statistics of one figure in milliseconds: the mean and
// percentiles by linear interpolation between closest ranks
// (numpy.percentile's default, as vLLM reports them). All are zero when
// Count is zero.
type Stats struct {
	Count  int     `json:"count"`
	Mean   float64 `json:"mean"`
	Median float64 `json:"median"`
	P95    float64 `json:"p95"`
	P99    float64 `json:"p99"`
}

// Goodput counts the requests that succeeded and met every SLO.
type Goodput struct {
	Good int `json:"good"`
	// Ratio is Good over all requests of the class, failed ones included.
	Ratio float64 `json:"ratio"`
	// PerSecond is Good over the run's duration (vLLM's request_goodput).
	PerSecond float64 `json:"per_second"`
	// BrokeTTFT, BrokeTPOT and BrokeE2E count the successful requests that
	// broke each target; a request that broke two is in both.
	BrokeTTFT int `json:"broke_ttft"`
	BrokeTPOT int `json:"broke_tpot"`
	BrokeE2E  int `json:"broke_e2e"`
}

// Errors counts failed requests by kind (see ErrorKind).
type Errors struct {
	// Status counts ErrStatus failures by HTTP status.
	Status       map[int]int `json:"status,omitempty"`
	Unauthorized int         `json:"unauthorized"`
	RateLimited  int         `json:"rate_limited"`
	Timeout      int         `json:"timeout"`
	StreamError  int         `json:"stream_error"`
	Truncated    int         `json:"truncated"`
	Protocol     int         `json:"protocol"`
	NoTokens     int         `json:"no_tokens"`
	Connect      int         `json:"connect"`
	Canceled     int         `json:"canceled"`
}

// Total returns the number of failed requests.
func (e *Errors) Total() int {
	n := e.Unauthorized + e.RateLimited + e.Timeout + e.StreamError + e.Truncated + e.Protocol +
		e.NoTokens + e.Connect + e.Canceled
	for _, c := range e.Status {
		n += c
	}
	return n
}

func (e *Errors) add(s *Sample) {
	switch s.Err {
	case ErrStatus:
		if e.Status == nil {
			e.Status = make(map[int]int)
		}
		e.Status[s.Status]++
	case ErrUnauthorized:
		e.Unauthorized++
	case ErrRateLimited:
		e.RateLimited++
	case ErrTimeout:
		e.Timeout++
	case ErrStreamError:
		e.StreamError++
	case ErrTruncated:
		e.Truncated++
	case ErrProtocol:
		e.Protocol++
	case ErrNoTokens:
		e.NoTokens++
	case ErrConnect:
		e.Connect++
	case ErrCanceled:
		e.Canceled++
	}
}

// Retries counts retried attempts, apart from the requests' outcomes.
type Retries struct {
	RateLimited int `json:"rate_limited"` // attempts answered 429 and retried
	ServerError int `json:"server_error"` // attempts answered 5xx and retried
	Recovered   int `json:"recovered"`    // requests that succeeded after a retry
}

// Summary holds the figures of one input-size class, or of all requests.
type Summary struct {
	Class     string `json:"class"`
	Requests  int    `json:"requests"`
	Succeeded int    `json:"succeeded"`
	Failed    int    `json:"failed"`

	// Latency figures over the successful requests; ITL pools every gap of
	// every request, and TPOT leaves out requests with fewer than two
	// output tokens.
	TTFT Stats `json:"ttft_ms"`
	TPOT Stats `json:"tpot_ms"`
	ITL  Stats `json:"itl_ms"`
	E2E  Stats `json:"e2e_ms"`

	// Token totals over the successful requests; EstimatedOutput counts
	// those whose output count was not reported.
	InputTokens     int64 `json:"input_tokens"`
	OutputTokens    int64 `json:"output_tokens"`
	EstimatedOutput int   `json:"estimated_output"`

	// Throughput over the run's duration (for a class, its share of it).
	OutputTokensPerSecond float64 `json:"output_tokens_per_second"`
	RequestsPerSecond     float64 `json:"requests_per_second"`

	Goodput Goodput `json:"goodput"`
	Errors  Errors  `json:"errors"`
	Retries Retries `json:"retries"`
}

// Info describes the run, without the API key.
type Info struct {
	URL         string  `json:"url"` // request URL, credentials redacted
	Dialect     string  `json:"dialect"`
	Model       string  `json:"model"`
	Requests    int     `json:"requests"`
	Concurrency int     `json:"concurrency"`
	Rate        float64 `json:"rate"`
	MaxTokens   int     `json:"max_tokens"`
	Prompts     int     `json:"prompts"`
	Seed        int64   `json:"seed"`
	TimeoutMs   float64 `json:"timeout_ms"`
	SLOTTFTMs   float64 `json:"slo_ttft_ms,omitempty"`
	SLOTPOTMs   float64 `json:"slo_tpot_ms,omitempty"`
	SLOE2EMs    float64 `json:"slo_e2e_ms,omitempty"`
}

// Result is a run's samples and summaries.
type Result struct {
	Info    Info
	SLO     llm.SLOTargets
	Started time.Time
	// Duration runs from the first dispatch to the last request's end.
	Duration time.Duration
	// Samples are the requests sent, by Index.
	Samples []Sample
	// Summaries has one entry per input-size class present in the run, in
	// the order short, medium, long, then one for all requests.
	Summaries []Summary
	// Gateway, when set, holds the gateway's own figures for the run (see
	// GatewayWatch); the reports show them beside the client's.
	Gateway *GatewayStats
	// Conversations summarises a multi-turn run's conversations; nil when
	// Config.Turns is 1.
	Conversations *Conversations
}

// Summary returns the summary of class (ClassAll for every request), or nil
// when no request of that class was sent.
func (r *Result) Summary(class string) *Summary {
	for i := range r.Summaries {
		if r.Summaries[i].Class == class {
			return &r.Summaries[i]
		}
	}
	return nil
}

func newResult(cfg Config, started time.Time, d time.Duration, samples []Sample) *Result {
	// settle has validated the URL: neither call fails.
	rawURL, _ := endpoint(cfg.BaseURL, cfg.Dialect)
	if u, err := url.Parse(rawURL); err == nil {
		rawURL = u.Redacted()
	}
	res := &Result{
		Info: Info{
			URL: rawURL, Dialect: cfg.Dialect.String(), Model: cfg.Model,
			Requests: cfg.Requests, Concurrency: cfg.Concurrency, Rate: cfg.Rate,
			MaxTokens: cfg.MaxTokens, Prompts: len(cfg.Prompts), Seed: cfg.Seed,
			TimeoutMs: ms(cfg.Timeout), SLOTTFTMs: ms(cfg.SLO.TTFT),
			SLOTPOTMs: ms(cfg.SLO.TPOT), SLOE2EMs: ms(cfg.SLO.E2E),
		},
		SLO:      cfg.SLO,
		Started:  started,
		Duration: d,
		Samples:  samples,
	}
	res.Summaries = summarize(samples, cfg.SLO, d)
	res.Conversations = summarizeConversations(cfg, samples)
	return res
}

// summarize builds the per-class and overall summaries of samples.
func summarize(samples []Sample, slo llm.SLOTargets, d time.Duration) []Summary {
	var out []Summary
	for _, c := range classOrder {
		var of []*Sample
		for i := range samples {
			if samples[i].Class == c {
				of = append(of, &samples[i])
			}
		}
		if len(of) > 0 {
			out = append(out, summarizeClass(c, of, slo, d))
		}
	}
	all := make([]*Sample, len(samples))
	for i := range samples {
		all[i] = &samples[i]
	}
	return append(out, summarizeClass(ClassAll, all, slo, d))
}

func summarizeClass(class string, samples []*Sample, slo llm.SLOTargets, d time.Duration) Summary {
	sum := Summary{Class: class, Requests: len(samples)}
	var ttft, tpot, itl, e2e []float64
	for _, s := range samples {
		sum.Retries.RateLimited += s.Retried429
		sum.Retries.ServerError += s.Retried5xx
		if !s.OK() {
			sum.Failed++
			sum.Errors.add(s)
			continue
		}
		sum.Succeeded++
		if s.Attempts > 1 {
			sum.Retries.Recovered++
		}
		ttft = append(ttft, ms(s.TTFT))
		e2e = append(e2e, ms(s.E2E))
		if s.HasTPOT {
			tpot = append(tpot, ms(s.TPOT))
		}
		for _, g := range s.ITL {
			itl = append(itl, ms(g))
		}
		sum.InputTokens += s.InputTokens
		sum.OutputTokens += s.OutputTokens
		if s.Estimated {
			sum.EstimatedOutput++
		}
		bt, bp, be := s.broke(slo)
		if bt {
			sum.Goodput.BrokeTTFT++
		}
		if bp {
			sum.Goodput.BrokeTPOT++
		}
		if be {
			sum.Goodput.BrokeE2E++
		}
		if !bt && !bp && !be {
			sum.Goodput.Good++
		}
	}
	sum.TTFT, sum.TPOT, sum.ITL, sum.E2E = stats(ttft), stats(tpot), stats(itl), stats(e2e)
	if sum.Requests > 0 {
		sum.Goodput.Ratio = float64(sum.Goodput.Good) / float64(sum.Requests)
	}
	if secs := d.Seconds(); secs > 0 {
		sum.OutputTokensPerSecond = float64(sum.OutputTokens) / secs
		sum.RequestsPerSecond = float64(sum.Succeeded) / secs
		sum.Goodput.PerSecond = float64(sum.Goodput.Good) / secs
	}
	return sum
}

// ms converts d to milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// stats sorts v and returns its statistics.
func stats(v []float64) Stats {
	if len(v) == 0 {
		return Stats{}
	}
	slices.Sort(v)
	var total float64
	for _, x := range v {
		total += x
	}
	return Stats{
		Count:  len(v),
		Mean:   total / float64(len(v)),
		Median: percentile(v, 50),
		P95:    percentile(v, 95),
		P99:    percentile(v, 99),
	}
}

// percentile returns the p-th percentile of sorted by linear interpolation
// between the closest ranks (numpy.percentile's default method).
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := p / 100 * float64(len(sorted)-1)
	lo := int(math.Floor(rank))
	hi := min(lo+1, len(sorted)-1)
	return sorted[lo] + (sorted[hi]-sorted[lo])*(rank-float64(lo))
}

// jsonSample is a Sample in the JSON report, durations in milliseconds.
type jsonSample struct {
	Index        int       `json:"index"`
	Class        string    `json:"class"`
	Prompt       int       `json:"prompt"`
	Conversation int       `json:"conversation,omitempty"`
	Turn         int       `json:"turn,omitempty"`
	StartMs      float64   `json:"start_ms"`
	QueueWaitMs  float64   `json:"queue_wait_ms,omitempty"`
	Attempts     int       `json:"attempts"`
	Retried429   int       `json:"retried_429,omitempty"`
	Retried5xx   int       `json:"retried_5xx,omitempty"`
	RetryWaitMs  float64   `json:"retry_wait_ms,omitempty"`
	Status       int       `json:"status"`
	Error        ErrorKind `json:"error,omitempty"`
	ErrorType    string    `json:"error_type,omitempty"`
	Goodput      string    `json:"goodput"`
	TTFTMs       float64   `json:"ttft_ms,omitempty"`
	TPOTMs       *float64  `json:"tpot_ms,omitempty"`
	E2EMs        float64   `json:"e2e_ms"`
	ITLMs        []float64 `json:"itl_ms,omitempty"`
	TokenEvents  int       `json:"token_events"`
	InputTokens  int64     `json:"input_tokens"`
	OutputTokens int64     `json:"output_tokens"`
	Estimated    bool      `json:"output_estimated,omitempty"`
}

// WriteJSON writes the result as one JSON object: "run" (Info), "started",
// "duration_s", "summaries", "conversations" (of a multi-turn run),
// "gateway" (GatewayStats, when set) and "samples", durations in
// milliseconds.
func (r *Result) WriteJSON(w io.Writer) error {
	samples := make([]jsonSample, len(r.Samples))
	for i := range r.Samples {
		s := &r.Samples[i]
		js := jsonSample{
			Index: s.Index, Class: s.Class, Prompt: s.Prompt, Conversation: s.Conversation, Turn: s.Turn,
			StartMs: ms(s.Start), QueueWaitMs: ms(s.QueueWait), Attempts: s.Attempts,
			Retried429: s.Retried429, Retried5xx: s.Retried5xx, RetryWaitMs: ms(s.RetryWait),
			Status: s.Status, Error: s.Err, ErrorType: s.ErrorType,
			Goodput: s.Goodput(r.SLO).String(),
			TTFTMs:  ms(s.TTFT), E2EMs: ms(s.E2E),
			TokenEvents: s.TokenEvents, InputTokens: s.InputTokens,
			OutputTokens: s.OutputTokens, Estimated: s.Estimated,
		}
		if s.HasTPOT {
			v := ms(s.TPOT)
			js.TPOTMs = &v
		}
		if len(s.ITL) > 0 {
			js.ITLMs = make([]float64, len(s.ITL))
			for j, g := range s.ITL {
				js.ITLMs[j] = ms(g)
			}
		}
		samples[i] = js
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	err := enc.Encode(struct {
		Run           Info           `json:"run"`
		Started       time.Time      `json:"started"`
		DurationS     float64        `json:"duration_s"`
		Summaries     []Summary      `json:"summaries"`
		Conversations *Conversations `json:"conversations,omitempty"`
		Gateway       *GatewayStats  `json:"gateway,omitempty"`
		Samples       []jsonSample   `json:"samples"`
	}{r.Info, r.Started, r.Duration.Seconds(), r.Summaries, r.Conversations, r.Gateway, samples})
	if err != nil {
		return fmt.Errorf("bench: writing JSON: %w", err)
	}
	return nil
}

// WriteTable writes the result as a human-readable table: one column per
// input-size class and one for all requests, then, when Gateway is set, the
// client's figures beside the gateway's.
func (r *Result) WriteTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s, model %s\n", r.Info.Dialect, r.Info.URL, r.Info.Model)
	mode := fmt.Sprintf("concurrency %d", r.Info.Concurrency)
	if r.Info.Rate > 0 {
		mode = fmt.Sprintf("%g req/s (Poisson), concurrency cap %d", r.Info.Rate, r.Info.Concurrency)
	}
	fmt.Fprintf(&b, "%d of %d requests sent, %s, max tokens %d, %.2f s\n",
		len(r.Samples), r.Info.Requests, mode, r.Info.MaxTokens, r.Duration.Seconds())
	if slo := sloText(r.SLO); slo != "" {
		fmt.Fprintf(&b, "SLO: %s\n", slo)
	}
	b.WriteByte('\n')

	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	row := func(label string, cell func(s *Summary) string) {
		fmt.Fprint(tw, label)
		for i := range r.Summaries {
			fmt.Fprint(tw, "\t", cell(&r.Summaries[i]))
		}
		fmt.Fprintln(tw, "\t")
	}
	row("", func(s *Summary) string { return s.Class })
	row("requests", func(s *Summary) string { return strconv.Itoa(s.Requests) })
	row("succeeded", func(s *Summary) string { return strconv.Itoa(s.Succeeded) })
	row("failed", func(s *Summary) string { return strconv.Itoa(s.Failed) })
	for _, f := range []struct {
		name string
		get  func(s *Summary) *Stats
	}{
		{"TTFT", func(s *Summary) *Stats { return &s.TTFT }},
		{"TPOT", func(s *Summary) *Stats { return &s.TPOT }},
		{"ITL", func(s *Summary) *Stats { return &s.ITL }},
		{"E2E", func(s *Summary) *Stats { return &s.E2E }},
	} {
		row(f.name+" mean ms", func(s *Summary) string { return msCell(f.get(s), f.get(s).Mean) })
		row(f.name+" median ms", func(s *Summary) string { return msCell(f.get(s), f.get(s).Median) })
		row(f.name+" P95 ms", func(s *Summary) string { return msCell(f.get(s), f.get(s).P95) })
		row(f.name+" P99 ms", func(s *Summary) string { return msCell(f.get(s), f.get(s).P99) })
	}
	row("output tokens", func(s *Summary) string {
		if s.EstimatedOutput > 0 {
			return fmt.Sprintf("%d (%d est.)", s.OutputTokens, s.EstimatedOutput)
		}
		return strconv.FormatInt(s.OutputTokens, 10)
	})
	row("output tokens/s", func(s *Summary) string { return fmt.Sprintf("%.1f", s.OutputTokensPerSecond) })
	row("requests/s", func(s *Summary) string { return fmt.Sprintf("%.2f", s.RequestsPerSecond) })
	row("goodput", func(s *Summary) string {
		return fmt.Sprintf("%d (%.1f%%)", s.Goodput.Good, 100*s.Goodput.Ratio)
	})
	row("broke TTFT/TPOT/E2E", func(s *Summary) string {
		return fmt.Sprintf("%d/%d/%d", s.Goodput.BrokeTTFT, s.Goodput.BrokeTPOT, s.Goodput.BrokeE2E)
	})
	row("errors", func(s *Summary) string { return errorsText(&s.Errors) })
	row("retried 429/5xx", func(s *Summary) string {
		return fmt.Sprintf("%d/%d", s.Retries.RateLimited, s.Retries.ServerError)
	})
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("bench: writing table: %w", err)
	}
	if r.Conversations != nil {
		r.Conversations.writeTable(&b)
	}
	if r.Gateway != nil {
		if err := r.Gateway.writeTable(&b); err != nil {
			return fmt.Errorf("bench: writing table: %w", err)
		}
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("bench: writing table: %w", err)
	}
	return nil
}

func msCell(st *Stats, v float64) string {
	if st.Count == 0 {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

func sloText(t llm.SLOTargets) string {
	var parts []string
	for _, p := range []struct {
		name string
		d    time.Duration
	}{{"TTFT", t.TTFT}, {"TPOT", t.TPOT}, {"E2E", t.E2E}} {
		if p.d > 0 {
			parts = append(parts, p.name+" ≤ "+p.d.String())
		}
	}
	return strings.Join(parts, ", ")
}

// errorsText lists the non-zero error counts, e.g. "500:2 timeout:1".
func errorsText(e *Errors) string {
	var parts []string
	codes := make([]int, 0, len(e.Status))
	for c := range e.Status {
		codes = append(codes, c)
	}
	slices.Sort(codes)
	for _, c := range codes {
		parts = append(parts, fmt.Sprintf("%d:%d", c, e.Status[c]))
	}
	for _, k := range []struct {
		name string
		n    int
	}{
		{"401", e.Unauthorized}, {"429", e.RateLimited}, {"timeout", e.Timeout}, {"stream_error", e.StreamError},
		{"truncated", e.Truncated}, {"protocol", e.Protocol}, {"no_tokens", e.NoTokens},
		{"connect", e.Connect}, {"canceled", e.Canceled},
	} {
		if k.n > 0 {
			parts = append(parts, fmt.Sprintf("%s:%d", k.name, k.n))
		}
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}
