package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/internal/redistest"
	"github.com/tollgate-llm/tollgate/metrics"
	"github.com/tollgate-llm/tollgate/proxy"
	"github.com/tollgate-llm/tollgate/ratelimit"
	"github.com/tollgate-llm/tollgate/spend"
)

// pacedUpstream is an OpenAI-compatible streaming upstream that remembers
// the exact bytes it sent each request (by its X-Tollgate-Request-Id), so a
// test can check what each caller got byte for byte. A request with
// X-Test-Held sends half its tokens, then waits for release.
type pacedUpstream struct {
	name    string
	tokens  int
	gap     time.Duration
	release chan struct{}
	mu      sync.Mutex
	sent    map[string][]byte
	held    int // requests waiting for release now
}

func newPacedUpstream(name string, tokens int, gap time.Duration) *pacedUpstream {
	return &pacedUpstream{name: name, tokens: tokens, gap: gap, release: make(chan struct{}), sent: map[string][]byte{}}
}

func (u *pacedUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	id := r.Header.Get("X-Tollgate-Request-Id")
	held := r.Header.Get("X-Test-Held") != ""
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	var all []byte
	send := func(ev string) bool {
		all = append(all, ev...)
		if _, err := io.WriteString(w, ev); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	defer func() {
		u.mu.Lock()
		u.sent[id] = all
		u.mu.Unlock()
	}()
	chunk := func(delta string, finish string) string {
		return `data: {"id":"chatcmpl-` + id + `","object":"chat.completion.chunk","created":1767225600,"model":"gpt-4o-mini",` +
			`"choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + finish + `}]}` + "\n\n"
	}
	if !send(chunk(`{"role":"assistant","content":""}`, "null")) {
		return
	}
	for i := range u.tokens {
		if held && i == u.tokens/2 {
			u.mu.Lock()
			u.held++
			u.mu.Unlock()
			select {
			case <-u.release:
			case <-r.Context().Done():
				return
			}
		}
		if held && u.gap > 0 {
			time.Sleep(u.gap)
		}
		if !send(chunk(`{"content":" `+u.name+strconv.Itoa(i)+`"}`, "null")) {
			return
		}
	}
	send(chunk(`{}`, `"stop"`))
	send(`data: {"id":"chatcmpl-` + id + `","object":"chat.completion.chunk","created":1767225600,"model":"gpt-4o-mini","choices":[],` +
		`"usage":{"prompt_tokens":10,"completion_tokens":` + strconv.Itoa(u.tokens) + `,"total_tokens":` + strconv.Itoa(10+u.tokens) + `}}` + "\n\n")
	send("data: [DONE]\n\n")
}

func (u *pacedUpstream) heldNow() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.held
}

func (u *pacedUpstream) sentTo(id string) ([]byte, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	b, ok := u.sent[id]
	return b, ok
}

// reloadDoc is a gateway.toml for the reload tests: mode "keys", the admin
// API, upstream a, the given [[keys]] (name → team t), team t's rpm,
// gpt-* priced at price µ$ per input and 2×price per output token, and
// extra TOML appended.
func reloadDoc(addr, upstreamA string, keys []string, rpm, price int, extra string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[server]\nlisten = %q\ndrain_timeout_seconds = 20\n\n[auth]\nmode = \"keys\"\n\n"+
		"[admin]\ntoken_env = \"ADMIN_TOKEN\"\n\n[spend]\nstate_file = \"spend.json\"\n\n"+
		"[[upstreams]]\nname = \"a\"\nbase_url = %q\n\n"+
		"[[models]]\npattern = \"gpt-*\"\ninput_usd_per_mtok = %d\noutput_usd_per_mtok = %d\n\n"+
		"[[teams]]\nname = \"t\"\nrpm = %d\n\n", addr, upstreamA, price, 2*price, rpm)
	for _, k := range keys {
		fmt.Fprintf(&b, "[[keys]]\nname = %q\nsha256 = %q\nteam = \"t\"\n\n", k, reloadKey(k))
	}
	b.WriteString(extra)
	return b.String()
}

// reloadKey is the [[keys]] sha256 of the test key named name.
func reloadKey(name string) string { return hashKey("sk-reload-" + name) }

// limitedTeam is TOML for team u with rpm and its key lim.
func limitedTeam(rpm int) string {
	return fmt.Sprintf("[[teams]]\nname = \"u\"\nrpm = %d\n\n[[keys]]\nname = \"lim\"\nsha256 = %q\nteam = \"u\"\n\n", rpm, reloadKey("lim"))
}

// reloadRun drives a built gateway binary through reloads.
type reloadRun struct {
	t        *testing.T
	bin      string
	p        *gatewayProc
	addr     string
	cfgPath  string
	dir      string
	env      []string
	client   *http.Client
	reloaded float64 // successful reloads so far
	failed   float64
	seq      int
}

// newReloadRun builds the binary and picks a free address and a config
// file for it; start starts it.
func newReloadRun(t *testing.T) *reloadRun {
	t.Helper()
	dir := t.TempDir()
	rr := &reloadRun{t: t, bin: buildGateway(t), addr: freeAddr(t), cfgPath: filepath.Join(dir, "gateway.toml"), dir: dir,
		env:    append(os.Environ(), "ADMIN_TOKEN="+reloadAdminToken),
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 300}}}
	t.Cleanup(rr.client.CloseIdleConnections)
	return rr
}

// reloadAdminToken is the admin token of the reload tests' gateways.
const reloadAdminToken = "admin-secret-of-the-reload-test"

// start writes doc and starts the gateway on it; it is killed in cleanup.
func (rr *reloadRun) start(doc string) {
	rr.t.Helper()
	rr.write(doc)
	rr.p = startGatewayProc(rr.t, rr.bin, rr.cfgPath, rr.dir, rr.addr, rr.env, 0)
	rr.t.Cleanup(rr.p.kill)
}

// write replaces the config file, as an editor that writes a new file and
// renames it over the old one does.
func (rr *reloadRun) write(doc string) {
	rr.t.Helper()
	tmp := rr.cfgPath + ".new"
	if err := os.WriteFile(tmp, []byte(doc), 0o600); err != nil {
		rr.t.Fatal(err)
	}
	if err := os.Rename(tmp, rr.cfgPath); err != nil {
		rr.t.Fatal(err)
	}
}

// hup writes doc, sends SIGHUP and waits, bounded, until the gateway counts
// the reload: a success when ok, else a failure.
func (rr *reloadRun) hup(doc string, ok bool) {
	rr.t.Helper()
	rr.write(doc)
	if err := rr.p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		rr.t.Fatal(err)
	}
	series, want := `tollgate_config_reload_total{result="success"}`, rr.reloaded+1
	if !ok {
		series, want = `tollgate_config_reload_total{result="failure"}`, rr.failed+1
	}
	rr.waitMetric(series, want)
	if ok {
		rr.reloaded++
		if v := rr.metric(`tollgate_config_last_reload_successful`); v != 1 {
			rr.t.Errorf("tollgate_config_last_reload_successful = %v after a reload that took", v)
		}
	} else {
		rr.failed++
		if v := rr.metric(`tollgate_config_last_reload_successful`); v != 0 {
			rr.t.Errorf("tollgate_config_last_reload_successful = %v after a refused reload", v)
		}
	}
}

// waitMetric polls /metrics until series reaches want: 1000 × 10 ms.
func (rr *reloadRun) waitMetric(series string, want float64) {
	rr.t.Helper()
	var got float64
	for range 1000 {
		if got = rr.metric(series); got >= want {
			return
		}
		select {
		case <-rr.p.done:
			rr.t.Fatalf("the gateway exited: %v\n%s", rr.p.waitErr, rr.p.stderr())
		case <-time.After(10 * time.Millisecond): // waiting for the signal to be handled
		}
	}
	rr.t.Fatalf("%s = %v after 10 s, want %v\n%s", series, got, want, rr.p.stderr())
}

// waitLog waits, bounded, until the gateway's log holds n lines with
// substr, and returns how many it holds then: its stderr is a pipe read by
// another goroutine, behind what the gateway answered.
func (rr *reloadRun) waitLog(substr string, n int) int {
	rr.t.Helper()
	got := 0
	for range 500 {
		if got = strings.Count(rr.p.stderr(), substr); got >= n {
			return got
		}
		time.Sleep(10 * time.Millisecond) // waiting for the pipe to be read
	}
	return got
}

// metric reads one series from /metrics; -1 when absent.
func (rr *reloadRun) metric(series string) float64 {
	rr.t.Helper()
	for line := range strings.Lines(scrape(rr.t, "http://"+rr.addr+"/metrics")) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				rr.t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	return -1
}

// call sends one streamed chat completion with key (a test key name) and
// model, and returns its status, body and request id.
func (rr *reloadRun) call(ctx context.Context, key, model string, hdr ...string) (int, []byte, string) {
	rr.seq++
	id := fmt.Sprintf("reload-%d", rr.seq)
	return rr.callID(ctx, id, key, model, hdr...)
}

func (rr *reloadRun) callID(ctx context.Context, id, key, model string, hdr ...string) (int, []byte, string) {
	body := `{"model":"` + model + `","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+rr.addr+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return 0, nil, id
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk-reload-"+key)
	req.Header.Set("X-Tollgate-Request-Id", id)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := rr.client.Do(req)
	if err != nil {
		return 0, []byte(err.Error()), id
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b, id
}

// admin sends an admin request with the test's token and returns the
// answer's body, failing the test on any status but 200.
func (rr *reloadRun) admin(method, path string, body []byte) []byte {
	rr.t.Helper()
	b, err := adminCall(method, "http://"+rr.addr+path, reloadAdminToken, body)
	if err != nil {
		rr.t.Fatal(err)
	}
	return b
}

// logged returns the access-log line of request id, decoded.
func (rr *reloadRun) logged(id string) map[string]any {
	rr.t.Helper()
	b, err := os.ReadFile(rr.p.log)
	if err != nil {
		rr.t.Fatal(err)
	}
	for line := range bytes.Lines(b) {
		var l map[string]any
		if json.Unmarshal(line, &l) == nil && l["request_id"] == id {
			return l
		}
	}
	rr.t.Fatalf("no access-log line for %s", id)
	return nil
}

// Ten reloads by SIGHUP to the built binary while 200 streams are open:
// keys added and removed, a price and a limit changed, an upstream and a
// route added, a broken file and a file that changes the listen address
// refused. Every stream finishes byte-exact, those of a key removed in
// flight too; each change holds from the next request on; a refused file
// leaves the running configuration serving.
func TestSIGHUPReloadsUnderOpenStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	ua, ub := newPacedUpstream("a", 40, 5*time.Millisecond), newPacedUpstream("b", 3, 0)
	sa, sb := httptest.NewServer(ua), httptest.NewServer(ub)
	defer sa.Close()
	defer sb.Close()
	rr := newReloadRun(t)
	addr := rr.addr
	keys := []string{"stay", "leaving"}
	rr.start(reloadDoc(addr, sa.URL, keys, 100000, 1, ""))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// 200 streams, half of them with the key the second reload removes,
	// each held at its middle until the reloads are done.
	const streams = 200
	type result struct {
		status int
		body   []byte
		id     string
	}
	results := make(chan result, streams)
	for i := range streams {
		key := keys[i%2]
		go func() {
			s, b, id := rr.callID(ctx, fmt.Sprintf("open-%d", i), key, "gpt-4o-mini", "X-Test-Held", "1")
			results <- result{s, b, id}
		}()
	}
	for i := 0; ua.heldNow() < streams; i++ {
		if i == 2000 {
			t.Fatalf("%d of %d streams reached the upstream in 20 s", ua.heldNow(), streams)
		}
		time.Sleep(10 * time.Millisecond) // waiting for the streams to open
	}

	expect := func(what string, status int, key, model string) string {
		t.Helper()
		got, body, id := rr.call(ctx, key, model)
		if got != status {
			t.Fatalf("%s: status %d, want %d: %s", what, got, status, body)
		}
		return id
	}
	// 1: a key added is admitted on the next request.
	expect("before the key is added", http.StatusUnauthorized, "new", "gpt-4o-mini")
	keys = append(keys, "new")
	rr.hup(reloadDoc(addr, sa.URL, keys, 100000, 1, ""), true)
	expect("the key just added", http.StatusOK, "new", "gpt-4o-mini")
	// 2: a key removed is refused on the next request; its streams in
	// flight go on.
	keys = []string{"stay", "new"}
	rr.hup(reloadDoc(addr, sa.URL, keys, 100000, 1, ""), true)
	expect("the key just removed", http.StatusUnauthorized, "leaving", "gpt-4o-mini")
	// 3: a price changed bills the next request.
	id := expect("at the old price", http.StatusOK, "stay", "gpt-4o-mini")
	rr.hup(reloadDoc(addr, sa.URL, keys, 100000, 3, ""), true)
	id2 := expect("at the new price", http.StatusOK, "stay", "gpt-4o-mini")
	// 4: a team with a limit added, 5: its limit lowered, which holds
	// from the next request on: of rpm 1, at most one more request.
	rr.hup(reloadDoc(addr, sa.URL, keys, 100000, 3, limitedTeam(1000)), true)
	expect("the team just added", http.StatusOK, "lim", "gpt-4o-mini")
	rr.hup(reloadDoc(addr, sa.URL, keys, 100000, 3, limitedTeam(1)), true)
	if s, _, _ := rr.call(ctx, "lim", "gpt-4o-mini"); s != http.StatusTooManyRequests {
		expect("the team's second request under rpm 1", http.StatusTooManyRequests, "lim", "gpt-4o-mini")
	}
	// 6: an upstream and a route to it added.
	route := limitedTeam(1) + fmt.Sprintf("[[upstreams]]\nname = \"b\"\nbase_url = %q\n\n[[routes]]\nmodels = [\"gpt-b-*\"]\nupstreams = [\"b\"]\n", sb.URL)
	rr.hup(reloadDoc(addr, sa.URL, keys, 100000, 3, route), true)
	idB := expect("the new route", http.StatusOK, "stay", "gpt-b-1")
	// 7: a broken file is refused, and everything stays as it was.
	rr.hup(reloadDoc(addr, sa.URL, keys, 100000, 3, route)+"\n[[keys]\nname = \"x\"\n", false)
	expect("a key after a broken file", http.StatusOK, "new", "gpt-b-1")
	// 8: a file that changes the listen address is refused, naming it.
	other := strings.Replace(reloadDoc(addr, sa.URL, append(keys, "late"), 100000, 3, route), addr, "127.0.0.1:1", 1)
	rr.hup(other, false)
	expect("a key of a refused file", http.StatusUnauthorized, "late", "gpt-4o-mini")
	// 9: team t, whose 200 streams are open, gets a daily token budget.
	budget := func(doc string) string {
		return strings.Replace(doc, "rpm = 100000\n", "rpm = 100000\ntokens_per_day = 1000000000\n", 1)
	}
	rr.hup(budget(reloadDoc(addr, sa.URL, keys, 100000, 3, route)), true)
	// 10: the key that stayed removed, one added back.
	keys = []string{"new", "leaving"}
	rr.hup(budget(reloadDoc(addr, sa.URL, keys, 100000, 3, route)), true)
	expect("a key removed after its streams opened", http.StatusUnauthorized, "stay", "gpt-4o-mini")
	expect("a key added back", http.StatusOK, "leaving", "gpt-4o-mini")

	close(ua.release)
	for range streams {
		r := <-results
		sent, ok := ua.sentTo(r.id)
		if r.status != http.StatusOK || !ok || !bytes.Equal(r.body, sent) {
			t.Errorf("stream %s: status %d, %d bytes, upstream sent %d (recorded %v)", r.id, r.status, len(r.body), len(sent), ok)
		}
	}

	// The budget added while the streams were open holds every token team
	// t billed today, theirs too, once they have.
	var used, billed int64
	for range 1000 {
		var lim proxy.LimitsReport
		var sp proxy.SpendReport
		if err := json.Unmarshal(rr.admin(http.MethodGet, "/admin/limits", nil), &lim); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(rr.admin(http.MethodGet, "/admin/spend?team=t", nil), &sp); err != nil {
			t.Fatal(err)
		}
		used, billed = -1, sp.Total.InputTokens+sp.Total.OutputTokens
		for _, s := range lim.Subjects {
			for _, l := range s.Limits {
				if s.Scope == "team" && s.ID == "t" && l.Limit == "tokens_per_day" {
					used = l.Used
				}
			}
		}
		if used == billed {
			break
		}
		time.Sleep(10 * time.Millisecond) // waiting for the raise after the streams billed
	}
	if used != billed || billed < streams*50 {
		t.Errorf("team t's budget added under open streams holds %d tokens; the ledger has %d", used, billed)
	}

	for _, c := range []struct {
		id   string
		cost float64
	}{{id, 10*1 + 40*2}, {id2, 10*3 + 40*6}, {idB, 10*3 + 3*6}} {
		l := rr.logged(c.id)
		if l["cost_micros"] != c.cost {
			t.Errorf("%s: cost_micros %v, want %v", c.id, l["cost_micros"], c.cost)
		}
	}
	if l := rr.logged(idB); l["upstream"] != "b" {
		t.Errorf("the new route's request went to %v", l["upstream"])
	}
	if sent, ok := ub.sentTo(idB); !ok || len(sent) == 0 {
		t.Error("upstream b never got the routed request")
	}
	errs := rr.p.stderr()
	for _, want := range []string{"gateway.toml:", "server.listen: differs from the running configuration", "config reloaded"} {
		if !strings.Contains(errs, want) {
			t.Errorf("the log lacks %q", want)
		}
	}
	if strings.Contains(errs+readFile(t, rr.p.log), "sk-reload-") {
		t.Error("a caller's key reached a log")
	}
	if err := rr.p.terminate(); err != nil {
		t.Fatalf("gateway exit: %v\n%s", err, rr.p.stderr())
	}
}

