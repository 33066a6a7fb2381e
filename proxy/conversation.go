package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/conversation"
	"github.com/tollgate-llm/tollgate/llm"
)

// conversationTimeout bounds one call to the conversation store on the
// request path (Resolve, Cost, Link).
const conversationTimeout = time.Second

// convTurn is the conversation an exchange is a turn of.
type convTurn struct {
	// key is the conversation's store key (conversation.Key); "" while
	// unknown: a Responses request that names no conversation and continues
	// none takes its new response's id (linkResponse).
	key string
	// source is the identity entry that named it ([conversations]
	// identity); "responses" for the Responses API's own chaining.
	source string
	// fromResponse: the conversation is named by the Responses API (its
	// own id or chain), so a turn without a key yet gets one from its
	// response.
	fromResponse bool
	// held is the estimate this turn holds against its conversation's
	// budget until it finishes (convHolds).
	held int64
}

// convHolds are the estimates of the turns in flight, per conversation,
// that a budget per conversation is checked against besides what the
// conversation has cost: turns of one conversation sent at once cannot
// all pass on the same spend. They are this process's: another replica's
// turns in flight are not seen.
type convHolds struct {
	mu sync.Mutex
	m  map[string]int64
}

// hold adds cost to key's holds if spent, the holds and cost fit in
// limit, and returns whether it did and the holds before it.
func (h *convHolds) hold(key string, spent, cost, limit int64) (ok bool, held int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	held = h.m[key]
	if satAdd(satAdd(spent, held), cost) > limit {
		return false, held
	}
	if h.m == nil {
		h.m = make(map[string]int64)
	}
	h.m[key] = held + cost
	return true, held
}

// release takes back a hold of cost on key.
func (h *convHolds) release(key string, cost int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if left := h.m[key] - cost; left > 0 {
		h.m[key] = left
	} else {
		delete(h.m, key)
	}
}

// identitySource is one entry of [conversations] identity: a header (its
// canonical name), or one of the other sources.
type identitySource struct {
	// name is the entry as configured, which the record names as its
	// source; header the canonical header name to read ("" for the other
	// sources).
	name, header string
}

// identitySources resolves [conversations] identity once: "header" to the
// application's header, each header name to its canonical form.
func identitySources(cc *config.Conversations) []identitySource {
	out := make([]identitySource, 0, len(cc.Identity))
	for _, e := range cc.Identity {
		switch e {
		case config.IdentityBaggage, config.IdentityClientMetadata, config.IdentityResponses:
			out = append(out, identitySource{name: e})
		case config.IdentityHeader:
			out = append(out, identitySource{name: strings.ToLower(cc.Header), header: http.CanonicalHeaderKey(cc.Header)})
		default:
			out = append(out, identitySource{name: strings.ToLower(e), header: http.CanonicalHeaderKey(e)})
		}
	}
	return out
}

// identifyConversation names the conversation a governed model request is
// a turn of, when [conversations] is on, from the first source of
// [conversations] identity that names one: a header (a coding agent's
// session, the application's), the W3C baggage entry session.id, the
// body's client_metadata.session_id, or on the Responses API ("responses")
// its "conversation", else the chain of previous_response_id (the
// conversation its previous response belongs to, else that response's own
// id: the first of the chain); a Responses request that names none starts
// a conversation named by its own new response. The id is the caller's:
// the key is scoped to the caller's team (conversation.Key).
func (ex *exchange) identifyConversation() refusal {
	g := ex.g
	if g.conv == nil {
		return refusal{}
	}
	owner := ex.owner()
	responses := ex.rec.Route == llm.RouteResponses
	for _, src := range g.identity {
		var id string
		switch {
		case src.header != "":
			if v := ex.r.Header[src.header]; len(v) > 0 {
				id = v[0]
			}
		case src.name == config.IdentityBaggage:
			id = baggageSessionID(ex.r.Header.Values("Baggage"))
		case src.name == config.IdentityClientMetadata:
			id = ex.info.agent.metaSession
		case src.name == config.IdentityResponses && responses:
			ex.conv.fromResponse = true
			if ex.conv.key == "" {
				ex.conv.source = src.name
				ex.chainConversation(owner)
			}
			return refusal{}
		}
		if id == "" || ex.conv.key != "" {
			continue // a later "responses" still links the new response
		}
		if !conversation.ValidID(id) {
			what := src.name
			if src.header != "" {
				what = "the " + src.header + " header"
			}
			return badRequest(errBadRequest("the conversation id in "+what+" must be 1 to "+
				strconv.Itoa(conversation.MaxIDLen)+" bytes without control characters", ""))
		}
		ex.conv.key, ex.conv.source = conversation.Key(owner, id), src.name
		if !responses {
			return refusal{}
		}
	}
	return refusal{}
}

