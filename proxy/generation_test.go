package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/metrics"
	"github.com/tollgate-llm/tollgate/ratelimit"
)

// reloadFixture is a gateway in mode "keys" whose upstream "main" is old
// (a gate that holds its stream until opened) and a second upstream, new,
// that answers at once; the config is built by edit over a base of key
// alpha in team search and gpt-* priced 1 and 2 µ$ a token.
type reloadFixture struct {
	tg       *testGateway
	old, new *gateUpstream
	oldURL   string
	newURL   string
}

// reloadConfig is the fixture's base config, changed by edit.
func (fx *reloadFixture) config(t *testing.T, edit func(*config.Config)) config.Config {
	return testConfig(t, fx.oldURL, func(c *config.Config) {
		c.Auth.Mode = "keys"
		c.Upstreams[0].Name = "main"
		c.Models = []config.Model{{Pattern: "gpt-*", InputUSDPerMTok: 1, OutputUSDPerMTok: 2}}
		c.Teams = []config.Team{{Name: "search"}}
		c.Keys = []config.Key{{Name: "alpha", SHA256: sha(keyAlpha), Team: "search"}}
		if edit != nil {
			edit(c)
		}
	})
}

func newReloadFixture(t *testing.T) *reloadFixture {
	t.Helper()
	rest := openAITok1 + openAIStop + openAIUsage + openAIDone
	fx := &reloadFixture{old: newGateUpstream(openAIRole, rest), new: newGateUpstream(openAIRole, rest)}
	fx.new.open()
	oldSrv, newSrv := httptest.NewServer(fx.old), httptest.NewServer(fx.new)
	t.Cleanup(oldSrv.Close)
	t.Cleanup(newSrv.Close)
	fx.oldURL, fx.newURL = oldSrv.URL, newSrv.URL
	cfg := fx.config(t, nil)
	lim := ratelimit.NewLocal(ratelimit.LocalOptions{})
	t.Cleanup(func() { _ = lim.Close() })
	ledger := newLocalLedger(t)
	fx.tg = newTestGatewayWith(t, fx.oldURL, func(c *config.Config) { *c = cfg },
		func(o *Options) { o.Limiter, o.Ledger = lim, ledger })
	return fx
}

const reloadStreamBody = `{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`

func bearer(key string) map[string]string { return map[string]string{"Authorization": "Bearer " + key} }

// A stream open across a reload finishes byte-exact, on the upstream (which
// the reload removed), key and prices it began with; the next requests see
// the new config at once: the removed key is refused, the added one
// admitted on the new upstream and billed at the new price.
func TestReloadLeavesExchangesInFlightUnderTheirConfig(t *testing.T) {
	fx := newReloadFixture(t)
	tg := fx.tg
	inFlight := make(chan sendResult, 1)
	go func() {
		inFlight <- sendRequest(testCtx(t), http.MethodPost, tg.URL+"/v1/chat/completions", "application/json",
			reloadStreamBody, bearer(keyAlpha))
	}()
	fx.old.waitArrived(t)

	next := fx.config(t, func(c *config.Config) {
		// "main" removed, "next" added in its place.
		c.Upstreams[0].Name, c.Upstreams[0].BaseURL = "next", fx.newURL
		c.Models[0].InputUSDPerMTok, c.Models[0].OutputUSDPerMTok = 10, 20
		c.Keys = []config.Key{{Name: "beta", SHA256: sha(keyBeta), Team: "search"}}
	})
	if _, err := tg.gw.Reload(&next); err != nil {
		t.Fatal(err)
	}
	if tg.gw.Config() != &next {
		t.Fatal("Config() is not the reloaded configuration")
	}

	resp, body := post(t, tg.URL+"/v1/chat/completions", reloadStreamBody, bearer(keyAlpha))
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), "invalid API key") {
		t.Fatalf("removed key: %d %s, want 401 invalid API key", resp.StatusCode, body)
	}
	if rec := tg.record(t); rec.Status != http.StatusUnauthorized {
		t.Fatalf("removed key's record: status %d", rec.Status)
	}
	resp, body = post(t, tg.URL+"/v1/chat/completions", reloadStreamBody, bearer(keyBeta))
	want := openAIRole + openAITok1 + openAIStop + openAIUsage + openAIDone
	if resp.StatusCode != http.StatusOK || string(body) != want {
		t.Fatalf("added key: %d, body differs at %s", resp.StatusCode, firstDiff(body, want))
	}
	added := tg.record(t)
	if added.KeyID != "beta" || added.CostMicros != 19*10+8*20 || added.Upstream != "next" {
		t.Errorf("added key's record: key %q cost %d µ$ upstream %q, want beta at the new price, %d, on next",
			added.KeyID, added.CostMicros, added.Upstream, 19*10+8*20)
	}
	if got := fx.new.requests.Load(); got != 1 {
		t.Errorf("the new upstream got %d requests, want 1", got)
	}

	fx.old.open()
	r := awaitResult(t, inFlight)
	if r.err != nil || r.resp.StatusCode != http.StatusOK || string(r.body) != want {
		t.Fatalf("the stream in flight: %v %v, body differs at %s", r.err, r.resp, firstDiff(r.body, want))
	}
	old := tg.record(t)
	if old.KeyID != "alpha" || old.Outcome != llm.OutcomeOK || old.CostMicros != 19*1+8*2 || old.Upstream != "main" {
		t.Errorf("the stream in flight: key %q outcome %s cost %d µ$ upstream %q, want alpha ok at the old price, %d, on the removed main",
			old.KeyID, old.Outcome, old.CostMicros, old.Upstream, 19*1+8*2)
	}
	if got := fx.old.requests.Load(); got != 1 {
		t.Errorf("the old upstream got %d requests, want only the one in flight", got)
	}
}

