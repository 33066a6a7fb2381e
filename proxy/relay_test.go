package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/sseparse"
)

func TestRelayByteFidelity(t *testing.T) {
	full := openAIRole + openAITok1 + openAITok2 + openAIStop + openAIUsage + openAIDone
	bigContent := strings.Repeat("x", 1<<20)
	big := `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"` + bigContent + `"},"finish_reason":null}]}` + "\n\n"
	malformed := `data: {"id":"chatcmpl-tg0001","choices":[{"delta":{"content":` + "\n\n"
	cr := strings.ReplaceAll(openAIRole+openAITok1+openAITok2+openAIStop+openAIDone, "\n", "\r")
	crlfAnthropic := strings.ReplaceAll(anthropicText, "\n", "\r\n")
	rs := responsesTranscript(t)
	rsEvents := strings.SplitAfter(rs, "\n\n")
	rsBig := "event: response.output_text.delta\n" +
		`data: {"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_045d","output_index":0,"content_index":0,"delta":"` + bigContent + `"}` + "\n\n"
	rsMalformed := "event: response.output_text.delta\n" + `data: {"type":"response.output_text.delta","delta":` + "\n\n"

	tests := []struct {
		name      string
		path      string
		upstream  string
		pieces    int
		askUsage  bool   // the caller sets include_usage itself
		want      string // what the client must receive
		tokens    int    // token-bearing events the record must count
		output    int64  // output tokens in the record
		estimated bool
		terminal  bool
	}{
		{name: "client asked for usage: unchanged", path: "/v1/chat/completions", upstream: full, pieces: 7,
			askUsage: true, want: full, tokens: 2, output: 8, terminal: true},
		{name: "usage chunk added by the gateway is withheld", path: "/v1/chat/completions", upstream: full, pieces: 13,
			want: openAIRole + openAITok1 + openAITok2 + openAIStop + openAIDone, tokens: 2, output: 8, terminal: true},
		{name: "malformed event relayed as sent", path: "/v1/chat/completions",
			upstream: openAIRole + openAITok1 + malformed + openAITok2 + openAIStop + openAIUsage + openAIDone, pieces: 5,
			askUsage: true, want: openAIRole + openAITok1 + malformed + openAITok2 + openAIStop + openAIUsage + openAIDone,
			tokens: 2, output: 8, terminal: true},
		{name: "1 MiB event", path: "/v1/chat/completions", upstream: openAIRole + big + openAIStop + openAIDone,
			pieces: 7 << 10, askUsage: true, want: openAIRole + big + openAIStop + openAIDone, tokens: 1, output: 1,
			estimated: true, terminal: true},
		{name: "CR-only line ends", path: "/v1/chat/completions", upstream: cr, pieces: 3, askUsage: true,
			want: cr, tokens: 2, output: 2, estimated: true, terminal: true},
		{name: "anthropic CRLF", path: "/v1/messages", upstream: crlfAnthropic, pieces: 11, want: crlfAnthropic,
			tokens: 2, output: 9, terminal: true},
		{name: "responses", path: "/v1/responses", upstream: rs, pieces: 9, want: rs, tokens: 4, output: 12, terminal: true},
		{name: "responses CRLF", path: "/v1/responses", upstream: strings.ReplaceAll(rs, "\n", "\r\n"), pieces: 17,
			want: strings.ReplaceAll(rs, "\n", "\r\n"), tokens: 4, output: 12, terminal: true},
		{name: "responses 1 MiB delta", path: "/v1/responses", upstream: rsEvents[0] + rsBig + rsEvents[11], pieces: 7 << 10,
			want: rsEvents[0] + rsBig + rsEvents[11], tokens: 1, output: 12, terminal: true},
		{name: "responses malformed event relayed as sent", path: "/v1/responses",
			upstream: strings.Join(rsEvents[:5], "") + rsMalformed + strings.Join(rsEvents[5:], ""), pieces: 5,
			want: strings.Join(rsEvents[:5], "") + rsMalformed + strings.Join(rsEvents[5:], ""), tokens: 4, output: 12, terminal: true},
		{name: "comments and keep-alives", path: "/v1/messages",
			upstream: ": keep-alive\n\n" + anthropicText[:200] + anthropicText[200:] + ": bye\n\n", pieces: 64,
			want: ": keep-alive\n\n" + anthropicText + ": bye\n\n", tokens: 2, output: 9, terminal: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			up := &rawUpstream{pieces: split(tc.upstream, tc.pieces)}
			srv := httptest.NewServer(up)
			defer srv.Close()
			tg := newTestGateway(t, srv.URL, func(c *config.Config) { c.Server.MaxEventBytes = 4 << 20 })
			body := `{"model":"m","stream":true,"max_tokens":100,"messages":[]}`
			if tc.askUsage {
				body = `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[]}`
			}
			resp, got := post(t, tg.URL+tc.path, body, nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, got)
			}
			if !bytes.Equal(got, []byte(tc.want)) {
				t.Fatalf("client received %d bytes, want %d\n got: %.300q\nwant: %.300q", len(got), len(tc.want), got, tc.want)
			}
			sent, _ := up.request()
			switch {
			case tc.path != "/v1/chat/completions" || tc.askUsage:
				if string(sent) != body {
					t.Errorf("the request body was changed: upstream got %s", sent)
				}
			case !bytes.Contains(sent, []byte(`"stream_options":{"include_usage":true}`)):
				t.Errorf("include_usage was not added: upstream got %s", sent)
			}
			rec := tg.record(t)
			if rec.TokenEvents != tc.tokens || rec.Usage.Output != tc.output || rec.Estimated != tc.estimated ||
				rec.TerminalSeen != tc.terminal || rec.Outcome != llm.OutcomeOK {
				t.Errorf("record: token events %d output %d estimated %v terminal %v outcome %s; want %d %d %v %v ok",
					rec.TokenEvents, rec.Usage.Output, rec.Estimated, rec.TerminalSeen, rec.Outcome,
					tc.tokens, tc.output, tc.estimated, tc.terminal)
			}
			if rec.BytesOut != int64(len(tc.want)) {
				t.Errorf("record counts %d bytes out, client got %d", rec.BytesOut, len(tc.want))
			}
			if rec.Timing.FirstTokenOut.IsZero() || rec.Timing.FirstTokenOut.Before(rec.Timing.FirstToken) {
				t.Errorf("first token out %v before first token read %v", rec.Timing.FirstTokenOut, rec.Timing.FirstToken)
			}
		})
	}
}

