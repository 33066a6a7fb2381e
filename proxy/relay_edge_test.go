package proxy

// Edge cases of the relay found in review: withheld chunks at read
// boundaries, CRLF split across reads, oversized events, outcomes after the
// terminal marker, buffer reuse, gzip upstreams. Each failed before its fix.

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/sseparse"
)

// recWriter is a ResponseWriter that records what was written and what had
// been flushed.
type recWriter struct {
	h       http.Header
	written []byte
	flushed int // len(written) at the last Flush
}

func (w *recWriter) Header() http.Header { return w.h }
func (w *recWriter) Write(p []byte) (int, error) {
	w.written = append(w.written, p...)
	return len(p), nil
}
func (w *recWriter) WriteHeader(int) {}
func (w *recWriter) Flush()          { w.flushed = len(w.written) }

// scriptReader serves reads in order (a read larger than p is served in
// parts, as a socket would) and calls before(i) before serving read i.
type scriptReader struct {
	reads  [][]byte
	i      int
	before func(i int)
	sizes  []int // len(p) of every Read call
}

func (s *scriptReader) Read(p []byte) (int, error) {
	s.sizes = append(s.sizes, len(p))
	if s.i == len(s.reads) {
		if s.before != nil {
			s.before(s.i)
		}
		return 0, io.EOF
	}
	if s.before != nil {
		s.before(s.i)
	}
	n := copy(p, s.reads[s.i])
	if n == len(s.reads[s.i]) {
		s.i++
	} else {
		s.reads[s.i] = s.reads[s.i][n:]
	}
	return n, nil
}

func edgeGateway(t *testing.T, maxEvent int) *Gateway {
	t.Helper()
	return bareGateway(t, "http://127.0.0.1:1", func(c *config.Config) {
		if maxEvent > 0 {
			c.Server.MaxEventBytes = maxEvent
		}
	})
}

// runRelay relays body through a fresh exchange and returns it.
func runRelay(g *Gateway, r *http.Request, w http.ResponseWriter, d llm.Dialect, suppress bool, body io.Reader) *exchange {
	ex := &exchange{g: g, w: w, r: r, up: g.upstreams[0], modelLabel: "m"}
	ex.rec.Route, ex.rec.Dialect, ex.rec.Status = llm.RouteChatCompletions, d, 200
	ex.rec.Timing.In = g.now()
	ex.info.suppressUsage = suppress
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	ex.relay(ctx, cancel, sseResponse(body), false, &phaseTimer{})
	return ex
}

// A complete event that precedes the withheld usage chunk in the same read
// must be flushed before the relay blocks on the next read (DESIGN 1: never
// buffer a stream), and its flush must set t_first_token_out.
func TestRelayFlushesBeforeWithheldChunk(t *testing.T) {
	g := edgeGateway(t, 0)
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
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	ex := runRelay(g, req, w, llm.DialectOpenAI, true, body)
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
	g := edgeGateway(t, 1024)
	w := &recWriter{h: http.Header{}}
	huge := "data: " + strings.Repeat("y", 4000)
	body := &scriptReader{reads: [][]byte{[]byte(openAIRole + openAITok1 + huge)}}
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	ex := runRelay(g, req, w, llm.DialectOpenAI, false, body)
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
			g := edgeGateway(t, 0)
			w := &recWriter{h: http.Header{}}
			body := &scriptReader{}
			for _, r := range tc.reads {
				body.reads = append(body.reads, []byte(r))
			}
			req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
			runRelay(g, req, w, llm.DialectOpenAI, true, body)
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
	g := edgeGateway(t, 0)
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
	ex := runRelay(g, req, w, llm.DialectOpenAI, false, body)
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
			var reads [][]byte
			for rest := in; rest != ""; {
				n := 1 + rng.IntN(min(len(rest), []int{7, 300, 5000, 70000}[iter%4]))
				reads = append(reads, []byte(rest[:n]))
				rest = rest[n:]
			}
			g := edgeGateway(t, 0)
			w := &recWriter{h: http.Header{}}
			var unflushed []int
			body := &scriptReader{reads: reads, before: func(i int) {
				if len(w.written) != w.flushed {
					unflushed = append(unflushed, i)
				}
			}}
			req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
			ex := runRelay(g, req, w, llm.DialectOpenAI, true, body)
			if string(w.written) != want {
				if fidelity++; fidelity == 1 {
					i := 0
					for i < min(len(w.written), len(want)) && w.written[i] == want[i] {
						i++
					}
					t.Logf("eol %q iter %d: client got %d bytes, want %d; first difference at %d: got %q want %q",
						eol, iter, len(w.written), len(want), i, w.written[i:min(i+8, len(w.written))], want[i:min(i+8, len(want))])
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
	g := edgeGateway(t, 0)
	w := &recWriter{h: http.Header{}}
	ev := openAITok1
	var reads [][]byte
	for range 200 {
		reads = append(reads, []byte(ev))
	}
	body := &scriptReader{reads: reads}
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	runRelay(g, req, w, llm.DialectOpenAI, false, body)
	small := 0
	for _, s := range body.sizes {
		if s < relayBufSize/2 {
			small++
		}
	}
	if small > 0 {
		t.Errorf("%d of %d reads offered less than half the %d-byte buffer although no event was pending (last sizes %v)",
			small, len(body.sizes), relayBufSize, body.sizes[len(body.sizes)-8:])
	}
}

// The stream-state pool is package-global but each framer keeps the
// max_event_bytes of the gateway that built it, so a second gateway (tests,
// a config reload) gets framers with the wrong cap.
func TestStreamStatePoolIsPerGateway(t *testing.T) {
	small := edgeGateway(t, 1024)
	large := edgeGateway(t, 1<<20)
	var states []*streamState
	for range 8 { // several, since the race detector drops some pool Puts
		states = append(states, small.getStreamState())
	}
	for _, s := range states {
		small.putStreamState(s)
	}
	s := large.getStreamState()
	defer large.putStreamState(s)
	if _, _, err := s.fr.Push([]byte("data: " + strings.Repeat("q", 8000))); errors.Is(err, sseparse.ErrEventTooLarge) {
		t.Fatalf("gateway with max_event_bytes 1 MiB rejected an 8 KB partial event: it got a framer of another gateway (%v)", err)
	}
}

// gzipUpstream compresses its answer when the request allows it.
func gzipUpstream(t *testing.T, ct string, pieces []string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", ct)
		var out io.Writer = w
		var zw *gzip.Writer
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.Header().Set("Content-Encoding", "gzip")
			zw = gzip.NewWriter(w)
			out = zw
		} else {
			t.Errorf("upstream was not offered gzip (Accept-Encoding %q)", r.Header.Get("Accept-Encoding"))
		}
		rc := http.NewResponseController(w)
		for _, p := range pieces {
			_, _ = io.WriteString(out, p)
			if zw != nil {
				_ = zw.Flush()
			}
			_ = rc.Flush()
		}
		if zw != nil {
			_ = zw.Close()
		}
	})
}

