package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tollgate-llm/tollgate/internal/jsonscan"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/ownership"
)

// storedKind is the kind of stored upstream object an id names.
type storedKind uint8

const (
	storedNone storedKind = iota
	storedResponse
	storedConversation
)

// ownershipTimeout bounds one call to the ownership store.
const ownershipTimeout = 2 * time.Second

// storedUse is what a request's path does with the upstream account's
// stored state (see storedPath).
type storedUse struct {
	kind storedKind
	// id is the object the path names; "" for a create.
	id string
	// create: POST /v1/conversations, whose answer names a new conversation.
	create bool
	// release: DELETE of the object itself; a 2xx forgets its owner.
	release bool
}

// storedPath reads which stored response or conversation a request's path
// addresses: /v1/responses/{id} and everything under it (except
// POST /v1/responses/input_tokens and /compact, which name none),
// /v1/conversations and everything under /v1/conversations/{id}. An
// escaped path addresses none: the upstream could split it otherwise, so
// in mode "keys" it stays refused.
func storedPath(method string, u *url.URL) storedUse {
	if u.RawPath != "" {
		return storedUse{}
	}
	rest, ok := strings.CutPrefix(u.Path, "/v1/")
	if !ok {
		return storedUse{}
	}
	// The path's first two segments, and whether it has more (no Split:
	// this runs on every request).
	first, after, two := strings.Cut(rest, "/")
	id, _, more := strings.Cut(after, "/")
	only := two && !more // exactly first/id
	switch {
	case first == "responses" && id != "":
		if only && (id == "input_tokens" || id == "compact") {
			return storedUse{}
		}
		return storedUse{kind: storedResponse, id: id, release: only && method == http.MethodDelete}
	case first == "conversations" && !two && method == http.MethodPost:
		return storedUse{kind: storedConversation, create: true}
	case first == "conversations" && id != "":
		return storedUse{kind: storedConversation, id: id, release: only && method == http.MethodDelete}
	}
	return storedUse{}
}

// replayPeek bounds how much of a GET's body isReplay reads.
const replayPeek = 64 << 10

// isReplay reports GET /v1/responses/{id} asking for a stream: a
// background response's events, replayed then followed live, relayed and
// measured as a stream. The Python and Node SDKs ask with the query's
// stream=true; openai-go's GetStreaming sends {"stream": true} as the GET's
// body, so a body is read too (and put back for the request).
func isReplay(r *http.Request) bool {
	if r.Method != http.MethodGet {
		return false
	}
	u := storedPath(r.Method, r.URL)
	if u.kind != storedResponse || strings.Contains(r.URL.Path[len("/v1/responses/"):], "/") {
		return false
	}
	if on, err := strconv.ParseBool(r.URL.Query().Get("stream")); err == nil {
		return on
	}
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return false
	}
	head, err := io.ReadAll(io.LimitReader(r.Body, replayPeek))
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(head), r.Body), r.Body}
	if err != nil {
		return false // readBody meets the error again and reports it
	}
	v, _ := jsonscan.Get(head, "stream")
	return jsonscan.Equal(v, "true")
}

// owner names the principal whose stored state a caller may use (see
// keyEntry.owner); "" for a caller without a [[keys]] entry.
func (ex *exchange) owner() string {
	if ex.key == nil {
		return ""
	}
	return ex.key.owner
}

// checkStored lets a request that names stored state, by its path or by
// previous_response_id or conversation in its body, through only for the
// team that created that state (mode "keys"). Everyone else gets the
// upstream's own 404, and the request never reaches the upstream.
func (ex *exchange) checkStored() refusal { return ex.checkStoredBut(nil) }

// checkStoredBut is checkStored for a socket's turn: a previous_response_id
// the socket itself made (madeHere; nil for none) is the caller's, stored
// or not, as the upstream's connection-local cache holds it for that
// socket alone.
func (ex *exchange) checkStoredBut(madeHere func(id string) bool) refusal {
	g := ex.g
	if !ex.gen.gov.keysMode {
		return refusal{}
	}
	refs := [...]struct {
		kind  storedKind
		id    string
		param string
	}{
		{ex.stored.kind, ex.stored.id, ""},
		{storedResponse, ex.info.PreviousResponseID, "previous_response_id"},
		{storedConversation, ex.info.Conversation, "conversation"},
	}
	me := ex.owner()
	for _, ref := range refs {
		if ref.id == "" || ref.kind == storedResponse && ref.param != "" && madeHere != nil && madeHere(ref.id) {
			continue
		}
		g.claims.wait(ex.r.Context(), ref.id, claimLookupWait)
		ctx, cancel := context.WithTimeout(ex.r.Context(), ownershipTimeout)
		holder, err := g.owners.Owner(ctx, ref.id)
		cancel()
		if errors.Is(err, ownership.ErrInvalid) {
			// No upstream id looks like this (too long, control bytes).
			holder, err = "", nil
		}
		if err != nil {
			g.log.Warn("ownership store unavailable", "request_id", ex.rec.RequestID, "err", err)
			return rejected(errOwnershipUnavailable(), llm.RejectOwnershipUnavailable)
		}
		if holder != me {
			return rejected(errStoredNotFound(ref.kind, ref.id, ref.param), llm.RejectNotOwner)
		}
	}
	return refusal{}
}

