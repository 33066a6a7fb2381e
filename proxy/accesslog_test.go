package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/internal/jsonlog"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
)

// The attempts take jsonlog's fast path only as an Appender.
var _ jsonlog.Appender = attemptsJSON{}

// attemptEntry is one element of the access log's "attempts" array, as a
// reader of the log decodes it.
type attemptEntry struct {
	Upstream      string  `json:"upstream"`
	Status        int     `json:"status"`
	Result        string  `json:"result"`
	Ms            float64 `json:"ms"`
	BreakerBypass bool    `json:"breaker_bypass,omitempty"`
}

// streamedRecord is a record as a retried stream leaves it: every figure
// set, more attempts than the record keeps, one sent past an open breaker,
// and an upstream name that JSON must escape.
func streamedRecord() *llm.Record {
	t0 := time.Date(2026, 12, 2, 11, 27, 41, 0, time.UTC)
	rec := &llm.Record{
		RequestID: "tg_7e85537e6979959087cab62e", KeyID: "e0af5a5e4f88", Team: "search", Route: llm.RouteChatCompletions,
		Model: "gpt-4o-mini", Upstream: "primary", Stream: true, Status: 200, UpstreamRequestID: "req_abc",
		Timing: llm.Timing{In: t0, UpSent: t0.Add(400 * time.Microsecond), UpFirstByte: t0.Add(200 * time.Millisecond),
			FirstToken: t0.Add(201 * time.Millisecond), FirstTokenOut: t0.Add(201*time.Millisecond + 30*time.Microsecond),
			HeadersOut: t0.Add(201*time.Millisecond + 20*time.Microsecond),
			LastToken:  t0.Add(2181 * time.Millisecond), End: t0.Add(2188 * time.Millisecond)},
		Usage:      llm.Usage{Input: 42, Output: 100, HasInput: true, HasOutput: true},
		CostMicros: 66, TokenEvents: 100, ITLCount: 99, ITLSum: 1980 * time.Millisecond, ITLMax: 22 * time.Millisecond,
		InputBucket: "0-500", TerminalSeen: true, BytesOut: 18234, RetryWait: 5 * time.Millisecond,
	}
	for i := range llm.MaxRecordedAttempts + 2 {
		rec.AddAttempt(llm.Attempt{Upstream: `a "quoted"` + "\n" + `name`, Status: 503, Result: "server_error",
			Duration: time.Duration(i+1) * 1234567, BreakerBypass: i == 1})
	}
	rec.AddAttempt(llm.Attempt{Upstream: "primary", Status: 200, Result: "ok", Duration: 2188 * time.Millisecond})
	return rec
}

// writeAccessLine writes rec's access-log line through h and returns it with
// its time cut off (two handlers never stamp the same instant): from
// "level" on.
func writeAccessLine(t *testing.T, h func(io.Writer) slog.Handler, rec *llm.Record) string {
	t.Helper()
	var b bytes.Buffer
	logRecord(slog.New(h(&b)), rec, false)
	line := b.String()
	if i := strings.Index(line, "level"); i >= 0 {
		return line[i:]
	}
	t.Fatalf("no level in %q", line)
	return ""
}

// TestAccessLineSameThroughEitherJSONHandler: the gateway's access-log
// line, attempts included, is byte for byte what slog's JSON handler
// writes; its attempts array is what encoding/json wrote for a list of the
// record's attempts, in order, the ones past what the record keeps left
// out.
func TestAccessLineSameThroughEitherJSONHandler(t *testing.T) {
	rec := streamedRecord()
	want := writeAccessLine(t, func(w io.Writer) slog.Handler { return slog.NewJSONHandler(w, nil) }, rec)
	got := writeAccessLine(t, func(w io.Writer) slog.Handler { return jsonlog.NewHandler(w, nil) }, rec)
	if got != want {
		t.Fatalf("\nslog    %s\njsonlog %s", want, got)
	}
	var line struct {
		Count    int            `json:"attempt_count"`
		Attempts []attemptEntry `json:"attempts"`
	}
	if err := json.Unmarshal([]byte(`{"`+got), &line); err != nil {
		t.Fatalf("%v in %s", err, got)
	}
	if line.Count != llm.MaxRecordedAttempts+3 || len(line.Attempts) != llm.MaxRecordedAttempts {
		t.Fatalf("attempt_count %d with %d attempts, want %d with %d", line.Count, len(line.Attempts),
			llm.MaxRecordedAttempts+3, llm.MaxRecordedAttempts)
	}
	// The array is what encoding/json wrote for the list the line had
	// before the attempts wrote their own JSON.
	var list []attemptEntry
	for _, a := range rec.Attempts {
		list = append(list, attemptEntry{Upstream: a.Upstream, Status: a.Status, Result: a.Result, Ms: ms(a.Duration),
			BreakerBypass: a.BreakerBypass})
	}
	var encoded bytes.Buffer
	enc := json.NewEncoder(&encoded)
	enc.SetEscapeHTML(false) // as slog's JSON handler encodes
	if err := enc.Encode(list); err != nil {
		t.Fatal(err)
	}
	if array := `"attempts":` + strings.TrimSuffix(encoded.String(), "\n"); !strings.Contains(got, array) {
		t.Errorf("attempts are not encoding/json's %s in\n%s", array, got)
	}
	for i, a := range line.Attempts {
		w := rec.Attempts[i]
		if a.Upstream != w.Upstream || a.Status != w.Status || a.Result != w.Result || a.Ms != ms(w.Duration) ||
			a.BreakerBypass != w.BreakerBypass {
			t.Errorf("attempt %d: %+v, want %+v", i, a, w)
		}
	}
	if last := line.Attempts[len(line.Attempts)-1]; last.Result != "ok" {
		t.Errorf("last attempt kept is %+v, want the final ok", last)
	}
}

