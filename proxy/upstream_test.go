package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
)

// TestShapingQueueFull: with max_concurrent 1 and no queue, a request
// that arrives while the primary's one slot holds a stream goes to the
// backup (fallback reason queue_full); with no backup it gets 503 with
// Retry-After in its dialect.
func TestShapingQueueFull(t *testing.T) {
	for _, withBackup := range []bool{true, false} {
		name := "single upstream"
		if withBackup {
			name = "with backup"
		}
		t.Run(name, func(t *testing.T) {
			gate := newGateUpstream(openAIRole, openAITok1+openAIStop+openAIDone)
			defer gate.open()
			primary := httptest.NewServer(gate)
			defer primary.Close()
			mock, backupURL := mockUpstream(t, mockllm.Options{OutputTokens: 2})
			tg := newTestGateway(t, primary.URL, func(c *config.Config) {
				c.Upstreams[0].Name = "primary"
				c.Upstreams[0].MaxConcurrent = 1
				c.Upstreams[0].QueueSize = 0
				if withBackup {
					b := config.DefaultUpstream()
					b.Name, b.BaseURL = "backup", backupURL
					b.CallerKeysOnFallback = true
					c.Upstreams = append(c.Upstreams, b)
				}
			})
			stream := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
			first := make(chan sendResult, 1)
			go func() {
				first <- sendRequest(context.Background(), http.MethodPost, tg.URL+"/v1/chat/completions", "application/json", stream, nil)
			}()
			gate.waitArrived(t) // the primary's slot is taken until the gate opens

			resp, body := post(t, tg.URL+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil)
			rec := tg.record(t)
			if withBackup {
				if resp.StatusCode != http.StatusOK {
					t.Errorf("second request: %d %s, want 200 from the backup", resp.StatusCode, body)
				}
				if got, want := attemptList(rec), []string{"primary:0:queue_full", "backup:200:ok"}; !slices.Equal(got, want) {
					t.Errorf("attempts %v, want %v", got, want)
				}
				if rec.Upstream != "backup" || mock.Stats().Requests != 1 {
					t.Errorf("answered by %q, backup saw %d requests", rec.Upstream, mock.Stats().Requests)
				}
				if v := metricValue(t, tg, "tollgate_upstream_fallbacks_total",
					map[string]string{"from": "primary", "to": "backup", "reason": "queue_full"}); v != 1 {
					t.Errorf("fallbacks_total{primary->backup, queue_full} = %v, want 1", v)
				}
			} else {
				ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
				if resp.StatusCode != http.StatusServiceUnavailable || err != nil || ra < 1 {
					t.Errorf("second request: %d Retry-After %q, want 503 with Retry-After >= 1", resp.StatusCode, resp.Header.Get("Retry-After"))
				}
				var e struct {
					Error struct{ Type, Code string }
				}
				if err := json.Unmarshal(body, &e); err != nil || e.Error.Code != "upstream_unavailable" {
					t.Errorf("503 body %s is not an OpenAI error with code upstream_unavailable (%v)", body, err)
				}
				if got, want := attemptList(rec), []string{"primary:0:queue_full"}; !slices.Equal(got, want) {
					t.Errorf("attempts %v, want %v", got, want)
				}
				if rec.Outcome != llm.OutcomeUpstreamUnreachable {
					t.Errorf("outcome %s, want upstream_unreachable", rec.Outcome)
				}
			}
			if v := metricValue(t, tg, "tollgate_upstream_retries_skipped_total",
				map[string]string{"upstream": "primary", "why": "queue_full"}); v != 1 {
				t.Errorf("retries_skipped_total{primary, queue_full} = %v, want 1", v)
			}
			if n := gate.requests.Load(); n != 1 {
				t.Errorf("primary saw %d requests, want 1", n)
			}

			gate.open()
			r := awaitResult(t, first)
			if r.resp.StatusCode != http.StatusOK || string(r.body) != openAIRole+openAITok1+openAIStop+openAIDone {
				t.Errorf("first request: %d %q", r.resp.StatusCode, r.body)
			}
			if rec := tg.record(t); rec.Upstream != "primary" || rec.Outcome != llm.OutcomeOK {
				t.Errorf("first request answered by %q with %s", rec.Upstream, rec.Outcome)
			}
		})
	}
}

