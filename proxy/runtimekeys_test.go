package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/keystore"
	"github.com/tollgate-llm/tollgate/mockllm"
)

// keysWorld is a govWorld with runtime keys on, in a Local store, and the
// operational log kept.
type keysWorld struct {
	*govWorld
	store *keystore.Local
	keys  *keystore.Watcher
	mu    sync.Mutex
	ops   bytes.Buffer
}

func (kw *keysWorld) Write(p []byte) (int, error) {
	kw.mu.Lock()
	defer kw.mu.Unlock()
	return kw.ops.Write(p)
}

func (kw *keysWorld) opsLog() string {
	kw.mu.Lock()
	defer kw.mu.Unlock()
	return kw.ops.String()
}

// newKeysWorld builds a keysWorld; edit may change the config further.
func newKeysWorld(t *testing.T, mo mockllm.Options, setup govSetup, edit func(*config.Config)) *keysWorld {
	t.Helper()
	kw := &keysWorld{}
	var err error
	if kw.store, err = keystore.NewLocal(""); err != nil {
		t.Fatal(err)
	}
	kw.keys = keystore.NewWatcher(kw.store, keystore.WatchOptions{Interval: time.Hour})
	setup.options = func(o *Options) {
		o.RuntimeKeys = kw.keys
		o.Logger = slog.New(slog.NewTextHandler(kw, nil))
	}
	kw.govWorld = newGovWorldWith(t, mo, true, func(c *config.Config) {
		c.Admin.TokenEnv, c.Admin.Token = "ADMIN_TOKEN", adminToken
		c.RuntimeKeys.Enabled = true
		if edit != nil {
			edit(c)
		}
	}, setup)
	if err := kw.keys.Start(context.Background(), kw.tg.gw.SetRuntimeKeys); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		kw.keys.Close()
		_ = kw.store.Close()
	})
	return kw
}

