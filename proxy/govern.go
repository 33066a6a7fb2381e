package proxy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"path"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/ratelimit"
	"github.com/tollgate-llm/tollgate/spend"
)

// governance is the gateway's view of [[keys]], [[teams]] and [[models]]:
// who a caller is, what it may use, and what it may spend.
type governance struct {
	keysMode bool
	// requireKey: a caller without a key is refused (mode "keys", or
	// [auth] require_key).
	requireKey       bool
	keys             map[[sha256.Size]byte]*keyEntry
	teams            map[string]*teamEntry
	limiter          ratelimit.Limiter // nil: no limits configured
	ledger           spend.Ledger      // nil: no spend ledger
	prices           *spend.Prices
	defaultMaxTokens int64
	// runtime are the runtime keys (runtimekeys.go) as this
	// configuration sees them; nil without any. now is the Gateway's
	// clock, for their expiry.
	runtime atomic.Pointer[runtimeIndex]
	now     func() time.Time
}

// keyEntry is one [[keys]] table.
type keyEntry struct {
	name string
	team *teamEntry // nil when the key has no team
	// owner names the principal whose stored responses and conversations
	// the key may use: "team:<name>", or "key:<name>" without a team.
	owner   string
	subject ratelimit.Subject
	limited bool
	// counts is the key's bucket for token counts (count_tokens_rpm);
	// counted says it has one.
	counts  ratelimit.Subject
	counted bool
	// expires is when a runtime key stops working; zero for none (and
	// for every [[keys]] table).
	expires time.Time
}

// teamEntry is one [[teams]] table.
type teamEntry struct {
	name     string
	patterns []string // empty: any model
	subject  ratelimit.Subject
	limited  bool
	counts   ratelimit.Subject // see keyEntry
	counted  bool
	// maxConvMicros is max_cost_per_conversation_usd, 0 for none.
	maxConvMicros int64
	// classes are the buckets of class_rpm, by request class.
	classes map[string]ratelimit.Subject
}

// newGovernance indexes the configuration. The config is validated, so every
// team a key names exists and every sha256 is 64 hex digits.
func newGovernance(cfg *config.Config, limiter ratelimit.Limiter, ledger spend.Ledger) (*governance, error) {
	gv := &governance{
		keysMode:         cfg.Auth.Mode == "keys",
		requireKey:       cfg.Auth.Mode == "keys" || cfg.Auth.RequireKey,
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
		gv.teams[t.Name].counts, gv.teams[t.Name].counted = countsSubject(ratelimit.ScopeTeam, t.Name, t.CountTokensRPM)
		for class, rpm := range t.ClassRPM {
			if gv.teams[t.Name].classes == nil {
				gv.teams[t.Name].classes = make(map[string]ratelimit.Subject, len(t.ClassRPM))
			}
			// Like count_tokens', its id is no team's name.
			gv.teams[t.Name].classes[class] = ratelimit.Subject{Scope: ratelimit.ScopeTeam, ID: t.Name + "/class:" + class,
				Limits: ratelimit.Limits{RPM: rpm}}
		}
		if p := t.MaxCostPerConversationUSD; p != nil {
			gv.teams[t.Name].maxConvMicros = config.USDToMicros(*p)
		}
	}
	for i := range cfg.Keys {
		k := &cfg.Keys[i]
		sum, ok := decodeSum(k.SHA256)
		if !ok {
			return nil, fmt.Errorf("proxy: keys[%d].sha256 is not a SHA-256 in hex", i)
		}
		e, err := gv.newKeyEntry(k)
		if err != nil {
			return nil, fmt.Errorf("proxy: keys[%d]: %w", i, err)
		}
		gv.keys[sum] = e
	}
	return gv, nil
}

// decodeSum reads a SHA-256 in hex.
func decodeSum(h string) (sum [sha256.Size]byte, ok bool) {
	n, err := hex.Decode(sum[:], []byte(h))
	return sum, err == nil && n == sha256.Size
}

// newKeyEntry is the entry of a [[keys]] table or a runtime key: its name,
// team, limits and their subjects, by name, so that a key's limits and
// spend are the same whichever way it was issued.
func (gv *governance) newKeyEntry(k *config.Key) (*keyEntry, error) {
	lim := ratelimit.LimitsFrom(k.Limits)
	e := &keyEntry{
		name:    k.Name,
		subject: ratelimit.Subject{Scope: ratelimit.ScopeKey, ID: k.Name, Limits: lim},
		limited: lim != (ratelimit.Limits{}),
	}
	e.counts, e.counted = countsSubject(ratelimit.ScopeKey, k.Name, k.CountTokensRPM)
	e.owner = ownerName(k.Name, k.Team)
	if k.Team != "" {
		e.team = gv.teams[k.Team]
		if e.team == nil {
			return nil, fmt.Errorf("team %q is not a [[teams]] name", k.Team)
		}
	}
	return e, nil
}