// routingFixture builds the routing of a config with three upstreams ("a"
// serves both dialects, "oa" only OpenAI, "an" only Anthropic) and routes
// with renames.
func routingFixture() (*config.Config, *routing) {
	up := func(name string, dialects ...string) config.Upstream {
		u := config.DefaultUpstream()
		u.Name, u.BaseURL, u.Dialects = name, "http://127.0.0.1:1", dialects
		return u
	}
	cfg := &config.Config{
		Upstreams: []config.Upstream{up("a", "openai", "anthropic"), up("oa", "openai"), up("an", "anthropic")},
		Routes: []config.Route{
			{Models: []string{"gpt-4o*"}, Upstreams: []string{"oa", "a"}, Rename: map[string]string{"a": "dep-4o"}},
			{Models: []string{"claude-*", "sonnet"}, Upstreams: []string{"an", "a"}},
			{Models: []string{"gpt-4o-mini"}, Upstreams: []string{"an"}}, // shadowed by the first route
			{Models: []string{"only-an"}, Upstreams: []string{"an"}, Rename: map[string]string{"an": "x"}},
		},
	}
	byName := map[string]*upstream{}
	var ordered []*upstream
	for i := range cfg.Upstreams {
		u := &upstream{cfg: &cfg.Upstreams[i]}
		byName[u.cfg.Name] = u
		ordered = append(ordered, u)
	}
	return cfg, newRouting(cfg, byName, ordered)
}

// routeTargetNames renders targets as "upstream" or "upstream=model".
func routeTargetNames(ts []target) []string {
	out := []string{}
	for _, t := range ts {
		s := t.up.cfg.Name
		if t.model != "" {
			s += "=" + t.model
		}
		out = append(out, s)
	}
	return out
}

func TestRoutingTargets(t *testing.T) {
	_, rt := routingFixture()
	tests := []struct {
		name  string
		d     llm.Dialect
		model string
		want  []string
	}{
		{"route in order with rename", llm.DialectOpenAI, "gpt-4o-mini", []string{"oa", "a=dep-4o"}},
		{"route filtered by dialect", llm.DialectAnthropic, "gpt-4o-mini", []string{"a=dep-4o"}},
		{"second route, second pattern", llm.DialectAnthropic, "sonnet", []string{"an", "a"}},
		{"second route for openai", llm.DialectOpenAI, "claude-3-5", []string{"a"}},
		{"route serving none of the dialect", llm.DialectOpenAI, "only-an", []string{}},
		{"no route: every upstream of the dialect in file order", llm.DialectOpenAI, "llama", []string{"a", "oa"}},
		{"no route, anthropic", llm.DialectAnthropic, "llama", []string{"a", "an"}},
		{"* does not cross /", llm.DialectOpenAI, "gpt-4o/ft", []string{"a", "oa"}},
		{"pattern is anchored", llm.DialectOpenAI, "x-gpt-4o", []string{"a", "oa"}},
		{"empty model", llm.DialectOpenAI, "", []string{"a", "oa"}},
		{"forwarded without a route: the first upstream", llm.DialectNone, "llama", []string{"a"}},
		{"forwarded without a model: the first upstream", llm.DialectNone, "", []string{"a"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := routeTargetNames(rt.targets(tc.d, tc.model)); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("targets(%s, %q) = %v, want %v", tc.d, tc.model, got, tc.want)
			}
		})
	}
}

// A forwarded request (another /v1/* path) is routed by the dialect its
// path and headers suggest, so that e.g. count_tokens reaches an Anthropic
// upstream; only when no upstream serves that dialect does it go to the
// first upstream.
func TestExchangeTargetsForwarded(t *testing.T) {
	cfg, rt := routingFixture()
	gen := &generation{cfg: cfg, routing: rt}
	tests := []struct {
		name, method, path string
		hdr                map[string]string
		model              string
		want               []string
	}{
		{"models list guessed openai", http.MethodGet, "/v1/models", nil, "", []string{"a", "oa"}},
		{"count_tokens guessed anthropic", http.MethodPost, "/v1/messages/count_tokens", nil, "", []string{"a", "an"}},
		{"x-api-key guesses anthropic", http.MethodGet, "/v1/models", map[string]string{"X-Api-Key": "k"}, "", []string{"a", "an"}},
		{"metered model with a route", http.MethodPost, "/v1/embeddings", nil, "gpt-4o-e", []string{"oa", "a=dep-4o"}},
		{"route of the other dialect falls back to the first upstream", http.MethodPost, "/v1/embeddings", nil, "only-an", []string{"a"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := http.NewRequest(tc.method, "http://gw"+tc.path, nil)
			for k, v := range tc.hdr {
				r.Header.Set(k, v)
			}
			ex := &exchange{gen: gen, r: r, answer: errorDialect(r, llm.DialectNone)} // as newExchange makes it
			ex.rec.Dialect = llm.DialectNone
			if got := routeTargetNames(ex.targets(tc.model)); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("targets = %v, want %v", got, tc.want)
			}
		})
	}
}

