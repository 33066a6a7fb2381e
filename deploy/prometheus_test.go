package deploy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/bench"
	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/stats"
)

// The deploy files, from this package's directory.
const (
	promDir       = "prometheus"
	grafanaDir    = "grafana"
	dashboardFile = grafanaDir + "/dashboards/tollgate.json"
)

// promWait bounds every wait on the Prometheus process.
const promWait = 30 * time.Second

// needPromBinary returns the path of a binary of Debian's prometheus package
// (prometheus or promtool). Without it the test is skipped on a developer
// machine, but fails when CI is set: .ci/run installs the package, so a
// missing binary there means the check silently stopped running.
func needPromBinary(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s not found (CI is set, and .ci/run installs Debian's prometheus package): %v", name, err)
	}
	t.Skipf("%s not found; install Debian's prometheus package to run this test: %v", name, err)
	return ""
}

// TestPrometheusRules runs promtool over the deploy files: the configuration
// (which loads the rule files), the rules, and their unit tests. It also
// checks that the unit tests exercise every alert both ways: each alert has
// a case where it fires and one where it must not.
func TestPrometheusRules(t *testing.T) {
	promtool := needPromBinary(t, "promtool")
	ruleFiles, err := filepath.Glob(filepath.Join(promDir, "rules", "*.yml"))
	if err != nil || len(ruleFiles) == 0 {
		t.Fatalf("no rule files under %s/rules: %v", promDir, err)
	}
	testFiles, err := filepath.Glob(filepath.Join(promDir, "tests", "*.yml"))
	if err != nil || len(testFiles) == 0 {
		t.Fatalf("no rule tests under %s/tests: %v", promDir, err)
	}
	rel := func(paths []string) []string {
		out := make([]string, len(paths))
		for i, p := range paths {
			out[i] = strings.TrimPrefix(p, promDir+"/")
		}
		return out
	}
	for _, args := range [][]string{
		{"check", "config", "prometheus.yml"},
		append([]string{"check", "rules"}, rel(ruleFiles)...),
		append([]string{"test", "rules"}, rel(testFiles)...),
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = promDir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}

	_, _, alerts := readRules(t, filepath.Join(promDir, "rules", "alerts.yml"))
	var tests strings.Builder
	for _, f := range testFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		tests.Write(b)
	}
	firing := regexp.MustCompile(`alertname: (\w+)\s+exp_alerts:\s*\n\s*- exp_labels:`)
	quiet := regexp.MustCompile(`alertname: (\w+)\s+exp_alerts: \[\]`)
	fires, stays := map[string]bool{}, map[string]bool{}
	for _, m := range firing.FindAllStringSubmatch(tests.String(), -1) {
		fires[m[1]] = true
	}
	for _, m := range quiet.FindAllStringSubmatch(tests.String(), -1) {
		stays[m[1]] = true
	}
	if len(alerts) == 0 {
		t.Fatal("no alert found in alerts.yml")
	}
	for _, a := range alerts {
		if !fires[a] || !stays[a] {
			t.Errorf("alert %s: a test where it fires: %v, one where it must not: %v", a, fires[a], stays[a])
		}
	}
}

