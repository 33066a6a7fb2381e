package dashboard_test

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/conversation"
	"github.com/tollgate-llm/tollgate/metrics"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/proxy"
	"github.com/tollgate-llm/tollgate/ratelimit"
	"github.com/tollgate-llm/tollgate/spend"
	"github.com/tollgate-llm/tollgate/stats"
)

const (
	keySearch = "tg-test-search-key-0001"
	keyAds    = "tg-test-ads-key-0002"
)

func sha(k string) string {
	s := sha256.Sum256([]byte(k))
	return hex.EncodeToString(s[:])
}

// chromium returns Debian's Chromium, or skips the test when it is missing
// outside CI (.ci/run installs it; in CI its absence is a failure).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium is not installed; .ci/run installs Debian's chromium package")
	}
	t.Skip("chromium is not installed (apt-get install chromium)")
	return ""
}

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// world is a gateway with two teams in front of a mockllm, its /stats
// requests counted and, once, held.
type world struct {
	url   string
	stats *stats.Windows
	// clock is the live windows' clock: it moves only when the test says,
	// so the page and the test see the same slices and spans.
	clock *fakeClock

	mu        sync.Mutex
	statsSeen int
	holdAt    int           // hold the holdAt-th /stats request (1-based) ...
	held      chan struct{} // ... until this is closed
	reached   chan struct{} // closed when that request arrives
	release   func()        // closes held, once
	failStats bool          // answer /stats with 503, as when too many are in flight
}

func newWorld(t *testing.T) *world {
	t.Helper()
	mock := mockllm.New(mockllm.Options{TTFT: 15 * time.Millisecond, ITL: 8 * time.Millisecond,
		Jitter: 2 * time.Millisecond, Seed: 7, OutputTokens: 12})
	up := httptest.NewServer(mock)
	t.Cleanup(up.Close)
	doc := fmt.Sprintf(`
[server]
listen = "127.0.0.1:0"
[auth]
mode = "keys"
[[upstreams]]
name = "mock"
base_url = %q
dialects = ["openai", "anthropic"]
[[models]]
pattern = "gpt-test*"
input_usd_per_mtok = 2.5
output_usd_per_mtok = 10
[[models]]
pattern = "claude-test*"
input_usd_per_mtok = 3
output_usd_per_mtok = 15
[[teams]]
name = "search"
[[teams]]
name = "ads"
rpm = 3
[[keys]]
name = "searcher"
sha256 = %q
team = "search"
[[keys]]
name = "advertiser"
sha256 = %q
team = "ads"
`, up.URL, sha(keySearch), sha(keyAds))
	cfg, err := config.Parse([]byte(doc), "dashboard-test.toml", func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	lim := ratelimit.NewLocal(ratelimit.LocalOptions{})
	t.Cleanup(func() { _ = lim.Close() })
	ledger, err := spend.NewLocal(spend.LocalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ledger.Close() })
	w := &world{clock: &fakeClock{t: time.Now()}, held: make(chan struct{}), reached: make(chan struct{})}
	w.stats = stats.New(w.clock.now)
	gw, err := proxy.New(proxy.Options{Config: cfg, Metrics: m, Gatherer: reg, Limiter: lim, Ledger: ledger,
		Stats: w.stats, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	h := gw.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/stats") {
			w.mu.Lock()
			w.statsSeen++
			hold := w.statsSeen == w.holdAt
			fail := w.failStats
			w.mu.Unlock()
			if fail {
				rw.Header().Set("Retry-After", "1")
				http.Error(rw, "too many /stats requests in flight; retry", http.StatusServiceUnavailable)
				return
			}
			if hold {
				close(w.reached)
				<-w.held
			}
		}
		h.ServeHTTP(rw, r)
	}))
	t.Cleanup(srv.Close)
	// Runs before srv.Close, which would wait for a held request forever.
	w.release = sync.OnceFunc(func() { close(w.held) })
	t.Cleanup(w.release)
	w.url = srv.URL
	return w
}

// openaiStreams sends n streams; it may run outside the test's goroutine.
func (w *world) openaiStreams(key string, n int) error {
	return w.openaiModelStreams(key, "gpt-test", n)
}

// openaiModelStreams sends n streams for model.
func (w *world) openaiModelStreams(key, model string, n int) error {
	c := openai.NewClient(option.WithBaseURL(w.url+"/v1"), option.WithAPIKey(key), option.WithMaxRetries(0))
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		st := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
			Model:     model,
			MaxTokens: openai.Int(int64(16 + i)),
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("How many moons has Saturn?")},
		})
		chunks := 0
		for st.Next() {
			chunks++
		}
		err := st.Err()
		cancel()
		if err != nil || chunks == 0 {
			return fmt.Errorf("openai stream %d: %d chunks, %v", i, chunks, err)
		}
	}
	return nil
}

// anthropicStreams sends n streams and returns how many the gateway
// refused with 429.
func (w *world) anthropicStreams(t *testing.T, key string, n int) (refused int) {
	t.Helper()
	c := anthropic.NewClient(aoption.WithBaseURL(w.url), aoption.WithAPIKey(key), aoption.WithMaxRetries(0))
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		st := c.Messages.NewStreaming(ctx, anthropic.MessageNewParams{
			Model: "claude-test", MaxTokens: int64(16 + i),
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Name a moon of Jupiter."))},
		})
		for st.Next() {
		}
		err := st.Err()
		cancel()
		var apiErr *anthropic.Error
		switch {
		case err == nil:
		case errors.As(err, &apiErr) && apiErr.StatusCode == http.StatusTooManyRequests:
			refused++
		default:
			t.Fatalf("anthropic stream %d: %v", i, err)
		}
	}
	return refused
}

