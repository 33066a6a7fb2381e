package stats

import (
	"cmp"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tollgate-llm/tollgate/llm"
)

// Report is the /stats document.
type Report struct {
	Generated time.Time  `json:"generated"`
	Sketch    SketchInfo `json:"sketch"`
	Windows   []Window   `json:"windows"`
	// Conversations are the figures of ended conversations and posted
	// outcomes, by team; window=, route= and model= do not narrow them
	// (a conversation spans routes and models), team= and merge=team do.
	Conversations []ConversationGroup `json:"conversations"`
	// Sessions are the figures of the ended conversations that were coding
	// agents' sessions (sessions.go), by team, narrowed as Conversations.
	Sessions []SessionGroup `json:"sessions"`
}

// SketchInfo names the quantile sketch and its error bound, so that a
// reader (gateway bench) knows how far a quantile may be from the exact one.
type SketchInfo struct {
	// Kind is "log-linear": each octave of nanoseconds in 1,024 equal
	// buckets, from 0 to 2^42 ns (73 min).
	Kind string `json:"kind"`
	// RelativeError is α = 0.001: each quantile is within α·v of the exact
	// one v (linear interpolation between the closest ranks, as numpy
	// computes it), for v under 73 min.
	RelativeError float64 `json:"relative_error"`
}

// Window holds the groups seen in one window ("1m", "5m" or "1h").
//
// Windows are made of whole slices (10 s for 1m and 5m, 1 min for 1h), the
// current one included, so Seconds is the span actually covered: between
// the nominal length less one slice and the nominal length, and less right
// after start, when it is the time since the Windows was created. Rates
// divide by Seconds.
type Window struct {
	Name    string  `json:"name"`
	Seconds float64 `json:"seconds"`
	Groups  []Group `json:"groups"`
}

// Group holds one route, model label and team's figures in a window. The
// team-less ITL groups have team "" and carry only ITL; requests without a
// team are under team "none", as in the metrics. A dimension merged away
// (merge=) reads "*".
type Group struct {
	Route string `json:"route"`
	Model string `json:"model"`
	Team  string `json:"team"`
	Figures
}

// Figures are the figures of the requests that ended in a span of time (a
// window, or one slice of a series).
type Figures struct {
	Requests int64            `json:"requests"`
	Outcomes map[string]int64 `json:"outcomes"` // every outcome, zeros included

	TTFT     Quantiles `json:"ttft"`
	TPOT     Quantiles `json:"tpot"`
	ITL      Quantiles `json:"itl"`
	E2E      Quantiles `json:"e2e"`
	Overhead Quantiles `json:"overhead"`

	// InputTokens and OutputTokens are the tokens of the requests that
	// ended in the span, as billed: as the upstream reported them, or
	// estimated (input from the prompt when the upstream reported none,
	// output counted from events). OutputTokensPerSecond divides the output tokens by
	// the span's seconds.
	InputTokens           int64   `json:"input_tokens"`
	OutputTokens          int64   `json:"output_tokens"`
	OutputTokensPerSecond float64 `json:"output_tokens_per_second"`
	// CostUSD is the spend priced by [[models]], as billed to the ledger.
	CostUSD float64 `json:"cost_usd"`
	// Rejections counts the requests the gateway refused (population
	// "refused") by reason: the limit ("rpm", "tpm", "concurrency",
	// "tokens_per_day", "cost_per_day", "cost_per_month"), the rule
	// ("model_not_allowed", "not_owner", ...), or what was wrong with the
	// request ("unauthorized", "bad_request", "not_found", "too_large",
	// ...). Only reasons seen are listed.
	Rejections map[string]int64 `json:"rejections"`
	// Populations counts the requests by population: "model_call",
	// "refused", "forward" (llm.Population). TTFT, TPOT, ITL, E2E and
	// goodput are over the model calls (and the forwards' routes their
	// own), never the refused.
	Populations map[string]int64 `json:"populations"`
	Goodput     Goodput          `json:"goodput"`
}