// responsesTranscript is the recorded Responses API stream of the sseparse
// transcripts (12 events, 4 of them token-bearing, usage 13 in / 12 out).
func responsesTranscript(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../sseparse/testdata/transcripts/9.9.sse")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestRelayEventTooLarge(t *testing.T) {
	huge := "data: " + strings.Repeat("y", 300<<10) + "\n\n"
	up := &rawUpstream{pieces: split(openAIRole+openAITok1+huge+openAIDone, 4096)}
	srv := httptest.NewServer(up)
	defer srv.Close()
	tg := newTestGateway(t, srv.URL, func(c *config.Config) { c.Server.MaxEventBytes = 64 << 10 })
	resp, got := post(t, tg.URL+"/v1/chat/completions", `{"model":"m","stream":true}`, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	// Everything before the oversized event arrived; nothing was invented.
	if !bytes.HasPrefix(got, []byte(openAIRole+openAITok1)) || bytes.Contains(got, []byte("[DONE]")) {
		t.Fatalf("client received %.200q", got)
	}
	rec := tg.record(t)
	if rec.Outcome != llm.OutcomeUpstreamError || rec.Interruption != llm.InterruptProtocolError || rec.TokenEvents != 1 {
		t.Fatalf("record outcome %s interruption %s tokens %d", rec.Outcome, rec.Interruption, rec.TokenEvents)
	}
}

func TestRelayTruncatedStream(t *testing.T) {
	// The upstream ends the body without [DONE] and in the middle of an event.
	up := &rawUpstream{pieces: [][]byte{[]byte(openAIRole + openAITok1 + `data: {"choi`)}}
	srv := httptest.NewServer(up)
	defer srv.Close()
	for _, errorEvents := range []bool{true, false} {
		tg := newTestGateway(t, srv.URL, func(c *config.Config) {
			c.Server.StreamErrorEvents = errorEvents
			c.Upstreams[0].Retry.MaxAttempts = 1
		})
		_, got := post(t, tg.URL+"/v1/chat/completions", `{"model":"m","stream":true}`, nil)
		// With stream error events the unterminated bytes are dropped (the
		// error event would be glued to them) and the error event ends
		// the stream; without, they pass as the upstream sent them.
		want := openAIRole + openAITok1 + string(openAIBrokenEvent)
		if !errorEvents {
			want = openAIRole + openAITok1 + `data: {"choi`
		}
		if string(got) != want {
			t.Fatalf("stream_error_events=%v: client received %q", errorEvents, got)
		}
		rec := tg.record(t)
		if rec.Outcome != llm.OutcomeUpstreamError || rec.Interruption != llm.InterruptUpstreamEOF ||
			rec.TerminalSeen || rec.Usage.Output != 1 || !rec.Estimated {
			t.Fatalf("record %+v", rec)
		}
	}
}

// randomSplit cuts s into reads of 1 to maxRead bytes drawn from rng.
func randomSplit(rng *rand.Rand, s string, maxRead int) [][]byte {
	var reads [][]byte
	for s != "" {
		n := 1 + rng.IntN(min(len(s), maxRead))
		reads = append(reads, []byte(s[:n]))
		s = s[n:]
	}
	return reads
}

// TestHoldRandomSplitsByteExact: whatever the read boundaries and line ends,
// a held stream reaches the caller byte for byte (the withheld usage chunk
// aside), and a relayed token sets t_first_token_out: a stream with no
// token keeps its held opening when the usage chunk commits it, and CR/CRLF
// splits at the hold's edge neither lose nor duplicate bytes.
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
				g := relayGateway(t, 0)
				bad, noTTFT := 0, 0
				for iter := range iterations {
					reads := randomSplit(rng, in, maxReads[iter%len(maxReads)])
					w := &recWriter{h: http.Header{}}
					ex, res := relayStream(g, w, nil, c.d, c.suppress, true, &scriptReader{reads: reads})
					if string(w.written) != want || !res.done {
						if bad++; bad == 1 {
							t.Errorf("iteration %d (%d reads): done=%v result=%s; %s",
								iter, len(reads), res.done, res.result, firstDiff(w.written, want))
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

// TestHeldEndKeepsCompleteEvents: a held stream that ends before its
// first token keeps exactly its complete events, wherever the one read
// boundary falls (a CRLF split between reads keeps the final LF of the held
// body), and writes nothing to the caller.
func TestHeldEndKeepsCompleteEvents(t *testing.T) {
	opening := anthropicText[:strings.Index(anthropicText, "event: content_block_delta")]
	for _, eol := range []string{"\n", "\r\n"} {
		in := strings.ReplaceAll(opening, "\n", eol)
		g := relayGateway(t, 0)
		for cut := 1; cut < len(in); cut++ {
			w := &recWriter{h: http.Header{}}
			body := &scriptReader{reads: [][]byte{[]byte(in[:cut]), []byte(in[cut:])}}
			_, res := relayStream(g, w, nil, llm.DialectAnthropic, false, true, body)
			if res.fail == nil || res.done || !res.retryable {
				t.Fatalf("eol %q cut %d: result %s done=%v retryable=%v fail=%v; want a retryable held failure",
					eol, cut, res.result, res.done, res.retryable, res.fail != nil)
			}
			if string(res.fail.body) != in {
				t.Errorf("eol %q cut %d: held body %s", eol, cut, firstDiff(res.fail.body, in))
			}
			if len(w.written) != 0 {
				t.Errorf("eol %q cut %d: %d bytes written while holding", eol, cut, len(w.written))
			}
		}
	}
}

// TestHoldOutlastsTheFirstBuffer: a stream starts on a small buffer, but
// opening events that outgrow it are still held back whole (the hold's
// bound is the larger buffer), so an error event after them can still be
// retried; past that bound the held events go to the caller.
func TestHoldOutlastsTheFirstBuffer(t *testing.T) {
	ping := "event: ping\ndata: {\"type\":\"ping\"}\n\n"
	ms := anthropicText[:strings.Index(anthropicText, "event: content_block_start")]
	errEvent := "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"
	for _, c := range []struct {
		name  string
		pings int
		held  bool
	}{
		{"past the first buffer", 3 * streamBufSize / len(ping), true},
		{"past the hold bound", 2 * relayBufSize / len(ping), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			opening := ms + strings.Repeat(ping, c.pings)
			g := relayGateway(t, 0)
			w := &recWriter{h: http.Header{}}
			body := &scriptReader{reads: [][]byte{[]byte(opening), []byte(errEvent)}}
			_, res := relayStream(g, w, nil, llm.DialectAnthropic, false, true, body)
			if !c.held {
				if len(w.written) < relayBufSize || !strings.HasPrefix(string(w.written), ms) {
					t.Errorf("%d bytes reached the caller, want the opening's first %d at least", len(w.written), relayBufSize)
				}
				return
			}
			if res.fail == nil || res.done || !res.retryable {
				t.Fatalf("result %s done=%v retryable=%v; want a retryable held failure", res.result, res.done, res.retryable)
			}
			if string(res.fail.body) != opening+errEvent {
				t.Errorf("held body %s", firstDiff(res.fail.body, opening+errEvent))
			}
			if len(w.written) != 0 {
				t.Errorf("%d bytes written while holding", len(w.written))
			}
		})
	}
}

// lockstepTransport is an upstream transport that counts the body bytes the
// gateway has read, so an upstream handler can send its next piece only
// once the gateway has read every byte before it: each piece then arrives
// in reads of its own, without sleeping.
type lockstepTransport struct {
	tr      *http.Transport
	read    atomic.Int64
	changed chan struct{} // capacity 1: a pending wake-up is never lost
}

func newLockstepTransport(t *testing.T) *lockstepTransport {
	l := &lockstepTransport{tr: &http.Transport{}, changed: make(chan struct{}, 1)}
	t.Cleanup(l.tr.CloseIdleConnections)
	return l
}

func (l *lockstepTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := l.tr.RoundTrip(r)
	if err == nil {
		resp.Body = &countedBody{ReadCloser: resp.Body, l: l}
	}
	return resp, err
}

// waitRead waits (at most 5 s) until the gateway has read n body bytes.
func (l *lockstepTransport) waitRead(n int64) bool {
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

type countedBody struct {
	io.ReadCloser
	l *lockstepTransport
}

func (b *countedBody) Read(p []byte) (int, error) {
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

// TestHeldStreamWithoutTokenReachesCaller: end to end, a stream with no token
// (role chunk, finish_reason "length", usage, [DONE], each read apart)
// reaches the caller whole, the withheld usage chunk aside: the usage chunk
// that commits the stream does not drop the held role and finish chunks.
func TestHeldStreamWithoutTokenReachesCaller(t *testing.T) {
	length := strings.Replace(openAIStop, `"stop"`, `"length"`, 1)
	pieces := []string{openAIRole, length, openAIUsage + openAIDone}
	ls := newLockstepTransport(t)
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
	resp, body := post(t, tg.URL+"/v1/chat/completions", streamChat, nil)
	rec := tg.record(t)
	if stalled.Load() {
		t.Fatal("the gateway stopped reading the upstream mid-stream")
	}
	if want := openAIRole + length + openAIDone; resp.StatusCode != http.StatusOK || string(body) != want {
		t.Errorf("caller got %d; %s", resp.StatusCode, firstDiff(body, want))
	}
	if rec.Outcome != llm.OutcomeOK || hits.Load() != 1 {
		t.Errorf("record outcome %s, upstream hits %d; want ok, 1", rec.Outcome, hits.Load())
	}
	if !rec.Usage.HasOutput || rec.Usage.Output != 8 {
		t.Errorf("record usage %+v; want the withheld chunk's 8 output tokens", rec.Usage)
	}
}

// TestHoldCapCommitsKeepAlives: on the gateway's clock, a stream still
// without a token 10 s after its hold began is committed at its next read,
// so its headers, opening events and keep-alives reach the caller (and its
// proxies) before any token, however long that token takes.
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
			g := bareGatewayWith(t, "http://127.0.0.1:1", nil, func(o *Options) { o.Now = clk.Now })
			w := &recWriter{h: http.Header{}}
			// Reads: the opening, a beat 4 s later (still held), a beat 7 s
			// after that (11 s: the hold ends), then the first token.
			var atHeld, atCap recWriter
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
			ex, res := relayStream(g, w, nil, c.d, c.suppress, true, body)
			if atHeld.status != 0 || len(atHeld.written) != 0 {
				t.Errorf("4 s into the hold: status %d, %d bytes written; want nothing yet", atHeld.status, len(atHeld.written))
			}
			wantCap := c.opening + c.beat + c.beat
			if atCap.status != http.StatusOK || string(atCap.written[:atCap.flushed]) != wantCap {
				t.Errorf("11 s into the hold, before the first token: status %d, flushed %s",
					atCap.status, firstDiff(atCap.written[:atCap.flushed], wantCap))
			}
			if want := wantCap + c.wantTotal; string(w.written) != want || !res.done {
				t.Errorf("whole stream: done=%v; %s", res.done, firstDiff(w.written, want))
			}
			if ex.rec.Outcome != llm.OutcomeOK || ex.rec.Timing.FirstTokenOut.IsZero() {
				t.Errorf("record outcome %s, first token out %v; want ok and set", ex.rec.Outcome, ex.rec.Timing.FirstTokenOut)
			}
		})
	}
}

// A complete event that precedes the withheld usage chunk in the same read
// must be flushed before the relay blocks on the next read (a stream is
// never buffered), and its flush must set t_first_token_out.
func TestRelayFlushesBeforeWithheldChunk(t *testing.T) {
	g := relayGateway(t, 0)
	w := &recWriter{h: http.Header{}}
	var flushedAtRead2 string
	body := &scriptReader{
		reads: [][]byte{[]byte(openAIRole + openAITok1 + openAIUsage), []byte(openAIDone)},
		before: func(i int) {
			if i == 1 {
				flushedAtRead2 = string(w.written[:w.flushed])
			}
		},
	}
	ex, res := relayStream(g, w, nil, llm.DialectOpenAI, true, false, body)
	if ex.rec.Outcome != llm.OutcomeOK || !res.done {
		t.Errorf("outcome %s, done %v for a whole stream; want ok, done", ex.rec.Outcome, res.done)
	}
	if flushedAtRead2 != openAIRole+openAITok1 {
		t.Errorf("while waiting on the upstream the client had only %d of %d bytes flushed: the events before the withheld usage chunk sit in the writer's buffer",
			len(flushedAtRead2), len(openAIRole+openAITok1))
	}
	if ex.rec.Timing.FirstTokenOut.IsZero() {
		t.Errorf("t_first_token_out never set (TTFT lost) although a token was relayed")
	}
	if string(w.written) != openAIRole+openAITok1+openAIDone {
		t.Errorf("client got %q", w.written)
	}
}

// Complete events read in the same read as the start of an oversized event
// must still reach the client: the upstream sent them before the bad one.
func TestRelayEventTooLargeKeepsEarlierEvents(t *testing.T) {
	g := relayGateway(t, 1024)
	w := &recWriter{h: http.Header{}}
	huge := "data: " + strings.Repeat("y", 4000)
	body := &scriptReader{reads: [][]byte{[]byte(openAIRole + openAITok1 + huge)}}
	ex, _ := relayStream(g, w, nil, llm.DialectOpenAI, false, false, body)
	if ex.rec.Interruption != llm.InterruptProtocolError {
		t.Fatalf("interruption %s, want protocol_error", ex.rec.Interruption)
	}
	if want := openAIRole + openAITok1 + string(openAIBrokenEvent); string(w.written) != want {
		t.Errorf("client got %d bytes, want the %d bytes of the two complete events and the gateway's error event (the tap counted %d token events)",
			len(w.written), len(want), ex.rec.TokenEvents)
	}
}

func crlf(s string) string { return strings.ReplaceAll(s, "\n", "\r\n") }

// With CRLF line ends, a read split between the CR and LF of a blank line
// next to the withheld usage chunk must neither drop a byte of the previous
// event nor leak a byte of the usage chunk.
func TestRelayCRLFSplitNextToWithheldChunk(t *testing.T) {
	stop, usage, done := crlf(openAIStop), crlf(openAIUsage), crlf(openAIDone)
	tests := []struct {
		name  string
		reads []string
	}{
		{"LF of the event before the usage chunk in the next read",
			[]string{stop[:len(stop)-1], stop[len(stop)-1:] + usage + done}},
		{"LF of the usage chunk in the next read",
			[]string{stop + usage[:len(usage)-1], usage[len(usage)-1:] + done}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := relayGateway(t, 0)
			w := &recWriter{h: http.Header{}}
			body := &scriptReader{}
			for _, r := range tc.reads {
				body.reads = append(body.reads, []byte(r))
			}
			ex, _ := relayStream(g, w, nil, llm.DialectOpenAI, true, false, body)
			if ex.rec.Outcome != llm.OutcomeOK || !ex.rec.TerminalSeen {
				t.Errorf("outcome %s, terminal seen %v; want ok with [DONE] seen", ex.rec.Outcome, ex.rec.TerminalSeen)
			}
			if want := stop + done; string(w.written) != want {
				t.Errorf("client got %q\nwant        %q", w.written, want)
			}
		})
	}
}

