package proxy

import (
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/tollgate-llm/tollgate/internal/retryhint"
)

// retryPolicy is the per-upstream retry schedule. The zero
// value never retries; policyFrom builds it from an [upstreams.retry] table.
type retryPolicy struct {
	// maxAttempts counts the first attempt too: 3 means at most 2 retries.
	maxAttempts int
	// base is the cap of the first retry's delay; the cap grows by
	// multiplier per retry up to max.
	base, max  time.Duration
	multiplier float64
	// maxWait is the total time allowed for waiting between attempts of one
	// request on this upstream; a wait that would not fit is not taken.
	maxWait time.Duration
	// statuses are the upstream HTTP statuses worth another attempt.
	statuses map[int]bool
}

// backoffCap returns min(max, base·multiplier^retry). The product is taken in
// float64, where a huge retry count saturates to +Inf instead of wrapping
// around as int64 arithmetic would.
func (p retryPolicy) backoffCap(retry int) time.Duration {
	if p.base <= 0 || p.max <= 0 {
		return 0
	}
	if retry < 0 {
		retry = 0
	}
	c := float64(p.base) * math.Pow(p.multiplier, float64(retry))
	if math.IsNaN(c) || c >= float64(p.max) {
		return p.max
	}
	if c <= 0 {
		return 0
	}
	return time.Duration(c)
}

// backoff returns the delay before the retry that follows retry earlier
// retries (0 for the first retry), with full jitter: uniform in
// [0, min(max, base·multiplier^retry)). Full jitter rather than the SDKs'
// 25 % jitter because many gateway requests fail together in an outage and
// must not come back together. rnd must return values in [0, 1); values
// outside are clamped so a bad source cannot exceed the cap.
func (p retryPolicy) backoff(retry int, rnd func() float64) time.Duration {
	c := p.backoffCap(retry)
	if c <= 0 {
		return 0
	}
	r := rnd()
	switch {
	case !(r > 0): // also catches NaN
		return 0
	case r >= 1: // before multiplying: +Inf·c does not convert to a Duration
		return c - 1
	}
	d := time.Duration(r * float64(c))
	if d >= c { // rounding of r just below 1
		d = c - 1
	}
	return d
}

// waitWithin returns how long to wait before the retry that follows retry
// earlier retries, and ok=false when the request must not be retried:
//
//   - the attempts are spent (retry+1 attempts made ≥ maxAttempts);
//   - the upstream's hint (retryhint.Parse, as the SDKs read it) is longer
//     than remaining (an overlong one saturates to retryhint.Max);
//   - without a hint, the backoff is longer than remaining.
//
// A hint is honoured exactly, even above p.max, and is not jittered: the
// upstream says earlier attempts will fail, and p.max shapes only our own
// schedule. A hint that does not fit is better served by relaying the error
// with it, so the caller's SDK can decide.
func (p retryPolicy) waitWithin(retry int, h http.Header, now time.Time, remaining time.Duration, rnd func() float64) (time.Duration, bool) {
	if retry < 0 {
		retry = 0
	}
	if retry+1 >= p.maxAttempts || remaining < 0 {
		return 0, false
	}
	if d, ok := retryhint.Parse(h, now); ok {
		return d, d <= remaining
	}
	d := p.backoff(retry, rnd)
	return d, d <= remaining
}

// retryableStatus reports whether an upstream error answer may succeed on
// retry: its status is in the policy and its error type/code is not one that
// retrying cannot fix. errorType and errorCode are error.type and error.code
// from the body ("" when absent); both are checked against every kind because
// OpenAI puts insufficient_quota in either field, depending on the era, and
// puts the newer billing codes under type insufficient_quota.
func retryableStatus(p retryPolicy, status int, errorType, errorCode string) bool {
	if !p.statuses[status] {
		return false
	}
	return !neverRetryable(errorType) && !neverRetryable(errorCode)
}

// neverRetryable lists error types and codes that no retry can fix: quota and
// billing exhaustion (OpenAI) and Anthropic's client-side errors. A switch
// rather than a map keeps the check allocation-free and read-only.
func neverRetryable(s string) bool {
	switch s {
	case "insufficient_quota",
		"credit_balance_exhausted",
		"organization_spend_limit_exceeded",
		"project_spend_limit_exceeded",
		"organization_usage_limit_exceeded",
		"billing_error",
		"permission_error",
		"authentication_error",
		"invalid_request_error":
		return true
	}
	return false
}

// budgetBuckets is the number of slices of a retryBudget window.
const budgetBuckets = 10