// TestTextAccessLineListsAttempts: with [log] format = "text" the attempts
// are written as their JSON array, not as a Go value.
func TestTextAccessLineListsAttempts(t *testing.T) {
	rec := streamedRecord()
	line := writeAccessLine(t, func(w io.Writer) slog.Handler { return slog.NewTextHandler(w, nil) }, rec)
	if !strings.Contains(line, `attempts="[{\"upstream\":`) || !strings.Contains(line, `\"result\":\"ok\",\"ms\":2188}]"`) {
		t.Errorf("text line's attempts are not the JSON array: %s", line)
	}
	if strings.Contains(line, "rec:0x") || strings.Contains(line, "Upstream:") {
		t.Errorf("text line prints a Go value: %s", line)
	}
}

// BenchmarkAccessLogLine: one streamed request's access-log line as the
// gateway writes it (jsonlog, attempts and all), to a discarding writer.
func BenchmarkAccessLogLine(b *testing.B) {
	rec := streamedRecord()
	l := slog.New(jsonlog.NewHandler(io.Discard, nil))
	b.ReportAllocs()
	for b.Loop() {
		logRecord(l, rec, false)
	}
}

// TestRejectedRequestLogNamesItsReason: a request the gateway refuses
// leaves an access-log line that says why (the rejection /stats and the
// span name), not only "outcome": "rejected": a path that is not
// canonical (400) and a model the caller's team may not use (403), sent
// through a running gateway. The line never shows the caller's key.
func TestRejectedRequestLogNamesItsReason(t *testing.T) {
	t.Run("non_canonical_path", func(t *testing.T) {
		tg := newTestGateway(t, "http://127.0.0.1:1", nil)
		req, err := http.NewRequest(http.MethodGet, tg.URL+"/v1/models%2F..%2Ffiles", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer sk-caller-secret")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		rec := tg.record(t)
		if resp.StatusCode != http.StatusBadRequest || rec.Rejection != llm.RejectNonCanonicalPath {
			t.Fatalf("status %d, rejection %q; want 400 non_canonical_path", resp.StatusCode, rec.Rejection)
		}
		wantRejectionLogged(t, tg, rec, "non_canonical_path", "sk-caller-secret")
	})
	t.Run("model_not_allowed", func(t *testing.T) {
		w := newGovWorld(t, mockllm.Options{OutputTokens: 3}, false, func(c *config.Config) {
			c.Teams[0].Models = []string{"claude-test*"}
		})
		resp, _ := post(t, w.tg.URL+"/v1/chat/completions", `{"model":"gpt-test","messages":[{"role":"user","content":"hi"}]}`,
			map[string]string{"Authorization": "Bearer " + keyAlpha})
		rec := w.tg.record(t)
		if resp.StatusCode != http.StatusForbidden || rec.Rejection != llm.RejectModelNotAllowed {
			t.Fatalf("status %d, rejection %q; want 403 model_not_allowed", resp.StatusCode, rec.Rejection)
		}
		wantRejectionLogged(t, w.tg, rec, "model_not_allowed", keyAlpha)
	})
}

// wantRejectionLogged checks rec's access-log line says it was rejected
// for reason and does not hold key.
func wantRejectionLogged(t *testing.T, tg *testGateway, rec llm.Record, reason, key string) {
	t.Helper()
	line := accessLogLine(t, tg, rec.RequestID)
	if got, want := string(line["outcome"]), `"rejected"`; got != want {
		t.Errorf("outcome %s, want %s", got, want)
	}
	if got, want := string(line["rejection"]), strconv.Quote(reason); got != want {
		t.Errorf("access log rejection %s, want %s in\n%s", got, want, tg.logs.String())
	}
	if strings.Contains(tg.logs.String(), key) {
		t.Errorf("the access log shows the caller's key:\n%s", tg.logs.String())
	}
}