// vLLM sends an error event and then [DONE]. If the caller hangs up after
// [DONE] reached it, the record must still say the upstream failed, not
// that the client cancelled: the outcome must not depend on the race
// between the caller's close and the upstream's EOF.
func TestRelayErrorEventThenDoneThenClientLeaves(t *testing.T) {
	g := relayGateway(t, 0)
	w := &recWriter{h: http.Header{}}
	ctx, cancelClient := context.WithCancel(context.Background())
	defer cancelClient()
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil).WithContext(ctx)
	errEv := `data: {"error":{"object":"error","message":"boom","type":"InternalServerError","param":null,"code":500}}` + "\n\n"
	body := &scriptReader{
		reads: [][]byte{[]byte(openAIRole + openAITok1 + errEv + openAIDone)},
		before: func(i int) {
			if i == 1 {
				cancelClient()
			}
		},
	}
	ex, _ := relayStream(g, w, req, llm.DialectOpenAI, false, false, body)
	if ex.rec.Outcome != llm.OutcomeUpstreamError || ex.rec.Interruption != llm.InterruptUpstreamErrorEvent {
		t.Errorf("outcome %s interruption %s; want upstream_error / upstream_error_event", ex.rec.Outcome, ex.rec.Interruption)
	}
}

// Every byte of the stream reaches the client in order (less the withheld
// usage chunk), and nothing written is left unflushed while the relay waits
// for the upstream, for random splits of LF, CRLF and CR streams, including
// events larger than the initial buffer arriving in many small reads.
func TestRelayRandomSplits(t *testing.T) {
	big := `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"` +
		strings.Repeat("z", 100<<10) + `"},"finish_reason":null}]}` + "\n\n"
	base := openAIRole + openAITok1 + ": keep-alive\n\n" + big + openAITok2 + openAIStop + openAIUsage + openAIDone
	rng := rand.New(rand.NewPCG(1, 2))
	for _, eol := range []string{"\n", "\r\n", "\r"} {
		in := strings.ReplaceAll(base, "\n", eol)
		want := strings.ReplaceAll(openAIRole+openAITok1+": keep-alive\n\n"+big+openAITok2+openAIStop+openAIDone, "\n", eol)
		var fidelity, held, other int
		for iter := range 80 {
			reads := randomSplit(rng, in, []int{7, 300, 5000, 70000}[iter%4])
			g := relayGateway(t, 0)
			w := &recWriter{h: http.Header{}}
			var unflushed []int
			body := &scriptReader{reads: reads, before: func(i int) {
				if len(w.written) != w.flushed {
					unflushed = append(unflushed, i)
				}
			}}
			ex, _ := relayStream(g, w, nil, llm.DialectOpenAI, true, false, body)
			if string(w.written) != want {
				if fidelity++; fidelity == 1 {
					t.Logf("eol %q iter %d: %s", eol, iter, firstDiff(w.written, want))
				}
			}
			if len(unflushed) > 0 {
				held++
			}
			if ex.rec.Outcome != llm.OutcomeOK || ex.rec.TokenEvents != 3 {
				if other++; other == 1 {
					t.Logf("eol %q iter %d: outcome %s, %d token events", eol, iter, ex.rec.Outcome, ex.rec.TokenEvents)
				}
			}
		}
		if fidelity+held+other > 0 {
			t.Errorf("eol %q: of 80 random splits, %d changed the bytes, %d left written bytes unflushed while waiting on the upstream, %d misclassified",
				eol, fidelity, held, other)
		}
	}
}