// TestPrometheusDashboardSeries checks that the Grafana dashboard and the
// rules only query series that exist: those the gateway registers (read
// from metrics/metrics.go and proxy/budget.go), the recording rules, and
// Prometheus' own up (rules only). A renamed metric or rule then fails here
// instead of leaving an empty panel. It also checks that every recording
// rule is used, and that the dashboard uses the provisioned datasource.
func TestPrometheusDashboardSeries(t *testing.T) {
	gateway := gatewaySeries(t)
	var exprs []string
	var records []string
	for _, f := range []string{"recording.yml", "alerts.yml"} {
		e, r, _ := readRules(t, filepath.Join(promDir, "rules", f))
		exprs = append(exprs, e...)
		records = append(records, r...)
	}
	known := map[string]bool{}
	for n := range gateway {
		known[n] = true
	}
	for _, r := range records {
		known[r] = true
	}

	used := map[string]bool{}
	for _, e := range exprs {
		for _, n := range seriesNames(e) {
			used[n] = true
			if !known[n] && n != "up" {
				t.Errorf("rule expression uses %q, which neither the gateway nor a recording rule defines:\n%s", n, e)
			}
		}
	}

	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	dsRaw, err := os.ReadFile(filepath.Join(grafanaDir, "provisioning", "datasources", "prometheus.yml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*uid:\s*(\S+)\s*$`).FindSubmatch(dsRaw)
	if m == nil {
		t.Fatal("no uid in the provisioned datasource")
	}
	dsUID := string(m[1])

	var dashExprs []string
	var uids []string
	walkJSON(dash, func(key string, v any) {
		switch key {
		case "expr":
			if s, ok := v.(string); ok {
				dashExprs = append(dashExprs, s)
			}
		case "datasource":
			if d, ok := v.(map[string]any); ok && d["type"] == "prometheus" {
				uids = append(uids, fmt.Sprint(d["uid"]))
			}
		}
	})
	for _, u := range uids {
		if u != dsUID {
			t.Errorf("dashboard datasource uid %q, the provisioned one is %q", u, dsUID)
		}
	}
	panels, _ := dash["panels"].([]any)
	for _, p := range panels {
		p := p.(map[string]any)
		if p["type"] == "row" {
			continue
		}
		if targets, _ := p["targets"].([]any); len(targets) == 0 {
			t.Errorf("panel %q has no query", p["title"])
		}
	}
	if len(dashExprs) < len(panels)/2 {
		t.Fatalf("found %d expressions in %d panels: the dashboard layout is not what this test reads", len(dashExprs), len(panels))
	}
	labelValues := regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][\w:]*)`)
	templating, _ := dash["templating"].(map[string]any)
	vars, _ := templating["list"].([]any)
	for _, v := range vars {
		q := v.(map[string]any)["query"]
		if qm, ok := q.(map[string]any); ok {
			q = qm["query"]
		}
		s, _ := q.(string)
		m := labelValues.FindStringSubmatch(s)
		if m == nil {
			t.Errorf("variable query %q: want label_values(<series>, <label>)", s)
			continue
		}
		dashExprs = append(dashExprs, m[1])
	}
	for _, e := range dashExprs {
		names := seriesNames(e)
		if len(names) == 0 {
			t.Errorf("dashboard expression without a series: %s", e)
		}
		for _, n := range names {
			used[n] = true
			if !known[n] {
				t.Errorf("dashboard expression uses %q, which neither the gateway nor a recording rule defines:\n%s", n, e)
			}
		}
	}
	for _, r := range records {
		if !used[r] {
			t.Errorf("recording rule %s is used by no alert, rule or dashboard panel", r)
		}
	}
}

// readRules reads a rule file of the shape the deploy files use: each rule a
// "- record:" or "- alert:" line and an "expr:" key, inline or as a block
// scalar (| or >). It returns the expressions and the record and alert
// names, and fails when the counts disagree, so that a file this reader does
// not understand is noticed. promtool checks the real YAML.
func readRules(t *testing.T, path string) (exprs, records, alerts []string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	indent := func(s string) int { return len(s) - len(strings.TrimLeft(s, " ")) }
	for i := 0; i < len(lines); i++ {
		s := strings.TrimSpace(lines[i])
		switch {
		case strings.HasPrefix(s, "#"):
		case strings.HasPrefix(s, "- record:"):
			records = append(records, strings.TrimSpace(strings.TrimPrefix(s, "- record:")))
		case strings.HasPrefix(s, "- alert:"):
			alerts = append(alerts, strings.TrimSpace(strings.TrimPrefix(s, "- alert:")))
		case strings.HasPrefix(s, "expr:"):
			v := strings.TrimSpace(strings.TrimPrefix(s, "expr:"))
			if v != "" && strings.Trim(v, "|>-+") == "" {
				var block []string
				for i+1 < len(lines) && (strings.TrimSpace(lines[i+1]) == "" || indent(lines[i+1]) > indent(lines[i])) {
					i++
					block = append(block, lines[i])
				}
				v = strings.Join(block, "\n")
			} else if uq, err := strconv.Unquote(v); err == nil {
				v = uq
			} else {
				v = strings.Trim(v, "'")
			}
			exprs = append(exprs, v)
		}
	}
	if len(exprs) != len(records)+len(alerts) {
		t.Fatalf("%s: %d expressions for %d records and %d alerts", path, len(exprs), len(records), len(alerts))
	}
	return exprs, records, alerts
}

// gatewaySeries returns the series names the gateway can export, read from
// the sources that register them: the hist, counter and gauge constructors
// of metrics/metrics.go (under its namespace) and the descriptors of
// proxy/budget.go. A histogram gives its _bucket, _sum and _count series and
// its own name (a native histogram). TestPrometheusScrapesGateway checks
// this set against what a real scrape returns.
func gatewaySeries(t *testing.T) map[string]bool {
	t.Helper()
	src, err := os.ReadFile("../metrics/metrics.go")
	if err != nil {
		t.Fatal(err)
	}
	ns := regexp.MustCompile(`const namespace = "(\w+)"`).FindSubmatch(src)
	if ns == nil {
		t.Fatal("metrics.go: no namespace constant")
	}
	prefix := string(ns[1]) + "_"
	names := map[string]bool{}
	for _, m := range regexp.MustCompile(`\bhist\(\s*"(\w+)"`).FindAllSubmatch(src, -1) {
		n := prefix + string(m[1])
		for _, s := range []string{"", "_bucket", "_sum", "_count"} {
			names[n+s] = true
		}
	}
	for _, re := range []string{`\bcounter\(\s*"(\w+)"`, `\bName:\s*"(\w+)"`} {
		for _, m := range regexp.MustCompile(re).FindAllSubmatch(src, -1) {
			names[prefix+string(m[1])] = true
		}
	}
	budget, err := os.ReadFile("../proxy/budget.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`NewDesc\(\s*"(\w+)"`).FindAllSubmatch(budget, -1) {
		names[string(m[1])] = true
	}
	if len(names) < 10 {
		t.Fatalf("found only %d metric names in the sources: the pattern no longer matches how they are registered", len(names))
	}
	return names
}

var (
	promString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	promMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promRange    = regexp.MustCompile(`\[[^\]]*\]`)
	promVariable = regexp.MustCompile(`\$\{?\w+\}?`)
	promIdent    = regexp.MustCompile(`[a-zA-Z_:][\w:]*`)
	promKeywords = map[string]bool{"and": true, "or": true, "unless": true, "offset": true, "bool": true,
		"atan2": true, "inf": true, "nan": true, "Inf": true, "NaN": true}
)

// seriesNames returns the series a PromQL expression (possibly with Grafana
// variables) selects: identifiers outside strings, label matchers, grouping
// clauses and ranges that are neither a function or aggregation (followed by
// a parenthesis) nor a keyword.
func seriesNames(expr string) []string {
	s := promString.ReplaceAllString(expr, `""`)
	s = promMatchers.ReplaceAllString(s, " ")
	s = promGrouping.ReplaceAllString(s, " ")
	s = promRange.ReplaceAllString(s, " ")
	s = promVariable.ReplaceAllString(s, " ")
	var out []string
	for _, loc := range promIdent.FindAllStringIndex(s, -1) {
		// Part of a number or duration (1e6, 1d, 0.5).
		if p := loc[0] - 1; p >= 0 && (s[p] == '.' || s[p] == '_' || s[p] >= '0' && s[p] <= '9' ||
			s[p] >= 'a' && s[p] <= 'z' || s[p] >= 'A' && s[p] <= 'Z') {
			continue
		}
		if strings.HasPrefix(strings.TrimLeft(s[loc[1]:], " \t\n"), "(") {
			continue
		}
		if id := s[loc[0]:loc[1]]; !promKeywords[id] {
			out = append(out, id)
		}
	}
	return out
}

// walkJSON calls f with every key and value of the objects in v.
func walkJSON(v any, f func(key string, v any)) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			f(k, e)
			walkJSON(e, f)
		}
	case []any:
		for _, e := range x {
			walkJSON(e, f)
		}
	}
}

// TestPrometheusScrapesGateway has a real Prometheus scrape a gateway (the
// binary, built from ../cmd/gateway) that served known traffic, and checks
// that PromQL's median TTFT over the scraped explicit buckets agrees with
// the gateway's /stats.
//
// They measure the same 60 TTFTs two ways. histogram_quantile interpolates
// linearly inside the bucket that holds the median rank, so its answer lies
// between that bucket's edges. /stats gives the median from a sketch within
// a relative error α of the exact value v, so v lies in [p/(1+α), p/(1−α)]
// for the /stats value p. The tolerance is therefore the buckets that can
// hold v: from the largest edge below p/(1+α) (0 if none) to the smallest
// edge at or above p/(1−α). The edges are read from the scraped le labels,
// which are metrics.go's TTFT buckets. The upstream's TTFT (15 ms ± 5 ms,
// plus the gateway's few milliseconds) is centred in the (10 ms, 25 ms]
// bucket, so that one bucket is usually the whole tolerance.
func TestPrometheusScrapesGateway(t *testing.T) {
	promBin := needPromBinary(t, "prometheus")

	up := httptest.NewServer(mockllm.New(mockllm.Options{TTFT: 15 * time.Millisecond, Jitter: 10 * time.Millisecond,
		Seed: 7, ITL: time.Millisecond, OutputTokens: 8}))
	t.Cleanup(up.Close)
	cfg := config.DemoConfig(up.URL)
	cfg.Auth.RequireKey = false
	// A constant label, to see that the recording rules keep it.
	cfg.Metrics.Labels = map[string]string{"scene": "scrape-test"}
	// The synthetic probe runs one round beside the bench: its series must
	// be scraped, and its requests must stay out of the TTFTs compared.
	cfg.Probe.Enabled, cfg.Probe.Requests, cfg.Probe.IntervalSeconds = true, 3, 3600
	// Dialect: the upstream's first, which Parse fills in.
	cfg.Probe.Targets = []config.ProbeTarget{{Upstream: "mock", Model: "probe-model", Dialect: "openai"}}
	// `gateway serve` reads cfg from this file; startGateway checks that
	// the file says just that.
	addr := startGateway(t, cfg, fmt.Sprintf(`[auth]
require_key = false

[metrics]
labels = { scene = "scrape-test" }

[probe]
enabled = true
requests = 3
interval_seconds = 3600

[[probe.targets]]
upstream = "mock"
model = "probe-model"

[[upstreams]]
name = "mock"
base_url = %q

[spend]
state_file = ""

[ownership]
state_file = ""

[conversations]
state_file = ""

[runtime_keys]
state_file = ""

[redis]
spill_dir = ""
`, up.URL))
	base := "http://" + addr

	const requests = 60
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := bench.Run(ctx, bench.Config{BaseURL: base, Dialect: llm.DialectOpenAI, Model: "m",
		Requests: requests, Concurrency: 4, MaxTokens: 64, Timeout: 10 * time.Second, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if s := res.Summary(bench.ClassAll); s == nil || s.Succeeded != requests {
		t.Fatalf("bench summary %+v, want %d successes", s, requests)
	}

	promURL := startPrometheus(t, promBin, addr)

	// The probe's round (1 to 5 s after the start) is scraped, with its
	// TTFTs in its own histogram.
	const probeOK = `sum(tollgate_probe_requests_total{result="ok",upstream="mock",model="probe-model"})`
	if v := waitForQuery(t, promURL, probeOK, func(v float64) bool { return v == 3 }); v != 3 {
		t.Errorf("%s = %v, want 3", probeOK, v)
	}
	if v := queryScalar(t, promURL, "sum(tollgate_probe_ttft_seconds_count)"); v != 3 {
		t.Errorf("probe TTFTs scraped: %v, want 3", v)
	}

	// The user traffic is over: the first scrape has every count, and the
	// probe's requests are not among them.
	count := waitForQuery(t, promURL, "sum(tollgate_time_to_first_token_seconds_count)", func(v float64) bool { return v == requests })
	if count != requests {
		t.Fatalf("Prometheus counts %v TTFTs, the gateway served %d", count, requests)
	}
	// Counts, not rate(): there is nothing left to rate once traffic stopped.
	promP50 := queryScalar(t, promURL, "histogram_quantile(0.5, sum by (le) (tollgate_time_to_first_token_seconds_bucket))")
	edges := bucketEdges(t, promURL, "tollgate_time_to_first_token_seconds_bucket")

	rep := gatewayStats(t, base+"/stats?window=5m&route=chat_completions")
	var statsCount, groups int64
	var statsP50, statsMean float64
	for _, w := range rep.Windows {
		for _, g := range w.Groups {
			if g.Team == "" || g.TTFT.Count == 0 { // the team-less ITL groups
				continue
			}
			groups++
			statsCount += g.TTFT.Count
			statsP50 = g.TTFT.P50 / 1000
			statsMean = g.TTFT.Mean / 1000
		}
	}
	if groups != 1 || statsCount != requests {
		t.Fatalf("/stats counts %d TTFTs in %d groups, want %d in one\n%+v", statsCount, groups, requests, rep)
	}
	alpha := rep.Sketch.RelativeError
	lo, hi := bucketBounds(edges, statsP50/(1+alpha), statsP50/(1-alpha))
	t.Logf("TTFT median: PromQL %.4f s, /stats %.4f s (α %.3g); allowed [%g, %g] s from the bucket edges",
		promP50, statsP50, alpha, lo, hi)
	if math.IsNaN(promP50) || promP50 < lo || promP50 > hi {
		t.Errorf("PromQL median TTFT %.4f s is outside the buckets [%g, %g] s that hold /stats' median %.4f s (±%g%%)",
			promP50, lo, hi, statsP50, 100*alpha)
	}

	// The sum, unlike the buckets, is exact on both sides: the same 60
	// durations added as float64 seconds and as int64 nanoseconds, so
	// the means differ by float rounding only.
	promMean := queryScalar(t, promURL, "sum(tollgate_time_to_first_token_seconds_sum) / sum(tollgate_time_to_first_token_seconds_count)")
	t.Logf("TTFT mean: PromQL %.6f s, /stats %.6f s", promMean, statsMean)
	if math.Abs(promMean-statsMean) > 1e-9*statsMean {
		t.Errorf("PromQL mean TTFT %.9f s, /stats %.9f s: not the same observations", promMean, statsMean)
	}

	// Every tollgate_ series scraped is one TestPrometheusDashboardSeries
	// knows, so its reading of the sources misses nothing.
	known := gatewaySeries(t)
	var names struct {
		Data []string `json:"data"`
	}
	promGet(t, promURL+"/api/v1/label/__name__/values", &names)
	var scraped int
	for _, n := range names.Data {
		if strings.HasPrefix(n, "tollgate_") {
			scraped++
			if !known[n] {
				t.Errorf("the gateway exports %s, which gatewaySeries did not find in the sources", n)
			}
		}
	}
	if scraped == 0 {
		t.Errorf("no tollgate_ series among %d names", len(names.Data))
	}
	for _, n := range []string{"tollgate_probe_success_ratio", "tollgate_probe_last_round_timestamp_seconds",
		"tollgate_probe_interval_seconds", "tollgate_probe_e2e_seconds_bucket", "tollgate_probe_tpot_seconds_bucket"} {
		if !slices.Contains(names.Data, n) {
			t.Errorf("the probe's %s was not scraped", n)
		}
	}

	checkRulesEvaluated(t, promURL)
}

// startPrometheus runs Prometheus on a free loopback port with a temporary
// storage directory, scraping target every second and loading the deploy
// rules, and returns its URL. The process is stopped and waited for when
// the test ends.
func startPrometheus(t *testing.T, bin, target string) string {
	t.Helper()
	dir := t.TempDir()
	rules, err := filepath.Abs(filepath.Join(promDir, "rules", "*.yml"))
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "prometheus.yml")
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - %q
scrape_configs:
  - job_name: tollgate
    static_configs:
      - targets: [%q]
`, rules, target)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	cmd := exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	u := "http://" + addr
	runUntilReady(t, "prometheus", cmd, u+"/-/ready", promWait)
	return u
}

type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

func (s promSample) float(t *testing.T) float64 {
	t.Helper()
	str, _ := s.Value[1].(string)
	v, err := strconv.ParseFloat(str, 64)
	if err != nil {
		t.Fatalf("sample value %v: %v", s.Value, err)
	}
	return v
}

// promGet decodes the data of a Prometheus API answer into v.
func promGet(t *testing.T, u string, v any) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var env struct {
		Status string `json:"status"`
		Error  string `json:"error"`
	}
	body := new(bytes.Buffer)
	if _, err := body.ReadFrom(resp.Body); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(body.Bytes(), &env); err != nil || env.Status != "success" {
		t.Fatalf("GET %s: %s %v %s", u, resp.Status, err, body)
	}
	if err := json.Unmarshal(body.Bytes(), v); err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
}

