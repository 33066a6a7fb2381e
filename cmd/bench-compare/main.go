// Command bench-compare measures tollgate side by side with nginx and with
// no proxy at all, on loopback, in one run: it builds the gateway, starts
// the fake upstream (mock-upstream), nginx (Debian's, with the repo's
// deploy/nginx/nginx.conf.tmpl) and tollgate as processes of their own,
// drives each with the same load in rounds whose order rotates (A/B/A/B),
// and prints per shape the latency each proxy adds to the direct
// connection, requests per second, the proxy's CPU per 1,000 requests and
// its peak RSS (from /proc), with tollgate's ratio to nginx. Medians over
// the rounds. Run it as `make bench-compare` from the repo's root.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// shapes are the loads of a full run; quick is a smoke test of each.
func shapes(quick bool, held int) []shape {
	if quick {
		return []shape{
			{name: "stream", concurrency: 8, requests: 16, stream: true, ttft: 20 * time.Millisecond, itl: 2 * time.Millisecond, tokens: 20},
			{name: "nodelay", concurrency: 4, requests: 40, stream: true, tokens: 50},
			{name: "unary", concurrency: 4, requests: 100, tokens: 16},
			{name: "held", requests: min(held, 50), stream: true, itl: time.Minute, tokens: 2, held: true},
		}
	}
	return []shape{
		{name: "stream256", concurrency: 256, requests: 512, stream: true, ttft: 200 * time.Millisecond, itl: 20 * time.Millisecond, tokens: 100},
		{name: "stream1000", concurrency: 1000, requests: 1000, stream: true, ttft: 200 * time.Millisecond, itl: 20 * time.Millisecond, tokens: 100},
		{name: "nodelay64", concurrency: 64, requests: 2000, stream: true, tokens: 200},
		{name: "unary64", concurrency: 64, requests: 20000, tokens: 16},
		{name: "held", requests: held, stream: true, itl: time.Minute, tokens: 2, held: true},
	}
}

func main() {
	if err := run1(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench-compare:", err)
		os.Exit(1)
	}
}

// options are the command's flags.
type options struct {
	rounds  int
	only    string
	held    int
	quick   bool
	base    string
	nginx   string
	repo    string
	h2c     bool
	noNginx bool
	timeout time.Duration
	env     []string // NAME=value for the tollgate column's process
}

func run1(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("bench-compare", flag.ContinueOnError)
	var o options
	fs.IntVar(&o.rounds, "rounds", 3, "rounds per shape; each runs every target once, in an order that rotates")
	fs.StringVar(&o.only, "shapes", "", "comma-separated shapes to run (default: all)")
	fs.IntVar(&o.held, "held", 10000, "streams the held shape opens at once")
	fs.BoolVar(&o.quick, "quick", false, "tiny loads: a smoke test of the tool, not a measurement")
	fs.StringVar(&o.base, "base", "", "also build and measure tollgate at this git revision (column tollgate@REV)")
	fs.StringVar(&o.nginx, "nginx", "/usr/sbin/nginx", "the nginx binary")
	fs.BoolVar(&o.noNginx, "no-nginx", false, "leave nginx out")
	fs.StringVar(&o.repo, "repo", ".", "the tollgate repository")
	fs.BoolVar(&o.h2c, "upstream-h2c", false, "tollgate speaks HTTP/2 without TLS to the fake upstream ([[upstreams]] h2c)")
	fs.Func("env", "NAME=value in the environment of the tollgate column's process (not of -base's), e.g. GOMAXPROCS=1; repeatable", func(v string) error {
		if name, _, ok := strings.Cut(v, "="); !ok || name == "" {
			return fmt.Errorf("%q is not NAME=value", v)
		}
		o.env = append(o.env, v)
		return nil
	})
	fs.DurationVar(&o.timeout, "timeout", 3*time.Minute, "bound on one target's run of one shape")
	if err := fs.Parse(args); err != nil {
		return err
	}
	return compare(o, out)
}

