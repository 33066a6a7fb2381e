package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/internal/redistest"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/proxy"
	"github.com/tollgate-llm/tollgate/ratelimit"
)

const (
	testKeyA   = "tg-replica-test-key-a-000"
	testKeyB   = "tg-replica-test-key-b-000"
	testAdmin  = "admin-token-replica-tests"
	upKey      = "sk-upstream-replica-tests"
	testMaxTok = 100
)

func hashKey(k string) string {
	s := sha256.Sum256([]byte(k))
	return hex.EncodeToString(s[:])
}

func p64(v int64) *int64 { return &v }

// govConfig is a config in mode "keys" with keys a (team "red") and b (team
// "blue") in front of upstreamURL, priced, with the admin API on.
func govConfig(upstreamURL string) config.Config {
	cfg := config.DemoConfig(upstreamURL)
	cfg.Auth.Mode = "keys"
	cfg.Upstreams[0].APIKeyEnv, cfg.Upstreams[0].APIKey = "UP_KEY", upKey
	cfg.Admin.TokenEnv, cfg.Admin.Token = "ADMIN_TOKEN", testAdmin
	cfg.Models = []config.Model{{Pattern: "claude-*", InputUSDPerMTok: 3, OutputUSDPerMTok: 15}}
	cfg.Teams = []config.Team{{Name: "red"}, {Name: "blue"}}
	cfg.Keys = []config.Key{
		{Name: "a", SHA256: hashKey(testKeyA), Team: "red"},
		{Name: "b", SHA256: hashKey(testKeyB), Team: "blue"},
	}
	cfg.Spend.FlushIntervalSeconds = 0.05
	cfg.RateLimit.RedisRetrySeconds = 0.1
	// A loaded CI machine (race detector, other packages' tests) can stall
	// a loopback Redis past the 250 ms default; a replica would then fall
	// back to its own limiter and the shared-limit tests would measure
	// that instead. Outage tests kill Redis, which fails at once anyway.
	cfg.Redis.TimeoutMs = 3000
	return cfg
}

// replica is one running gateway and the records it finished.
type replica struct {
	rg      *runningGateway
	url     string
	mu      sync.Mutex
	recs    []llm.Record
	once    sync.Once
	stopErr error
}

func (r *replica) records() []llm.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]llm.Record(nil), r.recs...)
}

// startReplica starts a gateway for cfg on a loopback port. It is shut down
// in t.Cleanup unless the test stops it first.
func startReplica(t *testing.T, cfg config.Config) *replica {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{}
	rg, err := startGateway(&cfg, ln, slog.New(slog.DiscardHandler), nil, func(rec *llm.Record) {
		r.mu.Lock()
		r.recs = append(r.recs, *rec)
		r.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	r.rg, r.url = rg, "http://"+rg.addr
	t.Cleanup(func() { _ = r.stop() })
	return r
}

// stop shuts the gateway down (once): it drains, then flushes its spend.
func (r *replica) stop() error {
	r.once.Do(func() { r.stopErr = r.rg.shutdown(0, 5*time.Second) })
	return r.stopErr
}

// messagesBody is an Anthropic Messages request; n makes bodies differ.
func messagesBody(n int, stream bool) string {
	return fmt.Sprintf(`{"model":"claude-test","max_tokens":%d,"stream":%t,"messages":[{"role":"user","content":"request %06d"}]}`,
		testMaxTok, stream, n)
}

// reserved is what the gateway reserves for a body: ceil(len/4) prompt
// tokens plus max_tokens. mockllm counts input the same way and stops at
// max_tokens, so a request's real usage equals its reservation.
func reserved(body string) int64 { return int64(len(body)+3)/4 + testMaxTok }

// loadResult counts a load run's answers.
type loadResult struct {
	ok, limited, other atomic.Int64
	tokens             atomic.Int64 // reservation of the admitted requests
	input, output      atomic.Int64 // usage the upstream reported in the 200 bodies
	firstSend          time.Time
	lastSend           atomic.Int64 // unix nanos of the last request sent
	// firstLimited is when the first 429 arrived (unix nanos): the bucket
	// was empty then.
	firstLimited atomic.Int64
	// firstOK is when the first 200 arrived, lastLimitedSend when the last
	// request that got a 429 was sent, and lastAnswer when the last answer
	// arrived (unix nanos): the instants that bracket the limiter's
	// decisions (see withinBucket).
	firstOK, lastLimitedSend, lastAnswer atomic.Int64
	// maxLatency is the longest time from a send to its answer (nanos)
	// among the answers that came after the first 429: how long after its
	// send stamp a request at the steady window's edges may have met the
	// bucket.
	maxLatency atomic.Int64
}

// storeMax raises v to x.
func storeMax(v *atomic.Int64, x int64) {
	for {
		cur := v.Load()
		if x <= cur || v.CompareAndSwap(cur, x) {
			return
		}
	}
}

// noteLatency records the time from sent (unix nanos) to now.
func (r *loadResult) noteLatency(sent int64) { storeMax(&r.maxLatency, time.Now().UnixNano()-sent) }

// load sends non-streamed requests with key from workers goroutines,
// round-robin over the replicas, for d (and at most max requests), or, when
// steady > 0, until steady after the first 429.
func load(t *testing.T, reps []*replica, key string, workers int, d, steady time.Duration, max int64) *loadResult {
	t.Helper()
	res := &loadResult{firstSend: time.Now()}
	deadline := res.firstSend.Add(d)
	res.run(reps, key, workers, max, func() bool {
		now := time.Now()
		if fl := res.firstLimited.Load(); steady > 0 && fl != 0 && now.Sub(time.Unix(0, fl)) > steady {
			return true
		}
		return !now.Before(deadline)
	})
	return res
}

// run sends non-streamed requests with key from workers goroutines,
// round-robin over the replicas, until stop says so or max requests were
// sent, and counts their answers in res.
func (res *loadResult) run(reps []*replica, key string, workers int, max int64, stop func() bool) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers}, Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	var seq atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; !stop(); i += workers {
				n := seq.Add(1)
				if n > max {
					return
				}
				body := messagesBody(int(n), false)
				req, _ := http.NewRequest(http.MethodPost, reps[int(n)%len(reps)].url+"/v1/messages", strings.NewReader(body))
				req.Header.Set("X-Api-Key", key)
				req.Header.Set("Content-Type", "application/json")
				sent := time.Now().UnixNano()
				res.lastSend.Store(sent)
				resp, err := client.Do(req)
				if err != nil {
					res.other.Add(1)
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if res.firstLimited.Load() != 0 {
					// Only answers that came after the bucket emptied
					// (those in flight at its start edge included) bear
					// on the steady window; a warm-up answer's latency
					// would loosen the bound.
					res.noteLatency(sent)
				}
				answered := time.Now().UnixNano()
				storeMax(&res.lastAnswer, answered)
				switch resp.StatusCode {
				case http.StatusOK:
					res.ok.Add(1)
					res.tokens.Add(reserved(body))
					res.firstOK.CompareAndSwap(0, answered)
					var m struct {
						Usage struct {
							InputTokens  int64 `json:"input_tokens"`
							OutputTokens int64 `json:"output_tokens"`
						} `json:"usage"`
					}
					if json.Unmarshal(b, &m) != nil {
						res.other.Add(1)
					}
					res.input.Add(m.Usage.InputTokens)
					res.output.Add(m.Usage.OutputTokens)
				case http.StatusTooManyRequests:
					res.limited.Add(1)
					res.firstLimited.CompareAndSwap(0, answered)
					storeMax(&res.lastLimitedSend, sent)
				default:
					res.other.Add(1)
				}
			}
		}()
	}
	wg.Wait()
}