// adminDo sends an admin request with the admin token and the actor "ana".
func adminDo(t *testing.T, method, url, body string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(context.Background(), method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("X-Tollgate-Actor", "ana@example.com")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// issue creates a runtime key through the admin API and returns its secret.
func (kw *keysWorld) issue(t *testing.T, body string) (string, KeyView) {
	t.Helper()
	code, b := adminDo(t, http.MethodPost, kw.tg.URL+"/admin/keys", body)
	if code != http.StatusCreated {
		t.Fatalf("POST /admin/keys %s: %d %s", body, code, b)
	}
	var iss IssuedKey
	if err := json.Unmarshal(b, &iss); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(iss.Key, "tg-") || sha(iss.Key) != iss.Record.SHA256 {
		t.Fatalf("issued %q with sha256 %s", iss.Key, iss.Record.SHA256)
	}
	return iss.Key, iss.Record
}

// messages sends an Anthropic Messages request with key in x-api-key.
func (kw *keysWorld) messages(t *testing.T, key string) (int, string) {
	t.Helper()
	resp, b := post(t, kw.tg.URL+"/v1/messages",
		`{"model":"claude-test","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`,
		map[string]string{"x-api-key": key, "anthropic-version": "2023-06-01"})
	return resp.StatusCode, string(b)
}

// chat sends an OpenAI chat completion with key as its bearer token.
func (kw *keysWorld) chat(t *testing.T, key string) (int, string) {
	t.Helper()
	resp, b := post(t, kw.tg.URL+"/v1/chat/completions", chatBody("gpt-test", false),
		map[string]string{"Authorization": "Bearer " + key})
	return resp.StatusCode, string(b)
}

// adminMessage is an admin error's message.
func adminMessage(b []byte) string {
	var e struct {
		Error struct{ Message string } `json:"error"`
	}
	_ = json.Unmarshal(b, &e)
	return e.Error.Message
}

// TestRuntimeKeysAdminInput: the keys' admin API needs the admin token, and
// refuses bad input with a 400 that says what is wrong; a taken name is a
// 409, a name nobody has a 404.
func TestRuntimeKeysAdminInput(t *testing.T) {
	kw := newKeysWorld(t, mockllm.Options{OutputTokens: 3}, govSetup{}, nil)
	base := kw.tg.URL + "/admin/keys"
	for _, tok := range []string{"", "wrong-token-0123456789"} {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, base, strings.NewReader(`{"name":"dev"}`))
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("token %q: %d, want 401", tok, resp.StatusCode)
		}
	}
	for _, c := range []struct{ name, body, want string }{
		{"not JSON", `name=dev`, "the body is not a key request"},
		{"unknown field", `{"name":"dev","rmp":5}`, `unknown field "rmp"`},
		{"wrong type", `{"name":"dev","rpm":"5"}`, "the body is not a key request"},
		{"no name", `{"team":"search"}`, "name: is required"},
		{"bad name", `{"name":"Dev Key"}`, `name: "Dev Key" may hold only a-z`},
		{"reserved name", `{"name":"none"}`, `"none" is reserved`},
		{"route name", `{"name":"audit"}`, `"audit" is reserved`},
		{"a [[keys]] name", `{"name":"alpha"}`, `"alpha" is the name of a [[keys]] table`},
		{"unknown team", `{"name":"dev","team":"nope"}`, `team: "nope" is not a [[teams]] name`},
		{"zero limit", `{"name":"dev","rpm":0}`, "rpm: a limit of 0 would refuse every request"},
		{"negative budget", `{"name":"dev","cost_per_day_usd":-1}`, "cost_per_day_usd: must be greater than 0"},
		{"two expiries", `{"name":"dev","expires_in":"1h","expires_at":"2030-01-01T00:00:00Z"}`, "not both"},
		{"past expiry", `{"name":"dev","expires_at":"2001-01-01T00:00:00Z"}`, "is not in the future"},
		{"bad duration", `{"name":"dev","expires_in":"soon"}`, `expires_in "soon" is not a positive duration`},
		{"bad label", `{"name":"dev","labels":{"a b":"x"}}`, `labels: name "a b" may hold only`},
		{"two documents", `{"name":"dev"}{"name":"eve"}`, "more than one JSON document"},
	} {
		code, b := adminDo(t, http.MethodPost, base, c.body)
		if code != http.StatusBadRequest || !strings.Contains(adminMessage(b), c.want) {
			t.Errorf("%s: %d %s, want 400 saying %q", c.name, code, b, c.want)
		}
	}
	if snap, _ := kw.store.Snapshot(context.Background()); len(snap.Keys) != 0 {
		t.Fatalf("bad requests stored keys: %+v", snap.Keys)
	}

	kw.issue(t, `{"name":"dev","team":"search"}`)
	if code, b := adminDo(t, http.MethodPost, base, `{"name":"dev"}`); code != http.StatusConflict {
		t.Errorf("second dev: %d %s, want 409", code, b)
	}
	for _, c := range []struct {
		method, path, body string
		code               int
		want               string
	}{
		{http.MethodPost, "/nobody/revoke", "", http.StatusNotFound, `no runtime key is named "nobody"`},
		{http.MethodGet, "/nobody", "", http.StatusNotFound, `no key is named "nobody"`},
		{http.MethodPost, "/alpha/revoke", "", http.StatusConflict, "is a [[keys]] table in gateway.toml"},
		{http.MethodPost, "/dev/rotate", `{"team":"ads"}`, http.StatusBadRequest, "a rotation takes only expires_at or expires_in"},
		{http.MethodGet, "/audit?limit=0", "", http.StatusBadRequest, "limit must be a whole number from 1 to 10000"},
		{http.MethodGet, "/audit?limit=x", "", http.StatusBadRequest, "limit must be a whole number"},
	} {
		code, b := adminDo(t, c.method, base+c.path, c.body)
		if code != c.code || !strings.Contains(adminMessage(b), c.want) {
			t.Errorf("%s %s: %d %s, want %d saying %q", c.method, c.path, code, b, c.code, c.want)
		}
	}
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, base+"/dev/revoke", nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("X-Tollgate-Actor", strings.Repeat("a", 129))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("an X-Tollgate-Actor of 129 characters: %d, want 400", resp.StatusCode)
	}
}

