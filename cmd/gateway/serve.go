package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/conversation"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/metrics"
	"github.com/tollgate-llm/tollgate/probe"
	"github.com/tollgate-llm/tollgate/proxy"
	"github.com/tollgate-llm/tollgate/stats"
	"github.com/tollgate-llm/tollgate/tracing"
)

func runServe(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("serve",
		"Runs the gateway: POST /v1/chat/completions and POST /v1/messages are relayed to the\n"+
			"configured upstream and measured; other /v1/* paths are forwarded; GET /metrics,\n"+
			"/healthz and /readyz are served. SIGINT or SIGTERM stops accepting requests, lets open\n"+
			"streams finish for up to server.drain_timeout_seconds, then cancels them.", stderr)
	path := fs.String("config", "gateway.toml", "config file")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	data, err := os.ReadFile(*path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	cfg, err := config.Parse(data, *path, os.Getenv)
	if err != nil {
		return err
	}
	// SIGHUP reloads the config file, as nginx taught: without this its
	// default action would end the process at once, cutting every stream.
	// It is caught from here on; one sent while the gateway starts is
	// taken once it serves.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	level := new(slog.LevelVar)
	ops, access := newLoggers(cfg.Log, level, stdout, stderr)
	ln, err := net.Listen("tcp", cfg.Server.Listen)
	if err != nil {
		return fmt.Errorf("listening on %q: %w", cfg.Server.Listen, err)
	}
	gw, err := startGateway(cfg, ln, ops, access, nil)
	if err != nil {
		return err
	}
	gw.level = level
	rl := &reloader{rg: gw, path: *path, sum: sha256.Sum256(data)}
	gw.reloader.Store(rl)
	if limit, source := memoryLimit(os.Getenv, "/sys/fs/cgroup"); limit > 0 {
		debug.SetMemoryLimit(limit)
		ops.Info("Go memory limit set from the container's", "limit_bytes", limit, "from", source)
	}
	ops.Info("tollgate serving", "addr", ln.Addr().String(), "config", *path, "version", version)
	gw.startProbe()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if cfg.Server.WatchConfig {
		watchCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		go rl.watch(watchCtx, watchInterval)
	}
	for {
		select {
		case <-hup:
			_, _ = rl.reload("sighup")
			continue
		case <-ctx.Done():
		case err := <-gw.done:
			return err
		}
		break
	}
	stop()
	// The [server] table never reloads: the drain settings are the start's.
	return gw.shutdown(config.Seconds(cfg.Server.ShutdownDelaySeconds), config.Seconds(cfg.Server.DrainTimeoutSeconds))
}

// watchInterval is how often [server] watch_config reads the config file.
const watchInterval = time.Second

// runningGateway is a gateway serving on a listener.
type runningGateway struct {
	gw       *proxy.Gateway
	srv      *http.Server
	registry *prometheus.Registry
	metrics  *metrics.Metrics
	gov      *governance
	tracer   *tracing.Tracer // nil when [tracing] is off
	log      *slog.Logger
	cancel   func()     // cancels every request's base context, with proxy.ErrShutdown
	done     chan error // Serve's result
	addr     string

	// level is the operational log's level, which a reload sets; nil in
	// tests that build their own loggers. reloader is set once the
	// gateway serves from a config file.
	level    *slog.LevelVar
	reloader atomic.Pointer[reloader]
	// afterReload are the reloads' work left for when the requests of the
	// replaced configuration have ended; shutdown closes stopping once the
	// exchanges are done, and waits for that work before the limiter and
	// the ledger close.
	afterMu      sync.Mutex
	afterReload  sync.WaitGroup
	afterStopped bool
	stopping     chan struct{}

	// The synthetic probe: nil when [probe] is off. startProbe runs it;
	// stopProbe cancels it and waits for its requests to end; a reload
	// replaces it (pauseProbe). probeMu holds them apart; probeOver is
	// set at shutdown, after which no probe starts.
	probeMu     sync.Mutex
	probe       *probe.Scheduler
	probeCancel context.CancelFunc
	probeDone   chan struct{}
	probeOver   bool
}

// startGateway builds the registry, metrics and proxy for cfg and serves them
// on ln in the background.
func startGateway(cfg *config.Config, ln net.Listener, ops, access *slog.Logger, onRecord func(*llm.Record)) (*runningGateway, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m, err := metrics.New(reg, cfg)
	if err != nil {
		return nil, fmt.Errorf("registering metrics: %w", err)
	}
	warnConfig(cfg, ops)
	tracer, err := startTracing(cfg, reg, ops)
	if err != nil {
		return nil, err
	}
	gov, err := openGovernance(cfg, m, ops)
	if err != nil {
		stopTracing(tracer, ops)
		return nil, err
	}
	st := stats.New(nil)
	err = gov.openConversations(cfg, ops, func(c conversation.Conversation, why conversation.Reason) {
		m.ConversationEnded(c, why)
		st.ObserveConversation(c, why)
	})
	if err != nil {
		_ = gov.Close()
		stopTracing(tracer, ops)
		return nil, err
	}
	rg := &runningGateway{registry: reg, metrics: m, gov: gov, tracer: tracer, log: ops, done: make(chan error, 1),
		addr: ln.Addr().String(), stopping: make(chan struct{})}
	reload := func(doc []byte, name string) ([]string, error) {
		rl := rg.reloader.Load()
		if rl == nil {
			return nil, proxy.ErrNothingToReload
		}
		return rl.serve(doc, name)
	}
	opts := proxy.Options{Config: cfg, Metrics: m, Gatherer: reg, Logger: ops, AccessLog: access,
		OnRecord: onRecord, Limiter: gov.limiter, Ledger: gov.ledger, Owners: gov.owners, Stats: st,
		Reload: reload, Conversations: gov.conv, RuntimeKeys: gov.keys,
		OnOutcome: func(team string, o conversation.Outcome, costMicros int64) {
			m.ConversationOutcome(team, o, costMicros)
			st.ObserveOutcome(team, o, costMicros)
		}}
	if tracer != nil {
		opts.Tracer = tracer.Tracer()
	}
	gw, err := proxy.New(opts)
	if err != nil {
		_ = gov.Close()
		stopTracing(tracer, ops)
		return nil, err
	}
	if gov.keys != nil {
		// The keys are read before the first request is served; a store
		// that cannot be read is an error, as Redis down at start is.
		ctx, cancel := context.WithTimeout(context.Background(), config.Millis(cfg.Redis.DialTimeoutMs)+config.Millis(cfg.Redis.TimeoutMs))
		err := gov.keys.Start(ctx, gw.SetRuntimeKeys)
		cancel()
		if err != nil {
			_ = gov.Close()
			stopTracing(tracer, ops)
			return nil, fmt.Errorf("reading the runtime keys: %w", err)
		}
	}
	if bc := gw.BudgetCollector(prometheus.Labels(cfg.Metrics.Labels)); bc != nil {
		reg.MustRegister(bc)
	}
	sched, err := probe.New(cfg, gw, m, probe.Options{Logger: ops})
	if err != nil {
		_ = gov.Close()
		stopTracing(tracer, ops)
		return nil, err
	}
	baseCtx, cancelCause := context.WithCancelCause(context.Background())
	cancel := func() { cancelCause(proxy.ErrShutdown) }
	srv := &http.Server{
		Handler:           gw.Handler(),
		ReadHeaderTimeout: config.Seconds(cfg.Server.ReadHeaderTimeoutSeconds),
		IdleTimeout:       config.Seconds(cfg.Server.IdleTimeoutSeconds),
		// The handler answers headers over max_header_bytes with a 431 in
		// the caller's dialect; the server's own limit, above it, stops a
		// header block so large that reading it would be the harm (its
		// 431 is plain text).
		MaxHeaderBytes: 2 * cfg.Server.MaxHeaderBytes,
		BaseContext:    func(net.Listener) context.Context { return baseCtx },
		ErrorLog:       slog.NewLogLogger(ops.Handler(), slog.LevelWarn),
	}
	rg.gw, rg.srv, rg.cancel, rg.probe = gw, srv, cancel, sched
	go func() {
		err := srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		rg.done <- err
	}()
	return rg, nil
}

// startProbe starts the synthetic probe's rounds, if [probe] is on. It is
// called once the listener serves, and at most once.
func (rg *runningGateway) startProbe() {
	rg.probeMu.Lock()
	defer rg.probeMu.Unlock()
	rg.startProbeLocked()
}

func (rg *runningGateway) startProbeLocked() {
	if rg.probe == nil || rg.probeDone != nil || rg.probeOver {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	rg.probeCancel, rg.probeDone = cancel, make(chan struct{})
	go func() {
		defer close(rg.probeDone)
		rg.probe.Run(ctx)
	}()
	pc := rg.gw.Config().Probe
	rg.log.Info("synthetic probe on", "targets", len(pc.Targets), "interval_seconds", pc.IntervalSeconds,
		"requests", pc.Requests)
}

// stopProbe stops the probe, cancelling its requests in flight, and waits
// for them to end.
func (rg *runningGateway) stopProbe() {
	rg.probeMu.Lock()
	defer rg.probeMu.Unlock()
	rg.stopProbeLocked()
	rg.probeOver = true
}

func (rg *runningGateway) stopProbeLocked() {
	if rg.probeDone == nil {
		return
	}
	rg.probeCancel()
	<-rg.probeDone
	rg.probeDone = nil
}

// pauseProbe stops the running probe, holding the probe's lock until the
// function it returns is called with the scheduler to run in its place
// (nil: [probe] is now off; the paused one, old, when a reload failed). A
// probe that was not started (the demo starts it after its burst) is not
// started by it.
func (rg *runningGateway) pauseProbe() (old *probe.Scheduler, resume func(sched *probe.Scheduler)) {
	rg.probeMu.Lock()
	running := rg.probeDone != nil || rg.reloader.Load() != nil
	old = rg.probe
	rg.stopProbeLocked()
	return old, func(sched *probe.Scheduler) {
		defer rg.probeMu.Unlock()
		rg.probe = sched
		if running {
			rg.startProbeLocked()
		}
	}
}

// later runs f in the background until shutdown, which waits for it before
// the limiter and the ledger close; after shutdown began it does nothing.
func (rg *runningGateway) later(f func()) {
	rg.afterMu.Lock()
	defer rg.afterMu.Unlock()
	if rg.afterStopped {
		return
	}
	rg.afterReload.Go(f)
}

// shutdown marks the gateway not ready, keeps accepting requests for delay
// (so a load balancer that polls /readyz stops sending first), stops
// accepting, lets open exchanges finish for up to drain, then cancels those
// still open and closes their connections.
func (rg *runningGateway) shutdown(delay, drain time.Duration) error {
	rg.gw.Drain()
	// The probe stops first: a replica leaving the pool has nothing left
	// to report, and its requests must not outlive the transport.
	rg.stopProbe()
	if delay > 0 {
		rg.log.Info("shutting down: /readyz answers 503, still accepting requests", "shutdown_delay", delay.String())
		<-time.After(delay)
	}
	rg.log.Info("shutting down: draining open requests", "drain_timeout", drain.String())
	ctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	// Upgraded Responses WebSockets are no longer the server's to drain:
	// the gateway closes each once its turns in flight end, meanwhile.
	sockets := make(chan error, 1)
	go func() { sockets <- rg.gw.CloseSockets(ctx) }()
	err := rg.srv.Shutdown(ctx)
	if serr := <-sockets; err == nil {
		err = serr
	}
	if err != nil {
		rg.log.Warn("drain timeout reached: cancelling open streams")
		rg.cancel()
		// Give the cancelled handlers a moment to record what they relayed.
		grace, gcancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer gcancel()
		if err = rg.srv.Shutdown(grace); err != nil {
			err = rg.srv.Close()
		}
	}
	rg.cancel()
	serveErr := <-rg.done
	// After a forced Close, handlers may still be running: let them finish
	// billing before the ledger closes.
	waitCtx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
	if werr := rg.gw.Wait(waitCtx); werr != nil {
		rg.log.Error("closing limits and spend with exchanges still open", "err", werr)
	}
	wcancel()
	rg.afterMu.Lock()
	rg.afterStopped = true
	close(rg.stopping)
	rg.afterMu.Unlock()
	rg.afterReload.Wait()
	// Every exchange is settled and in the ledger: its last flush loses
	// nothing. It goes before the traces, which may wait on a collector.
	if gerr := rg.gov.Close(); gerr != nil {
		rg.log.Error("closing limits and spend", "err", gerr)
		if serveErr == nil {
			serveErr = gerr
		}
	}
	// Every exchange has ended its span: the last export loses none.
	stopTracing(rg.tracer, rg.log)
	if serveErr != nil {
		return serveErr
	}
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	rg.log.Info("stopped")
	return nil
}

// tracingFlushTimeout bounds the export of the spans still queued at
// shutdown: a collector that is down must not hold the exit.
const tracingFlushTimeout = 5 * time.Second

// startTracing builds the trace pipeline of an enabled [tracing] table and
// registers tollgate_tracing_dropped_spans_total; nil when it is off.
func startTracing(cfg *config.Config, reg *prometheus.Registry, ops *slog.Logger) (*tracing.Tracer, error) {
	tc := cfg.Tracing
	if !tc.Enabled {
		return nil, nil
	}
	tr, err := tracing.New(context.Background(), tc, tracing.Options{Logger: ops, Version: version})
	if err != nil {
		return nil, err
	}
	reg.MustRegister(tr.Collector())
	// What the SDK cannot return to a caller (partial exports, say) goes to
	// the operational log, not to stderr in its own format.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { ops.Warn("tracing", "err", err) }))
	ops.Info("tracing on", "protocol", tc.Protocol, "endpoint", withoutUserinfo(tc.Endpoint), "sample_ratio", tc.SampleRatio,
		"capture_content", tc.CaptureContent)
	return tr, nil
}

// withoutUserinfo is endpoint for a log line: a URL's user:password@ is
// left out.
func withoutUserinfo(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil || u.User == nil {
		return endpoint
	}
	u.User = nil
	return u.String()
}

// stopTracing flushes and stops tr (nil: nothing to do), within
// tracingFlushTimeout.
func stopTracing(tr *tracing.Tracer, ops *slog.Logger) {
	if tr == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), tracingFlushTimeout)
	defer cancel()
	if err := tr.Shutdown(ctx); err != nil {
		ops.Warn("tracing: spans not exported at shutdown", "err", err)
	}
}

// warnConfig logs, at start and on a reload, what the configuration holds
// that does nothing (config.Warnings), one warning each.
func warnConfig(cfg *config.Config, log *slog.Logger) {
	for _, w := range cfg.Warnings() {
		log.Warn("config: " + w)
	}
}
