package proxy

// Regression tests for the review of issue 4 (commit "Review fixes: held
// preamble kept, budget before the wait, probes at first token, hold
// capped"): the held opening of a stream reaches the caller byte for byte,
// a refused retry never makes the caller wait, a half-open probe is released
// at its stream's first token, the hold is capped, account errors do not
// open a breaker, a connect timeout is a connect error, other model calls
// are repeated only when the upstream surely did not act, and the header
// phase follows the request. Each failed on the parent commit.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/metrics"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/spend"
)

// holdChat is a streamed chat request that does not ask for usage, so the
// gateway asks for it and withholds the usage-only chunk.
const holdChat = `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}`

// holdChatPlain is the same request, not streamed.
const holdChatPlain = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`

// holdRun relays body through a fresh exchange with the opening held (as
// when another attempt could follow) and returns the exchange and the
// attempt's result.
func holdRun(g *Gateway, w http.ResponseWriter, d llm.Dialect, suppress bool, body io.Reader) (*exchange, attemptResult) {
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	ex := &exchange{g: g, w: w, r: r, up: g.upstreams[0], modelLabel: "m"}
	ex.rec.Route, ex.rec.Dialect, ex.rec.Status = llm.RouteChatCompletions, d, http.StatusOK
	ex.rec.Timing.In = g.now()
	ex.info.suppressUsage = suppress
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	res := ex.relay(ctx, cancel, sseResponse(body), true, &phaseTimer{})
	return ex, res
}

// holdSplit cuts s into reads of 1 to maxRead bytes drawn from rng.
func holdSplit(rng *rand.Rand, s string, maxRead int) [][]byte {
	var reads [][]byte
	for s != "" {
		n := 1 + rng.IntN(min(len(s), maxRead))
		reads = append(reads, []byte(s[:n]))
		s = s[n:]
	}
	return reads
}

// holdFirstDiff describes where got first differs from want.
func holdFirstDiff(got []byte, want string) string {
	i := 0
	for i < min(len(got), len(want)) && got[i] == want[i] {
		i++
	}
	return fmt.Sprintf("got %d bytes, want %d; first difference at %d: got %q, want %q",
		len(got), len(want), i, got[i:min(i+24, len(got))], want[i:min(i+24, len(want))])
}

// TestHoldRandomSplitsByteExact: whatever the read boundaries and line ends,
// a held stream reaches the caller byte for byte (the withheld usage chunk
// aside), and a relayed token sets t_first_token_out. Before the fix a
// stream with no token lost its held opening when the usage chunk committed
// it, and CR/CRLF splits at the hold's edge lost or duplicated bytes.
func TestHoldRandomSplitsByteExact(t *testing.T) {
	ping := "event: ping\ndata: {\"type\":\"ping\"}\n\n"
	manyPings := strings.Repeat(ping, 40<<10/len(ping)) // more than one relay buffer
	bigComment := ": " + strings.Repeat("p", 40<<10) + "\n\n"
	keepAlives := strings.Repeat(": keep-alive\n\n", 3000)
	ms := anthropicText[:strings.Index(anthropicText, "event: content_block_start")]
	rest := anthropicText[len(ms):]
	cases := []struct {
		name     string
		d        llm.Dialect
		in, want string
		suppress bool
	}{
		{"openai keep-alive and withheld usage", llm.DialectOpenAI,
			openAIRole + ": keep-alive\n\n" + openAITok1 + openAITok2 + openAIStop + openAIUsage + openAIDone,
			openAIRole + ": keep-alive\n\n" + openAITok1 + openAITok2 + openAIStop + openAIDone, true},
		{"openai no token", llm.DialectOpenAI,
			openAIRole + openAIStop + openAIUsage + openAIDone,
			openAIRole + openAIStop + openAIDone, true},
		{"openai many keep-alives", llm.DialectOpenAI,
			openAIRole + keepAlives + openAITok1 + openAIStop + openAIUsage + openAIDone,
			openAIRole + keepAlives + openAITok1 + openAIStop + openAIDone, true},
		{"anthropic many pings", llm.DialectAnthropic, ms + manyPings + rest, ms + manyPings + rest, false},
		{"anthropic big comment", llm.DialectAnthropic, ms + bigComment + rest, ms + bigComment + rest, false},
	}
	const iterations = 48
	maxReads := []int{7, 300, 5000, 70000}
	rng := rand.New(rand.NewPCG(3, 4)) // fixed seed: a failure replays
	for _, c := range cases {
		for _, eol := range []string{"\n", "\r\n", "\r"} {
			t.Run(fmt.Sprintf("%s/eol %q", c.name, eol), func(t *testing.T) {
				in := strings.ReplaceAll(c.in, "\n", eol)
				want := strings.ReplaceAll(c.want, "\n", eol)
				g := edgeGateway(t, 0)
				bad, noTTFT := 0, 0
				for iter := range iterations {
					reads := holdSplit(rng, in, maxReads[iter%len(maxReads)])
					w := &recWriter{h: http.Header{}}
					ex, res := holdRun(g, w, c.d, c.suppress, &scriptReader{reads: reads})
					if string(w.written) != want || !res.done {
						if bad++; bad == 1 {
							t.Errorf("iteration %d (%d reads): done=%v result=%s; %s",
								iter, len(reads), res.done, res.result, holdFirstDiff(w.written, want))
						}
					}
					if ex.rec.TokenEvents > 0 && ex.rec.Timing.FirstTokenOut.IsZero() {
						noTTFT++
					}
				}
				if bad > 0 {
					t.Errorf("%d of %d splits delivered the wrong bytes", bad, iterations)
				}
				if noTTFT > 0 {
					t.Errorf("%d of %d streams relayed a token without t_first_token_out", noTTFT, iterations)
				}
			})
		}
	}
}

// TestHoldHeldEndKeepsCompleteEvents: a held stream that ends before its
// first token keeps exactly its complete events, wherever the one read
// boundary falls, and writes nothing to the caller. Before the fix a CRLF
// split between reads lost the final LF of the held body.
func TestHoldHeldEndKeepsCompleteEvents(t *testing.T) {
	opening := anthropicText[:strings.Index(anthropicText, "event: content_block_delta")]
	for _, eol := range []string{"\n", "\r\n"} {
		in := strings.ReplaceAll(opening, "\n", eol)
		g := edgeGateway(t, 0)
		for cut := 1; cut < len(in); cut++ {
			w := &recWriter{h: http.Header{}}
			body := &scriptReader{reads: [][]byte{[]byte(in[:cut]), []byte(in[cut:])}}
			_, res := holdRun(g, w, llm.DialectAnthropic, false, body)
			if res.fail == nil || res.done || !res.retryable {
				t.Fatalf("eol %q cut %d: result %s done=%v retryable=%v fail=%v; want a retryable held failure",
					eol, cut, res.result, res.done, res.retryable, res.fail != nil)
			}
			if string(res.fail.body) != in {
				t.Errorf("eol %q cut %d: held body %s", eol, cut, holdFirstDiff(res.fail.body, in))
			}
			if len(w.written) != 0 {
				t.Errorf("eol %q cut %d: %d bytes written while holding", eol, cut, len(w.written))
			}
		}
	}
}

// holdLockstep is an upstream transport that counts the body bytes the
// gateway has read, so an upstream handler can send its next piece only
// once the gateway has read every byte before it: each piece then arrives
// in reads of its own, without sleeping.
type holdLockstep struct {
	tr      *http.Transport
	read    atomic.Int64
	changed chan struct{} // capacity 1: a pending wake-up is never lost
}

func newHoldLockstep(t *testing.T) *holdLockstep {
	l := &holdLockstep{tr: &http.Transport{}, changed: make(chan struct{}, 1)}
	t.Cleanup(l.tr.CloseIdleConnections)
	return l
}

func (l *holdLockstep) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := l.tr.RoundTrip(r)
	if err == nil {
		resp.Body = &holdCountedBody{ReadCloser: resp.Body, l: l}
	}
	return resp, err
}

// waitRead waits (at most 5 s) until the gateway has read n body bytes.
func (l *holdLockstep) waitRead(n int64) bool {
	limit := time.NewTimer(5 * time.Second)
	defer limit.Stop()
	for l.read.Load() < n {
		select {
		case <-l.changed:
		case <-limit.C:
			return false
		}
	}
	return true
}

type holdCountedBody struct {
	io.ReadCloser
	l *holdLockstep
}

func (b *holdCountedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.l.read.Add(int64(n))
		select {
		case b.l.changed <- struct{}{}:
		default:
		}
	}
	return n, err
}

// TestHoldNoTokenStreamReachesCaller: end to end, a stream with no token
// (role chunk, finish_reason "length", usage, [DONE], each read apart)
// reaches the caller whole, the withheld usage chunk aside. Before the fix
// the usage chunk committed the stream and the held role and finish chunks
// were dropped.
func TestHoldNoTokenStreamReachesCaller(t *testing.T) {
	length := strings.Replace(openAIStop, `"stop"`, `"length"`, 1)
	pieces := []string{openAIRole, length, openAIUsage + openAIDone}
	ls := newHoldLockstep(t)
	var hits atomic.Int32
	var stalled atomic.Bool
	us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		sent := 0
		for _, p := range pieces {
			_, _ = io.WriteString(w, p)
			_ = rc.Flush()
			sent += len(p)
			if !ls.waitRead(int64(sent)) {
				stalled.Store(true)
				return
			}
		}
	}))
	defer us.Close()
	tg := newTestGatewayWith(t, us.URL, nil, func(o *Options) { o.Transport = ls })
	resp, body := post(t, tg.URL+"/v1/chat/completions", holdChat, nil)
	rec := tg.record(t)
	if stalled.Load() {
		t.Fatal("the gateway stopped reading the upstream mid-stream")
	}
	if want := openAIRole + length + openAIDone; resp.StatusCode != http.StatusOK || string(body) != want {
		t.Errorf("caller got %d; %s", resp.StatusCode, holdFirstDiff(body, want))
	}
	if rec.Outcome != llm.OutcomeOK || hits.Load() != 1 {
		t.Errorf("record outcome %s, upstream hits %d; want ok, 1", rec.Outcome, hits.Load())
	}
	if !rec.Usage.HasOutput || rec.Usage.Output != 8 {
		t.Errorf("record usage %+v; want the withheld chunk's 8 output tokens", rec.Usage)
	}
}

// TestHoldRefusedRetryDoesNotWait: a retry the budget or the breaker will
// refuse is refused before the Retry-After wait, not after it: the caller
// gets the upstream's 429 at once and the record shows no wait. Before the
// fix the gateway slept the 1.5 s hint and only then found the budget empty
// (or the breaker open).
func TestHoldRefusedRetryDoesNotWait(t *testing.T) {
	const errBody = `{"error":{"message":"slow down","type":"requests","param":null,"code":"rate_limit_exceeded"}}`
	cases := []struct {
		name string
		edit func(u *config.Upstream)
		why  string
	}{
		{"empty budget", func(u *config.Upstream) {
			u.Retry.BudgetRatio, u.Retry.BudgetMinPerSecond = 0, 0
		}, skipBudget},
		{"breaker opened by the attempt", func(u *config.Upstream) {
			u.Breaker.ConsecutiveFailures = 1
		}, skipBreakerOpen},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var hits atomic.Int32
			us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				hits.Add(1)
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Retry-After-Ms", "1500")
				w.WriteHeader(http.StatusTooManyRequests)
				_, _ = io.WriteString(w, errBody)
			}))
			defer us.Close()
			tg := newTestGateway(t, us.URL, func(cfg *config.Config) { c.edit(&cfg.Upstreams[0]) })
			resp, body := post(t, tg.URL+"/v1/chat/completions", holdChatPlain, nil)
			rec := tg.record(t)
			if resp.StatusCode != http.StatusTooManyRequests || string(body) != errBody {
				t.Errorf("caller got %d %q; want the upstream's 429", resp.StatusCode, body)
			}
			if rec.RetryWait != 0 {
				t.Errorf("record retry wait %v for a retry that was not taken; want 0", rec.RetryWait)
			}
			if hits.Load() != 1 {
				t.Errorf("upstream hits %d, want 1", hits.Load())
			}
			wantAttempts(t, rec, "mock:429:rate_limited")
			if v := metricValue(t, tg, "tollgate_upstream_retries_skipped_total",
				map[string]string{"upstream": "mock", "why": c.why}); v != 1 {
				t.Errorf("retries skipped {why=%q} = %v, want 1", c.why, v)
			}
		})
	}
}

// holdProbeUpstream answers its first request 500, its second with a stream
// that sends its first token and waits for release, and later ones with a
// whole stream.
type holdProbeUpstream struct {
	hits    atomic.Int32
	release chan struct{}
}

func (u *holdProbeUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	switch u.hits.Add(1) {
	case 1:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, `{"error":{"message":"boom","type":"server_error","param":null,"code":null}}`)
	case 2:
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, openAIRole+openAITok1)
		_ = http.NewResponseController(w).Flush()
		select {
		case <-u.release:
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, openAITok2+openAIStop+openAIUsage+openAIDone)
	default:
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, openAIRole+openAITok1+openAIStop+openAIUsage+openAIDone)
	}
}

// TestHoldProbeReleasedAtFirstToken: a half-open probe that is a stream
// reports the upstream healthy at its first token, so the breaker closes
// and the next request reaches the upstream while the probe still streams.
// Before the fix the probe held its slot to the end of its stream and every
// other request got 503.
func TestHoldProbeReleasedAtFirstToken(t *testing.T) {
	clk := newFakeClock()
	up := &holdProbeUpstream{release: make(chan struct{})}
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(up.release) }) }
	us := httptest.NewServer(up)
	defer us.Close()
	defer release() // before us.Close: the probe's handler must end
	tg := newTestGatewayWith(t, us.URL, func(c *config.Config) {
		u := &c.Upstreams[0]
		u.Retry.BaseDelayMs, u.Retry.MaxDelayMs = 1, 2
		u.Breaker.ConsecutiveFailures, u.Breaker.CooldownSeconds, u.Breaker.HalfOpenProbes = 1, 5, 1
	}, func(o *Options) { o.Now = clk.Now })
	state := func() float64 {
		return metricValue(t, tg, "tollgate_upstream_circuit_state", map[string]string{"upstream": "mock"})
	}

	// One failure opens the circuit.
	if resp, _ := post(t, tg.URL+"/v1/chat/completions", holdChatPlain, nil); resp.StatusCode != http.StatusInternalServerError {
		t.Fatalf("first request: %d, want the upstream's 500", resp.StatusCode)
	}
	tg.record(t)
	if s := state(); s != metrics.CircuitOpen {
		t.Fatalf("circuit state %v after the failure, want open", s)
	}
	clk.Advance(6 * time.Second) // past the cooldown: the next request is the probe

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, tg.URL+"/v1/chat/completions", strings.NewReader(holdChat))
	if err != nil {
		t.Fatal(err)
	}
	probe, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Body.Close()
	var got bytes.Buffer
	br := bufio.NewReader(probe.Body)
	for !strings.Contains(got.String(), openAITok1) {
		line, err := br.ReadBytes('\n')
		got.Write(line)
		if err != nil {
			t.Fatalf("probe stream ended before its first token (%v): %q", err, got.String())
		}
	}
	// The caller has the probe's first token; the probe still streams.
	if s := state(); s != metrics.CircuitClosed {
		t.Errorf("circuit state %v once the probe's first token is out, want closed", s)
	}
	resp, body := post(t, tg.URL+"/v1/chat/completions", holdChat, nil)
	if want := openAIRole + openAITok1 + openAIStop + openAIDone; resp.StatusCode != http.StatusOK || string(body) != want {
		t.Errorf("request during the probe stream: %d %q; want the upstream's stream", resp.StatusCode, body)
	}
	if n := up.hits.Load(); n != 3 {
		t.Errorf("upstream hits %d, want 3 (failure, probe, the request during the probe)", n)
	}
	release()
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatalf("reading the rest of the probe: %v", err)
	}
	got.Write(rest)
	if want := openAIRole + openAITok1 + openAITok2 + openAIStop + openAIDone; got.String() != want {
		t.Errorf("probe stream: %s", holdFirstDiff(got.Bytes(), want))
	}
}

// TestHoldBreakAfterFirstTokenCounts: a stream reported healthy at its
// first token and broken by the upstream later still counts as a failure:
// one such break opens a breaker set to open after one failure. Not a
// failure on the parent commit (which reported the ticket at the end);
// it guards the early report against losing the later failure.
func TestHoldBreakAfterFirstTokenCounts(t *testing.T) {
	var hits atomic.Int32
	us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, openAIRole+openAITok1) // then the body ends, no [DONE]
	}))
	defer us.Close()
	tg := newTestGatewayWith(t, us.URL, func(c *config.Config) {
		c.Upstreams[0].Breaker.ConsecutiveFailures = 1
	}, func(o *Options) { o.Now = newFakeClock().Now })
	resp, body := post(t, tg.URL+"/v1/chat/completions", holdChat, nil)
	rec := tg.record(t)
	if want := openAIRole + openAITok1 + string(openAIBrokenEvent); resp.StatusCode != http.StatusOK || string(body) != want {
		t.Errorf("caller got %d %q; want the token, then the gateway's error event", resp.StatusCode, body)
	}
	if rec.Interruption != llm.InterruptUpstreamEOF || hits.Load() != 1 {
		t.Errorf("record interruption %s, upstream hits %d; want upstream_eof, 1", rec.Interruption, hits.Load())
	}
	if s := metricValue(t, tg, "tollgate_upstream_circuit_state", map[string]string{"upstream": "mock"}); s != metrics.CircuitOpen {
		t.Errorf("circuit state %v after a stream broken after its first token, want open (%d)", s, metrics.CircuitOpen)
	}
	if n := metricValue(t, tg, "tollgate_upstream_circuit_transitions_total",
		map[string]string{"upstream": "mock", "to": "open"}); n != 1 {
		t.Errorf("transitions to open: %v, want 1", n)
	}
}

// holdWriter is a ResponseWriter that records the status written and what
// had been flushed.
type holdWriter struct {
	h       http.Header
	status  int
	written []byte
	flushed int // len(written) at the last Flush
}

func (w *holdWriter) Header() http.Header { return w.h }
func (w *holdWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	w.written = append(w.written, p...)
	return len(p), nil
}
func (w *holdWriter) WriteHeader(s int) {
	if w.status == 0 {
		w.status = s
	}
}
func (w *holdWriter) Flush() { w.flushed = len(w.written) }

// TestHoldCapCommitsKeepAlives: on the gateway's clock, a stream still
// without a token 10 s after its hold began is committed at its next read,
// so its headers, opening events and keep-alives reach the caller (and its
// proxies) before any token. Before the fix the opening was held until the
// first token, however long that took.
func TestHoldCapCommitsKeepAlives(t *testing.T) {
	ms := anthropicText[:strings.Index(anthropicText, "event: content_block_start")]
	ping := "event: ping\ndata: {\"type\":\"ping\"}\n\n"
	cases := []struct {
		name            string
		d               llm.Dialect
		opening, beat   string
		tail, wantTotal string
		suppress        bool
	}{
		{"openai", llm.DialectOpenAI, openAIRole, ": keep-alive\n\n",
			openAITok1 + openAIStop + openAIUsage + openAIDone, openAITok1 + openAIStop + openAIDone, true},
		{"anthropic", llm.DialectAnthropic, ms, ping,
			anthropicText[len(ms):], anthropicText[len(ms):], false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clk := newFakeClock()
			cfg := config.DemoConfig("http://127.0.0.1:1")
			cfg.Auth.RequireKey = false
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			m, err := metrics.New(prometheus.NewRegistry(), &cfg)
			if err != nil {
				t.Fatal(err)
			}
			g, err := New(Options{Config: &cfg, Metrics: m, Now: clk.Now, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			w := &holdWriter{h: http.Header{}}
			// Reads: the opening, a beat 4 s later (still held), a beat 7 s
			// after that (11 s: the hold ends), then the first token.
			var atHeld, atCap holdWriter
			body := &scriptReader{
				reads: [][]byte{[]byte(c.opening), []byte(c.beat), []byte(c.beat), []byte(c.tail)},
				before: func(i int) {
					switch i {
					case 1:
						clk.Advance(4 * time.Second)
					case 2:
						atHeld = *w
						clk.Advance(7 * time.Second)
					case 3:
						atCap = *w
					}
				},
			}
			ex, res := holdRun(g, w, c.d, c.suppress, body)
			if atHeld.status != 0 || len(atHeld.written) != 0 {
				t.Errorf("4 s into the hold: status %d, %d bytes written; want nothing yet", atHeld.status, len(atHeld.written))
			}
			wantCap := c.opening + c.beat + c.beat
			if atCap.status != http.StatusOK || string(atCap.written[:atCap.flushed]) != wantCap {
				t.Errorf("11 s into the hold, before the first token: status %d, flushed %s",
					atCap.status, holdFirstDiff(atCap.written[:atCap.flushed], wantCap))
			}
			if want := wantCap + c.wantTotal; string(w.written) != want || !res.done {
				t.Errorf("whole stream: done=%v; %s", res.done, holdFirstDiff(w.written, want))
			}
			if ex.rec.Outcome != llm.OutcomeOK || ex.rec.Timing.FirstTokenOut.IsZero() {
				t.Errorf("record outcome %s, first token out %v; want ok and set", ex.rec.Outcome, ex.rec.Timing.FirstTokenOut)
			}
		})
	}
}

// TestHoldQuotaDoesNotOpenBreaker: insufficient_quota (a 429 no retry can
// fix) says nothing about the upstream's health, so two of them leave a
// breaker set to open after one failure closed; a plain 500 then opens it.
// Before the fix the first quota answer opened the circuit and the second
// request got the gateway's 503.
func TestHoldQuotaDoesNotOpenBreaker(t *testing.T) {
	// With retries possible the error body is read before deciding; on the
	// last attempt (max_attempts 1) it is relayed first and judged after.
	for _, attempts := range []int{3, 1} {
		t.Run(fmt.Sprintf("max_attempts=%d", attempts), func(t *testing.T) { holdQuotaBreaker(t, attempts) })
	}
}

func holdQuotaBreaker(t *testing.T, attempts int) {
	const quota = `{"error":{"message":"You exceeded your current quota.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`
	var hits atomic.Int32
	us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		if hits.Add(1) <= 2 {
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, quota)
			return
		}
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, `{"error":{"message":"boom","type":"server_error","param":null,"code":null}}`)
	}))
	defer us.Close()
	tg := newTestGatewayWith(t, us.URL, func(c *config.Config) {
		u := &c.Upstreams[0]
		u.Retry.BaseDelayMs, u.Retry.MaxDelayMs = 1, 2
		u.Retry.MaxAttempts = attempts
		u.Breaker.ConsecutiveFailures = 1
	}, func(o *Options) { o.Now = newFakeClock().Now })
	state := func() float64 {
		return metricValue(t, tg, "tollgate_upstream_circuit_state", map[string]string{"upstream": "mock"})
	}
	for i := range 2 {
		resp, body := post(t, tg.URL+"/v1/chat/completions", holdChatPlain, nil)
		if resp.StatusCode != http.StatusTooManyRequests || string(body) != quota {
			t.Fatalf("quota request %d: %d %q; want the upstream's 429", i+1, resp.StatusCode, body)
		}
		wantAttempts(t, tg.record(t), "mock:429:rate_limited")
		if s := state(); s != metrics.CircuitClosed {
			t.Errorf("circuit state %v after %d quota answers, want closed", s, i+1)
		}
	}
	resp, _ := post(t, tg.URL+"/v1/chat/completions", holdChatPlain, nil)
	tg.record(t)
	if resp.StatusCode != http.StatusInternalServerError {
		t.Errorf("plain failure: %d, want the upstream's 500", resp.StatusCode)
	}
	if s := state(); s != metrics.CircuitOpen {
		t.Errorf("circuit state %v after a 500, want open", s)
	}
	if n := hits.Load(); n != 3 {
		t.Errorf("upstream hits %d, want 3", n)
	}
}

