package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tollgate-llm/tollgate/bench"
	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
)

// runBench is `gateway bench`: a load run against a base URL, reported as a
// table (or JSON), beside the gateway's own /stats figures when the target is
// a tollgate, with a non-zero exit when goodput is under -min-goodput so it
// can gate a release.
func runBench(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench",
		"Streams requests to an OpenAI- or Anthropic-compatible endpoint (a tollgate gateway or any\n"+
			"other) and reports, per prompt size, the client-side TTFT, TPOT, ITL and E2E (mean, median,\n"+
			"P95, P99), output tokens/s, goodput against the SLOs and errors by kind; against a tollgate,\n"+
			"also the gateway's own figures for the run from its /stats (-gateway-stats). The API key is\n"+
			"read from the environment variable named by -key-env, never from the command line; neither\n"+
			"it nor credentials in a URL (user:password@) are sent to /stats. With -turns N above 1, each\n"+
			"worker runs conversations of N turns, one after another: on openai and anthropic every turn\n"+
			"carries -conversation-header and the history so far; on responses the turns chain through\n"+
			"previous_response_id (\"store\": true) with no header. The report adds conversations\n"+
			"started, completed, failed and cut short by -requests, and TTFT of first and later turns.", stderr)
	def := config.Default().SLO
	url := fs.String("url", "", "base URL of the endpoint, e.g. http://127.0.0.1:8080 (required)")
	dialect := fs.String("dialect", "openai", "API: openai (POST /v1/chat/completions), anthropic (POST /v1/messages) or responses (POST /v1/responses); -api is the same flag")
	fs.StringVar(dialect, "api", "openai", "the same as -dialect")
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
	sweep := fs.String("sweep", "", "concurrency sweep: comma-separated increasing levels, e.g. 1,2,4,8,16; -requests per level; reports the saturation point (the highest level meeting -sweep-goodput and, when set, P99 TTFT ≤ -slo-ttft-ms)")
	sweepGoodput := fs.Float64("sweep-goodput", bench.DefaultSweepTarget, "with -sweep: the goodput ratio a level must reach (0 to 1)")
	sweepStop := fs.Bool("sweep-stop", true, "with -sweep: run no level after the first that breaks")
	stages := fs.String("stages", "", "staged run: comma-separated request counts, e.g. 5,30,100, run in order; stops at the first stage with a failed request")
	turns := fs.Int("turns", 1, "turns per conversation (1: every request stands alone); -requests still bounds the requests, so the last conversation is cut short when they are no multiple of -turns; not with -rate")
	convHeader := fs.String("conversation-header", bench.DefaultConversationHeader, "with -turns above 1, on openai and anthropic: the header carrying each conversation's id, <run-id>-<n>")
	gwStats := fs.String("gateway-stats", "auto", "the gateway's own figures for the run, from its /stats, beside the client's: auto (from -url's host, shown when it answers as a tollgate), off, or the gateway's base or /stats URL (failing to read it is then reported)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	concurrencySet := set["concurrency"]
	var levels, counts []int
	if err := benchModeFlags(set, *sweep, *stages, *rate, stderr, &levels, &counts); err != nil {
		return err
	}
	if err := turnsFlags(set, *turns, *rate, *dialect, *convHeader, stderr); err != nil {
		return err
	}
	if *sweepGoodput <= 0 || *sweepGoodput > 1 {
		fmt.Fprintln(stderr, "-sweep-goodput must be more than 0 and at most 1")
		return errUsage
	}
	if levels != nil && !set["requests"] {
		// A sweep level needs at least as many requests as its
		// concurrency, or it never reaches it.
		*requests = max(*requests, levels[len(levels)-1])
	}
	if *rate > 0 && !concurrencySet {
		// With -rate the arrivals set the load; a default cap of 4 in
		// flight would hide a saturated service behind queueing.
		*concurrency = 0
	}
	cfg := bench.Config{
		BaseURL: *url, Model: *model, Requests: *requests, Concurrency: *concurrency, Rate: *rate,
		MaxTokens: *maxTokens, Timeout: *timeout, Seed: *seed, Turns: *turns, ConversationHeader: *convHeader,
		SLO: llm.SLOTargets{TTFT: config.Millis(*ttft), TPOT: config.Millis(*tpot), E2E: config.Millis(*e2e)},
	}
	switch *dialect {
	case "openai":
		cfg.Dialect = llm.DialectOpenAI
	case "anthropic":
		cfg.Dialect = llm.DialectAnthropic
	case "responses":
		cfg.Dialect = llm.DialectResponses
	default:
		fmt.Fprintf(stderr, "-dialect %q: want openai, anthropic or responses\n", *dialect)
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
	gw := &statsWatch{stderr: stderr}
	switch *gwStats {
	case "off":
	case "auto":
		// A -url that is no URL fails the run itself, with its message.
		gw.url, _ = bench.StatsURL(*url)
	default:
		u, err := bench.StatsURL(*gwStats)
		if err != nil {
			fmt.Fprintf(stderr, "-gateway-stats: want auto, off or an http(s) URL: %v\n", err)
			return errUsage
		}
		gw.url, gw.explicit = u, true
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
	gw.start(ctx, cfg)
	err := runBenchMode(ctx, cfg, levels, counts, bench.SweepOptions{Target: *sweepGoodput, StopAfterBreak: *sweepStop},
		*minGoodput, *asJSON, gw, stdout)
	var ue *bench.UnauthorizedError
	if errors.As(err, &ue) && cfg.APIKey == "" {
		return fmt.Errorf("%w (no key was sent: name the variable that holds it with -key-env)", err)
	}
	return err
}

// runBenchMode runs and prints a plain run, a sweep (levels) or a staged run
// (counts).
func runBenchMode(ctx context.Context, cfg bench.Config, levels, counts []int, opt bench.SweepOptions,
	minGoodput float64, asJSON bool, gw *statsWatch, stdout io.Writer) error {
	switch {
	case levels != nil:
		return benchSweep(ctx, cfg, levels, opt, asJSON, gw, stdout)
	case counts != nil:
		return benchStages(ctx, cfg, counts, minGoodput, asJSON, gw, stdout)
	}
	res, err := bench.Run(ctx, cfg)
	if res == nil {
		return err
	}
	res.Gateway = gw.finish(ctx, res)
	if asJSON {
		if werr := res.WriteJSON(stdout); werr != nil {
			return werr
		}
	} else if werr := res.WriteTable(stdout); werr != nil {
		return werr
	}
	if err != nil {
		return err // interrupted or stopped: the partial report is printed
	}
	return gateGoodput(res, minGoodput)
}

// gateGoodput returns an error when res's goodput ratio over all requests is
// below minGoodput (unchecked when zero).
func gateGoodput(res *bench.Result, minGoodput float64) error {
	if all := res.Summary(bench.ClassAll); minGoodput > 0 && (all == nil || all.Goodput.Ratio < minGoodput) {
		ratio := 0.0
		if all != nil {
			ratio = all.Goodput.Ratio
		}
		return fmt.Errorf("goodput %.3f is below -min-goodput %.3f", ratio, minGoodput)
	}
	return nil
}

// benchModeFlags checks the flags of the -sweep and -stages modes and parses
// their lists into levels and counts (left nil when the mode is off).
func benchModeFlags(set map[string]bool, sweep, stages string, rate float64, stderr io.Writer, levels, counts *[]int) error {
	usage := func(msg string) error {
		fmt.Fprintln(stderr, msg)
		return errUsage
	}
	if sweep != "" && stages != "" {
		return usage("-sweep and -stages are mutually exclusive")
	}
	if sweep == "" && (set["sweep-goodput"] || set["sweep-stop"]) {
		return usage("-sweep-goodput and -sweep-stop need -sweep")
	}
	if sweep != "" {
		switch {
		case rate != 0:
			return usage("-rate is not allowed with -sweep: a sweep runs at fixed concurrency")
		case set["concurrency"]:
			return usage("-concurrency is not allowed with -sweep: the levels set it")
		case set["min-goodput"]:
			return usage("-min-goodput is not allowed with -sweep: use -sweep-goodput")
		}
		l, err := intList(sweep)
		if err != nil {
			return usage("-sweep: " + err.Error())
		}
		for i := 1; i < len(l); i++ {
			if l[i] <= l[i-1] {
				return usage("-sweep: levels must be strictly increasing")
			}
		}
		*levels = l
	}
	if stages != "" {
		if set["requests"] {
			return usage("-requests is not allowed with -stages: the stages set it")
		}
		c, err := intList(stages)
		if err != nil {
			return usage("-stages: " + err.Error())
		}
		*counts = c
	}
	return nil
}

// turnsFlags checks -turns and -conversation-header.
func turnsFlags(set map[string]bool, turns int, rate float64, dialect, header string, stderr io.Writer) error {
	usage := func(msg string) error {
		fmt.Fprintln(stderr, msg)
		return errUsage
	}
	switch {
	case turns < 1:
		return usage(fmt.Sprintf("-turns %d: want 1 or more", turns))
	case turns > 1 && rate != 0:
		return usage("-rate is not allowed with -turns above 1: a conversation's next turn follows its answer")
	case set["conversation-header"] && turns == 1:
		return usage("-conversation-header needs -turns above 1")
	case set["conversation-header"] && dialect == "responses":
		return usage("-conversation-header is not used with -dialect responses: its turns chain through previous_response_id")
	case !bench.ValidHeaderName(header):
		return usage(fmt.Sprintf("-conversation-header %q: not a header name", header))
	}
	return nil
}

// intList parses a comma-separated list of positive integers.
func intList(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q: want comma-separated positive integers", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// benchSweep runs and prints a concurrency sweep. It fails (exit 1) when no
// level passed, so a sweep can gate a release as -min-goodput does a run.
func benchSweep(ctx context.Context, cfg bench.Config, levels []int, opt bench.SweepOptions, asJSON bool, gw *statsWatch, stdout io.Writer) error {
	cfg.Rate, cfg.Concurrency = 0, 0
	sr, err := bench.Sweep(ctx, cfg, levels, opt)
	if sr == nil {
		return err
	}
	runs := make([]*bench.Result, len(sr.Levels))
	for i := range sr.Levels {
		runs[i] = sr.Levels[i].Result
	}
	sr.Gateway = gw.finish(ctx, runs...)
	write := sr.WriteTable
	if asJSON {
		write = sr.WriteJSON
	}
	if werr := write(stdout); werr != nil {
		return werr
	}
	if err != nil {
		return err // interrupted: the levels measured are printed
	}
	if sr.Saturation == 0 {
		return fmt.Errorf("no concurrency level met the sweep's targets (%d broke first)", sr.FirstBreak)
	}
	return nil
}

// benchStages runs and prints a staged run; -min-goodput gates the last
// stage run.
func benchStages(ctx context.Context, cfg bench.Config, counts []int, minGoodput float64, asJSON bool, gw *statsWatch, stdout io.Writer) error {
	res, err := bench.Stages(ctx, cfg, counts)
	if len(res) == 0 {
		return err
	}
	write := bench.WriteStagesTable
	if asJSON {
		write = bench.WriteStagesJSON
	}
	if werr := write(stdout, res, gw.finish(ctx, res...)); werr != nil {
		return werr
	}
	if err != nil {
		return err // a stage failed or the run was interrupted
	}
	return gateGoodput(res[len(res)-1], minGoodput)
}

// statsWatch is -gateway-stats: it reads the gateway's /stats before and
// after the run to show the gateway's figures beside the client's.
type statsWatch struct {
	url string // the /stats URL; "" when off
	// explicit is set when -gateway-stats named the URL: failing to read
	// it is then reported. In auto mode an endpoint whose /stats is no
	// tollgate report (any other API) gets no comparison, silently.
	explicit bool
	watch    *bench.GatewayWatch
	stderr   io.Writer
}

// start reads /stats before the run.
func (g *statsWatch) start(ctx context.Context, cfg bench.Config) {
	if g.url == "" {
		return
	}
	w, err := bench.WatchGateway(ctx, g.url, cfg, nil)
	if err != nil {
		if g.explicit {
			fmt.Fprintf(g.stderr, "gateway bench: -gateway-stats: %v; no comparison with the gateway's figures\n", err)
		}
		return
	}
	g.watch = w
}

// finish reads /stats after runs and returns the gateway's figures, or nil
// when there are none to show. A gateway that answered before the run and
// fails after it is reported in both modes.
func (g *statsWatch) finish(ctx context.Context, runs ...*bench.Result) *bench.GatewayStats {
	if g.watch == nil || len(runs) == 0 || ctx.Err() != nil {
		return nil // off, not a tollgate, or interrupted: the user wants out
	}
	gs, err := g.watch.Finish(ctx, runs...)
	if err != nil {
		fmt.Fprintf(g.stderr, "gateway bench: -gateway-stats: after the run: %v; no comparison with the gateway's figures\n", err)
		return nil
	}
	return gs
}