// chainConversation names a Responses request's conversation by the API's
// own state: its "conversation", else the conversation its
// previous_response_id belongs to (else that response's own id: the first
// of the chain); none for a request that continues nothing, which its own
// new response names (takeLink).
func (ex *exchange) chainConversation(owner string) {
	g := ex.g
	switch {
	case ex.info.Conversation != "":
		ex.conv.key = conversation.Key(owner, ex.info.Conversation)
	case ex.info.PreviousResponseID != "":
		g.claims.wait(ex.r.Context(), ex.info.PreviousResponseID, claimLookupWait) // its link may be in flight
		ctx, cancel := context.WithTimeout(ex.r.Context(), conversationTimeout)
		key, err := g.conv.Resolve(ctx, linkName(owner, ex.info.PreviousResponseID))
		cancel()
		if err != nil {
			g.log.Warn("conversation store unavailable: the turn starts its chain's conversation afresh",
				"request_id", ex.rec.RequestID, "err", err)
		}
		if key == "" {
			key = conversation.Key(owner, ex.info.PreviousResponseID)
		}
		ex.conv.key = key
	}
}

// linkName names a response in the store's links: scoped to its owner, as
// conversations are, so another team naming the response (where an
// upstream account is shared without mode "keys") never continues this
// team's conversation.
func linkName(owner, responseID string) string { return owner + "\x00" + responseID }

// baggageSessionID returns the session.id entry of W3C baggage headers,
// percent-decoded; "" when there is none.
func baggageSessionID(values []string) string {
	for _, v := range values {
		for member := range strings.SplitSeq(v, ",") {
			kv, _, _ := strings.Cut(member, ";") // properties follow a ';'
			k, val, ok := strings.Cut(kv, "=")
			if !ok || strings.TrimSpace(k) != "session.id" {
				continue
			}
			if dec, err := url.PathUnescape(strings.TrimSpace(val)); err == nil {
				return dec
			}
		}
	}
	return ""
}

// checkConversationBudget refuses a turn whose estimated cost would take
// its conversation past its team's max_cost_per_conversation_usd: what the
// conversation has cost, the estimates of its turns in flight here and
// this turn's (cost, as the other budgets reserve it). An admitted turn
// holds its estimate until it finishes. A Responses turn that starts its
// conversation (named by its own response) is checked against the budget
// alone. A store that cannot be asked admits the turn, unless
// [ratelimit] on_redis_error is "deny".
func (ex *exchange) checkConversationBudget(cost int64) refusal {
	k := ex.key
	if k == nil || k.team == nil || k.team.maxConvMicros <= 0 {
		return refusal{}
	}
	if ex.conv.key == "" {
		if cost <= k.team.maxConvMicros {
			return refusal{}
		}
		return ex.refuseConversationTurn(0, cost)
	}
	ctx, cancel := context.WithTimeout(ex.r.Context(), conversationTimeout)
	spent, err := ex.g.conv.Cost(ctx, ex.conv.key)
	cancel()
	if err != nil {
		if ex.gen.cfg.RateLimit.OnRedisError != "deny" {
			ex.g.log.Warn("conversation store unavailable: the conversation's budget is not checked",
				"request_id", ex.rec.RequestID, "err", err)
			return refusal{}
		}
		ex.g.log.Error("conversation store unavailable", "request_id", ex.rec.RequestID, "err", err)
		ex.w.Header().Set("Retry-After", "1")
		return rejected(errLimiterUnavailable(), llm.RejectLimiterUnavailable)
	}
	ok, held := ex.g.convHolds.hold(ex.conv.key, spent, cost, k.team.maxConvMicros)
	if ok {
		ex.conv.held = cost
		return refusal{}
	}
	return ex.refuseConversationTurn(satAdd(spent, held), cost)
}

