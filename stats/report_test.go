package stats

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/llm"
)

// served returns a Windows with two teams on two routes plus ITL.
func served(t *testing.T) *Windows {
	t.Helper()
	clk := newFakeClock()
	w := New(clk.now)
	clk.advance(20 * time.Second)
	slo := llm.SLOTargets{TTFT: 500 * time.Millisecond}
	w.Observe(record(clk.now(), okStream("alpha", 100*time.Millisecond, time.Second, 10), slo), "gpt")
	w.Observe(record(clk.now(), okStream("beta", 700*time.Millisecond, time.Second, 10), slo), "gpt")
	rec := record(clk.now(), okStream("alpha", 100*time.Millisecond, time.Second, 10), slo)
	rec.Route = llm.RouteMessages
	w.Observe(rec, "claude")
	w.ObserveITL(llm.RouteChatCompletions, "gpt", 20*time.Millisecond)
	w.ObserveITL(llm.RouteMessages, "claude", 30*time.Millisecond)
	return w
}

func get(t *testing.T, h http.Handler, method, target string) *httptest.ResponseRecorder {
	t.Helper()
	rr := httptest.NewRecorder()
	h.ServeHTTP(rr, httptest.NewRequest(method, target, nil))
	return rr
}

// TestHTTPShape checks the JSON field names a reader (bench, dashboard)
// depends on.
func TestHTTPShape(t *testing.T) {
	rr := get(t, served(t), http.MethodGet, "/stats")
	if rr.Code != http.StatusOK || rr.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, content type %q", rr.Code, rr.Header().Get("Content-Type"))
	}
	var doc map[string]any
	if err := json.Unmarshal(rr.Body.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	keys := func(v any) string {
		m, ok := v.(map[string]any)
		if !ok {
			return fmt.Sprintf("not an object: %T", v)
		}
		var ks []string
		for k := range m {
			ks = append(ks, k)
		}
		slices.Sort(ks)
		return strings.Join(ks, ",")
	}
	if got := keys(doc); got != "conversations,generated,sessions,sketch,windows" {
		t.Errorf("report keys %s", got)
	}
	if got := keys(doc["sketch"]); got != "kind,relative_error" {
		t.Errorf("sketch keys %s", got)
	}
	if sk := doc["sketch"].(map[string]any); sk["kind"] != "log-linear" || sk["relative_error"] != 0.001 {
		t.Errorf("sketch = %v", sk)
	}
	wins := doc["windows"].([]any)
	var names []string
	for _, w := range wins {
		names = append(names, w.(map[string]any)["name"].(string))
		if got := keys(w); got != "groups,name,seconds" {
			t.Errorf("window keys %s", got)
		}
	}
	if fmt.Sprint(names) != "[1m 5m 1h]" {
		t.Errorf("windows %v", names)
	}
	g := wins[0].(map[string]any)["groups"].([]any)[0]
	if got := keys(g); got != "cost_usd,e2e,goodput,input_tokens,itl,model,outcomes,output_tokens,output_tokens_per_second,overhead,populations,rejections,requests,route,team,tpot,ttft" {
		t.Errorf("group keys %s", got)
	}
	gm := g.(map[string]any)
	if got := keys(gm["ttft"]); got != "count,max_ms,mean_ms,p50_ms,p95_ms,p99_ms" {
		t.Errorf("quantile keys %s", got)
	}
	if got := keys(gm["goodput"]); got != "broken,good,ratio,total" {
		t.Errorf("goodput keys %s", got)
	}
	if got := keys(gm["goodput"].(map[string]any)["broken"]); got != "e2e,failed,tpot,ttft" {
		t.Errorf("broken keys %s", got)
	}

	var rep Report
	if err := json.Unmarshal(rr.Body.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	beta, ok := findGroup(rep.Windows[0], "chat_completions", "gpt", "beta")
	if !ok || beta.Goodput.Broken["ttft"] != 1 || beta.Goodput.Good != 0 || beta.Requests != 1 || beta.TTFT.Count != 1 {
		t.Errorf("beta group round trip = %+v", beta)
	}
	if rep.Windows[0].Seconds != 20 {
		t.Errorf("1m seconds %g, want 20", rep.Windows[0].Seconds)
	}
}

func TestHTTPFilters(t *testing.T) {
	w := served(t)
	for _, tc := range []struct {
		query   string
		windows string
		groups  string // of the first window
	}{
		{"", "[1m 5m 1h]", "[chat_completions/gpt/ chat_completions/gpt/alpha chat_completions/gpt/beta messages/claude/ messages/claude/alpha]"},
		{"window=5m", "[5m]", "[chat_completions/gpt/ chat_completions/gpt/alpha chat_completions/gpt/beta messages/claude/ messages/claude/alpha]"},
		{"route=messages", "[1m 5m 1h]", "[messages/claude/ messages/claude/alpha]"},
		{"model=gpt&window=1h", "[1h]", "[chat_completions/gpt/ chat_completions/gpt/alpha chat_completions/gpt/beta]"},
		// A team keeps the team-less ITL groups.
		{"team=beta", "[1m 5m 1h]", "[chat_completions/gpt/ chat_completions/gpt/beta messages/claude/]"},
		{"team=beta&model=gpt", "[1m 5m 1h]", "[chat_completions/gpt/ chat_completions/gpt/beta]"},
		{"model=nope", "[1m 5m 1h]", "[]"},
	} {
		rr := get(t, w, http.MethodGet, "/stats?"+tc.query)
		var rep Report
		if err := json.Unmarshal(rr.Body.Bytes(), &rep); err != nil {
			t.Fatalf("%s: %v", tc.query, err)
		}
		var wins, groups []string
		for _, win := range rep.Windows {
			wins = append(wins, win.Name)
		}
		for _, g := range rep.Windows[0].Groups {
			groups = append(groups, g.Route+"/"+g.Model+"/"+g.Team)
		}
		if fmt.Sprint(wins) != tc.windows || fmt.Sprint(groups) != tc.groups {
			t.Errorf("?%s: windows %v groups %v, want %s %s", tc.query, wins, groups, tc.windows, tc.groups)
		}
	}
	// An empty window lists no groups as [], not null.
	if body := get(t, w, http.MethodGet, "/stats?model=nope&window=1m").Body.String(); !strings.Contains(body, `"groups":[]`) {
		t.Errorf("empty groups encoded as %s", body)
	}
}

func TestHTTPErrors(t *testing.T) {
	w := served(t)
	if rr := get(t, w, http.MethodGet, "/stats?window=2m"); rr.Code != http.StatusBadRequest {
		t.Errorf("window=2m: status %d", rr.Code)
	}
	rr := get(t, w, http.MethodPost, "/stats")
	if rr.Code != http.StatusMethodNotAllowed || rr.Header().Get("Allow") != "GET, HEAD" {
		t.Errorf("POST: status %d, Allow %q", rr.Code, rr.Header().Get("Allow"))
	}
	if rr := get(t, w, http.MethodHead, "/stats"); rr.Code != http.StatusOK || rr.Body.Len() != 0 {
		t.Errorf("HEAD: status %d, %d body bytes", rr.Code, rr.Body.Len())
	}
}
