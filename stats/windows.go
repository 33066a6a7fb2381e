// Package stats keeps recent request figures in memory and serves them as
// JSON on /stats: per route, model label and team, over the last minute, 5
// minutes and hour, the count, mean, P50/P95/P99 and max of TTFT, TPOT, ITL,
// E2E and gateway overhead, output tokens per second, goodput with the SLO
// each bad request broke first, and outcome counts. Per team, it also
// reports the conversations that ended (package conversation) and the
// outcomes applications posted for them, over the last hour and since the
// start (conversations.go).
//
// Quantiles come from a log-linear histogram (HdrHistogram's layout, see
// sketch.go): every octave of nanoseconds cut into 1,024 buckets, so that a
// bucket is at most 2^−10 of its value wide, from 0 to 2^42 ns (73 min). A
// quantile is interpolated between the closest ranks, as numpy (and so
// gateway bench, and vLLM) computes it, each rank's value estimated inside
// its bucket; the answer is within 0.1 % of the exact quantile (exact under
// 2 µs, and at the min and max). Sketches with the same layout merge by
// adding counts, which is how the time slices of a window and the groups
// of a merged report are combined; the merged answer is as exact as a
// single sketch over all the values.
//
// Which records feed which figure mirrors package metrics: TTFT only for
// streams whose first token reached the client, TPOT for streams with at
// least two output tokens, E2E when positive, overhead once the request was
// sent upstream, goodput for the chat and messages routes.
package stats

import (
	"net/http"
	"sync"
	"time"

	"github.com/tollgate-llm/tollgate/llm"
)

// figure indexes the sketched figures.
type figure int

const (
	figTTFT figure = iota
	figTPOT
	figITL
	figE2E
	figOverhead
	nFigures
)

const (
	nOutcomes = int(llm.OutcomeShutdown) + 1
	nSLOs     = int(llm.SLOFailed) + 1

	// sliceShort and sliceLong are the slice widths of the two rings: the
	// 1m and 5m windows are read from 30 slices of 10 s, the 1h window
	// from 60 slices of one minute.
	sliceShort = 10 * time.Second
	sliceLong  = time.Minute

	// maxGroups bounds the groups kept. Route, model label and team come
	// from closed sets, so this is a backstop: past it, new groups fold
	// into model "other" (and team "other").
	maxGroups = 1024

	// teamNone is the team of records without one, as in package metrics;
	// it keeps team "" free for the team-less ITL groups.
	teamNone   = "none"
	labelOther = "other"
)

// windowSpec describes one reported window.
type windowSpec struct {
	name   string
	ring   int           // index into group.rings
	width  time.Duration // that ring's slice width
	slices int64         // slices of that ring in the window, the current one included
}

// The windows span whole slices, so 6 slices of 10 s make the 1m window: a
// value leaves it between 50 and 60 s after it was added, never later.
var windowSpecs = [...]windowSpec{
	{"1m", 0, sliceShort, 6},
	{"5m", 0, sliceShort, 30},
	{"1h", 1, sliceLong, 60},
}

// counters are the exact counts of one slice.
type counters struct {
	requests     int64
	outcomes     [nOutcomes]int64
	goodput      [nSLOs]int64 // by llm.SLO; model calls only
	inputTokens  int64
	outputTokens int64
	costMicros   int64
	rejections   [llm.NumRejections]int64 // by llm.Rejection, for the refused
	// populations counts the requests by llm.Population.
	populations [llm.NumPopulations]int64
}

func (c *counters) merge(o *counters) {
	c.requests += o.requests
	for i, n := range o.outcomes {
		c.outcomes[i] += n
	}
	for i, n := range o.goodput {
		c.goodput[i] += n
	}
	c.inputTokens += o.inputTokens
	c.outputTokens += o.outputTokens
	c.costMicros += o.costMicros
	for i, n := range o.rejections {
		c.rejections[i] += n
	}
	for i, n := range o.populations {
		c.populations[i] += n
	}
}

// active is the slice being written. The 10 s ring's holds dense sketches,
// so that adding to it is O(1) and allocation-free; the 1 min ring's holds
// none: its current slice's sketches are the merge of the 10 s slices it
// spans (see group), which halves what a writer adds and what a group
// holds.
type active struct {
	stamp int64 // slice number: elapsed time since start / ring width
	counters
	figs [nFigures]*sketch // nil until the figure is seen in the slice
}