// TestRuntimeKeysOff: without [runtime_keys], /admin/keys says how to turn
// them on.
func TestRuntimeKeysOff(t *testing.T) {
	w := newGovWorld(t, mockllm.Options{}, true, func(c *config.Config) {
		c.Admin.TokenEnv, c.Admin.Token = "ADMIN_TOKEN", adminToken
	})
	code, b := adminDo(t, http.MethodGet, w.tg.URL+"/admin/keys", "")
	if code != http.StatusNotFound || !strings.Contains(string(b), "[runtime_keys] enabled = true") {
		t.Errorf("GET /admin/keys with runtime keys off: %d %s", code, b)
	}
}

// TestRuntimeKeyLifecycle: a key issued through the admin API admits its
// caller at once, with its name and team on the record and its spend under
// its name; rotated, the old secret is refused (401 saying it was
// replaced) and the new one admitted; revoked, it is refused (401 saying
// so) in the caller's dialect with nothing sent upstream; expired, refused
// saying when. An unknown key is still only "invalid". No secret is ever
// in a log line, and the audit log names who did what.
func TestRuntimeKeyLifecycle(t *testing.T) {
	kw := newKeysWorld(t, mockllm.Options{OutputTokens: 3}, govSetup{}, nil)
	secret, view := kw.issue(t, `{"name":"dev-ana","team":"search","tokens_per_day":100000,"expires_in":"24h","labels":{"email":"ana@example.com"}}`)
	if view.Status != "active" || view.Team != "search" || view.TokensPerDay == nil || view.Expires.IsZero() ||
		view.CreatedBy != "ana@example.com" || view.Labels["email"] != "ana@example.com" {
		t.Errorf("issued %+v", view)
	}
	if code, b := kw.messages(t, secret); code != http.StatusOK {
		t.Fatalf("the new key: %d %s", code, b)
	}
	rec := kw.tg.record(t)
	if rec.KeyID != "dev-ana" || rec.Team != "search" {
		t.Errorf("record key %q team %q, want dev-ana, search", rec.KeyID, rec.Team)
	}
	code, b := adminGet(t, kw.tg.URL, "/admin/spend?key=dev-ana", adminToken)
	var sp SpendReport
	if code != http.StatusOK || json.Unmarshal(b, &sp) != nil || sp.Total.Requests != 1 || sp.Rows[0].Team != "search" {
		t.Errorf("/admin/spend?key=dev-ana: %d %s", code, b)
	}
	code, b = adminGet(t, kw.tg.URL, "/admin/limits", adminToken)
	if code != http.StatusOK || !strings.Contains(string(b), `"id": "dev-ana"`) {
		t.Errorf("/admin/limits does not show the runtime key's budget: %d %s", code, b)
	}

	code, b = adminDo(t, http.MethodPost, kw.tg.URL+"/admin/keys/dev-ana/rotate", "")
	var iss IssuedKey
	if code != http.StatusOK || json.Unmarshal(b, &iss) != nil || iss.Key == secret || sha(iss.Key) != iss.Record.SHA256 {
		t.Fatalf("rotate: %d %s", code, b)
	}
	if code, b := kw.messages(t, secret); code != http.StatusUnauthorized || !strings.Contains(b, "was replaced by a new one") ||
		!strings.Contains(b, `"type":"authentication_error"`) {
		t.Errorf("the rotated-out key: %d %s", code, b)
	}
	kw.tg.record(t)
	if code, b := kw.chat(t, iss.Key); code != http.StatusOK {
		t.Fatalf("the rotated key: %d %s", code, b)
	}
	kw.tg.record(t)

	before := kw.mock.Stats().Requests
	if code, b := adminDo(t, http.MethodPost, kw.tg.URL+"/admin/keys/dev-ana/revoke", ""); code != http.StatusOK ||
		!strings.Contains(string(b), `"status": "revoked"`) {
		t.Fatalf("revoke: %d %s", code, b)
	}
	if code, b := adminDo(t, http.MethodPost, kw.tg.URL+"/admin/keys/dev-ana/revoke", ""); code != http.StatusConflict {
		t.Errorf("second revoke: %d %s, want 409", code, b)
	}
	code, body := kw.chat(t, iss.Key)
	if code != http.StatusUnauthorized || !strings.Contains(body, "was revoked at") || !strings.Contains(body, `"error":{`) {
		t.Errorf("revoked key, OpenAI dialect: %d %s", code, body)
	}
	kw.tg.record(t)
	code, body = kw.messages(t, iss.Key)
	if code != http.StatusUnauthorized || !strings.Contains(body, "was revoked at") || !strings.Contains(body, `"type":"error"`) {
		t.Errorf("revoked key, Anthropic dialect: %d %s", code, body)
	}
	kw.tg.record(t)
	if after := kw.mock.Stats().Requests; after != before {
		t.Errorf("a revoked key's requests reached the upstream: %d before, %d after", before, after)
	}
	if code, body := kw.chat(t, "tg-nobody-has-this-key-000"); code != http.StatusUnauthorized ||
		!strings.Contains(body, "it is not one of this gateway's keys") {
		t.Errorf("unknown key: %d %s", code, body)
	}
	kw.tg.record(t)

	// The name may be issued again; it expires with the clock.
	again, _ := kw.issue(t, `{"name":"dev-ana","team":"search","expires_in":"1h"}`)
	if code, b := kw.chat(t, again); code != http.StatusOK {
		t.Fatalf("re-issued: %d %s", code, b)
	}
	kw.tg.record(t)
	kw.clock.Advance(time.Hour)
	if code, body := kw.chat(t, again); code != http.StatusUnauthorized || !strings.Contains(body, "expired at") {
		t.Errorf("expired key: %d %s", code, body)
	}
	kw.tg.record(t)

	code, b = adminDo(t, http.MethodGet, kw.tg.URL+"/admin/keys/audit", "")
	var audit AuditReport
	if code != http.StatusOK || json.Unmarshal(b, &audit) != nil {
		t.Fatalf("audit: %d %s", code, b)
	}
	var got []string
	for _, e := range audit.Events {
		got = append(got, e.Action)
		if e.Actor != "ana@example.com" || e.Name != "dev-ana" || e.Remote == "" {
			t.Errorf("audit event %+v", e)
		}
	}
	if strings.Join(got, ",") != "create,revoke,rotate,create" {
		t.Errorf("audit actions %v, want create, revoke, rotate, create (newest first)", got)
	}
	code, b = adminDo(t, http.MethodGet, kw.tg.URL+"/admin/keys", "")
	if code != http.StatusOK || !strings.Contains(string(b), `"source": "config"`) || !strings.Contains(string(b), `"status": "expired"`) {
		t.Errorf("list: %d %s", code, b)
	}

	logs := kw.opsLog() + kw.tg.logs.String()
	for _, s := range []string{secret, iss.Key, again} {
		if strings.Contains(logs, s) || strings.Contains(string(b), s) {
			t.Errorf("a secret is in the logs or the listing")
		}
	}
	if !strings.Contains(kw.opsLog(), "runtime key revoke") {
		t.Errorf("no operational log line for the revocation:\n%s", kw.opsLog())
	}
}