// The relay reads into the free tail of its buffer and only moves or resets
// it when the tail is empty, so after a while every read offers the upstream
// a sliver of the buffer even when no event is pending (many tiny reads).
func TestRelayRewindsEmptyBuffer(t *testing.T) {
	g := relayGateway(t, 0)
	w := &recWriter{h: http.Header{}}
	ev := openAITok1
	var reads [][]byte
	for range 200 {
		reads = append(reads, []byte(ev))
	}
	body := &scriptReader{reads: reads, recordSizes: true}
	ex, _ := relayStream(g, w, nil, llm.DialectOpenAI, false, false, body)
	if ex.rec.TokenEvents != 200 {
		t.Errorf("%d token events relayed, want 200", ex.rec.TokenEvents)
	}
	if len(body.sizes) < 8 {
		t.Fatalf("%d reads recorded for a stream of 200 events", len(body.sizes))
	}
	small := 0
	for _, s := range body.sizes {
		if s < streamBufSize/2 {
			small++
		}
	}
	if small > 0 {
		t.Errorf("%d of %d reads offered less than half the %d-byte buffer although no event was pending (last sizes %v)",
			small, len(body.sizes), streamBufSize, body.sizes[len(body.sizes)-8:])
	}
}

// The stream-state pool is package-global but each framer keeps the
// max_event_bytes of the gateway that built it, so a second gateway (tests,
// a config reload) gets framers with the wrong cap.
func TestStreamStatePoolIsPerGateway(t *testing.T) {
	small := relayGateway(t, 1024)
	large := relayGateway(t, 1<<20)
	var states []*streamState
	for range 8 { // several, since the race detector drops some pool Puts
		states = append(states, small.getStreamState())
	}
	if _, _, err := states[0].fr.Push([]byte("data: " + strings.Repeat("q", 8000))); !errors.Is(err, sseparse.ErrEventTooLarge) {
		t.Fatalf("gateway with max_event_bytes 1 KiB took an 8 KB partial event (%v)", err)
	}
	states[0] = small.getStreamState() // the one above holds a partial event
	for _, s := range states {
		small.putStreamState(s)
	}
	s := large.getStreamState()
	defer large.putStreamState(s)
	if _, _, err := s.fr.Push([]byte("data: " + strings.Repeat("q", 8000))); errors.Is(err, sseparse.ErrEventTooLarge) {
		t.Fatalf("gateway with max_event_bytes 1 MiB rejected an 8 KB partial event: it got a framer of another gateway (%v)", err)
	}
}

