package proxy

import (
	"net/http"
	"strings"

	"github.com/tollgate-llm/tollgate/llm"
)

// newExchange starts an exchange at t_in under gen, the configuration it
// runs under to its end: its route and dialect, its kind (kindOf), the
// dialect its errors are written in, and its request id (id). Every
// exchange is made here: a caller's request (handle), one that matched no
// route (reject) and the synthetic probe of an upstream (Probe, probe
// non-nil), which has no key and goes to that upstream alone.
func (g *Gateway) newExchange(gen *generation, w http.ResponseWriter, r *http.Request, route llm.Route, d llm.Dialect,
	probe *upstream, id string) *exchange {
	ex := &exchange{g: g, gen: gen, w: w, r: r, promptEstimate: -1, kind: kindOf(route, d, probe != nil),
		answer: errorDialect(r, d)}
	ex.rec.Timing.In = g.now()
	ex.rec.Route, ex.rec.Dialect = route, d
	ex.rec.RequestID = id
	if probe != nil {
		ex.rec.KeyID, ex.rec.Upstream = keyID(""), probe.cfg.Name
	}
	return ex
}

// handle runs one exchange, t_in to finish.
func (g *Gateway) handle(w http.ResponseWriter, r *http.Request, route llm.Route, d llm.Dialect) {
	g.open.Add(1)
	defer g.open.Add(-1)
	ex := g.newExchange(g.begin(), w, r, route, d, nil, requestIDFrom(r.Context()))
	defer ex.gen.end()
	ex.rec.TraceID = ex.startTrace()
	inflight := g.metrics.Inflight(route)
	inflight.Inc()
	defer inflight.Dec()
	defer ex.finish()
	defer ex.abortOnPanic()
	ex.serve()
}

// reject answers a request that matched no route, and records it like any
// other so it leaves its access-log line and counts in requests_total.
func (g *Gateway) reject(w http.ResponseWriter, r *http.Request, e *apiError) {
	ex := g.newExchange(g.begin(), w, r, llm.RouteOther, llm.DialectNone, nil, requestIDFrom(r.Context()))
	defer ex.gen.end()
	c, k, _ := ex.gen.gov.pick(readKeys(r.Header))
	ex.rec.KeyID = keyName(c, k)
	ex.fail(e, llm.OutcomeBadRequest)
	ex.finish()
}

// errorDialect is the dialect a request's errors are written in: its
// route's (d), or for a request outside the dialect routes (a forwarded
// path, the admin API, a panic's 500) Anthropic's when its path or headers
// say so, else OpenAI's.
func errorDialect(r *http.Request, d llm.Dialect) llm.Dialect {
	switch {
	case d != llm.DialectNone:
		return d
	case r.Header.Get("Anthropic-Version") != "" || r.Header.Get("X-Api-Key") != "" ||
		strings.HasPrefix(r.URL.Path, "/v1/messages"):
		return llm.DialectAnthropic
	}
	return llm.DialectOpenAI
}

// refusal is what a front-door check says when a request may not go on:
// the error the caller gets in its dialect, the outcome, and for a
// rejection the rule that refused it. The zero value lets the request on.
type refusal struct {
	err     *apiError
	outcome llm.Outcome
	reason  llm.Rejection
	// typed: the error's type is the record's error type too (a limit's
	// 429, which the SDKs and dashboards tell apart by it).
	typed bool
	// gone: the caller left (or the gateway cut it) while the check waited.
	gone bool
}

// ok reports whether the request may go on.
func (rf refusal) ok() bool { return rf.err == nil && !rf.gone }

// badRequest refuses a request that is malformed or cannot be served as
// sent.
func badRequest(e *apiError) refusal { return refusal{err: e, outcome: llm.OutcomeBadRequest} }

// rejected refuses a well-formed request by a rule of the gateway's (why).
func rejected(e *apiError, why llm.Rejection) refusal {
	return refusal{err: e, outcome: llm.OutcomeRejected, reason: why}
}

// limited refuses a request past a limit: rejected, with the error's type
// on the record.
func limited(e *apiError, why llm.Rejection) refusal {
	rf := rejected(e, why)
	rf.typed = true
	return rf
}

// callerGone ends a request whose caller left during a check.
var callerGone = refusal{gone: true}