// Quantiles summarises one figure in milliseconds. Count, Mean and Max are
// exact; the percentiles, interpolated between the closest ranks as numpy
// does, are within the sketch's relative error. All are zero when Count
// is.
type Quantiles struct {
	Count int64   `json:"count"`
	Mean  float64 `json:"mean_ms"`
	P50   float64 `json:"p50_ms"`
	P95   float64 `json:"p95_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"`
}

// Goodput counts requests on the chat and messages routes: Good met every
// SLO, and Broken holds the others by the SLO they broke first ("ttft",
// "tpot", "e2e", or "failed" when the request did not succeed). Ratio is
// Good/Total, 0 when Total is.
type Goodput struct {
	Good   int64            `json:"good"`
	Total  int64            `json:"total"`
	Ratio  float64          `json:"ratio"`
	Broken map[string]int64 `json:"broken"`
}

// filter selects groups and windows; an empty field selects all. The merge
// fields merge groups across that dimension.
type filter struct {
	route, model, team, window string

	mergeRoute, mergeModel, mergeTeam bool
}

func (f *filter) keep(k groupKey) bool {
	return (f.route == "" || f.route == k.route.String()) &&
		(f.model == "" || f.model == k.model) &&
		// ITL is not split by team, so a team's view keeps its ITL groups.
		(f.team == "" || f.team == k.team || k.team == "")
}

// mergeAll is "*": a dimension merged away.
const mergeAll = "*"

// names returns the labels a group is reported under.
func (f *filter) names(k groupKey) (route, model, team string) {
	route, model, team = k.route.String(), k.model, k.team
	if f.mergeRoute {
		route = mergeAll
	}
	if f.mergeModel {
		model = mergeAll
	}
	if f.mergeTeam {
		team = mergeAll
	}
	return route, model, team
}

// set is the groups reported as one.
type set struct {
	route, model, team string
	groups             []*group
}

// Snapshot returns the figures of every window. It also drops the groups
// that saw nothing in the last hour.
func (w *Windows) Snapshot() Report { return w.snapshot(filter{}) }

// sets returns the live groups f keeps, in sets of groups reported as one,
// sorted by route, model and team; e is the elapsed time. It drops the
// groups that saw nothing in the last hour.
func (w *Windows) sets(f *filter, e int64) []set {
	w.mu.RLock()
	groups := make([]*group, 0, len(w.groups))
	for _, g := range w.groups {
		groups = append(groups, g)
	}
	w.mu.RUnlock()

	var live, stale []*group
	for _, g := range groups {
		g.mu.Lock()
		if g.stale(e) {
			stale = append(stale, g)
		} else if f.keep(g.key) {
			live = append(live, g)
		}
		g.mu.Unlock()
	}
	if len(stale) > 0 {
		w.mu.Lock()
		for _, g := range stale {
			// Writers hold the read lock while writing, so none is
			// midway; one may have revived the group since.
			g.mu.Lock()
			if g.stale(e) && w.groups[g.key] == g {
				delete(w.groups, g.key)
			}
			g.mu.Unlock()
		}
		w.mu.Unlock()
	}

	byName := make(map[[3]string]int, len(live))
	var out []set
	for _, g := range live {
		r, m, t := f.names(g.key)
		name := [3]string{r, m, t}
		i, ok := byName[name]
		if !ok {
			i = len(out)
			byName[name] = i
			out = append(out, set{route: r, model: m, team: t})
		}
		out[i].groups = append(out[i].groups, g)
	}
	for i := range out {
		// A fixed order, so that a report's merge order is repeatable.
		slices.SortFunc(out[i].groups, func(a, b *group) int { return compareKeys(a.key, b.key) })
	}
	slices.SortFunc(out, func(a, b set) int {
		return cmp.Or(cmp.Compare(a.route, b.route), cmp.Compare(a.model, b.model), cmp.Compare(a.team, b.team))
	})
	return out
}

