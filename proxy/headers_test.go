package proxy

import (
	"net/http"
	"testing"
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
