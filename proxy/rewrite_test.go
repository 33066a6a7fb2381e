package proxy

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
)

// TestIncludeUsageOff: with include_usage = false on the upstream, the
// request body goes up unchanged, nothing is withheld, and tokens are
// estimated from events.
func TestIncludeUsageOff(t *testing.T) {
	up := &rawUpstream{pieces: split(openAIRole+openAITok1+openAITok2+openAIStop+openAIDone, 50)}
	srv := httptest.NewServer(up)
	defer srv.Close()
	tg := newTestGateway(t, srv.URL, func(c *config.Config) { c.Upstreams[0].IncludeUsage = false })
	body := `{"model":"m","stream":true,"messages":[]}`
	_, got := post(t, tg.URL+"/v1/chat/completions", body, nil)
	if want := openAIRole + openAITok1 + openAITok2 + openAIStop + openAIDone; string(got) != want {
		t.Fatalf("client got %q", got)
	}
	if sent, _ := up.request(); string(sent) != body {
		t.Errorf("body changed with include_usage=false: %s", sent)
	}
	rec := tg.record(t)
	if !rec.Estimated || rec.Usage.Output != 2 {
		t.Errorf("record usage %+v estimated %v", rec.Usage, rec.Estimated)
	}
	if rec.Outcome != llm.OutcomeOK || !rec.TerminalSeen {
		t.Errorf("record outcome %s, terminal seen %v; want ok with [DONE] seen", rec.Outcome, rec.TerminalSeen)
	}
}

