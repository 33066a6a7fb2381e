package proxy

// Unit tests of the pieces of attempt.go and upstream.go that decide an
// attempt's fate: the model rename, the reading of error bodies and error
// events, the retry decision, the routing table, the phase timer and the
// in-band error event that ends a broken stream.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strconv"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/sseparse"
)

// touch is touchAt now, on the timer's clock.
func (pt *phaseTimer) touch() { pt.touchAt(pt.clock()) }

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

func TestErrorFields(t *testing.T) {
	tests := []struct {
		name, body, typ, code string
	}{
		{"openai insufficient_quota",
			`{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`,
			"insufficient_quota", "insufficient_quota"},
		{"openai rate limit", `{"error":{"message":"slow down","type":"requests","param":null,"code":"rate_limit_exceeded"}}`,
			"requests", "rate_limit_exceeded"},
		{"openai null code", `{"error":{"message":"boom","type":"server_error","param":null,"code":null}}`, "server_error", ""},
		{"anthropic", `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_1"}`,
			"overloaded_error", ""},
		{"vllm numeric code", `{"error":{"object":"error","message":"boom","type":"InternalServerError","param":null,"code":500}}`,
			"InternalServerError", "500"},
		{"numeric type", `{"error":{"type":429}}`, "429", ""},
		{"fields in any order with spaces", "{ \"error\" : { \"code\" : \"c\" ,\n \"type\" : \"t\" } }", "t", "c"},
		{"bool type ignored", `{"error":{"type":true,"code":["x"]}}`, "", ""},
		{"missing error", `{"detail":"not found"}`, "", ""},
		{"string error", `{"error":"boom"}`, "", ""},
		{"null error", `{"error":null}`, "", ""},
		{"array error", `{"error":[{"type":"x"}]}`, "", ""},
		{"top-level type only", `{"type":"error"}`, "", ""},
		{"not JSON", `<html>502 Bad Gateway</html>`, "", ""},
		{"truncated", `{"error":{"type":"insufficient_quota"`, "", ""},
		{"empty", ``, "", ""},
		{"array body", `[{"error":{"type":"x"}}]`, "", ""},
		// JSON escapes are decoded: an escaped quota error is still one
		// (and so never retried).
		{"escaped", `{"error":{"type":"insufficient\u005fquota","code":"billing_hard_limit_reached\u0021"}}`,
			"insufficient_quota", "billing_hard_limit_reached!"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			typ, code := errorFields([]byte(tc.body))
			if typ != tc.typ || code != tc.code {
				t.Errorf("errorFields(%q) = (%q, %q), want (%q, %q)", tc.body, typ, code, tc.typ, tc.code)
			}
		})
	}
}

func TestErrorEventStatus(t *testing.T) {
	tests := []struct {
		typ  string
		want int
	}{
		{"overloaded_error", 529},
		{"api_error", 500},
		{"server_error", 500},
		{"internal_server_error", 500},
		{"InternalServerError", 500},
		{"rate_limit_error", 429},
		{"rate_limit_exceeded", 429},
		{"timeout_error", 504},
		{"not_found_error", 404},
		{"request_too_large", 413},
		{"service_unavailable", 503},
		{"ServiceUnavailableError", 503},
		{"503", 503},
		{"400", 400},
		{"599", 599},
		{"399", 0},
		{"600", 0},
		{"200", 0},
		{"5OO", 0},
		{"invalid_request_error", 0},
		{"insufficient_quota", 0},
		{"Overloaded_Error", 0},
		{"", 0},
	}
	for _, tc := range tests {
		if got := errorEventStatus([]byte(tc.typ)); got != tc.want {
			t.Errorf("errorEventStatus(%q) = %d, want %d", tc.typ, got, tc.want)
		}
	}
	if got := errorEventStatus(nil); got != 0 {
		t.Errorf("errorEventStatus(nil) = %d, want 0", got)
	}
}

