package mockllm

import (
	"bytes"
	"container/list"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tollgate-llm/tollgate/internal/jsonscan"
	"github.com/tollgate-llm/tollgate/llm"
)

// The stored state of the Responses API and the Conversations API, kept in
// memory so that a client (or a gateway in front of the mock) can retrieve,
// chain, resume, cancel and delete what it created, as on api.openai.com.
// Stored objects are bounded: the oldest are dropped first.

const (
	// storeCap bounds the responses, and separately the conversations,
	// the mock keeps.
	storeCap = 10000
	// storeBytes bounds the bytes they hold (bodies, objects, items),
	// again for each kind.
	storeBytes = 256 << 20
	// listLimit and listMax are the default and the largest page size of
	// the item lists.
	listLimit = 20
	listMax   = 100
)

// item is a stored input or conversation item: its id and its JSON.
type item struct {
	id  string
	raw []byte
}

// storedResponse is one response kept for GET /v1/responses/{id} and the
// routes under it.
type storedResponse struct {
	// object is the final response object, as its creation answered it
	// (or, for a background one, as it finished); cancel rewrites its
	// status.
	object []byte
	// body, p, seq and created let a background stream be sent again with
	// the same ids, timing and events.
	body       []byte
	p          params
	seq        uint64
	created    int64
	items      []item
	background bool
	stream     bool
	cancelled  bool
}

func (r *storedResponse) size() int64 {
	n := len(r.object) + len(r.body)
	for _, it := range r.items {
		n += len(it.raw)
	}
	return int64(n)
}

// conversation is one conversation of the Conversations API.
type conversation struct {
	id       string
	created  int64
	metadata []byte // a JSON object
	items    []item
}

// state holds the stored responses and conversations.
type state struct {
	mu        sync.Mutex
	responses fifo[*storedResponse]
	convs     fifo[*conversation]
}

func newState() state {
	return state{
		responses: fifo[*storedResponse]{maxLen: storeCap, maxBytes: storeBytes},
		convs:     fifo[*conversation]{maxLen: storeCap, maxBytes: storeBytes},
	}
}

// fifo is a map bounded in entries and bytes that drops its oldest entries
// first. It is not safe for concurrent use.
type fifo[T any] struct {
	maxLen   int
	maxBytes int64
	bytes    int64
	idx      map[string]*list.Element
	order    list.List // of *fifoEntry[T], oldest first
}

type fifoEntry[T any] struct {
	id   string
	size int64
	v    T
}

func (f *fifo[T]) get(id string) (T, bool) {
	e, ok := f.idx[id]
	if !ok {
		var zero T
		return zero, false
	}
	return e.Value.(*fifoEntry[T]).v, true
}

// put adds v as the newest entry, replacing any under id, and drops the
// oldest entries beyond the bounds (never the newest).
func (f *fifo[T]) put(id string, v T, size int64) {
	if f.idx == nil {
		f.idx = make(map[string]*list.Element)
	}
	if e, ok := f.idx[id]; ok {
		f.drop(e)
	}
	f.idx[id] = f.order.PushBack(&fifoEntry[T]{id: id, size: size, v: v})
	f.bytes += size
	f.evict()
}

// grow records that the entry under id now holds delta more bytes.
func (f *fifo[T]) grow(id string, delta int64) {
	e, ok := f.idx[id]
	if !ok {
		return
	}
	e.Value.(*fifoEntry[T]).size += delta
	f.bytes += delta
	f.evict()
}

func (f *fifo[T]) remove(id string) bool {
	e, ok := f.idx[id]
	if ok {
		f.drop(e)
	}
	return ok
}

func (f *fifo[T]) evict() {
	for f.order.Len() > 1 && (f.order.Len() > f.maxLen || f.bytes > f.maxBytes) {
		f.drop(f.order.Front())
	}
}

func (f *fifo[T]) drop(e *list.Element) {
	ent := f.order.Remove(e).(*fifoEntry[T])
	delete(f.idx, ent.id)
	f.bytes -= ent.size
}

