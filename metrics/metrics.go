// Package metrics owns tollgate's Prometheus collectors. Every collector is
// registered on a registry the caller injects; label values come from closed
// sets so that no caller input can grow the series count without bound: a
// requested model name becomes a label value only once an upstream has
// served it (ModelServed), within [metrics] max_models.
//
// Besides the request figures, the tollgate_upstream_* families follow each
// [[upstreams]] entry through retries, fallbacks, its circuit breaker and
// its shaping queue; their upstream label is a configured name.
// The tollgate_probe_* families hold the synthetic probe's results per
// configured target (upstream and model), apart from every user figure.
// The tollgate_conversation* families hold the figures of each ended
// conversation (package conversation) and the outcomes applications report
// for them, per team; the tollgate_session_* families those of the ended
// conversations that were coding agents' sessions, and the *_by_class
// families every request by the request class its agent named (a closed
// set, llm.RequestClasses and none).
package metrics

import (
	"math"
	"path"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/conversation"
	"github.com/tollgate-llm/tollgate/llm"
)

const namespace = "tollgate"

// Bucket layouts. Explicit buckets let histogram_quantile work on every
// Prometheus; native buckets (when enabled) add resolution where supported.
var (
	// TTFT and E2E: 1 ms to 5 min.
	latencyBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
		0.75, 1, 1.5, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300}
	// TPOT and ITL: 0.25 ms to 2.5 s.
	tokenBuckets = []float64{0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025,
		0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2.5}
	// Gateway overhead: 10 µs to 1 s.
	overheadBuckets = []float64{0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
		0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1}

	// Turns of a conversation: every count up to 6, then about 1.25× to
	// 200 and two beyond, so agent loops of a few hundred turns still fall
	// in a finite bucket.
	conversationTurnBuckets = []float64{1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 60, 80, 100,
		125, 150, 200, 300, 500}
	// Cost of a conversation: a tenth of a cent to $50, 1-2.5-5 a decade.
	conversationCostBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
		1, 2.5, 5, 10, 25, 50}
	// Tokens of a conversation, of one type: 100 to 50 M, 1-2.5-5 a
	// decade. Input grows with turns, as each turn resends the context.
	conversationTokenBuckets = []float64{100, 250, 500, 1e3, 2.5e3, 5e3, 1e4, 2.5e4, 5e4, 1e5, 2.5e5,
		5e5, 1e6, 2.5e6, 5e6, 1e7, 2.5e7, 5e7}
	// First to last turn of a conversation: a second (one turn: 0) to a day.
	conversationDurationBuckets = []float64{1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200,
		14400, 28800, 86400}
	// Outcome scores, 0 to 1 in tenths.
	scoreBuckets = []float64{0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1}
	// Shares of a session (of its time, of its cost): 0 on its own (no
	// subagent, no tool time), then in tenths with 5% at both ends.
	shareBuckets = []float64{0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1}
	// Compactions of a session: none, then every count up to 6, then a few.
	compactionBuckets = []float64{0, 1, 2, 3, 4, 5, 6, 8, 10, 15, 20}
)

// Label values used where a dimension is unknown.
const (
	labelNone  = "none"
	labelOther = "other"
)

// Metrics holds the collectors. The zero value is not usable; use New.
type Metrics struct {
	duration     *prometheus.HistogramVec
	ttft         *prometheus.HistogramVec
	upstreamTTFT *prometheus.HistogramVec
	tpot         *prometheus.HistogramVec
	itl          *prometheus.HistogramVec
	overhead     *prometheus.HistogramVec
	tokens       *prometheus.CounterVec
	requests     *prometheus.CounterVec
	goodput      *prometheus.CounterVec
	inflight     *prometheus.GaugeVec
	interrupts   *prometheus.CounterVec
	// refusals counts the requests the gateway refused (population
	// refused) by reason; refusalTime is how long it took to say so.
	refusals    *prometheus.CounterVec
	refusalTime *prometheus.HistogramVec // no labels
	// hold is how long model-call streams were held before their headers
	// went out (llm.Record.Hold).
	hold       *prometheus.HistogramVec
	cost       *prometheus.CounterVec
	rejections *prometheus.CounterVec
	degraded   *prometheus.GaugeVec
	replicas   prometheus.Gauge
	// claimsDeferred counts streams the relay did not hold for the record
	// of their new stored response.
	claimsDeferred prometheus.Counter
	// sockets counts Responses WebSocket upgrades by result; socketsOpen
	// is the sockets open now.
	sockets     *prometheus.CounterVec
	socketsOpen prometheus.Gauge

	// Configuration reloads.
	reloads          *prometheus.CounterVec
	reloadOK         prometheus.Gauge
	reloadSuccessful prometheus.Gauge

	// Upstream resilience: retries, fallbacks, the circuit breaker.
	attempts           *prometheus.CounterVec
	retries            *prometheus.CounterVec
	retriesSkipped     *prometheus.CounterVec
	fallbacks          *prometheus.CounterVec
	circuitState       *prometheus.GaugeVec
	circuitTransitions *prometheus.CounterVec
	breakerBypass      *prometheus.CounterVec
	retryWait          *prometheus.HistogramVec
	queueWait          *prometheus.HistogramVec
	queueWaiting       *prometheus.GaugeVec

	// The synthetic probe (package probe).
	probeRequests  *prometheus.CounterVec
	probeTTFT      *prometheus.HistogramVec
	probeTPOT      *prometheus.HistogramVec
	probeE2E       *prometheus.HistogramVec
	probeSuccess   *prometheus.GaugeVec
	probeLastRound *prometheus.GaugeVec
	probeInterval  *prometheus.GaugeVec

	// Ended conversations (package conversation) and the outcomes
	// applications report for them.
	convTurns         *prometheus.HistogramVec
	convCost          *prometheus.HistogramVec
	convTokens        *prometheus.HistogramVec
	convDuration      *prometheus.HistogramVec
	convEnded         *prometheus.CounterVec
	convOutcomes      *prometheus.CounterVec
	convScore         *prometheus.HistogramVec
	convCompletedCost *prometheus.CounterVec

	// Ended sessions (conversations whose calls carried a coding agent's
	// hints), per team.
	sessCost          *prometheus.HistogramVec
	sessCalls         *prometheus.HistogramVec
	sessUserTurns     *prometheus.HistogramVec
	sessDuration      *prometheus.HistogramVec
	sessTimeShare     *prometheus.HistogramVec
	sessCompactions   *prometheus.HistogramVec
	sessSubagentShare *prometheus.HistogramVec

	// Every request by team and request class.
	classRequests *prometheus.CounterVec
	classCost     *prometheus.CounterVec
	classDuration *prometheus.HistogramVec

	// circuit holds each upstream's last circuit state, so that a
	// transition is counted from what was set rather than read back from
	// the gauge; probeTargets the probe targets whose series exist. Both
	// are under circuitMu.
	circuitMu    sync.Mutex
	circuit      map[string]int
	probeTargets map[[2]string]bool

	buckets llm.Buckets
	models  *modelSet
}

