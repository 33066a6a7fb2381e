package stats

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
	"unsafe"
)

// TestLayout walks every bucket: the buckets tile [0, 2^42) ns without gap
// or overlap, in value order, each narrower than 2^−10 of its lower bound
// (one value each under 2 µs), and bucketOf puts both ends of each in it.
func TestLayout(t *testing.T) {
	if nBuckets != (topOctave-subBits+2)*subCount || nBuckets > math.MaxUint16+1 || nPages*pageSize != nBuckets {
		t.Fatalf("nBuckets %d, nPages %d", nBuckets, nPages)
	}
	if relativeError < 1.0/subCount {
		t.Fatalf("reported bound %g is under the layout's 2^−%d", relativeError, subBits)
	}
	next := int64(0)
	for i := range nBuckets {
		lo, hi := bucketRange(i)
		if lo != next || hi < lo {
			t.Fatalf("bucket %d is [%d, %d]; the previous one ended at %d", i, lo, hi, next-1)
		}
		next = hi + 1
		if i < exactBelow && hi != lo {
			t.Fatalf("bucket %d under 2048 ns holds [%d, %d]", i, lo, hi)
		}
		if w := float64(hi - lo + 1); i >= exactBelow && w/float64(lo) > 1.0/subCount {
			t.Fatalf("bucket %d [%d, %d] is %g of its lower bound wide", i, lo, hi, w/float64(lo))
		}
		if bucketOf(time.Duration(lo)) != i || bucketOf(time.Duration(hi)) != i {
			t.Fatalf("bucket %d [%d, %d]: bucketOf gives %d and %d", i, lo, hi, bucketOf(time.Duration(lo)), bucketOf(time.Duration(hi)))
		}
	}
	if next != sketchMax {
		t.Fatalf("the layout ends at %d, want 2^42", next)
	}
	for _, d := range []time.Duration{sketchMax, 100 * time.Hour, math.MaxInt64} {
		if bucketOf(d) != nBuckets-1 {
			t.Errorf("bucketOf(%v) = %d, want the last bucket", d, bucketOf(d))
		}
	}
	for _, d := range []time.Duration{0, -1, -time.Second, math.MinInt64} {
		if bucketOf(d) != 0 {
			t.Errorf("bucketOf(%v) = %d, want 0", d, bucketOf(d))
		}
	}
}

// TestBucketOfMonotone checks the property the quantile walk relies on:
// a larger value never lands in a lower bucket.
func TestBucketOfMonotone(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	vals := make([]time.Duration, 200000)
	for i := range vals {
		vals[i] = time.Duration(math.Exp(r.Float64() * math.Log(float64(2*time.Hour))))
	}
	slices.Sort(vals)
	for i := 1; i < len(vals); i++ {
		if bucketOf(vals[i]) < bucketOf(vals[i-1]) {
			t.Fatalf("bucketOf(%d) = %d < bucketOf(%d) = %d", vals[i], bucketOf(vals[i]), vals[i-1], bucketOf(vals[i-1]))
		}
	}
}

// distributions are latency shapes seen in LLM serving, in nanoseconds.
var distributions = []struct {
	name string
	gen  func(r *rand.Rand) time.Duration
}{
	{"uniform 1ms-1s", func(r *rand.Rand) time.Duration {
		return time.Millisecond + time.Duration(r.Int64N(int64(time.Second-time.Millisecond)))
	}},
	{"lognormal median 200ms", func(r *rand.Rand) time.Duration {
		return time.Duration(float64(200*time.Millisecond) * math.Exp(r.NormFloat64()))
	}},
	{"exponential mean 20ms", func(r *rand.Rand) time.Duration {
		return time.Duration(r.ExpFloat64() * float64(20*time.Millisecond))
	}},
	{"bimodal 5ms and 2s", func(r *rand.Rand) time.Duration {
		if r.IntN(10) < 8 {
			return time.Duration(float64(5*time.Millisecond) * (1 + 0.1*r.NormFloat64()))
		}
		return time.Duration(float64(2*time.Second) * (1 + 0.2*r.NormFloat64()))
	}},
	{"pareto tail from 10µs", func(r *rand.Rand) time.Duration {
		return time.Duration(float64(10*time.Microsecond) / math.Pow(1-r.Float64(), 1/1.2))
	}},
	{"few distinct values", func(r *rand.Rand) time.Duration {
		return []time.Duration{time.Millisecond, 3 * time.Millisecond, 40 * time.Millisecond}[r.IntN(3)]
	}},
	{"sub-microsecond", func(r *rand.Rand) time.Duration { return time.Duration(r.IntN(3000)) }},
}

