package stats

import (
	"cmp"
	"slices"
	"time"

	"github.com/tollgate-llm/tollgate/conversation"
)

// A session is a conversation any of whose calls carried a coding agent's
// hints (conversation.IsSession). Besides being one of its team's
// conversations, an ended session is kept as such: its counts by minute,
// its figures for the percentiles (the team's last sessSample sessions
// that ended idle), and the costliest sessions of each minute, so that the
// last hour's costliest are exact.

const (
	// sessSample bounds the sessions a team keeps for percentiles, as
	// convSample does the conversations.
	sessSample = 1024
	// maxCostliest is how many of the costliest sessions a team keeps per
	// minute and since the start, and a report lists per team.
	maxCostliest = 10
)

// A session's figures, by index.
const (
	figCost          = iota // US dollars
	figCalls                // calls of every class
	figUserTurns            // distinct prompts
	figDuration             // wall time, in seconds
	figModelShare           // of its time (conversation.TimeSplit.Shares)
	figToolShare            // of its time
	figCompactions          // compacting calls
	figSubagentShare        // of its cost
	sessFigs
)

// sessFigures are a session's figures, by index.
type sessFigures [sessFigs]float64

// sessionFiguresOf is an ended session's figures, as package conversation
// defines them.
func sessionFiguresOf(c *conversation.Conversation) sessFigures {
	split := c.TimeSplit()
	model, tool, _ := split.Shares()
	var f sessFigures
	f[figCost] = float64(max(c.CostMicros, 0)) / 1e6
	f[figCalls] = float64(max(c.Turns, 0))
	f[figUserTurns] = float64(max(c.Breakdown.Prompts, 0))
	f[figDuration] = max(split.Wall, 0).Seconds()
	f[figModelShare] = model
	f[figToolShare] = tool
	f[figCompactions] = float64(c.Breakdown.CompactionCalls())
	f[figSubagentShare] = c.SubagentCostShare()
	return f
}

// sessCounters are the exact session counts of a span: ended (idle and
// evicted), evicted, and the sums of the figures of those that ended idle.
type sessCounters struct {
	ended, evicted, idle int64
	sums                 sessFigures
}

func (c *sessCounters) merge(o *sessCounters) {
	c.ended += o.ended
	c.evicted += o.evicted
	c.idle += o.idle
	for i := range c.sums {
		c.sums[i] += o.sums[i]
	}
}

// costly is one of the costliest sessions: its cost in micro-dollars (the
// order) and what a report shows of it.
type costly struct {
	costMicros int64
	CostlySession
}

// sessSlot is one minute's sessions; stamp is its slice number.
type sessSlot struct {
	stamp int64
	sessCounters
	top []costly
}

// sessEntry is one idle-ended session kept for percentiles.
type sessEntry struct {
	stamp int64
	figs  sessFigures
}

// sessTeam is one team's sessions, made when its first session ends: the
// counts and costliest sessions of the last hour by minute and since the
// start, and its last sessSample idle-ended sessions. At most about 75 KB
// of sample and 600 kept costliest sessions (of a few hundred bytes each,
// their ids included) when more than 10 end every minute.
type sessTeam struct {
	slots  [convSlices]sessSlot
	total  sessCounters
	top    []costly
	sample []sessEntry // a ring once full; next is the oldest
	next   int
}

func newSessTeam() *sessTeam {
	t := &sessTeam{}
	for i := range t.slots {
		t.slots[i].stamp = noStamp
	}
	return t
}

// add counts a session that ended in slice k (idle: with whole figures f,
// and its costliest-list entry cs).
func (t *sessTeam) add(k int64, idle bool, f *sessFigures, cs costly) {
	sl := &t.slots[mod(k, convSlices)]
	if sl.stamp != k {
		*sl = sessSlot{stamp: k, top: sl.top[:0]}
	}
	for _, c := range []*sessCounters{&sl.sessCounters, &t.total} {
		c.ended++
		if !idle {
			c.evicted++
			continue
		}
		c.idle++
		for i := range c.sums {
			c.sums[i] += f[i]
		}
	}
	if !idle {
		return
	}
	sl.top = keepCostliest(sl.top, cs)
	t.top = keepCostliest(t.top, cs)
	en := sessEntry{stamp: k, figs: *f}
	if len(t.sample) < sessSample {
		t.sample = append(t.sample, en)
		return
	}
	t.sample[t.next] = en
	t.next = (t.next + 1) % sessSample
}

