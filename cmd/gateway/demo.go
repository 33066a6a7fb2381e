package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/conversation"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/spend"
)

func runDemo(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo",
		"Starts the fake upstream and the gateway on loopback (no keys, no Redis), sends a short\n"+
			"mixed burst through the gateway (OpenAI and Anthropic, streamed and not), prints TTFT,\n"+
			"TPOT, ITL and E2E P50/P95/P99 as the gateway measured them, then keeps serving so you\n"+
			"can point an SDK or curl at it and watch /dashboard and /metrics, until interrupted or -duration.", stderr)
	var mf mockFlags
	mf.register(fs, 150*time.Millisecond, 10*time.Millisecond, 6*time.Millisecond, 32)
	listen := fs.String("listen", "127.0.0.1:8080", "gateway address (a free port is used if it is taken)")
	requests := fs.Int("requests", 40, "requests in the burst")
	concurrency := fs.Int("concurrency", 8, "requests in flight at once during the burst")
	duration := fs.Duration("duration", 0, "after the burst, serve this long, then stop (0 = until interrupted)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *requests < 1 || *concurrency < 1 {
		fmt.Fprintln(stderr, "-requests and -concurrency must be at least 1")
		return errUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	ops := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	// The fake upstream.
	mockLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("listening for the fake upstream: %w", err)
	}
	primary := mockllm.New(mf.options(nil))
	mock := &http.Server{Handler: primary, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = mock.Serve(mockLn) }()
	defer mock.Close()
	// A second fake upstream the gateway falls back to.
	backupLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("listening for the backup upstream: %w", err)
	}
	backup := &http.Server{Handler: mockllm.New(mf.options(nil)), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = backup.Serve(backupLn) }()
	defer backup.Close()
	faults := &demoFaults{m: primary}

	// The gateway, on the embedded demo config.
	cfg := config.DemoConfig("http://" + mockLn.Addr().String())
	cfg.Auth.RequireKey = false
	demoGovernance(&cfg)
	demoConversations(&cfg)
	demoUpstreams(&cfg, "http://"+backupLn.Addr().String())
	demoProbe(&cfg)
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(stderr, "%s is taken (%v); using a free port\n", *listen, err)
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return err
		}
	}
	var col collector
	gw, err := startGateway(&cfg, ln, ops, nil, col.add)
	if err != nil {
		return err
	}
	base := "http://" + gw.addr
	fmt.Fprintf(stdout, "tollgate demo: gateway on %s, fake upstream on http://%s (TTFT %s, ITL %s±%s, %d tokens)\n",
		base, mockLn.Addr(), mf.ttft, mf.itl, mf.jitter/2, mf.tokens)
	fmt.Fprintf(stdout, "sending %d requests (%d at a time): OpenAI and Anthropic, streamed and not...\n\n",
		*requests, *concurrency)

	started := time.Now()
	failures := sendBurst(ctx, base, *requests, *concurrency, faults.before)
	if ctx.Err() != nil {
		return gw.shutdown(0, 5*time.Second)
	}
	fmt.Fprintf(stdout, "burst done in %s\n\n", time.Since(started).Round(time.Millisecond))
	printDemoTable(stdout, col.snapshot(), gw)
	printDemoResilience(stdout, col.snapshot(), faults.injected)
	printDemoSpend(ctx, stdout, gw)
	printDemoConversations(ctx, stdout, gw, *requests)
	if failures > 0 {
		fmt.Fprintf(stdout, "\n%d requests failed on the client side\n", failures)
	}
	// The probe starts after the burst, so that it takes none of the
	// failures scripted into the burst.
	gw.startProbe()
	fmt.Fprintf(stdout, "\nDashboard: %s/dashboard\nMetrics:   %s/metrics\n", base, base)
	fmt.Fprintf(stdout, "Probe:     %d requests to each of mock (demo-gpt) and mock-backup (demo-claude) every %g s, "+
		"within 5 s from now: tollgate_probe_* in /metrics\n", cfg.Probe.Requests, cfg.Probe.IntervalSeconds)
	fmt.Fprintf(stdout, "OpenAI:    base_url %s/v1   e.g. curl -s %s/v1/chat/completions -d '{\"model\":\"demo-gpt\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'\n", base, base)
	fmt.Fprintf(stdout, "Anthropic: base_url %s\n", base)
	if *duration > 0 {
		fmt.Fprintf(stdout, "serving for %s more (Ctrl-C stops sooner)\n", *duration)
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	} else {
		fmt.Fprintln(stdout, "serving until interrupted (Ctrl-C)")
	}
	select {
	case <-ctx.Done():
	case err := <-gw.done:
		return err
	}
	return gw.shutdown(0, 5*time.Second)
}

