package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/ratelimit"
	"github.com/tollgate-llm/tollgate/spend"
)

// settleTimeout bounds the Settle of a lease after the response is done. The
// caller's context may be gone by then (a cancelled stream must still be
// settled), so Settle runs without its cancellation.
const settleTimeout = 2 * time.Second

// governance is the gateway's view of [[keys]], [[teams]] and [[models]]:
// who a caller is, what it may use, and what it may spend (DESIGN 4).
type governance struct {
	keysMode         bool
	keys             map[[sha256.Size]byte]*keyEntry
	teams            map[string]*teamEntry
	limiter          ratelimit.Limiter // nil: no limits configured
	ledger           spend.Ledger      // nil: no spend ledger
	prices           *spend.Prices
	defaultMaxTokens int64
}

// keyEntry is one [[keys]] table.
type keyEntry struct {
	name    string
	team    *teamEntry // nil when the key has no team
	subject ratelimit.Subject
	limited bool
}

// teamEntry is one [[teams]] table.
type teamEntry struct {
	name     string
	patterns []string // empty: any model
	subject  ratelimit.Subject
	limited  bool
}

// newGovernance indexes the configuration. The config is validated, so every
// team a key names exists and every sha256 is 64 hex digits.
func newGovernance(cfg *config.Config, limiter ratelimit.Limiter, ledger spend.Ledger) (*governance, error) {
	gv := &governance{
		keysMode:         cfg.Auth.Mode == "keys",
		keys:             make(map[[sha256.Size]byte]*keyEntry, len(cfg.Keys)),
		teams:            make(map[string]*teamEntry, len(cfg.Teams)),
		limiter:          limiter,
		ledger:           ledger,
		prices:           spend.NewPrices(cfg.Models),
		defaultMaxTokens: cfg.RateLimit.DefaultMaxTokens,
	}
	for i := range cfg.Teams {
		t := &cfg.Teams[i]
		lim := ratelimit.LimitsFrom(t.Limits)
		gv.teams[t.Name] = &teamEntry{
			name:     t.Name,
			patterns: t.Models,
			subject:  ratelimit.Subject{Scope: ratelimit.ScopeTeam, ID: t.Name, Limits: lim},
			limited:  lim != (ratelimit.Limits{}),
		}
	}
	for i := range cfg.Keys {
		k := &cfg.Keys[i]
		var sum [sha256.Size]byte
		if n, err := hex.Decode(sum[:], []byte(k.SHA256)); err != nil || n != sha256.Size {
			return nil, fmt.Errorf("proxy: keys[%d].sha256 is not a SHA-256 in hex", i)
		}
		lim := ratelimit.LimitsFrom(k.Limits)
		e := &keyEntry{
			name:    k.Name,
			subject: ratelimit.Subject{Scope: ratelimit.ScopeKey, ID: k.Name, Limits: lim},
			limited: lim != (ratelimit.Limits{}),
		}
		if k.Team != "" {
			e.team = gv.teams[k.Team]
			if e.team == nil {
				return nil, fmt.Errorf("proxy: keys[%d].team %q is not a [[teams]] name", i, k.Team)
			}
		}
		gv.keys[sum] = e
	}
	return gv, nil
}

// hasLimits reports whether any key or team has a limit, i.e. whether the
// gateway needs a limiter at all.
func (gv *governance) hasLimits() bool {
	for _, k := range gv.keys {
		if k.limited {
			return true
		}
	}
	for _, t := range gv.teams {
		if t.limited {
			return true
		}
	}
	return false
}

// lookup finds the [[keys]] table of a caller's key by its SHA-256 (see
// keyHash), or nil; hasKey is false when the caller sent no key.
func (gv *governance) lookup(sum [sha256.Size]byte, hasKey bool) *keyEntry {
	if !hasKey || len(gv.keys) == 0 {
		return nil
	}
	return gv.keys[sum]
}