// refuseConversationTurn answers a turn past its conversation's budget:
// used is what the conversation has cost and holds, cost the turn's
// estimate.
func (ex *exchange) refuseConversationTurn(used, cost int64) refusal {
	k := ex.key
	ex.g.metrics.Rejected("conversation", "cost_per_conversation", ex.rec.Team)
	ex.w.Header().Set("X-Should-Retry", "false")
	return limited(errConversationBudget(k.team.name, k.team.maxConvMicros, used, cost), llm.RejectCostPerConversation)
}

// linksResponse reports whether this attempt's answer names a new stored
// response that must be linked to the exchange's conversation.
func (ex *exchange) linksResponse() bool {
	return ex.g.conv != nil && ex.conv.fromResponse && !ex.info.NoStore && ex.kind.caller()
}

// takeLink returns the conversation key the new stored response id must
// be linked to ("" when it is not linked), and clears the attempt's pending
// link. A first turn's conversation is named by its own response.
func (ex *exchange) takeLink(at *attemptState, id string) (key string) {
	link := at.link && id != ""
	at.link = false
	switch {
	case !link:
		return ""
	case ex.conv.key != "":
		return ex.conv.key
	}
	return conversation.Key(ex.owner(), id)
}

// linkResponse links a new stored response to the conversation key before
// its id reaches the caller. A link that fails is logged: the chain's next
// turn then starts a conversation of its own.
func (ex *exchange) linkResponse(id, key string) {
	// The caller may be gone; the response exists upstream all the same.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ex.r.Context()), conversationTimeout)
	defer cancel()
	if err := ex.g.conv.Link(ctx, linkName(ex.owner(), id), key); err != nil {
		ex.g.log.Warn("linking a response to its conversation failed: a turn continuing it starts another",
			"request_id", ex.rec.RequestID, "err", err)
	}
}

// recordTurn folds a finished exchange into its conversation: every
// request that was admitted and sent upstream is a turn (a refused one is
// not), with what its finished record (rec) says it used, cost and waited.
func (ex *exchange) recordTurn(rec *llm.Record) {
	if ex.conv.held > 0 {
		// After the Record below has its cost in the store.
		defer ex.g.convHolds.release(ex.conv.key, ex.conv.held)
	}
	if ex.g.conv == nil || ex.conv.key == "" || rec.AttemptCount == 0 {
		return
	}
	ex.g.conv.Record(conversation.Turn{
		Key:  ex.conv.key,
		Team: rec.Team,
		At:   rec.Timing.End,
		Tokens: conversation.Tokens{Input: rec.Usage.Input, Output: rec.Usage.Output,
			CacheRead: rec.Usage.CacheRead, CacheWrite: rec.Usage.CacheWrite, Reasoning: rec.Usage.Reasoning},
		CostMicros:   rec.CostMicros,
		TTFT:         rec.TTFT(),
		Error:        rec.Outcome != llm.OutcomeOK,
		Start:        rec.Timing.In,
		E2E:          rec.E2E(),
		KeyID:        rec.KeyID,
		User:         ex.info.agent.endUser,
		Hints:        ex.info.agent.hints,
		AgentSession: slices.Contains(config.AgentSessionHeaders, ex.conv.source),
	})
}

func errConversationBudget(team string, limit, spent, cost int64) *apiError {
	return &apiError{Status: http.StatusTooManyRequests, Kind: "insufficient_quota", Code: "insufficient_quota",
		AnthropicKind: "rate_limit_error",
		Msg: "Conversation budget spent for team " + strconv.Quote(team) + ": Limit " + usd(limit) +
			" per conversation, Used " + usd(spent) + " by this conversation (its turns in flight included), this turn may cost up to " + usd(cost) +
			". This is the conversation's budget, not a rate limit: retrying will not succeed; start a new conversation."}
}

// maxOutcomeBody caps the body of POST /tollgate/conversations/{id}/outcome.
const maxOutcomeBody = 64 << 10

// outcomeRequest is the body of POST /tollgate/conversations/{id}/outcome.
type outcomeRequest struct {
	Completed *bool    `json:"completed"`
	Score     *float64 `json:"score"`
	Feedback  *string  `json:"feedback"`
}