// holdTimeoutErr is a net.Error that timed out, as a dialer's deadline
// gives.
type holdTimeoutErr struct{}

func (holdTimeoutErr) Error() string   { return "i/o timeout" }
func (holdTimeoutErr) Timeout() bool   { return true }
func (holdTimeoutErr) Temporary() bool { return true }

// TestHoldConnectTimeoutIsConnectError: a dial that runs out of
// connect_timeout_seconds is a connect error (502 upstream_unreachable, the
// attempt's result connect_error), not an upstream timeout. Before the fix
// the timeout test came first and it was a 504 "timeout".
func TestHoldConnectTimeoutIsConnectError(t *testing.T) {
	t.Run("real dial", func(t *testing.T) {
		// A 1 ns connect timeout expires before the dial starts: the
		// dialer returns its own *net.OpError "dial ... i/o timeout",
		// without touching the listening upstream.
		var hits atomic.Int32
		us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
		defer us.Close()
		tg := newTestGateway(t, us.URL, func(c *config.Config) {
			c.Upstreams[0].ConnectTimeoutSeconds = 1e-9
			c.Upstreams[0].Retry.MaxAttempts = 1
		})
		if d := config.Seconds(tg.gw.cfg.Upstreams[0].ConnectTimeoutSeconds); d <= 0 {
			t.Fatalf("connect timeout %v: the dialer would have none", d)
		}
		resp, body := post(t, tg.URL+"/v1/chat/completions", holdChatPlain, nil)
		rec := tg.record(t)
		if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), "upstream_unreachable") {
			t.Errorf("caller got %d %s; want 502 upstream_unreachable", resp.StatusCode, body)
		}
		wantAttempts(t, rec, "mock:0:connect_error")
		if rec.Outcome != llm.OutcomeUpstreamUnreachable || hits.Load() != 0 {
			t.Errorf("record outcome %s, upstream hits %d; want upstream_unreachable, 0", rec.Outcome, hits.Load())
		}
	})
	t.Run("classification", func(t *testing.T) {
		g := edgeGateway(t, 0)
		cases := []struct {
			name    string
			err     error
			cause   error
			result  string
			outcome llm.Outcome
		}{
			{"dial timeout", &net.OpError{Op: "dial", Net: "tcp", Err: holdTimeoutErr{}}, nil,
				resultConnectError, llm.OutcomeUpstreamUnreachable},
			{"dial refused", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, nil,
				resultConnectError, llm.OutcomeUpstreamUnreachable},
			{"read timeout", &net.OpError{Op: "read", Net: "tcp", Err: holdTimeoutErr{}}, nil,
				resultTimeout, llm.OutcomeUpstreamTimeout},
			{"header phase", &net.OpError{Op: "dial", Net: "tcp", Err: holdTimeoutErr{}}, errHeaderTimeout,
				resultHeaderTimeout, llm.OutcomeUpstreamTimeout},
		}
		for _, c := range cases {
			ex := &exchange{g: g, r: httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil), up: g.upstreams[0]}
			ctx, cancel := context.WithCancelCause(context.Background())
			if c.cause != nil {
				cancel(c.cause)
			}
			res := ex.noResponse(ctx, c.err)
			cancel(nil)
			if res.result != c.result || !res.retryable || res.fail == nil || res.fail.outcome != c.outcome {
				t.Errorf("%s: result %s retryable %v outcome %v; want %s, retryable, %s",
					c.name, res.result, res.retryable, res.fail != nil && res.fail.outcome == c.outcome, c.result, c.outcome)
			}
		}
	})
}

