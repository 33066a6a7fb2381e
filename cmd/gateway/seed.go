package main

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/ratelimit"
	"github.com/tollgate-llm/tollgate/spend"
)

// seedBudgets tells an in-process limiter what every key and team with a
// budget has already used today and this month, from the persisted ledger
// (its state file and the journal's requests after it), so that a restart
// does not hand out a fresh budget. The ledger's tokens
// (input + output) and cost are what the limiter charges at settlement, so
// the seeded state is the state the limiter had when it stopped, less the
// reservations of requests that were open then.
func seedBudgets(ctx context.Context, l *ratelimit.Local, ledger spend.Ledger, cfg *config.Config, now time.Time) error {
	now = now.UTC()
	today := now.Format(time.DateOnly)
	monthStart := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC).Format(time.DateOnly)
	type used struct{ dayTokens, dayCost, monthCost int64 }
	subjects := map[ratelimit.Subject]*used{}
	byKey, byTeam := map[string]*used{}, map[string]*used{}
	for i := range cfg.Keys {
		k := &cfg.Keys[i]
		if lim := ratelimit.LimitsFrom(k.Limits); lim.HasBudget() {
			u := &used{}
			subjects[ratelimit.Subject{Scope: ratelimit.ScopeKey, ID: k.Name, Limits: lim}] = u
			byKey[k.Name] = u
		}
	}
	for i := range cfg.Teams {
		t := &cfg.Teams[i]
		if lim := ratelimit.LimitsFrom(t.Limits); lim.HasBudget() {
			u := &used{}
			subjects[ratelimit.Subject{Scope: ratelimit.ScopeTeam, ID: t.Name, Limits: lim}] = u
			byTeam[t.Name] = u
		}
	}
	if len(subjects) == 0 {
		return nil
	}
	rows, err := ledger.Query(ctx, spend.Filter{From: monthStart, To: today})
	if err != nil {
		return fmt.Errorf("reading this month's spend to restore budgets: %w", err)
	}
	for _, r := range rows {
		for _, u := range []*used{byKey[r.KeyID], byTeam[r.Team]} {
			if u == nil {
				continue
			}
			u.monthCost += r.CostMicros
			if r.Day == today {
				u.dayTokens += r.Input + r.Output
				u.dayCost += r.CostMicros
			}
		}
	}
	for s, u := range subjects {
		l.Seed(s, now, u.dayTokens, u.dayCost, u.monthCost)
	}
	return nil
}

// rateSeeder collects, from the spend journal as the ledger replays it, the
// billed requests of keys and teams with an rpm or tpm, and then charges
// them to an in-process limiter at their admission instants, so that a
// restart grants no fresh burst: the buckets are as the billed requests
// left them. The journal holds at least the last minute, all that a
// per-minute bucket remembers. Requests admitted but not yet billed when
// the process stopped are not in it and are not charged.
type rateSeeder struct {
	keys, teams map[string]ratelimit.Subject
	entries     []spend.Entry
}

// newRateSeeder indexes the subjects of cfg with rate limits.
func newRateSeeder(cfg *config.Config) *rateSeeder {
	r := &rateSeeder{keys: map[string]ratelimit.Subject{}, teams: map[string]ratelimit.Subject{}}
	for i := range cfg.Keys {
		k := &cfg.Keys[i]
		if lim := ratelimit.LimitsFrom(k.Limits); lim.RPM > 0 || lim.TPM > 0 {
			r.keys[k.Name] = ratelimit.Subject{Scope: ratelimit.ScopeKey, ID: k.Name, Limits: lim}
		}
	}
	for i := range cfg.Teams {
		t := &cfg.Teams[i]
		if lim := ratelimit.LimitsFrom(t.Limits); lim.RPM > 0 || lim.TPM > 0 {
			r.teams[t.Name] = ratelimit.Subject{Scope: ratelimit.ScopeTeam, ID: t.Name, Limits: lim}
		}
	}
	return r
}

// add keeps a journal entry that charges a rate-limited key or team.
func (r *rateSeeder) add(e spend.Entry) {
	_, k := r.keys[e.KeyID]
	_, t := r.teams[e.Team]
	if k || t {
		r.entries = append(r.entries, e)
	}
}

// seed charges the kept entries to l in order of admission (the journal is
// in order of billing: a long stream is billed after shorter ones admitted
// later), each with its requests and its input and output tokens, as
// Settle charged them, and forgets them.
func (r *rateSeeder) seed(l *ratelimit.Local) {
	slices.SortStableFunc(r.entries, func(a, b spend.Entry) int { return cmp.Compare(a.Admitted.UnixNano(), b.Admitted.UnixNano()) })
	for _, e := range r.entries {
		tokens := e.Input + e.Output
		if s, ok := r.keys[e.KeyID]; ok {
			l.ChargeRates(s, e.Admitted, e.Requests, tokens)
		}
		if s, ok := r.teams[e.Team]; ok {
			l.ChargeRates(s, e.Admitted, e.Requests, tokens)
		}
	}
	r.entries = nil
}
