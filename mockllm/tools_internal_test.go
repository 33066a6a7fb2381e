package mockllm

import "testing"

// A tool is named by its whole name, in its own case, wherever it stands;
// a longer name that contains it does not name it.
func TestNamesWordMatchesWholeNamesOnly(t *testing.T) {
	for _, c := range []struct {
		text, name string
		want       bool
	}{
		{"read", "read", true},
		{"read the file", "read", true},
		{"please read", "read", true},
		{"(read), then Bash.", "Bash", true},
		{"use `get_weather`", "get_weather", true},
		{"Read the file", "read", false},
		{"reading", "read", false},
		{"read-only", "read", false},
		{"pre_read", "read", false},
		{"get_time_zone, then get_time", "get_time", true},
		{"get_time_zone and get_time2", "get_time", false},
		{"mcp__git__status", "mcp__git__status", true},
		{"", "read", false},
		{"rea", "read", false},
	} {
		if got := namesWord(c.text, c.name); got != c.want {
			t.Errorf("namesWord(%q, %q) = %v, want %v", c.text, c.name, got, c.want)
		}
	}
}
