package mockllm

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/tollgate-llm/tollgate/internal/jsonscan"
	"github.com/tollgate-llm/tollgate/llm"
)

// request holds the body fields the mock reads, for both dialects.
type request struct {
	Model         string `json:"model"`
	Stream        bool   `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	MaxTokens           *int64 `json:"max_tokens"`
	MaxCompletionTokens *int64 `json:"max_completion_tokens"`
	MaxOutputTokens     *int64 `json:"max_output_tokens"` // Responses
	Tools               []struct {
		Name     string `json:"name"` // Anthropic, Responses
		Function *struct {
			Name string `json:"name"`
		} `json:"function"` // OpenAI
	} `json:"tools"`
	// The Responses API's stored state (see stored.go).
	Background         bool            `json:"background"`
	Store              *bool           `json:"store"`
	PreviousResponseID string          `json:"previous_response_id"`
	Conversation       json.RawMessage `json:"conversation"`
	Input              json.RawMessage `json:"input"`
	// Generate false is a WebSocket turn's warm-up (Codex's prewarm): a
	// response with no output, whose id later turns may chain from.
	Generate *bool `json:"generate"`
}

// stores reports whether a Responses request is kept: "store" defaults to
// true.
func (r *request) stores() bool { return r.Store == nil || *r.Store }

// toolName returns the name of the first tool ("tool" when it has none),
// or "" without tools.
func (r *request) toolName() string {
	if len(r.Tools) == 0 {
		return ""
	}
	t := r.Tools[0]
	name := t.Name
	if t.Function != nil && t.Function.Name != "" {
		name = t.Function.Name
	}
	if name == "" {
		name = "tool"
	}
	return name
}

// exchange is one generation request being answered.
type exchange struct {
	srv     *Server
	w       http.ResponseWriter
	rc      *http.ResponseController
	ctx     context.Context
	dialect llm.Dialect
	route   llm.Route
	reqID   string
	seq     uint64
	arrival time.Time

	p         params
	req       request
	input     int // base input tokens
	maxTokens int64
	plan      plan
	sched     schedule
	timer     *time.Timer
	buf       []byte
	created   int64
	model     []byte // the model as a JSON string
	id        string
	toolID    string
	// tool is the tool the answer calls, "" for text (pickTool).
	tool string
	// ended is set when a fault ended the body early (error event).
	ended bool
	// respSeq is the next sequence_number of a Responses stream;
	// reasoningClosed is set once its reasoning item is done.
	respSeq         int64
	reasoningClosed bool
	// injected is set when the fault came from Server.Inject.
	injected bool
	// body is the request body.
	body []byte
	// conv is the conversation a Responses request names, items its input
	// items with their ids; kept is set once its answer is stored (see
	// keep). replay marks a stored stream sent again, whose events up to
	// sequence number skip are left out.
	conv   string
	items  []item
	kept   bool
	replay bool
	skip   int64
	// evStart and evSeq are the offset in buf and the sequence number of
	// the Responses event being written.
	evStart int
	evSeq   int64
	// socket: the turn came as a response.create on a WebSocket, which
	// implies a stream (socket.go); socketMade lists the responses that
	// socket's turns made, which a turn on it may chain from stored or not
	// (the real API's connection-local cache).
	socket     bool
	socketMade *[]string
}

// serve validates the request and answers it.
func (x *exchange) serve(r *http.Request, body []byte) outcome {
	s := x.srv
	x.body = body
	var err error
	if x.p, err = s.parseParams(r.Header); err != nil {
		return s.badRequest(x.w, x.dialect, x.reqID, err.Error())
	}
	if e, ok := x.parseBody(body); !ok {
		writeError(x.w, x.dialect, x.reqID, e)
		return outcomeBadRequest
	}
	if x.socket {
		x.req.Stream = true
	}
	if x.tool, err = x.pickTool(body); err != nil {
		return s.badRequest(x.w, x.dialect, x.reqID, err.Error())
	}
	// Only now, with the request accepted, may it use up an injected fault.
	if inj, ok := s.takeInjected(); ok {
		x.p.fault, x.injected = inj, true
	}
	f := x.p.fault
	if f.set {
		s.update(func(st *Stats) { st.Faults++ })
	}
	if !x.req.Stream && f.errorEvent >= 0 {
		return s.badRequest(x.w, x.dialect, x.reqID, "mockllm: fault error-event needs stream: true")
	}

	if !s.acquire(x.ctx) {
		return outcomeCanceled
	}
	defer s.release()
	defer func() {
		if x.timer != nil {
			x.timer.Stop()
		}
	}()
	if f.stall > 0 && !x.waitUntil(time.Now().Add(f.stall)) {
		return outcomeCanceled
	}
	t0 := time.Now()

	if f.status != 0 {
		e := defaultError(x.dialect, f.status)
		if f.errType != "" {
			e.typ = f.errType
		}
		if f.errCode != "" {
			e.code = f.errCode
		}
		e.retryAfter, e.retryAfterMs = f.retryAfter, f.retryAfterMs
		writeError(x.w, x.dialect, x.reqID, e)
		x.log(f.status, outcomeCompleted)
		return outcomeCompleted
	}

	x.prepare(t0)
	if x.dialect == llm.DialectResponses && x.req.Background {
		// The mock does a background response's work at once: it is
		// stored finished before the answer starts, and stays so if the
		// client goes away.
		x.keep(x.finalResponse())
	}

	var oc outcome
	switch {
	case x.req.Stream && x.dialect == llm.DialectAnthropic:
		oc = x.streamAnthropic()
	case x.req.Stream && x.dialect == llm.DialectResponses:
		oc = x.streamResponses()
	case x.req.Stream:
		oc = x.streamOpenAI()
	default:
		oc = x.whole()
	}
	x.log(http.StatusOK, oc)
	return oc
}

// prepare sets up the answer from t0: its schedule, ids, model and plan.
func (x *exchange) prepare(t0 time.Time) {
	x.sched = newSchedule(t0, x.p, x.srv.opts.Seed, x.seq)
	x.created = t0.Unix()
	x.model = jsonscan.AppendString(nil, x.req.Model)
	n := pad(x.seq)
	if x.dialect == llm.DialectAnthropic {
		x.id, x.toolID = "msg_mock"+n, "toolu_mock"+n
		x.plan = newPlan(x.p, x.maxTokens, x.tool, false)
	} else {
		x.id, x.toolID = "chatcmpl-mock"+n, "call_mock"+n
		x.plan = newPlan(x.p, x.maxTokens, x.tool, true)
	}
	if g := x.req.Generate; g != nil && !*g {
		x.plan = plan{tpc: max(x.plan.tpc, 1)} // a warm-up generates nothing
	}
}

// parseBody decodes and validates the body, returning the 400 to send when
// it is not acceptable.
func (x *exchange) parseBody(body []byte) (apiError, bool) {
	bad := func(msg string) (apiError, bool) {
		e := defaultError(x.dialect, http.StatusBadRequest)
		e.msg = msg
		return e, false
	}
	if err := json.Unmarshal(body, &x.req); err != nil {
		if x.dialect == llm.DialectAnthropic {
			return bad("mockllm: invalid JSON body: " + err.Error())
		}
		return bad("We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON.)")
	}
	x.input = InputTokens(body)
	x.maxTokens = -1
	if x.dialect == llm.DialectAnthropic {
		if x.req.Model == "" {
			return bad("model: Field required")
		}
		if x.req.MaxTokens == nil {
			return bad("max_tokens: Field required")
		}
		if *x.req.MaxTokens < 1 {
			return bad("max_tokens: Input should be greater than or equal to 1")
		}
		x.maxTokens = *x.req.MaxTokens
		return apiError{}, true
	}
	if x.dialect == llm.DialectResponses {
		return x.parseResponses(bad)
	}
	if x.req.Model == "" {
		return bad("you must provide a model parameter")
	}
	if x.req.StreamOptions != nil && !x.req.Stream {
		return bad("The 'stream_options' parameter is only allowed when 'stream' is enabled.")
	}
	name, limit := "max_tokens", x.req.MaxTokens
	if x.req.MaxCompletionTokens != nil {
		name, limit = "max_completion_tokens", x.req.MaxCompletionTokens
	}
	if limit != nil {
		if *limit < 1 {
			e, _ := bad("Invalid '" + name + "': integer below minimum value. Expected a value >= 1, but got " +
				strconv.FormatInt(*limit, 10) + " instead.")
			e.param, e.code = name, "integer_below_min_value"
			return e, false
		}
		x.maxTokens = *limit
	}
	return apiError{}, true
}

// parseResponses validates a Responses API body as the real API does.
func (x *exchange) parseResponses(bad func(string) (apiError, bool)) (apiError, bool) {
	if x.req.Model == "" {
		e, _ := bad("Missing required parameter: 'model'.")
		e.param, e.code = "model", "missing_required_parameter"
		return e, false
	}
	if x.req.StreamOptions != nil && !x.req.Stream {
		return bad("The 'stream_options' parameter is only allowed when 'stream' is enabled.")
	}
	if l := x.req.MaxOutputTokens; l != nil {
		if *l < 16 {
			e, _ := bad("Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 16, but got " +
				strconv.FormatInt(*l, 10) + " instead.")
			e.param, e.code = "max_output_tokens", "integer_below_min_value"
			return e, false
		}
		x.maxTokens = *l
	}
	return x.parseStored(bad)
}

// waitUntil waits for t or the client's departure, and reports whether the
// client is still there.
func (x *exchange) waitUntil(t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return x.ctx.Err() == nil
	}
	if x.timer == nil {
		x.timer = time.NewTimer(d)
	} else {
		x.timer.Reset(d)
	}
	select {
	case <-x.timer.C:
		return true
	case <-x.ctx.Done():
		return false
	}
}

// startStream writes the headers of a 200 event stream.
func (x *exchange) startStream() {
	setHeaders(x.w.Header(), x.dialect, x.reqID, "text/event-stream")
	x.w.WriteHeader(http.StatusOK)
}

// emit writes x.buf as one event (or a few written together) and flushes.
// It reports false when the client is gone.
func (x *exchange) emit() bool {
	_, err := x.w.Write(x.buf)
	x.buf = x.buf[:0]
	if err == nil {
		err = x.rc.Flush()
	}
	if err != nil && !errors.Is(err, http.ErrNotSupported) {
		return false
	}
	return x.ctx.Err() == nil
}

// faults fires the stream faults due after n token events; last marks the
// call after the final token event, where every count at or past n is due.
// writeMalformed and writeErrorEvent write the dialect's events. Faults due
// together fire in the order malformed, error-event, disconnect, hang. It
// reports false when the body must end (the error event was sent, or the
// client is gone).
func (x *exchange) faults(n int, last bool, writeMalformed, writeErrorEvent func()) bool {
	f := &x.p.fault
	due := func(at int) bool { return at == n || (last && at > n) }
	if f.malformed >= 0 && due(f.malformed) {
		writeMalformed()
		if !x.emit() {
			return false
		}
	}
	if f.errorEvent >= 0 && due(f.errorEvent) {
		writeErrorEvent()
		x.ended = true
		x.emit()
		return false
	}
	if f.disconnect >= 0 && due(f.disconnect) {
		_ = x.rc.Flush()
		x.log(http.StatusOK, outcomeAborted)
		panic(http.ErrAbortHandler)
	}
	if f.hang >= 0 && due(f.hang) {
		// Everything so far was flushed by emit; the upstream now goes
		// silent with the connection open, which only the client can end.
		<-x.ctx.Done()
		return false
	}
	return true
}

// whole answers a non-streamed request at the deadline of its last token
// event.
func (x *exchange) whole() outcome {
	if x.p.fault.hang >= 0 {
		// Nothing is written, not even the headers, until the client leaves.
		<-x.ctx.Done()
		return outcomeCanceled
	}
	// A background response is answered at once, queued: its work is
	// already done and stored.
	background := x.dialect == llm.DialectResponses && x.req.Background
	if !background {
		var at time.Time
		for k := range x.plan.events() {
			at = x.sched.deadline(k)
		}
		if x.plan.events() == 0 {
			at = x.sched.t0.Add(x.sched.ttft)
		}
		if !x.waitUntil(at) {
			return outcomeCanceled
		}
	}
	var body []byte
	switch {
	case x.dialect == llm.DialectAnthropic:
		body = x.anthropicMessage()
	case background:
		body = x.appendResponse(nil, "queued", false)
	case x.dialect == llm.DialectResponses:
		body = x.responsesObject()
		x.keep(body, false)
	default:
		body = x.openAICompletion()
	}
	f := &x.p.fault
	if f.malformed >= 0 {
		body = body[:len(body)/2]
	}
	h := x.w.Header()
	setHeaders(h, x.dialect, x.reqID, "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	x.w.WriteHeader(http.StatusOK)
	if f.disconnect >= 0 {
		_, _ = x.w.Write(body[:len(body)/2])
		_ = x.rc.Flush()
		x.log(http.StatusOK, outcomeAborted)
		panic(http.ErrAbortHandler)
	}
	if _, err := x.w.Write(body); err != nil {
		return outcomeCanceled
	}
	return outcomeCompleted
}

// log writes the request's Debug record.
func (x *exchange) log(status int, oc outcome) {
	lg := x.srv.log
	if !lg.Enabled(x.ctx, slog.LevelDebug) {
		return
	}
	names := [...]string{"completed", "canceled", "aborted", "bad_request"}
	lg.LogAttrs(x.ctx, slog.LevelDebug, "mockllm: request",
		slog.String("request_id", x.reqID),
		slog.String("route", x.route.String()),
		slog.String("model", x.req.Model),
		slog.Bool("stream", x.req.Stream),
		slog.Int("status", status),
		slog.Bool("injected", x.injected),
		slog.String("outcome", names[oc]),
		slog.Int("output_tokens", x.plan.output()),
		slog.Duration("elapsed", time.Since(x.arrival)))
}
