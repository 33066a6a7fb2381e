package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"runtime/debug"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
)

// ProbeHeader marks a request as the gateway's own synthetic probe on its
// way upstream ("1"), so that upstream logs can tell it from user traffic.
// The gateway removes it from callers' requests: upstream, it always means
// a probe.
const ProbeHeader = "X-Tollgate-Probe"

// probeUserAgent is the User-Agent of probe requests.
const probeUserAgent = "tollgate-probe"

// anthropicVersion is the anthropic-version a probe sends, the version the Anthropic SDKs send.
const anthropicVersion = "2023-06-01"

// errBadProbeTarget is returned for a target the configuration does not
// allow (config.Validate refuses them in [[probe.targets]]).
var errBadProbeTarget = errors.New("proxy: probe target is not a configured upstream serving its dialect")

// Probe sends one synthetic probe request to t.Upstream through the
// gateway's own exchange code, in process, in one attempt (no retry, no
// fallback), so that the result is that upstream's own health; it is kept out
// of every user figure (see ARCHITECTURE.md). ctx bounds it: run out, the
// result is llm.ProbeTimeout (no breaker verdict); cancelled,
// llm.ProbeCanceled. The error is for a target that is not a configured
// upstream serving its dialect.
func (g *Gateway) Probe(ctx context.Context, t llm.ProbeTarget) (llm.ProbeResult, error) {
	gen := g.begin()
	defer gen.end()
	var up *upstream
	for _, u := range gen.upstreams {
		if u.cfg.Name == t.Upstream {
			up = u
			break
		}
	}
	if up == nil {
		return llm.ProbeResult{}, errBadProbeTarget
	}
	d := t.Dialect
	if d == llm.DialectNone {
		d = gen.cfg.ProbeDialect(config.ProbeTarget{Upstream: t.Upstream})
	}
	if !up.cfg.Serves(d) || t.Model == "" {
		return llm.ProbeResult{}, errBadProbeTarget
	}
	body, route, path := probeBody(d, t)
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://tollgate.probe"+path, bytes.NewReader(body))
	if err != nil {
		return llm.ProbeResult{}, err
	}
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("User-Agent", probeUserAgent)
	if d == llm.DialectAnthropic {
		r.Header.Set("Anthropic-Version", anthropicVersion)
	}

	ex := g.newExchange(gen, &probeWriter{h: http.Header{}}, r, route, d, up, newRequestID())
	if _, rf := ex.inspect(body); !rf.ok() { // the gateway's own body: valid
		return llm.ProbeResult{}, rf.err
	}

	panicked := func() (panicked bool) {
		defer func() {
			if p := recover(); p != nil {
				g.log.Error("panic in a probe request", "request_id", ex.rec.RequestID,
					"upstream", up.cfg.Name, "panic", p, "stack", string(debug.Stack()))
				panicked = true
			}
		}()
		ex.roundTrip(body, false, []target{{up: up}})
		return false
	}()
	return ex.probeResult(ctx, ex.finish(), panicked), nil
}

// probeBody builds a probe request body in dialect d, streamed, with the
// route and path it goes to.
func probeBody(d llm.Dialect, t llm.ProbeTarget) ([]byte, llm.Route, string) {
	type message struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := []message{{Role: "user", Content: t.Prompt}}
	var v any
	route, path := llm.RouteChatCompletions, "/v1/chat/completions"
	if d == llm.DialectResponses {
		b, _ := json.Marshal(struct {
			Model           string `json:"model"`
			MaxOutputTokens int    `json:"max_output_tokens"`
			Stream          bool   `json:"stream"`
			Input           string `json:"input"`
		}{t.Model, t.MaxTokens, true, t.Prompt})
		return b, llm.RouteResponses, "/v1/responses"
	}
	if d == llm.DialectAnthropic {
		route, path = llm.RouteMessages, "/v1/messages"
		v = struct {
			Model     string    `json:"model"`
			MaxTokens int       `json:"max_tokens"`
			Stream    bool      `json:"stream"`
			Messages  []message `json:"messages"`
		}{t.Model, t.MaxTokens, true, msgs}
	} else {
		v = struct {
			Model               string    `json:"model"`
			MaxCompletionTokens int       `json:"max_completion_tokens"`
			Stream              bool      `json:"stream"`
			Messages            []message `json:"messages"`
		}{t.Model, t.MaxTokens, true, msgs}
	}
	b, _ := json.Marshal(v) // strings and ints only: cannot fail
	return b, route, path
}

// probeResult reads the result of a finished probe exchange from its
// record (rec): its one attempt's result, or what ended it before an
// attempt.
func (ex *exchange) probeResult(ctx context.Context, rec *llm.Record, panicked bool) llm.ProbeResult {
	res := llm.ProbeResult{E2E: rec.E2E(), OutputTokens: rec.Usage.Output}
	if n := min(rec.AttemptCount, llm.MaxRecordedAttempts); n > 0 {
		a := rec.Attempts[n-1]
		res.Result, res.Status = a.Result, a.Status
	}
	switch {
	case panicked:
		res.Result = llm.ProbeInternalError
	case res.Status == http.StatusUnauthorized || res.Status == http.StatusForbidden:
		res.Result = llm.ProbeAuthError
	case res.Result == "" || res.Result == resultClientGone:
		// The probe's own context ended the request.
		res.Result = llm.ProbeCanceled
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			res.Result = llm.ProbeTimeout
		}
	}
	if !rec.Timing.FirstTokenOut.IsZero() {
		res.TTFT, res.HasTTFT = rec.TTFT(), true
	}
	res.TPOT, res.HasTPOT = rec.TPOT()
	return res
}

// probeWriter is the ResponseWriter of a probe request: it discards the
// answer, as a caller that reads and drops every byte would, and flushes
// (to nothing) so that the relay times each token as it does for a caller.
type probeWriter struct {
	h http.Header
}

var _ http.Flusher = (*probeWriter)(nil)

func (w *probeWriter) Header() http.Header         { return w.h }
func (w *probeWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *probeWriter) WriteHeader(int)             {}
func (w *probeWriter) Flush()                      {}
