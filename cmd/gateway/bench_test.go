package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/bench"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/stats"
)

// TestBenchCommand runs `gateway bench` against the fake upstream: the JSON
// report counts every request, -min-goodput gates the exit status, and bad
// flags are usage errors.
func TestBenchCommand(t *testing.T) {
	up := httptest.NewServer(mockllm.New(mockllm.Options{TTFT: 20 * time.Millisecond, ITL: 2 * time.Millisecond, OutputTokens: 8}))
	t.Cleanup(up.Close)
	base := []string{"bench", "-url", up.URL, "-model", "m", "-requests", "6", "-concurrency", "2", "-quiet", "-max-tokens", "64"}

	var out, errb strings.Builder
	if code := run(append(base, "-json"), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var rep struct {
		Summaries []struct {
			Class     string `json:"class"`
			Requests  int    `json:"requests"`
			Succeeded int    `json:"succeeded"`
		} `json:"summaries"`
	}
	if err := json.Unmarshal([]byte(out.String()), &rep); err != nil {
		t.Fatalf("JSON report: %v\n%s", err, out.String())
	}
	all := rep.Summaries[len(rep.Summaries)-1]
	if all.Class != bench.ClassAll || all.Requests != 6 || all.Succeeded != 6 {
		t.Fatalf("summary %+v, want all 6 requests succeeded", all)
	}

	// A TTFT objective no request can meet (the schedule's TTFT is 20 ms).
	out.Reset()
	errb.Reset()
	if code := run(append(base, "-slo-ttft-ms", "1", "-min-goodput", "0.5"), &out, &errb); code != 1 ||
		!strings.Contains(errb.String(), "below -min-goodput") || !strings.Contains(out.String(), "goodput") {
		t.Errorf("gate: exit %d, stderr %q; want 1 and the table printed", code, errb.String())
	}
	for _, bad := range [][]string{
		{"bench", "-model", "m"},
		{"bench", "-url", up.URL},
		{"bench", "-url", up.URL, "-model", "m", "-dialect", "grpc"},
		{"bench", "-url", up.URL, "-model", "m", "-min-goodput", "2"},
	} {
		if code := run(bad, &out, &errb); code != 2 {
			t.Errorf("%v: exit %d, want 2 (usage)", bad, code)
		}
	}
	t.Setenv("TOLLGATE_TEST_EMPTY_KEY", "")
	if code := run(append(base, "-key-env", "TOLLGATE_TEST_EMPTY_KEY"), &out, &errb); code != 1 {
		t.Errorf("unset key variable: exit %d, want 1", code)
	}
}

// TestBenchAgainstGatewayStats: a bench run through a gateway, and the
// gateway's /stats for the same run. Every request the client counted is
// in /stats, and the gateway's TTFT, stamped right after the first token's
// flush and before the second token is written, is earlier than the
// client's reading of the second token: so the gateway's median is at most
// the median of the client's TTFT + first gap (plus the sketch's relative
// error). The client's first token alone is no bound: it can be read before
// the gateway's goroutine, back from the flush, takes its timestamp.
func TestBenchAgainstGatewayStats(t *testing.T) {
	base, _ := startStatsGateway(t, nil)

	res, err := bench.Run(context.Background(), bench.Config{BaseURL: base, Dialect: llm.DialectOpenAI, Model: "m",
		Requests: 12, Concurrency: 3, MaxTokens: 64, Timeout: 10 * time.Second, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	client := res.Summary(bench.ClassAll)
	if client == nil || client.Succeeded != 12 {
		t.Fatalf("client summary %+v, want 12 successes", client)
	}

	resp, err := http.Get(base + "/stats?window=1m&route=chat_completions")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rep stats.Report
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
		t.Fatal(err)
	}
	var requests, ttftCount int64
	var ttftP50 float64
	for _, w := range rep.Windows {
		for _, g := range w.Groups {
			if g.Team == "" { // the team-less ITL group
				continue
			}
			requests += g.Requests
			ttftCount += g.TTFT.Count
			ttftP50 = g.TTFT.P50
		}
	}
	if requests != 12 || ttftCount != 12 {
		t.Fatalf("/stats counts %d requests, %d TTFTs; the client sent 12\n%+v", requests, ttftCount, rep)
	}
	second := make([]float64, 0, len(res.Samples))
	for _, s := range res.Samples {
		if len(s.ITL) == 0 {
			t.Fatalf("sample %d has no inter-token gap", s.Index)
		}
		second = append(second, float64(s.TTFT+s.ITL[0])/float64(time.Millisecond))
	}
	sort.Float64s(second)
	// The sketch's median interpolates between the middle ranks, as numpy's
	// does; each request's TTFT is under its second token, so each order
	// statistic is, and so is the median.
	median := (second[(len(second)-1)/2] + second[len(second)/2]) / 2
	if limit := median * (1 + rep.Sketch.RelativeError); ttftP50 > limit {
		t.Errorf("gateway TTFT P50 %.3f ms is later than the client's second tokens (median %.3f ms, +%g%%)",
			ttftP50, median, 100*rep.Sketch.RelativeError)
	}
	if ttftP50 < float64(sideUpstreamTTFT.Milliseconds())*(1-rep.Sketch.RelativeError) {
		t.Errorf("gateway TTFT P50 %.3f ms is below the upstream's scheduled 20 ms", ttftP50)
	}
}

// headerRecorder passes requests to next and counts them by the value of
// one header.
type headerRecorder struct {
	next   http.Handler
	header string

	mu     sync.Mutex
	values map[string]int
	total  int
}

func (h *headerRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	h.values[r.Header.Get(h.header)]++
	h.total++
	h.mu.Unlock()
	h.next.ServeHTTP(w, r)
}

// TestBenchTurnsCommand runs `gateway bench -turns 3`: the upstream sees
// each conversation's three requests under one value of the header (named
// by -conversation-header when given), a different value per conversation,
// and the JSON report counts the conversations sent.
func TestBenchTurnsCommand(t *testing.T) {
	for _, header := range []string{"", "X-Chat-Session"} {
		name := header
		if name == "" {
			name = bench.DefaultConversationHeader
		}
		t.Run(name, func(t *testing.T) {
			rec := &headerRecorder{next: mockllm.New(mockllm.Options{TTFT: 5 * time.Millisecond, ITL: time.Millisecond, OutputTokens: 4}),
				header: name, values: map[string]int{}}
			up := httptest.NewServer(rec)
			t.Cleanup(up.Close)
			args := []string{"bench", "-url", up.URL, "-model", "m", "-requests", "6", "-concurrency", "2", "-turns", "3",
				"-quiet", "-json", "-gateway-stats", "off", "-max-tokens", "16"}
			if header != "" {
				args = append(args, "-conversation-header", header)
			}
			var out, errb strings.Builder
			if code := run(args, &out, &errb); code != 0 {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			up.Close() // waits for the handlers
			if rec.total != 6 || len(rec.values) != 2 || rec.values[""] != 0 {
				t.Fatalf("upstream saw %d requests, by %s: %v; want 6 in 2 conversations", rec.total, name, rec.values)
			}
			for v, n := range rec.values {
				if n != 3 {
					t.Errorf("conversation %s: %d requests, want 3", v, n)
				}
			}
			var rep struct {
				Conversations *bench.Conversations `json:"conversations"`
			}
			if err := json.Unmarshal([]byte(out.String()), &rep); err != nil {
				t.Fatal(err)
			}
			if c := rep.Conversations; c == nil || c.Started != 2 || c.Completed != 2 || c.TurnsPerConversation != 3 || c.Header != name {
				t.Errorf("conversations %+v, want 2 completed of 3 turns under %s", c, name)
			}
		})
	}
}

// TestBenchTurnsThroughGateway: conversations through a tollgate reach the
// upstream whole, the Responses chain included (the mock refuses a
// previous_response_id it did not give), and the gateway counts every turn.
func TestBenchTurnsThroughGateway(t *testing.T) {
	base, m := startStatsGateway(t, nil)
	var out, errb strings.Builder
	for _, d := range []string{"openai", "responses"} {
		out.Reset()
		if code := run([]string{"bench", "-url", base, "-model", "demo-gpt-note", "-requests", "6", "-concurrency", "2",
			"-turns", "3", "-quiet", "-dialect", d, "-max-tokens", "16"}, &out, &errb); code != 0 {
			t.Fatalf("%s: exit %d: %s\n%s", d, code, errb.String(), out.String())
		}
		if !strings.Contains(out.String(), "started 2, completed 2, failed 0, cut short 0; 3.00 turns per conversation") {
			t.Errorf("%s: report:\n%s", d, out.String())
		}
	}
	if got := m.Stats().Requests; got != 12 {
		t.Errorf("upstream saw %d requests, want 12", got)
	}
}

// TestBenchTurnsFlagErrors: -turns below 1, -turns with -rate, and
// -conversation-header where no header is sent are usage errors, and send
// nothing.
func TestBenchTurnsFlagErrors(t *testing.T) {
	m := mockllm.New(mockllm.Options{})
	up := httptest.NewServer(m)
	t.Cleanup(up.Close)
	base := []string{"bench", "-url", up.URL, "-model", "m", "-quiet", "-gateway-stats", "off"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-turns", "0"}, "-turns 0: want 1 or more"},
		{[]string{"-turns", "-2"}, "-turns -2: want 1 or more"},
		{[]string{"-turns", "2", "-rate", "5"}, "-rate is not allowed with -turns"},
		{[]string{"-conversation-header", "X-Chat"}, "-conversation-header needs -turns"},
		{[]string{"-turns", "2", "-dialect", "responses", "-conversation-header", "X-Chat"}, "previous_response_id"},
		{[]string{"-turns", "2", "-conversation-header", "X Chat"}, "not a header name"},
	} {
		var out, errb strings.Builder
		code := run(append(base, c.args...), &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", c.args, code, errb.String(), c.want)
		}
	}
	if got := m.Stats().Requests; got != 0 {
		t.Errorf("usage errors sent %d requests", got)
	}
}
