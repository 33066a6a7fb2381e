package mockllm

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/tollgate-llm/tollgate/llm"
)

// serveCountTokens answers POST /v1/messages/count_tokens.
func (s *Server) serveCountTokens(w http.ResponseWriter, reqID string, body []byte) outcome {
	var req struct {
		Model string `json:"model"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return s.badRequest(w, llm.DialectAnthropic, reqID, "mockllm: invalid JSON body: "+err.Error())
	}
	if req.Model == "" {
		return s.badRequest(w, llm.DialectAnthropic, reqID, "model: Field required")
	}
	out := `{"input_tokens":` + strconv.Itoa(InputTokens(body)) + `}`
	return writeJSON(w, llm.DialectAnthropic, reqID, []byte(out))
}

// serveInputTokens answers POST /v1/responses/input_tokens, the Responses
// API's token count: {"object":"response.input_tokens","input_tokens":N}.
// Its model is optional, as the API's is.
func (s *Server) serveInputTokens(w http.ResponseWriter, reqID string, body []byte) outcome {
	var req map[string]json.RawMessage
	if err := json.Unmarshal(body, &req); err != nil || req == nil {
		return s.badRequest(w, llm.DialectOpenAI, reqID, "mockllm: the body must be a JSON object")
	}
	out := `{"object":"response.input_tokens","input_tokens":` + strconv.Itoa(InputTokens(body)) + `}`
	return writeJSON(w, llm.DialectOpenAI, reqID, []byte(out))
}
