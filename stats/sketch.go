package stats

import (
	"math"
	"math/bits"
	"time"
)

// The sketch is DDSketch's logarithmic layout (Masson, Rim, Lee, "DDSketch:
// a fast and fully-mergeable quantile sketch with relative-error
// guarantees", VLDB 2019) over a fixed range, so that every sketch has the
// same buckets and two sketches merge by adding counts. The bucket of log
// index k (array index k − firstIndex) holds the values v with
// γ^(k−1) < v ≤ γ^k (v in nanoseconds) and reports 2γ^k/(γ+1), which is
// within α of every value in the bucket.
const (
	// relativeError is α: a quantile is reported within α·v of the value v
	// at its rank, for v in [sketchMin, sketchMax].
	relativeError = 0.01
	// sketchMin and sketchMax bound the layout; smaller values share the
	// first bucket and larger ones the last (min and max stay exact, and
	// quantiles are clamped to them).
	sketchMin = time.Microsecond
	sketchMax = time.Hour
	// nBuckets is ceil(log_γ(1h)) − ceil(log_γ(1µs)) + 1 for
	// γ = 1.01/0.99; TestLayout recomputes it.
	nBuckets = 1101
	// sketchKind names the layout in reports.
	sketchKind = "ddsketch"
)

// gamma is (1+α)/(1−α), the ratio between consecutive bucket bounds.
var gamma = (1 + relativeError) / (1 - relativeError)

var (
	// firstIndex is the log_γ index of bucket 0.
	firstIndex = int(math.Ceil(math.Log(float64(sketchMin)) / math.Log(gamma)))
	// bounds holds each bucket's upper bound ⌊γ^k⌋ in nanoseconds: an
	// integer v is in bucket i when bounds[i−1] < v ≤ bounds[i], which for
	// integers is the same as γ^(k−1) < v ≤ γ^k.
	bounds = func() (b [nBuckets]int64) {
		for i := range b {
			b[i] = int64(math.Pow(gamma, float64(i+firstIndex)))
		}
		return b
	}()
	// reps holds each bucket's representative value in nanoseconds.
	reps = func() (r [nBuckets]float64) {
		for i := range r {
			r[i] = 2 * math.Pow(gamma, float64(i+firstIndex)) / (gamma + 1)
		}
		return r
	}()
)

// bucketOf avoids math.Log (a third of ObserveITL's time) with a table:
// values are split into cells by their top bit and the cellBits bits under
// it. A cell spans a ratio of at most 1+2⁻⁶ < γ, so it holds at most one
// bucket bound, and one comparison with it finishes the lookup. The answer
// is the same as a search of bounds (TestBucketOfMatchesBounds), and so
// non-decreasing in v.
const (
	cellBits = 6
	// firstOctave is the top bit of sketchMin and lastOctave that of
	// sketchMax.
	firstOctave = 9
	lastOctave  = 41
)

var cells = func() (c [(lastOctave - firstOctave + 1) << cellBits]uint16) {
	for i := range c {
		octave, m := firstOctave+i>>cellBits, int64(i&(1<<cellBits-1))
		lo := (1<<cellBits | m) << (octave - cellBits)
		c[i] = uint16(searchBounds(lo))
	}
	return c
}()

// searchBounds returns the bucket holding v by binary search of bounds.
func searchBounds(v int64) int {
	i, j := 0, nBuckets-1
	for i < j {
		h := int(uint(i+j) >> 1)
		if bounds[h] < v {
			i = h + 1
		} else {
			j = h
		}
	}
	return i
}

// bucketOf returns the bucket holding d.
func bucketOf(d time.Duration) int {
	v := int64(d)
	if v <= bounds[0] {
		return 0
	}
	if v > bounds[nBuckets-2] {
		return nBuckets - 1
	}
	octave := bits.Len64(uint64(v)) - 1
	c := (octave-firstOctave)<<cellBits | int(v>>(octave-cellBits))&(1<<cellBits-1)
	i := int(cells[c])
	if v > bounds[i] {
		i++
	}
	return i
}

// summary is the exact part of a sketch: count, sum, min and max in
// nanoseconds.
type summary struct {
	n, sum, min, max int64
}

func (s *summary) add(v int64) {
	if s.n == 0 || v < s.min {
		s.min = v
	}
	if s.n == 0 || v > s.max {
		s.max = v
	}
	s.n++
	s.sum += v
}

func (s *summary) merge(o *summary) {
	if o.n == 0 {
		return
	}
	if s.n == 0 || o.min < s.min {
		s.min = o.min
	}
	if s.n == 0 || o.max > s.max {
		s.max = o.max
	}
	s.n += o.n
	s.sum += o.sum
}

// sketch is a dense log-bucketed histogram (4,404 bytes of counts). It is
// used for the slice being written, where Add must be O(1) and must not
// allocate, and as the scratch that Snapshot merges slices into. Closed
// slices are kept as compact sketches.
type sketch struct {
	counts [nBuckets]uint32
	// lo and hi bound the buckets in use, so that reset, compaction and
	// quantiles only walk that range; lo > hi when empty.
	lo, hi int
	summary
}

