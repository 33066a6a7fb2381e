package agents_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
)

// The recorder reads the token usage each agent was sent, from the bytes
// it relayed to the agent, so that the ledger can be held to it: what the
// gateway bills a key is what its agent was told it used. The reading here
// is the wire formats' own (an independent reading, not the gateway's
// parser): a whole answer's usage, an SSE stream's final usage, or each
// response.completed on a WebSocket.

// tapLimit bounds what the recorder keeps of one answer: an agent's answer
// from the fake upstream is a few KiB.
const tapLimit = 8 << 20

// usage is the usage an agent was sent: answers that reported one, and
// their input (cached and cache-written tokens included, as the ledger
// counts them) and output tokens.
type usage struct {
	answers, input, output int64
}

func (u *usage) add(o usage) {
	u.answers += o.answers
	u.input += o.input
	u.output += o.output
}

func (u usage) String() string {
	return fmt.Sprintf("%d answers, %d input + %d output tokens", u.answers, u.input, u.output)
}

// tap keeps a copy of the bytes read through it, up to tapLimit.
type tap struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	over bool
}

func (t *tap) keep(p []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.buf.Len()+len(p) > tapLimit {
		t.over = true
		return
	}
	t.buf.Write(p)
}

func (t *tap) bytes() ([]byte, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.over {
		return nil, fmt.Errorf("the answer is over %d bytes", tapLimit)
	}
	return bytes.Clone(t.buf.Bytes()), nil
}

// tappedBody is an answer's body read through a tap.
type tappedBody struct {
	io.ReadCloser
	t *tap
}

func (b tappedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.t.keep(p[:n])
	return n, err
}

// tappedConn is an upgraded connection to the gateway whose reads (the
// gateway's frames to the agent) go through a tap. The reverse proxy needs
// the body of a 101 to be an io.ReadWriteCloser.
type tappedConn struct {
	io.ReadWriteCloser
	t *tap
}

func (c tappedConn) Read(p []byte) (int, error) {
	n, err := c.ReadWriteCloser.Read(p)
	c.t.keep(p[:n])
	return n, err
}

// tapAnswer puts a tap on an answer whose usage the agent is sent: a model
// call's 200 over HTTP, or a WebSocket's 101. It returns nil for any other.
func tapAnswer(resp *http.Response) *tap {
	req := resp.Request
	switch {
	case resp.StatusCode == http.StatusSwitchingProtocols:
		conn, ok := resp.Body.(io.ReadWriteCloser)
		if !ok {
			return nil
		}
		t := &tap{}
		resp.Body = tappedConn{conn, t}
		return t
	case resp.StatusCode == http.StatusOK && req.Method == http.MethodPost && modelPaths[req.URL.Path]:
		t := &tap{}
		resp.Body = tappedBody{resp.Body, t}
		return t
	}
	return nil
}

// usageOf reads the usage in an answer the recorder tapped, by its form.
func usageOf(resp *http.Response, body []byte) (usage, error) {
	if enc := resp.Header.Get("Content-Encoding"); enc != "" && enc != "identity" {
		return usage{}, fmt.Errorf("the answer is %s-encoded", enc)
	}
	switch ct := resp.Header.Get("Content-Type"); {
	case resp.StatusCode == http.StatusSwitchingProtocols:
		return socketUsage(body)
	case strings.HasPrefix(ct, "text/event-stream"):
		return streamUsage(body)
	default:
		var u usage
		var in, out int64
		ok, err := answerUsage(body, &in, &out)
		if ok {
			u = usage{answers: 1, input: in, output: out}
		}
		return u, err
	}
}

// streamUsage reads an SSE stream's usage: its data lines are events, and
// the stream is one answer.
func streamUsage(body []byte) (usage, error) {
	var in, out int64
	seen := false
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 64<<10), tapLimit)
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data:"))
		if !ok {
			continue
		}
		data = bytes.TrimSpace(data)
		if len(data) == 0 || data[0] != '{' {
			continue // [DONE]
		}
		got, err := eventUsage(data, &in, &out)
		if err != nil {
			return usage{}, err
		}
		seen = seen || got
	}
	if err := sc.Err(); err != nil {
		return usage{}, err
	}
	if !seen {
		return usage{}, nil
	}
	return usage{answers: 1, input: in, output: out}, nil
}

// socketUsage reads the frames a WebSocket's server sent (RFC 6455 5.2:
// unmasked, no extension negotiated through the gateway): each text
// message is a Responses event, and each response.completed (or
// incomplete, failed) one answer.
func socketUsage(stream []byte) (usage, error) {
	var u usage
	var msg []byte
	for len(stream) > 0 {
		if len(stream) < 2 {
			return u, errors.New("a truncated frame header")
		}
		fin, op, n := stream[0]&0x80 != 0, stream[0]&0x0f, int64(stream[1]&0x7f)
		if stream[0]&0x70 != 0 || stream[1]&0x80 != 0 {
			return u, errors.New("a frame with RSV bits or a mask from the server")
		}
		hdr := 2
		switch n {
		case 126:
			if len(stream) < 4 {
				return u, errors.New("a truncated frame header")
			}
			n, hdr = int64(binary.BigEndian.Uint16(stream[2:])), 4
		case 127:
			if len(stream) < 10 {
				return u, errors.New("a truncated frame header")
			}
			n, hdr = int64(binary.BigEndian.Uint64(stream[2:])), 10
		}
		if n > int64(len(stream)-hdr) {
			return u, nil // the connection ended inside a frame: nothing more was delivered whole
		}
		payload := stream[hdr : int64(hdr)+n]
		stream = stream[int64(hdr)+n:]
		switch op {
		case 0x1, 0x0: // text, continuation (pings, pongs and close carry no usage)
			msg = append(msg, payload...)
			if !fin {
				continue
			}
			var in, out int64
			got, err := eventUsage(msg, &in, &out)
			if err != nil {
				return u, err
			}
			if got {
				u.add(usage{answers: 1, input: in, output: out})
			}
			msg = msg[:0]
		}
	}
	return u, nil
}

