package main

import (
	"context"
	"fmt"
	"time"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/ratelimit"
	"github.com/tollgate-llm/tollgate/spend"
)

// seedBudgets tells an in-process limiter what every key and team with a
// budget has already used today and this month, from the persisted ledger,
// so that a restart does not hand out a fresh budget. The ledger's tokens
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