// holdStatusUpstream answers with statuses in turn (the last one repeats),
// each with a body naming it.
type holdStatusUpstream struct {
	statuses []int
	hits     atomic.Int32
}

func (u *holdStatusUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	i := int(u.hits.Add(1)) - 1
	st := u.statuses[min(i, len(u.statuses)-1)]
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(st)
	_, _ = io.WriteString(w, holdStatusBody(st))
}

func holdStatusBody(st int) string { return `{"answer":` + strconv.Itoa(st) + `}` }

// TestHoldForwardedRepeatOnlyWhenNotActed: a model call on another path
// (images, embeddings) may have acted on a 500, so it is not sent again; on
// a 503 or 429 the upstream surely did not act, so it is. GET is always
// repeated. Before the fix every retryable status repeated the call.
func TestHoldForwardedRepeatOnlyWhenNotActed(t *testing.T) {
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
			up := &holdStatusUpstream{statuses: c.statuses}
			us := httptest.NewServer(up)
			defer us.Close()
			tg := newTestGateway(t, us.URL, func(cfg *config.Config) {
				cfg.Upstreams[0].Retry.BaseDelayMs, cfg.Upstreams[0].Retry.MaxDelayMs = 1, 2
			})
			var rd io.Reader
			if c.body != "" {
				rd = strings.NewReader(c.body)
			}
			req, err := http.NewRequestWithContext(context.Background(), c.method, tg.URL+c.path, rd)
			if err != nil {
				t.Fatal(err)
			}
			if c.body != "" {
				req.Header.Set("Content-Type", "application/json")
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			tg.record(t)
			if resp.StatusCode != c.wantStatus || string(body) != holdStatusBody(c.wantStatus) {
				t.Errorf("caller got %d %q; want %d %q", resp.StatusCode, body, c.wantStatus, holdStatusBody(c.wantStatus))
			}
			if n := up.hits.Load(); n != c.wantHits {
				t.Errorf("upstream hits %d, want %d", n, c.wantHits)
			}
		})
	}
}

