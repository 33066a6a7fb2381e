package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
)

// populationGroup is the part of a /stats group this test reads.
type populationGroup struct {
	Route string `json:"route"`
	Team  string `json:"team"`
	E2E   struct {
		Count int64   `json:"count"`
		P50   float64 `json:"p50_ms"`
	} `json:"e2e"`
	Goodput struct {
		Total int64 `json:"total"`
	} `json:"goodput"`
	Requests    int64            `json:"requests"`
	Rejections  map[string]int64 `json:"rejections"`
	Populations map[string]int64 `json:"populations"`
}

// The traffic that made the headline figures lie, through a running
// gateway in mode keys: a client with a wrong key, Claude Code's HEAD /, a
// WebSocket upgrade no upstream can take, and real model calls. E2E and
// goodput in /stats are those of the model calls alone; the wrong key's
// 401s are counted as refusals by reason; the refused upgrade is a socket
// refused (websocket_connections_total), no request; HEAD / is in nothing;
// and the records (the access log's lines) and /stats agree population by
// population.
func TestRefusalsAreNoModelCallsInStats(t *testing.T) {
	mock := mockllm.New(mockllm.Options{OutputTokens: 3, TTFT: 30e6, RequireKey: upKey})
	up := httptest.NewServer(mock)
	t.Cleanup(up.Close)
	cfg := govConfig(up.URL)
	cfg.Spend.StateFile = ""
	r := startReplica(t, cfg)
	do := func(method, path, body string, hdr map[string]string) int {
		t.Helper()
		req, err := http.NewRequest(method, r.url+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	anthropic := func(key string) map[string]string {
		return map[string]string{"X-Api-Key": key, "Anthropic-Version": "2023-06-01", "Content-Type": "application/json"}
	}
	const calls, wrong = 4, 10
	for i := range calls {
		if st := do("POST", "/v1/messages", messagesBody(980000+i, true), anthropic(testKeyA)); st != 200 {
			t.Fatalf("model call %d: %d", i, st)
		}
	}
	for i := range wrong {
		if st := do("POST", "/v1/messages", messagesBody(981000+i, true), anthropic("sk-wrong-key-0123456789")); st != 401 {
			t.Fatalf("wrong key %d: %d", i, st)
		}
	}
	if st := do("HEAD", "/", "", nil); st != 200 {
		t.Fatalf("HEAD /: %d", st)
	}
	if st := do("GET", "/v1/responses", "", map[string]string{"Authorization": "Bearer " + testKeyA,
		"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
		"Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}); st != http.StatusUpgradeRequired {
		t.Fatalf("an upgrade no upstream takes: %d, want 426", st)
	}

	recs := r.records()
	byPop := map[string]int64{}
	var modelE2E []float64
	for _, rec := range recs {
		byPop[rec.Population.String()]++
		if rec.Population == llm.PopModelCall {
			modelE2E = append(modelE2E, float64(rec.E2E().Microseconds())/1e3)
		}
		if rec.Population == llm.PopRefused && rec.Goodput != llm.SLOExcluded {
			t.Errorf("refused record %s has goodput %s", rec.RequestID, rec.Goodput)
		}
	}
	if byPop["model_call"] != calls || byPop["refused"] != wrong || len(recs) != calls+wrong {
		t.Fatalf("records by population %v (%d records); want %d model calls and %d refused, HEAD / and the upgrade in none",
			byPop, len(recs), calls, wrong)
	}
	if n, _, _ := seriesSum(t, r, "tollgate_websocket_connections_total", map[string]string{"result": "unsupported"}); n != 1 {
		t.Errorf("websocket_connections_total{result=unsupported} = %v, want the 1 refused upgrade", n)
	}

	resp, err := http.Get(r.url + "/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc struct {
		Windows []struct {
			Name   string            `json:"name"`
			Groups []populationGroup `json:"groups"`
		} `json:"windows"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	var e2e, goodput, requests int64
	statsPop, rejections := map[string]int64{}, map[string]int64{}
	for _, w := range doc.Windows {
		if w.Name != "1m" {
			continue
		}
		for _, g := range w.Groups {
			e2e += g.E2E.Count
			goodput += g.Goodput.Total
			requests += g.Requests
			for p, n := range g.Populations {
				statsPop[p] += n
			}
			for reason, n := range g.Rejections {
				rejections[reason] += n
			}
			if g.Team == "none" && g.E2E.Count != 0 {
				t.Errorf("group %s/%s: the wrong key's refusals are in E2E (%d)", g.Route, g.Team, g.E2E.Count)
			}
		}
	}
	if e2e != calls || goodput != calls {
		t.Errorf("/stats E2E over %d requests, goodput over %d; want the %d model calls", e2e, goodput, calls)
	}
	if rejections["unauthorized"] != wrong || len(rejections) != 1 {
		t.Errorf("/stats rejections %v; want %d unauthorized", rejections, wrong)
	}
	if requests != int64(len(recs)) {
		t.Errorf("/stats counts %d requests, the records %d", requests, len(recs))
	}
	for p, n := range byPop {
		if statsPop[p] != n {
			t.Errorf("population %s: /stats %d, records %d", p, statsPop[p], n)
		}
	}
}
