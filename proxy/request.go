package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/tollgate-llm/tollgate/internal/jsonscan"
	"github.com/tollgate-llm/tollgate/llm"
)

// readBody reads the whole request body, at most limit bytes, into one
// slice of exactly its length. The body is read before the upstream request
// starts: streaming the inbound body into the outbound request truncates
// streams under load (golang/go#40747), and the dialect handler needs the
// bytes anyway.
//
// A body with a Content-Length is read straight into a slice of that
// length (net/http ends a server request's body there). One without is read
// into buffers borrowed from chunks (a pool of *[]byte), refused as soon as
// it passes limit, and at its end copied into a slice of its length, each
// buffer going back to the pool once copied. Refusing a body therefore
// costs about limit, not the several times limit of a doubling buffer. A
// body within limit costs its length in new memory; while it is copied, the
// borrowed buffers holding it are live too.
func readBody(r *http.Request, limit int64, chunks *sync.Pool) ([]byte, *apiError) {
	if r.ContentLength > limit {
		return nil, errTooLarge(limit)
	}
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	if r.ContentLength > 0 {
		body := make([]byte, r.ContentLength)
		if _, err := io.ReadFull(r.Body, body); err != nil {
			return nil, errBadRequest("could not read the request body", "")
		}
		return body, nil
	}
	body, err := readUnsized(r.Body, limit, chunks)
	switch {
	case errors.Is(err, errOverLimit):
		return nil, errTooLarge(limit)
	case err != nil:
		return nil, errBadRequest("could not read the request body", "")
	}
	return body, nil
}

// errOverLimit is readUnsized's error for a body past its limit.
var errOverLimit = errors.New("proxy: body over its limit")

// readUnsized reads a body of unknown length (chunked) as readBody says:
// the error is errOverLimit once it passes limit, else body's own (never
// io.EOF), so that a caller reading a decoder can tell the two apart.
func readUnsized(body io.Reader, limit int64, chunks *sync.Pool) ([]byte, error) {
	var first [16]*[]byte // enough for most bodies without a heap-allocated list
	held := first[:0]
	release := func() {
		for _, c := range held {
			chunks.Put(c)
		}
	}
	var n int64
	for {
		c := chunks.Get().(*[]byte)
		held = append(held, c)
		// Never more than one byte past the limit: that byte refuses it.
		k, err := fill(body, (*c)[:min(int64(len(*c)), limit+1-n)])
		n += int64(k)
		if n > limit {
			release()
			return nil, errOverLimit
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			release()
			return nil, err
		}
	}
	if n == 0 {
		release()
		return nil, nil
	}
	out := make([]byte, n)
	off := 0
	for _, c := range held {
		off += copy(out[off:], *c) // every chunk but the last is full
		chunks.Put(c)
	}
	return out, nil
}

// fill reads from r into p until p is full or r fails; err is nil when p
// is full, else r's error (io.EOF at the body's end).
func fill(r io.Reader, p []byte) (n int, err error) {
	for n < len(p) && err == nil {
		var k int
		k, err = r.Read(p[n:])
		n += k
	}
	return n, err
}

// requestInfo is what the gateway reads from a dialect request body.
type requestInfo struct {
	// decoded is set when the body going upstream is the one the caller
	// sent with a Content-Encoding, decoded (inspect): the header is not
	// sent with it.
	decoded bool
	Model   string
	Stream  bool
	// MaxTokens is max_completion_tokens (preferred) or max_tokens, on the
	// Responses API max_output_tokens; -1 when the request sets none.
	MaxTokens int64
	// Background is set for an asynchronous request (OpenAI Responses
	// "background": true), whose answer carries no usage to bill.
	Background bool
	// IncludeUsage reports whether the caller itself asked for streamed usage
	// (OpenAI stream_options.include_usage: true).
	IncludeUsage bool
	// PreviousResponseID and Conversation name the stored state a
	// Responses API request continues ("" when none); NoStore is set by
	// "store": false (the response is not kept upstream).
	PreviousResponseID string
	Conversation       string
	NoStore            bool
	// clientMeta is the body's client_metadata (a span of it; Codex's
	// per-turn attribution) and endUser the end user it names (Messages
	// metadata.user_id, OpenAI's user or safety_identifier): read for the
	// agent's hints (agent).
	clientMeta []byte
	endUser    string
	// agent is what the call's agent said of it (agenthints.go).
	agent agentCall
}