// TestHoldHeaderPhaseFollowsRequest: the header timeout applies to streamed
// requests only, whatever an earlier attempt answered. A non-streamed
// request whose first attempt got a stream (that broke before its first
// token) must not put its second attempt under header_timeout_seconds.
// Before the fix the first attempt's stream flag did, and the slow but
// healthy non-streamed answer was cut as a header timeout.
func TestHoldHeaderPhaseFollowsRequest(t *testing.T) {
	const answer = `{"id":"chatcmpl-tg0002","object":"chat.completion","created":1767225600,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"Oslo"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}`
	var hits atomic.Int32
	us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if hits.Add(1) == 1 {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, openAIRole) // and the body ends: no token
			return
		}
		// A non-streamed answer's headers come with its body: slower than
		// the header timeout, which must not apply here. (The wait only
		// gives the parent's wrongly armed timer time to fire.)
		select {
		case <-r.Context().Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, answer)
	}))
	defer us.Close()
	tg := newTestGateway(t, us.URL, func(c *config.Config) {
		u := &c.Upstreams[0]
		u.HeaderTimeoutSeconds = 0.001
		u.Retry.BaseDelayMs, u.Retry.MaxDelayMs = 1, 2
	})
	resp, body := post(t, tg.URL+"/v1/chat/completions", holdChatPlain, nil)
	rec := tg.record(t)
	if resp.StatusCode != http.StatusOK || string(body) != answer {
		t.Errorf("caller got %d %q; want the second attempt's answer", resp.StatusCode, body)
	}
	wantAttempts(t, rec, "mock:200:stream_broken", "mock:200:ok")
	if rec.Stream || hits.Load() != 2 {
		t.Errorf("record stream %v, upstream hits %d; want false, 2", rec.Stream, hits.Load())
	}
}