// collector keeps the demo's finished records.
type collector struct {
	mu   sync.Mutex
	recs []llm.Record
}

func (c *collector) add(r *llm.Record) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.recs) < 100000 {
		c.recs = append(c.recs, *r)
	}
}

func (c *collector) snapshot() []llm.Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]llm.Record(nil), c.recs...)
}

// demoPrompt returns a prompt of roughly words words, so the burst spans
// several input-size buckets.
func demoPrompt(words int) string {
	return strings.TrimSpace(strings.Repeat("tell me about gateways ", words/4+1))
}

// sendBurst sends n requests, c at a time, cycling through the four kinds
// (OpenAI and Anthropic, streamed and not). It returns how many failed.
func sendBurst(ctx context.Context, base string, n, c int, before func(i int)) int {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: c}}
	defer client.CloseIdleConnections()
	var mu sync.Mutex
	failures := 0
	sem := make(chan struct{}, c)
	var wg sync.WaitGroup
	for i := 0; i < n && ctx.Err() == nil; i++ {
		sem <- struct{}{}
		if before != nil {
			before(i)
		}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			if err := sendOne(ctx, client, base, i); err != nil {
				mu.Lock()
				failures++
				mu.Unlock()
			}
		}(i)
	}
	wg.Wait()
	return failures
}

// demoSizes are the burst's prompt sizes, in words.
var demoSizes = []int{40, 400, 1600, 4000}

// demoShape says what request i of the burst is: its key, API, stream flag
// and prompt size. Stream flag and API are bits 0 and 1 of i, the size
// changes every 4 requests, and the team follows neither bit and changes
// with the size every 16 requests, so in every 32 each team sends every
// API, streamed and not, in every size.
func demoShape(i int) (key string, chat, stream bool, size int) {
	return demoKeys[(i/4+i/16)%len(demoKeys)], i/2%2 == 0, i%2 == 0, demoSizes[i/4%len(demoSizes)]
}

func sendOne(ctx context.Context, client *http.Client, base string, i int) error {
	key, chat, stream, size := demoShape(i)
	prompt := demoPrompt(size)
	var url, body string
	h := http.Header{"Content-Type": {"application/json"}, "Authorization": {"Bearer " + key},
		"X-Conversation-Id": {demoConversation(i)}}
	if chat {
		url = base + "/v1/chat/completions"
		body = fmt.Sprintf(`{"model":"demo-gpt","stream":%t,"messages":[{"role":"user","content":%q}]}`, stream, prompt)
	} else {
		url = base + "/v1/messages"
		h.Set("Anthropic-Version", "2023-06-01")
		body = fmt.Sprintf(`{"model":"demo-claude","max_tokens":1024,"stream":%t,"messages":[{"role":"user","content":%q}]}`, stream, prompt)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewBufferString(body))
	if err != nil {
		return err
	}
	req.Header = h
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// printDemoTable prints the gateway's figures for the burst. TTFT, TPOT and
// E2E are exact per-request values from the records; ITL, observed per gap,
// comes from the gateway's own histogram (interpolated within buckets, as
// histogram_quantile does).
func printDemoTable(w io.Writer, recs []llm.Record, gw *runningGateway) {
	var ttft, tpot, e2e, over []float64
	outcomes := map[string]int{}
	var in, out int64
	for i := range recs {
		r := &recs[i]
		outcomes[r.Outcome.String()]++
		in += r.Usage.Input
		out += r.Usage.Output
		e2e = append(e2e, ms(r.E2E()))
		over = append(over, ms(r.Overhead()))
		if r.Stream && r.Outcome == llm.OutcomeOK {
			ttft = append(ttft, ms(r.TTFT()))
			if d, ok := r.TPOT(); ok {
				tpot = append(tpot, ms(d))
			}
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "figure (ms)\tcount\tP50\tP95\tP99\t")
	row := func(name string, v []float64) {
		sort.Float64s(v)
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t%.2f\t\n", name, len(v), pct(v, 50), pct(v, 95), pct(v, 99))
	}
	row("TTFT", ttft)
	row("TPOT", tpot)
	if n, q := histQuantiles(gw, "tollgate_inter_token_latency_seconds", 0.5, 0.95, 0.99); n > 0 {
		fmt.Fprintf(tw, "ITL (per gap)\t%d\t%.2f\t%.2f\t%.2f\t\n", n, q[0]*1000, q[1]*1000, q[2]*1000)
	}
	row("E2E", e2e)
	row("overhead", over)
	_ = tw.Flush()
	keys := make([]string, 0, len(outcomes))
	for k := range outcomes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, outcomes[k]))
	}
	fmt.Fprintf(w, "\nrequests: %d (%s); tokens: %d input, %d output\n", len(recs), strings.Join(parts, " "), in, out)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// pct is the nearest-rank percentile of sorted values.