// ConversationReport is one conversation's figures, as GET
// /admin/conversations/{id} and the outcome API answer them.
type ConversationReport struct {
	// ID is the id the request named; Key is the conversation's key,
	// which the gateway's logs and files know it by.
	ID              string              `json:"id"`
	Key             string              `json:"key"`
	Team            string              `json:"team"`
	Turns           int64               `json:"turns"`
	Errors          int64               `json:"errors"`
	Tokens          conversation.Tokens `json:"tokens"`
	CostUSD         float64             `json:"cost_usd"`
	CostMicros      int64               `json:"cost_micros"`
	FirstSeen       time.Time           `json:"first_seen"`
	LastSeen        time.Time           `json:"last_seen"`
	DurationSeconds float64             `json:"duration_seconds"`
	// TTFTMs is the TTFT of each of its first turns, in milliseconds;
	// null for a turn without one (an error, a non-streamed answer).
	TTFTMs  []*float64            `json:"ttft_ms"`
	Outcome *conversation.Outcome `json:"outcome"`
	// KeyID is the key of its first turn ([[keys]] name or key id), User
	// the end user its turns named (hashed); "" when none.
	KeyID string `json:"key_id,omitempty"`
	User  string `json:"user,omitempty"`
	// Session is what a coding agent's turns said of themselves.
	Session SessionReport `json:"session"`
}

// SessionReport is a conversation's breakdown as the admin API shows it:
// its calls by request class, its agents as a tree (each names its
// parent), the tools its agents ran, its compactions, its user turns, and
// where its time went.
type SessionReport struct {
	Classes     map[string]conversation.Calls       `json:"classes"`
	Agents      []AgentReport                       `json:"agents"`
	Tools       map[string]conversation.Tool        `json:"tools"`
	Compactions map[string]conversation.Compactions `json:"compactions"`
	// UserTurns counts the distinct user prompts its calls served (Claude
	// Code's prompt id, Codex's turn id); capped says it stopped counting
	// at conversation.MaxPrompts.
	UserTurns       int64 `json:"user_turns"`
	UserTurnsCapped bool  `json:"user_turns_capped,omitempty"`
	// SubagentCostShare is the share of its cost its subagents' calls
	// took (0 without any).
	SubagentCostShare float64     `json:"subagent_cost_share"`
	Time              SessionTime `json:"time"`
}

// AgentReport is one agent of a session: its id and its parent's (hashes
// of the agent's own ids; no parent for one the main loop spawned).
type AgentReport struct {
	ID string `json:"id"`
	conversation.Agent
}

// SessionTime is where a session's time went: its wall time from its first
// call's arrival to its last call's end, the model's (the calls' summed
// E2E, and of it their TTFTs), the tools' (the durations the agents
// reported), and the rest (the user, the client), which is the wall time
// less the other two, at least 0: parallel calls and tools (subagents,
// parallel tool calls) overlap, so the parts may add up to more than the
// wall time.
type SessionTime struct {
	WallSeconds  float64 `json:"wall_seconds"`
	ModelSeconds float64 `json:"model_seconds"`
	TTFTSeconds  float64 `json:"ttft_seconds"`
	ToolSeconds  float64 `json:"tool_seconds"`
	OtherSeconds float64 `json:"other_seconds"`
}

func reportOf(id string, c *conversation.Conversation) ConversationReport {
	rep := ConversationReport{ID: id, Key: c.Key, Team: c.Team, Turns: c.Turns, Errors: c.Errors, Tokens: c.Tokens,
		CostUSD: float64(c.CostMicros) / 1e6, CostMicros: c.CostMicros, FirstSeen: c.First, LastSeen: c.Last,
		DurationSeconds: c.Duration().Seconds(), TTFTMs: make([]*float64, len(c.TTFTs)), Outcome: c.Outcome,
		KeyID: c.KeyID, User: c.User, Session: sessionReport(c)}
	for i, d := range c.TTFTs {
		if d > 0 {
			ms := float64(d) / float64(time.Millisecond)
			rep.TTFTMs[i] = &ms
		}
	}
	return rep
}