// A half-open probe whose stream breaks before its first token is a failed
// probe: the circuit opens again (the ticket is reported healthy only at the
// first token, not when the stream is committed).
func TestHoldProbeBrokenBeforeTokenReopens(t *testing.T) {
	clk := newFakeClock()
	var hits atomic.Int32
	us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if hits.Add(1) <= 2 {
			w.WriteHeader(500)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, openAIRole) // headers, then the body ends: no token
	}))
	defer us.Close()
	tg := newTestGatewayWith(t, us.URL, func(c *config.Config) {
		u := &c.Upstreams[0]
		u.Retry.MaxAttempts = 1
		u.Breaker.ConsecutiveFailures, u.Breaker.CooldownSeconds, u.Breaker.HalfOpenProbes = 2, 5, 1
	}, func(o *Options) { o.Now = clk.Now })
	state := func() float64 {
		return metricValue(t, tg, "tollgate_upstream_circuit_state", map[string]string{"upstream": "mock"})
	}
	post(t, tg.URL+"/v1/chat/completions", holdChatPlain, nil)
	tg.record(t)
	post(t, tg.URL+"/v1/chat/completions", holdChatPlain, nil)
	tg.record(t)
	if s := state(); s != 2 {
		t.Fatalf("circuit state %v after 2 failures in a row, want 2 (open)", s)
	}
	clk.Advance(6 * time.Second)
	resp, _ := post(t, tg.URL+"/v1/chat/completions", holdChat, nil)
	rec := tg.record(t)
	if resp.StatusCode != 200 || rec.AttemptCount != 1 || rec.Attempts[0].Result != resultStreamBroken {
		t.Fatalf("probe: status %d attempts %v, want one stream_broken attempt", resp.StatusCode, attemptList(rec))
	}
	if s := state(); s != 2 {
		t.Errorf("circuit state %v after a probe that broke before its first token, want 2 (open)", s)
	}
}

