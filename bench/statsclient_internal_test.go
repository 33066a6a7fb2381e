package bench

import (
	"strings"
	"testing"
)

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