func TestShouldRetry(t *testing.T) {
	def := defaultRetryPolicy()
	custom := retryPolicy{maxAttempts: 3, statuses: map[int]bool{418: true}}
	none := retryPolicy{}
	hdr := func(v string) http.Header {
		h := http.Header{}
		if v != "" {
			h.Set("X-Should-Retry", v)
		}
		return h
	}
	tests := []struct {
		name          string
		p             retryPolicy
		status        int
		should        string // X-Should-Retry
		errType, code string
		want          bool
	}{
		{"429", def, 429, "", "requests", "rate_limit_exceeded", true},
		{"408", def, 408, "", "", "", true},
		{"409", def, 409, "", "", "", true},
		{"500", def, 500, "", "server_error", "", true},
		{"502", def, 502, "", "", "", true},
		{"503", def, 503, "", "", "", true},
		{"504", def, 504, "", "", "", true},
		{"529", def, 529, "", "overloaded_error", "", true},
		{"400", def, 400, "", "invalid_request_error", "", false},
		{"401", def, 401, "", "", "invalid_api_key", false},
		{"404", def, 404, "", "", "model_not_found", false},
		{"422", def, 422, "", "", "", false},
		{"501 not listed", def, 501, "", "", "", false},
		{"503 x-should-retry false", def, 503, "false", "", "", false},
		{"429 x-should-retry false", def, 429, "false", "", "", false},
		{"400 x-should-retry true", def, 400, "true", "", "", true},
		{"501 x-should-retry true", def, 501, "true", "", "", true},
		{"x-should-retry is case sensitive like the SDKs", def, 400, "TRUE", "", "", false},
		{"x-should-retry other value ignored", def, 503, "no", "", "", true},
		{"insufficient_quota type", def, 429, "", "insufficient_quota", "", false},
		{"insufficient_quota code", def, 429, "", "requests", "insufficient_quota", false},
		{"insufficient_quota beats x-should-retry true", def, 429, "true", "insufficient_quota", "insufficient_quota", false},
		{"billing code", def, 429, "", "insufficient_quota", "credit_balance_exhausted", false},
		{"anthropic billing_error", def, 500, "", "billing_error", "", false},
		{"authentication_error on a 500", def, 500, "", "authentication_error", "", false},
		{"invalid_request_error code on a 503", def, 503, "", "", "invalid_request_error", false},
		{"custom statuses: listed", custom, 418, "", "", "", true},
		{"custom statuses: default one not listed", custom, 429, "", "", "", false},
		{"zero policy", none, 500, "", "", "", false},
		{"zero policy, x-should-retry true", none, 500, "true", "", "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := shouldRetry(tc.p, tc.status, hdr(tc.should), tc.errType, tc.code); got != tc.want {
				t.Errorf("shouldRetry(status %d, x-should-retry %q, type %q, code %q) = %v, want %v",
					tc.status, tc.should, tc.errType, tc.code, got, tc.want)
			}
		})
	}
}

func TestStatusResult(t *testing.T) {
	tests := []struct {
		status int
		want   string
	}{
		{400, resultClientError},
		{401, resultClientError},
		{404, resultClientError},
		{409, resultClientError},
		{413, resultClientError},
		{408, resultTimeout},
		{429, resultRateLimited},
		{500, resultServerError},
		{501, resultServerError},
		{502, resultServerError},
		{503, resultServerError},
		{504, resultTimeout},
		{529, resultOverloaded},
		{599, resultServerError},
	}
	for _, tc := range tests {
		if got := statusResult(tc.status); got != tc.want {
			t.Errorf("statusResult(%d) = %q, want %q", tc.status, got, tc.want)
		}
	}
}

// routingFixture builds the routing of a config with three upstreams ("a"
// serves both dialects, "oa" only OpenAI, "an" only Anthropic) and routes
// with renames.
func routingFixture() (*config.Config, *routing) {
	up := func(name string, dialects ...string) config.Upstream {
		u := config.DefaultUpstream()
		u.Name, u.BaseURL, u.Dialects = name, "http://127.0.0.1:1", dialects
		return u
	}
	cfg := &config.Config{
		Upstreams: []config.Upstream{up("a", "openai", "anthropic"), up("oa", "openai"), up("an", "anthropic")},
		Routes: []config.Route{
			{Models: []string{"gpt-4o*"}, Upstreams: []string{"oa", "a"}, Rename: map[string]string{"a": "dep-4o"}},
			{Models: []string{"claude-*", "sonnet"}, Upstreams: []string{"an", "a"}},
			{Models: []string{"gpt-4o-mini"}, Upstreams: []string{"an"}}, // shadowed by the first route
			{Models: []string{"only-an"}, Upstreams: []string{"an"}, Rename: map[string]string{"an": "x"}},
		},
	}
	byName := map[string]*upstream{}
	var ordered []*upstream
	for i := range cfg.Upstreams {
		u := &upstream{cfg: &cfg.Upstreams[i]}
		byName[u.cfg.Name] = u
		ordered = append(ordered, u)
	}
	return cfg, newRouting(cfg, byName, ordered)
}

