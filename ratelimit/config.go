package ratelimit

import "github.com/tollgate-llm/tollgate/config"

// LimitsFrom converts the limits of a [[keys]] or [[teams]] table to the
// limiter's units (a limit left out is 0, unlimited; dollars become
// micro-dollars).
func LimitsFrom(l config.Limits) Limits {
	get := func(p *int64) int64 {
		if p == nil {
			return 0
		}
		return *p
	}
	usd := func(p *float64) int64 {
		if p == nil {
			return 0
		}
		return config.USDToMicros(*p)
	}
	return Limits{RPM: get(l.RPM), TPM: get(l.TPM), Concurrency: get(l.Concurrency),
		TokensPerDay: get(l.TokensPerDay), CostPerDayMicros: usd(l.CostPerDayUSD), CostPerMonthMicros: usd(l.CostPerMonthUSD)}
}
