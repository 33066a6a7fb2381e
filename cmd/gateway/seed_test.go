package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/proxy"
	"github.com/tollgate-llm/tollgate/ratelimit"
	"github.com/tollgate-llm/tollgate/spend"
)

// TestRateSeederChargesBilledRequests: the journal's billed requests of a
// key with an rpm and a team with a tpm are charged at their admission
// instants, in that order whatever the journal's, and nothing else is.
func TestRateSeederChargesBilledRequests(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	cfg := config.DemoConfig("http://127.0.0.1:1")
	cfg.Teams = []config.Team{{Name: "red", Limits: config.Limits{TPM: p64(6000)}}, {Name: "blue"}}
	cfg.Keys = []config.Key{
		{Name: "a", SHA256: hashKey(testKeyA), Team: "red", Limits: config.Limits{RPM: p64(6)}},
		{Name: "b", SHA256: hashKey(testKeyB), Team: "blue", Limits: config.Limits{TokensPerDay: p64(10)}},
	}
	r := newRateSeeder(&cfg)
	entry := func(key, team string, ago time.Duration, tokens int64) spend.Entry {
		return spend.Entry{Admitted: now.Add(-ago), Key: spend.Key{KeyID: key, Team: team},
			Totals: spend.Totals{Requests: 1, Input: tokens / 2, Output: tokens - tokens/2}}
	}
	// Billed out of admission order: the 40 s old stream last.
	for _, e := range []spend.Entry{
		entry("a", "red", 20*time.Second, 1000), entry("a", "red", 5*time.Second, 1000),
		entry("b", "blue", time.Second, 5000), entry("x", "none", time.Second, 5000),
		entry("a", "red", 40*time.Second, 3000),
	} {
		r.add(e)
	}
	if len(r.entries) != 3 {
		t.Fatalf("kept %d entries, want the 3 of key a (and team red)", len(r.entries))
	}
	l := ratelimit.NewLocal(ratelimit.LocalOptions{Now: func() time.Time { return now }})
	defer l.Close()
	r.seed(l)
	sts, err := l.Peek(context.Background(), []ratelimit.Subject{
		{Scope: ratelimit.ScopeKey, ID: "a", Limits: ratelimit.Limits{RPM: 6}},
		{Scope: ratelimit.ScopeTeam, ID: "red", Limits: ratelimit.Limits{TPM: 6000}},
		{Scope: ratelimit.ScopeKey, ID: "b", Limits: ratelimit.Limits{RPM: 6}},
	})
	if err != nil {
		t.Fatal(err)
	}
	// In admission order: rpm 6 (10 s a request) gives TATs -30 s, -10 s,
	// +5 s: 5 left. tpm 6000 (10 ms a token): 3000 tokens at -40 s end at
	// -10 s, 1000 at -20 s at 0 s, 1000 at -5 s at +10 s: 5000 left. In
	// billing order the buckets would hold 4 and 2500; key b, without a
	// rate limit, is not charged.
	for i, want := range []int64{5, 5000, 6} {
		if sts[i].Remaining != want {
			t.Errorf("%s %s: %+v, want remaining %d", sts[i].ID, sts[i].Kind, sts[i], want)
		}
	}
	if len(r.entries) != 0 {
		t.Error("seed kept the entries")
	}
}

