package main

import (
	"context"
	"encoding/json"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/stats"
)

// A coding agent's session through a running gateway, sent with the
// official Anthropic SDK and Claude Code's hint headers, and a plain
// conversation beside it: once both are idle, the metrics and /stats
// show one session of team red whose cost, calls, user turns,
// compactions and subagent share are what its records add up to, with
// its key among the costliest; every request is counted and priced by
// its class; and the plain conversation is a conversation, not a session.
// On one gateway, and on three replicas sharing Redis, each call sent to
// the next: the session is still one, observed by one replica.
func TestSessionReachesMetricsAndStats(t *testing.T) {
	t.Run("one gateway", func(t *testing.T) {
		mock := mockllm.New(mockllm.Options{OutputTokens: 4, RequireKey: upKey})
		up := httptest.NewServer(mock)
		t.Cleanup(up.Close)
		cfg := govConfig(up.URL)
		cfg.Spend.StateFile = ""
		cfg.Conversations.StateFile = ""
		sessionThrough(t, cfg, 1)
	})
	t.Run("three replicas on one Redis", func(t *testing.T) {
		_, cfg := redisGovConfig(t, mockllm.Options{OutputTokens: 4})
		sessionThrough(t, cfg, 3)
	})
}

func sessionThrough(t *testing.T, cfg config.Config, replicas int) {
	cfg.Conversations.Enabled = true
	cfg.Conversations.FlushIntervalSeconds = 0.05
	cfg.Conversations.IdleTimeoutSeconds = 0.5
	var reps []*replica
	for range replicas {
		reps = append(reps, startReplica(t, cfg))
	}
	sent := 0
	send := func(stream bool, headers ...string) {
		t.Helper()
		client := anthropic.NewClient(aoption.WithBaseURL(reps[sent%len(reps)].url), aoption.WithAPIKey(testKeyA),
			aoption.WithMaxRetries(0))
		sent++
		opts := []aoption.RequestOption{}
		for i := 0; i < len(headers); i += 2 {
			opts = append(opts, aoption.WithHeader(headers[i], headers[i+1]))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		params := anthropic.MessageNewParams{Model: "claude-test", MaxTokens: 32,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("List the files."))}}
		if !stream {
			if _, err := client.Messages.New(ctx, params, opts...); err != nil {
				t.Fatal(err)
			}
			return
		}
		st := client.Messages.NewStreaming(ctx, params, opts...)
		for st.Next() {
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
	}
	const sess = "x-claude-code-session-id"
	const id = "5d1e2a9c-claude-session"
	send(true, sess, id, "x-claude-code-request-class", "main", "x-claude-code-prompt-id", "p1")
	send(true, sess, id, "x-claude-code-agent-id", "agent-1", "x-claude-code-request-class", "subagent",
		"x-claude-code-agent-type", "Explore", "x-claude-code-prompt-id", "p1")
	send(true, sess, id, "x-claude-code-request-class", "main", "x-claude-code-prompt-id", "p1",
		"x-claude-code-prev-tool-durations", "Bash=742;Read=9")
	send(false, sess, id, "x-claude-code-request-class", "compaction", "x-claude-code-compaction", "auto",
		"x-claude-code-prompt-id", "p2")
	send(true, sess, id, "x-claude-code-request-class", "main", "x-claude-code-context-compacted", "auto",
		"x-claude-code-prompt-id", "p2", "x-claude-code-prev-tool-durations", "Bash=100")
	send(false, sess, id, "x-claude-code-request-class", "auxiliary")
	send(false, "X-Conversation-Id", "plain-1")
	send(false, "X-Conversation-Id", "plain-1")

	deadline := time.Now().Add(20 * time.Second)
	for endedCount(t, reps) < 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	// Longer than several intervals and another idle timeout: a second
	// observation would have come by now.
	time.Sleep(time.Second)
	if n := endedCount(t, reps); n != 2 {
		t.Fatalf("%v conversations ended, want the session and the plain one, once each", n)
	}

	// What the records add up to.
	var recs []llm.Record
	for _, r := range reps {
		recs = append(recs, r.records()...)
	}
	var sessKey, keyID string
	var sessCost, subCost int64
	var sessCalls int
	byClass := map[string]int{}
	costByClass := map[string]int64{}
	for _, rec := range recs {
		class := rec.RequestClass
		if class == "" {
			class = "none"
		}
		byClass[class]++
		costByClass[class] += rec.CostMicros
		if rec.RequestClass == "" {
			continue
		}
		if sessKey != "" && rec.Conversation != sessKey {
			t.Fatalf("the session's calls are in conversations %s and %s", sessKey, rec.Conversation)
		}
		sessKey, keyID = rec.Conversation, rec.KeyID
		sessCalls++
		sessCost += rec.CostMicros
		if rec.RequestClass == "subagent" {
			subCost += rec.CostMicros
		}
	}
	if len(recs) != 8 || sessCalls != 6 || sessKey == "" || sessCost == 0 || subCost == 0 {
		t.Fatalf("%d records, %d of the session %q costing %d (subagent %d)", len(recs), sessCalls, sessKey, sessCost, subCost)
	}
	if want := map[string]int{"main": 3, "subagent": 1, "compaction": 1, "auxiliary": 1, "none": 2}; !maps.Equal(byClass, want) {
		t.Fatalf("records by class %v, want %v", byClass, want)
	}

	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }
	red := map[string]string{"team": "red"}
	for _, h := range []struct {
		name string
		sum  float64
	}{
		{"tollgate_session_cost_usd", float64(sessCost) / 1e6},
		{"tollgate_session_calls", 6},
		{"tollgate_session_user_turns", 2},
		{"tollgate_session_compactions", 1},
		{"tollgate_session_subagent_cost_share", float64(subCost) / float64(sessCost)},
	} {
		if n, sum := sumOver(t, reps, h.name, red); n != 1 || !near(sum, h.sum) {
			t.Errorf("%s{team=red}: %d sessions summing %v, want 1 of %v", h.name, n, sum, h.sum)
		}
	}
	var shares float64
	for _, part := range []string{"model", "tool", "other"} {
		n, sum := sumOver(t, reps, "tollgate_session_time_share", map[string]string{"team": "red", "part": part})
		if n != 1 || (part != "other" && sum <= 0) {
			t.Errorf("time share %s: %d sessions, %v", part, n, sum)
		}
		shares += sum
	}
	if !near(shares, 1) {
		t.Errorf("the session's time shares add up to %v", shares)
	}
	if n, _ := sumOver(t, reps, "tollgate_conversation_turns", red); n != 2 {
		t.Errorf("%d conversations observed, want 2: a session is a conversation too", n)
	}
	for class, n := range byClass {
		labels := map[string]string{"team": "red", "class": class}
		var v, cost float64
		var timed uint64
		for _, r := range reps {
			rv, _, _ := seriesSum(t, r, "tollgate_requests_by_class_total", labels)
			rc, _, _ := seriesSum(t, r, "tollgate_cost_by_class_usd_total", labels)
			_, rt, _ := seriesSum(t, r, "tollgate_request_duration_by_class_seconds", labels)
			v, cost, timed = v+rv, cost+rc, timed+rt
		}
		if v != float64(n) || timed != uint64(n) || !near(cost, float64(costByClass[class])/1e6) {
			t.Errorf("class %s: %v requests, %d timed, $%v; the records: %d, $%v", class, v, timed, cost, n, float64(costByClass[class])/1e6)
		}
	}

	// Each replica's /stats has what it observed: the session in one.
	var doc stats.Report
	var found int
	for _, r := range reps {
		resp, err := http.Get(r.url + "/stats?team=red")
		if err != nil {
			t.Fatal(err)
		}
		var d stats.Report
		err = json.NewDecoder(resp.Body).Decode(&d)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(d.Sessions) > 0 {
			doc = d
			found++
		}
	}
	if found != 1 || len(doc.Sessions) != 1 || doc.Sessions[0].Team != "red" {
		t.Fatalf("/stats: %d replicas with sessions; %+v", found, doc.Sessions)
	}
	f := doc.Sessions[0].LastHour
	if f.Ended != 1 || f.Sampled != 1 || !near(f.CostUSD.P50, float64(sessCost)/1e6) || f.Calls.P95 != 6 ||
		f.UserTurns.Mean != 2 || f.Compactions.P50 != 1 || !near(f.SubagentCostShare.Mean, float64(subCost)/float64(sessCost)) ||
		f.ToolShare.P50 <= 0 || f.DurationSeconds.P50 <= 0 {
		t.Errorf("/stats session figures %+v", f)
	}
	if len(f.Costliest) != 1 {
		t.Fatalf("/stats costliest %+v", f.Costliest)
	}
	if c := f.Costliest[0]; c.Key != sessKey || c.KeyID != keyID || keyID == "" || c.Team != "red" || c.Calls != 6 ||
		c.UserTurns != 2 || !near(c.CostUSD, float64(sessCost)/1e6) || !near(c.DurationSeconds, f.DurationSeconds.P50) {
		t.Errorf("costliest session %+v; its records: key %s, key id %s, $%v", c, sessKey, keyID, float64(sessCost)/1e6)
	}
}

// sumOver adds up the sample counts and sums of histogram name{labels}
// over the replicas.
func sumOver(t *testing.T, reps []*replica, name string, labels map[string]string) (count uint64, sum float64) {
	t.Helper()
	for _, r := range reps {
		_, c, s := seriesSum(t, r, name, labels)
		count, sum = count+c, sum+s
	}
	return count, sum
}
