package mockllm

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/tollgate-llm/tollgate/llm"
)

// apiError is one error answer, before it is put in a dialect's shape.
type apiError struct {
	status int
	typ    string // error.type
	code   string // OpenAI error.code; "" is null
	param  string // OpenAI error.param; "" is null
	msg    string
	// retryAfter and retryAfterMs, when set, are sent verbatim as the
	// Retry-After and retry-after-ms headers, each on its own, so a client's
	// precedence between them can be tested.
	retryAfter   string
	retryAfterMs string
}

// defaultError returns the error JSON the real API gives for status, in
// each dialect's shape and error types.
func defaultError(d llm.Dialect, status int) apiError {
	e := apiError{status: status}
	if d == llm.DialectAnthropic {
		switch status {
		case 400:
			e.typ, e.msg = "invalid_request_error", "Invalid request"
		case 401:
			e.typ, e.msg = "authentication_error", "invalid x-api-key"
		case 402:
			e.typ, e.msg = "billing_error", "Your credit balance is too low to access the Anthropic API."
		case 403:
			e.typ, e.msg = "permission_error", "Your API key does not have permission to use the specified resource."
		case 404:
			e.typ, e.msg = "not_found_error", "The requested resource could not be found."
		case 413:
			e.typ, e.msg = "request_too_large", "Request exceeds the maximum allowed number of bytes."
		case 429:
			e.typ, e.msg = "rate_limit_error", "Number of requests has exceeded your rate limit. Please try again later."
		case 500:
			e.typ, e.msg = "api_error", "Internal server error"
		case 504:
			e.typ, e.msg = "timeout_error", "Request timed out"
		case 529:
			e.typ, e.msg = "overloaded_error", "Overloaded"
		default:
			if status < 500 {
				e.typ, e.msg = "invalid_request_error", http.StatusText(status)
			} else {
				e.typ, e.msg = "api_error", "Internal server error"
			}
		}
		return e
	}
	switch status {
	case 401:
		e.typ, e.code, e.msg = "invalid_request_error", "invalid_api_key", "Incorrect API key provided."
	case 404:
		e.typ, e.code, e.msg = "invalid_request_error", "model_not_found", "The model does not exist or you do not have access to it."
	case 429:
		e.typ, e.code, e.msg = "requests", "rate_limit_exceeded", "Rate limit reached for requests. Please try again in 1s."
	case 500:
		e.typ, e.msg = "server_error", "The server had an error processing your request. Sorry about that! You can retry your request, or contact us through our help center if the error persists."
	case 503:
		e.typ, e.msg = "server_error", "The engine is currently overloaded, please try again later."
	default:
		if status < 500 {
			e.typ, e.msg = "invalid_request_error", http.StatusText(status)
		} else {
			e.typ, e.msg = "server_error", "The server had an error processing your request."
		}
	}
	return e
}

type openAIErrorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

type anthropicErrorBody struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
	RequestID string `json:"request_id,omitempty"`
}

// errorJSON renders e in the dialect's shape. reqID is only used by
// Anthropic, whose error bodies carry it (mid-stream error events do not).
func errorJSON(d llm.Dialect, e apiError, reqID string) []byte {
	var v any
	if d == llm.DialectAnthropic {
		var b anthropicErrorBody
		b.Type = "error"
		b.Error.Type, b.Error.Message = e.typ, e.msg
		b.RequestID = reqID
		v = b
	} else {
		var b openAIErrorBody
		b.Error.Message, b.Error.Type = e.msg, e.typ
		if e.param != "" {
			b.Error.Param = &e.param
		}
		if e.code != "" {
			b.Error.Code = &e.code
		}
		v = b
	}
	out, err := json.Marshal(v)
	if err != nil { // cannot happen for these types
		panic("mockllm: marshal error body: " + err.Error())
	}
	return out
}

// setHeaders sets the headers every response carries.
func setHeaders(h http.Header, d llm.Dialect, reqID, contentType string) {
	h.Set("Content-Type", contentType)
	h.Set("Cache-Control", "no-cache")
	if d == llm.DialectAnthropic {
		h.Set("request-id", reqID)
	} else {
		h.Set("x-request-id", reqID)
	}
}

// writeError writes e in the dialect's shape, with its retry hints.
func writeError(w http.ResponseWriter, d llm.Dialect, reqID string, e apiError) {
	body := errorJSON(d, e, reqID)
	h := w.Header()
	setHeaders(h, d, reqID, "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	if e.retryAfter != "" {
		h.Set("Retry-After", e.retryAfter)
	}
	if e.retryAfterMs != "" {
		h.Set("Retry-After-Ms", e.retryAfterMs)
	}
	w.WriteHeader(e.status)
	_, _ = w.Write(body) // a client that left is not our concern here
}

// reject answers a request the mock refuses before generating; msg, when
// set, replaces the default message.
func (s *Server) reject(w http.ResponseWriter, d llm.Dialect, reqID string, status int, msg string) outcome {
	e := defaultError(d, status)
	if msg != "" {
		e.msg = msg
	}
	writeError(w, d, reqID, e)
	return outcomeBadRequest
}

// badRequest answers 400 invalid_request_error with msg.
func (s *Server) badRequest(w http.ResponseWriter, d llm.Dialect, reqID, msg string) outcome {
	return s.reject(w, d, reqID, http.StatusBadRequest, msg)
}
