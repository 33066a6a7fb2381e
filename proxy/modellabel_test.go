package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/ratelimit"
	"github.com/tollgate-llm/tollgate/stats"
)

// chatBody is a chat completion request for model, streamed or not.
func chatBody(model string, stream bool) string {
	return fmt.Sprintf(`{"model":%q,"stream":%v,"messages":[{"role":"user","content":"hi"}]}`, model, stream)
}

// modelLabels returns every model label value of the gateway's registry,
// with the number of series (metrics as gathered) that carry it.
func modelLabels(t *testing.T, tg *testGateway) map[string]int {
	t.Helper()
	mfs, err := tg.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "tollgate_probe_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "model" {
					got[lp.GetValue()]++
				}
			}
		}
	}
	return got
}

// statsModels returns the model of every /stats group, read over HTTP.
func statsModels(t *testing.T, tg *testGateway) map[string]bool {
	t.Helper()
	resp, err := http.Get(tg.URL + "/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rep stats.Report
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
		t.Fatalf("/stats: %v", err)
	}
	got := map[string]bool{}
	for _, w := range rep.Windows {
		for _, g := range w.Groups {
			got[g.Model] = true
		}
	}
	return got
}

// wantOnlyModels checks that the registry and /stats carry no model label
// value but those allowed.
func wantOnlyModels(t *testing.T, tg *testGateway, allowed ...string) {
	t.Helper()
	ok := map[string]bool{}
	for _, a := range allowed {
		ok[a] = true
	}
	var extra []string
	for m := range modelLabels(t, tg) {
		if !ok[m] {
			extra = append(extra, m)
		}
	}
	if len(extra) > 0 {
		t.Errorf("/metrics has %d model labels beyond %v, e.g. %q", len(extra), allowed, extra[:min(len(extra), 5)])
	}
	extra = extra[:0]
	for m := range statsModels(t, tg) {
		if !ok[m] {
			extra = append(extra, m)
		}
	}
	if len(extra) > 0 {
		t.Errorf("/stats has groups for %d models beyond %v, e.g. %q", len(extra), allowed, extra[:min(len(extra), 5)])
	}
}

