package mockllm_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/mockllm"
)

// dialectCase describes one generation route for dialect-agnostic tests.
type dialectCase struct {
	name     string
	path     string
	body     string // streamed
	whole    string // not streamed
	isToken  func(*testing.T, event) bool
	terminal func(event) bool
	isError  func(event) bool
}

var dialects = []dialectCase{
	{
		name: "openai", path: "/v1/chat/completions",
		body: `{"model":"m","stream":true}`, whole: `{"model":"m"}`,
		isToken:  isOpenAIToken,
		terminal: func(ev event) bool { return ev.data == "[DONE]" },
		isError:  func(ev event) bool { return strings.HasPrefix(ev.data, `{"error":`) },
	},
	{
		name: "anthropic", path: "/v1/messages",
		body: `{"model":"c","max_tokens":100,"stream":true}`, whole: `{"model":"c","max_tokens":100}`,
		isToken:  isAnthropicToken,
		terminal: func(ev event) bool { return ev.name == "message_stop" },
		isError:  func(ev event) bool { return ev.name == "error" },
	},
}

// summary counts what a stream contained.
type summary struct {
	tokens, malformed int
	terminal, errEv   bool
	// malformedAfter is the number of token events before the malformed one.
	malformedAfter int
	last           event
}

func summarize(t *testing.T, d dialectCase, evs []event) summary {
	var s summary
	for _, ev := range evs {
		switch {
		case ev.data != "[DONE]" && !json.Valid([]byte(ev.data)):
			s.malformed++
			s.malformedAfter = s.tokens
		case d.isToken(t, ev):
			s.tokens++
		case d.terminal(ev):
			s.terminal = true
		case d.isError(ev):
			s.errEv = true
		}
	}
	if len(evs) > 0 {
		s.last = evs[len(evs)-1]
	}
	return s
}

func TestStreamFaults(t *testing.T) {
	const n = 6
	tests := []struct {
		fault      string
		broken     bool // body read fails
		tokens     int
		terminal   bool
		errEv      bool
		malformed  int // count; malformedAt tokens before it
		malformedN int
		aborted    int64
	}{
		{fault: "disconnect=0", broken: true, tokens: 0, aborted: 1},
		{fault: "disconnect=3", broken: true, tokens: 3, aborted: 1},
		{fault: "disconnect=99", broken: true, tokens: n, aborted: 1},
		{fault: "error-event=2", tokens: 2, errEv: true},
		{fault: "error-event=6", tokens: n, errEv: true},
		{fault: "malformed=4", tokens: n, terminal: true, malformed: 1, malformedN: 4},
		{fault: "malformed=1;error-event=3", tokens: 3, errEv: true, malformed: 1, malformedN: 1},
		{fault: "malformed=2;disconnect=5", broken: true, tokens: 5, malformed: 1, malformedN: 2, aborted: 1},
		{fault: "stall=1", tokens: n, terminal: true},
	}
	for _, d := range dialects {
		for _, tc := range tests {
			t.Run(d.name+" "+tc.fault, func(t *testing.T) {
				m, ts := start(t, mockllm.Options{OutputTokens: n})
				resp := post(t, ts, d.path, d.body, "X-Mock-Fault", tc.fault)
				if resp.StatusCode != 200 {
					t.Fatalf("status %d", resp.StatusCode)
				}
				evs, err := readEvents(resp.Body)
				if tc.broken != (err != nil) {
					t.Fatalf("read error %v, want broken=%v", err, tc.broken)
				}
				s := summarize(t, d, evs)
				if s.tokens != tc.tokens || s.terminal != tc.terminal || s.errEv != tc.errEv || s.malformed != tc.malformed {
					t.Errorf("got %d tokens, terminal %v, error event %v, %d malformed; want %d, %v, %v, %d",
						s.tokens, s.terminal, s.errEv, s.malformed, tc.tokens, tc.terminal, tc.errEv, tc.malformed)
				}
				if tc.malformed > 0 && s.malformedAfter != tc.malformedN {
					t.Errorf("malformed event after %d tokens, want %d", s.malformedAfter, tc.malformedN)
				}
				if tc.errEv && !d.isError(s.last) {
					t.Errorf("the body goes on after the error event: last %+v", s.last)
				}
				st, err := m.WaitStats(waitCtx(t), func(s mockllm.Stats) bool {
					return s.Completed+s.Aborted+s.Canceled == 1
				})
				if err != nil || st.Aborted != tc.aborted || st.Faults != 1 || st.Canceled != 0 {
					t.Errorf("stats %+v (%v), want aborted %d, faults 1", st, err, tc.aborted)
				}
			})
		}
	}
}