// modelAllowed reports whether a team may use model.
func (t *teamEntry) modelAllowed(model string) bool {
	if len(t.patterns) == 0 {
		return true
	}
	for _, p := range t.patterns {
		if ok, _ := path.Match(p, model); ok {
			return true
		}
	}
	return false
}

// identify names the caller from its key's SHA-256 (see keyHash):
// the [[keys]] name and team when listed, and says whether the caller may go
// on. In mode "keys" the key must be configured.
func (ex *exchange) identify(sum [sha256.Size]byte, hasKey bool) *apiError {
	gv := ex.g.gov
	ex.key = gv.lookup(sum, hasKey)
	if ex.key != nil {
		// The record's key id was the hash prefix; the name says more.
		ex.rec.KeyID = ex.key.name
		if ex.key.team != nil {
			ex.rec.Team = ex.key.team.name
		}
	}
	if !gv.keysMode {
		return nil
	}
	switch {
	case !hasKey:
		return errUnauthorized("missing API key: send \"Authorization: Bearer <key>\" or \"x-api-key: <key>\"")
	case ex.key == nil:
		// The message names the key only by the hash prefix the operators
		// can find in the access log.
		return errUnauthorized("invalid API key (id " + ex.rec.KeyID + "): it is not one of this gateway's keys")
	}
	return nil
}

// subjects returns the limited subjects of the caller: its key and its team.
func (ex *exchange) subjects() []ratelimit.Subject {
	k := ex.key
	if k == nil || ex.g.gov.limiter == nil {
		return nil
	}
	var out []ratelimit.Subject
	if k.limited {
		out = append(out, k.subject)
	}
	if k.team != nil && k.team.limited {
		out = append(out, k.team.subject)
	}
	return out
}

// admit checks the caller's team may use the model and its limits admit the
// request. On refusal it answers the caller and returns false.
func (ex *exchange) admit() bool {
	gv := ex.g.gov
	if ex.key != nil && ex.key.team != nil && !ex.key.team.modelAllowed(ex.rec.Model) {
		ex.rec.Rejection = llm.RejectModelNotAllowed
		ex.fail(errModelNotAllowed(ex.key.team.name, ex.rec.Model), llm.OutcomeRejected)
		return false
	}
	subjects := ex.subjects()
	if len(subjects) == 0 {
		return true
	}
	maxTok := ex.info.MaxTokens
	switch {
	case maxTok >= 0:
	case ex.metered:
		// Embeddings and the like generate nothing; an API that does is
		// charged its real output at settlement.
		maxTok = 0
	default:
		maxTok = gv.defaultMaxTokens
	}
	prompt := max(ex.promptEstimate, 0)
	estimate := llm.Usage{Input: prompt, Output: maxTok, HasInput: true, HasOutput: true}
	cost, priced := gv.prices.Cost(ex.rec.Model, estimate)
	if !priced {
		for _, s := range subjects {
			if s.Limits.CostPerDayMicros > 0 || s.Limits.CostPerMonthMicros > 0 {
				// An unpriced model costs 0 and would slip past the budget.
				ex.rec.Rejection = llm.RejectUnpricedModel
				ex.fail(errUnpricedModel(ex.who(ratelimit.State{Scope: s.Scope, ID: s.ID}), ex.rec.Model),
					llm.OutcomeRejected)
				return false
			}
		}
	}
	dec, err := gv.limiter.Admit(ex.r.Context(), ratelimit.Request{
		Subjects: subjects, Tokens: satAdd(prompt, maxTok), CostMicros: cost,
	})
	if err != nil {
		if ex.r.Context().Err() != nil {
			ex.clientGone()
			return false
		}
		ex.g.log.Error("rate limiter unavailable", "request_id", ex.rec.RequestID, "err", err)
		ex.w.Header().Set("Retry-After", "1")
		ex.rec.Rejection = llm.RejectLimiterUnavailable
		ex.fail(errLimiterUnavailable(), llm.OutcomeRejected)
		return false
	}
	ex.rlStates = dec.States
	if !dec.Allowed {
		ex.g.metrics.Rejected(dec.Refused.Scope.String(), dec.Refused.Kind.String(), ex.rec.Team)
		h := ex.w.Header()
		setRateLimitHeaders(h, ex.rec.Dialect, dec.States, ex.g.now())
		e := errRateLimited(dec, ex.who(dec.Refused), ex.g.now())
		if dec.Refused.Kind.Budget() {
			// Retrying cannot succeed before the window ends: tell the SDKs
			// not to (wire.md 1.9, 2.9) and give no Retry-After in seconds.
			h.Set("X-Should-Retry", "false")
		} else {
			setRetryAfter(h, dec.RetryAfter)
		}
		ex.rec.ErrorType = e.Kind
		ex.rec.Rejection = rejectionOf(dec.Refused.Kind)
		ex.fail(e, llm.OutcomeRejected)
		return false
	}
	ex.lease = dec.Lease
	return true
}

