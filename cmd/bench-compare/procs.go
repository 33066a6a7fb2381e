package main

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/template"
	"time"

	"github.com/tollgate-llm/tollgate/internal/procstat"
)

// target is one endpoint the load is sent to: the fake upstream itself
// (direct), nginx, or a tollgate build. pids are the processes whose CPU
// and memory are its own (nginx: master and workers).
type target struct {
	name string
	url  string
	cmd  *exec.Cmd
	// exited is closed once the process has been waited for.
	exited <-chan struct{}
	pids   func() []int
	// c is the driver's client for this target, kept across the warm-up
	// and the rounds so that they reuse its connections.
	c *http.Client
}

// client returns the target's client, made for conns connections.
func (t *target) client(conns int) *http.Client {
	if t.c == nil {
		t.c = newClient(conns)
	}
	return t.c
}

func (t *target) stop() {
	if t.c != nil {
		t.c.CloseIdleConnections()
	}
	if t.cmd != nil && t.cmd.Process != nil {
		_ = t.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-t.exited:
		case <-time.After(5 * time.Second):
			_ = t.cmd.Process.Kill()
			<-t.exited
		}
	}
}

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// start runs name with args in dir, its output to dir/<label>.log, and
// waits until url answers (any status). exited is closed once the process
// has ended and been waited for (by start's own goroutine, the only one).
func start(label, dir, url string, env []string, name string, args ...string) (cmd *exec.Cmd, exited <-chan struct{}, err error) {
	logf, err := os.Create(filepath.Join(dir, label+".log"))
	if err != nil {
		return nil, nil, err
	}
	cmd = exec.Command(name, args...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, logf, logf
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, nil, fmt.Errorf("starting %s: %w", label, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			return cmd, done, nil
		}
		time.Sleep(50 * time.Millisecond) // waiting for the process to listen
	}
	_ = cmd.Process.Kill()
	<-done
	log, _ := os.ReadFile(filepath.Join(dir, label+".log"))
	return nil, nil, fmt.Errorf("%s did not answer at %s within 20 s; its log:\n%s", label, url, log)
}

// buildGateway builds ./cmd/gateway of the tree at src into out.
func buildGateway(src, out string) error {
	cmd := exec.Command("go", "build", "-o", out, "./cmd/gateway")
	cmd.Dir = src
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build in %s: %v\n%s", src, err, b)
	}
	return nil
}

// buildRevision builds the gateway of git revision rev of the repository
// at repo, in a worktree removed afterwards.
func buildRevision(repo, rev, out string) error {
	wt, err := os.MkdirTemp("", "bench-compare-base-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(wt)
	add := exec.Command("git", "worktree", "add", "--detach", wt, rev)
	add.Dir = repo
	if b, err := add.CombinedOutput(); err != nil {
		return fmt.Errorf("git worktree add %s: %v\n%s", rev, err, b)
	}
	defer func() {
		rm := exec.Command("git", "worktree", "remove", "--force", wt)
		rm.Dir = repo
		_ = rm.Run()
	}()
	return buildGateway(wt, out)
}

// gatewayConfig is tollgate's config for the run: one upstream (the fake
// one), callers' keys passed through, and every other setting its default
// (metrics, access log, ledger journal, parser: what tollgate always does).
func gatewayConfig(listen, upstream string, h2c bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[server]\nlisten = %q\n\n[auth]\nmode = \"passthrough\"\nrequire_key = false\n\n", listen)
	fmt.Fprintf(&b, "[[upstreams]]\nname = \"mock\"\nbase_url = %q\ndialects = [\"openai\", \"anthropic\"]\nmax_idle_conns = 2048\n", "http://"+upstream)
	if h2c {
		b.WriteString("h2c = true\n")
	}
	return b.String()
}

