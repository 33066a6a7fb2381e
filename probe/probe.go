// Package probe is tollgate's synthetic probe ([probe] in gateway.toml): it
// owns the schedule of the probe's rounds and the tollgate_probe_* results.
// Each [[probe.targets]] table (an upstream and a model) gets its own rounds,
// in its own goroutine: the first 1 to 5 seconds after Run starts, at a
// random moment so that replicas do not probe in step, then one every
// interval_seconds from the start of the last. A round sends [probe] requests
// requests, concurrency at a time, each bounded by timeout_seconds, and
// records every result and, once the round is over, its success ratio and
// time.
//
// The requests themselves are not this package's: each goes through the
// gateway's own path (proxy.Gateway.Probe), pinned to the target's upstream,
// and is kept out of every user figure there.
package probe

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/metrics"
)

// Prober sends one probe request; *proxy.Gateway is one (this package
// does not import proxy: the types are llm's).
type Prober interface {
	Probe(ctx context.Context, t llm.ProbeTarget) (llm.ProbeResult, error)
}

// Clock is the time the schedule runs on.
type Clock interface {
	Now() time.Time
	// After sends the time on the channel once d has passed (at once when
	// d <= 0).
	After(d time.Duration) <-chan time.Time
}

// realClock is the wall clock.
type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// First rounds start between firstMin and firstMin+firstSpread after Run.
const (
	firstMin    = time.Second
	firstSpread = 4 * time.Second
)

// Options holds the Scheduler's optional parts.
type Options struct {
	// Logger receives a line per round (Warn when a request failed, Debug
	// otherwise). Nil: slog.Default().
	Logger *slog.Logger
	// Clock times the rounds. Nil: the wall clock. The requests' own
	// timeouts always run on the wall clock.
	Clock Clock
	// Rand returns numbers in [0, 1) that place each target's first round.
	// Nil: math/rand/v2.
	Rand func() float64
}

// Scheduler runs the probe's rounds. Create it with New.
type Scheduler struct {
	prober   Prober
	metrics  *metrics.Metrics
	log      *slog.Logger
	clock    Clock
	rand     func() float64
	targets  []llm.ProbeTarget
	interval time.Duration
	timeout  time.Duration
	requests int
	conc     int
}

// New returns a Scheduler for cfg's [probe] table; nil when the probe is
// off. p sends the requests and m receives the results.
func New(cfg *config.Config, p Prober, m *metrics.Metrics, opts Options) (*Scheduler, error) {
	pc := cfg.Probe
	if !pc.Enabled {
		return nil, nil
	}
	if p == nil || m == nil {
		return nil, errors.New("probe: a Prober and Metrics are required")
	}
	if len(pc.Targets) == 0 {
		return nil, errors.New("probe: enabled without a target")
	}
	s := &Scheduler{
		prober: p, metrics: m, log: opts.Logger, clock: opts.Clock, rand: opts.Rand,
		interval: config.Seconds(pc.IntervalSeconds),
		timeout:  config.Seconds(pc.TimeoutSeconds),
		requests: max(pc.Requests, 1),
		conc:     max(pc.Concurrency, 1),
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.clock == nil {
		s.clock = realClock{}
	}
	if s.rand == nil {
		s.rand = rand.Float64
	}
	for _, t := range pc.Targets {
		if u := cfg.UpstreamByName(t.Upstream); u != nil && u.APIKeyEnv == "" {
			// Right for a keyless server (a self-hosted vLLM, usually
			// plain http: only noted); for a provider's https endpoint
			// every probe would be refused and the upstream blamed.
			level := slog.LevelInfo
			if strings.HasPrefix(strings.ToLower(u.BaseURL), "https:") {
				level = slog.LevelWarn
			}
			s.log.Log(context.Background(), level, "probe target's upstream has no api_key_env: its probes go "+
				"without a key (right for a server that needs none; one that needs a key answers 401, "+
				"result auth_error)", "upstream", t.Upstream, "model", t.Model)
		}
		s.targets = append(s.targets, llm.ProbeTarget{Upstream: t.Upstream, Model: t.Model,
			Dialect: cfg.ProbeDialect(t), Prompt: pc.Prompt, MaxTokens: pc.MaxTokens})
	}
	return s, nil
}

// Run runs every target's rounds until ctx is done, then returns once the
// requests in flight (cancelled with ctx) have ended. A round ended by ctx
// (shutdown) leaves the success ratio and round time as they were; one cut
// at the next round's start counts its unfinished requests as
// probe_timeout.
func (s *Scheduler) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, t := range s.targets {
		first := firstMin + time.Duration(s.rand()*float64(firstSpread))
		wg.Go(func() { s.runTarget(ctx, t, first) })
	}
	wg.Wait()
}

