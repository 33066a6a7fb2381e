package main

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/internal/redistest"
	"github.com/tollgate-llm/tollgate/mockllm"
)

// TestKillNineLosesNothingWithRedis is TestKillNineLosesNothing with the
// ledger in Redis: the built gateway, under bounded load, is killed with
// SIGKILL at random moments, between and during its flushes to Redis, and
// restarted on the same [redis] spill_dir each time. Redis's ledger must
// then hold every request the killed gateways logged as billed, and beyond
// them only whole requests that were open at a kill: what a kill caught
// aggregated in memory, or cut into batches not yet (or already) applied,
// is sent by the next start from its journal, once.
func TestKillNineLosesNothingWithRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	const (
		kills   = 4
		workers = 3
		maxReqs = 20000 // over the whole run, all workers
	)
	rng := killMoments(t)

	srv := redistest.Start(t)
	bin := buildGateway(t)
	up := httptest.NewServer(mockllm.New(mockllm.Options{OutputTokens: 1000, ITL: time.Millisecond, RequireKey: upKey}))
	defer up.Close()
	uA, uB := reserved(messagesBody(0, false)), reserved(messagesBody(0, true))
	dir := t.TempDir()
	addr := freeAddr(t)
	cfg := killConfig(addr, up.URL, fmt.Sprintf(`[redis]
addrs = [%q]
spill_dir = %q

[spend]
flush_interval_seconds = 2
`, srv.Addr(), dir), "", "")
	kr := newKillRun(t, bin, cfg, dir, addr)
	lk := newKillLoad(addr, maxReqs)
	kr.start()
	lk.run(testKeyA, "a", false, workers)
	lk.run(testKeyB, "b", true, workers)
	// Random moments up to two flush intervals: mid-aggregation, mid-send.
	kr.killAndRestart(rng, kills, 500*time.Millisecond, 3500*time.Millisecond)
	time.Sleep(time.Second) // the last run, started on the last kill's journal, serves load too
	lk.stop()
	kr.stopLast()
	// A new gateway answers /admin/spend from Redis.
	kr.start()
	ledger, rep := spendViaCLI(t, bin, addr, kr.env)
	if rep.Partial {
		t.Fatalf("/admin/spend is partial (%s): Redis should be readable", rep.Note)
	}
	logged := kr.billed()
	replays := 0
	for _, p := range kr.procs[1 : len(kr.procs)-1] {
		if strings.Contains(p.stderr(), "spend from the journal will be written to Redis") {
			replays++
		}
	}
	t.Logf("%d of %d starts after a kill sent spend from the journal", replays, kills)
	for _, key := range []string{"a", "b"} {
		u := map[string]int64{"a": uA, "b": uB}[key]
		// Key a's answers are written at the end of the handler, after
		// billing and its log line: a kill between the two cuts an answer
		// that was billed. That is the proxy's order, not the ledger's.
		checkBilled(t, key, u, lk.stats[key], logged, ledger[key], lk.stats[key].broken.Load())
	}
}