// notFound is the 404 for a stored object that does not exist; param names
// the body field that referred to it, "" when the path did.
func notFound(what, id, param string) apiError {
	return apiError{status: http.StatusNotFound, typ: "invalid_request_error", param: param,
		msg: what + " with id '" + id + "' not found."}
}

// invalid is a 400 invalid_request_error.
func invalid(msg, param, code string) apiError {
	return apiError{status: http.StatusBadRequest, typ: "invalid_request_error", msg: msg, param: param, code: code}
}

// parseStored checks what a Responses request says about stored state: the
// previous response or the conversation it continues must exist, and not
// both may be named; background needs store. It also reads the input
// items, which the response and its conversation keep.
func (x *exchange) parseStored(bad func(string) (apiError, bool)) (apiError, bool) {
	req := &x.req
	if len(req.Conversation) > 0 && string(req.Conversation) != "null" {
		var ref struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(req.Conversation, &x.conv); err != nil {
			if err := json.Unmarshal(req.Conversation, &ref); err != nil || ref.ID == "" {
				return invalid("mockllm: 'conversation' must be a conversation id or an object with its id", "conversation", ""), false
			}
			x.conv = ref.ID
		}
	}
	if x.replay {
		// Sent again as it was accepted; what it named may be gone since.
		return apiError{}, true
	}
	if req.Background && !req.stores() {
		return invalid("mockllm: background mode requires 'store' to be true", "background", ""), false
	}
	if req.PreviousResponseID != "" && x.conv != "" {
		return invalid("Mutually exclusive parameters. Ensure you are only providing one of: 'previous_response_id' or 'conversation'.",
			"", "mutually_exclusive_parameters"), false
	}
	items, msg := inputItems(req.Input, x.seq)
	if msg != "" {
		e, _ := bad(msg)
		e.param = "input"
		return e, false
	}
	x.items = items
	st := &x.srv.state
	st.mu.Lock()
	_, prevOK := st.responses.get(req.PreviousResponseID)
	_, convOK := st.convs.get(x.conv)
	st.mu.Unlock()
	if x.socketMade != nil && slices.Contains(*x.socketMade, req.PreviousResponseID) {
		prevOK = true
	}
	if req.PreviousResponseID != "" && !prevOK {
		e := notFound("Previous response", req.PreviousResponseID, "previous_response_id")
		e.status, e.code = http.StatusBadRequest, "previous_response_not_found"
		return e, false
	}
	if x.conv != "" && !convOK {
		return notFound("Conversation", x.conv, "conversation"), false
	}
	return apiError{}, true
}

// keep stores a Responses request's final object (unless the request set
// "store": false) and appends its input and output items to its
// conversation (unless it failed). It runs once, before the final object is
// written, so that a client that has read the answer finds it stored.
func (x *exchange) keep(object []byte, failed bool) {
	if x.dialect != llm.DialectResponses || x.replay || x.kept {
		return
	}
	x.kept = true
	if x.socketMade != nil {
		*x.socketMade = append(*x.socketMade, x.responseID())
	}
	var out []item
	if x.conv != "" && !failed {
		out = outputItems(object)
	}
	st := &x.srv.state
	st.mu.Lock()
	defer st.mu.Unlock()
	if x.req.stores() {
		p := x.p
		// A replay repeats the answer, not the transport's faults.
		p.fault = noFault()
		p.fault.errorEvent = x.p.fault.errorEvent
		r := &storedResponse{object: object, body: x.body, p: p, seq: x.seq, created: x.created,
			items: x.items, background: x.req.Background, stream: x.req.Stream}
		st.responses.put(x.responseID(), r, r.size())
	}
	if c, ok := st.convs.get(x.conv); ok && !failed {
		st.convs.grow(c.id, c.add(x.items, out))
	}
}

// add appends items to the conversation and returns the bytes added.
func (c *conversation) add(lists ...[]item) int64 {
	var n int64
	for _, l := range lists {
		for _, it := range l {
			n += int64(len(it.raw))
		}
		c.items = append(c.items, l...)
	}
	return n
}

