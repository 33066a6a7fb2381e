package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/tollgate-llm/tollgate/bench"
	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
)

// runBench is `gateway bench`: a load run against a base URL, reported as a
// table (or JSON), with a non-zero exit when goodput is under -min-goodput so
// it can gate a release.
func runBench(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench",
		"Streams requests to an OpenAI- or Anthropic-compatible endpoint (a tollgate gateway or any\n"+
			"other) and reports, per prompt size, the client-side TTFT, TPOT, ITL and E2E (mean, median,\n"+
			"P95, P99), output tokens/s, goodput against the SLOs and errors by kind. The API key is read\n"+
			"from the environment variable named by -key-env, never from the command line.", stderr)
	def := config.Default().SLO
	url := fs.String("url", "", "base URL of the endpoint, e.g. http://127.0.0.1:8080 (required)")
	dialect := fs.String("dialect", "openai", "API: openai (POST /v1/chat/completions) or anthropic (POST /v1/messages)")
	model := fs.String("model", "", "model named in every request (required)")
	keyEnv := fs.String("key-env", "", "environment variable holding the API key (optional)")
	requests := fs.Int("requests", 30, "total requests")
	concurrency := fs.Int("concurrency", 4, "requests in flight at most (with -rate: no cap unless given)")
	rate := fs.Float64("rate", 0, "requests per second with Poisson arrivals (0: fixed concurrency)")
	maxTokens := fs.Int("max-tokens", 256, "max output tokens per request")
	prompts := fs.String("prompts", "", "JSONL file of prompts ({\"messages\":[...]} or {\"prompt\":\"...\"} per line); default: built-in short, medium and long prompts")
	ttft := fs.Float64("slo-ttft-ms", def.TTFTMs, "TTFT objective in ms for goodput (0: unchecked)")
	tpot := fs.Float64("slo-tpot-ms", def.TPOTMs, "TPOT objective in ms for goodput (0: unchecked)")
	e2e := fs.Float64("slo-e2e-ms", def.E2ELMs, "E2E objective in ms for goodput (0: unchecked)")
	timeout := fs.Duration("timeout", 5*time.Minute, "per-request timeout")
	seed := fs.Int64("seed", 1, "seed for prompt order and arrivals")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	minGoodput := fs.Float64("min-goodput", 0, "exit with status 1 when the goodput ratio over all requests is below this (0 to 1)")
	quiet := fs.Bool("quiet", false, "no progress bar on stderr")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	concurrencySet := false
	fs.Visit(func(f *flag.Flag) { concurrencySet = concurrencySet || f.Name == "concurrency" })
	if *rate > 0 && !concurrencySet {
		// With -rate the arrivals set the load; a default cap of 4 in
		// flight would hide a saturated service behind queueing.
		*concurrency = 0
	}
	cfg := bench.Config{
		BaseURL: *url, Model: *model, Requests: *requests, Concurrency: *concurrency, Rate: *rate,
		MaxTokens: *maxTokens, Timeout: *timeout, Seed: *seed,
		SLO: llm.SLOTargets{TTFT: config.Millis(*ttft), TPOT: config.Millis(*tpot), E2E: config.Millis(*e2e)},
	}
	switch *dialect {
	case "openai":
		cfg.Dialect = llm.DialectOpenAI
	case "anthropic":
		cfg.Dialect = llm.DialectAnthropic
	default:
		fmt.Fprintf(stderr, "-dialect %q: want openai or anthropic\n", *dialect)
		return errUsage
	}
	if *url == "" || *model == "" {
		fmt.Fprintln(stderr, "-url and -model are required")
		return errUsage
	}
	if *minGoodput < 0 || *minGoodput > 1 {
		fmt.Fprintln(stderr, "-min-goodput must be between 0 and 1")
		return errUsage
	}
	if *keyEnv != "" {
		cfg.APIKey = os.Getenv(*keyEnv)
		if cfg.APIKey == "" {
			return fmt.Errorf("environment variable %s is not set or is empty", *keyEnv)
		}
	}
	if *prompts != "" {
		f, err := os.Open(*prompts)
		if err != nil {
			return err
		}
		ps, err := bench.LoadPrompts(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", *prompts, err)
		}
		cfg.Prompts = ps
	}
	if !*quiet {
		cfg.Progress = stderr
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := bench.Run(ctx, cfg)
	if res == nil {
		return err
	}
	if *asJSON {
		if werr := res.WriteJSON(stdout); werr != nil {
			return werr
		}
	} else if werr := res.WriteTable(stdout); werr != nil {
		return werr
	}
	if err != nil {
		return err // interrupted: the partial report is printed
	}
	if all := res.Summary(bench.ClassAll); *minGoodput > 0 && (all == nil || all.Goodput.Ratio < *minGoodput) {
		ratio := 0.0
		if all != nil {
			ratio = all.Goodput.Ratio
		}
		return fmt.Errorf("goodput %.3f is below -min-goodput %.3f", ratio, *minGoodput)
	}
	return nil
}
