package proxy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"

	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
)

// TestRecordAttemptsKeepTheLast: past MaxRecordedAttempts the record keeps the
// first attempts and the last one, which ended the request.
func TestRecordAttemptsKeepTheLast(t *testing.T) {
	var rec llm.Record
	for i := range llm.MaxRecordedAttempts + 3 {
		rec.AddAttempt(llm.Attempt{Upstream: "u" + strconv.Itoa(i)})
	}
	last := llm.MaxRecordedAttempts - 1
	if rec.AttemptCount != llm.MaxRecordedAttempts+3 || rec.Attempts[0].Upstream != "u0" ||
		rec.Attempts[last-1].Upstream != "u"+strconv.Itoa(last-1) ||
		rec.Attempts[last].Upstream != "u"+strconv.Itoa(llm.MaxRecordedAttempts+2) {
		t.Fatalf("count %d, attempts %+v", rec.AttemptCount, rec.Attempts)
	}
}

// TestUnknownRouteLeavesAccessLogLine: every request leaves one access-log
// line, a 404 on an unknown route too.
func TestUnknownRouteLeavesAccessLogLine(t *testing.T) {
	tg := newTestGateway(t, "http://127.0.0.1:1", nil)
	resp, _ := post(t, tg.URL+"/v2/nope", `{}`, nil)
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if !bytes.Contains(tg.logs.Bytes(), []byte(`"status":404`)) {
		t.Errorf("no access-log line for an unknown route; log: %q", tg.logs.String())
	}
	if rec := tg.record(t); rec.Status != http.StatusNotFound || rec.Outcome != llm.OutcomeBadRequest {
		t.Errorf("record status %d outcome %s, want the 404 as a bad request", rec.Status, rec.Outcome)
	}
}

// accessLogLine finds the access-log line of a request.
func accessLogLine(t *testing.T, tg *testGateway, requestID string) map[string]json.RawMessage {
	t.Helper()
	sc := bufio.NewScanner(bytes.NewReader(tg.logs.Bytes()))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var m map[string]json.RawMessage
		if json.Unmarshal(sc.Bytes(), &m) != nil {
			continue
		}
		if string(m["request_id"]) == strconv.Quote(requestID) {
			return m
		}
	}
	t.Fatalf("no access-log line for request %s in %q", requestID, tg.logs.String())
	return nil
}

// TestAccessLogAttempts: a retried request's access-log line carries
// attempt_count and one entry per attempt with its upstream, status and
// result, and the retry wait.
func TestAccessLogAttempts(t *testing.T) {
	mock, url := mockUpstream(t, mockllm.Options{OutputTokens: 2})
	tg := newTestGateway(t, url, nil)
	if err := mock.Inject("status=503;retry-after-ms=5", 1); err != nil {
		t.Fatal(err)
	}
	resp, body := post(t, tg.URL+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	rec := tg.record(t) // the access log is written before the record is handed over
	line := accessLogLine(t, tg, rec.RequestID)
	var count int
	var attempts []attemptEntry
	var wait float64
	if err := json.Unmarshal(line["attempt_count"], &count); err != nil || count != 2 {
		t.Errorf("attempt_count %s (%v), want 2", line["attempt_count"], err)
	}
	if err := json.Unmarshal(line["attempts"], &attempts); err != nil {
		t.Fatalf("attempts %s: %v", line["attempts"], err)
	}
	want := []attemptEntry{{Upstream: "mock", Status: 503, Result: "server_error"}, {Upstream: "mock", Status: 200, Result: "ok"}}
	if len(attempts) != len(want) {
		t.Fatalf("attempts %+v, want %+v", attempts, want)
	}
	for i := range want {
		a := attempts[i]
		if a.Upstream != want[i].Upstream || a.Status != want[i].Status || a.Result != want[i].Result || a.Ms < 0 {
			t.Errorf("attempt %d: %+v, want %+v with ms >= 0", i, a, want[i])
		}
	}
	if err := json.Unmarshal(line["retry_wait_ms"], &wait); err != nil || wait != 5 {
		t.Errorf("retry_wait_ms %s (%v), want 5 (the upstream's retry-after-ms)", line["retry_wait_ms"], err)
	}
}