// New registers tollgate's collectors on reg, with the constant labels of
// cfg.Metrics.Labels on every series.
func New(reg prometheus.Registerer, cfg *config.Config) (*Metrics, error) {
	mc := cfg.Metrics
	if len(mc.Labels) > 0 {
		reg = prometheus.WrapRegistererWith(prometheus.Labels(mc.Labels), reg)
	}
	hist := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		opts := prometheus.HistogramOpts{Namespace: namespace, Name: name, Help: help, Buckets: buckets}
		if mc.NativeHistograms {
			opts.NativeHistogramBucketFactor = 1.1
			opts.NativeHistogramMaxBucketNumber = 160
			opts.NativeHistogramMinResetDuration = time.Hour
		}
		return prometheus.NewHistogramVec(opts, labels)
	}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}, labels)
	}
	m := &Metrics{
		duration: hist("request_duration_seconds",
			"End-to-end latency: from the request's arrival to its last byte flushed (gen_ai.client.operation.duration); model calls and forwarded requests, each route its own, never a refusal (refusal_duration_seconds).",
			latencyBuckets, "route", "model", "team", "outcome", "input_bucket"),
		ttft: hist("time_to_first_token_seconds",
			"Streamed requests: from arrival to the first token-bearing event flushed to the client (gen_ai.client.operation.time_to_first_chunk).",
			latencyBuckets, "route", "model", "team", "input_bucket"),
		upstreamTTFT: hist("upstream_time_to_first_token_seconds",
			"Streamed requests: from the upstream request written to the first token-bearing event read (gen_ai.server.time_to_first_token).",
			latencyBuckets, "route", "model", "upstream"),
		tpot: hist("time_per_output_token_seconds",
			"Streamed requests with at least 2 output tokens: (last token - first token) / (output tokens - 1), one value per request (gen_ai.server.time_per_output_token).",
			tokenBuckets, "route", "model", "team"),
		itl: hist("inter_token_latency_seconds",
			"Every gap between consecutive token-bearing events of a stream; a chunk may carry several tokens (gen_ai.client.operation.time_per_output_chunk).",
			tokenBuckets, "route", "model"),
		overhead: hist("overhead_seconds",
			"Time the gateway itself adds: arrival to upstream request written, plus each event's read-to-flush time.",
			overheadBuckets, "route"),
		tokens: counter("tokens_total",
			"Tokens by type (input, output, cache_read, cache_write, reasoning); input includes cache_read and cache_write, output includes reasoning; estimated=true when the upstream reported no usage: output counted from events (or max_tokens billed for a forwarded answer), input estimated from the prompt.",
			"route", "model", "team", "type", "estimated"),
		requests: counter("requests_total", "Requests by status code sent to the client and outcome.",
			"route", "model", "team", "code", "outcome"),
		goodput: counter("goodput_requests_total",
			"Requests by SLO result: met, or the first objective broken (ttft, tpot, e2e), or failed.",
			"route", "model", "team", "slo"),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "inflight_requests",
			Help: "Exchanges open now."}, []string{"route"}),
		interrupts: counter("stream_interruptions_total", "Streams that ended early, and non-streamed answers that were not JSON (protocol_error), by cause.", "route", "cause"),
		refusals: counter("refusals_total",
			"Requests the gateway answered itself with an error before any upstream attempt (identity, limits, budgets, bad input, ownership), by reason (the access log's rejection). They are in no latency or goodput figure.",
			"reason", "team"),
		hold: hist("stream_hold_seconds",
			"Streamed model calls: how long the answer's headers and opening events were held back, from the upstream's first byte to the headers written to the caller, so that a failure before the first token could be retried unseen.",
			latencyBuckets, "route"),
		refusalTime: hist("refusal_duration_seconds",
			"How long the gateway took to refuse a request (population refused): arrival to the error's last byte.",
			overheadBuckets),
		cost: counter("cost_usd_total",
			"Spend in US dollars, priced by [[models]] from the usage of each billable exchange.",
			"route", "model", "team"),
		rejections: counter("ratelimit_rejections_total",
			"Requests refused by a limit, by scope (key, team) and limit (rpm, tpm, concurrency, tokens_per_day, cost_per_day, cost_per_month).",
			"scope", "limit", "team"),
		degraded: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "degraded",
			Help: "1 while a shared backend is unreachable and the gateway runs on its fallback (component = ratelimit, spend), or while Redis, found to have lost its data, is being refilled (redis_data)."},
			[]string{"component"}),
		reloads: counter("config_reload_total",
			"Configuration reloads (SIGHUP, POST /admin/reload, a watched file that changed), by result: success (the file was swapped in, or equal to the running one) or failure (it was refused and the running configuration kept).",
			"result"),
		reloadOK: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "config_last_reload_success_timestamp_seconds",
			Help: "Unix time of the last successful configuration load: the start, or the last reload that succeeded."}),
		reloadSuccessful: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "config_last_reload_successful",
			Help: "1 if the last configuration reload succeeded (or none was tried since the start), 0 if it was refused: the file on disk is then not what runs."}),
		replicas: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "fleet_replicas",
			Help: "Replicas sharing Redis at this replica's last heartbeat; while Redis is down, its fallback admits 1/this of every limit."}),
		claimsDeferred: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "stored_claims_deferred_total",
			Help: "Streams whose new stored response's owner or conversation link the store had not recorded within the relay's few-millisecond wait: the relay went on without it rather than hold a token (a slow or stalled ownership or conversation store)."}),

		sockets: counter("websocket_connections_total",
			"WebSocket upgrades on GET /v1/responses (the Responses API's WebSocket mode), by result: accepted, unauthorized, unsupported (no upstream speaks it: 426), upstream_refused (the upstream answered the upgrade with an error, relayed), upstream_unreachable. Each turn on an accepted socket is a request of route responses, transport websocket.",
			"result"),
		socketsOpen: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "websocket_connections_open",
			Help: "Responses API WebSockets open now, each joined to one of the gateway's own to its upstream."}),

		attempts: counter("upstream_attempts_total",
			"Attempts sent to an upstream, by result (ok, client_error, rate_limited, overloaded, server_error, connect_error, connection_error, header_timeout, first_token_timeout, idle_timeout, error_event, stream_broken, timeout, client_gone).",
			"upstream", "result"),
		retries: counter("upstream_retries_total",
			"Retries and fallbacks taken after a failed attempt on an upstream, by reason (the failed attempt's result).",
			"upstream", "reason"),
		retriesSkipped: counter("upstream_retries_skipped_total",
			"Retries not taken after a failed attempt, and upstreams passed over, by why (budget, wait_too_long, attempts, breaker_open, queue_full, queue_timeout, key_scope; attempts only when another upstream follows).",
			"upstream", "why"),
		fallbacks: counter("upstream_fallbacks_total",
			"Requests moved from one upstream of their route to the next, by reason (a failed attempt's result, or breaker_open, queue_full, queue_timeout when from was skipped without an attempt).",
			"from", "to", "reason"),
		circuitState: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "upstream_circuit_state",
			Help: "An upstream's circuit breaker: 0 closed, 1 half-open, 2 open."}, []string{"upstream"}),
		circuitTransitions: counter("upstream_circuit_transitions_total",
			"Circuit breaker state changes, by the state entered (closed, half_open, open).",
			"upstream", "to"),
		breakerBypass: counter("upstream_breaker_bypass_total",
			"Attempts sent to an upstream although its circuit breaker refused them (open, or half-open with every probe slot taken), because the breaker of every upstream the request could use refused it: the one open longest gets the request, once.",
			"upstream"),
		retryWait: hist("upstream_retry_wait_seconds",
			"Time one request spent waiting between attempts (backoff and Retry-After), once per request that waited, by the upstream that finally answered it.",
			latencyBuckets, "upstream"),
		queueWait: hist("upstream_queue_wait_seconds",
			"Time an attempt waited in an upstream's shaping queue (max_concurrent, requests_per_second) before it was sent.",
			latencyBuckets, "upstream"),
		queueWaiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "upstream_queue_waiting",
			Help: "Requests waiting now in an upstream's shaping queue."}, []string{"upstream"}),
		probeRequests: counter("probe_requests_total",
			"Synthetic probe requests, by result: ok, or why one failed (an attempt result: rate_limited, overloaded, server_error, client_error, connect_error, connection_error, header_timeout, first_token_timeout, idle_timeout, error_event, stream_broken; the upstream's timeout (408, 504, its timeout_seconds); breaker_open, queue_full, queue_timeout when nothing was sent; auth_error when the upstream refused the probe's key (401, 403); probe_timeout when the probe's own timeout_seconds or its round ran out; internal_error when the gateway failed).",
			"upstream", "model", "result"),
		probeTTFT: hist("probe_ttft_seconds",
			"Synthetic probe requests that succeeded: from the request entering the gateway to its first token-bearing event relayed.",
			latencyBuckets, "upstream", "model"),
		probeTPOT: hist("probe_tpot_seconds",
			"Synthetic probe requests that succeeded with at least 2 output tokens: time per output token.",
			tokenBuckets, "upstream", "model"),
		probeE2E: hist("probe_e2e_seconds",
			"Synthetic probe requests that succeeded: end-to-end latency.",
			latencyBuckets, "upstream", "model"),
		probeSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "probe_success_ratio",
			Help: "Share of the requests of a target's last finished probe round that succeeded; NaN before the first round."},
			[]string{"upstream", "model"}),
		probeLastRound: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "probe_last_round_timestamp_seconds",
			Help: "Unix time at which a target's last probe round finished; NaN before the first round."},
			[]string{"upstream", "model"}),
		probeInterval: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "probe_interval_seconds",
			Help: "The probe's [probe] interval_seconds, per target, so that an alert can tell a late round."},
			[]string{"upstream", "model"}),
		convTurns: hist("conversation_turns",
			"Conversations that ended idle (no turn for [conversations] idle timeout): their turns (requests), by the team of their first turn.",
			conversationTurnBuckets, "team"),
		convCost: hist("conversation_cost_usd",
			"Conversations that ended idle: their spend in US dollars, priced by [[models]] as each turn was billed.",
			conversationCostBuckets, "team"),
		convTokens: hist("conversation_tokens",
			"Conversations that ended idle: their tokens by type (input, output, cache_read, cache_write, reasoning; input includes cache_read and cache_write, output includes reasoning, as in tollgate_tokens_total), zeros included.",
			conversationTokenBuckets, "team", "type"),
		convDuration: hist("conversation_duration_seconds",
			"Conversations that ended idle: the time from their first turn's end to their last's (0 for one turn).",
			conversationDurationBuckets, "team"),
		convEnded: counter("conversations_ended_total",
			"Conversations ended, by reason (idle: no turn for the idle timeout; evicted: pushed out by [conversations] max_active, its figures partial and so not in the tollgate_conversation_* histograms) and errored (true when any turn failed).",
			"team", "reason", "errored"),
		convOutcomes: counter("conversation_outcomes_total",
			"Outcomes applications reported for conversations (POST /tollgate/conversations/{id}/outcome), by completed (whether the conversation's task was done).",
			"team", "completed"),
		convScore: hist("conversation_score",
			"Quality scores (0 to 1) of reported outcomes that carry one.",
			scoreBuckets, "team"),
		convCompletedCost: counter("conversation_completed_cost_usd_total",
			"Spend in US dollars of the conversations reported completed, up to the report; divided by tollgate_conversation_outcomes_total{completed=\"true\"} it is the cost per completed task.",
			"team"),

		sessCost: hist("session_cost_usd",
			"Coding agents' sessions (conversations any of whose calls carried an agent's hints) that ended idle: their spend in US dollars, by the team of their first call.",
			conversationCostBuckets, "team"),
		sessCalls: hist("session_calls",
			"Sessions that ended idle: their calls (requests) of every class.",
			conversationTurnBuckets, "team"),
		sessUserTurns: hist("session_user_turns",
			"Sessions that ended idle: their user turns (the distinct prompts their calls served; 0 when the agent names none).",
			conversationTurnBuckets, "team"),
		sessDuration: hist("session_duration_seconds",
			"Sessions that ended idle: their wall time, from their first call's arrival to their last call's end.",
			conversationDurationBuckets, "team"),
		sessTimeShare: hist("session_time_share",
			"Sessions that ended idle: the share of their time each part took (part = model: the calls' summed E2E; tool: the tool durations the agents reported; other: the rest), over the wall time or, when calls and tools overlap past it, their sum.",
			shareBuckets, "team", "part"),
		sessCompactions: hist("session_compactions",
			"Sessions that ended idle: their calls that compacted the context, of every kind, zeros included.",
			compactionBuckets, "team"),
		sessSubagentShare: hist("session_subagent_cost_share",
			"Sessions that ended idle: the share of their cost their subagents' calls (class subagent) took, zeros included.",
			shareBuckets, "team"),
		classRequests: counter("requests_by_class_total",
			"Requests by the request class their coding agent named: main, subagent, workflow, compaction, auxiliary, warmup, other (a value outside these), none (no class named).",
			"team", "class"),
		classCost: counter("cost_by_class_usd_total",
			"Spend in US dollars by request class, priced by [[models]] as each request was billed.",
			"team", "class"),
		classDuration: hist("request_duration_by_class_seconds",
			"End-to-end latency of every request, by request class: the model's share of a session's time, call by call.",
			latencyBuckets, "team", "class"),

		circuit:      make(map[string]int, len(cfg.Upstreams)),
		probeTargets: map[[2]string]bool{},

		buckets: llm.NewBuckets(mc.LatencyBuckets),
		models:  newModelSet(mc.Models, mc.MaxModels, labelPatterns(cfg)),
	}
	for _, c := range []prometheus.Collector{m.duration, m.ttft, m.upstreamTTFT, m.tpot, m.itl, m.overhead,
		m.tokens, m.requests, m.goodput, m.inflight, m.interrupts, m.refusals, m.refusalTime, m.hold, m.cost, m.rejections, m.degraded, m.replicas,
		m.claimsDeferred, m.sockets, m.socketsOpen, m.reloads, m.reloadOK, m.reloadSuccessful,
		m.attempts, m.retries, m.retriesSkipped, m.fallbacks, m.circuitState, m.circuitTransitions, m.breakerBypass,
		m.retryWait, m.queueWait, m.queueWaiting,
		m.probeRequests, m.probeTTFT, m.probeTPOT, m.probeE2E, m.probeSuccess, m.probeLastRound, m.probeInterval,
		m.convTurns, m.convCost, m.convTokens, m.convDuration, m.convEnded, m.convOutcomes, m.convScore, m.convCompletedCost,
		m.sessCost, m.sessCalls, m.sessUserTurns, m.sessDuration, m.sessTimeShare, m.sessCompactions, m.sessSubagentShare,
		m.classRequests, m.classCost, m.classDuration} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, r := range []llm.Route{llm.RouteChatCompletions, llm.RouteMessages, llm.RouteResponses, llm.RouteResponsesRetrieve, llm.RouteCountTokens, llm.RouteOther} {
		m.inflight.WithLabelValues(r.String())
	}
	for _, c := range []string{"ratelimit", "spend", "redis_data"} {
		m.degraded.WithLabelValues(c)
	}
	for _, r := range []string{"success", "failure"} {
		m.reloads.WithLabelValues(r)
	}
	m.reloadOK.Set(float64(time.Now().UnixNano()) / 1e9)
	m.reloadSuccessful.Set(1)
	m.addSeries(cfg)
	return m, nil
}