// outputItems reads the output items of a response object.
func outputItems(object []byte) []item {
	var r struct {
		Output []json.RawMessage `json:"output"`
	}
	if json.Unmarshal(object, &r) != nil {
		return nil
	}
	out := make([]item, 0, len(r.Output))
	for _, raw := range r.Output {
		var it struct {
			ID string `json:"id"`
		}
		_ = json.Unmarshal(raw, &it)
		out = append(out, item{id: it.ID, raw: raw})
	}
	return out
}

// inputItems reads a Responses input (or a conversation's items) as items
// with ids: a string is one user message with an input_text part; each
// element of an array is an item, a message when it has a role and no
// type. Items without an id get one from seq and their position. It
// returns a message for a 400 when the input is neither.
func inputItems(input json.RawMessage, seq uint64) ([]item, string) {
	input = bytes.TrimSpace(input)
	if len(input) == 0 || string(input) == "null" {
		return nil, ""
	}
	var text string
	if json.Unmarshal(input, &text) == nil {
		raw, _ := json.Marshal(text)
		it, msg := normalizeItem(json.RawMessage(`{"role":"user","content":`+string(raw)+`}`), seq, 0)
		return []item{it}, msg
	}
	var elems []json.RawMessage
	if json.Unmarshal(input, &elems) != nil {
		return nil, "mockllm: 'input' must be a string or an array of items"
	}
	items := make([]item, 0, len(elems))
	for k, raw := range elems {
		it, msg := normalizeItem(raw, seq, k)
		if msg != "" {
			return nil, msg
		}
		items = append(items, it)
	}
	return items, ""
}

// normalizeItem gives one input item the shape the API stores: a message's
// type, status and content parts made explicit, and an id. Its JSON starts
// with the id and type, then the other fields by name.
func normalizeItem(raw json.RawMessage, seq uint64, k int) (item, string) {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil || m == nil {
		return item{}, "mockllm: input item " + strconv.Itoa(k) + " must be an object"
	}
	var typ, id, role string
	_ = json.Unmarshal(m["type"], &typ)
	_ = json.Unmarshal(m["id"], &id)
	_ = json.Unmarshal(m["role"], &role)
	if typ == "" && role != "" {
		typ = "message"
	}
	if typ == "message" {
		var text string
		if json.Unmarshal(m["content"], &text) == nil {
			part := `[{"type":"input_text","text":`
			if role == "assistant" {
				part = `[{"type":"output_text","annotations":[],"text":`
			}
			m["content"] = json.RawMessage(string(jsonscan.AppendString([]byte(part), text)) + "}]")
		}
		if _, ok := m["status"]; !ok {
			m["status"] = json.RawMessage(`"completed"`)
		}
	}
	if id == "" {
		prefix := "item"
		switch typ {
		case "message":
			prefix = "msg"
		case "function_call":
			prefix = "fc"
		case "reasoning":
			prefix = "rs"
		}
		id = prefix + "_mock" + pad(seq) + "_" + strconv.Itoa(k)
	}
	delete(m, "id")
	delete(m, "type")
	b := jsonscan.AppendString([]byte(`{"id":`), id)
	if typ != "" {
		b = jsonscan.AppendString(append(b, `,"type":`...), typ)
	}
	keys := make([]string, 0, len(m))
	for key := range m {
		keys = append(keys, key)
	}
	slices.Sort(keys)
	for _, key := range keys {
		b = append(jsonscan.AppendString(append(b, ','), key), ':')
		b = append(b, m[key]...)
	}
	return item{id: id, raw: append(b, '}')}, ""
}

