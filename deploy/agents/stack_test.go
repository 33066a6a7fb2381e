package agents_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The fake upstream's schedule: short, so an agent's run takes its own
// start-up time and little more, and at least two tokens, so TPOT exists.
const (
	mockTokens = 8
	mockTTFT   = "30ms"
	mockITL    = "5ms"
	// upstreamKeyEnv holds the upstream's own key in mode keys: the mock
	// accepts only it, so a caller's key that reached it would fail.
	upstreamKeyEnv = "TOLLGATE_AGENTS_UPSTREAM_KEY"
	adminTokenEnv  = "TOLLGATE_AGENTS_ADMIN_TOKEN"
	// team is the [[teams]] entry every key belongs to in mode keys.
	team = "agents"
)

// stack is a fake upstream, a gateway in front of it in one mode, and the
// recording proxy the agents talk to.
type stack struct {
	mode    string
	gateway string // the gateway's base URL
	agents  string // the recorder's base URL, which the agents are given
	log     *accessLog
	rec     *recorder
	stderr  *lockedBuffer // the gateway's operational log
	// adminToken opens the admin API, whose /admin/spend the ledger is read
	// from.
	adminToken string
}

// startStack builds the config for mode (in mode keys, one [[keys]] entry
// per scenario, named after it, with the sha256 `gateway hash-key` prints
// for keys[name] and the lines limits[name] adds) and starts the mock, the gateway and the recorder.
func startStack(t *testing.T, bin, mode string, keys, limits map[string]string) *stack {
	t.Helper()
	dir := t.TempDir()
	mockAddr, gwAddr := freeAddr(t), freeAddr(t)
	upstreamKey := "tg-upstream-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	adminToken := newKey(t)

	var cfg strings.Builder
	fmt.Fprintf(&cfg, "[server]\nlisten = %q\ndrain_timeout_seconds = 2\n\n", gwAddr)
	fmt.Fprintf(&cfg, "[auth]\nmode = %q\n\n", mode)
	fmt.Fprintf(&cfg, "[[upstreams]]\nname = \"mock\"\nbase_url = \"http://%s\"\nresponses_websocket = true\n", mockAddr)
	if mode == "keys" {
		fmt.Fprintf(&cfg, "api_key_env = %q\n", upstreamKeyEnv)
	}
	fmt.Fprintf(&cfg, "\n[log]\nlevel = \"info\"\naccess_log = true\n\n[admin]\ntoken_env = %q\n\n", adminTokenEnv)
	fmt.Fprintf(&cfg, "[spend]\nstate_file = %q\n\n[ownership]\nstate_file = %q\n\n[conversations]\nenabled = true\nstate_file = %q\n\n[redis]\nspill_dir = %q\n\n",
		filepath.Join(dir, "spend.json"), filepath.Join(dir, "ownership.jsonl"), filepath.Join(dir, "conversations.json"), dir)
	// One price for every model the agents ask for, so every call is billed.
	fmt.Fprintf(&cfg, "[[models]]\npattern = \"*\"\ninput_usd_per_mtok = 3.0\noutput_usd_per_mtok = 15.0\n\n")
	if mode == "keys" {
		fmt.Fprintf(&cfg, "[[teams]]\nname = %q\n\n", team)
		names := make([]string, 0, len(keys))
		for name := range keys {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			fmt.Fprintf(&cfg, "[[keys]]\nname = %q\nsha256 = %q\nteam = %q\n", name, hashKey(t, bin, keys[name]), team)
			if l := limits[name]; l != "" {
				fmt.Fprintf(&cfg, "%s\n", l)
			}
			fmt.Fprintf(&cfg, "\n")
		}
	}
	cfgPath := filepath.Join(dir, "gateway.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), upstreamKeyEnv+"="+upstreamKey, adminTokenEnv+"="+adminToken)

	mockArgs := []string{"mock-upstream", "-listen", mockAddr, "-ttft", mockTTFT, "-itl", mockITL, "-tokens", strconv.Itoa(mockTokens)}
	if mode == "keys" {
		mockArgs = append(mockArgs, "-require-key-env", upstreamKeyEnv)
	}
	mockOut := &lockedBuffer{}
	mock := exec.Command(bin, mockArgs...)
	mock.Env, mock.Stdout, mock.Stderr = env, mockOut, mockOut
	startProcess(t, "mock upstream", mock, mockOut, func() bool { return dialable(mockAddr) })

	s := &stack{mode: mode, gateway: "http://" + gwAddr, log: &accessLog{}, stderr: &lockedBuffer{}, adminToken: adminToken}
	gw := exec.Command(bin, "serve", "-config", cfgPath)
	gw.Env, gw.Stdout, gw.Stderr = env, s.log, s.stderr
	startProcess(t, "gateway ("+mode+")", gw, s.stderr, func() bool { return get(s.gateway+"/readyz") == http.StatusOK })

	s.rec = startRecorder(t, s.gateway)
	s.agents = s.rec.url
	return s
}

// hashKey runs `gateway hash-key` on key, as an operator would.
func hashKey(t *testing.T, bin, key string) string {
	t.Helper()
	cmd := exec.Command(bin, "hash-key")
	cmd.Stdin = strings.NewReader(key)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("gateway hash-key: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// startProcess starts cmd and waits until ready says so; the test ends it
// with SIGTERM (SIGKILL after 10 s) and shows out if the test failed.
func startProcess(t *testing.T, what string, cmd *exec.Cmd, out *lockedBuffer, ready func() bool) {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", what, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("%s output (last 8 KiB):\n%s", what, tail(out.Bytes(), 8<<10))
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for !ready() {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("%s exited: %v\n%s", what, err, tail(out.Bytes(), 8<<10))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready after 30 s", what)
		}
	}
}

// freeAddr returns a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func dialable(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func get(u string) int {
	resp, err := http.Get(u)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// lockedBuffer is an output buffer safe to read while a process writes it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf.Len() > 4<<20 { // enough for any run here; keep memory bounded
		return len(p), nil
	}
	return b.buf.Write(p)
}

