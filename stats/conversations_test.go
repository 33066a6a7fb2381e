package stats

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/conversation"
)

// ended is a conversation as a test ends it.
type ended struct {
	c   conversation.Conversation
	why conversation.Reason
}

// posted is an outcome as a test posts it.
type posted struct {
	team string
	o    conversation.Outcome
	cost int64
}

// randomConversations returns n ended conversations of the teams, about a
// tenth evicted and a fifth with a failed turn, turns from 1 to 200 and
// cost up to $20, skewed low.
func randomConversations(r *rand.Rand, n int, teams ...string) []ended {
	out := make([]ended, n)
	for i := range out {
		turns := 1 + int64(math.Floor(math.Pow(r.Float64(), 3)*200))
		c := conversation.Conversation{Team: teams[r.IntN(len(teams))], Turns: turns,
			CostMicros: int64(math.Pow(r.Float64(), 4) * 20e6)}
		if r.IntN(5) == 0 {
			c.Errors = 1 + r.Int64N(turns)
		}
		why := conversation.EndIdle
		if r.IntN(10) == 0 {
			why = conversation.EndEvicted
		}
		out[i] = ended{c, why}
	}
	return out
}

func randomOutcomes(r *rand.Rand, n int, teams ...string) []posted {
	out := make([]posted, n)
	for i := range out {
		o := conversation.Outcome{Completed: r.IntN(3) > 0}
		if r.IntN(4) > 0 {
			s := math.Round(r.Float64()*100) / 100
			o.Score = &s
		}
		out[i] = posted{teams[r.IntN(len(teams))], o, r.Int64N(5e6)}
	}
	return out
}

// numpyQuantile is numpy's default quantile of vals: the value at 1-based
// rank 1 + q·(n−1), interpolated between the ranks around it.
func numpyQuantile(vals []float64, q float64) float64 {
	s := slices.Clone(vals)
	sort.Float64s(s)
	rank := 1 + q*float64(len(s)-1)
	i, frac := math.Modf(rank)
	if int(i) >= len(s) {
		return s[len(s)-1]
	}
	return s[int(i)-1]*(1-frac) + s[int(i)]*frac
}

// expectConversations works out the figures of cs and os, as the report
// should give them, apart from Seconds; sample keeps the idle ones of cs
// for percentiles (all of them when nil).
func expectConversations(cs []ended, os []posted, sample []ended) ConversationFigures {
	var f ConversationFigures
	var errored, idle, turns, cost float64
	for _, e := range cs {
		f.Ended++
		if e.c.Errors > 0 {
			errored++
		}
		if e.why == conversation.EndEvicted {
			f.Evicted++
			continue
		}
		idle++
		turns += float64(e.c.Turns)
		cost += float64(e.c.CostMicros) / 1e6
	}
	if sample == nil {
		sample = cs
	}
	var ts, usd []float64
	for _, e := range sample {
		if e.why == conversation.EndIdle {
			ts = append(ts, float64(e.c.Turns))
			usd = append(usd, float64(e.c.CostMicros)/1e6)
		}
	}
	f.Sampled = int64(len(ts))
	if f.Ended > 0 {
		f.ErrorShare = errored / float64(f.Ended)
	}
	if idle > 0 {
		f.Turns.Mean, f.CostUSD.Mean = turns/idle, cost/idle
	}
	if len(ts) > 0 {
		f.Turns.P50, f.Turns.P95, f.Turns.P99 = numpyQuantile(ts, 0.5), numpyQuantile(ts, 0.95), numpyQuantile(ts, 0.99)
		f.CostUSD.P50, f.CostUSD.P95, f.CostUSD.P99 = numpyQuantile(usd, 0.5), numpyQuantile(usd, 0.95), numpyQuantile(usd, 0.99)
	}
	var scores, completedCost float64
	for _, p := range os {
		f.Outcomes.Posted++
		if p.o.Completed {
			f.Outcomes.Completed++
			completedCost += float64(p.cost) / 1e6
		}
		if p.o.Score != nil && *p.o.Score >= 0 && *p.o.Score <= 1 {
			f.Outcomes.Scored++
			scores += *p.o.Score
		}
	}
	if f.Outcomes.Posted > 0 {
		f.Outcomes.CompletionRate = float64(f.Outcomes.Completed) / float64(f.Outcomes.Posted)
	}
	if f.Outcomes.Scored > 0 {
		f.Outcomes.MeanScore = scores / float64(f.Outcomes.Scored)
	}
	if f.Outcomes.Completed > 0 {
		f.Outcomes.CostPerCompletedUSD = completedCost / float64(f.Outcomes.Completed)
	}
	return f
}

