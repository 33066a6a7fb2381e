// Package retryhint reads the wait an HTTP error answer asks for, and whether
// it asks to be retried at all (x-should-retry), the way the official OpenAI
// and Anthropic SDKs do. The gateway's retries (proxy) and the load
// generator's (bench) both use it.
package retryhint

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Max is what an overlong but finite hint saturates to: "not soon" must
// stop a bounded retry, not fall back to a short backoff.
const Max = time.Duration(math.MaxInt64)

// Parse reads retry-after-ms as float milliseconds, then Retry-After as
// float seconds, then as an HTTP-date relative to now (a date in the past
// means 0). Negative, NaN, infinite and unparsable values are ignored and
// the next form is tried. ok is false when no usable hint exists.
func Parse(h http.Header, now time.Time) (time.Duration, bool) {
	if v := strings.TrimSpace(h.Get("Retry-After-Ms")); v != "" {
		if d, ok := units(v, float64(time.Millisecond)); ok {
			return d, true
		}
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if d, ok := units(v, float64(time.Second)); ok {
		return d, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	if d := t.Sub(now); d > 0 {
		return d, true
	}
	return 0, true
}

// ShouldRetry reads x-should-retry, which OpenAI and Anthropic send and
// their SDKs obey: said is false unless it is exactly "true" or "false",
// and retry is what it says.
func ShouldRetry(h http.Header) (retry, said bool) {
	switch h.Get("X-Should-Retry") {
	case "true":
		return true, true
	case "false":
		return false, true
	}
	return false, false
}

// units parses a non-negative finite decimal number of units.
func units(v string, unit float64) (time.Duration, bool) {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
		return 0, false
	}
	d := f * unit
	if d >= float64(math.MaxInt64) {
		return Max, true
	}
	return time.Duration(d), true
}
