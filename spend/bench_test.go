package spend

import (
	"context"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
)

var benchKey = Key{Day: "2026-11-30", KeyID: "3f9a1c2b", Team: "search", Model: "gpt-4o-2024-08-06"}
var benchTotals = Totals{Requests: 1, Input: 1200, Output: 300, CacheRead: 800, Reasoning: 100, CostMicros: 4500}

// BenchmarkLocalAdd adds to an existing row: the request path's cost.
func BenchmarkLocalAdd(b *testing.B) {
	l, err := NewLocal(LocalOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	l.Add(benchKey, benchTotals, time.Time{})
	b.ReportAllocs()
	for b.Loop() {
		l.Add(benchKey, benchTotals, time.Time{})
	}
}

// BenchmarkLocalAddJournal is BenchmarkLocalAdd with a state file and its
// journal: each Add also writes its journal line, one write(2) into the
// page cache. "sync-100ms" fsyncs the journal every 100 ms ([spend]
// journal_sync_ms's default) meanwhile, "sync-off" never (journal_sync_ms
// = 0), to show what the syncs cost the writes.
func BenchmarkLocalAddJournal(b *testing.B) {
	for _, c := range []struct {
		name string
		sync time.Duration
	}{{"sync-100ms", 100 * time.Millisecond}, {"sync-off", 0}} {
		b.Run(c.name, func(b *testing.B) {
			l, err := NewLocal(LocalOptions{StateFile: filepath.Join(b.TempDir(), "spend.json"), FlushInterval: time.Hour,
				Journal: true, JournalSync: c.sync})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			at := time.Now()
			l.Add(benchKey, benchTotals, at)
			b.ReportAllocs()
			for b.Loop() {
				l.Add(benchKey, benchTotals, at)
			}
		})
	}
}

// BenchmarkRedisAdd adds to an existing pending row; no I/O happens.
func BenchmarkRedisAdd(b *testing.B) { benchRedisAdd(b, RedisOptions{}) }

// BenchmarkRedisAddJournal is BenchmarkRedisAdd with a journal: one
// write(2) of the Add's line per Add, no fsync on the way.
func BenchmarkRedisAddJournal(b *testing.B) {
	benchRedisAdd(b, RedisOptions{Journal: filepath.Join(b.TempDir(), "spend.journal"), JournalSync: 100 * time.Millisecond})
}

func benchRedisAdd(b *testing.B, opts RedisOptions) {
	srv := startRedisServer(b, false)
	opts.FlushInterval = time.Hour
	r, err := NewRedis(srv.Client(b), opts)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	r.Add(benchKey, benchTotals, time.Time{})
	b.ReportAllocs()
	for b.Loop() {
		r.Add(benchKey, benchTotals, time.Time{})
	}
}

// BenchmarkRedisFlush100 adds 100 distinct rows and flushes them as one
// batch to a local redis-server.
func BenchmarkRedisFlush100(b *testing.B) {
	srv := startRedisServer(b, false)
	r, err := NewRedis(srv.Client(b), RedisOptions{FlushInterval: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	keys := make([]Key, 100)
	for i := range keys {
		keys[i] = benchKey
		keys[i].KeyID = "key" + strconv.Itoa(i)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		for _, k := range keys {
			r.Add(k, benchTotals, time.Time{})
		}
		if err := r.Flush(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPricesCost(b *testing.B) {
	cr, cw := 1.25, 3.75
	p := NewPrices([]config.Model{
		{Pattern: "claude-sonnet-4-*", InputUSDPerMTok: 3, OutputUSDPerMTok: 15},
		{Pattern: "gpt-4o-mini*", InputUSDPerMTok: 0.15, OutputUSDPerMTok: 0.6},
		{Pattern: "gpt-4o*", InputUSDPerMTok: 2.5, OutputUSDPerMTok: 10, CacheReadUSDPerMTok: &cr, CacheWriteUSDPerMTok: &cw},
	})
	u := llm.Usage{Input: 1200, Output: 300, CacheRead: 800, Reasoning: 100}
	b.ReportAllocs()
	var sink int64
	for b.Loop() {
		c, _ := p.Cost("gpt-4o-2024-08-06", u)
		sink += c
	}
	if sink == 0 {
		b.Fatal("no cost")
	}
}