// TestHoldErrorEventHealth: an error event before the first token whose type
// is a quota, billing, key or request error is not an outage (the breaker
// stays closed); one of an unknown type is taken for one.
func TestHoldErrorEventHealth(t *testing.T) {
	for _, c := range []struct {
		typ       string
		wantState float64
	}{
		{"insufficient_quota", metrics.CircuitClosed},
		{"invalid_request_error", metrics.CircuitClosed},
		{"mystery_error", metrics.CircuitOpen},
	} {
		t.Run(c.typ, func(t *testing.T) {
			ev := `data: {"error":{"message":"no","type":"` + c.typ + `","param":null,"code":null}}` + "\n\n"
			us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = io.WriteString(w, openAIRole+ev)
			}))
			defer us.Close()
			tg := newTestGatewayWith(t, us.URL, func(cfg *config.Config) {
				cfg.Upstreams[0].Breaker.ConsecutiveFailures = 1
			}, func(o *Options) { o.Now = newFakeClock().Now })
			resp, body := post(t, tg.URL+"/v1/chat/completions", holdChat, nil)
			rec := tg.record(t)
			if resp.StatusCode != 200 || !strings.Contains(string(body), c.typ) || rec.AttemptCount != 1 {
				t.Fatalf("status %d attempts %v body %q: want the upstream's error event, not retried",
					resp.StatusCode, attemptList(rec), body)
			}
			s := metricValue(t, tg, "tollgate_upstream_circuit_state", map[string]string{"upstream": "mock"})
			if s != c.wantState {
				t.Errorf("circuit state %v, want %v", s, c.wantState)
			}
		})
	}
}