// TestRevokedKeysStreamFinishes: a stream admitted before its key is
// revoked runs to its end and is billed; the key's next request is
// refused.
func TestRevokedKeysStreamFinishes(t *testing.T) {
	gate := newGateUpstream(
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-test\",\"content\":[],\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n"+
			"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"+
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hel\"}}\n\n",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"lo\"}}\n\n"+
			"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"+
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":2}}\n\n"+
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	kw := newKeysWorld(t, mockllm.Options{}, govSetup{upstream: func(http.Handler) http.Handler { return gate }}, nil)
	secret, _ := kw.issue(t, `{"name":"dev","team":"search"}`)
	done := make(chan sendResult, 1)
	go func() {
		done <- sendRequest(context.Background(), http.MethodPost, kw.tg.URL+"/v1/messages", "application/json",
			`{"model":"claude-test","max_tokens":10,"stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			map[string]string{"x-api-key": secret, "anthropic-version": "2023-06-01"})
	}()
	gate.waitArrived(t)
	if code, b := adminDo(t, http.MethodPost, kw.tg.URL+"/admin/keys/dev/revoke", ""); code != http.StatusOK {
		t.Fatalf("revoke: %d %s", code, b)
	}
	gate.open()
	res := awaitResult(t, done)
	if res.resp.StatusCode != http.StatusOK || !strings.Contains(string(res.body), "message_stop") {
		t.Errorf("the open stream: %d %q, want it whole", res.resp.StatusCode, res.body)
	}
	rec := kw.tg.record(t)
	if rec.KeyID != "dev" || rec.Usage.Output != 2 || rec.CostMicros == 0 {
		t.Errorf("the stream's record: key %q, output %d, cost %d", rec.KeyID, rec.Usage.Output, rec.CostMicros)
	}
	if code, b := kw.messages(t, secret); code != http.StatusUnauthorized {
		t.Errorf("after the revocation: %d %s", code, b)
	}
}

// TestRuntimeKeyLimitsAndShadowing: a runtime key's limits are the
// limiter's, by its name; a runtime key named as a [[keys]] table (written
// to the store behind the admin API's back) is shadowed: the file wins, its
// secret admits nobody; a reload that removes a key's team orphans it.
func TestRuntimeKeyLimitsAndShadowing(t *testing.T) {
	kw := newKeysWorld(t, mockllm.Options{OutputTokens: 3}, govSetup{}, nil)
	secret, _ := kw.issue(t, `{"name":"ci","team":"ads","rpm":1}`)
	if code, b := kw.chat(t, secret); code != http.StatusOK {
		t.Fatalf("first: %d %s", code, b)
	}
	kw.tg.record(t)
	if code, b := kw.chat(t, secret); code != http.StatusTooManyRequests || !strings.Contains(b, `key \"ci\"`) {
		t.Errorf("second in the minute: %d %s, want 429 naming key ci", code, b)
	}
	kw.tg.record(t)

	ctx := context.Background()
	shadow, sum, _ := keystore.Secret()
	k := keystore.Key{Key: config.Key{Name: "alpha", SHA256: sum, Team: "ads"}, Created: kw.clock.Now()}
	if err := kw.store.Create(ctx, k, keystore.Event{Action: "create", Name: "alpha", SHA256: sum}); err != nil {
		t.Fatal(err)
	}
	if err := kw.keys.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if code, b := kw.chat(t, shadow); code != http.StatusUnauthorized || !strings.Contains(b, "it is not one of this gateway's keys") {
		t.Errorf("a runtime key shadowed by [[keys]] alpha: %d %s", code, b)
	}
	kw.tg.record(t)
	if code, b := kw.chat(t, keyAlpha); code != http.StatusOK {
		t.Errorf("[[keys]] alpha itself: %d %s", code, b)
	}
	kw.tg.record(t)
	if !strings.Contains(kw.opsLog(), "runtime key shadowed by a [[keys]] table") {
		t.Error("no warning for the shadowed runtime key")
	}

	// A reload keeps the runtime keys; one that drops the key's team
	// leaves it admitting nobody.
	next := *kw.tg.gw.Config()
	if _, err := kw.tg.gw.Reload(&next); err != nil {
		t.Fatal(err)
	}
	kw.clock.Advance(time.Minute)
	if code, b := kw.chat(t, secret); code != http.StatusOK {
		t.Errorf("after a reload: %d %s", code, b)
	}
	kw.tg.record(t)
	next.Teams = next.Teams[:1]
	next.Keys = next.Keys[:1]
	if _, err := kw.tg.gw.Reload(&next); err != nil {
		t.Fatal(err)
	}
	kw.clock.Advance(time.Minute)
	if code, b := kw.chat(t, secret); code != http.StatusUnauthorized {
		t.Errorf("its team removed: %d %s, want 401", code, b)
	}
	kw.tg.record(t)
	code, b := adminDo(t, http.MethodGet, kw.tg.URL+"/admin/keys/ci", "")
	if code != http.StatusOK || !strings.Contains(string(b), `"status": "orphaned"`) {
		t.Errorf("show ci: %d %s", code, b)
	}
}