// sessionReport is c's breakdown as SessionReport shows it; its time split
// and subagent share are the conversation's own (conversation.TimeSplit),
// as the metrics and /stats have them.
func sessionReport(c *conversation.Conversation) SessionReport {
	bd := &c.Breakdown
	rep := SessionReport{Classes: map[string]conversation.Calls{}, Agents: []AgentReport{},
		Tools: map[string]conversation.Tool{}, Compactions: map[string]conversation.Compactions{},
		UserTurns: bd.Prompts, UserTurnsCapped: bd.PromptsCapped, SubagentCostShare: c.SubagentCostShare()}
	for name, calls := range bd.Classes {
		rep.Classes[name] = *calls
	}
	for id, a := range bd.Agents {
		rep.Agents = append(rep.Agents, AgentReport{ID: id, Agent: *a})
	}
	slices.SortFunc(rep.Agents, func(a, b AgentReport) int { return strings.Compare(a.ID, b.ID) })
	for name, t := range bd.Tools {
		rep.Tools[name] = *t
	}
	for kind, k := range bd.Compactions {
		rep.Compactions[kind] = *k
	}
	s := c.TimeSplit()
	rep.Time = SessionTime{WallSeconds: s.Wall.Seconds(), ModelSeconds: s.Model.Seconds(), TTFTSeconds: s.TTFT.Seconds(),
		ToolSeconds: s.Tool.Seconds(), OtherSeconds: s.Other.Seconds()}
	return rep
}

// conversationOwner is the owner an admin request names with ?team= or
// ?key= (a key without a team); neither names callers without a [[keys]]
// entry.
func conversationOwner(cfg *config.Config, q url.Values) (string, *apiError) {
	team, key := q.Get("team"), q.Get("key")
	switch {
	case team != "" && key != "":
		return "", errBadRequest("give team or key, not both", "")
	case team != "":
		if cfg.Team(team) == nil {
			return "", errBadRequest("team "+strconv.Quote(team)+" is not one of this gateway's [[teams]]", "team")
		}
		return ownerName("", team), nil
	case key != "":
		for i := range cfg.Keys {
			if k := &cfg.Keys[i]; k.Name == key {
				return ownerName(k.Name, k.Team), nil
			}
		}
		return "", errBadRequest("key "+strconv.Quote(key)+" is not one of this gateway's [[keys]]", "key")
	}
	return "", nil
}

// adminConversation serves GET /admin/conversations/{id}: an active
// conversation's figures (404 when there is none).
func (g *Gateway) adminConversation(w http.ResponseWriter, r *http.Request) {
	d := errorDialect(r, llm.DialectNone)
	id := conversationID(r)
	if e := g.checkConversationAPI(id); e != nil {
		writeError(w, d, requestIDFrom(r.Context()), e)
		return
	}
	owner, e := conversationOwner(g.Config(), r.URL.Query())
	if e != nil {
		writeError(w, d, requestIDFrom(r.Context()), e)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
	defer cancel()
	c, err := g.conv.Get(ctx, conversation.Key(owner, id))
	if e := conversationError(err); e != nil {
		writeError(w, d, requestIDFrom(r.Context()), e)
		return
	}
	writeJSON(w, http.StatusOK, reportOf(id, &c))
}

// conversationID is the path's {id}. The router matches the escaped path
// when there is one, so its parameter is unescaped then.
func conversationID(r *http.Request) string {
	id := chi.URLParam(r, "id")
	if r.URL.RawPath == "" {
		return id
	}
	id, err := url.PathUnescape(id)
	if err != nil {
		return ""
	}
	return id
}

// checkConversationAPI answers a conversation API request that cannot be
// served: tracking off, or an id that names none.
func (g *Gateway) checkConversationAPI(id string) *apiError {
	switch {
	case g.conv == nil:
		return &apiError{Status: http.StatusNotFound, Kind: "invalid_request_error", Code: "conversations_off",
			AnthropicKind: "not_found_error",
			Msg:           "conversation tracking is off: set [conversations] enabled = true in the gateway's config"}
	case !conversation.ValidID(id):
		return errBadRequest("a conversation id is 1 to "+strconv.Itoa(conversation.MaxIDLen)+
			" bytes without control characters", "id")
	}
	return nil
}

// conversationError phrases a store's error for the conversation API.
func conversationError(err error) *apiError {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, conversation.ErrUnknown):
		return &apiError{Status: http.StatusNotFound, Kind: "invalid_request_error", Code: "conversation_not_found",
			AnthropicKind: "not_found_error",
			Msg: "no active conversation has this id for this team: it never had a turn through this gateway, " +
				"or it ended (idle past [conversations] idle_timeout_seconds)"}
	case errors.Is(err, conversation.ErrOutcomeSet):
		return &apiError{Status: http.StatusConflict, Kind: "invalid_request_error", Code: "outcome_already_recorded",
			AnthropicKind: "invalid_request_error",
			Msg:           "this conversation's outcome was recorded already; an outcome is recorded once"}
	}
	return &apiError{Status: http.StatusServiceUnavailable, Kind: "server_error", Code: "conversations_unavailable",
		AnthropicKind: "api_error", Msg: "the conversation store cannot be reached right now; retry shortly"}
}