// requestsOf sums tollgate_requests_total for one model label.
func requestsOf(t *testing.T, tg *testGateway, model string) float64 {
	t.Helper()
	mfs, err := tg.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "tollgate_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "model" && lp.GetValue() == model {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// TestRefusedModelsTakeNoLabel: requests naming hundreds of distinct models
// that the upstream refuses (4xx, and 5xx), that the gateway refuses itself
// (a bad request, a rate limit, a model the team may not use) or that never
// reach an upstream add no model label to /metrics and no group to /stats:
// they are counted under "other". Only the one name served takes a label.
func TestRefusedModelsTakeNoLabel(t *testing.T) {
	_, upURL := mockUpstream(t, mockllm.Options{OutputTokens: 3, ITL: 100 * time.Microsecond})
	lim := ratelimit.NewLocal(ratelimit.LocalOptions{})
	t.Cleanup(func() { _ = lim.Close() })
	win := stats.New(nil)
	tg := newTestGatewayWith(t, upURL, func(c *config.Config) {
		c.Upstreams[0].Retry.MaxAttempts = 1 // one answer per request, 5xx included
		c.Models = []config.Model{{Pattern: "gpt-test*", InputUSDPerMTok: 1, OutputUSDPerMTok: 1}}
		// Any name the upstream serves may take a label here: what must keep
		// these names out is that no upstream served them.
		c.Metrics.ModelsFromPrices = false
		c.Teams = []config.Team{{Name: "search", Limits: config.Limits{RPM: i64(1)}},
			{Name: "closed", Models: []string{"gpt-test*"}}}
		c.Keys = []config.Key{{Name: "alpha", SHA256: sha(keyAlpha), Team: "search"},
			{Name: "beta", SHA256: sha(keyBeta), Team: "closed"}}
	}, func(o *Options) { o.Limiter, o.Stats = lim, win })
	alpha := map[string]string{"Authorization": "Bearer " + keyAlpha}
	beta := map[string]string{"Authorization": "Bearer " + keyBeta}

	// alpha's one request a minute, served: its model takes a label.
	if resp, b := post(t, tg.URL+"/v1/chat/completions", chatBody("gpt-test", true), alpha); resp.StatusCode != http.StatusOK {
		t.Fatalf("alpha's first request: %d %s", resp.StatusCode, b)
	}
	tg.record(t)

	const perKind = 40
	kinds := []struct {
		name   string
		path   string
		body   func(model string) string
		hdr    map[string]string
		status int
	}{
		{"upstream 404, streamed", "/v1/chat/completions", func(m string) string { return chatBody(m, true) },
			map[string]string{"X-Mock-Fault": "status=404"}, 404},
		{"upstream 404", "/v1/chat/completions", func(m string) string { return chatBody(m, false) },
			map[string]string{"X-Mock-Fault": "status=404"}, 404},
		{"upstream 400, streamed", "/v1/chat/completions", func(m string) string { return chatBody(m, true) },
			map[string]string{"X-Mock-Fault": "status=400"}, 400},
		{"upstream 422", "/v1/messages", func(m string) string {
			return fmt.Sprintf(`{"model":%q,"max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`, m)
		}, map[string]string{"X-Mock-Fault": "status=422"}, 422},
		{"upstream 503, streamed", "/v1/chat/completions", func(m string) string { return chatBody(m, true) },
			map[string]string{"X-Mock-Fault": "status=503"}, 503},
		{"bad request (background)", "/v1/responses", func(m string) string {
			return fmt.Sprintf(`{"model":%q,"background":true,"input":"hi"}`, m)
		}, alpha, 400},
		{"rate limited", "/v1/chat/completions", func(m string) string { return chatBody(m, true) }, alpha, 429},
		{"not allowed", "/v1/chat/completions", func(m string) string { return chatBody(m, false) }, beta, 403},
	}
	sent := 0
	for k, kind := range kinds {
		for i := range perKind {
			model := fmt.Sprintf("hostile-%d-%d", k, i)
			resp, b := post(t, tg.URL+kind.path, kind.body(model), kind.hdr)
			if resp.StatusCode != kind.status {
				t.Fatalf("%s: %d %s, want %d", kind.name, resp.StatusCode, b, kind.status)
			}
			if rec := tg.record(t); rec.Model != model {
				t.Fatalf("%s: recorded model %q, want %q", kind.name, rec.Model, model)
			}
			sent++
		}
	}
	wantOnlyModels(t, tg, "gpt-test", "other")
	if n := requestsOf(t, tg, "other"); n != float64(sent) {
		t.Errorf("requests_total{model=\"other\"} = %v, want every refused request (%d)", n, sent)
	}
	if n := requestsOf(t, tg, "gpt-test"); n != 1 {
		t.Errorf("requests_total{model=\"gpt-test\"} = %v, want 1", n)
	}

	// No upstream reached at all.
	down := newTestGatewayWith(t, closedPortURL(t), nil, func(o *Options) { o.Stats = stats.New(nil) })
	for i := range perKind {
		resp, b := post(t, down.URL+"/v1/chat/completions", chatBody(fmt.Sprintf("hostile-down-%d", i), i%2 == 0), nil)
		if resp.StatusCode < 500 {
			t.Fatalf("unreachable upstream: %d %s", resp.StatusCode, b)
		}
		down.record(t)
	}
	wantOnlyModels(t, down, "other")
}

// TestModelLabelFollowsPricePatterns: with [[models]] patterns, names the
// upstream serves take a label only when they match one; others, served
// or not, are "other" in every series, ITL included, and in /stats. A
// [metrics] models name is labelled whatever it matches.
func TestModelLabelFollowsPricePatterns(t *testing.T) {
	_, upURL := mockUpstream(t, mockllm.Options{OutputTokens: 3, ITL: 100 * time.Microsecond})
	tg := newTestGatewayWith(t, upURL, func(c *config.Config) {
		c.Models = []config.Model{{Pattern: "gpt-test*", InputUSDPerMTok: 1, OutputUSDPerMTok: 1}}
		c.Metrics.Models = []string{"local-free"}
	}, func(o *Options) { o.Stats = stats.New(nil) })
	send := func(model string, stream bool) {
		t.Helper()
		if resp, b := post(t, tg.URL+"/v1/chat/completions", chatBody(model, stream), nil); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", model, resp.StatusCode, b)
		}
		tg.record(t)
	}
	send("gpt-test-a", true)
	send("gpt-test-b", false)
	send("local-free", true)
	const hostile = 50
	for i := range hostile {
		send(fmt.Sprintf("hostile-%d", i), i%2 == 0)
	}
	wantOnlyModels(t, tg, "gpt-test-a", "gpt-test-b", "local-free", "other")
	if n := requestsOf(t, tg, "other"); n != hostile {
		t.Errorf("requests_total{model=\"other\"} = %v, want %d", n, hostile)
	}
	// A stream's gaps are under the label of its other series.
	for _, m := range []string{"gpt-test-a", "local-free", "other"} {
		if !hasSeries(t, tg, "tollgate_inter_token_latency_seconds", m) {
			t.Errorf("no ITL series for model %q", m)
		}
	}

	// models_from_prices = false: any name the upstream served.
	_, upURL = mockUpstream(t, mockllm.Options{OutputTokens: 3})
	open := newTestGateway(t, upURL, func(c *config.Config) {
		c.Models = []config.Model{{Pattern: "gpt-test*", InputUSDPerMTok: 1, OutputUSDPerMTok: 1}}
		c.Metrics.ModelsFromPrices = false
	})
	if resp, b := post(t, open.URL+"/v1/chat/completions", chatBody("hostile-0", false), nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	open.record(t)
	if n := requestsOf(t, open, "hostile-0"); n != 1 {
		t.Errorf("models_from_prices = false: requests_total{model=\"hostile-0\"} = %v, want 1", n)
	}
}

// TestModelLabelOneForTheExchange: a stream whose first attempt the
// upstream refuses and whose retry it serves takes its label at the retry,
// and every series of the exchange, ITL included, carries that one label.
func TestModelLabelOneForTheExchange(t *testing.T) {
	mock, upURL := mockUpstream(t, mockllm.Options{OutputTokens: 4, ITL: 100 * time.Microsecond})
	tg := newTestGateway(t, upURL, func(c *config.Config) { fastRetry(&c.Upstreams[0]) })
	if err := mock.Inject("status=503", 1); err != nil {
		t.Fatal(err)
	}
	if resp, b := post(t, tg.URL+"/v1/chat/completions", chatBody("gpt-retried", true), nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if rec := tg.record(t); rec.AttemptCount != 2 {
		t.Fatalf("%d attempts, want 2 (503, then 200)", rec.AttemptCount)
	}
	if got := modelLabels(t, tg); len(got) != 1 || got["gpt-retried"] == 0 {
		t.Errorf("model labels %v, want gpt-retried alone", got)
	}
	if !hasSeries(t, tg, "tollgate_inter_token_latency_seconds", "gpt-retried") {
		t.Error("no ITL series for gpt-retried")
	}
}

// hasSeries reports whether family name has a series with model label model.
func hasSeries(t *testing.T, tg *testGateway, name, model string) bool {
	t.Helper()
	mfs, err := tg.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "model" && lp.GetValue() == model {
					return true
				}
			}
		}
	}
	return false
}

