package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestReadmeTestCommandInstallsWhatTheTestsNeed: the README's one test
// command is .ci/test, which runs .ci/setup before the tests, and CI runs
// that same command.
func TestReadmeTestCommandInstallsWhatTheTestsNeed(t *testing.T) {
	root := repoRoot(t)
	read := func(name string) string { return readFile(t, root, name) }
	block := regexp.MustCompile("(?s)## Run the tests\n\n```sh\n(.*?)```").FindStringSubmatch(read("README.md"))
	if block == nil {
		t.Fatal("README.md has no sh block under \"## Run the tests\"")
	}
	cmd := strings.TrimSpace(block[1])
	if cmd != "./.ci/test" {
		t.Fatalf("README's test command is %q, want the one command ./.ci/test", cmd)
	}
	test := read(".ci/test")
	setup, gotest := strings.Index(test, "./.ci/setup\n"), strings.Index(test, "go test -race -count=1 ./...")
	if setup < 0 || gotest < setup {
		t.Errorf(".ci/test does not run ./.ci/setup and then go test -race -count=1 ./...:\n%s", test)
	}
	lines := strings.Split(strings.TrimSpace(read(".ci/run")), "\n")
	if last := lines[len(lines)-1]; last != cmd {
		t.Errorf(".ci/run ends with %q, want the README's test command %q", last, cmd)
	}
	if mk := read("Makefile"); !strings.Contains(mk, "test:\n\t"+cmd+"\n") {
		t.Errorf("make test does not run %s", cmd)
	}
}

// TestSetupFindsWhatIsMissing runs .ci/setup --check with a PATH that has
// every tool the tests need (nginx among them, for cmd/bench-compare, and
// the pinned helm in Go's bin directory, for the chart) but redis-server
// and redis-cli: it names redis-server (whose package brings redis-cli),
// and installs nothing; with a redis-server but no redis-cli, it names
// redis-tools; without helm, or with another version of it, it names helm
// at the pinned version.
func TestSetupFindsWhatIsMissing(t *testing.T) {
	root := repoRoot(t)
	bin, gobin := t.TempDir(), t.TempDir()
	tool := func(name string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"gcc", "git", "prometheus", "promtool", "docker-compose", "chromium", "nginx"} {
		tool(name)
	}
	// A go that answers what .ci/setup asks: GOBIN, and the module
	// version in a binary's build information, here the stub helm's text.
	// (Shell built-ins only: PATH holds nothing else.)
	goStub := "#!/bin/sh\ncase \"$1\" in\nenv) echo " + gobin + " ;;\n" +
		"version) [ -f \"$3\" ] || exit 1; read -r v < \"$3\"; printf '%s: go1\\n\\tmod\\thelm.sh/helm/v4\\t%s\\th1:x\\n' \"$3\" \"$v\" ;;\nesac\n"
	if err := os.WriteFile(filepath.Join(bin, "go"), []byte(goStub), 0o755); err != nil {
		t.Fatal(err)
	}
	pin := helmPin(t)
	helmStub := func(version string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(gobin, "helm"), []byte(version), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	helmStub(pin)
	run := func(path string) (string, error) {
		c := exec.Command("bash", filepath.Join(root, ".ci", "setup"), "--check")
		c.Env = append(os.Environ(), "PATH="+path)
		out, err := c.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	if out, err := run(bin); err == nil || out != "missing: redis-server" {
		t.Errorf("without redis-server: %q (%v), want \"missing: redis-server\" and a failure", out, err)
	}
	tool("redis-server")
	if out, err := run(bin); err == nil || out != "missing: redis-tools" {
		t.Errorf("with redis-server but no redis-cli: %q (%v), want \"missing: redis-tools\" and a failure", out, err)
	}
	tool("redis-cli")
	if out, err := run(bin); err != nil || out != "nothing missing" {
		t.Errorf("with every tool: %q (%v), want \"nothing missing\"", out, err)
	}
	helmStub("v4.0.0")
	if out, err := run(bin); err == nil || out != "missing: helm@"+pin {
		t.Errorf("with helm v4.0.0: %q (%v), want \"missing: helm@%s\" and a failure", out, err, pin)
	}
	if err := os.Remove(filepath.Join(gobin, "helm")); err != nil {
		t.Fatal(err)
	}
	if out, err := run(bin); err == nil || out != "missing: helm@"+pin {
		t.Errorf("without helm: %q (%v), want \"missing: helm@%s\" and a failure", out, err, pin)
	}
}

// TestCIRunsTheAgentsCheck: CI runs the coding agents through a gateway
// (.ci/agents, deploy/agents) before the README's test command, and `make
// agents` runs the same script.
func TestCIRunsTheAgentsCheck(t *testing.T) {
	root := repoRoot(t)
	read := func(name string) string { return readFile(t, root, name) }
	run := read(".ci/run")
	agents, test := strings.Index(run, "\n./.ci/agents\n"), strings.LastIndex(run, "\n./.ci/test")
	if agents < 0 || agents > test {
		t.Errorf(".ci/run does not run ./.ci/agents before ./.ci/test:\n%s", run)
	}
	if !strings.Contains(read("Makefile"), "agents:\n\t./.ci/agents\n") {
		t.Error("make agents does not run ./.ci/agents")
	}
	if script := read(".ci/agents"); !strings.Contains(script, "TOLLGATE_AGENTS=1") || !strings.Contains(script, "./deploy/agents/") {
		t.Errorf(".ci/agents does not run deploy/agents with TOLLGATE_AGENTS set:\n%s", script)
	}
}
