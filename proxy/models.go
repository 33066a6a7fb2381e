package proxy

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
)

// modelListLimit bounds the model list read to be filtered; a longer one
// goes to the caller as it came.
const modelListLimit = 1 << 20

// filtersModelList reports whether an answer to GET /v1/models is the list
// of what the caller's team may use: in mode "keys", for a team held to
// model patterns. Admission enforces the patterns either way; the list
// keeps a client (Claude Code's model picker, Codex's catalog) from
// offering what every request would be refused.
func (ex *exchange) filtersModelList(resp *http.Response) bool {
	r, k := ex.r, ex.key
	return ex.gen.gov.keysMode && k != nil && k.team != nil && len(k.team.patterns) > 0 &&
		r.Method == http.MethodGet && r.URL.RawPath == "" && r.URL.Path == "/v1/models" &&
		resp.StatusCode == http.StatusOK
}

// copyModelList relays the upstream's model list with only the models the
// caller's team may use, in the shape it came in: OpenAI's and Anthropic's
// "data" (entries by "id"; Anthropic's first_id and last_id follow), and
// Codex's "models" (entries by "slug").
func (ex *exchange) copyModelList(ctx context.Context, at *attemptState, resp *http.Response) attemptResult {
	s := stop{stage: stageBody, ctx: ctx}
	body, err := io.ReadAll(io.LimitReader(resp.Body, modelListLimit+1))
	if err == nil && len(body) <= modelListLimit {
		if filtered, ok := ex.filterModelList(body); ok {
			body = filtered
		}
	} else if err == nil {
		ex.g.log.Warn("model list larger than the gateway filters: relayed whole", "request_id", ex.rec.RequestID,
			"limit_bytes", modelListLimit)
	}
	ex.prepareHeaders(resp.Header)
	ex.writeHeader(resp.StatusCode)
	if err == nil {
		s.writeErr = ex.write(body)
		if len(body) > modelListLimit && s.writeErr == nil {
			_, s.err = io.Copy(writerFunc(ex.write), resp.Body)
		}
	}
	if s.err == nil {
		s.err = err
	}
	e := ex.classify(at, s)
	ex.ended(e)
	return ex.result(e, resp.StatusCode, true)
}

// writerFunc adapts a write function to io.Writer.
type writerFunc func([]byte) error

func (f writerFunc) Write(p []byte) (int, error) {
	if err := f(p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// filterModelList keeps the entries of a model list the caller's team may
// use; false when body is not a list it knows.
func (ex *exchange) filterModelList(body []byte) ([]byte, bool) {
	var list map[string]json.RawMessage
	if json.Unmarshal(body, &list) != nil {
		return nil, false
	}
	team := ex.key.team
	filtered := false
	for _, f := range []struct{ field, id string }{{"data", "id"}, {"models", "slug"}} {
		raw, ok := list[f.field]
		if !ok {
			continue
		}
		var entries []map[string]json.RawMessage
		if json.Unmarshal(raw, &entries) != nil {
			return nil, false
		}
		kept := entries[:0]
		for _, e := range entries {
			var id string
			if json.Unmarshal(e[f.id], &id) == nil && team.modelAllowed(id) {
				kept = append(kept, e)
			}
		}
		b, err := json.Marshal(kept)
		if err != nil {
			return nil, false
		}
		list[f.field], filtered = b, true
		if f.field == "data" {
			firstLast(list, kept)
		}
	}
	if !filtered {
		return nil, false
	}
	b, err := json.Marshal(list)
	return b, err == nil
}

// firstLast sets an Anthropic list's first_id and last_id to its kept
// entries' (null when none is kept), when the list has them.
func firstLast(list map[string]json.RawMessage, kept []map[string]json.RawMessage) {
	for _, f := range []struct {
		key string
		at  int
	}{{"first_id", 0}, {"last_id", len(kept) - 1}} {
		if _, ok := list[f.key]; !ok {
			continue
		}
		list[f.key] = json.RawMessage("null")
		if f.at >= 0 && f.at < len(kept) {
			if id, ok := kept[f.at]["id"]; ok {
				list[f.key] = id
			}
		}
	}
}
