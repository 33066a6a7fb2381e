package ratelimit

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/internal/atomicfile"
)

// spillKinds returns the kinds of the operations in the spill file name.
func spillKinds(t *testing.T, name string) []string {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	var sf spillFile
	if err := atomicfile.DecodeJSON(data, &sf); err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, o := range sf.Ops {
		kinds = append(kinds, o.Kind)
	}
	return kinds
}

func waitGone(t *testing.T, name string) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		_, err := os.Stat(name)
		if errors.Is(err, fs.ErrNotExist) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("spill file %s never removed: %v", name, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFailoverSpillAcrossRestart is a rolling restart during an outage: a
// replica closes while Redis is down with an undo, a settlement and a
// charge of fallback usage queued; they go to its spill file instead of
// being dropped. Redis comes back, the next replica on the same file
// replays them once its primary answers, and Redis's budgets and
// concurrency end as if there had been no restart. The file is then
// removed; a copy of it replayed again (a crash before the removal)
// changes nothing.
func TestFailoverSpillAcrossRestart(t *testing.T) {
	srv := startPersistentRedisServer(t)
	client := srv.clientWith(t, noRetry)
	spill := filepath.Join(t.TempDir(), "ratelimit-spill.json")
	open := func() *Failover {
		return newTestFailover(t, FailoverOptions{Primary: NewRedis(client, RedisOptions{}),
			Fallback: NewLocal(LocalOptions{}), SpillFile: spill})
	}
	ctx := context.Background()
	key := keySubject("spill", Limits{Concurrency: 5, TokensPerDay: 1e6, CostPerDayMicros: 1e6})
	team := teamSubject("spill", Limits{CostPerMonthMicros: 1e6})
	req := Request{Subjects: []Subject{key, team}, Tokens: 1000, CostMicros: 100}
	redisState := func() [4]int64 {
		p := NewRedis(client, RedisOptions{})
		held := func(st State) int64 { return st.Used + st.Reserved }
		return [4]int64{peekKind(t, p, key, KindConcurrency).Used, held(peekKind(t, p, key, KindTokensPerDay)),
			held(peekKind(t, p, key, KindCostPerDay)), held(peekKind(t, p, team, KindCostPerMonth))}
	}

	f1 := open()
	a := mustAdmit(t, f1, req)
	if a.Lease.issuer == f1.fallback {
		t.Fatal("Redis is up, but the fallback admitted")
	}
	srv.kill()
	b := mustAdmit(t, f1, req) // queues the undo of its attempted Redis admission
	if b.Lease.issuer != f1.fallback {
		t.Fatal("Redis is down, but the fallback did not admit")
	}
	mustSettle(t, f1, a.Lease, 300, 30)
	mustSettle(t, f1, b.Lease, 200, 1000)
	if f1.Pending() != 3 {
		t.Fatalf("pending %d, want an undo, a settlement and a charge", f1.Pending())
	}
	if err := f1.Retry(ctx); err == nil {
		t.Fatal("Retry with Redis down reported no error")
	}
	if err := f1.Close(); err != nil {
		t.Fatalf("Close with Redis down: %v", err)
	}
	if f1.Pending() != 0 || f1.Dropped() != 0 {
		t.Fatalf("after Close: pending %d, dropped %d; want 0, 0", f1.Pending(), f1.Dropped())
	}
	st, err := os.Stat(spill)
	if err != nil {
		t.Fatalf("no spill file: %v", err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("spill file mode %v, want 0600", st.Mode().Perm())
	}
	if got := strings.Join(spillKinds(t, spill), ","); got != "undo,settle,charge" {
		t.Fatalf("spilled %s, want undo,settle,charge", got)
	}
	saved, err := os.ReadFile(spill)
	if err != nil {
		t.Fatal(err)
	}

	srv.restart()
	// Redis remembers the admission of a (persistent), not what followed.
	if got := redisState(); got != [4]int64{1, 1000, 100, 100} {
		t.Fatalf("Redis before the replay: %v, want a's lease and reservation", got)
	}
	f2 := open()
	if f2.Pending() != 3 {
		t.Fatalf("pending %d after loading the spill file, want 3", f2.Pending())
	}
	c := mustAdmit(t, f2, req) // the primary answers: the replay starts
	if c.Lease.issuer == f2.fallback {
		t.Fatal("the fallback admitted with Redis up")
	}
	waitGone(t, spill)
	mustSettle(t, f2, c.Lease, 0, 0)
	// a settled to 300 and 30 µ$, b's 200 tokens and 1000 µ$ charged.
	want := [4]int64{0, 500, 1030, 1030}
	if got := redisState(); got != want || f2.Pending() != 0 || f2.Dropped() != 0 {
		t.Fatalf("Redis after the replay: %v, want %v; pending %d, dropped %d", got, want, f2.Pending(), f2.Dropped())
	}

	if err := os.WriteFile(spill, saved, 0o600); err != nil {
		t.Fatal(err)
	}
	f3 := open()
	if err := f3.Retry(ctx); err != nil {
		t.Fatal(err)
	}
	if f3.Pending() != 0 {
		t.Fatalf("pending %d", f3.Pending())
	}
	waitGone(t, spill)
	if got := redisState(); got != want {
		t.Fatalf("Redis after replaying the spill file again: %v, want %v (counted once)", got, want)
	}
}

// TestFailoverSpillAgain: a replica that loaded a spill file and closes
// before Redis is back writes the file again, with its own queue behind
// the loaded operations, so nothing is lost over two restarts.
func TestFailoverSpillAgain(t *testing.T) {
	srv := startRedisServer(t)
	client := srv.clientWith(t, noRetry)
	spill := filepath.Join(t.TempDir(), "spill.json")
	open := func() *Failover {
		return newTestFailover(t, FailoverOptions{Primary: NewRedis(client, RedisOptions{}),
			Fallback: NewLocal(LocalOptions{}), SpillFile: spill})
	}
	key := keySubject("again", Limits{CostPerDayMicros: 1e6})
	req := Request{Subjects: []Subject{key}, CostMicros: 100}
	srv.kill()
	f1 := open()
	mustSettle(t, f1, mustAdmit(t, f1, req).Lease, 0, 10)
	if err := f1.Close(); err != nil {
		t.Fatal(err)
	}
	f2 := open()
	mustSettle(t, f2, mustAdmit(t, f2, req).Lease, 0, 20)
	if err := f2.Close(); err != nil {
		t.Fatal(err)
	}
	// Each admission queued an undo and a charge.
	if got := strings.Join(spillKinds(t, spill), ","); got != "undo,charge,undo,charge" {
		t.Fatalf("spilled %s", got)
	}
	srv.restart()
	f3 := open()
	if err := f3.Retry(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitGone(t, spill)
	if st := peekKind(t, NewRedis(client, RedisOptions{}), key, KindCostPerDay); st.Used != 30 {
		t.Fatalf("cost per day %+v, want both outages' 30", st)
	}
}

// TestFailoverSpillWriteFails: a spill file that cannot be written fails
// Close, and its operations are counted as dropped.
func TestFailoverSpillWriteFails(t *testing.T) {
	srv := startRedisServer(t)
	spill := filepath.Join(t.TempDir(), "missing", "spill.json")
	f := newTestFailover(t, FailoverOptions{Primary: NewRedis(srv.clientWith(t, noRetry), RedisOptions{}),
		Fallback: NewLocal(LocalOptions{}), SpillFile: spill})
	srv.kill()
	mustSettle(t, f, mustAdmit(t, f, Request{Subjects: []Subject{keySubject("w", Limits{TokensPerDay: 10})}, Tokens: 1}).Lease, 1, 0)
	if err := f.Close(); err == nil || !strings.Contains(err.Error(), spill) {
		t.Fatalf("Close with an unwritable spill file: %v", err)
	}
	if f.Dropped() != 2 {
		t.Fatalf("dropped %d, want the undo and the charge", f.Dropped())
	}
}

// validSpill is a spill file with one operation of each kind.
const validSpill = `{"version": 1, "saved_at": "2026-11-30T12:00:00Z", "ops": [
 {"kind": "settle", "lease_id": "aa", "subjects": [{"scope": "key", "id": "k", "limits": {"concurrency": 2, "tokens_per_day": 100}}],
  "at": "2026-11-30T11:00:00Z", "estimate_tokens": 10, "estimate_cost_micros": 0,
  "holds": [{"tokens_per_day": 10, "cost_per_day": 0, "cost_per_month": 0, "kept": false}], "tokens": 5, "cost_micros": 0},
 {"kind": "undo", "lease_id": "bb", "subjects": [{"scope": "team", "id": "t", "limits": {"tpm": 60}}],
  "at": "2026-11-30T11:00:00Z", "estimate_tokens": 10, "estimate_cost_micros": 0, "tokens": 0, "cost_micros": 0},
 {"kind": "charge", "charge_id": "cc", "subjects": [{"scope": "key", "id": "k", "limits": {"cost_per_day_micros": 100}}],
  "at": "2026-11-30T11:00:00Z", "estimate_tokens": 0, "estimate_cost_micros": 7, "tokens": 0, "cost_micros": 7}
]}`

// TestFailoverSpillCorrupt: NewFailover refuses a spill file it cannot
// trust, naming it, rather than starting without its operations.
func TestFailoverSpillCorrupt(t *testing.T) {
	srv := startRedisServer(t)
	client := srv.client(t)
	dir := t.TempDir()
	load := func(name, content string) (*Failover, error) {
		spill := filepath.Join(dir, name)
		if err := os.WriteFile(spill, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return NewFailover(FailoverOptions{Primary: NewRedis(client, RedisOptions{}),
			Fallback: NewLocal(LocalOptions{}), SpillFile: spill})
	}
	f, err := load("valid.json", validSpill)
	if err != nil {
		t.Fatalf("valid spill file: %v", err)
	}
	if f.Pending() != 3 {
		t.Fatalf("pending %d, want 3", f.Pending())
	}
	_ = f.Close()

	for i, c := range []struct{ name, old, new string }{
		{"truncated", `]}`, ``},
		{"not-json", validSpill, "garbage"},
		{"trailing", `]}`, `]} {}`},
		{"unknown-field", `"version": 1,`, `"version": 1, "extra": 1,`},
		{"version", `"version": 1`, `"version": 2`},
		{"no-ops", validSpill, `{"version": 1, "saved_at": "2026-11-30T12:00:00Z", "ops": []}`},
		{"kind", `"kind": "undo"`, `"kind": "refund"`},
		{"undo-usage", `"estimate_cost_micros": 0, "tokens": 0`, `"estimate_cost_micros": 0, "tokens": 3`},
		{"no-lease", `"lease_id": "aa"`, `"lease_id": ""`},
		{"no-charge-id", `"charge_id": "cc"`, `"charge_id": ""`},
		{"scope", `"scope": "team"`, `"scope": "org"`},
		{"negative", `"cost_micros": 7}`, `"cost_micros": -7}`},
		{"holds", `"kept": false}]`, `"kept": false}, {"tokens_per_day": 1, "cost_per_day": 0, "cost_per_month": 0, "kept": false}]`},
		{"no-at", `"at": "2026-11-30T11:00:00Z", "estimate_tokens": 10, "estimate_cost_micros": 0, "tokens": 0`,
			`"at": "0001-01-01T00:00:00Z", "estimate_tokens": 10, "estimate_cost_micros": 0, "tokens": 0`},
	} {
		content := strings.Replace(validSpill, c.old, c.new, 1)
		if content == validSpill {
			t.Fatalf("case %s changes nothing", c.name)
		}
		name := c.name + ".json"
		f, err := load(name, content)
		if err == nil || f != nil || !strings.Contains(err.Error(), name) {
			t.Errorf("case %d %s: NewFailover = %v, %v; want an error naming the file", i, c.name, f, err)
		}
	}

	// A repeated charge id would be skipped as applied: refused too.
	dup := strings.Replace(validSpill, `"cost_micros": 7}`, `"cost_micros": 7},
 {"kind": "charge", "charge_id": "cc", "subjects": [{"scope": "key", "id": "k", "limits": {"cost_per_day_micros": 100}}],
  "at": "2026-11-30T11:00:00Z", "estimate_tokens": 0, "estimate_cost_micros": 7, "tokens": 0, "cost_micros": 7}`, 1)
	if _, err := load("dup.json", dup); err == nil || !strings.Contains(err.Error(), "repeated charge id") {
		t.Errorf("repeated charge id: %v", err)
	}
	// Charges need a primary that takes them.
	spill := filepath.Join(dir, "valid.json")
	if err := os.WriteFile(spill, []byte(validSpill), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := NewFailover(FailoverOptions{Primary: NewLocal(LocalOptions{}), Fallback: NewLocal(LocalOptions{}),
		SpillFile: spill}); err == nil {
		t.Error("charges loaded for a primary that takes none")
	}
}

// TestFailoverNoSpillFile: without a spill file, or with one that does not
// exist yet, nothing is loaded; and a Close with nothing queued writes none.
func TestFailoverNoSpillFile(t *testing.T) {
	srv := startRedisServer(t)
	spill := filepath.Join(t.TempDir(), "spill.json")
	f := newTestFailover(t, FailoverOptions{Primary: NewRedis(srv.clientWith(t, noRetry), RedisOptions{}),
		Fallback: NewLocal(LocalOptions{}), SpillFile: spill})
	if f.Pending() != 0 {
		t.Fatalf("pending %d", f.Pending())
	}
	mustSettle(t, f, mustAdmit(t, f, Request{Subjects: []Subject{keySubject("n", Limits{Concurrency: 1})}}).Lease, 0, 0)
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(spill); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("spill file after a clean Close: %v", err)
	}
}

// TestSpillRoundTrip writes every kind of queued operation and reads it
// back: the leases carry what a replay needs.
func TestSpillRoundTrip(t *testing.T) {
	primary := NewLocal(LocalOptions{})
	at := time.Date(2026, 11, 30, 23, 59, 59, 123456000, time.UTC)
	subjects := []Subject{keySubject("k", Limits{RPM: 1, TPM: 2, Concurrency: 3, TokensPerDay: 4, CostPerDayMicros: 5, CostPerMonthMicros: 6}),
		teamSubject("t", Limits{TokensPerDay: 7})}
	settled := &Lease{ID: "s", Subjects: subjects, Tokens: 100, CostMicros: 10, At: at,
		holds: []hold{{tpd: 4, cpd: 5, cpm: 6, kept: true}, {tpd: 7}}}
	undone := &Lease{ID: "u", Subjects: subjects[:1], Tokens: 50, CostMicros: 5, At: at}
	ops := []pendingOp{
		{kind: opSettle, lease: settled, tokens: 90, costMicros: 9, attempts: 2},
		{kind: opUndo, lease: undone},
		{kind: opCharge, lease: &Lease{Subjects: subjects, At: at, Tokens: 8, CostMicros: 3}, tokens: 7, costMicros: 2, chargeID: "c"},
	}
	name := filepath.Join(t.TempDir(), "spill.json")
	if err := writeSpill(name, ops); err != nil {
		t.Fatal(err)
	}
	sf, err := readSpill(name)
	if err != nil {
		t.Fatal(err)
	}
	got, err := sf.pendingOps(primary)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(ops) {
		t.Fatalf("%d ops, want %d", len(got), len(ops))
	}
	for i, g := range got {
		w := ops[i]
		gl, wl := g.lease, w.lease
		if g.kind != w.kind || g.tokens != w.tokens || g.costMicros != w.costMicros || g.chargeID != w.chargeID ||
			!g.spilled || g.attempts != 0 {
			t.Errorf("op %d: %+v, want %+v", i, g, w)
		}
		if gl.ID != wl.ID || gl.Tokens != wl.Tokens || gl.CostMicros != wl.CostMicros || !gl.At.Equal(wl.At) ||
			len(gl.Subjects) != len(wl.Subjects) {
			t.Errorf("op %d lease: %+v, want %+v", i, gl, wl)
			continue
		}
		for j := range gl.Subjects {
			if gl.Subjects[j] != wl.Subjects[j] {
				t.Errorf("op %d subject %d: %+v, want %+v", i, j, gl.Subjects[j], wl.Subjects[j])
			}
		}
		if len(gl.holds) != len(wl.holds) {
			t.Errorf("op %d holds %+v, want %+v", i, gl.holds, wl.holds)
		}
		for j := range gl.holds {
			if gl.holds[j] != wl.holds[j] {
				t.Errorf("op %d hold %d: %+v, want %+v", i, j, gl.holds[j], wl.holds[j])
			}
		}
		if wantIssuer := Limiter(primary); w.kind == opCharge && gl.issuer != nil || w.kind != opCharge && gl.issuer != wantIssuer {
			t.Errorf("op %d issuer %v", i, gl.issuer)
		}
	}
	var raw map[string]any
	data, _ := os.ReadFile(name)
	if err := json.Unmarshal(data, &raw); err != nil || raw["version"] != float64(spillVersion) {
		t.Fatalf("file %s: %v", data, err)
	}
}