// An upstream that sent [DONE] but keeps the body open until the exchange
// times out has delivered the whole answer: the caller got everything, so the
// record should not say upstream_timeout.
func TestTimeoutAfterTerminalFlushed(t *testing.T) {
	g := relayGateway(t, 0)
	w := &recWriter{h: http.Header{}}
	ctx, cancel := context.WithTimeout(context.Background(), 0)
	defer cancel()
	<-ctx.Done()
	rg := &relayRig{g: g, w: w, d: llm.DialectOpenAI, ctx: ctx, cancel: cancel}
	res := rg.run(io.MultiReader(strings.NewReader(openAIRole+openAITok1+openAIStop+openAIDone),
		errReader{context.DeadlineExceeded}))
	ex := &rg.ex
	if !res.done {
		t.Errorf("attempt result %s not done: another attempt could follow a stream the caller has whole", res.result)
	}
	if string(w.written) != openAIRole+openAITok1+openAIStop+openAIDone {
		t.Fatalf("client got %q", w.written)
	}
	if ex.rec.Outcome != llm.OutcomeOK {
		t.Errorf("outcome %s (interruption %s) for a stream whose [DONE] reached the caller", ex.rec.Outcome, ex.rec.Interruption)
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// tapTransport wraps the gateway's upstream transport: the response
// body signals waiting when the relay, having read the first after bytes,
// asks for more. At that moment the relay has done all it will ever do with
// those bytes, since it reads again only once the previous read is handled.
type tapTransport struct {
	base    *http.Transport
	after   int
	waiting chan struct{}
	once    sync.Once
}

func (tt *tapTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := tt.base.RoundTrip(req)
	if err == nil {
		resp.Body = &tapBody{ReadCloser: resp.Body, tt: tt}
	}
	return resp, err
}

type tapBody struct {
	io.ReadCloser
	tt *tapTransport
	n  int
}

func (b *tapBody) Read(p []byte) (int, error) {
	if b.n >= b.tt.after {
		b.tt.once.Do(func() { close(b.tt.waiting) })
	}
	n, err := b.ReadCloser.Read(p)
	b.n += n
	return n, err
}

// spyWriter records what the gateway did to the caller's response.
type spyWriter struct {
	http.ResponseWriter
	mu     sync.Mutex
	header int      // status passed to WriteHeader, 0 before
	writes [][]byte // every Write, in order
	flush  int
}

func (s *spyWriter) WriteHeader(code int) {
	s.mu.Lock()
	if s.header == 0 {
		s.header = code
	}
	s.mu.Unlock()
	s.ResponseWriter.WriteHeader(code)
}

func (s *spyWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	s.writes = append(s.writes, append([]byte(nil), p...))
	s.mu.Unlock()
	return s.ResponseWriter.Write(p)
}

func (s *spyWriter) Flush() {
	s.mu.Lock()
	s.flush++
	s.mu.Unlock()
	_ = http.NewResponseController(s.ResponseWriter).Flush()
}

func (s *spyWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func (s *spyWriter) snapshot() (header int, writes [][]byte, flushes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.header, append([][]byte(nil), s.writes...), s.flush
}

// openingStreams are the two dialects' streamed requests with an upstream
// stream cut into its preamble and the rest.
var openingStreams = []struct {
	name, path, body string
	preamble, rest   string
}{
	{"openai", "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
		openAIRole, openAITok1 + openAITok2 + openAIStop + openAIDone},
	{"anthropic", "/v1/messages", `{"model":"m","stream":true,"max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`,
		anthropicText[:strings.Index(anthropicText, "event: content_block_delta")],
		anthropicText[strings.Index(anthropicText, "event: content_block_delta"):]},
}

// TestHoldUntilFirstToken: while another attempt is possible, the
// caller gets nothing, not even the response headers, until the first
// token: the upstream has sent its preamble and stalls, and the moment the
// relay asks the upstream for more (it has handled the preamble) the
// gateway has not called WriteHeader, Write or Flush on the caller's
// response. This is observed on the gateway's side through a spy writer and
// a tapped upstream body, so no sleep or timer decides the result. Once the
// upstream sends its first token the caller gets the preamble and the token
// together.
func TestHoldUntilFirstToken(t *testing.T) {
	for _, tc := range openingStreams {
		t.Run(tc.name, func(t *testing.T) {
			gate := newGateUpstream(tc.preamble, tc.rest)
			defer gate.open()
			up := httptest.NewServer(gate)
			defer up.Close()
			base := &http.Transport{}
			defer base.CloseIdleConnections()
			tap := &tapTransport{base: base, after: len(tc.preamble), waiting: make(chan struct{})}
			tg := newTestGatewayWith(t, up.URL, nil, func(o *Options) { o.Transport = tap })
			var spy atomic.Pointer[spyWriter]
			h := tg.gw.Handler()
			front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				s := &spyWriter{ResponseWriter: w}
				spy.Store(s)
				h.ServeHTTP(s, r)
			}))
			defer front.Close()

			done := make(chan sendResult, 1)
			go func() {
				done <- sendRequest(context.Background(), http.MethodPost, front.URL+tc.path, "application/json", tc.body, nil)
			}()
			await(t, tap.waiting, "the relay to read the upstream's preamble")
			header, writes, flushes := spy.Load().snapshot()
			if header != 0 || len(writes) != 0 || flushes != 0 {
				t.Errorf("before the first token the gateway sent the caller: status %d, %d writes (%q), %d flushes",
					header, len(writes), writes, flushes)
			}
			select {
			case r := <-done:
				t.Fatalf("the caller had its response before the first token (err %v)", r.err)
			default:
			}

			gate.open()
			r := awaitResult(t, done)
			if r.resp.StatusCode != http.StatusOK || !strings.HasPrefix(r.resp.Header.Get("Content-Type"), "text/event-stream") {
				t.Errorf("status %d content-type %q", r.resp.StatusCode, r.resp.Header.Get("Content-Type"))
			}
			if string(r.body) != tc.preamble+tc.rest {
				t.Errorf("caller got %q\nwant %q", r.body, tc.preamble+tc.rest)
			}
			_, writes, _ = spy.Load().snapshot()
			if len(writes) == 0 || !bytes.HasPrefix(writes[0], []byte(tc.preamble)) || len(writes[0]) == len(tc.preamble) {
				t.Errorf("the first write to the caller should be the preamble with the first token; got %d writes, first %q", len(writes), firstWrite(writes))
			}
			if rec := tg.record(t); rec.Outcome != llm.OutcomeOK || rec.AttemptCount != 1 || rec.TokenEvents != 2 {
				t.Errorf("record outcome %s attempts %d token events %d", rec.Outcome, rec.AttemptCount, rec.TokenEvents)
			}
		})
	}
}