func (b *lockedBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}

// accessLog keeps the gateway's stdout: one JSON line per request.
type accessLog struct {
	mu      sync.Mutex
	partial []byte
	lines   []logLine
}

// logLine is one access-log line, as written and decoded.
type logLine struct {
	raw string
	f   map[string]any
}

func (a *accessLog) Write(p []byte) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.partial = append(a.partial, p...)
	for {
		i := bytes.IndexByte(a.partial, '\n')
		if i < 0 {
			break
		}
		raw := string(a.partial[:i])
		a.partial = a.partial[i+1:]
		l := logLine{raw: raw}
		if err := json.Unmarshal([]byte(raw), &l.f); err != nil {
			l.f = map[string]any{"msg": "not JSON"}
		}
		a.lines = append(a.lines, l)
	}
	return len(p), nil
}

// since returns the lines from index i on.
func (a *accessLog) since(i int) []logLine {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.lines[i:])
}

func (a *accessLog) len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.lines)
}

func (l logLine) str(k string) string {
	s, _ := l.f[k].(string)
	return s
}

func (l logLine) num(k string) (float64, bool) {
	v, ok := l.f[k].(float64)
	return v, ok
}

// exchange is one request an agent sent, as the recorder saw it: no header
// value but a few harmless ones, never a key.
type exchange struct {
	run       string // the run it belongs to
	method    string
	uri       string
	headers   []string // names, sorted
	shown     []string // name=value of the headers in showHeaders
	upgrade   bool
	status    int    // the gateway's answer; 0 when none came
	requestID string // X-Tollgate-Request-Id of the answer
	err       string // the recorder's error reaching the gateway
	done      bool
	left      bool // the agent closed the connection before the answer's end
	took      time.Duration
	// seen is the usage the agent was sent in this exchange's answer (or
	// on its socket), read from the bytes relayed (usage_test.go);
	// seenErr says why it could not be read.
	seen    usage
	seenErr string
	tap     *tap
	answer  *http.Response
	// session is the agent's session id, from the header that carries it
	// (sessionHeaders), to ask the admin API for the session's figures.
	session string
}

// sessionHeaders carry the agents' session ids: Claude Code's, Codex's.
var sessionHeaders = []string{"X-Claude-Code-Session-Id", "Session-Id"}

var showHeaders = []string{"User-Agent", "Upgrade", "Content-Encoding", "Openai-Beta", "Anthropic-Version"}

func (e *exchange) String() string {
	s := fmt.Sprintf("%s %s -> %d", e.method, e.uri, e.status)
	if e.err != "" {
		s += " (" + e.err + ")"
	}
	if e.left {
		s += " (the agent left before the answer's end)"
	}
	return s
}

// recorder is the reverse proxy between the agents and the gateway.
type recorder struct {
	url string
	mu  sync.Mutex
	run string
	ex  []*exchange
}

type exchangeKey struct{}