// countsSubject is the bucket of a key's or team's token counts (POST
// /v1/messages/count_tokens), rpm a minute; ok is false without one. Its
// id, "<name>/count_tokens", is no key's or team's name (names have no
// slash), so the bucket is its own.
func countsSubject(scope ratelimit.Scope, name string, rpm *int64) (ratelimit.Subject, bool) {
	if rpm == nil {
		return ratelimit.Subject{}, false
	}
	return ratelimit.Subject{Scope: scope, ID: name + "/count_tokens", Limits: ratelimit.Limits{RPM: *rpm}}, true
}

// ownerName names the principal a key's stored responses and
// conversations belong to: "team:<team>", or "key:<key>" without a team.
func ownerName(key, team string) string {
	if team != "" {
		return "team:" + team
	}
	return "key:" + key
}

// hasLimits reports whether any key or team has a limit, i.e. whether the
// gateway needs a limiter at all.
func (gv *governance) hasLimits() bool {
	for _, k := range gv.keys {
		if k.limited || k.counted {
			return true
		}
	}
	for _, t := range gv.teams {
		if t.limited || t.counted || len(t.classes) > 0 {
			return true
		}
	}
	return false
}

// lookup finds the entry of a caller's key: its [[keys]] table, else the
// runtime key it is while that has not expired (a revoked one is not in the
// index); nil when it is neither (for no key too). This is the one place a
// key is found: every path that identifies a caller asks it.
func (gv *governance) lookup(c credential) *keyEntry {
	if !c.present {
		return nil
	}
	if k := gv.keys[c.sum]; k != nil {
		return k
	}
	idx := gv.runtime.Load()
	if idx == nil {
		return nil
	}
	k := idx.keys[c.sum]
	if k != nil && !k.expires.IsZero() && !gv.now().Before(k.expires) {
		return nil
	}
	return k
}