func firstWrite(b [][]byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b[0]
}

// TestNoHoldWithoutRetry: with no other attempt possible (max_attempts
// 1, one upstream), the headers and the preamble go out before the first
// token. The upstream sends its first token only once the caller has read
// the preamble, so a gateway that held it would deadlock; the caller's
// deadline turns that into a failure instead of a hang.
func TestNoHoldWithoutRetry(t *testing.T) {
	for _, tc := range openingStreams {
		t.Run(tc.name, func(t *testing.T) {
			gate := newGateUpstream(tc.preamble, tc.rest)
			defer gate.open()
			up := httptest.NewServer(gate)
			defer up.Close()
			tg := newTestGateway(t, up.URL, func(c *config.Config) { c.Upstreams[0].Retry.MaxAttempts = 1 })

			ctx, cancel := context.WithTimeout(context.Background(), testWait)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, tg.URL+tc.path, strings.NewReader(tc.body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("no response headers before the first token (the gateway held them with no retry possible): %v", err)
			}
			defer resp.Body.Close()
			pre := make([]byte, len(tc.preamble))
			if _, err := io.ReadFull(resp.Body, pre); err != nil {
				t.Fatalf("reading the preamble before the first token: %v", err)
			}
			if string(pre) != tc.preamble {
				t.Errorf("preamble %q, want %q", pre, tc.preamble)
			}
			gate.open()
			rest, err := io.ReadAll(resp.Body)
			if err != nil || string(rest) != tc.rest {
				t.Errorf("rest %q (%v), want %q", rest, err, tc.rest)
			}
			if rec := tg.record(t); rec.Outcome != llm.OutcomeOK || rec.AttemptCount != 1 {
				t.Errorf("record outcome %s attempts %d", rec.Outcome, rec.AttemptCount)
			}
		})
	}
}