func (a *active) fig(f figure) *sketch {
	s := a.figs[f]
	if s == nil {
		s = newSketch()
		a.figs[f] = s
	}
	return s
}

// slot is a closed slice, its sketches compacted.
type slot struct {
	stamp int64 // slice number; noStamp when never written
	counters
	figs [nFigures]*compact // kept once allocated, to reuse its storage
}

const noStamp = -1 << 63

// ring is one group's slices of one width. Slot i holds the closed slice
// whose number is i modulo the ring's length; a slot is valid for a window
// only when its stamp falls in it, which is how old slices drop out without
// a goroutine.
type ring struct {
	width int64 // nanoseconds
	cur   active
	slots []slot
}

func newRing(width time.Duration, n int, stamp int64) ring {
	r := ring{width: int64(width), cur: active{stamp: stamp}, slots: make([]slot, n)}
	for i := range r.slots {
		r.slots[i].stamp = noStamp
	}
	return r
}

// close moves the current slice's counters into its slot, and returns the
// slot, its sketches still to be set.
func (r *ring) close() *slot {
	sl := &r.slots[mod(r.cur.stamp, int64(len(r.slots)))]
	sl.stamp = r.cur.stamp
	sl.counters = r.cur.counters
	r.cur.counters = counters{}
	return sl
}

// setFig makes s, when it holds values, figure f of sl; else it empties
// it.
func (sl *slot) setFig(f int, s *sketch) {
	c := sl.figs[f]
	if s != nil && s.n > 0 {
		if c == nil {
			c = &compact{}
			sl.figs[f] = c
		}
		c.fill(s)
	} else if c != nil {
		c.empty()
	}
}

// slot returns the closed slice numbered k, or nil when the ring does not
// hold it (never written, or overwritten by a later one).
func (r *ring) slot(k int64) *slot {
	sl := &r.slots[mod(k, int64(len(r.slots)))]
	if sl.stamp != k {
		return nil
	}
	return sl
}

// groupKey identifies a group. ITL groups have team "".
type groupKey struct {
	route llm.Route
	model string
	team  string
}

type group struct {
	key   groupKey
	mu    sync.Mutex
	rings [2]ring // sliceShort ×30, sliceLong ×60
}

// shortPerLong is the number of 10 s slices in a 1 min one; slice k of the
// long ring spans slices [k·shortPerLong, (k+1)·shortPerLong) of the short
// one, which keeps more than that many.
const shortPerLong = int64(sliceLong / sliceShort)

func newGroup(k groupKey, e int64) *group {
	g := &group{key: k}
	g.rings[0] = newRing(sliceShort, 30, floorDiv(e, int64(sliceShort)))
	g.rings[1] = newRing(sliceLong, 60, floorDiv(e, int64(sliceLong)))
	return g
}

// advance makes the slices at elapsed time e the current ones, closing the
// current ones into their slots: the short ring's first, then the long
// ring's, whose sketches are merged from the short slices it spans, all
// closed by then. A time at or before the current slices' (a clock that
// went back) keeps them, so stamps only grow, and the long ring's current
// slice is always the one that spans the short ring's. Called with g.mu
// held.
func (g *group) advance(e int64) {
	short, long := &g.rings[0], &g.rings[1]
	if sn := floorDiv(e, short.width); sn > short.cur.stamp {
		sl := short.close()
		for f, d := range short.cur.figs {
			sl.setFig(f, d)
			if d != nil && d.n == 0 {
				// Unused for a whole slice: let the dense sketch go (its
				// directory alone is 1 KB); the next value allocates it
				// again.
				short.cur.figs[f] = nil
			} else if d != nil {
				d.recycle()
			}
		}
		short.cur.stamp = sn
	}
	if sn := floorDiv(e, long.width); sn > long.cur.stamp {
		k := long.cur.stamp
		sl := long.close()
		sc := getScratch()
		g.mergeShort(k*shortPerLong, (k+1)*shortPerLong-1, sc)
		sc.flush()
		for f, s := range sc.figs {
			sl.setFig(f, s)
		}
		putScratch(sc)
		long.cur.stamp = sn
	}
}

