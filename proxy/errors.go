package proxy

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/ratelimit"
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

// errMissingKey refuses a request that presented no key where one is
// required.
func errMissingKey() *apiError {
	return errUnauthorized("missing API key: send \"Authorization: Bearer <key>\" or \"x-api-key: <key>\"")
}

// errMalformedAuth refuses an Authorization header that is not a bearer
// credential, when no gateway key in x-api-key makes it moot.
func errMalformedAuth() *apiError {
	return errUnauthorized("malformed Authorization header: expected \"Bearer <key>\"")
}

// errUnknownKey refuses a key that is not one of [[keys]], named by its
// id (credential.id), which the operators find in the access log.
func errUnknownKey(id string) *apiError {
	return errUnauthorized("invalid API key (id " + id + "): it is not one of this gateway's keys")
}

// errConflictingKeys refuses two different gateway keys, one in each
// header, named by their ids: the gateway cannot tell which is meant.
func errConflictingKeys(bearerID, apiKeyID string) *apiError {
	return errUnauthorized("conflicting API keys: Authorization carries gateway key id " + bearerID +
		" and x-api-key gateway key id " + apiKeyID + "; send one key, or the same key in both headers")
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

var limitNames = [...]string{
	ratelimit.KindRPM:          "requests per minute (RPM)",
	ratelimit.KindTPM:          "tokens per minute (TPM)",
	ratelimit.KindConcurrency:  "concurrent requests",
	ratelimit.KindTokensPerDay: "tokens per day",
	ratelimit.KindCostPerDay:   "cost per day",
	ratelimit.KindCostPerMonth: "cost per month",
}

// errRateLimited phrases a refusal. A rate or concurrency limit is a
// rate_limit_exceeded the caller should retry after RetryAfter, and so is a
// budget that requests in flight hold (it frees as they end, and its message
// gives what is used and what is reserved apart); a spent budget is not a
// rate limit and says when it renews.
func errRateLimited(dec ratelimit.Decision, who string, now time.Time) *apiError {
	st := dec.Refused
	name := "limit"
	if int(st.Kind) < len(limitNames) {
		name = limitNames[st.Kind]
	}
	wait := dec.RetryAfter.Round(time.Millisecond).String()
	if st.Kind.Budget() {
		amount := usd
		if st.Kind == ratelimit.KindTokensPerDay {
			amount = func(n int64) string { return strconv.FormatInt(n, 10) }
		}
		used, limit := amount(st.Used), amount(st.Limit)
		if !st.Spent() {
			return &apiError{Status: http.StatusTooManyRequests, Kind: "tokens", Code: "rate_limit_exceeded",
				AnthropicKind: "rate_limit_error",
				Msg: "Budget held by requests in flight for " + who + " on " + name + ": Limit " + limit +
					", Used " + used + ", Reserved " + amount(st.Reserved) +
					". It is not spent: what those requests do not use comes back as they end. Please try again in " +
					wait + "."}
		}
		window := "day"
		if st.Kind == ratelimit.KindCostPerMonth {
			window = "month"
		}
		// Windows end on whole seconds (UTC midnights); rounding hides the
		// microseconds between the limiter's clock and this one.
		renews := now.Add(dec.RetryAfter).UTC().Round(time.Second).Format(time.RFC3339)
		return &apiError{Status: http.StatusTooManyRequests, Kind: "insufficient_quota", Code: "insufficient_quota",
			AnthropicKind: "rate_limit_error",
			Msg: "Budget spent for " + who + " on " + name + ": Limit " + limit + ", Used " + used +
				". This is a budget, not a rate limit: retrying will not succeed before it renews with the next UTC " +
				window + " at " + renews + "."}
	}
	kind := "requests"
	if st.Kind == ratelimit.KindTPM {
		kind = "tokens"
	}
	msg := "Rate limit reached for " + who + " on " + name + ": Limit " + strconv.FormatInt(st.Limit, 10) +
		", Used " + strconv.FormatInt(st.Used, 10) + ". Please try again in " + wait + "."
	return &apiError{Status: http.StatusTooManyRequests, Kind: kind, Code: "rate_limit_exceeded",
		AnthropicKind: "rate_limit_error", Msg: msg}
}

// usd renders micro-dollars as dollars with cents ("$12.50"), or with
// micro-dollar precision when cents would hide it.
func usd(micros int64) string {
	s := strconv.FormatFloat(float64(micros)/1e6, 'f', 6, 64)
	s = strings.TrimRight(s, "0")
	if i := strings.IndexByte(s, '.'); i >= 0 && len(s)-i-1 < 2 {
		s += strings.Repeat("0", 2-(len(s)-i-1))
	}
	return "$" + s
}

func errModelNotAllowed(team, model string) *apiError {
	return &apiError{Status: http.StatusForbidden, Kind: "invalid_request_error", Code: "model_not_allowed",
		AnthropicKind: "permission_error", Param: "model",
		Msg: "team " + strconv.Quote(team) + " may not use model " + strconv.Quote(model)}
}

func errUnmetered(path, why string) *apiError {
	return &apiError{Status: http.StatusBadRequest, Kind: "invalid_request_error", Code: "unmetered_request",
		AnthropicKind: "invalid_request_error",
		Msg:           "this gateway meters every request of a governed key, and cannot meter this one on " + path + ": " + why}
}

func errNotWithGatewayKeys(method, path string) *apiError {
	return &apiError{Status: http.StatusForbidden, Kind: "invalid_request_error", Code: "not_available",
		AnthropicKind: "permission_error",
		Msg: method + " " + path + " is not available with this gateway's keys: it would reach resources shared by " +
			"every key of the upstream account (only model requests, GET /v1/models, count_tokens and the team's own " +
			"stored responses and conversations are)"}
}

func errCaseVariant(key, field string) *apiError {
	return &apiError{Status: http.StatusBadRequest, Kind: "invalid_request_error", Code: "ambiguous_field",
		AnthropicKind: "invalid_request_error", Param: field,
		Msg: "field " + strconv.Quote(key) + " differs from " + strconv.Quote(field) +
			" only in case; the gateway cannot tell which one the upstream reads"}
}

func errUnpricedModel(who, model string) *apiError {
	return &apiError{Status: http.StatusForbidden, Kind: "invalid_request_error", Code: "model_not_priced",
		AnthropicKind: "permission_error", Param: "model",
		Msg: who + " has a cost budget, and model " + strconv.Quote(model) +
			" has no price in this gateway's [[models]]; its cost could not be counted"}
}

func errLimiterUnavailable() *apiError {
	return &apiError{Status: http.StatusServiceUnavailable, Kind: "server_error", Code: "rate_limiter_unavailable",
		AnthropicKind: "api_error",
		Msg:           "the gateway cannot check rate limits right now (on_redis_error = \"deny\"); retry shortly"}
}

// quoteID bounds an id quoted back in an error message.
func quoteID(id string) string {
	if len(id) > 128 {
		id = id[:128] + "..."
	}
	return "'" + id + "'"
}

func errStoredNotFound(kind storedKind, id, param string) *apiError {
	e := &apiError{Status: http.StatusNotFound, Kind: "invalid_request_error", AnthropicKind: "not_found_error",
		Param: param}
	switch {
	case param == "previous_response_id":
		e.Code = "previous_response_not_found"
		e.Msg = "Previous response with id " + quoteID(id) + " not found."
	case kind == storedResponse:
		e.Msg = "Response with id " + quoteID(id) + " not found."
	default:
		e.Msg = "Conversation with id " + quoteID(id) + " not found."
	}
	return e
}

func errStoredIDConflict() *apiError {
	return &apiError{Status: http.StatusBadGateway, Kind: "server_error", Code: "stored_id_conflict",
		AnthropicKind: "api_error", Msg: "the upstream answered with the id of a stored object that another team owns; " +
			"the answer was withheld. Retry the request"}
}

func errOwnershipUnavailable() *apiError {
	return &apiError{Status: http.StatusServiceUnavailable, Kind: "server_error", Code: "ownership_unavailable",
		AnthropicKind: "api_error",
		Msg:           "the gateway cannot check who owns stored responses and conversations right now; retry shortly"}
}

func errNonCanonicalPath(why string) *apiError {
	return &apiError{Status: http.StatusBadRequest, Kind: "invalid_request_error", Code: "invalid_path",
		AnthropicKind: "invalid_request_error",
		Msg:           "the request path is not canonical, so the gateway does not pass it on: " + why}
}

func errHeadersTooLarge(limit int) *apiError {
	return &apiError{Status: http.StatusRequestHeaderFieldsTooLarge, Kind: "invalid_request_error",
		Code: "headers_too_large", AnthropicKind: "invalid_request_error",
		Msg: "the request headers are larger than this gateway accepts (" + strconv.Itoa(limit) + " bytes)"}
}

// quoteHeader quotes a header value for an error message, bounded.
func quoteHeader(v string) string {
	if len(v) > 128 {
		v = v[:128] + "..."
	}
	return strconv.Quote(v)
}

// errUnsupportedEncoding refuses a body whose Content-Encoding (enc, as
// sent) the gateway cannot undo, and so cannot read (RFC 9110 §15.5.16).
func errUnsupportedEncoding(enc, why string) *apiError {
	return &apiError{Status: http.StatusUnsupportedMediaType, Kind: "invalid_request_error",
		Code: "unsupported_content_encoding", AnthropicKind: "invalid_request_error",
		Msg: "Content-Encoding " + quoteHeader(enc) + " is not supported (" + why + "): send the body uncompressed, " +
			"or compressed with one of " + supportedCodings}
}

// errTooLargeDecoded refuses a body that decodes past the limit.
func errTooLargeDecoded(limit int64, enc string) *apiError {
	e := errTooLarge(limit)
	e.Msg += " once decoded (Content-Encoding " + quoteHeader(enc) + ")"
	return e
}

// errUndecodable refuses a body that is not valid data of its coding c;
// why is the decoder's error, which names no byte of the body.
func errUndecodable(c, enc, why string) *apiError {
	return &apiError{Status: http.StatusBadRequest, Kind: "invalid_request_error", Code: "invalid_content_encoding",
		AnthropicKind: "invalid_request_error",
		Msg:           "the request body is not valid " + c + " data (Content-Encoding " + quoteHeader(enc) + "): " + why}
}
