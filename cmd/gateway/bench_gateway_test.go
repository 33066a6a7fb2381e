package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/bench"
	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/stats"
)

// sideUpstreamTTFT is the mock's TTFT behind the gateways of these tests.
const sideUpstreamTTFT = 20 * time.Millisecond

// startStatsGateway starts a mock upstream and a gateway (with /stats) in
// front of it on loopback; edit, when not nil, changes the config first. It
// returns the gateway's base URL.
func startStatsGateway(t *testing.T, edit func(*config.Config)) (string, *mockllm.Server) {
	t.Helper()
	m := mockllm.New(mockllm.Options{TTFT: sideUpstreamTTFT, ITL: 2 * time.Millisecond, OutputTokens: 8})
	up := httptest.NewServer(m)
	t.Cleanup(up.Close)
	cfg := config.DemoConfig(up.URL)
	cfg.Auth.RequireKey = false
	if edit != nil {
		edit(&cfg)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gw, err := startGateway(&cfg, ln, slog.New(slog.DiscardHandler), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.shutdown(0, 5*time.Second) })
	return "http://" + gw.addr, m
}

// benchJSON is the part of a -json report these tests read.
type benchJSON struct {
	Summaries []struct {
		Requests  int `json:"requests"`
		Succeeded int `json:"succeeded"`
	} `json:"summaries"`
	Gateway *struct {
		Window         string       `json:"window"`
		WindowSeconds  float64      `json:"window_seconds"`
		Route          string       `json:"route"`
		Model          string       `json:"model"`
		RelativeError  float64      `json:"relative_error"`
		Group          *stats.Group `json:"group"`
		WindowRequests int64        `json:"window_requests"`
		Counts         string       `json:"counts"`
		Unreliable     bool         `json:"counts_unreliable"`
		RequestsBefore int64        `json:"requests_before"`
		RequestsAfter  int64        `json:"requests_after"`
		Run            struct {
			Requests     int64   `json:"requests"`
			OutputTokens int64   `json:"output_tokens"`
			Total        int64   `json:"goodput_total"`
			CostUSD      float64 `json:"cost_usd"`
		} `json:"run"`
		ClientAttempts int           `json:"client_attempts"`
		OtherTraffic   bool          `json:"other_traffic"`
		Covered        bool          `json:"covered"`
		Client         bench.Summary `json:"client"`
		Note           string        `json:"note"`
	} `json:"gateway"`
	Samples []struct {
		TTFTMs float64   `json:"ttft_ms"`
		ITLMs  []float64 `json:"itl_ms"`
	} `json:"samples"`
}

func decodeBench(t *testing.T, out string) benchJSON {
	t.Helper()
	var rep benchJSON
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("JSON report: %v\n%s", err, out)
	}
	return rep
}

