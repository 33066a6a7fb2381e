package mockllm_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	anthropic "github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	ooption "github.com/openai/openai-go/v3/option"

	"github.com/tollgate-llm/tollgate/mockllm"
)

// statusOf sends body to path and returns the status, draining the body.
func statusOf(ctx context.Context, ts *httptest.Server, path, body string, hdr ...string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+path, strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := ts.Client().Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, err
}

// status is statusOf for the test goroutine.
func status(t *testing.T, ts *httptest.Server, path, body string, hdr ...string) int {
	t.Helper()
	code, err := statusOf(waitCtx(t), ts, path, body, hdr...)
	if err != nil {
		t.Fatal(err)
	}
	return code
}

// settled waits until every request the mock received has been counted as
// ended, and returns the counters.
func settled(t *testing.T, m *mockllm.Server) mockllm.Stats {
	t.Helper()
	st, err := m.WaitStats(waitCtx(t), func(s mockllm.Stats) bool {
		return s.Completed+s.Canceled+s.Aborted+s.BadRequests == s.Requests
	})
	if err != nil {
		t.Fatalf("requests still running: %+v (%v)", st, err)
	}
	return st
}

// stallUntilCanceled sends a request that must stall before its headers,
// cancels it once the mock holds it, and checks the client saw no response
// and the mock counted a cancel.
func stallUntilCanceled(t *testing.T, m *mockllm.Server, ts *httptest.Server, d dialectCase) {
	t.Helper()
	before := settled(t, m)
	ctx, cancel := context.WithCancel(waitCtx(t))
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := statusOf(ctx, ts, d.path, d.whole)
		errc <- err
	}()
	if _, err := m.WaitStats(waitCtx(t), func(s mockllm.Stats) bool {
		return s.Requests > before.Requests && s.InFlight == 1
	}); err != nil {
		t.Fatalf("the request never got in flight: %v", err)
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("client error %v, want context.Canceled (the request should have stalled)", err)
	}
	if err := m.WaitCanceled(waitCtx(t), before.Canceled+1); err != nil {
		t.Fatalf("WaitCanceled: %v (stats %+v)", err, m.Stats())
	}
}

func TestInjectOrderAndCount(t *testing.T) {
	m, ts := start(t, mockllm.Options{})
	if err := m.Inject("status=429", 1); err != nil {
		t.Fatal(err)
	}
	if err := m.Inject("stall=3600000", 2); err != nil {
		t.Fatal(err)
	}
	if err := m.Inject("status=503", 1); err != nil {
		t.Fatal(err)
	}
	// The queue is shared by both generation routes.
	oa, an := dialects[0], dialects[1]
	if got := status(t, ts, oa.path, oa.whole); got != 429 {
		t.Fatalf("request 1: status %d, want 429", got)
	}
	stallUntilCanceled(t, m, ts, an)
	stallUntilCanceled(t, m, ts, oa)
	if got := status(t, ts, an.path, an.whole); got != 503 {
		t.Fatalf("request 4: status %d, want 503", got)
	}
	for i := 5; i <= 6; i++ {
		if got := status(t, ts, oa.path, oa.whole); got != 200 {
			t.Fatalf("request %d: status %d, want 200", i, got)
		}
	}
	st := settled(t, m)
	if st.Injected != 4 || st.Faults != 4 || st.Canceled != 2 || st.Completed != 4 || st.Requests != 6 {
		t.Errorf("stats %+v, want 4 injected, 4 faults, 2 canceled, 4 completed", st)
	}
}