func compareKeys(a, b groupKey) int {
	return cmp.Or(cmp.Compare(a.route.String(), b.route.String()),
		cmp.Compare(a.model, b.model), cmp.Compare(a.team, b.team))
}

func (w *Windows) snapshot(f filter) Report {
	t := w.now()
	rep := Report{
		Generated: t,
		Sketch:    SketchInfo{Kind: sketchKind, RelativeError: relativeError},
	}
	e := w.elapsed(t)

	var specs []windowSpec
	for _, spec := range windowSpecs {
		if f.window == "" || f.window == spec.name {
			specs = append(specs, spec)
			rep.Windows = append(rep.Windows, Window{Name: spec.name, Seconds: covered(spec, e), Groups: []Group{}})
		}
	}
	rep.Conversations = w.conversations(&f, e)
	rep.Sessions = w.sessions(&f, e)
	sc := getScratch()
	defer putScratch(sc)
	for _, st := range w.sets(&f, e) {
		for i, spec := range specs {
			win := &rep.Windows[i]
			s := floorDiv(e, int64(spec.width))
			if out, ok := st.sum(spec.ring, s-spec.slices+1, s, win.Seconds, sc); ok {
				win.Groups = append(win.Groups, Group{Route: st.route, Model: st.model, Team: st.team, Figures: out})
			}
		}
	}
	return rep
}

// covered returns the seconds the window spans at elapsed time e: from the
// start of its oldest slice, or from start if later, to now.
func covered(spec windowSpec, e int64) float64 {
	width := int64(spec.width)
	from := max((floorDiv(e, width)-spec.slices+1)*width, 0)
	return float64(max(e-from, 0)) / float64(time.Second)
}

// afterGroupHook, when set (tests), runs in sum after each group is read
// and unlocked.
var afterGroupHook func(*group)

// scratch holds one dense sketch per figure, reused across sums, and the
// closed slices read under a group's lock, to be merged into them once it
// is released (a compact is never written after fill, so a copy of one
// stays whole).
type scratch struct {
	figs    [nFigures]*sketch
	pending [nFigures][]compact
}

func newScratch() *scratch {
	var sc scratch
	for f := range sc.figs {
		sc.figs[f] = newSketch()
	}
	return &sc
}

// addCompact notes closed slice cp of figure f, for flush.
func (sc *scratch) addCompact(f int, cp *compact) { sc.pending[f] = append(sc.pending[f], *cp) }

// flush merges the noted closed slices.
func (sc *scratch) flush() {
	for f, p := range sc.pending {
		for i := range p {
			sc.figs[f].mergeCompact(&p[i])
		}
		clear(p)
		sc.pending[f] = p[:0]
	}
}

// reset empties sc.
func (sc *scratch) reset() {
	for f, s := range sc.figs {
		s.reset()
		clear(sc.pending[f])
		sc.pending[f] = sc.pending[f][:0]
	}
}

// scratchPool holds empty scratch, for reports and for closing a group's
// 1 min slice (a merge of its 10 s slices).
var scratchPool = sync.Pool{New: func() any { return newScratch() }}

func getScratch() *scratch { return scratchPool.Get().(*scratch) }

// putScratch empties sc and returns it to the pool.
func putScratch(sc *scratch) {
	sc.reset()
	scratchPool.Put(sc)
}