// dump loads the dashboard in headless Chromium and returns the DOM once
// the page's scripts have run for budget of virtual time (Chromium stops
// virtual time while a fetch is pending, so every refresh in the budget
// completes).
func dump(t *testing.T, chrome, url string, budget time.Duration) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, chrome, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
		"--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-dev-shm-usage", "--user-data-dir="+t.TempDir(),
		"--virtual-time-budget="+strconv.FormatInt(budget.Milliseconds(), 10), "--dump-dom", url)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium: %v\n%s", err, stderr.String())
	}
	return string(out)
}

// tag is one start or end tag of the dumped DOM.
type tag struct {
	name  string
	end   bool
	attrs map[string]string
}

var (
	tagRE  = regexp.MustCompile(`<(/?)([a-zA-Z][a-zA-Z0-9:-]*)((?:\s+[^\s=>]+(?:="[^"]*")?)*)\s*/?>`)
	attrRE = regexp.MustCompile(`([^\s=>]+)(?:="([^"]*)")?`)
)

func parseTags(dom string) []tag {
	var out []tag
	for _, m := range tagRE.FindAllStringSubmatch(dom, -1) {
		tg := tag{name: strings.ToLower(m[2]), end: m[1] == "/", attrs: map[string]string{}}
		for _, a := range attrRE.FindAllStringSubmatch(m[3], -1) {
			tg.attrs[a[1]] = html.UnescapeString(a[2])
		}
		out = append(out, tg)
	}
	return out
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, body)
	}
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

// num parses a data attribute; "" is a figure with no sample.
func num(t *testing.T, s string) (float64, bool) {
	t.Helper()
	if s == "" {
		return 0, false
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatalf("data value %q: %v", s, err)
	}
	return v, true
}

// TestDashboardRendersStats loads /dashboard in headless Chromium against a
// gateway with traffic from both SDKs and two teams, one of them over its
// rate limit, and checks that the tiles, the chart lines and the team and
// model tables show exactly the figures /stats reports — after a refresh
// that happened while the page was open: the page is held on its second
// refresh until more traffic has gone through, and must show that traffic.
func TestDashboardRendersStats(t *testing.T) {
	chrome := chromium(t)
	w := newWorld(t)
	if err := w.openaiStreams(keySearch, 6); err != nil {
		t.Fatal(err)
	}
	if refused := w.anthropicStreams(t, keyAds, 6); refused != 3 {
		t.Fatalf("team ads (rpm 3) had %d of 6 requests refused, want 3", refused)
	}
	w.endConversations()
	w.endSessions()
	// That traffic is in the first 10 s slice; 12 s on, it is closed and
	// the current one is 2 s old (its rates are not charted yet).
	w.clock.advance(12 * time.Second)
	// The page asks four documents per refresh: hold the first of the
	// second refresh until four more requests have gone through.
	w.mu.Lock()
	w.holdAt = 5
	w.mu.Unlock()
	more := make(chan error, 1)
	go func() {
		select {
		case <-w.reached:
		case <-time.After(90 * time.Second):
			more <- errors.New("the page never refreshed")
			return
		}
		more <- w.openaiStreams(keySearch, 4)
		w.release()
	}()
	dom := dump(t, chrome, w.url+"/dashboard", 12*time.Second)
	select {
	case <-w.reached:
	default:
		w.mu.Lock()
		defer w.mu.Unlock()
		t.Fatalf("the page did not refresh (%d /stats requests)", w.statsSeen)
	}
	if err := <-more; err != nil {
		t.Fatal(err)
	}

	var all, teams, models stats.Report
	var series stats.SeriesReport
	getJSON(t, w.url+"/stats?window=5m&merge=route,model,team", &all)
	getJSON(t, w.url+"/stats/series?window=5m&merge=route,model,team", &series)
	getJSON(t, w.url+"/stats?window=5m&merge=route,model", &teams)
	getJSON(t, w.url+"/stats?window=5m&merge=team", &models)
	if len(all.Windows[0].Groups) != 1 || len(series.Series) != 1 {
		t.Fatalf("/stats: %d groups, %d series", len(all.Windows[0].Groups), len(series.Series))
	}
	g := all.Windows[0].Groups[0]
	if g.Requests != 16 || g.Rejections["rpm"] != 3 || g.CostUSD <= 0 {
		t.Fatalf("/stats counts %d requests, rejections %v, cost %g; sent 16, 3 over the limit", g.Requests, g.Rejections, g.CostUSD)
	}

	tags := parseTags(dom)
	if body := tags[slices.IndexFunc(tags, func(tg tag) bool { return tg.name == "body" })]; body.attrs["data-window"] != "5m" {
		t.Fatalf("page did not render (body %v); DOM:\n%s", body.attrs, dom)
	}
	if s := statusText(dom); !strings.HasPrefix(s, "updated") {
		t.Errorf("status %q", s)
	}

	checkTiles(t, dom, tags, g, all.Windows[0].Seconds)
	checkCharts(t, tags, series)
	checkTeams(t, tags, teams)
	checkModels(t, tags, models)
	checkConversations(t, dom, tags, teams)
	checkSessions(t, dom, tags, teams)
}

