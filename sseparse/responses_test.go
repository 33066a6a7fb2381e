package sseparse

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/tollgate-llm/tollgate/internal/jsonscan"
	"github.com/tollgate-llm/tollgate/llm"
)

// Events of the Responses API, one of each kind the decoder tells apart.
const (
	rsCreated    = `{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","status":"in_progress","usage":null}}`
	rsTextDelta  = `{"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hi","logprobs":[],"obfuscation":"mvkAadO"}`
	rsEmptyDelta = `{"type":"response.output_text.delta","sequence_number":4,"delta":"","obfuscation":"mvkAadO"}`
	rsFnAdded    = `{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"fc_1","type":"function_call","status":"in_progress","arguments":"","call_id":"call_1","name":"get_weather"}}`
	rsMsgAdded   = `{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","content":[],"role":"assistant"}}`
	rsCompleted  = `{"type":"response.completed","sequence_number":11,"response":{"id":"resp_1","status":"completed","error":null,"incomplete_details":null,"output":[{"type":"message","content":[{"type":"output_text","text":"Hi"}]}],"usage":{"input_tokens":12033,"input_tokens_details":{"cached_tokens":11904},"output_tokens":44,"output_tokens_details":{"reasoning_tokens":7},"total_tokens":12077}}}`
	rsIncomplete = `{"type":"response.incomplete","sequence_number":9,"response":{"id":"resp_1","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"usage":{"input_tokens":10,"output_tokens":16,"output_tokens_details":{"reasoning_tokens":16}}}}`
	rsFailed     = `{"type":"response.failed","sequence_number":3,"response":{"id":"resp_1","status":"failed","error":{"code":"insufficient_quota","message":"You exceeded your current quota"},"output":[],"usage":null}}`
	rsErrNested  = `{"type":"error","sequence_number":2,"error":{"type":"tokens","code":"rate_limit_exceeded","message":"Rate limit reached","param":null}}`
	rsErrFlat    = `{"type":"error","code":"server_error","message":"Something went wrong","param":null,"sequence_number":1}`
	rsKeepalive  = `{"type":"keepalive","sequence_number":466}`
)