// Reconfigure takes a reloaded configuration: the model names its
// [[models]] patterns give a label to, and the series of new upstreams and
// probe targets. Series of upstreams and targets no longer configured stay
// as they were last written.
func (m *Metrics) Reconfigure(cfg *config.Config) {
	m.models.setPatterns(labelPatterns(cfg))
	m.addSeries(cfg)
	m.dropProbeTargets(cfg)
}

// dropProbeTargets deletes the gauges of the probe targets cfg no longer
// probes (all of them with [probe] off): left as last written, the stalled
// probe alert would fire for them until a restart. Their counters and
// histograms stay, as a counter's history does.
func (m *Metrics) dropProbeTargets(cfg *config.Config) {
	keep := map[[2]string]bool{}
	if cfg.Probe.Enabled {
		for _, t := range cfg.Probe.Targets {
			keep[[2]string{t.Upstream, t.Model}] = true
		}
	}
	m.circuitMu.Lock()
	defer m.circuitMu.Unlock()
	for t := range m.probeTargets {
		if keep[t] {
			continue
		}
		delete(m.probeTargets, t)
		for _, g := range []*prometheus.GaugeVec{m.probeSuccess, m.probeLastRound, m.probeInterval} {
			g.DeleteLabelValues(t[0], t[1])
		}
	}
}

