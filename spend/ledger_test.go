package spend

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// add is one Add call of a test.
type add struct {
	k Key
	t Totals
}

// sampleAdds returns adds over several days, teams, keys and models,
// including names with separators and non-ASCII bytes.
func sampleAdds() []add {
	var out []add
	days := []string{"2026-11-29", "2026-11-30", "2026-12-01"}
	teams := []string{"search", "ads", ""}
	keyIDs := []string{"k1", "k:2|x", "ключ"}
	models := []string{"gpt-4o", "claude-sonnet-4-5", "3:a:b:c"}
	i := int64(0)
	for _, d := range days {
		for _, tm := range teams {
			for _, k := range keyIDs {
				for _, m := range models {
					i++
					out = append(out, add{Key{Day: d, KeyID: k, Team: tm, Model: m},
						Totals{Requests: 1, Input: 100 + i, Output: 10 + i, CacheRead: i % 7, CacheWrite: i % 3,
							Reasoning: i % 5, CostMicros: 1000*i + 1}})
				}
			}
		}
	}
	// Every row twice, so rows are sums of several adds.
	return append(out, out...)
}

// expectRows sums adds selected by f, with its own matching code, into
// sorted rows.
func expectRows(adds []add, f Filter) []Row {
	m := map[Key]Totals{}
	for _, a := range adds {
		k := a.k
		if f.Team != "" && k.Team != f.Team || f.KeyID != "" && k.KeyID != f.KeyID ||
			f.Model != "" && k.Model != f.Model || f.From != "" && k.Day < f.From || f.To != "" && k.Day > f.To {
			continue
		}
		t := m[k]
		t.Add(a.t)
		m[k] = t
	}
	rows := make([]Row, 0, len(m))
	for _, k := range slices.Collect(maps.Keys(m)) {
		rows = append(rows, Row{Key: k, Totals: m[k]})
	}
	slices.SortFunc(rows, func(a, b Row) int {
		return strings.Compare(fmt.Sprint(a.Day, "\x00", a.Team, "\x00", a.KeyID, "\x00", a.Model),
			fmt.Sprint(b.Day, "\x00", b.Team, "\x00", b.KeyID, "\x00", b.Model))
	})
	return rows
}

var sampleFilters = []Filter{
	{},
	{Team: "search"},
	{Team: ""},
	{KeyID: "k:2|x"},
	{Model: "3:a:b:c"},
	{From: "2026-11-30"},
	{To: "2026-11-30"},
	{From: "2026-11-30", To: "2026-11-30"},
	{From: "2026-12-01", To: "2026-11-29"},
	{Team: "ads", KeyID: "ключ", Model: "gpt-4o", From: "2026-11-29", To: "2026-12-01"},
	{Team: "nobody"},
}

// checkQueries checks every sample filter against expectRows.
func checkQueries(t *testing.T, l Ledger, adds []add) {
	t.Helper()
	for _, f := range sampleFilters {
		got, err := l.Query(context.Background(), f)
		if err != nil {
			t.Fatalf("Query(%+v): %v", f, err)
		}
		want := expectRows(adds, f)
		if len(got) == 0 && len(want) == 0 {
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("Query(%+v):\n got %d rows %+v\nwant %d rows %+v", f, len(got), got, len(want), want)
		}
	}
	for _, f := range []Filter{{From: "2026-13-01"}, {To: "yesterday"}} {
		if _, err := l.Query(context.Background(), f); err == nil || !strings.HasPrefix(err.Error(), "spend: ") {
			t.Errorf("Query(%+v) error = %v, want a spend: error", f, err)
		}
	}
}

// sumRows totals rows.
func sumRows(rows []Row) Totals {
	var s Totals
	for _, r := range rows {
		s.Add(r.Totals)
	}
	return s
}