// meterForwarded decides how a request to another /v1/* path is governed.
// A POST whose JSON body names a top-level model (embeddings, responses,
// completions) is metered: identified, checked against the team's models,
// admitted and billed like a dialect request. A caller the gateway governs
// (mode "keys", or a key with limits) may not send what cannot be metered:
// a stream or background request, a body without a model, or, in mode
// "keys", anything but GET /v1/models and POST /v1/messages/count_tokens
// (the upstream account's files, batches and stored responses are shared by
// every gateway key). Other callers' unmeterable requests go upstream as
// they are.
func (ex *exchange) meterForwarded(body []byte) *apiError {
	r, gv := ex.r, ex.g.gov
	path := r.URL.Path
	exact := r.URL.RawPath == "" // no escaped characters in the path
	strict := gv.keysMode || len(ex.subjects()) > 0 ||
		ex.key != nil && ex.key.team != nil && len(ex.key.team.patterns) > 0
	if r.Method != http.MethodPost || exact && path == "/v1/messages/count_tokens" {
		if !gv.keysMode {
			if strict && r.Method != http.MethodGet && r.Method != http.MethodHead && r.Method != http.MethodPost {
				return errUnmetered(path, "a governed key may send only GET, HEAD and model requests")
			}
			return nil
		}
		models := (r.Method == http.MethodGet || r.Method == http.MethodHead) && exact &&
			(path == "/v1/models" || strings.HasPrefix(path, "/v1/models/"))
		count := r.Method == http.MethodPost && exact && path == "/v1/messages/count_tokens"
		if models || count {
			return nil
		}
		return errNotWithGatewayKeys(r.Method, path)
	}
	if key, field, bad := caseVariantField(body); bad {
		return errCaseVariant(key, field)
	}
	info, ok := inspectForwarded(body)
	switch {
	case !ok && strict:
		return errUnmetered(path, "its body is not a JSON object naming a \"model\"")
	case !ok:
		return nil
	case (info.Stream || info.Background) && strict:
		return errUnmetered(path, "streamed and background requests are metered only on /v1/chat/completions and /v1/messages")
	case info.Stream || info.Background:
		return nil
	}
	ex.info, ex.metered = info, true
	ex.rec.Model = info.Model
	ex.promptEstimate = int64(len(body)+3) / 4
	return nil
}

// who names the subject of a limit for an error message.
func (ex *exchange) who(st ratelimit.State) string {
	if st.Scope == ratelimit.ScopeTeam {
		return "team " + strconv.Quote(st.ID)
	}
	return "key " + strconv.Quote(st.ID)
}

