package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/proxy"
)

// convTurn sends one turn of conversation id with key to r: an Anthropic
// Messages request (streamed every other turn) with the conversation
// header. It returns the status and the gateway's request id.
func convTurn(t *testing.T, r *replica, key, id string, n int) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, r.url+"/v1/messages", strings.NewReader(messagesBody(n, n%2 == 0)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Api-Key", key)
	req.Header.Set("Anthropic-Version", "2023-06-01")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Conversation-Id", id)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get("X-Tollgate-Request-Id")
}

// convSum is what a conversation's records add up to.
type convSum struct {
	turns, in, out, cost int64
}

// addRecords adds to sums[c] every record whose request was a turn of
// conversation c (turnOf: request id to conversation).
func addRecords(sums []convSum, recs []llm.Record, turnOf map[string]int) {
	for i := range recs {
		r := &recs[i]
		c, ok := turnOf[r.RequestID]
		if !ok {
			continue
		}
		sums[c].turns++
		sums[c].in += r.Usage.Input
		sums[c].out += r.Usage.Output
		sums[c].cost += r.CostMicros
	}
}

// adminConversation reads GET /admin/conversations/{id}?team=.
func adminConversation(t *testing.T, base, id, team string) (int, proxy.ConversationReport) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+"/admin/conversations/"+id+"?team="+team, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testAdmin)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rep proxy.ConversationReport
	if resp.StatusCode == http.StatusOK {
		if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
			t.Fatal(err)
		}
	}
	return resp.StatusCode, rep
}

// wantSum checks that base reports conversation id as the sum s.
func wantSum(t *testing.T, what, base, id, team string, s convSum) {
	t.Helper()
	status, rep := adminConversation(t, base, id, team)
	if status != 200 || rep.Turns != s.turns || rep.Tokens.Input != s.in || rep.Tokens.Output != s.out ||
		rep.CostMicros != s.cost || rep.Team != team || s.turns == 0 || s.cost == 0 {
		t.Errorf("%s: conversation %s = %d %+v; its records sum to %+v", what, id, status, rep, s)
	}
}

// Turns and cost per conversation equal the sum of its requests' records
// when its turns go to two replicas sharing one Redis, and after both are
// restarted; and without Redis across a restart of the one gateway (its
// state file).
func TestConversationFiguresSumTheirRecords(t *testing.T) {
	const convs, turns = 6, 4
	run := func(t *testing.T, cfg config.Config, replicas int) {
		cfg.Conversations.Enabled = true
		cfg.Conversations.FlushIntervalSeconds = 0.05
		sums := make([]convSum, convs)
		turnOf := map[string]int{}
		n := 0
		for round := range 2 {
			var reps []*replica
			for range replicas {
				reps = append(reps, startReplica(t, cfg))
			}
			for c := range convs {
				for k := range turns {
					r := reps[(c+k)%len(reps)]
					st, rid := convTurn(t, r, testKeyA, fmt.Sprintf("conv-%d", c), 900000+n)
					if st != 200 || rid == "" {
						t.Fatalf("round %d conversation %d turn %d: status %d, request id %q", round, c, k, st, rid)
					}
					turnOf[rid] = c
					n++
				}
			}
			// A request of team blue with the same id is blue's conversation.
			if st, _ := convTurn(t, reps[0], testKeyB, "conv-0", 990000+round); st != 200 {
				t.Fatalf("team blue: status %d", st)
			}
			for _, r := range reps {
				if err := r.stop(); err != nil {
					t.Fatal(err)
				}
				addRecords(sums, r.records(), turnOf)
			}
			// A gateway started afterwards reads them back (Redis, or the
			// state file the last one wrote).
			check := startReplica(t, cfg)
			for c := range convs {
				wantSum(t, fmt.Sprintf("after round %d", round), check.url, fmt.Sprintf("conv-%d", c), "red", sums[c])
			}
			if status, rep := adminConversation(t, check.url, "conv-0", "blue"); status != 200 || rep.Turns != int64(round+1) {
				t.Errorf("team blue's conv-0: %d %+v, want %d turns", status, rep, round+1)
			}
			if err := check.stop(); err != nil {
				t.Fatal(err)
			}
		}
		if sums[0].turns != 2*turns {
			t.Errorf("conversation 0 has %d turns in its records, want %d", sums[0].turns, 2*turns)
		}
	}
	t.Run("two replicas on one Redis", func(t *testing.T) {
		_, cfg := redisGovConfig(t, mockllm.Options{OutputTokens: 5})
		run(t, cfg, 2)
	})
	t.Run("one gateway and its state file", func(t *testing.T) {
		mock := mockllm.New(mockllm.Options{OutputTokens: 5, RequireKey: upKey})
		up := httptest.NewServer(mock)
		t.Cleanup(up.Close)
		cfg := govConfig(up.URL)
		dir := t.TempDir()
		cfg.Spend.StateFile = filepath.Join(dir, "spend.json")
		cfg.Conversations.StateFile = filepath.Join(dir, "conversations.json")
		run(t, cfg, 1)
	})
}

