package bench_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/bench"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
)

// recorded is one request as the recorder in front of the mock saw it.
type recorded struct {
	header http.Header
	body   []byte
	// responseID is the id response.created named in the answer (Responses).
	responseID string
}

// recorder serves the mock behind it and records every request, with the
// id of the response it got on the Responses API. fail, when set, answers a
// request 400 instead of passing it on (a 400 is not retried).
type recorder struct {
	next http.Handler
	fail func(r *http.Request, body []byte) bool

	mu   sync.Mutex
	reqs []recorded
}

func (rc *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	if rc.fail != nil && rc.fail(r, body) {
		rc.add(recorded{header: r.Header.Clone(), body: body})
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"error":{"type":"invalid_request_error","message":"refused by the test"}}`)
		return
	}
	cw := &captureWriter{ResponseWriter: w}
	rc.next.ServeHTTP(cw, r)
	rc.add(recorded{header: r.Header.Clone(), body: body, responseID: createdID(cw.buf.Bytes())})
}

func (rc *recorder) add(r recorded) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.reqs = append(rc.reqs, r)
}

// captureWriter keeps a copy of what it writes, and flushes as asked.
type captureWriter struct {
	http.ResponseWriter
	buf bytes.Buffer
}

func (c *captureWriter) Write(p []byte) (int, error) {
	c.buf.Write(p)
	return c.ResponseWriter.Write(p)
}

func (c *captureWriter) Flush() { http.NewResponseController(c.ResponseWriter).Flush() }

func (c *captureWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// createdID returns the response id of a Responses stream's response.created.
func createdID(stream []byte) string {
	for line := range strings.SplitSeq(string(stream), "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type     string `json:"type"`
			Response struct {
				ID string `json:"id"`
			} `json:"response"`
		}
		if json.Unmarshal([]byte(data), &ev) == nil && ev.Type == "response.created" {
			return ev.Response.ID
		}
	}
	return ""
}

// startRecorder serves a recorder in front of a mock on loopback. Its
// requests are complete once stop has returned (stop waits for the
// handlers).
func startRecorder(t *testing.T, fail func(*http.Request, []byte) bool) (rc *recorder, url string, stop func()) {
	t.Helper()
	m := mockllm.New(mockllm.Options{TTFT: 5 * time.Millisecond, ITL: time.Millisecond, OutputTokens: 6})
	rc = &recorder{next: m, fail: fail}
	ts := httptest.NewServer(rc)
	t.Cleanup(ts.Close)
	return rc, ts.URL, ts.Close
}

// reqBody is what the tests read of a request body.
type reqBody struct {
	Messages []bench.Message `json:"messages"`
	Input    []bench.Message `json:"input"`
	Store    *bool           `json:"store"`
	Previous *string         `json:"previous_response_id"`
}

func decodeBody(t *testing.T, b []byte) reqBody {
	t.Helper()
	var rb reqBody
	if err := json.Unmarshal(b, &rb); err != nil {
		t.Fatalf("request body: %v\n%s", err, b)
	}
	return rb
}

// TestConversationsCarryOneHeaderEach: with three turns on the Chat
// Completions and Messages dialects, the upstream sees every conversation's
// three requests under one header value, a different value per
// conversation, each turn's history one answer and one question longer than
// the last; and the result counts what was sent.
func TestConversationsCarryOneHeaderEach(t *testing.T) {
	for _, tc := range []struct {
		dialect llm.Dialect
		header  string // Config.ConversationHeader
	}{
		{llm.DialectOpenAI, ""},
		{llm.DialectAnthropic, ""},
		{llm.DialectOpenAI, "X-Session-Id"},
	} {
		t.Run(tc.dialect.String()+"/"+tc.header, func(t *testing.T) {
			rc, url, stop := startRecorder(t, nil)
			const convs, turns = 4, 3
			res, err := bench.Run(runCtx(t), bench.Config{BaseURL: url, Dialect: tc.dialect, Model: "m",
				Requests: convs * turns, Concurrency: 3, MaxTokens: 16, Turns: turns,
				ConversationHeader: tc.header, RunID: "run7"})
			if err != nil {
				t.Fatal(err)
			}
			stop()
			header := tc.header
			if header == "" {
				header = bench.DefaultConversationHeader
			}

			byConv := map[string][]reqBody{}
			for _, r := range rc.reqs {
				if tc.header != "" && r.header.Get(bench.DefaultConversationHeader) != "" {
					t.Errorf("the default header was sent beside %s", tc.header)
				}
				v := r.header.Get(header)
				if !strings.HasPrefix(v, "run7-") {
					t.Fatalf("%s %q, want run7-<n>", header, v)
				}
				byConv[v] = append(byConv[v], decodeBody(t, r.body))
			}
			if len(rc.reqs) != convs*turns || len(byConv) != convs {
				t.Fatalf("upstream saw %d requests in %d conversations, want %d in %d", len(rc.reqs), len(byConv), convs*turns, convs)
			}
			for v, bodies := range byConv {
				if len(bodies) != turns {
					t.Fatalf("conversation %s: %d requests, want %d", v, len(bodies), turns)
				}
				// The turns of one conversation are sent one after
				// another, so they are recorded in order: each adds an
				// answer and a question, the question last.
				for k := 1; k < turns; k++ {
					prev, cur := bodies[k-1].Messages, bodies[k].Messages
					if len(cur) != len(prev)+2 || cur[len(cur)-2].Role != "assistant" ||
						cur[len(cur)-2].Content == "" || cur[len(cur)-1].Role != "user" {
						t.Errorf("conversation %s turn %d: %d messages after %d, ending %+v", v, k+1, len(cur), len(prev), cur[len(cur)-2:])
					}
				}
			}

			c := res.Conversations
			if c == nil || c.Started != convs || c.Completed != convs || c.Failed != 0 || c.Cut != 0 ||
				c.TurnsPerConversation != turns || c.Header != header || c.Turns != turns {
				t.Fatalf("conversations %+v, want %d completed of %d turns under %s", c, convs, turns, header)
			}
			if c.FirstTurnTTFT.Count != convs || c.LaterTurnTTFT.Count != convs*(turns-1) {
				t.Errorf("TTFT counts first %d, later %d; want %d and %d", c.FirstTurnTTFT.Count, c.LaterTurnTTFT.Count, convs, convs*(turns-1))
			}
			seen := map[[2]int]bool{}
			for _, s := range res.Samples {
				if s.Conversation < 1 || s.Conversation > convs || s.Turn < 1 || s.Turn > turns || seen[[2]int{s.Conversation, s.Turn}] {
					t.Errorf("sample %d: conversation %d turn %d", s.Index, s.Conversation, s.Turn)
				}
				seen[[2]int{s.Conversation, s.Turn}] = true
			}
			checkConversationReports(t, res)
		})
	}
}

// checkConversationReports: the table and the JSON report carry the
// conversation summary as the result holds it.
func checkConversationReports(t *testing.T, res *bench.Result) {
	t.Helper()
	var tb strings.Builder
	if err := res.WriteTable(&tb); err != nil {
		t.Fatal(err)
	}
	c := res.Conversations
	for _, want := range []string{
		"conversations of " + strconv.Itoa(c.Turns) + " turns",
		"started " + strconv.Itoa(c.Started) + ", completed " + strconv.Itoa(c.Completed),
		"first turn", "later turns",
	} {
		if !strings.Contains(tb.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, tb.String())
		}
	}
	var jb bytes.Buffer
	if err := res.WriteJSON(&jb); err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Conversations *bench.Conversations `json:"conversations"`
		Samples       []struct {
			Conversation int `json:"conversation"`
			Turn         int `json:"turn"`
		} `json:"samples"`
	}
	if err := json.Unmarshal(jb.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Conversations == nil || *rep.Conversations != *c {
		t.Errorf("JSON conversations %+v, want %+v", rep.Conversations, c)
	}
	for i, s := range rep.Samples {
		if s.Conversation != res.Samples[i].Conversation || s.Turn != res.Samples[i].Turn {
			t.Errorf("JSON sample %d: conversation %d turn %d", i, s.Conversation, s.Turn)
		}
	}
}

// TestResponsesTurnsChainThroughPreviousResponseID: on the Responses API
// turn k > 1 names turn k−1's response id as previous_response_id, every
// turn asks for "store": true, and no conversation header is sent, so a
// gateway finds the conversation from the chain alone.
func TestResponsesTurnsChainThroughPreviousResponseID(t *testing.T) {
	rc, url, stop := startRecorder(t, nil)
	const convs, turns = 3, 3
	res, err := bench.Run(runCtx(t), bench.Config{BaseURL: url, Dialect: llm.DialectResponses, Model: "m",
		Requests: convs * turns, Concurrency: 2, MaxTokens: 16, Turns: turns})
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if len(rc.reqs) != convs*turns {
		t.Fatalf("upstream saw %d requests, want %d", len(rc.reqs), convs*turns)
	}
	byID := map[string]reqBody{}
	next := map[string]string{} // response id → the response that continued it
	var firsts []string
	for _, r := range rc.reqs {
		if v := r.header.Get(bench.DefaultConversationHeader); v != "" {
			t.Errorf("%s %q sent on the Responses API", bench.DefaultConversationHeader, v)
		}
		b := decodeBody(t, r.body)
		if b.Store == nil || !*b.Store {
			t.Errorf("store %v, want true", b.Store)
		}
		if r.responseID == "" || byID[r.responseID].Input != nil {
			t.Fatalf("response id %q missing or repeated", r.responseID)
		}
		byID[r.responseID] = b
		switch {
		case b.Previous == nil:
			firsts = append(firsts, r.responseID)
		case next[*b.Previous] != "":
			t.Errorf("%s continued twice", *b.Previous)
		default:
			next[*b.Previous] = r.responseID
		}
	}
	if len(firsts) != convs {
		t.Fatalf("%d requests without previous_response_id, want %d (one per conversation)", len(firsts), convs)
	}
	for _, id := range firsts {
		n := 1
		for cur := id; next[cur] != ""; cur = next[cur] {
			if _, ok := byID[next[cur]]; !ok {
				t.Fatalf("%s continues no response the upstream gave", next[cur])
			}
			n++
		}
		if n != turns {
			t.Errorf("the chain from %s has %d turns, want %d", id, n, turns)
		}
	}
	if c := res.Conversations; c == nil || c.Started != convs || c.Completed != convs || c.Header != "" {
		t.Errorf("conversations %+v, want %d completed, no header", c, convs)
	}
	checkConversationReports(t, res)
}

// TestConversationCutByTheBound: a request bound that is no multiple of the
// turns cuts the last conversation short, and only it; a failed turn ends
// its conversation and gives its unsent turns back, so the run still sends
// exactly Requests.
func TestConversationCutByTheBound(t *testing.T) {
	t.Run("bound", func(t *testing.T) {
		rc, url, stop := startRecorder(t, nil)
		res, err := bench.Run(runCtx(t), bench.Config{BaseURL: url, Dialect: llm.DialectOpenAI, Model: "m",
			Requests: 7, Concurrency: 2, MaxTokens: 16, Turns: 3})
		if err != nil {
			t.Fatal(err)
		}
		stop()
		c := res.Conversations
		if len(rc.reqs) != 7 || len(res.Samples) != 7 || c.Started != 3 || c.Completed != 2 || c.Cut != 1 ||
			c.Failed != 0 || c.TurnsPerConversation != 7.0/3 {
			t.Errorf("upstream %d, samples %d, conversations %+v; want 7 requests, 2 completed and 1 cut", len(rc.reqs), len(res.Samples), c)
		}
	})
	t.Run("failed turn", func(t *testing.T) {
		// The second turn of conversation 2 is refused.
		rc, url, stop := startRecorder(t, func(r *http.Request, body []byte) bool {
			return r.Header.Get(bench.DefaultConversationHeader) == "r-2" && bytes.Contains(body, []byte(`"assistant"`))
		})
		res, err := bench.Run(runCtx(t), bench.Config{BaseURL: url, Dialect: llm.DialectOpenAI, Model: "m",
			Requests: 9, Concurrency: 2, MaxTokens: 16, Turns: 3, RunID: "r"})
		if err != nil {
			t.Fatal(err)
		}
		stop()
		c := res.Conversations
		// 3 + 2 (failed) + 3 + 1 (cut: the turn given back) = 9.
		if len(rc.reqs) != 9 || c.Started != 4 || c.Completed != 2 || c.Failed != 1 || c.Cut != 1 {
			t.Errorf("upstream %d, conversations %+v; want 9 requests, 2 completed, 1 failed, 1 cut", len(rc.reqs), c)
		}
		all := res.Summary(bench.ClassAll)
		if all.Failed != 1 || all.Errors.Status[http.StatusBadRequest] != 1 {
			t.Errorf("all %+v, want the one 400", all)
		}
	})
}

// TestSingleTurnSendsNoConversation: the default run sends what it always
// did, no conversation header, no store or previous_response_id, and
// reports no conversations.
func TestSingleTurnSendsNoConversation(t *testing.T) {
	for _, d := range []llm.Dialect{llm.DialectOpenAI, llm.DialectResponses} {
		rc, url, stop := startRecorder(t, nil)
		res, err := bench.Run(runCtx(t), bench.Config{BaseURL: url, Dialect: d, Model: "m", Requests: 3, Concurrency: 2, MaxTokens: 16})
		if err != nil {
			t.Fatal(err)
		}
		stop()
		for _, r := range rc.reqs {
			b := decodeBody(t, r.body)
			if r.header.Get(bench.DefaultConversationHeader) != "" || b.Store != nil || b.Previous != nil {
				t.Errorf("%s: a single-turn request carries a conversation: %v %s", d, r.header, r.body)
			}
		}
		var jb, tb bytes.Buffer
		if err := res.WriteJSON(&jb); err != nil {
			t.Fatal(err)
		}
		if err := res.WriteTable(&tb); err != nil {
			t.Fatal(err)
		}
		if res.Conversations != nil || bytes.Contains(jb.Bytes(), []byte(`"conversation`)) ||
			bytes.Contains(jb.Bytes(), []byte(`"turn"`)) || strings.Contains(tb.String(), "conversations") {
			t.Errorf("%s: a single-turn run reports conversations", d)
		}
	}
}