// serveStored answers the routes of stored responses and conversations. It
// reports false for any other path, which the caller answers.
func (s *Server) serveStored(w http.ResponseWriter, r *http.Request, reqID string, seq uint64, arrival time.Time, body []byte) (outcome, bool) {
	rest, ok := strings.CutPrefix(r.URL.Path, "/v1/")
	if !ok {
		return 0, false
	}
	segs := strings.Split(rest, "/")
	if slices.Contains(segs, "") {
		return 0, false
	}
	d := llm.DialectOpenAI
	// allow answers a 405 unless the method is one of methods.
	allow := func(methods ...string) bool {
		if slices.Contains(methods, r.Method) {
			return true
		}
		w.Header().Set("Allow", strings.Join(methods, ", "))
		s.reject(w, d, reqID, http.StatusMethodNotAllowed, "Method "+r.Method+" not allowed for "+r.URL.Path)
		return false
	}
	h := storedCall{s: s, w: w, r: r, reqID: reqID, seq: seq, body: body}
	n := len(segs)
	switch {
	case segs[0] == "responses" && n == 2 && segs[1] != "input_tokens" && segs[1] != "compact":
		d = llm.DialectResponses
		if !allow(http.MethodGet, http.MethodDelete) {
			return outcomeBadRequest, true
		}
		if r.Method == http.MethodDelete {
			return h.deleteResponse(segs[1]), true
		}
		return h.getResponse(segs[1], arrival), true
	case segs[0] == "responses" && n == 3 && segs[2] == "cancel":
		d = llm.DialectResponses
		if !allow(http.MethodPost) {
			return outcomeBadRequest, true
		}
		return h.cancelResponse(segs[1]), true
	case segs[0] == "responses" && n == 3 && segs[2] == "input_items":
		d = llm.DialectResponses
		if !allow(http.MethodGet) {
			return outcomeBadRequest, true
		}
		return h.listInputItems(segs[1]), true
	case segs[0] == "conversations" && n == 1:
		if !allow(http.MethodPost) {
			return outcomeBadRequest, true
		}
		return h.newConversation(), true
	case segs[0] == "conversations" && n == 2:
		if !allow(http.MethodGet, http.MethodPost, http.MethodDelete) {
			return outcomeBadRequest, true
		}
		return h.conversation(segs[1]), true
	case segs[0] == "conversations" && n == 3 && segs[2] == "items":
		if !allow(http.MethodGet, http.MethodPost) {
			return outcomeBadRequest, true
		}
		return h.conversationItems(segs[1]), true
	case segs[0] == "conversations" && n == 4 && segs[2] == "items":
		if !allow(http.MethodGet, http.MethodDelete) {
			return outcomeBadRequest, true
		}
		return h.conversationItem(segs[1], segs[3]), true
	}
	return 0, false
}

// storedCall is one request on a stored-state route.
type storedCall struct {
	s     *Server
	w     http.ResponseWriter
	r     *http.Request
	reqID string
	seq   uint64
	body  []byte
}

func (h *storedCall) ok(body []byte) outcome {
	return writeJSON(h.w, llm.DialectOpenAI, h.reqID, body)
}

func (h *storedCall) fail(e apiError) outcome {
	writeError(h.w, llm.DialectOpenAI, h.reqID, e)
	return outcomeBadRequest
}

// decode reads the JSON body into v; an empty body leaves v as it is.
func (h *storedCall) decode(v any) (apiError, bool) {
	if len(bytes.TrimSpace(h.body)) == 0 {
		return apiError{}, true
	}
	if json.Unmarshal(h.body, v) != nil {
		return invalid("We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON.)", "", ""), false
	}
	return apiError{}, true
}

// getResponse answers GET /v1/responses/{id}: the stored object, or with
// stream=true (in the query, or in a JSON body as openai-go sends it) the
// events of a background stream sent again.
func (h *storedCall) getResponse(id string, arrival time.Time) outcome {
	q := h.r.URL.Query()
	stream := false
	if v := q.Get("stream"); v != "" {
		var err error
		if stream, err = strconv.ParseBool(v); err != nil {
			return h.fail(invalid("mockllm: query stream="+v+": want a boolean", "stream", ""))
		}
	}
	var b struct {
		Stream bool `json:"stream"`
	}
	if json.Unmarshal(h.body, &b) == nil && b.Stream {
		stream = true
	}
	after := int64(-1)
	if v := q.Get("starting_after"); v != "" {
		var err error
		if after, err = strconv.ParseInt(v, 10, 64); err != nil {
			return h.fail(invalid("mockllm: query starting_after="+v+": want an integer", "starting_after", ""))
		}
	}
	st := &h.s.state
	st.mu.Lock()
	sr, found := st.responses.get(id)
	var replay storedResponse
	if found {
		replay = *sr
	}
	st.mu.Unlock()
	// Only a background stream can be streamed again; the API answers the
	// others as if they did not exist.
	if !found || (stream && !(replay.background && replay.stream)) {
		return h.fail(notFound("Response", id, ""))
	}
	if !stream {
		return h.ok(replay.object)
	}
	return h.s.replay(h.w, h.r, h.reqID, arrival, &replay, after)
}