// mergeShort merges into sc the sketches of the short ring's slices lo to
// hi (at most shortPerLong) that it holds: the current one at once, the
// closed ones at sc's next flush. A slot is found by its stamp,
// so slices closed long ago count as long as no later slice took their
// slot: when the long ring closes a minute after an idle spell, its short
// slices are all still there. Called with g.mu held.
func (g *group) mergeShort(lo, hi int64, sc *scratch) {
	r := &g.rings[0]
	for k := lo; k <= hi; k++ {
		if r.cur.stamp == k {
			for f, d := range r.cur.figs {
				if d != nil {
					sc.figs[f].Merge(d)
				}
			}
		} else if sl := r.slot(k); sl != nil {
			for f, cp := range sl.figs {
				if cp != nil {
					sc.addCompact(f, cp)
				}
			}
		}
	}
}

// mergeSlice merges slice k of ring ri into c and sc, if g holds it (its
// closed sketches at sc's next flush). Called with g.mu held.
func (g *group) mergeSlice(ri int, k int64, c *counters, sc *scratch) {
	r := &g.rings[ri]
	if r.cur.stamp == k {
		c.merge(&r.cur.counters)
		if ri == 0 {
			g.mergeShort(k, k, sc)
		} else {
			g.mergeShort(k*shortPerLong, (k+1)*shortPerLong-1, sc)
		}
	} else if sl := r.slot(k); sl != nil {
		c.merge(&sl.counters)
		for f, cp := range sl.figs {
			if cp != nil {
				sc.addCompact(f, cp)
			}
		}
	}
}

// stale reports whether every slice of g is older than the longest window
// at elapsed time e. Called with g.mu held.
func (g *group) stale(e int64) bool {
	r := &g.rings[windowSpecs[2].ring]
	return r.cur.stamp <= floorDiv(e, r.width)-windowSpecs[2].slices
}

// Windows keeps the figures of the last hour in time slices, per route,
// model label and team, and serves them on /stats. It is safe for
// concurrent use; create it with New.
//
// Memory: a group keeps, per figure it writes, one dense sketch for the
// current 10 s slice (a 1 KB directory and 272 bytes per page of 64
// buckets in use, so 7 KB for 20 TTFTs spread over 50 ms–5 s and 34–42 KB
// for a thousand ITL gaps over 1–200 ms; one idle for a whole slice is
// released) and its 90 closed slices as runs of buckets, one or two bytes
// per non-empty bucket. The 1 min ring's current slice is merged from the
// 10 s ones when read or closed, so it holds no dense sketch of its own.
// With an hour of traffic spread as above (BenchmarkGroupBytes), a request
// group (TTFT, TPOT, E2E, overhead) holds 166 KiB at 2 requests a second
// and 1.8 MiB at 128, an ITL group 495 KiB at 100 gaps a second and 795
// KiB at 12,800; with lognormal traffic (BenchmarkSnapshot50Groups) about
// 145 KiB a group. However it is fed, a sketch has at most the layout's
// 33,792 buckets: at most 140 KB dense and 8 bytes a bucket compact.
// Groups with nothing in the last hour are dropped by Snapshot.
type Windows struct {
	now   func() time.Time
	start time.Time

	// mu guards the map; each group guards its slices with its own mutex,
	// so that Snapshot holds up a writer for one group's summary at most,
	// not for the whole report. Writers hold mu's read lock while they
	// write to a group, so that Snapshot, holding the write lock, can
	// drop a stale group without losing a value written to it meanwhile.
	mu     sync.RWMutex
	groups map[groupKey]*group

	// convMu guards convs, the conversation figures by team (see
	// conversations.go). Conversations end far less often than requests,
	// so one lock for every team is enough.
	convMu sync.Mutex
	convs  map[string]*convTeam
}

var _ http.Handler = (*Windows)(nil)

// New returns empty windows reading time from now (time.Now when nil).
// Slices are aligned on the first reading of the clock, and elapsed time is
// measured with its monotonic reading when it has one.
func New(now func() time.Time) *Windows {
	if now == nil {
		now = time.Now
	}
	return &Windows{now: now, start: now(), groups: make(map[groupKey]*group), convs: make(map[string]*convTeam)}
}

// elapsed returns the nanoseconds from start to t.
func (w *Windows) elapsed(t time.Time) int64 { return int64(t.Sub(w.start)) }

// acquire returns k's group, created at elapsed time e if need be, locked
// and with w.mu read-locked; release unlocks both.
func (w *Windows) acquire(k groupKey, e int64) *group {
	for {
		w.mu.RLock()
		if g := w.groups[k]; g != nil {
			g.mu.Lock()
			return g
		}
		w.mu.RUnlock()

		w.mu.Lock()
		if w.groups[k] == nil {
			if len(w.groups) >= maxGroups && !isOverflow(k) {
				k.model = labelOther
				if k.team != "" {
					k.team = labelOther
				}
			}
			if w.groups[k] == nil {
				w.groups[k] = newGroup(k, e)
			}
		}
		w.mu.Unlock()
	}
}