// withinBucket checks what a GCRA bucket of burst limit, refilling limit
// per minute, admitted over a load run that emptied it, in units of one
// request's cost (unit). The bucket was full at its first admission t0 and
// never full again, so after n admissions its theoretical arrival time is
// t0 + n·cost. It admits only while that stays within a minute of the
// present, so by the last admission n ≤ limit + refill(last − t0); and it
// refused at t_r only because one more would not fit, so before t_r it had
// admitted at least limit + refill(t_r − t0) − unit. The clients bracket
// those instants without knowing them: t0 is after the first send and
// before the first 200 arrived, the last admission before the last answer,
// the last refusal after its request was sent. Both bounds hold however
// slowly the machine answers; on an idle one they are a few milliseconds
// of refill apart, so the check is as tight as the old 1% window.
func withinBucket(t *testing.T, what string, admitted, limit int64, res *loadResult, unit int64) {
	t.Helper()
	refill := func(from, to int64) float64 { return float64(limit) * time.Duration(to-from).Minutes() }
	hi := float64(limit) + refill(res.firstSend.UnixNano(), res.lastAnswer.Load()) + float64(unit)
	lo := float64(limit) + refill(res.firstOK.Load(), res.lastLimitedSend.Load()) - float64(unit)
	t.Logf("%s: admitted %d; the bucket held at least %.1f and at most %.1f (%.2f%% apart) over %v",
		what, admitted, lo, hi, 100*(hi-lo)/hi, time.Duration(res.lastAnswer.Load()-res.firstSend.UnixNano()).Round(time.Millisecond))
	if res.firstOK.Load() == 0 || res.lastLimitedSend.Load() < res.firstOK.Load() {
		t.Fatalf("%s: no refusal after the first admission: the load never emptied the bucket", what)
	}
	if float64(admitted) > hi {
		t.Errorf("%s: admitted %d, more than the bucket held (%.1f)", what, admitted, hi)
	}
	if float64(admitted) < lo {
		t.Errorf("%s: admitted %d, less than the bucket gave before its last refusal (%.1f)", what, admitted, lo)
	}
}