func newSketch() *sketch {
	s := &sketch{}
	s.reset()
	return s
}

// Add records one value. It does not allocate.
func (s *sketch) Add(d time.Duration) { s.addAt(bucketOf(d), d) }

// addAt records d, whose bucket i the caller computed (once for several
// sketches, and outside any lock).
func (s *sketch) addAt(i int, d time.Duration) {
	s.counts[i]++
	s.lo = min(s.lo, i)
	s.hi = max(s.hi, i)
	s.summary.add(int64(d))
}

// reset empties s, clearing only the buckets in use.
func (s *sketch) reset() {
	if s.lo <= s.hi {
		clear(s.counts[s.lo : s.hi+1])
	}
	s.lo, s.hi = nBuckets, -1
	s.summary = summary{}
}

// addCount adds c to bucket i, saturating rather than wrapping (a bucket
// would need 2³² values of one group in one window to saturate). The
// caller widens lo and hi.
func (s *sketch) addCount(i int, c uint32) {
	if n := s.counts[i] + c; n >= c {
		s.counts[i] = n
	} else {
		s.counts[i] = math.MaxUint32
	}
}

// Merge adds o's values to s.
func (s *sketch) Merge(o *sketch) {
	if o.lo > o.hi {
		return
	}
	for i := o.lo; i <= o.hi; i++ {
		s.addCount(i, o.counts[i])
	}
	s.lo, s.hi = min(s.lo, o.lo), max(s.hi, o.hi)
	s.summary.merge(&o.summary)
}

// mergeCompact adds c's values to s.
func (s *sketch) mergeCompact(c *compact) {
	if len(c.entries) == 0 {
		return
	}
	for _, e := range c.entries {
		s.addCount(int(e>>countBits), e&countMask)
	}
	// Entries are in bucket order.
	s.lo = min(s.lo, int(c.entries[0]>>countBits))
	s.hi = max(s.hi, int(c.entries[len(c.entries)-1]>>countBits))
	s.summary.merge(&c.summary)
}

// Quantile returns the value at rank ⌊q·(n−1)⌋ (0-based, in ascending
// order) within the relative error α, or 0 when s is empty.
func (s *sketch) Quantile(q float64) time.Duration {
	var out [1]float64
	s.quantiles(out[:], []float64{q})
	return time.Duration(math.Round(out[0]))
}

// quantiles writes to dst the values (in nanoseconds) at the ascending
// quantiles qs, in one pass over the buckets.
//
// Bucket order follows value order (bucketOf is non-decreasing), so the
// value of rank k lies in the first bucket whose cumulative count exceeds
// k, and that bucket's representative is within α of it. The result is
// clamped to the exact [min, max], which only brings it closer (the value at
// rank k is inside that range) and keeps values outside [1µs, 1h] honest;
// the first and last ranks are the exact min and max.
func (s *sketch) quantiles(dst, qs []float64) {
	if s.n == 0 {
		clear(dst)
		return
	}
	j := 0
	var cum uint64
	for i := s.lo; i <= s.hi && j < len(qs); i++ {
		cum += uint64(s.counts[i])
		for j < len(qs) {
			rank := math.Floor(qs[j] * float64(s.n-1))
			if float64(cum) <= rank {
				break
			}
			switch rank {
			case 0:
				dst[j] = float64(s.min)
			case float64(s.n - 1):
				dst[j] = float64(s.max)
			default:
				dst[j] = min(max(reps[i], float64(s.min)), float64(s.max))
			}
			j++
		}
	}
	// Only reached if counts saturated and fell short of n.
	for ; j < len(qs); j++ {
		dst[j] = float64(s.max)
	}
}

// Compact entries pack a bucket index and a count into one uint32: the index
// in the top 11 bits (nBuckets < 2¹¹), the count in the low 21. A larger
// count is split over several entries of the same index, which merging adds
// back together.
const (
	countBits = 21
	countMask = 1<<countBits - 1
)

// compact is a closed slice's sketch: its non-empty buckets only, 4 bytes
// each, in ascending bucket order.
type compact struct {
	entries []uint32
	summary
}

// fill replaces c's content with s's, reusing c's storage unless it is too
// small or more than twice too big (slices live up to an hour, so their
// size should fit).
func (c *compact) fill(s *sketch) {
	n := 0
	for i := s.lo; i <= s.hi; i++ {
		n += int((uint64(s.counts[i]) + countMask - 1) / countMask)
	}
	if cap(c.entries) < n || cap(c.entries) > 2*n+16 {
		c.entries = make([]uint32, 0, n)
	}
	c.entries = c.entries[:0]
	for i := s.lo; i <= s.hi; i++ {
		for n := s.counts[i]; n != 0; {
			part := min(n, countMask)
			c.entries = append(c.entries, uint32(i)<<countBits|part)
			n -= part
		}
	}
	c.summary = s.summary
}

// empty clears c and lets its storage go.
func (c *compact) empty() {
	c.entries = nil
	c.summary = summary{}
}