// conversationOutcome serves POST /tollgate/conversations/{id}/outcome:
// the application's verdict on a conversation, {"completed": true|false,
// "score": 0..1, "feedback": "..."} (score and feedback optional),
// recorded once. The caller names the conversation as its turns did, with
// its gateway key (the key's team owns it); the admin token names the
// owner with ?team= or ?key=. The path is the gateway's own, so it never
// shadows an upstream API such as /v1/conversations.
func (g *Gateway) conversationOutcome(w http.ResponseWriter, r *http.Request) {
	rid := requestIDFrom(r.Context())
	d := errorDialect(r, llm.DialectNone)
	id := conversationID(r)
	if e := g.checkConversationAPI(id); e != nil {
		writeError(w, d, rid, e)
		return
	}
	owner, e := g.outcomeOwner(r)
	if e == nil {
		var o conversation.Outcome
		if o, e = readOutcome(w, r); e == nil {
			o.At = g.now()
			ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
			c, err := g.conv.SetOutcome(ctx, conversation.Key(owner, id), o)
			cancel()
			if e = conversationError(err); e == nil {
				if g.onOutcome != nil {
					g.onOutcome(c.Team, *c.Outcome, c.CostMicros)
				}
				writeJSON(w, http.StatusOK, reportOf(id, &c))
				return
			}
		}
	}
	if e.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="tollgate"`)
	}
	writeError(w, d, rid, e)
}

// outcomeOwner is the owner of the conversation an outcome request names:
// the admin token's ?team= or ?key=, else the caller key's.
func (g *Gateway) outcomeOwner(r *http.Request) (string, *apiError) {
	if g.isAdmin(r) {
		return conversationOwner(g.Config(), r.URL.Query())
	}
	gen := g.begin()
	defer gen.end()
	c, k, aerr := gen.gov.pick(readKeys(r.Header))
	switch {
	case aerr != nil:
		return "", aerr
	case !c.present:
		return "", errUnauthorized("missing API key: send the gateway key the conversation's turns were sent with " +
			"(\"Authorization: Bearer <key>\" or \"x-api-key: <key>\"), or the admin token")
	case k != nil:
		return k.owner, nil
	case gen.gov.keysMode:
		return "", errUnknownKey(c.id())
	}
	return "", nil
}

// readOutcome decodes and checks an outcome body: one JSON object with
// "completed", and optionally "score" (0 to 1) and "feedback".
func readOutcome(w http.ResponseWriter, r *http.Request) (conversation.Outcome, *apiError) {
	var req outcomeRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxOutcomeBody))
	dec.DisallowUnknownFields()
	err := dec.Decode(&req)
	if err == nil && dec.More() {
		err = errors.New("data after the JSON object")
	}
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return conversation.Outcome{}, &apiError{Status: http.StatusRequestEntityTooLarge, Kind: "invalid_request_error",
			Code: "request_too_large", AnthropicKind: "request_too_large",
			Msg: "an outcome body is at most " + strconv.Itoa(maxOutcomeBody) + " bytes"}
	case err != nil:
		return conversation.Outcome{}, errBadRequest("the body must be one JSON object "+
			`{"completed": true|false, "score": 0..1, "feedback": "..."}: `+err.Error(), "")
	case req.Completed == nil:
		return conversation.Outcome{}, errBadRequest(`"completed" (true or false) is required`, "completed")
	case req.Score != nil && !(*req.Score >= 0 && *req.Score <= 1):
		return conversation.Outcome{}, errBadRequest(`"score" must be a number from 0 to 1`, "score")
	case req.Feedback != nil && len(*req.Feedback) > conversation.MaxFeedbackLen:
		return conversation.Outcome{}, errBadRequest(`"feedback" is at most `+
			strconv.Itoa(conversation.MaxFeedbackLen)+" bytes", "feedback")
	}
	o := conversation.Outcome{Completed: *req.Completed, Score: req.Score}
	if req.Feedback != nil {
		o.Feedback = *req.Feedback
	}
	return o, nil
}
