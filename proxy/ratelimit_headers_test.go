package proxy

import (
	"testing"
	"time"
)

func TestCeilSecond(t *testing.T) {
	base := time.Date(2026, 11, 30, 12, 0, 7, 0, time.UTC)
	for _, tc := range []struct{ in, want time.Time }{
		{base, base},
		{base.Add(time.Nanosecond), base.Add(time.Second)},
		{base.Add(999 * time.Millisecond), base.Add(time.Second)},
		{base.In(time.FixedZone("x", 3600)), base},
	} {
		if got := ceilSecond(tc.in); !got.Equal(tc.want) || got.Location() != time.UTC {
			t.Errorf("ceilSecond(%v) = %v, want %v UTC", tc.in, got, tc.want)
		}
	}
}