// TestKillNineLosesNothing runs the real binary without Redis, a key "a"
// with an rpm and a team "blue" (key "b") with a tokens_per_day, under
// load, and SIGKILLs it five times at random moments, restarting it on the
// same state file each time. What the gateway billed is what its access
// log says it billed (the line is written after the bill, so a logged
// request was billed before the kill), and the ledger at the end must hold
// each of those, and nothing but whole requests that were open at a kill:
// no billed request lost, none counted twice. The budget is never spent
// past its limit, and the answers the clients got add up to no more than
// the budget plus what was open at the kills; the rpm bucket admits no
// more over the whole run than its burst once plus its refill, plus what
// was open at the kills (admitted, never billed, so forgotten).
func TestKillNineLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	if now := time.Now().UTC(); now.Add(2*time.Minute).Day() != now.Day() {
		t.Skip("the budget is per UTC day, and midnight is less than two minutes away")
	}
	const (
		kills   = 5
		rpm     = 300
		workers = 3
		maxReqs = 20000 // over the whole run, all workers
	)
	rng := killMoments(t)

	bin := buildGateway(t)
	// Streams (key b) take 100 ms, so that kills cut some; key a's
	// answers come at once (X-Mock-ITL-Ms), so that it meets its rpm.
	up := httptest.NewServer(mockllm.New(mockllm.Options{OutputTokens: 1000, ITL: time.Millisecond, RequireKey: upKey}))
	defer up.Close()
	// Every request of a kind has the same usage, which is also what it
	// reserves (see reserved): the ledger's totals are whole requests.
	uA, uB := reserved(messagesBody(0, false)), reserved(messagesBody(0, true))
	budget := 100 * uB
	dir := t.TempDir()
	addr := freeAddr(t)
	cfg := killConfig(addr, up.URL, fmt.Sprintf(`[spend]
state_file = %q
flush_interval_seconds = 1

[ownership]
state_file = %q
`, filepath.Join(dir, "spend.json"), filepath.Join(dir, "owners.jsonl")),
		fmt.Sprintf("tokens_per_day = %d\n", budget), fmt.Sprintf("rpm = %d\n", rpm))
	kr := newKillRun(t, bin, cfg, dir, addr)
	lk := newKillLoad(addr, maxReqs)
	kr.start()
	lk.run(testKeyA, "a", false, workers)
	lk.run(testKeyB, "b", true, workers)
	kr.killAndRestart(rng, kills, 300*time.Millisecond, 1500*time.Millisecond)
	// The last run serves load too, until both limits have refused some
	// (bounded: a slow machine may take longer to spend them).
	for i := 0; i < 300 && (i < 15 || lk.stats["a"].limited.Load() == 0 || lk.stats["b"].limited.Load() == 0); i++ {
		time.Sleep(100 * time.Millisecond)
	}
	lk.stop()
	kr.stopLast()
	// A new gateway on the same files answers `gateway spend` from what it
	// restored: the state file the last one wrote and the journal.
	kr.start()
	ledger, _ := spendViaCLI(t, bin, addr, kr.env)
	logged := kr.billed()

	span := lk.last().Sub(lk.first())
	for _, key := range []string{"a", "b"} {
		u := map[string]int64{"a": uA, "b": uB}[key]
		st := lk.stats[key]
		got := ledger[key]
		open := checkBilled(t, key, u, st, logged, got, 0)
		switch key {
		case "a":
			allowed := rpm + rpm*span.Nanoseconds()/int64(time.Minute) + 1
			t.Logf("key a: %d answered over %v; rpm %d allows %d, plus %d open at the kills",
				len(st.answered), span.Round(time.Millisecond), rpm, allowed, open)
			if st.limited.Load() == 0 {
				t.Error("key a was never refused: the load did not reach its rpm")
			}
			if n := int64(len(st.answered)); n > allowed+open {
				t.Errorf("key a: %d answered, more than the bucket allows over the run (%d) plus the requests open at the kills (%d): a restart refilled it",
					n, allowed, open)
			}
		case "b":
			if spent := got.Input + got.Output; spent > budget {
				t.Errorf("team blue spent %d tokens, past its tokens_per_day of %d", spent, budget)
			}
			if st.limited.Load() == 0 {
				t.Error("key b was never refused: the load did not spend the budget")
			}
			if n := int64(len(st.answered)); n*u > budget+open*u {
				t.Errorf("team blue: %d answers of %d tokens, more than its budget of %d plus the %d requests open at the kills: a restart granted budget again",
					n, u, budget, open)
			}
		}
	}
}