func TestInjectClear(t *testing.T) {
	m, ts := start(t, mockllm.Options{})
	if err := m.Inject("status=500", 5); err != nil {
		t.Fatal(err)
	}
	if got := status(t, ts, "/v1/chat/completions", `{"model":"m"}`); got != 500 {
		t.Fatalf("status %d, want 500", got)
	}
	m.ClearInjected()
	if got := status(t, ts, "/v1/chat/completions", `{"model":"m"}`); got != 200 {
		t.Fatalf("after ClearInjected: status %d, want 200", got)
	}
	// The queue works again after a clear.
	if err := m.Inject("status=502", 1); err != nil {
		t.Fatal(err)
	}
	if got := status(t, ts, "/v1/chat/completions", `{"model":"m"}`); got != 502 {
		t.Fatalf("status %d, want 502", got)
	}
	if st := m.Stats(); st.Injected != 2 {
		t.Errorf("Injected %d, want 2", st.Injected)
	}
}

func TestInjectRejectsBadSpec(t *testing.T) {
	m, ts := start(t, mockllm.Options{})
	tests := []struct {
		spec    string
		n       int
		mention string
	}{
		{"explode=1", 1, "explode"},
		{"status=200", 1, "status"},
		{"status=429;retry-after=soon", 1, "retry-after"},
		{"retry-after=3", 1, "status"},
		{"retry-after-ms=300", 1, "status"},
		{"status=429;retry-after-ms=-1", 1, "retry-after-ms"},
		{"status=429;retry-after-ms=inf", 1, "retry-after-ms"},
		{"status=429;retry-after-ms=NaN", 1, "retry-after-ms"},
		{"hang=-1", 1, "hang"},
		{"hang=later", 1, "hang"},
		{"hang=", 1, "hang"},
		{"status=429", 0, "count"},
		{"status=429", -3, "count"},
	}
	for _, tc := range tests {
		err := m.Inject(tc.spec, tc.n)
		if err == nil {
			t.Errorf("Inject(%q, %d) accepted", tc.spec, tc.n)
			continue
		}
		if msg := err.Error(); !strings.HasPrefix(msg, "mockllm: ") || !strings.Contains(msg, tc.mention) {
			t.Errorf("Inject(%q, %d): error %q does not mention %q", tc.spec, tc.n, msg, tc.mention)
		}
	}
	// Nothing was queued.
	if got := status(t, ts, "/v1/chat/completions", `{"model":"m"}`); got != 200 {
		t.Errorf("status %d after rejected specs, want 200", got)
	}
	if st := m.Stats(); st.Injected != 0 || st.Faults != 0 {
		t.Errorf("stats %+v, want nothing injected", st)
	}
}

func TestInjectOverridesHeader(t *testing.T) {
	m, ts := start(t, mockllm.Options{})
	if err := m.Inject("status=429", 1); err != nil {
		t.Fatal(err)
	}
	if err := m.Inject("", 1); err != nil { // an empty spec: a normal answer
		t.Fatal(err)
	}
	hdr := []string{"X-Mock-Fault", "status=500"}
	for i, want := range []int{429, 200, 500} {
		if got := status(t, ts, "/v1/messages", `{"model":"c","max_tokens":5}`, hdr...); got != want {
			t.Errorf("request %d: status %d, want %d", i+1, got, want)
		}
	}
	// The 429 and the header's 500 are faults; the empty spec is not.
	if st := m.Stats(); st.Injected != 2 || st.Faults != 2 {
		t.Errorf("stats %+v, want 2 injected, 2 faults", st)
	}
}