// TestReplicasShareLimits: three gateways on one real redis-server, under
// concurrent load, admit what one bucket of the key's RPM and the team's
// TPM admits (withinBucket), and never more streams at once than the
// concurrency cap.
func TestReplicasShareLimits(t *testing.T) {
	srv := redistest.Start(t)
	mock := mockllm.New(mockllm.Options{OutputTokens: 1000, RequireKey: upKey})
	up := httptest.NewServer(mock)
	t.Cleanup(up.Close)

	// overLimit runs 12 clients against three replicas sharing srv under
	// prefix until 4 s after the bucket first refused (at most 30 s or 60,000
	// requests), and checks the load went past the limit cleanly. The
	// limits below are small enough that a machine busy with other work
	// (under 50 requests/s) still empties the bucket within the 30 s;
	// withinBucket's bounds do not depend on how fast it answers.
	overLimit := func(t *testing.T, prefix string, limit func(*config.Config)) ([]*replica, *loadResult) {
		t.Helper()
		cfg := govConfig(up.URL)
		cfg.Redis.Addrs = []string{srv.Addr()}
		cfg.Redis.KeyPrefix = prefix
		// A replica that fell back would stay on its fallback until the
		// end, so the check below sees it.
		cfg.RateLimit.RedisRetrySeconds = 60
		limit(&cfg)
		reps := []*replica{startReplica(t, cfg), startReplica(t, cfg), startReplica(t, cfg)}
		res := load(t, reps, testKeyA, 12, 30*time.Second, 4*time.Second, 60000)
		for i, r := range reps {
			// A replica on its fallback limiter would not share the limit:
			// say so rather than report a miscount.
			if f, ok := r.rg.gov.limiter.(*ratelimit.Failover); ok && (f.Degraded() || f.Pending() > 0) {
				t.Errorf("replica %d fell back from Redis during the load (pending %d)", i, f.Pending())
			}
		}
		if res.other.Load() != 0 || res.limited.Load() == 0 || res.firstLimited.Load() == 0 {
			t.Fatalf("ok %d, 429 %d, other %d: the load did not reach the limit cleanly", res.ok.Load(),
				res.limited.Load(), res.other.Load())
		}
		return reps, res
	}

	t.Run("rpm", func(t *testing.T) {
		_, res := overLimit(t, "t-rpm:", func(c *config.Config) { c.Keys[0].RPM = p64(600) })
		withinBucket(t, "RPM 600", res.ok.Load(), 600, res, 1)
	})

	t.Run("tpm", func(t *testing.T) {
		reps, res := overLimit(t, "t-tpm:", func(c *config.Config) { c.Teams[0].TPM = p64(60000) })
		// The premise: every admitted request used exactly what it
		// reserved (the bodies all have one length), so admitted tokens
		// are what the bucket gave out.
		each := reserved(messagesBody(0, false))
		for _, r := range reps {
			for _, rec := range r.records() {
				if rec.Status == http.StatusOK && rec.Usage.Input+rec.Usage.Output != each {
					t.Fatalf("usage %+v, reserved %d: the test's premise does not hold", rec.Usage, each)
				}
			}
		}
		withinBucket(t, "TPM 60000", res.tokens.Load(), 60000, res, each)
	})

	t.Run("concurrency", func(t *testing.T) {
		slow := mockllm.New(mockllm.Options{TTFT: 20 * time.Millisecond, ITL: 2 * time.Millisecond,
			OutputTokens: 1000, RequireKey: upKey})
		sup := httptest.NewServer(slow)
		t.Cleanup(sup.Close)
		cfg := govConfig(sup.URL)
		cfg.Redis.Addrs = []string{srv.Addr()}
		cfg.Redis.KeyPrefix = "t-conc:"
		cfg.Keys[0].Concurrency = p64(4)
		reps := []*replica{startReplica(t, cfg), startReplica(t, cfg), startReplica(t, cfg)}
		res := load(t, reps, testKeyA, 16, 1500*time.Millisecond, 0, 3000)
		peak := slow.Stats().PeakInFlight
		t.Logf("concurrency 4: ok %d, 429 %d, upstream peak in flight %d", res.ok.Load(), res.limited.Load(), peak)
		if res.other.Load() != 0 || res.limited.Load() == 0 || res.ok.Load() == 0 {
			t.Fatalf("ok %d, 429 %d, other %d", res.ok.Load(), res.limited.Load(), res.other.Load())
		}
		if peak > 4 {
			t.Errorf("upstream saw %d requests at once, over the cap of 4", peak)
		}
		if peak < 2 {
			t.Errorf("upstream peak %d: the load never used the cap, the test proves nothing", peak)
		}
		// Every slot is released at the end.
		lim := adminLimits(t, reps[0].url)
		if l := lim.find("key", "a", "concurrency"); l == nil || l.Used != 0 {
			t.Errorf("concurrency after the load: %+v", l)
		}
	})
}

type limitsReport struct{ proxy.LimitsReport }

func (r limitsReport) find(scope, id, limit string) *proxy.LimitState {
	for _, s := range r.Subjects {
		if s.Scope == scope && s.ID == id {
			for i := range s.Limits {
				if s.Limits[i].Limit == limit {
					return &s.Limits[i]
				}
			}
		}
	}
	return nil
}

func adminJSON(t *testing.T, url string, v any) {
	t.Helper()
	body, err := adminGet(url, testAdmin)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatal(err)
	}
}

func adminLimits(t *testing.T, base string) limitsReport {
	var r limitsReport
	adminJSON(t, base+"/admin/limits", &r.LimitsReport)
	return r
}

func adminSpend(t *testing.T, base, query string) proxy.SpendReport {
	var r proxy.SpendReport
	adminJSON(t, base+"/admin/spend?"+query, &r)
	return r
}

// usageSum adds up what a set of records billed, per key.
type usageSum struct{ requests, input, output, cost int64 }

func billed(recs []llm.Record, into map[string]*usageSum) {
	for _, r := range recs {
		if r.Status != http.StatusOK || r.Route == llm.RouteOther {
			continue
		}
		s := into[r.KeyID]
		if s == nil {
			s = &usageSum{}
			into[r.KeyID] = s
		}
		s.requests++
		s.input += r.Usage.Input
		s.output += r.Usage.Output
		s.cost += r.CostMicros
	}
}

// spendByKey reads /admin/spend and sums it per key.
func spendByKey(t *testing.T, base string) map[string]*usageSum {
	out := map[string]*usageSum{}
	for _, row := range adminSpend(t, base, "").Rows {
		s := out[row.KeyID]
		if s == nil {
			s = &usageSum{}
			out[row.KeyID] = s
		}
		s.requests += row.Requests
		s.input += row.InputTokens
		s.output += row.OutputTokens
		s.cost += row.CostMicros
	}
	return out
}

func sameSums(t *testing.T, what string, got, want map[string]*usageSum) {
	t.Helper()
	if len(want) == 0 {
		t.Fatalf("%s: nothing was billed", what)
	}
	for k, w := range want {
		if g := got[k]; g == nil || *g != *w {
			t.Errorf("%s: key %s: ledger %+v, upstream usage %+v", what, k, g, w)
		}
	}
	for k := range got {
		if want[k] == nil {
			t.Errorf("%s: ledger has key %s nobody used", what, k)
		}
	}
}

// cancelledStream sends a streamed request and hangs up after reading a few
// events.
func cancelledStream(t *testing.T, base, key string, n int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/messages",
		strings.NewReader(messagesBody(n, true)))
	req.Header.Set("X-Api-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for range 12 { // message_start, content_block_start, a few deltas
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatalf("stream ended early: %v", err)
		}
	}
}

