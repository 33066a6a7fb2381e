package proxy

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-llm/tollgate/ratelimit"
)

// budgetPeekTimeout bounds the limiter read a scrape makes.
const budgetPeekTimeout = time.Second

// budgetCollector exports what is left of each team's budgets, read from the
// limiter at scrape time, so every replica reports the shared state.
type budgetCollector struct {
	g      *Gateway
	tokens *prometheus.Desc
	usd    *prometheus.Desc
}

// BudgetCollector returns a collector of tollgate_budget_remaining_tokens
// and tollgate_budget_remaining_usd per team and window (day, month) of the
// teams with a budget in the running configuration, or nil without a
// limiter. Register it next to the metrics; each scrape costs one limiter
// Peek (one Redis round trip when shared) when a team has a budget.
func (g *Gateway) BudgetCollector(constLabels prometheus.Labels) prometheus.Collector {
	if g.limiter == nil {
		return nil
	}
	return &budgetCollector{g: g,
		tokens: prometheus.NewDesc("tollgate_budget_remaining_tokens",
			"Tokens left in a team's tokens_per_day budget.", []string{"team", "window"}, constLabels),
		usd: prometheus.NewDesc("tollgate_budget_remaining_usd",
			"US dollars left in a team's cost_per_day or cost_per_month budget.", []string{"team", "window"}, constLabels),
	}
}

// budgeted returns the teams of the running configuration with a budget.
func (g *Gateway) budgeted() []ratelimit.Subject {
	var subjects []ratelimit.Subject
	for _, t := range g.gen.Load().gov.teams {
		if t.subject.Limits.HasBudget() {
			subjects = append(subjects, t.subject)
		}
	}
	return subjects
}

func (c *budgetCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.tokens
	ch <- c.usd
}

func (c *budgetCollector) Collect(ch chan<- prometheus.Metric) {
	subjects := c.g.budgeted()
	if len(subjects) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), budgetPeekTimeout)
	defer cancel()
	states, err := c.g.limiter.Peek(ctx, subjects)
	if err != nil {
		// A scrape without these series is better than one that fails:
		// the degraded gauge already says why.
		c.g.log.Debug("budget metrics: limiter unavailable", "err", err)
		return
	}
	for _, st := range states {
		if st.Scope != ratelimit.ScopeTeam {
			continue
		}
		switch st.Kind {
		case ratelimit.KindTokensPerDay:
			ch <- prometheus.MustNewConstMetric(c.tokens, prometheus.GaugeValue, float64(st.Remaining), st.ID, "day")
		case ratelimit.KindCostPerDay:
			ch <- prometheus.MustNewConstMetric(c.usd, prometheus.GaugeValue, float64(st.Remaining)/1e6, st.ID, "day")
		case ratelimit.KindCostPerMonth:
			ch <- prometheus.MustNewConstMetric(c.usd, prometheus.GaugeValue, float64(st.Remaining)/1e6, st.ID, "month")
		}
	}
}
