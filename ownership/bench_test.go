package ownership

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/internal/redistest"
)

// benchID is an id shaped like OpenAI's: "resp_" and 50 hex digits.
func benchID(i int) string { return fmt.Sprintf("resp_%050x", i) }

func benchIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = benchID(i)
	}
	return ids
}

// BenchmarkLocalClaim claims with a journal: new ids (one journal line
// each), renewals of one id as the clock moves (one line each, and a
// rewrite of the journal every 4096), and new ids in memory only.
func BenchmarkLocalClaim(b *testing.B) {
	ctx := context.Background()
	b.Run("new-id", func(b *testing.B) {
		l, err := NewLocal(LocalOptions{File: filepath.Join(b.TempDir(), "owners.jsonl")})
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		ids := benchIDs(b.N)
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if _, err := l.Claim(ctx, ids[i], "team:alpha", time.Hour); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("renew", func(b *testing.B) {
		var now time.Time
		l, err := NewLocal(LocalOptions{File: filepath.Join(b.TempDir(), "owners.jsonl"), Now: func() time.Time { return now }})
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		id := benchID(1)
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			now = time.Unix(1_800_000_000+int64(i), 0)
			if _, err := l.Claim(ctx, id, "team:alpha", time.Hour); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("new-id-memory", func(b *testing.B) {
		l, err := NewLocal(LocalOptions{})
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		ids := benchIDs(b.N)
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if _, err := l.Claim(ctx, ids[i], "team:alpha", time.Hour); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkLocalOwner looks up ids among 100k records, from one goroutine
// and from GOMAXPROCS.
func BenchmarkLocalOwner(b *testing.B) {
	ctx := context.Background()
	l, err := NewLocal(LocalOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	ids := benchIDs(100_000)
	for _, id := range ids {
		if _, err := l.Claim(ctx, id, "team:alpha", time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if o, err := l.Owner(ctx, ids[i%len(ids)]); err != nil || o == "" {
				b.Fatal(o, err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for i := 0; pb.Next(); i++ {
				if o, err := l.Owner(ctx, ids[i%len(ids)]); err != nil || o == "" {
					b.Fatal(o, err)
				}
			}
		})
	})
}

// BenchmarkRedisOwner is one GET on a local redis-server.
func BenchmarkRedisOwner(b *testing.B) {
	ctx := context.Background()
	r := NewRedis(redistest.Start(b).Client(b), "tollgate:own:")
	id := benchID(1)
	if _, err := r.Claim(ctx, id, "team:alpha", time.Hour); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if o, err := r.Owner(ctx, id); err != nil || o != "team:alpha" {
			b.Fatal(o, err)
		}
	}
}

// BenchmarkLocalMemoryPerRecord claims 100k OpenAI-shaped ids for one owner
// and reports the heap the store holds per record (ids included: the store
// keeps its own copy).
func BenchmarkLocalMemoryPerRecord(b *testing.B) {
	const n = 100_000
	ctx := context.Background()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = "resp_" + strconv.FormatInt(int64(i), 16) + fmt.Sprintf("%046x", i*7919)
	}
	var total float64
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		l, err := NewLocal(LocalOptions{})
		if err != nil {
			b.Fatal(err)
		}
		for _, id := range ids {
			if _, err := l.Claim(ctx, id, "team:alpha", time.Hour); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		total += float64(after.HeapAlloc-before.HeapAlloc) / n
		runtime.KeepAlive(l)
		_ = l.Close()
	}
	b.ReportMetric(total/float64(b.N), "B/record")
}
