package agents_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/mockllm"
)

// runLimit bounds one agent's run: against the fake upstream each takes a
// few seconds, most of it the agent's own start-up.
const runLimit = 90 * time.Second

// prompt names none of the agents' tools, so the fake upstream answers
// with text and every agent stops after one turn.
const prompt = "say hi"

// scenario is one way of pointing an agent at the gateway.
type scenario struct {
	name  string // also its [[keys]] name in mode keys
	agent string // a key of pins
	about string // what it runs, for the report
	route string // the route label of its model calls
	// websocket: its model calls are turns on a Responses API WebSocket;
	// else they are HTTP requests.
	websocket bool
	calls     int    // the model calls it makes; 0: at least one
	optIn     string // an environment variable that must be set for it to run
	mode      string // the only mode it runs in; "": every mode
	// refused: its [[keys]] entry has a limit that refuses some of its
	// calls (calls counts the admitted ones); those refusals, and only
	// those, are expected in the access log.
	refused *refusal
	// session is the conversation source that names the run's calls as
	// one session (the agent's own session header); "" when the agent
	// sends none.
	session string
	// classes are the request classes its calls must name, one each, in
	// order ("" for none said); agents the types of the subagents its
	// session must show.
	classes []string
	agents  []string
	prepare func(r *run) []string
}

// refusal is what a scenario's [[keys]] limit refuses and how the agent
// must take it.
type refusal struct {
	limits    string // TOML lines added to its [[keys]] entry
	rejection string // the access log's rejection of each refused call
	refused   int    // the refused calls it makes
	// retryAfter is the least time between a refusal and the agent's next
	// call: it waits out the Retry-After the refusal carried.
	retryAfter time.Duration
	// surfaced: the agent does not retry the refusal but ends its run at
	// once, printing this.
	surfaced string
}