// sum merges the slices numbered lo to hi of ring ri of the set's groups,
// which span seconds; ok is false when they hold nothing. sc is scratch
// space. Each group is locked only while its own slices are read: its
// counters and current slice merged, its closed slices copied, and merged
// after it is unlocked. So a writer waits for one group's current slice at
// most, however many slices and groups a report spans.
func (st *set) sum(ri int, lo, hi int64, seconds float64, sc *scratch) (out Figures, ok bool) {
	var c counters
	sc.reset()
	for _, g := range st.groups {
		g.mu.Lock()
		r := &g.rings[ri]
		for k := max(lo, hi-int64(len(r.slots))); k <= hi; k++ {
			g.mergeSlice(ri, k, &c, sc)
		}
		g.mu.Unlock()
		sc.flush()
		if afterGroupHook != nil {
			afterGroupHook(g)
		}
	}

	var qs [nFigures]Quantiles
	for f := range nFigures {
		qs[f] = quantilesOf(sc.figs[f])
		ok = ok || qs[f].Count > 0
	}
	return figuresOf(&c, &qs, seconds), ok || c.requests > 0
}

// figuresOf reports the counters and quantiles of a span of seconds.
func figuresOf(c *counters, qs *[nFigures]Quantiles, seconds float64) Figures {
	out := Figures{
		Requests: c.requests,
		Outcomes: make(map[string]int64, nOutcomes),
		TTFT:     qs[figTTFT], TPOT: qs[figTPOT], ITL: qs[figITL], E2E: qs[figE2E], Overhead: qs[figOverhead],
		InputTokens:  c.inputTokens,
		OutputTokens: c.outputTokens,
		CostUSD:      float64(c.costMicros) / 1e6,
		Rejections:   map[string]int64{},
		Populations:  map[string]int64{},
		Goodput:      Goodput{Broken: make(map[string]int64, nSLOs-1)},
	}
	for p, n := range c.populations {
		if n > 0 {
			out.Populations[llm.Population(p).String()] = n
		}
	}
	if seconds > 0 {
		out.OutputTokensPerSecond = float64(c.outputTokens) / seconds
	}
	for o, n := range c.outcomes {
		out.Outcomes[llm.Outcome(o).String()] = n
	}
	for r, n := range c.rejections {
		if n > 0 {
			out.Rejections[llm.Rejection(r).String()] = n
		}
	}
	for s, n := range c.goodput {
		out.Goodput.Total += n
		if llm.SLO(s) == llm.SLOMet {
			out.Goodput.Good = n
		} else {
			out.Goodput.Broken[llm.SLO(s).String()] = n
		}
	}
	if out.Goodput.Total > 0 {
		out.Goodput.Ratio = float64(out.Goodput.Good) / float64(out.Goodput.Total)
	}
	return out
}

var quantileLevels = []float64{0.5, 0.95, 0.99}

// quantilesOf converts s to milliseconds.
func quantilesOf(s *sketch) Quantiles {
	if s.n == 0 {
		return Quantiles{}
	}
	var v [3]float64
	s.quantiles(v[:], quantileLevels)
	const ms = float64(time.Millisecond)
	return Quantiles{
		Count: s.n,
		Mean:  float64(s.sum) / float64(s.n) / ms,
		P50:   v[0] / ms, P95: v[1] / ms, P99: v[2] / ms,
		Max: float64(s.max) / ms,
	}
}

// SeriesReport is the /stats/series document: a window's figures slice by
// slice, for charts over time.
type SeriesReport struct {
	Generated time.Time  `json:"generated"`
	Sketch    SketchInfo `json:"sketch"`
	Window    string     `json:"window"`
	// SliceSeconds is the width of a slice: 10 for the 1m and 5m windows,
	// 60 for 1h.
	SliceSeconds float64  `json:"slice_seconds"`
	Series       []Series `json:"series"`
}

// Series is one group's points, oldest first: one per slice of the window,
// empty ones included, so that every series of a report has the same
// points.
type Series struct {
	Route  string  `json:"route"`
	Model  string  `json:"model"`
	Team   string  `json:"team"`
	Points []Point `json:"points"`
}

// Point holds the figures of the requests that ended in one slice, which
// starts at Start and spans Seconds (less than a slice for the current
// one).
type Point struct {
	Start   time.Time `json:"start"`
	Seconds float64   `json:"seconds"`
	Figures
}

// Series returns the window's figures slice by slice.
func (w *Windows) Series(window string) (SeriesReport, error) {
	return w.series(filter{window: window})
}

func (w *Windows) series(f filter) (SeriesReport, error) {
	i := slices.IndexFunc(windowSpecs[:], func(s windowSpec) bool { return s.name == f.window })
	if i < 0 {
		return SeriesReport{}, errBadWindow
	}
	spec := windowSpecs[i]
	t := w.now()
	e := w.elapsed(t)
	width := int64(spec.width)
	rep := SeriesReport{
		Generated: t, Sketch: SketchInfo{Kind: sketchKind, RelativeError: relativeError},
		Window: spec.name, SliceSeconds: spec.width.Seconds(), Series: []Series{},
	}
	cur := floorDiv(e, width)
	first := max(cur-spec.slices+1, 0)
	sc := getScratch()
	defer putScratch(sc)
	for _, st := range w.sets(&f, e) {
		out := Series{Route: st.route, Model: st.model, Team: st.team, Points: make([]Point, 0, cur-first+1)}
		for k := first; k <= cur; k++ {
			seconds := float64(min(e-k*width, width)) / float64(time.Second)
			figs, _ := st.sum(spec.ring, k, k, seconds, sc)
			out.Points = append(out.Points, Point{Start: w.start.Add(time.Duration(k * width)), Seconds: seconds, Figures: figs})
		}
		rep.Series = append(rep.Series, out)
	}
	return rep, nil
}

var errBadWindow = errors.New("stats: window must be 1m, 5m or 1h")

// parseFilter reads the query parameters of /stats and /stats/series.
func parseFilter(q url.Values) (filter, error) {
	f := filter{route: q.Get("route"), model: q.Get("model"), team: q.Get("team"), window: q.Get("window")}
	if f.window != "" && !slices.ContainsFunc(windowSpecs[:], func(s windowSpec) bool { return s.name == f.window }) {
		return f, errBadWindow
	}
	if m := q.Get("merge"); m != "" {
		for d := range strings.SplitSeq(m, ",") {
			switch strings.TrimSpace(d) {
			case "route":
				f.mergeRoute = true
			case "model":
				f.mergeModel = true
			case "team":
				f.mergeTeam = true
			default:
				return f, errors.New("stats: merge takes a comma-separated list of route, model and team")
			}
		}
	}
	return f, nil
}

// ServeHTTP serves the Report as JSON on GET /stats, and the SeriesReport
// on GET /stats/series (a path ending in "/series"). Query parameters
// narrow them: route=, model=, team= keep matching groups (team= also keeps
// the team-less ITL groups; of the three, only team= narrows the
// conversations); window= (1m, 5m or 1h) keeps one window (for
// series it picks the window, 5m by default); merge= (a comma-separated
// list of route, model, team) reports groups that differ only in those as
// one, with "*" for the merged labels — merge=team puts a route and model's
// ITL with its requests, merge=route,model,team gives the whole gateway.
func (w *Windows) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		rw.Header().Set("Allow", "GET, HEAD")
		http.Error(rw, "stats: method not allowed", http.StatusMethodNotAllowed)
		return
	}
	f, err := parseFilter(r.URL.Query())
	if err != nil {
		http.Error(rw, err.Error(), http.StatusBadRequest)
		return
	}
	var doc any
	if strings.HasSuffix(r.URL.Path, "/series") {
		if f.window == "" {
			f.window = "5m"
		}
		rep, err := w.series(f)
		if err != nil {
			http.Error(rw, err.Error(), http.StatusBadRequest)
			return
		}
		doc = rep
	} else {
		doc = w.snapshot(f)
	}
	rw.Header().Set("Content-Type", "application/json")
	rw.Header().Set("Cache-Control", "no-store")
	if r.Method == http.MethodHead {
		return
	}
	// A write error means the client went away; there is no one to tell.
	_ = json.NewEncoder(rw).Encode(doc)
}