// A reload that changes a key only a restart can change is refused whole:
// the running configuration stays, keys and upstream alike.
func TestReloadRefusedChangesNothing(t *testing.T) {
	fx := newReloadFixture(t)
	fx.old.open()
	tg := fx.tg
	running := tg.gw.Config()
	next := fx.config(t, func(c *config.Config) {
		c.Keys = []config.Key{{Name: "beta", SHA256: sha(keyBeta), Team: "search"}}
		c.Server.Listen = ":9999"
	})
	_, err := tg.gw.Reload(&next)
	if err == nil || !strings.Contains(err.Error(), "server.listen") {
		t.Fatalf("Reload = %v, want a refusal naming server.listen", err)
	}
	if tg.gw.Config() != running {
		t.Fatal("a refused reload replaced the configuration")
	}
	resp, body := post(t, tg.URL+"/v1/chat/completions", reloadStreamBody, bearer(keyAlpha))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the running key after a refused reload: %d %s", resp.StatusCode, body)
	}
	if rec := tg.record(t); rec.Upstream != "main" || fx.old.requests.Load() != 1 {
		t.Errorf("served by %q; old upstream requests %d", rec.Upstream, fx.old.requests.Load())
	}
	resp, _ = post(t, tg.URL+"/v1/chat/completions", reloadStreamBody, bearer(keyBeta))
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the refused config's key: %d, want 401", resp.StatusCode)
	}
	tg.record(t)
}

// An upstream whose table is unchanged keeps its state across a reload (its
// breaker, queue and connections); a changed one is new, and the idle
// connections of the one it replaced are closed once no exchange holds it.
func TestReloadKeepsUnchangedUpstreams(t *testing.T) {
	fx := newReloadFixture(t)
	g := fx.tg.gw
	before := g.gen.Load()
	same := fx.config(t, func(c *config.Config) { c.Keys[0].Name = "alpha2" })
	if _, err := g.Reload(&same); err != nil {
		t.Fatal(err)
	}
	mid := g.gen.Load()
	if mid.upstreams[0] != before.upstreams[0] {
		t.Error("an unchanged upstream was rebuilt")
	}
	moved := fx.config(t, func(c *config.Config) { c.Upstreams[0].BaseURL = fx.newURL })
	held := g.begin() // an exchange still under the middle generation
	ended, err := g.Reload(&moved)
	if err != nil {
		t.Fatal(err)
	}
	if g.gen.Load().upstreams[0] == mid.upstreams[0] {
		t.Fatal("a changed upstream kept its old state")
	}
	if !mid.retired.Load() || len(mid.dropped) != 1 {
		t.Fatalf("the replaced generation: retired %v, dropped %d upstreams", mid.retired.Load(), len(mid.dropped))
	}
	select {
	case <-ended:
		t.Fatal("the replaced generation ended with an exchange still on it")
	default:
	}
	held.end()
	select {
	case <-ended:
	default:
		t.Fatal("the replaced generation did not end with its last exchange")
	}
}