// endConversations hands the live windows ended conversations and
// outcomes of both teams, as the conversation store and the outcome
// endpoint do: search with idle, evicted and errored ones, outcomes with
// and without a score; ads with an outcome that did not complete (so no
// cost per completed task) and no score.
func (w *world) endConversations() {
	score := func(v float64) *float64 { return &v }
	for i := range 9 {
		c := conversation.Conversation{Team: "search", Turns: int64(1 + i*i), CostMicros: int64(1_500 + 40_000*i)}
		if i%4 == 0 {
			c.Errors = 1
		}
		why := conversation.EndIdle
		if i == 5 {
			why = conversation.EndEvicted
		}
		w.stats.ObserveConversation(c, why)
	}
	w.stats.ObserveOutcome("search", conversation.Outcome{Completed: true, Score: score(0.75)}, 81_500)
	w.stats.ObserveOutcome("search", conversation.Outcome{Completed: true}, 1_500)
	w.stats.ObserveOutcome("search", conversation.Outcome{Completed: false, Score: score(0.2)}, 241_500)
	w.stats.ObserveConversation(conversation.Conversation{Team: "ads", Turns: 3, CostMicros: 2_000_000}, conversation.EndIdle)
	w.stats.ObserveOutcome("ads", conversation.Outcome{Completed: false}, 2_000_000)
}

// checkConversations: one row per team with conversations in the last
// hour, holding in its data attributes exactly the figures /stats
// reports (empty for a figure without a sample) and showing each in its
// cell, read back to the precision it is written with.
func checkConversations(t *testing.T, dom string, tags []tag, rep stats.Report) {
	t.Helper()
	rows := map[string]map[string]string{}
	for _, tg := range tags {
		if tg.name == "tr" && tg.attrs["data-conversation-team"] != "" {
			rows[tg.attrs["data-conversation-team"]] = tg.attrs
		}
	}
	if len(rep.Conversations) != 2 || len(rows) != 2 {
		t.Fatalf("%d conversation rows, /stats has %d teams with conversations", len(rows), len(rep.Conversations))
	}
	// The cells' texts, by team, in column order after the team's name.
	cells := map[string][]string{}
	for _, m := range regexp.MustCompile(`<tr data-conversation-team="([^"]*)"[^>]*>(.*?)</tr>`).FindAllStringSubmatch(dom, -1) {
		for _, td := range regexp.MustCompile(`<td>([^<]*)</td>`).FindAllStringSubmatch(m[2], -1) {
			cells[html.UnescapeString(m[1])] = append(cells[html.UnescapeString(m[1])], html.UnescapeString(td[1]))
		}
	}
	for _, c := range rep.Conversations {
		f, o := c.LastHour, c.LastHour.Outcomes
		idle, sampled := f.Ended > f.Evicted, f.Sampled > 0
		type want struct {
			attr string
			v    float64
			has  bool
		}
		wants := []want{
			{"ended", float64(f.Ended), true}, {"evicted", float64(f.Evicted), true}, {"error-share", f.ErrorShare, f.Ended > 0},
			{"turns-mean", f.Turns.Mean, idle}, {"turns-p50", f.Turns.P50, sampled}, {"turns-p95", f.Turns.P95, sampled}, {"turns-p99", f.Turns.P99, sampled},
			{"cost-mean", f.CostUSD.Mean, idle}, {"cost-p50", f.CostUSD.P50, sampled}, {"cost-p95", f.CostUSD.P95, sampled}, {"cost-p99", f.CostUSD.P99, sampled},
			{"completion-rate", o.CompletionRate, o.Posted > 0}, {"mean-score", o.MeanScore, o.Scored > 0},
			{"cost-per-completed", o.CostPerCompletedUSD, o.Completed > 0},
		}
		row := rows[c.Team]
		texts := cells[c.Team]
		if row == nil || len(texts) != len(wants)+1 || texts[0] != c.Team {
			t.Errorf("team %s: row %v, cells %q", c.Team, row, texts)
			continue
		}
		for i, wt := range wants {
			got, has := num(t, row["data-"+wt.attr])
			if has != wt.has || (has && got != wt.v) {
				t.Errorf("team %s %s holds %q, /stats says %v (has %v)", c.Team, wt.attr, row["data-"+wt.attr], wt.v, wt.has)
			}
			text := texts[i+1]
			if !wt.has {
				if text != "–" {
					t.Errorf("team %s %s shows %q without a sample", c.Team, wt.attr, text)
				}
				continue
			}
			shown, tol, err := readTile(text)
			// A share is a percentage to one decimal, a count or turns
			// to one decimal, a score to two, dollars to 4 under $1.
			if err != nil || math.Abs(shown-wt.v) > max(tol, 0.005*math.Abs(wt.v)) {
				t.Errorf("team %s %s shows %q (read %v, %v), /stats says %v", c.Team, wt.attr, text, shown, err, wt.v)
			}
		}
	}
	// The figures are those observed: search's 8 idle of 9 and its 12
	// sessions (one evicted), ads' one and its 2 sessions.
	search := rows["search"]
	if search["data-ended"] != "21" || search["data-evicted"] != "2" || rows["ads"]["data-ended"] != "3" ||
		rows["ads"]["data-cost-per-completed"] != "" {
		t.Errorf("search %v, ads %v", search, rows["ads"])
	}
}