// routeTargetNames renders targets as "upstream" or "upstream=model".
func routeTargetNames(ts []target) []string {
	out := []string{}
	for _, t := range ts {
		s := t.up.cfg.Name
		if t.model != "" {
			s += "=" + t.model
		}
		out = append(out, s)
	}
	return out
}

func TestRoutingTargets(t *testing.T) {
	_, rt := routingFixture()
	tests := []struct {
		name  string
		d     llm.Dialect
		model string
		want  []string
	}{
		{"route in order with rename", llm.DialectOpenAI, "gpt-4o-mini", []string{"oa", "a=dep-4o"}},
		{"route filtered by dialect", llm.DialectAnthropic, "gpt-4o-mini", []string{"a=dep-4o"}},
		{"second route, second pattern", llm.DialectAnthropic, "sonnet", []string{"an", "a"}},
		{"second route for openai", llm.DialectOpenAI, "claude-3-5", []string{"a"}},
		{"route serving none of the dialect", llm.DialectOpenAI, "only-an", []string{}},
		{"no route: every upstream of the dialect in file order", llm.DialectOpenAI, "llama", []string{"a", "oa"}},
		{"no route, anthropic", llm.DialectAnthropic, "llama", []string{"a", "an"}},
		{"* does not cross /", llm.DialectOpenAI, "gpt-4o/ft", []string{"a", "oa"}},
		{"pattern is anchored", llm.DialectOpenAI, "x-gpt-4o", []string{"a", "oa"}},
		{"empty model", llm.DialectOpenAI, "", []string{"a", "oa"}},
		{"forwarded without a route: the first upstream", llm.DialectNone, "llama", []string{"a"}},
		{"forwarded without a model: the first upstream", llm.DialectNone, "", []string{"a"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := routeTargetNames(rt.targets(tc.d, tc.model)); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("targets(%s, %q) = %v, want %v", tc.d, tc.model, got, tc.want)
			}
		})
	}
}

// A forwarded request (another /v1/* path) is routed by the dialect its
// path and headers suggest, so that e.g. count_tokens reaches an Anthropic
// upstream; only when no upstream serves that dialect does it go to the
// first upstream.
func TestExchangeTargetsForwarded(t *testing.T) {
	cfg, rt := routingFixture()
	g := &Gateway{cfg: cfg, routing: rt}
	tests := []struct {
		name, method, path string
		hdr                map[string]string
		model              string
		want               []string
	}{
		{"models list guessed openai", http.MethodGet, "/v1/models", nil, "", []string{"a", "oa"}},
		{"count_tokens guessed anthropic", http.MethodPost, "/v1/messages/count_tokens", nil, "", []string{"a", "an"}},
		{"x-api-key guesses anthropic", http.MethodGet, "/v1/models", map[string]string{"X-Api-Key": "k"}, "", []string{"a", "an"}},
		{"metered model with a route", http.MethodPost, "/v1/embeddings", nil, "gpt-4o-e", []string{"oa", "a=dep-4o"}},
		{"route of the other dialect falls back to the first upstream", http.MethodPost, "/v1/embeddings", nil, "only-an", []string{"a"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := http.NewRequest(tc.method, "http://gw"+tc.path, nil)
			for k, v := range tc.hdr {
				r.Header.Set(k, v)
			}
			ex := &exchange{g: g, r: r}
			ex.rec.Dialect = llm.DialectNone
			if got := routeTargetNames(ex.targets(tc.model)); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("targets = %v, want %v", got, tc.want)
			}
		})
	}
}

// phaseTimerCause waits (bounded) for ctx to end and returns its cause.
func phaseTimerCause(t *testing.T, ctx context.Context) error {
	t.Helper()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-time.After(5 * time.Second):
		t.Fatal("the phase timer never fired")
		return nil
	}
}

