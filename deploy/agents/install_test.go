package agents_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// pin is one npm package the check installs, at an exact version.
type pin struct {
	pkg     string
	version string
	// bin is the command the package installs; empty for a library.
	bin string
	// with are packages installed beside it, as name → exact version (the
	// openai package's optional peer ws, which its WebSocket client needs).
	with map[string]string
	// postinstall is the package's own install script, which puts its
	// native binary in place. npm 11 warns that it may stop running
	// dependencies' scripts, so the check installs with --ignore-scripts and
	// runs this one script itself, the same way whatever npm does.
	postinstall string
}

// The pinned versions: bump one here (and in CONTRIBUTING.md); each version
// is installed into a folder of its own in the cache.
var pins = map[string]pin{
	"claude":   {pkg: "@anthropic-ai/claude-code", version: "2.1.337", bin: "claude", postinstall: "install.cjs"},
	"codex":    {pkg: "@openai/codex", version: "0.171.0", bin: "codex"},
	"opencode": {pkg: "opencode-ai", version: "1.18.33", bin: "opencode", postinstall: "postinstall.mjs"},
	"openai":   {pkg: "openai", version: "7.60.0", with: map[string]string{"ws": "8.23.1"}},
}

// dir is the pin's folder under the cache root, keyed by version.
func (p pin) dir() string {
	return strings.ReplaceAll(strings.TrimPrefix(p.pkg, "@"), "/", "+") + "@" + p.version
}

// command is the path of the pin's command once installed in dir.
func (p pin) command(dir string) string {
	return filepath.Join(dir, "node_modules", ".bin", p.bin)
}

// cacheRoot is where the agents are installed: $TOLLGATE_AGENTS_CACHE, else
// tollgate-agents under $XDG_CACHE_HOME or ~/.cache.
func cacheRoot() (string, error) {
	if d := os.Getenv("TOLLGATE_AGENTS_CACHE"); d != "" {
		return filepath.Abs(d)
	}
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "tollgate-agents"), nil
}

// installed is what ensure reports of one pin.
type installed struct {
	dir    string
	cached bool
	took   time.Duration
	err    error
}

// ensureAll installs every pin that the cache does not hold yet, all at
// once (the time goes to downloads).
func ensureAll(ctx context.Context, root, scratch string) map[string]installed {
	out := make(map[string]installed, len(pins))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, p := range pins {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			dir, cached, err := ensure(ctx, root, filepath.Join(scratch, name), p)
			mu.Lock()
			out[name] = installed{dir: dir, cached: cached, took: time.Since(start), err: err}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// ensure returns the folder holding p, installing it there first unless a
// complete install is already in the cache. An install is made in a
// temporary folder beside it and renamed into place once it works, so an
// interrupted one is never taken for complete.
func ensure(ctx context.Context, root, scratch string, p pin) (dir string, cached bool, err error) {
	dir = filepath.Join(root, p.dir())
	if _, err := os.Stat(filepath.Join(dir, ".complete")); err == nil {
		if err := verify(ctx, dir, scratch, p); err == nil {
			return dir, true, nil
		}
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", false, err
	}
	tmp, err := os.MkdirTemp(root, ".partial-"+p.dir()+"-")
	if err != nil {
		return "", false, err
	}
	defer os.RemoveAll(tmp) // nothing left there once renamed
	// MkdirTemp's 0700 would stay on the install.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", false, err
	}
	deps := map[string]string{p.pkg: p.version}
	for name, v := range p.with {
		deps[name] = v
	}
	manifest, err := json.Marshal(map[string]any{"name": "tollgate-agents", "private": true, "dependencies": deps})
	if err != nil {
		return "", false, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "package.json"), manifest, 0o644); err != nil {
		return "", false, err
	}
	if err := runIn(ctx, tmp, 10*time.Minute, "npm", "install", "--ignore-scripts", "--no-audit", "--no-fund",
		"--no-update-notifier", "--loglevel=error"); err != nil {
		return "", false, fmt.Errorf("npm install %s@%s: %w", p.pkg, p.version, err)
	}
	if p.postinstall != "" {
		if err := runIn(ctx, filepath.Join(tmp, "node_modules", p.pkg), 2*time.Minute, "node", p.postinstall); err != nil {
			return "", false, fmt.Errorf("%s@%s's %s: %w", p.pkg, p.version, p.postinstall, err)
		}
	}
	if err := verify(ctx, tmp, scratch, p); err != nil {
		return "", false, err
	}
	if err := os.WriteFile(filepath.Join(tmp, ".complete"), []byte(p.pkg+"@"+p.version+"\n"), 0o644); err != nil {
		return "", false, err
	}
	if err := os.RemoveAll(dir); err != nil {
		return "", false, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		// Another run may have put its own install there meanwhile.
		if _, serr := os.Stat(filepath.Join(dir, ".complete")); serr == nil {
			return dir, false, nil
		}
		return "", false, err
	}
	return dir, false, nil
}

// verify checks that dir holds p at its version: the command answers
// --version with it, or the library's package.json names it.
func verify(ctx context.Context, dir, scratch string, p pin) error {
	if p.bin == "" {
		b, err := os.ReadFile(filepath.Join(dir, "node_modules", p.pkg, "package.json"))
		if err != nil {
			return err
		}
		var m struct{ Version string }
		if err := json.Unmarshal(b, &m); err != nil {
			return err
		}
		if m.Version != p.version {
			return fmt.Errorf("%s is at %s, want %s", p.pkg, m.Version, p.version)
		}
		return nil
	}
	// The agents may write to their home on any command: give them a
	// throwaway one.
	home := filepath.Join(scratch, "verify-home")
	if err := os.MkdirAll(home, 0o755); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, p.command(dir), "--version")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "TERM=dumb"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s --version: %v\n%s", p.bin, err, tail(out, 2000))
	}
	if !bytes.Contains(out, []byte(p.version)) {
		return fmt.Errorf("%s --version printed %q, want %s", p.bin, strings.TrimSpace(string(out)), p.version)
	}
	return nil
}

// runIn runs name with args in dir, within limit, and returns its output
// with the error when it fails.
func runIn(ctx context.Context, dir string, limit time.Duration, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("not done after %v", limit)
		}
		return fmt.Errorf("%v\n%s", err, tail(out, 4000))
	}
	return nil
}

// tail returns the last n bytes of b, as text.
func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