// checkConversationFigures compares got with want, floats to a relative
// 1e-9 (sums in another order), Seconds aside.
func checkConversationFigures(t *testing.T, name string, got, want ConversationFigures) {
	t.Helper()
	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }
	ints := [][2]int64{{got.Ended, want.Ended}, {got.Evicted, want.Evicted}, {got.Sampled, want.Sampled},
		{got.Outcomes.Posted, want.Outcomes.Posted}, {got.Outcomes.Completed, want.Outcomes.Completed},
		{got.Outcomes.Scored, want.Outcomes.Scored}}
	floats := [][2]float64{{got.ErrorShare, want.ErrorShare},
		{got.Turns.Mean, want.Turns.Mean}, {got.Turns.P50, want.Turns.P50}, {got.Turns.P95, want.Turns.P95}, {got.Turns.P99, want.Turns.P99},
		{got.CostUSD.Mean, want.CostUSD.Mean}, {got.CostUSD.P50, want.CostUSD.P50}, {got.CostUSD.P95, want.CostUSD.P95}, {got.CostUSD.P99, want.CostUSD.P99},
		{got.Outcomes.CompletionRate, want.Outcomes.CompletionRate}, {got.Outcomes.MeanScore, want.Outcomes.MeanScore},
		{got.Outcomes.CostPerCompletedUSD, want.Outcomes.CostPerCompletedUSD}}
	for _, p := range ints {
		if p[0] != p[1] {
			t.Errorf("%s: got %+v\nwant %+v", name, got, want)
			return
		}
	}
	for _, p := range floats {
		if !near(p[0], p[1]) {
			t.Errorf("%s: got %+v\nwant %+v", name, got, want)
			return
		}
	}
}

func findConversations(t *testing.T, r Report, team string) ConversationGroup {
	t.Helper()
	for _, g := range r.Conversations {
		if g.Team == team {
			return g
		}
	}
	t.Fatalf("no conversations of team %q in %+v", team, r.Conversations)
	return ConversationGroup{}
}

func byTeam[T any](xs []T, team func(T) string) map[string][]T {
	out := map[string][]T{}
	for _, x := range xs {
		out[team(x)] = append(out[team(x)], x)
	}
	return out
}

// TestConversationFiguresEqualObserved: per team, the report's counts,
// shares, means, percentiles and outcome ratios are those of the
// conversations and outcomes observed, worked out here; a conversation
// without a team is under "none", and merge=team gives every team as one.
func TestConversationFiguresEqualObserved(t *testing.T) {
	clk := newFakeClock()
	w := New(clk.now)
	r := rand.New(rand.NewPCG(3, 17))
	cs := randomConversations(r, 600, "search", "ads", "")
	os := randomOutcomes(r, 300, "search", "ads", "")
	for i, e := range cs {
		w.ObserveConversation(e.c, e.why)
		if i < len(os) {
			w.ObserveOutcome(os[i].team, os[i].o, os[i].cost)
		}
		clk.advance(time.Second) // 10 min in all: all in the last hour
	}
	rep := w.Snapshot()
	if len(rep.Conversations) != 3 {
		t.Fatalf("%d conversation groups, want 3 (search, ads, none)", len(rep.Conversations))
	}
	csBy := byTeam(cs, func(e ended) string { return e.c.Team })
	osBy := byTeam(os, func(p posted) string { return p.team })
	for _, team := range []string{"search", "ads", ""} {
		name := team
		if name == "" {
			name = "none"
		}
		g := findConversations(t, rep, name)
		want := expectConversations(csBy[team], osBy[team], nil)
		checkConversationFigures(t, name+" last hour", g.LastHour, want)
		checkConversationFigures(t, name+" since start", g.SinceStart, want)
		if g.LastHour.Seconds != 600 || g.SinceStart.Seconds != 600 {
			t.Errorf("%s: spans %v and %v s, want 600 (10 min since the start)", name, g.LastHour.Seconds, g.SinceStart.Seconds)
		}
	}

	merged := w.snapshot(filter{mergeTeam: true})
	if len(merged.Conversations) != 1 || merged.Conversations[0].Team != "*" {
		t.Fatalf("merge=team: %+v", merged.Conversations)
	}
	checkConversationFigures(t, "merged", merged.Conversations[0].LastHour, expectConversations(cs, os, nil))
}