// endSessions hands the live windows ended coding agents' sessions, as
// the conversation store does: search has twelve (eleven that ended idle,
// more than the ten costliest shown, with wall times from seconds to
// hours, and one evicted), ads two, one of them without subagents, tools or
// prompts.
func (w *world) endSessions() {
	t0 := time.Date(2026, 9, 1, 9, 0, 0, 0, time.UTC)
	session := func(team, key, keyID string, n int64, wall time.Duration) conversation.Conversation {
		cost := 40_000 + 173_000*n
		c := conversation.Conversation{Team: team, Key: key, KeyID: keyID, Turns: 3 + n, CostMicros: cost,
			Start: t0, First: t0.Add(wall / 4), Last: t0.Add(wall)}
		c.Breakdown.Classes = map[string]*conversation.Calls{
			"main": {Calls: 2 + n, CostMicros: cost - 10_000*n, E2EMicros: int64(wall/time.Microsecond) / 3}}
		if n > 0 {
			c.Breakdown.Classes["subagent"] = &conversation.Calls{Calls: 1, CostMicros: 10_000 * n, E2EMicros: 2_000_000}
			c.Breakdown.Tools = map[string]*conversation.Tool{"Bash": {Runs: n, Millis: int64(wall/time.Millisecond) / (2 + n)}}
			c.Breakdown.Compactions = map[string]*conversation.Compactions{"auto": {Calls: n % 3}}
			c.Breakdown.Prompts = 1 + n/2
		}
		return c
	}
	for i := range int64(12) {
		why := conversation.EndIdle
		if i == 7 {
			why = conversation.EndEvicted
		}
		wall := []time.Duration{8 * time.Second, 45 * time.Second, 7 * time.Minute, 95 * time.Minute}[i%4]
		w.stats.ObserveConversation(session("search", sha(fmt.Sprint("search-session-", i))[:32], "searcher", i, wall), why)
	}
	w.stats.ObserveConversation(session("ads", sha("ads-session-1")[:32], "advertiser", 0, 3*time.Second), conversation.EndIdle)
	w.stats.ObserveConversation(session("ads", sha("ads-session-2")[:32], "tg-1a2b3c4d5e6f", 20, 2*time.Hour), conversation.EndIdle)
}

// checkSessions: one row per team with sessions in the last hour, holding
// in its data attributes exactly the P50 and P95 /stats reports of each
// figure and showing them, read back; and one row per costliest session
// of every team, costliest first, with its key, as /stats lists them.
func checkSessions(t *testing.T, dom string, tags []tag, rep stats.Report) {
	t.Helper()
	rows := map[string]map[string]string{}
	var costly []map[string]string
	for _, tg := range tags {
		switch {
		case tg.name == "tr" && tg.attrs["data-session-team"] != "":
			rows[tg.attrs["data-session-team"]] = tg.attrs
		case tg.name == "tr" && tg.attrs["data-costly-key"] != "":
			costly = append(costly, tg.attrs)
		}
	}
	if len(rep.Sessions) != 2 || len(rows) != 2 {
		t.Fatalf("%d session rows, /stats has %d teams with sessions", len(rows), len(rep.Sessions))
	}
	cells := rowCells(dom, "data-session-team")
	var wantCostly []stats.CostlySession
	for _, g := range rep.Sessions {
		f := g.LastHour
		wantCostly = append(wantCostly, f.Costliest...)
		row, texts := rows[g.Team], cells[g.Team]
		figs := []struct {
			attr string
			d    stats.Distribution
			unit float64 // what readTile's reading is of the figure
		}{{"cost", f.CostUSD, 1}, {"calls", f.Calls, 1}, {"user-turns", f.UserTurns, 1},
			{"duration", f.DurationSeconds, 1000}, {"model-share", f.ModelShare, 1}, {"tool-share", f.ToolShare, 1},
			{"compactions", f.Compactions, 1}, {"subagent-share", f.SubagentCostShare, 1}}
		if row == nil || len(texts) != 3+len(figs) || texts[0] != g.Team || row["data-ended"] != strconv.FormatInt(f.Ended, 10) ||
			row["data-evicted"] != strconv.FormatInt(f.Evicted, 10) {
			t.Errorf("team %s: row %v, cells %q; /stats %d ended, %d evicted", g.Team, row, texts, f.Ended, f.Evicted)
			continue
		}
		for i, fg := range figs {
			shown := strings.Split(texts[3+i], " / ")
			if len(shown) != 2 {
				t.Errorf("team %s %s shows %q, want P50 / P95", g.Team, fg.attr, texts[3+i])
				continue
			}
			for j, q := range []struct {
				name string
				v    float64
			}{{"p50", fg.d.P50}, {"p95", fg.d.P95}} {
				if got, has := num(t, row["data-"+fg.attr+"-"+q.name]); !has || got != q.v {
					t.Errorf("team %s %s-%s holds %q, /stats says %v", g.Team, fg.attr, q.name, row["data-"+fg.attr+"-"+q.name], q.v)
				}
				v, tol, err := readTile(shown[j])
				if want := q.v * fg.unit; err != nil || math.Abs(v-want) > max(tol, 0.005*math.Abs(want)) {
					t.Errorf("team %s %s %s shows %q (read %v, %v), /stats says %v", g.Team, fg.attr, q.name, shown[j], v, err, q.v)
				}
			}
		}
	}
	// Costliest first across the teams, each team's ten at most.
	slices.SortStableFunc(wantCostly, func(a, b stats.CostlySession) int {
		return cmp.Or(cmp.Compare(b.CostUSD, a.CostUSD), strings.Compare(a.Team, b.Team), strings.Compare(a.Key, b.Key))
	})
	if len(costly) != len(wantCostly) || len(wantCostly) != 12 {
		t.Fatalf("%d costliest rows, /stats lists %d (want 10 of search's 11, and ads' 2)", len(costly), len(wantCostly))
	}
	costlyCells := rowCells(dom, "data-costly-key")
	for i, c := range wantCostly {
		row := costly[i]
		texts := costlyCells[c.Key]
		if row["data-costly-key"] != c.Key || row["data-costly-team"] != c.Team || row["data-key-id"] != c.KeyID ||
			row["data-cost"] != strconv.FormatFloat(c.CostUSD, 'g', -1, 64) || row["data-calls"] != strconv.FormatInt(c.Calls, 10) ||
			row["data-duration"] != strconv.FormatFloat(c.DurationSeconds, 'g', -1, 64) ||
			row["data-user-turns"] != strconv.FormatInt(c.UserTurns, 10) {
			t.Errorf("costliest row %d is %v, /stats says %+v", i, row, c)
			continue
		}
		if len(texts) != 7 || texts[0] != c.Team || texts[1] != c.KeyID || texts[2] != c.Key[:12] {
			t.Errorf("costliest row %d shows %q, /stats says %+v", i, texts, c)
			continue
		}
		for j, fg := range []struct {
			v, unit float64
		}{{c.CostUSD, 1}, {c.DurationSeconds, 1000}, {float64(c.Calls), 1}, {float64(c.UserTurns), 1}} {
			v, tol, err := readTile(texts[3+j])
			if want := fg.v * fg.unit; err != nil || math.Abs(v-want) > max(tol, 0.005*math.Abs(want)) {
				t.Errorf("costliest row %d cell %d shows %q (read %v, %v), /stats says %v", i, 3+j, texts[3+j], v, err, fg.v)
			}
		}
	}
	// The costliest of all is ads' 20-call session of two hours.
	if c := wantCostly[0]; c.Team != "ads" || c.KeyID != "tg-1a2b3c4d5e6f" || c.DurationSeconds != 7200 || c.Calls != 23 {
		t.Errorf("costliest session %+v", c)
	}
}

