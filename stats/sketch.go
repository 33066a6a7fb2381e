package stats

import (
	"encoding/binary"
	"iter"
	"math"
	"math/bits"
	"time"
	"unsafe"
)

// The sketch is a log-linear histogram, HdrHistogram's layout: each octave
// [2^e, 2^(e+1)) of nanoseconds is cut into 2^subBits equal buckets, so a
// bucket is at most 2^−subBits of its lower bound wide, and values under
// 2^(subBits+1) ns have a bucket each. The bounds are integers computed
// with shifts, the same on every machine, so that two sketches merge by
// adding counts and a merge is exactly the sketch of the union.
//
// A quantile is estimated inside the bucket that holds its rank (see
// quantiles), so it is off by less than the bucket's width: under 2^−10 ≈
// 0.098 % of the value, and exact below 2 µs.
const (
	subBits  = 10
	subCount = 1 << subBits
	// exactBelow: values under it (2,048 ns) have a bucket each.
	exactBelow = 2 << subBits
	// topOctave is the last octave in the layout: values of 2^42 ns
	// (73 min) or more share the last bucket, and quantiles there are
	// clamped to the exact max.
	topOctave = 41
	sketchMax = 1 << (topOctave + 1)
	// nBuckets bounds the buckets of any sketch, whatever it is fed.
	nBuckets = (topOctave - subBits + 2) << subBits
	// relativeError is the bound reported to readers (the layout's is
	// 2^−subBits, a little under it).
	relativeError = 0.001
	// sketchKind names the layout in reports.
	sketchKind = "log-linear"
)

// bucketOf returns the bucket holding d; negative durations count as 0.
// Buckets are in value order: bucketOf is non-decreasing.
func bucketOf(d time.Duration) int {
	v := int64(d)
	if v < exactBelow {
		return int(max(v, 0))
	}
	if v >= sketchMax {
		return nBuckets - 1
	}
	// v has its top bit at e ≥ subBits+1; its bucket is the top
	// subBits+1 bits (1024..2047) after the octaves below.
	shift := bits.Len64(uint64(v)) - 1 - subBits
	return shift<<subBits + int(v>>shift)
}

