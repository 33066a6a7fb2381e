package deploy_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/config"
)

// gatewayWait bounds the wait for the gateway process to serve.
const gatewayWait = 30 * time.Second

// startGateway builds ../cmd/gateway and runs `gateway serve` on a free
// loopback port with the config doc, which must say exactly what want
// does: want's [server] listen, shutdown_delay_seconds and
// drain_timeout_seconds are set here (the port, 0 and 5 s) and written
// before doc, which must not hold a [server] table. It returns the address
// the gateway serves on. When the test ends the process gets SIGTERM and
// is waited for.
func startGateway(t *testing.T, want config.Config, doc string) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "gateway")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/gateway").CombinedOutput(); err != nil {
		t.Fatalf("go build ../cmd/gateway: %v\n%s", err, out)
	}
	addr := freeAddr(t)
	want.Server.Listen = addr
	want.Server.ShutdownDelaySeconds, want.Server.DrainTimeoutSeconds = 0, 5
	doc = fmt.Sprintf("[server]\nlisten = %q\nshutdown_delay_seconds = 0\ndrain_timeout_seconds = 5\n\n", addr) + doc
	cfgPath := filepath.Join(dir, "gateway.toml")
	if err := os.WriteFile(cfgPath, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := config.Parse([]byte(doc), cfgPath, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(*got, want) {
		t.Fatalf("the gateway's config file says other than the test means:\nfile:\n%s\nmeant:\n%s", got.Redacted(), want.Redacted())
	}

	cmd := exec.Command(bin, "serve", "-config", cfgPath)
	cmd.Dir = dir
	runUntilReady(t, "gateway", cmd, "http://"+addr+"/readyz", gatewayWait)
	return addr
}
