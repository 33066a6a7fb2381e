// Package proxy is tollgate's request path: the router and its middleware,
// the OpenAI and Anthropic dialect handlers, the upstream client and the
// relay that forwards every SSE event the moment it is complete while a tee'd
// parser timestamps its tokens.
package proxy

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/conversation"
	"github.com/tollgate-llm/tollgate/dashboard"
	"github.com/tollgate-llm/tollgate/keystore"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/metrics"
	"github.com/tollgate-llm/tollgate/ownership"
	"github.com/tollgate-llm/tollgate/ratelimit"
	"github.com/tollgate-llm/tollgate/spend"
)

// Options configures a Gateway.
type Options struct {
	// Config is the loaded, validated configuration. Required.
	Config *config.Config
	// Metrics receives one observation per request. Required.
	Metrics *metrics.Metrics
	// Gatherer serves GET /metrics. If nil, /metrics answers 404.
	Gatherer prometheus.Gatherer
	// Logger receives operational logs. If nil, slog.Default() is used.
	Logger *slog.Logger
	// AccessLog receives one line per request. If nil, access logging is off.
	AccessLog *slog.Logger
	// OnRecord, if set, is called with every finished record after the
	// metrics and the access log; it must not keep the pointer. Used by demo
	// and tests.
	OnRecord func(*llm.Record)
	// Transport overrides the upstream transport (tests). If nil, each
	// upstream gets a pooled transport sized from its config.
	Transport http.RoundTripper
	// Now is the clock (tests). If nil, time.Now.
	Now func() time.Time
	// Limiter admits and settles the requests of keys and teams that have
	// limits. Required when the configuration sets any limit.
	Limiter ratelimit.Limiter
	// Ledger receives the usage and cost of every billable exchange. If nil,
	// spend is not recorded.
	Ledger spend.Ledger
	// Owners records which team created each stored response and
	// conversation, in mode "keys" (package ownership). If nil there, the
	// owners are kept in memory (lost at restart: every stored id is then
	// a 404).
	Owners ownership.Store
	// Reload, if set, serves POST /admin/reload: called with nil, it reads
	// the gateway's config file again and swaps it in (Gateway.Reload);
	// with a document (named name in its errors), it only checks that the
	// document would reload cleanly. It returns the tables and keys that
	// differ from the running configuration.
	Reload func(check []byte, name string) (changed []string, err error)
	// Stats receives every finished record and every inter-token gap (the
	// live windows) and serves GET /stats. If nil, /stats answers 404.
	Stats StatsSink
	// Conversations keeps the figures of each conversation (package
	// conversation). Required when [conversations] is on, ignored when it
	// is off. The caller closes it, after Wait.
	Conversations conversation.Store
	// OnOutcome, if set, receives every outcome posted for a conversation
	// (POST /tollgate/conversations/{id}/outcome) with the conversation's
	// team and its cost so far: the metrics and /stats of outcomes.
	OnOutcome func(team string, o conversation.Outcome, costMicros int64)
	// RuntimeKeys, if set, serves the runtime keys' admin API (/admin/keys)
	// from its store; the caller starts it with SetRuntimeKeys as the
	// function it hands each new set of keys to, and closes it. A runtime
	// key with limits needs Limiter.
	RuntimeKeys *keystore.Watcher
	// Tracer starts a span for every request and one for each of its
	// upstream attempts (package tracing builds it from [tracing]); the
	// trace context goes upstream as W3C traceparent. If nil, tracing is
	// off and costs nothing: no span, no allocation. Probe requests are
	// never traced.
	Tracer trace.Tracer
}

// StatsSink keeps live figures of the gateway's traffic (package stats).
type StatsSink interface {
	// Observe receives one finished exchange; model is the metrics label.
	Observe(rec *llm.Record, model string)
	// ObserveITLs receives the gaps between token-bearing events of one
	// read of a stream, after the relay has flushed them.
	ObserveITLs(route llm.Route, model string, gaps []time.Duration)
	http.Handler
}