func pct(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// histQuantiles merges every series of a histogram family and returns its
// sample count and the quantiles qs, interpolated linearly within the
// explicit buckets.
func histQuantiles(gw *runningGateway, name string, qs ...float64) (uint64, []float64) {
	mfs, err := gw.registry.Gather()
	if err != nil {
		return 0, nil
	}
	var count uint64
	var upper []float64
	var cum []uint64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			h := m.GetHistogram()
			count += h.GetSampleCount()
			mergeBuckets(&upper, &cum, h.GetBucket())
		}
	}
	out := make([]float64, len(qs))
	if count == 0 {
		return 0, out
	}
	for i, q := range qs {
		rank := q * float64(count)
		lo, prev := 0.0, uint64(0)
		out[i] = math.NaN()
		for j, ub := range upper {
			if float64(cum[j]) >= rank {
				frac := 0.0
				if cum[j] > prev {
					frac = (rank - float64(prev)) / float64(cum[j]-prev)
				}
				out[i] = lo + (ub-lo)*frac
				break
			}
			lo, prev = ub, cum[j]
		}
	}
	return count, out
}

func mergeBuckets(upper *[]float64, cum *[]uint64, bs []*dto.Bucket) {
	if *upper == nil {
		for _, b := range bs {
			*upper = append(*upper, b.GetUpperBound())
			*cum = append(*cum, 0)
		}
	}
	for j, b := range bs {
		if j < len(*cum) {
			(*cum)[j] += b.GetCumulativeCount()
		}
	}
}

// demoKeys are the demo's callers, one per team; in passthrough mode they
// reach the fake upstream, which accepts any key.
var demoKeys = []string{"demo-key-search", "demo-key-ads"}

// demoGovernance gives the demo two teams, a [[keys]] entry for each demo
// key and prices for the demo models, so spend per team can be shown.
func demoGovernance(cfg *config.Config) {
	cfg.Models = []config.Model{
		{Pattern: "demo-gpt*", InputUSDPerMTok: 2.5, OutputUSDPerMTok: 10},
		{Pattern: "demo-claude*", InputUSDPerMTok: 3, OutputUSDPerMTok: 15},
	}
	for i, k := range demoKeys {
		team := strings.TrimPrefix(k, "demo-key-")
		sum := sha256.Sum256([]byte(k))
		cfg.Teams = append(cfg.Teams, config.Team{Name: team})
		cfg.Keys = append(cfg.Keys, config.Key{Name: "demo-" + strconv.Itoa(i+1), SHA256: hex.EncodeToString(sum[:]), Team: team})
	}
}

// demoTurns is the number of turns of each of the burst's conversations.
const demoTurns = 4

// demoConversation names the conversation request i of the burst is a turn
// of: every demoTurns requests in a row, which demoShape gives one key.
func demoConversation(i int) string { return "demo-conversation-" + strconv.Itoa(i/demoTurns+1) }

// demoConversations turns conversation tracking on, in memory, with an idle
// timeout short enough that the burst's conversations end while the demo
// serves and show in /stats and the tollgate_conversation_* series.
func demoConversations(cfg *config.Config) {
	cfg.Conversations.Enabled = true
	cfg.Conversations.IdleTimeoutSeconds = 30
}

// printDemoConversations prints the turns, tokens and cost of each of the
// burst's conversations, as the gateway's conversation store holds them.
func printDemoConversations(ctx context.Context, w io.Writer, gw *runningGateway, requests int) {
	if gw.gov.conv == nil {
		return
	}
	fmt.Fprintf(w, "\nconversations (%d turns each, named by X-Conversation-Id):\n", demoTurns)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "conversation\tteam\tturns\terrors\tinput\toutput\tcost USD\tTTFT ms (streamed, mean)\t")
	for i := 0; i < requests; i += demoTurns {
		key, _, _, _ := demoShape(i)
		team := strings.TrimPrefix(key, "demo-key-")
		id := demoConversation(i)
		c, err := gw.gov.conv.Get(ctx, conversation.Key("team:"+team, id))
		if err != nil {
			fmt.Fprintf(tw, "%s\t%s\t%v\t\n", id, team, err)
			continue
		}
		// The burst sends a conversation's turns at once, so their order
		// is arbitrary: the mean over its streamed turns.
		var sum time.Duration
		n := 0
		for _, d := range c.TTFTs {
			if d > 0 {
				sum, n = sum+d, n+1
			}
		}
		ttft := "-"
		if n > 0 {
			ttft = strconv.FormatFloat(ms(sum/time.Duration(n)), 'f', 2, 64)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t\n", id, c.Team, c.Turns, c.Errors, c.Tokens.Input,
			c.Tokens.Output, microsUSD(c.CostMicros), ttft)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "they end after %g s without a turn: then /stats (\"conversations\") and the "+
		"tollgate_conversation_* series show turns and cost per conversation\n", gw.gw.Config().Conversations.IdleTimeoutSeconds)
}

