package mockllm

import (
	"bytes"
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/tollgate-llm/tollgate/internal/jsonscan"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/sseparse"
)

// The Responses API's WebSocket mode (GET /v1/responses with Upgrade:
// websocket), as api.openai.com speaks it: the client sends each turn as a
// response.create text message (the POST /v1/responses body at the top
// level, stream implied), the server answers with the same events as the
// SSE stream, one JSON object per text message (no event: line, no [DONE]),
// and a turn the server refuses is an error event carrying its status,
// after which the socket stays open. Turns are answered one at a time, in
// order (the default lane); a message of another type gets an error event.

// isSocketUpgrade reports whether r asks to open a WebSocket.
func isSocketUpgrade(r *http.Request) bool {
	return r.Method == http.MethodGet && strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
}

// serveSocket runs one client's socket until it closes. Each turn counts as
// a request in Stats and Requests.
func (s *Server) serveSocket(w http.ResponseWriter, r *http.Request) {
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		return // Accept answered the failed handshake
	}
	c.SetReadLimit(maxBody)
	// Messages are read on their own goroutine, so that a socket closed
	// mid-turn cancels the turn (ctx) as a closed connection cancels a
	// POST's.
	ctx, cancel := context.WithCancel(r.Context())
	msgs := make(chan socketMessage, 16)
	go func() {
		defer close(msgs)
		defer cancel()
		for {
			typ, msg, err := c.Read(ctx)
			if err != nil {
				return
			}
			select {
			case msgs <- socketMessage{typ, msg}:
			case <-ctx.Done():
				return
			}
		}
	}()
	defer func() {
		cancel()
		c.CloseNow()
		for range msgs { // the reader has ended
		}
	}()
	var made []string
	for m := range msgs {
		if !s.serveSocketMessage(ctx, c, r, m.typ, m.msg, &made) {
			return
		}
	}
}

// socketMessage is a message read from a socket.
type socketMessage struct {
	typ websocket.MessageType
	msg []byte
}

// serveSocketMessage answers one client message; false when the socket
// must be dropped (the disconnect fault).
func (s *Server) serveSocketMessage(ctx context.Context, c *websocket.Conn, r *http.Request,
	typ websocket.MessageType, msg []byte, made *[]string) (ok bool) {
	arrival := time.Now()
	seq := s.seq.Add(1)
	reqID := "req_mock" + pad(seq)
	sw := &socketWriter{c: c, ctx: ctx, h: http.Header{}}
	if typ != websocket.MessageText || socketEventType(msg) != "response.create" {
		sw.WriteHeader(http.StatusBadRequest)
		_, _ = sw.Write(errorJSON(llm.DialectResponses, apiError{status: http.StatusBadRequest,
			typ: "invalid_request_error", code: "unknown_event",
			msg: "mockllm: only response.create is answered on this socket"}, reqID))
		return true
	}
	s.update(func(st *Stats) { st.Requests++ })
	s.record(r, msg, arrival)
	oc := outcomeAborted
	defer func() {
		s.finish(oc)
		if p := recover(); p != nil {
			if p != http.ErrAbortHandler {
				panic(p)
			}
			ok = false // the disconnect fault: the socket is cut
		}
	}()
	x := &exchange{srv: s, w: sw, rc: http.NewResponseController(sw), ctx: ctx,
		dialect: llm.DialectResponses, route: llm.RouteResponses, reqID: reqID, seq: seq, arrival: arrival,
		socket: true, socketMade: made}
	oc = x.serve(r, msg)
	return true
}

// socketEventType returns a client message's type, "" when it has none.
func socketEventType(msg []byte) string {
	obj, ok := jsonscan.Value(msg)
	if !ok {
		return ""
	}
	v, ok := jsonscan.Get(obj, "type")
	if !ok {
		return ""
	}
	t, _ := jsonscan.String(v)
	return string(t)
}

// socketWriter turns the answer the mock writes for a POST into socket
// messages: each SSE event's data as one text message; an error answer
// (status 400 or more, one JSON body) as one error event with the status,
// and its Retry-After and x-ratelimit headers under "headers".
type socketWriter struct {
	c      *websocket.Conn
	ctx    context.Context
	h      http.Header
	status int
	fr     *sseparse.Framer
	mu     sync.Mutex
}

func (sw *socketWriter) Header() http.Header { return sw.h }

func (sw *socketWriter) WriteHeader(status int) {
	if sw.status == 0 {
		sw.status = status
	}
}

// Flush is a no-op: every message is sent as it is written.
func (sw *socketWriter) Flush() {}

func (sw *socketWriter) Write(p []byte) (int, error) {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	if sw.status == 0 {
		sw.status = http.StatusOK
	}
	if sw.status >= 400 {
		return len(p), sw.c.Write(sw.ctx, websocket.MessageText, sw.errorEvent(p))
	}
	if sw.fr == nil {
		sw.fr = sseparse.NewFramer(maxBody)
	}
	// The mock writes whole events; a partial line left at the end (the
	// malformed fault's) is sent as it is, a broken message.
	rest := p
	for len(rest) > 0 {
		n, _, err := sw.fr.Push(rest)
		if err != nil {
			return 0, err
		}
		if ev := sw.fr.Event(); ev != nil {
			if err := sw.c.Write(sw.ctx, websocket.MessageText, ev.Data); err != nil {
				return 0, err
			}
		}
		if n == 0 {
			return len(p), sw.c.Write(sw.ctx, websocket.MessageText, rest)
		}
		rest = rest[n:]
	}
	return len(p), nil
}

// errorEvent wraps an error body ({"error":{...}}) as the socket's error
// event: {"type":"error","status":N,"error":{...},"headers":{...}}.
func (sw *socketWriter) errorEvent(body []byte) []byte {
	b := []byte(`{"type":"error","status":`)
	b = strconv.AppendInt(b, int64(sw.status), 10)
	if rest, ok := bytes.CutPrefix(bytes.TrimSpace(body), []byte("{")); ok {
		b = append(b, ',')
		b = append(b, bytes.TrimSuffix(bytes.TrimSpace(rest), []byte("}"))...)
	}
	var hs []byte
	for _, k := range []string{"Retry-After", "Retry-After-Ms", "X-Ratelimit-Remaining-Requests"} {
		if v := sw.h.Get(k); v != "" {
			if len(hs) > 0 {
				hs = append(hs, ',')
			}
			hs = jsonscan.AppendString(hs, strings.ToLower(k))
			hs = append(hs, ':')
			hs = jsonscan.AppendString(hs, v)
		}
	}
	if len(hs) > 0 {
		b = append(b, `,"headers":{`...)
		b = append(b, hs...)
		b = append(b, '}')
	}
	return append(b, '}')
}