func startRecorder(t *testing.T, target string) *recorder {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{}
	proxy := &httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(u) },
		FlushInterval: -1,
		ModifyResponse: func(resp *http.Response) error {
			if e, ok := resp.Request.Context().Value(exchangeKey{}).(*exchange); ok {
				r.mu.Lock()
				e.status, e.requestID = resp.StatusCode, resp.Header.Get("X-Tollgate-Request-Id")
				e.answer, e.tap = resp, tapAnswer(resp)
				r.mu.Unlock()
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, req *http.Request, err error) {
			if e, ok := req.Context().Value(exchangeKey{}).(*exchange); ok {
				r.mu.Lock()
				if e.status == 0 {
					e.status = http.StatusBadGateway
				}
				e.err = err.Error()
				r.mu.Unlock()
			}
			w.WriteHeader(http.StatusBadGateway)
		},
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		start := time.Now()
		e := &exchange{method: req.Method, uri: req.URL.RequestURI(), upgrade: req.Header.Get("Upgrade") != ""}
		for name := range req.Header {
			e.headers = append(e.headers, name)
		}
		slices.Sort(e.headers)
		for _, name := range showHeaders {
			if v := req.Header.Get(name); v != "" {
				e.shown = append(e.shown, name+"="+v)
			}
		}
		for _, name := range sessionHeaders {
			if v := req.Header.Get(name); v != "" && e.session == "" {
				e.session = v
			}
		}
		r.mu.Lock()
		e.run = r.run
		r.ex = append(r.ex, e)
		r.mu.Unlock()
		// The proxy panics with http.ErrAbortHandler when the agent leaves
		// before the end of a body it was sent (Codex does, once it has
		// read response.completed): the exchange is over all the same.
		defer func() {
			v := recover()
			r.mu.Lock()
			if e.tap != nil {
				body, err := e.tap.bytes()
				if err == nil {
					e.seen, err = usageOf(e.answer, body)
				}
				if err != nil {
					e.seenErr = err.Error()
				}
			}
			e.done, e.took = true, time.Since(start)
			if v == http.ErrAbortHandler {
				e.left = true
			}
			r.mu.Unlock()
			if v != nil {
				panic(v)
			}
		}()
		proxy.ServeHTTP(w, req.WithContext(context.WithValue(req.Context(), exchangeKey{}, e)))
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	r.url = "http://" + ln.Addr().String()
	return r
}

// begin attributes the requests that follow to run.
func (r *recorder) begin(run string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.run = run
}

// of returns copies of run's exchanges.
func (r *recorder) of(run string) []exchange {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []exchange
	for _, e := range r.ex {
		if e.run == run {
			out = append(out, *e)
		}
	}
	return out
}

// busy says whether a request of run is still open.
func (r *recorder) busy(run string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.ex {
		if e.run == run && !e.done {
			return true
		}
	}
	return false
}

// settle waits, at most 5 s, until run has no request open and the access
// log has had no new line for 300 ms: the lines of an exchange the agent
// left are written once the gateway has noticed. It says what was still
// going on when it stopped waiting, or "".
func (s *stack) settle(run string) string {
	deadline := time.Now().Add(5 * time.Second)
	n, quietSince := s.log.len(), time.Now()
	for time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		if m := s.log.len(); m != n {
			n, quietSince = m, time.Now()
			continue
		}
		if !s.rec.busy(run) && time.Since(quietSince) >= 300*time.Millisecond {
			return ""
		}
	}
	var open []string
	for _, e := range s.rec.of(run) {
		if !e.done {
			open = append(open, e.String())
		}
	}
	return fmt.Sprintf("still open after 5 s: %v; last access-log line %v ago", open, time.Since(quietSince).Round(time.Millisecond))
}

var socketSeries = regexp.MustCompile(`(?m)^tollgate_websocket_connections_total\{[^}]*result="([a-z_]+)"[^}]*\} (\S+)$`)

// sockets returns tollgate_websocket_connections_total by result.
func (s *stack) sockets() (map[string]float64, error) {
	resp, err := http.Get(s.gateway + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, m := range socketSeries.FindAllSubmatch(body, -1) {
		v, err := strconv.ParseFloat(string(m[2]), 64)
		if err != nil {
			return nil, err
		}
		out[string(m[1])] += v
	}
	return out, nil
}

// opsLines returns the gateway's operational log lines at level WARN or
// ERROR.
func (s *stack) opsLines() []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(s.stderr.Bytes()))
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, `"level":"WARN"`) || strings.Contains(line, `"level":"ERROR"`) {
			out = append(out, line)
		}
	}
	return out
}