// rowCells returns the cell texts of the table rows carrying attribute
// attr, by its value, in column order.
func rowCells(dom, attr string) map[string][]string {
	out := map[string][]string{}
	re := regexp.MustCompile(`<tr ` + attr + `="([^"]*)"[^>]*>(.*?)</tr>`)
	for _, m := range re.FindAllStringSubmatch(dom, -1) {
		k := html.UnescapeString(m[1])
		for _, td := range regexp.MustCompile(`<td[^>]*>([^<]*)</td>`).FindAllStringSubmatch(m[2], -1) {
			out[k] = append(out[k], html.UnescapeString(td[1]))
		}
	}
	return out
}

// checkTiles: the tiles hold exactly the values of the whole-gateway group
// g of a window spanning seconds, in their data attributes, and show them:
// each tile's text, read back, is that value to the precision it is
// written with, in its unit.
func checkTiles(t *testing.T, dom string, tags []tag, g stats.Group, seconds float64) {
	t.Helper()
	byID := map[string]tag{}
	for _, tg := range tags {
		if id := tg.attrs["id"]; id != "" && !tg.end {
			byID[id] = tg
		}
	}
	want := map[string]float64{
		"requests": float64(g.Requests), "goodput": g.Goodput.Ratio, "cost": g.CostUSD,
		"rejected":          float64(g.Populations["refused"]),
		"tokens-per-second": g.OutputTokensPerSecond,
		"overhead-p50":      g.Overhead.P50, "overhead-p99": g.Overhead.P99,
	}
	for name, q := range map[string]stats.Quantiles{"ttft": g.TTFT, "tpot": g.TPOT, "itl": g.ITL, "e2e": g.E2E} {
		if q.Count == 0 {
			t.Fatalf("no %s in /stats", name)
		}
		want[name+"-p50"], want[name+"-p95"], want[name+"-p99"] = q.P50, q.P95, q.P99
	}
	texts := map[string]string{}
	for _, m := range regexp.MustCompile(`<div class="tile" id="t-([a-z0-9-]+)"[^>]*><div class="k">[^<]*</div><div class="v">([^<]*)</div>`).FindAllStringSubmatch(dom, -1) {
		texts[m[1]] = html.UnescapeString(m[2])
	}
	if len(texts) != len(want) {
		t.Errorf("%d tiles shown, want %d: %v", len(texts), len(want), texts)
	}
	for id, v := range want {
		tg, ok := byID["t-"+id]
		if !ok {
			t.Errorf("no tile t-%s", id)
			continue
		}
		got, has := num(t, tg.attrs["data-v"])
		if !has || got != v {
			t.Errorf("tile %s holds %q, /stats says %v", id, tg.attrs["data-v"], v)
		}
		shown, tol, err := readTile(texts[id])
		if err != nil || math.Abs(shown-v) > max(tol, 0.005*math.Abs(v)) {
			t.Errorf("tile %s shows %q (read %v, %v), /stats says %v", id, texts[id], shown, err, v)
		}
	}
	// The refused tile names the most frequent reason.
	top := ""
	for reason, n := range g.Rejections {
		if top == "" || n > g.Rejections[top] || n == g.Rejections[top] && reason < top {
			top = reason
		}
	}
	if top != "" && !strings.HasSuffix(texts["rejected"], " · "+top) {
		t.Errorf("the refused tile shows %q; its top reason is %s", texts["rejected"], top)
	}
	body := tags[slices.IndexFunc(tags, func(tg tag) bool { return tg.name == "body" })]
	if secs, ok := num(t, body.attrs["data-seconds"]); !ok || secs != seconds {
		t.Errorf("page's window spans %q s, /stats says %v", body.attrs["data-seconds"], seconds)
	}
}