var testLevels = []float64{0, 0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1}

// TestSketchQuantiles compares the sketch with exact quantiles on 1e5
// points per distribution: every level within 0.1 %, and the summary
// exact.
func TestSketchQuantiles(t *testing.T) {
	for _, dist := range distributions {
		t.Run(dist.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(7, uint64(len(dist.name))))
			s := newSketch()
			vals := make([]time.Duration, 100000)
			var sum int64
			for i := range vals {
				v := max(dist.gen(r), 1)
				vals[i] = v
				sum += int64(v)
				s.Add(v)
			}
			got := checkQuantiles(t, s, vals, testLevels)
			slices.Sort(vals)
			if s.n != int64(len(vals)) || s.sum != sum || s.min != int64(vals[0]) || s.max != int64(vals[len(vals)-1]) {
				t.Fatalf("summary n=%d sum=%d min=%d max=%d, want %d %d %d %d",
					s.n, s.sum, s.min, s.max, len(vals), sum, vals[0], vals[len(vals)-1])
			}
			for i, q := range testLevels {
				if d := s.Quantile(q); math.Abs(float64(d)-got[i]) > 0.5 {
					t.Errorf("q=%g: Quantile %v disagrees with quantiles %.1f", q, d, got[i])
				}
				if i > 0 && got[i] < got[i-1] {
					t.Errorf("q=%g: %.1f under the level before, %.1f", q, got[i], got[i-1])
				}
			}
		})
	}
}

// TestQuantilesAnyOrder: levels out of order, or repeated, get the same
// answers as in order.
func TestQuantilesAnyOrder(t *testing.T) {
	vals := spreadTTFT.values(9, 5000)
	s := sketchOf(vals)
	want := make([]float64, len(testLevels))
	s.quantiles(want, testLevels)
	levels := slices.Clone(testLevels)
	slices.Reverse(levels)
	levels = append(levels, 0.5, 0.5, 0.99)
	got := make([]float64, len(levels))
	s.quantiles(got, levels)
	for i, q := range levels {
		j := slices.Index(testLevels, q)
		if got[i] != want[j] {
			t.Errorf("q=%g asked out of order: %g, in order %g", q, got[i], want[j])
		}
	}
}

// TestSketchOutOfRange: beyond 2^42 ns the answer is clamped to the exact
// min and max, so constant data comes back exactly.
func TestSketchOutOfRange(t *testing.T) {
	for _, v := range []time.Duration{0, 100 * time.Nanosecond, 2 * time.Hour, 1000 * time.Hour} {
		s := newSketch()
		for range 10 {
			s.Add(v)
		}
		for _, q := range []float64{0, 0.5, 0.99, 1} {
			if got := s.Quantile(q); got != v {
				t.Errorf("all %v: Quantile(%g) = %v", v, q, got)
			}
		}
	}
	s := newSketch()
	s.Add(100 * time.Nanosecond)
	s.Add(2 * time.Hour)
	if got := s.Quantile(0); got != 100*time.Nanosecond {
		t.Errorf("min of {100ns, 2h} reported as %v", got)
	}
	if got := s.Quantile(1); got != 2*time.Hour {
		t.Errorf("max of {100ns, 2h} reported as %v", got)
	}
	if got := newSketch().Quantile(0.5); got != 0 {
		t.Errorf("empty sketch: %v", got)
	}
	n := newSketch()
	n.Add(-time.Second)
	if n.min != 0 || n.Quantile(0.5) != 0 {
		t.Errorf("a negative value counts as %d, reported %v; want 0", n.min, n.Quantile(0.5))
	}
}