// killMoments returns the random source of a kill test's moments, its
// seed logged to replay a failure.
func killMoments(t *testing.T) *rand.Rand {
	seed := time.Now().UnixNano()
	t.Logf("kill moments: math/rand seed %d", seed)
	return rand.New(rand.NewPCG(uint64(seed), 0))
}

// killConfig is the kill tests' config: a gateway on addr in mode keys,
// with keys a (team red) and b (team blue) through the mock upstream at
// upURL; storage holds the tables that say where it keeps its state, and
// blue and keyA extra lines for team blue and key a (their limits).
func killConfig(addr, upURL, storage, blue, keyA string) string {
	return fmt.Sprintf(`[server]
listen = %q
drain_timeout_seconds = 10

[auth]
mode = "keys"

[admin]
token_env = "ADMIN_TOKEN"

%s
[[upstreams]]
name = "mock"
base_url = %q
api_key_env = "UP_KEY"

[[models]]
pattern = "claude-*"
input_usd_per_mtok = 3
output_usd_per_mtok = 15

[[teams]]
name = "red"

[[teams]]
name = "blue"
%s
[[keys]]
name = "a"
sha256 = %q
team = "red"
%s
[[keys]]
name = "b"
sha256 = %q
team = "blue"
`, addr, storage, upURL, blue, hashKey(testKeyA), keyA, hashKey(testKeyB))
}

// killRun is a gateway restarted, after each kill, on the same config and
// files; every process is killed at the end of the test.
type killRun struct {
	t                       *testing.T
	bin, cfgPath, dir, addr string
	env                     []string
	procs                   []*gatewayProc
}

// newKillRun writes cfg to dir/gateway.toml for gateways of bin at addr.
func newKillRun(t *testing.T, bin, cfg, dir, addr string) *killRun {
	t.Helper()
	kr := &killRun{t: t, bin: bin, cfgPath: filepath.Join(dir, "gateway.toml"), dir: dir, addr: addr,
		env: append(os.Environ(), "UP_KEY="+upKey, "ADMIN_TOKEN="+testAdmin)}
	if err := os.WriteFile(kr.cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, p := range kr.procs {
			p.kill()
		}
	})
	return kr
}

// start starts the next gateway and waits for it to serve.
func (kr *killRun) start() *gatewayProc {
	kr.t.Helper()
	p := startGatewayProc(kr.t, kr.bin, kr.cfgPath, kr.dir, kr.addr, kr.env, len(kr.procs))
	kr.procs = append(kr.procs, p)
	return p
}

// killAndRestart SIGKILLs the running gateway kills times, each at a
// random moment from min to min+span after its start (not a wait for
// anything), starting the next one at once.
func (kr *killRun) killAndRestart(rng *rand.Rand, kills int, min, span time.Duration) {
	kr.t.Helper()
	for i := range kills {
		time.Sleep(min + time.Duration(rng.Int64N(int64(span))))
		p := kr.procs[len(kr.procs)-1]
		p.kill()
		kr.t.Logf("kill %d after %v", i+1, time.Since(p.started).Round(time.Millisecond))
		kr.start()
	}
}

// stopLast stops the running gateway with SIGTERM; it must exit cleanly.
func (kr *killRun) stopLast() {
	kr.t.Helper()
	last := kr.procs[len(kr.procs)-1]
	if err := last.terminate(); err != nil {
		kr.t.Fatalf("the last gateway did not stop cleanly: %v\n%s", err, last.stderr())
	}
}

// billed reads the access logs of every gateway but the running one.
func (kr *killRun) billed() map[string]loggedBill {
	logged := map[string]loggedBill{}
	for _, p := range kr.procs[:len(kr.procs)-1] {
		p.readAccessLog(kr.t, logged)
	}
	return logged
}