func TestDecodeResponses(t *testing.T) {
	type want struct {
		bearing, terminal, err, incomplete bool
		errType, reason                    string
		usage                              *llm.Usage
	}
	cases := []struct {
		name, event, data string
		want              want
	}{
		{"created", "response.created", rsCreated, want{}},
		{"text delta", "response.output_text.delta", rsTextDelta, want{bearing: true}},
		{"empty delta", "response.output_text.delta", rsEmptyDelta, want{}},
		{"refusal delta", "", `{"type":"response.refusal.delta","delta":"no"}`, want{bearing: true}},
		{"function arguments delta", "", `{"type":"response.function_call_arguments.delta","item_id":"fc_1","output_index":0,"delta":"{\"ci"}`, want{bearing: true}},
		{"custom tool input delta", "", `{"type":"response.custom_tool_call_input.delta","delta":"x"}`, want{bearing: true}},
		{"mcp arguments delta", "", `{"type":"response.mcp_call_arguments.delta","delta":"{"}`, want{bearing: true}},
		{"code interpreter delta", "", `{"type":"response.code_interpreter_call_code.delta","delta":"print(1)"}`, want{bearing: true}},
		{"shell command delta", "", `{"type":"response.shell_call_command.delta","output_index":0,"command_index":0,"delta":"ls","obfuscation":"ab"}`, want{bearing: true}},
		{"reasoning summary delta", "", `{"type":"response.reasoning_summary_text.delta","summary_index":0,"delta":"**Thinking**"}`, want{bearing: true}},
		{"reasoning text delta", "", `{"type":"response.reasoning_text.delta","delta":"step"}`, want{bearing: true}},
		{"audio delta", "", `{"type":"response.audio.delta","delta":"UklGRg=="}`, want{bearing: true}},
		{"audio transcript delta", "", `{"type":"response.audio.transcript.delta","delta":"hello"}`, want{bearing: true}},
		{"legacy reasoning delta", "", `{"type":"response.reasoning.delta","delta":"x"}`, want{bearing: true}},
		{"legacy reasoning delta, an object as the SDK typed it", "", `{"type":"response.reasoning.delta","delta":{"text":"x"}}`, want{bearing: true}},
		{"legacy summary delta, empty object", "", `{"type":"response.reasoning_summary.delta","delta":{}}`, want{}},
		{"error by its event name only", "error", `{"error":{"message":"x"}}`, want{err: true}},
		{"unknown future delta", "", `{"type":"response.new_thing.delta","delta":"x"}`, want{bearing: true}},
		{"shell output is no model output", "", `{"type":"response.shell_call_output_content.delta","delta":"{\"stdout\":\"x\"}"}`, want{}},
		{"object delta", "", `{"type":"response.new_thing.delta","delta":{"stdout":"x"}}`, want{}},
		{"text done repeats the deltas", "", `{"type":"response.output_text.done","text":"Hi"}`, want{}},
		{"partial image", "", `{"type":"response.image_generation_call.partial_image","partial_image_b64":"AAAA"}`, want{}},
		{"function call added", "response.output_item.added", rsFnAdded, want{bearing: true}},
		{"message added", "response.output_item.added", rsMsgAdded, want{}},
		{"completed", "response.completed", rsCompleted, want{terminal: true,
			usage: &llm.Usage{Input: 12033, CacheRead: 11904, Output: 44, Reasoning: 7, HasInput: true, HasOutput: true}}},
		{"incomplete", "response.incomplete", rsIncomplete, want{terminal: true, incomplete: true, reason: "max_output_tokens",
			usage: &llm.Usage{Input: 10, Output: 16, Reasoning: 16, HasInput: true, HasOutput: true}}},
		{"failed", "response.failed", rsFailed, want{terminal: true, err: true, errType: "insufficient_quota"}},
		{"error, nested", "error", rsErrNested, want{err: true, errType: "rate_limit_exceeded"}},
		{"error, flat", "error", rsErrFlat, want{err: true, errType: "server_error"}},
		{"error, numeric code", "error", `{"type":"error","error":{"message":"x","code":500}}`, want{err: true, errType: "500"}},
		{"error without a type", "error", `{"type":"error","message":"x"}`, want{err: true}},
		{"error, malformed data", "error", `{"type":"error","error":`, want{err: true}},
		{"keepalive", "keepalive", rsKeepalive, want{}},
		{"[DONE] means nothing here", "", `[DONE]`, want{}},
		{"malformed delta", "", `{"type":"response.output_text.delta","delta":"x"`, want{}},
		{"trailing garbage", "", rsTextDelta + ` x`, want{}},
		{"escaped type", "", `{"type":"response.output_text.\u0064elta","delta":"x"}`, want{bearing: true}},
		{"type after the delta", "", `{"delta":"x","type":"response.output_text.delta"}`, want{bearing: true}},
		{"repeated type: the last wins", "", `{"type":"response.output_text.delta","type":"response.output_text.done","delta":"x"}`, want{}},
		{"failed without usage object", "", `{"type":"response.failed","response":{"error":{"type":"server_error"},"usage":null}}`,
			want{terminal: true, err: true, errType: "server_error"}},
		{"completed with a malformed response", "", `{"type":"response.completed","response":"x"}`, want{terminal: true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var o Observation
			data := []byte(c.data)
			DecodeResponses(&Event{Type: []byte(c.event), Data: data}, &o)
			checkInvariants(t, &o, data)
			got := want{bearing: o.TokenBearing, terminal: o.Terminal, err: o.Error, incomplete: o.Incomplete,
				errType: string(o.ErrorType), reason: string(o.IncompleteReason)}
			if o.usage.has&hasObject != 0 {
				u := canonical(o.usage.normalize(llm.DialectResponses), o.usage.has&hasReasoning != 0)
				got.usage = &u
			}
			if got.bearing != c.want.bearing || got.terminal != c.want.terminal || got.err != c.want.err ||
				got.incomplete != c.want.incomplete || got.errType != c.want.errType || got.reason != c.want.reason ||
				(got.usage == nil) != (c.want.usage == nil) || got.usage != nil && *got.usage != *c.want.usage {
				t.Errorf("got %+v (usage %+v)\nwant %+v (usage %+v)", got, got.usage, c.want, c.want.usage)
			}
			if o.TokenBearing && o.Tokens != 1 {
				t.Errorf("Tokens %d, want 1", o.Tokens)
			}
		})
	}
}