// satAdd adds two non-negative int64s, saturating.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// billable returns the usage the exchange is billed for: the upstream's
// usage when it answered successfully (a cancelled stream is billed for what
// was relayed before the cut: output counted from events, input from the
// upstream's usage or else the prompt estimate), nothing otherwise. What it
// estimates it writes on the record too, flagged (InputEstimated,
// Estimated), so the token metrics, /stats and the access log count what
// the ledger does.
func (ex *exchange) billable() (llm.Usage, bool) {
	rec := &ex.rec
	if rec.Route == llm.RouteOther && !ex.metered ||
		rec.Timing.UpFirstByte.IsZero() || rec.Status < 200 || rec.Status >= 300 {
		// Not a model call, or the upstream did not answer with one: an
		// upstream error or a caller gone before the answer is not billed.
		return llm.Usage{}, false
	}
	u := &rec.Usage
	if (rec.Outcome == llm.OutcomeUpstreamError || rec.Outcome == llm.OutcomeUpstreamTimeout) &&
		rec.TokenEvents == 0 && !u.HasInput && !u.HasOutput {
		// A stream the upstream failed before any token and any usage (an
		// error event, a break, a stall), or a non-streamed answer that
		// broke or is not JSON: a 200 carrying what would otherwise be an
		// error answer, and not billed, as that is not.
		return llm.Usage{}, false
	}
	if ex.metered && !u.HasInput && !u.HasOutput {
		// A forwarded answer that reports no usage (speech, an
		// assistants run, usage beyond the capture limit) is billed its
		// estimate, never nothing.
		u.Output, rec.Estimated = max(ex.info.MaxTokens, 0), true
	}
	if !u.HasInput {
		u.Input, u.HasInput, rec.InputEstimated = max(ex.promptEstimate, 0), true, true
	}
	billed := *u
	billed.HasOutput = true
	return billed, true
}

// settle bills a finished exchange: it settles its lease with the real usage
// and adds the usage and cost to the spend ledger. It runs once, from finish.
func (ex *exchange) settle() {
	gv := ex.g.gov
	u, ok := ex.billable()
	var cost int64
	if ok {
		cost, _ = gv.prices.Cost(ex.rec.Model, u)
		ex.costMicros = cost
	}
	if ex.lease != nil {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ex.r.Context()), settleTimeout)
		err := gv.limiter.Settle(ctx, ex.lease, satAdd(u.Input, u.Output), cost)
		cancel()
		if err != nil {
			ex.g.log.Warn("settling a rate-limit lease", "request_id", ex.rec.RequestID, "key_id", ex.rec.KeyID,
				"err", err)
		}
	}
	if ok && gv.ledger != nil {
		day := ex.rec.Timing.In.UTC().Format(time.DateOnly)
		gv.ledger.Add(spend.Key{Day: day, KeyID: ex.rec.KeyID, Team: ex.rec.Team, Model: ex.rec.Model},
			spend.TotalsFor(u, cost))
	}
}

// rateHeaderNames are the rate-limit header names in canonical form, per
// dialect and unit (requests, tokens), in the order limit, remaining,
// reset; writing them straight into the map skips canonicalising them on
// every request.
var rateHeaderNames = [2][2][3]string{
	{ // OpenAI (wire.md 1.8)
		{"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests"},
		{"X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens"},
	},
	{ // Anthropic (wire.md 2.8)
		{"Anthropic-Ratelimit-Requests-Limit", "Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Ratelimit-Requests-Reset"},
		{"Anthropic-Ratelimit-Tokens-Limit", "Anthropic-Ratelimit-Tokens-Remaining", "Anthropic-Ratelimit-Tokens-Reset"},
	},
}

// setRateLimitHeaders writes the dialect's rate-limit headers for the
// tightest RPM and TPM limits among states: OpenAI's x-ratelimit-* (resets
// as durations) or Anthropic's anthropic-ratelimit-* (resets as RFC 3339
// times) (wire.md 1.8, 2.8).
func setRateLimitHeaders(h http.Header, d llm.Dialect, states []ratelimit.State, now time.Time) {
	dialect := 0
	if d == llm.DialectAnthropic {
		dialect = 1
	}
	req, tok := ratelimit.Tightest(states)
	for unit, st := range [...]*ratelimit.State{req, tok} {
		if st == nil {
			continue
		}
		names := &rateHeaderNames[dialect][unit]
		var reset string
		if dialect == 1 {
			reset = ceilSecond(now.Add(st.Reset)).Format(time.RFC3339)
		} else {
			reset = resetDuration(st.Reset)
		}
		h[names[0]] = []string{strconv.FormatInt(st.Limit, 10)}
		h[names[1]] = []string{strconv.FormatInt(max(st.Remaining, 0), 10)}
		h[names[2]] = []string{reset}
	}
}

