package proxy

import (
	"errors"
	"net/http"
	"reflect"
	"sync"
	"sync/atomic"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
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
	open        atomic.Int64
	retired     atomic.Bool
	dropped     []*upstream // set before retired
	close       sync.Once
	dropsClosed atomic.Bool
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
	gen := &generation{cfg: cfg, gov: gov, slo: cfg.SLOTargets()}
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
		}
	}
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
		gen.dropsClosed.Store(true)
	})
}

// Reload swaps cfg in: requests that begin from now on run under it, those
// in flight finish under the configuration they began with. cfg must be
// loaded and validated, and differ from the running configuration only in
// what reloads (config.ReloadChanges); on error nothing changes.
func (g *Gateway) Reload(cfg *config.Config) error {
	g.reloadMu.Lock()
	defer g.reloadMu.Unlock()
	prev := g.gen.Load()
	if _, err := config.ReloadChanges(prev.cfg, cfg); err != nil {
		return err
	}
	next, err := g.newGeneration(cfg, prev)
	if err != nil {
		return err
	}
	g.metrics.Reconfigure(cfg)
	g.gen.Store(next)
	prev.retire(next)
	return nil
}

// Config returns the running configuration. It must not be modified.
func (g *Gateway) Config() *config.Config { return g.gen.Load().cfg }