// readTile reads a tile's text back as the value in the tile's unit (ms for
// latencies, a ratio for "12.5% of 8", dollars, or a plain number), and
// the rounding its format allows.
func readTile(text string) (v, tol float64, err error) {
	parse := func(s string) (float64, error) { return strconv.ParseFloat(strings.ReplaceAll(s, ",", ""), 64) }
	for _, f := range []struct {
		re    string
		scale float64
		tol   float64
	}{
		{`^([\d,.]+) ms$`, 1, 0.005},
		{`^([\d,.]+) s$`, 1000, 5},
		{`^([\d,.]+) min$`, 60_000, 300},
		{`^([\d,.]+) h$`, 3_600_000, 18_000},
		{`^([\d,.]+)%(?: of \d+)?$`, 0.01, 0.0005},
		{`^\$([\d,.]+)$`, 1, 0.00005},
		{`^([\d,.]+)(?: · [a-z_]+)?$`, 1, 0.05}, // a count, and for the refused the top reason
	} {
		if m := regexp.MustCompile(f.re).FindStringSubmatch(text); m != nil {
			n, err := parse(m[1])
			return n * f.scale, f.tol, err
		}
	}
	return 0, 0, fmt.Errorf("tile text %q is not a figure", text)
}

func statusText(dom string) string {
	m := regexp.MustCompile(`id="status"[^>]*>([^<]*)<`).FindStringSubmatch(dom)
	if m == nil {
		return ""
	}
	return m[1]
}

// chartLine is one line of a chart: its values and the points drawn.
type chartLine struct {
	values string
	points [][2]float64
}

// chartLines reads every chart line of the page, by "chart/line" (for
// example "ttft/p50"), and each chart's point spans (data-seconds).
func chartLines(tags []tag) (map[string]*chartLine, map[string]string) {
	lines := map[string]*chartLine{}
	spans := map[string]string{}
	chart, series := "", ""
	for _, tg := range tags {
		switch {
		case !tg.end && tg.name == "div" && strings.HasPrefix(tg.attrs["id"], "c-"):
			chart = strings.TrimPrefix(tg.attrs["id"], "c-")
		case !tg.end && tg.name == "svg" && chart != "":
			spans[chart] = tg.attrs["data-seconds"]
		case !tg.end && tg.name == "g" && tg.attrs["class"] == "series":
			series = chart + "/" + tg.attrs["data-name"]
			lines[series] = &chartLine{values: tg.attrs["data-values"]}
		case tg.end && tg.name == "g":
			series = ""
		case !tg.end && series != "" && tg.name == "polyline":
			for p := range strings.FieldsSeq(tg.attrs["points"]) {
				x, y, _ := strings.Cut(p, ",")
				xf, _ := strconv.ParseFloat(x, 64)
				yf, _ := strconv.ParseFloat(y, 64)
				lines[series].points = append(lines[series].points, [2]float64{xf, yf})
			}
		case !tg.end && series != "" && tg.name == "circle":
			xf, _ := strconv.ParseFloat(tg.attrs["cx"], 64)
			yf, _ := strconv.ParseFloat(tg.attrs["cy"], 64)
			lines[series].points = append(lines[series].points, [2]float64{xf, yf})
		}
	}
	return lines, spans
}