// requestFields are the few fields of a request body the gateway reads. The
// rest of the body goes upstream as the caller sent it.
type requestFields struct {
	Model               json.RawMessage `json:"model"`
	Stream              json.RawMessage `json:"stream"`
	MaxTokens           json.RawMessage `json:"max_tokens"`
	MaxCompletionTokens json.RawMessage `json:"max_completion_tokens"`
	MaxOutputTokens     json.RawMessage `json:"max_output_tokens"` // Responses
	Background          json.RawMessage `json:"background"`        // Responses
	storedRefs
	StreamOptions *streamOptions `json:"stream_options"`
	// Read for reporting only (agenthints.go): never judged.
	Metadata         json.RawMessage `json:"metadata"`          // Messages: user_id
	User             json.RawMessage `json:"user"`              // OpenAI
	SafetyIdentifier json.RawMessage `json:"safety_identifier"` // OpenAI
	ClientMetadata   json.RawMessage `json:"client_metadata"`   // Responses (Codex)
}

// streamOptions is the one field of stream_options the gateway reads.
type streamOptions struct {
	IncludeUsage json.RawMessage `json:"include_usage"`
}

var jsonNull = []byte("null")

// inspectRequest validates a dialect request body and picks out the fields
// the gateway needs. Errors are phrased for the caller.
func inspectRequest(d llm.Dialect, body []byte) (requestInfo, *apiError) {
	info := requestInfo{MaxTokens: -1}
	// Only JSON's own whitespace may come before the object (after it, the
	// decoders allow the same and nothing else).
	trimmed := body[jsonscan.SkipWS(body, 0):]
	if len(trimmed) == 0 {
		return info, errBadRequest("the request body is empty: expected a JSON object", "")
	}
	if trimmed[0] != '{' {
		return info, errBadRequest("the request body must be a JSON object", "")
	}
	f, aerr := decodeRequestFields(trimmed)
	if aerr != nil {
		return info, aerr
	}
	if len(f.Model) == 0 || bytes.Equal(f.Model, jsonNull) {
		return info, errBadRequest("missing required field \"model\"", "model")
	}
	var ok bool
	if info.Model, ok = jsonText(f.Model); !ok || info.Model == "" {
		return info, errBadRequest("\"model\" must be a non-empty string", "model")
	}
	if len(f.Stream) > 0 && !bytes.Equal(f.Stream, jsonNull) {
		if info.Stream, ok = jsonBool(f.Stream); !ok {
			return info, errBadRequest("\"stream\" must be a boolean", "stream")
		}
	}
	limits, limitName := [][]byte{f.MaxCompletionTokens, f.MaxTokens}, "max_tokens"
	if d == llm.DialectResponses {
		limits, limitName = [][]byte{f.MaxOutputTokens}, "max_output_tokens"
		if len(f.Background) > 0 && !bytes.Equal(f.Background, jsonNull) {
			if info.Background, ok = jsonBool(f.Background); !ok {
				return info, errBadRequest("\"background\" must be a boolean", "background")
			}
		}
		if aerr := f.storedRefs.read(&info); aerr != nil {
			return info, aerr
		}
	}
	for _, raw := range limits {
		if len(raw) == 0 || bytes.Equal(raw, jsonNull) {
			continue
		}
		var n int64
		if err := json.Unmarshal(raw, &n); err != nil {
			return info, errBadRequest("max tokens must be an integer", limitName)
		}
		info.MaxTokens = n
		break
	}
	if d == llm.DialectOpenAI && f.StreamOptions != nil && len(f.StreamOptions.IncludeUsage) > 0 {
		if on, ok := jsonBool(f.StreamOptions.IncludeUsage); ok {
			info.IncludeUsage = on
		}
	}
	info.endUser = endUserOf(d, &f)
	if d == llm.DialectResponses && jsonscan.KindOf(f.ClientMetadata) == jsonscan.KindObject {
		info.clientMeta = f.ClientMetadata
	}
	return info, nil
}

// endUserOf is the end user a request names, for reporting only: Messages'
// metadata.user_id, else OpenAI's user, else its safety_identifier; "" when
// none is a string.
func endUserOf(d llm.Dialect, f *requestFields) string {
	if d == llm.DialectAnthropic {
		if v, ok := jsonscan.Get(f.Metadata, "user_id"); ok {
			s, _ := jsonText(v)
			return s
		}
		return ""
	}
	for _, v := range [][]byte{f.User, f.SafetyIdentifier} {
		if s, ok := jsonText(v); ok && s != "" {
			return s
		}
	}
	return ""
}

