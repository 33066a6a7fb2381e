package spend

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// faults is a hook that can make Redis look down (every command fails
// without running) or lose the reply of the next script after it ran. It
// records the batch marker of every script that ran.
type faults struct {
	down     atomic.Bool
	loseNext atomic.Bool
	mu       sync.Mutex
	markers  []string
}

func (h *faults) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *faults) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.down.Load() {
			return errors.New("injected: Redis is down")
		}
		return next(ctx, cmds)
	}
}
func (h *faults) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.down.Load() {
			err := errors.New("injected: Redis is down")
			cmd.SetErr(err)
			return err
		}
		err := next(ctx, cmd)
		if name := cmd.Name(); name != "evalsha" && name != "eval" || err != nil {
			return err
		}
		h.mu.Lock()
		h.markers = append(h.markers, cmd.Args()[3].(string))
		h.mu.Unlock()
		if h.loseNext.CompareAndSwap(true, false) {
			err = errors.New("injected: reply lost after Redis applied the script")
			cmd.SetErr(err)
		}
		return err
	}
}

func (h *faults) ran() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.markers)
}

// readSpillJSON decodes the spill file as written, without the checks of
// readSpill.
func readSpillJSON(t *testing.T, name string) spillFile {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	var sf spillFile
	if err := json.Unmarshal(data, &sf); err != nil {
		t.Fatal(err)
	}
	return sf
}

func spillRows(sf spillFile) int {
	n := 0
	for _, b := range sf.Batches {
		n += len(b.Rows)
	}
	return n
}

func spillIDs(sf spillFile) []string {
	var ids []string
	for _, b := range sf.Batches {
		ids = append(ids, b.ID)
	}
	return ids
}

func mustNotExist(t *testing.T, name string) {
	t.Helper()
	if _, err := os.Stat(name); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("spill file %s: stat = %v, want it removed", name, err)
	}
}

// manyAdds returns n adds to n distinct rows of one team, enough for
// several batches when n > maxBatchRows.
func manyAdds(n int, tag string) []add {
	out := make([]add, n)
	for i := range out {
		out[i] = add{Key{Day: []string{"2026-11-30", "2026-12-01"}[i%2], KeyID: tag + strconv.Itoa(i), Team: "bulk", Model: "m"},
			Totals{Requests: 1, Input: int64(i + 1), Output: 2, CostMicros: int64(3*i + 1)}}
	}
	return out
}

func addAll(l Ledger, adds []add) {
	for _, a := range adds {
		l.Add(a.k, a.t, time.Time{})
	}
}

