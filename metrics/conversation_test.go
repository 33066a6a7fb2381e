package metrics

import (
	"fmt"
	"maps"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/conversation"
)

// newConversationTest returns Metrics for teams "search" and "ads", with a
// constant label.
func newConversationTest(t *testing.T) (*Metrics, *prometheus.Registry) {
	t.Helper()
	return newTest(t, func(c *config.Config) {
		c.Metrics.Labels = map[string]string{"env": "test"}
		c.Teams = []config.Team{{Name: "search"}, {Name: "ads"}}
	})
}

// series returns the metric of family name whose labels are exactly
// labels (the constant env label aside), nil when there is none.
func series(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				if l.GetName() != "env" {
					got[l.GetName()] = l.GetValue()
				}
			}
			if maps.Equal(got, labels) {
				return m
			}
		}
	}
	return nil
}

// checkHistogram asserts that histogram name{labels} holds exactly vals:
// their count, their sum, and at every bound the number of them at or
// under it.
func checkHistogram(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string, vals ...float64) {
	t.Helper()
	m := series(t, reg, name, labels)
	if m == nil {
		if len(vals) > 0 {
			t.Errorf("%s%v: no series, want %d observations", name, labels, len(vals))
		}
		return
	}
	h := m.GetHistogram()
	var sum float64
	for _, v := range vals {
		sum += v
	}
	if h.GetSampleCount() != uint64(len(vals)) || math.Abs(h.GetSampleSum()-sum) > 1e-9*math.Max(1, sum) {
		t.Errorf("%s%v: count %d sum %v, want %d and %v", name, labels, h.GetSampleCount(), h.GetSampleSum(), len(vals), sum)
	}
	if len(h.GetBucket()) == 0 {
		t.Errorf("%s%v: no explicit bucket", name, labels)
	}
	for _, b := range h.GetBucket() {
		var want uint64
		for _, v := range vals {
			if v <= b.GetUpperBound() {
				want++
			}
		}
		if b.GetCumulativeCount() != want {
			t.Errorf("%s%v: bucket le=%v holds %d, want %d", name, labels, b.GetUpperBound(), b.GetCumulativeCount(), want)
		}
	}
}

func counterValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	m := series(t, reg, name, labels)
	if m == nil {
		t.Errorf("%s%v: no series", name, labels)
		return math.NaN()
	}
	return m.GetCounter().GetValue()
}

// conv builds an ended conversation of team.
func conv(team string, turns, errors, costMicros int64, tokens conversation.Tokens, span time.Duration) conversation.Conversation {
	first := time.Unix(1_700_000_000, 0)
	return conversation.Conversation{Key: conversation.Key("team:"+team, "c"), Team: team, Turns: turns, Errors: errors,
		Tokens: tokens, CostMicros: costMicros, First: first, Last: first.Add(span)}
}