var scenarios = []scenario{
	{name: "claude-api-key", agent: "claude", route: "messages", session: "x-claude-code-session-id",
		about:   "claude -p, ANTHROPIC_API_KEY (x-api-key)",
		prepare: func(r *run) []string { return r.claude("ANTHROPIC_API_KEY", false, false) }},
	{name: "claude-auth-token", agent: "claude", route: "messages", session: "x-claude-code-session-id",
		about:   "claude -p, ANTHROPIC_AUTH_TOKEN (Authorization: Bearer)",
		prepare: func(r *run) []string { return r.claude("ANTHROPIC_AUTH_TOKEN", false, false) }},
	// With its gateway hint headers on, Claude Code names each call's
	// request class: `claude -p` makes one main call.
	{name: "claude-hints", agent: "claude", route: "messages", session: "x-claude-code-session-id", calls: 1,
		classes: []string{"main"},
		about:   "claude -p, ANTHROPIC_AUTH_TOKEN, CLAUDE_CODE_GATEWAY_HINT_HEADERS=1",
		prepare: func(r *run) []string { return r.claude("ANTHROPIC_AUTH_TOKEN", false, true) }},
	// A main turn that runs a subagent through the Agent tool: the session
	// is the main call, the subagent's, and the main call after it.
	{name: "claude-subagent", agent: "claude", route: "messages", session: "x-claude-code-session-id", calls: 3,
		classes: []string{"main", "subagent", "main"}, agents: []string{"Explore"},
		about:   "claude -p, hint headers on, its Agent tool run (an Explore subagent)",
		prepare: func(r *run) []string { return r.claudeSubagent() }},
	// Claude Code's non-essential traffic includes its HEAD /api/hello
	// warm-up (the gateway answers it), but also lookups of
	// api.anthropic.com, which this machine cannot reach: so only on demand.
	{name: "claude-warmup", agent: "claude", route: "messages", optIn: "TOLLGATE_AGENTS_WARMUP",
		about:   "claude -p, ANTHROPIC_API_KEY, non-essential traffic on (its HEAD /api/hello)",
		prepare: func(r *run) []string { return r.claude("ANTHROPIC_API_KEY", true, false) }},
	// Codex opens its socket's session with a warm-up, then its turn.
	{name: "codex-builtin", agent: "codex", route: "responses", websocket: true, session: "session-id",
		calls: 2, classes: []string{"warmup", "main"},
		about:   "codex exec, built-in OpenAI provider, openai_base_url (WebSocket)",
		prepare: func(r *run) []string { return r.codex("builtin") }},
	// rpm = 1 is a bucket of one call refilled in a minute: it admits
	// Codex's warm-up (a response.create with generate: false, the
	// socket's first call) and refuses the turn after it with a 429 error
	// event on the socket, retry-after 60. Codex (0.171) does not show the
	// refusal: it waits out retry-after, opens a new socket and sends the
	// turn again, which the refilled bucket admits; so this run takes a
	// minute. Its built-in provider's retries cannot be configured.
	{name: "codex-refused", agent: "codex", route: "responses", websocket: true, calls: 2, mode: "keys",
		refused: &refusal{limits: "rpm = 1", rejection: "rpm", refused: 1, retryAfter: 55 * time.Second},
		about:   "codex exec, built-in provider (WebSocket), [[keys]] rpm = 1: the turn refused 429, retried after retry-after",
		prepare: func(r *run) []string { return r.codex("refused") }},
	// tokens_per_day = 100 admits Codex's warm-up (nothing is spent yet),
	// whose ~8k tokens spend it; the turn after it is refused on the
	// socket, 429 insufficient_quota. A spent budget lasts the day, and
	// Codex, which waits out a rate limit, ends the run at once saying so.
	{name: "codex-quota", agent: "codex", route: "responses", websocket: true, calls: 1, mode: "keys",
		refused: &refusal{limits: "tokens_per_day = 100", rejection: "tokens_per_day", refused: 1, surfaced: "Quota exceeded"},
		about:   "codex exec, built-in provider (WebSocket), [[keys]] tokens_per_day = 100: the turn refused, Codex prints it",
		prepare: func(r *run) []string { return r.codex("refused") }},
	{name: "codex-http", agent: "codex", route: "responses", session: "session-id",
		about:   "codex exec, [model_providers.tollgate] (HTTP)",
		prepare: func(r *run) []string { return r.codex("http") }},
	{name: "codex-custom-ws", agent: "codex", route: "responses", websocket: true, session: "session-id",
		calls: 2, classes: []string{"warmup", "main"},
		about:   "codex exec, [model_providers.tollgate] supports_websockets = true",
		prepare: func(r *run) []string { return r.codex("websocket") }},
	{name: "opencode-chat", agent: "opencode", route: "chat_completions",
		about:   "opencode run, @ai-sdk/openai-compatible (Chat Completions)",
		prepare: func(r *run) []string { return r.opencode("@ai-sdk/openai-compatible", "gpt-5.5") }},
	{name: "opencode-responses", agent: "opencode", route: "responses",
		about:   "opencode run, @ai-sdk/openai (Responses API)",
		prepare: func(r *run) []string { return r.opencode("@ai-sdk/openai", "gpt-5.5") }},
	{name: "opencode-messages", agent: "opencode", route: "messages",
		about:   "opencode run, @ai-sdk/anthropic (Messages)",
		prepare: func(r *run) []string { return r.opencode("@ai-sdk/anthropic", "claude-sonnet-5") }},
	{name: "openai-node-ws", agent: "openai", route: "responses", websocket: true, calls: 2,
		about:   "openai-node ResponsesWS, two turns on one socket",
		prepare: func(r *run) []string { return r.node() }},
}