func promQuery(t *testing.T, base, q string) []promSample {
	t.Helper()
	var r struct {
		Data struct {
			Result []promSample `json:"result"`
		} `json:"data"`
	}
	promGet(t, base+"/api/v1/query?query="+url.QueryEscape(q), &r)
	return r.Data.Result
}

// queryScalar returns the value of a query that gives one sample.
func queryScalar(t *testing.T, base, q string) float64 {
	t.Helper()
	res := promQuery(t, base, q)
	if len(res) != 1 {
		t.Fatalf("%s: %d samples, want 1: %+v", q, len(res), res)
	}
	return res[0].float(t)
}

// waitForQuery polls a one-sample query until ok accepts its value or
// promWait passes, and returns the last value (NaN if none).
func waitForQuery(t *testing.T, base, q string, ok func(float64) bool) float64 {
	t.Helper()
	last := math.NaN()
	for deadline := time.Now().Add(promWait); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		if res := promQuery(t, base, q); len(res) == 1 {
			if last = res[0].float(t); ok(last) {
				break
			}
		}
	}
	return last
}

// bucketEdges returns the finite le values of a histogram's bucket series,
// ascending.
func bucketEdges(t *testing.T, base, bucket string) []float64 {
	t.Helper()
	var edges []float64
	for _, s := range promQuery(t, base, "count by (le) ("+bucket+")") {
		v, err := strconv.ParseFloat(s.Metric["le"], 64)
		if err != nil {
			t.Fatalf("le %q: %v", s.Metric["le"], err)
		}
		if !math.IsInf(v, 1) {
			edges = append(edges, v)
		}
	}
	slices.Sort(edges)
	if len(edges) < 2 {
		t.Fatalf("%s: bucket edges %v", bucket, edges)
	}
	return edges
}

