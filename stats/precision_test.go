package stats

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// The bound /stats promises for every quantile: 0.1 % of the exact value.
// It is written out here, not read from the sketch, so that a coarser
// sketch fails these tests instead of loosening them.
const wantRelError = 0.001

// exactQuantile is the q-quantile of sorted by linear interpolation between
// the closest ranks (numpy.percentile's default, which gateway bench
// computes for the client's side).
func exactQuantile(sorted []time.Duration, q float64) float64 {
	h := q * float64(len(sorted)-1)
	lo := int(math.Floor(h))
	hi := min(lo+1, len(sorted)-1)
	return float64(sorted[lo]) + (h-float64(lo))*float64(sorted[hi]-sorted[lo])
}

// checkQuantiles compares the sketch of vals with the exact quantiles of
// vals at levels, and returns the sketch's answers.
func checkQuantiles(t *testing.T, s *sketch, vals []time.Duration, levels []float64) []float64 {
	t.Helper()
	sorted := slices.Clone(vals)
	slices.Sort(sorted)
	got := make([]float64, len(levels))
	s.quantiles(got, levels)
	for i, q := range levels {
		exact := exactQuantile(sorted, q)
		if e := math.Abs(got[i] - exact); e > wantRelError*exact {
			t.Errorf("q=%g: sketch %.0f ns, exact %.0f ns: off by %.4f%% (bound %.1f%%)",
				q, got[i], exact, 100*e/exact, 100*wantRelError)
		}
	}
	return got
}

func sketchOf(vals []time.Duration) *sketch {
	s := newSketch()
	for _, v := range vals {
		s.Add(v)
	}
	return s
}

// uniform returns n values drawn uniformly from [lo, hi].
func uniform(r *rand.Rand, n int, lo, hi time.Duration) []time.Duration {
	v := make([]time.Duration, n)
	for i := range v {
		v[i] = lo + time.Duration(r.Int64N(int64(hi-lo)+1))
	}
	return v
}

// TestTightDistributions: values within 2 % of each other, as TTFT and E2E
// are under a steady load. P50, P95 and P99 must be told apart, each
// within 0.1 % of the exact quantile.
func TestTightDistributions(t *testing.T) {
	for _, c := range []struct {
		lo, hi time.Duration
		n      int
	}{
		{200 * time.Millisecond, 204 * time.Millisecond, 1000},
		{2180 * time.Millisecond, 2187 * time.Millisecond, 256}, // E2E at 256 streams
		{201 * time.Millisecond, 208 * time.Millisecond, 256},   // TTFT at 256 streams
		{20 * time.Millisecond, 20400 * time.Microsecond, 1000},
		{2 * time.Millisecond, 2040 * time.Microsecond, 1000},
		{20 * time.Second, 20400 * time.Millisecond, 1000},
		{100 * time.Microsecond, 102 * time.Microsecond, 1000},
	} {
		for seed := range uint64(5) {
			t.Run(fmt.Sprintf("%v-%v/n=%d/seed=%d", c.lo, c.hi, c.n, seed), func(t *testing.T) {
				vals := uniform(rand.New(rand.NewPCG(seed, 11)), c.n, c.lo, c.hi)
				got := checkQuantiles(t, sketchOf(vals), vals, quantileLevels)
				if !(got[0] < got[1] && got[1] < got[2]) {
					t.Errorf("P50 %.0f, P95 %.0f, P99 %.0f ns: not told apart", got[0], got[1], got[2])
				}
			})
		}
	}
}

// TestWideDistribution: log-uniform from 1 ms to 60 s, every level within
// the bound.
func TestWideDistribution(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for _, n := range []int{100, 10_000, 200_000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			vals := spread{"wide", time.Millisecond, time.Minute}.values(r.Uint64(), n)
			checkQuantiles(t, sketchOf(vals), vals, testLevels)
		})
	}
}

// TestSingleValues: one value, alone or repeated, comes back exactly at
// every level, whatever its size.
func TestSingleValues(t *testing.T) {
	for _, v := range []time.Duration{0, 1, 999, time.Microsecond, 1234567, 201750 * time.Microsecond,
		2181700 * time.Microsecond, time.Hour, 2 * time.Hour} {
		for _, n := range []int{1, 7} {
			s := newSketch()
			for range n {
				s.Add(v)
			}
			got := make([]float64, len(testLevels))
			s.quantiles(got, testLevels)
			for i, q := range testLevels {
				if got[i] != float64(v) {
					t.Errorf("%d × %v: quantile %g is %.1f ns", n, v, q, got[i])
				}
			}
		}
	}
}

// TestMergeIsUnion: the merge of two sketches, dense or through a closed
// slice, is the sketch of the union bucket for bucket, and its quantiles
// are within the bound of the union's exact ones.
func TestMergeIsUnion(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	for _, c := range []struct {
		name string
		a, b []time.Duration
	}{
		{"tight+tight", uniform(r, 700, 200*time.Millisecond, 204*time.Millisecond),
			uniform(r, 300, 202*time.Millisecond, 206*time.Millisecond)},
		{"tight+wide", uniform(r, 1000, 200*time.Millisecond, 204*time.Millisecond),
			spread{"wide", time.Millisecond, time.Minute}.values(33, 5000)},
		{"wide+wide", spreadTTFT.values(34, 20_000), spreadITL.values(35, 50_000)},
		{"one+empty", []time.Duration{150 * time.Millisecond}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			union := append(slices.Clone(c.a), c.b...)
			all := sketchOf(union)
			sa, sb := sketchOf(c.a), sketchOf(c.b)
			dense := sketchOf(nil)
			dense.Merge(sa)
			dense.Merge(sb)
			viaCompact := sketchOf(nil)
			var ca, cb compact
			ca.fill(sa)
			cb.fill(sb)
			viaCompact.mergeCompact(&ca)
			viaCompact.mergeCompact(&cb)
			want := bucketList(all)
			for name, m := range map[string]*sketch{"dense": dense, "compact": viaCompact} {
				if got := bucketList(m); !slices.Equal(got, want) {
					t.Errorf("%s merge: %d buckets, the union's sketch %d; first difference %v",
						name, len(got), len(want), firstBucketDiff(got, want))
				}
				if m.summary != all.summary {
					t.Errorf("%s merge: summary %+v, union %+v", name, m.summary, all.summary)
				}
				got := checkQuantiles(t, m, union, testLevels)
				direct := make([]float64, len(testLevels))
				all.quantiles(direct, testLevels)
				if !slices.Equal(got, direct) {
					t.Errorf("%s merge: quantiles %v, the union's sketch %v", name, got, direct)
				}
			}
		})
	}
}

// bucket is one non-empty bucket: its index and count.
type bucket struct {
	i int
	n uint32
}

func bucketList(s *sketch) []bucket {
	var out []bucket
	for i, n := range s.buckets() {
		out = append(out, bucket{i, n})
	}
	return out
}

func firstBucketDiff(a, b []bucket) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprintf("at %d: %v vs %v", i, a[i], b[i])
		}
	}
	return "one is a prefix of the other"
}
