package proxy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/ratelimit"
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

// TestForwardedWithoutUsageCountsBilledOutput: a metered forwarded answer
// without usage is billed max_tokens as its output (never nothing); the
// record, tollgate_tokens_total and the ledger carry the same tokens,
// flagged estimated.
func TestForwardedWithoutUsageCountsBilledOutput(t *testing.T) {
	us := httptest.NewServer(&rawUpstream{pieces: [][]byte{[]byte(`{"id":"cmpl_1","object":"text_completion","choices":[]}`)},
		contentType: "application/json"})
	defer us.Close()
	ledger := newLocalLedger(t)
	tg := newTestGatewayWith(t, us.URL, func(c *config.Config) {
		c.Models = []config.Model{{Pattern: "gpt-*", InputUSDPerMTok: 1, OutputUSDPerMTok: 1}}
	}, func(o *Options) { o.Ledger = ledger })
	resp, _ := post(t, tg.URL+"/v1/completions", `{"model":"gpt-4o-mini","prompt":"hi","max_tokens":7}`, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	rec := tg.record(t)
	rows, err := ledger.Query(context.Background(), spend.Filter{})
	if err != nil || len(rows) != 1 || rows[0].Output != 7 {
		t.Fatalf("ledger %+v %v; want max_tokens 7 billed as output", rows, err)
	}
	if !rec.Estimated || rec.Usage.Output != 7 || !rec.InputEstimated || rec.Usage.Input != rows[0].Input {
		t.Errorf("record usage %+v (estimated %v/%v); want the billed %d in and 7 out", rec.Usage, rec.InputEstimated, rec.Estimated, rows[0].Input)
	}
	if out := metricValue(t, tg, "tollgate_tokens_total", map[string]string{"type": "output", "estimated": "true"}); out != 7 {
		t.Errorf("tollgate_tokens_total output (estimated) %v, want 7", out)
	}
}

// TestStreamBrokenBeforeTokenNotBilled: a stream the upstream breaks
// before any token and any usage is not billed, like an error answer; one
// that broke after a token is.
func TestStreamBrokenBeforeTokenNotBilled(t *testing.T) {
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

// TestErrorEventOnlyStreamNotBilled: a 200 stream whose only event
// is an error event (no token, no usage) is what an error status would
// have been: nothing is billed, in the ledger or the record, whether the
// opening was held or not. The same stream with one token before the error
// is billed (the token and the prompt estimate).
func TestErrorEventOnlyStreamNotBilled(t *testing.T) {
	errEv := errorEvent("invalid_request_error", "context_length_exceeded")
	for _, attempts := range []int{1, 3} {
		for _, c := range []struct {
			name   string
			pieces [][]byte
			tokens int
			billed bool
		}{
			{"error_only", eventPieces(errEv), 0, false},
			{"token_then_error", eventPieces(chunkEvent(`{"role":"assistant","content":""}`), chunkEvent(`{"content":"Hello"}`), errEv), 1, true},
		} {
			t.Run(c.name+"/max_attempts="+strconv.Itoa(attempts), func(t *testing.T) {
				us := httptest.NewServer(&rawUpstream{pieces: c.pieces})
				defer us.Close()
				ledger := newLocalLedger(t)
				tg := newTestGatewayWith(t, us.URL, func(cf *config.Config) {
					cf.Upstreams[0].Retry.MaxAttempts = attempts
					cf.Models = []config.Model{{Pattern: "gpt-*", InputUSDPerMTok: 2.5, OutputUSDPerMTok: 10}}
				}, func(o *Options) { o.Ledger = ledger })
				body := `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"` +
					strings.Repeat("x", 4000) + `"}]}`
				resp, b := post(t, tg.URL+"/v1/chat/completions", body, nil)
				rec := tg.record(t)
				if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "context_length_exceeded") {
					t.Fatalf("caller got %d %q; want the stream with its error event", resp.StatusCode, b)
				}
				if rec.Interruption != llm.InterruptUpstreamErrorEvent || rec.TokenEvents != c.tokens {
					t.Errorf("record interruption %s, %d tokens; want upstream_error_event, %d tokens",
						rec.Interruption, rec.TokenEvents, c.tokens)
				}
				rows, err := ledger.Query(context.Background(), spend.Filter{})
				if err != nil {
					t.Fatal(err)
				}
				if !c.billed {
					if rec.CostMicros != 0 || len(rows) != 0 {
						t.Errorf("an error-only stream was billed: record %d µ$ (usage %+v), ledger %+v",
							rec.CostMicros, rec.Usage, rows)
					}
					return
				}
				if rec.CostMicros <= 0 || len(rows) != 1 || rows[0].CostMicros != rec.CostMicros || rows[0].Output != 1 {
					t.Errorf("a stream with a token was not billed as such: record %d µ$, ledger %+v", rec.CostMicros, rows)
				}
			})
		}
	}
}

// admittedLedger records the admission time of each Add.
type admittedLedger struct {
	spend.Ledger
	admitted []time.Time
}

func (l *admittedLedger) Add(k spend.Key, t spend.Totals, admitted time.Time) {
	l.admitted = append(l.admitted, admitted)
	l.Ledger.Add(k, t, admitted)
}

// TestBillCarriesTheAdmissionTime: the ledger is told when a billed request
// was admitted (its lease's time, what a restart charges the rate buckets
// at), or without a lease when it arrived.
func TestBillCarriesTheAdmissionTime(t *testing.T) {
	for _, limited := range []bool{false, true} {
		var keyLimits config.Limits
		if limited {
			rpm := int64(100)
			keyLimits.RPM = &rpm
		}
		admittedAt := time.Date(2026, 11, 30, 12, 0, 1, 0, time.UTC)
		lim := ratelimit.NewLocal(ratelimit.LocalOptions{Now: func() time.Time { return admittedAt }})
		defer lim.Close()
		ledger := &admittedLedger{Ledger: newLocalLedger(t)}
		g := governedGateway(t, keyLimits, config.Limits{}, lim, ledger)
		arrived := admittedAt.Add(-time.Second)
		governOnce(t, g, &discardWriter{h: http.Header{}}, alphaChat(), arrived, llm.Usage{Input: 10, Output: 5, HasInput: true, HasOutput: true})
		want := arrived
		if limited {
			want = admittedAt
		}
		if len(ledger.admitted) != 1 || !ledger.admitted[0].Equal(want) {
			t.Errorf("limited %v: the ledger was told %v, want %v", limited, ledger.admitted, want)
		}
	}
}
