package conversation

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/internal/redistest"
)

// benchKeys are the conversations the benchmarks spread their turns over.
var benchKeys = func() []string {
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = Key("team:search", fmt.Sprint("bench-", i))
	}
	return keys
}()

// benchAt is every turn's end, so the figures leave out reading the clock.
var benchAt = time.Now()

func benchTurn(i int) Turn {
	return Turn{Key: benchKeys[i%len(benchKeys)], Team: "search", At: benchAt,
		Tokens:     Tokens{Input: 1200, Output: 300, CacheRead: 800, Reasoning: 100},
		CostMicros: 4500, TTFT: 180 * time.Millisecond}
}

// BenchmarkRecord records turns of 1024 conversations: the request path's
// cost. The Redis store's loop flushes every millisecond meanwhile, so its
// figure includes its share of sending them (the lock it contends for, the
// batches it builds); ns/op is per turn.
func BenchmarkRecord(b *testing.B) {
	b.Run("Local", func(b *testing.B) {
		l, err := NewLocal(LocalOptions{Options: Options{Interval: time.Millisecond}})
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		benchRecord(b, l)
	})
	b.Run("Redis", func(b *testing.B) {
		srv := redistest.Start(b)
		r, err := NewRedis(srv.Client(b), RedisOptions{Options: Options{Interval: time.Millisecond}, Prefix: "bench:"})
		if err != nil {
			b.Fatal(err)
		}
		defer r.Close()
		benchRecord(b, r)
		if err := r.Flush(context.Background()); err != nil {
			b.Fatal(err)
		}
	})
}

func benchRecord(b *testing.B, s Store) {
	for i := range benchKeys {
		s.Record(benchTurn(i))
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		s.Record(benchTurn(i))
		i++
	}
}

// BenchmarkGetCost reads one conversation's figures (Get) and cost (Cost),
// as the admin API and the per-conversation budget do.
func BenchmarkGetCost(b *testing.B) {
	ctx := context.Background()
	run := func(b *testing.B, s Store) {
		for i := range 8 * MaxTTFTs {
			s.Record(benchTurn(i))
		}
		if err := s.Flush(ctx); err != nil {
			b.Fatal(err)
		}
		b.Run("Get", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.Get(ctx, benchKeys[0]); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("Cost", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.Cost(ctx, benchKeys[0]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("Local", func(b *testing.B) {
		l, err := NewLocal(LocalOptions{Options: Options{Interval: time.Hour}})
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		run(b, l)
	})
	b.Run("Redis", func(b *testing.B) {
		srv := redistest.Start(b)
		r, err := NewRedis(srv.Client(b), RedisOptions{Options: Options{Interval: time.Hour}, Prefix: "bench:"})
		if err != nil {
			b.Fatal(err)
		}
		defer r.Close()
		run(b, r)
	})
}