// TestConversationSeriesArePreCreated: a configured team's conversation
// counters exist at 0 before any conversation ends, so that the first
// one shows in increase(); no histogram exists yet, and no series of a
// team that is not configured.
func TestConversationSeriesArePreCreated(t *testing.T) {
	_, reg := newConversationTest(t)
	want := `
# HELP tollgate_conversation_completed_cost_usd_total Spend in US dollars of the conversations reported completed, up to the report; divided by tollgate_conversation_outcomes_total{completed="true"} it is the cost per completed task.
# TYPE tollgate_conversation_completed_cost_usd_total counter
tollgate_conversation_completed_cost_usd_total{env="test",team="ads"} 0
tollgate_conversation_completed_cost_usd_total{env="test",team="search"} 0
# HELP tollgate_conversation_outcomes_total Outcomes applications reported for conversations (POST /tollgate/conversations/{id}/outcome), by completed (whether the conversation's task was done).
# TYPE tollgate_conversation_outcomes_total counter
tollgate_conversation_outcomes_total{completed="false",env="test",team="ads"} 0
tollgate_conversation_outcomes_total{completed="false",env="test",team="search"} 0
tollgate_conversation_outcomes_total{completed="true",env="test",team="ads"} 0
tollgate_conversation_outcomes_total{completed="true",env="test",team="search"} 0
# HELP tollgate_conversations_ended_total Conversations ended, by reason (idle: no turn for the idle timeout; evicted: pushed out by [conversations] max_active, its figures partial and so not in the tollgate_conversation_* histograms) and errored (true when any turn failed).
# TYPE tollgate_conversations_ended_total counter
tollgate_conversations_ended_total{env="test",errored="false",reason="idle",team="ads"} 0
tollgate_conversations_ended_total{env="test",errored="false",reason="idle",team="search"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "tollgate_conversation_completed_cost_usd_total",
		"tollgate_conversation_outcomes_total", "tollgate_conversations_ended_total", "tollgate_conversation_turns",
		"tollgate_conversation_cost_usd", "tollgate_conversation_tokens", "tollgate_conversation_duration_seconds",
		"tollgate_conversation_score"); err != nil {
		t.Error(err)
	}
}

// TestConversationEnded: an idle conversation is counted and its turns,
// cost, tokens by type and duration observed under its team; an evicted
// one is counted only; errored says whether any turn failed; a
// conversation without a team is team "none".
func TestConversationEnded(t *testing.T) {
	m, reg := newConversationTest(t)
	ended := []struct {
		c   conversation.Conversation
		why conversation.Reason
	}{
		{conv("search", 7, 0, 123_456, conversation.Tokens{Input: 42_000, Output: 3_100, CacheRead: 30_000, CacheWrite: 2_000, Reasoning: 900}, 95*time.Second), conversation.EndIdle},
		{conv("search", 1, 1, 800, conversation.Tokens{Input: 300, Output: 20}, 0), conversation.EndIdle},
		{conv("search", 180, 3, 31_250_000, conversation.Tokens{Input: 9_000_000, Output: 120_000, CacheRead: 8_000_000}, 3*time.Hour), conversation.EndIdle},
		{conv("search", 12, 0, 50_000, conversation.Tokens{Input: 5_000, Output: 400}, time.Minute), conversation.EndEvicted},
		{conv("search", 4, 2, 9_000, conversation.Tokens{Input: 1_000, Output: 40}, time.Second), conversation.EndEvicted},
		{conv("", 3, 0, 2_500, conversation.Tokens{Input: 1_200, Output: 90}, 20*time.Second), conversation.EndIdle},
		{conv("ads", 250, 0, 60_000_000, conversation.Tokens{Input: 60_000_000, Output: 1}, 5*time.Minute), conversation.EndIdle},
	}
	for _, e := range ended {
		m.ConversationEnded(e.c, e.why)
	}

	// What the test expects, worked out from the conversations above.
	type key struct{ team, reason, errored string }
	counts := map[key]float64{{"search", "idle", "false"}: 0, {"ads", "idle", "false"}: 0}
	turns, cost, dur := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
	tokens := map[[2]string][]float64{}
	for _, e := range ended {
		team := e.c.Team
		if team == "" {
			team = "none"
		}
		counts[key{team, e.why.String(), fmt.Sprint(e.c.Errors > 0)}]++
		if e.why != conversation.EndIdle {
			continue
		}
		turns[team] = append(turns[team], float64(e.c.Turns))
		cost[team] = append(cost[team], float64(e.c.CostMicros)/1e6)
		dur[team] = append(dur[team], e.c.Last.Sub(e.c.First).Seconds())
		tk := e.c.Tokens
		for typ, n := range map[string]int64{"input": tk.Input, "output": tk.Output, "cache_read": tk.CacheRead,
			"cache_write": tk.CacheWrite, "reasoning": tk.Reasoning} {
			tokens[[2]string{team, typ}] = append(tokens[[2]string{team, typ}], float64(n))
		}
	}

	got := 0
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "tollgate_conversations_ended_total" {
			got = len(mf.GetMetric())
		}
	}
	if got != len(counts) {
		t.Errorf("%d ended series, want %d", got, len(counts))
	}
	for k, want := range counts {
		labels := map[string]string{"team": k.team, "reason": k.reason, "errored": k.errored}
		if v := counterValue(t, reg, "tollgate_conversations_ended_total", labels); v != want {
			t.Errorf("ended%v = %v, want %v", labels, v, want)
		}
	}
	for _, team := range []string{"search", "ads", "none"} {
		lt := map[string]string{"team": team}
		checkHistogram(t, reg, "tollgate_conversation_turns", lt, turns[team]...)
		checkHistogram(t, reg, "tollgate_conversation_cost_usd", lt, cost[team]...)
		checkHistogram(t, reg, "tollgate_conversation_duration_seconds", lt, dur[team]...)
		for _, typ := range []string{"input", "output", "cache_read", "cache_write", "reasoning"} {
			checkHistogram(t, reg, "tollgate_conversation_tokens", map[string]string{"team": team, "type": typ}, tokens[[2]string{team, typ}]...)
		}
	}
	// The evicted conversations of search made no observation: 3 idle ones.
	if n := series(t, reg, "tollgate_conversation_turns", map[string]string{"team": "search"}).GetHistogram().GetSampleCount(); n != 3 {
		t.Errorf("search's turns histogram counts %d conversations, want its 3 idle ones", n)
	}
}

// TestConversationOutcome: outcomes are counted by completed, scores in
// [0, 1] observed (others, and none, not), and the cost of completed
// conversations summed, so that the cost per completed task is the sum
// over the completed count.
func TestConversationOutcome(t *testing.T) {
	m, reg := newConversationTest(t)
	score := func(v float64) *float64 { return &v }
	outcomes := []struct {
		team string
		o    conversation.Outcome
		cost int64
	}{
		{"search", conversation.Outcome{Completed: true, Score: score(0.8), Feedback: "great, thanks"}, 120_000},
		{"search", conversation.Outcome{Completed: true, Score: score(1)}, 30_000},
		{"search", conversation.Outcome{Completed: true}, 7_500},
		{"search", conversation.Outcome{Completed: false, Score: score(0)}, 900_000},
		{"search", conversation.Outcome{Completed: false, Score: score(0.35)}, 1},
		{"search", conversation.Outcome{Completed: true, Score: score(math.NaN())}, 10},
		{"search", conversation.Outcome{Completed: false, Score: score(1.5)}, 10},
		{"", conversation.Outcome{Completed: true, Score: score(0.5)}, 2_000_000},
	}
	for _, o := range outcomes {
		m.ConversationOutcome(o.team, o.o, o.cost)
	}
	type key struct{ team, completed string }
	counts := map[key]float64{}
	scores, completedCost := map[string][]float64{}, map[string]float64{}
	for _, o := range outcomes {
		team := o.team
		if team == "" {
			team = "none"
		}
		counts[key{team, fmt.Sprint(o.o.Completed)}]++
		if s := o.o.Score; s != nil && *s >= 0 && *s <= 1 {
			scores[team] = append(scores[team], *s)
		}
		if o.o.Completed {
			completedCost[team] += float64(o.cost) / 1e6
		}
	}
	for k, want := range counts {
		labels := map[string]string{"team": k.team, "completed": k.completed}
		if v := counterValue(t, reg, "tollgate_conversation_outcomes_total", labels); v != want {
			t.Errorf("outcomes%v = %v, want %v", labels, v, want)
		}
	}
	for team, want := range completedCost {
		v := counterValue(t, reg, "tollgate_conversation_completed_cost_usd_total", map[string]string{"team": team})
		if math.Abs(v-want) > 1e-12 {
			t.Errorf("completed cost of %s = %v, want %v", team, v, want)
		}
	}
	for _, team := range []string{"search", "none", "ads"} {
		checkHistogram(t, reg, "tollgate_conversation_score", map[string]string{"team": team}, scores[team]...)
	}
	// Feedback is no label value anywhere.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, mt := range mf.GetMetric() {
			for _, l := range mt.GetLabel() {
				if strings.Contains(l.GetValue(), "thanks") {
					t.Errorf("%s has the feedback as label %s", mf.GetName(), l.GetName())
				}
			}
		}
	}
}