// serve takes a request through the front door's checks in the order it
// meets them, each returning a refusal, and refuses in one place (refuse)
// at the first that says no; then it goes upstream. A check that is not
// reached leaves its part of the record empty, as before it.
func (ex *exchange) serve() {
	var hasKey bool
	var body []byte
	rf := ex.checkEdge()
	if rf.ok() {
		hasKey, rf = ex.checkIdentity()
	}
	if rf.ok() {
		rf = ex.checkUpstream()
	}
	if rf.ok() {
		body, rf = ex.readRequestBody()
	}
	if rf.ok() {
		body, rf = ex.inspect(body)
	}
	if rf.ok() {
		rf = ex.checkStored()
	}
	if rf.ok() && ex.kind.admitted() {
		rf = ex.identifyConversation()
	}
	if rf.ok() && ex.kind.limited() {
		rf = ex.admit()
	}
	if !rf.ok() {
		ex.refuse(rf)
		return
	}
	// No label of its own yet for a name nobody has served: the upstream
	// may still refuse it (see servedBy).
	ex.modelLabel = ex.g.metrics.Model(ex.rec.Model)
	// In mode "keys" the caller's key is the gateway's, never the
	// upstream's: the upstream's own key replaces it.
	ex.roundTrip(body, hasKey && !ex.gen.gov.keysMode, ex.targets(ex.rec.Model))
}

// refuse answers a request a check refused: the one place the record's
// rejection is written.
func (ex *exchange) refuse(rf refusal) {
	if rf.gone {
		ex.clientGone()
		return
	}
	ex.rec.Rejection = rf.reason
	if rf.typed {
		ex.rec.ErrorType = rf.err.Kind
	}
	ex.fail(rf.err, rf.outcome)
}

// checkTurn takes a response.create of a socket (frame; socketturn.go)
// through the checks a POST /v1/responses meets after its body is read
// (the socket's keys were checked when it opened, and identify the caller
// again under the turn's configuration): inspection, stored-object
// ownership, conversation, admission. A turn is a stream by the transport.
// It returns the message that goes upstream.
func (ex *exchange) checkTurn(frame []byte, keys presented, madeHere func(id string) bool) ([]byte, refusal) {
	ex.rec.Transport = llm.TransportWebSocket
	if _, aerr := ex.identify(keys); aerr != nil {
		return nil, badRequest(aerr)
	}
	frame, rf := ex.inspect(frame)
	ex.info.Stream, ex.rec.Stream = true, true
	if rf.ok() && !validStreamID(frame) {
		rf = badRequest(&apiError{Status: http.StatusBadRequest, Kind: "invalid_request_error", Code: "invalid_stream_id",
			Msg: "stream_id must be 1 to 256 letters, digits, '_', '-' or '.'", Param: "stream_id"})
	}
	if rf.ok() {
		rf = ex.checkStoredBut(madeHere)
	}
	if rf.ok() {
		rf = ex.identifyConversation()
	}
	if rf.ok() {
		rf = ex.admit()
	}
	ex.modelLabel = ex.g.metrics.Model(ex.rec.Model)
	return frame, rf
}

// followTurn opens a socket's turn that no response.create asked for (a
// steered response's successor, socketturn.go): the socket's keys
// identified, its model the one the upstream names, a stream by the
// transport, and no check: the upstream made it already.
func (ex *exchange) followTurn(keys presented, model string) {
	ex.rec.Transport = llm.TransportWebSocket
	_, _ = ex.identify(keys)
	ex.rec.Model, ex.rec.Stream, ex.info.Stream = model, true, true
	ex.modelLabel = ex.g.metrics.Model(model)
}

// checkIdentity reads the caller's keys (Authorization and x-api-key) and
// identifies the caller by them (identify). hasKey says a key identifies
// it.
func (ex *exchange) checkIdentity() (hasKey bool, rf refusal) {
	hasKey, aerr := ex.identify(readKeys(ex.r.Header))
	if aerr != nil {
		return false, badRequest(aerr)
	}
	return hasKey, refusal{}
}

// identify names the caller from the keys it presented
// (governance.identify): the record's key id is its key's [[keys]] name,
// with its team, or else the key's hash prefix; and says whether a key
// identifies it and whether it may go on.
func (ex *exchange) identify(p presented) (hasKey bool, aerr *apiError) {
	c, k, aerr := ex.gen.gov.identify(p)
	ex.key = k
	ex.rec.KeyID = keyName(c, k)
	if k != nil && k.team != nil {
		ex.rec.Team = k.team.name
	}
	return c.present, aerr
}

// keyName is how records name a caller's key c: its [[keys]] name when k,
// its entry, is known (it says more than the hash prefix), else its id.
func keyName(c credential, k *keyEntry) string {
	if k != nil {
		return k.name
	}
	return c.id()
}

// checkUpstream refuses a request no configured upstream serves.
func (ex *exchange) checkUpstream() refusal {
	if len(ex.targets("")) == 0 {
		return badRequest(errNoUpstream(ex.rec.Dialect))
	}
	return refusal{}
}

// readRequestBody reads the body whole, bounded by max_body_bytes: the
// inspection needs it, and streaming it upstream instead truncated
// requests under load (DESIGN.md).
func (ex *exchange) readRequestBody() ([]byte, refusal) {
	body, aerr := readBody(ex.r, ex.gen.cfg.Server.MaxBodyBytes, &ex.g.bufPool)
	switch {
	case aerr == nil:
		return body, refusal{}
	case ex.r.Context().Err() != nil:
		return nil, callerGone
	}
	return nil, badRequest(aerr)
}

