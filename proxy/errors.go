package proxy

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/tollgate-llm/tollgate/llm"
)

// apiError is an error the gateway itself answers with, in the caller's
// dialect. Msg is safe to show the caller; it never holds a key or a body.
type apiError struct {
	Status int
	// Kind is the OpenAI error type ("invalid_request_error", "server_error", ...).
	Kind string
	// Code is the OpenAI error code (may be empty).
	Code string
	// AnthropicKind is the Anthropic error type ("invalid_request_error",
	// "authentication_error", "not_found_error", "request_too_large",
	// "api_error", "timeout_error", ...).
	AnthropicKind string
	Msg           string
	Param         string
}

func (e *apiError) Error() string { return "proxy: " + strconv.Itoa(e.Status) + " " + e.Msg }

func errBadRequest(msg, param string) *apiError {
	return &apiError{Status: http.StatusBadRequest, Kind: "invalid_request_error",
		AnthropicKind: "invalid_request_error", Msg: msg, Param: param}
}

func errUnauthorized(msg string) *apiError {
	return &apiError{Status: http.StatusUnauthorized, Kind: "invalid_request_error", Code: "invalid_api_key",
		AnthropicKind: "authentication_error", Msg: msg}
}

func errTooLarge(limit int64) *apiError {
	return &apiError{Status: http.StatusRequestEntityTooLarge, Kind: "invalid_request_error", Code: "request_too_large",
		AnthropicKind: "request_too_large",
		Msg:           "request body exceeds the gateway's limit of " + strconv.FormatInt(limit, 10) + " bytes"}
}

func errNotFound(path string) *apiError {
	return &apiError{Status: http.StatusNotFound, Kind: "invalid_request_error", Code: "unknown_url",
		AnthropicKind: "not_found_error", Msg: "unknown route " + strconv.Quote(path)}
}

func errNoUpstream(d llm.Dialect) *apiError {
	return &apiError{Status: http.StatusNotFound, Kind: "invalid_request_error", Code: "no_upstream",
		AnthropicKind: "not_found_error", Msg: "no upstream is configured for the " + d.String() + " API"}
}

func errUpstreamUnreachable() *apiError {
	return &apiError{Status: http.StatusBadGateway, Kind: "server_error", Code: "upstream_unreachable",
		AnthropicKind: "api_error", Msg: "the gateway could not reach the upstream"}
}

func errUpstreamFailed() *apiError {
	return &apiError{Status: http.StatusBadGateway, Kind: "server_error", Code: "upstream_error",
		AnthropicKind: "api_error", Msg: "the upstream request failed"}
}

func errShuttingDown() *apiError {
	return &apiError{Status: http.StatusServiceUnavailable, Kind: "server_error", Code: "gateway_shutting_down",
		AnthropicKind: "overloaded_error", Msg: "the gateway is shutting down; retry the request"}
}

func errUpstreamTimeout() *apiError {
	return &apiError{Status: http.StatusGatewayTimeout, Kind: "server_error", Code: "upstream_timeout",
		AnthropicKind: "timeout_error", Msg: "the upstream did not answer in time"}
}

type openAIErrorBody struct {
	Error openAIError `json:"error"`
}

type openAIError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

type anthropicErrorBody struct {
	Type      string         `json:"type"`
	Error     anthropicError `json:"error"`
	RequestID string         `json:"request_id,omitempty"`
}

type anthropicError struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// body renders the error in dialect d (OpenAI's shape for DialectNone).
func (e *apiError) body(d llm.Dialect, requestID string) []byte {
	var v any
	if d == llm.DialectAnthropic {
		v = anthropicErrorBody{Type: "error", Error: anthropicError{Type: e.AnthropicKind, Message: e.Msg},
			RequestID: requestID}
	} else {
		oe := openAIError{Message: e.Msg, Type: e.Kind}
		if e.Param != "" {
			oe.Param = &e.Param
		}
		if e.Code != "" {
			oe.Code = &e.Code
		}
		v = openAIErrorBody{Error: oe}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)              // messages quote things like "Bearer <key>"; keep them readable
	if err := enc.Encode(v); err != nil { // cannot happen for these types
		return []byte(`{"error":{"message":"internal error","type":"server_error","param":null,"code":null}}` + "\n")
	}
	return buf.Bytes()
}

// writeError sends e to the client in dialect d and returns the bytes written.
func writeError(w http.ResponseWriter, d llm.Dialect, requestID string, e *apiError) int {
	b := e.body(d, requestID)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(e.Status)
	n, _ := w.Write(b)
	return n
}
