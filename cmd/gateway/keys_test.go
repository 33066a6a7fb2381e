package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/internal/redistest"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
)

// keysCLI runs `gateway keys args...` against base with the test's admin
// token and returns what it printed.
func keysCLI(t *testing.T, base string, args ...string) string {
	t.Helper()
	t.Setenv("TEST_ADMIN_TOKEN", testAdmin)
	var out, errb strings.Builder
	full := append([]string{"keys", args[0], "-url", base, "-token-env", "TEST_ADMIN_TOKEN", "-actor", "ops@test"}, args[1:]...)
	if code := run(full, &out, &errb); code != 0 {
		t.Fatalf("gateway %s: exit %d: %s", strings.Join(args, " "), code, errb.String())
	}
	return out.String()
}

// issuedKey picks the key out of `gateway keys create` or `rotate`.
func issuedKey(t *testing.T, out string) string {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if k, ok := strings.CutPrefix(line, "key:"); ok {
			return strings.TrimSpace(k)
		}
	}
	t.Fatalf("no key printed:\n%s", out)
	return ""
}

// statusOf sends one non-streamed Messages request with key to base.
func statusOf(t *testing.T, client *http.Client, base, key string, n int) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/messages", strings.NewReader(messagesBody(n, false)))
	req.Header.Set("X-Api-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// waitStatus sends requests with key to every replica at once until each
// answers want, and returns how long each took from since. The deadline is
// generous: the test proves propagation; the times are reported, not
// asserted (a loaded machine must not fail it).
func waitStatus(t *testing.T, client *http.Client, reps []*replica, key string, want int, since time.Time) []time.Duration {
	t.Helper()
	took := make([]time.Duration, len(reps))
	errs := make(chan error, len(reps))
	for i, r := range reps {
		go func() {
			for n := 0; ; n++ {
				req, _ := http.NewRequest(http.MethodPost, r.url+"/v1/messages", strings.NewReader(messagesBody(n, false)))
				req.Header.Set("X-Api-Key", key)
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					errs <- err
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == want {
					took[i] = time.Since(since)
					errs <- nil
					return
				}
				if time.Since(since) > 15*time.Second {
					errs <- fmt.Errorf("replica %d never answered %d for the key", i, want)
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	for range reps {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	return took
}

// TestRuntimeKeysAcrossReplicas: three replicas on one Redis, runtime keys
// on at the default poll interval. A key created (with the CLI) on one is
// admitted by the others; revoked there, it is refused everywhere, while a
// stream it opened before finishes whole; a developer's daily token budget
// inside the team's holds across the replicas, and their spend in
// /admin/spend is the sum of their records. The propagation times are
// logged (the bound is 1 s; the poll interval is 250 ms).
func TestRuntimeKeysAcrossReplicas(t *testing.T) {
	_, cfg := redisGovConfig(t, mockllm.Options{OutputTokens: 1000})
	cfg.RuntimeKeys.Enabled = true
	cfg.Teams[0].TokensPerDay = p64(1_000_000)
	reps := []*replica{startReplica(t, cfg), startReplica(t, cfg), startReplica(t, cfg)}
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()

	// Created on replica 0: it admits there at once (the admin API reads
	// the store back before it answers), and on the others within the
	// poll interval.
	out := keysCLI(t, reps[0].url, "create", "-name", "dev-ana", "-team", "red", "-tokens-per-day", "1200",
		"-label", "email=ana@example.com")
	created := time.Now()
	key := issuedKey(t, out)
	if !strings.Contains(out, "dev-ana") || !strings.Contains(out, "tokens_per_day=1200") {
		t.Errorf("create printed:\n%s", out)
	}
	if code := statusOf(t, client, reps[0].url, key, 0); code != http.StatusOK {
		t.Fatalf("replica 0, right after the create: %d", code)
	}
	for i, d := range waitStatus(t, client, reps[1:], key, http.StatusOK, created) {
		t.Logf("created on replica 0, admitted by replica %d after %v", i+1, d.Round(time.Millisecond))
	}

	// A stream opened on replica 1 before the revocation (100 tokens 40
	// ms apart) finishes.
	type streamed struct {
		code int
		body string
		err  error
		end  time.Time
	}
	streamDone := make(chan streamed, 1)
	started := make(chan struct{})
	go func() {
		req, _ := http.NewRequest(http.MethodPost, reps[1].url+"/v1/messages",
			strings.NewReader(`{"model":"claude-test","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("X-Api-Key", key)
		req.Header.Set("X-Mock-ITL-Ms", "40")
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			close(started)
			streamDone <- streamed{err: err}
			return
		}
		defer resp.Body.Close()
		buf := make([]byte, 1)
		_, _ = io.ReadFull(resp.Body, buf) // the stream is open
		close(started)
		rest, err := io.ReadAll(resp.Body)
		streamDone <- streamed{code: resp.StatusCode, body: string(buf) + string(rest), err: err, end: time.Now()}
	}()
	<-started

	out = keysCLI(t, reps[2].url, "revoke", "dev-ana")
	revoked := time.Now()
	if !strings.Contains(out, "revoked") {
		t.Errorf("revoke printed:\n%s", out)
	}
	if code := statusOf(t, client, reps[2].url, key, 0); code != http.StatusUnauthorized {
		t.Errorf("replica 2, right after the revocation: %d", code)
	}
	for i, d := range waitStatus(t, client, reps[:2], key, http.StatusUnauthorized, revoked) {
		t.Logf("revoked on replica 2, refused by replica %d after %v", i, d.Round(time.Millisecond))
	}
	s := <-streamDone
	if s.err != nil || s.code != http.StatusOK || !strings.Contains(s.body, "message_stop") {
		t.Errorf("the stream open before the revocation: %d, %v, ends %q", s.code, s.err, s.body[max(0, len(s.body)-80):])
	}
	t.Logf("the stream opened before the revocation ended whole %v after it", s.end.Sub(revoked).Round(time.Millisecond))

	// A developer's budget inside the team's, across the replicas: a new
	// key with 1200 tokens a day, requests round-robin until refused.
	out = keysCLI(t, reps[1].url, "create", "-name", "dev-bo", "-team", "red", "-tokens-per-day", "1200")
	bo := issuedKey(t, out)
	waitStatus(t, client, reps, bo, http.StatusOK, time.Now())
	res := &loadResult{}
	res.run(reps, bo, 1, 40, func() bool { return res.limited.Load() >= 3 })
	var billed int64
	var records int
	for _, r := range reps {
		for _, rec := range r.records() {
			if rec.KeyID == "dev-bo" && rec.Outcome == llm.OutcomeOK {
				billed += rec.Usage.Input + rec.Usage.Output
				records++
			}
		}
	}
	// The budget admits while what settled and what is reserved are
	// below it, reserving at most what is left: the last request admitted
	// may take it past by what it used beyond that (docs/keys.md), less
	// than one request's reservation.
	one := reserved(messagesBody(0, false))
	if billed > 1200+one || billed <= 1200-one || res.limited.Load() < 3 || records < 3 {
		t.Errorf("dev-bo billed %d tokens in %d requests (budget 1200, one request %d), %d refused", billed, records, one,
			res.limited.Load())
	}
	t.Logf("dev-bo: %d requests admitted across 3 replicas (%d tokens of 1200), then refused", records, billed)
	// The team was charged the same, and the spend per developer in the
	// ledger is the sum of their records (flushed every 50 ms).
	var rep struct {
		Total struct {
			Requests     int64 `json:"requests"`
			InputTokens  int64 `json:"input_tokens"`
			OutputTokens int64 `json:"output_tokens"`
		} `json:"total"`
	}
	for n := 0; ; n++ {
		adminJSON(t, reps[2].url+"/admin/spend?key=dev-bo", &rep)
		if rep.Total.InputTokens+rep.Total.OutputTokens == billed && rep.Total.Requests == int64(records) {
			break
		}
		if n == 200 {
			t.Fatalf("/admin/spend?key=dev-bo: %+v, want %d requests, %d tokens", rep.Total, records, billed)
		}
		time.Sleep(25 * time.Millisecond)
	}
	lim := adminLimits(t, reps[0].url)
	if s := lim.find("team", "red", "tokens_per_day"); s == nil || s.Used < billed {
		t.Errorf("team red's tokens_per_day %+v, want at least dev-bo's %d", s, billed)
	}

	// The audit log is shared: every replica shows the three changes.
	audit := keysCLI(t, reps[1].url, "audit")
	for _, want := range []string{"create  dev-bo", "revoke  dev-ana", "create  dev-ana", "ops@test"} {
		if !strings.Contains(audit, want) {
			t.Errorf("audit lacks %q:\n%s", want, audit)
		}
	}
	if strings.Contains(audit, key) || strings.Contains(audit, bo) {
		t.Error("a key's secret is in the audit log")
	}
}

// TestRuntimeKeysLocalStateFile: without Redis the keys live in
// [runtime_keys] state_file: a key issued before a restart admits after it,
// its daily budget is restored from the spend ledger (a restart grants
// none afresh), and check-config lists the file's keys.
func TestRuntimeKeysLocalStateFile(t *testing.T) {
	dir := t.TempDir()
	up := httptest.NewServer(mockllm.New(mockllm.Options{OutputTokens: 1000, RequireKey: upKey}))
	t.Cleanup(up.Close)
	cfg := govConfig(up.URL)
	cfg.RuntimeKeys.Enabled = true
	cfg.RuntimeKeys.StateFile = filepath.Join(dir, "keys.json")
	cfg.Spend.StateFile = filepath.Join(dir, "spend.json")
	r := startReplica(t, cfg)
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	key := issuedKey(t, keysCLI(t, r.url, "create", "-name", "ci-bot", "-tokens-per-day", "400"))
	first := 0
	for n := 0; n < 10 && statusOf(t, client, r.url, key, n) == http.StatusOK; n++ {
		first++
	}
	if first == 0 || first >= 10 {
		t.Fatalf("%d requests admitted before the budget of 400 tokens refused", first)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}

	r2 := startReplica(t, cfg)
	if code := statusOf(t, client, r2.url, key, 99); code != http.StatusTooManyRequests {
		t.Errorf("after the restart: %d, want 429 (the day's budget was spent before it)", code)
	}
	if err := r2.stop(); err != nil {
		t.Fatal(err)
	}

	var out, errb strings.Builder
	path := writeConfigFor(t, dir, cfg)
	if code := run([]string{"check-config", "-config", path}, &out, &errb); code != 0 {
		t.Fatalf("check-config: exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "# Runtime keys in "+cfg.RuntimeKeys.StateFile+" (version 1): 1") ||
		!strings.Contains(out.String(), "ci-bot") {
		t.Errorf("check-config does not list the runtime key:\n%s", out.String())
	}
	cfg.RuntimeKeys.StateFile = filepath.Join(dir, "missing-dir", "keys.json")
	out.Reset()
	path = writeConfigFor(t, dir, cfg)
	if code := run([]string{"check-config", "-config", path}, &out, &errb); code != 0 {
		t.Fatalf("check-config: exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "# Runtime keys in") {
		t.Errorf("check-config with no keys file:\n%s", out.String())
	}
}

// TestCheckConfigCannotReachRedis: check-config says so when the runtime
// keys' Redis does not answer, and still checks the file.
func TestCheckConfigCannotReachRedis(t *testing.T) {
	dir := t.TempDir()
	cfg := govConfig("http://127.0.0.1:9")
	cfg.RuntimeKeys.Enabled = true
	srv := redistest.Start(t)
	cfg.Redis.Addrs = []string{srv.Addr()}
	srv.Kill()
	var out, errb strings.Builder
	if code := run([]string{"check-config", "-config", writeConfigFor(t, dir, cfg)}, &out, &errb); code != 0 {
		t.Fatalf("check-config: exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "# Runtime keys: cannot read Redis "+srv.Addr()) {
		t.Errorf("check-config with Redis down:\n%s", out.String())
	}
}

// writeConfigFor writes cfg as a gateway.toml in dir, with its secrets in
// the test's environment, and returns its path.
func writeConfigFor(t *testing.T, dir string, cfg config.Config) string {
	t.Helper()
	t.Setenv("UP_KEY", upKey)
	t.Setenv("ADMIN_TOKEN", testAdmin)
	doc := cfg.Redacted()
	path := filepath.Join(dir, "gateway.toml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestKeysCommandUsage: the keys command's mistakes are usage errors (exit
// 2) or say what is missing (exit 1), before any request is sent.
func TestKeysCommandUsage(t *testing.T) {
	t.Setenv("TEST_ADMIN_TOKEN", testAdmin)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"keys"}, 2, "Usage: gateway keys"},
		{[]string{"keys", "frobnicate"}, 2, `unknown command "frobnicate"`},
		{[]string{"keys", "revoke"}, 2, "needs the key's name"},
		{[]string{"keys", "list", "extra"}, 2, "unexpected arguments"},
		{[]string{"keys", "create", "-rpm", "many"}, 2, "not a whole number"},
		{[]string{"keys", "create", "-label", "novalue"}, 2, "a label is k=v"},
		{[]string{"keys", "create", "-token-env", "TEST_ADMIN_TOKEN"}, 1, "-name is required"},
		{[]string{"keys", "list", "-token-env", "UNSET_TOKEN_VAR_X"}, 1, "$UNSET_TOKEN_VAR_X is not set"},
	} {
		var out, errb strings.Builder
		code := run(c.args, &out, &errb)
		if code != c.code || !strings.Contains(errb.String(), c.want) {
			t.Errorf("gateway %s: exit %d (want %d), stderr:\n%s\nwant it to say %q", strings.Join(c.args, " "), code, c.code,
				errb.String(), c.want)
		}
	}
}