// claims reports whether the answer to this request names a new stored
// object that must be recorded as the caller's before the caller sees it:
// a response created with store on, or a conversation created.
func (ex *exchange) claims() storedKind {
	switch {
	case !ex.gen.gov.keysMode || ex.key == nil: // a probe is no team's
		return storedNone
	case ex.rec.Route == llm.RouteResponses && !ex.info.NoStore:
		return storedResponse
	case ex.stored.create:
		return storedConversation
	}
	return storedNone
}

// claimAnswer records the object a non-streamed answer (a response, a
// conversation) names by its top-level id. It reports whether another team
// owns the id (claimID).
func (ex *exchange) claimAnswer(at *attemptState, body []byte) (conflict bool) {
	kind := at.claim
	at.claim = storedNone
	raw, _ := jsonscan.Get(body, "id")
	s, ok := jsonscan.String(raw)
	if !ok || len(s) == 0 {
		at.link = false
		ex.g.log.Warn("stored object without an id: its owner and conversation are not recorded", "request_id", ex.rec.RequestID)
		return false
	}
	return ex.newStored(at, kind, string(jsonscan.AppendUnescape(nil, s)))
}

// newStored records a new stored object the answer names before the caller
// sees it: its owner (kind, when it must be claimed; storedNone when not)
// and, for a response, its conversation. It reports whether another team
// owns the id (claimID), in which case nothing else is recorded.
func (ex *exchange) newStored(at *attemptState, kind storedKind, id string) (conflict bool) {
	key := ex.takeLink(at, id)
	conflict = ex.recordStored(kind, id, key)
	ex.joinConversation(key, conflict)
	return conflict
}

// recordStored writes what newStored decided: the owner of id, when kind
// is not storedNone, then the response's link to the conversation key
// ("" for none). It reads only what stays fixed while the exchange runs
// (the caller, the configuration), so a stream runs it off the relay loop
// (claimStream).
func (ex *exchange) recordStored(kind storedKind, id, key string) (conflict bool) {
	if kind != storedNone && ex.claimID(kind, id) {
		return true
	}
	if key != "" {
		ex.linkResponse(id, key)
	}
	return false
}

// joinConversation makes a response's conversation the exchange's once it
// is recorded: a first turn's conversation is named by its own response,
// unless that response is another team's.
func (ex *exchange) joinConversation(key string, conflict bool) {
	if !conflict && key != "" {
		ex.conv.key = key
	}
}

// claimWait is how long the relay waits for a stream's new response to be
// recorded (owner and conversation link) before it writes the
// response.created event that names it. A local store answers in
// microseconds and a healthy Redis in well under a millisecond, so the
// wait normally ends with the answer, and an answer naming another team's
// response is withheld whole. A store slower than this (a stalled Redis)
// delays no event and does not hold the stream's end either: the relay
// goes on, counts it (tollgate_stored_claims_deferred_total), and ends the
// stream at its next event if the claim finds a conflict; a request on
// this replica naming the id waits for the claim (claimsInFlight). The
// first token follows response.created by the model's prefill time, so
// this bound normally costs no token anything.
const claimWait = 5 * time.Millisecond

// claimLookupWait bounds how long a request naming a response waits for
// that response's claim in flight (owner, then conversation link) before
// it looks the owner or the conversation up.
const claimLookupWait = ownershipTimeout + conversationTimeout

// storedClaim is a stream's new response being recorded off the relay
// loop: done is closed when it is, and conflict is then its answer.
// deferred is the relay's own: it went on before the answer.
type storedClaim struct {
	id       string
	convKey  string // the conversation it is linked to, "" for none
	done     chan struct{}
	conflict bool
	deferred bool
}

// result returns the claim's answer without waiting; ok is false while it
// is still in flight.
func (c *storedClaim) result() (conflict, ok bool) {
	select {
	case <-c.done:
		return c.conflict, true
	default:
		return false, false
	}
}