// addSeries creates the series every upstream and probe target shows from
// the start: a closed circuit, a zero ok count and no bypass, so rate() and
// alerts on them work before the first failure; the probe's series, so
// dashboards show them before the first round (the gauges are NaN until
// then, which no alert threshold matches). A series that exists is kept.
func (m *Metrics) addSeries(cfg *config.Config) {
	for _, u := range cfg.Upstreams {
		m.circuitMu.Lock()
		if _, ok := m.circuit[u.Name]; !ok {
			m.circuitState.WithLabelValues(u.Name)
			m.circuit[u.Name] = CircuitClosed
		}
		m.circuitMu.Unlock()
		m.attempts.WithLabelValues(u.Name, "ok")
		m.breakerBypass.WithLabelValues(u.Name)
	}
	// A configured team's conversation counters start at 0, so that the
	// first conversation it ends or completes shows in increase() and
	// rate(), and a completion rate reads 0 rather than nothing. Only the
	// common cases: an error or an eviction makes its series when it
	// happens.
	for _, t := range cfg.Teams {
		m.convEnded.WithLabelValues(t.Name, conversation.EndIdle.String(), "false")
		m.convOutcomes.WithLabelValues(t.Name, "true")
		m.convOutcomes.WithLabelValues(t.Name, "false")
		m.convCompletedCost.WithLabelValues(t.Name)
	}
	p := cfg.Probe
	if !p.Enabled {
		return
	}
	for _, t := range p.Targets {
		m.probeRequests.WithLabelValues(t.Upstream, t.Model, "ok")
		m.probeTTFT.WithLabelValues(t.Upstream, t.Model)
		m.probeTPOT.WithLabelValues(t.Upstream, t.Model)
		m.probeE2E.WithLabelValues(t.Upstream, t.Model)
		m.probeInterval.WithLabelValues(t.Upstream, t.Model).Set(p.IntervalSeconds)
		m.circuitMu.Lock()
		seen := m.probeTargets[[2]string{t.Upstream, t.Model}]
		m.probeTargets[[2]string{t.Upstream, t.Model}] = true
		m.circuitMu.Unlock()
		if !seen {
			m.probeSuccess.WithLabelValues(t.Upstream, t.Model).Set(math.NaN())
			m.probeLastRound.WithLabelValues(t.Upstream, t.Model).Set(math.NaN())
		}
	}
}