// keepCostliest adds c to top (in costliestFirst order, at most
// maxCostliest) if it is among the costliest.
func keepCostliest(top []costly, c costly) []costly {
	i, _ := slices.BinarySearchFunc(top, c, costliestFirst)
	if i >= maxCostliest {
		return top
	}
	if len(top) < maxCostliest {
		top = append(top, costly{})
	}
	copy(top[i+1:], top[i:])
	top[i] = c
	return top
}

// costliestFirst orders sessions by cost, the costliest first; of equal
// cost, the one that ended first, then by key, so that a report's order
// does not depend on the order teams are merged in.
func costliestFirst(a, b costly) int {
	return cmp.Or(cmp.Compare(b.costMicros, a.costMicros), a.Ended.Compare(b.Ended), cmp.Compare(a.Key, b.Key))
}

// observeSession adds c, which ended in slice k of team record t, to the
// sessions when it is one. Called with w.convMu held.
func observeSession(t *convTeam, k int64, c *conversation.Conversation, idle bool, at time.Time) {
	if !c.IsSession() {
		return
	}
	if t.sess == nil {
		t.sess = newSessTeam()
	}
	var f sessFigures
	var cs costly
	if idle {
		f = sessionFiguresOf(c)
		cs = costly{costMicros: max(c.CostMicros, 0), CostlySession: CostlySession{Team: c.Team, Key: c.Key,
			KeyID: c.KeyID, User: c.User, CostUSD: f[figCost], Calls: c.Turns, UserTurns: c.Breakdown.Prompts,
			DurationSeconds: f[figDuration], Ended: at}}
		if cs.Team == "" {
			cs.Team = teamNone
		}
	}
	t.sess.add(k, idle, &f, cs)
}

// SessionGroup is one team's session figures: over the last hour (the 1h
// window's minute slices, whatever window= asks) and since the gateway
// started. Sessions without a team are under team "none"; merge=team
// reports every team as one, team "*".
type SessionGroup struct {
	Team       string         `json:"team"`
	LastHour   SessionFigures `json:"last_hour"`
	SinceStart SessionFigures `json:"since_start"`
}

// SessionFigures are the figures of the sessions that ended in a span of
// Seconds. Ended counts every ended session, Evicted those of them pushed
// out by [conversations] max_active, whose figures are partial. The
// distributions are over the sessions that ended idle (Ended − Evicted):
// their means exactly, their percentiles over the last Sampled of them
// (all, up to 1,024 a team). Costliest are the costliest of them, at most
// 10 (a team's, or with merge=team the gateway's), costliest first.
type SessionFigures struct {
	Seconds float64 `json:"seconds"`
	Ended   int64   `json:"ended"`
	Evicted int64   `json:"evicted"`
	Sampled int64   `json:"sampled"`
	// CostUSD, Calls (requests of every class), UserTurns (distinct
	// prompts) and DurationSeconds (wall time: first call's arrival to
	// last call's end) per session.
	CostUSD         Distribution `json:"cost_usd"`
	Calls           Distribution `json:"calls"`
	UserTurns       Distribution `json:"user_turns"`
	DurationSeconds Distribution `json:"duration_seconds"`
	// ModelShare and ToolShare are the shares of a session's time the
	// model (its calls' summed E2E) and the tools took, over its wall time
	// or, when they overlap past it, their sum.
	ModelShare Distribution `json:"model_share"`
	ToolShare  Distribution `json:"tool_share"`
	// Compactions are its compacting calls, SubagentCostShare the share of
	// its cost its subagents' calls took.
	Compactions       Distribution    `json:"compactions"`
	SubagentCostShare Distribution    `json:"subagent_cost_share"`
	Costliest         []CostlySession `json:"costliest"`
}