// inspect reads what the request asks for, and so settles what the
// exchange is: the stored object its path names; a model call's model,
// stream and limits (a background response from a governed caller is
// refused: its usage could be neither reserved nor billed; the probe's is
// the gateway's own body); whether a forward is metered; a replay is a
// stream by definition. It is the one place these are written.
//
// It returns the body that goes upstream. A body the gateway reads (a
// model call's, a metered forward's) is read decoded from its
// Content-Encoding (decodedBody), and goes upstream decoded: the gateway
// may rewrite it (bodyFor), and every upstream reads plain JSON. Any
// other body goes upstream as the caller sent it, encoding and all.
func (ex *exchange) inspect(raw []byte) ([]byte, refusal) {
	ex.stored = storedPath(ex.r.Method, ex.r.URL)
	switch ex.kind {
	case kindReplay:
		ex.rec.Stream, ex.info.Stream = true, true // asked for by its query or its body's stream
	case kindModelCall, kindProbe:
		body, decoded, aerr := ex.decodedBody(raw)
		if aerr != nil {
			return nil, ex.undecodable(aerr)
		}
		ex.promptEstimate = int64(len(body)+3) / 4
		info, aerr := inspectRequest(ex.rec.Dialect, body)
		if aerr != nil {
			return nil, badRequest(aerr)
		}
		if key, field, bad := caseVariantField(body); bad {
			return nil, badRequest(errCaseVariant(key, field))
		}
		info.decoded = decoded
		if ex.kind == kindModelCall {
			info.agent = readAgentCall(ex.r.Header, info.clientMeta, info.endUser)
		}
		ex.info = info
		ex.rec.Model, ex.rec.Stream = info.Model, info.Stream
		if aerr := ex.meterBackground(); aerr != nil {
			return nil, rejected(aerr, llm.RejectNotMeterable)
		}
		return body, refusal{}
	case kindCountTokens:
		if !ex.gen.gov.keysMode || !strings.HasPrefix(ex.r.URL.Path, "/v1/responses/") {
			return raw, refusal{} // it names no stored state to check the owner of
		}
		body, decoded, aerr := ex.decodedBody(raw)
		if aerr != nil {
			return nil, ex.undecodable(aerr)
		}
		info, aerr := inspectTokenCount(body)
		if aerr != nil {
			return nil, badRequest(aerr)
		}
		info.decoded = decoded
		ex.info = info
		return body, refusal{}
	case kindForward:
		body, decoded, derr := raw, false, (*apiError)(nil)
		if ex.r.Method == http.MethodPost { // meterForwarded reads no other body
			body, decoded, derr = ex.decodedBody(raw)
		}
		info, metered, aerr := ex.meterForwarded(body, derr)
		switch {
		case aerr != nil && aerr == derr: // a body it must meter and cannot read
			return nil, ex.undecodable(aerr)
		case aerr != nil:
			return nil, rejected(aerr, llm.RejectNotMeterable)
		}
		if metered {
			// previous_response_id and conversation are checked whatever
			// the path: an upstream may serve the Responses API under
			// another spelling of it.
			info.decoded = decoded
			ex.info, ex.kind = info, kindMetered
			ex.rec.Model = info.Model
			ex.promptEstimate = int64(len(body)+3) / 4
			return body, refusal{}
		}
	}
	return raw, refusal{}
}

// decodedBody is raw with the request's content codings undone
// (decodeBody), at most server.max_body_bytes once decoded; raw itself when
// it has none, or nothing to decode. decoded reports that the request came
// with a Content-Encoding, which must not go upstream with this body.
func (ex *exchange) decodedBody(raw []byte) (body []byte, decoded bool, aerr *apiError) {
	if ex.rec.Transport == llm.TransportWebSocket { // a socket's messages carry no Content-Encoding
		return raw, false, nil
	}
	codings, n, aerr := requestCodings(ex.r.Header)
	switch {
	case aerr != nil:
		return nil, false, aerr
	case n == 0 || len(raw) == 0:
		return raw, len(ex.r.Header["Content-Encoding"]) > 0, nil
	}
	body, aerr = decodeBody(raw, codings[:n], contentEncoding(ex.r.Header), ex.gen.cfg.Server.MaxBodyBytes, &ex.g.bufPool)
	return body, aerr == nil, aerr
}

// undecodable refuses a body the gateway must read and cannot decode; a
// coding it does not know gets the ones it does in Accept-Encoding, as RFC
// 9110 §12.5.3 asks of a 415.
func (ex *exchange) undecodable(aerr *apiError) refusal {
	if aerr.Status == http.StatusUnsupportedMediaType {
		ex.w.Header().Set("Accept-Encoding", supportedCodings)
	}
	return badRequest(aerr)
}