// TestRouteRename: a route's rename changes only the model the upstream
// gets; the caller's record keeps the model it asked for, and a model no
// route matches goes up unchanged.
func TestRouteRename(t *testing.T) {
	tests := []struct{ name, path, body string }{
		{"openai", "/v1/chat/completions", `{"model":"alias-1","messages":[{"role":"user","content":"hi"}],"metadata":{"model":"keep"}}`},
		{"anthropic", "/v1/messages", `{"model":"alias-1","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mock, url := mockUpstream(t, mockllm.Options{OutputTokens: 2})
			tg := newTestGateway(t, url, func(c *config.Config) {
				c.Routes = []config.Route{{Models: []string{"alias-*"}, Upstreams: []string{"mock"},
					Rename: map[string]string{"mock": "deployment-7"}}}
			})
			resp, body := post(t, tg.URL+tc.path, tc.body, nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			reqs := mock.Requests()
			want := strings.Replace(tc.body, `"model":"alias-1"`, `"model":"deployment-7"`, 1)
			if len(reqs) != 1 || string(reqs[0].Body) != want {
				t.Errorf("upstream got %d requests, body %q\nwant %q", len(reqs), lastBody(reqs), want)
			}
			if rec := tg.record(t); rec.Model != "alias-1" || rec.Upstream != "mock" {
				t.Errorf("record model %q upstream %q, want the caller's alias-1 on mock", rec.Model, rec.Upstream)
			}
			plain := strings.Replace(tc.body, "alias-1", "plain-1", 1)
			post(t, tg.URL+tc.path, plain, nil)
			tg.record(t)
			if reqs := mock.Requests(); string(lastBody(reqs)) != plain {
				t.Errorf("unrouted model went up as %q, want %q", lastBody(reqs), plain)
			}
		})
	}
}

func lastBody(reqs []mockllm.Recorded) []byte {
	if len(reqs) == 0 {
		return nil
	}
	return reqs[len(reqs)-1].Body
}

func TestSetModel(t *testing.T) {
	tests := []struct {
		name, body, model string
		want              string // "" with ok false: the body must come back as it was
		ok                bool
	}{
		{"plain", `{"model":"a","messages":[]}`, "b", `{"model":"b","messages":[]}`, true},
		{"model last", `{"messages":[],"stream":true,"model":"a"}`, "gpt-x", `{"messages":[],"stream":true,"model":"gpt-x"}`, true},
		{"nested model keys untouched",
			`{"messages":[{"role":"user","model":"m1"}],"model":"a","tools":{"model":"m2"},"metadata":{"x":{"model":"m3"}}}`, "b",
			`{"messages":[{"role":"user","model":"m1"}],"model":"b","tools":{"model":"m2"},"metadata":{"x":{"model":"m3"}}}`, true},
		{"model in a string untouched", `{"content":"\"model\":\"a\"","model":"a"}`, "b",
			`{"content":"\"model\":\"a\"","model":"b"}`, true},
		{"duplicate top-level keys all replaced", `{"model":"a","x":1,"model":"c"}`, "b", `{"model":"b","x":1,"model":"b"}`, true},
		{"whitespace and escapes kept byte for byte",
			"{ \"model\" :\t\"a\" ,\n\t\"msg\" : \"caf\\u00e9 \\\"q\\\" \\/ \\n\" ,\r\n \"n\" : 1.50e2 , \"e\":[ ] }\n", "new",
			"{ \"model\" :\t\"new\" ,\n\t\"msg\" : \"caf\\u00e9 \\\"q\\\" \\/ \\n\" ,\r\n \"n\" : 1.50e2 , \"e\":[ ] }\n", true},
		{"non-string value replaced", `{"model":null,"x":2}`, "b", `{"model":"b","x":2}`, true},
		{"object value replaced", `{"model":{"id":"a","model":"z"}}`, "b", `{"model":"b"}`, true},
		{"escaped key matches like encoding/json", `{"mod\u0065l":"a"}`, "b", `{"mod\u0065l":"b"}`, true},
		{"empty name", `{"model":"a"}`, "", `{"model":""}`, true},
		{"no model member", `{"messages":[],"models":"a","Model":"b"}`, "b", "", false},
		{"array", `["model","a"]`, "b", "", false},
		{"string", `"model"`, "b", "", false},
		{"number", `42`, "b", "", false},
		{"null", `null`, "b", "", false},
		{"empty", ``, "b", "", false},
		{"unterminated", `{"model":"a"`, "b", "", false},
		{"trailing garbage", `{"model":"a"} x`, "b", "", false},
		{"trailing comma", `{"model":"a",}`, "b", "", false},
		{"bad value later", `{"model":"a","x":tru}`, "b", "", false},
		{"two values", `{"model":"a"}{"model":"a"}`, "b", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := []byte(tc.body)
			got, ok := setModel(in, tc.model)
			if ok != tc.ok {
				t.Fatalf("setModel(%q, %q) ok = %v, want %v (got %q)", tc.body, tc.model, ok, tc.ok, got)
			}
			if !ok {
				if !bytes.Equal(got, in) {
					t.Errorf("refused, but returned %q instead of the input", got)
				}
				return
			}
			if string(got) != tc.want {
				t.Errorf("setModel(%q, %q)\n got %q\nwant %q", tc.body, tc.model, got, tc.want)
			}
			if string(in) != tc.body {
				t.Errorf("the input was modified: %q", in)
			}
		})
	}
}

// Names that need escaping must come out as the JSON string of the name.
func TestSetModelNamesNeedingEscapes(t *testing.T) {
	names := []string{
		`dep"quoted"`, `back\slash`, "new\nline", "tab\there", "cr\r", "bs\b ff\f",
		"café-日本", "sep\u2028ara\u2029tor", "soft\u00adhyphen", "</script>&", "slash/name",
		"emoji-😀", "replacement-\uFFFD",
	}
	body := `{"model":"a","messages":[{"role":"user","content":"hi"}]}`
	for _, name := range names {
		t.Run(strconv.Quote(name), func(t *testing.T) {
			got, ok := setModel([]byte(body), name)
			if !ok {
				t.Fatalf("setModel refused the name %q", name)
			}
			var m struct {
				Model    string          `json:"model"`
				Messages json.RawMessage `json:"messages"`
			}
			if err := json.Unmarshal(got, &m); err != nil {
				t.Fatalf("output is not JSON: %v: %q", err, got)
			}
			if m.Model != name {
				t.Errorf("model decodes to %q, want %q", m.Model, name)
			}
			if string(m.Messages) != `[{"role":"user","content":"hi"}]` {
				t.Errorf("messages changed: %s", m.Messages)
			}
		})
	}
}

// A rename to a name that JSON can carry but strconv.Quote would write with a Go
// escape (\x01, \a, \v, \x7f, \U...) must still be applied: the config
// accepts such names (TOML "\u0001"), and a refused rename silently sends
// the caller's model to the upstream instead of the configured one.
func TestSetModelNamesWithGoOnlyEscapes(t *testing.T) {
	names := []string{"nul\x00", "ctl\x01", "bell\a", "vt\v", "del\x7f", "private-\U000F0000"}
	body := `{"model":"a"}`
	var refused []string
	for _, name := range names {
		got, ok := setModel([]byte(body), name)
		if !ok {
			refused = append(refused, strconv.Quote(name))
			continue
		}
		var m struct{ Model string }
		if err := json.Unmarshal(got, &m); err != nil || m.Model != name {
			t.Errorf("name %q: output %q decodes to %q (%v)", name, got, m.Model, err)
		}
	}
	if len(refused) > 0 {
		t.Errorf("setModel refuses the valid JSON names %v, so bodyFor would send the caller's model instead of the route's rename", refused)
	}
}

// FuzzSetModel: when setModel accepts a body, the result is valid JSON whose
// top-level model is the new name and whose other top-level members are
// unchanged; when it refuses, the body comes back untouched. A small object
// with a top-level model must not be refused for a name JSON can carry.
func FuzzSetModel(f *testing.F) {
	seeds := []struct{ body, name string }{
		{`{"model":"a","messages":[]}`, "b"},
		{`{"messages":[{"model":"m"}],"model":"a"}`, "dep-1"},
		{`{"model":"a","x":1,"model":"c"}`, "b"},
		{"{ \"model\" :\t\"a\" ,\n\"msg\":\"caf\\u00e9\" }", "new"},
		{`{"mod\u0065l":"a"}`, `q"uote`},
		{`{"model":null}`, "back\\slash"},
		{`{"model":{"model":"x"}}`, "line\nfeed"},
		{`{"n":1e400,"model":"a"}`, "big"},
		{`{"model":"a",}`, "b"},
		{`["model"]`, "b"},
		{`{"model":"a"} x`, "b"},
		{``, "b"},
		{`{"model":"a"}`, "ctl\x01"},
		{`{"model":"a"}`, "emoji-😀"},
		{`{"model":"a","s":"\ud800"}`, "b"},
	}
	for _, s := range seeds {
		f.Add([]byte(s.body), s.name)
	}
	f.Fuzz(func(t *testing.T, body []byte, name string) {
		in := append([]byte(nil), body...)
		out, ok := setModel(body, name)
		if !bytes.Equal(body, in) {
			t.Fatalf("input modified")
		}
		inMap, inObj := fuzzTopMembers(in)
		if !ok {
			if !bytes.Equal(out, in) {
				t.Fatalf("refused but returned %q for %q", out, in)
			}
			// Below 256 bytes the nesting cannot reach jsonscan.MaxDepth.
			_, hasModel := inMap["model"]
			if inObj && hasModel && len(in) < 256 && utf8.ValidString(name) {
				t.Fatalf("refused a small object with a model for the plain name %q: %q", name, in)
			}
			return
		}
		if !json.Valid(out) {
			t.Fatalf("output is not valid JSON: %q (input %q, name %q)", out, in, name)
		}
		if !inObj {
			t.Fatalf("accepted %q, which encoding/json does not decode as an object", in)
		}
		outMap, outObj := fuzzTopMembers(out)
		if !outObj {
			t.Fatalf("output %q is not an object", out)
		}
		var got string
		if err := json.Unmarshal(outMap["model"], &got); err != nil || got != name {
			t.Fatalf("model decodes to %q (%v), want %q; output %q", got, err, name, out)
		}
		if _, had := inMap["model"]; !had {
			t.Fatalf("accepted %q, which has no top-level model", in)
		}
		if len(outMap) != len(inMap) {
			t.Fatalf("members %d, want %d: %q -> %q", len(outMap), len(inMap), in, out)
		}
		for k, v := range inMap {
			if k == "model" {
				continue
			}
			if w, ok := outMap[k]; !ok || !fuzzJSONEqual(v, w) {
				t.Fatalf("member %q changed: %s -> %s", k, v, w)
			}
		}
	})
}

// fuzzTopMembers decodes a JSON object's top-level members (the last of
// duplicate keys wins, as in encoding/json).
func fuzzTopMembers(b []byte) (map[string]json.RawMessage, bool) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil || m == nil {
		return nil, false
	}
	return m, true
}

// fuzzJSONEqual compares two JSON values by their decoded form, numbers as
// written.
func fuzzJSONEqual(a, b []byte) bool {
	dec := func(x []byte) (any, bool) {
		d := json.NewDecoder(bytes.NewReader(x))
		d.UseNumber()
		var v any
		return v, d.Decode(&v) == nil
	}
	va, oka := dec(a)
	vb, okb := dec(b)
	return oka && okb && reflect.DeepEqual(va, vb)
}
