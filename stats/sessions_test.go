package stats

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/conversation"
)

// session is an ended conversation as a test builds it, with the figures
// it should count for, worked out here from its parts rather than by
// package conversation.
type session struct {
	ended
	session bool // its calls carried hints
	figs    sessFigures
}

// randomSessions returns n ended conversations of the teams: most of them
// agents' sessions (main calls, some subagent calls, tools, compactions,
// prompts), some plain conversations (calls that named no class), about a
// tenth evicted. Times are whole milliseconds, costs whole micro-dollars.
func randomSessions(r *rand.Rand, n int, teams ...string) []session {
	t0 := time.Date(2026, 9, 1, 9, 0, 0, 0, time.UTC)
	out := make([]session, n)
	for i := range out {
		team := teams[r.IntN(len(teams))]
		c := conversation.Conversation{Team: team, Key: fmt.Sprintf("k%04d", i), KeyID: fmt.Sprintf("dev-%d", r.IntN(5)),
			Start: t0.Add(time.Duration(r.IntN(1000)) * time.Second)}
		wall := time.Duration(1+r.IntN(3_600_000)) * time.Millisecond
		c.First, c.Last = c.Start.Add(wall/10), c.Start.Add(wall)
		s := session{session: r.IntN(6) > 0}
		mainCalls := 1 + r.Int64N(80)
		mainCost := r.Int64N(4_000_000)
		mainE2E := r.Int64N(int64(wall/time.Microsecond) + 1)
		c.Turns, c.CostMicros = mainCalls, mainCost
		if !s.session {
			c.Breakdown.Classes = map[string]*conversation.Calls{"none": {Calls: mainCalls, CostMicros: mainCost, E2EMicros: mainE2E}}
		} else {
			c.Breakdown.Classes = map[string]*conversation.Calls{"main": {Calls: mainCalls, CostMicros: mainCost, E2EMicros: mainE2E}}
			var subCost, subE2E int64
			if r.IntN(2) == 0 {
				subCalls := 1 + r.Int64N(30)
				subCost, subE2E = r.Int64N(2_000_000), r.Int64N(int64(wall/time.Microsecond)+1)
				c.Breakdown.Classes["subagent"] = &conversation.Calls{Calls: subCalls, CostMicros: subCost, E2EMicros: subE2E}
				c.Turns += subCalls
				c.CostMicros += subCost
			}
			toolMs := r.Int64N(int64(wall / time.Millisecond))
			if toolMs > 0 {
				c.Breakdown.Tools = map[string]*conversation.Tool{"Bash": {Runs: 3, Millis: toolMs / 3}, "Read": {Runs: 1, Millis: toolMs - toolMs/3}}
			}
			compactions := r.Int64N(4)
			if compactions > 0 {
				c.Breakdown.Compactions = map[string]*conversation.Compactions{"auto": {Calls: compactions}}
			}
			c.Breakdown.Prompts = r.Int64N(12)
			model := float64(mainE2E+subE2E) / 1e6
			tools := float64(toolMs) / 1e3
			total := math.Max(wall.Seconds(), model+tools)
			s.figs = sessFigures{
				figCost: float64(c.CostMicros) / 1e6, figCalls: float64(c.Turns), figUserTurns: float64(c.Breakdown.Prompts),
				figDuration: wall.Seconds(), figModelShare: model / total, figToolShare: tools / total,
				figCompactions: float64(compactions),
			}
			if c.CostMicros > 0 {
				s.figs[figSubagentShare] = float64(subCost) / float64(c.CostMicros)
			}
		}
		why := conversation.EndIdle
		if r.IntN(10) == 0 {
			why = conversation.EndEvicted
		}
		s.ended = ended{c, why}
		out[i] = s
	}
	return out
}

