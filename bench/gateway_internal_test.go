package bench

import (
	"strings"
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

func TestStatsURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:8080":              "http://127.0.0.1:8080/stats",
		"http://127.0.0.1:8080/":             "http://127.0.0.1:8080/stats",
		"http://gw/v1":                       "http://gw/stats",
		"https://gw/llm/v1/":                 "https://gw/llm/stats",
		"http://gw:9000/stats":               "http://gw:9000/stats",
		"http://gw/stats/?window=1m#x":       "http://gw/stats",
		"http://user:pw@gw/stats?model=keep": "http://gw/stats", // /stats gets no credentials
	} {
		if got, err := StatsURL(in); err != nil || got != want {
			t.Errorf("StatsURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"ftp://gw", "127.0.0.1:8080", "on", "http://", "http://u:secret@gw:x/"} {
		_, err := StatsURL(bad)
		if err == nil {
			t.Errorf("StatsURL(%q): no error", bad)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("StatsURL(%q): error %q shows the password", bad, err)
		}
	}
}