// Gateway serves the proxy's routes. Create it with New.
type Gateway struct {
	metrics   *metrics.Metrics
	gatherer  prometheus.Gatherer
	log       *slog.Logger
	accessLog *slog.Logger
	onRecord  func(*llm.Record)
	now       func() time.Time
	transport http.RoundTripper // Options.Transport
	limiter   ratelimit.Limiter
	ledger    spend.Ledger
	// tracer is Options.Tracer; traceContent is [tracing] capture_content.
	tracer       trace.Tracer
	traceContent bool

	// gen is the running configuration's generation; Reload replaces it.
	gen      atomic.Pointer[generation]
	reloadMu sync.Mutex
	// runtimeKeys are the latest runtime keys (under reloadMu), which
	// every new generation indexes; keys is where they come from, nil
	// when runtime keys are off.
	runtimeKeys keystore.Snapshot
	keys        *keystore.Watcher
	chainMu     sync.Mutex // the generations' chain (generation.ended)

	owners ownership.Store
	claims claimsInFlight // stream claims in flight, by response id
	// claiming counts them too, for Wait: a claim outlives its stream.
	claiming atomic.Int64
	// conv is the conversation store, nil when [conversations] is off;
	// onOutcome is Options.OnOutcome.
	conv      conversation.Store
	onOutcome func(team string, o conversation.Outcome, costMicros int64)
	convHolds convHolds
	// identity is [conversations] identity, each entry resolved once.
	identity []identitySource
	// adminToken is the SHA-256 of [admin] token, hasAdmin whether one is set.
	adminToken [sha256.Size]byte
	hasAdmin   bool
	stats      StatsSink
	reload     func(check []byte, name string) ([]string, error)
	draining   atomic.Bool
	open       atomic.Int64 // exchanges whose finish has not run yet
	// sockets are the open Responses WebSockets (socket.go), which the
	// HTTP server does not track once upgraded: CloseSockets closes them.
	sockets    socketSet
	streamBufs sync.Pool // *[]byte of streamBufSize: a stream's first relay buffer
	bufPool    sync.Pool // *[]byte of relayBufSize: larger relay buffers, copies, the chunks of request bodies read
	states     sync.Pool // *streamState
}

// New builds a Gateway from opts.
func New(opts Options) (*Gateway, error) {
	if opts.Config == nil || opts.Metrics == nil {
		return nil, errors.New("proxy: Options.Config and Options.Metrics are required")
	}
	g := &Gateway{
		metrics:   opts.Metrics,
		gatherer:  opts.Gatherer,
		log:       opts.Logger,
		accessLog: opts.AccessLog,
		onRecord:  opts.OnRecord,
		now:       opts.Now,
		transport: opts.Transport,
		limiter:   opts.Limiter,
		ledger:    opts.Ledger,
		stats:     opts.Stats,
		reload:    opts.Reload,
		tracer:    opts.Tracer,
		keys:      opts.RuntimeKeys,
	}
	if opts.RuntimeKeys != nil && opts.Limiter == nil {
		return nil, errors.New("proxy: Options.RuntimeKeys needs Options.Limiter: a runtime key may have limits")
	}
	// [tracing] is read at start only, as the Tracer is built then.
	g.traceContent = opts.Tracer != nil && opts.Config.Tracing.CaptureContent
	if g.log == nil {
		g.log = slog.Default()
	}
	if g.now == nil {
		g.now = time.Now
	}
	gen, err := g.newGeneration(opts.Config, nil)
	if err != nil {
		return nil, err
	}
	g.gen.Store(gen)
	g.owners = opts.Owners
	if gen.gov.keysMode && g.owners == nil {
		if g.owners, err = ownership.NewLocal(ownership.LocalOptions{}); err != nil {
			return nil, err
		}
	}
	if opts.Config.Conversations.Enabled {
		if opts.Conversations == nil {
			return nil, errors.New("proxy: [conversations] is on and Options.Conversations is nil")
		}
		g.conv, g.onOutcome = opts.Conversations, opts.OnOutcome
		g.identity = identitySources(&opts.Config.Conversations)
	}
	if token := opts.Config.Admin.Token.Reveal(); token != "" {
		// Comparing digests keeps the comparison constant-time whatever
		// the presented token's length.
		g.adminToken, g.hasAdmin = sha256.Sum256([]byte(token)), true
	}
	g.streamBufs.New = func() any {
		b := make([]byte, streamBufSize)
		return &b
	}
	g.bufPool.New = func() any {
		b := make([]byte, relayBufSize)
		return &b
	}
	return g, nil
}

// dialTimeout is the upstream's connect timeout, capped by its total
// timeout. The dialer splits it across a host's addresses, and the
// attempt's context has no deadline for it to take the total from: the
// phase timer, not a context deadline, ends an attempt.
func dialTimeout(u *config.Upstream) time.Duration {
	d, total := config.Seconds(u.ConnectTimeoutSeconds), config.Seconds(u.TimeoutSeconds)
	if total > 0 && (d <= 0 || total < d) {
		return total
	}
	return d
}