// expectSessions works out the session figures of ss as the report should
// give them, Seconds aside: sample keeps the idle sessions for
// percentiles (all of them when nil), and ss's costliest idle sessions.
func expectSessions(ss, sample []session) SessionFigures {
	var f SessionFigures
	var sums sessFigures
	var idle []session
	for _, s := range ss {
		if !s.session {
			continue
		}
		f.Ended++
		if s.why == conversation.EndEvicted {
			f.Evicted++
			continue
		}
		idle = append(idle, s)
		for i := range sums {
			sums[i] += s.figs[i]
		}
	}
	if sample == nil {
		sample = ss
	}
	var vals [sessFigs][]float64
	for _, s := range sample {
		if s.session && s.why == conversation.EndIdle {
			for i := range vals {
				vals[i] = append(vals[i], s.figs[i])
			}
		}
	}
	f.Sampled = int64(len(vals[0]))
	dist := func(fig int) Distribution {
		var d Distribution
		if len(idle) > 0 {
			d.Mean = sums[fig] / float64(len(idle))
		}
		if len(vals[fig]) > 0 {
			d.P50, d.P95, d.P99 = numpyQuantile(vals[fig], 0.5), numpyQuantile(vals[fig], 0.95), numpyQuantile(vals[fig], 0.99)
		}
		return d
	}
	f.CostUSD, f.Calls, f.UserTurns, f.DurationSeconds = dist(figCost), dist(figCalls), dist(figUserTurns), dist(figDuration)
	f.ModelShare, f.ToolShare = dist(figModelShare), dist(figToolShare)
	f.Compactions, f.SubagentCostShare = dist(figCompactions), dist(figSubagentShare)
	slices.SortStableFunc(idle, func(a, b session) int { return int(b.c.CostMicros - a.c.CostMicros) })
	for _, s := range idle[:min(len(idle), maxCostliest)] {
		team := s.c.Team
		if team == "" {
			team = "none"
		}
		f.Costliest = append(f.Costliest, CostlySession{Team: team, Key: s.c.Key, KeyID: s.c.KeyID,
			CostUSD: s.figs[figCost], Calls: s.c.Turns, UserTurns: s.c.Breakdown.Prompts, DurationSeconds: s.figs[figDuration]})
	}
	return f
}

// checkSessionFigures compares got with want, floats to a relative 1e-9
// (sums in another order), Seconds and the costliest's end times aside.
func checkSessionFigures(t *testing.T, name string, got, want SessionFigures) {
	t.Helper()
	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }
	if got.Ended != want.Ended || got.Evicted != want.Evicted || got.Sampled != want.Sampled {
		t.Errorf("%s: ended %d, evicted %d, sampled %d; want %d, %d, %d", name, got.Ended, got.Evicted, got.Sampled,
			want.Ended, want.Evicted, want.Sampled)
	}
	for _, d := range []struct {
		fig       string
		got, want Distribution
	}{{"cost", got.CostUSD, want.CostUSD}, {"calls", got.Calls, want.Calls}, {"user turns", got.UserTurns, want.UserTurns},
		{"duration", got.DurationSeconds, want.DurationSeconds}, {"model share", got.ModelShare, want.ModelShare},
		{"tool share", got.ToolShare, want.ToolShare}, {"compactions", got.Compactions, want.Compactions},
		{"subagent share", got.SubagentCostShare, want.SubagentCostShare}} {
		if !near(d.got.Mean, d.want.Mean) || !near(d.got.P50, d.want.P50) || !near(d.got.P95, d.want.P95) || !near(d.got.P99, d.want.P99) {
			t.Errorf("%s: %s %+v, want %+v", name, d.fig, d.got, d.want)
		}
	}
	if len(got.Costliest) != len(want.Costliest) {
		t.Errorf("%s: %d costliest, want %d", name, len(got.Costliest), len(want.Costliest))
		return
	}
	for i, c := range got.Costliest {
		w := want.Costliest[i]
		c.Ended, w.Ended = time.Time{}, time.Time{}
		if c.Team != w.Team || c.Key != w.Key || c.KeyID != w.KeyID || c.Calls != w.Calls || c.UserTurns != w.UserTurns ||
			!near(c.CostUSD, w.CostUSD) || !near(c.DurationSeconds, w.DurationSeconds) {
			t.Errorf("%s: costliest %d is %+v, want %+v", name, i, c, w)
		}
	}
}