// pick chooses, among the keys a caller presented, the one that identifies
// it, with its [[keys]] entry (nil when it is not listed). Claude Code sends
// ANTHROPIC_API_KEY as x-api-key and ANTHROPIC_AUTH_TOKEN as Authorization,
// and an Anthropic SDK given a default x-api-key header sends Authorization
// too, so a gateway key in one header often travels with a leftover token in
// the other; taking Authorization's whatever it held refused every such
// request. So (docs/keys.md, "One key from two headers"):
//   - the same key in both headers (apiKeyHelper sends it so) is that key;
//   - a gateway key (listed in [[keys]]) wins over one that is not;
//   - two different gateway keys are refused (401 naming both ids): either
//     could be meant, and their teams and limits differ;
//   - with neither listed, Authorization's wins, as it always has.
//
// A malformed Authorization header is ignored when x-api-key holds a
// gateway key, which it is not needed beside; otherwise it is refused as
// before, since the caller meant something by it. The key is zero when
// none was presented.
func (gv *governance) pick(p presented) (credential, *keyEntry, *apiError) {
	b, x := p.bearer, p.apiKey
	if p.malformed {
		if k := gv.lookup(x); k != nil {
			return x, k, nil
		}
		return credential{}, nil, errMalformedAuth()
	}
	if !b.present || !x.present || b.sum == x.sum {
		if !b.present {
			b = x
		}
		return b, gv.lookup(b), nil
	}
	kb, kx := gv.lookup(b), gv.lookup(x)
	switch {
	case kb != nil && kx != nil:
		return b, nil, errConflictingKeys(b.id(), x.id())
	case kx != nil:
		return x, kx, nil
	}
	return b, kb, nil
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

// identify finds who the caller is from the keys it presented (pick) and
// says whether it may go on: a key is required in mode "keys" or with
// require_key, and in mode "keys" it must be configured.
func (gv *governance) identify(p presented) (credential, *keyEntry, *apiError) {
	c, k, aerr := gv.pick(p)
	switch {
	case aerr != nil:
	case !c.present && gv.requireKey:
		aerr = errMissingKey()
	case k == nil && gv.keysMode:
		// The message names the key only by the hash prefix the operators
		// can find in the access log.
		aerr = gv.refuseKey(c)
	}
	return c, k, aerr
}

// subjects returns the limited subjects of the caller: its key and its team.
func (ex *exchange) subjects() []ratelimit.Subject {
	k := ex.key
	if k == nil || ex.gen.gov.limiter == nil {
		return nil
	}
	var out []ratelimit.Subject
	if ex.kind == kindCountTokens { // its own buckets only
		if k.counted {
			out = append(out, k.counts)
		}
		if k.team != nil && k.team.counted {
			out = append(out, k.team.counts)
		}
		return out
	}
	if k.limited {
		out = append(out, k.subject)
	}
	if k.team != nil && k.team.limited {
		out = append(out, k.team.subject)
	}
	if k.team != nil && len(k.team.classes) > 0 {
		// The class is the agent's word: a cap on what it names, never
		// a way around the team's own limits.
		if s, ok := k.team.classes[ex.info.agent.hints.Class]; ok {
			out = append(out, s)
		}
	}
	return out
}

// admit checks the caller's team may use the model and its limits admit the
// request: the model, the cost estimate, the conversation's budget, then
// the limiter, which leases what the request reserves.
func (ex *exchange) admit() refusal {
	if k := ex.key; k != nil && k.team != nil && ex.kind != kindCountTokens && !k.team.modelAllowed(ex.rec.Model) {
		return rejected(errModelNotAllowed(k.team.name, ex.rec.Model), llm.RejectModelNotAllowed)
	}
	subjects := ex.subjects()
	convBudget := (ex.conv.key != "" || ex.conv.fromResponse) && ex.key != nil && ex.key.team != nil &&
		ex.key.team.maxConvMicros > 0
	if len(subjects) == 0 && !convBudget {
		return refusal{}
	}
	prompt, maxTok := ex.reservation()
	cost, rf := ex.estimateCost(subjects, convBudget, llm.Usage{Input: prompt, Output: maxTok, HasInput: true, HasOutput: true})
	if !rf.ok() {
		return rf
	}
	if convBudget {
		if rf := ex.checkConversationBudget(cost); !rf.ok() {
			return rf
		}
	}
	if len(subjects) == 0 {
		return refusal{}
	}
	return ex.takeLease(subjects, satAdd(prompt, maxTok), cost)
}

// reservation is what admission reserves for a request: its prompt
// estimate and the output it may generate (max_tokens, else the default;
// nothing for a metered forward: embeddings and the like generate nothing,
// and an API that does is charged its real output at settlement).
func (ex *exchange) reservation() (prompt, maxTok int64) {
	maxTok = ex.info.MaxTokens
	switch {
	case maxTok >= 0:
	case ex.kind == kindMetered:
		maxTok = 0
	default:
		maxTok = ex.gen.gov.defaultMaxTokens
	}
	return max(ex.promptEstimate, 0), maxTok
}

// estimateCost prices the reservation; an unpriced model is refused where a
// cost budget (a subject's, or the conversation's) applies, since it would
// cost 0 and slip past the budget.
func (ex *exchange) estimateCost(subjects []ratelimit.Subject, convBudget bool, estimate llm.Usage) (int64, refusal) {
	cost, priced := ex.gen.gov.prices.Cost(ex.rec.Model, estimate)
	if priced {
		return cost, refusal{}
	}
	for _, s := range subjects {
		if s.Limits.CostPerDayMicros > 0 || s.Limits.CostPerMonthMicros > 0 {
			return 0, rejected(errUnpricedModel(ex.who(ratelimit.State{Scope: s.Scope, ID: s.ID}), ex.rec.Model),
				llm.RejectUnpricedModel)
		}
	}
	if convBudget {
		return 0, rejected(errUnpricedModel("team "+strconv.Quote(ex.key.team.name)+"'s conversations", ex.rec.Model),
			llm.RejectUnpricedModel)
	}
	return cost, refusal{}
}

// takeLease asks the limiter to admit the request's subjects for tokens and
// cost, and keeps the lease and the limits' states (for the rate-limit
// headers). A refusal carries the dialect's rate-limit headers and says
// whether retrying can help.
func (ex *exchange) takeLease(subjects []ratelimit.Subject, tokens, cost int64) refusal {
	gv := ex.gen.gov
	dec, err := gv.limiter.Admit(ex.r.Context(), ratelimit.Request{Subjects: subjects, Tokens: tokens, CostMicros: cost})
	if err != nil {
		if ex.r.Context().Err() != nil {
			return callerGone
		}
		ex.g.log.Error("rate limiter unavailable", "request_id", ex.rec.RequestID, "err", err)
		ex.w.Header().Set("Retry-After", "1")
		return rejected(errLimiterUnavailable(), llm.RejectLimiterUnavailable)
	}
	ex.rlStates = dec.States
	if !dec.Allowed {
		ex.g.metrics.Rejected(dec.Refused.Scope.String(), dec.Refused.Kind.String(), ex.rec.Team)
		h := ex.w.Header()
		setRateLimitHeaders(h, ex.rec.Dialect, dec.States, ex.g.now())
		if dec.Refused.Spent() {
			// Retrying cannot succeed before the window ends: tell the SDKs
			// not to (both SDKs honour x-should-retry) and give no Retry-After in seconds.
			h.Set("X-Should-Retry", "false")
		} else {
			// A rate, a concurrency cap, or a budget that requests in
			// flight hold: the SDKs retry it after this wait.
			setRetryAfter(h, dec.RetryAfter)
		}
		return limited(errRateLimited(dec, ex.who(dec.Refused), ex.g.now()), rejectionOf(dec.Refused.Kind))
	}
	ex.lease = dec.Lease
	return refusal{}
}

// governed reports whether the gateway governs the caller: mode "keys", or
// a key with limits, or a team held to some models. A governed caller may
// send only what the gateway can meter.
func (ex *exchange) governed() bool {
	return ex.gen.gov.keysMode || len(ex.subjects()) > 0 ||
		ex.key != nil && ex.key.team != nil && len(ex.key.team.patterns) > 0
}

// meterBackground refuses a governed caller's background request on the
// Responses API: its usage arrives later, on requests the gateway does not
// see, so it could be neither reserved nor billed.
func (ex *exchange) meterBackground() *apiError {
	if !ex.info.Background || !ex.governed() {
		return nil
	}
	return errUnmetered(ex.r.URL.Path, "a background response reports its usage later, elsewhere; "+
		"send it without \"background\": true")
}

// meterForwarded decides how a request to another /v1/* path is governed.
// A POST whose JSON body names a top-level model (embeddings, responses,
// completions) is metered: identified, checked against the team's models,
// admitted and billed like a dialect request. A caller the gateway governs
// (mode "keys", or a key with limits) may not send what cannot be metered:
// a stream or background request, a body without a model, or, in mode
// "keys", anything but GET /v1/models and the caller's own stored
// responses and conversations (the upstream account's files, batches and
// the rest are shared by every gateway key; a token count is not a
// forward, see isTokenCount).
// Other callers' unmeterable requests go upstream as they are. metered
// says the request is metered, and info is what its body asks for.
//
// body is the request's body decoded from its Content-Encoding, unless
// undecodable says why it could not be: a governed caller then gets that
// error, and another caller's body goes upstream unread, as sent.
func (ex *exchange) meterForwarded(body []byte, undecodable *apiError) (requestInfo, bool, *apiError) {
	r, gv := ex.r, ex.gen.gov
	path := r.URL.Path
	exact := r.URL.RawPath == "" // no escaped characters in the path
	strict := ex.governed()
	if gv.keysMode && ex.stored.kind != storedNone {
		// A stored response or conversation of the caller's own team
		// (checkStored): reading, cancelling, deleting or adding items
		// costs no tokens.
		return requestInfo{}, false, nil
	}
	if r.Method != http.MethodPost {
		if !gv.keysMode {
			if strict && !safeMethod(r.Method) && r.Method != http.MethodPost {
				return requestInfo{}, false, errUnmetered(path, "a governed key may send only GET, HEAD and model requests")
			}
			return requestInfo{}, false, nil
		}
		if safeMethod(r.Method) && exact && (path == "/v1/models" || strings.HasPrefix(path, "/v1/models/")) {
			return requestInfo{}, false, nil
		}
		return requestInfo{}, false, errNotWithGatewayKeys(r.Method, path)
	}
	if undecodable != nil {
		if strict {
			return requestInfo{}, false, undecodable
		}
		return requestInfo{}, false, nil
	}
	if key, field, bad := caseVariantField(body); bad {
		return requestInfo{}, false, errCaseVariant(key, field)
	}
	info, ok := inspectForwarded(body)
	switch {
	case !ok && strict:
		return requestInfo{}, false, errUnmetered(path, "its body is not a JSON object naming a \"model\"")
	case !ok:
		return requestInfo{}, false, nil
	case (info.Stream || info.Background) && strict:
		return requestInfo{}, false, errUnmetered(path, "streamed requests are metered only on /v1/chat/completions, /v1/messages and /v1/responses, and background requests nowhere")
	case info.Stream || info.Background:
		return requestInfo{}, false, nil
	}
	// previous_response_id and conversation are checked whatever the path:
	// an upstream may serve the Responses API under another spelling of it.
	return info, true, nil
}

// who names the subject of a limit for an error message.
func (ex *exchange) who(st ratelimit.State) string {
	if st.Scope == ratelimit.ScopeTeam {
		return "team " + strconv.Quote(st.ID)
	}
	return "key " + strconv.Quote(st.ID)
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