// teeUpstream serves mockllm and keeps, per X-Test-Stream header, the bytes
// it wrote and the protocol and connection the request came on.
type teeUpstream struct {
	h     http.Handler
	mu    sync.Mutex
	wrote map[string]*bytes.Buffer
	proto map[string]int
	conns map[string]bool
}

type teeWriter struct {
	http.ResponseWriter
	buf *bytes.Buffer
}

func (w teeWriter) Write(p []byte) (int, error) { w.buf.Write(p); return w.ResponseWriter.Write(p) }
func (w teeWriter) Flush()                      { w.ResponseWriter.(http.Flusher).Flush() }

func (u *teeUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("X-Test-Stream")
	buf := &bytes.Buffer{}
	u.mu.Lock()
	u.wrote[id], u.proto[id], u.conns[r.RemoteAddr] = buf, r.ProtoMajor, true
	u.mu.Unlock()
	u.h.ServeHTTP(teeWriter{w, buf}, r)
}

// newTeeUpstream starts a teeUpstream of mockllm serving HTTP/1.1 and h2c
// on one port.
func newTeeUpstream(t *testing.T) (*teeUpstream, *httptest.Server) {
	tee := &teeUpstream{h: mockllm.New(mockllm.Options{OutputTokens: 40}),
		wrote: map[string]*bytes.Buffer{}, proto: map[string]int{}, conns: map[string]bool{}}
	srv := httptest.NewUnstartedServer(tee)
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv.Config.Protocols = &p
	srv.Start()
	t.Cleanup(srv.Close)
	return tee, srv
}

// TestH2CReloads: turning h2c on in a reload moves the next request to
// HTTP/2, and turning it off moves it back.
func TestH2CReloads(t *testing.T) {
	tee, srv := newTeeUpstream(t)
	tg := newTestGateway(t, srv.URL, nil)
	send := func(id string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, tg.URL+"/v1/chat/completions",
			strings.NewReader(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("X-Test-Stream", id)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %s: status %d", id, resp.StatusCode)
		}
	}
	reload := func(h2c bool) {
		t.Helper()
		cfg := testConfig(t, srv.URL, func(c *config.Config) { c.Upstreams[0].H2C = h2c })
		if _, err := tg.gw.Reload(&cfg); err != nil {
			t.Fatal(err)
		}
	}
	send("before")
	reload(true)
	send("on")
	reload(false)
	send("off")
	tee.mu.Lock()
	defer tee.mu.Unlock()
	for id, want := range map[string]int{"before": 1, "on": 2, "off": 1} {
		if tee.proto[id] != want {
			t.Errorf("request %q reached the upstream over HTTP/%d, want %d", id, tee.proto[id], want)
		}
	}
}

// TestH2CUpstreamCarriesStreamsByteExact: with h2c = true the gateway
// speaks HTTP/2 without TLS to the upstream, the concurrent streams share
// its connections, and each reaches the caller byte for byte as the
// upstream wrote it; a non-streamed answer too.
func TestH2CUpstreamCarriesStreamsByteExact(t *testing.T) {
	tee, srv := newTeeUpstream(t)
	tg := newTestGateway(t, srv.URL, func(c *config.Config) { c.Upstreams[0].H2C = true })

	const streams = 20
	got := make([][]byte, streams+1)
	var wg sync.WaitGroup
	for i := range streams + 1 {
		wg.Go(func() {
			body := `{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
			if i == streams { // the last one not streamed
				body = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`
			}
			req, _ := http.NewRequest(http.MethodPost, tg.URL+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("X-Test-Stream", strconv.Itoa(i))
			req.Header.Set("X-Mock-ITL-Ms", "5") // long enough that the streams overlap
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			got[i], err = io.ReadAll(resp.Body)
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Errorf("request %d: status %d, %v", i, resp.StatusCode, err)
			}
		})
	}
	wg.Wait()
	tee.mu.Lock()
	defer tee.mu.Unlock()
	for i := range streams + 1 {
		id := strconv.Itoa(i)
		if tee.proto[id] != 2 {
			t.Errorf("request %d reached the upstream over HTTP/%d, want 2", i, tee.proto[id])
		}
		if w := tee.wrote[id]; w == nil || !bytes.Equal(got[i], w.Bytes()) || w.Len() == 0 {
			t.Errorf("request %d: the caller got %d bytes, not the %d the upstream wrote", i, len(got[i]), tee.wrote[id].Len())
		}
	}
	if len(tee.conns) > 2 {
		t.Errorf("%d concurrent requests came on %d connections; HTTP/2 should carry them on one or two", streams+1, len(tee.conns))
	}
}