func findSessions(t *testing.T, r Report, team string) SessionGroup {
	t.Helper()
	for _, g := range r.Sessions {
		if g.Team == team {
			return g
		}
	}
	t.Fatalf("no sessions of team %q in %+v", team, r.Sessions)
	return SessionGroup{}
}

// TestSessionFiguresEqualObserved: per team, the sessions' counts, means,
// percentiles and costliest are those of the agents' sessions observed,
// worked out here, with the plain conversations left out (and counted as
// conversations still); merge=team gives every team as one. About 100
// sessions a team end in each of two minutes, so the hour's ten costliest
// must be kept from each minute's ten.
func TestSessionFiguresEqualObserved(t *testing.T) {
	clk := newFakeClock()
	w := New(clk.now)
	r := rand.New(rand.NewPCG(11, 29))
	ss := randomSessions(r, 600, "search", "ads", "")
	for _, s := range ss {
		w.ObserveConversation(s.c, s.why)
		clk.advance(200 * time.Millisecond)
	}
	rep := w.Snapshot()
	if len(rep.Sessions) != 3 {
		t.Fatalf("%d session groups, want 3 (search, ads, none)", len(rep.Sessions))
	}
	by := byTeam(ss, func(s session) string { return s.c.Team })
	for _, team := range []string{"search", "ads", ""} {
		name := team
		if name == "" {
			name = "none"
		}
		g := findSessions(t, rep, name)
		want := expectSessions(by[team], nil)
		checkSessionFigures(t, name+" last hour", g.LastHour, want)
		checkSessionFigures(t, name+" since start", g.SinceStart, want)
		if g.LastHour.Seconds != 120 || g.SinceStart.Seconds != 120 {
			t.Errorf("%s: spans %v and %v s, want 120", name, g.LastHour.Seconds, g.SinceStart.Seconds)
		}
		if c := findConversations(t, rep, name); c.SinceStart.Ended != int64(len(by[team])) {
			t.Errorf("%s: %d conversations ended, want all %d, sessions or not", name, c.SinceStart.Ended, len(by[team]))
		}
	}
	merged := w.snapshot(filter{mergeTeam: true})
	if len(merged.Sessions) != 1 || merged.Sessions[0].Team != "*" {
		t.Fatalf("merge=team: %+v", merged.Sessions)
	}
	checkSessionFigures(t, "merged", merged.Sessions[0].LastHour, expectSessions(ss, nil))
}

// TestSessionWindowExpiry: a session, and its place among the costliest,
// leave the last hour 60 minutes after it ended and stay since the start;
// a cheaper session of the last hour then leads.
func TestSessionWindowExpiry(t *testing.T) {
	clk := newFakeClock()
	w := New(clk.now)
	start := clk.now()
	mk := func(key string, cost int64) conversation.Conversation {
		return conversation.Conversation{Team: "a", Key: key, KeyID: "dev-" + key, Turns: 3, CostMicros: cost,
			Breakdown: conversation.Breakdown{Classes: map[string]*conversation.Calls{"main": {Calls: 3, CostMicros: cost}}}}
	}
	w.ObserveConversation(mk("old", 9_000_000), conversation.EndIdle)
	clk.advance(30 * time.Minute)
	w.ObserveConversation(mk("new", 1_000), conversation.EndIdle)
	clk.advance(29*time.Minute + 59*time.Second)
	keys := func(cs []CostlySession) string {
		var ks []string
		for _, c := range cs {
			ks = append(ks, c.KeyID+"@"+c.Ended.Sub(start).String())
		}
		return strings.Join(ks, ",")
	}
	g := findSessions(t, w.Snapshot(), "a")
	if got := keys(g.LastHour.Costliest); got != "dev-old@0s,dev-new@30m0s" || g.LastHour.Ended != 2 {
		t.Errorf("at 59:59: %d ended, costliest %s", g.LastHour.Ended, got)
	}
	clk.advance(time.Second)
	g = findSessions(t, w.Snapshot(), "a")
	if got := keys(g.LastHour.Costliest); got != "dev-new@30m0s" || g.LastHour.Ended != 1 || g.LastHour.CostUSD.P50 != 0.001 {
		t.Errorf("at 60:00: %d ended, P50 %v, costliest %s", g.LastHour.Ended, g.LastHour.CostUSD.P50, got)
	}
	if got := keys(g.SinceStart.Costliest); got != "dev-old@0s,dev-new@30m0s" || g.SinceStart.Ended != 2 {
		t.Errorf("since start: %d ended, costliest %s", g.SinceStart.Ended, got)
	}
}