// Buckets returns the input-size segmentation.
func (m *Metrics) Buckets() llm.Buckets { return m.buckets }

// Model returns the label value a requested model name has now, without
// giving it one: the name itself when it has a label of its own ([metrics]
// models, or given one by ModelServed), "none" for an empty name, else
// "other". A request nobody has served yet (refused by the gateway or the
// upstream, or not answered yet) is labelled with it.
func (m *Metrics) Model(name string) string { return m.models.label(name) }

// ModelServed returns the label value of a model name an upstream has
// answered with a success status, giving the name a label of its own when
// it has none yet, one of max_models is free and the name may have one: at
// most 128 printable ASCII bytes and, when [[models]] patterns exist (and
// [metrics] models_from_prices is on), matching one of them. Otherwise it is
// Model's answer. A name that only a caller vouches for never takes a
// label, so callers cannot use up the labels with names of their own.
func (m *Metrics) ModelServed(name string) string { return m.models.claim(name) }

// Inflight returns the open-exchanges gauge of a route; Inc at the start of an
// exchange and Dec at its end.
func (m *Metrics) Inflight(r llm.Route) prometheus.Gauge {
	return m.inflight.WithLabelValues(r.String())
}

// ITL returns the inter-token-latency observer of one stream. Resolve it once
// per request, before the relay starts, so the relay only calls Observe.
func (m *Metrics) ITL(r llm.Route, modelLabel string) prometheus.Observer {
	return m.itl.WithLabelValues(r.String(), modelLabel)
}