// deleteUpstreamAccountHeaders removes the upstream's rate-limit headers
// and, when the upstream was called with the gateway's own key
// (ownAccount), the headers naming its organisation and project.
func deleteUpstreamAccountHeaders(h http.Header, ownAccount bool) {
	for k := range h {
		if strings.HasPrefix(k, "X-Ratelimit-") || strings.HasPrefix(k, "Anthropic-Ratelimit-") ||
			strings.HasPrefix(k, "Anthropic-Priority-") ||
			ownAccount && (k == "Openai-Organization" || k == "Openai-Project" || k == "Anthropic-Organization-Id") {
			delete(h, k)
		}
	}
}

// ceilSecond rounds t up to a whole second, in UTC: RFC 3339 resets have
// second precision, and a reset shown early would invite a retry too soon.
func ceilSecond(t time.Time) time.Time {
	t = t.UTC()
	if tr := t.Truncate(time.Second); !tr.Equal(t) {
		return tr.Add(time.Second)
	}
	return t
}

// resetDuration renders a reset like OpenAI does ("1s", "6m0s", "12ms").
func resetDuration(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(10 * time.Millisecond).String()
}

// setRetryAfter writes Retry-After in whole seconds (rounded up, at least 1)
// and retry-after-ms, which the official SDKs read first (wire.md 1.9).
func setRetryAfter(h http.Header, d time.Duration) {
	if d < time.Millisecond {
		d = time.Millisecond
	}
	secs := int64((d + time.Second - 1) / time.Second)
	h.Set("Retry-After", strconv.FormatInt(secs, 10))
	h.Set("Retry-After-Ms", strconv.FormatInt(int64((d+time.Millisecond-1)/time.Millisecond), 10))
}

var limitNames = [...]string{
	ratelimit.KindRPM:          "requests per minute (RPM)",
	ratelimit.KindTPM:          "tokens per minute (TPM)",
	ratelimit.KindConcurrency:  "concurrent requests",
	ratelimit.KindTokensPerDay: "tokens per day",
	ratelimit.KindCostPerDay:   "cost per day",
	ratelimit.KindCostPerMonth: "cost per month",
}

// errRateLimited phrases a refusal. A rate or concurrency limit is a
// rate_limit_exceeded the caller should retry after RetryAfter; a spent
// budget is not a rate limit and says when it renews.
func errRateLimited(dec ratelimit.Decision, who string, now time.Time) *apiError {
	st := dec.Refused
	name := "limit"
	if int(st.Kind) < len(limitNames) {
		name = limitNames[st.Kind]
	}
	if st.Kind.Budget() {
		var used, limit string
		if st.Kind == ratelimit.KindTokensPerDay {
			used, limit = strconv.FormatInt(st.Used, 10), strconv.FormatInt(st.Limit, 10)
		} else {
			used, limit = usd(st.Used), usd(st.Limit)
		}
		window := "day"
		if st.Kind == ratelimit.KindCostPerMonth {
			window = "month"
		}
		// Windows end on whole seconds (UTC midnights); rounding hides the
		// microseconds between the limiter's clock and this one.
		renews := now.Add(dec.RetryAfter).UTC().Round(time.Second).Format(time.RFC3339)
		return &apiError{Status: http.StatusTooManyRequests, Kind: "insufficient_quota", Code: "insufficient_quota",
			AnthropicKind: "rate_limit_error",
			Msg: "Budget spent for " + who + " on " + name + ": Limit " + limit + ", Used " + used +
				". This is a budget, not a rate limit: retrying will not succeed before it renews with the next UTC " +
				window + " at " + renews + "."}
	}
	kind := "requests"
	if st.Kind == ratelimit.KindTPM {
		kind = "tokens"
	}
	msg := "Rate limit reached for " + who + " on " + name + ": Limit " + strconv.FormatInt(st.Limit, 10) +
		", Used " + strconv.FormatInt(st.Used, 10) + ". Please try again in " + dec.RetryAfter.Round(time.Millisecond).String() + "."
	return &apiError{Status: http.StatusTooManyRequests, Kind: kind, Code: "rate_limit_exceeded",
		AnthropicKind: "rate_limit_error", Msg: msg}
}