// newTransport sizes a transport for one upstream. http.DefaultTransport
// keeps two idle connections per host, which under load makes a proxy
// reconnect constantly; there is no overall client timeout,
// since it would cap the length of a stream.
func newTransport(u *config.Upstream) *http.Transport {
	t := &http.Transport{
		Proxy: http.ProxyFromEnvironment,
		DialContext: (&net.Dialer{
			Timeout:   dialTimeout(u),
			KeepAlive: 30 * time.Second,
		}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          u.MaxIdleConns,
		MaxIdleConnsPerHost:   u.MaxIdleConns,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   config.Seconds(u.ConnectTimeoutSeconds),
		ExpectContinueTimeout: time.Second,
	}
	if u.H2C {
		// HTTP/2 only, without TLS: the upstream serves it by prior
		// knowledge (there is no upgrade from HTTP/1.1).
		var p http.Protocols
		p.SetUnencryptedHTTP2(true)
		t.Protocols = &p
	}
	return t
}

// Handler returns the gateway's router.
func (g *Gateway) Handler() http.Handler {
	r := chi.NewRouter()
	r.Use(g.requestID, g.recoverer)
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	r.Get("/readyz", g.readyz)
	if g.gatherer != nil {
		r.Method(http.MethodGet, "/metrics", promhttp.HandlerFor(g.gatherer, promhttp.HandlerOpts{
			ErrorLog: slog.NewLogLogger(g.log.Handler(), slog.LevelError), MaxRequestsInFlight: 8,
		}))
	}
	if g.stats != nil {
		st := limitInFlight(g.stats, statsInFlight)
		r.Method(http.MethodGet, "/stats", st)
		r.Method(http.MethodGet, "/stats/series", st)
		// The dashboard charts /stats, so it is served where /stats is.
		dash := dashboard.Handler("/dashboard")
		r.Method(http.MethodGet, "/dashboard", dash)
		r.Method(http.MethodGet, "/dashboard/*", dash)
	}
	g.adminRoutes(r)
	r.Post("/tollgate/conversations/{id}/outcome", g.conversationOutcome)
	r.Post("/v1/chat/completions", g.dialectHandler(llm.RouteChatCompletions, llm.DialectOpenAI))
	r.Post("/v1/messages", g.dialectHandler(llm.RouteMessages, llm.DialectAnthropic))
	r.Post("/v1/responses", g.dialectHandler(llm.RouteResponses, llm.DialectResponses))
	r.Get("/v1/responses", g.responsesGet)
	r.HandleFunc("/v1/*", g.forwardHandler)
	// Every method, so that chi does not answer the others 405: only HEAD
	// is a start probe.
	r.HandleFunc("/", g.startProbe)
	r.HandleFunc("/api/hello", g.startProbe)
	r.NotFound(g.notFound)
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		g.reject(w, r, &apiError{Status: http.StatusMethodNotAllowed, Kind: "invalid_request_error",
			Code: "method_not_allowed", AnthropicKind: "invalid_request_error",
			Msg: "method " + r.Method + " is not allowed on " + r.URL.Path})
	})
	return r
}

// notFound answers a path no route serves, recorded like any request.
func (g *Gateway) notFound(w http.ResponseWriter, r *http.Request) {
	g.reject(w, r, errNotFound(r.URL.Path))
}

// startProbe answers HEAD / and HEAD /api/hello, which Claude Code sends to
// its ANTHROPIC_BASE_URL at every start to warm the connection up (the LLM
// gateway protocol names HEAD / in its docs of 2026-06, HEAD /api/hello
// from 2026-08: wire.md §11.1, "answer 200, empty body; do not meter").
// They are the client's, not a model call or a caller's mistake: 200 with
// no body, like /healthz no record, so no access-log line, metric or
// /stats entry, and no key asked for. Any other method on these paths is
// the 404 it always was.
func (g *Gateway) startProbe(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodHead {
		g.notFound(w, r)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// statsInFlight bounds concurrent /stats and /stats/series requests: each
// merges every group's slices (milliseconds with many groups), and the port
// is the public one. A dashboard asks four, one after another.
const statsInFlight = 4

// limitInFlight serves at most n requests at once through h; the others get
// 503 with Retry-After at once, as promhttp's MaxRequestsInFlight does for
// /metrics.
func limitInFlight(h http.Handler, n int) http.Handler {
	sem := make(chan struct{}, n)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case sem <- struct{}{}:
			defer func() { <-sem }()
			h.ServeHTTP(w, r)
		default:
			w.Header().Set("Retry-After", "1")
			http.Error(w, "too many /stats requests in flight; retry", http.StatusServiceUnavailable)
		}
	})
}

// Wait returns once every exchange has finished (settled, billed and
// logged) and every stream's new stored response is recorded (a claim
// may outlive its stream, see claimWait), or with ctx's error. http.Server.Shutdown waits for handlers,
// but Close does not: after a forced close the caller waits here before
// closing the limiter and the ledger, so that no exchange bills into a
// closed ledger.
func (g *Gateway) Wait(ctx context.Context) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for g.open.Load() > 0 || g.claiming.Load() > 0 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("proxy: %d exchanges still open, %d stored responses still being recorded: %w",
				g.open.Load(), g.claiming.Load(), ctx.Err())
		case <-t.C:
		}
	}
	return nil
}

// Drain marks the gateway as shutting down: /readyz answers 503 from now on,
// so a load balancer stops sending new requests while open streams finish.
func (g *Gateway) Drain() { g.draining.Store(true) }

func (g *Gateway) readyz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if g.draining.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("draining\n"))
		return
	}
	_, _ = w.Write([]byte("ready\n"))
}