func TestAgents(t *testing.T) {
	if os.Getenv("TOLLGATE_AGENTS") == "" {
		t.Skip("set TOLLGATE_AGENTS=1 (make agents) to run the coding agents through a gateway; it installs them from npm")
	}
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed to install and run the agents: %v", tool, err)
		}
	}
	began := time.Now()
	root, err := cacheRoot()
	if err != nil {
		t.Fatal(err)
	}
	scratch := t.TempDir()
	ctx := context.Background()

	// Build the gateway while npm downloads.
	bin := filepath.Join(scratch, "gateway")
	built := make(chan error, 1)
	go func() {
		out, err := exec.Command("go", "build", "-o", bin, "../../cmd/gateway").CombinedOutput()
		if err != nil {
			err = fmt.Errorf("go build ../../cmd/gateway: %v\n%s", err, out)
		}
		built <- err
	}()
	inst := ensureAll(ctx, root, scratch)
	if err := <-built; err != nil {
		t.Fatal(err)
	}
	fmt.Printf("agents (cache %s):\n", root)
	for _, name := range []string{"claude", "codex", "opencode", "openai"} {
		p, in := pins[name], inst[name]
		how := fmt.Sprintf("installed in %.1fs", in.took.Seconds())
		if in.cached {
			how = "cached"
		}
		if in.err != nil {
			how = "FAILED: " + in.err.Error()
		}
		fmt.Printf("  %-9s %s@%s  %s\n", name, p.pkg, p.version, how)
		if in.err != nil {
			t.Errorf("installing %s@%s: %v", p.pkg, p.version, in.err)
		}
	}
	fmt.Printf("set up in %.1fs\n\n", time.Since(began).Seconds())
	if t.Failed() {
		return
	}

	var results []*result
	for _, mode := range []string{"passthrough", "keys"} {
		t.Run(mode, func(t *testing.T) {
			results = append(results, runMode(t, ctx, bin, mode, inst)...)
		})
	}
	printReport(results)
	fmt.Printf("\nTestAgents took %.1fs\n", time.Since(began).Seconds())
}

// runMode starts a stack in mode and runs every scenario against it, one at
// a time (the metrics and the access log are read per run).
func runMode(t *testing.T, ctx context.Context, bin, mode string, inst map[string]installed) []*result {
	var runs []*run
	keys, limits := map[string]string{}, map[string]string{}
	for _, sc := range scenarios {
		if sc.optIn != "" && os.Getenv(sc.optIn) == "" || sc.mode != "" && sc.mode != mode {
			continue
		}
		key := newKey(t)
		keys[sc.name] = key
		if sc.refused != nil {
			limits[sc.name] = sc.refused.limits
		}
		runs = append(runs, &run{sc: sc, mode: mode, id: mode + "/" + sc.name, key: key, dir: inst[sc.agent].dir})
	}
	s := startStack(t, bin, mode, keys, limits)
	var results []*result
	for _, r := range runs {
		t.Run(r.sc.name, func(t *testing.T) {
			res := r.execute(t, ctx, s)
			results = append(results, res)
			for _, p := range res.problems {
				t.Error(p)
			}
			if t.Failed() {
				t.Log(res.evidence())
			}
		})
	}
	if ops := s.opsLines(); len(ops) > 0 {
		t.Logf("the gateway's warnings and errors (%s):\n%s", mode, strings.Join(ops, "\n"))
	}
	return results
}

func newKey(t *testing.T) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "tg-agents-" + hex.EncodeToString(b)
}

// run is one scenario in one mode.
type run struct {
	t          *testing.T
	sc         scenario
	mode, id   string
	key        string // the caller's key
	dir        string // the agent's install folder
	home, work string
	base       string // the recorder's URL
	env        []string
}

// keyID is how the access log names the caller: its [[keys]] name in mode
// keys, a SHA-256 prefix in passthrough.
func (r *run) keyID() string {
	if r.mode == "keys" {
		return r.sc.name
	}
	sum := sha256.Sum256([]byte(r.key))
	return hex.EncodeToString(sum[:6])
}

