// Package spend is the spend ledger: requests, tokens by type and cost, per
// key, team, model and UTC day.
//
// Money is kept in integer micro-dollars. Two backends implement [Ledger]:
// [Local] keeps the ledger in the process, in a state file and in a journal
// of every Add, and [Redis] shares it between replicas. Both make Add cheap:
// Redis's does no I/O, Local's one write into the kernel's page cache (its
// journal line, never an fsync), so the request path never waits for a
// disk or the network.
package spend

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"
)

// DayLayout is the layout of [Key.Day] and of [Filter] days.
const DayLayout = "2006-01-02"

// Day returns t's UTC day in [DayLayout], the Day of a [Key].
func Day(t time.Time) string { return t.UTC().Format(DayLayout) }

// Key identifies one ledger row.
type Key struct {
	// Day is the UTC day of the request, in DayLayout ("2006-01-02").
	Day string
	// KeyID is the short hash or name of the caller's key, never the key.
	KeyID string
	Team  string
	Model string
}

// Totals are additive counters. Input includes CacheRead and CacheWrite,
// Output includes Reasoning (as in llm.Usage).
type Totals struct {
	Requests   int64
	Input      int64
	Output     int64
	CacheRead  int64
	CacheWrite int64
	Reasoning  int64
	CostMicros int64
}

// Add adds o to t.
func (t *Totals) Add(o Totals) {
	t.Requests += o.Requests
	t.Input += o.Input
	t.Output += o.Output
	t.CacheRead += o.CacheRead
	t.CacheWrite += o.CacheWrite
	t.Reasoning += o.Reasoning
	t.CostMicros += o.CostMicros
}

// Row is one ledger row.
type Row struct {
	Key
	Totals
}

// Filter selects rows. Empty fields match everything; From and To are
// inclusive UTC days in DayLayout.
type Filter struct {
	Team, KeyID, Model, From, To string
}

// validate checks the filter's days, so that a typo in a date range is an
// error rather than an empty answer.
func (f Filter) validate() error {
	for _, d := range [...]struct{ name, v string }{{"from", f.From}, {"to", f.To}} {
		if d.v == "" {
			continue
		}
		if _, err := time.Parse(DayLayout, d.v); err != nil {
			return fmt.Errorf("spend: filter %s %q is not a day (YYYY-MM-DD): %w", d.name, d.v, err)
		}
	}
	return nil
}

// matchDay reports whether day is within the filter's range; days compare
// as strings because DayLayout sorts chronologically.
func (f Filter) matchDay(day string) bool {
	return (f.From == "" || day >= f.From) && (f.To == "" || day <= f.To)
}

// match reports whether the filter selects k.
func (f Filter) match(k Key) bool {
	return f.matchDay(k.Day) && (f.Team == "" || k.Team == f.Team) &&
		(f.KeyID == "" || k.KeyID == f.KeyID) && (f.Model == "" || k.Model == f.Model)
}

// sortRows sorts rows by day, team, key and model.
func sortRows(rows []Row) {
	slices.SortFunc(rows, func(a, b Row) int {
		return cmp.Or(cmp.Compare(a.Day, b.Day), cmp.Compare(a.Team, b.Team),
			cmp.Compare(a.KeyID, b.KeyID), cmp.Compare(a.Model, b.Model))
	})
}

// Ledger records spend and answers queries about it.
type Ledger interface {
	// Add records one request's usage. admitted is when the request was
	// admitted (its lease's time), kept by a Local journal so that a
	// restart can restore in-process rate limits. It never waits for a
	// disk or the network and never fails: a backend that cannot write now
	// keeps the delta and writes it later.
	Add(k Key, t Totals, admitted time.Time)
	// Query returns matching rows sorted by day, team, key and model.
	Query(ctx context.Context, f Filter) ([]Row, error)
	// Flush writes everything recorded so far (state file or Redis) before
	// returning, or returns the error.
	Flush(ctx context.Context) error
	// Close stops the background flusher and flushes one last time.
	Close() error
}