// printDemoSpend prints the ledger per team and model.
func printDemoSpend(ctx context.Context, w io.Writer, gw *runningGateway) {
	rows, err := gw.gov.ledger.Query(ctx, spend.Filter{})
	if err != nil {
		fmt.Fprintf(w, "\nspend: %v\n", err)
		return
	}
	fmt.Fprintln(w, "\nspend (priced by the demo's [[models]]):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "team\tkey\tmodel\trequests\tinput\toutput\tcost USD\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s\t\n", r.Team, r.KeyID, r.Model, r.Requests, r.Input, r.Output,
			microsUSD(r.CostMicros))
	}
	_ = tw.Flush()
}

// demoFaults scripts upstream failures into the primary fake upstream, one
// every 8 requests of the burst (a 429 with retry-after-ms, three 529s, a
// 503, a 500), so the demo shows the gateway retrying (and, when the 529s
// meet one request, falling back) while its callers see only successes. Spread over the burst, they do
// not add up to the breaker's 5 failures in a row.
type demoFaults struct {
	m        *mockllm.Server
	injected int
}

func (f *demoFaults) before(i int) {
	if i%8 != 5 {
		return
	}
	spec, times := []string{"status=429;retry-after-ms=30", "status=529", "status=503", "status=500"}[i/8%4], 1
	if spec == "status=529" {
		// The next three answers; with requests in flight they may go to
		// different requests (each then retried on the primary) or to one
		// request's three attempts (which then falls back to mock-backup).
		times = 3
	}
	if err := f.m.Inject(spec, times); err == nil {
		f.injected += times
	}
}

// demoUpstreams adds the backup upstream and makes the demo's retries quick.
func demoUpstreams(cfg *config.Config, backupURL string) {
	b := config.DefaultUpstream()
	b.Name, b.BaseURL = "mock-backup", backupURL
	// The demo's callers bring keys (passthrough); the backup is a replica
	// of the same fake server, so their keys may follow a fallback.
	b.CallerKeysOnFallback = true
	cfg.Upstreams = append(cfg.Upstreams, b)
	for i := range cfg.Upstreams {
		cfg.Upstreams[i].Retry.BaseDelayMs = 20
		cfg.Upstreams[i].Retry.MaxDelayMs = 200
		// The fake upstream speaks the Responses API's WebSocket mode,
		// Codex's default transport.
		cfg.Upstreams[i].ResponsesWebSocket = true
	}
}

// demoProbe turns the synthetic probe on with a short interval, one target
// on each fake upstream, so /metrics shows tollgate_probe_* series within
// seconds.
func demoProbe(cfg *config.Config) {
	cfg.Probe.Enabled = true
	cfg.Probe.IntervalSeconds = 15
	cfg.Probe.Requests = 5
	// 3 waves of 2 requests, each given 5 s: a round fits its 15 s.
	cfg.Probe.TimeoutSeconds = 5
	cfg.Probe.Targets = []config.ProbeTarget{
		{Upstream: "mock", Model: "demo-gpt", Dialect: "openai"},
		{Upstream: "mock-backup", Model: "demo-claude", Dialect: "anthropic"},
	}
}

// printDemoResilience prints what the gateway did about the injected
// upstream failures: attempts, retries and fallbacks by reason, and what the
// callers saw.
func printDemoResilience(w io.Writer, recs []llm.Record, injected int) {
	if injected == 0 {
		return
	}
	attempts, retried, fellBack := 0, 0, 0 // retried: requests with a failed attempt
	reasons := map[string]int{}
	callerErrors := 0
	for i := range recs {
		r := &recs[i]
		attempts += r.AttemptCount
		if r.Upstream == "mock-backup" {
			fellBack++
		}
		failed := false
		for _, a := range r.Attempts[:min(r.AttemptCount, llm.MaxRecordedAttempts)] {
			if a.Result != "ok" {
				reasons[a.Result]++
				failed = true
			}
		}
		if failed {
			retried++
		}
		if r.Outcome != llm.OutcomeOK {
			callerErrors++
		}
	}
	keys := make([]string, 0, len(reasons))
	for k := range reasons {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, reasons[k]))
	}
	fallback := ""
	if fellBack > 0 {
		fallback = fmt.Sprintf(", served %d from mock-backup", fellBack)
	}
	fmt.Fprintf(w, "\nupstream failures injected into the fake upstream: %d; the gateway made %d attempts for %d "+
		"requests (failed: %s) and retried %d requests%s; callers saw %d errors\n",
		injected, attempts, len(recs), strings.Join(parts, " "), retried, fallback, callerErrors)
}