// result is what a run did and what the gateway saw of it.
type result struct {
	r              *run
	args           []string
	err            error
	timedOut       bool
	took           time.Duration
	stdout, stderr []byte
	ex             []exchange
	lines          []logLine
	sockets        map[string]float64 // websocket_connections_total added during the run, by result
	problems       []string
	unsettled      string // what settle saw still going on
	// seen is the usage the agent was sent, summed over its exchanges;
	// ledger what the spend ledger holds for its key after the run.
	seen, ledger usage
	ledgerErr    error
	// s is the stack the run ran on; sessionSeen what checkSession read of
	// the run's session, for the report.
	s           *stack
	sessionSeen string
}

// execute runs the scenario in a home and folder of its own, with only the
// environment it sets, and checks it.
func (r *run) execute(t *testing.T, ctx context.Context, s *stack) *result {
	t.Helper()
	r.t = t
	r.home, r.work = filepath.Join(t.TempDir(), "home"), filepath.Join(t.TempDir(), "work")
	for _, d := range []string{r.home, r.work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	r.base = s.agents
	r.env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + r.home, "TERM=dumb", "NO_COLOR=1", "LANG=C.UTF-8",
		"XDG_CONFIG_HOME=" + filepath.Join(r.home, ".config"), "XDG_CACHE_HOME=" + filepath.Join(r.home, ".cache"),
		"XDG_DATA_HOME=" + filepath.Join(r.home, ".local", "share"), "XDG_STATE_HOME=" + filepath.Join(r.home, ".local", "state")}
	res := &result{r: r, args: r.sc.prepare(r), s: s}

	before, err := s.sockets()
	if err != nil {
		t.Fatalf("reading /metrics: %v", err)
	}
	first := s.log.len()
	s.rec.begin(r.id)
	res.exec(ctx, r)
	res.unsettled = s.settle(r.id)
	s.rec.begin("")
	after, err := s.sockets()
	if err != nil {
		t.Fatalf("reading /metrics: %v", err)
	}
	res.sockets = map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			res.sockets[k] = d
		}
	}
	res.ex, res.lines = s.rec.of(r.id), s.log.since(first)
	res.ledger, res.ledgerErr = s.ledger(r.keyID())
	res.check()
	return res
}

// exec runs the agent within runLimit in a process group of its own, and
// ends whatever it left behind.
func (res *result) exec(ctx context.Context, r *run) {
	ctx, cancel := context.WithTimeout(ctx, runLimit)
	defer cancel()
	var stdout, stderr lockedBuffer
	cmd := exec.CommandContext(ctx, res.args[0], res.args[1:]...)
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = r.work, r.env, &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	res.err = cmd.Run()
	res.took = time.Since(start)
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	res.timedOut = errors.Is(ctx.Err(), context.DeadlineExceeded)
	res.stdout, res.stderr = stdout.Bytes(), stderr.Bytes()
}

// modelPaths are the routes of model calls over HTTP.
var modelPaths = map[string]bool{"/v1/messages": true, "/v1/chat/completions": true, "/v1/responses": true}

func isModelRoute(route string) bool {
	return route == "messages" || route == "chat_completions" || route == "responses"
}