// TestIdleTimeoutMidStream: a stream that goes silent after 3 tokens is
// cut by idle_timeout; the caller has the 3 tokens and then the gateway's
// timeout error event in its dialect (none with stream_error_events off),
// never a terminal marker; nothing is retried after bytes were sent.
func TestIdleTimeoutMidStream(t *testing.T) {
	tests := []struct {
		name, path, body, terminal string
		route                      llm.Route
		errorEvents                bool
		wantEnd                    []byte
	}{
		{"openai", "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			"[DONE]", llm.RouteChatCompletions, true, openAITimeoutEvent},
		{"anthropic", "/v1/messages", `{"model":"m","stream":true,"max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`,
			"message_stop", llm.RouteMessages, true, anthropicTimeoutEvent},
		{"openai without error events", "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			"[DONE]", llm.RouteChatCompletions, false, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mock, url := mockUpstream(t, mockllm.Options{OutputTokens: 5})
			tg := newTestGateway(t, url, func(c *config.Config) {
				c.Upstreams[0].IdleTimeoutSeconds = 0.2
				c.Server.StreamErrorEvents = tc.errorEvents
				fastRetry(&c.Upstreams[0])
			})
			resp, body := post(t, tg.URL+tc.path, tc.body, map[string]string{"X-Mock-Fault": "hang=3"})
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			s := string(body)
			if !strings.Contains(s, " tok3") || strings.Contains(s, " tok4") || strings.Contains(s, tc.terminal) {
				t.Errorf("caller's stream should hold tok1..tok3 and no terminal marker: %q", s)
			}
			if tc.errorEvents && !strings.HasSuffix(s, string(tc.wantEnd)) {
				t.Errorf("stream does not end with the gateway's timeout event %q:\n%q", tc.wantEnd, s)
			}
			if !tc.errorEvents {
				if strings.Contains(s, "error") {
					t.Errorf("error event sent with stream_error_events off: %q", s)
				}
				if i := strings.LastIndex(s, "data: "); i < 0 || !strings.Contains(s[i:], " tok3") {
					t.Errorf("stream should end with the tok3 chunk: %q", s)
				}
			}
			rec := tg.record(t)
			if rec.Outcome != llm.OutcomeUpstreamTimeout || rec.Interruption != llm.InterruptIdleTimeout || rec.TokenEvents != 3 {
				t.Errorf("record outcome %s interruption %s token events %d", rec.Outcome, rec.Interruption, rec.TokenEvents)
			}
			if got, want := attemptList(rec), []string{"mock:200:idle_timeout"}; !slices.Equal(got, want) {
				t.Errorf("attempts %v, want %v", got, want)
			}
			if v := metricValue(t, tg, "tollgate_stream_interruptions_total",
				map[string]string{"route": tc.route.String(), "cause": "idle_timeout"}); v != 1 {
				t.Errorf("stream_interruptions_total{cause=idle_timeout} = %v, want 1", v)
			}
			if v := metricValue(t, tg, "tollgate_upstream_attempts_total",
				map[string]string{"upstream": "mock", "result": "idle_timeout"}); v != 1 {
				t.Errorf("upstream_attempts_total{result=idle_timeout} = %v, want 1", v)
			}
			if st := mock.Stats(); st.Requests != 1 {
				t.Errorf("mock saw %d requests, want 1 (no retry after bytes were sent)", st.Requests)
			}
		})
	}
}