func compare(o options, out io.Writer) error {
	noFile := raiseNoFile()
	dir, err := os.MkdirTemp("", "bench-compare-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	repo, err := filepath.Abs(o.repo)
	if err != nil {
		return err
	}
	bin := filepath.Join(dir, "gateway")
	if err := buildGateway(repo, bin); err != nil {
		return err
	}
	baseBin := ""
	if o.base != "" {
		baseBin = filepath.Join(dir, "gateway-base")
		if err := buildRevision(repo, o.base, baseBin); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "# bench-compare %s\n\n%s; %d cores; open files %d; %s\n", time.Now().UTC().Format(time.RFC3339), runtime.Version(), runtime.NumCPU(), noFile, nginxVersion(o.nginx, o.noNginx))
	if len(o.env) > 0 {
		fmt.Fprintf(out, "tollgate's environment adds %s\n", strings.Join(o.env, " "))
	}
	for _, s := range shapes(o.quick, o.held) {
		if o.only != "" && !slices.Contains(strings.Split(o.only, ","), s.name) {
			continue
		}
		// Fresh processes for every shape: a peak RSS is then this
		// shape's, not what an earlier one left behind.
		targets, err := launch(o, repo, filepath.Join(dir, s.name), bin, baseBin, noFile)
		if err != nil {
			return err
		}
		fmt.Fprintln(out)
		for _, t := range targets {
			fmt.Fprintf(out, "- %s: %s, pids %v\n", t.name, t.url, t.pids())
			warm(s, t)
		}
		fmt.Fprintln(out)
		res := measure(s, targets, o)
		for _, t := range targets {
			t.stop()
		}
		writeTable(out, s, targets, res)
	}
	return nil
}

// launch starts the fake upstream and every proxy in dir.
func launch(o options, repo, dir, bin, baseBin string, noFile uint64) ([]*target, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	mock, err := startMock(bin, dir)
	if err != nil {
		return nil, err
	}
	targets := []*target{mock}
	fail := func(err error) ([]*target, error) {
		for _, t := range targets {
			t.stop()
		}
		return nil, err
	}
	upstream := strings.TrimPrefix(mock.url, "http://")
	if !o.noNginx {
		ng, err := startNginx(o.nginx, repo, dir, upstream, noFile-64)
		if err != nil {
			return fail(err)
		}
		targets = append(targets, ng)
	}
	tg, err := startTollgate("tollgate", bin, dir, upstream, o.h2c, o.env)
	if err != nil {
		return fail(err)
	}
	targets = append(targets, tg)
	if baseBin != "" {
		bt, err := startTollgate("tollgate@"+o.base, baseBin, dir, upstream, false, nil)
		if err != nil {
			return fail(err)
		}
		targets = append(targets, bt)
	}
	return targets, nil
}

// warm opens the connections a shape will use (the driver's to the target
// and the target's to the upstream) with one short request each, so that
// the first round does not measure connection setup.
func warm(s shape, t *target) {
	n := s.concurrency
	if s.held {
		return
	}
	w := shape{name: "warm-up", concurrency: n, requests: n, stream: s.stream, tokens: 1}
	drive(w, t, 30*time.Second)
}

// measure runs s against every target, o.rounds times, rotating the order.
func measure(s shape, targets []*target, o options) map[string][]run {
	res := map[string][]run{}
	for round := range o.rounds {
		for i := range targets {
			t := targets[(i+round)%len(targets)]
			if s.held {
				if t.name == "direct" {
					continue
				}
				res[t.name] = append(res[t.name], holdStreams(s, t, o.timeout))
			} else {
				res[t.name] = append(res[t.name], drive(s, t, o.timeout))
			}
			time.Sleep(300 * time.Millisecond) // let sockets close between runs
		}
	}
	return res
}

func nginxVersion(nginx string, off bool) string {
	if off {
		return "no nginx"
	}
	b, err := exec.Command(nginx, "-v").CombinedOutput()
	if err != nil {
		return "nginx: " + err.Error()
	}
	return strings.TrimSpace(string(b))
}