// check holds the run to what it should have done, filling problems.
func (res *result) check() {
	sc := res.r.sc
	bad := func(format string, args ...any) { res.problems = append(res.problems, fmt.Sprintf(format, args...)) }

	surfaced := ""
	if sc.refused != nil {
		surfaced = sc.refused.surfaced
	}
	switch {
	case res.timedOut:
		bad("%s did not finish within %v", sc.agent, runLimit)
	case surfaced != "":
		// The agent ends the run on the refusal, as an error.
		if printed := string(res.stdout) + string(res.stderr); !strings.Contains(printed, surfaced) {
			bad("%s did not print the refusal (%q) it was sent", sc.agent, surfaced)
		}
	case res.err != nil:
		bad("%s exited: %v", sc.agent, res.err)
	}
	if answer := strings.TrimSpace(mockllm.Text(mockTokens)); surfaced == "" && !strings.Contains(string(res.stdout), answer) {
		bad("the answer %q is not in what %s printed", answer, sc.agent)
	}

	var calls, refused []logLine
	for _, l := range res.lines {
		// A refused call of a scenario that expects refusals is held to
		// what the gateway must record of a refusal, below.
		if sc.refused != nil && isModelRoute(l.str("route")) && l.str("outcome") == "rejected" {
			refused = append(refused, l)
			continue
		}
		if o := l.str("outcome"); o != "ok" {
			bad("access-log line with outcome %q (status %v, route %q, error_type %q, rejection %q): %s",
				o, l.f["status"], l.str("route"), l.str("error_type"), l.str("rejection"), l.raw)
		}
		if isModelRoute(l.str("route")) {
			calls = append(calls, l)
		}
	}
	switch {
	case len(calls) == 0:
		bad("no model call in the access log")
	case sc.calls > 0 && len(calls) != sc.calls:
		bad("%d model calls in the access log, want %d", len(calls), sc.calls)
	}
	for _, l := range calls {
		res.checkCall(l)
	}
	if sc.refused != nil {
		res.checkRefusals(calls, refused)
	}

	var upgrades, accepted, httpCalls int
	for _, e := range res.ex {
		path := strings.SplitN(e.uri, "?", 2)[0]
		switch {
		case e.upgrade:
			upgrades++
			if e.status == 101 {
				accepted++
			} else {
				bad("WebSocket upgrade %s refused: %d", e.uri, e.status)
			}
		case e.status == 0 || e.status >= 400:
			bad("%s %s answered %d%s", e.method, e.uri, e.status, suffix(e.err))
		}
		if e.method == "POST" && modelPaths[path] {
			httpCalls++
		}
	}
	if sc.websocket {
		if accepted == 0 {
			bad("no WebSocket upgrade accepted: %s did not use the Responses API's WebSocket mode", sc.agent)
		}
		if httpCalls > 0 {
			bad("%d model calls over HTTP: %s fell back from the WebSocket", httpCalls, sc.agent)
		}
		if got := res.sockets["accepted"]; int(got) != accepted {
			bad("tollgate_websocket_connections_total{result=\"accepted\"} rose by %v, want %d (the upgrades the gateway answered 101)", got, accepted)
		}
	} else {
		if upgrades > 0 {
			bad("%d WebSocket upgrades, want none", upgrades)
		}
		if httpCalls != len(calls) {
			bad("%d model requests sent, %d model calls in the access log", httpCalls, len(calls))
		}
	}
	res.checkLedger(len(calls))
	res.checkSession(calls)
	for result, n := range res.sockets {
		if result != "accepted" {
			bad("tollgate_websocket_connections_total{result=%q} rose by %v", result, n)
		}
	}
	if strings.Contains(string(res.stderr), "Falling back from WebSockets") {
		bad("%s says it fell back from WebSockets to HTTPS", sc.agent)
	}
}

// checkLedger holds the spend ledger to the usage the agent was sent: each
// of its admitted calls answered with a usage, and the key's ledger is
// their sum, requests and tokens (each run has a key of its own).
func (res *result) checkLedger(calls int) {
	bad := func(format string, args ...any) { res.problems = append(res.problems, fmt.Sprintf(format, args...)) }
	for _, e := range res.ex {
		if e.seenErr != "" {
			bad("the usage in the answer to %s cannot be read: %s", e.String(), e.seenErr)
		}
		res.seen.add(e.seen)
	}
	if res.seen.answers != int64(calls) {
		bad("%d answers with a usage reached %s, for %d model calls in the access log", res.seen.answers, res.r.sc.agent, calls)
	}
	switch {
	case res.ledgerErr != nil:
		bad("reading the ledger: %v", res.ledgerErr)
	case res.ledger != res.seen:
		bad("the ledger holds %v for key %s; %s was sent %v", res.ledger, res.r.keyID(), res.r.sc.agent, res.seen)
	}
}