// Observe records one finished exchange. model is the label from Model.
// ITL gaps are not observed here: the relay observes them as they happen.
func (m *Metrics) Observe(rec *llm.Record, model string) {
	route := rec.Route.String()
	team := rec.Team
	if team == "" {
		team = labelNone
	}
	inputBucket := rec.InputBucket
	if inputBucket == "" {
		inputBucket = "unknown"
	}
	outcome := rec.Outcome.String()
	class := conversation.ClassLabel(rec.RequestClass)

	if rec.Population == llm.PopRefused {
		// A refusal is in no latency or goodput figure: counted and timed
		// apart.
		m.refusals.WithLabelValues(rec.Rejection.String(), team).Inc()
		if e2e := rec.E2E(); e2e > 0 {
			m.refusalTime.WithLabelValues().Observe(e2e.Seconds())
		}
	} else if e2e := rec.E2E(); e2e > 0 {
		m.duration.WithLabelValues(route, model, team, outcome, inputBucket).Observe(e2e.Seconds())
		m.classDuration.WithLabelValues(team, class).Observe(e2e.Seconds())
	}
	if rec.Stream && !rec.Timing.FirstTokenOut.IsZero() {
		m.ttft.WithLabelValues(route, model, team, inputBucket).Observe(rec.TTFT().Seconds())
	}
	if hold, ok := rec.Hold(); ok && rec.Population == llm.PopModelCall {
		m.hold.WithLabelValues(route).Observe(hold.Seconds())
	}
	if rec.Stream && !rec.Timing.FirstToken.IsZero() && !rec.Timing.UpSent.IsZero() {
		up := rec.Upstream
		if up == "" {
			up = labelNone
		}
		m.upstreamTTFT.WithLabelValues(route, model, up).Observe(rec.UpstreamTTFT().Seconds())
	}
	if tpot, ok := rec.TPOT(); ok && rec.Stream {
		m.tpot.WithLabelValues(route, model, team).Observe(tpot.Seconds())
	}
	if !rec.Timing.UpSent.IsZero() {
		m.overhead.WithLabelValues(route).Observe(rec.Overhead().Seconds())
	}

	u := rec.Usage
	if u.HasInput {
		est := strconv.FormatBool(rec.InputEstimated)
		m.addTokens(route, model, team, "input", est, u.Input)
		m.addTokens(route, model, team, "cache_read", est, u.CacheRead)
		m.addTokens(route, model, team, "cache_write", est, u.CacheWrite)
	}
	if u.HasOutput || rec.Estimated {
		est := strconv.FormatBool(rec.Estimated)
		m.addTokens(route, model, team, "output", est, u.Output)
		m.addTokens(route, model, team, "reasoning", est, u.Reasoning)
	}

	if rec.CostMicros > 0 {
		m.cost.WithLabelValues(route, model, team).Add(float64(rec.CostMicros) / 1e6)
		m.classCost.WithLabelValues(team, class).Add(float64(rec.CostMicros) / 1e6)
	}
	m.requests.WithLabelValues(route, model, team, statusCode(rec.Status), outcome).Inc()
	m.classRequests.WithLabelValues(team, class).Inc()
	if rec.Goodput != llm.SLOExcluded { // a model call
		m.goodput.WithLabelValues(route, model, team, rec.Goodput.String()).Inc()
	}
	if rec.Interruption != llm.InterruptNone {
		m.interrupts.WithLabelValues(route, rec.Interruption.String()).Inc()
	}
}

// Rejected counts a request refused by a limit. team is "" for none.
func (m *Metrics) Rejected(scope, limit, team string) {
	if team == "" {
		team = labelNone
	}
	m.rejections.WithLabelValues(scope, limit, team).Inc()
}

// ConfigReloaded counts a configuration reload that succeeded at at, or
// failed.
func (m *Metrics) ConfigReloaded(ok bool, at time.Time) {
	if !ok {
		m.reloads.WithLabelValues("failure").Inc()
		m.reloadSuccessful.Set(0)
		return
	}
	m.reloads.WithLabelValues("success").Inc()
	m.reloadSuccessful.Set(1)
	m.reloadOK.Set(float64(at.UnixNano()) / 1e9)
}

// SetDegraded sets the degraded gauge of a component ("ratelimit",
// "spend" or "redis_data").
func (m *Metrics) SetDegraded(component string, degraded bool) {
	v := 0.0
	if degraded {
		v = 1
	}
	m.degraded.WithLabelValues(component).Set(v)
}

// StoredClaimDeferred counts a stream the relay did not hold for the record
// of its new stored response (the store answered too slowly).
func (m *Metrics) StoredClaimDeferred() { m.claimsDeferred.Inc() }

// Socket counts a WebSocket upgrade by result (see websocket_connections_total).
func (m *Metrics) Socket(result string) { m.sockets.WithLabelValues(result).Inc() }

// SocketsOpen returns the gauge of open WebSockets.
func (m *Metrics) SocketsOpen() prometheus.Gauge { return m.socketsOpen }

// SetReplicas sets the replicas sharing Redis, as the fleet's heartbeat
// last read them.
func (m *Metrics) SetReplicas(n int) { m.replicas.Set(float64(n)) }

// UpstreamAttempt counts one attempt sent to an upstream, by result.
func (m *Metrics) UpstreamAttempt(upstream, result string) {
	m.attempts.WithLabelValues(upstream, result).Inc()
}

// UpstreamRetry counts a retry or fallback taken after a failed attempt on
// upstream, by reason (the failed attempt's result).
func (m *Metrics) UpstreamRetry(upstream, reason string) {
	m.retries.WithLabelValues(upstream, reason).Inc()
}

// UpstreamRetrySkipped counts a retry not taken after a failed attempt on
// upstream, by why: budget, wait_too_long, attempts, breaker_open,
// queue_full, queue_timeout, key_scope.
func (m *Metrics) UpstreamRetrySkipped(upstream, why string) {
	m.retriesSkipped.WithLabelValues(upstream, why).Inc()
}

