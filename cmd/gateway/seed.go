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

// budgetSubjects returns the keys (by name, as the ledger's rows name them)
// and the teams that have a budget, as limiter subjects.
func budgetSubjects(cfg *config.Config) (byKey, byTeam map[string]ratelimit.Subject) {
	byKey, byTeam = map[string]ratelimit.Subject{}, map[string]ratelimit.Subject{}
	for i := range cfg.Keys {
		k := &cfg.Keys[i]
		if lim := ratelimit.LimitsFrom(k.Limits); lim.HasBudget() {
			byKey[k.Name] = ratelimit.Subject{Scope: ratelimit.ScopeKey, ID: k.Name, Limits: lim}
		}
	}
	for i := range cfg.Teams {
		t := &cfg.Teams[i]
		if lim := ratelimit.LimitsFrom(t.Limits); lim.HasBudget() {
			byTeam[t.Name] = ratelimit.Subject{Scope: ratelimit.ScopeTeam, ID: t.Name, Limits: lim}
		}
	}
	return byKey, byTeam
}

// used is what one subject's budgets hold: today's tokens and cost, and
// the month's cost.
type used struct{ dayTokens, dayCost, monthCost int64 }

// budgetUsage sums rows into what each key and team with a budget used
// today and this month (now's UTC day and month).
func budgetUsage(rows []spend.Row, cfg *config.Config, now time.Time) map[ratelimit.Subject]*used {
	today := now.UTC().Format(time.DateOnly)
	month := today[:len("2006-01")]
	byKey, byTeam := budgetSubjects(cfg)
	out := map[ratelimit.Subject]*used{}
	for _, r := range rows {
		if len(r.Day) < len(month) || r.Day[:len(month)] != month {
			continue
		}
		for _, s := range [...]struct {
			s  ratelimit.Subject
			ok bool
		}{{byKey[r.KeyID], byKey[r.KeyID].ID != ""}, {byTeam[r.Team], byTeam[r.Team].ID != ""}} {
			if !s.ok {
				continue
			}
			u := out[s.s]
			if u == nil {
				u = &used{}
				out[s.s] = u
			}
			u.monthCost += r.CostMicros
			if r.Day == today {
				u.dayTokens += r.Input + r.Output
				u.dayCost += r.CostMicros
			}
		}
	}
	return out
}

// seedBudgets tells an in-process limiter what every key and team with a
// budget has already used today and this month, from the persisted ledger
// (its state file and the journal's requests after it), so that a restart
// does not hand out a fresh budget. The ledger's tokens
// (input + output) and cost are what the limiter charges at settlement, so
// the seeded state is the state the limiter had when it stopped, less the
// reservations of requests that were open then.
func seedBudgets(ctx context.Context, l *ratelimit.Local, ledger spend.Ledger, cfg *config.Config, now time.Time) error {
	byKey, byTeam := budgetSubjects(cfg)
	if len(byKey)+len(byTeam) == 0 {
		return nil
	}
	now = now.UTC()
	monthStart := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC).Format(time.DateOnly)
	rows, err := ledger.Query(ctx, spend.Filter{From: monthStart, To: now.Format(time.DateOnly)})
	if err != nil {
		return fmt.Errorf("reading this month's spend to restore budgets: %w", err)
	}
	for s, u := range budgetUsage(rows, cfg, now) {
		// Only the windows s has a budget in: another window's usage is
		// not the limiter's to hold (a reload may add just one).
		lim := s.Limits
		l.Seed(s, now, onlyIf(lim.TokensPerDay > 0, u.dayTokens), onlyIf(lim.CostPerDayMicros > 0, u.dayCost),
			onlyIf(lim.CostPerMonthMicros > 0, u.monthCost))
	}
	return nil
}

func onlyIf(ok bool, v int64) int64 {
	if ok {
		return v
	}
	return 0
}

// addedBudgets returns next with, for each key and team, only the budgets
// (tokens_per_day, cost_per_day, cost_per_month) that running did not give
// it, and no rate limits: what a reload must seed from the ledger, since
// the limiter has counted nothing against a budget that did not exist.
func addedBudgets(running, next *config.Config) *config.Config {
	oldKeys, oldTeams := budgetSubjects(running)
	fresh := *next
	fresh.Keys, fresh.Teams = nil, nil
	only := func(was ratelimit.Limits, now config.Limits) (config.Limits, bool) {
		var out config.Limits
		if now.TokensPerDay != nil && was.TokensPerDay == 0 {
			out.TokensPerDay = now.TokensPerDay
		}
		if now.CostPerDayUSD != nil && was.CostPerDayMicros == 0 {
			out.CostPerDayUSD = now.CostPerDayUSD
		}
		if now.CostPerMonthUSD != nil && was.CostPerMonthMicros == 0 {
			out.CostPerMonthUSD = now.CostPerMonthUSD
		}
		return out, ratelimit.LimitsFrom(out).HasBudget()
	}
	for _, k := range next.Keys {
		if lim, ok := only(oldKeys[k.Name].Limits, k.Limits); ok {
			k.Limits = lim
			fresh.Keys = append(fresh.Keys, k)
		}
	}
	for _, t := range next.Teams {
		if lim, ok := only(oldTeams[t.Name].Limits, t.Limits); ok {
			t.Limits = lim
			fresh.Teams = append(fresh.Teams, t)
		}
	}
	return &fresh
}

// refillBudgets charges to Redis's budget counters, which a Redis that lost
// its data lost too, what this replica's own rows say each key and team
// with a budget used today and this month. Each charge's id derives from
// the refill's, so a refill tried again charges nothing twice. The month's
// cost before today is charged to today's window: the counters of a past
// day no longer decide anything.
func refillBudgets(ctx context.Context, rl *ratelimit.Redis, rows []spend.Row, cfg *config.Config, now time.Time, id string) error {
	for s, u := range budgetUsage(rows, cfg, now) {
		// Today's tokens and cost go to the day's counters and the
		// month's; the month's earlier cost to the month's alone (a
		// subject holding only that limit).
		if err := rl.Charge(ctx, []ratelimit.Subject{s}, now, u.dayTokens, u.dayCost,
			id+":"+s.Scope.String()+":"+s.ID+":day"); err != nil {
			return err
		}
		if rest := u.monthCost - u.dayCost; rest > 0 {
			month := s
			month.Limits = ratelimit.Limits{CostPerMonthMicros: s.Limits.CostPerMonthMicros}
			if err := rl.Charge(ctx, []ratelimit.Subject{month}, now, 0, rest,
				id+":"+s.Scope.String()+":"+s.ID+":month"); err != nil {
				return err
			}
		}
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