// TestSketchMerge: merged sketches, dense or compacted, equal one sketch of
// every point.
func TestSketchMerge(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	all := newSketch()
	parts := []*sketch{newSketch(), newSketch(), newSketch(), newSketch()}
	for i := range 100000 {
		v := distributions[i%len(distributions)].gen(r)
		all.Add(v)
		parts[r.IntN(len(parts))].Add(v)
	}
	dense, viaCompact := newSketch(), newSketch()
	var c compact
	for _, p := range parts {
		dense.Merge(p)
		c.fill(p)
		viaCompact.mergeCompact(&c)
	}
	for name, m := range map[string]*sketch{"dense": dense, "compact": viaCompact} {
		if !slices.Equal(bucketList(m), bucketList(all)) || m.summary != all.summary || m.lo != all.lo || m.hi != all.hi {
			t.Errorf("%s merge differs from adding every point", name)
		}
		a, b := make([]float64, len(testLevels)), make([]float64, len(testLevels))
		m.quantiles(a, testLevels)
		all.quantiles(b, testLevels)
		if !slices.Equal(a, b) {
			t.Errorf("%s merge quantiles %v, want %v", name, a, b)
		}
	}
}

// TestCompactLargeCounts: counts of any size come back whole from a
// compact, and merges saturate instead of wrapping.
func TestCompactLargeCounts(t *testing.T) {
	s := newSketch()
	s.addCount(7, 5_000_000)
	s.addCount(900, 1)
	s.addCount(nBuckets-1, math.MaxUint32)
	s.lo, s.hi = 7, nBuckets-1
	s.summary = summary{n: 5_000_001 + math.MaxUint32, sum: 1, min: 1, max: 1}
	var c compact
	c.fill(s)
	back := newSketch()
	back.mergeCompact(&c)
	if !slices.Equal(bucketList(back), []bucket{{7, 5_000_000}, {900, 1}, {nBuckets - 1, math.MaxUint32}}) {
		t.Errorf("round trip: %v", bucketList(back))
	}
	back.mergeCompact(&c)
	if got := bucketList(back); got[2].n != math.MaxUint32 || got[0].n != 10_000_000 {
		t.Errorf("merged twice: %v, want the last bucket saturated", got)
	}
	c.empty()
	if len(c.data) != 0 || c.n != 0 {
		t.Error("empty left data behind")
	}
}

func TestSketchReset(t *testing.T) {
	s := newSketch()
	s.Add(time.Millisecond)
	s.Add(time.Second)
	s.reset()
	if s.dir != ([nPages]uint16{}) || len(s.pages) != 0 || s.n != 0 || s.lo <= s.hi {
		t.Error("reset left state behind")
	}
	s.Add(2 * time.Millisecond)
	if got := bucketList(s); len(got) != 1 || got[0] != (bucket{bucketOf(2 * time.Millisecond), 1}) {
		t.Errorf("after reset: %v", got)
	}
}

// TestRecycleKeepsWhatTrafficNeeds: pages are kept for a slice like the
// last, and let go after a burst.
func TestRecycleKeepsWhatTrafficNeeds(t *testing.T) {
	s := newSketch()
	for _, v := range spreadITL.values(1, 10000) {
		s.Add(v)
	}
	burst := cap(s.pages)
	s.recycle()
	if cap(s.pages) != burst {
		t.Fatalf("a slice's pages (%d) were not kept for the next", burst)
	}
	s.Add(20 * time.Millisecond)
	s.recycle()
	if cap(s.pages) != 0 {
		t.Errorf("%d pages kept after a slice that used 1", cap(s.pages))
	}
}

