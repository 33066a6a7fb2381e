package stats

import (
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// tolerance allows for the last-bit rounding of math.Log and math.Pow at a
// bucket's edge; it is far below anything a reader could see.
const tolerance = relativeError * (1 + 1e-9)

func TestLayout(t *testing.T) {
	hi := int(math.Ceil(math.Log(float64(sketchMax)) / math.Log(gamma)))
	if got := hi - firstIndex + 1; got != nBuckets {
		t.Fatalf("layout needs %d buckets, nBuckets is %d", got, nBuckets)
	}
	if bucketOf(0) != 0 || bucketOf(sketchMin) != 0 || bucketOf(-time.Second) != 0 {
		t.Error("values at or under 1µs must fall in bucket 0")
	}
	if bucketOf(sketchMax) != nBuckets-1 || bucketOf(100*time.Hour) != nBuckets-1 {
		t.Error("values at or over 1h must fall in the last bucket")
	}
	for i := range nBuckets {
		// Bucket i holds (γ^(k−1), γ^k]; its representative must be
		// within α of both ends.
		k := float64(i + firstIndex)
		lo, up := math.Pow(gamma, k-1), math.Pow(gamma, k)
		if e := (reps[i] - lo) / lo; e > tolerance || e < 0 {
			t.Fatalf("bucket %d: representative %g is %g above its lower bound %g", i, reps[i], e, lo)
		}
		if e := (up - reps[i]) / up; e > tolerance || e < 0 {
			t.Fatalf("bucket %d: representative %g is %g below its upper bound %g", i, reps[i], e, up)
		}
		if i > 0 && i < nBuckets-1 {
			// Values just inside each end land in the bucket.
			if b := bucketOf(time.Duration(math.Ceil(lo * (1 + 1e-6)))); b != i {
				t.Fatalf("just above bucket %d's lower bound: bucket %d", i, b)
			}
			if b := bucketOf(time.Duration(math.Floor(up * (1 - 1e-6)))); b != i {
				t.Fatalf("just under bucket %d's upper bound: bucket %d", i, b)
			}
		}
	}
}

// TestBucketOfMatchesBounds: the table lookup agrees with a binary search
// of the bucket bounds at every bound, at every cell edge and on random
// values.
func TestBucketOfMatchesBounds(t *testing.T) {
	if got := bits.Len64(uint64(bounds[0]+1)) - 1; got != firstOctave {
		t.Errorf("firstOctave is %d, bounds[0]+1 has top bit %d", firstOctave, got)
	}
	if got := bits.Len64(uint64(bounds[nBuckets-2])) - 1; got != lastOctave {
		t.Errorf("lastOctave is %d, bounds[nBuckets-2] has top bit %d", lastOctave, got)
	}
	check := func(v int64) {
		t.Helper()
		if got, want := bucketOf(time.Duration(v)), searchBounds(v); got != want {
			t.Fatalf("bucketOf(%d) = %d, bounds say %d", v, got, want)
		}
	}
	for _, b := range bounds {
		check(b - 1)
		check(b)
		check(b + 1)
	}
	for i := range len(cells) {
		octave, m := firstOctave+i>>cellBits, int64(i&(1<<cellBits-1))
		lo := (1<<cellBits | m) << (octave - cellBits)
		check(lo)
		check(lo - 1)
	}
	r := rand.New(rand.NewPCG(8, 9))
	for range 1_000_000 {
		check(int64(math.Exp(r.Float64() * math.Log(float64(2*time.Hour)))))
	}
	if searchBounds(math.MaxInt64) != nBuckets-1 || bucketOf(math.MaxInt64) != nBuckets-1 {
		t.Error("huge values must land in the last bucket")
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
}

var testLevels = []float64{0, 0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1}

// inRange clamps like the sketch's layout does, for computing the bound:
// the α guarantee holds for values in [1µs, 1h].
func inRange(v time.Duration) bool { return v >= sketchMin && v <= sketchMax }

// TestSketchQuantiles compares the sketch with exact quantiles on 1e5
// points per distribution.
//
// By rank: the sketch answers for rank k = ⌊q(n−1)⌋ with the bucket where
// the cumulative count first exceeds k. Because bucketOf is non-decreasing,
// the k-th smallest value is in exactly that bucket, so the answer is within
// α of sorted[k]; the only slack is last-bit rounding at a bucket's edge,
// which tolerance covers. A value equal to a bucket edge could be put in
// either neighbouring bucket by that rounding, and either representative is
// still within α(1+ε) of it.
//
// Interpolated (numpy, vLLM): the exact value lies between sorted[⌊h⌋] and
// sorted[⌈h⌉], h = q(n−1); the answer must lie within α of that interval.
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
			slices.Sort(vals)
			if s.n != int64(len(vals)) || s.sum != sum || s.min != int64(vals[0]) || s.max != int64(vals[len(vals)-1]) {
				t.Fatalf("summary n=%d sum=%d min=%d max=%d, want %d %d %d %d",
					s.n, s.sum, s.min, s.max, len(vals), sum, vals[0], vals[len(vals)-1])
			}
			got := make([]float64, len(testLevels))
			s.quantiles(got, testLevels)
			for i, q := range testLevels {
				h := q * float64(len(vals)-1)
				exact := vals[int(math.Floor(h))]
				if inRange(exact) {
					if e := math.Abs(got[i]-float64(exact)) / float64(exact); e > tolerance {
						t.Errorf("q=%g: got %.0fns, value at rank is %dns: relative error %.5f > %g", q, got[i], exact, e, relativeError)
					}
				}
				lo, hi := float64(vals[int(math.Floor(h))]), float64(vals[int(math.Ceil(h))])
				if inRange(vals[int(math.Floor(h))]) && inRange(vals[int(math.Ceil(h))]) && got[i] < lo*(1-tolerance) || got[i] > hi*(1+tolerance) {
					t.Errorf("q=%g: got %.0fns outside [%g, %g] ± α", q, got[i], lo, hi)
				}
				if d := s.Quantile(q); math.Abs(float64(d)-got[i]) > 0.5 {
					t.Errorf("q=%g: Quantile %v disagrees with quantiles %.1f", q, d, got[i])
				}
			}
		})
	}
}