// buildGateway builds the gateway binary into a temporary directory.
func buildGateway(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "gateway")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// spendViaCLI asks the gateway at addr for its ledger with `gateway spend
// -json` and sums its rows per key.
func spendViaCLI(t *testing.T, bin, addr string, env []string) (map[string]spend.Totals, proxy.SpendReport) {
	t.Helper()
	var out, errb bytes.Buffer
	spendCmd := exec.Command(bin, "spend", "-json", "-url", "http://"+addr, "-token-env", "ADMIN_TOKEN")
	spendCmd.Env, spendCmd.Stdout, spendCmd.Stderr = env, &out, &errb
	if err := spendCmd.Run(); err != nil {
		t.Fatalf("gateway spend: %v\n%s", err, errb.String())
	}
	var rep proxy.SpendReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("gateway spend -json: %v\n%s", err, out.String())
	}
	ledger := map[string]spend.Totals{}
	for _, row := range rep.Rows {
		s := ledger[row.KeyID]
		s.Add(spend.Totals{Requests: row.Requests, Input: row.InputTokens, Output: row.OutputTokens})
		ledger[row.KeyID] = s
	}
	return ledger, rep
}

// checkBilled compares key's ledger totals got with what its clients read
// (st) and what the killed gateways logged as billed: every billed request
// is in the ledger, with the tokens its client read, and the ledger holds
// beyond them only whole requests (of u tokens) that were open at a kill,
// whose number it returns. A request billed whose client got no whole
// answer is an error, but for cutByKill of them: a kill after the access
// log line and before the answer left the process.
func checkBilled(t *testing.T, key string, u int64, st *keyLoad, logged map[string]loggedBill, got spend.Totals, cutByKill int64) (open int64) {
	t.Helper()
	var loggedN, loggedIn, loggedOut, unlogged, unanswered int64
	for id, a := range st.answered {
		b, ok := logged[id]
		if !ok {
			unlogged++ // answered, but the gateway was killed before it billed (or logged) it
			continue
		}
		if b.in != a.in || b.out != a.out {
			t.Errorf("key %s, request %s: the client read %d/%d tokens, the gateway billed %d/%d", key, id, a.in, a.out, b.in, b.out)
		}
		loggedN, loggedIn, loggedOut = loggedN+1, loggedIn+b.in, loggedOut+b.out
	}
	for id, b := range logged {
		if b.key == key {
			if _, ok := st.answered[id]; !ok {
				unanswered++
				loggedN, loggedIn, loggedOut = loggedN+1, loggedIn+b.in, loggedOut+b.out
				if unanswered > cutByKill {
					t.Errorf("key %s: request %s was billed but its client got no whole answer", key, id)
				}
			}
		}
	}
	open = unlogged + st.broken.Load() // admitted, maybe, and not known to be billed at a kill
	t.Logf("key %s: %d answered (%d logged as billed, %d not: open at a kill), %d cut by a kill (%d of them logged as billed), "+
		"%d refused (429); ledger %d requests, %d in / %d out", key, len(st.answered), loggedN-unanswered, unlogged,
		st.broken.Load(), unanswered, st.limited.Load(), got.Requests, got.Input, got.Output)
	// No billed request lost...
	if got.Requests < loggedN || got.Input < loggedIn || got.Output < loggedOut {
		t.Errorf("key %s: ledger %+v holds less than the %d requests (%d in / %d out) the gateway billed: billing lost across kills",
			key, got, loggedN, loggedIn, loggedOut)
	}
	// ...and nothing but whole requests that were open at a kill.
	if extra := got.Requests - loggedN; extra > open || got.Input+got.Output != got.Requests*u {
		t.Errorf("key %s: ledger %+v: %d requests beyond those logged (at most %d were open at the kills), or not whole requests of %d tokens",
			key, got, extra, open, u)
	}
	return open
}

// freeAddr returns a loopback address nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// gatewayProc is one `gateway serve` process, its access log in a file.
type gatewayProc struct {
	cmd     *exec.Cmd
	log     string
	errb    *syncBuffer
	started time.Time
	done    chan struct{}
	waitErr error
}