// replay streams a stored background response's events again: the original
// body through the same code, with its sequence number (so the same ids and
// jitter), its timing from now, and its creation time; events numbered up
// to after are left out.
func (s *Server) replay(w http.ResponseWriter, r *http.Request, reqID string, arrival time.Time, sr *storedResponse, after int64) outcome {
	x := &exchange{srv: s, w: w, rc: http.NewResponseController(w), ctx: r.Context(),
		dialect: llm.DialectResponses, route: llm.RouteResponsesRetrieve, reqID: reqID, seq: sr.seq,
		arrival: arrival, p: sr.p, replay: true, skip: after}
	if e, ok := x.parseBody(sr.body); !ok { // it was accepted once; cannot happen
		writeError(w, llm.DialectOpenAI, reqID, e)
		return outcomeBadRequest
	}
	x.tool, _ = x.pickTool(sr.body) // the same answer: sr.p holds its X-Mock-Tool-Call
	defer func() {
		if x.timer != nil {
			x.timer.Stop()
		}
	}()
	x.prepare(time.Now())
	x.created = sr.created
	oc := x.streamResponses()
	x.log(http.StatusOK, oc)
	return oc
}

func (h *storedCall) deleteResponse(id string) outcome {
	st := &h.s.state
	st.mu.Lock()
	ok := st.responses.remove(id)
	st.mu.Unlock()
	if !ok {
		return h.fail(notFound("Response", id, ""))
	}
	return h.ok(deleted(id, "response"))
}

// deleted is the answer to a DELETE of an object.
func deleted(id, object string) []byte {
	b := jsonscan.AppendString([]byte(`{"id":`), id)
	return append(b, `,"object":"`+object+`","deleted":true}`...)
}

// cancelResponse answers POST /v1/responses/{id}/cancel: a background
// response ends cancelled (again the same object on a second cancel); a
// synchronous one cannot be cancelled.
func (h *storedCall) cancelResponse(id string) outcome {
	st := &h.s.state
	st.mu.Lock()
	sr, found := st.responses.get(id)
	var object []byte
	if found && sr.background {
		if !sr.cancelled {
			sr.object, sr.cancelled = withStatus(sr.object, "cancelled"), true
		}
		object = sr.object
	}
	st.mu.Unlock()
	switch {
	case !found:
		return h.fail(notFound("Response", id, ""))
	case object == nil:
		return h.fail(invalid("Cannot cancel a synchronous response.", "", ""))
	}
	return h.ok(object)
}

// withStatus returns a copy of a response object with its status replaced.
// The mock writes the object's status right after its id and created_at, so
// the first status field is the object's own.
func withStatus(object []byte, status string) []byte {
	const key = `,"status":"`
	i := bytes.Index(object, []byte(key))
	if i < 0 {
		return object
	}
	start := i + len(key)
	end := bytes.IndexByte(object[start:], '"')
	if end < 0 {
		return object
	}
	out := make([]byte, 0, len(object)+len(status))
	out = append(out, object[:start]...)
	out = append(out, status...)
	return append(out, object[start+end:]...)
}

