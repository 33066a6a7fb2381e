package retryhint

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestParse: retry-after-ms first, then Retry-After as seconds, then as an
// HTTP date; unusable values fall through to the next form.
func TestParse(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		name   string
		ms, ra string // "" leaves the header out
		want   time.Duration
		wantOK bool
	}{
		{"none", "", "", 0, false},
		{"ms integer", "1500", "", 1500 * time.Millisecond, true},
		{"ms float", "0.5", "", 500 * time.Microsecond, true},
		{"ms zero", "0", "", 0, true},
		{"ms wins over seconds", "250", "10", 250 * time.Millisecond, true},
		{"ms garbage falls back to seconds", "soon", "3", 3 * time.Second, true},
		{"ms negative falls back", "-5", "2", 2 * time.Second, true},
		{"ms NaN falls back", "NaN", "2", 2 * time.Second, true},
		{"ms Inf falls back", "+Inf", "2", 2 * time.Second, true},
		{"ms garbage alone", "x", "", 0, false},
		{"seconds integer", "", "7", 7 * time.Second, true},
		{"seconds float", "", "1.25", 1250 * time.Millisecond, true},
		{"seconds padded", "", "  4 ", 4 * time.Second, true},
		{"seconds zero", "", "0", 0, true},
		{"seconds negative", "", "-1", 0, false},
		{"seconds NaN", "", "NaN", 0, false},
		{"seconds Inf", "", "Inf", 0, false},
		{"seconds huge saturates", "", "1e300", Max, true},
		{"garbage", "", "tomorrow", 0, false},
		{"date future RFC 1123", "", "Sun, 01 Mar 2026 12:00:30 GMT", 30 * time.Second, true},
		{"date future RFC 850", "", "Sunday, 01-Mar-26 12:01:00 GMT", time.Minute, true},
		{"date future ANSI C", "", "Sun Mar  1 12:00:05 2026", 5 * time.Second, true},
		{"date now", "", "Sun, 01 Mar 2026 12:00:00 GMT", 0, true},
		{"date past", "", "Sun, 01 Mar 2026 11:00:00 GMT", 0, true},
		{"date with ms garbage", "bad", "Sun, 01 Mar 2026 12:00:02 GMT", 2 * time.Second, true},
	}
	for _, c := range cases {
		h := http.Header{}
		if c.ms != "" {
			h.Set("retry-after-ms", c.ms)
		}
		if c.ra != "" {
			h.Set("retry-after", c.ra)
		}
		got, ok := Parse(h, now)
		if got != c.want || ok != c.wantOK {
			t.Errorf("%s: Parse = %v, %v; want %v, %v", c.name, got, ok, c.want, c.wantOK)
		}
	}
}

func TestShouldRetry(t *testing.T) {
	for _, c := range []struct {
		value       string // "" leaves the header out
		retry, said bool
	}{
		{"", false, false}, {"true", true, true}, {"false", false, true},
		{"TRUE", false, false}, {"yes", false, false}, {" true", false, false},
	} {
		h := http.Header{}
		if c.value != "" {
			h.Set("x-should-retry", c.value)
		}
		if retry, said := ShouldRetry(h); retry != c.retry || said != c.said {
			t.Errorf("x-should-retry %q: ShouldRetry = %v, %v; want %v, %v", c.value, retry, said, c.retry, c.said)
		}
	}
}

// FuzzParse: whatever the two headers hold, Parse returns a wait that is
// never negative, none without a hint, and the same wait for a valid
// retry-after-ms whatever Retry-After says; a date hint is the date's
// distance from now, never below 0.
func FuzzParse(f *testing.F) {
	for _, s := range [][2]string{
		{"", ""}, {"1500", ""}, {"0.5", "10"}, {"-5", "2"}, {"NaN", "Inf"}, {"", "1e300"},
		{"", "  4 "}, {"x", "Sun, 01 Mar 2026 12:00:30 GMT"}, {"", "Sunday, 01-Mar-26 12:01:00 GMT"},
		{"", "Sun Mar  1 12:00:05 2026"}, {"1e-400", "0x10"}, {"9223372036854775807", ""},
	} {
		f.Add(s[0], s[1], int64(0))
	}
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, ms, ra string, offset int64) {
		h := http.Header{}
		if ms != "" {
			h.Set("Retry-After-Ms", ms)
		}
		if ra != "" {
			h.Set("Retry-After", ra)
		}
		now := base.Add(time.Duration(offset))
		d, ok := Parse(h, now)
		if d < 0 || (!ok && d != 0) {
			t.Fatalf("Parse(%q, %q) = %v, %v", ms, ra, d, ok)
		}
		if f, err := strconv.ParseFloat(strings.TrimSpace(h.Get("Retry-After-Ms")), 64); err == nil && f >= 0 && !math.IsInf(f, 0) && !math.IsNaN(f) {
			want := Max
			if x := f * float64(time.Millisecond); x < float64(math.MaxInt64) {
				want = time.Duration(x)
			}
			if !ok || d != want {
				t.Fatalf("retry-after-ms %q: Parse = %v, %v; want %v", ms, d, ok, want)
			}
			return
		}
		v := strings.TrimSpace(h.Get("Retry-After"))
		if _, err := strconv.ParseFloat(v, 64); err == nil {
			return // seconds: TestParse covers the values
		}
		if at, err := http.ParseTime(v); err == nil {
			if want := max(at.Sub(now), 0); !ok || d != want {
				t.Fatalf("Retry-After date %q at %v: Parse = %v, %v; want %v", v, now, d, ok, want)
			}
		} else if ok {
			t.Fatalf("Parse(%q, %q) = %v, true from no usable hint", ms, ra, d)
		}
	})
}