// startGatewayProc starts bin and waits, bounded, until it answers on addr.
func startGatewayProc(t *testing.T, bin, cfgPath, dir, addr string, env []string, n int) *gatewayProc {
	t.Helper()
	p := &gatewayProc{log: filepath.Join(dir, fmt.Sprintf("access-%d.log", n)), errb: &syncBuffer{}, done: make(chan struct{})}
	out, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	p.cmd = exec.Command(bin, "serve", "-config", cfgPath)
	p.cmd.Env, p.cmd.Dir, p.cmd.Stdout, p.cmd.Stderr = env, dir, out, p.errb
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.started = time.Now()
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.done)
	}()
	url := "http://" + addr + "/healthz"
	for i := 0; ; i++ {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		select {
		case <-p.done:
			t.Fatalf("gateway %d exited: %v\n%s", n, p.waitErr, p.errb.String())
		default:
		}
		if i == 1000 {
			t.Fatalf("gateway %d never answered: %v\n%s", n, err, p.errb.String())
		}
		time.Sleep(10 * time.Millisecond) // waiting for the process to listen
	}
}

func (p *gatewayProc) stderr() string { return p.errb.String() }

// kill SIGKILLs the process and waits for it.
func (p *gatewayProc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// terminate stops the process with SIGTERM, bounded, and returns its exit.
func (p *gatewayProc) terminate() error {
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-p.done:
		return p.waitErr
	case <-time.After(30 * time.Second):
		p.kill()
		return errors.New("still running 30 s after SIGTERM")
	}
}

// loggedBill is what one access-log line says a request was billed.
type loggedBill struct {
	key     string
	in, out int64
}

// readAccessLog adds the process's access-log lines of billed requests
// (status 200, outcome ok) to into, by request id.
func (p *gatewayProc) readAccessLog(t *testing.T, into map[string]loggedBill) {
	t.Helper()
	b, err := os.ReadFile(p.log)
	if err != nil {
		t.Fatal(err)
	}
	for line := range bytes.Lines(b) {
		var l struct {
			RequestID string `json:"request_id"`
			KeyID     string `json:"key_id"`
			Status    int    `json:"status"`
			Outcome   string `json:"outcome"`
			Input     int64  `json:"input_tokens"`
			Output    int64  `json:"output_tokens"`
		}
		if err := json.Unmarshal(line, &l); err != nil {
			if !bytes.HasSuffix(line, []byte("\n")) {
				continue // a line the kill cut: the request it was about is not known to be billed
			}
			t.Fatalf("%s: %v: %s", p.log, err, line)
		}
		if l.Status == http.StatusOK && l.Outcome == "ok" && strings.HasPrefix(l.RequestID, "kill-") {
			if _, dup := into[l.RequestID]; dup {
				t.Fatalf("request %s logged twice", l.RequestID)
			}
			into[l.RequestID] = loggedBill{key: l.KeyID, in: l.Input, out: l.Output}
		}
	}
}

// killLoad drives requests at a gateway that comes and goes.
type killLoad struct {
	addr   string
	max    int64
	seq    atomic.Int64
	done   chan struct{}
	wg     sync.WaitGroup
	client *http.Client
	stats  map[string]*keyLoad
	mu     sync.Mutex
	t0, t1 time.Time // the first send, the last answer
}

// keyLoad counts one key's answers.
type keyLoad struct {
	mu              sync.Mutex
	answered        map[string]usageRead // whole 200 answers, by request id
	broken, limited atomic.Int64         // cut by a kill after sending; 429
}

type usageRead struct{ in, out int64 }

func newKillLoad(addr string, max int64) *killLoad {
	// A connection per request: a refused dial then always means the
	// request was never sent, and a broken one that it was.
	return &killLoad{addr: addr, max: max, done: make(chan struct{}), stats: map[string]*keyLoad{},
		client: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}}
}