// bucketRange returns the smallest and largest integer values of bucket i.
// The last bucket's upper end is the layout's; its values go beyond.
func bucketRange(i int) (lo, hi int64) {
	if i < exactBelow {
		return int64(i), int64(i)
	}
	shift := i>>subBits - 1
	lo = int64(i&(subCount-1)|subCount) << shift
	return lo, lo + 1<<shift - 1
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

// The counts of a dense sketch live in pages of pageSize buckets,
// allocated the first time a value falls in them: 64 buckets span 3 to 6 %
// of their values, so values a few percent apart share a page.
const (
	pageBits = 6
	pageSize = 1 << pageBits
	nPages   = nBuckets >> pageBits
)

// page holds the counts of pageSize buckets, their total, by which
// quantiles skip whole pages, and which of them are non-empty (bit j for
// bucket j), so that walks visit those only.
type page struct {
	n     [pageSize]uint32
	total uint64
	used  uint64
}

// sketch is a histogram whose counts are paged: a directory of every page
// of the layout (2 bytes each) and the pages in use, 272 bytes each. It is
// used for the slice being written, where Add must be O(1), and as the
// scratch that Snapshot merges slices into. Closed slices are kept as
// compact sketches. Add allocates only when a value falls in a page not
// in use; pages are kept across reset, so steady traffic allocates
// nothing.
type sketch struct {
	// dir holds, per page of the layout, 1 + its index in pages, or 0.
	dir   [nPages]uint16
	pages []page
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

// Add records one value; a negative one counts as 0.
func (s *sketch) Add(d time.Duration) {
	d = max(d, 0)
	s.addAt(bucketOf(d), d)
}

// addAt records d ≥ 0, whose bucket i the caller computed (once for
// several sketches, and outside any lock).
func (s *sketch) addAt(i int, d time.Duration) {
	pg, j := s.page(i>>pageBits), i&(pageSize-1)
	// A bucket would need 2³² values of one group in one slice to wrap.
	pg.n[j]++
	pg.total++
	pg.used |= 1 << j
	s.lo = min(s.lo, i)
	s.hi = max(s.hi, i)
	s.summary.add(int64(d))
}

// page returns page number pi, putting a zeroed one in use if need be. The
// pointer is good until the next page is put in use.
func (s *sketch) page(pi int) *page {
	p := s.dir[pi]
	if p == 0 {
		if len(s.pages) == cap(s.pages) {
			// Grown by hand so that no sketch holds more than the
			// layout's pages.
			grown := make([]page, len(s.pages), min(cap(s.pages)+max(cap(s.pages)/4, 4), nPages))
			copy(grown, s.pages)
			s.pages = grown
		}
		s.pages = append(s.pages, page{})
		p = uint16(len(s.pages))
		s.dir[pi] = p
	}
	return &s.pages[p-1]
}

// reset empties s, keeping its pages' storage for the next values.
func (s *sketch) reset() {
	if s.lo <= s.hi {
		clear(s.dir[s.lo>>pageBits : s.hi>>pageBits+1])
	}
	s.pages = s.pages[:0]
	s.lo, s.hi = nBuckets, -1
	s.summary = summary{}
}

// recycle empties s for the next slice, and lets its pages' storage go
// when the slice used less than half of it (a burst has passed), so a
// sketch holds about what its traffic needs.
func (s *sketch) recycle() {
	used := len(s.pages)
	s.reset()
	if cap(s.pages) > 2*used+8 {
		s.pages = nil
	}
}

// bytes is the memory s holds.
func (s *sketch) bytes() int {
	return int(unsafe.Sizeof(*s)) + cap(s.pages)*int(unsafe.Sizeof(page{}))
}

// add adds c to bucket j of pg, saturating rather than wrapping (a bucket
// would need 2³² values of one group in one window to saturate).
func (pg *page) add(j int, c uint32) {
	old := pg.n[j]
	n := old + c
	if n < c {
		n = math.MaxUint32
	}
	pg.n[j] = n
	pg.total += uint64(n - old)
	pg.used |= 1 << j
}

// addCount adds c to bucket i. The caller widens lo and hi.
func (s *sketch) addCount(i int, c uint32) { s.page(i>>pageBits).add(i&(pageSize-1), c) }

// Merge adds o's values to s.
func (s *sketch) Merge(o *sketch) {
	if o.lo > o.hi {
		return
	}
	for pi := o.lo >> pageBits; pi <= o.hi>>pageBits; pi++ {
		if op := o.dir[pi]; op != 0 {
			src, dst := &o.pages[op-1], s.page(pi)
			for m := src.used; m != 0; m &= m - 1 {
				j := bits.TrailingZeros64(m)
				dst.add(j, src.n[j])
			}
		}
	}
	s.lo, s.hi = min(s.lo, o.lo), max(s.hi, o.hi)
	s.summary.merge(&o.summary)
}

// buckets yields the non-empty buckets in order, with their counts.
func (s *sketch) buckets() iter.Seq2[int, uint32] {
	return func(yield func(int, uint32) bool) {
		if s.lo > s.hi {
			return
		}
		for pi := s.lo >> pageBits; pi <= s.hi>>pageBits; pi++ {
			if p := s.dir[pi]; p != 0 {
				pg := &s.pages[p-1]
				for m := pg.used; m != 0; m &= m - 1 {
					j := bits.TrailingZeros64(m)
					if !yield(pi<<pageBits|j, pg.n[j]) {
						return
					}
				}
			}
		}
	}
}

// Quantile returns the q-quantile (see quantiles), rounded to the
// nanosecond, or 0 when s is empty.
func (s *sketch) Quantile(q float64) time.Duration {
	var out [1]float64
	s.quantiles(out[:], []float64{q})
	return time.Duration(math.Round(out[0]))
}

// quantiles writes to dst the q-quantiles, in nanoseconds, for the
// ascending levels qs, in one pass over the buckets.
//
// A quantile is the value at rank h = q·(n−1) by linear interpolation
// between the closest ranks, as numpy.percentile computes by default and
// gateway bench for the client: v(⌊h⌋) + (h−⌊h⌋)·(v(⌊h⌋+1) − v(⌊h⌋)).
// The value at a rank is estimated inside the bucket that holds it, as if
// the bucket's c values were evenly spread over its range (narrowed to the
// exact min and max): the j-th at (j+½)/c of the way. Since buckets follow
// value order, the true value is in that range too, so the estimate is off
// by less than the bucket's width, which is under 2^−10 of the value; a
// combination of two such estimates is off by less than 2^−10 of the
// interpolated value. Ranks 0 and n−1 are the exact min and max, and a
// bucket of one integer is exact.
func (s *sketch) quantiles(dst, qs []float64) {
	if s.n == 0 {
		clear(dst)
		return
	}
	last := uint64(s.n - 1)
	c := newCursor(s)
	// The previous level's ranks and values, which the next level often
	// shares, and which the cursor may have walked past.
	memoK, memo0, memo1, has1 := uint64(math.MaxUint64), 0.0, 0.0, false
	for x, q := range qs {
		h := min(max(q, 0), 1) * float64(last)
		k := min(uint64(h), last)
		f := h - float64(k)
		var v0 float64
		switch {
		case k == memoK:
			v0 = memo0
		case k == memoK+1 && has1:
			v0 = memo1
		default:
			v0 = c.value(k)
		}
		v := v0
		if f > 0 && k < last {
			var v1 float64
			if k == memoK && has1 {
				v1 = memo1
			} else {
				v1 = c.value(k + 1)
			}
			v += f * (v1 - v0)
			memo1, has1 = v1, true
		} else {
			has1 = false
		}
		memoK, memo0 = k, v0
		dst[x] = v
	}
}

// cursor walks a sketch's buckets in order, answering the estimated value
// at a rank. It skips whole pages by their totals.
type cursor struct {
	s *sketch
	// pi is the current page (−1 before the first), whose buckets hold
	// the ranks from pageBefore; i is the current bucket in it (−1 before
	// the first), holding ranks [before, before+count).
	pi, i                     int
	pageBefore, before, count uint64
}

func newCursor(s *sketch) cursor { return cursor{s: s, pi: -1, i: -1} }

// value returns the estimated value at rank j < n (see quantiles). Ranks
// are best asked in ascending order; an earlier one restarts the walk.
func (c *cursor) value(j uint64) float64 {
	s := c.s
	if j == 0 {
		return float64(s.min)
	}
	if j >= uint64(s.n-1) {
		return float64(s.max)
	}
	if c.i >= 0 && j < c.before || c.i < 0 && j < c.pageBefore {
		*c = newCursor(s)
	}
	for c.i < 0 || c.before+c.count <= j {
		if c.pi >= 0 && c.i < pageSize-1 {
			// The rest of the current page, which holds rank j if the
			// page's total said so.
			pg := &s.pages[s.dir[c.pi]-1]
			if rest := pg.used >> (c.i + 1) << (c.i + 1); rest != 0 {
				c.i = bits.TrailingZeros64(rest)
				c.before += c.count
				c.count = uint64(pg.n[c.i])
				continue
			}
		}
		// The next page whose total reaches rank j.
		if c.pi >= 0 {
			c.pageBefore = c.before + c.count
		}
		for {
			c.pi = max(c.pi+1, s.lo>>pageBits)
			if c.pi > s.hi>>pageBits {
				// Only reached if counts saturated and fell short of n.
				c.pi, c.i = s.hi>>pageBits, pageSize-1
				c.before, c.count = c.pageBefore, 0
				return float64(s.max)
			}
			p := s.dir[c.pi]
			if p == 0 {
				continue
			}
			if total := s.pages[p-1].total; c.pageBefore+total > j {
				break
			}
			c.pageBefore += s.pages[p-1].total
		}
		c.i, c.before, c.count = -1, c.pageBefore, 0
	}
	lo, hi := bucketRange(c.pi<<pageBits | c.i)
	if c.pi<<pageBits|c.i == nBuckets-1 {
		hi = s.max
	}
	lo, hi = max(lo, s.min), min(hi, s.max)
	return float64(lo) + float64(hi-lo)*(float64(j-c.before)+0.5)/float64(c.count)
}

// compact is a closed slice's sketch: its non-empty buckets only, in
// ascending order, as runs of neighbouring buckets. A run is a uvarint
// header, gap<<3 | min(len−1, 7) (gap: buckets since the previous run's
// end; len: the run's buckets), a uvarint len−8 when len−1 ≥ 7, then each
// bucket's count as a zigzag uvarint of its difference from the previous
// count in the run (the first from 0). Neighbouring counts are alike, so a
// busy slice takes about a byte per bucket, and a sparse one two.
//
// data is never written once filled, so that a report may copy a compact
// under its group's lock and decode it after releasing the lock.
type compact struct {
	data []byte
	summary
}

// fill replaces c's content with s's, in new storage (see compact).
func (c *compact) fill(s *sketch) {
	size := 0
	s.encode(func(v uint64) { size += uvarintLen(v) })
	c.data = make([]byte, 0, size)
	s.encode(func(v uint64) { c.data = binary.AppendUvarint(c.data, v) })
	c.summary = s.summary
}

// encode calls put with each uvarint of s's compact form.
func (s *sketch) encode(put func(uint64)) {
	end := 0 // the bucket after the previous run
	for i := s.nextUsed(s.lo); i >= 0; i = s.nextUsed(end) {
		e := s.runEnd(i)
		l := uint64(e - i - 1)
		put(uint64(i-end)<<3 | min(l, 7))
		if l >= 7 {
			put(l - 7)
		}
		prev := int64(0)
		for j := i; j < e; j++ {
			n := int64(s.pages[s.dir[j>>pageBits]-1].n[j&(pageSize-1)])
			put(uint64((n-prev)<<1 ^ (n-prev)>>63))
			prev = n
		}
		end = e
	}
}

// nextUsed returns the first non-empty bucket at or after i, or −1.
func (s *sketch) nextUsed(i int) int {
	for i = max(i, s.lo); i <= s.hi; {
		pi := i >> pageBits
		if p := s.dir[pi]; p != 0 {
			if m := s.pages[p-1].used >> (i & (pageSize - 1)); m != 0 {
				return i + bits.TrailingZeros64(m)
			}
		}
		i = (pi + 1) << pageBits
	}
	return -1
}

// runEnd returns the first empty bucket after the non-empty bucket i.
func (s *sketch) runEnd(i int) int {
	for {
		pi, j := i>>pageBits, i&(pageSize-1)
		p := s.dir[pi]
		if p == 0 {
			return i
		}
		// The empty buckets of the page from j on; none: the run goes on
		// into the next page.
		if free := ^s.pages[p-1].used >> j; free != 0 {
			return i + bits.TrailingZeros64(free)
		}
		i = (pi + 1) << pageBits
		if i >= nBuckets {
			return nBuckets
		}
	}
}

// mergeCompact adds c's values to s.
func (s *sketch) mergeCompact(c *compact) {
	b := c.data
	i, first := 0, -1
	pi, pg := -1, (*page)(nil)
	for k := 0; k < len(b); {
		// Each uvarint is one byte but for long gaps and large counts;
		// that case is decoded without a call.
		h := uint64(b[k])
		if h < 0x80 {
			k++
		} else {
			var w int
			h, w = binary.Uvarint(b[k:])
			k += w
		}
		i += int(h >> 3)
		if first < 0 {
			first = i
		}
		n := h&7 + 1
		if n == 8 {
			l, w := binary.Uvarint(b[k:])
			k += w
			n += l
		}
		prev := int64(0)
		for ; n > 0; n-- {
			z := uint64(b[k])
			if z < 0x80 {
				k++
			} else {
				var w int
				z, w = binary.Uvarint(b[k:])
				k += w
			}
			prev += int64(z>>1) ^ -int64(z&1)
			if i>>pageBits != pi {
				pi = i >> pageBits
				pg = s.page(pi)
			}
			pg.add(i&(pageSize-1), uint32(prev))
			i++
		}
	}
	if first >= 0 {
		s.lo, s.hi = min(s.lo, first), max(s.hi, i-1)
	}
	s.summary.merge(&c.summary)
}

func uvarintLen(v uint64) int { return (bits.Len64(v|1) + 6) / 7 }

// empty clears c and lets its storage go.
func (c *compact) empty() {
	c.data = nil
	c.summary = summary{}
}