// claimStream starts recording the new response a stream's
// response.created names (id), off the relay loop, and waits for it at
// most claimWait. The claim is in claimsInFlight from before it starts to
// its end, so a request naming id on this replica waits for it instead of
// finding it unowned; it runs to its end (each store call bounded by its
// own timeout) whether or not the stream is still open, and Gateway.Wait
// waits for it at shutdown. A panic in a store counts as a failed claim:
// logged, and the id stays unowned.
func (ex *exchange) claimStream(at *attemptState, id string) *storedClaim {
	g := ex.g
	kind := at.claim
	at.claim = storedNone
	c := &storedClaim{id: id, convKey: ex.takeLink(at, id), done: make(chan struct{})}
	g.claims.add(c)
	g.claiming.Add(1)
	go func() {
		defer g.claiming.Add(-1)
		defer g.claims.remove(c)
		defer close(c.done)
		defer func() {
			if p := recover(); p != nil {
				c.conflict = false
				g.log.Error("panic recording a new stored response: it is unusable through the gateway",
					"request_id", ex.rec.RequestID, "panic", p, "stack", string(debug.Stack()))
			}
		}()
		c.conflict = ex.recordStored(kind, id, c.convKey)
	}()
	t := time.NewTimer(claimWait)
	defer t.Stop()
	select {
	case <-c.done:
	case <-t.C:
		c.deferred = true
		g.metrics.StoredClaimDeferred()
	}
	return c
}

// endClaim joins the stream's conversation once the stream has ended,
// without waiting for a claim still in flight: its conversation key was
// known before it started. A conflict that claim finds later can change
// nothing the caller got (the whole answer); claimID logs it.
func (ex *exchange) endClaim(c *storedClaim) {
	conflict, _ := c.result()
	ex.joinConversation(c.convKey, conflict)
}

// claimsInFlight are the stream claims in flight, by response id: a
// request on this replica that names one (a GET of it, or
// previous_response_id) waits for it before it looks the owner or the
// conversation up, so it is served as it would be a moment later. Another
// replica sees the claim once its store has it.
type claimsInFlight struct {
	mu sync.Mutex
	m  map[string]*storedClaim
}

func (f *claimsInFlight) add(c *storedClaim) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = make(map[string]*storedClaim)
	}
	f.m[c.id] = c
}

func (f *claimsInFlight) remove(c *storedClaim) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m[c.id] == c {
		delete(f.m, c.id)
	}
}

// wait returns once no claim of id is in flight, ctx ends, or limit
// passes.
func (f *claimsInFlight) wait(ctx context.Context, id string, limit time.Duration) {
	f.mu.Lock()
	c := f.m[id]
	f.mu.Unlock()
	if c == nil {
		return
	}
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-c.done:
	case <-ctx.Done():
	case <-t.C:
	}
}

// claimID records id, of a new object of kind, as the caller's. A claim
// that fails leaves the id unowned (a 404 for everyone, never someone
// else's): the failure is logged, and the answer still goes to the caller.
// An id that another team owns already (an upstream that repeats ids, or
// one that answers for another account) is reported as a conflict: the
// answer must not reach the caller, who would hold a name of that team's
// object.
func (ex *exchange) claimID(kind storedKind, id string) (conflict bool) {
	g := ex.g
	ttl := ex.gen.cfg.Ownership.ResponseTTL()
	if kind == storedConversation {
		ttl = ex.gen.cfg.Ownership.ConversationTTL()
	}
	// The caller may be gone; the object exists upstream all the same.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ex.r.Context()), ownershipTimeout)
	defer cancel()
	me := ex.owner()
	holder, err := g.owners.Claim(ctx, id, me, ttl)
	switch {
	case err != nil:
		g.log.Error("recording the owner of a stored object failed: it is unusable through the gateway",
			"request_id", ex.rec.RequestID, "err", err)
	case holder != me:
		g.log.Error("the upstream answered with the id of a stored object another team owns: it stays that team's, "+
			"and the answer is withheld unless the caller had it already (a claim slower than the stream)",
			"request_id", ex.rec.RequestID)
		return true
	}
	return false
}

// releaseStored forgets the owner of an object the upstream deleted.
func (ex *exchange) releaseStored() {
	g := ex.g
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ex.r.Context()), ownershipTimeout)
	defer cancel()
	if err := g.owners.Release(ctx, ex.stored.id, ex.owner()); err != nil {
		g.log.Warn("forgetting the owner of a deleted object failed; it expires with its ttl",
			"request_id", ex.rec.RequestID, "err", err)
	}
}
