package proxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/spend"
	"github.com/tollgate-llm/tollgate/stats"
)

// TestEstimatedInputCountedAsBilled: an OpenAI stream whose usage never
// comes is billed the prompt estimate as its input; tollgate_tokens_total,
// /stats and the access log must count those same tokens (flagged
// estimated), or spend and tokens disagree for every such request.
func TestEstimatedInputCountedAsBilled(t *testing.T) {
	mock := httptest.NewServer(mockllm.New(mockllm.Options{OutputTokens: 5}))
	defer mock.Close()
	ledger := newLocalLedger(t)
	live := stats.New(nil)
	tg := newTestGatewayWith(t, mock.URL, func(c *config.Config) {
		c.Models = []config.Model{{Pattern: "gpt-*", InputUSDPerMTok: 1, OutputUSDPerMTok: 1}}
	}, func(o *Options) { o.Ledger, o.Stats = ledger, live })

	body := `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"` + strings.Repeat("y", 400) + `"}]}`
	resp, _ := post(t, tg.URL+"/v1/chat/completions", body, map[string]string{"X-Mock-No-Usage": "1"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	rec := tg.record(t)
	rows, err := ledger.Query(context.Background(), spend.Filter{})
	if err != nil || len(rows) != 1 {
		t.Fatalf("ledger %+v %v", rows, err)
	}
	billed := rows[0].Input
	if billed <= 0 || rows[0].Output != 5 {
		t.Fatalf("ledger input %d output %d; want the prompt estimate and 5", billed, rows[0].Output)
	}
	if !rec.InputEstimated || !rec.Usage.HasInput || rec.Usage.Input != billed || !rec.Estimated || rec.Usage.Output != 5 {
		t.Errorf("record usage %+v (input estimated %v, output estimated %v); want the billed input %d, estimated",
			rec.Usage, rec.InputEstimated, rec.Estimated, billed)
	}
	in := metricValue(t, tg, "tollgate_tokens_total", map[string]string{"type": "input", "estimated": "true"})
	out := metricValue(t, tg, "tollgate_tokens_total", map[string]string{"type": "output", "estimated": "true"})
	if in != float64(billed) || out != 5 {
		t.Errorf("tollgate_tokens_total input %v, output %v (estimated); the ledger billed %d and 5", in, out, billed)
	}
	var statsIn int64
	for _, g := range live.Snapshot().Windows[0].Groups {
		statsIn += g.InputTokens
	}
	if statsIn != billed {
		t.Errorf("/stats input tokens %d; the ledger billed %d", statsIn, billed)
	}
	if !strings.Contains(tg.logs.String(), `"input_estimated":true`) {
		t.Errorf("access log does not say the input was estimated: %s", tg.logs.String())
	}

	// With the upstream's usage, nothing is estimated.
	resp, _ = post(t, tg.URL+"/v1/chat/completions", body, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if rec := tg.record(t); rec.InputEstimated || rec.Estimated || !rec.Usage.HasInput {
		t.Errorf("reported usage taken for an estimate: %+v", rec)
	}
}

// TestMalformedAnswerIsAnUpstreamError: a non-streamed 200 on a dialect
// route whose body is not JSON (cut short by a broken proxy, say) is no
// success: the caller's SDK cannot parse it. It is relayed as it came, and
// recorded as an upstream error with a protocol_error interruption, not as
// ok and goodput met, and it is not billed. A whole JSON answer stays ok
// and billed; other statuses (a redirect, a 204) are not judged by their
// body.
func TestMalformedAnswerIsAnUpstreamError(t *testing.T) {
	for _, c := range []struct {
		name, body string
		status     int
		ok, billed bool
	}{
		{"truncated", `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hel`, 200, false, false},
		{"html", `<html>upstream gateway hiccup</html>`, 200, false, false},
		{"empty", ``, 200, false, false},
		{"whole", `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`, 200, true, true},
		{"redirect", `<html>moved</html>`, http.StatusTemporaryRedirect, true, false},
		{"no content", ``, http.StatusNoContent, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			us := httptest.NewServer(&rawUpstream{pieces: [][]byte{[]byte(c.body)}, contentType: "application/json", status: c.status})
			defer us.Close()
			ledger := newLocalLedger(t)
			tg := newTestGatewayWith(t, us.URL, func(cf *config.Config) {
				cf.Upstreams[0].Retry.MaxAttempts = 1
				cf.Models = []config.Model{{Pattern: "gpt-*", InputUSDPerMTok: 1, OutputUSDPerMTok: 1}}
			}, func(o *Options) { o.Ledger = ledger })
			client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
			req, _ := http.NewRequest(http.MethodPost, tg.URL+"/v1/chat/completions",
				strings.NewReader(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`))
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != c.status || string(got) != c.body {
				t.Fatalf("caller got %d %q; want the upstream's answer as it came", resp.StatusCode, got)
			}
			rec := tg.record(t)
			rows, err := ledger.Query(context.Background(), spend.Filter{})
			if err != nil {
				t.Fatal(err)
			}
			if billed := len(rows) == 1 && rec.CostMicros > 0; billed != c.billed {
				t.Errorf("billed %v (ledger %+v, record %d µ$), want %v", billed, rows, rec.CostMicros, c.billed)
			}
			if c.ok {
				if rec.Outcome != llm.OutcomeOK || rec.Interruption != llm.InterruptNone || (c.status == 200 && rec.Usage.Input != 3) {
					t.Errorf("outcome %s, interruption %s, usage %+v; want ok", rec.Outcome, rec.Interruption, rec.Usage)
				}
				return
			}
			if rec.Outcome != llm.OutcomeUpstreamError || rec.Interruption != llm.InterruptProtocolError || rec.Goodput == llm.SLOMet {
				t.Errorf("outcome %s, interruption %s, goodput %s; want upstream_error, protocol_error, not met",
					rec.Outcome, rec.Interruption, rec.Goodput)
			}
			if rec.AttemptCount != 1 || rec.Attempts[0].Result != resultStreamBroken {
				t.Errorf("%d attempts, first %+v; want one, %s", rec.AttemptCount, rec.Attempts[0], resultStreamBroken)
			}
		})
	}
}

// TestForwardedWithoutUsageCountsBilledOutput: a metered forwarded answer
// without usage is billed max_tokens as its output (never nothing); the
// record, tollgate_tokens_total and the ledger carry the same tokens,
// flagged estimated.
func TestForwardedWithoutUsageCountsBilledOutput(t *testing.T) {
	us := httptest.NewServer(&rawUpstream{pieces: [][]byte{[]byte(`{"id":"resp_1","object":"response","output":[]}`)},
		contentType: "application/json"})
	defer us.Close()
	ledger := newLocalLedger(t)
	tg := newTestGatewayWith(t, us.URL, func(c *config.Config) {
		c.Models = []config.Model{{Pattern: "gpt-*", InputUSDPerMTok: 1, OutputUSDPerMTok: 1}}
	}, func(o *Options) { o.Ledger = ledger })
	resp, _ := post(t, tg.URL+"/v1/responses", `{"model":"gpt-4o-mini","input":"hi","max_output_tokens":7}`, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	rec := tg.record(t)
	rows, err := ledger.Query(context.Background(), spend.Filter{})
	if err != nil || len(rows) != 1 || rows[0].Output != 7 {
		t.Fatalf("ledger %+v %v; want max_output_tokens 7 billed as output", rows, err)
	}
	if !rec.Estimated || rec.Usage.Output != 7 || !rec.InputEstimated || rec.Usage.Input != rows[0].Input {
		t.Errorf("record usage %+v (estimated %v/%v); want the billed %d in and 7 out", rec.Usage, rec.InputEstimated, rec.Estimated, rows[0].Input)
	}
	if out := metricValue(t, tg, "tollgate_tokens_total", map[string]string{"type": "output", "estimated": "true"}); out != 7 {
		t.Errorf("tollgate_tokens_total output (estimated) %v, want 7", out)
	}
}
