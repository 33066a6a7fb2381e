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
// request path: identifying the key from the request's key headers
// (reading them, SHA-256 and a map lookup), admission for the key and its
// team (RPM, TPM, concurrency), the rate-limit headers, and at the end the
// settlement and the ledger entry. "off" is a key with no
// limits; "local" the in-process limiter with the ledger in memory;
// "local-journal" the same with the ledger's state file and journal (one
// write(2) a request, fsynced every 100 ms), as a gateway without Redis
// runs; "redis" the shared one against a private redis-server on loopback
// (one round trip to admit, one to settle).
func BenchmarkGovernance(b *testing.B) {
	for _, backend := range []string{"off", "local", "local-journal", "redis"} {
		b.Run(backend, func(b *testing.B) {
			var keyLimits, teamLimits config.Limits
			if backend != "off" {
				big := int64(1) << 40
				keyLimits = config.Limits{RPM: &big, TPM: &big, Concurrency: &big}
				teamLimits = config.Limits{RPM: &big, TPM: &big}
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
			g := governedGateway(b, keyLimits, teamLimits, lim, ledger)
			r := alphaChat()
			w := &discardWriter{h: http.Header{}}
			now := time.Now()
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				clear(w.h)
				governOnce(b, g, w, r, now, llm.Usage{Input: 300, Output: 150, HasInput: true, HasOutput: true})
			}
		})
	}
}

// governedGateway is a gateway in mode "keys" whose one key, alpha
// (keyAlpha), is in team search, with the limits given, gpt-* priced, on lim
// and ledger.
func governedGateway(tb testing.TB, keyLimits, teamLimits config.Limits, lim ratelimit.Limiter, ledger spend.Ledger) *Gateway {
	tb.Helper()
	cfg := config.DemoConfig("http://127.0.0.1:1")
	cfg.Auth.Mode = "keys"
	cfg.Models = []config.Model{{Pattern: "gpt-*", InputUSDPerMTok: 2.5, OutputUSDPerMTok: 10}}
	cfg.Teams = []config.Team{{Name: "search", Limits: teamLimits}}
	cfg.Keys = []config.Key{{Name: "alpha", SHA256: sha(keyAlpha), Team: "search", Limits: keyLimits}}
	if err := cfg.Validate(); err != nil {
		tb.Fatal(err)
	}
	m, err := metrics.New(prometheus.NewRegistry(), &cfg)
	if err != nil {
		tb.Fatal(err)
	}
	g, err := New(Options{Config: &cfg, Metrics: m, Logger: slog.New(slog.DiscardHandler), Limiter: lim, Ledger: ledger})
	if err != nil {
		tb.Fatal(err)
	}
	return g
}

// alphaChat is a chat completion request carrying key alpha, as
// governOnce takes it.
func alphaChat() *http.Request {
	r, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, "/v1/chat/completions", nil)
	r.Header.Set("Authorization", "Bearer "+keyAlpha)
	return r
}

// governOnce takes one chat completion of key alpha (r, see alphaChat),
// arrived at in, through governance: identified from its headers, admitted
// (its prompt estimate and max_tokens being u's), the rate-limit headers
// set, answered and settled with u.
func governOnce(tb testing.TB, g *Gateway, w *discardWriter, r *http.Request, in time.Time, u llm.Usage) {
	ex := exchange{g: g, gen: g.gen.Load(), w: w, r: r, promptEstimate: u.Input, kind: kindModelCall, answer: llm.DialectOpenAI}
	ex.rec.Route, ex.rec.Dialect, ex.rec.Model = llm.RouteChatCompletions, llm.DialectOpenAI, "gpt-4o"
	ex.rec.Timing.In = in
	ex.info.MaxTokens = u.Output
	if _, aerr := ex.identify(readKeys(r.Header)); aerr != nil {
		tb.Fatal(aerr)
	}
	if rf := ex.admit(); !rf.ok() {
		tb.Fatal("refused")
	}
	if len(ex.rlStates) > 0 {
		setRateLimitHeaders(w.h, ex.rec.Dialect, ex.rlStates, in)
	}
	ex.rec.Status, ex.rec.Timing.UpFirstByte = 200, in
	ex.rec.Usage = u
	ex.settle(&ex.rec, ex.chargeFor(&ex.rec))
}