func (h *storedCall) listInputItems(id string) outcome {
	st := &h.s.state
	st.mu.Lock()
	sr, found := st.responses.get(id)
	var items []item
	if found {
		items = sr.items
	}
	st.mu.Unlock()
	if !found {
		return h.fail(notFound("Response", id, ""))
	}
	page, e, ok := listPage(h.r.URL.Query(), items)
	if !ok {
		return h.fail(e)
	}
	return h.ok(page)
}

// listPage renders one page of items as the API's list object, read with
// the query's after, limit (1 to 100, default 20) and order ("asc" or the
// default "desc", newest first). An unknown after gives an empty page.
func listPage(q url.Values, items []item) ([]byte, apiError, bool) {
	limit := listLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		switch {
		case err != nil:
			return nil, invalid("Invalid type for 'limit': expected an integer, but got a string instead.", "limit", "invalid_type"), false
		case n < 1:
			return nil, invalid("Invalid 'limit': integer below minimum value. Expected a value >= 1, but got "+v+" instead.",
				"limit", "integer_below_min_value"), false
		case n > listMax:
			return nil, invalid("Invalid 'limit': integer above maximum value. Expected a value <= 100, but got "+v+" instead.",
				"limit", "integer_above_max_value"), false
		}
		limit = n
	}
	order := q.Get("order")
	switch order {
	case "", "desc":
		items = slices.Clone(items)
		slices.Reverse(items)
	case "asc":
	default:
		return nil, invalid("Invalid value: '"+order+"'. Supported values are: 'asc' and 'desc'.", "order", "invalid_value"), false
	}
	if after := q.Get("after"); after != "" {
		if i := slices.IndexFunc(items, func(it item) bool { return it.id == after }); i >= 0 {
			items = items[i+1:]
		} else {
			items = nil
		}
	}
	more := len(items) > limit
	if more {
		items = items[:limit]
	}
	return appendList(nil, items, more), apiError{}, true
}

// appendList appends the list object of items; first_id and last_id are
// null for an empty list.
func appendList(b []byte, items []item, more bool) []byte {
	b = append(b, `{"object":"list","data":[`...)
	for i, it := range items {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, it.raw...)
	}
	b = append(b, `],"first_id":`...)
	if len(items) == 0 {
		b = append(b, `null,"last_id":null`...)
	} else {
		b = jsonscan.AppendString(b, items[0].id)
		b = jsonscan.AppendString(append(b, `,"last_id":`...), items[len(items)-1].id)
	}
	b = append(b, `,"has_more":`...)
	b = strconv.AppendBool(b, more)
	return append(b, '}')
}

// conversationBody is the body of a conversation create or update.
type conversationBody struct {
	Items    json.RawMessage `json:"items"`
	Metadata json.RawMessage `json:"metadata"`
}

// metadata checks a metadata object as the API bounds it: at most 16
// string values, keys up to 64 and values up to 512 characters. An absent
// or null one is empty.
func metadata(raw json.RawMessage) ([]byte, apiError, bool) {
	if len(raw) == 0 || string(raw) == "null" {
		return []byte("{}"), apiError{}, true
	}
	var m map[string]string
	if err := json.Unmarshal(raw, &m); err != nil || len(m) > 16 {
		return nil, invalid("mockllm: 'metadata' must be an object of at most 16 string values", "metadata", ""), false
	}
	for k, v := range m {
		if len(k) > 64 || len(v) > 512 {
			return nil, invalid("mockllm: 'metadata' keys are at most 64 and values at most 512 characters", "metadata", ""), false
		}
	}
	return mustJSON(m), apiError{}, true
}

// newConversation answers POST /v1/conversations; the body (items,
// metadata) is optional.
func (h *storedCall) newConversation() outcome {
	var b conversationBody
	if e, ok := h.decode(&b); !ok {
		return h.fail(e)
	}
	meta, e, ok := metadata(b.Metadata)
	if !ok {
		return h.fail(e)
	}
	items, msg := inputItems(b.Items, h.seq)
	if msg != "" {
		return h.fail(invalid(msg, "items", ""))
	}
	c := &conversation{id: "conv_mock" + pad(h.seq), created: time.Now().Unix(), metadata: meta}
	size := c.add(items) + int64(len(meta))
	obj := c.object()
	st := &h.s.state
	st.mu.Lock()
	st.convs.put(c.id, c, size)
	st.mu.Unlock()
	return h.ok(obj)
}