func TestWholeFaults(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.name+" disconnect", func(t *testing.T) {
			_, ts := start(t, mockllm.Options{})
			resp := post(t, ts, d.path, d.whole, "X-Mock-Fault", "disconnect=1")
			if _, err := io.ReadAll(resp.Body); err == nil {
				t.Error("body read without error")
			}
		})
		t.Run(d.name+" malformed", func(t *testing.T) {
			_, ts := start(t, mockllm.Options{})
			resp := post(t, ts, d.path, d.whole, "X-Mock-Fault", "malformed=0")
			b, err := io.ReadAll(resp.Body)
			if err != nil || resp.StatusCode != 200 || json.Valid(b) || len(b) == 0 {
				t.Errorf("status %d err %v body %q: want 200 with truncated JSON", resp.StatusCode, err, b)
			}
		})
		t.Run(d.name+" stall", func(t *testing.T) {
			_, ts := start(t, mockllm.Options{})
			const stall = 20 * time.Millisecond
			t0 := time.Now()
			resp := post(t, ts, d.path, d.whole, "X-Mock-Fault", "stall=20")
			if got := time.Since(t0); got < stall || resp.StatusCode != 200 {
				t.Errorf("status %d after %v, want 200 after at least %v", resp.StatusCode, got, stall)
			}
		})
	}
}

func TestCancelMidStream(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			// One token at once, then an hour to the next: only the client's
			// cancel can end this stream.
			m, ts := start(t, mockllm.Options{ITL: time.Hour})
			ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
			defer cancel()
			resp := do(t, ctx, ts, http.MethodPost, d.path, d.body)
			br := bufio.NewReader(resp.Body)
			waitForToken(t, d, br)
			cancel()
			wctx := waitCtx(t)
			if err := m.WaitCanceled(wctx, 1); err != nil {
				t.Fatalf("WaitCanceled: %v (stats %+v)", err, m.Stats())
			}
			st, err := m.WaitStats(wctx, func(s mockllm.Stats) bool { return s.InFlight == 0 })
			if err != nil || st.Completed != 0 || st.Canceled != 1 {
				t.Errorf("stats %+v (%v)", st, err)
			}
		})
	}
}

// waitForToken reads events until the first token event.
func waitForToken(t *testing.T, d dialectCase, br *bufio.Reader) {
	t.Helper()
	var cur event
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("stream ended before a token: %v", err)
		}
		line = strings.TrimRight(line, "\n")
		switch {
		case strings.HasPrefix(line, "event: "):
			cur.name = line[len("event: "):]
		case strings.HasPrefix(line, "data: "):
			cur.data = line[len("data: "):]
		case line == "":
			if d.isToken(t, cur) {
				return
			}
			cur = event{}
		}
	}
}

func TestCancelWhileStalled(t *testing.T) {
	m, ts := start(t, mockllm.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/chat/completions",
			strings.NewReader(`{"model":"m","stream":true}`))
		req.Header.Set("X-Mock-Fault", "stall=3600000")
		resp, err := ts.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	// The request has arrived and holds a slot: it is stalling.
	if _, err := m.WaitStats(waitCtx(t), func(s mockllm.Stats) bool { return s.InFlight == 1 }); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("client error %v, want context.Canceled", err)
	}
	if err := m.WaitCanceled(waitCtx(t), 1); err != nil {
		t.Errorf("WaitCanceled: %v (stats %+v)", err, m.Stats())
	}
}

func TestMaxConcurrentQueues(t *testing.T) {
	const slots = 2
	m, ts := start(t, mockllm.Options{MaxConcurrent: slots, ITL: time.Hour})
	d := dialects[0]

	// Fill both slots with streams that stay open until canceled.
	cancels := make([]context.CancelFunc, slots)
	for i := range slots {
		ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
		defer cancel()
		cancels[i] = cancel
		resp := do(t, ctx, ts, http.MethodPost, d.path, d.body)
		waitForToken(t, d, bufio.NewReader(resp.Body))
	}

	// Two more requests queue behind them.
	var wg sync.WaitGroup
	results := make(chan string, 2)
	rctx := waitCtx(t)
	for range 2 {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(rctx, http.MethodPost, ts.URL+d.path, strings.NewReader(d.whole))
			req.Header.Set("X-Mock-ITL-Ms", "0") // answer at once when admitted
			resp, err := ts.Client().Do(req)
			if err != nil {
				results <- err.Error()
				return
			}
			defer resp.Body.Close()
			results <- strconv.Itoa(resp.StatusCode)
		})
	}
	ctx := waitCtx(t)
	st, err := m.WaitStats(ctx, func(s mockllm.Stats) bool { return s.Waiting == 2 })
	if err != nil || st.InFlight != slots || st.Queued != 2 {
		t.Fatalf("stats %+v (%v), want 2 in flight, 2 waiting", st, err)
	}
	select {
	case r := <-results:
		t.Fatalf("a queued request was answered while both slots were held: %s", r)
	default:
	}

	// Freeing one slot lets the queue drain one at a time.
	cancels[0]()
	for range 2 {
		if r := <-results; r != "200" {
			t.Errorf("queued request: %s", r)
		}
	}
	wg.Wait()
	cancels[1]()
	st, err = m.WaitStats(ctx, func(s mockllm.Stats) bool { return s.InFlight == 0 && s.Canceled == 2 })
	if err != nil || st.PeakInFlight != slots || st.Completed != 2 || st.Waiting != 0 {
		t.Errorf("stats %+v (%v), want peak %d, 2 completed", st, err, slots)
	}
}