// jsonText is the string the JSON value raw holds, as json.Unmarshal reads
// it; ok is false when raw is not a string. A string with no escape, no
// control character and only valid UTF-8 is its bytes, copied without
// encoding/json (two allocations fewer on every request's model).
func jsonText(raw []byte) (s string, ok bool) {
	if in, quoted := jsonscan.String(raw); quoted {
		plain := true
		for _, c := range in {
			if c < 0x20 || c == '"' || c == '\\' {
				plain = false
				break
			}
		}
		if plain && utf8.Valid(in) {
			return string(in), true
		}
	}
	return s, json.Unmarshal(raw, &s) == nil
}

// jsonBool is the boolean the JSON value raw holds, as json.Unmarshal reads
// it; ok is false when raw is not a boolean.
func jsonBool(raw []byte) (v, ok bool) {
	switch string(raw) {
	case "true":
		return true, true
	case "false":
		return false, true
	}
	return v, json.Unmarshal(raw, &v) == nil
}

// decodeRequestFields reads the fields of a body that opens an object: in
// one jsonscan pass when scanRequestFields can, else through encoding/json,
// which also words what is wrong with it.
func decodeRequestFields(body []byte) (requestFields, *apiError) {
	if f, ok := scanRequestFields(body); ok {
		return f, nil
	}
	var f requestFields
	err := json.Unmarshal(body, &f)
	if err == nil {
		return f, nil
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return f, errBadRequest("the request body is not valid JSON: "+se.Error(), "")
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return f, errBadRequest("invalid type for "+quoteField(te.Field)+": expected "+te.Type.String(), te.Field)
	}
	return f, errBadRequest("the request body is not valid JSON", "")
}

// scanRequestFields fills f as json.Unmarshal does, in one pass of
// jsonscan over the body where encoding/json makes two (a validating scan,
// then the decode) at a tenth of the speed: the body is mostly the prompt,
// which the gateway does not read. Each key sets the field it names
// exactly or in another ASCII case, the last of duplicates winning, as
// encoding/json matches them. ok is false, and f is not to be used, when
// it cannot be sure to read the body alike: malformed JSON, a key with an
// escape or a byte outside printable ASCII (encoding/json folds those by
// Unicode rules), or stream_options given twice or as neither an object
// nor null. The values are spans of body, not copies.
func scanRequestFields(body []byte) (f requestFields, ok bool) {
	it := jsonscan.Object(body)
	seenOptions := false
	for it.Next() {
		key := it.Key()
		if !plainKey(key) {
			return f, false
		}
		v := it.Value()
		if v == nil {
			return f, false
		}
		switch {
		case asciiFoldEq(key, "model"):
			f.Model = v
		case asciiFoldEq(key, "stream"):
			f.Stream = v
		case asciiFoldEq(key, "max_tokens"):
			f.MaxTokens = v
		case asciiFoldEq(key, "max_completion_tokens"):
			f.MaxCompletionTokens = v
		case asciiFoldEq(key, "max_output_tokens"):
			f.MaxOutputTokens = v
		case asciiFoldEq(key, "background"):
			f.Background = v
		case asciiFoldEq(key, "previous_response_id"):
			f.PreviousResponseID = v
		case asciiFoldEq(key, "conversation"):
			f.Conversation = v
		case asciiFoldEq(key, "store"):
			f.Store = v
		case asciiFoldEq(key, "metadata"):
			f.Metadata = v
		case asciiFoldEq(key, "user"):
			f.User = v
		case asciiFoldEq(key, "safety_identifier"):
			f.SafetyIdentifier = v
		case asciiFoldEq(key, "client_metadata"):
			f.ClientMetadata = v
		case asciiFoldEq(key, "stream_options"):
			if seenOptions {
				return f, false // a second object would merge into the first
			}
			seenOptions = true
			switch jsonscan.KindOf(v) {
			case jsonscan.KindNull:
			case jsonscan.KindObject:
				f.StreamOptions = &streamOptions{}
				in := jsonscan.Object(v)
				for in.Next() {
					if k := in.Key(); !plainKey(k) {
						return f, false
					} else if w := in.Value(); asciiFoldEq(k, "include_usage") {
						f.StreamOptions.IncludeUsage = w
					}
				}
				if in.Err() != nil {
					return f, false
				}
			default:
				return f, false // encoding/json's type error words it
			}
		}
	}
	return f, it.Err() == nil
}