// The phase timer fires with the cause of the phase it is in, on a real
// timer with tiny durations; only the cause is checked.
func TestPhaseTimerFiresWithPhaseCause(t *testing.T) {
	tests := []struct {
		name  string
		start func(pt *phaseTimer)
		want  error
	}{
		{"headers", func(pt *phaseTimer) { pt.enter(phaseHeaders, time.Millisecond) }, errHeaderTimeout},
		{"first token", func(pt *phaseTimer) { pt.enter(phaseFirstToken, time.Millisecond) }, errFirstTokenTimeout},
		{"idle after the first token", func(pt *phaseTimer) { pt.firstToken() }, errIdleTimeout},
		{"timer reused by the next phase", func(pt *phaseTimer) {
			pt.enter(phaseHeaders, time.Hour)
			pt.enter(phaseFirstToken, time.Millisecond)
		}, errFirstTokenTimeout},
		{"timer stopped by a phase without timeout, then reused", func(pt *phaseTimer) {
			pt.enter(phaseHeaders, time.Hour)
			pt.enter(phaseNone, 0)
			pt.enter(phaseIdle, time.Millisecond)
		}, errIdleTimeout},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			pt := newPhaseTimer(cancel, time.Millisecond)
			defer pt.stop()
			tc.start(pt)
			if got := phaseTimerCause(t, ctx); !errors.Is(got, tc.want) {
				t.Errorf("cause %v, want %v", got, tc.want)
			}
		})
	}
}

// A fire whose phase has moved on (or whose timer was stopped) does
// nothing; touch moves the idle deadline, and only in the idle phase. The
// timer's callback is called by hand with the deadline set as if its time
// had come, so nothing depends on the scheduler.
func TestPhaseTimerStaleAndTouch(t *testing.T) {
	expired := func(pt *phaseTimer) { pt.deadline.Store(0) }
	tests := []struct {
		name string
		idle time.Duration
		run  func(pt *phaseTimer)
		want error // nil: not cancelled
	}{
		{"expired headers phase fires", time.Hour, func(pt *phaseTimer) {
			pt.enter(phaseHeaders, time.Hour)
			expired(pt)
			pt.fire()
		}, errHeaderTimeout},
		{"headers timer firing after the first-token phase began", time.Hour, func(pt *phaseTimer) {
			pt.enter(phaseHeaders, time.Hour)
			pt.enter(phaseFirstToken, time.Hour)
			pt.fire()
		}, nil},
		{"first-token timer firing after the first token", time.Hour, func(pt *phaseTimer) {
			pt.enter(phaseFirstToken, time.Hour)
			pt.firstToken()
			pt.fire()
		}, nil},
		{"phase without timeout", time.Hour, func(pt *phaseTimer) {
			pt.enter(phaseHeaders, time.Hour)
			pt.enter(phaseNone, 0)
			pt.fire()
		}, nil},
		{"phase with timeout 0", time.Hour, func(pt *phaseTimer) {
			pt.enter(phaseFirstToken, 0)
			pt.fire()
		}, nil},
		{"stopped", time.Hour, func(pt *phaseTimer) {
			pt.enter(phaseFirstToken, time.Hour)
			pt.stop()
			pt.fire()
		}, nil},
		{"stopped with an expired deadline", time.Hour, func(pt *phaseTimer) {
			pt.enter(phaseFirstToken, time.Hour)
			pt.stop()
			expired(pt)
			pt.fire()
		}, nil},
		{"expired idle phase fires", time.Hour, func(pt *phaseTimer) {
			pt.firstToken()
			expired(pt)
			pt.fire()
		}, errIdleTimeout},
		{"touch extends the idle phase", time.Hour, func(pt *phaseTimer) {
			pt.firstToken()
			expired(pt)
			pt.touch()
			pt.fire()
		}, nil},
		{"touch does not extend the first-token phase", time.Hour, func(pt *phaseTimer) {
			pt.enter(phaseFirstToken, time.Hour)
			expired(pt)
			pt.touch()
			pt.fire()
		}, errFirstTokenTimeout},
		{"touch does not extend the headers phase", time.Hour, func(pt *phaseTimer) {
			pt.enter(phaseHeaders, time.Hour)
			expired(pt)
			pt.touch()
			pt.fire()
		}, errHeaderTimeout},
		{"idle timeout off: no timer after the first token", 0, func(pt *phaseTimer) {
			pt.enter(phaseFirstToken, time.Hour)
			pt.firstToken()
			pt.touch()
			pt.fire()
		}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			pt := newPhaseTimer(cancel, tc.idle)
			defer pt.stop()
			tc.run(pt)
			got := context.Cause(ctx)
			if ctx.Err() == nil {
				got = nil
			}
			if !errors.Is(got, tc.want) || (got == nil) != (tc.want == nil) {
				t.Errorf("cause %v, want %v", got, tc.want)
			}
		})
	}
}

