package main

// These tests check docker-compose.yml, the Dockerfile, .dockerignore and the
// compose gateway configs as far as a machine without a Docker engine allows:
//
//   - the compose file is validated by a Compose implementation when one is
//     installed (`docker compose` or Debian's `docker-compose`; required
//     when CI is set), and its structure is checked here after parsing it
//     as YAML;
//   - the Dockerfile is parsed here, and its build stage's `go build` runs
//     on the host, with the stage's ENV and ARGs, in a copy of the build
//     context filtered by .dockerignore; the binary must be static and run;
//   - both compose configs, and gateway.toml (the image's default), pass
//     `gateway check-config` run with that binary.
//
// What needs an engine (pulling the base images, the build in them, the
// containers starting and talking to each other) is not tested here.

import (
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v4"

	"github.com/tollgate-llm/tollgate/config"
)

// composeServices are the services of docker-compose.yml and their profile
// ("" starts with a plain `docker compose up`).
var composeServices = map[string]string{
	"gateway": "", "redis": "", "prometheus": "", "grafana": "",
	"mock": "demo", "bench": "demo",
}

// composeGatewayConfigs are the configs docker-compose.yml can mount, chosen
// with TOLLGATE_CONFIG; the first is the default.
var composeGatewayConfigs = []string{"gateway.toml", "gateway.openai.toml"}

// composeSecretEnv are the variables the compose configs read secrets from,
// given dummy values in these tests and removed from the environment of the
// Compose tool, which prints the environment it passes.
var composeSecretEnv = []string{"OPENAI_API_KEY"}

// repoRoot returns the module root: tests run in cmd/gateway.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found from the test's directory: %v", err)
	}
	return root
}

func readYAML(t *testing.T, file string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return doc
}

// asMap, asList and asStrings read decoded YAML, treating a missing or
// mistyped value as empty: the assertions that follow then fail with a
// message naming what is missing.
func asMap(v any) map[string]any { m, _ := v.(map[string]any); return m }
func asList(v any) []any         { l, _ := v.([]any); return l }
func asStrings(v any) []string {
	var out []string
	for _, e := range asList(v) {
		out = append(out, fmt.Sprint(e))
	}
	return out
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

func hostPort(t *testing.T, what, addr string) (string, string) {
	t.Helper()
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("%s %q: %v", what, addr, err)
	}
	return h, p
}

// composeMount is one entry of a service's volumes.
type composeMount struct {
	source, target string
	bind           bool // a host path, not a named volume
	readOnly       bool
}

// composeMounts reads a service's volumes in the short syntax
// (SOURCE:TARGET[:MODE]) or the long one ({type, source, target}), as
// written by hand or printed by `docker compose config`, expanding variables
// from vars first as Compose does.
func composeMounts(t *testing.T, svc map[string]any, vars map[string]string) []composeMount {
	t.Helper()
	var out []composeMount
	for _, v := range asList(svc["volumes"]) {
		switch v := v.(type) {
		case string:
			v = expandVars(v, vars)
			parts := strings.Split(v, ":")
			if len(parts) < 2 {
				t.Fatalf("volume %q: want SOURCE:TARGET[:MODE]", v)
			}
			m := composeMount{source: parts[0], target: parts[1]}
			m.bind = strings.HasPrefix(m.source, ".") || strings.HasPrefix(m.source, "/")
			m.readOnly = len(parts) > 2 && slices.Contains(strings.Split(parts[2], ","), "ro")
			out = append(out, m)
		case map[string]any:
			ro, _ := v["read_only"].(bool)
			out = append(out, composeMount{source: fmt.Sprint(v["source"]), target: fmt.Sprint(v["target"]),
				bind: v["type"] == "bind", readOnly: ro})
		default:
			t.Fatalf("volume entry of type %T", v)
		}
	}
	return out
}

// loadComposeConfig parses a compose gateway config with dummy secrets.
func loadComposeConfig(t *testing.T, root, name string) *config.Config {
	t.Helper()
	file := filepath.Join(root, "deploy", "compose", name)
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse(data, file, func(k string) string {
		if slices.Contains(composeSecretEnv, k) {
			return "dummy-" + strings.ToLower(k)
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestComposeFile checks docker-compose.yml's structure, and that it agrees
// with the compose gateway configs and the Dockerfile.
func TestComposeFile(t *testing.T) {
	root := repoRoot(t)
	doc := readYAML(t, filepath.Join(root, "docker-compose.yml"))
	services := asMap(doc["services"])

	t.Run("services and profiles", func(t *testing.T) {
		var names []string
		for name, v := range services {
			names = append(names, name)
			want, ok := composeServices[name]
			if !ok {
				t.Errorf("unexpected service %q", name)
				continue
			}
			if got := strings.Join(asStrings(asMap(v)["profiles"]), ","); got != want {
				t.Errorf("service %s: profiles %q, want %q", name, got, want)
			}
		}
		for name := range composeServices {
			if !slices.Contains(names, name) {
				t.Errorf("service %q missing", name)
			}
		}
	})

	t.Run("no host network, no privileges, loopback ports, pinned images", func(t *testing.T) {
		for name, v := range services {
			svc := asMap(v)
			for _, k := range []string{"network_mode", "pid", "ipc", "uts", "userns_mode"} {
				if s, ok := svc[k]; ok {
					t.Errorf("service %s sets %s: %v", name, k, s)
				}
			}
			if p, _ := svc["privileged"].(bool); p {
				t.Errorf("service %s is privileged", name)
			}
			if u := fmt.Sprint(svc["user"]); svc["user"] != nil && (u == "root" || u == "0" || strings.HasPrefix(u, "0:")) {
				t.Errorf("service %s runs as root (user %q)", name, u)
			}
			for _, p := range asStrings(svc["ports"]) {
				if !strings.HasPrefix(p, "127.0.0.1:") {
					t.Errorf("service %s publishes %q beyond loopback", name, p)
				}
			}
			img := fmt.Sprint(svc["image"])
			if i := strings.LastIndex(img, ":"); i < 0 || strings.Contains(img[i:], "/") || strings.HasSuffix(img, ":latest") {
				t.Errorf("service %s: image %q has no pinned tag", name, img)
			}
		}
		for name, v := range asMap(doc["networks"]) {
			if d := asMap(v)["driver"]; d == "host" {
				t.Errorf("network %s uses the host driver", name)
			}
		}
	})

	t.Run("one tollgate image built from the Dockerfile", func(t *testing.T) {
		img := fmt.Sprint(asMap(services["gateway"])["image"])
		for _, name := range []string{"gateway", "mock", "bench"} {
			svc := asMap(services[name])
			if got := fmt.Sprint(svc["image"]); got != img {
				t.Errorf("service %s: image %q, want the gateway's %q", name, got, img)
			}
			build := asMap(svc["build"])
			ctx := fmt.Sprint(build["context"])
			df := "Dockerfile"
			if s, ok := build["dockerfile"].(string); ok {
				df = s
			}
			if _, err := os.Stat(filepath.Join(root, ctx, df)); err != nil {
				t.Errorf("service %s: build context %q, dockerfile %q: %v", name, ctx, df, err)
			}
			if ro, _ := svc["read_only"].(bool); !ro {
				t.Errorf("service %s: want read_only: true (state goes to a volume)", name)
			}
		}
	})

	t.Run("named volumes are declared, bind mounts exist", func(t *testing.T) {
		declared := asMap(doc["volumes"])
		for name, v := range services {
			for _, m := range composeMounts(t, asMap(v), nil) {
				if !m.bind {
					if _, ok := declared[m.source]; !ok {
						t.Errorf("service %s: volume %q is not declared under volumes:", name, m.source)
					}
					continue
				}
				if !m.readOnly {
					t.Errorf("service %s: bind mount %s is not read-only", name, m.source)
				}
				requireHostPath(t, root, filepath.Join(root, m.source))
			}
			// The gateway config chosen by TOLLGATE_CONFIG.
			for _, c := range composeGatewayConfigs {
				for _, m := range composeMounts(t, asMap(v), map[string]string{"TOLLGATE_CONFIG": c}) {
					if m.bind {
						requireHostPath(t, root, filepath.Join(root, m.source))
					}
				}
			}
		}
	})

	dockerfile := mustParseDockerfile(t, root)
	cfg := loadComposeConfig(t, root, composeGatewayConfigs[0])

	t.Run("gateway service serves its mounted config on the listen port", func(t *testing.T) {
		gw := asMap(services["gateway"])
		cmd := asStrings(gw["command"])
		cfgPath, ok := flagValue(cmd, "-config")
		if len(cmd) == 0 || cmd[0] != "serve" || !ok {
			t.Fatalf("gateway command %q: want serve -config FILE", cmd)
		}
		var mounted bool
		for _, m := range composeMounts(t, gw, nil) {
			if m.target == cfgPath {
				mounted = m.bind && strings.Contains(m.source, "deploy/compose/")
			}
		}
		if !mounted {
			t.Errorf("gateway: %s is not a bind mount from deploy/compose/", cfgPath)
		}
		if got := dockerfile.final().lastArgs("CMD"); !strings.Contains(got, cfgPath) {
			t.Errorf("Dockerfile CMD %s does not serve %s, which compose mounts", got, cfgPath)
		}
		_, port := hostPort(t, "server.listen", cfg.Server.Listen)
		var published bool
		for _, p := range asStrings(gw["ports"]) {
			published = published || strings.HasSuffix(p, ":"+port)
		}
		if !published {
			t.Errorf("gateway ports %q do not publish the listen port %s", asStrings(gw["ports"]), port)
		}
		if got := dockerfile.final().lastArgs("EXPOSE"); got != port {
			t.Errorf("Dockerfile EXPOSE %q, want the listen port %s", got, port)
		}
		// Every variable a compose config reads a secret from must reach the
		// container.
		env := composeEnvNames(gw["environment"])
		for _, name := range composeGatewayConfigs {
			c := loadComposeConfig(t, root, name)
			for _, u := range c.Upstreams {
				if u.APIKeyEnv != "" && !slices.Contains(env, u.APIKeyEnv) {
					t.Errorf("%s: api_key_env %s is not in the gateway service's environment %q", name, u.APIKeyEnv, env)
				}
			}
			for _, v := range []string{c.Redis.PasswordEnv, c.Admin.TokenEnv} {
				if v != "" && !slices.Contains(env, v) {
					t.Errorf("%s: %s is not in the gateway service's environment", name, v)
				}
			}
		}
	})

	t.Run("demo config reaches the mock and redis services", func(t *testing.T) {
		if len(cfg.Upstreams) != 1 {
			t.Fatalf("demo config: %d upstreams, want the mock alone", len(cfg.Upstreams))
		}
		u, err := url.Parse(cfg.Upstreams[0].BaseURL)
		if err != nil {
			t.Fatal(err)
		}
		listen, ok := flagValue(asStrings(asMap(services["mock"])["command"]), "-listen")
		if !ok {
			t.Fatal("mock command has no -listen (its default is loopback, unreachable from the gateway)")
		}
		if h, _ := hostPort(t, "mock -listen", listen); h != "" && h != "0.0.0.0" {
			t.Errorf("mock listens on %q: want every interface", listen)
		}
		if _, p := hostPort(t, "mock -listen", listen); u.Hostname() != "mock" || u.Port() != p {
			t.Errorf("demo upstream %s, want http://mock:%s", u, p)
		}
		if len(cfg.Redis.Addrs) != 1 {
			t.Fatalf("demo config: redis addrs %q, want the redis service", cfg.Redis.Addrs)
		}
		if h, p := hostPort(t, "redis addr", cfg.Redis.Addrs[0]); h != "redis" || p != "6379" {
			t.Errorf("redis addr %q, want redis:6379", cfg.Redis.Addrs[0])
		}
		for _, name := range composeGatewayConfigs {
			c := loadComposeConfig(t, root, name)
			if c.Redis.SpillDir == "" || c.Redis.SpillDir != dockerfile.final().lastArgs("WORKDIR") {
				t.Errorf("%s: spill_dir %q, want the image's state directory %q", name, c.Redis.SpillDir, dockerfile.final().lastArgs("WORKDIR"))
			}
		}
	})

	t.Run("bench sends a bounded load as a known demo key", func(t *testing.T) {
		bench := asMap(services["bench"])
		cmd := asStrings(bench["command"])
		if len(cmd) == 0 || cmd[0] != "bench" {
			t.Fatalf("bench command %q", cmd)
		}
		raw, _ := flagValue(cmd, "-url")
		u, err := url.Parse(raw)
		_, port := hostPort(t, "server.listen", cfg.Server.Listen)
		if err != nil || u.Hostname() != "gateway" || u.Port() != port {
			t.Errorf("bench -url %q, want http://gateway:%s", raw, port)
		}
		if n, ok := flagValue(cmd, "-requests"); !ok || n == "0" {
			t.Errorf("bench -requests %q: want an explicit bound", n)
		}
		model, _ := flagValue(cmd, "-model")
		priced := slices.ContainsFunc(cfg.Models, func(m config.Model) bool { ok, _ := path.Match(m.Pattern, model); return ok })
		if !priced {
			t.Errorf("bench -model %q matches no [[models]] pattern of the demo config", model)
		}
		keyEnv, _ := flagValue(cmd, "-key-env")
		key := fmt.Sprint(asMap(bench["environment"])[keyEnv])
		sum := sha256.Sum256([]byte(key))
		i := slices.IndexFunc(cfg.Keys, func(k config.Key) bool { return k.SHA256 == hex.EncodeToString(sum[:]) })
		if keyEnv == "" || i < 0 || cfg.Keys[i].Team == "" {
			t.Errorf("bench -key-env %q: its key is not a [[keys]] entry with a team in the demo config", keyEnv)
		}
	})

	t.Run("depends_on names services a plain up can start", func(t *testing.T) {
		for name, v := range services {
			for dep := range asMap(asMap(v)["depends_on"]) {
				p, ok := composeServices[dep]
				if !ok {
					t.Errorf("service %s depends on unknown %q", name, dep)
				} else if p != "" && composeServices[name] != p {
					t.Errorf("service %s (profile %q) depends on %s, only in profile %q", name, composeServices[name], dep, p)
				}
			}
		}
	})
}

// composeEnvNames returns the variable names of a service's environment, in
// the list (NAME or NAME=value) or the map form.
func composeEnvNames(v any) []string {
	var names []string
	for _, e := range asStrings(v) {
		name, _, _ := strings.Cut(e, "=")
		names = append(names, name)
	}
	for k := range asMap(v) {
		names = append(names, k)
	}
	return names
}

// requireHostPath fails when a bind-mounted path is missing.
func requireHostPath(t *testing.T, root, p string) {
	t.Helper()
	if _, err := os.Stat(p); err != nil {
		rel, _ := filepath.Rel(root, p)
		t.Errorf("bind mount source %s does not exist", rel)
	}
}

// composeTool returns the command that runs Compose: the docker CLI's
// plugin, or Debian's docker-compose. Neither needs an engine for `config`.
// CI must have one (.ci/run installs Debian's docker-compose); elsewhere the
// test is skipped without.
func composeTool(t *testing.T) []string {
	t.Helper()
	for _, c := range [][]string{{"docker", "compose"}, {"docker-compose"}} {
		if _, err := exec.LookPath(c[0]); err != nil {
			continue
		}
		if err := exec.Command(c[0], append(c[1:], "version")...).Run(); err == nil {
			return c
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no Compose implementation (docker compose or docker-compose) on a CI machine: .ci/run must install Debian's docker-compose")
	}
	t.Skip("no Compose implementation (docker compose or docker-compose): apt-get install docker-compose")
	return nil
}

// TestComposeConfigValidates has Compose itself load and validate the file
// (schema, interpolation, profiles, merge keys) for the demo and the
// real-upstream variant, and checks what it resolved.
func TestComposeConfigValidates(t *testing.T) {
	tool := composeTool(t)
	root := repoRoot(t)
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(composeSecretEnv, name) && !strings.HasPrefix(name, "TOLLGATE_") && !strings.HasPrefix(name, "COMPOSE_") {
			env = append(env, kv)
		}
	}
	compose := func(t *testing.T, extraEnv []string, args ...string) []byte {
		t.Helper()
		argv := append(slices.Clone(tool[1:]), "-f", filepath.Join(root, "docker-compose.yml"), "--project-directory", root)
		cmd := exec.Command(tool[0], append(argv, args...)...)
		cmd.Env = append(slices.Clone(env), extraEnv...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", strings.Join(tool, " "), strings.Join(args, " "), err, stderr.String())
		}
		return out
	}
	for _, variant := range []struct {
		name    string
		env     []string
		profile []string
	}{
		{"plain", nil, nil},
		{"demo", nil, []string{"--profile", "demo"}},
		{"openai", []string{"TOLLGATE_CONFIG=gateway.openai.toml"}, nil},
	} {
		t.Run(variant.name, func(t *testing.T) {
			compose(t, variant.env, append(slices.Clone(variant.profile), "config", "-q")...)
			out := compose(t, variant.env, append(slices.Clone(variant.profile), "config")...)
			var doc map[string]any
			if err := yaml.Unmarshal(out, &doc); err != nil {
				t.Fatalf("compose config output: %v", err)
			}
			services := asMap(doc["services"])
			for name := range composeServices {
				if _, ok := services[name]; !ok {
					t.Errorf("resolved config has no service %s", name)
				}
			}
			gw := asMap(services["gateway"])
			var cfgSource string
			for _, m := range composeMounts(t, gw, nil) {
				if m.target == "/etc/tollgate/gateway.toml" {
					cfgSource = m.source
				}
			}
			wantCfg := composeGatewayConfigs[0]
			if variant.name == "openai" {
				wantCfg = "gateway.openai.toml"
			}
			if cfgSource != filepath.Join(root, "deploy", "compose", wantCfg) {
				t.Errorf("gateway config mounted from %q, want deploy/compose/%s", cfgSource, wantCfg)
			}
			for name, v := range services {
				for _, m := range composeMounts(t, asMap(v), nil) {
					if m.bind {
						if !filepath.IsAbs(m.source) {
							t.Errorf("service %s: bind source %q not resolved to an absolute path", name, m.source)
						}
						requireHostPath(t, root, m.source)
					}
				}
			}
		})
	}
}

// dfInstr is one Dockerfile instruction, continuation lines joined.
type dfInstr struct {
	cmd, args string
	line      int
}

// dfStage is a FROM and the instructions up to the next.
type dfStage struct {
	base, name string
	instrs     []dfInstr
}

// lastArgs returns the arguments of the stage's last cmd instruction.
func (s *dfStage) lastArgs(cmd string) string {
	for i := len(s.instrs) - 1; i >= 0; i-- {
		if s.instrs[i].cmd == cmd {
			return s.instrs[i].args
		}
	}
	return ""
}

// kv returns the KEY=value pairs of the stage's ENV and ARG instructions
// (ARG defaults), in order, later ones winning.
func (s *dfStage) kv(cmd string) map[string]string {
	m := map[string]string{}
	for _, in := range s.instrs {
		if in.cmd != cmd {
			continue
		}
		for _, f := range strings.Fields(in.args) {
			k, v, _ := strings.Cut(f, "=")
			m[k] = strings.Trim(v, `"'`)
		}
	}
	return m
}

type dockerfile struct {
	globalArgs map[string]string // ARG defaults before the first FROM
	stages     []*dfStage
}

func (d *dockerfile) final() *dfStage { return d.stages[len(d.stages)-1] }

// parseDockerfile reads the subset of Dockerfile syntax this repository's
// Dockerfile uses: comments, backslash continuations, ARG before FROM, and
// one instruction per logical line. Heredocs and an escape directive are
// refused, so that the checks never misread the file.
func parseDockerfile(data []byte) (*dockerfile, error) {
	d := &dockerfile{globalArgs: map[string]string{}}
	var pending strings.Builder
	start := 0
	for i, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") {
			if strings.Contains(strings.ToLower(trimmed), "escape=") {
				return nil, fmt.Errorf("line %d: escape directive not supported by this check", i+1)
			}
			continue
		}
		if pending.Len() == 0 {
			if trimmed == "" {
				continue
			}
			start = i + 1
		}
		if cont, ok := strings.CutSuffix(trimmed, `\`); ok {
			pending.WriteString(cont + " ")
			continue
		}
		pending.WriteString(trimmed)
		logical := pending.String()
		pending.Reset()
		cmd, args, _ := strings.Cut(logical, " ")
		in := dfInstr{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args), line: start}
		if strings.Contains(in.args, "<<") {
			return nil, fmt.Errorf("line %d: heredocs not supported by this check", in.line)
		}
		switch {
		case in.cmd == "FROM":
			f := strings.Fields(in.args)
			st := &dfStage{base: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.name = f[2]
			}
			d.stages = append(d.stages, st)
		case len(d.stages) == 0:
			if in.cmd != "ARG" {
				return nil, fmt.Errorf("line %d: %s before the first FROM", in.line, in.cmd)
			}
			k, v, _ := strings.Cut(in.args, "=")
			d.globalArgs[k] = v
		default:
			st := d.stages[len(d.stages)-1]
			st.instrs = append(st.instrs, in)
		}
	}
	if pending.Len() > 0 {
		return nil, errors.New("the file ends in a continuation line")
	}
	if len(d.stages) == 0 {
		return nil, errors.New("no FROM")
	}
	return d, nil
}

func mustParseDockerfile(t *testing.T, root string) *dockerfile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	d, err := parseDockerfile(data)
	if err != nil {
		t.Fatalf("Dockerfile: %v", err)
	}
	return d
}

// goBuildRun returns the build stage and its RUN instruction that runs
// go build.
func (d *dockerfile) goBuildRun() (*dfStage, string) {
	for _, st := range d.stages {
		for _, in := range st.instrs {
			if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
				return st, in.args
			}
		}
	}
	return nil, ""
}

var goDirective = regexp.MustCompile(`(?m)^go (\d+\.\d+)(\.\d+)?\s*$`)

// TestDockerfile checks the Dockerfile: a Go build stage on the go.mod
// toolchain making a static, stripped, trimmed binary of ./cmd/gateway, and a
// final stage that runs that binary as a non-root user.
func TestDockerfile(t *testing.T) {
	root := repoRoot(t)
	d := mustParseDockerfile(t, root)
	if len(d.stages) < 2 {
		t.Fatalf("%d stages: want a build stage and a small final one", len(d.stages))
	}
	build, run := d.goBuildRun()
	if build == nil {
		t.Fatal("no RUN ... go build")
	}
	final := d.final()
	if build == final {
		t.Fatal("go build runs in the final stage")
	}

	t.Run("builder image matches go.mod", func(t *testing.T) {
		gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		m := goDirective.FindSubmatch(gomod)
		if m == nil {
			t.Fatal("go.mod has no go directive")
		}
		img := expandVars(build.base, d.globalArgs)
		repo, tag, _ := strings.Cut(img, ":")
		minor := string(m[1])
		if repo != "golang" || !(tag == minor || strings.HasPrefix(tag, minor+".") || strings.HasPrefix(tag, minor+"-")) {
			t.Errorf("build stage FROM %s: want golang:%s (go.mod's go %s%s)", img, minor, m[1], m[2])
		}
		if build.kv("ENV")["GOTOOLCHAIN"] != "local" {
			t.Error("build stage: want ENV GOTOOLCHAIN=local, so an old image fails instead of downloading a toolchain")
		}
	})

	t.Run("static trimmed stripped build of ./cmd/gateway", func(t *testing.T) {
		if build.kv("ENV")["CGO_ENABLED"] != "0" && !strings.Contains(run, "CGO_ENABLED=0") {
			t.Error("build: CGO_ENABLED=0 not set")
		}
		f := strings.Fields(run)
		if f[len(f)-1] != "./cmd/gateway" {
			t.Errorf("go build's package %q, want ./cmd/gateway", f[len(f)-1])
		}
		for _, want := range []string{"-trimpath", `-ldflags "-s -w `, "-X main.version=${VERSION}"} {
			if !strings.Contains(run, want) {
				t.Errorf("go build lacks %s: %s", want, run)
			}
		}
		if _, ok := build.kv("ARG")["VERSION"]; !ok {
			t.Error("build stage: no ARG VERSION for -X main.version")
		}
	})

	t.Run("final stage runs the built binary as non-root", func(t *testing.T) {
		base := expandVars(final.base, d.globalArgs)
		if !(base == "scratch" || strings.HasPrefix(base, "gcr.io/distroless/static") && strings.HasSuffix(base, ":nonroot")) {
			t.Errorf("final FROM %s: want distroless static nonroot or scratch", base)
		}
		user := final.lastArgs("USER")
		uid, _, _ := strings.Cut(user, ":")
		if user == "" || uid == "root" || strings.Trim(uid, "0") == "" {
			t.Errorf("final USER %q: want a non-root user", user)
		}
		for _, in := range final.instrs {
			if in.cmd == "RUN" || in.cmd == "ADD" {
				t.Errorf("line %d: %s in the final stage (it has no shell; copy from the build stage)", in.line, in.cmd)
			}
		}
		out, ok := flagValue(strings.Fields(run), "-o")
		if !ok {
			t.Fatal("go build has no -o")
		}
		var entry []string
		if err := json.Unmarshal([]byte(final.lastArgs("ENTRYPOINT")), &entry); err != nil || len(entry) != 1 {
			t.Fatalf("ENTRYPOINT %s: want the exec form naming the binary alone (%v)", final.lastArgs("ENTRYPOINT"), err)
		}
		var copied bool
		for _, in := range final.instrs {
			f := strings.Fields(in.args)
			if in.cmd == "COPY" && len(f) == 3 && f[0] == "--from="+build.name && f[1] == out && f[2] == entry[0] {
				copied = true
			}
		}
		if !copied {
			t.Errorf("no COPY --from=%s %s %s: the ENTRYPOINT is not the binary go build made", build.name, out, entry[0])
		}
		var cmd []string
		if err := json.Unmarshal([]byte(final.lastArgs("CMD")), &cmd); err != nil {
			t.Fatalf("CMD %s: want the exec form: %v", final.lastArgs("CMD"), err)
		}
		cfgPath, _ := flagValue(cmd, "-config")
		if len(cmd) == 0 || cmd[0] != "serve" || cfgPath == "" {
			t.Errorf("CMD %q: want serve -config FILE", cmd)
		}
		var hasConfig bool
		for _, in := range final.instrs {
			f := strings.Fields(in.args)
			hasConfig = hasConfig || in.cmd == "COPY" && len(f) >= 2 && f[len(f)-1] == cfgPath && strings.HasSuffix(f[len(f)-2], "/gateway.toml")
		}
		if !hasConfig {
			t.Errorf("the image does not contain %s, the config its CMD serves", cfgPath)
		}
		if wd := final.lastArgs("WORKDIR"); wd == "" || wd == "/" {
			t.Errorf("final WORKDIR %q: want a directory the user may write (spend and spill files)", wd)
		}
	})
}

// dockerignore returns .dockerignore's patterns.
func dockerignore(root string) ([]string, error) {
	data, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
	if err != nil {
		return nil, err
	}
	var pats []string
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "#") {
			pats = append(pats, line)
		}
	}
	return pats, nil
}