// checkSession holds a run whose agent names its session to being one
// conversation: every admitted call's access-log line names the same
// conversation, from the agent's session header, with the classes the
// scenario expects; and the admin API's figures of that session are its
// calls': as many turns, their cost summed, their classes counted.
func (res *result) checkSession(calls []logLine) {
	r, sc := res.r, res.r.sc
	bad := func(format string, args ...any) { res.problems = append(res.problems, fmt.Sprintf(format, args...)) }
	if sc.session == "" {
		return
	}
	var id string
	for _, e := range res.ex {
		if e.session != "" && id == "" {
			id = e.session
		} else if e.session != "" && e.session != id {
			bad("the agent sent two session ids: %q and %q", id, e.session)
		}
	}
	if id == "" {
		bad("no request carried a session header (%v)", sessionHeaders)
		return
	}
	var cost int64
	classes := map[string]int64{}
	for i, l := range calls {
		if l.str("conversation") == "" || l.str("conversation") != calls[0].str("conversation") || l.str("conversation_source") != sc.session {
			bad("model call %s: conversation %q from %q; want the session's, from %s", l.str("request_id"),
				l.str("conversation"), l.str("conversation_source"), sc.session)
		}
		class := l.str("request_class")
		if i < len(sc.classes) && class != sc.classes[i] {
			bad("model call %s: request_class %q, want %q", l.str("request_id"), class, sc.classes[i])
		}
		if class == "" {
			class = "none"
		}
		classes[class]++
		c, _ := l.num("cost_micros")
		cost += int64(c)
	}
	rep, err := res.s.session(id, r.mode)
	if err != nil {
		bad("GET /admin/conversations for the session: %v", err)
		return
	}
	if rep.Turns != int64(len(calls)) || rep.CostMicros != cost {
		bad("the session has %d turns costing %d µ$; its %d calls in the access log cost %d", rep.Turns, rep.CostMicros, len(calls), cost)
	}
	for class, n := range classes {
		if got := rep.Session.Classes[class].Calls; got != n {
			bad("the session has %d calls of class %q, the access log %d", got, class, n)
		}
	}
	var types []string
	for _, a := range rep.Session.Agents {
		types = append(types, a.Type)
	}
	if !slices.Equal(types, sc.agents) {
		bad("the session's subagents are of types %q, want %q", types, sc.agents)
	}
	res.sessionSeen = fmt.Sprintf("%d turns, $%.6f, classes %v", rep.Turns, float64(rep.CostMicros)/1e6, classes)
}

// checkCall holds one model call's access-log line to what the gateway
// must record of it.
func (res *result) checkCall(l logLine) {
	r, sc := res.r, res.r.sc
	bad := func(format string, args ...any) {
		res.problems = append(res.problems, fmt.Sprintf("model call %s: ", l.str("request_id"))+fmt.Sprintf(format, args...))
	}
	if got := l.str("route"); got != sc.route {
		bad("route %q, want %q", got, sc.route)
	}
	if st, _ := l.num("status"); st != 200 {
		bad("status %v, want 200", l.f["status"])
	}
	if got, want := l.str("key_id"), r.keyID(); got != want {
		bad("key_id %q, want %q", got, want)
	}
	// Codex opens a socket's session with a warm-up (isWarmUp).
	out, _ := l.num("output_tokens")
	warmUp := isWarmUp(sc, l)
	if ttft, ok := l.num("ttft_ms"); !warmUp && (!ok || ttft <= 0) {
		bad("no ttft_ms")
	}
	if in, _ := l.num("input_tokens"); in <= 0 {
		bad("no input_tokens")
	}
	if !warmUp && out <= 0 {
		bad("no output_tokens")
	}
	if est, _ := l.f["tokens_estimated"].(bool); est {
		bad("tokens_estimated: the upstream's usage was not read")
	}
	transport := l.str("transport")
	if sc.websocket && transport != "websocket" {
		bad("transport %q, want \"websocket\"", transport)
	}
	if !sc.websocket && transport != "" && transport != "http" {
		bad("transport %q, want HTTP", transport)
	}
	if r.mode == "keys" {
		if c, _ := l.num("cost_micros"); c <= 0 {
			bad("no cost_micros")
		}
		if got := l.str("team"); got != team {
			bad("team %q, want %q", got, team)
		}
	}
}