// The recorded stream of wire.md 9.9 through a Tap: the first token at the
// first output_text.delta (seq 4), four token-bearing events (obfuscation
// not counted), usage 13 in / 12 out from response.completed, and the body
// ends with no [DONE]. The recorded quota failure is an error typed
// insufficient_quota, terminal, with no usage.
func TestResponsesTranscripts(t *testing.T) {
	for _, ending := range []string{"\n", "\r\n"} {
		var tap Tap
		tap.Reset(llm.DialectResponses)
		rd := NewReader(bytes.NewReader(withEndings(loadTranscript(t, "9.9.sse"), ending)), 0)
		k, firstAt := 0, -1
		for {
			ev, err := rd.Next()
			if err != nil {
				break
			}
			if o := tap.Observe(ev, at(k)); o.TokenBearing && firstAt < 0 {
				firstAt = k
			}
			k++
		}
		var rec llm.Record
		tap.Fill(&rec)
		u, ok := tap.Usage()
		if k != 12 || firstAt != 4 || rec.TokenEvents != 4 || !rec.TerminalSeen || rec.Interruption != llm.InterruptNone ||
			!ok || u.Input != 13 || u.Output != 12 || u.CacheRead != 0 || rec.Estimated ||
			!rec.Timing.FirstToken.Equal(at(4)) || !rec.Timing.LastToken.Equal(at(7)) {
			t.Errorf("line ends %q: %d events, first token at %d, record %+v, usage %+v (%v)", ending, k, firstAt, rec, u, ok)
		}
		// The transcript numbers its events from 0; response.created
		// names resp_045d.
		if tap.Sequence() != int64(k-1) || string(tap.ResponseID()) != "resp_045d" {
			t.Errorf("line ends %q: last sequence %d (want %d), response id %q", ending, tap.Sequence(), k-1, tap.ResponseID())
		}
	}

	var fresh Tap
	fresh.Reset(llm.DialectResponses)
	fresh.Observe(&Event{Data: []byte(`{"type":"response.created","sequence_number":0,"response":{"id":"resp_\u0031"}}`)}, at(0))
	fresh.Observe(&Event{Data: []byte(`{"type":"response.created","response":{"id":"resp_2"}}`)}, at(1))
	if fresh.Sequence() != 0 || string(fresh.ResponseID()) != "resp_1" {
		t.Errorf("escaped id and a second response.created: sequence %d, id %q; want 0, the first id decoded",
			fresh.Sequence(), fresh.ResponseID())
	}
	fresh.Reset(llm.DialectResponses)
	if fresh.Sequence() != -1 || len(fresh.ResponseID()) != 0 {
		t.Errorf("after Reset: sequence %d, id %q", fresh.Sequence(), fresh.ResponseID())
	}

	var inc Tap
	inc.Reset(llm.DialectResponses)
	inc.Observe(&Event{Data: []byte(rsTextDelta)}, at(0))
	inc.Observe(&Event{Data: []byte(rsIncomplete)}, at(1))
	var incRec llm.Record
	inc.Fill(&incRec)
	if incRec.IncompleteReason != "max_output_tokens" || !incRec.TerminalSeen || incRec.Usage.Output != 16 {
		t.Errorf("incomplete stream: record %+v", incRec)
	}

	var tap Tap
	tap.Reset(llm.DialectResponses)
	rd := NewReader(bytes.NewReader(loadTranscript(t, "9.9-failed.sse")), 0)
	for k := 0; ; k++ {
		ev, err := rd.Next()
		if err != nil {
			break
		}
		tap.Observe(ev, at(k))
	}
	var rec llm.Record
	tap.Fill(&rec)
	if !tap.ErrorSeen() || !tap.TerminalSeen() || rec.ErrorType != "insufficient_quota" ||
		rec.Interruption != llm.InterruptUpstreamErrorEvent || rec.Usage.HasInput || rec.TokenEvents != 0 {
		t.Errorf("failed stream: error %v terminal %v record %+v", tap.ErrorSeen(), tap.TerminalSeen(), rec)
	}
}

// Decoding allocates nothing, whatever the event.
func TestDecodeResponsesAllocatesNothing(t *testing.T) {
	var o Observation
	for _, data := range []string{rsCreated, rsTextDelta, rsFnAdded, rsMsgAdded, rsCompleted, rsIncomplete, rsFailed,
		rsErrNested, rsErrFlat, rsKeepalive, `{"type":"response.output_text.\u0064elta","delta":"x"}`} {
		ev := &Event{Data: []byte(data)}
		if n := testing.AllocsPerRun(100, func() { DecodeResponses(ev, &o) }); n != 0 {
			t.Errorf("%.40s…: %v allocations per event", data, n)
		}
	}
}