func TestInjectNotUsedByRejectedRequests(t *testing.T) {
	const key = "sk-right"
	m, ts := start(t, mockllm.Options{RequireKey: key})
	if err := m.Inject("status=429", 1); err != nil {
		t.Fatal(err)
	}
	auth := []string{"Authorization", "Bearer " + key}
	rejected := []struct {
		name, method, path, body string
		hdr                      []string
	}{
		{"bad json", "POST", "/v1/chat/completions", `{"model":`, auth},
		{"no model", "POST", "/v1/chat/completions", `{}`, auth},
		{"no max_tokens", "POST", "/v1/messages", `{"model":"c"}`, auth},
		{"wrong key", "POST", "/v1/chat/completions", `{"model":"m"}`, []string{"Authorization", "Bearer sk-wrong"}},
		{"no key", "POST", "/v1/messages", `{"model":"c","max_tokens":5}`, nil},
		{"bad header", "POST", "/v1/chat/completions", `{"model":"m"}`, append([]string{"X-Mock-TTFT-Ms", "-1"}, auth...)},
		{"bad fault header", "POST", "/v1/messages", `{"model":"c","max_tokens":5}`, append([]string{"X-Mock-Fault", "hang=x"}, auth...)},
		{"wrong method", "GET", "/v1/chat/completions", ``, auth},
	}
	for _, tc := range rejected {
		resp := do(t, waitCtx(t), ts, tc.method, tc.path, tc.body, tc.hdr...)
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode < 400 || resp.StatusCode >= 500 || resp.StatusCode == 429 {
			t.Errorf("%s: status %d, want a 4xx rejection", tc.name, resp.StatusCode)
		}
	}
	// Other routes do not take injected faults either.
	for _, p := range []struct{ method, path, body string }{
		{"GET", "/v1/models", ``},
		{"POST", "/v1/embeddings", `{"model":"e","input":"hi"}`},
		{"POST", "/v1/messages/count_tokens", `{"model":"c","messages":[]}`},
	} {
		resp := do(t, waitCtx(t), ts, p.method, p.path, p.body, auth...)
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != 200 {
			t.Errorf("%s %s: status %d, want 200", p.method, p.path, resp.StatusCode)
		}
	}
	if st := settled(t, m); st.Injected != 0 || st.BadRequests != int64(len(rejected)) {
		t.Fatalf("stats %+v, want nothing injected and %d bad requests", st, len(rejected))
	}
	if got := status(t, ts, "/v1/chat/completions", `{"model":"m"}`, auth...); got != 429 {
		t.Errorf("first valid request: status %d, want the injected 429", got)
	}
	if st := m.Stats(); st.Injected != 1 {
		t.Errorf("Injected %d, want 1", st.Injected)
	}
}