// TestConversationWindowExpiry: a conversation and an outcome leave the
// last hour between 59 and 60 minutes after they were observed (the hour
// is 60 one-minute slices, as the 1h window), whatever their offset in a
// minute, and stay in the figures since the start.
func TestConversationWindowExpiry(t *testing.T) {
	for off := time.Duration(0); off < sliceLong; off += 7 * time.Second {
		t.Run(off.String(), func(t *testing.T) {
			clk := newFakeClock()
			w := New(clk.now)
			clk.advance(off)
			score := 0.25
			old := []ended{{conversation.Conversation{Team: "a", Turns: 40, CostMicros: 4_000_000, Errors: 1}, conversation.EndIdle}}
			oldOut := []posted{{"a", conversation.Outcome{Completed: true, Score: &score}, 4_000_000}}
			w.ObserveConversation(old[0].c, old[0].why)
			w.ObserveOutcome(oldOut[0].team, oldOut[0].o, oldOut[0].cost)
			clk.advance(30 * time.Minute)
			recent := []ended{
				{conversation.Conversation{Team: "a", Turns: 2, CostMicros: 3_000}, conversation.EndIdle},
				{conversation.Conversation{Team: "a", Turns: 9, CostMicros: 70_000}, conversation.EndEvicted},
			}
			recentOut := []posted{{"a", conversation.Outcome{Completed: false}, 3_000}}
			for _, e := range recent {
				w.ObserveConversation(e.c, e.why)
			}
			w.ObserveOutcome(recentOut[0].team, recentOut[0].o, recentOut[0].cost)
			all, allOut := append(slices.Clone(old), recent...), append(slices.Clone(oldOut), recentOut...)

			clk.advance(29*time.Minute - time.Second) // the old ones are 59 min − 1 s old
			g := findConversations(t, w.Snapshot(), "a")
			checkConversationFigures(t, "at 59 min", g.LastHour, expectConversations(all, allOut, nil))

			clk.advance(time.Minute + time.Second) // 60 min old
			g = findConversations(t, w.Snapshot(), "a")
			checkConversationFigures(t, "at 60 min", g.LastHour, expectConversations(recent, recentOut, nil))
			checkConversationFigures(t, "since start at 60 min", g.SinceStart, expectConversations(all, allOut, nil))

			clk.advance(31 * time.Minute) // nothing in the last hour
			g = findConversations(t, w.Snapshot(), "a")
			checkConversationFigures(t, "at 91 min", g.LastHour, ConversationFigures{})
			checkConversationFigures(t, "since start at 91 min", g.SinceStart, expectConversations(all, allOut, nil))
		})
	}
}

// TestConversationSampleBounded: a team keeps at most convSample
// conversations for percentiles, its last ones, while its counts and
// means cover every one; and the teams kept are bounded, the rest folded
// into "other".
func TestConversationSampleBounded(t *testing.T) {
	clk := newFakeClock()
	w := New(clk.now)
	r := rand.New(rand.NewPCG(5, 8))
	cs := randomConversations(r, 3*convSample+17, "busy")
	for _, e := range cs {
		w.ObserveConversation(e.c, e.why)
	}
	if n := len(w.convs["busy"].sample); n != convSample {
		t.Errorf("%d conversations kept, want %d", n, convSample)
	}
	// The last convSample idle ones are the sample.
	var tail []ended
	for i := len(cs) - 1; i >= 0 && len(tail) < convSample; i-- {
		if cs[i].why == conversation.EndIdle {
			tail = append(tail, cs[i])
		}
	}
	g := findConversations(t, w.Snapshot(), "busy")
	want := expectConversations(cs, nil, tail)
	checkConversationFigures(t, "bounded", g.LastHour, want)
	if want.Sampled != convSample || want.Ended != int64(len(cs)) {
		t.Fatalf("test set-up: %d sampled of %d", want.Sampled, want.Ended)
	}

	for i := range maxConvTeams + 10 {
		w.ObserveConversation(conversation.Conversation{Team: fmt.Sprintf("t%03d", i), Turns: 1}, conversation.EndIdle)
	}
	if n := len(w.convs); n != maxConvTeams+1 {
		t.Errorf("%d teams kept, want %d and other", n, maxConvTeams)
	}
	// busy and t000..t254 filled the teams; t255..t265 went to other.
	if o := findConversations(t, w.Snapshot(), "other"); o.SinceStart.Ended != 11 {
		t.Errorf("other holds %d conversations, want 11", o.SinceStart.Ended)
	}
}