// UpstreamFallback counts a request moved from one upstream to the next of
// its route, by reason: a failed attempt's result, or breaker_open,
// queue_full or queue_timeout when from was skipped without an attempt.
func (m *Metrics) UpstreamFallback(from, to, reason string) {
	m.fallbacks.WithLabelValues(from, to, reason).Inc()
}

// Circuit breaker states, as SetCircuitState takes them and
// tollgate_upstream_circuit_state exports them.
const (
	CircuitClosed   = 0
	CircuitHalfOpen = 1
	CircuitOpen     = 2
)

// circuitStates are the to label values of the transitions counter, by
// state.
var circuitStates = [...]string{CircuitClosed: "closed", CircuitHalfOpen: "half_open", CircuitOpen: "open"}

// SetCircuitState sets an upstream's circuit state gauge (CircuitClosed,
// CircuitHalfOpen, CircuitOpen) and, when the state differs from the last
// one set, counts the transition by the state entered. Every upstream starts
// closed. A state outside the three is ignored, to keep the to label a
// closed set.
func (m *Metrics) SetCircuitState(upstream string, state int) {
	if state < 0 || state >= len(circuitStates) {
		return
	}
	// One lock around compare, gauge and counter keeps the gauge at the
	// last state counted when two callers race.
	m.circuitMu.Lock()
	defer m.circuitMu.Unlock()
	prev, known := m.circuit[upstream]
	if !known {
		prev = CircuitClosed
	}
	m.circuit[upstream] = state
	m.circuitState.WithLabelValues(upstream).Set(float64(state))
	if state != prev {
		m.circuitTransitions.WithLabelValues(upstream, circuitStates[state]).Inc()
	}
}

// UpstreamBreakerBypass counts an attempt sent to upstream although its
// breaker refused it, because every upstream of the request's route refused
// it (see tollgate_upstream_breaker_bypass_total).
func (m *Metrics) UpstreamBreakerBypass(upstream string) {
	m.breakerBypass.WithLabelValues(upstream).Inc()
}

// RetryWait observes the time one request spent waiting between attempts
// (backoff and Retry-After), once per request that waited. upstream is the
// one that finally answered the request.
func (m *Metrics) RetryWait(upstream string, d time.Duration) {
	m.retryWait.WithLabelValues(upstream).Observe(d.Seconds())
}

// QueueWait observes the time an attempt spent in an upstream's shaping
// queue.
func (m *Metrics) QueueWait(upstream string, d time.Duration) {
	m.queueWait.WithLabelValues(upstream).Observe(d.Seconds())
}

// SetQueueWaiting sets the number of requests waiting now in an upstream's
// shaping queue.
func (m *Metrics) SetQueueWaiting(upstream string, n int) {
	m.queueWaiting.WithLabelValues(upstream).Set(float64(n))
}

// ProbeSample is the result of one synthetic probe request.
type ProbeSample struct {
	// Result is "ok" or why the request failed (see ObserveProbe).
	Result string
	// TTFT, TPOT and E2E are its figures; HasTTFT and HasTPOT say whether
	// it had a first token, and at least 2 output tokens.
	TTFT, TPOT, E2E  time.Duration
	HasTTFT, HasTPOT bool
}

// ObserveProbe records one synthetic probe request of a target: it counts
// it by result and, when it succeeded, observes its TTFT, TPOT and E2E (a
// failure's latency, such as a 529 answered at once, would only pull the
// percentiles down; the failure shows in the result count). upstream and
// model come from the configured targets.
func (m *Metrics) ObserveProbe(upstream, model string, s ProbeSample) {
	m.probeRequests.WithLabelValues(upstream, model, s.Result).Inc()
	if s.Result != "ok" {
		return
	}
	if s.HasTTFT {
		m.probeTTFT.WithLabelValues(upstream, model).Observe(s.TTFT.Seconds())
	}
	if s.HasTPOT {
		m.probeTPOT.WithLabelValues(upstream, model).Observe(s.TPOT.Seconds())
	}
	m.probeE2E.WithLabelValues(upstream, model).Observe(s.E2E.Seconds())
}

// ProbeRound records a target's finished probe round: the share of its
// requests that succeeded and when it finished.
func (m *Metrics) ProbeRound(upstream, model string, successRatio float64, at time.Time) {
	m.probeSuccess.WithLabelValues(upstream, model).Set(successRatio)
	m.probeLastRound.WithLabelValues(upstream, model).Set(float64(at.UnixNano()) / 1e9)
}

// ConversationEnded records a conversation that ended (the store's
// Options.OnEnd). Every one is counted by reason and by whether any of its
// turns failed; one that ended idle also has its turns, cost, tokens by
// type and duration observed, and, when it was a coding agent's session
// (conversation.IsSession), its session figures (sessionEnded). An evicted
// one is only counted: its figures are partial (it may go on as a new
// conversation), and would pull the distributions down. Its team label is
// c.Team, "none" for "": the team of a [[keys]] entry, so from the
// configuration.
func (m *Metrics) ConversationEnded(c conversation.Conversation, why conversation.Reason) {
	team := c.Team
	if team == "" {
		team = labelNone
	}
	m.convEnded.WithLabelValues(team, why.String(), strconv.FormatBool(c.Errors > 0)).Inc()
	if why != conversation.EndIdle {
		return
	}
	m.convTurns.WithLabelValues(team).Observe(float64(c.Turns))
	m.convCost.WithLabelValues(team).Observe(float64(max(c.CostMicros, 0)) / 1e6)
	m.convDuration.WithLabelValues(team).Observe(max(c.Duration(), 0).Seconds())
	tk := c.Tokens
	for _, v := range [...]struct {
		typ string
		n   int64
	}{{"input", tk.Input}, {"output", tk.Output}, {"cache_read", tk.CacheRead},
		{"cache_write", tk.CacheWrite}, {"reasoning", tk.Reasoning}} {
		m.convTokens.WithLabelValues(team, v.typ).Observe(float64(max(v.n, 0)))
	}
	if c.IsSession() {
		m.sessionEnded(&c, team)
	}
}