func TestInjectConcurrent(t *testing.T) {
	const (
		injectors = 8
		each      = 3
		queued    = injectors * each
		requests  = 40
		late      = 10
	)
	m, ts := start(t, mockllm.Options{})
	var wg sync.WaitGroup
	for range injectors {
		wg.Go(func() {
			if err := m.Inject("status=429", each); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()

	// Requests race each other and more Inject calls, which queue behind
	// the 429s, so exactly the first `queued` takers get a 429.
	codes := make(chan int, requests)
	for i := range requests {
		wg.Go(func() {
			d := dialects[i%2]
			code, err := statusOf(waitCtx(t), ts, d.path, d.whole)
			if err != nil {
				t.Error(err)
			}
			codes <- code
		})
	}
	for range late {
		wg.Go(func() {
			if err := m.Inject("status=500", 1); err != nil {
				t.Error(err)
			}
			_ = m.Stats()
		})
	}
	wg.Wait()
	close(codes)
	count := map[int]int{}
	for c := range codes {
		count[c]++
	}
	if count[429] != queued || count[429]+count[500]+count[200] != requests || count[500] > late {
		t.Fatalf("statuses %v, want %d × 429 and the rest 500 or 200", count, queued)
	}
	st := settled(t, m)
	if st.Injected != int64(queued+count[500]) || st.Completed != requests {
		t.Errorf("stats %+v, want %d injected", st, queued+count[500])
	}
	// What the late calls queued and no request took is still there.
	for i := count[500]; i < late; i++ {
		if got := status(t, ts, "/v1/chat/completions", `{"model":"m"}`); got != 500 {
			t.Fatalf("leftover %d: status %d, want 500", i, got)
		}
	}
	if got := status(t, ts, "/v1/chat/completions", `{"model":"m"}`); got != 200 {
		t.Errorf("after the queue: status %d, want 200", got)
	}
}

// nextEvent reads one SSE event from br.
func nextEvent(br *bufio.Reader) (event, error) {
	var ev event
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return ev, err
		}
		line = strings.TrimRight(line, "\n")
		switch {
		case line == "" && ev.data != "":
			return ev, nil
		case strings.HasPrefix(line, "event: "):
			ev.name = line[len("event: "):]
		case strings.HasPrefix(line, "data: "):
			ev.data = line[len("data: "):]
		}
	}
}

func TestHangStream(t *testing.T) {
	const n = 5
	// pre is the number of events before the first token.
	pre := map[string]int{"openai": 1, "anthropic": 3}
	tests := []struct {
		spec      string
		tokens    int // token events before the silence
		malformed int
		inject    bool
	}{
		{spec: "hang=0", tokens: 0},
		{spec: "hang=2", tokens: 2},
		{spec: "hang=5", tokens: n},
		{spec: "hang=99", tokens: n},
		{spec: "malformed=3;hang=3", tokens: 3, malformed: 1},
		{spec: "hang=3", tokens: 3, inject: true},
	}
	for _, d := range dialects {
		for _, tc := range tests {
			name := d.name + " " + tc.spec
			if tc.inject {
				name += " injected"
			}
			t.Run(name, func(t *testing.T) {
				m, ts := start(t, mockllm.Options{OutputTokens: n})
				var hdr []string
				if tc.inject {
					if err := m.Inject(tc.spec, 1); err != nil {
						t.Fatal(err)
					}
					// The injected fault replaces this one.
					hdr = []string{"X-Mock-Fault", "disconnect=0"}
				} else {
					hdr = []string{"X-Mock-Fault", tc.spec}
				}
				ctx, cancel := context.WithCancel(waitCtx(t))
				defer cancel()
				resp := do(t, ctx, ts, http.MethodPost, d.path, d.body, hdr...)
				if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
					t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
				}
				// Read what must arrive before the silence: the events
				// before the first token, the token events, and the
				// malformed event if one is due.
				br := bufio.NewReader(resp.Body)
				var got []event
				tokens, malformed := 0, 0
				for len(got) < pre[d.name] || tokens < tc.tokens || malformed < tc.malformed {
					ev, err := nextEvent(br)
					if err != nil {
						t.Fatalf("stream ended after %d events: %v", len(got), err)
					}
					got = append(got, ev)
					switch {
					case !json.Valid([]byte(ev.data)):
						malformed++
					case d.isToken(t, ev):
						tokens++
					}
				}
				cancel()
				rest, err := readEvents(br)
				if err == nil {
					t.Error("the body ended normally; want it cut by the cancel")
				}
				got = append(got, rest...)
				s := summarize(t, d, got)
				if s.tokens != tc.tokens || s.terminal || s.errEv || s.malformed != tc.malformed {
					t.Errorf("got %d tokens, terminal %v, error event %v, %d malformed; want %d tokens, %d malformed and silence",
						s.tokens, s.terminal, s.errEv, s.malformed, tc.tokens, tc.malformed)
				}
				if tc.malformed > 0 && s.malformedAfter != tc.tokens {
					t.Errorf("malformed event after %d tokens, want %d", s.malformedAfter, tc.tokens)
				}
				st := settled(t, m)
				if st.Canceled != 1 || st.Completed != 0 || st.Aborted != 0 || st.Faults != 1 {
					t.Errorf("stats %+v, want 1 canceled, none completed or aborted", st)
				}
				if want := int64(btoi(tc.inject)); st.Injected != want {
					t.Errorf("Injected %d, want %d", st.Injected, want)
				}
			})
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestHangWhole(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			m, ts := start(t, mockllm.Options{})
			ctx, cancel := context.WithCancel(waitCtx(t))
			defer cancel()
			errc := make(chan error, 1)
			go func() {
				code, err := statusOf(ctx, ts, d.path, d.whole, "X-Mock-Fault", "hang=0")
				if err == nil {
					err = errors.New("got a response with status " + strconv.Itoa(code))
				}
				errc <- err
			}()
			if _, err := m.WaitStats(waitCtx(t), func(s mockllm.Stats) bool { return s.InFlight == 1 }); err != nil {
				t.Fatal(err)
			}
			cancel()
			if err := <-errc; !errors.Is(err, context.Canceled) {
				t.Errorf("client error %v, want context.Canceled before any header", err)
			}
			if st := settled(t, m); st.Canceled != 1 || st.Completed != 0 {
				t.Errorf("stats %+v, want 1 canceled", st)
			}
		})
	}
}