// TestConversationClockBack: a clock that goes back writes to the latest
// minute, so nothing observed is lost or counted twice.
func TestConversationClockBack(t *testing.T) {
	clk := newFakeClock()
	w := New(clk.now)
	clk.advance(5 * time.Minute)
	a := ended{conversation.Conversation{Team: "a", Turns: 3, CostMicros: 10}, conversation.EndIdle}
	w.ObserveConversation(a.c, a.why)
	clk.advance(-3 * time.Minute)
	b := ended{conversation.Conversation{Team: "a", Turns: 5, CostMicros: 20}, conversation.EndIdle}
	w.ObserveConversation(b.c, b.why)
	clk.advance(3 * time.Minute)
	g := findConversations(t, w.Snapshot(), "a")
	checkConversationFigures(t, "clock back", g.LastHour, expectConversations([]ended{a, b}, nil, nil))
}

// TestConversationsHTTP checks the JSON field names the dashboard reads,
// that team= keeps one team's conversations and route=, model= and
// window= none of them away, and that an empty list is [], not null.
func TestConversationsHTTP(t *testing.T) {
	w := served(t)
	if body := get(t, w, http.MethodGet, "/stats").Body.String(); !strings.Contains(body, `"conversations":[]`) {
		t.Errorf("no conversations encoded as %s", body)
	}
	score := 0.9
	w.ObserveConversation(conversation.Conversation{Team: "alpha", Turns: 4, CostMicros: 12_000}, conversation.EndIdle)
	w.ObserveConversation(conversation.Conversation{Team: "beta", Turns: 1, Errors: 1}, conversation.EndEvicted)
	w.ObserveOutcome("alpha", conversation.Outcome{Completed: true, Score: &score, Feedback: "fine"}, 12_000)

	var doc struct {
		Conversations []map[string]json.RawMessage `json:"conversations"`
	}
	if err := json.Unmarshal(get(t, w, http.MethodGet, "/stats").Body.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Conversations) != 2 {
		t.Fatalf("%d conversation groups, want 2", len(doc.Conversations))
	}
	keys := func(raw json.RawMessage) string {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			return err.Error()
		}
		var ks []string
		for k := range m {
			ks = append(ks, k)
		}
		slices.Sort(ks)
		return strings.Join(ks, ",")
	}
	g := doc.Conversations[0]
	var top []string
	for k := range g {
		top = append(top, k)
	}
	slices.Sort(top)
	if got := strings.Join(top, ","); got != "last_hour,since_start,team" {
		t.Errorf("conversation group keys %s", got)
	}
	if got := keys(g["last_hour"]); got != "cost_usd,ended,error_share,evicted,outcomes,sampled,seconds,turns" {
		t.Errorf("figures keys %s", got)
	}
	var figs map[string]json.RawMessage
	if err := json.Unmarshal(g["since_start"], &figs); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"turns", "cost_usd"} {
		if got := keys(figs[f]); got != "mean,p50,p95,p99" {
			t.Errorf("%s keys %s", f, got)
		}
	}
	if got := keys(figs["outcomes"]); got != "completed,completion_rate,cost_per_completed_usd,mean_score,posted,scored" {
		t.Errorf("outcomes keys %s", got)
	}

	for query, want := range map[string]string{
		"":                             "[alpha beta]",
		"team=beta":                    "[beta]",
		"team=nope":                    "[]",
		"route=messages&model=claude":  "[alpha beta]",
		"window=1m":                    "[alpha beta]",
		"merge=team":                   "[*]",
		"merge=route,model&team=alpha": "[alpha]",
	} {
		var rep Report
		if err := json.Unmarshal(get(t, w, http.MethodGet, "/stats?"+query).Body.Bytes(), &rep); err != nil {
			t.Fatal(err)
		}
		var teams []string
		for _, g := range rep.Conversations {
			teams = append(teams, g.Team)
		}
		if fmt.Sprint(teams) != want && !(want == "[]" && teams == nil) {
			t.Errorf("?%s: conversation teams %v, want %s", query, teams, want)
		}
	}
	var rep Report
	if err := json.Unmarshal(get(t, w, http.MethodGet, "/stats?team=alpha").Body.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	a := rep.Conversations[0].LastHour
	if a.Ended != 1 || a.Turns.P99 != 4 || a.CostUSD.Mean != 0.012 || a.Outcomes.MeanScore != score || a.Outcomes.CostPerCompletedUSD != 0.012 {
		t.Errorf("alpha round trip %+v", a)
	}
}