// checkCharts: every chart line holds exactly the values of the series'
// points — the P50/P95/P99 of the latency charts, and the rates (tokens/s,
// requests and rejections per second, spend per minute) of the slices at
// least half over, the current one left out before that — and draws one
// point per value, a higher value never lower on the chart.
func checkCharts(t *testing.T, tags []tag, series stats.SeriesReport) {
	t.Helper()
	pts := series.Series[0].Points
	lines, spans := chartLines(tags)
	settled := func(p stats.Point) bool { return p.Seconds >= series.SliceSeconds/2 }
	var secs []string
	for _, p := range pts {
		secs = append(secs, strconv.FormatFloat(p.Seconds, 'f', -1, 64))
	}
	for chart, got := range spans {
		if got != strings.Join(secs, ",") {
			t.Errorf("chart %s spans %q, /stats/series %v", chart, got, secs)
		}
	}
	want := map[string]func(stats.Point) (float64, bool){
		"tokens/tokens/s": func(p stats.Point) (float64, bool) { return p.OutputTokensPerSecond, settled(p) },
		"goodput/goodput": func(p stats.Point) (float64, bool) { return p.Goodput.Ratio, p.Goodput.Total > 0 },
		"requests/requests/s": func(p stats.Point) (float64, bool) {
			return float64(p.Requests) / p.Seconds, settled(p)
		},
		"requests/rejected/s": func(p stats.Point) (float64, bool) {
			return float64(p.Populations["refused"]) / p.Seconds, settled(p)
		},
		"spend/USD/min": func(p stats.Point) (float64, bool) { return p.CostUSD / p.Seconds * 60, settled(p) },
	}
	for _, f := range []struct {
		name string
		q    func(stats.Point) stats.Quantiles
	}{
		{"ttft", func(p stats.Point) stats.Quantiles { return p.TTFT }},
		{"tpot", func(p stats.Point) stats.Quantiles { return p.TPOT }},
		{"itl", func(p stats.Point) stats.Quantiles { return p.ITL }},
		{"e2e", func(p stats.Point) stats.Quantiles { return p.E2E }},
	} {
		want[f.name+"/p50"] = func(p stats.Point) (float64, bool) { return f.q(p).P50, f.q(p).Count > 0 }
		want[f.name+"/p95"] = func(p stats.Point) (float64, bool) { return f.q(p).P95, f.q(p).Count > 0 }
		want[f.name+"/p99"] = func(p stats.Point) (float64, bool) { return f.q(p).P99, f.q(p).Count > 0 }
	}
	if len(lines) != len(want) {
		t.Errorf("%d chart lines on the page, want %d", len(lines), len(want))
	}
	for name, f := range want {
		ln := lines[name]
		if ln == nil {
			t.Errorf("no chart line %s", name)
			continue
		}
		vals := strings.Split(ln.values, ",")
		if len(vals) != len(pts) {
			t.Errorf("%s: %d values, /stats/series has %d points", name, len(vals), len(pts))
			continue
		}
		drawn := 0
		for i, pt := range pts {
			w, has := f(pt)
			got, shown := num(t, vals[i])
			if shown != has || (has && got != w) {
				t.Errorf("%s point %d: page %q, /stats/series %v (shown: %v)", name, i, vals[i], w, has)
			}
			if shown {
				drawn++
			}
		}
		if drawn == 0 || len(ln.points) != drawn {
			t.Errorf("%s: %d points drawn for %d values", name, len(ln.points), drawn)
		}
	}
	for _, fig := range []string{"ttft", "tpot", "itl", "e2e"} {
		y99 := map[float64]float64{}
		for _, xy := range lines[fig+"/p99"].points {
			y99[xy[0]] = xy[1]
		}
		for _, xy := range lines[fig+"/p50"].points {
			if y, ok := y99[xy[0]]; !ok || y > xy[1]+1e-9 || math.IsNaN(y) {
				t.Errorf("%s at x=%g: p99 drawn at y=%g, p50 at y=%g", fig, xy[0], y, xy[1])
			}
		}
	}
}

// checkTeams: one row per team with its spend, requests and rejections.
func checkTeams(t *testing.T, tags []tag, rep stats.Report) {
	t.Helper()
	rows := map[string]map[string]string{}
	for _, tg := range tags {
		if tg.name == "tr" && tg.attrs["data-team"] != "" {
			rows[tg.attrs["data-team"]] = tg.attrs
		}
	}
	n := 0
	for _, g := range rep.Windows[0].Groups {
		if g.Team == "" {
			continue
		}
		n++
		row, ok := rows[g.Team]
		if !ok {
			t.Errorf("no row for team %s", g.Team)
			continue
		}
		cost, _ := num(t, row["data-cost"])
		reqs, _ := num(t, row["data-requests"])
		rej, _ := num(t, row["data-rejected"])
		var reasons []string
		for k, v := range g.Rejections {
			reasons = append(reasons, fmt.Sprintf("%s:%d", k, v))
		}
		slices.Sort(reasons)
		if cost != g.CostUSD || reqs != float64(g.Requests) || rej != float64(g.Populations["refused"]) ||
			row["data-reasons"] != strings.Join(reasons, " ") {
			t.Errorf("team %s row %v, /stats %+v", g.Team, row, g.Figures)
		}
	}
	if n != 2 || len(rows) != n {
		t.Errorf("%d team rows, /stats has %d teams", len(rows), n)
	}
	if rows["ads"]["data-reasons"] != "rpm:3" {
		t.Errorf("team ads rejections %q, want rpm:3", rows["ads"]["data-reasons"])
	}
}

// checkModels: one row per route and model with its requests and TTFT.
func checkModels(t *testing.T, tags []tag, rep stats.Report) {
	t.Helper()
	rows := map[string]map[string]string{}
	for _, tg := range tags {
		if tg.name == "tr" && tg.attrs["data-route"] != "" {
			rows[tg.attrs["data-route"]+"/"+tg.attrs["data-model"]] = tg.attrs
		}
	}
	for _, g := range rep.Windows[0].Groups {
		row, ok := rows[g.Route+"/"+g.Model]
		reqs, _ := num(t, row["data-requests"])
		ttft, has := num(t, row["data-ttft-p50"])
		if !ok || reqs != float64(g.Requests) || has != (g.TTFT.Count > 0) || ttft != g.TTFT.P50 {
			t.Errorf("route/model %s/%s row %v, /stats %d requests TTFT P50 %g", g.Route, g.Model, row, g.Requests, g.TTFT.P50)
		}
	}
	if len(rows) != len(rep.Windows[0].Groups) || len(rows) != 2 {
		t.Errorf("%d route/model rows, /stats has %d", len(rows), len(rep.Windows[0].Groups))
	}
}