func TestRetryAfterMs(t *testing.T) {
	tests := []struct {
		spec, after, afterMs string
	}{
		{"status=429;retry-after-ms=1500", "", "1500"},
		{"status=503;retry-after=2;retry-after-ms=250.5", "2", "250.5"},
		{"status=529;retry-after=7", "7", ""},
	}
	for _, d := range dialects {
		for _, tc := range tests {
			t.Run(d.name+" "+tc.spec, func(t *testing.T) {
				m, ts := start(t, mockllm.Options{})
				resp := post(t, ts, d.path, d.body, "X-Mock-Fault", tc.spec)
				if resp.Header.Get("Retry-After") != tc.after || resp.Header.Get("retry-after-ms") != tc.afterMs {
					t.Errorf("Retry-After %q, retry-after-ms %q; want %q, %q",
						resp.Header.Get("Retry-After"), resp.Header.Get("retry-after-ms"), tc.after, tc.afterMs)
				}
				// The same through Inject.
				if err := m.Inject(tc.spec, 1); err != nil {
					t.Fatal(err)
				}
				resp = post(t, ts, d.path, d.body)
				if resp.StatusCode < 429 || resp.Header.Get("Retry-After") != tc.after || resp.Header.Get("retry-after-ms") != tc.afterMs {
					t.Errorf("injected: status %d, Retry-After %q, retry-after-ms %q; want %q, %q", resp.StatusCode,
						resp.Header.Get("Retry-After"), resp.Header.Get("retry-after-ms"), tc.after, tc.afterMs)
				}
			})
		}
	}
}

// TestInjectSDKRetry is the scenario Inject exists for: the SDK resends the
// same request after a 429 or 529 and sees one successful response.
func TestInjectSDKRetry(t *testing.T) {
	t.Run("openai", func(t *testing.T) {
		m, ts := start(t, mockllm.Options{OutputTokens: 3})
		if err := m.Inject("status=429;retry-after-ms=1", 1); err != nil {
			t.Fatal(err)
		}
		client := openAIClient(ts, ooption.WithMaxRetries(2))
		cc, err := client.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
			Model: "m", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		if len(cc.Choices) != 1 || cc.Choices[0].Message.Content != words(" tok", 1, 3) {
			t.Errorf("choices %+v", cc.Choices)
		}
		checkRetried(t, m)
	})
	t.Run("anthropic", func(t *testing.T) {
		m, ts := start(t, mockllm.Options{OutputTokens: 3})
		if err := m.Inject("status=529;retry-after-ms=1", 1); err != nil {
			t.Fatal(err)
		}
		client := anthropicClient(ts, aoption.WithMaxRetries(2))
		msg, err := client.Messages.New(t.Context(), anthropic.MessageNewParams{
			Model: "c", MaxTokens: 10,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))},
		})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		if len(msg.Content) != 1 || msg.Content[0].Text != words(" tok", 1, 3) {
			t.Errorf("content %+v", msg.Content)
		}
		checkRetried(t, m)
	})
}

// checkRetried checks the mock saw the same request twice and injected the
// first.
func checkRetried(t *testing.T, m *mockllm.Server) {
	t.Helper()
	recs := m.Requests()
	if len(recs) != 2 || string(recs[0].Body) != string(recs[1].Body) {
		t.Fatalf("%d requests recorded, want the same body twice", len(recs))
	}
	if st := settled(t, m); st.Injected != 1 || st.Completed != 2 {
		t.Errorf("stats %+v, want 1 injected, 2 completed", st)
	}
}