// TestSpendExactAcrossRedisRestart: three replicas bill to one Redis while
// it is killed and restarted mid-load (limits fall back in-process, spend
// waits in memory); after the load every key's spend equals the usage the
// upstream reported, to the token, including streams clients cancelled.
func TestSpendExactAcrossRedisRestart(t *testing.T) {
	srv, cfg := redisGovConfig(t, mockllm.Options{OutputTokens: 1000, ITL: time.Millisecond}, redistest.Persistent())
	cfg.Keys[0].RPM = p64(1_000_000) // limited, so admission goes through Redis too
	reps := []*replica{startReplica(t, cfg), startReplica(t, cfg), startReplica(t, cfg)}

	done := make(chan *loadResult, 2)
	go func() { done <- load(t, reps, testKeyA, 4, 1500*time.Millisecond, 0, 100000) }()
	go func() { done <- load(t, reps, testKeyB, 2, 1500*time.Millisecond, 0, 100000) }()
	time.Sleep(300 * time.Millisecond)
	srv.Kill()
	for i := range 3 {
		cancelledStream(t, reps[i].url, testKeyA, 900000+i)
	}
	// Bounded wait until some replica has noticed, for limits and spend.
	for _, comp := range []string{"ratelimit", "spend"} {
		seen := false
		for i := 0; i < 200 && !seen; i++ {
			for _, r := range reps {
				if gaugeValue(t, r, "tollgate_degraded", comp) == 1 {
					seen = true
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
		if !seen {
			t.Errorf("no replica reports tollgate_degraded{component=%q} = 1 while Redis is down", comp)
		}
	}
	// A fourth replica serves during the outage and stops before Redis
	// returns: what it billed waits in its state file (the spill), and
	// the same replica started again sends it.
	spill := cfg
	spill.Redis.SpillDir = t.TempDir()
	spillFile := filepath.Join(spill.Redis.SpillDir, "tollgate-spend-spill.json")
	victim := startReplica(t, spill)
	if res := load(t, []*replica{victim}, testKeyB, 1, 200*time.Millisecond, 0, 20); res.ok.Load() == 0 {
		t.Fatal("the fourth replica served nothing during the outage")
	}
	if err := victim.stop(); err == nil {
		t.Error("stopping with Redis down reported no unwritten spend")
	}
	if _, err := os.Stat(spillFile); err != nil {
		t.Fatalf("no spill file after stopping with Redis down: %v", err)
	}
	srv.Start()
	// go-redis fails dials fast for up to 1 s once PoolSize dials failed:
	// wait, bounded, until every replica's client reaches Redis again.
	for _, r := range reps {
		for i := 0; r.rg.gov.redis.Ping(context.Background()).Err() != nil; i++ {
			if i == 100 {
				t.Fatal("a replica's client did not reconnect to the restarted Redis")
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	cancelledStream(t, reps[1].url, testKeyB, 900100)
	again := startReplica(t, spill)
	if err := again.stop(); err != nil {
		t.Fatalf("the restarted replica could not send its spill: %v", err)
	}
	if _, err := os.Stat(spillFile); !os.IsNotExist(err) {
		t.Errorf("spill file still there after it was sent: %v", err)
	}
	r1, r2 := <-done, <-done
	if r1.other.Load()+r2.other.Load() != 0 || r1.limited.Load()+r2.limited.Load() != 0 {
		t.Fatalf("load: other %d, 429 %d: every request should pass while Redis is down (on_redis_error = allow)",
			r1.other.Load()+r2.other.Load(), r1.limited.Load()+r2.limited.Load())
	}

	// Stop the replicas: each flushes what it still holds to Redis.
	want := map[string]*usageSum{}
	for _, r := range reps[1:] {
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
	}
	// The first replica stays up to answer the admin API; flush it directly.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := reps[0].rg.gov.ledger.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for _, r := range append(reps, victim) {
		billed(r.records(), want)
	}
	var cancelled int
	for _, r := range reps {
		for _, rec := range r.records() {
			if rec.Outcome == llm.OutcomeClientCancel {
				cancelled++
				if rec.Usage.Output == 0 || rec.Usage.Output >= testMaxTok {
					t.Errorf("cancelled stream billed %d output tokens", rec.Usage.Output)
				}
			}
		}
	}
	if cancelled != 4 {
		t.Errorf("%d cancelled streams recorded, want 4", cancelled)
	}
	// The records' usage is the upstream's: the completed requests' sum is
	// what the clients read in the response bodies.
	var in, out, cin, cout int64
	for _, r := range reps {
		for _, rec := range r.records() {
			if rec.Status == http.StatusOK && rec.Outcome == llm.OutcomeOK {
				in, out = in+rec.Usage.Input, out+rec.Usage.Output
			}
		}
	}
	for _, res := range []*loadResult{r1, r2} {
		cin, cout = cin+res.input.Load(), cout+res.output.Load()
	}
	if in != cin || out != cout || cin == 0 {
		t.Errorf("records: %d in / %d out; response bodies: %d in / %d out", in, out, cin, cout)
	}
	t.Logf("billed: a %+v, b %+v", *want["a"], *want["b"])
	sameSums(t, "after Redis kill and restart", spendByKey(t, reps[0].url), want)
}

// TestSpendExactAcrossRestart: without Redis, spend lives in the process and
// its state file; a gateway stopped and started again on the same file
// loses nothing.
func TestSpendExactAcrossRestart(t *testing.T) {
	mock := mockllm.New(mockllm.Options{OutputTokens: 1000, ITL: time.Millisecond, RequireKey: upKey})
	up := httptest.NewServer(mock)
	t.Cleanup(up.Close)
	cfg := govConfig(up.URL)
	cfg.Spend.StateFile = filepath.Join(t.TempDir(), "spend.json")
	want := map[string]*usageSum{}
	for run := range 2 {
		r := startReplica(t, cfg)
		res := load(t, []*replica{r}, testKeyA, 3, 300*time.Millisecond, 0, 200)
		load(t, []*replica{r}, testKeyB, 1, 200*time.Millisecond, 0, 50)
		cancelledStream(t, r.url, testKeyA, 800000+run)
		if res.ok.Load() == 0 {
			t.Fatal("no request passed")
		}
		if run == 1 {
			// Read before stopping: the ledger in memory is the file's
			// content plus this run.
			wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := r.rg.gw.Wait(wctx)
			wcancel()
			if err != nil {
				t.Fatal(err)
			}
			if err := r.rg.gov.ledger.Flush(context.Background()); err != nil {
				t.Fatal(err)
			}
			billed(r.records(), want)
			sameSums(t, "after a restart", spendByKey(t, r.url), want)
			break
		}
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
		billed(r.records(), want)
	}
}

// TestRedisDownDeny: with on_redis_error = "deny", requests get 503 in their
// dialect while Redis is down, the degraded gauge says so, and service
// returns with Redis.
func TestRedisDownDeny(t *testing.T) {
	srv, cfg := redisGovConfig(t, mockllm.Options{OutputTokens: 3})
	cfg.RateLimit.OnRedisError = "deny"
	cfg.Keys[0].RPM = p64(100000)
	r := startReplica(t, cfg)
	send := func() (int, string, http.Header) {
		req, _ := http.NewRequest(http.MethodPost, r.url+"/v1/messages", strings.NewReader(messagesBody(1, false)))
		req.Header.Set("X-Api-Key", testKeyA)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}
	if code, body, _ := send(); code != http.StatusOK {
		t.Fatalf("Redis up: %d %s", code, body)
	}
	srv.Kill()
	code, body, h := send()
	if code != http.StatusServiceUnavailable || !strings.Contains(body, `"type":"error"`) || h.Get("Retry-After") == "" {
		t.Errorf("Redis down, deny: %d %s", code, body)
	}
	if g := gaugeValue(t, r, "tollgate_degraded", "ratelimit"); g != 1 {
		t.Errorf("tollgate_degraded{component=ratelimit} = %v while Redis is down", g)
	}
	srv.Start()
	// Bounded wait for the limiter's retry interval (0.1 s) to pass.
	var ok bool
	for range 100 {
		if code, _, _ := send(); code == http.StatusOK {
			ok = true
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !ok {
		t.Fatal("requests still refused after Redis came back")
	}
	if g := gaugeValue(t, r, "tollgate_degraded", "ratelimit"); g != 0 {
		t.Errorf("tollgate_degraded{component=ratelimit} = %v after Redis returned", g)
	}
}

// TestFleetOutageHoldsTheTeamsLimits runs three gateways on one Redis with
// on_redis_error = "allow": team red (1,200 a minute) has emptied its bucket
// and team blue its daily tokens when Redis dies. During the outage the
// fleet admits for red what the rate refills, within 1.2 times (where each
// replica would once have admitted a whole burst more), and nothing for
// blue.
func TestFleetOutageHoldsTheTeamsLimits(t *testing.T) {
	srv, cfg := redisGovConfig(t, mockllm.Options{OutputTokens: 1000})
	cfg.Teams[0].RPM = p64(1200)
	cfg.Teams[1].TokensPerDay = p64(2000)
	reps := []*replica{startReplica(t, cfg), startReplica(t, cfg), startReplica(t, cfg)}
	waitFleet(t, reps)
	red := load(t, reps, testKeyA, 4, 20*time.Second, 50*time.Millisecond, 5000)
	emptied := time.Now()
	blue := load(t, reps, testKeyB, 2, 20*time.Second, 20*time.Millisecond, 500)
	if red.limited.Load() == 0 || blue.limited.Load() == 0 {
		t.Fatalf("the limits never refused: red %d, blue %d 429s", red.limited.Load(), blue.limited.Load())
	}

	srv.Kill()
	done := make(chan *loadResult)
	go func() { done <- load(t, reps, testKeyB, 1, 2*time.Second, 0, 1000) }()
	redOut := load(t, reps, testKeyA, 4, 2*time.Second, 0, 100000)
	blueOut := <-done
	due := 1200 * time.Since(emptied).Seconds() / 60
	t.Logf("outage: red admitted %d where %.0f were due (×%.2f); blue %d of %d", redOut.ok.Load(), due,
		float64(redOut.ok.Load())/due, blueOut.ok.Load(), blueOut.ok.Load()+blueOut.limited.Load())
	for i, r := range reps {
		if gaugeValue(t, r, "tollgate_degraded", "ratelimit") != 1 {
			t.Errorf("replica %d is not degraded during the outage", i)
		}
	}
	if float64(redOut.ok.Load()) > 1.2*due+3 { // one per replica for rounding
		t.Errorf("red: the fleet admitted %d in the outage where %.0f were due", redOut.ok.Load(), due)
	}
	if redOut.ok.Load() == 0 || redOut.other.Load() != 0 {
		t.Errorf("red in the outage: %d admitted, %d other answers", redOut.ok.Load(), redOut.other.Load())
	}
	if blueOut.ok.Load() != 0 || blueOut.limited.Load() == 0 {
		t.Errorf("blue's spent budget in the outage: %d admitted, %d refused", blueOut.ok.Load(), blueOut.limited.Load())
	}
}

// TestEmptyRedisIsRefilled: two gateways bill through a Redis without
// persistence, which restarts empty. Without further traffic, each notices
// and sends back what it billed: /admin/spend equals again what the clients
// read, and team blue's daily budget counts its usage again instead of
// starting from zero. A gateway restarted afterwards from its spill
// directory sends nothing twice.
func TestEmptyRedisIsRefilled(t *testing.T) {
	srv, cfg := redisGovConfig(t, mockllm.Options{OutputTokens: 9})
	cfg.Teams[1].TokensPerDay = p64(1_000_000)
	cfgA, cfgB := cfg, cfg
	cfgA.Redis.SpillDir, cfgB.Redis.SpillDir = t.TempDir(), t.TempDir()
	reps := []*replica{startReplica(t, cfgA), startReplica(t, cfgB)}
	var read [2]*loadResult
	read[0] = load(t, reps, testKeyA, 2, time.Hour, 0, 30)
	read[1] = load(t, reps, testKeyB, 2, time.Hour, 0, 20)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	want := map[string]*usageSum{}
	for _, r := range reps {
		if err := r.rg.gov.ledger.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		billed(r.records(), want)
	}
	for i, k := range []string{"a", "b"} {
		if w := want[k]; w == nil || w.input != read[i].input.Load() || w.output != read[i].output.Load() {
			t.Fatalf("key %s billed %+v; the clients read %d in / %d out", k, w, read[i].input.Load(), read[i].output.Load())
		}
	}
	blueUsed := want["b"].input + want["b"].output
	budget := func() int64 {
		if l := adminLimits(t, reps[0].url).find("team", "blue", "tokens_per_day"); l != nil {
			return l.Used
		}
		return -1
	}
	sameSums(t, "before the restart", spendByKey(t, reps[0].url), want)
	if got := budget(); got != blueUsed {
		t.Fatalf("blue's budget used %d before the restart, want %d", got, blueUsed)
	}

	srv.Restart()
	same := func(got map[string]*usageSum) bool {
		for k, w := range want {
			if g := got[k]; g == nil || *g != *w {
				return false
			}
		}
		return len(got) == len(want)
	}
	// The ledger is whole again once both replicas' parts are back; each
	// replica lowers its redis_data gauge at its next flush after that.
	refilled := func() bool {
		for _, r := range reps {
			if gaugeValue(t, r, "tollgate_degraded", "redis_data") != 0 {
				return false
			}
		}
		return true
	}
	for n := 0; !same(spendByKey(t, reps[0].url)) || budget() != blueUsed || !refilled(); n++ {
		if n == 500 {
			sameSums(t, "after Redis restarted empty", spendByKey(t, reps[0].url), want)
			for i, r := range reps {
				if g := gaugeValue(t, r, "tollgate_degraded", "redis_data"); g != 0 {
					t.Errorf("replica %d: tollgate_degraded{component=redis_data} = %v after the refill", i, g)
				}
			}
			t.Fatalf("blue's budget used %d after the refill, want %d", budget(), blueUsed)
		}
		time.Sleep(20 * time.Millisecond)
	}

	if err := reps[1].stop(); err != nil {
		t.Fatal(err)
	}
	again := startReplica(t, cfgB)
	time.Sleep(time.Duration(3*cfg.Spend.FlushIntervalSeconds*1000) * time.Millisecond) // a few flushes
	if err := again.rg.gov.ledger.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	sameSums(t, "after a gateway restarted", spendByKey(t, reps[0].url), want)
}

// TestWarnsWhenRedisForgetsOnRestart: a Redis without an append-only file
// is warned about at start, one with it is not.
func TestWarnsWhenRedisForgetsOnRestart(t *testing.T) {
	for _, c := range []struct {
		srv  *redistest.Server
		warn bool
	}{{redistest.Start(t), true}, {redistest.Start(t, redistest.Persistent()), false}} {
		var buf strings.Builder
		warnIfRedisForgets(c.srv.Client(t), slog.New(slog.NewTextHandler(&buf, nil)))
		if got := strings.Contains(buf.String(), "appendonly no"); got != c.warn {
			t.Errorf("Redis on %s: warned %v, want %v: %q", c.srv.Addr(), got, c.warn, buf.String())
		}
	}
}

// TestAdminSpendDuringOutageIsThisReplicasOwn: with Redis up, /admin/spend
// is the fleet's spend; with Redis down, it is what the asked replica billed
// itself, 200 and flagged partial with a note saying so, where it used to
// be a 503; `gateway spend` prints the note under its table.
func TestAdminSpendDuringOutageIsThisReplicasOwn(t *testing.T) {
	srv, cfg := redisGovConfig(t, mockllm.Options{OutputTokens: 7})
	reps := []*replica{startReplica(t, cfg), startReplica(t, cfg)}
	for i, r := range reps {
		if res := load(t, []*replica{r}, testKeyA, 2, time.Hour, 0, int64(5+5*i)); res.ok.Load() != int64(5+5*i) {
			t.Fatalf("replica %d: %d of %d requests answered", i, res.ok.Load(), 5+5*i)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	fleetWide, own := map[string]*usageSum{}, map[string]*usageSum{}
	for _, r := range reps {
		if err := r.rg.gov.ledger.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		billed(r.records(), fleetWide)
	}
	billed(reps[0].records(), own)
	if rep := adminSpend(t, reps[0].url, ""); rep.Partial || rep.Note != "" {
		t.Fatalf("Redis up: partial %v, note %q", rep.Partial, rep.Note)
	}
	sameSums(t, "Redis up", spendByKey(t, reps[0].url), fleetWide)

	srv.Kill()
	rep := adminSpend(t, reps[0].url, "")
	if !rep.Partial || !strings.Contains(rep.Note, "only what this replica billed") {
		t.Fatalf("Redis down: partial %v, note %q", rep.Partial, rep.Note)
	}
	sameSums(t, "Redis down", spendByKey(t, reps[0].url), own)

	t.Setenv("TOLLGATE_ADMIN_TOKEN", testAdmin)
	var out, errb strings.Builder
	if code := run([]string{"spend", "-url", reps[0].url}, &out, &errb); code != 0 {
		t.Fatalf("gateway spend: exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "partial: the shared ledger cannot be read") {
		t.Errorf("gateway spend during the outage printed no partial note:\n%s", out.String())
	}
}

// redisGovConfig starts a redis-server and a mockllm (options o, the
// upstream key required) and returns govConfig in front of it on that Redis.
func redisGovConfig(t *testing.T, o mockllm.Options, opts ...redistest.Option) (*redistest.Server, config.Config) {
	t.Helper()
	srv := redistest.Start(t, opts...)
	o.RequireKey = upKey
	up := httptest.NewServer(mockllm.New(o))
	t.Cleanup(up.Close)
	cfg := govConfig(up.URL)
	cfg.Redis.Addrs = []string{srv.Addr()}
	return srv, cfg
}

// waitFleet waits (bounded) until every replica's heartbeat counts them
// all, so that an outage's share is 1/len(reps).
func waitFleet(t *testing.T, reps []*replica) {
	t.Helper()
	for i, r := range reps {
		for n := 0; gaugeValue(t, r, "tollgate_fleet_replicas", "") != float64(len(reps)); n++ {
			if n == 500 {
				t.Fatalf("replica %d counts %v replicas, want %d", i, gaugeValue(t, r, "tollgate_fleet_replicas", ""), len(reps))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// gaugeValue reads a gauge of r's registry: the series of the component, or
// the unlabelled one for component "".
func gaugeValue(t *testing.T, r *replica, name, component string) float64 {
	t.Helper()
	mfs, err := r.rg.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if component == "" && len(m.GetLabel()) == 0 {
				return m.GetGauge().GetValue()
			}
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "component" && lp.GetValue() == component {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return -1
}

// TestHashKey: hash-key prints the SHA-256 of the key on stdin, which a
// [[keys]] table accepts; -generate makes a new key and its hash.
func TestHashKey(t *testing.T) {
	defer func(r io.Reader) { stdin = r }(stdin)
	stdin = strings.NewReader(testKeyA + "\n")
	var out, errb strings.Builder
	if code := run([]string{"hash-key"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if got := strings.TrimSpace(out.String()); got != hashKey(testKeyA) {
		t.Errorf("hash-key printed %q, want the SHA-256 %s", got, hashKey(testKeyA))
	}
	for _, bad := range []string{"", "\n", " padded-key\n"} {
		stdin = strings.NewReader(bad)
		if code := run([]string{"hash-key"}, io.Discard, io.Discard); code != 1 {
			t.Errorf("hash-key of %q: exit %d, want 1", bad, code)
		}
	}

	out.Reset()
	if code := run([]string{"hash-key", "-generate"}, &out, &errb); code != 0 {
		t.Fatalf("-generate: exit %d: %s", code, errb.String())
	}
	var key, sum string
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		k, v, _ := strings.Cut(line, ":")
		switch k {
		case "key":
			key = strings.TrimSpace(v)
		case "sha256":
			sum = strings.TrimSpace(v)
		}
	}
	if !strings.HasPrefix(key, "tg-") || len(key) < 40 || sum != hashKey(key) {
		t.Errorf("-generate printed key %q sha256 %q", key, sum)
	}
}

// TestSpendCommand: `gateway spend` prints the admin API's spend as a table
// whose total is the ledger's, and `-limits` the limits.
func TestSpendCommand(t *testing.T) {
	mock := mockllm.New(mockllm.Options{OutputTokens: 1000, RequireKey: upKey})
	up := httptest.NewServer(mock)
	t.Cleanup(up.Close)
	cfg := govConfig(up.URL)
	cfg.Teams[1].TokensPerDay = p64(1_000_000)
	r := startReplica(t, cfg)
	res := load(t, []*replica{r}, testKeyB, 1, 5*time.Second, 0, 3)
	if res.ok.Load() != 3 {
		t.Fatalf("%d of 3 requests passed", res.ok.Load())
	}
	t.Setenv("TEST_ADMIN_TOKEN", testAdmin)
	var out, errb strings.Builder
	if code := run([]string{"spend", "-url", r.url, "-token-env", "TEST_ADMIN_TOKEN"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	rep := adminSpend(t, r.url, "")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "cost USD") {
		t.Fatalf("table:\n%s", out.String())
	}
	total := strings.Fields(lines[2])
	wantCost := microsUSD(rep.Total.CostMicros)
	if total[0] != "total" || total[len(total)-1] != wantCost || !strings.Contains(lines[1], " b ") {
		t.Errorf("table:\n%s\nwant a row for key b and a total of %s", out.String(), wantCost)
	}
	if rep.Total.Requests != 3 || rep.Total.InputTokens != res.input.Load() || rep.Total.OutputTokens != res.output.Load() {
		t.Errorf("spend %+v, upstream usage %d in / %d out", rep.Total, res.input.Load(), res.output.Load())
	}

	out.Reset()
	if code := run([]string{"spend", "-limits", "-url", r.url, "-token-env", "TEST_ADMIN_TOKEN"}, &out, &errb); code != 0 {
		t.Fatalf("-limits: exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "tokens_per_day") || !strings.Contains(out.String(), "blue") {
		t.Errorf("-limits:\n%s", out.String())
	}
	if code := run([]string{"spend", "-url", r.url, "-token-env", "UNSET_TOKEN_VAR_X"}, io.Discard, &errb); code != 1 {
		t.Errorf("without a token: exit %d", code)
	}
}

// TestForcedShutdownStillBills: a caller that stops reading keeps its
// handler blocked in Write past the drain timeout, so shutdown force-closes
// the server; the exchange must still be billed into the state file, not
// into a ledger already closed.
func TestForcedShutdownStillBills(t *testing.T) {
	big := strings.Repeat("x", 16000)
	var written atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-test\",\"content\":[],\"usage\":{\"input_tokens\":7,\"output_tokens\":1}}}\n\n")
		for i := 0; i < 5000 && r.Context().Err() == nil; i++ {
			fmt.Fprintf(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"%s\"}}\n\n", big)
			w.(http.Flusher).Flush()
			written.Add(1)
		}
	}))
	defer up.Close()
	cfg := govConfig(up.URL)
	cfg.Spend.StateFile = filepath.Join(t.TempDir(), "spend.json")
	r := startReplica(t, cfg)
	c, err := net.Dial("tcp", r.rg.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := `{"model":"claude-test","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"x"}]}`
	fmt.Fprintf(c, "POST /v1/messages HTTP/1.1\r\nHost: x\r\nX-Api-Key: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		testKeyA, len(body), body)
	// Bounded wait until the socket buffers are full and the upstream
	// stalls: the gateway's handler is then blocked writing to us.
	last := int64(-1)
	for range 200 {
		time.Sleep(25 * time.Millisecond)
		n := written.Load()
		if n > 0 && n == last {
			break
		}
		last = n
	}
	_ = r.rg.shutdown(0, 100*time.Millisecond) // drain times out: forced close
	r.once.Do(func() {})                       // already stopped
	recs := r.records()
	if len(recs) != 1 || recs[0].Usage.Output == 0 {
		t.Fatalf("records after shutdown: %+v", recs)
	}
	data, err := os.ReadFile(cfg.Spend.StateFile)
	if err != nil {
		t.Fatal(err)
	}
	var saved struct {
		Rows []struct {
			KeyID  string `json:"key_id"`
			Output int64  `json:"output"`
		} `json:"rows"`
	}
	if err := json.Unmarshal(data, &saved); err != nil || len(saved.Rows) != 1 || saved.Rows[0].KeyID != "a" ||
		saved.Rows[0].Output != recs[0].Usage.Output {
		t.Errorf("state file %s; the record billed %d output tokens", data, recs[0].Usage.Output)
	}
}

// TestBudgetsSurviveRestart: without Redis, a restarted gateway restores
// what each team used today from its state file, so a spent budget stays
// spent.
func TestBudgetsSurviveRestart(t *testing.T) {
	mock := mockllm.New(mockllm.Options{OutputTokens: 1000, RequireKey: upKey})
	up := httptest.NewServer(mock)
	t.Cleanup(up.Close)
	cfg := govConfig(up.URL)
	cfg.Spend.StateFile = filepath.Join(t.TempDir(), "spend.json")
	cfg.Teams[0].TokensPerDay = p64(600)
	send := func(r *replica) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, r.url+"/v1/messages", strings.NewReader(messagesBody(1, false)))
		req.Header.Set("X-Api-Key", testKeyA)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	first := startReplica(t, cfg)
	admitted := 0
	for range 20 {
		code, body := send(first)
		if code == http.StatusTooManyRequests {
			if !strings.Contains(body, "Budget spent") || !strings.Contains(body, "T00:00:00Z.") {
				t.Fatalf("refusal is not the budget: %s", body)
			}
			break
		}
		if code != http.StatusOK {
			t.Fatalf("%d %s", code, body)
		}
		admitted++
	}
	if admitted == 0 || admitted == 20 {
		t.Fatalf("%d requests admitted before the budget of 600 tokens refused", admitted)
	}
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}
	second := startReplica(t, cfg)
	if code, body := send(second); code != http.StatusTooManyRequests || !strings.Contains(body, "Budget spent") {
		t.Errorf("after a restart the spent budget admitted again: %d %s", code, body)
	}
	lim := adminLimits(t, second.url)
	if l := lim.find("team", "red", "tokens_per_day"); l == nil || l.Used < 600 {
		t.Errorf("tokens_per_day after the restart: %+v", l)
	}
}

// TestOneGatewayPerStateFile: a second gateway on the same state file (or,
// with Redis, the same spill directory) refuses to start instead of
// overwriting the first one's spend; once the first stops, it can.
func TestOneGatewayPerStateFile(t *testing.T) {
	srv := redistest.Start(t)
	up := httptest.NewServer(mockllm.New(mockllm.Options{RequireKey: upKey}))
	t.Cleanup(up.Close)
	local := govConfig(up.URL)
	local.Spend.StateFile = filepath.Join(t.TempDir(), "spend.json")
	shared := govConfig(up.URL)
	shared.Redis.Addrs = []string{srv.Addr()}
	shared.Redis.SpillDir = t.TempDir()
	owners := govConfig(up.URL)
	owners.Spend.StateFile = ""
	owners.Ownership.StateFile = filepath.Join(t.TempDir(), "owners.jsonl")
	for name, cfg := range map[string]config.Config{"state_file": local, "spill_dir": shared,
		"ownership state_file": owners} {
		t.Run(name, func(t *testing.T) {
			first := startReplica(t, cfg)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			c := cfg
			if _, err := startGateway(&c, ln, slog.New(slog.DiscardHandler), nil, nil); err == nil ||
				!strings.Contains(err.Error(), "in use by another running gateway") {
				t.Fatalf("second gateway on the same %s: %v", name, err)
			}
			if err := first.stop(); err != nil {
				t.Fatal(err)
			}
			startReplica(t, cfg) // the lock is free again
		})
	}
}

// storedRequest sends one request with key and returns its status and body.
func storedRequest(t *testing.T, method, url, key, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// createStored makes a stored response through base as key and returns its id.
func createStored(t *testing.T, base, key string) string {
	t.Helper()
	code, body := storedRequest(t, "POST", base+"/v1/responses", key, `{"model":"gpt-x","input":"keep this"}`)
	var r struct {
		ID string `json:"id"`
	}
	if code != http.StatusOK || json.Unmarshal([]byte(body), &r) != nil || r.ID == "" {
		t.Fatalf("creating a response: %d %s", code, body)
	}
	return r.ID
}

// wantOwnedBy checks through base that key a's team reads response id and
// key b's gets 404.
func wantOwnedBy(t *testing.T, what, base, id string) {
	t.Helper()
	if code, body := storedRequest(t, "GET", base+"/v1/responses/"+id, testKeyA, ""); code != http.StatusOK ||
		!strings.Contains(body, id) {
		t.Errorf("%s: own response: %d %s", what, code, body)
	}
	if code, body := storedRequest(t, "GET", base+"/v1/responses/"+id, testKeyB, ""); code != http.StatusNotFound ||
		!strings.Contains(body, "not found") {
		t.Errorf("%s: another team's response: %d %s", what, code, body)
	}
}

// TestStoredOwnersAcrossRestartAndReplicas runs the serve wiring: without
// Redis the owners outlive a restart in [ownership] state_file; with it
// two replicas share them.
func TestStoredOwnersAcrossRestartAndReplicas(t *testing.T) {
	up := httptest.NewServer(mockllm.New(mockllm.Options{RequireKey: upKey}))
	t.Cleanup(up.Close)

	local := govConfig(up.URL)
	local.Ownership.StateFile = filepath.Join(t.TempDir(), "owners.jsonl")
	first := startReplica(t, local)
	id := createStored(t, first.url, testKeyA)
	wantOwnedBy(t, "before the restart", first.url, id)
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}
	wantOwnedBy(t, "after the restart", startReplica(t, local).url, id)

	srv := redistest.Start(t)
	shared := govConfig(up.URL)
	shared.Redis.Addrs = []string{srv.Addr()}
	shared.Redis.SpillDir = t.TempDir()
	one := startReplica(t, shared)
	shared.Redis.SpillDir = t.TempDir()
	two := startReplica(t, shared)
	id = createStored(t, one.url, testKeyA)
	wantOwnedBy(t, "through the other replica", two.url, id)
	wantOwnedBy(t, "through the replica that saw it made", one.url, id)
}