// TestSessionsBounded: a team keeps at most maxCostliest sessions a
// minute and since the start, and sessSample for percentiles; a team that
// never ended a session keeps none and is not reported.
func TestSessionsBounded(t *testing.T) {
	clk := newFakeClock()
	w := New(clk.now)
	r := rand.New(rand.NewPCG(2, 4))
	for i := range 3 * sessSample {
		c := conversation.Conversation{Team: "busy", Key: fmt.Sprint(i), Turns: 1, CostMicros: r.Int64N(1e6),
			Breakdown: conversation.Breakdown{Prompts: 1}}
		w.ObserveConversation(c, conversation.EndIdle)
		if i%100 == 0 {
			clk.advance(time.Minute)
		}
	}
	w.ObserveConversation(conversation.Conversation{Team: "plain", Turns: 2}, conversation.EndIdle)
	s := w.convs["busy"].sess
	if len(s.sample) != sessSample || len(s.top) != maxCostliest {
		t.Errorf("busy keeps %d sessions and %d costliest, want %d and %d", len(s.sample), len(s.top), sessSample, maxCostliest)
	}
	for i := range s.slots {
		if n := len(s.slots[i].top); n > maxCostliest {
			t.Errorf("minute %d keeps %d costliest", i, n)
		}
	}
	if w.convs["plain"].sess != nil {
		t.Error("a team without a session keeps session records")
	}
	if rep := w.Snapshot(); len(rep.Sessions) != 1 || rep.Sessions[0].Team != "busy" {
		t.Errorf("session groups %+v, want busy's only", rep.Sessions)
	}
}

// TestSessionsHTTP checks the JSON field names the dashboard reads, that
// team= keeps one team's sessions, and that none is [], not null.
func TestSessionsHTTP(t *testing.T) {
	w := served(t)
	if body := get(t, w, http.MethodGet, "/stats").Body.String(); !strings.Contains(body, `"sessions":[]`) {
		t.Errorf("no sessions encoded as %s", body)
	}
	for _, team := range []string{"alpha", "beta"} {
		w.ObserveConversation(conversation.Conversation{Team: team, Key: "k-" + team, KeyID: "dev", Turns: 2, CostMicros: 5_000,
			Breakdown: conversation.Breakdown{Classes: map[string]*conversation.Calls{"main": {Calls: 2, CostMicros: 5_000}}}},
			conversation.EndIdle)
	}
	var doc struct {
		Sessions []map[string]json.RawMessage `json:"sessions"`
	}
	if err := json.Unmarshal(get(t, w, http.MethodGet, "/stats?team=alpha").Body.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Sessions) != 1 {
		t.Fatalf("team=alpha: %d session groups", len(doc.Sessions))
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
	g := doc.Sessions[0]
	if string(g["team"]) != `"alpha"` {
		t.Errorf("team %s", g["team"])
	}
	if got := keys(g["last_hour"]); got != "calls,compactions,cost_usd,costliest,duration_seconds,ended,evicted,model_share,"+
		"sampled,seconds,subagent_cost_share,tool_share,user_turns" {
		t.Errorf("figures keys %s", got)
	}
	var figs struct {
		Costliest []json.RawMessage `json:"costliest"`
		CostUSD   json.RawMessage   `json:"cost_usd"`
	}
	if err := json.Unmarshal(g["last_hour"], &figs); err != nil || len(figs.Costliest) != 1 {
		t.Fatalf("last hour: %v, %d costliest", err, len(figs.Costliest))
	}
	if got := keys(figs.Costliest[0]); got != "calls,cost_usd,duration_seconds,ended,key,key_id,team,user_turns" {
		t.Errorf("costliest keys %s", got)
	}
	if got := keys(figs.CostUSD); got != "mean,p50,p95,p99" {
		t.Errorf("distribution keys %s", got)
	}
}