// dockerignored reports whether rel (slash-separated, relative to the
// context) is left out of the build context, as Docker decides: the last
// pattern matching the path or one of its parent directories wins, "!"
// patterns put paths back, and "**/" matches any number of directories.
func dockerignored(pats []string, rel string) bool {
	excluded := false
	for _, p := range pats {
		neg := strings.HasPrefix(p, "!")
		p = path.Clean(strings.TrimPrefix(strings.TrimPrefix(p, "!"), "/"))
		for cand := rel; cand != "." && cand != "/"; cand = path.Dir(cand) {
			if globPath(p, cand) {
				excluded = !neg
				break
			}
		}
	}
	return excluded
}

func globPath(p, s string) bool {
	if rest, ok := strings.CutPrefix(p, "**/"); ok {
		parts := strings.Split(s, "/")
		for i := range parts {
			if globPath(rest, strings.Join(parts[i:], "/")) {
				return true
			}
		}
		return false
	}
	ok, _ := path.Match(p, s)
	return ok
}

// copyBuildContext copies the regular files of root that .dockerignore keeps
// to dst.
func copyBuildContext(t *testing.T, root, dst string) {
	t.Helper()
	pats, err := dockerignore(root)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	err = filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == "." {
			return err
		}
		if dockerignored(pats, filepath.ToSlash(rel)) {
			if e.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		target := filepath.Join(dst, rel)
		if e.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !e.Type().IsRegular() {
			return nil
		}
		in, err := os.Open(p)
		if err != nil {
			return err
		}
		defer in.Close()
		info, err := in.Stat()
		if err != nil {
			return err
		}
		out, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, info.Mode().Perm())
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
	if err != nil {
		t.Fatalf("copying the build context: %v", err)
	}
}

// TestDockerImageBinary runs the Dockerfile build stage's go build on the
// host, as a builder would: in a copy of the build context filtered by
// .dockerignore, through /bin/sh, with the stage's ENV and ARG defaults
// (VERSION set to a test value), /out becoming a temporary directory. The
// binary must be static, stripped and trimmed, report the version, and pass
// check-config on the configs the image and compose serve.
func TestDockerImageBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the gateway")
	}
	root := repoRoot(t)
	d := mustParseDockerfile(t, root)
	build, run := d.goBuildRun()
	if build == nil {
		t.Fatal("no RUN ... go build")
	}
	dir := t.TempDir()
	src, out := filepath.Join(dir, "src"), filepath.Join(dir, "out")
	copyBuildContext(t, root, src)

	t.Run("dockerignore keeps the sources and drops the rest", func(t *testing.T) {
		for _, keep := range []string{"go.mod", "go.sum", "gateway.toml", "cmd/gateway/main.go", "config/config.go"} {
			if _, err := os.Stat(filepath.Join(src, keep)); err != nil {
				t.Errorf("build context lacks %s: %v", keep, err)
			}
		}
		for _, drop := range []string{".git", "deploy", "docker-compose.yml"} {
			if _, err := os.Stat(filepath.Join(root, drop)); err != nil {
				continue
			}
			if _, err := os.Stat(filepath.Join(src, drop)); err == nil {
				t.Errorf("build context keeps %s", drop)
			}
		}
		_ = filepath.WalkDir(src, func(p string, e fs.DirEntry, err error) error {
			if err == nil && strings.HasSuffix(p, ".test") && !e.IsDir() {
				t.Errorf("build context keeps the test binary %s", p)
			}
			return nil
		})
	})

	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return strings.HasPrefix(name, "CGO_") || name == "GOFLAGS" || name == "GOTOOLCHAIN" || name == "VERSION"
	})
	for k, v := range build.kv("ENV") {
		env = append(env, k+"="+v)
	}
	for k, v := range build.kv("ARG") {
		if k == "VERSION" {
			v = dockerTestVersion
		}
		env = append(env, k+"="+v)
	}
	script := strings.ReplaceAll(run, "/out/", out+"/")
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Dir, cmd.Env = src, env
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sh -c %q: %v\n%s", script, err, b)
	}
	outPath, _ := flagValue(strings.Fields(run), "-o")
	bin := filepath.Join(out, strings.TrimPrefix(outPath, "/out/"))

	t.Run("static, stripped, trimmed", func(t *testing.T) {
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Error("the binary has an ELF interpreter: it is dynamically linked")
			}
		}
		if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
			t.Errorf("the binary needs shared libraries %q (%v)", libs, err)
		}
		for _, s := range []string{".symtab", ".debug_info"} {
			if f.Section(s) != nil {
				t.Errorf("the binary has a %s section: -ldflags -s -w not applied", s)
			}
		}
		data, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(data, []byte(src)) {
			t.Errorf("the binary contains the build directory %s: -trimpath not applied", src)
		}
	})

	t.Run("version", func(t *testing.T) {
		b, err := exec.Command(bin, "version").CombinedOutput()
		if err != nil || !strings.HasPrefix(string(b), "tollgate "+dockerTestVersion+" (go") {
			t.Errorf("gateway version: %v: %q, want tollgate %s", err, b, dockerTestVersion)
		}
	})

	checkConfig := func(t *testing.T, file string, extraEnv ...string) (string, error) {
		t.Helper()
		cmd := exec.Command(bin, "check-config", "-config", file)
		cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, extraEnv...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return stdout.String() + stderr.String(), err
	}
	const dummyKey = "dummy-key-for-check-config-0123456789"
	// The compose configs, and gateway.toml, which the image serves by default.
	files := []string{"gateway.toml"}
	for _, name := range composeGatewayConfigs {
		files = append(files, path.Join("deploy", "compose", name))
	}
	for _, rel := range files {
		file := filepath.Join(root, filepath.FromSlash(rel))
		t.Run("check-config "+rel, func(t *testing.T) {
			var env []string
			for _, k := range composeSecretEnv {
				env = append(env, k+"="+dummyKey)
			}
			got, err := checkConfig(t, file, env...)
			if err != nil || !strings.HasPrefix(got, file+": ok\n") {
				t.Fatalf("check-config -config %s: %v\n%s", file, err, got)
			}
			if strings.Contains(got, dummyKey) {
				t.Error("check-config printed the key")
			}
		})
	}
	t.Run("check-config refuses the openai config without its key", func(t *testing.T) {
		file := filepath.Join(root, "deploy", "compose", "gateway.openai.toml")
		got, err := checkConfig(t, file)
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(got, "OPENAI_API_KEY is not set") {
			t.Errorf("check-config without OPENAI_API_KEY: %v\n%s", err, got)
		}
	})
}