// A gzip-speaking upstream: the caller asked for gzip, the gateway let the
// transport negotiate it, and the caller must get plain, identical bytes
// without a Content-Encoding header.
func TestGzipUpstream(t *testing.T) {
	jsonBody := `{"id":"chatcmpl-1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`
	sse := []string{openAIRole, openAITok1, openAITok2, openAIStop + openAIUsage, openAIDone}
	tests := []struct {
		name, ct, body string
		pieces         []string
		want           string
		stream         bool
	}{
		{"json", "application/json", `{"model":"m","messages":[]}`, []string{jsonBody}, jsonBody, false},
		{"sse", "text/event-stream", `{"model":"m","stream":true,"messages":[]}`, sse,
			openAIRole + openAITok1 + openAITok2 + openAIStop + openAIDone, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(gzipUpstream(t, tc.ct, tc.pieces))
			defer srv.Close()
			tg := newTestGateway(t, srv.URL, nil)
			req, _ := http.NewRequest(http.MethodPost, tg.URL+"/v1/chat/completions", strings.NewReader(tc.body))
			req.Header.Set("Accept-Encoding", "gzip") // the caller's own: must not reach the upstream
			resp, err := (&http.Client{Transport: &http.Transport{DisableCompression: true}}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if ce := resp.Header.Get("Content-Encoding"); ce != "" {
				t.Errorf("client got Content-Encoding %q", ce)
			}
			if !bytes.Equal(got, []byte(tc.want)) {
				t.Errorf("client got %.200q", got)
			}
			rec := tg.record(t)
			if rec.Outcome != llm.OutcomeOK || rec.Usage.Output != 7 && !tc.stream || tc.stream && rec.Usage.Output != 8 {
				t.Errorf("record outcome %s output %d", rec.Outcome, rec.Usage.Output)
			}
		})
	}
}

// An upstream that sent [DONE] but keeps the body open until the exchange
// times out has delivered the whole answer: the caller got everything, so the
// record should not say upstream_timeout.
func TestTimeoutAfterTerminalFlushed(t *testing.T) {
	g := edgeGateway(t, 0)
	w := &recWriter{h: http.Header{}}
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 0)
	defer cancel()
	<-ctx.Done()
	ex := &exchange{g: g, w: w, r: req, up: g.upstreams[0], modelLabel: "m"}
	ex.rec.Route, ex.rec.Dialect, ex.rec.Status = llm.RouteChatCompletions, llm.DialectOpenAI, 200
	ex.rec.Timing.In = g.now()
	ex.relay(ctx, cancel, sseResponse(io.MultiReader(strings.NewReader(openAIRole+openAITok1+openAIStop+openAIDone),
		errReader{context.DeadlineExceeded})), false, &phaseTimer{})
	if string(w.written) != openAIRole+openAITok1+openAIStop+openAIDone {
		t.Fatalf("client got %q", w.written)
	}
	if ex.rec.Outcome != llm.OutcomeOK {
		t.Errorf("outcome %s (interruption %s) for a stream whose [DONE] reached the caller", ex.rec.Outcome, ex.rec.Interruption)
	}
}

// sseResponse is an upstream event-stream response with body.
func sseResponse(body io.Reader) *http.Response {
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"text/event-stream"}},
		Body: io.NopCloser(body)}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }
