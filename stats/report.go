package stats

import (
	"cmp"
	"encoding/json"
	"net/http"
	"slices"
	"time"

	"github.com/tollgate-llm/tollgate/llm"
)

// Report is the /stats document.
type Report struct {
	Generated time.Time  `json:"generated"`
	Sketch    SketchInfo `json:"sketch"`
	Windows   []Window   `json:"windows"`
}

// SketchInfo names the quantile sketch and its error bound, so that a
// reader (gateway bench) knows how far a quantile may be from the exact one.
type SketchInfo struct {
	// Kind is "ddsketch": log buckets at powers of (1+α)/(1−α) from 1 µs to
	// 1 h.
	Kind string `json:"kind"`
	// RelativeError is α: each quantile is within α·v of the value v at
	// its rank, for v between 1 µs and 1 h.
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
// team are under team "none", as in the metrics.
type Group struct {
	Route    string           `json:"route"`
	Model    string           `json:"model"`
	Team     string           `json:"team"`
	Requests int64            `json:"requests"`
	Outcomes map[string]int64 `json:"outcomes"` // every outcome, zeros included

	TTFT     Quantiles `json:"ttft"`
	TPOT     Quantiles `json:"tpot"`
	ITL      Quantiles `json:"itl"`
	E2E      Quantiles `json:"e2e"`
	Overhead Quantiles `json:"overhead"`

	// OutputTokensPerSecond is the output tokens of the requests that
	// ended in the window, over the window's Seconds.
	OutputTokensPerSecond float64 `json:"output_tokens_per_second"`
	Goodput               Goodput `json:"goodput"`
}

// Quantiles summarises one figure in milliseconds. Count, Mean and Max are
// exact; the percentiles are within the sketch's relative error. All are
// zero when Count is.
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

// filter selects groups and windows; an empty field selects all.
type filter struct {
	route, model, team, window string
}

func (f *filter) keep(k groupKey) bool {
	return (f.route == "" || f.route == k.route.String()) &&
		(f.model == "" || f.model == k.model) &&
		// ITL is not split by team, so a team's view keeps its ITL groups.
		(f.team == "" || f.team == k.team || k.team == "")
}

// Snapshot returns the figures of every window. It also drops the groups
// that saw nothing in the last hour.
func (w *Windows) Snapshot() Report { return w.snapshot(filter{}) }

func (w *Windows) snapshot(f filter) Report {
	t := w.now()
	rep := Report{
		Generated: t,
		Sketch:    SketchInfo{Kind: sketchKind, RelativeError: relativeError},
	}

	e := w.elapsed(t)

	w.mu.RLock()
	groups := make([]*group, 0, len(w.groups))
	for _, g := range w.groups {
		groups = append(groups, g)
	}
	w.mu.RUnlock()
	slices.SortFunc(groups, func(a, b *group) int {
		return cmp.Or(cmp.Compare(a.key.route.String(), b.key.route.String()),
			cmp.Compare(a.key.model, b.key.model), cmp.Compare(a.key.team, b.key.team))
	})

	var specs []windowSpec
	for _, spec := range windowSpecs {
		if f.window == "" || f.window == spec.name {
			specs = append(specs, spec)
			rep.Windows = append(rep.Windows, Window{Name: spec.name, Seconds: covered(spec, e), Groups: []Group{}})
		}
	}
	sc := newSketch()
	var stale []*group
	for _, g := range groups {
		g.mu.Lock()
		if g.stale(e) {
			stale = append(stale, g)
		} else if f.keep(g.key) {
			for i, spec := range specs {
				win := &rep.Windows[i]
				if out, ok := g.summarize(spec, e, win.Seconds, sc); ok {
					win.Groups = append(win.Groups, out)
				}
			}
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
	return rep
}

// covered returns the seconds the window spans at elapsed time e: from the
// start of its oldest slice, or from start if later, to now.
func covered(spec windowSpec, e int64) float64 {
	width := int64(spec.width)
	from := max((floorDiv(e, width)-spec.slices+1)*width, 0)
	return float64(max(e-from, 0)) / float64(time.Second)
}

// summarize merges the group's slices in the window, which spans seconds;
// ok is false when the window holds nothing of the group. sc is the scratch
// sketch.
func (g *group) summarize(spec windowSpec, e int64, seconds float64, sc *sketch) (out Group, ok bool) {
	r := &g.rings[spec.ring]
	s := floorDiv(e, r.width)
	in := func(stamp int64) bool { return stamp > s-spec.slices && stamp <= s }
	curIn := in(r.cur.stamp)

	var c counters
	if curIn {
		c.merge(&r.cur.counters)
	}
	for i := range r.slots {
		if in(r.slots[i].stamp) {
			c.merge(&r.slots[i].counters)
		}
	}

	var qs [nFigures]Quantiles
	for f := range nFigures {
		sc.reset()
		if d := r.cur.figs[f]; curIn && d != nil {
			sc.Merge(d)
		}
		for i := range r.slots {
			if sl := &r.slots[i]; in(sl.stamp) && sl.figs[f] != nil {
				sc.mergeCompact(sl.figs[f])
			}
		}
		qs[f] = quantilesOf(sc)
		ok = ok || qs[f].Count > 0
	}
	if !ok && c.requests == 0 {
		return Group{}, false
	}

	out = Group{
		Route: g.key.route.String(), Model: g.key.model, Team: g.key.team,
		Requests: c.requests,
		Outcomes: make(map[string]int64, nOutcomes),
		TTFT:     qs[figTTFT], TPOT: qs[figTPOT], ITL: qs[figITL], E2E: qs[figE2E], Overhead: qs[figOverhead],
		Goodput: Goodput{Broken: make(map[string]int64, nSLOs-1)},
	}
	if seconds > 0 {
		out.OutputTokensPerSecond = float64(c.outputTokens) / seconds
	}
	for o, n := range c.outcomes {
		out.Outcomes[llm.Outcome(o).String()] = n
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
	return out, true
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

// ServeHTTP serves the Report as JSON on GET. Query parameters narrow it:
// route=, model=, team= keep matching groups (team= also keeps the team-less
// ITL groups), window= (1m, 5m or 1h) keeps one window.
func (w *Windows) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		rw.Header().Set("Allow", "GET, HEAD")
		http.Error(rw, "stats: method not allowed", http.StatusMethodNotAllowed)
		return
	}
	q := r.URL.Query()
	f := filter{route: q.Get("route"), model: q.Get("model"), team: q.Get("team"), window: q.Get("window")}
	if f.window != "" && !slices.ContainsFunc(windowSpecs[:], func(s windowSpec) bool { return s.name == f.window }) {
		http.Error(rw, "stats: window must be 1m, 5m or 1h", http.StatusBadRequest)
		return
	}
	rep := w.snapshot(f)
	rw.Header().Set("Content-Type", "application/json")
	rw.Header().Set("Cache-Control", "no-store")
	if r.Method == http.MethodHead {
		return
	}
	// A write error means the client went away; there is no one to tell.
	_ = json.NewEncoder(rw).Encode(rep)
}
