package stats

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/tollgate-llm/tollgate/conversation"
)

const (
	// convSample bounds the conversations a team keeps for percentiles:
	// its last convSample that ended idle. With more than that in the last
	// hour, the hour's percentiles are over the last convSample of them
	// (ConversationFigures.Sampled says how many); counts and means stay
	// exact.
	convSample = 1024

	// maxConvTeams bounds the teams conversations are kept for. Teams come
	// from the configuration, so this is a backstop: past it, new teams
	// fold into team "other" (one more).
	maxConvTeams = 256

	// convSlices is the 1 min slices of the last hour a team keeps
	// conversation counts in: the 1h window of the request figures.
	convSlices = 60
)

// convCounters are the exact conversation counts of a span.
type convCounters struct {
	ended   int64 // idle and evicted
	evicted int64
	errored int64 // ended with at least one failed turn
	// idle, turns and costMicros are over the conversations that ended
	// idle: the ones whose figures are whole.
	idle       int64
	turns      int64
	costMicros int64

	posted, completed, scored int64
	scoreSum                  float64
	completedCostMicros       int64
}

func (c *convCounters) merge(o *convCounters) {
	c.ended += o.ended
	c.evicted += o.evicted
	c.errored += o.errored
	c.idle += o.idle
	c.turns += o.turns
	c.costMicros += o.costMicros
	c.posted += o.posted
	c.completed += o.completed
	c.scored += o.scored
	c.scoreSum += o.scoreSum
	c.completedCostMicros += o.completedCostMicros
}

// convSlot is one minute's counts; stamp is its slice number.
type convSlot struct {
	stamp int64
	convCounters
}

// convEntry is one idle-ended conversation kept for percentiles.
type convEntry struct {
	stamp      int64 // the 1 min slice it ended in
	turns      int64
	costMicros int64
}

// convTeam is one team's conversations: the counts of the last hour by
// minute and since the start, and its last convSample idle-ended
// conversations. About 6 KB of slices and 24 bytes a kept conversation:
// at most 31 KB.
type convTeam struct {
	last   int64 // the latest slice written, so that stamps only grow
	slots  [convSlices]convSlot
	total  convCounters
	sample []convEntry // a ring once full; next is the oldest
	next   int
	// sess are its sessions (sessions.go), nil until one ends.
	sess *sessTeam
}

// add applies f to the counters of the slice at elapsed time e and to the
// totals, and returns the slice's number. A clock that went back writes
// to the latest slice.
func (t *convTeam) add(e int64, f func(*convCounters)) int64 {
	k := max(floorDiv(e, int64(sliceLong)), t.last)
	t.last = k
	sl := &t.slots[mod(k, convSlices)]
	if sl.stamp != k {
		*sl = convSlot{stamp: k}
	}
	f(&sl.convCounters)
	f(&t.total)
	return k
}

func (t *convTeam) keep(en convEntry) {
	if len(t.sample) < convSample {
		t.sample = append(t.sample, en)
		return
	}
	t.sample[t.next] = en
	t.next = (t.next + 1) % convSample
}

// convTeamOf returns team's record, created if need be. Called with
// w.convMu held.
func (w *Windows) convTeamOf(team string) *convTeam {
	if team == "" {
		team = teamNone
	}
	t := w.convs[team]
	if t == nil {
		if len(w.convs) >= maxConvTeams {
			team = labelOther
			if t = w.convs[team]; t != nil {
				return t
			}
		}
		t = &convTeam{last: noStamp}
		for i := range t.slots {
			t.slots[i].stamp = noStamp
		}
		w.convs[team] = t
	}
	return t
}