// scrapeModelSeries fetches /metrics over HTTP in the text format and
// returns, for one model label value, the number of series lines (one per
// classic bucket, _sum and _count of a histogram) and the families they
// belong to.
func scrapeModelSeries(t *testing.T, tg *testGateway, model string) (int, map[string]int) {
	t.Helper()
	resp, err := http.Get(tg.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`[{,]model="` + regexp.QuoteMeta(model) + `"[,}]`)
	n, fams := 0, map[string]int{}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "#") || !re.MatchString(l) {
			continue
		}
		n++
		fam, _, _ := strings.Cut(l, "{")
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			fam = strings.TrimSuffix(fam, suf)
		}
		fams[fam]++
	}
	return n, fams
}

// readmeSeriesCounts reads README's series counts per model label: what a
// successful streamed request adds (classic series, native series), what a
// non-streamed one adds, and what a stream of one token adds.
func readmeSeriesCounts(t *testing.T) (streamed, native, plain, oneToken int) {
	t.Helper()
	b, err := os.ReadFile("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	// Line breaks may fall between any two words.
	words := strings.NewReplacer(" ", `\s+`)
	re := regexp.MustCompile(`(?s)` + words.Replace(`a successful streamed request adds \*\*(\d+)\*\* series`) + `.*?` +
		words.Replace(`(\d+) when Prometheus ingests native histograms`) + `.*?` +
		words.Replace(`a successful non-streamed one \*\*(\d+)\*\*`) + `.*?` +
		words.Replace(`a stream of one token (\d+)`))
	m := re.FindSubmatch(b)
	if m == nil {
		t.Fatalf("docs/metrics.md does not say the series per model label in the expected words (%s)", re)
	}
	nums := make([]int, 4)
	for i := range nums {
		nums[i], _ = strconv.Atoi(string(m[i+1]))
	}
	return nums[0], nums[1], nums[2], nums[3]
}

// TestSeriesPerModelLabel: the series one model label value adds to
// /metrics are what README says, after one successful streamed and one
// non-streamed request of that model (route, team and input bucket shared),
// one non-streamed request of another, and a one-token stream of a third.
func TestSeriesPerModelLabel(t *testing.T) {
	streamed, native, plain, oneToken := readmeSeriesCounts(t)
	_, upURL := mockUpstream(t, mockllm.Options{OutputTokens: 4, ITL: 100 * time.Microsecond})
	tg := newTestGateway(t, upURL, nil)
	if !tg.gw.Config().Metrics.NativeHistograms {
		t.Fatal("native histograms are off: the README's counts are for the default")
	}
	send := func(model string, stream bool, hdr map[string]string) {
		t.Helper()
		if resp, b := post(t, tg.URL+"/v1/chat/completions", chatBody(model, stream), hdr); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", model, resp.StatusCode, b)
		}
		tg.record(t)
	}
	send("model-a", true, nil)
	send("model-a", false, nil)
	send("model-b", false, nil)
	send("model-c", true, map[string]string{"X-Mock-Output-Tokens": "1"})

	n, fams := scrapeModelSeries(t, tg, "model-a")
	if n != streamed {
		t.Errorf("model-a (streamed and not): %d series lines, README says %d: %v", n, streamed, fams)
	}
	if g := modelLabels(t, tg)["model-a"]; g != native {
		t.Errorf("model-a: %d series counting each histogram once, README says %d", g, native)
	}
	if n, fams := scrapeModelSeries(t, tg, "model-b"); n != plain {
		t.Errorf("model-b (non-streamed): %d series lines, README says %d: %v", n, plain, fams)
	}
	n, fams = scrapeModelSeries(t, tg, "model-c")
	if n != oneToken {
		t.Errorf("model-c (a stream of one token): %d series lines, README says %d: %v", n, oneToken, fams)
	}
	for _, f := range []string{"tollgate_inter_token_latency_seconds", "tollgate_time_per_output_token_seconds"} {
		if fams[f] != 0 {
			t.Errorf("a stream of one token has %d %s series, want none (no gap to observe)", fams[f], f)
		}
	}
}