// wireUsage is a usage object in any of the three dialects.
type wireUsage struct {
	PromptTokens     *int64 `json:"prompt_tokens"`     // Chat Completions
	CompletionTokens *int64 `json:"completion_tokens"` // Chat Completions
	InputTokens      *int64 `json:"input_tokens"`      // Messages, Responses
	OutputTokens     *int64 `json:"output_tokens"`     // Messages, Responses
	CacheRead        int64  `json:"cache_read_input_tokens"`
	CacheWrite       int64  `json:"cache_creation_input_tokens"`
}

// read puts what u reports into in and out: Anthropic's input is its
// input_tokens plus the cache's, the others' includes them already.
func (u *wireUsage) read(in, out *int64) bool {
	got := false
	switch {
	case u.PromptTokens != nil:
		*in, got = *u.PromptTokens, true
	case u.InputTokens != nil:
		*in, got = *u.InputTokens+u.CacheRead+u.CacheWrite, true
	}
	switch {
	case u.CompletionTokens != nil:
		*out, got = *u.CompletionTokens, true
	case u.OutputTokens != nil:
		*out, got = *u.OutputTokens, true
	}
	return got
}

// eventUsage reads the usage a streamed event reports, if any: a Chat
// Completions chunk's usage, Anthropic's message_start (input) and
// message_delta (cumulative counts), a Responses terminal event's
// response.usage. A later report replaces an earlier one.
func eventUsage(data []byte, in, out *int64) (bool, error) {
	var ev struct {
		Type     string                      `json:"type"`
		Object   string                      `json:"object"`
		Usage    *wireUsage                  `json:"usage"`
		Message  *struct{ Usage *wireUsage } `json:"message"`
		Response *struct{ Usage *wireUsage } `json:"response"`
	}
	if err := json.Unmarshal(data, &ev); err != nil {
		return false, fmt.Errorf("an event that is not JSON: %v", err)
	}
	switch ev.Type {
	case "message_start":
		return ev.Message != nil && ev.Message.Usage != nil && ev.Message.Usage.read(in, out), nil
	case "message_delta":
		return ev.Usage != nil && ev.Usage.read(in, out), nil
	case "response.completed", "response.incomplete", "response.failed":
		return ev.Response != nil && ev.Response.Usage != nil && ev.Response.Usage.read(in, out), nil
	}
	if ev.Object == "chat.completion.chunk" && ev.Usage != nil {
		return ev.Usage.read(in, out), nil
	}
	return false, nil
}

// answerUsage reads a whole (non-streamed) answer's top-level usage.
func answerUsage(body []byte, in, out *int64) (bool, error) {
	var a struct {
		Usage *wireUsage `json:"usage"`
	}
	if err := json.Unmarshal(body, &a); err != nil {
		return false, fmt.Errorf("an answer that is not JSON: %v", err)
	}
	return a.Usage != nil && a.Usage.read(in, out), nil
}

// sessionReport is what checkSession reads of GET /admin/conversations/{id}.
type sessionReport struct {
	Turns      int64 `json:"turns"`
	CostMicros int64 `json:"cost_micros"`
	Session    struct {
		Classes map[string]struct {
			Calls int64 `json:"calls"`
		} `json:"classes"`
		Agents []struct {
			Type string `json:"type"`
		} `json:"agents"`
	} `json:"session"`
}

// session returns the figures of the session id names, as the admin API
// has them: in mode keys the session is the agents team's.
func (s *stack) session(id, mode string) (sessionReport, error) {
	u := s.gateway + "/admin/conversations/" + url.PathEscape(id)
	if mode == "keys" {
		u += "?team=" + team
	}
	var rep sessionReport
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		return rep, err
	}
	req.Header.Set("Authorization", "Bearer "+s.adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return rep, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return rep, fmt.Errorf("%d %s", resp.StatusCode, b)
	}
	return rep, json.NewDecoder(resp.Body).Decode(&rep)
}

// ledger returns what the gateway's spend ledger holds for keyID, from
// GET /admin/spend, as usage.
func (s *stack) ledger(keyID string) (usage, error) {
	req, err := http.NewRequest(http.MethodGet, s.gateway+"/admin/spend?key="+url.QueryEscape(keyID), nil)
	if err != nil {
		return usage{}, err
	}
	req.Header.Set("Authorization", "Bearer "+s.adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return usage{}, err
	}
	defer resp.Body.Close()
	var rep struct {
		Total struct {
			Requests     int64 `json:"requests"`
			InputTokens  int64 `json:"input_tokens"`
			OutputTokens int64 `json:"output_tokens"`
		} `json:"total"`
		Partial bool `json:"partial"`
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return usage{}, fmt.Errorf("GET /admin/spend: %d %s", resp.StatusCode, b)
	}
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
		return usage{}, err
	}
	if rep.Partial {
		return usage{}, errors.New("GET /admin/spend says its answer is partial")
	}
	return usage{answers: rep.Total.Requests, input: rep.Total.InputTokens, output: rep.Total.OutputTokens}, nil
}
