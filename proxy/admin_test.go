package proxy

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/mockllm"
)

const adminToken = "admin-token-for-tests-0123"

// adminGet fetches an admin path with the given bearer token ("" for none).
func adminGet(t *testing.T, base, path, token string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// TestAdminAPI: /admin/* needs the admin token; /admin/spend filters the
// ledger and sums it; /admin/limits shows each limited key and team with
// what is used and left; bad filters are 400s.
func TestAdminAPI(t *testing.T) {
	w := newGovWorld(t, mockllm.Options{OutputTokens: 7}, true, func(c *config.Config) {
		c.Admin.TokenEnv, c.Admin.Token = "ADMIN_TOKEN", adminToken
		c.Keys[0].RPM = i64(10)
		c.Teams[1].TokensPerDay = i64(100000)
		c.Teams[1].CostPerDayUSD = f64(5)
	})
	ctx := testCtx(t)
	for _, k := range []string{keyAlpha, keyBeta, keyBeta} {
		if _, err := w.openai(k).Chat.Completions.New(ctx, chatParams(0)); err != nil {
			t.Fatal(err)
		}
		w.tg.record(t)
	}

	for _, tok := range []string{"", "wrong-token", adminToken + "x"} {
		if code, body := adminGet(t, w.tg.URL, "/admin/spend", tok); code != http.StatusUnauthorized ||
			strings.Contains(string(body), adminToken) {
			t.Errorf("token %q: %d %s", tok, code, body)
		}
	}

	code, body := adminGet(t, w.tg.URL, "/admin/spend", adminToken)
	if code != http.StatusOK {
		t.Fatalf("/admin/spend: %d %s", code, body)
	}
	var all SpendReport
	if err := json.Unmarshal(body, &all); err != nil {
		t.Fatal(err)
	}
	if len(all.Rows) != 2 || all.Total.Requests != 3 {
		t.Fatalf("/admin/spend: %d rows, %d requests; want 2 rows (alpha, beta), 3 requests: %s", len(all.Rows),
			all.Total.Requests, body)
	}
	var sumIn, sumCost int64
	for _, r := range all.Rows {
		sumIn += r.InputTokens
		sumCost += r.CostMicros
		if r.Day != "2026-11-30" || r.Model != "gpt-test" || r.OutputTokens == 0 || r.CostMicros == 0 {
			t.Errorf("row %+v", r)
		}
	}
	if all.Total.InputTokens != sumIn || all.Total.CostMicros != sumCost {
		t.Errorf("total %+v is not the sum of the rows", all.Total)
	}

	code, body = adminGet(t, w.tg.URL, "/admin/spend?team=ads&from=2026-11-30&to=2026-11-30", adminToken)
	var ads SpendReport
	if err := json.Unmarshal(body, &ads); code != http.StatusOK || err != nil {
		t.Fatalf("team filter: %d %v %s", code, err, body)
	}
	if len(ads.Rows) != 1 || ads.Rows[0].KeyID != "beta" || ads.Rows[0].Requests != 2 {
		t.Errorf("team=ads: %+v", ads.Rows)
	}
	code, body = adminGet(t, w.tg.URL, "/admin/spend?from=2026-12-01", adminToken)
	var none SpendReport
	if err := json.Unmarshal(body, &none); code != http.StatusOK || err != nil || len(none.Rows) != 0 {
		t.Errorf("from a later day: %d %s", code, body)
	}
	for _, q := range []string{"from=yesterday", "to=2026-13-01", "from=2026-12-02&to=2026-12-01"} {
		if code, body := adminGet(t, w.tg.URL, "/admin/spend?"+q, adminToken); code != http.StatusBadRequest {
			t.Errorf("%s: %d %s", q, code, body)
		}
	}

	code, body = adminGet(t, w.tg.URL, "/admin/limits", adminToken)
	var lim LimitsReport
	if err := json.Unmarshal(body, &lim); code != http.StatusOK || err != nil {
		t.Fatalf("/admin/limits: %d %v %s", code, err, body)
	}
	find := func(scope, id, limit string) *LimitState {
		for _, s := range lim.Subjects {
			if s.Scope != scope || s.ID != id {
				continue
			}
			for i := range s.Limits {
				if s.Limits[i].Limit == limit {
					return &s.Limits[i]
				}
			}
		}
		return nil
	}
	if l := find("key", "alpha", "rpm"); l == nil || l.Max != 10 || l.Used != 1 || l.Remaining != 9 {
		t.Errorf("alpha rpm: %+v (%s)", l, body)
	}
	if l := find("team", "ads", "tokens_per_day"); l == nil || l.Used != ads.Rows[0].InputTokens+ads.Rows[0].OutputTokens ||
		l.Remaining != 100000-l.Used || l.ResetAt != "2026-12-01T00:00:00Z" {
		t.Errorf("ads tokens_per_day: %+v, spent %+v", l, ads.Rows[0])
	}
	if l := find("team", "ads", "cost_per_day"); l == nil || l.Used != ads.Rows[0].CostMicros || l.Max != 5_000_000 {
		t.Errorf("ads cost_per_day: %+v, spent %d µ$", l, ads.Rows[0].CostMicros)
	}
	if find("team", "search", "rpm") != nil {
		t.Error("team search has no limits but is listed")
	}

	// The same state as metrics, read at scrape time.
	w.tg.registry.MustRegister(w.tg.gw.BudgetCollector(nil))
	tokLeft := find("team", "ads", "tokens_per_day").Remaining
	if got := metricValue(t, w.tg, "tollgate_budget_remaining_tokens", map[string]string{"team": "ads", "window": "day"}); got != float64(tokLeft) {
		t.Errorf("tollgate_budget_remaining_tokens{ads,day} = %v, want %d", got, tokLeft)
	}
	usdLeft := float64(5_000_000-ads.Rows[0].CostMicros) / 1e6
	if got := metricValue(t, w.tg, "tollgate_budget_remaining_usd", map[string]string{"team": "ads", "window": "day"}); got != usdLeft {
		t.Errorf("tollgate_budget_remaining_usd{ads,day} = %v, want %v", got, usdLeft)
	}
	if got := metricValue(t, w.tg, "tollgate_budget_remaining_usd", map[string]string{"team": "search"}); got != -1 {
		t.Errorf("team search has no budget but is exported: %v", got)
	}
}

// TestAdminServesProfiles: the runtime's profiles are the admin's alone, in
// pprof's format or as text, and an unknown one is refused.
func TestAdminServesProfiles(t *testing.T) {
	up := httptest.NewServer(mockllm.New(mockllm.Options{}))
	t.Cleanup(up.Close)
	tg := newTestGateway(t, up.URL, func(c *config.Config) {
		c.Admin.TokenEnv, c.Admin.Token = "ADMIN_TOKEN", adminToken
	})
	if code, _ := adminGet(t, tg.URL, "/admin/debug/pprof/heap", ""); code != http.StatusUnauthorized {
		t.Errorf("heap profile without the admin token: %d, want 401", code)
	}
	for _, p := range []string{"/admin/debug/pprof/heap", "/admin/debug/pprof/allocs", "/admin/debug/pprof/profile?seconds=1"} {
		code, body := adminGet(t, tg.URL, p, adminToken)
		if code != http.StatusOK || len(body) < 2 || body[0] != 0x1f || body[1] != 0x8b { // a gzipped profile.proto
			t.Errorf("%s: %d, %d bytes (%.40q), want 200 and a gzipped profile", p, code, len(body), body)
		}
	}
	code, body := adminGet(t, tg.URL, "/admin/debug/pprof/goroutine?debug=1", adminToken)
	if code != http.StatusOK || !strings.Contains(string(body), "goroutine profile: total") {
		t.Errorf("goroutine profile as text: %d, %.80q", code, body)
	}
	for _, p := range []string{"/admin/debug/pprof/cmdline", "/admin/debug/pprof/nosuch"} {
		if code, body := adminGet(t, tg.URL, p, adminToken); code != http.StatusNotFound || !strings.Contains(string(body), "no such profile") {
			t.Errorf("%s: %d %s, want 404 naming the profiles there are", p, code, body)
		}
	}
}

// TestAdminAPIOffWithoutToken: with no [admin] token_env the admin routes do
// not exist.
func TestAdminAPIOffWithoutToken(t *testing.T) {
	up := httptest.NewServer(mockllm.New(mockllm.Options{}))
	t.Cleanup(up.Close)
	tg := newTestGateway(t, up.URL, nil)
	for _, p := range []string{"/admin/spend", "/admin/limits", "/admin/debug/pprof/heap"} {
		if code, _ := adminGet(t, tg.URL, p, adminToken); code != http.StatusNotFound {
			t.Errorf("%s without an admin token configured: %d, want 404", p, code)
		}
	}
}

// POST /admin/reload: a body is a document to check only with check=true;
// any other check value is refused, and a body without check=true too,
// since the file on disk would be swapped in while the document was
// ignored.
func TestAdminReloadTakesADocumentOnlyToCheckIt(t *testing.T) {
	upstream := httptest.NewServer(newGateUpstream(openAIRole, openAIDone))
	defer upstream.Close()
	type call struct {
		doc  string
		name string
	}
	var calls []call
	tg := newTestGatewayWith(t, upstream.URL, func(c *config.Config) {
		c.Admin.TokenEnv, c.Admin.Token = "ADMIN_TOKEN", adminToken
	}, func(o *Options) {
		o.Reload = func(doc []byte, name string) ([]string, error) {
			calls = append(calls, call{string(doc), name})
			return []string{"keys"}, nil
		}
	})
	auth := map[string]string{"Authorization": "Bearer " + adminToken}
	cases := []struct {
		query, body string
		status      int
		want        *call // the Reload call made, nil: none
		result      string
	}{
		{"", "", http.StatusOK, &call{"", ""}, `"result": "reloaded"`},
		{"?check=false", "", http.StatusOK, &call{"", ""}, `"result": "reloaded"`},
		{"?check=true&name=new.toml", "[server]\n", http.StatusOK, &call{"[server]\n", "new.toml"}, `"result": "valid"`},
		{"?check=1", "[server]\n", http.StatusOK, &call{"[server]\n", "posted config"}, `"result": "valid"`},
		{"?check=yes", "[server]\n", http.StatusBadRequest, nil, "check must be true or false"},
		{"?check=true", "", http.StatusBadRequest, nil, "needs the config document"},
		{"", "[server]\n", http.StatusBadRequest, nil, "takes no body"},
	}
	for _, tc := range cases {
		calls = nil
		resp, body := post(t, tg.URL+"/admin/reload"+tc.query, tc.body, auth)
		if resp.StatusCode != tc.status || !strings.Contains(string(body), tc.result) {
			t.Errorf("POST /admin/reload%s with %q: %d %s, want %d %s", tc.query, tc.body, resp.StatusCode, body, tc.status, tc.result)
		}
		switch {
		case tc.want == nil && len(calls) > 0:
			t.Errorf("POST /admin/reload%s with %q reloaded: %+v", tc.query, tc.body, calls)
		case tc.want != nil && (len(calls) != 1 || calls[0] != *tc.want):
			t.Errorf("POST /admin/reload%s with %q: calls %+v, want %+v", tc.query, tc.body, calls, *tc.want)
		}
	}
	if resp, _ := post(t, tg.URL+"/admin/reload", "", nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("POST /admin/reload without the admin token: %d", resp.StatusCode)
	}
}
