package proxy

import (
	"context"
	"log/slog"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/internal/redistest"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/metrics"
	"github.com/tollgate-llm/tollgate/ratelimit"
	"github.com/tollgate-llm/tollgate/spend"
)

// BenchmarkGovernance measures what governance adds to one request on the
// request path: identifying the key (SHA-256 and a map lookup), admission
// for the key and its team (RPM, TPM, concurrency), the rate-limit headers,
// and at the end the settlement and the ledger entry. "off" is a key with no
// limits; "local" the in-process limiter with the ledger in memory;
// "local-journal" the same with the ledger's state file and journal (one
// write(2) a request, fsynced every 100 ms), as a gateway without Redis
// runs; "redis" the shared one against a private redis-server on loopback
// (one round trip to admit, one to settle).
func BenchmarkGovernance(b *testing.B) {
	for _, backend := range []string{"off", "local", "local-journal", "redis"} {
		b.Run(backend, func(b *testing.B) {
			cfg := config.DemoConfig("http://127.0.0.1:1")
			cfg.Auth.Mode = "keys"
			cfg.Models = []config.Model{{Pattern: "gpt-*", InputUSDPerMTok: 2.5, OutputUSDPerMTok: 10}}
			cfg.Teams = []config.Team{{Name: "search"}}
			cfg.Keys = []config.Key{{Name: "alpha", SHA256: sha(keyAlpha), Team: "search"}}
			if backend != "off" {
				big := int64(1) << 40
				cfg.Keys[0].Limits = config.Limits{RPM: &big, TPM: &big, Concurrency: &big}
				cfg.Teams[0].Limits = config.Limits{RPM: &big, TPM: &big}
			}
			if err := cfg.Validate(); err != nil {
				b.Fatal(err)
			}
			var lim ratelimit.Limiter = ratelimit.NewLocal(ratelimit.LocalOptions{})
			if backend == "redis" {
				lim = ratelimit.NewRedis(redistest.Start(b).Client(b), ratelimit.RedisOptions{})
			}
			defer lim.Close()
			var lo spend.LocalOptions
			if backend == "local-journal" {
				lo = spend.LocalOptions{StateFile: filepath.Join(b.TempDir(), "spend.json"), FlushInterval: time.Hour,
					Journal: true, JournalSync: 100 * time.Millisecond}
			}
			ledger, err := spend.NewLocal(lo)
			if err != nil {
				b.Fatal(err)
			}
			defer ledger.Close()
			m, err := metrics.New(prometheus.NewRegistry(), &cfg)
			if err != nil {
				b.Fatal(err)
			}
			g, err := New(Options{Config: &cfg, Metrics: m, Logger: slog.New(slog.DiscardHandler),
				Limiter: lim, Ledger: ledger})
			if err != nil {
				b.Fatal(err)
			}
			r, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, "/v1/chat/completions", nil)
			w := &discardWriter{h: http.Header{}}
			now := time.Now()
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				clear(w.h)
				ex := exchange{g: g, w: w, r: r, promptEstimate: 300}
				ex.rec.Route, ex.rec.Dialect, ex.rec.Model = llm.RouteChatCompletions, llm.DialectOpenAI, "gpt-4o"
				ex.rec.Timing.In = now
				ex.info.MaxTokens = 200
				sum, id := keyHash(keyAlpha)
				ex.rec.KeyID = id
				if aerr := ex.identify(sum, true); aerr != nil {
					b.Fatal(aerr)
				}
				if !ex.admit() {
					b.Fatal("refused")
				}
				if len(ex.rlStates) > 0 {
					setRateLimitHeaders(w.h, ex.rec.Dialect, ex.rlStates, now)
				}
				ex.rec.Status, ex.rec.Timing.UpFirstByte = 200, now
				ex.rec.Usage = llm.Usage{Input: 300, Output: 150, HasInput: true, HasOutput: true}
				ex.settle()
			}
		})
	}
}
