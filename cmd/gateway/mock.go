package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/tollgate-llm/tollgate/mockllm"
)

// mockFlags are the fake upstream's knobs, shared by mock-upstream and demo.
type mockFlags struct {
	ttft, itl, jitter time.Duration
	tokens, perChunk  int
	maxConcurrent     int
	seed              int64
	requireKey        string
}

func (mf *mockFlags) register(fs interface {
	DurationVar(*time.Duration, string, time.Duration, string)
	IntVar(*int, string, int, string)
	Int64Var(*int64, string, int64, string)
}, ttft, itl, jitter time.Duration, tokens int) {
	fs.DurationVar(&mf.ttft, "ttft", ttft, "fake upstream: time to first token")
	fs.DurationVar(&mf.itl, "itl", itl, "fake upstream: delay between token events")
	fs.DurationVar(&mf.jitter, "jitter", jitter, "fake upstream: each delay varies uniformly within ±jitter/2")
	fs.IntVar(&mf.tokens, "tokens", tokens, "fake upstream: output tokens per answer")
	fs.IntVar(&mf.perChunk, "tokens-per-chunk", 1, "fake upstream: tokens per stream event")
	fs.IntVar(&mf.maxConcurrent, "max-concurrent", 0, "fake upstream: requests generated at once (0 = unlimited; others queue)")
	fs.Int64Var(&mf.seed, "seed", 1, "fake upstream: jitter seed")
}

func (mf *mockFlags) options(log *slog.Logger) mockllm.Options {
	return mockllm.Options{TTFT: mf.ttft, ITL: mf.itl, Jitter: mf.jitter, Seed: mf.seed, OutputTokens: mf.tokens,
		TokensPerChunk: mf.perChunk, MaxConcurrent: mf.maxConcurrent, RequireKey: mf.requireKey, Logger: log}
}

// mockServer serves h as the fake upstream does: HTTP/1.1 and HTTP/2
// without TLS (prior knowledge, for an upstream with h2c = true) on the
// same port, up to 1,000 streams on one HTTP/2 connection.
func mockServer(h http.Handler) *http.Server {
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, Protocols: &protocols,
		HTTP2: &http.HTTP2Config{MaxConcurrentStreams: 1000}}
}

func runMock(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("mock-upstream",
		"Serves the fake OpenAI/Anthropic upstream (package mockllm): POST /v1/chat/completions,\n"+
			"POST /v1/messages, /v1/messages/count_tokens, /v1/models, /v1/embeddings, with the\n"+
			"schedule below. Requests may override it with X-Mock-* headers (X-Mock-TTFT-Ms,\n"+
			"X-Mock-ITL-Ms, X-Mock-Output-Tokens, X-Mock-Fault: status=429;retry-after=2, ...;\n"+
			"see the mockllm package doc). Offered tools are called only when asked (X-Mock-Tool-Call:\n"+
			"1 or a tool's name, or the last user message naming the tool), never right after a tool\n"+
			"result, so an agent's loop ends. No key is needed unless -require-key-env is set.", stderr)
	var mf mockFlags
	mf.register(fs, 200*time.Millisecond, 20*time.Millisecond, 0, 32)
	listen := fs.String("listen", "127.0.0.1:9000", "address to serve on")
	keyEnv := fs.String("require-key-env", "", "environment variable holding the only API key the mock accepts")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *keyEnv != "" {
		mf.requireKey = os.Getenv(*keyEnv)
		if mf.requireKey == "" {
			return fmt.Errorf("environment variable %s is empty or unset", *keyEnv)
		}
	}
	log := slog.New(slog.NewJSONHandler(stderr, nil))
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listening on %q: %w", *listen, err)
	}
	srv := mockServer(mockllm.New(mf.options(log)))
	fmt.Fprintf(stdout, "fake upstream on http://%s (TTFT %s, ITL %s, %d tokens; HTTP/1.1 and h2c)\n", ln.Addr(), mf.ttft, mf.itl, mf.tokens)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