// A gateway built without a limiter refuses a reload that sets limits.
func TestReloadNeedsALimiterForLimits(t *testing.T) {
	upstream := httptest.NewServer(newGateUpstream(openAIRole, openAIDone))
	defer upstream.Close()
	tg := newTestGateway(t, upstream.URL, nil)
	next := testConfig(t, upstream.URL, func(c *config.Config) {
		c.Teams = []config.Team{{Name: "search", Limits: config.Limits{RPM: i64(5)}}}
	})
	if _, err := tg.gw.Reload(&next); err == nil || !strings.Contains(err.Error(), "Limiter") {
		t.Fatalf("Reload = %v, want a refusal: no limiter", err)
	}
}

// A reload that rebuilds an upstream (its table changed) gives it a new,
// closed breaker, and the circuit gauge says so: an operator who fixes a
// broken upstream's table is not left with an open circuit on the
// dashboard while traffic flows. The old breaker, still under the
// exchanges of the old config, writes the gauge no more.
func TestReloadOfAChangedUpstreamResetsItsCircuitGauge(t *testing.T) {
	var failing atomic.Bool
	failing.Store(true)
	us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if failing.Load() {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, `{"error":{"message":"boom","type":"server_error"}}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, openAIRole+openAITok1+openAIStop+openAIUsage+openAIDone)
	}))
	defer us.Close()
	edit := func(timeout float64) func(*config.Config) {
		return func(c *config.Config) {
			u := &c.Upstreams[0]
			fastRetry(u)
			u.Retry.MaxAttempts = 1
			u.Breaker.ConsecutiveFailures, u.Breaker.CooldownSeconds = 1, 300
			u.TimeoutSeconds = timeout
		}
	}
	tg := newTestGateway(t, us.URL, edit(60))
	if resp, _ := post(t, tg.URL+"/v1/chat/completions", streamChat, nil); resp.StatusCode != http.StatusInternalServerError {
		t.Fatalf("first request: %d, want the upstream's 500", resp.StatusCode)
	}
	tg.record(t)
	if s := circuitState(t, tg, "mock"); s != metrics.CircuitOpen {
		t.Fatalf("circuit %v after the failure, want open", s)
	}
	old := tg.gw.gen.Load().upstreams[0]
	failing.Store(false)
	next := testConfig(t, us.URL, edit(61))
	if _, err := tg.gw.Reload(&next); err != nil {
		t.Fatal(err)
	}
	if s := circuitState(t, tg, "mock"); s != metrics.CircuitClosed {
		t.Errorf("circuit gauge %v right after the reload rebuilt the breaker, want closed", s)
	}
	// The old breaker, half-open after a verdict of its own, writes nothing.
	old.breaker.onChange(breakerOpen, breakerHalfOpen)
	resp, _ := post(t, tg.URL+"/v1/chat/completions", streamChat, nil)
	tg.record(t)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("request after the reload: %d, want 200 through the new, closed breaker", resp.StatusCode)
	}
	if s := circuitState(t, tg, "mock"); s != metrics.CircuitClosed {
		t.Errorf("circuit gauge %v after the reload and a request through the new breaker, want closed", s)
	}
}

// The channel a reload returns closes once every exchange begun before it
// has ended: those of the configuration it replaced and of every earlier
// one. A budget added by the second of two reloads waits for a stream
// begun before the first.
func TestReloadEndsWhenEveryEarlierExchangeHas(t *testing.T) {
	fx := newReloadFixture(t)
	g := fx.tg.gw
	first := g.begin() // a stream under the first configuration
	one := fx.config(t, func(c *config.Config) { c.Keys[0].Name = "alpha1" })
	endedOne, err := g.Reload(&one)
	if err != nil {
		t.Fatal(err)
	}
	second := g.begin()
	two := fx.config(t, func(c *config.Config) { c.Keys[0].Name = "alpha2" })
	endedTwo, err := g.Reload(&two)
	if err != nil {
		t.Fatal(err)
	}
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	second.end()
	if closed(endedOne) || closed(endedTwo) {
		t.Fatalf("ended with the first stream still open: first reload's %v, second's %v", closed(endedOne), closed(endedTwo))
	}
	first.end()
	if !closed(endedOne) || !closed(endedTwo) {
		t.Fatalf("after the last stream: first reload's ended %v, second's %v; want both", closed(endedOne), closed(endedTwo))
	}
}

// BenchmarkGenerationBeginEnd: what taking and releasing the running
// configuration costs an exchange (one atomic load and two atomic adds on
// a counter every exchange of the generation shares), alone and from every
// core at once.
func BenchmarkGenerationBeginEnd(b *testing.B) {
	g := bareGateway(b, "http://127.0.0.1:1", nil)
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			g.begin().end()
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				g.begin().end()
			}
		})
	})
}
