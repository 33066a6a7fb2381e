package deploy_test

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// BenchmarkStartToReady measures the time from exec of `gateway serve` to
// its first 200 from GET /readyz, the figure an orchestrator waits for
// before a new replica takes traffic. The binary is built as the
// Dockerfile builds it (static, stripped), and serves the repository's
// gateway.toml, the image's default config, on a free loopback port, from
// an empty working directory as a fresh container would. /readyz is polled
// every 0.5 ms, so the figure is at most that much late. Each stop
// (SIGTERM, drain) is outside the timed part.
//
//	go test -run '^$' -bench StartToReady -benchtime 20x ./deploy/
func BenchmarkStartToReady(b *testing.B) {
	root, err := filepath.Abs("..")
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	bin := filepath.Join(dir, "gateway")
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "./cmd/gateway")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	starter, err := os.ReadFile(filepath.Join(root, "gateway.toml"))
	if err != nil {
		b.Fatal(err)
	}
	client := &http.Client{Timeout: time.Second}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		addr := freeAddr(b)
		cfg := strings.Replace(string(starter), `listen = ":8080"`, `listen = "`+addr+`"`, 1)
		if cfg == string(starter) {
			b.Fatal(`gateway.toml has no listen = ":8080" line to replace`)
		}
		work := filepath.Join(dir, "run")
		_ = os.RemoveAll(work)
		if err := os.MkdirAll(work, 0o755); err != nil {
			b.Fatal(err)
		}
		cfgPath := filepath.Join(work, "gateway.toml")
		if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
			b.Fatal(err)
		}
		cmd := exec.Command(bin, "serve", "-config", cfgPath)
		cmd.Dir = work
		b.StartTimer()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			resp, err := client.Get("http://" + addr + "/readyz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Now().After(deadline) {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				b.Fatal("not ready after 30 s")
			}
			time.Sleep(500 * time.Microsecond)
		}
		b.StopTimer()
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		client.CloseIdleConnections()
		b.StartTimer()
	}
}