// retryBudget caps retries to an upstream at a share of its requests plus a
// floor, so an outage multiplies load by at most about 1+ratio instead of by
// maxAttempts (Finagle's RetryBudget): a retry is allowed while, over the
// sliding window, retries < ratio × requests + floorPerSecond × window
// seconds, and taking it counts it. The window is budgetBuckets slices, so
// memory is constant whatever the rate. It is safe for concurrent use.
type retryBudget struct {
	now   func() time.Time
	start time.Time
	slice time.Duration
	// ratioMicro and floorMicro are ratio and floor·window in millionths, so
	// the comparison is exact integer arithmetic (0.2×100 is exactly 20). ratio
	// is capped at 1000 and floor·window at 1e9 so the products cannot overflow.
	ratioMicro, floorMicro int64

	mu      sync.Mutex
	last    int64 // highest slice number seen; guards against a clock going back
	buckets [budgetBuckets]budgetBucket
}

// budgetBucket holds the counts of one slice of the window.
type budgetBucket struct {
	slice             int64
	requests, retries int64
}

// newRetryBudget returns a budget allowing ratio retries per request plus
// floorPerSecond·window retries per window. Negative ratio or floor mean 0, a
// non-positive window means 10 s, and a nil now means time.Now.
func newRetryBudget(ratio, floorPerSecond float64, window time.Duration, now func() time.Time) *retryBudget {
	if !(ratio > 0) {
		ratio = 0
	}
	if !(floorPerSecond > 0) {
		floorPerSecond = 0
	}
	if window <= 0 {
		window = 10 * time.Second
	}
	if now == nil {
		now = time.Now
	}
	slice := window / budgetBuckets
	if slice <= 0 {
		slice = 1
	}
	return &retryBudget{
		now:        now,
		start:      now(),
		slice:      slice,
		ratioMicro: int64(math.Round(math.Min(ratio, 1e3) * 1e6)),
		floorMicro: int64(math.Round(math.Min(floorPerSecond*window.Seconds(), 1e9) * 1e6)),
	}
}

// current returns the bucket of the present slice, emptied if it last held
// an older slice, and the present slice number. b.mu must be held.
func (b *retryBudget) current() (*budgetBucket, int64) {
	n := int64(b.now().Sub(b.start) / b.slice)
	if n < b.last {
		n = b.last
	}
	b.last = n
	k := &b.buckets[n%budgetBuckets]
	if k.slice != n {
		*k = budgetBucket{slice: n}
	}
	return k, n
}

// recordRequest counts one original request (retries are counted by tryRetry).
func (b *retryBudget) recordRequest() {
	b.mu.Lock()
	k, _ := b.current()
	k.requests++
	b.mu.Unlock()
}

// tryRetry reports whether one more retry fits the budget and, if so, counts
// it. A refused retry is not counted.
func (b *retryBudget) tryRetry() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	k, n := b.current()
	var requests, retries int64
	for i := range b.buckets {
		if s := b.buckets[i].slice; s > n-budgetBuckets && s <= n {
			requests += b.buckets[i].requests
			retries += b.buckets[i].retries
		}
	}
	if retries*1e6 >= requests*b.ratioMicro+b.floorMicro {
		return false
	}
	k.retries++
	return true
}

// shouldRetry decides on an upstream error answer: the upstream's
// x-should-retry (sent by OpenAI and Anthropic, and honoured by their SDKs)
// wins when it says false, and may add a status the policy leaves out when
// it says true; errors no retry can fix are never retried.
func shouldRetry(p retryPolicy, status int, h http.Header, errType, errCode string) bool {
	if neverRetryable(errType) || neverRetryable(errCode) {
		return false
	}
	if retry, said := retryhint.ShouldRetry(h); said {
		return retry
	}
	return retryableStatus(p, status, errType, errCode)
}

// repeatable reports whether a failed attempt may be sent again: always
// when the kind says so (kind.repeatsAnyFailure), else only when the
// upstream surely did not act on it: connection refused, 429, 503 or 529.
func (ex *exchange) repeatable(res attemptResult) bool {
	if ex.kind.repeatsAnyFailure(ex.r.Method) {
		return true
	}
	switch res.result {
	case resultConnectError, resultRateLimited, resultOverloaded:
		return true
	}
	return res.status == http.StatusServiceUnavailable
}

// retryVeto says why the retry after attempt n on up will not be taken, ""
// when it will; fits says its wait fits the retry policy. It is decided
// before the wait: a retry that will not be taken must not make the caller
// wait for it.
func (up *upstream) retryVeto(n int, fits bool) string {
	switch {
	case !fits && n+1 >= up.policy.maxAttempts:
		return skipAttempts
	case !fits:
		return skipWaitTooLong
	case up.breaker != nil && up.breaker.state() == breakerOpen:
		return skipBreakerOpen
	case !up.budget.tryRetry():
		return skipBudget
	}
	return ""
}
