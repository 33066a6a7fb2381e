package proxy

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
)

func TestHopHeaders(t *testing.T) {
	in := http.Header{
		"Connection":        {"keep-alive, X-Secret-Hop"},
		"X-Secret-Hop":      {"1"},
		"Keep-Alive":        {"timeout=5"},
		"Te":                {"trailers"},
		"Transfer-Encoding": {"chunked"},
		"Upgrade":           {"h2c"},
		"Forwarded":         {"for=1.2.3.4"},
		"X-Forwarded-For":   {"1.2.3.4"},
		"Accept-Encoding":   {"gzip"},
		"Authorization":     {"Bearer sk-test"},
		"Anthropic-Beta":    {"a,b"},
		// Asking the upstream to route by another path or method.
		"X-Original-Url":         {"/v1/responses/resp_other"},
		"X-Rewrite-Url":          {"/admin"},
		"X-Http-Method-Override": {"DELETE"},
		"X-Http-Method":          {"DELETE"},
		"X-Method-Override":      {"DELETE"},
	}
	out := upstreamRequestHeaders(in)
	for _, k := range []string{"Connection", "X-Secret-Hop", "Keep-Alive", "Te", "Transfer-Encoding", "Upgrade",
		"Forwarded", "X-Forwarded-For", "Accept-Encoding", "X-Original-Url", "X-Rewrite-Url",
		"X-Http-Method-Override", "X-Http-Method", "X-Method-Override"} {
		if _, ok := out[k]; ok {
			t.Errorf("%s forwarded upstream", k)
		}
	}
	if out.Get("Authorization") != "Bearer sk-test" || out.Get("Anthropic-Beta") != "a,b" {
		t.Errorf("end-to-end headers changed: %v", out)
	}
	if v, ok := out["User-Agent"]; !ok || len(v) != 1 || v[0] != "" {
		t.Errorf("missing User-Agent should stay empty, got %q", v)
	}
	if in.Get("Connection") == "" {
		t.Error("the caller's header map was modified")
	}

	dst := http.Header{}
	copyResponseHeaders(dst, http.Header{
		"Connection": {"X-Hop"}, "X-Hop": {"1"}, "Content-Length": {"10"}, "Keep-Alive": {"x"},
		"Content-Type": {"text/event-stream"}, "X-Request-Id": {"req_1"},
	})
	for _, k := range []string{"Connection", "X-Hop", "Content-Length", "Keep-Alive"} {
		if _, ok := dst[k]; ok {
			t.Errorf("%s copied to the client", k)
		}
	}
	if dst.Get("Content-Type") != "text/event-stream" || dst.Get("X-Request-Id") != "req_1" {
		t.Errorf("end-to-end response headers lost: %v", dst)
	}
}

func TestOversizedHeadersGet431InDialect(t *testing.T) {
	up := newFixedUpstream(http.StatusOK, `{}`, `{}`)
	srv := httptest.NewServer(up)
	defer srv.Close()
	const limit = 16 << 10
	tg := newTestGateway(t, srv.URL, func(c *config.Config) { c.Server.MaxHeaderBytes = limit })
	big := strings.Repeat("x", limit)
	var many strings.Builder // many small lines count as much as one large one
	for i := 0; many.Len() <= limit; i++ {
		many.WriteString("X-Small-" + strconv.Itoa(i) + ": " + strings.Repeat("y", 100) + "\r\n")
	}
	for _, c := range []struct {
		path, hdr string
		anthropic bool
	}{
		{"/v1/chat/completions", "X-Big: " + big, false},
		{"/v1/messages", "X-Big: " + big, true},
		{"/v1/embeddings", strings.TrimSuffix(many.String(), "\r\n"), false},
	} {
		body := `{"model":"m","messages":[]}`
		resp, got := rawRequest(t, strings.TrimPrefix(tg.URL, "http://"), "POST "+c.path+" HTTP/1.1\r\nHost: gw\r\n"+
			c.hdr+"\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\nConnection: close\r\n\r\n"+body)
		code, typ := errorCode(got)
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge ||
			c.anthropic && typ != "invalid_request_error" || !c.anthropic && code != "headers_too_large" {
			t.Errorf("POST %s with %d header bytes: %d %s, want 431 in its dialect", c.path, len(c.hdr), resp.StatusCode, got)
		}
		if rec := tg.record(t); rec.Rejection != llm.RejectHeadersTooLarge || rec.Outcome != llm.OutcomeRejected {
			t.Errorf("POST %s: record outcome %s rejection %s", c.path, rec.Outcome, rec.Rejection)
		}
	}
	if n := up.requests(); n != 0 {
		t.Errorf("the upstream got %d requests, want none", n)
	}
	// Just under the limit passes.
	hdr := "X-Fine: " + strings.Repeat("z", limit/2)
	resp, got := rawRequest(t, strings.TrimPrefix(tg.URL, "http://"), "GET /v1/models HTTP/1.1\r\nHost: gw\r\n"+hdr+
		"\r\nConnection: close\r\n\r\n")
	if resp.StatusCode != http.StatusOK || up.requests() != 1 {
		t.Errorf("headers under the limit: %d %s", resp.StatusCode, got)
	}
	tg.record(t)
}