// bucketBounds returns the edges of the buckets (lo, hi] that can hold a
// value in [from, to]: lo is the largest edge below from (0 when none),
// hi the smallest edge at or above to (+Inf when none).
func bucketBounds(edges []float64, from, to float64) (lo, hi float64) {
	lo, hi = 0, math.Inf(1)
	for _, e := range edges {
		if e < from {
			lo = e
		}
		if e >= to && math.IsInf(hi, 1) {
			hi = e
		}
	}
	return lo, hi
}

func gatewayStats(t *testing.T, u string) stats.Report {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rep stats.Report
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
		t.Fatal(err)
	}
	return rep
}

// checkRulesEvaluated waits until Prometheus has evaluated every deploy rule
// over the gateway's real series, and checks that none failed (a matching
// error, say, only shows with real labels) and that the recording rules
// keep the gateway's constant labels.
func checkRulesEvaluated(t *testing.T, base string) {
	t.Helper()
	type rule struct {
		Name           string    `json:"name"`
		Health         string    `json:"health"`
		LastError      string    `json:"lastError"`
		LastEvaluation time.Time `json:"lastEvaluation"`
	}
	var r struct {
		Data struct {
			Groups []struct {
				Name  string `json:"name"`
				Rules []rule `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	// The TTFT percentiles exist (NaN: no rate once traffic stopped) after
	// an evaluation over two scrapes.
	const recorded = `group by (model, route, scene) (model_route:tollgate_time_to_first_token_seconds:quantile_rate5m{quantile="0.5"})`
	var rules []rule
	var series []promSample
	for deadline := time.Now().Add(promWait); ; time.Sleep(250 * time.Millisecond) {
		promGet(t, base+"/api/v1/rules", &r)
		rules = rules[:0]
		pending := 0
		for _, g := range r.Data.Groups {
			for _, ru := range g.Rules {
				rules = append(rules, ru)
				if ru.LastEvaluation.IsZero() {
					pending++
				}
			}
		}
		series = promQuery(t, base, recorded)
		if len(rules) > 0 && pending == 0 && len(series) > 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(rules) == 0 {
		t.Fatal("prometheus loaded no rules")
	}
	for _, ru := range rules {
		if ru.LastEvaluation.IsZero() {
			t.Errorf("rule %s not evaluated within %v", ru.Name, promWait)
		} else if ru.Health != "ok" {
			t.Errorf("rule %s: health %q: %s", ru.Name, ru.Health, ru.LastError)
		}
	}
	want := map[string]string{"model": "m", "route": "chat_completions", "scene": "scrape-test"}
	if len(series) != 1 || !maps.Equal(series[0].Metric, want) {
		t.Errorf("%s = %+v, want one series %v", recorded, series, want)
	}
}