// TestHoldUnavailableRetryAfterFromSkippedBreakers: the 503 of a request
// whose every upstream was skipped advertises the cooldown of the breakers
// it skipped, not that of an upstream its key may not go to.
func TestHoldUnavailableRetryAfterFromSkippedBreakers(t *testing.T) {
	clk := newFakeClock()
	primary := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusInternalServerError)
	}))
	defer primary.Close()
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusInternalServerError)
	}))
	defer other.Close()
	tg := newTestGatewayWith(t, primary.URL, func(cfg *config.Config) {
		u := &cfg.Upstreams[0]
		u.Retry.MaxAttempts = 1
		u.Breaker.ConsecutiveFailures, u.Breaker.CooldownSeconds = 1, 30
		b := config.DefaultUpstream()
		b.Name, b.BaseURL = "other", other.URL
		b.Retry.MaxAttempts = 1
		b.Breaker.ConsecutiveFailures, b.Breaker.CooldownSeconds = 1, 2
		cfg.Upstreams = append(cfg.Upstreams, b)
	}, func(o *Options) { o.Now = clk.Now })
	// A keyless request opens both breakers (primary, then the fallback).
	post(t, tg.URL+"/v1/chat/completions", holdChatPlain, nil)
	tg.record(t)
	// A caller with a key may only go to the primary (another origin):
	// its 503 must say 30 s, not the other upstream's 2 s.
	resp, body := post(t, tg.URL+"/v1/chat/completions", holdChatPlain, map[string]string{"Authorization": "Bearer sk-caller"})
	tg.record(t)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "30" {
		t.Fatalf("status %d Retry-After %q body %s; want 503 with Retry-After 30", resp.StatusCode,
			resp.Header.Get("Retry-After"), body)
	}
}

// TestHoldTouchMovesIdleDeadline: a read during the idle phase moves the
// deadline, and a timer that fires before it sleeps again instead of
// cutting the stream; once the deadline has passed, it cuts it with the idle
// cause. fire is called by hand, so no timing decides the result.
func TestHoldTouchMovesIdleDeadline(t *testing.T) {
	var causes []error
	pt := newPhaseTimer(func(c error) { causes = append(causes, c) }, time.Hour)
	pt.t = time.AfterFunc(time.Hour, func() {}) // a timer fire may re-arm; never runs here
	defer pt.t.Stop()
	pt.phase.Store(phaseIdle)
	pt.deadline.Store(0) // the idle phase ran out...
	pt.touch()           // ...but a read just came
	pt.fire()
	if len(causes) != 0 {
		t.Fatalf("fire after a read cut the stream with %v", causes)
	}
	pt.deadline.Store(0)
	pt.fire()
	if len(causes) != 1 || !errors.Is(causes[0], errIdleTimeout) {
		t.Fatalf("fire past the deadline: causes %v, want the idle timeout", causes)
	}
}

// TestHoldProbeCallerLeavesNoVerdict: a half-open probe whose caller gives
// up on a hanging upstream is no verdict: the breaker stays half-open (it
// does not close and flood a dead upstream), and the probe slot is free for
// the next request, whose success closes it.
func TestHoldProbeCallerLeavesNoVerdict(t *testing.T) {
	clk := newFakeClock()
	var hits atomic.Int32
	got := make(chan struct{}, 1)
	us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		switch hits.Add(1) {
		case 1:
			w.WriteHeader(http.StatusInternalServerError)
		case 2: // hangs until the caller leaves
			got <- struct{}{}
			<-r.Context().Done()
		default:
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
		}
	}))
	defer us.Close()
	tg := newTestGatewayWith(t, us.URL, func(c *config.Config) {
		u := &c.Upstreams[0]
		u.Retry.MaxAttempts = 1
		u.Breaker.ConsecutiveFailures, u.Breaker.CooldownSeconds, u.Breaker.HalfOpenProbes = 1, 5, 1
	}, func(o *Options) { o.Now = clk.Now })
	state := func() float64 {
		return metricValue(t, tg, "tollgate_upstream_circuit_state", map[string]string{"upstream": "mock"})
	}
	post(t, tg.URL+"/v1/chat/completions", holdChatPlain, nil)
	tg.record(t)
	if s := state(); s != metrics.CircuitOpen {
		t.Fatalf("circuit state %v after a 500, want open", s)
	}
	clk.Advance(6 * time.Second)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, tg.URL+"/v1/chat/completions", strings.NewReader(holdChatPlain))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the probe never reached the upstream")
	}
	cancel()
	<-done
	if rec := tg.record(t); rec.AttemptCount != 1 || rec.Attempts[0].Result != resultClientGone {
		t.Fatalf("probe attempts %v, want one client_gone", attemptList(rec))
	}
	if s := state(); s != metrics.CircuitHalfOpen {
		t.Fatalf("circuit state %v after the probe's caller left, want half-open (no verdict)", s)
	}
	resp, body := post(t, tg.URL+"/v1/chat/completions", holdChatPlain, nil)
	tg.record(t)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("next request: %d %s; want the probe slot free and the upstream's answer", resp.StatusCode, body)
	}
	if s := state(); s != metrics.CircuitClosed {
		t.Errorf("circuit state %v after a successful probe, want closed", s)
	}
}