func TestCancelWhileQueued(t *testing.T) {
	m, ts := start(t, mockllm.Options{MaxConcurrent: 1, ITL: time.Hour})
	d := dialects[1]
	hold, release := context.WithTimeout(t.Context(), waitTimeout)
	defer release()
	resp := do(t, hold, ts, http.MethodPost, d.path, d.body)
	waitForToken(t, d, bufio.NewReader(resp.Body))

	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+d.path, strings.NewReader(d.whole))
		resp, err := ts.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	if _, err := m.WaitStats(waitCtx(t), func(s mockllm.Stats) bool { return s.Waiting == 1 }); err != nil {
		t.Fatal(err)
	}
	cancel()
	<-errc
	if err := m.WaitCanceled(waitCtx(t), 1); err != nil {
		t.Fatalf("WaitCanceled: %v", err)
	}
	if st := m.Stats(); st.Waiting != 0 || st.InFlight != 1 {
		t.Errorf("stats %+v, want the holder still in flight and none waiting", st)
	}
	release()
	if err := m.WaitCanceled(waitCtx(t), 2); err != nil {
		t.Fatalf("WaitCanceled: %v", err)
	}
}

func TestScheduleLowerBounds(t *testing.T) {
	// Lower bounds only: a slow machine can make the mock late, never early.
	const ttft, itl, n = 30 * time.Millisecond, 5 * time.Millisecond, 4
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			_, ts := start(t, mockllm.Options{TTFT: ttft, ITL: itl, OutputTokens: n})
			t0 := time.Now()
			resp := post(t, ts, d.path, d.body)
			br := bufio.NewReader(resp.Body)
			waitForToken(t, d, br)
			if got := time.Since(t0); got < ttft {
				t.Errorf("first token after %v, want at least %v", got, ttft)
			}
			evs, err := readEvents(br)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := time.Since(t0), ttft+(n-1)*itl; got < want {
				t.Errorf("last token after %v, want at least %v", got, want)
			}
			if s := summarize(t, d, evs); s.tokens != n-1 || !s.terminal {
				t.Errorf("after the first token: %d tokens, terminal %v", s.tokens, s.terminal)
			}
		})
	}
	t.Run("header override, not streamed", func(t *testing.T) {
		_, ts := start(t, mockllm.Options{})
		t0 := time.Now()
		resp := post(t, ts, "/v1/chat/completions", `{"model":"m"}`,
			"X-Mock-TTFT-Ms", "20", "X-Mock-ITL-Ms", "2.5", "X-Mock-Output-Tokens", "5")
		if _, err := io.ReadAll(resp.Body); err != nil {
			t.Fatal(err)
		}
		if got, want := time.Since(t0), 20*time.Millisecond+4*2500*time.Microsecond; got < want {
			t.Errorf("whole answer after %v, want at least %v", got, want)
		}
	})
}

func TestRequireKey(t *testing.T) {
	const key = "sk-secret-123"
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			_, ts := start(t, mockllm.Options{RequireKey: key})
			for _, hdr := range [][]string{nil, {"Authorization", "Bearer wrong"}, {"x-api-key", "sk-secret-12"}} {
				resp := post(t, ts, d.path, d.whole, hdr...)
				b, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != 401 || strings.Contains(string(b), "secret") {
					t.Errorf("%v: status %d body %s", hdr, resp.StatusCode, b)
				}
				var m map[string]any
				if err := json.Unmarshal(b, &m); err != nil {
					t.Fatal(err)
				}
				checkErrorShape(t, m, d.name == "anthropic", resp)
			}
			for _, hdr := range [][]string{{"Authorization", "Bearer " + key}, {"x-api-key", key}} {
				if resp := post(t, ts, d.path, d.whole, hdr...); resp.StatusCode != 200 {
					t.Errorf("%v: status %d", hdr[0], resp.StatusCode)
				}
			}
		})
	}
}

func TestRequestsRecorded(t *testing.T) {
	m, ts := start(t, mockllm.Options{})
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	post(t, ts, "/v1/chat/completions", body, "X-Trace", "abc")
	recs := m.Requests()
	if len(recs) != 1 {
		t.Fatalf("%d records", len(recs))
	}
	r := recs[0]
	if r.Method != "POST" || r.Path != "/v1/chat/completions" || string(r.Body) != body ||
		r.Header.Get("X-Trace") != "abc" || r.At.IsZero() {
		t.Errorf("record %+v", r)
	}

	// The record keeps the last 256, oldest first.
	const total = 300
	for i := range total {
		resp := do(t, t.Context(), ts, http.MethodGet, "/v1/models?i="+strconv.Itoa(i), "")
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	recs = m.Requests()
	if len(recs) != 256 {
		t.Fatalf("%d records, want 256", len(recs))
	}
	for j, r := range recs {
		if want := "i=" + strconv.Itoa(total+1-256+j-1); r.Query != want {
			t.Fatalf("record %d: query %q, want %q", j, r.Query, want)
		}
	}
	if st := m.Stats(); st.Requests != total+1 || st.Completed != total+1 {
		t.Errorf("stats %+v", st)
	}
}