// plainKey reports whether a raw key holds only printable ASCII and no
// escape, so that its bytes are its name.
func plainKey(k []byte) bool {
	for _, c := range k {
		if c < 0x20 || c > 0x7e || c == '\\' {
			return false
		}
	}
	return true
}

// asciiFoldEq reports whether k equals the lower-case name lit in any ASCII
// case.
func asciiFoldEq(k []byte, lit string) bool {
	if len(k) != len(lit) {
		return false
	}
	for i := range len(k) {
		c := k[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lit[i] {
			return false
		}
	}
	return true
}

func quoteField(f string) string {
	if f == "" {
		return "a field"
	}
	return "\"" + f + "\""
}

// storedRefs are the fields of a Responses API body that name stored
// state: the response it continues, the conversation it joins, and whether
// its own response is stored.
type storedRefs struct {
	PreviousResponseID json.RawMessage `json:"previous_response_id"`
	Conversation       json.RawMessage `json:"conversation"`
	Store              json.RawMessage `json:"store"`
}

// read puts the references into info: conversation is "conv_…" or
// {"id":"conv_…"}. Errors are phrased for the caller.
func (f *storedRefs) read(info *requestInfo) *apiError {
	var ok bool
	if len(f.PreviousResponseID) > 0 && !bytes.Equal(f.PreviousResponseID, jsonNull) {
		if info.PreviousResponseID, ok = jsonText(f.PreviousResponseID); !ok {
			return errBadRequest("\"previous_response_id\" must be a string", "previous_response_id")
		}
	}
	if c := f.Conversation; len(c) > 0 && !bytes.Equal(c, jsonNull) { // a value span: no whitespace around it
		if c[0] == '{' {
			// Exact keys, escapes decoded, the last of duplicates: as the
			// upstream reads it.
			var obj map[string]json.RawMessage
			if json.Unmarshal(c, &obj) != nil {
				return errBadRequest("\"conversation\" must be a conversation id or {\"id\": ...}", "conversation")
			}
			c = obj["id"]
		}
		if info.Conversation, ok = jsonText(c); !ok || info.Conversation == "" {
			return errBadRequest("\"conversation\" must be a conversation id or {\"id\": ...}", "conversation")
		}
	}
	if len(f.Store) > 0 && !bytes.Equal(f.Store, jsonNull) {
		var on bool
		if on, ok = jsonBool(f.Store); !ok {
			return errBadRequest("\"store\" must be a boolean", "store")
		}
		info.NoStore = !on
	}
	return nil
}

// forwardedFields are what the gateway reads from a POST to another /v1/*
// path (embeddings, responses, completions, ...) to meter it.
type forwardedFields struct {
	Model               string          `json:"model"`
	Stream              bool            `json:"stream"`
	MaxTokens           json.RawMessage `json:"max_tokens"`
	MaxCompletionTokens json.RawMessage `json:"max_completion_tokens"`
	MaxOutputTokens     json.RawMessage `json:"max_output_tokens"`
	Background          bool            `json:"background"`
	storedRefs
}

// inspectForwarded reads the model, stream flag and output cap of a
// forwarded request body. ok is false when the body is not a JSON object
// naming a model; such a request goes upstream unmetered (the gateway does
// not judge bodies of APIs it does not speak).
func inspectForwarded(body []byte) (info requestInfo, ok bool) {
	info.MaxTokens = -1
	var f forwardedFields
	if json.Unmarshal(body, &f) != nil || f.Model == "" {
		return info, false
	}
	info.Model, info.Stream, info.Background = f.Model, f.Stream, f.Background
	if f.storedRefs.read(&info) != nil {
		// Unreadable references: the upstream refuses the body too, and
		// nothing is let through unchecked.
		return info, false
	}
	for _, raw := range [][]byte{f.MaxCompletionTokens, f.MaxTokens, f.MaxOutputTokens} {
		var n int64
		if len(raw) > 0 && json.Unmarshal(raw, &n) == nil && n >= 0 {
			info.MaxTokens = n
			break
		}
	}
	return info, true
}

// inspectTokenCount reads what a Responses token count
// (POST /v1/responses/input_tokens) names of the caller's stored state:
// its previous_response_id and conversation, whose owner is checked before
// it goes upstream, where their items would be counted. Nothing else of it
// is judged; its model is optional.
func inspectTokenCount(body []byte) (requestInfo, *apiError) {
	info := requestInfo{MaxTokens: -1}
	var f storedRefs
	if b := bytes.TrimLeft(body, " \t\r\n"); len(b) == 0 || b[0] != '{' || json.Unmarshal(b, &f) != nil {
		return info, errBadRequest("the request body must be a JSON object", "")
	}
	if key, field, bad := caseVariantField(body); bad {
		return info, errCaseVariant(key, field)
	}
	return info, f.read(&info)
}

// governedFields are the body fields the gateway decides on. encoding/json
// matches field names without regard to case, so {"model":"a","MODEL":"b"}
// would be judged and billed as "b" while an upstream that reads keys
// exactly (most servers) serves "a": such bodies are refused.
var governedFields = []string{"model", "stream", "max_tokens", "max_completion_tokens", "max_output_tokens",
	"background", "stream_options", "previous_response_id", "conversation", "store"}

// caseVariantField returns the first top-level key of body that equals a
// governed field name but for case (escapes decoded), with that name.
func caseVariantField(body []byte) (key, field string, found bool) {
	obj, ok := jsonscan.Value(body)
	if !ok || jsonscan.KindOf(obj) != jsonscan.KindObject {
		return "", "", false
	}
	return caseVariantIn(obj, governedFields)
}

// caseVariantIn checks the keys of one JSON object against fields, and
// those of its "stream_options" member against include_usage.
func caseVariantIn(obj []byte, fields []string) (key, field string, found bool) {
	it := jsonscan.Object(obj)
	for it.Next() {
		kb := it.Key()
		if bytes.IndexByte(kb, '\\') >= 0 { // rare: decoded into a buffer of its own
			kb = jsonscan.AppendUnescape(nil, kb)
		}
		// k is not kept (the key found is cloned), so a short one is
		// converted on the stack: no allocation per key.
		k := string(kb)
		for _, f := range fields {
			if k != f && strings.EqualFold(k, f) {
				return strings.Clone(k), f, true
			}
		}
		if k == "stream_options" {
			if v := it.Value(); jsonscan.KindOf(v) == jsonscan.KindObject {
				if key, field, found := caseVariantIn(v, []string{"include_usage"}); found {
					return key, field, true
				}
			}
		}
	}
	return "", "", false
}

// checkEdge refuses a request the gateway must not pass on, before it reads
// anything else of it: a path that is not canonical, or headers larger than
// server.max_header_bytes.
func (ex *exchange) checkEdge() refusal {
	r := ex.r
	if why := nonCanonical(r.URL); why != "" {
		return rejected(errNonCanonicalPath(why), llm.RejectNonCanonicalPath)
	}
	if n, limit := headerBytes(r.Header), ex.gen.cfg.Server.MaxHeaderBytes; n > limit {
		return rejected(errHeadersTooLarge(limit), llm.RejectHeadersTooLarge)
	}
	return refusal{}
}

// nonCanonical says why a path is not one the gateway forwards, or "" when
// it is. The upstream receives the path as sent, so anything an upstream
// (or a proxy in front of it) could resolve to another path than the one
// the gateway routed and judged is refused: dot segments, empty segments,
// backslashes, semicolons (path parameters: Java servers read "..;" as
// ".."), control bytes, a percent sign or invalid UTF-8 once decoded (a
// second decoding would change it), and any escape but the standard one
// for the decoded path: encoded dots, slashes or backslashes, and an
// escaped letter such as /v1/respons%65s, which reaches another route here
// than the one the upstream serves. Otherwise GET /v1/../metrics or
// /v1/%2e%2e/admin reaches an internal endpoint of a self-hosted upstream
// that only the gateway fronts.
func nonCanonical(u *url.URL) string {
	if u.RawPath != "" {
		// net/url keeps RawPath only when the escaping differs from the
		// standard one of the decoded path: %2e, %2f, %65, ... (an encoded
		// backslash is standard, and the decoded one is refused below).
		return "it escapes what a standard encoder would not (an encoded dot or slash, an escaped letter)"
	}
	p := u.Path
	switch {
	case strings.IndexByte(p, '\\') >= 0:
		return "it holds a backslash"
	case strings.IndexByte(p, ';') >= 0:
		return "it holds a semicolon"
	case strings.IndexByte(p, '%') >= 0:
		return "it holds an escaped percent sign"
	case !utf8.ValidString(p):
		return "it is not valid UTF-8"
	case !strings.HasPrefix(p, "/"):
		return "it does not start with /"
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; c < 0x20 || c == 0x7f {
			return "it holds a control character"
		}
	}
	for seg := range strings.SplitSeq(p[1:], "/") {
		switch seg {
		case "":
			return "it has an empty segment"
		case ".", "..":
			return "it has a dot segment"
		}
	}
	return ""
}