// TestHoldStreamFailedBeforeTokenNotBilled: a stream the upstream breaks
// before any token and any usage is not billed, like an error answer; one
// that broke after a token is.
func TestHoldStreamFailedBeforeTokenNotBilled(t *testing.T) {
	for _, c := range []struct {
		fault  string
		billed bool
	}{{"disconnect=0", false}, {"disconnect=1", true}} {
		t.Run(c.fault, func(t *testing.T) {
			m := mockllm.New(mockllm.Options{OutputTokens: 4})
			us := httptest.NewServer(m)
			defer us.Close()
			ledger := newLocalLedger(t)
			tg := newTestGatewayWith(t, us.URL, func(cf *config.Config) {
				cf.Upstreams[0].Retry.MaxAttempts = 1
				cf.Models = []config.Model{{Pattern: "gpt-*", InputUSDPerMTok: 2.5, OutputUSDPerMTok: 10}}
			}, func(o *Options) { o.Ledger = ledger })
			body := `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"` +
				strings.Repeat("x", 4000) + `"}]}`
			post(t, tg.URL+"/v1/chat/completions", body, map[string]string{"X-Mock-Fault": c.fault})
			rec := tg.record(t)
			if rec.Outcome != llm.OutcomeUpstreamError || rec.Interruption != llm.InterruptUpstreamEOF {
				t.Fatalf("record %s / %s, want upstream_error / upstream_eof", rec.Outcome, rec.Interruption)
			}
			rows, err := ledger.Query(context.Background(), spend.Filter{})
			if err != nil {
				t.Fatal(err)
			}
			if billed := rec.CostMicros > 0 && len(rows) == 1; billed != c.billed {
				t.Errorf("billed %v (record %d µ$, ledger %+v), want %v", billed, rec.CostMicros, rows, c.billed)
			}
		})
	}
}

// TestHoldCommittedFirstTokenCutLabelled: a stream committed at once (no
// retry left) and cut by the first-token timer is recorded as
// first_token_timeout, as a held one is.
func TestHoldCommittedFirstTokenCutLabelled(t *testing.T) {
	m := mockllm.New(mockllm.Options{OutputTokens: 2})
	us := httptest.NewServer(m)
	defer us.Close()
	tg := newTestGateway(t, us.URL, func(c *config.Config) {
		c.Upstreams[0].Retry.MaxAttempts = 1
		c.Upstreams[0].FirstTokenTimeoutSeconds = 0.05
	})
	post(t, tg.URL+"/v1/chat/completions", holdChat, map[string]string{"X-Mock-Fault": "hang=0"})
	rec := tg.record(t)
	if rec.AttemptCount != 1 || rec.Attempts[0].Result != resultFirstTokenTimeout {
		t.Fatalf("attempts %v, want one first_token_timeout", attemptList(rec))
	}
}

// TestHoldAttemptsKeepTheLast: past MaxRecordedAttempts the record keeps the
// first attempts and the last one, which ended the request.
func TestHoldAttemptsKeepTheLast(t *testing.T) {
	var rec llm.Record
	for i := range llm.MaxRecordedAttempts + 3 {
		rec.AddAttempt(llm.Attempt{Upstream: "u" + strconv.Itoa(i)})
	}
	last := llm.MaxRecordedAttempts - 1
	if rec.AttemptCount != llm.MaxRecordedAttempts+3 || rec.Attempts[0].Upstream != "u0" ||
		rec.Attempts[last-1].Upstream != "u"+strconv.Itoa(last-1) ||
		rec.Attempts[last].Upstream != "u"+strconv.Itoa(llm.MaxRecordedAttempts+2) {
		t.Fatalf("count %d, attempts %+v", rec.AttemptCount, rec.Attempts)
	}
}

// TestStatsLimitedInFlight: /stats serves at most statsInFlight requests at
// once; one more gets 503 with Retry-After instead of queueing work.
func TestStatsLimitedInFlight(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, statsInFlight)
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
	})
	h := limitInFlight(slow, statsInFlight)
	var wg sync.WaitGroup
	for range statsInFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/stats", nil))
		}()
	}
	for range statsInFlight {
		<-entered
	}
	rr := httptest.NewRecorder()
	h.ServeHTTP(rr, httptest.NewRequest(http.MethodGet, "/stats", nil))
	close(release)
	wg.Wait()
	if rr.Code != http.StatusServiceUnavailable || rr.Header().Get("Retry-After") != "1" {
		t.Fatalf("request over the limit: %d, Retry-After %q; want 503 with Retry-After 1", rr.Code, rr.Header().Get("Retry-After"))
	}
	rr = httptest.NewRecorder()
	h.ServeHTTP(rr, httptest.NewRequest(http.MethodGet, "/stats", nil))
	if rr.Code != http.StatusOK {
		t.Errorf("after the others finished: %d, want 200", rr.Code)
	}
}