// TestDashboardOffline: the page and its assets name no other origin, and
// the Content-Security-Policy forbids loading from one.
func TestDashboardOffline(t *testing.T) {
	w := newWorld(t)
	for _, p := range []string{"/dashboard", "/dashboard/app.js", "/dashboard/app.css"} {
		resp, err := http.Get(w.url + p)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || len(body) == 0 {
			t.Fatalf("%s: %d, %d bytes", p, resp.StatusCode, len(body))
		}
		csp := resp.Header.Get("Content-Security-Policy")
		if !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "connect-src 'self'") ||
			!strings.Contains(csp, "script-src 'self'") {
			t.Errorf("%s: CSP %q", p, csp)
		}
		// The SVG namespace is a name, not a fetch.
		rest := strings.ReplaceAll(string(body), "http://www.w3.org/2000/svg", "")
		if m := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}`).FindString(rest); m != "" {
			t.Errorf("%s names another origin: %s", p, m)
		}
	}
	resp, err := http.Get(w.url + "/dashboard/nope.js")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown asset: %d", resp.StatusCode)
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err = c.Get(w.url + "/dashboard/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != "../dashboard" {
		t.Errorf("/dashboard/: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}
}

// TestDashboardWindow: ?window=1m shows the 1 min window's figures and its
// six 10 s slices.
func TestDashboardWindow(t *testing.T) {
	chrome := chromium(t)
	w := newWorld(t)
	if err := w.openaiStreams(keySearch, 3); err != nil {
		t.Fatal(err)
	}
	w.clock.advance(15 * time.Second)
	dom := dump(t, chrome, w.url+"/dashboard?window=1m", 2*time.Second)
	var all stats.Report
	var series stats.SeriesReport
	getJSON(t, w.url+"/stats?window=1m&merge=route,model,team", &all)
	getJSON(t, w.url+"/stats/series?window=1m&merge=route,model,team", &series)
	tags := parseTags(dom)
	body := tags[slices.IndexFunc(tags, func(tg tag) bool { return tg.name == "body" })]
	if body.attrs["data-window"] != "1m" {
		t.Fatalf("body %v", body.attrs)
	}
	for _, tg := range tags {
		if tg.name == "button" && tg.attrs["data-window"] != "" &&
			(tg.attrs["aria-pressed"] == "true") != (tg.attrs["data-window"] == "1m") {
			t.Errorf("button %s pressed=%q", tg.attrs["data-window"], tg.attrs["aria-pressed"])
		}
	}
	if len(all.Windows) != 1 || all.Windows[0].Name != "1m" || len(all.Windows[0].Groups) != 1 {
		t.Fatalf("/stats?window=1m: %+v", all.Windows)
	}
	g := all.Windows[0].Groups[0]
	if g.Requests != 3 {
		t.Fatalf("/stats counts %d requests, sent 3", g.Requests)
	}
	checkTiles(t, dom, tags, g, all.Windows[0].Seconds)
	checkCharts(t, tags, series)
	if !strings.Contains(dom, "No conversation ended in the last hour.") {
		t.Error("no conversation ended, and the page does not say so")
	}
	if !strings.Contains(dom, "No agent session ended in the last hour.") {
		t.Error("no session ended, and the page does not say so")
	}
}

// TestDashboardRefreshFailure: when /stats refuses (503), the page says so
// in its status line instead of showing stale or empty figures silently.
func TestDashboardRefreshFailure(t *testing.T) {
	chrome := chromium(t)
	w := newWorld(t)
	w.mu.Lock()
	w.failStats = true
	w.mu.Unlock()
	dom := dump(t, chrome, w.url+"/dashboard", 2*time.Second)
	st := statusText(dom)
	if !strings.Contains(st, "refresh failed") || !strings.Contains(st, "HTTP 503") ||
		!strings.Contains(st, "too many /stats requests in flight") {
		t.Errorf("status %q", st)
	}
	if !regexp.MustCompile(`id="status" class="status error"|class="status error" id="status"`).MatchString(dom) {
		t.Errorf("status not marked as an error:\n%s", dom)
	}
	for _, tg := range parseTags(dom) {
		if strings.HasPrefix(tg.attrs["id"], "t-") {
			t.Errorf("tile %s drawn without figures", tg.attrs["id"])
		}
	}
}

// TestDashboardEscapesNames: model names come from callers and reach the
// page through /stats; one that is markup shows as text, never as an
// element or a script. (Only a name that matches a [[models]] pattern and
// that the upstream served has a group of its own, so this one starts with
// a priced prefix.)
func TestDashboardEscapesNames(t *testing.T) {
	chrome := chromium(t)
	w := newWorld(t)
	const hostile = `gpt-test<img src=x onerror="document.body.setAttribute('data-pwned','1')">`
	if err := w.openaiModelStreams(keySearch, hostile, 1); err != nil {
		t.Fatal(err)
	}
	w.clock.advance(12 * time.Second)
	dom := dump(t, chrome, w.url+"/dashboard", 2*time.Second)
	tags := parseTags(dom)
	for _, tg := range tags {
		if tg.name == "img" || tg.attrs["data-pwned"] != "" {
			t.Fatalf("the model name became markup: %v\n%s", tg, dom)
		}
	}
	var found bool
	for _, tg := range tags {
		if tg.name == "tr" && tg.attrs["data-model"] == hostile {
			found = true
		}
	}
	// A text node is serialized with &, < and > escaped (quotes are not).
	asText := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace("chat_completions / " + hostile)
	if !found || !strings.Contains(dom, asText) {
		t.Errorf("the model's row is missing or not shown as text:\n%s", dom)
	}
}
