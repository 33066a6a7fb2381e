package deploy_test

// These tests check the Dockerfile and .dockerignore as far as a machine
// without a Docker engine allows: the Dockerfile is parsed here, and its
// build stage's `go build` runs on the host, with the stage's ENV and ARGs,
// in a copy of the build context filtered by .dockerignore; the binary must
// be static and run, and both compose configs, and gateway.toml (the
// image's default), must pass `gateway check-config` run with it.
//
// What needs an engine (pulling the base images, the build in them, the
// containers starting and talking to each other) is not tested here.

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

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
		for _, drop := range []string{".git", "deploy", "docs", "docker-compose.yml"} {
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
	// The compose configs, and gateway.toml (the starter), which the image
	// serves by default.
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
