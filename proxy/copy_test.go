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
	"github.com/tollgate-llm/tollgate/spend"
)

// TestStreamAnsweredAsJSONGoodput: a stream request the upstream answers
// with a plain JSON body (it ignored "stream") is a non-streamed success:
// no TTFT objective applies.
func TestStreamAnsweredAsJSONGoodput(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`))
	}))
	defer srv.Close()
	tg := newTestGateway(t, srv.URL, nil)
	post(t, tg.URL+"/v1/chat/completions", `{"model":"m","stream":true}`, nil)
	rec := tg.record(t)
	if rec.Outcome != llm.OutcomeOK || rec.Stream {
		t.Errorf("outcome %s, stream %v for a whole JSON answer; want ok, not streamed", rec.Outcome, rec.Stream)
	}
	if rec.Outcome == llm.OutcomeOK && rec.Goodput != llm.SLOMet {
		t.Errorf("ok answer classified goodput=%s (stream=%v, ttft=%v)", rec.Goodput, rec.Stream, rec.TTFT())
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