// object is the conversation's JSON.
func (c *conversation) object() []byte {
	b := jsonscan.AppendString([]byte(`{"id":`), c.id)
	b = append(b, `,"object":"conversation","created_at":`...)
	b = strconv.AppendInt(b, c.created, 10)
	b = append(b, `,"metadata":`...)
	b = append(b, c.metadata...)
	return append(b, '}')
}

// conversation answers GET, POST (metadata update) and DELETE on
// /v1/conversations/{id}.
func (h *storedCall) conversation(id string) outcome {
	var meta []byte
	if h.r.Method == http.MethodPost {
		var b conversationBody
		if e, ok := h.decode(&b); !ok {
			return h.fail(e)
		}
		if len(b.Metadata) == 0 {
			return h.fail(invalid("Missing required parameter: 'metadata'.", "metadata", "missing_required_parameter"))
		}
		var e apiError
		var ok bool
		if meta, e, ok = metadata(b.Metadata); !ok {
			return h.fail(e)
		}
	}
	st := &h.s.state
	st.mu.Lock()
	c, found := st.convs.get(id)
	var obj []byte
	switch {
	case !found:
	case h.r.Method == http.MethodDelete:
		st.convs.remove(id)
		obj = deleted(id, "conversation.deleted")
	default:
		if meta != nil {
			st.convs.grow(id, int64(len(meta)-len(c.metadata)))
			c.metadata = meta
		}
		obj = c.object()
	}
	st.mu.Unlock()
	if !found {
		return h.fail(notFound("Conversation", id, ""))
	}
	return h.ok(obj)
}

// conversationItems answers GET (list) and POST (add) on
// /v1/conversations/{id}/items; an add answers the added items, in order.
func (h *storedCall) conversationItems(id string) outcome {
	var items []item
	if h.r.Method == http.MethodPost {
		var b conversationBody
		if e, ok := h.decode(&b); !ok {
			return h.fail(e)
		}
		if len(b.Items) == 0 {
			return h.fail(invalid("Missing required parameter: 'items'.", "items", "missing_required_parameter"))
		}
		var msg string
		if items, msg = inputItems(b.Items, h.seq); msg != "" {
			return h.fail(invalid(msg, "items", ""))
		}
	}
	st := &h.s.state
	st.mu.Lock()
	c, found := st.convs.get(id)
	var all []item
	if found {
		if h.r.Method == http.MethodPost {
			st.convs.grow(id, c.add(items))
		}
		all = c.items
	}
	st.mu.Unlock()
	if !found {
		return h.fail(notFound("Conversation", id, ""))
	}
	if h.r.Method == http.MethodPost {
		return h.ok(appendList(nil, items, false))
	}
	page, e, ok := listPage(h.r.URL.Query(), all)
	if !ok {
		return h.fail(e)
	}
	return h.ok(page)
}

// conversationItem answers GET (the item) and DELETE (which answers the
// conversation) on /v1/conversations/{id}/items/{item_id}.
func (h *storedCall) conversationItem(id, itemID string) outcome {
	st := &h.s.state
	st.mu.Lock()
	c, found := st.convs.get(id)
	var obj []byte
	itemFound := false
	if found {
		if i := slices.IndexFunc(c.items, func(it item) bool { return it.id == itemID }); i >= 0 {
			itemFound = true
			obj = c.items[i].raw
			if h.r.Method == http.MethodDelete {
				st.convs.grow(id, -int64(len(obj)))
				// A new slice: a list being written may still hold the old one.
				c.items = slices.Concat(c.items[:i], c.items[i+1:])
				obj = c.object()
			}
		}
	}
	st.mu.Unlock()
	switch {
	case !found:
		return h.fail(notFound("Conversation", id, ""))
	case !itemFound:
		return h.fail(notFound("Item", itemID, ""))
	}
	return h.ok(obj)
}
