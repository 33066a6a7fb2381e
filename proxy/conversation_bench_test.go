package proxy

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/conversation"
	"github.com/tollgate-llm/tollgate/internal/redistest"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/metrics"
)

// BenchmarkConversationTracking measures what conversation tracking adds
// to one request: reading its agent's hints, naming its conversation from
// the header, checking the team's budget per conversation (with a budget:
// one Cost read from the store) and recording the turn at finish. The
// store is in process (local) or in Redis (redis: Record batches; Cost is
// a round trip); "off" is the same request with tracking off. The
// "-session" cases are a Claude Code session's call instead: its session
// header and hint headers (class, agent, prompt, two tool runs), read and
// folded into the session's breakdown.
func BenchmarkConversationTracking(b *testing.B) {
	for _, tc := range []struct {
		name    string
		backend string
		budget  bool
		session bool
	}{
		{"off", "", false, false},
		{"local", "local", false, false},
		{"local-budget", "local", true, false},
		{"local-session", "local", false, true},
		{"redis", "redis", false, false},
		{"redis-budget", "redis", true, false},
		{"redis-session", "redis", false, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var store conversation.Store
			opts := conversation.Options{IdleTimeout: time.Hour, Interval: 50 * time.Millisecond}
			switch tc.backend {
			case "local":
				l, err := conversation.NewLocal(conversation.LocalOptions{Options: opts})
				if err != nil {
					b.Fatal(err)
				}
				store = l
			case "redis":
				rs, err := conversation.NewRedis(redistest.Start(b).Client(b), conversation.RedisOptions{Options: opts, Prefix: "bench:"})
				if err != nil {
					b.Fatal(err)
				}
				store = rs
			}
			if store != nil {
				defer store.Close()
			}
			g := conversationGateway(b, store, tc.budget)
			r, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, "/v1/chat/completions", nil)
			w := &discardWriter{h: http.Header{}}
			now := time.Now()
			i := 0
			b.ReportAllocs()
			b.ResetTimer()
			if tc.session {
				r.Header.Set("X-Claude-Code-Request-Class", "subagent")
				r.Header.Set("X-Claude-Code-Agent-Id", "7b7f0a52-1c38-4c2e-9d2e-5b1b2e3c4d5e")
				r.Header.Set("X-Claude-Code-Prev-Tool-Durations", "Bash=742;Read=9")
			}
			for b.Loop() {
				// 100 conversations of ever more turns.
				id := "bench-" + strconv.Itoa(i%100)
				if tc.session {
					r.Header.Set("X-Claude-Code-Session-Id", id)
					r.Header.Set("X-Claude-Code-Prompt-Id", "p-"+strconv.Itoa(i%1000))
				} else {
					r.Header.Set("X-Conversation-Id", id)
				}
				i++
				trackOnce(b, g, w, r, now)
			}
		})
	}
}

// conversationGateway is a gateway in mode "keys" with key alpha in team
// search, gpt-* priced, tracking conversations in store (off when nil),
// with a budget per conversation the benchmark never reaches when budget.
func conversationGateway(tb testing.TB, store conversation.Store, budget bool) *Gateway {
	tb.Helper()
	cfg := config.DemoConfig("http://127.0.0.1:1")
	cfg.Auth.Mode = "keys"
	cfg.Models = []config.Model{{Pattern: "gpt-*", InputUSDPerMTok: 2.5, OutputUSDPerMTok: 10}}
	cfg.Teams = []config.Team{{Name: "search"}}
	cfg.Keys = []config.Key{{Name: "alpha", SHA256: sha(keyAlpha), Team: "search"}}
	cfg.Conversations.Enabled = store != nil
	if budget {
		cfg.Teams[0].MaxCostPerConversationUSD = f64(1e9)
	}
	if err := cfg.Validate(); err != nil {
		tb.Fatal(err)
	}
	m, err := metrics.New(prometheus.NewRegistry(), &cfg)
	if err != nil {
		tb.Fatal(err)
	}
	g, err := New(Options{Config: &cfg, Metrics: m, Logger: slog.New(slog.DiscardHandler), Conversations: store})
	if err != nil {
		tb.Fatal(err)
	}
	return g
}

// trackOnce takes one chat completion of key alpha through what tracking
// does: identified, its conversation named, admitted (the budget checked),
// and its turn recorded as finish would.
func trackOnce(tb testing.TB, g *Gateway, w *discardWriter, r *http.Request, in time.Time) {
	ex := exchange{g: g, gen: g.gen.Load(), w: w, r: r, promptEstimate: 300, kind: kindModelCall, answer: llm.DialectOpenAI}
	ex.rec.Route, ex.rec.Dialect, ex.rec.Model = llm.RouteChatCompletions, llm.DialectOpenAI, "gpt-4o"
	ex.rec.Timing.In = in
	ex.info.MaxTokens = 150
	ex.info.agent = readAgentCall(r.Header, nil, "")
	if _, aerr := ex.identify(presented{bearer: keyHash(keyAlpha)}); aerr != nil {
		tb.Fatal(aerr)
	}
	if rf := ex.identifyConversation(); !rf.ok() {
		tb.Fatal(rf.err)
	}
	if rf := ex.admit(); !rf.ok() {
		tb.Fatal("refused")
	}
	ex.rec.Status, ex.rec.AttemptCount = 200, 1
	ex.rec.Timing.End, ex.rec.Timing.FirstTokenOut = in, in
	ex.rec.Usage = llm.Usage{Input: 300, Output: 150, HasInput: true, HasOutput: true}
	ex.rec.CostMicros = 2250
	ex.recordTurn(&ex.rec)
}
