package proxy

import (
	"errors"
	"net/http"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/metrics"
)

// generation is what one configuration decides on the request path: who the
// callers are and what they may spend, the upstreams and the routes to
// them, the objectives. An exchange takes the current generation when it
// begins and keeps it to its end, so a reload never changes a request in
// flight; the next request sees the new one.
type generation struct {
	cfg       *config.Config
	gov       *governance
	upstreams []*upstream
	routing   *routing
	slo       llm.SLOTargets

	// open counts the exchanges begun under this generation that have not
	// finished. Once the generation is replaced and open reaches zero, the
	// idle connections of the upstreams the new one dropped are closed.
	open    atomic.Int64
	retired atomic.Bool
	dropped []*upstream // set before retired
	close   sync.Once

	// ended is closed once this generation and every one before it have
	// no exchange left: everything begun before the next one took over
	// has finished. The chain (prev, next, own, done) is under chain, the
	// Gateway's.
	chain      *sync.Mutex
	prev, next *generation
	own, done  bool // its own exchanges have ended; ended is closed
	ended      chan struct{}
}

// newGeneration builds the generation of cfg. An upstream whose table is
// unchanged from prev's keeps its breaker, retry budget, shaping queue and
// connections; a new or changed one gets its own.
func (g *Gateway) newGeneration(cfg *config.Config, prev *generation) (*generation, error) {
	gov, err := newGovernance(cfg, g.limiter, g.ledger)
	if err != nil {
		return nil, err
	}
	if gov.hasLimits() && g.limiter == nil {
		return nil, errors.New("proxy: the configuration sets limits but Options.Limiter is nil")
	}
	gov.now = g.now
	// The runtime keys as this configuration sees them (its teams, its
	// [[keys]] names), built before it serves: SetRuntimeKeys and Reload
	// hold reloadMu, so none is missed.
	gov.runtime.Store(newRuntimeIndex(gov, g.runtimeKeys))
	gen := &generation{cfg: cfg, gov: gov, slo: cfg.SLOTargets(), chain: &g.chainMu, prev: prev, ended: make(chan struct{})}
	kept := map[string]*upstream{}
	if prev != nil {
		for _, up := range prev.upstreams {
			kept[up.cfg.Name] = up
		}
	}
	byName := make(map[string]*upstream, len(cfg.Upstreams))
	for i := range cfg.Upstreams {
		u := &cfg.Upstreams[i]
		up := kept[u.Name]
		if up == nil || !reflect.DeepEqual(*up.cfg, *u) {
			t := g.transport
			if t == nil {
				t = newTransport(u)
			}
			up = newUpstream(u, t, g.now, g.metrics)
		}
		gen.upstreams = append(gen.upstreams, up)
		byName[u.Name] = up
	}
	gen.routing = newRouting(cfg, byName, gen.upstreams)
	return gen, nil
}

// begin takes the current generation for an exchange; end must follow.
func (g *Gateway) begin() *generation {
	gen := g.gen.Load()
	gen.open.Add(1)
	return gen
}

// end releases an exchange's generation.
func (gen *generation) end() {
	if gen.open.Add(-1) == 0 && gen.retired.Load() {
		gen.closeDropped()
	}
}

// retire marks gen replaced by next and, once its exchanges have ended,
// closes the idle connections of the upstreams next does not use.
func (gen *generation) retire(next *generation) {
	inUse := make(map[*upstream]bool, len(next.upstreams))
	for _, up := range next.upstreams {
		inUse[up] = true
	}
	for _, up := range gen.upstreams {
		if !inUse[up] {
			gen.dropped = append(gen.dropped, up)
			up.replaced.Store(true)
		}
	}
	gen.chain.Lock()
	gen.next = next
	gen.chain.Unlock()
	gen.retired.Store(true)
	if gen.open.Load() == 0 {
		gen.closeDropped()
	}
}

// closeDropped closes the idle connections of the dropped upstreams'
// transports, once. A transport shared with a kept upstream (Options.Transport)
// only loses idle connections, which it dials again.
func (gen *generation) closeDropped() {
	gen.close.Do(func() {
		for _, up := range gen.dropped {
			if t, ok := up.transport.(interface{ CloseIdleConnections() }); ok && up.transport != http.DefaultTransport {
				t.CloseIdleConnections()
			}
		}
		gen.chain.Lock()
		gen.own = true
		gen.chain.Unlock()
		gen.endChain()
	})
}

// endChain closes ended when gen and every generation before it have no
// exchange left, and passes the word on to the next.
func (gen *generation) endChain() {
	gen.chain.Lock()
	defer gen.chain.Unlock()
	for ; gen != nil; gen = gen.next {
		if gen.done || !gen.own || gen.prev != nil && !gen.prev.done {
			return
		}
		gen.done = true
		gen.prev = nil // what came before has ended: let it go
		close(gen.ended)
	}
}

// Reload swaps cfg in: requests that begin from now on run under it, those
// in flight finish under the configuration they began with. cfg must be
// loaded and validated, and differ from the running configuration only in
// what reloads (config.ReloadChanges); on error nothing changes. The channel
// returned is closed once every request begun before the swap, under this
// configuration or an earlier one, has finished (settled and billed).
func (g *Gateway) Reload(cfg *config.Config) (<-chan struct{}, error) {
	g.reloadMu.Lock()
	defer g.reloadMu.Unlock()
	prev := g.gen.Load()
	if _, err := config.ReloadChanges(prev.cfg, cfg); err != nil {
		return nil, err
	}
	next, err := g.newGeneration(cfg, prev)
	if err != nil {
		return nil, err
	}
	g.metrics.Reconfigure(cfg)
	g.gen.Store(next)
	prev.retire(next)
	if n := g.sockets.reconfigured(next.upstreams); n > 0 {
		g.log.Info("config reload: closing the Responses WebSockets on a changed or removed upstream, each once idle",
			"sockets", n)
	}
	// An upstream built anew starts closed with an empty queue: its gauges
	// say so, whatever the one it replaced last wrote.
	for _, up := range next.upstreams {
		if !slices.Contains(prev.upstreams, up) {
			g.metrics.SetCircuitState(up.cfg.Name, metrics.CircuitClosed)
			g.metrics.SetQueueWaiting(up.cfg.Name, 0)
		}
	}
	return prev.ended, nil
}

// Config returns the running configuration. It must not be modified.
func (g *Gateway) Config() *config.Config { return g.gen.Load().cfg }
