package proxy

import (
	"math/rand/v2"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/internal/shaper"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/metrics"
)

// upstream is a configured upstream with its transport and the state the
// resilience rules keep for it: retry policy and budget, circuit
// breaker, shaping queue and phase timeouts.
type upstream struct {
	cfg       *config.Upstream
	transport http.RoundTripper
	// origin is the base URL's scheme://host[:port]: in passthrough mode a
	// caller's key goes only to upstreams at the origin its route starts
	// with.
	origin string
	// timeout bounds one attempt whole; headerTimeout the wait for a
	// stream's headers, firstToken the wait for its first token, idle the
	// gap between reads after it (0 = off).
	timeout, headerTimeout, firstToken, idle time.Duration

	policy  retryPolicy
	budget  *retryBudget
	breaker *breaker // nil when [upstreams.breaker] is off
	shaper  *shaper.Shaper

	// replaced is set once a reload has put another upstream of this name
	// in its place, or none: the exchanges still on this one no longer
	// write the upstream's circuit and queue gauges, which are the new
	// one's.
	replaced atomic.Bool
}

// newUpstream builds the runtime state of one [[upstreams]] table.
func newUpstream(u *config.Upstream, t http.RoundTripper, now func() time.Time, m *metrics.Metrics) *upstream {
	up := &upstream{
		cfg:           u,
		origin:        u.Origin(),
		transport:     t,
		timeout:       config.Seconds(u.TimeoutSeconds),
		headerTimeout: config.Seconds(u.HeaderTimeoutSeconds),
		firstToken:    config.Seconds(u.FirstTokenTimeoutSeconds),
		idle:          config.Seconds(u.IdleTimeoutSeconds),
		policy:        policyFrom(u.Retry),
		budget:        newRetryBudget(u.Retry.BudgetRatio, u.Retry.BudgetMinPerSecond, 10*time.Second, now),
		shaper: shaper.New(u.MaxConcurrent, u.RequestsPerSecond, u.QueueSize,
			config.Seconds(u.QueueTimeoutSeconds)),
	}
	name := u.Name
	if up.shaper != nil {
		up.shaper.OnWaiting = func(n int) {
			if !up.replaced.Load() {
				m.SetQueueWaiting(name, n)
			}
		}
	}
	if b := u.Breaker; b.Enabled {
		up.breaker = newBreaker(breakerFrom(b), now, func(_, to breakerState) {
			if !up.replaced.Load() {
				m.SetCircuitState(name, circuitMetric(to))
			}
		})
	}
	return up
}

// circuitMetric is the value of tollgate_upstream_circuit_state for s.
func circuitMetric(s breakerState) int {
	switch s {
	case breakerOpen:
		return metrics.CircuitOpen
	case breakerHalfOpen:
		return metrics.CircuitHalfOpen
	}
	return metrics.CircuitClosed
}

// policyFrom converts an [upstreams.retry] table.
func policyFrom(r config.Retry) retryPolicy {
	p := retryPolicy{
		maxAttempts: r.MaxAttempts,
		base:        config.Millis(r.BaseDelayMs),
		max:         config.Millis(r.MaxDelayMs),
		multiplier:  r.Multiplier,
		maxWait:     config.Seconds(r.MaxWaitSeconds),
		statuses:    make(map[int]bool, len(r.Statuses)),
	}
	for _, s := range r.Statuses {
		p.statuses[s] = true
	}
	return p
}

// allow asks the upstream's breaker for a ticket; without a breaker every
// request may go.
func (up *upstream) allow() (ticket, bool) {
	if up.breaker == nil {
		return ticket{}, true
	}
	return up.breaker.allow()
}

// allowOrBypass is allow for a request that no other upstream of its route
// would take: a refusing breaker issues a bypass ticket (breaker.allowOrBypass).
func (up *upstream) allowOrBypass() ticket {
	if up.breaker == nil {
		return ticket{}
	}
	return up.breaker.allowOrBypass()
}

// retryIn is how long until the upstream's open breaker lets probes through.
func (up *upstream) retryIn() time.Duration {
	if up.breaker == nil {
		return 0
	}
	return up.breaker.retryIn()
}

// target is one upstream of a request's route, with the model name sent to
// it ("" keeps the caller's).
type target struct {
	up    *upstream
	model string
}

// routing holds, per dialect, the ordered targets of every [[routes]] table
// and of requests no route matches.
type routing struct {
	cfg     *config.Config
	byRoute [][3][]target // [route][dialect]; DialectNone unused
	// fallback[d] is every upstream serving d, in file order;
	// fallback[DialectNone] the first upstream.
	fallback [3][]target
}

// newRouting resolves the configuration's routes to upstreams once, so that
// choosing a request's targets costs a pattern match and no allocation.
func newRouting(cfg *config.Config, byName map[string]*upstream, ordered []*upstream) *routing {
	rt := &routing{cfg: cfg, byRoute: make([][3][]target, len(cfg.Routes))}
	for _, d := range []llm.Dialect{llm.DialectOpenAI, llm.DialectAnthropic} {
		for _, up := range ordered {
			if up.cfg.Serves(d) {
				rt.fallback[d] = append(rt.fallback[d], target{up: up})
			}
		}
	}
	if len(ordered) > 0 {
		rt.fallback[llm.DialectNone] = []target{{up: ordered[0]}}
	}
	for i, r := range cfg.Routes {
		for _, name := range r.Upstreams {
			up := byName[name]
			if up == nil {
				continue // Validate refuses this; keep New total anyway
			}
			t := target{up: up, model: r.Rename[name]}
			for _, d := range []llm.Dialect{llm.DialectOpenAI, llm.DialectAnthropic} {
				if up.cfg.Serves(d) {
					rt.byRoute[i][d] = append(rt.byRoute[i][d], t)
				}
			}
		}
	}
	return rt
}

// targets returns the upstreams a request of dialect d for model goes to, in
// order: its route's (the first whose pattern matches), or every upstream
// serving d. A request on another /v1/* path asks with the dialect its
// path and headers suggest (exchange.targets), and goes to the first
// upstream (fallback[DialectNone]) when no upstream serves that dialect.
func (rt *routing) targets(d llm.Dialect, model string) []target {
	if model != "" {
		if i := rt.cfg.RouteIndex(model); i >= 0 {
			return rt.byRoute[i][d]
		}
	}
	return rt.fallback[d]
}

// jitter is the random source of the backoff's full jitter.
func jitter() float64 { return rand.Float64() }
