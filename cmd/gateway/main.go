// Command gateway is tollgate, an LLM API gateway: it forwards OpenAI and
// Anthropic API traffic to an upstream and measures what callers feel.
//
//	gateway serve -config gateway.toml   run the gateway
//	gateway demo                         fake upstream + gateway + traffic, then the figures
//	gateway mock-upstream                the fake upstream alone
//	gateway check-config -config FILE    validate a config file
//	gateway hash-key < keyfile           print a key's SHA-256 for [[keys]]
//	gateway keys create -name NAME       issue a runtime key (list, show, revoke, rotate, audit)
//	gateway spend -url URL               spend per key, team, model and day
//	gateway bench -url URL               client-side TTFT, TPOT, ITL, E2E and goodput
//	gateway version                      print the version
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/internal/jsonlog"
	"github.com/tollgate-llm/tollgate/proxy"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

type command struct {
	name    string
	summary string
	run     func(args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"serve", "run the gateway with a config file", runServe},
		{"demo", "start a fake upstream and the gateway on loopback, send traffic, print the figures", runDemo},
		{"mock-upstream", "serve the fake OpenAI/Anthropic upstream alone", runMock},
		{"check-config", "validate a config file and print the effective settings", runCheckConfig},
		{"hash-key", "print the SHA-256 of a gateway key (read from stdin) for [[keys]]", runHashKey},
		{"keys", "issue, list, revoke and rotate gateway keys at runtime through a running gateway", runKeys},
		{"spend", "print what keys and teams spent (or their limits) from a running gateway", runSpend},
		{"bench", "load an OpenAI- or Anthropic-compatible endpoint and report TTFT, TPOT, ITL, E2E and goodput", runBench},
		{"version", "print the version", runVersion},
	}
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// errUsage marks a command-line mistake; the usage has been printed.
var errUsage = errors.New("usage")

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands() {
		if c.name == args[0] {
			err := c.run(args[1:], stdout, stderr)
			switch {
			case err == nil, errors.Is(err, flag.ErrHelp):
				return 0
			case errors.Is(err, errUsage):
				return 2
			default:
				fmt.Fprintln(stderr, "gateway "+c.name+": "+err.Error())
				return 1
			}
		}
	}
	fmt.Fprintf(stderr, "gateway: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "tollgate — an LLM API gateway that measures TTFT, TPOT, ITL and end-to-end latency.")
	fmt.Fprintln(w, "\nUsage: gateway <command> [flags]\n\nCommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-14s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun 'gateway <command> -h' for a command's flags.")
}

// newFlagSet returns a flag set whose -h prints a description first.
func newFlagSet(name, description string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: gateway %s [flags]\n\n%s\n\nFlags:\n", name, description)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args, mapping a bad flag to errUsage.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "unexpected arguments: %s\n", strings.Join(fs.Args(), " "))
		fs.Usage()
		return errUsage
	}
	return nil
}

func runVersion(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("version", "Prints tollgate's version and the Go version it was built with.", stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	v := version
	if bi, ok := debug.ReadBuildInfo(); ok && v == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v = bi.Main.Version
	}
	fmt.Fprintf(stdout, "tollgate %s (%s, %s/%s)\n", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return nil
}

func runCheckConfig(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("check-config",
		"Loads a config file strictly (unknown keys and wrong types are errors), applies defaults,\n"+
			"resolves api_key_env variables and validates every setting. Prints the effective\n"+
			"configuration (secrets redacted) and exits 0, after a warning for each setting that does\n"+
			"nothing (such as a fallback no caller can use), or lists every problem and exits 1.\n"+
			"With -against URL, asks that running gateway (POST /admin/reload?check=true, the admin\n"+
			"token from the variable -token-env names) whether the file would reload cleanly there,\n"+
			"under its environment, and prints what would change.", stderr)
	path := fs.String("config", "gateway.toml", "config file to check")
	against := fs.String("against", "", "a running gateway's base URL to check the file against")
	tokenEnv := fs.String("token-env", "TOLLGATE_ADMIN_TOKEN", "environment variable holding the admin token, with -against")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *against != "" {
		return checkAgainst(stdout, *path, *against, *tokenEnv)
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: ok\n", *path)
	for _, w := range cfg.Warnings() {
		fmt.Fprintf(stdout, "warning: %s\n", w)
	}
	fmt.Fprintf(stdout, "\n%s", cfg.Redacted())
	printRuntimeKeys(stdout, cfg)
	return nil
}

// checkAgainst asks a running gateway whether the file at path would reload
// cleanly there, and prints what would change.
func checkAgainst(stdout io.Writer, path, base, tokenEnv string) error {
	token := os.Getenv(tokenEnv)
	if token == "" {
		return fmt.Errorf("$%s is not set: it must hold the gateway's admin token", tokenEnv)
	}
	doc, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	u := strings.TrimRight(base, "/") + "/admin/reload?check=true&name=" + url.QueryEscape(filepath.Base(path))
	body, err := adminCall(http.MethodPost, u, token, doc)
	if err != nil {
		return err
	}
	var rep proxy.ReloadReport
	if err := json.Unmarshal(body, &rep); err != nil {
		return fmt.Errorf("decoding /admin/reload: %w", err)
	}
	if len(rep.Changed) == 0 {
		fmt.Fprintf(stdout, "%s: would reload cleanly on %s; nothing would change\n", path, base)
		return nil
	}
	fmt.Fprintf(stdout, "%s: would reload cleanly on %s; would change: %s\n", path, base, strings.Join(rep.Changed, ", "))
	return nil
}

// newLoggers builds the operational logger (stderr) and the access log
// (stdout, one line per request) from the [log] table.
func newLoggers(lc config.Log, level *slog.LevelVar, stdout, stderr io.Writer) (ops, access *slog.Logger) {
	_ = level.UnmarshalText([]byte(lc.Level))
	opts := &slog.HandlerOptions{Level: level}
	mk := func(w io.Writer) *slog.Logger {
		if lc.Format == "text" {
			return slog.New(slog.NewTextHandler(w, opts))
		}
		return slog.New(jsonlog.NewHandler(w, opts)) // slog's JSON lines, written faster
	}
	ops = mk(stderr)
	if lc.AccessLog {
		access = mk(stdout)
	}
	return ops, access
}
