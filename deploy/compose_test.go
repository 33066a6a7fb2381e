package deploy_test

// These tests check docker-compose.yml and the compose gateway configs as
// far as a machine without a Docker engine allows: the compose file is
// validated by a Compose implementation when one is installed (`docker
// compose` or Debian's `docker-compose`; required when CI is set), and its
// structure is checked here after parsing it as YAML, against the compose
// gateway configs, the Dockerfile and the monitoring files it mounts.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
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
	"jaeger": "tracing",
}

// composeGatewayConfigs are the configs docker-compose.yml can mount, chosen
// with TOLLGATE_CONFIG; the first is the default.
var composeGatewayConfigs = []string{"gateway.toml", "gateway.openai.toml"}

// composeSecretEnv are the variables the compose configs read secrets from,
// given dummy values in these tests and removed from the environment of the
// Compose tool, which prints the environment it passes.
var composeSecretEnv = []string{"OPENAI_API_KEY"}

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

	t.Run("demo config sends traces to the jaeger service's OTLP/HTTP port", func(t *testing.T) {
		tc := cfg.Tracing
		u, err := url.Parse(tc.Endpoint)
		if err != nil || !tc.Enabled || tc.Protocol != "http/protobuf" || u.Scheme != "http" ||
			u.Hostname() != "jaeger" || u.Port() != "4318" {
			t.Errorf("demo [tracing]: enabled %v, protocol %q, endpoint %q; want OTLP/HTTP to http://jaeger:4318",
				tc.Enabled, tc.Protocol, tc.Endpoint)
		}
		jaeger := asMap(services["jaeger"])
		if env := asMap(jaeger["environment"]); fmt.Sprint(env["COLLECTOR_OTLP_ENABLED"]) != "true" {
			t.Errorf("jaeger environment %v: want COLLECTOR_OTLP_ENABLED true", env)
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