// startTollgate starts the gateway binary bin on a free port in its own
// directory under dir, with env added to its environment.
func startTollgate(label, bin, dir, upstream string, h2c bool, env []string) (*target, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	d := filepath.Join(dir, label)
	if err := os.MkdirAll(d, 0o755); err != nil {
		return nil, err
	}
	listen := fmt.Sprintf("127.0.0.1:%d", port)
	if err := os.WriteFile(filepath.Join(d, "gateway.toml"), []byte(gatewayConfig(listen, upstream, h2c)), 0o644); err != nil {
		return nil, err
	}
	url := "http://" + listen
	cmd, exited, err := start(label, d, url+"/healthz", env, bin, "serve", "-config", "gateway.toml")
	if err != nil {
		return nil, err
	}
	return &target{name: label, url: url, cmd: cmd, exited: exited, pids: func() []int { return []int{cmd.Process.Pid} }}, nil
}

// startMock starts the fake upstream (tollgate's mock-upstream); each
// request sets its own timing with X-Mock-* headers.
func startMock(bin, dir string) (*target, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	listen := fmt.Sprintf("127.0.0.1:%d", port)
	cmd, exited, err := start("mock", dir, "http://"+listen+"/", nil, bin, "mock-upstream", "-listen", listen, "-ttft", "0s", "-itl", "0s")
	if err != nil {
		return nil, err
	}
	return &target{name: "direct", url: "http://" + listen, cmd: cmd, exited: exited, pids: func() []int { return []int{cmd.Process.Pid} }}, nil
}

// nginxTemplate is the nginx config the run uses, relative to the repo.
const nginxTemplate = "deploy/nginx/nginx.conf.tmpl"

// startNginx starts nginx from the repo's template, proxying to upstream.
func startNginx(nginx, repo, dir, upstream string, noFile uint64) (*target, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	d := filepath.Join(dir, "nginx")
	if err := os.MkdirAll(d, 0o755); err != nil {
		return nil, err
	}
	tmpl, err := template.ParseFiles(filepath.Join(repo, nginxTemplate))
	if err != nil {
		return nil, err
	}
	listen := fmt.Sprintf("127.0.0.1:%d", port)
	var conf bytes.Buffer
	if err := tmpl.Execute(&conf, map[string]any{
		"Dir": d, "Listen": listen, "Upstream": upstream,
		"NoFile": noFile, "Connections": noFile,
	}); err != nil {
		return nil, err
	}
	path := filepath.Join(d, "nginx.conf")
	if err := os.WriteFile(path, conf.Bytes(), 0o644); err != nil {
		return nil, err
	}
	url := "http://" + listen
	cmd, exited, err := start("nginx", d, url+"/", nil, nginx, "-p", d, "-c", path)
	if err != nil {
		return nil, err
	}
	master := cmd.Process.Pid
	return &target{name: "nginx", url: url, cmd: cmd, exited: exited, pids: func() []int { return append([]int{master}, children(master)...) }}, nil
}

// children lists the processes whose parent is pid.
func children(pid int) []int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return nil
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// cpuSeconds sums user and system CPU of pids.
func cpuSeconds(pids []int) float64 {
	var sum float64
	for _, p := range pids {
		sum += procstat.CPUSeconds(p)
	}
	return sum
}

// resetPeak starts pids' peak RSS afresh (VmHWM back to VmRSS).
func resetPeak(pids []int) error {
	var errs []error
	for _, p := range pids {
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", p), []byte("5"), 0); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// memKiB sums a /proc/<pid>/status field (VmHWM, VmRSS) over pids, in KiB.
func memKiB(pids []int, field string) int64 {
	var sum int64
	for _, p := range pids {
		sum += procstat.StatusKiB(p, field)
	}
	return sum
}

// raiseNoFile lifts this process's open-file soft limit to its hard limit
// (children inherit it) and returns it.
func raiseNoFile() uint64 {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) != nil {
		return 1024
	}
	l.Cur = l.Max
	_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	return l.Cur
}