func (lk *killLoad) first() time.Time { lk.mu.Lock(); defer lk.mu.Unlock(); return lk.t0 }
func (lk *killLoad) last() time.Time  { lk.mu.Lock(); defer lk.mu.Unlock(); return lk.t1 }

func (lk *killLoad) stop() {
	close(lk.done)
	lk.wg.Wait()
}

// run starts workers sending with key (named name) until stop, or until
// the run has sent max requests.
func (lk *killLoad) run(key, name string, stream bool, workers int) {
	st := &keyLoad{answered: map[string]usageRead{}}
	lk.stats[name] = st
	for range workers {
		lk.wg.Go(func() {
			for {
				select {
				case <-lk.done:
					return
				default:
				}
				n := lk.seq.Add(1)
				if n > lk.max {
					return
				}
				lk.once(key, stream, n, st)
			}
		})
	}
}

// once sends request n and counts its answer.
func (lk *killLoad) once(key string, stream bool, n int64, st *keyLoad) {
	id := fmt.Sprintf("kill-%d", n)
	req, _ := http.NewRequest(http.MethodPost, "http://"+lk.addr+"/v1/messages", strings.NewReader(messagesBody(int(n), stream)))
	req.Header.Set("X-Api-Key", key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Tollgate-Request-Id", id)
	if !stream {
		req.Header.Set("X-Mock-ITL-Ms", "0")
	}
	sent := time.Now()
	resp, err := lk.client.Do(req)
	if errors.Is(err, syscall.ECONNREFUSED) {
		time.Sleep(5 * time.Millisecond) // the gateway is restarting
		return
	}
	lk.mu.Lock()
	if lk.t0.IsZero() {
		lk.t0 = sent
	}
	lk.mu.Unlock()
	if err != nil {
		st.broken.Add(1)
		return
	}
	defer resp.Body.Close()
	var u usageRead
	var whole bool
	switch {
	case resp.StatusCode == http.StatusTooManyRequests:
		_, _ = io.Copy(io.Discard, resp.Body)
		st.limited.Add(1)
		time.Sleep(10 * time.Millisecond) // not a tight loop of refusals
		return
	case resp.StatusCode != http.StatusOK:
		_, _ = io.Copy(io.Discard, resp.Body)
		st.broken.Add(1)
		return
	case stream:
		u, whole = readStreamUsage(resp.Body)
	default:
		var m struct {
			Usage struct {
				InputTokens  int64 `json:"input_tokens"`
				OutputTokens int64 `json:"output_tokens"`
			} `json:"usage"`
		}
		b, err := io.ReadAll(resp.Body)
		whole = err == nil && json.Unmarshal(b, &m) == nil
		u = usageRead{m.Usage.InputTokens, m.Usage.OutputTokens}
	}
	if !whole {
		st.broken.Add(1)
		return
	}
	lk.mu.Lock()
	lk.t1 = time.Now()
	lk.mu.Unlock()
	st.mu.Lock()
	st.answered[id] = u
	st.mu.Unlock()
}

// readStreamUsage reads an Anthropic stream: its usage, and whether it
// ended with message_stop.
func readStreamUsage(r io.Reader) (usageRead, bool) {
	var u usageRead
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type    string `json:"type"`
			Message struct {
				Usage struct {
					InputTokens int64 `json:"input_tokens"`
				} `json:"usage"`
			} `json:"message"`
			Usage struct {
				OutputTokens int64 `json:"output_tokens"`
			} `json:"usage"`
		}
		if json.Unmarshal([]byte(data), &ev) != nil {
			continue
		}
		switch ev.Type {
		case "message_start":
			u.in = ev.Message.Usage.InputTokens
		case "message_delta":
			u.out = ev.Usage.OutputTokens
		case "message_stop":
			return u, true
		}
	}
	return u, false
}