// TestSketchOutOfRange: outside [1µs, 1h] the answer is clamped to the
// exact min and max, so constant data comes back exactly.
func TestSketchOutOfRange(t *testing.T) {
	for _, v := range []time.Duration{0, 100 * time.Nanosecond, 2 * time.Hour} {
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
		if m.counts != all.counts || m.summary != all.summary || m.lo != all.lo || m.hi != all.hi {
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

// TestCompactSplitsLargeCounts: a bucket count past the 21-bit entry field
// is split and comes back whole.
func TestCompactSplitsLargeCounts(t *testing.T) {
	s := newSketch()
	s.addCount(7, 5_000_000)
	s.addCount(900, 1)
	s.lo, s.hi = 7, 900
	s.summary = summary{n: 5_000_001, sum: 1, min: 1, max: 1}
	var c compact
	c.fill(s)
	if len(c.entries) != 4 {
		t.Errorf("%d entries for counts 5e6 and 1, want 3+1", len(c.entries))
	}
	back := newSketch()
	back.mergeCompact(&c)
	if back.counts != s.counts {
		t.Errorf("round trip lost counts: bucket 7 = %d, 900 = %d", back.counts[7], back.counts[900])
	}
	c.empty()
	if len(c.entries) != 0 || c.n != 0 {
		t.Error("empty left entries behind")
	}
}

func TestSketchReset(t *testing.T) {
	s := newSketch()
	s.Add(time.Millisecond)
	s.Add(time.Second)
	s.reset()
	if s.counts != ([nBuckets]uint32{}) || s.n != 0 || s.lo <= s.hi {
		t.Error("reset left state behind")
	}
}
