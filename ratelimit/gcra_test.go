package ratelimit

import (
	"math"
	"testing"
	"time"
)

// The Local prefix keeps these in `go test -run Local`, which needs no
// redis-server.

func TestLocalArithmeticSaturates(t *testing.T) {
	const now = int64(1_800_000_000) * int64(time.Second)
	cases := []struct {
		name    string
		got     int64
		want    int64
		comment string
	}{
		{"mulDiv exact", mulDiv(7, rateWindow, 7), rateWindow, ""},
		{"mulDiv 128-bit", mulDiv(1<<40, rateWindow, 1<<40), rateWindow, "2^40 tokens times 1min overflows int64"},
		{"mulDiv saturates", mulDiv(math.MaxInt64, math.MaxInt64, 1), math.MaxInt64, ""},
		{"mulDiv quotient saturates", mulDiv(math.MaxInt64, 4, 2), math.MaxInt64, ""},
		{"mulDivCeil rounds up", mulDivCeil(1, rateWindow, 7), 8_571_428_572, ""},
		{"mulDivCeil saturates", mulDivCeil(math.MaxInt64, math.MaxInt64, 1), math.MaxInt64, ""},
		{"mulDivCeil quotient saturates", mulDivCeil(math.MaxInt64, 4, 2), math.MaxInt64, ""},
		{"rateCost floor", rateCost(1, 7), 8_571_428_571, ""},
		{"rateCost of nothing", rateCost(-5, 7), 0, ""},
		{"satAdd", satAdd(math.MaxInt64-1, 5), math.MaxInt64, ""},
		{"huge debt pins the bucket", rateSettle(now, now, 1<<62, 1), math.MaxInt64, "instead of wrapping to the past"},
		{"refund stops at full", rateSettle(now+10, now, -1<<40, 1), now, ""},
	}
	for _, tc := range cases {
		if tc.got != tc.want {
			t.Errorf("%s: got %d, want %d %s", tc.name, tc.got, tc.want, tc.comment)
		}
	}
	if _, ok, wait := rateReserve(math.MaxInt64, now, 0, 1); ok || wait <= 0 {
		t.Errorf("a saturated bucket admitted (ok=%v wait=%d)", ok, wait)
	}
	if used, rem, reset := rateState(math.MaxInt64, now, 1000); rem != 0 || used <= 1000 || reset <= 0 {
		t.Errorf("saturated state: used %d remaining %d reset %v", used, rem, reset)
	}
}

func TestLocalOptionsZeroValue(t *testing.T) {
	l := NewLocal(LocalOptions{})
	defer l.Close()
	if l.max != DefaultMaxSubjects || l.now == nil {
		t.Fatalf("zero options: max %d, clock set %v", l.max, l.now != nil)
	}
}