// isWarmUp says whether l is a warm-up of Codex's: a socket's session opens
// with a response.create with generate: false, a whole response with no
// output, so no first token; the upstream reports its usage, 0 output
// tokens.
func isWarmUp(sc scenario, l logLine) bool {
	out, reported := l.num("output_tokens")
	return sc.websocket && reported && out == 0 && l.f["terminal_seen"] == true
}

// checkRefusals holds a scenario whose limit refuses calls to what it
// expects: the refusals it counts, each as the gateway must record it;
// unless the agent ends its run on them (surfaced), the warm-up admitted
// first, then each refused call followed, no sooner than retryAfter, by the
// agent's next call, which is admitted.
func (res *result) checkRefusals(calls, refused []logLine) {
	sc := res.r.sc
	bad := func(format string, args ...any) { res.problems = append(res.problems, fmt.Sprintf(format, args...)) }
	if len(refused) != sc.refused.refused {
		bad("%d refused model calls in the access log, want %d (the turn refused by [[keys]] %s)", len(refused), sc.refused.refused, sc.refused.limits)
	}
	for _, l := range refused {
		res.checkRefused(l)
	}
	if len(calls) == 0 || !isWarmUp(sc, calls[0]) {
		bad("the first admitted model call is not %s's warm-up: [[keys]] %s should admit it", sc.agent, sc.refused.limits)
	}
	if sc.refused.surfaced != "" {
		return // nothing follows: the agent ended its run (check)
	}
	// Each refusal is followed by the agent's next call, after the
	// retry-after it was given.
	model := func(l logLine) bool { return isModelRoute(l.str("route")) }
	for i, l := range res.lines {
		if !model(l) || l.str("outcome") != "rejected" {
			continue
		}
		var next *logLine
		for j := i + 1; j < len(res.lines); j++ {
			if model(res.lines[j]) {
				next = &res.lines[j]
				break
			}
		}
		if next == nil {
			bad("no model call after the refused %s: %s did not send its turn again", l.str("request_id"), sc.agent)
			continue
		}
		t0, err0 := time.Parse(time.RFC3339Nano, l.str("time"))
		t1, err1 := time.Parse(time.RFC3339Nano, next.str("time"))
		gap := t1.Sub(t0) - time.Duration(num(*next, "e2e_ms")*float64(time.Millisecond))
		switch {
		case err0 != nil || err1 != nil:
			bad("access-log times %q, %q: %v %v", l.str("time"), next.str("time"), err0, err1)
		case gap < sc.refused.retryAfter:
			bad("%s sent its turn again %v after the refusal %s, sooner than the retry-after it was given (%v at least)",
				sc.agent, gap.Round(time.Millisecond), l.str("request_id"), sc.refused.retryAfter)
		}
	}
}

func num(l logLine, k string) float64 {
	v, _ := l.num(k)
	return v
}

// checkRefused holds one refused model call's access-log line to what the
// gateway must record of a refusal by the caller's limit: on the socket,
// 429, outcome rejected, naming the limit.
func (res *result) checkRefused(l logLine) {
	r, sc := res.r, res.r.sc
	bad := func(format string, args ...any) {
		res.problems = append(res.problems, fmt.Sprintf("refused model call %s: ", l.str("request_id"))+fmt.Sprintf(format, args...))
	}
	if got := l.str("route"); got != sc.route {
		bad("route %q, want %q", got, sc.route)
	}
	if got, want := l.str("transport"), "http"; sc.websocket {
		if got != "websocket" {
			bad("transport %q, want \"websocket\"", got)
		}
	} else if got != "" && got != want {
		bad("transport %q, want HTTP", got)
	}
	if st, _ := l.num("status"); st != 429 {
		bad("status %v, want 429", l.f["status"])
	}
	if got := l.str("rejection"); got != sc.refused.rejection {
		bad("rejection %q, want %q", got, sc.refused.rejection)
	}
	if got, want := l.str("key_id"), r.keyID(); got != want {
		bad("key_id %q, want %q", got, want)
	}
	if c, _ := l.num("cost_micros"); c != 0 {
		bad("cost_micros %v: a refused call is not billed", c)
	}
}

