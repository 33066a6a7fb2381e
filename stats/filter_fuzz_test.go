package stats

import (
	"net/url"
	"slices"
	"testing"
)

// FuzzParseFilter: any query string either parses into a filter whose
// window is one of the windows (or all) and whose merges came from the
// merge parameter, or is refused; never a panic.
func FuzzParseFilter(f *testing.F) {
	for _, s := range []string{"", "window=1m", "window=2m", "merge=route,model,team", "merge=team,", "merge=tenant",
		"route=chat_completions&model=gpt&team=a&window=1h&merge=model", "merge=%20team%20", "window=1m&window=5m"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		flt, err := parseFilter(q)
		if err != nil {
			return
		}
		if flt.window != "" && !slices.ContainsFunc(windowSpecs[:], func(s windowSpec) bool { return s.name == flt.window }) {
			t.Fatalf("%q: window %q accepted", raw, flt.window)
		}
		if (flt.mergeRoute || flt.mergeModel || flt.mergeTeam) && q.Get("merge") == "" {
			t.Fatalf("%q: merges without a merge parameter", raw)
		}
		if flt.route != q.Get("route") || flt.model != q.Get("model") || flt.team != q.Get("team") {
			t.Fatalf("%q: filter %+v", raw, flt)
		}
	})
}
