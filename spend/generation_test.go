package spend

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// refillLog records OnRefill calls.
type refillLog struct {
	mu   sync.Mutex
	ids  []string
	rows map[string][]Row
}

// record keeps the calls that hand rows over; the first adoption of a
// generation calls OnRefill with none (for the limits' rate buckets).
func (l *refillLog) record(_ context.Context, rows []Row, id string) error {
	if len(rows) == 0 {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.rows == nil {
		l.rows = map[string][]Row{}
	}
	l.ids = append(l.ids, id)
	l.rows[id] = rows
	return nil
}

func (l *refillLog) get() ([]string, map[string][]Row) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.ids), l.rows
}

// holds reports whether l's Query answers exactly the rows of adds.
func holds(l Ledger, adds []add) bool {
	rows, err := l.Query(context.Background(), Filter{})
	return err == nil && reflect.DeepEqual(rows, expectRows(adds, Filter{}))
}

func queryOwn(t *testing.T, r *Redis) []Row {
	t.Helper()
	rows, err := r.QueryOwn(context.Background(), Filter{})
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// TestRedisRefillsAnEmptyRedis: two replicas write to a Redis without
// persistence, which restarts empty. Each notices it without traffic, says
// so (OnDataLost), hands its own rows to OnRefill and sends them again
// once: the ledger holds every row as before. A batch sent right after the
// restart, before anyone noticed, is not counted before the refill nor
// twice after it; a replica restarted from its own-state file and one
// joining afresh add nothing and report no loss.
func TestRedisRefillsAnEmptyRedis(t *testing.T) {
	srv := startRedisServer(t, false)
	dir := t.TempDir()
	var lostA, lostB, lostA2, lostC degradedLog
	var refA, refB refillLog
	open := func(name string, lost *degradedLog, ref *refillLog) *Redis {
		o := RedisOptions{OwnFile: filepath.Join(dir, name), FlushInterval: 10 * time.Millisecond, OnDataLost: lost.record}
		if ref != nil {
			o.OnRefill = ref.record
		}
		return newRedis(t, srv.Client(t), o)
	}
	a, b := open("a.json", &lostA, &refA), open("b.json", &lostB, &refB)
	adds := append(sampleAdds(), manyAdds(2*maxBatchRows+10, "bulk")...)
	toA, toB := adds[:len(adds)/2], adds[len(adds)/2:]
	addAll(a, toA)
	addAll(b, toB)
	flush(t, a)
	flush(t, b)
	checkQueries(t, a, adds)
	if lostA.get() != nil || lostB.get() != nil {
		t.Fatalf("a first generation reported as a loss: %v %v", lostA.get(), lostB.get())
	}

	srv.Restart()
	// Before either flusher notices: a batch to the empty Redis.
	late := manyAdds(3, "late")
	addAll(b, late)
	flush(t, b)
	adds = append(adds, late...)
	waitFor(t, "both replicas' rows back in Redis", func() bool { return holds(a, adds) })
	waitFor(t, "both replicas to report the refill done", func() bool {
		return slices.Equal(lostA.get(), []bool{true, false}) && slices.Equal(lostB.get(), []bool{true, false})
	})
	idsA, rowsA := refA.get()
	idsB, rowsB := refB.get()
	if len(idsA) != 1 || len(idsB) != 1 || idsA[0] == idsB[0] {
		t.Fatalf("OnRefill ids: a %v, b %v; want one each, distinct", idsA, idsB)
	}
	if !reflect.DeepEqual(rowsA[idsA[0]], expectRows(toA, Filter{})) || !reflect.DeepEqual(rowsB[idsB[0]], expectRows(toB, Filter{})) {
		t.Fatal("OnRefill was not given the replica's own rows")
	}
	if own := queryOwn(t, b); !reflect.DeepEqual(own, expectRows(append(slices.Clone(toB), late...), Filter{})) {
		t.Fatalf("b's own part: %d rows", len(own))
	}

	// a restarts from its own-state file: the generation is the one it
	// knows, so it sends nothing again.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	a2 := open("a.json", &lostA2, nil)
	c := open("c.json", &lostC, nil)
	more := manyAdds(5, "more")
	addAll(a2, more)
	addAll(c, more)
	flush(t, a2)
	flush(t, c)
	adds = append(append(adds, more...), more...)
	time.Sleep(50 * time.Millisecond) // a few ticks, to see that nothing else is sent
	checkQueries(t, a2, adds)
	if lostA2.get() != nil || lostC.get() != nil {
		t.Fatalf("a restart or a new replica reported a loss: %v %v", lostA2.get(), lostC.get())
	}
}

// TestRedisRefillByAReplicaThatWasDown: a replica stopped while Redis lost
// its data finds, at its next start, a generation another replica created
// in the meantime, and adds its own part to it once.
func TestRedisRefillByAReplicaThatWasDown(t *testing.T) {
	srv := startRedisServer(t, false)
	dir := t.TempDir()
	a := newRedis(t, srv.Client(t), RedisOptions{OwnFile: filepath.Join(dir, "a.json")})
	b := newRedis(t, srv.Client(t), RedisOptions{OwnFile: filepath.Join(dir, "b.json")})
	adds := sampleAdds()
	toA, toB := adds[:len(adds)/2], adds[len(adds)/2:]
	addAll(a, toA)
	addAll(b, toB)
	flush(t, a)
	flush(t, b)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	srv.Restart()
	addAll(b, toB[:1]) // b's next batch notices and refills
	flush(t, b)
	want := append(slices.Clone(toB), toB[0])
	checkQueries(t, b, want)

	var lost degradedLog
	a2 := newRedis(t, srv.Client(t), RedisOptions{OwnFile: filepath.Join(dir, "a.json"), OnDataLost: lost.record})
	addAll(a2, toA[:1])
	flush(t, a2)
	want = append(append(want, toA...), toA[0])
	checkQueries(t, a2, want)
	if !slices.Equal(lost.get(), []bool{true, false}) {
		t.Fatalf("OnDataLost calls %v, want [true false]", lost.get())
	}
	// Once more, from the same file: nothing is sent twice.
	if err := a2.Close(); err != nil {
		t.Fatal(err)
	}
	a3 := newRedis(t, srv.Client(t), RedisOptions{OwnFile: filepath.Join(dir, "a.json")})
	a3.tick(context.Background()) // the flusher's check of the generation
	checkQueries(t, a3, want)
}

// TestRedisOwnPartKeepsThisAndLastMonth: the own-state file holds the days
// a refill restores (this month and the last), not all history.
func TestRedisOwnPartKeepsThisAndLastMonth(t *testing.T) {
	srv := startRedisServer(t, false)
	file := filepath.Join(t.TempDir(), "own.json")
	r := newRedis(t, srv.Client(t), RedisOptions{OwnFile: file})
	now := time.Now().UTC()
	old := Key{Day: now.AddDate(0, -3, 0).Format(DayLayout), KeyID: "k", Team: "t", Model: "m"}
	lastMonth := Key{Day: time.Date(now.Year(), now.Month()-1, 1, 0, 0, 0, 0, time.UTC).Format(DayLayout), KeyID: "k", Team: "t", Model: "m"}
	today := Key{Day: now.Format(DayLayout), KeyID: "k", Team: "t", Model: "m"}
	for _, k := range []Key{old, lastMonth, today} {
		r.Add(k, Totals{Requests: 1, Input: 10}, time.Time{})
	}
	flush(t, r)
	of, err := readOwn(file)
	if err != nil || of == nil {
		t.Fatalf("own file: %v %v", of, err)
	}
	var days []string
	for _, row := range of.Rows {
		days = append(days, row.Day)
	}
	slices.Sort(days)
	if want := []string{lastMonth.Day, today.Day}; !slices.Equal(days, want) {
		t.Fatalf("own file keeps days %v, want %v", days, want)
	}
	if rows, err := r.Query(context.Background(), Filter{}); err != nil || len(rows) != 3 {
		t.Fatalf("the shared ledger keeps every day: %d rows, %v", len(rows), err)
	}
}

// TestRedisRefusesACorruptOwnFile: an own-state file that does not parse,
// has another version or names no owner stops NewRedis with an error naming
// the file, rather than starting with an empty part that a refill would
// then miss.
func TestRedisRefusesACorruptOwnFile(t *testing.T) {
	srv := startRedisServer(t, false)
	for name, data := range map[string]string{
		"not json":      `{"version":1,`,
		"unknown field": `{"version":1,"owner":"o","generation":"g","rows":[],"extra":1}`,
		"version":       `{"version":9,"owner":"o","generation":"g","rows":[]}`,
		"no owner":      `{"version":1,"owner":"","generation":"g","rows":[]}`,
	} {
		file := filepath.Join(t.TempDir(), "own.json")
		if err := os.WriteFile(file, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		r, err := NewRedis(srv.Client(t), RedisOptions{OwnFile: file, FlushInterval: time.Hour})
		if err == nil {
			_ = r.Close()
			t.Errorf("%s: NewRedis accepted %s", name, data)
			continue
		}
		if !strings.Contains(err.Error(), file) {
			t.Errorf("%s: error %q does not name the file", name, err)
		}
	}
}

// wholeLog records OnWhole calls.
type wholeLog struct {
	mu   sync.Mutex
	gens []string
}

func (w *wholeLog) record(gen string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.gens = append(w.gens, gen)
}

func (w *wholeLog) get() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.gens)
}