func (w *Windows) release(g *group) {
	g.mu.Unlock()
	w.mu.RUnlock()
}

// isOverflow reports whether k is where groups past maxGroups fold.
func isOverflow(k groupKey) bool {
	return k.model == labelOther && (k.team == labelOther || k.team == "")
}

// Observe adds one finished exchange; model is its metrics label, bounded
// by package metrics (a name is its own label only once an upstream served
// it, else "other"), so callers' names add no groups. It does not allocate
// once the group's current slices exist and the sketch pages its values
// fall in are in use (they are kept from slice to slice while traffic lasts).
func (w *Windows) Observe(rec *llm.Record, model string) {
	var vals [nFigures]time.Duration
	var buckets [nFigures]int
	var has [nFigures]bool
	set := func(f figure, d time.Duration) {
		// The latency figures are over model calls and forwards (each
		// route its own group); a refusal's are the gateway's answer
		// time, counted apart (rejections), never in them.
		if rec.Population == llm.PopRefused {
			return
		}
		d = max(d, 0)
		vals[f], buckets[f], has[f] = d, bucketOf(d), true
	}
	if rec.Stream && !rec.Timing.FirstTokenOut.IsZero() {
		set(figTTFT, rec.TTFT())
	}
	if tpot, ok := rec.TPOT(); ok && rec.Stream {
		set(figTPOT, tpot)
	}
	if e2e := rec.E2E(); e2e > 0 {
		set(figE2E, e2e)
	}
	if !rec.Timing.UpSent.IsZero() {
		set(figOverhead, rec.Overhead())
	}
	var tokens, input int64
	if rec.Usage.HasOutput || rec.Estimated {
		tokens = rec.Usage.Output
	}
	if rec.Usage.HasInput {
		input = rec.Usage.Input
	}
	rej := -1
	if rec.Population == llm.PopRefused {
		rej = int(rec.Rejection)
		if rej == int(llm.RejectNone) || rej >= llm.NumRejections {
			rej = int(llm.RejectOther)
		}
	}
	team := rec.Team
	if team == "" {
		team = teamNone
	}
	e := w.elapsed(w.now())

	g := w.acquire(groupKey{route: rec.Route, model: model, team: team}, e)
	defer w.release(g)
	g.advance(e)
	for f, ok := range has {
		if ok {
			g.rings[0].cur.fig(figure(f)).addAt(buckets[f], vals[f])
		}
	}
	for i := range g.rings {
		c := &g.rings[i].cur.counters
		c.requests++
		if o := int(rec.Outcome); o < nOutcomes {
			c.outcomes[o]++
		}
		if int(rec.Goodput) < nSLOs { // not SLOExcluded: a model call
			c.goodput[rec.Goodput]++
		}
		if p := int(rec.Population); p < llm.NumPopulations {
			c.populations[p]++
		}
		c.outputTokens += tokens
		c.inputTokens += input
		c.costMicros += rec.CostMicros
		if rej >= 0 {
			c.rejections[rej]++
		}
	}
}

// ObserveITL adds one gap between token-bearing events. ITL is kept per
// route and model only, in groups whose team is "". Like Observe, it does
// not allocate in steady traffic.
func (w *Windows) ObserveITL(route llm.Route, model string, gap time.Duration) {
	w.ObserveITLs(route, model, []time.Duration{gap})
}

// ObserveITLs records several gaps of one route and model at once (the
// gaps of one read of a stream): one group lookup, one lock and one clock
// reading for all of them.
func (w *Windows) ObserveITLs(route llm.Route, model string, gaps []time.Duration) {
	if len(gaps) == 0 {
		return
	}
	e := w.elapsed(w.now())
	g := w.acquire(groupKey{route: route, model: model}, e)
	g.advance(e)
	fig := g.rings[0].cur.fig(figITL)
	for _, gap := range gaps {
		gap = max(gap, 0)
		fig.addAt(bucketOf(gap), gap)
	}
	w.release(g)
}

// floorDiv returns ⌊a/b⌋ for b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// mod returns a mod b in [0, b) for b > 0.
func mod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}