// runTarget runs one target's rounds: the first after first, each next one
// interval after the last was due (not after it started, so that timer
// lateness does not add up), at once if the last ran past that.
func (s *Scheduler) runTarget(ctx context.Context, t llm.ProbeTarget, first time.Duration) {
	due := s.clock.Now().Add(first)
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.clock.After(due.Sub(s.clock.Now())):
		}
		if !s.round(ctx, t) {
			return
		}
		due = due.Add(s.interval)
		if now := s.clock.Now(); due.Before(now) {
			due = now
		}
	}
}

// round sends one round of requests to t and records them; false when the
// target cannot be probed at all (or ctx is done), which ends its rounds.
func (s *Scheduler) round(ctx context.Context, t llm.ProbeTarget) bool {
	var (
		next    atomic.Int64
		mu      sync.Mutex
		results = map[string]int{}
		bad     atomic.Bool
		wg      sync.WaitGroup
	)
	// A round ends by the next one's start: a hanging upstream must not
	// stretch it (and leave the ratio stale) for requests × timeout.
	roundCtx, endRound := context.WithTimeout(ctx, s.interval)
	defer endRound()
	for range min(s.conc, s.requests) {
		wg.Go(func() {
			for next.Add(1) <= int64(s.requests) && roundCtx.Err() == nil {
				rctx, cancel := context.WithTimeout(roundCtx, s.timeout)
				res, err := s.prober.Probe(rctx, t)
				cancel()
				if err != nil {
					if !bad.Swap(true) {
						s.log.Error("probe target cannot be probed; its rounds stop", "upstream", t.Upstream,
							"model", t.Model, "err", err)
					}
					return
				}
				if res.Result == llm.ProbeCanceled {
					return // shutting down: no verdict on the upstream
				}
				s.metrics.ObserveProbe(t.Upstream, t.Model, metrics.ProbeSample{Result: res.Result,
					TTFT: res.TTFT, TPOT: res.TPOT, E2E: res.E2E, HasTTFT: res.HasTTFT, HasTPOT: res.HasTPOT})
				mu.Lock()
				results[res.Result]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if bad.Load() || ctx.Err() != nil {
		return false
	}
	n := 0
	for _, c := range results {
		n += c
	}
	if n == 0 {
		return true
	}
	ratio := float64(results["ok"]) / float64(n)
	s.metrics.ProbeRound(t.Upstream, t.Model, ratio, s.clock.Now())
	level := slog.LevelDebug
	if ratio < 1 {
		level = slog.LevelWarn
	}
	s.log.Log(ctx, level, "probe round", "upstream", t.Upstream, "model", t.Model,
		"requests", n, "success_ratio", ratio, "results", summary(results))
	return true
}

// summary renders results by count as "ok=7 overloaded=3", sorted by name.
func summary(results map[string]int) string {
	names := make([]string, 0, len(results))
	for r := range results {
		names = append(names, r)
	}
	sort.Strings(names)
	var b strings.Builder
	for i, r := range names {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(r + "=" + strconv.Itoa(results[r]))
	}
	return b.String()
}