// ObserveConversation adds a conversation that ended (the conversation
// store's Options.OnEnd), at the clock's time. Every one counts as ended,
// and as errored when any turn failed; one that ended idle also gives its
// turns and cost to the means and percentiles. An evicted one is counted
// only: its figures are partial, as in package metrics. A coding agent's
// session is also counted as a session (sessions.go).
func (w *Windows) ObserveConversation(c conversation.Conversation, why conversation.Reason) {
	at := w.now()
	e := w.elapsed(at)
	idle := why == conversation.EndIdle
	turns, cost := max(c.Turns, 0), max(c.CostMicros, 0)
	w.convMu.Lock()
	defer w.convMu.Unlock()
	t := w.convTeamOf(c.Team)
	k := t.add(e, func(cc *convCounters) {
		cc.ended++
		if c.Errors > 0 {
			cc.errored++
		}
		if !idle {
			cc.evicted++
			return
		}
		cc.idle++
		cc.turns += turns
		cc.costMicros += cost
	})
	if idle {
		t.keep(convEntry{stamp: k, turns: turns, costMicros: cost})
	}
	observeSession(t, k, &c, idle, at)
}

// ObserveOutcome adds the outcome an application reported for a
// conversation of team ("" for none) that had cost costMicros so far, at
// the clock's time. A score outside [0, 1] (which the API refuses) is left
// out of the mean, as in package metrics.
func (w *Windows) ObserveOutcome(team string, o conversation.Outcome, costMicros int64) {
	e := w.elapsed(w.now())
	scored := o.Score != nil && *o.Score >= 0 && *o.Score <= 1
	w.convMu.Lock()
	defer w.convMu.Unlock()
	w.convTeamOf(team).add(e, func(cc *convCounters) {
		cc.posted++
		if o.Completed {
			cc.completed++
			cc.completedCostMicros += max(costMicros, 0)
		}
		if scored {
			cc.scored++
			cc.scoreSum += *o.Score
		}
	})
}

// ConversationGroup is one team's conversation figures: over the last hour
// (the 1h window's minute slices, whatever window= asks) and since the
// gateway started. Conversations without a team are under team "none";
// merge=team reports every team as one, team "*".
type ConversationGroup struct {
	Team       string              `json:"team"`
	LastHour   ConversationFigures `json:"last_hour"`
	SinceStart ConversationFigures `json:"since_start"`
}

// ConversationFigures are the figures of the conversations that ended, and
// of the outcomes posted, in a span of Seconds. Ended counts every ended
// conversation, Evicted those of them pushed out by [conversations]
// max_active, whose figures are partial; ErrorShare is the share of Ended
// with a failed turn. Turns and CostUSD are over the conversations that
// ended idle (Ended − Evicted): their means exactly, their percentiles
// over the last Sampled of them (all, up to 1,024 a team).
type ConversationFigures struct {
	Seconds    float64      `json:"seconds"`
	Ended      int64        `json:"ended"`
	Evicted    int64        `json:"evicted"`
	ErrorShare float64      `json:"error_share"`
	Sampled    int64        `json:"sampled"`
	Turns      Distribution `json:"turns"`
	CostUSD    Distribution `json:"cost_usd"`
	Outcomes   Outcomes     `json:"outcomes"`
}

// Distribution summarises a per-conversation figure. Mean is exact; the
// percentiles are exact over the sample, interpolated linearly between the
// closest ranks as numpy computes them. All are zero without a sample.
type Distribution struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P95  float64 `json:"p95"`
	P99  float64 `json:"p99"`
}

// Outcomes summarises the outcomes posted in a span: CompletionRate is
// Completed/Posted, MeanScore the mean of the Scored ones' scores, and
// CostPerCompletedUSD the cost of the completed conversations (up to their
// outcome) over Completed. Each ratio is 0 when its divisor is.
type Outcomes struct {
	Posted              int64   `json:"posted"`
	Completed           int64   `json:"completed"`
	CompletionRate      float64 `json:"completion_rate"`
	Scored              int64   `json:"scored"`
	MeanScore           float64 `json:"mean_score"`
	CostPerCompletedUSD float64 `json:"cost_per_completed_usd"`
}

// convSet is the teams reported as one: their counts and kept
// conversations, copied under w.convMu.
type convSet struct {
	team        string
	hour, total convCounters
	hourSample  []convEntry
	allSample   []convEntry
}