// refResponses decodes an event with encoding/json, following the shapes
// of wire.md 9.4–9.6.
func refResponses(event string, data []byte) (v obsView, incomplete bool, reason string) {
	top, ok := unmarshalObject(data)
	if !ok {
		v.Error = event == "error"
		return v, false, ""
	}
	typ, _ := top["type"].(string)
	var raw struct {
		Type json.RawMessage `json:"type"`
	}
	_ = json.Unmarshal(data, &raw)
	if bytes.IndexByte(raw.Type, '\\') >= 0 && len(raw.Type) > 66 {
		typ = "" // longer escaped names than any the decoder acts on
	}
	str := func(m map[string]any, k string) string { s, _ := m[k].(string); return s }
	codeOr := func(m map[string]any, withType bool) string {
		if s := str(m, "code"); s != "" {
			return s
		}
		if n, ok := m["code"].(json.Number); ok {
			return string(n)
		}
		if withType {
			return str(m, "type")
		}
		return ""
	}
	kind := responsesKindOf([]byte(typ))
	if event == "error" {
		kind = rkError
	}
	switch kind {
	case rkLegacyDelta:
		switch d := top["delta"].(type) {
		case string:
			v.TokenBearing = d != ""
		case map[string]any:
			v.TokenBearing = len(d) > 0
		case []any:
			v.TokenBearing = len(d) > 0
		}
	case rkDelta:
		v.TokenBearing = nonEmpty(top["delta"])
	case rkItemAdded:
		item, _ := top["item"].(map[string]any)
		switch str(item, "type") {
		case "function_call", "custom_tool_call", "mcp_call":
			v.TokenBearing = nonEmpty(item["name"])
		}
	case rkCompleted, rkIncomplete, rkFailed:
		v.Terminal, v.Error, incomplete = true, kind == rkFailed, kind == rkIncomplete
		resp, _ := top["response"].(map[string]any)
		if u, ok := resp["usage"].(map[string]any); ok {
			v.HasUsage, v.Usage = true, refOpenAIShapedUsage(u, "input_tokens", "output_tokens")
		}
		if d, ok := resp["incomplete_details"].(map[string]any); ok && incomplete {
			reason = str(d, "reason")
		}
		if e, ok := resp["error"].(map[string]any); ok && kind == rkFailed {
			v.ErrorType = codeOr(e, true)
		}
	case rkError:
		v.Error = true
		if e, ok := top["error"].(map[string]any); ok {
			v.ErrorType = codeOr(e, true)
		} else {
			v.ErrorType = codeOr(top, false)
		}
	}
	if v.TokenBearing {
		v.Tokens = 1
	}
	return v, incomplete, reason
}