func suffix(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}

// evidence is what a failed run sent, what the gateway answered and logged,
// and the end of what the agent printed.
func (res *result) evidence() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s\ncommand: %s\nrequests the agent sent (through the recorder):\n", res.r.id, res.r.sc.about, strings.Join(res.args, " "))
	for _, e := range res.ex {
		fmt.Fprintf(&b, "  %s  request id %s, %v\n    headers: %s\n    %s\n", e.String(), e.requestID, e.took.Round(time.Millisecond),
			strings.Join(e.headers, ","), strings.Join(e.shown, "  "))
	}
	fmt.Fprintf(&b, "access-log lines:\n")
	for _, l := range res.lines {
		fmt.Fprintf(&b, "  %s\n", l.raw)
	}
	if res.unsettled != "" {
		fmt.Fprintf(&b, "note: %s\n", res.unsettled)
	}
	fmt.Fprintf(&b, "sockets: %v\nstdout (end):\n%s\nstderr (end):\n%s\n", res.sockets, tail(res.stdout, 3000), tail(res.stderr, 3000))
	return b.String()
}

// printReport prints, per run, the requests the agent sent and each model
// call as the access log has it.
func printReport(results []*result) {
	fmt.Printf("\n%-12s %-20s %-5s %6s  %s\n", "mode", "scenario", "", "time", "what")
	failed := 0
	for _, res := range results {
		verdict := "ok"
		if len(res.problems) > 0 {
			verdict, failed = "FAIL", failed+1
		}
		fmt.Printf("%-12s %-20s %-5s %5.1fs  %s\n", res.r.mode, res.r.sc.name, verdict, res.took.Seconds(), res.r.sc.about)
		for _, e := range res.ex {
			fmt.Printf("    sent %s\n", e.String())
		}
		for _, l := range res.lines {
			if !isModelRoute(l.str("route")) {
				fmt.Printf("    line %s %v %s key %s\n", l.str("route"), l.f["status"], l.str("outcome"), l.str("key_id"))
				continue
			}
			transport := l.str("transport")
			if transport == "" {
				transport = "http"
			}
			ttft, _ := l.num("ttft_ms")
			in, _ := l.num("input_tokens")
			out, _ := l.num("output_tokens")
			cost := "-"
			if c, ok := l.num("cost_micros"); ok {
				cost = fmt.Sprintf("$%.6f", c/1e6)
			}
			fmt.Printf("    call %s %s %v %s ttft %.1fms tokens %.0f+%.0f cost %s key %s\n",
				l.str("route"), transport, l.f["status"], l.str("outcome"), ttft, in, out, cost, l.str("key_id"))
		}
		fmt.Printf("    usage sent %v; ledger %v\n", res.seen, res.ledger)
		if res.sessionSeen != "" {
			fmt.Printf("    session %s\n", res.sessionSeen)
		}
		if len(res.sockets) > 0 {
			b, _ := json.Marshal(res.sockets)
			fmt.Printf("    sockets %s\n", b)
		}
		if res.unsettled != "" {
			fmt.Printf("    note: %s\n", res.unsettled)
		}
		for _, p := range res.problems {
			fmt.Printf("    PROBLEM %s\n", p)
		}
	}
	fmt.Printf("\nagent runs: %d ok, %d failed\n", len(results)-failed, failed)
}