// seriesSum adds up, over r's series of the family name that carry labels,
// counter values, and histogram sample counts and sums.
func seriesSum(t *testing.T, r *replica, name string, labels map[string]string) (value float64, count uint64, sum float64) {
	t.Helper()
	mfs, err := r.rg.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for k, v := range labels {
				found := false
				for _, lp := range m.GetLabel() {
					found = found || lp.GetName() == k && lp.GetValue() == v
				}
				if !found {
					continue series
				}
			}
			value += m.GetCounter().GetValue()
			count += m.GetHistogram().GetSampleCount()
			sum += m.GetHistogram().GetSampleSum()
		}
	}
	return value, count, sum
}

// endedCount is the conversations the replicas observed ending idle.
func endedCount(t *testing.T, reps []*replica) float64 {
	t.Helper()
	var n float64
	for _, r := range reps {
		v, _, _ := seriesSum(t, r, "tollgate_conversations_ended_total", map[string]string{"reason": "idle"})
		n += v
	}
	return n
}

// Three replicas on one Redis serve the turns of many conversations; once
// they are idle, each conversation is observed ending exactly once across
// the three, and the histograms hold its turns and cost as its records do.
func TestConversationEndsOnceAcrossThreeReplicas(t *testing.T) {
	const convs, turns = 30, 2
	_, cfg := redisGovConfig(t, mockllm.Options{OutputTokens: 3})
	cfg.Conversations.Enabled = true
	cfg.Conversations.FlushIntervalSeconds = 0.05
	cfg.Conversations.IdleTimeoutSeconds = 0.5
	var reps []*replica
	for range 3 {
		reps = append(reps, startReplica(t, cfg))
	}
	n := 0
	for c := range convs {
		for k := range turns {
			if st, _ := convTurn(t, reps[(c+k)%3], testKeyA, fmt.Sprintf("idle-%d", c), 950000+n); st != 200 {
				t.Fatalf("conversation %d turn %d: status %d", c, k, st)
			}
			n++
		}
	}
	var cost int64
	for _, r := range reps {
		for _, rec := range r.records() {
			cost += rec.CostMicros
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for endedCount(t, reps) < convs && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	// Longer than several intervals and another idle timeout: a second
	// observation would have come by now.
	time.Sleep(time.Second)
	if got := endedCount(t, reps); got != convs {
		t.Fatalf("%v conversations observed ending, want %d exactly once each", got, convs)
	}
	var count uint64
	var turnSum, costSum float64
	for _, r := range reps {
		_, c, s := seriesSum(t, r, "tollgate_conversation_turns", map[string]string{"team": "red"})
		count, turnSum = count+c, turnSum+s
		_, _, s = seriesSum(t, r, "tollgate_conversation_cost_usd", map[string]string{"team": "red"})
		costSum += s
	}
	if count != convs || turnSum != convs*turns {
		t.Errorf("turns histogram: %d conversations, %v turns; want %d and %d", count, turnSum, convs, convs*turns)
	}
	if d := costSum - float64(cost)/1e6; d > 1e-9 || d < -1e-9 {
		t.Errorf("cost histogram sums to %v USD, the records to %v", costSum, float64(cost)/1e6)
	}
}

// An outcome posted to a running gateway reaches its metrics and /stats:
// completion rate, score and cost per completed task per team, as posted.
func TestOutcomeReachesMetricsAndStats(t *testing.T) {
	mock := mockllm.New(mockllm.Options{OutputTokens: 3, RequireKey: upKey})
	up := httptest.NewServer(mock)
	t.Cleanup(up.Close)
	cfg := govConfig(up.URL)
	cfg.Spend.StateFile = ""
	cfg.Conversations.Enabled, cfg.Conversations.StateFile = true, ""
	r := startReplica(t, cfg)
	posts := []struct {
		id        string
		completed bool
		score     string
	}{{"o-1", true, "0.9"}, {"o-2", false, "0.2"}, {"o-3", true, ""}}
	var completedCost int64
	for i, p := range posts {
		if st, _ := convTurn(t, r, testKeyA, p.id, 970000+i); st != 200 {
			t.Fatalf("turn: %d", st)
		}
		body := fmt.Sprintf(`{"completed":%t`, p.completed)
		if p.score != "" {
			body += `,"score":` + p.score
		}
		req, err := http.NewRequest(http.MethodPost, r.url+"/tollgate/conversations/"+p.id+"/outcome", strings.NewReader(body+"}"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Api-Key", testKeyA)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var rep proxy.ConversationReport
		err = json.NewDecoder(resp.Body).Decode(&rep)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || rep.Outcome == nil || rep.Outcome.Completed != p.completed {
			t.Fatalf("outcome %s: %d %+v %v", p.id, resp.StatusCode, rep, err)
		}
		if p.completed {
			completedCost += rep.CostMicros
		}
	}
	done, _, _ := seriesSum(t, r, "tollgate_conversation_outcomes_total", map[string]string{"team": "red", "completed": "true"})
	notDone, _, _ := seriesSum(t, r, "tollgate_conversation_outcomes_total", map[string]string{"team": "red", "completed": "false"})
	_, scored, scoreSum := seriesSum(t, r, "tollgate_conversation_score", map[string]string{"team": "red"})
	cost, _, _ := seriesSum(t, r, "tollgate_conversation_completed_cost_usd_total", map[string]string{"team": "red"})
	if done != 2 || notDone != 1 || scored != 2 || scoreSum < 1.0999 || scoreSum > 1.1001 ||
		cost < float64(completedCost)/1e6-1e-9 || cost > float64(completedCost)/1e6+1e-9 || completedCost == 0 {
		t.Errorf("metrics: completed %v, not %v, %d scored summing %v, completed cost %v (want %v)",
			done, notDone, scored, scoreSum, cost, float64(completedCost)/1e6)
	}
	resp, err := http.Get(r.url + "/stats?team=red")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc struct {
		Conversations []struct {
			Team     string `json:"team"`
			LastHour struct {
				Outcomes struct {
					Posted         int64   `json:"posted"`
					CompletionRate float64 `json:"completion_rate"`
					MeanScore      float64 `json:"mean_score"`
					CostPerDone    float64 `json:"cost_per_completed_usd"`
				} `json:"outcomes"`
			} `json:"last_hour"`
		} `json:"conversations"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Conversations) != 1 || doc.Conversations[0].Team != "red" {
		t.Fatalf("/stats conversations: %+v", doc.Conversations)
	}
	o := doc.Conversations[0].LastHour.Outcomes
	if o.Posted != 3 || o.CompletionRate < 0.6666 || o.CompletionRate > 0.6667 || o.MeanScore < 0.5499 || o.MeanScore > 0.5501 ||
		o.CostPerDone < float64(completedCost)/2e6-1e-9 || o.CostPerDone > float64(completedCost)/2e6+1e-9 {
		t.Errorf("/stats outcomes %+v; want 3 posted, rate 2/3, mean score 0.55, cost per completed %v", o, float64(completedCost)/2e6)
	}
}

// sessionCall sends one call of a Claude Code session to r: its session
// header, the hints hdr adds, a turn of n input tokens.
func sessionCall(t *testing.T, r *replica, session string, hdr map[string]string, n int) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, r.url+"/v1/messages", strings.NewReader(messagesBody(n, false)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Api-Key", testKeyA)
	req.Header.Set("Anthropic-Version", "2023-06-01")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Claude-Code-Session-Id", session)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode
}

// A coding agent's session whose calls go to three replicas on one Redis is
// one session: each replica's admin API gives all of it (its calls by
// class, the subagent, its tools, each user prompt counted once whichever
// replica served it), and once idle it ends once across the three, its
// turns and cost as its records say.
func TestAgentSessionAcrossThreeReplicasIsOneSession(t *testing.T) {
	_, cfg := redisGovConfig(t, mockllm.Options{OutputTokens: 3})
	cfg.Conversations.Enabled = true
	cfg.Conversations.FlushIntervalSeconds = 0.05
	cfg.Conversations.IdleTimeoutSeconds = 2
	var reps []*replica
	for range 3 {
		reps = append(reps, startReplica(t, cfg))
	}
	const session = "5f0c2a64-3d1e-4f8a-b6c1-0e9d7a2b4c11"
	calls := []map[string]string{
		{"X-Claude-Code-Request-Class": "main", "X-Claude-Code-Prompt-Id": "p1"},
		{"X-Claude-Code-Request-Class": "main", "X-Claude-Code-Prompt-Id": "p1", "X-Claude-Code-Prev-Tool-Durations": "Bash=100"},
		{"X-Claude-Code-Request-Class": "subagent", "X-Claude-Code-Agent-Id": "sub-1", "X-Claude-Code-Prompt-Id": "p1"},
		{"X-Claude-Code-Request-Class": "subagent", "X-Claude-Code-Agent-Id": "sub-1", "X-Claude-Code-Prompt-Id": "p1",
			"X-Claude-Code-Prev-Tool-Durations": "Read=7"},
		{"X-Claude-Code-Request-Class": "main", "X-Claude-Code-Prompt-Id": "p2", "X-Claude-Code-Prev-Tool-Durations": "Bash=20"},
		{"X-Claude-Code-Request-Class": "auxiliary"},
	}
	for i, h := range calls {
		if st := sessionCall(t, reps[i%3], session, h, 990000+i); st != 200 {
			t.Fatalf("call %d: status %d", i, st)
		}
	}
	var cost int64
	for _, r := range reps {
		for _, rec := range r.records() {
			cost += rec.CostMicros
			if rec.ConversationSource != "x-claude-code-session-id" {
				t.Errorf("record %s: conversation source %q", rec.RequestID, rec.ConversationSource)
			}
		}
	}
	// Each replica's view, once every replica has sent its turns: until
	// then a view adds its own unsent turns to Redis's, and their prompts
	// may count again.
	for i, r := range reps {
		var rep proxy.ConversationReport
		for n := 0; ; n++ {
			var status int
			status, rep = adminConversation(t, r.url, session, "red")
			if status == 200 && rep.Turns == int64(len(calls)) && rep.Session.UserTurns == 2 {
				break
			}
			if n == 200 {
				t.Fatalf("replica %d: the session has %d turns and %d user turns, want %d and 2",
					i, rep.Turns, rep.Session.UserTurns, len(calls))
			}
			time.Sleep(20 * time.Millisecond)
		}
		s := rep.Session
		if rep.CostMicros != cost || s.Classes["main"].Calls != 3 || s.Classes["subagent"].Calls != 2 ||
			s.Classes["auxiliary"].Calls != 1 || len(s.Agents) != 1 || s.Agents[0].Calls.Calls != 2 ||
			s.Tools["Bash"].Millis != 120 || s.Tools["Read"].Runs != 1 {
			t.Errorf("replica %d: session cost %d (records %d), %+v", i, rep.CostMicros, cost, s)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for endedCount(t, reps) < 1 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(time.Second) // a second end would have come by now
	if got := endedCount(t, reps); got != 1 {
		t.Fatalf("the session ended %v times across the replicas, want once", got)
	}
	var turns, costUSD float64
	for _, r := range reps {
		_, _, s := seriesSum(t, r, "tollgate_conversation_turns", map[string]string{"team": "red"})
		turns += s
		_, _, s = seriesSum(t, r, "tollgate_conversation_cost_usd", map[string]string{"team": "red"})
		costUSD += s
	}
	if turns != float64(len(calls)) || costUSD-float64(cost)/1e6 > 1e-9 || float64(cost)/1e6-costUSD > 1e-9 {
		t.Errorf("the ended session: %v turns, %v USD; its records %d turns, %v USD", turns, costUSD, len(calls), float64(cost)/1e6)
	}
}