// usd renders micro-dollars as dollars with cents ("$12.50"), or with
// micro-dollar precision when cents would hide it.
func usd(micros int64) string {
	s := strconv.FormatFloat(float64(micros)/1e6, 'f', 6, 64)
	s = strings.TrimRight(s, "0")
	if i := strings.IndexByte(s, '.'); i >= 0 && len(s)-i-1 < 2 {
		s += strings.Repeat("0", 2-(len(s)-i-1))
	}
	return "$" + s
}

func errModelNotAllowed(team, model string) *apiError {
	return &apiError{Status: http.StatusForbidden, Kind: "invalid_request_error", Code: "model_not_allowed",
		AnthropicKind: "permission_error", Param: "model",
		Msg: "team " + strconv.Quote(team) + " may not use model " + strconv.Quote(model)}
}

func errUnmetered(path, why string) *apiError {
	return &apiError{Status: http.StatusBadRequest, Kind: "invalid_request_error", Code: "unmetered_request",
		AnthropicKind: "invalid_request_error",
		Msg:           "this gateway meters every request of a governed key, and cannot meter this one on " + path + ": " + why}
}

func errNotWithGatewayKeys(method, path string) *apiError {
	return &apiError{Status: http.StatusForbidden, Kind: "invalid_request_error", Code: "not_available",
		AnthropicKind: "permission_error",
		Msg: method + " " + path + " is not available with this gateway's keys: it would reach resources shared by " +
			"every key of the upstream account (only model requests, GET /v1/models and count_tokens are)"}
}

func errCaseVariant(key, field string) *apiError {
	return &apiError{Status: http.StatusBadRequest, Kind: "invalid_request_error", Code: "ambiguous_field",
		AnthropicKind: "invalid_request_error", Param: field,
		Msg: "field " + strconv.Quote(key) + " differs from " + strconv.Quote(field) +
			" only in case; the gateway cannot tell which one the upstream reads"}
}

func errUnpricedModel(who, model string) *apiError {
	return &apiError{Status: http.StatusForbidden, Kind: "invalid_request_error", Code: "model_not_priced",
		AnthropicKind: "permission_error", Param: "model",
		Msg: who + " has a cost budget, and model " + strconv.Quote(model) +
			" has no price in this gateway's [[models]]; its cost could not be counted"}
}

func errLimiterUnavailable() *apiError {
	return &apiError{Status: http.StatusServiceUnavailable, Kind: "server_error", Code: "rate_limiter_unavailable",
		AnthropicKind: "api_error",
		Msg:           "the gateway cannot check rate limits right now (on_redis_error = \"deny\"); retry shortly"}
}

// rejectionOf names the limit kind k as a record's rejection.
func rejectionOf(k ratelimit.Kind) llm.Rejection {
	switch k {
	case ratelimit.KindRPM:
		return llm.RejectRPM
	case ratelimit.KindTPM:
		return llm.RejectTPM
	case ratelimit.KindConcurrency:
		return llm.RejectConcurrency
	case ratelimit.KindTokensPerDay:
		return llm.RejectTokensPerDay
	case ratelimit.KindCostPerDay:
		return llm.RejectCostPerDay
	case ratelimit.KindCostPerMonth:
		return llm.RejectCostPerMonth
	}
	return llm.RejectOther
}
