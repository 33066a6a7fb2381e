package deploy_test

import (
	"bytes"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		// The gateway binary gatewayBinary built, if a test asked for it.
		if gatewayBuild.dir != "" {
			os.RemoveAll(gatewayBuild.dir)
		}
		os.Exit(code)
	}))
}

// repoRoot returns the module root: tests run in deploy.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found from the test's directory: %v", err)
	}
	return root
}

// readFile returns the text of the file at name below root.
func readFile(t *testing.T, root, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// expandVars expands $VAR, ${VAR} and ${VAR:-default} as Compose and the
// Dockerfile do, from vars; unset variables expand to their default or "".
func expandVars(s string, vars map[string]string) string {
	return os.Expand(s, func(name string) string {
		def := ""
		if i := strings.Index(name, ":-"); i >= 0 {
			name, def = name[:i], name[i+2:]
		}
		if v := vars[name]; v != "" {
			return v
		}
		return def
	})
}

// flagValue returns the argument after flag name in args.
func flagValue(args []string, name string) (string, bool) {
	i := slices.Index(args, name)
	if i < 0 || i+1 >= len(args) {
		return "", false
	}
	return args[i+1], true
}

// freeAddr returns a loopback address that nothing listens on, for a process
// that takes its listen address as a flag or in its config.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// runUntilReady starts cmd, keeping its output, and returns once a GET of
// ready answers 200; it fails the test when the process exits first or wait
// passes. When the test ends the process gets SIGTERM (SIGKILL after 10 s)
// and is waited for, and its output is logged if the test failed.
func runUntilReady(t *testing.T, what string, cmd *exec.Cmd, ready string, wait time.Duration) {
	t.Helper()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		// Read only once the process is gone: its output is written by
		// exec's copying goroutine until then.
		if t.Failed() {
			t.Logf("%s output:\n%s", what, out.String())
		}
	})

	deadline := time.Now().Add(wait)
	for {
		select {
		case err := <-exited:
			exited <- err // for the cleanup
			t.Fatalf("%s exited: %v", what, err)
		default:
		}
		if resp, err := http.Get(ready); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready at %s after %v", what, ready, wait)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
