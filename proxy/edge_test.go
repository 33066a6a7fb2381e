package proxy

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
)

// rawRequest writes request (a whole HTTP/1.1 request) to addr as it is,
// so no client library cleans its path, and reads the answer.
func rawRequest(t *testing.T, addr, request string) (*http.Response, []byte) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, request); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

// errorCode reads the code of an OpenAI error body ("" if none), or the
// type of an Anthropic one.
func errorCode(body []byte) (openAICode, anthropicType string) {
	var e struct {
		Type  string `json:"type"`
		Error struct {
			Code *string `json:"code"`
			Type string  `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil {
		return "", ""
	}
	if e.Type == "error" {
		return "", e.Error.Type
	}
	if e.Error.Code != nil {
		return *e.Error.Code, ""
	}
	return "", ""
}

func TestNonCanonicalPathsNeverReachTheUpstream(t *testing.T) {
	up := newFixedUpstream(http.StatusOK, `{"object":"list","data":[]}`, `{}`)
	srv := httptest.NewServer(up)
	defer srv.Close()
	tg := newTestGateway(t, srv.URL, nil)
	addr := strings.TrimPrefix(tg.URL, "http://")
	for _, path := range []string{
		"/v1/../metrics",
		"/v1/chat/completions/../../metrics",
		"/v1/%2e%2e/admin",
		"/v1/%2E%2E/admin",
		"/v1/models/..%2fadmin",
		"/v1/files%2F..%2Fadmin",
		"/v1/files%5cadmin",
		"/v1/models%2ex",
		"/v1//models",
		"/v1/./models",
		"/v1/models/",
		`/v1/models\..\admin`,
		"/v1/.",
		"/v1/respons%65s/resp_1",
		"/v1/models/..;/..;/admin",
		"/v1/models;x",
		"/v1/models/%252e%252e/admin",
		"/v1/models/a%00b",
		"/v1/models/%ff",
		"/v1/mod%7Eels",
	} {
		for _, anthropic := range []bool{false, true} {
			hdr := ""
			if anthropic {
				hdr = "anthropic-version: 2023-06-01\r\n"
			}
			resp, body := rawRequest(t, addr, "GET "+path+" HTTP/1.1\r\nHost: gw\r\n"+hdr+"Connection: close\r\n\r\n")
			code, typ := errorCode(body)
			switch {
			case resp.StatusCode != http.StatusBadRequest:
				t.Errorf("GET %s: %d %s, want 400", path, resp.StatusCode, body)
			case anthropic && typ != "invalid_request_error":
				t.Errorf("GET %s (Anthropic caller): %s, want an Anthropic invalid_request_error", path, body)
			case !anthropic && code != "invalid_path":
				t.Errorf("GET %s: %s, want an OpenAI error with code invalid_path", path, body)
			}
			if rec := tg.record(t); rec.Outcome != llm.OutcomeRejected || rec.Rejection != llm.RejectNonCanonicalPath {
				t.Errorf("GET %s: record outcome %s rejection %s", path, rec.Outcome, rec.Rejection)
			}
		}
	}
	if n := up.requests(); n != 0 {
		t.Errorf("the upstream got %d requests, want none", n)
	}
	// A canonical path still goes through.
	resp, body := rawRequest(t, addr, "GET /v1/models HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
	if resp.StatusCode != http.StatusOK || up.requests() != 1 {
		t.Errorf("GET /v1/models: %d %s, upstream %d requests", resp.StatusCode, body, up.requests())
	}
	tg.record(t)
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