// FuzzDecodeResponses checks that any event decodes without a panic, that
// the observation's invariants hold, and that for JSON encoding/json can
// represent the decoder agrees with a reference built on encoding/json.
func FuzzDecodeResponses(f *testing.F) {
	for _, name := range []string{"9.9.sse", "9.9-failed.sse"} {
		rd := NewReader(bytes.NewReader(loadTranscript(f, name)), 0)
		for {
			ev, err := rd.Next()
			if err != nil {
				break
			}
			f.Add(string(ev.Type), bytes.Clone(ev.Data))
		}
	}
	for _, data := range []string{rsFnAdded, rsCompleted, rsIncomplete, rsErrNested, rsErrFlat, rsKeepalive, rsEmptyDelta} {
		f.Add("", []byte(data))
	}
	f.Add("error", []byte(`{"type":"error","error":{"code":500}}`))
	f.Add("", []byte(`{"typ\u0065":"response.c\u006fmpleted","resp\u006fnse":{"usage":{"input_tokens":1,"input_tokens_details":{"cache_write_tokens":2}}}}`))
	f.Add("", []byte(" { \"type\" : \"response.refusal.delta\" , \"delta\" : \"x\" } "))
	f.Add("", []byte(`{"type":"response.incomplete","response":{"incomplete_details":null,"incomplete_details":{"reason":"content_filter"}}}`))
	f.Add("", []byte(`{"type":"response.output_item.added","item":{"type":"mcp_call","name":""}}`))
	f.Add("", []byte(`{"type":"response.failed","response":{"error":{"code":"","type":"t"},"usage":{"output_tokens":-1}}}`))
	f.Add("", []byte(`{"type":"`+strings.Repeat(`\u0061`, 20)+`.delta","delta":"x"}`))
	f.Fuzz(func(t *testing.T, event string, data []byte) {
		var o Observation
		DecodeResponses(&Event{Type: []byte(event), Data: data}, &o)
		checkInvariants(t, &o, data)
		if o.UsageOnly {
			t.Fatal("UsageOnly is a Chat Completions notion")
		}
		if o.IncompleteReason != nil && (!o.Incomplete || !aliases(o.IncompleteReason, data)) {
			t.Fatalf("IncompleteReason %q without Incomplete or not aliasing the data", o.IncompleteReason)
		}
		if !comparable(data) {
			if !json.Valid(data) && (o.TokenBearing || o.Terminal || o.usage.has != 0) {
				t.Fatalf("malformed event produced %+v", view(&o, llm.DialectResponses))
			}
			return
		}
		want, incomplete, reason := refResponses(event, data)
		got := view(&o, llm.DialectResponses)
		if got != want || o.Incomplete != incomplete || string(jsonscan.AppendUnescape(nil, o.IncompleteReason)) != reason {
			t.Fatalf("decoder %+v (incomplete %v %q)\nreference %+v (incomplete %v %q)",
				got, o.Incomplete, o.IncompleteReason, want, incomplete, reason)
		}
	})
}

// BenchmarkDecodeResponses is the cost of the event of every token, and of
// the terminal event once per stream.
func BenchmarkDecodeResponses(b *testing.B) {
	for _, c := range []struct{ name, data string }{{"text_delta", rsTextDelta}, {"completed", rsCompleted}} {
		b.Run(c.name, func(b *testing.B) {
			ev := &Event{Data: []byte(c.data)}
			var o Observation
			b.ReportAllocs()
			b.SetBytes(int64(len(c.data)))
			for b.Loop() {
				DecodeResponses(ev, &o)
			}
		})
	}
}

// A non-streamed Responses body: usage (cached and reasoning included),
// the reason of an incomplete answer, and the code of a failed one.
func TestResponsesBody(t *testing.T) {
	completed := []byte(`{"id":"resp_0cd5","object":"response","status":"completed","error":null,"incomplete_details":null,` +
		`"usage":{"input_tokens":12033,"input_tokens_details":{"cached_tokens":11904},"output_tokens":44,"output_tokens_details":{"reasoning_tokens":3},"total_tokens":12077}}`)
	a := ReadResponsesAnswer(completed)
	if u, ok := a.Usage, a.HasUsage; !ok || u != (llm.Usage{Input: 12033, CacheRead: 11904, Output: 44, Reasoning: 3, HasInput: true, HasOutput: true}) {
		t.Errorf("usage %+v (%v)", u, ok)
	}
	if r := a.IncompleteReason; r != nil {
		t.Errorf("a completed answer's incomplete reason %q", r)
	}
	if c, failed := a.Code, a.Failed; failed || c != nil {
		t.Errorf("a completed answer failed: %q", c)
	}
	incomplete := []byte(`{"status":"incomplete","incomplete_details":{"reason":"content_filter"},"usage":{"input_tokens":3,"output_tokens":2}}`)
	if r := ReadResponsesAnswer(incomplete).IncompleteReason; string(r) != "content_filter" {
		t.Errorf("incomplete reason %q", r)
	}
	for body, want := range map[string]string{
		`{"status":"failed","error":{"code":"insufficient_quota","message":"x"},"usage":null}`: "insufficient_quota",
		`{"status":"failed","error":{"type":"server_error"}}`:                                  "server_error",
		`{"status":"failed","error":null}`:                                                     "",
	} {
		a := ReadResponsesAnswer([]byte(body))
		if c, failed := a.Code, a.Failed; !failed || string(c) != want {
			t.Errorf("%s: failed %v, code %q; want %q", body, failed, c, want)
		}
	}
	if ReadResponsesAnswer([]byte(`{"status":"failed","usage":null}`)).HasUsage {
		t.Error("usage from a failed answer without any")
	}
}
