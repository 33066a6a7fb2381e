package main

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine running: the
// driver starts thousands.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestQuickRunMeasuresEveryTarget runs the tool's smoke test for real: the
// fake upstream, nginx (when installed; in CI it must be) and tollgate as
// processes, every shape once. Each target's table column holds figures,
// and every request of every shape succeeded (the streams whole, with
// every token and [DONE]).
func TestQuickRunMeasuresEveryTarget(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the gateway and starts processes")
	}
	o := options{quick: true, rounds: 1, held: 50, repo: "../..", nginx: "/usr/sbin/nginx", timeout: 60e9}
	if _, err := exec.LookPath(o.nginx); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("nginx is not installed (.ci/setup installs nginx-light): %v", err)
		}
		t.Logf("no nginx at %s: measuring without it", o.nginx)
		o.noNginx = true
	}
	var out bytes.Buffer
	if err := compare(o, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	report := out.String()
	targets := []string{"direct", "tollgate"}
	if !o.noNginx {
		targets = append(targets, "nginx")
	}
	for _, name := range targets {
		if !strings.Contains(report, "- "+name+": http://127.0.0.1:") {
			t.Errorf("the report does not list %s:\n%s", name, report)
		}
	}
	tables := strings.Split(report, "\n## ")[1:]
	if len(tables) != 4 {
		t.Fatalf("%d tables, want one per quick shape (4):\n%s", len(tables), report)
	}
	counts := regexp.MustCompile(`(\d+) / (\d+)`)
	for _, tab := range tables {
		name, _, _ := strings.Cut(tab, ":")
		var errRow, rpsRow string
		for _, line := range strings.Split(tab, "\n") {
			switch {
			case strings.HasPrefix(line, "| requests / errors"):
				errRow = line
			case strings.HasPrefix(line, "| requests/s |"), strings.HasPrefix(line, "| memory per stream |"):
				rpsRow = line
			}
		}
		cols := counts.FindAllStringSubmatch(errRow, -1)
		want := len(targets)
		if name == "held" {
			want-- // direct holds nothing for itself
		}
		if len(cols) != want {
			t.Errorf("%s: %d request counts in %q, want %d", name, len(cols), errRow, want)
		}
		for _, c := range cols {
			if c[1] == "0" || c[2] != "0" {
				t.Errorf("%s: a target sent %s requests with %s errors: %q\n%s", name, c[1], c[2], errRow, tab)
			}
		}
		if rpsRow == "" || strings.Contains(rpsRow, "–") {
			t.Errorf("%s: a target has no figure: %q", name, rpsRow)
		}
	}
}

// TestEnvFlagNeedsNameAndValue: -env takes NAME=value and refuses
// anything else before building or starting anything.
func TestEnvFlagNeedsNameAndValue(t *testing.T) {
	for _, bad := range []string{"GOMAXPROCS", "=1", ""} {
		err := run1([]string{"-env", bad, "-repo", t.TempDir()}, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "NAME=value") {
			t.Errorf("-env %q: %v, want an error naming NAME=value", bad, err)
		}
	}
}