// sessionEnded observes the figures of a session that ended idle: its cost,
// calls, user turns, wall time, the shares of its time, its compactions
// and its subagents' share of its cost, as package conversation defines
// them.
func (m *Metrics) sessionEnded(c *conversation.Conversation, team string) {
	split := c.TimeSplit()
	model, tool, other := split.Shares()
	m.sessCost.WithLabelValues(team).Observe(float64(max(c.CostMicros, 0)) / 1e6)
	m.sessCalls.WithLabelValues(team).Observe(float64(max(c.Turns, 0)))
	m.sessUserTurns.WithLabelValues(team).Observe(float64(max(c.Breakdown.Prompts, 0)))
	m.sessDuration.WithLabelValues(team).Observe(max(split.Wall, 0).Seconds())
	m.sessTimeShare.WithLabelValues(team, "model").Observe(model)
	m.sessTimeShare.WithLabelValues(team, "tool").Observe(tool)
	m.sessTimeShare.WithLabelValues(team, "other").Observe(other)
	m.sessCompactions.WithLabelValues(team).Observe(float64(c.Breakdown.CompactionCalls()))
	m.sessSubagentShare.WithLabelValues(team).Observe(c.SubagentCostShare())
}

// ConversationOutcome records the outcome an application reported for a
// conversation of team ("" for none) that had cost costMicros so far: it
// counts it by completed, observes its score when it has one in [0, 1]
// (another value, which the API refuses, is left out rather than put in
// an edge bucket), and adds the cost of a completed one to
// tollgate_conversation_completed_cost_usd_total. The feedback text is
// never a label.
func (m *Metrics) ConversationOutcome(team string, o conversation.Outcome, costMicros int64) {
	if team == "" {
		team = labelNone
	}
	m.convOutcomes.WithLabelValues(team, strconv.FormatBool(o.Completed)).Inc()
	if o.Score != nil && *o.Score >= 0 && *o.Score <= 1 {
		m.convScore.WithLabelValues(team).Observe(*o.Score)
	}
	if o.Completed {
		m.convCompletedCost.WithLabelValues(team).Add(float64(max(costMicros, 0)) / 1e6)
	}
}

func (m *Metrics) addTokens(route, model, team, typ, est string, n int64) {
	if n <= 0 {
		return
	}
	m.tokens.WithLabelValues(route, model, team, typ, est).Add(float64(n))
}

// statusCodes memoises the label strings of every valid status so the finish
// path does not format one per request.
var statusCodes = func() [600]string {
	var s [600]string
	for i := 100; i < 600; i++ {
		s[i] = strconv.Itoa(i)
	}
	return s
}()

func statusCode(code int) string {
	if code >= 100 && code < 600 {
		return statusCodes[code]
	}
	return "000"
}

// modelSet bounds the model label's cardinality. A name is in known once
// it has a label of its own; names get in only through claim, after an
// upstream served them.
type modelSet struct {
	mu    sync.RWMutex
	known map[string]struct{}
	max   int
	// patterns, when not empty, are the path.Match patterns a name must
	// match to be claimed.
	patterns []string
}

func newModelSet(configured []string, max int, patterns []string) *modelSet {
	s := &modelSet{known: make(map[string]struct{}, len(configured)), max: max, patterns: patterns}
	for _, m := range configured {
		s.known[m] = struct{}{}
	}
	if s.max < len(s.known) {
		s.max = len(s.known)
	}
	return s
}

// labelPatterns returns the patterns a model name must match to take a
// label: the [[models]] patterns, unless models_from_prices is off.
func labelPatterns(cfg *config.Config) []string {
	if !cfg.Metrics.ModelsFromPrices {
		return nil
	}
	p := make([]string, 0, len(cfg.Models))
	for _, m := range cfg.Models {
		p = append(p, m.Pattern)
	}
	return p
}

// maxModelName caps the length of a model name used as a label value.
const maxModelName = 128

// label returns name's label as it stands, taking nothing.
func (s *modelSet) label(name string) string {
	if name == "" {
		return labelNone
	}
	s.mu.RLock()
	_, ok := s.known[name]
	s.mu.RUnlock()
	if ok {
		return name
	}
	return labelOther
}

// claim returns name's label, giving it one of its own if it may have one
// and one is free.
func (s *modelSet) claim(name string) string {
	if name == "" {
		return labelNone
	}
	s.mu.RLock()
	_, ok := s.known[name]
	full := len(s.known) >= s.max
	s.mu.RUnlock()
	if ok {
		return name
	}
	if full || !s.eligible(name) {
		return labelOther
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.known[name]; ok {
		return name
	}
	if len(s.known) >= s.max {
		return labelOther
	}
	s.known[name] = struct{}{}
	return name
}

// setPatterns replaces the patterns a name must match to be claimed. Names
// claimed already keep their label.
func (s *modelSet) setPatterns(patterns []string) {
	s.mu.Lock()
	s.patterns = patterns
	s.mu.Unlock()
}

// eligible reports whether name may have a label of its own.
func (s *modelSet) eligible(name string) bool {
	if len(name) > maxModelName || !printable(name) {
		return false
	}
	s.mu.RLock()
	patterns := s.patterns
	s.mu.RUnlock()
	if len(patterns) == 0 {
		return true
	}
	for _, p := range patterns {
		// A malformed pattern matches nothing; config validation reports it.
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}
