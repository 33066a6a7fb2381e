package bench

import (
	"testing"
	"time"
)

// TestPickWindow: the smallest window whose sure span (its length less one
// slice) holds the run plus the margin (15 s + 5 %).
func TestPickWindow(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{0, "1m"},
		{30 * time.Second, "1m"}, // 46.5 s ≤ 50 s
		{40 * time.Second, "5m"}, // 57 s > 50 s: 1m may reach back only 50 s
		{4 * time.Minute, "5m"},  // 267 s ≤ 290 s
		{5 * time.Minute, "1h"},
		{55 * time.Minute, "1h"}, // 3480 s ≤ 3540 s
		{56 * time.Minute, ""},   // 3543 s > 3540 s
		{3 * time.Hour, ""},
	} {
		if got := pickWindow(c.d); got != c.want {
			t.Errorf("pickWindow(%v) = %q, want %q", c.d, got, c.want)
		}
	}
}