// TestRedisRefillWaitsForTheFleet: two replicas of a fleet of two bill to
// a Redis that restarts empty. The first to send its part back does not
// call the ledger whole: it stays incomplete (/admin/spend's partial),
// redis_data stays raised and the limiter is not told the new generation,
// until the second's part is back too. A third replica counted in the
// fleet that never sends its part is waited for RefillWait at most.
func TestRedisRefillWaitsForTheFleet(t *testing.T) {
	srv := startRedisServer(t, false)
	ctx := context.Background()
	fleet := 2
	var lostA, lostB degradedLog
	var wholeA, wholeB wholeLog
	open := func(lost *degradedLog, whole *wholeLog) *Redis {
		return newRedis(t, srv.Client(t), RedisOptions{OnDataLost: lost.record, OnWhole: whole.record,
			Replicas: func() int { return fleet }, RefillWait: time.Hour})
	}
	a, b := open(&lostA, &wholeA), open(&lostB, &wholeB)
	adds := sampleAdds()
	addAll(a, adds[:len(adds)/2])
	addAll(b, adds[len(adds)/2:])
	flush(t, a)
	flush(t, b)
	g1 := wholeA.get()
	if len(g1) != 1 || !slices.Equal(wholeB.get(), g1) || a.Incomplete(ctx) {
		t.Fatalf("first generation: whole %v and %v, incomplete %v", g1, wholeB.get(), a.Incomplete(ctx))
	}

	srv.Restart()
	if !a.Incomplete(ctx) {
		t.Fatal("an emptied Redis is not reported incomplete before any flush noticed it")
	}
	a.tick(ctx) // a notices, refills its own part, and waits for b's
	if !a.Incomplete(ctx) || !slices.Equal(lostA.get(), []bool{true}) || len(wholeA.get()) != 1 {
		t.Fatalf("with only a's part back: incomplete %v, OnDataLost %v, OnWhole %v", a.Incomplete(ctx), lostA.get(), wholeA.get())
	}
	if holds(a, adds) {
		t.Fatal("the ledger already holds b's part: the test proves nothing")
	}
	a.tick(ctx)
	if !a.Incomplete(ctx) || len(wholeA.get()) != 1 {
		t.Fatal("a called the ledger whole before b's part was back")
	}
	b.tick(ctx)
	a.tick(ctx)
	if !holds(a, adds) || a.Incomplete(ctx) || b.Incomplete(ctx) {
		t.Fatalf("both parts back: holds %v, incomplete %v %v", holds(a, adds), a.Incomplete(ctx), b.Incomplete(ctx))
	}
	g2 := wholeA.get()
	if len(g2) != 2 || g2[1] == g1[0] || !slices.Equal(wholeB.get(), g2) {
		t.Fatalf("OnWhole: a %v, b %v; want the new generation once each", g2, wholeB.get())
	}
	if !slices.Equal(lostA.get(), []bool{true, false}) || !slices.Equal(lostB.get(), []bool{true, false}) {
		t.Fatalf("OnDataLost: a %v, b %v", lostA.get(), lostB.get())
	}

	// A fleet of three where the third never comes back: RefillWait.
	fleet = 3
	a.refillWait, b.refillWait = time.Millisecond, time.Millisecond
	srv.Restart()
	a.tick(ctx)
	b.tick(ctx)
	time.Sleep(2 * time.Millisecond)
	a.tick(ctx)
	if a.Incomplete(ctx) || len(wholeA.get()) != 3 {
		t.Fatalf("after RefillWait: incomplete %v, OnWhole %v", a.Incomplete(ctx), wholeA.get())
	}
}