// CostlySession is one of the costliest sessions: its team, its
// conversation key (GET /admin/conversations takes the id, which the
// gateway never keeps), the key that ran it (its [[keys]] name or key id),
// the end user its calls named (hashed; "" for none), and its figures.
type CostlySession struct {
	Team            string    `json:"team"`
	Key             string    `json:"key"`
	KeyID           string    `json:"key_id"`
	User            string    `json:"user,omitempty"`
	CostUSD         float64   `json:"cost_usd"`
	Calls           int64     `json:"calls"`
	UserTurns       int64     `json:"user_turns"`
	DurationSeconds float64   `json:"duration_seconds"`
	Ended           time.Time `json:"ended"`
}

// sessSet is the teams reported as one: their counts, costliest and kept
// sessions, copied under w.convMu.
type sessSet struct {
	team                string
	hour, total         sessCounters
	hourTop, allTop     []costly
	hourSample, allSamp []sessEntry
}

// sessions returns the session figures f keeps at elapsed time e, sorted
// by team: f.team keeps one team, f.mergeTeam merges them all. Teams that
// never ended a session are left out.
func (w *Windows) sessions(f *filter, e int64) []SessionGroup {
	cur := floorDiv(e, int64(sliceLong))
	byTeam := map[string]*sessSet{}
	w.convMu.Lock()
	for team, ct := range w.convs {
		t := ct.sess
		if t == nil || (f.team != "" && f.team != team) {
			continue
		}
		name := team
		if f.mergeTeam {
			name = mergeAll
		}
		s := byTeam[name]
		if s == nil {
			s = &sessSet{team: name}
			byTeam[name] = s
		}
		s.total.merge(&t.total)
		for _, c := range t.top {
			s.allTop = keepCostliest(s.allTop, c)
		}
		for i := range t.slots {
			if sl := &t.slots[i]; inLastHour(sl.stamp, cur) {
				s.hour.merge(&sl.sessCounters)
				for _, c := range sl.top {
					s.hourTop = keepCostliest(s.hourTop, c)
				}
			}
		}
		for _, en := range t.sample {
			s.allSamp = append(s.allSamp, en)
			if inLastHour(en.stamp, cur) {
				s.hourSample = append(s.hourSample, en)
			}
		}
	}
	w.convMu.Unlock()

	out := make([]SessionGroup, 0, len(byTeam))
	for _, s := range byTeam {
		out = append(out, SessionGroup{Team: s.team,
			LastHour:   sessionFigures(&s.hour, s.hourSample, s.hourTop, covered(windowSpecs[2], e)),
			SinceStart: sessionFigures(&s.total, s.allSamp, s.allTop, float64(max(e, 0))/float64(time.Second)),
		})
	}
	slices.SortFunc(out, func(a, b SessionGroup) int { return cmp.Compare(a.Team, b.Team) })
	return out
}

func sessionFigures(c *sessCounters, sample []sessEntry, top []costly, seconds float64) SessionFigures {
	out := SessionFigures{Seconds: seconds, Ended: c.ended, Evicted: c.evicted, Sampled: int64(len(sample)),
		Costliest: make([]CostlySession, len(top))}
	for i := range top {
		out.Costliest[i] = top[i].CostlySession
	}
	vals := make([]float64, len(sample))
	dist := func(fig int) Distribution {
		for i := range sample {
			vals[i] = sample[i].figs[fig]
		}
		mean := 0.0
		if c.idle > 0 {
			mean = c.sums[fig] / float64(c.idle)
		}
		return distribution(vals, mean)
	}
	out.CostUSD = dist(figCost)
	out.Calls = dist(figCalls)
	out.UserTurns = dist(figUserTurns)
	out.DurationSeconds = dist(figDuration)
	out.ModelShare = dist(figModelShare)
	out.ToolShare = dist(figToolShare)
	out.Compactions = dist(figCompactions)
	out.SubagentCostShare = dist(figSubagentShare)
	return out
}