// TestRelayAllocationsDoNotGrowWithEvents proves that the relay allocates
// nothing per event: a stream of 1,024 events costs the same number of
// allocations as one of 16 (only per-request costs remain).
//
// Native histograms are off here: client_golang allocates a sparse bucket
// the first time an ITL value lands in a new bucket (at most
// NativeHistogramMaxBucketNumber of them, so amortised to zero, as
// BenchmarkRelay shows), which would make an exact count depend on timing.
func TestRelayAllocationsDoNotGrowWithEvents(t *testing.T) {
	for _, hold := range []bool{false, true} {
		t.Run(fmt.Sprintf("hold=%v", hold), func(t *testing.T) { relayAllocations(t, hold) })
	}
}

func relayAllocations(t *testing.T, hold bool) {
	allocs := func(events int) float64 {
		rb := newRelayBench(t, events, false)
		rb.hold = hold
		rb.run() // warm the pools and the metric children
		if ex := &rb.ex; ex.rec.Outcome != llm.OutcomeOK || ex.rec.TokenEvents != events || ex.rec.Usage.Output != 8 {
			t.Fatalf("relay of %d events: outcome %s, %d token events, usage %+v", events, ex.rec.Outcome,
				ex.rec.TokenEvents, ex.rec.Usage)
		}
		n := testing.AllocsPerRun(50, rb.run)
		if rb.ex.rec.Outcome != llm.OutcomeOK || rb.ex.rec.TokenEvents != events {
			t.Fatalf("relay of %d events, run again: outcome %s, %d token events", events, rb.ex.rec.Outcome, rb.ex.rec.TokenEvents)
		}
		return n
	}
	small, large := allocs(16), allocs(1024)
	// One allocation per event would add 1,008; a few of slack absorb the
	// race detector, which makes sync.Pool drop items at random (seen: 2 vs
	// 3 under -race).
	if large > small+4 {
		t.Fatalf("relay allocations grow with events: %.1f for 16 events, %.1f for 1024", small, large)
	}
	t.Logf("allocations per stream: %.1f (16 events), %.1f (1024 events)", small, large)
}