// conversations returns the conversation figures f keeps at elapsed time e,
// sorted by team: f.team keeps one team, f.mergeTeam merges them all.
func (w *Windows) conversations(f *filter, e int64) []ConversationGroup {
	cur := floorDiv(e, int64(sliceLong))
	byTeam := map[string]*convSet{}
	w.convMu.Lock()
	for team, t := range w.convs {
		if f.team != "" && f.team != team {
			continue
		}
		name := team
		if f.mergeTeam {
			name = mergeAll
		}
		s := byTeam[name]
		if s == nil {
			s = &convSet{team: name}
			byTeam[name] = s
		}
		s.total.merge(&t.total)
		for i := range t.slots {
			if sl := &t.slots[i]; inLastHour(sl.stamp, cur) {
				s.hour.merge(&sl.convCounters)
			}
		}
		for _, en := range t.sample {
			s.allSample = append(s.allSample, en)
			if inLastHour(en.stamp, cur) {
				s.hourSample = append(s.hourSample, en)
			}
		}
	}
	w.convMu.Unlock()

	out := make([]ConversationGroup, 0, len(byTeam))
	for _, s := range byTeam {
		out = append(out, ConversationGroup{Team: s.team,
			LastHour:   convFigures(&s.hour, s.hourSample, covered(windowSpecs[2], e)),
			SinceStart: convFigures(&s.total, s.allSample, float64(max(e, 0))/float64(time.Second)),
		})
	}
	slices.SortFunc(out, func(a, b ConversationGroup) int { return cmp.Compare(a.Team, b.Team) })
	return out
}

// inLastHour reports whether the 1 min slice stamp is one of the last
// hour's at the current slice cur.
func inLastHour(stamp, cur int64) bool { return stamp > cur-convSlices && stamp <= cur }

func convFigures(c *convCounters, sample []convEntry, seconds float64) ConversationFigures {
	ratio := func(a, b float64) float64 {
		if b == 0 {
			return 0
		}
		return a / b
	}
	out := ConversationFigures{Seconds: seconds, Ended: c.ended, Evicted: c.evicted,
		ErrorShare: ratio(float64(c.errored), float64(c.ended)),
		Sampled:    int64(len(sample)),
		Outcomes: Outcomes{Posted: c.posted, Completed: c.completed, Scored: c.scored,
			CompletionRate:      ratio(float64(c.completed), float64(c.posted)),
			MeanScore:           ratio(c.scoreSum, float64(c.scored)),
			CostPerCompletedUSD: ratio(float64(c.completedCostMicros)/1e6, float64(c.completed)),
		},
	}
	turns := make([]float64, len(sample))
	cost := make([]float64, len(sample))
	for i, en := range sample {
		turns[i], cost[i] = float64(en.turns), float64(en.costMicros)/1e6
	}
	out.Turns = distribution(turns, ratio(float64(c.turns), float64(c.idle)))
	out.CostUSD = distribution(cost, ratio(float64(c.costMicros)/1e6, float64(c.idle)))
	return out
}

// distribution returns mean and the percentiles of vals (sorted here).
func distribution(vals []float64, mean float64) Distribution {
	if len(vals) == 0 {
		return Distribution{Mean: mean}
	}
	slices.Sort(vals)
	return Distribution{Mean: mean, P50: linearQuantile(vals, 0.5), P95: linearQuantile(vals, 0.95), P99: linearQuantile(vals, 0.99)}
}

// linearQuantile returns quantile q of sorted, interpolated linearly
// between the closest ranks (numpy's default, "linear").
func linearQuantile(sorted []float64, q float64) float64 {
	h := q * float64(len(sorted)-1)
	lo := int(math.Floor(h))
	if lo+1 >= len(sorted) {
		return sorted[len(sorted)-1]
	}
	return sorted[lo] + (h-float64(lo))*(sorted[lo+1]-sorted[lo])
}