// Touching the idle phase on a real timer keeps it from firing at its
// first deadline: the timer is re-armed for a full idle period from the
// touch, so a touch made long before the deadline cannot end the stream
// early. Only the cause is checked once the stream is left alone.
func TestPhaseTimerTouchRearms(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	pt := newPhaseTimer(cancel, 5*time.Millisecond)
	defer pt.stop()
	pt.firstToken()
	for range 3 {
		pt.touch()
	}
	if got := phaseTimerCause(t, ctx); !errors.Is(got, errIdleTimeout) {
		t.Errorf("cause %v, want %v", got, errIdleTimeout)
	}
}

// The error event that ends a broken stream is one complete SSE event that
// the dialect's SDK raises on: OpenAI a data payload whose only top-level
// member is an error object, Anthropic an `event: error` whose data has
// type "error" and an error object. The gateway's own tap reads it as an
// error event too.
func TestStreamErrorEvent(t *testing.T) {
	tests := []struct {
		d        llm.Dialect
		why      llm.Interruption
		wantType string // error.type
		wantCode string // OpenAI error.code
	}{
		{llm.DialectOpenAI, llm.InterruptIdleTimeout, "server_error", "upstream_timeout"},
		{llm.DialectOpenAI, llm.InterruptTimeout, "server_error", "upstream_timeout"},
		{llm.DialectOpenAI, llm.InterruptUpstreamEOF, "server_error", "upstream_stream_broken"},
		{llm.DialectOpenAI, llm.InterruptProtocolError, "server_error", "upstream_stream_broken"},
		{llm.DialectAnthropic, llm.InterruptIdleTimeout, "timeout_error", ""},
		{llm.DialectAnthropic, llm.InterruptTimeout, "timeout_error", ""},
		{llm.DialectAnthropic, llm.InterruptUpstreamEOF, "api_error", ""},
		{llm.DialectAnthropic, llm.InterruptProtocolError, "api_error", ""},
	}
	for _, tc := range tests {
		t.Run(tc.d.String()+"/"+tc.why.String(), func(t *testing.T) {
			raw := streamErrorEvent(tc.d, tc.why)
			rd := sseparse.NewReader(bytes.NewReader(raw), 0)
			ev, err := rd.Next()
			if err != nil {
				t.Fatalf("%q is not an SSE event: %v", raw, err)
			}
			evType, data := string(ev.Type), append([]byte(nil), ev.Data...)
			var tap sseparse.Tap
			tap.Reset(tc.d)
			obs := tap.Observe(ev, time.Now())
			if !obs.Error || string(obs.ErrorType) != tc.wantType || obs.Terminal || obs.TokenBearing {
				t.Errorf("tap reads it as error=%v type=%q terminal=%v token=%v", obs.Error, obs.ErrorType, obs.Terminal, obs.TokenBearing)
			}
			if _, err := rd.Next(); err == nil || rd.Truncated() {
				t.Errorf("more than one event, or an unterminated one, in %q", raw)
			}
			type apiErr struct {
				Type    string  `json:"type"`
				Message string  `json:"message"`
				Code    *string `json:"code"`
			}
			var top map[string]json.RawMessage
			if err := json.Unmarshal(data, &top); err != nil {
				t.Fatalf("data is not a JSON object: %v: %s", err, data)
			}
			var e apiErr
			if err := json.Unmarshal(top["error"], &e); err != nil {
				t.Fatalf("no error object in %s: %v", data, err)
			}
			if e.Type != tc.wantType || e.Message == "" {
				t.Errorf("error type %q message %q, want type %q and a message", e.Type, e.Message, tc.wantType)
			}
			switch tc.d {
			case llm.DialectOpenAI:
				if evType != "" || len(top) != 1 {
					t.Errorf("event type %q, members %d: want a default event whose data holds only error", evType, len(top))
				}
				if e.Code == nil || *e.Code != tc.wantCode {
					t.Errorf("error.code %v, want %q", e.Code, tc.wantCode)
				}
			case llm.DialectAnthropic:
				if evType != "error" || string(top["type"]) != `"error"` {
					t.Errorf("event %q data type %s, want event: error with type \"error\"", evType, top["type"])
				}
			}
		})
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