// TestRedisSpillRecovers: a replica closed while Redis is down spills its
// failed batches and pending rows; the next one, with Redis back, writes
// them exactly once and removes the file.
func TestRedisSpillRecovers(t *testing.T) {
	spill := filepath.Join(t.TempDir(), "spend.spill")
	srv := startRedisServer(t, true)
	r1 := newRedis(t, srv.Client(t), RedisOptions{SpillFile: spill, ReplicaID: "rep"})
	before := sampleAdds()
	addAll(r1, before)
	flush(t, r1)
	mustNotExist(t, spill)

	srv.Kill()
	failed := manyAdds(2*maxBatchRows+5, "f") // three batches that fail
	addAll(r1, failed)
	if err := r1.Flush(context.Background()); err == nil {
		t.Fatal("Flush with Redis down succeeded")
	}
	later := append(sampleAdds(), manyAdds(7, "p")...) // pending only: existing and new rows
	addAll(r1, later)
	wantRows := len(expectRows(failed, Filter{})) + len(expectRows(later, Filter{}))
	if r1.Pending() != wantRows {
		t.Fatalf("Pending = %d, want %d", r1.Pending(), wantRows)
	}
	err := r1.Close()
	if err == nil || !strings.Contains(err.Error(), strconv.Itoa(wantRows)+" rows not written") ||
		!strings.Contains(err.Error(), spill) {
		t.Fatalf("Close = %v, want an error saying %d rows are not written and kept in %s", err, wantRows, spill)
	}
	fi, err := os.Stat(spill)
	if err != nil {
		t.Fatalf("Close wrote no spill file: %v", err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("spill file mode %v, want 0600", fi.Mode().Perm())
	}
	sf := readSpillJSON(t, spill)
	if sf.Version != spillVersion || len(sf.Batches) != 4 || spillRows(sf) != wantRows {
		t.Fatalf("spill file: version %d, %d batches, %d rows; want version %d, 4 batches, %d rows",
			sf.Version, len(sf.Batches), spillRows(sf), spillVersion, wantRows)
	}
	for _, b := range sf.Batches {
		if b.Tag != "{tollgate:spend}" || !strings.HasPrefix(b.ID, "rep:") {
			t.Fatalf("spilled batch id %q tag %q; want a rep: id under {tollgate:spend}", b.ID, b.Tag)
		}
	}

	srv.Start()
	r2 := newRedis(t, srv.Client(t), RedisOptions{SpillFile: spill, ReplicaID: "rep"})
	if r2.Pending() != wantRows {
		t.Fatalf("Pending after loading the spill file = %d, want %d", r2.Pending(), wantRows)
	}
	if _, err := os.Stat(spill); err != nil {
		t.Fatalf("spill file gone before its batches were written: %v", err)
	}
	flush(t, r2)
	mustNotExist(t, spill)
	all := slices.Concat(before, failed, later)
	checkQueries(t, r2, all)
	if rows, err := r2.Query(context.Background(), Filter{}); err != nil || !reflect.DeepEqual(rows, expectRows(all, Filter{})) {
		t.Fatalf("rows after recovery differ from what was added (%v)", err)
	}
	if err := r2.Close(); err != nil {
		t.Fatalf("Close after recovery: %v", err)
	}
	mustNotExist(t, spill)
}

// TestRedisSpillLostReply: a batch that Redis applied but whose reply was
// lost is spilled with its id, and the next replica does not apply it
// again.
func TestRedisSpillLostReply(t *testing.T) {
	spill := filepath.Join(t.TempDir(), "spend.spill")
	srv := startRedisServer(t, false)
	h := &faults{}
	r1 := newRedis(t, srv.Client(t, h), RedisOptions{SpillFile: spill})
	kA := Key{Day: "2026-11-30", KeyID: "a", Team: "t", Model: "m"}
	kB := Key{Day: "2026-11-30", KeyID: "b", Team: "t", Model: "m"}
	r1.Add(kA, Totals{Requests: 1, Input: 10, CostMicros: 100}, time.Time{})
	h.loseNext.Store(true)
	if err := r1.Flush(context.Background()); err == nil {
		t.Fatal("Flush succeeded although its reply was lost")
	}
	ran := h.ran()
	if len(ran) != 1 {
		t.Fatalf("scripts run: %q, want 1", ran)
	}
	r1.Add(kA, Totals{Requests: 1, Input: 5, CostMicros: 50}, time.Time{})
	r1.Add(kB, Totals{Requests: 1, Input: 7, CostMicros: 70}, time.Time{})
	h.down.Store(true)
	if err := r1.Close(); err == nil || !strings.Contains(err.Error(), "spill file") {
		t.Fatalf("Close = %v, want an error naming the spill file", err)
	}
	sf := readSpillJSON(t, spill)
	if len(sf.Batches) != 2 || "{tollgate:spend}:batch:"+sf.Batches[0].ID != ran[0] {
		t.Fatalf("spilled batches %q; want 2, the first being the applied one %q", spillIDs(sf), ran[0])
	}

	r2 := newRedis(t, srv.Client(t), RedisOptions{SpillFile: spill})
	flush(t, r2)
	rows, err := r2.Query(context.Background(), Filter{})
	if err != nil {
		t.Fatal(err)
	}
	want := []Row{{kA, Totals{Requests: 2, Input: 15, CostMicros: 150}}, {kB, Totals{Requests: 1, Input: 7, CostMicros: 70}}}
	if !reflect.DeepEqual(rows, want) {
		t.Fatalf("rows %+v, want %+v (the applied batch counted once)", rows, want)
	}
	mustNotExist(t, spill)
}

// TestRedisSpillCrashDuringRecovery: while recovering, the spill file stays
// until its batches are in Redis; a replica closed again before that
// rewrites it with the same ids and its own rows, and a file replayed after
// its batches were applied (a crash before its removal) counts nothing
// twice.
func TestRedisSpillCrashDuringRecovery(t *testing.T) {
	spill := filepath.Join(t.TempDir(), "spend.spill")
	srv := startRedisServer(t, false)
	h1 := &faults{}
	h1.down.Store(true)
	r1 := newRedis(t, srv.Client(t, h1), RedisOptions{SpillFile: spill})
	first := manyAdds(maxBatchRows+1, "x")
	addAll(r1, first)
	if err := r1.Flush(context.Background()); err == nil {
		t.Fatal("Flush with Redis down succeeded")
	}
	addAll(r1, sampleAdds())
	if err := r1.Close(); err == nil {
		t.Fatal("Close with Redis down succeeded")
	}
	sf1 := readSpillJSON(t, spill)
	if len(sf1.Batches) != 3 {
		t.Fatalf("first spill: %d batches, want 3", len(sf1.Batches))
	}

	// Redis still down: the second replica spills the first's batches
	// again, unchanged and once, then its own.
	h2 := &faults{}
	h2.down.Store(true)
	r2 := newRedis(t, srv.Client(t, h2), RedisOptions{SpillFile: spill})
	second := manyAdds(5, "y")
	addAll(r2, second)
	if err := r2.Flush(context.Background()); err == nil {
		t.Fatal("Flush with Redis down succeeded")
	}
	if err := r2.Close(); err == nil {
		t.Fatal("Close with Redis down succeeded")
	}
	sf2 := readSpillJSON(t, spill)
	if len(sf2.Batches) != 4 || !reflect.DeepEqual(sf2.Batches[:3], sf1.Batches) {
		t.Fatalf("second spill %q; want the first spill's 3 batches unchanged, then 1 new", spillIDs(sf2))
	}
	if sf2.Batches[3].ID == sf1.Batches[2].ID || strings.HasPrefix(sf2.Batches[3].ID, sf1.Replica+":") {
		t.Fatalf("new batch id %q reuses the first replica's ids (%s)", sf2.Batches[3].ID, sf1.Replica)
	}
	saved, err := os.ReadFile(spill)
	if err != nil {
		t.Fatal(err)
	}

	r3 := newRedis(t, srv.Client(t), RedisOptions{SpillFile: spill})
	flush(t, r3)
	mustNotExist(t, spill)
	all := slices.Concat(first, sampleAdds(), second)
	checkQueries(t, r3, all)

	// As if r3 had crashed after writing the batches but before removing
	// the file: a fourth replica replays it and counts nothing twice.
	if err := os.WriteFile(spill, saved, 0o600); err != nil {
		t.Fatal(err)
	}
	r4 := newRedis(t, srv.Client(t), RedisOptions{SpillFile: spill})
	flush(t, r4)
	mustNotExist(t, spill)
	checkQueries(t, r4, all)
}

// TestRedisSpillFlushAfterClose: an explicit Flush after a Close that
// spilled writes the batches and removes the file.
func TestRedisSpillFlushAfterClose(t *testing.T) {
	spill := filepath.Join(t.TempDir(), "spend.spill")
	srv := startRedisServer(t, false)
	h := &faults{}
	r := newRedis(t, srv.Client(t, h), RedisOptions{SpillFile: spill})
	adds := sampleAdds()
	addAll(r, adds)
	h.down.Store(true)
	if err := r.Close(); err == nil {
		t.Fatal("Close with Redis down succeeded")
	}
	if sf := readSpillJSON(t, spill); spillRows(sf) != len(expectRows(adds, Filter{})) {
		t.Fatalf("spilled %d rows, want %d", spillRows(sf), len(expectRows(adds, Filter{})))
	}
	h.down.Store(false)
	flush(t, r)
	mustNotExist(t, spill)
	checkQueries(t, r, adds)
}

// TestRedisSpillOtherPrefix: spilled batches go to the prefix they were
// made under, where their markers are, even if the next replica uses
// another prefix.
func TestRedisSpillOtherPrefix(t *testing.T) {
	spill := filepath.Join(t.TempDir(), "spend.spill")
	srv := startRedisServer(t, false)
	h := &faults{}
	h.down.Store(true)
	old := newRedis(t, srv.Client(t, h), RedisOptions{SpillFile: spill, Prefix: "old:"})
	adds := sampleAdds()
	addAll(old, adds)
	if err := old.Close(); err == nil {
		t.Fatal("Close with Redis down succeeded")
	}
	renamed := newRedis(t, srv.Client(t), RedisOptions{SpillFile: spill, Prefix: "new:"})
	flush(t, renamed)
	mustNotExist(t, spill)
	if rows, err := renamed.Query(context.Background(), Filter{}); err != nil || len(rows) != 0 {
		t.Fatalf("new prefix holds %d rows (%v), want none", len(rows), err)
	}
	reader := newRedis(t, srv.Client(t), RedisOptions{Prefix: "old:"})
	checkQueries(t, reader, adds)
}

// TestRedisSpillCorrupt: a spill file that cannot be trusted stops NewRedis
// with an error naming it, and is left as it is.
func TestRedisSpillCorrupt(t *testing.T) {
	srv := startRedisServer(t, false)
	row := `{"day":"2026-11-30","team":"t","key_id":"k","model":"m","requests":1,"input":0,"output":0,"cache_read":0,"cache_write":0,"reasoning":0,"cost_micros":5}`
	file := func(batches string) string {
		return `{"version":1,"saved_at":"2026-11-30T00:00:00Z","replica":"r:n","batches":[` + batches + `]}`
	}
	batch := func(id, tag, rows string) string {
		return `{"id":"` + id + `","tag":"` + tag + `","rows":[` + rows + `]}`
	}
	good := batch("r:n:1", "{tollgate:spend}", row)
	for _, c := range []struct{ name, data, want string }{
		{"empty", "", "corrupt"},
		{"not JSON", "spend", "corrupt"},
		{"truncated", file(good)[:40], "corrupt"},
		{"trailing data", file(good) + "{}", "corrupt"},
		{"unknown field", strings.Replace(file(good), `"version"`, `"extra":1,"version"`, 1), "corrupt"},
		{"version", strings.Replace(file(good), `"version":1`, `"version":2`, 1), "version 2"},
		{"no id", file(batch("", "{tollgate:spend}", row)), "corrupt"},
		{"repeated id", file(good + "," + good), "corrupt"},
		{"bad tag", file(batch("r:n:1", "tollgate:", row)), "corrupt"},
		{"no rows", file(batch("r:n:1", "{tollgate:spend}", "")), "corrupt"},
		{"bad day", file(batch("r:n:1", "{tollgate:spend}", strings.Replace(row, "2026-11-30", "2026-13-30", 1))), "corrupt"},
	} {
		t.Run(c.name, func(t *testing.T) {
			spill := filepath.Join(t.TempDir(), "spend.spill")
			if err := os.WriteFile(spill, []byte(c.data), 0o600); err != nil {
				t.Fatal(err)
			}
			r, err := NewRedis(srv.Client(t), RedisOptions{SpillFile: spill})
			if err == nil {
				_ = r.Close()
				t.Fatal("NewRedis accepted the spill file")
			}
			if !strings.HasPrefix(err.Error(), "spend: ") || !strings.Contains(err.Error(), spill) ||
				!strings.Contains(err.Error(), c.want) {
				t.Fatalf("NewRedis = %v, want a spend: error naming %s and saying %q", err, spill, c.want)
			}
			if data, err := os.ReadFile(spill); err != nil || string(data) != c.data {
				t.Fatalf("the spill file was changed or removed (%v)", err)
			}
		})
	}
	// The control: the good file loads, and its row is written.
	spill := filepath.Join(t.TempDir(), "spend.spill")
	if err := os.WriteFile(spill, []byte(file(good)), 0o600); err != nil {
		t.Fatal(err)
	}
	r := newRedis(t, srv.Client(t), RedisOptions{SpillFile: spill})
	flush(t, r)
	rows, err := r.Query(context.Background(), Filter{})
	want := []Row{{Key{Day: "2026-11-30", KeyID: "k", Team: "t", Model: "m"}, Totals{Requests: 1, CostMicros: 5}}}
	if err != nil || !reflect.DeepEqual(rows, want) {
		t.Fatalf("rows %+v, %v; want %+v", rows, err, want)
	}

	// A path that cannot be read is an error too, never an empty ledger.
	dir := t.TempDir()
	if _, err := NewRedis(srv.Client(t), RedisOptions{SpillFile: dir}); err == nil || !strings.Contains(err.Error(), dir) {
		t.Fatalf("NewRedis with a directory as spill file = %v, want an error naming it", err)
	}
}

// TestRedisSpillUnwritable: if the spill file cannot be written, Close says
// both failures.
func TestRedisSpillUnwritable(t *testing.T) {
	srv := startRedisServer(t, false)
	spill := filepath.Join(t.TempDir(), "missing-dir", "spend.spill")
	r := newRedis(t, srv.Client(t), RedisOptions{SpillFile: spill})
	srv.Kill()
	r.Add(Key{Day: "2026-11-30", KeyID: "a"}, Totals{Requests: 1}, time.Time{})
	err := r.Close()
	if err == nil || !strings.Contains(err.Error(), "1 rows not written") || !strings.Contains(err.Error(), "writing spill file") {
		t.Fatalf("Close = %v, want an error saying 1 row is not written and the spill file failed", err)
	}
	if r.Pending() != 1 {
		t.Fatalf("Pending = %d, want 1", r.Pending())
	}
}

func TestPickNonce(t *testing.T) {
	used := []string{"rep:aa:3", "rep:cc:1"}
	seq := func(ns ...string) func() string {
		return func() string {
			n := ns[0]
			ns = ns[1:]
			return n
		}
	}
	if n, err := pickNonce("rep", used, seq("aa", "cc", "bb")); err != nil || n != "bb" {
		t.Fatalf("pickNonce = %q, %v; want bb, the first unused", n, err)
	}
	if n, err := pickNonce("other", used, seq("aa")); err != nil || n != "aa" {
		t.Fatalf("pickNonce for another replica = %q, %v; want aa", n, err)
	}
	if n, err := pickNonce("rep", nil, seq("aa")); err != nil || n != "aa" {
		t.Fatalf("pickNonce without earlier ids = %q, %v; want aa", n, err)
	}
	if _, err := pickNonce("rep", used, func() string { return "aa" }); err == nil {
		t.Fatal("pickNonce returned a nonce in use")
	}
}
