package metrics

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tollgate-llm/tollgate/conversation"
	"github.com/tollgate-llm/tollgate/llm"
)

// sessionCall is one call of a test session: when it arrived (seconds
// after the session's start), how long it took, its cost and its hints.
type sessionCall struct {
	start, e2e int
	cost       int64
	h          conversation.Hints
}

// foldSessions records each conversation's calls in a real Local store
// and returns the conversations as the store hands them on.
func foldSessions(t *testing.T, convs map[string][]sessionCall, teams map[string]string) map[string]conversation.Conversation {
	t.Helper()
	st, err := conversation.NewLocal(conversation.LocalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	t0 := time.Unix(1_800_000_000, 0)
	out := map[string]conversation.Conversation{}
	for id, calls := range convs {
		key := conversation.Key("team:"+teams[id], id)
		for _, c := range calls {
			start := t0.Add(time.Duration(c.start) * time.Second)
			e2e := time.Duration(c.e2e) * time.Second
			st.Record(conversation.Turn{Key: key, Team: teams[id], Start: start, E2E: e2e, At: start.Add(e2e),
				CostMicros: c.cost, KeyID: "dev-" + id, Hints: c.h})
		}
		got, err := st.Get(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		out[id] = got
	}
	return out
}

// TestSessionEnded: an agent's session that ended idle has its cost,
// calls, user turns, wall time, time shares, compactions and subagent cost
// share observed under its team; a plain conversation (no hints) and an
// evicted session are not sessions' observations.
func TestSessionEnded(t *testing.T) {
	m, reg := newConversationTest(t)
	tools := func(ms ...int64) []conversation.ToolRun {
		var r []conversation.ToolRun
		for _, v := range ms {
			r = append(r, conversation.ToolRun{Name: "Bash", Millis: v})
		}
		return r
	}
	convs := map[string][]sessionCall{
		// 100 s of wall time: 45 s model, 30 s tools, 25 s the rest;
		// $0.001 of which a subagent's call $0.0003; one compaction; two
		// user prompts.
		"claude": {
			{0, 10, 600, conversation.Hints{Class: "main", Prompt: "p1"}},
			{30, 20, 300, conversation.Hints{Class: "subagent", Agent: "a1", Prompt: "p1", Tools: tools(15_000)}},
			{60, 5, 100, conversation.Hints{Class: "compaction", Compaction: "auto", Prompt: "p2"}},
			{90, 10, 0, conversation.Hints{Class: "main", Compacted: "auto", Prompt: "p2", Tools: tools(5_000, 10_000)}},
		},
		// A warm-up and a turn, no prompt id: 0 user turns, 40 s wall time
		// all of it the model's and tools' (overlapping: 30 + 20 of 50).
		"codex": {
			{0, 10, 50, conversation.Hints{Class: "warmup"}},
			{20, 20, 2_000_000, conversation.Hints{Class: "main", Tools: tools(20_000)}},
		},
		"plain":   {{0, 1, 700, conversation.Hints{}}, {5, 1, 700, conversation.Hints{}}},
		"evicted": {{0, 3, 9_000, conversation.Hints{Class: "main"}}},
		"teamless": {
			{0, 2, 10, conversation.Hints{Class: "auxiliary"}},
		},
	}
	teams := map[string]string{"claude": "search", "codex": "search", "plain": "search", "evicted": "ads", "teamless": ""}
	got := foldSessions(t, convs, teams)
	for id, c := range got {
		why := conversation.EndIdle
		if id == "evicted" {
			why = conversation.EndEvicted
		}
		m.ConversationEnded(c, why)
	}

	search := map[string]string{"team": "search"}
	checkHistogram(t, reg, "tollgate_session_cost_usd", search, 0.001, 2.00005)
	checkHistogram(t, reg, "tollgate_session_calls", search, 4, 2)
	checkHistogram(t, reg, "tollgate_session_user_turns", search, 2, 0)
	checkHistogram(t, reg, "tollgate_session_duration_seconds", search, 100, 40)
	checkHistogram(t, reg, "tollgate_session_time_share", map[string]string{"team": "search", "part": "model"}, 0.45, 0.6)
	checkHistogram(t, reg, "tollgate_session_time_share", map[string]string{"team": "search", "part": "tool"}, 0.3, 0.4)
	checkHistogram(t, reg, "tollgate_session_time_share", map[string]string{"team": "search", "part": "other"}, 0.25, 0)
	checkHistogram(t, reg, "tollgate_session_compactions", search, 1, 0)
	checkHistogram(t, reg, "tollgate_session_subagent_cost_share", search, 0.3, 0)

	// The evicted session of ads is counted as a conversation, not observed.
	checkHistogram(t, reg, "tollgate_session_cost_usd", map[string]string{"team": "ads"})
	// A session without a team is team "none": 2 s, all the model's.
	checkHistogram(t, reg, "tollgate_session_duration_seconds", map[string]string{"team": "none"}, 2)
	checkHistogram(t, reg, "tollgate_session_time_share", map[string]string{"team": "none", "part": "model"}, 1)
	// The plain conversation is one of search's conversations, not a session.
	if n := series(t, reg, "tollgate_conversation_turns", search).GetHistogram().GetSampleCount(); n != 3 {
		t.Errorf("search's conversations: %d observed, want 3 (two sessions and a plain one)", n)
	}
}

// TestRequestsByClass: every request is counted, priced and timed under
// its team and request class; a class outside the closed set is "other",
// none named is "none", and no other value becomes a class label.
func TestRequestsByClass(t *testing.T) {
	m, reg := newConversationTest(t)
	t0 := time.Unix(1000, 0)
	rec := func(team, class string, e2e time.Duration, cost int64) *llm.Record {
		return &llm.Record{Route: llm.RouteMessages, Model: "claude", Team: team, Status: 200, Outcome: llm.OutcomeOK,
			RequestClass: class, Agent: "a1b2c3d4e5f6", CostMicros: cost,
			Timing: llm.Timing{In: t0, End: t0.Add(e2e)}}
	}
	recs := []*llm.Record{
		rec("search", "main", 2*time.Second, 3_000),
		rec("search", "main", 500*time.Millisecond, 1_000),
		rec("search", "subagent", time.Second, 2_500),
		rec("search", "", 40*time.Millisecond, 10),
		rec("search", "brainstorm", 10*time.Millisecond, 0),
		rec("", "compaction", 30*time.Second, 90_000),
	}
	for _, r := range recs {
		m.Observe(r, "claude")
	}
	type key struct{ team, class string }
	want := map[key]struct {
		n    float64
		cost float64
		e2e  []float64
	}{
		{"search", "main"}:     {2, 0.004, []float64{2, 0.5}},
		{"search", "subagent"}: {1, 0.0025, []float64{1}},
		{"search", "none"}:     {1, 0.00001, []float64{0.04}},
		{"search", "other"}:    {1, 0, []float64{0.01}},
		{"none", "compaction"}: {1, 0.09, []float64{30}},
	}
	for k, w := range want {
		labels := map[string]string{"team": k.team, "class": k.class}
		if v := counterValue(t, reg, "tollgate_requests_by_class_total", labels); v != w.n {
			t.Errorf("requests%v = %v, want %v", labels, v, w.n)
		}
		if w.cost > 0 {
			if v := counterValue(t, reg, "tollgate_cost_by_class_usd_total", labels); math.Abs(v-w.cost) > 1e-12 {
				t.Errorf("cost%v = %v, want %v", labels, v, w.cost)
			}
		} else if series(t, reg, "tollgate_cost_by_class_usd_total", labels) != nil {
			t.Errorf("cost%v: a series for a request that cost nothing", labels)
		}
		checkHistogram(t, reg, "tollgate_request_duration_by_class_seconds", labels, w.e2e...)
	}
	classes := append(slices.Clone(llm.RequestClasses), "none")
	for _, name := range []string{"tollgate_requests_by_class_total", "tollgate_cost_by_class_usd_total",
		"tollgate_request_duration_by_class_seconds"} {
		for _, s := range gatherFamily(t, reg, name) {
			for _, l := range s.GetLabel() {
				if l.GetName() == "class" && !slices.Contains(classes, l.GetValue()) {
					t.Errorf("%s has class %q, outside the closed set", name, l.GetValue())
				}
				if l.GetValue() == "a1b2c3d4e5f6" {
					t.Errorf("%s has the agent id as label %s", name, l.GetName())
				}
			}
		}
	}
}

// gatherFamily returns the series of family name.
func gatherFamily(t *testing.T, reg *prometheus.Registry, name string) []*dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()
		}
	}
	t.Errorf("no family %s", name)
	return nil
}

// BenchmarkObserve is the metrics of one finished streamed request, as the
// proxy hands it over, with the request class its agent named: every
// series it writes exists already, so it allocates nothing.
func BenchmarkObserve(b *testing.B) {
	m, _ := newConversationTest(&testing.T{})
	t0 := time.Unix(1000, 0)
	rec := &llm.Record{Route: llm.RouteMessages, Model: "claude", Team: "search", Status: 200, Stream: true,
		Outcome: llm.OutcomeOK, RequestClass: "subagent", CostMicros: 120, InputBucket: "500-2000",
		Timing: llm.Timing{In: t0, UpSent: t0.Add(time.Millisecond), FirstToken: t0.Add(100 * time.Millisecond),
			FirstTokenOut: t0.Add(101 * time.Millisecond), LastToken: t0.Add(190 * time.Millisecond), End: t0.Add(200 * time.Millisecond)},
		Usage: llm.Usage{Input: 600, Output: 10, HasInput: true, HasOutput: true}}
	b.ReportAllocs()
	for b.Loop() {
		m.Observe(rec, "claude")
	}
}
