package proxy

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
)

// TestIncludeUsageOff: with include_usage = false on the upstream, the
// request body goes up unchanged, nothing is withheld, and tokens are
// estimated from events.
func TestIncludeUsageOff(t *testing.T) {
	up := &rawUpstream{pieces: split(openAIRole+openAITok1+openAITok2+openAIStop+openAIDone, 50)}
	srv := httptest.NewServer(up)
	defer srv.Close()
	tg := newTestGateway(t, srv.URL, func(c *config.Config) { c.Upstreams[0].IncludeUsage = false })
	body := `{"model":"m","stream":true,"messages":[]}`
	_, got := post(t, tg.URL+"/v1/chat/completions", body, nil)
	if want := openAIRole + openAITok1 + openAITok2 + openAIStop + openAIDone; string(got) != want {
		t.Fatalf("client got %q", got)
	}
	if sent, _ := up.request(); string(sent) != body {
		t.Errorf("body changed with include_usage=false: %s", sent)
	}
	if rec := tg.record(t); !rec.Estimated || rec.Usage.Output != 2 {
		t.Errorf("record usage %+v estimated %v", rec.Usage, rec.Estimated)
	}
}

// TestUnknownRouteLeavesAccessLogLine: the issue asks for one access-log
// line per request; a 404 on an unknown route must leave one too.
func TestUnknownRouteLeavesAccessLogLine(t *testing.T) {
	tg := newTestGateway(t, "http://127.0.0.1:1", nil)
	resp, _ := post(t, tg.URL+"/v2/nope", `{}`, nil)
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if !bytes.Contains(tg.logs.Bytes(), []byte(`"status":404`)) {
		t.Errorf("no access-log line for an unknown route; log: %q", tg.logs.String())
	}
}

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
	if rec.Outcome == llm.OutcomeOK && rec.Goodput != llm.SLOMet {
		t.Errorf("ok answer classified goodput=%s (stream=%v, ttft=%v)", rec.Goodput, rec.Stream, rec.TTFT())
	}
}