// TestBenchGatewaySideBySide: a run against a fresh gateway gets the
// gateway's own figures for exactly its requests (JSON); a second run finds
// the first in the window and says its quantiles include other traffic,
// while its counts are its own (table, with -gateway-stats naming the
// gateway).
func TestBenchGatewaySideBySide(t *testing.T) {
	base, _ := startStatsGateway(t, nil)
	const n = 8
	args := []string{"bench", "-url", base, "-model", "m", "-requests", "8", "-concurrency", "2", "-quiet",
		"-max-tokens", "64", "-timeout", "10s"}

	var out, errb strings.Builder
	if code := run(append(args, "-json"), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	rep := decodeBench(t, out.String())
	g := rep.Gateway
	if g == nil || g.Group == nil {
		t.Fatalf("no gateway figures in the report:\n%s", out.String())
	}
	if g.Window != "1m" || g.Route != "chat_completions" || g.Model != "m" || g.Group.Team != "*" {
		t.Errorf("window %q route %q model %q team %q; want 1m, chat_completions, m, * (teams merged)",
			g.Window, g.Route, g.Model, g.Group.Team)
	}
	if g.RequestsBefore != 0 || g.RequestsAfter != n || g.Run.Requests != n || g.ClientAttempts != n ||
		g.Group.TTFT.Count != n || g.Run.Total != n || g.OtherTraffic || !g.Covered ||
		g.Counts != "series" || g.Unreliable || g.WindowRequests != n {
		t.Errorf("gateway %+v; want %d requests counted, none before, no other traffic", *g, n)
	}
	// merge=team puts the route's ITL (kept without a team) in the group.
	if want := int64(n * 7); g.Group.ITL.Count != want {
		t.Errorf("gateway ITL count %d, want %d (7 gaps per request)", g.Group.ITL.Count, want)
	}
	if g.Client.Requests != n || g.Client.OutputTokens != g.Run.OutputTokens || g.Run.OutputTokens != n*8 {
		t.Errorf("client %d requests, %d output tokens; gateway %d output tokens; want %d and %d",
			g.Client.Requests, g.Client.OutputTokens, g.Run.OutputTokens, n, n*8)
	}
	// The gateway stamps TTFT once the first token is flushed, before it
	// writes the second: so its median is at most the client's median
	// reading of the second token (+ the sketch's error). The client's
	// first token alone is no bound (TestBenchAgainstGatewayStats says
	// why). It is at least the upstream's scheduled TTFT.
	second := make([]float64, 0, len(rep.Samples))
	for _, s := range rep.Samples {
		if len(s.ITLMs) == 0 {
			t.Fatal("a sample has no inter-token gap")
		}
		second = append(second, s.TTFTMs+s.ITLMs[0])
	}
	slices.Sort(second)
	p50 := g.Group.TTFT.P50
	// Both medians interpolate between the middle ranks (numpy's).
	median := (second[(len(second)-1)/2] + second[len(second)/2]) / 2
	if limit := median * (1 + g.RelativeError); p50 > limit {
		t.Errorf("gateway TTFT P50 %.3f ms is later than the client's median second token %.3f ms (+%g%%)",
			p50, median, 100*g.RelativeError)
	}
	if floor := float64(sideUpstreamTTFT/time.Millisecond) * (1 - g.RelativeError); p50 < floor {
		t.Errorf("gateway TTFT P50 %.3f ms is below the upstream's scheduled %v", p50, sideUpstreamTTFT)
	}

	// The second run: the first is still in the window.
	out.Reset()
	errb.Reset()
	if code := run(append(args, "-gateway-stats", base+"/stats"), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	table := out.String()
	for _, want := range []string{
		"client vs gateway (/stats window 1m, route chat_completions, model m)",
		"8 sent", "8 counted", "gateway counts: /stats/series",
		"WARNING: other traffic: the 1m window holds 16 requests, 8 of them from the run",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	if errb.Len() != 0 {
		t.Errorf("stderr %q, want nothing", errb.String())
	}
}

// TestBenchResponsesSideBySide: `gateway bench -api responses` streams the
// Responses API through a gateway and reads the gateway's own figures for
// it from /stats: the same requests, output tokens and ITL gaps.
func TestBenchResponsesSideBySide(t *testing.T) {
	base, _ := startStatsGateway(t, nil)
	const n = 6
	var out, errb strings.Builder
	if code := run([]string{"bench", "-url", base, "-model", "m", "-api", "responses", "-requests", "6",
		"-concurrency", "2", "-quiet", "-max-tokens", "64", "-timeout", "10s", "-json"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	rep := decodeBench(t, out.String())
	g := rep.Gateway
	if g == nil || g.Group == nil {
		t.Fatalf("no gateway figures in the report:\n%s", out.String())
	}
	if g.Route != "responses" || g.Run.Requests != n || g.ClientAttempts != n || g.Group.TTFT.Count != n ||
		g.Group.ITL.Count != int64(n*7) || g.Client.OutputTokens != g.Run.OutputTokens || g.Run.OutputTokens != n*8 {
		t.Errorf("route %q, gateway %+v, client %+v; want %d requests of 8 tokens and 7 gaps on route responses",
			g.Route, g.Run, g.Client, n)
	}
}

// TestGatewayWatchOtherClient: another client's requests that end between
// the two reads of /stats are counted with the run's and flagged.
func TestGatewayWatchOtherClient(t *testing.T) {
	base, _ := startStatsGateway(t, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cfg := bench.Config{BaseURL: base, Dialect: llm.DialectAnthropic, Model: "m", Requests: 4, Concurrency: 2,
		MaxTokens: 64, Timeout: 10 * time.Second}
	u, err := bench.StatsURL(base + "/v1")
	if err != nil {
		t.Fatal(err)
	}
	w, err := bench.WatchGateway(ctx, u, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The other client: three complete requests, counted by the gateway
	// before the run starts (so, after the first read of /stats).
	const others = 3
	for range others {
		resp, err := http.Post(base+"/v1/messages", "application/json",
			strings.NewReader(`{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = bytes.NewBuffer(nil).ReadFrom(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("other client: status %d", resp.StatusCode)
		}
	}
	res, err := bench.Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	gs, err := w.Finish(ctx, res)
	if err != nil {
		t.Fatal(err)
	}
	if gs.Route != "messages" || gs.Group == nil || gs.RequestsBefore != 0 {
		t.Fatalf("gateway stats %+v; want the messages route's group, empty before", gs)
	}
	if gs.Run.Requests != 4+others || gs.ClientAttempts != 4 || !gs.OtherTraffic {
		t.Errorf("gateway counted %d, client sent %d, other traffic %v; want %d, 4, true",
			gs.Run.Requests, gs.ClientAttempts, gs.OtherTraffic, 4+others)
	}
	res.Gateway = gs
	var b strings.Builder
	if err := res.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	if want := "WARNING: other traffic: the gateway counted 7 requests during the run, the client sent 4"; !strings.Contains(b.String(), want) {
		t.Errorf("table lacks %q:\n%s", want, b.String())
	}

	// A run that began two hours ago is beyond every window: no figures,
	// and a note that says why.
	old := &bench.Result{Started: time.Now().Add(-2 * time.Hour), Duration: 2 * time.Hour, Samples: res.Samples, SLO: res.SLO}
	gs, err = w.Finish(ctx, old)
	if err != nil || gs.Window != "" || gs.Group != nil || !strings.Contains(gs.Note, "an hour at most") {
		t.Errorf("two-hour run: %v, %+v; want no window, no group and a note", err, gs)
	}
}

// TestBenchGatewayStatsAbsent: against a bare mock (no /stats) the default
// auto mode shows nothing and says nothing; a -gateway-stats URL that
// cannot be read is reported on stderr, and the run's report and exit
// status are as without it.
func TestBenchGatewayStatsAbsent(t *testing.T) {
	m := mockllm.New(mockllm.Options{TTFT: 5 * time.Millisecond, ITL: time.Millisecond, OutputTokens: 4})
	up := httptest.NewServer(m)
	t.Cleanup(up.Close)
	args := []string{"bench", "-url", up.URL, "-model", "m", "-requests", "4", "-concurrency", "2", "-quiet"}

	var out, errb strings.Builder
	if code := run(args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if strings.Contains(out.String(), "client vs gateway") || errb.Len() != 0 || !strings.Contains(out.String(), "goodput") {
		t.Errorf("auto against a bare mock: stdout\n%s\nstderr %q; want the report alone", out.String(), errb.String())
	}
	// Auto did ask: the 4 requests and one GET /stats (a 404).
	if st := m.Stats(); st.Requests != 5 {
		t.Errorf("the mock saw %d requests, want 4 and one /stats", st.Requests)
	}

	out.Reset()
	errb.Reset()
	if code := run(append(args, "-json"), &out, &errb); code != 0 || strings.Contains(out.String(), `"gateway"`) {
		t.Errorf("auto, JSON: exit %d, a gateway object in\n%s", code, out.String())
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	for _, target := range []string{dead, up.URL} {
		out.Reset()
		errb.Reset()
		if code := run(append(args, "-gateway-stats", target), &out, &errb); code != 0 {
			t.Errorf("%s: exit %d, want 0: the run met its goals", target, code)
		}
		if msg := errb.String(); !strings.Contains(msg, "-gateway-stats") || !strings.Contains(msg, "no comparison") {
			t.Errorf("%s: stderr %q, want the failure reported", target, msg)
		}
		if s := out.String(); !strings.Contains(s, "goodput") || strings.Contains(s, "client vs gateway") {
			t.Errorf("%s: stdout\n%s\nwant the run's report, no comparison", target, s)
		}
	}
	// The exit status still follows -min-goodput.
	out.Reset()
	errb.Reset()
	if code := run(append(args, "-gateway-stats", dead, "-slo-ttft-ms", "1", "-min-goodput", "0.5"), &out, &errb); code != 1 ||
		!strings.Contains(errb.String(), "below -min-goodput") {
		t.Errorf("gate: exit %d, stderr %q; want 1", code, errb.String())
	}
	// The key goes to the API only, never to /stats.
	const key = "sk-bench-stats-secret-77"
	keyed := httptest.NewServer(mockllm.New(mockllm.Options{OutputTokens: 2, RequireKey: key}))
	t.Cleanup(keyed.Close)
	var statsHeaders []http.Header
	var mu sync.Mutex
	spy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		statsHeaders = append(statsHeaders, r.Header.Clone())
		mu.Unlock()
		http.NotFound(w, r)
	}))
	t.Cleanup(spy.Close)
	t.Setenv("TOLLGATE_TEST_BENCH_KEY", key)
	out.Reset()
	errb.Reset()
	if code := run([]string{"bench", "-url", keyed.URL, "-model", "m", "-requests", "2", "-quiet",
		"-key-env", "TOLLGATE_TEST_BENCH_KEY", "-gateway-stats", spy.URL}, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), "2 of 2 requests sent") {
		t.Fatalf("keyed run: exit %d, stderr %q\n%s", code, errb.String(), out.String())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(statsHeaders) != 1 {
		t.Errorf("/stats asked %d times, want once (before the run; its 404 ends the comparison)", len(statsHeaders))
	}
	for _, h := range statsHeaders {
		if h.Get("Authorization") != "" || h.Get("x-api-key") != "" || strings.Contains(fmt.Sprint(h), key) {
			t.Errorf("/stats was sent the key: %v", h)
		}
	}

	for _, bad := range []string{"ftp://x", "127.0.0.1:8080", "on"} {
		if code := run(append(args, "-gateway-stats", bad), &out, &errb); code != 2 {
			t.Errorf("-gateway-stats %q: exit %d, want 2 (usage)", bad, code)
		}
	}
}

// TestBenchGatewayStatsStagesAndModels: a staged run is compared once, all
// stages together; a model the gateway counts as "other" has no group, and
// the report says so.
func TestBenchGatewayStatsStagesAndModels(t *testing.T) {
	base, _ := startStatsGateway(t, func(c *config.Config) {
		c.Metrics.Models = []string{"known"}
		c.Metrics.MaxModels = 1
	})
	var out, errb strings.Builder
	args := []string{"bench", "-url", base, "-model", "known", "-quiet", "-max-tokens", "64", "-stages", "2,3", "-json"}
	if code := run(args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var rep struct {
		Stages  []json.RawMessage `json:"stages"`
		Gateway *struct {
			Run struct {
				Requests int64 `json:"requests"`
			} `json:"run"`
			Client struct {
				Requests int `json:"requests"`
			} `json:"client"`
			OtherTraffic bool `json:"other_traffic"`
			Runs         int  `json:"runs"`
		} `json:"gateway"`
	}
	if err := json.Unmarshal([]byte(out.String()), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Stages) != 2 || rep.Gateway == nil || rep.Gateway.Run.Requests != 5 || rep.Gateway.Client.Requests != 5 ||
		rep.Gateway.OtherTraffic || rep.Gateway.Runs != 2 {
		t.Errorf("stages %d, gateway %+v; want both stages' 5 requests on both sides\n%s", len(rep.Stages), rep.Gateway, out.String())
	}

	out.Reset()
	errb.Reset()
	if code := run([]string{"bench", "-url", base, "-model", "unlisted", "-quiet", "-requests", "2"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if want := `no gateway figures: the gateway has no figures for route chat_completions, model "unlisted"`; !strings.Contains(out.String(), want) {
		t.Errorf("table lacks %q:\n%s", want, out.String())
	}
}

// TestBenchUnauthorizedCommand: a gateway that wants a key stops the run
// after three 401s, prints what was measured, and tells how to send a key;
// a run whose every request got a 401 exits 1 too, though all were sent.
func TestBenchUnauthorizedCommand(t *testing.T) {
	base, m := startStatsGateway(t, func(c *config.Config) { c.Auth.RequireKey = true })
	var out, errb strings.Builder
	code := run([]string{"bench", "-url", base, "-model", "m", "-quiet", "-requests", "50", "-concurrency", "1"}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "401 Unauthorized") || !strings.Contains(errb.String(), "-key-env") {
		t.Errorf("exit %d, stderr %q; want 1, the 401s and a hint at -key-env", code, errb.String())
	}
	if s := out.String(); !strings.Contains(s, "3 of 50 requests sent") || !strings.Contains(s, "401:3") {
		t.Errorf("report:\n%s\nwant 3 of 50 sent, 401:3", s)
	}
	for _, n := range []string{"3", "2"} {
		out.Reset()
		errb.Reset()
		code := run([]string{"bench", "-url", base, "-model", "m", "-quiet", "-requests", n, "-concurrency", "1"}, &out, &errb)
		if code != 1 || !strings.Contains(errb.String(), "401 Unauthorized") || !strings.Contains(errb.String(), "-key-env") {
			t.Errorf("-requests %s: exit %d, stderr %q; want 1, the 401s and a hint at -key-env", n, code, errb.String())
		}
		if s := out.String(); !strings.Contains(s, n+" of "+n+" requests sent") || !strings.Contains(s, "401:"+n) {
			t.Errorf("-requests %s: report:\n%s\nwant all sent, 401:%s", n, s, n)
		}
	}
	if got := m.Stats().Requests; got != 0 {
		t.Errorf("the upstream saw %d requests, want none", got)
	}
}

// TestBenchStatsNoCredentials: credentials in -url (user:password@) go
// with the API requests, as the user asked (here to a proxy in front of
// the gateway), but not to /stats, nor do those in a -gateway-stats URL.
func TestBenchStatsNoCredentials(t *testing.T) {
	base, _ := startStatsGateway(t, nil)
	target, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	var mu sync.Mutex
	var statsAuth []string // the Authorization of each /stats request
	apiAuth := 0
	spy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		if strings.HasPrefix(r.URL.Path, "/stats") {
			statsAuth = append(statsAuth, r.Header.Get("Authorization"))
		} else if r.Header.Get("Authorization") != "" {
			apiAuth++
			// The spy is the proxy the credentials are for: the gateway
			// would take a Basic header for a wrong key and answer 401.
			r.Header.Del("Authorization")
		}
		mu.Unlock()
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(spy.Close)
	withUser := strings.Replace(spy.URL, "http://", "http://bench-user:pw-secret-31@", 1)

	for _, extra := range [][]string{nil, {"-gateway-stats", withUser + "/stats"}} {
		mu.Lock()
		statsAuth, apiAuth = nil, 0
		mu.Unlock()
		var out, errb strings.Builder
		args := append([]string{"bench", "-url", withUser, "-model", "m", "-requests", "2", "-quiet", "-max-tokens", "16"}, extra...)
		if code := run(args, &out, &errb); code != 0 {
			t.Fatalf("%v: exit %d: %s", extra, code, errb.String())
		}
		if o := out.String(); !strings.Contains(o, "client vs gateway") || !strings.Contains(o, "2 sent  ") ||
			!strings.Contains(o, "2 counted") || strings.Contains(o+errb.String(), "pw-secret-31") {
			t.Errorf("%v: want the comparison of 2 requests, and the password nowhere:\n%s\n%s", extra, o, errb.String())
		}
		mu.Lock()
		if len(statsAuth) < 2 || apiAuth != 2 {
			t.Errorf("%v: %d /stats requests, %d API requests with credentials; want 2 or more and 2", extra, len(statsAuth), apiAuth)
		}
		for _, a := range statsAuth {
			if a != "" {
				t.Errorf("%v: /stats was sent Authorization %q", extra, a)
			}
		}
		mu.Unlock()
	}
}