// POST /admin/reload reloads the file and answers what changed; a file
// that fails gets 422 with its problems and changes nothing; check=true
// (what gateway check-config -against sends) checks a document without
// taking it.
func TestAdminReloadAndCheckAgainst(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	sa := httptest.NewServer(newPacedUpstream("a", 2, 0))
	defer sa.Close()
	rr := newReloadRun(t)
	addr, dir, bin := rr.addr, rr.dir, rr.bin
	rr.start(reloadDoc(addr, sa.URL, []string{"one"}, 1000, 1, ""))
	ctx := context.Background()

	admin := func(query, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/admin/reload"+query, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+reloadAdminToken)
		resp, err := rr.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if s, b := admin("", ""); s != http.StatusOK || !strings.Contains(b, `"result": "unchanged"`) {
		t.Fatalf("reload of the same file: %d %s", s, b)
	}
	rr.write(reloadDoc(addr, sa.URL, []string{"one", "two"}, 1000, 1, ""))
	if s, b := admin("", ""); s != http.StatusOK || !strings.Contains(b, `"result": "reloaded"`) || !strings.Contains(b, `"keys"`) {
		t.Fatalf("reload with a key added: %d %s", s, b)
	}
	if s, _, _ := rr.call(ctx, "two", "gpt-4o-mini"); s != http.StatusOK {
		t.Fatalf("the added key: %d", s)
	}
	rr.write(reloadDoc(addr, sa.URL, []string{"one"}, 1000, 1, "[[teams]]\nname = \"t\"\n"))
	if s, b := admin("", ""); s != http.StatusUnprocessableEntity || !strings.Contains(b, "gateway.toml:") {
		t.Fatalf("reload of a file with a duplicate team: %d %s", s, b)
	}
	if s, _, _ := rr.call(ctx, "two", "gpt-4o-mini"); s != http.StatusOK {
		t.Fatalf("the key of the running config after a refused reload: %d", s)
	}
	if s, b := admin("?check=true", reloadDoc(addr, sa.URL, []string{"three"}, 1000, 1, "")); s != http.StatusOK ||
		!strings.Contains(b, `"result": "valid"`) {
		t.Fatalf("check of a good document: %d %s", s, b)
	}
	if s, _, _ := rr.call(ctx, "three", "gpt-4o-mini"); s != http.StatusUnauthorized {
		t.Fatalf("a checked document's key was taken: %d", s)
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/admin/reload", nil)
	if resp, err := rr.client.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("reload without the admin token: %v %v", err, resp)
	} else {
		resp.Body.Close()
	}

	// log.level reloads: at "error", a reload's own info line is not
	// written, and back at "info" it is.
	before := rr.waitLog(`"msg":"config reloaded"`, 1) // the reload that added key two
	rr.write(reloadDoc(addr, sa.URL, []string{"one", "two"}, 1000, 1, "[log]\nlevel = \"error\"\n"))
	if s, b := admin("", ""); s != http.StatusOK {
		t.Fatalf("reload to level error: %d %s", s, b)
	}
	rr.write(reloadDoc(addr, sa.URL, []string{"one"}, 1000, 1, "[log]\nlevel = \"error\"\n"))
	if s, b := admin("", ""); s != http.StatusOK {
		t.Fatalf("reload at level error: %d %s", s, b)
	}
	rr.write(reloadDoc(addr, sa.URL, []string{"one", "two"}, 1000, 1, ""))
	if s, b := admin("", ""); s != http.StatusOK {
		t.Fatalf("reload back to level info: %d %s", s, b)
	}
	// The line of this reload comes after any of the two before it.
	if n := rr.waitLog(`"msg":"config reloaded"`, before+1); n != before+1 {
		t.Errorf("%d info lines of reloads since level error, want 1 (level info again)\n%s", n-before, rr.p.stderr())
	}

	// The probe follows a reload: on, it probes its new target.
	rr.write(reloadDoc(addr, sa.URL, []string{"one", "two"}, 1000, 1,
		"[probe]\nenabled = true\ninterval_seconds = 2\nrequests = 1\ntimeout_seconds = 1\n\n[[probe.targets]]\nupstream = \"a\"\nmodel = \"gpt-probe\"\n"))
	if s, b := admin("", ""); s != http.StatusOK || !strings.Contains(b, `"probe"`) {
		t.Fatalf("reload turning the probe on: %d %s", s, b)
	}
	rr.waitMetric(`tollgate_probe_requests_total{model="gpt-probe",result="ok",upstream="a"}`, 1)

	// gateway check-config -against, good and refused.
	good := filepath.Join(dir, "good.toml")
	bad := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(good, []byte(reloadDoc(addr, sa.URL, []string{"one", "four"}, 1000, 1, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte(strings.Replace(reloadDoc(addr, sa.URL, []string{"one"}, 1000, 1, ""), "spend.json", "other.json", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	check := func(file string) (string, error) {
		var out, errb bytes.Buffer
		c := exec.Command(bin, "check-config", "-config", file, "-against", "http://"+addr, "-token-env", "ADMIN_TOKEN")
		c.Env, c.Stdout, c.Stderr = rr.env, &out, &errb
		err := c.Run()
		return out.String() + errb.String(), err
	}
	if out, err := check(good); err != nil || !strings.Contains(out, "would reload cleanly") || !strings.Contains(out, "keys") {
		t.Errorf("check-config -against a good file: %v %s", err, out)
	}
	if out, err := check(bad); err == nil || !strings.Contains(out, "bad.toml:") || !strings.Contains(out, "spend.state_file") {
		t.Errorf("check-config -against a file changing the state file: %v %s", err, out)
	}
	if err := rr.p.terminate(); err != nil {
		t.Fatalf("gateway exit: %v\n%s", err, rr.p.stderr())
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// With [server] watch_config, a file that changes is reloaded without a
// signal, once; a file written back unchanged is not reloaded again.
func TestWatchConfigReloadsAChangedFile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	sa := httptest.NewServer(newPacedUpstream("a", 2, 0))
	defer sa.Close()
	rr := newReloadRun(t)
	doc := func(keys ...string) string {
		return strings.Replace(reloadDoc(rr.addr, sa.URL, keys, 1000, 1, ""), "[server]\n", "[server]\nwatch_config = true\n", 1)
	}
	rr.start(doc("one"))
	ctx := context.Background()
	if s, _, _ := rr.call(ctx, "two", "gpt-4o-mini"); s != http.StatusUnauthorized {
		t.Fatalf("a key not yet in the file: %d", s)
	}
	rr.write(doc("one", "two"))
	rr.waitMetric(`tollgate_config_reload_total{result="success"}`, 1)
	if s, _, _ := rr.call(ctx, "two", "gpt-4o-mini"); s != http.StatusOK {
		t.Fatalf("the key the watched file added: %d", s)
	}
	rr.write(doc("one", "two")) // the same contents, a new file
	rr.write(doc("one"))
	rr.waitMetric(`tollgate_config_reload_total{result="success"}`, 2)
	if s, _, _ := rr.call(ctx, "two", "gpt-4o-mini"); s != http.StatusUnauthorized {
		t.Fatalf("the key the watched file removed: %d", s)
	}
	if n := rr.waitLog(`"trigger":"watch"`, 2); n != 2 {
		t.Errorf("%d reloads by the watch, want 2:\n%s", n, rr.p.stderr())
	}
	if err := rr.p.terminate(); err != nil {
		t.Fatalf("gateway exit: %v\n%s", err, rr.p.stderr())
	}
}

// The budgets a reload adds start from what the ledger says their key or
// team used today, once: raised twice (after the requests in flight
// billed, or by every replica), given back after a reload removed them,
// or added by replicas that ran different configurations. A reload that
// keeps a budget leaves it alone.
func TestReloadRaisesTheBudgetsItAddsToTheLedger(t *testing.T) {
	budget := func(base config.Config, red, blue int64) *config.Config {
		c := base
		c.Teams = []config.Team{{Name: "red"}, {Name: "blue"}}
		if red > 0 {
			c.Teams[0].Limits.TokensPerDay = p64(red)
		}
		if blue > 0 {
			c.Teams[1].Limits.TokensPerDay = p64(blue)
		}
		return &c
	}
	// Each step is a reload from running to next budgets (red, blue; 0:
	// none); the ledger holds 1000 tokens of each team today.
	type step struct{ fromRed, fromBlue, toRed, toBlue int64 }
	cases := []struct {
		name  string
		steps []step
	}{
		{"added", []step{{0, 0, 1500, 1500}}},
		{"added, raised again", []step{{0, 0, 1500, 1500}, {0, 0, 1500, 1500}}},
		{"removed and given back", []step{{0, 0, 1500, 1500}, {1500, 1500, 0, 0}, {0, 0, 1600, 1600}}},
		{"replicas from different configs", []step{{0, 0, 5000, 1500}, {5000, 0, 5000, 1500}}},
		{"kept", []step{{0, 0, 1500, 1500}, {1500, 1500, 1500, 1500}}},
	}
	for _, shared := range []bool{false, true} {
		for _, tc := range cases {
			t.Run(map[bool]string{false: "local/", true: "redis/"}[shared]+tc.name, func(t *testing.T) {
				cfg := govConfig("http://127.0.0.1:1")
				if shared {
					cfg.Redis.Addrs = []string{redistest.Start(t).Addr()}
				}
				cfg.Spend.StateFile = filepath.Join(t.TempDir(), "spend.json")
				cfg.Redis.SpillDir = t.TempDir()
				m, err := metrics.New(prometheus.NewRegistry(), &cfg)
				if err != nil {
					t.Fatal(err)
				}
				gov, err := openGovernance(&cfg, m, slog.New(slog.DiscardHandler))
				if err != nil {
					t.Fatal(err)
				}
				defer gov.Close()
				now := time.Now().UTC()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				for _, k := range []spend.Key{{KeyID: "a", Team: "red"}, {KeyID: "b", Team: "blue"}} {
					k.Day, k.Model = now.Format(time.DateOnly), "claude-x"
					gov.ledger.Add(k, spend.Totals{Requests: 3, Input: 600, Output: 400, CostMicros: 7800}, now)
				}
				if err := gov.ledger.Flush(ctx); err != nil {
					t.Fatal(err)
				}
				var last *config.Config
				for _, st := range tc.steps {
					last = budget(cfg, st.toRed, st.toBlue)
					if _, err := gov.raiseAdded(ctx, budget(cfg, st.fromRed, st.fromBlue), last, now); err != nil {
						t.Fatal(err)
					}
				}
				var subjects []ratelimit.Subject
				for _, tm := range last.Teams {
					subjects = append(subjects, ratelimit.Subject{Scope: ratelimit.ScopeTeam, ID: tm.Name, Limits: ratelimit.LimitsFrom(tm.Limits)})
				}
				states, err := gov.limiter.Peek(ctx, subjects)
				if err != nil {
					t.Fatal(err)
				}
				if len(states) != 2 {
					t.Fatalf("%d budget states, want 2: %+v", len(states), states)
				}
				for _, st := range states {
					if st.Kind != ratelimit.KindTokensPerDay || st.Used != 1000 {
						t.Errorf("team %s: %+v, want tokens_per_day used 1000 (the ledger's, once)", st.ID, st)
					}
				}
				if g := gov.current.Load(); g != last {
					t.Error("the refill's configuration is not the last reloaded")
				}
			})
		}
	}
}

// Reloads that restart the probe, checks, and a shutdown racing them, in
// the process: under -race nothing may be reported, no probe may run after
// the shutdown, and the shutdown must end.
func TestReloadRacesChecksAndShutdown(t *testing.T) {
	t.Setenv("ADMIN_TOKEN", reloadAdminToken)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer up.Close()
	dir := t.TempDir()
	path := filepath.Join(dir, "gateway.toml")
	probeOn := func(model string) string {
		return reloadDoc("127.0.0.1:0", up.URL, []string{"k1"}, 100, 1,
			fmt.Sprintf("[probe]\nenabled = true\ninterval_seconds = 1\nrequests = 1\ntimeout_seconds = 1\n\n[[probe.targets]]\nupstream = \"a\"\nmodel = %q\n", model))
	}
	docs := []string{probeOn("gpt-a"), probeOn("gpt-b")}
	docs[0] = strings.Replace(docs[0], `state_file = "spend.json"`, fmt.Sprintf("state_file = %q", filepath.Join(dir, "spend.json")), 1)
	docs[1] = strings.Replace(docs[1], `state_file = "spend.json"`, fmt.Sprintf("state_file = %q", filepath.Join(dir, "spend.json")), 1)
	if err := os.WriteFile(path, []byte(docs[0]), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rg, err := startGateway(cfg, ln, slog.New(slog.DiscardHandler), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	rl := &reloader{rg: rg, path: path}
	rg.reloader.Store(rl)
	rg.startProbe()

	var wg sync.WaitGroup
	var reloaded atomic.Int64
	stop := make(chan struct{})
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := 0; i < 40; i++ {
			select {
			case <-stop:
				return
			default:
			}
			_ = os.WriteFile(path, []byte(docs[(i+1)%2]), 0o600)
			if ch, err := rl.reload("test"); err == nil && len(ch) > 0 {
				reloaded.Add(1)
			}
		}
	}()
	go func() {
		defer wg.Done()
		for i := 0; i < 40; i++ {
			_, _ = rl.check([]byte(docs[i%2]), "x")
		}
	}()
	time.Sleep(200 * time.Millisecond)
	done := make(chan error, 1)
	go func() { done <- rg.shutdown(0, 2*time.Second) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("shutdown did not end with reloads racing it")
	}
	close(stop)
	wg.Wait()
	rg.probeMu.Lock()
	running := rg.probeDone != nil
	rg.probeMu.Unlock()
	if running {
		t.Error("a probe runs after the shutdown")
	}
	if reloaded.Load() == 0 {
		t.Error("no reload took effect")
	}
}