// TestSketchBounded feeds hostile values: every kind of extreme, and a
// million distinct values over the whole int64 range. No sketch holds
// more than the layout's 33,792 buckets (at most 140 KB dense; compact, at
// most 8 bytes a bucket: 3 of run header, 5 of count), and the answers
// stay ordered and inside [min, max].
func TestSketchBounded(t *testing.T) {
	s := newSketch()
	for _, d := range []time.Duration{0, -1, math.MinInt64, math.MaxInt64, 1, sketchMax - 1, sketchMax} {
		s.Add(d)
	}
	r := rand.New(rand.NewPCG(41, 42))
	for range 1_000_000 {
		s.Add(time.Duration(r.Int64() >> r.IntN(63))) // every magnitude
		s.Add(time.Duration(r.Int64N(int64(time.Second))))
		s.Add(-time.Duration(r.Int64()))
	}
	nb := len(bucketList(s))
	if nb > nBuckets || len(s.pages) > nPages || cap(s.pages) > nPages {
		t.Fatalf("%d buckets, %d pages (cap %d): past the layout's %d and %d", nb, len(s.pages), cap(s.pages), nBuckets, nPages)
	}
	if maxDense := int(unsafe.Sizeof(sketch{}) + nPages*unsafe.Sizeof(page{})); s.bytes() > maxDense {
		t.Errorf("dense sketch holds %d bytes, bound %d", s.bytes(), maxDense)
	}
	var c compact
	c.fill(s)
	if maxCompact := nBuckets * 8; len(c.data) > maxCompact {
		t.Errorf("compact holds %d bytes, bound %d", len(c.data), maxCompact)
	}
	t.Logf("%d values in %d buckets: dense %d bytes, compact %d bytes", s.n, nb, s.bytes(), len(c.data))
	if s.min != 0 || s.max != math.MaxInt64 {
		t.Errorf("min %d max %d, want 0 and MaxInt64", s.min, s.max)
	}
	got := make([]float64, len(testLevels))
	s.quantiles(got, testLevels)
	for i := range got {
		if got[i] < 0 || got[i] > math.MaxInt64 || (i > 0 && got[i] < got[i-1]) {
			t.Errorf("quantiles %v: out of order or of [min, max]", got)
		}
	}
}

// TestAddAllocationFree: once its pages exist, a sketch records values,
// and merges, without allocating.
func TestAddAllocationFree(t *testing.T) {
	vals := spreadITL.values(5, 4096)
	s := sketchOf(vals)
	i := 0
	if n := testing.AllocsPerRun(10000, func() { s.Add(vals[i&4095]); i++ }); n != 0 {
		t.Errorf("Add: %g allocations", n)
	}
	var c compact
	c.fill(s)
	dst := sketchOf(vals)
	if n := testing.AllocsPerRun(100, func() { dst.mergeCompact(&c); dst.Merge(s) }); n != 0 {
		t.Errorf("merges: %g allocations", n)
	}
	q := make([]float64, 3)
	if n := testing.AllocsPerRun(100, func() { s.quantiles(q, quantileLevels) }); n != 0 {
		t.Errorf("quantiles: %g allocations", n)
	}
}

// TestCompactRoundTrip: runs of every length, across pages, with counts
// that jump both ways, come back from a compact bucket for bucket.
func TestCompactRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(51, 52))
	for range 200 {
		s := newSketch()
		for range r.IntN(50) {
			start, l := r.IntN(nBuckets), 1+r.IntN(300)
			for i := start; i < min(start+l, nBuckets); i++ {
				c := uint32(1 + r.IntN(3))
				if r.IntN(20) == 0 {
					c = uint32(r.Int64N(math.MaxUint32)) + 1
				}
				s.addCount(i, c)
				s.lo, s.hi = min(s.lo, i), max(s.hi, i)
			}
		}
		var c compact
		c.fill(s)
		back := newSketch()
		back.mergeCompact(&c)
		if !slices.Equal(bucketList(back), bucketList(s)) || back.lo != s.lo || back.hi != s.hi {
			t.Fatalf("round trip of %d buckets: %d back", len(bucketList(s)), len(bucketList(back)))
		}
	}
}

// TestCompactNeverRewritten: a copy of a compact taken before the next fill
// still decodes to what it held, which is what lets reports decode closed
// slices after releasing the group's lock.
func TestCompactNeverRewritten(t *testing.T) {
	a, b := sketchOf(spreadTTFT.values(1, 500)), sketchOf(spreadITL.values(2, 500))
	var c compact
	c.fill(a)
	kept := c
	c.fill(b)
	c.empty()
	back := newSketch()
	back.mergeCompact(&kept)
	if !slices.Equal(bucketList(back), bucketList(a)) || back.summary != a.summary {
		t.Error("a copy of a compact changed when the compact was filled again")
	}
}
