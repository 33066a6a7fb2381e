package ratelimit

import (
	"math"
	"math/bits"
	"time"
)

// This file holds the arithmetic both backends share, on int64 nanoseconds
// so that a Lua script can mirror it line for line. A rate bucket's whole
// state is its theoretical arrival time (TAT): the instant at which the
// bucket would be full again. tat <= now means full.

// rateWindow is the span a per-minute limit refills over; a bucket holds
// exactly one window's worth of units (burst = the per-minute limit).
const rateWindow = int64(time.Minute)

// mulDiv returns a·b/c rounded down for a, b >= 0 and c > 0, saturating at
// math.MaxInt64. The 128-bit product keeps token counts times nanoseconds
// from overflowing for any realistic limit.
func mulDiv(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// mulDivCeil is mulDiv rounded up.
func mulDivCeil(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, r := bits.Div64(hi, lo, uint64(c))
	if r != 0 {
		q++
	}
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// satAdd returns a+b for b >= 0, saturating at math.MaxInt64, so that a
// huge debt pins a bucket shut instead of wrapping it open.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// rateCost returns how long n units occupy a bucket of limit units per
// minute: n·T with T = 1min/limit. It rounds down to the nanosecond so that
// rounding never refuses the last unit of a full burst; the over-admission
// this allows is below one unit per limit reservations, i.e. none for limits
// under ~245,000 per minute (limit² < 1min in ns).
func rateCost(n, limit int64) int64 {
	if n <= 0 {
		return 0
	}
	return mulDiv(n, rateWindow, limit)
}

// rateReserve takes n units at now from a bucket of limit per minute whose
// TAT is tat. It returns the new TAT when the units fit; otherwise it
// returns tat unchanged and the exact wait after which they will fit
// (newTAT − now − 1min), never the whole window.
func rateReserve(tat, now, n, limit int64) (newTAT int64, ok bool, retryAfter int64) {
	newTAT = satAdd(max(tat, now), rateCost(n, limit))
	if d := newTAT - now; d > rateWindow {
		return tat, false, d - rateWindow
	}
	return newTAT, true, 0
}

// rateSettle corrects a bucket by delta = actual − reserved units. A charge
// (delta > 0) is taken from the bucket as it is now and may push it into
// debt (TAT beyond now+1min), which later requests wait out; a refund
// (delta < 0) never fills the bucket beyond full (TAT never below now).
func rateSettle(tat, now, delta, limit int64) int64 {
	if delta >= 0 {
		return satAdd(max(tat, now), rateCost(delta, limit))
	}
	return max(tat-rateCost(-delta, limit), now)
}

// rateState reports a bucket for headers: used is the consumed share rounded
// up (above limit when in debt), remaining = floor((1min − (TAT−now))/T)
// clamped at 0, and reset the time until the bucket is full again.
func rateState(tat, now, limit int64) (used, remaining int64, reset time.Duration) {
	d := max(tat-now, 0)
	used = mulDivCeil(d, limit, rateWindow)
	if d < rateWindow {
		remaining = mulDiv(rateWindow-d, limit, rateWindow)
	}
	return used, remaining, time.Duration(d)
}

// tpmReserve is what a request reserves against a TPM limit: its estimate
// clamped to the limit. An estimate above the whole bucket (a large
// max_tokens) could otherwise never be admitted, and refusing a request for
// its max_tokens alone would be wrong; clamped, it is admitted once the
// bucket is full, and Settle charges any real excess as debt.
func tpmReserve(tokens, limit int64) int64 {
	return min(max(tokens, 0), limit)
}

// budgetReserve is what a request reserves against a budget window holding
// held of limit (settled usage and reservations together): its estimate
// clamped to what is left, limit − held. ok is false when nothing is left
// (held >= limit), which refuses even a zero estimate. A large estimate (a
// generous max_tokens) is thus never refused while some budget is left;
// Settle charges the real usage, so a window may end above its limit by at
// most one request's usage beyond its clamped reservation (per request open
// at once).
func budgetReserve(held, estimate, limit int64) (reserve int64, ok bool) {
	if held >= limit {
		return 0, false
	}
	return min(max(estimate, 0), limit-held), true
}

// heldRetryMin and heldRetryMax bound heldRetry's wait. The floor is for an
// oldest request already past its expected end, or with no estimate yet: it
// ends any moment, which no limiter can predict, as for concurrency. The
// ceiling is the longest Retry-After that every release of the official SDKs
// honours (some ignore more than 60 s, or give up).
const (
	heldRetryMin = int64(time.Second)
	heldRetryMax = int64(time.Minute)
)

// heldRetry is how long a request refused by a held budget (nothing left,
// but not spent: reservations of requests in flight make up the rest) should
// wait: until the oldest open reservation of the window, admitted at oldest,
// is expected to end, typical after its admission, within [heldRetryMin,
// heldRetryMax]. found is false when no open lease of the window is known (on
// Redis, when only leases past their LeaseTTL hold it: their replicas died,
// or their settlements wait for a replay): then heldRetryMax. The wait never
// reaches past until, the earlier of the window's end (where reservations
// start from zero) and the oldest lease's expiry.
func heldRetry(oldest int64, found bool, typical, now, until int64) int64 {
	wait := heldRetryMax
	if found {
		wait = min(max(oldest+typical-now, heldRetryMin), heldRetryMax)
	}
	return max(min(wait, until-now), 0)
}