const dockerTestVersion = "v0.0.0-compose-test"

// hostPathOf maps a path inside a service's container to the host path a
// bind mount puts there, relative paths taken from root.
func hostPathOf(mounts []composeMount, root, p string) (string, bool) {
	best := -1
	for i, m := range mounts {
		if m.bind && (p == m.target || strings.HasPrefix(p, m.target+"/")) && (best < 0 || len(m.target) > len(mounts[best].target)) {
			best = i
		}
	}
	if best < 0 {
		return "", false
	}
	m := mounts[best]
	return filepath.Join(root, m.source, strings.TrimPrefix(p, m.target)), true
}

// requireMonitoringFiles returns the files glob matches, and fails the
// test when there are none.
func requireMonitoringFiles(t *testing.T, glob string) []string {
	t.Helper()
	files, err := filepath.Glob(glob)
	if err != nil || len(files) == 0 {
		t.Fatalf("no file matches %s (%v)", glob, err)
	}
	return files
}

// TestComposeMonitoringFiles checks that the Prometheus and Grafana files
// mounted by docker-compose.yml fit its services: Prometheus scrapes the
// gateway service and finds its rules, Grafana reaches the prometheus
// service and finds the dashboards.
func TestComposeMonitoringFiles(t *testing.T) {
	root := repoRoot(t)
	services := asMap(readYAML(t, filepath.Join(root, "docker-compose.yml"))["services"])
	cfg := loadComposeConfig(t, root, composeGatewayConfigs[0])
	_, gwPort := hostPort(t, "server.listen", cfg.Server.Listen)

	t.Run("prometheus", func(t *testing.T) {
		prom := asMap(services["prometheus"])
		mounts := composeMounts(t, prom, nil)
		var cfgPath string
		for _, a := range asStrings(prom["command"]) {
			if v, ok := strings.CutPrefix(a, "--config.file="); ok {
				cfgPath = v
			}
		}
		host, ok := hostPathOf(mounts, root, cfgPath)
		if !ok {
			t.Fatalf("prometheus --config.file=%q is not mounted from the repository", cfgPath)
		}
		requireMonitoringFiles(t, host)
		doc := readYAML(t, host)
		var targets []string
		for _, sc := range asList(doc["scrape_configs"]) {
			for _, st := range asList(asMap(sc)["static_configs"]) {
				targets = append(targets, asStrings(asMap(st)["targets"])...)
			}
		}
		if !slices.Contains(targets, "gateway:"+gwPort) {
			t.Errorf("prometheus targets %q do not include the gateway service, gateway:%s", targets, gwPort)
		}
		rules := asStrings(doc["rule_files"])
		if len(rules) == 0 {
			t.Error("prometheus.yml has no rule_files")
		}
		for _, r := range rules {
			if !path.IsAbs(r) {
				r = path.Join(path.Dir(cfgPath), r)
			}
			hr, ok := hostPathOf(mounts, root, r)
			matches, _ := filepath.Glob(hr)
			if !ok || len(matches) == 0 {
				t.Errorf("rule_files %q: no file mounted there", r)
			}
		}
	})

	t.Run("grafana", func(t *testing.T) {
		graf := asMap(services["grafana"])
		mounts := composeMounts(t, graf, nil)
		prov, ok := hostPathOf(mounts, root, "/etc/grafana/provisioning")
		if !ok {
			t.Fatal("grafana: /etc/grafana/provisioning is not mounted from the repository")
		}
		dsFiles := requireMonitoringFiles(t, filepath.Join(prov, "datasources", "*.y*ml"))
		dbFiles := requireMonitoringFiles(t, filepath.Join(prov, "dashboards", "*.y*ml"))
		var urls []string
		for _, f := range dsFiles {
			for _, ds := range asList(readYAML(t, f)["datasources"]) {
				urls = append(urls, fmt.Sprint(asMap(ds)["url"]))
			}
		}
		if !slices.Contains(urls, "http://prometheus:9090") {
			t.Errorf("grafana datasources %q: none is the prometheus service, http://prometheus:9090", urls)
		}
		var dashboards int
		for _, f := range dbFiles {
			for _, p := range asList(readYAML(t, f)["providers"]) {
				dir := fmt.Sprint(asMap(asMap(p)["options"])["path"])
				hd, ok := hostPathOf(mounts, root, dir)
				js, _ := filepath.Glob(filepath.Join(hd, "*.json"))
				if !ok || len(js) == 0 {
					t.Errorf("dashboard provider path %s: no dashboard JSON mounted there", dir)
				}
				dashboards += len(js)
			}
		}
		if dashboards == 0 {
			t.Error("grafana provisions no dashboard")
		}
		if home, ok := asMap(graf["environment"])["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"].(string); ok {
			hp, mounted := hostPathOf(mounts, root, home)
			if _, err := os.Stat(hp); !mounted || err != nil {
				t.Errorf("home dashboard %s is not a mounted file", home)
			}
		}
	})
}
