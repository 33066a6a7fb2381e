package deploy_test

// These tests check the Helm chart in helm/tollgate without a cluster:
// helm lint, and helm template over several values sets, each rendered
// manifest decoded strictly (an unknown or duplicate field is an error)
// into the Kubernetes API types of the pinned k8s.io/api release, and the
// Prometheus Operator's for the ServiceMonitor. The rendered gateway.toml
// must pass `gateway check-config` run with the built binary, and the
// Deployment must agree with it: the probes on its port, the termination
// grace from its shutdown delay and drain, GOMEMLIMIT from the memory
// limit, the config mounted so that an update reaches the file.
//
// Helm comes from .ci/setup, built from the Go module proxy at the version
// pinned there into Go's bin directory.

import (
	"bytes"
	"debug/buildinfo"
	"fmt"
	"maps"
	"math"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"go.yaml.in/yaml/v4"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"

	"github.com/tollgate-llm/tollgate/config"
)

const (
	chartDir = "helm/tollgate"
	// chartRelease is the release name the tests render, so the objects
	// are named chartFullname.
	chartRelease  = "tg"
	chartFullname = "tg-tollgate"
	// serviceMonitorAPI and prometheusRuleAPI are what a cluster with the
	// Prometheus Operator's CRDs serves, as helm template --api-versions
	// takes them.
	serviceMonitorAPI = "monitoring.coreos.com/v1/ServiceMonitor"
	prometheusRuleAPI = "monitoring.coreos.com/v1/PrometheusRule"
)

var helmPinRE = regexp.MustCompile(`(?m)^helm_version=(v[0-9][^\s]*)$`)

// helmPin returns the Helm version .ci/setup installs.
func helmPin(t *testing.T) string {
	t.Helper()
	m := helmPinRE.FindStringSubmatch(readFile(t, repoRoot(t), ".ci/setup"))
	if m == nil {
		t.Fatal(".ci/setup pins no helm_version=v...")
	}
	return m[1]
}

// goBinDir is where go install puts binaries: GOBIN, else GOPATH's first
// entry's bin.
func goBinDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOBIN", "GOPATH").Output()
	if err != nil {
		t.Fatalf("go env: %v", err)
	}
	lines := strings.Split(string(out), "\n")
	if lines[0] != "" {
		return lines[0]
	}
	return filepath.Join(filepath.SplitList(lines[1])[0], "bin")
}

// needHelm returns the path of the helm binary .ci/setup installs (Go's
// bin directory), else of one on PATH. Without one the test is skipped on
// a developer machine but fails when CI is set, as for prometheus. With CI
// set it must also be the pinned release, read from its build information.
func needHelm(t *testing.T) string {
	t.Helper()
	p := filepath.Join(goBinDir(t), "helm")
	if _, err := os.Stat(p); err != nil {
		if p, err = exec.LookPath("helm"); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("helm not found in %s or on PATH (CI is set, and .ci/setup installs it): %v", goBinDir(t), err)
			}
			t.Skipf("helm not found; ./.ci/setup installs it: %v", err)
		}
	}
	if os.Getenv("CI") != "" {
		want := helmPin(t)
		info, err := buildinfo.ReadFile(p)
		if err != nil || info.Main.Path != "helm.sh/helm/v4" || info.Main.Version != want {
			got := "unknown"
			if err == nil {
				got = info.Main.Path + "@" + info.Main.Version
			}
			t.Fatalf("%s is %s (%v), want helm.sh/helm/v4@%s as .ci/setup installs it", p, got, err, want)
		}
	}
	return p
}

// helm runs the helm binary in this package's directory and returns its
// standard output; its standard error (Helm logs each chart file it reads
// through a symbolic link there) is returned with the error.
func helm(helmBin string, args ...string) (string, error) {
	cmd := exec.Command(helmBin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// writeValues writes a values file for one case and returns its path,
// which holds no comma (helm -f splits its argument at commas, and
// t.TempDir's name comes from the test's).
func writeValues(t *testing.T, doc string) string {
	t.Helper()
	f, err := os.CreateTemp("", "tollgate-values-*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(f.Name()) })
	if _, err := f.WriteString(doc); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}

// renderChart runs helm template with the values doc (none if empty) and
// the API versions the cluster is to serve.
func renderChart(t *testing.T, helmBin, values string, apiVersions ...string) string {
	t.Helper()
	args := []string{"template", chartRelease, chartDir, "--namespace", "llm"}
	if values != "" {
		args = append(args, "-f", writeValues(t, values))
	}
	for _, v := range apiVersions {
		args = append(args, "--api-versions", v)
	}
	out, err := helm(helmBin, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// k8sDecoder decodes manifests strictly into the registered API types:
// an unknown kind, an unknown field or a field given twice is an error.
var k8sDecoder = sync.OnceValue(func() runtime.Decoder {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, appsv1.AddToScheme, policyv1.AddToScheme,
		autoscalingv2.AddToScheme, monitoringv1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
	return serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
})

var docSep = regexp.MustCompile(`(?m)^---[ \t]*$`)

// manifests are rendered objects by "Kind name".
type manifests map[string]runtime.Object

func (m manifests) names() []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// decodeManifests splits helm template's output into documents and decodes
// each strictly.
func decodeManifests(t *testing.T, out string) manifests {
	t.Helper()
	objs := manifests{}
	for _, doc := range docSep.Split(out, -1) {
		var probe map[string]any
		if err := yaml.Unmarshal([]byte(doc), &probe); err != nil {
			t.Fatalf("a rendered document is not YAML: %v\n%s", err, doc)
		}
		if len(probe) == 0 {
			continue // comments only
		}
		obj, gvk, err := k8sDecoder().Decode([]byte(doc), nil, nil)
		if err != nil {
			t.Errorf("strict decoding: %v\n%s", err, doc)
			continue
		}
		name, _ := probe["metadata"].(map[string]any)["name"].(string)
		key := gvk.Kind + " " + name
		if _, dup := objs[key]; dup {
			t.Errorf("%s rendered twice", key)
		}
		objs[key] = obj
	}
	return objs
}

// get returns the object "Kind name" as its API type, failing the test
// when it was not rendered.
func get[T runtime.Object](t *testing.T, objs manifests, key string) T {
	t.Helper()
	obj, ok := objs[key].(T)
	if !ok {
		t.Fatalf("no %s among %q", key, objs.names())
	}
	return obj
}

// chartValues returns the chart's values.yaml, parsed.
func chartValues(t *testing.T) map[string]any {
	t.Helper()
	var v map[string]any
	if err := yaml.Unmarshal([]byte(readFile(t, chartDir, "values.yaml")), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// number returns the number at the path of keys in a parsed YAML map.
func number(t *testing.T, m map[string]any, keys ...string) float64 {
	t.Helper()
	var v any = m
	for _, k := range keys {
		mm, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("values: %s is not a map", strings.Join(keys, "."))
		}
		v = mm[k]
	}
	switch n := v.(type) {
	case int:
		return float64(n)
	case float64:
		return n
	}
	t.Fatalf("values: %s = %v, not a number", strings.Join(keys, "."), v)
	return 0
}

// gatewayBuild is the gateway binary gatewayBinary builds, shared by the
// package's tests.
var gatewayBuild struct {
	once      sync.Once
	dir, path string
	err       error
}

// gatewayBinary builds ../cmd/gateway once for every test of the package
// that runs it; TestMain removes it.
func gatewayBinary(t *testing.T) string {
	t.Helper()
	gatewayBuild.once.Do(func() {
		dir, err := os.MkdirTemp("", "tollgate-deploy-test-")
		if err != nil {
			gatewayBuild.err = err
			return
		}
		gatewayBuild.dir = dir
		gatewayBuild.path = filepath.Join(dir, "gateway")
		if out, err := exec.Command("go", "build", "-o", gatewayBuild.path, "../cmd/gateway").CombinedOutput(); err != nil {
			gatewayBuild.err = fmt.Errorf("go build ../cmd/gateway: %w\n%s", err, out)
		}
	})
	if gatewayBuild.err != nil {
		t.Fatal(gatewayBuild.err)
	}
	return gatewayBuild.path
}

// chartCase is one values set and what it must render.
type chartCase struct {
	name        string
	values      string
	apiVersions []string
	// objects are the "Kind name" of every object rendered.
	objects []string
	// env is the environment check-config runs with: what the case's
	// Secrets would give the pod.
	env map[string]string
	// check is what else the case must show.
	check func(t *testing.T, objs manifests, cfg *config.Config)
}

// The objects of a default install.
var defaultObjects = []string{
	"ConfigMap " + chartFullname,
	"ConfigMap " + chartFullname + "-grafana-dashboard",
	"ConfigMap " + chartFullname + "-prometheus-rules",
	"Deployment " + chartFullname,
	"PodDisruptionBudget " + chartFullname,
	"Service " + chartFullname,
}

func withObjects(extra ...string) []string {
	out := append(slices.Clone(defaultObjects), extra...)
	slices.Sort(out)
	return out
}

func withoutObjects(drop ...string) []string {
	return slices.DeleteFunc(slices.Clone(defaultObjects), func(s string) bool { return slices.Contains(drop, s) })
}

var chartCases = []chartCase{
	{
		name:    "defaults",
		objects: defaultObjects,
		check: func(t *testing.T, objs manifests, cfg *config.Config) {
			if cfg.Auth.Mode != "passthrough" || len(cfg.Upstreams) != 2 || len(cfg.Redis.Addrs) != 0 {
				t.Errorf("default config: mode %q, %d upstreams, redis %q; want passthrough, openai and anthropic, no Redis",
					cfg.Auth.Mode, len(cfg.Upstreams), cfg.Redis.Addrs)
			}
			d := get[*appsv1.Deployment](t, objs, "Deployment "+chartFullname)
			if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
				t.Errorf("replicas %v, want 2", d.Spec.Replicas)
			}
			if d.Spec.Template.Spec.Containers[0].Lifecycle != nil {
				t.Error("a lifecycle hook by default: the gateway's own shutdown delay does the waiting")
			}
			pdb := get[*policyv1.PodDisruptionBudget](t, objs, "PodDisruptionBudget "+chartFullname)
			if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
				t.Errorf("PDB maxUnavailable %v, want 1", pdb.Spec.MaxUnavailable)
			}
		},
	},
	{
		name:        "ServiceMonitor and PrometheusRules when the CRDs are served",
		apiVersions: []string{serviceMonitorAPI, prometheusRuleAPI},
		objects: withObjects("ServiceMonitor "+chartFullname,
			"PrometheusRule "+chartFullname+"-recording", "PrometheusRule "+chartFullname+"-alerts"),
		check: func(t *testing.T, objs manifests, _ *config.Config) {
			for _, f := range []string{"recording", "alerts"} {
				checkPrometheusRule(t, get[*monitoringv1.PrometheusRule](t, objs, "PrometheusRule "+chartFullname+"-"+f),
					"prometheus/rules/"+f+".yml")
			}
			sm := get[*monitoringv1.ServiceMonitor](t, objs, "ServiceMonitor "+chartFullname)
			svc := get[*corev1.Service](t, objs, "Service "+chartFullname)
			if !selects(sm.Spec.Selector.MatchLabels, svc.Labels) {
				t.Errorf("ServiceMonitor selector %v does not select the Service (labels %v)", sm.Spec.Selector.MatchLabels, svc.Labels)
			}
			if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "http" || sm.Spec.Endpoints[0].Path != "/metrics" {
				t.Errorf("ServiceMonitor endpoints %+v, want port http, path /metrics", sm.Spec.Endpoints)
			}
			if svc.Spec.Ports[0].Name != "http" {
				t.Errorf("Service port named %q, want http", svc.Spec.Ports[0].Name)
			}
		},
	},
	{
		name:        "no ServiceMonitor or rules when turned off",
		values:      "serviceMonitor:\n  enabled: false\nprometheusRules:\n  enabled: false\n",
		apiVersions: []string{serviceMonitorAPI, prometheusRuleAPI},
		objects:     withoutObjects("ConfigMap " + chartFullname + "-prometheus-rules"),
	},
	{
		name: "Redis beside the gateways",
		values: `redis:
  enabled: true
`,
		objects: withObjects("Deployment "+chartFullname+"-redis", "Service "+chartFullname+"-redis"),
		check: func(t *testing.T, objs manifests, cfg *config.Config) {
			if want := []string{chartFullname + "-redis:6379"}; !slices.Equal(cfg.Redis.Addrs, want) {
				t.Errorf("[redis] addrs %q, want %q", cfg.Redis.Addrs, want)
			}
			rsvc := get[*corev1.Service](t, objs, "Service "+chartFullname+"-redis")
			if rsvc.Spec.Ports[0].Port != 6379 {
				t.Errorf("Redis Service port %d, want 6379", rsvc.Spec.Ports[0].Port)
			}
			rd := get[*appsv1.Deployment](t, objs, "Deployment "+chartFullname+"-redis")
			gw := get[*appsv1.Deployment](t, objs, "Deployment "+chartFullname)
			if !selects(rsvc.Spec.Selector, rd.Spec.Template.Labels) {
				t.Errorf("the Redis Service's selector %v does not select the Redis pod %v", rsvc.Spec.Selector, rd.Spec.Template.Labels)
			}
			for _, what := range []struct {
				name string
				sel  map[string]string
			}{
				{"gateway Service", get[*corev1.Service](t, objs, "Service "+chartFullname).Spec.Selector},
				{"gateway Deployment", gw.Spec.Selector.MatchLabels},
				{"PDB", get[*policyv1.PodDisruptionBudget](t, objs, "PodDisruptionBudget "+chartFullname).Spec.Selector.MatchLabels},
			} {
				if selects(what.sel, rd.Spec.Template.Labels) {
					t.Errorf("the %s's selector %v also selects the Redis pod", what.name, what.sel)
				}
			}
			if selects(rd.Spec.Selector.MatchLabels, gw.Spec.Template.Labels) {
				t.Error("the Redis Deployment's selector selects the gateway's pods")
			}
			c := rd.Spec.Template.Spec.Containers[0]
			if sc := c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
				t.Error("Redis: root filesystem not read-only")
			}
		},
	},
	{
		name: "external Redis, keys and admin token from Secrets, preStop sleep",
		values: `config:
  server:
    shutdown_delay_seconds: 2.5
    drain_timeout_seconds: 120
  upstreams:
    - name: openai
      base_url: https://api.openai.com
      api_key_env: OPENAI_API_KEY
  redis:
    addrs: ["redis.shared.svc:6379"]
    password_env: REDIS_PASSWORD
  admin:
    token_env: TOLLGATE_ADMIN_TOKEN
existingSecrets: [tollgate-redis]
secretEnv:
  OPENAI_API_KEY: sk-test-not-a-real-key-0123456789
  TOLLGATE_ADMIN_TOKEN: admin-token-for-the-test-0123456789
shutdown:
  preStopSleepSeconds: 3
resources:
  limits:
    memory: 2Gi
`,
		objects: withObjects("Secret " + chartFullname + "-env"),
		env: map[string]string{
			"OPENAI_API_KEY":       "sk-test-not-a-real-key-0123456789",
			"TOLLGATE_ADMIN_TOKEN": "admin-token-for-the-test-0123456789",
			"REDIS_PASSWORD":       "redis-password-for-the-test",
		},
		check: func(t *testing.T, objs manifests, cfg *config.Config) {
			if !slices.Equal(cfg.Redis.Addrs, []string{"redis.shared.svc:6379"}) {
				t.Errorf("[redis] addrs %q", cfg.Redis.Addrs)
			}
			d := get[*appsv1.Deployment](t, objs, "Deployment "+chartFullname)
			c := d.Spec.Template.Spec.Containers[0]
			var refs []string
			for _, e := range c.EnvFrom {
				if e.SecretRef != nil {
					refs = append(refs, e.SecretRef.Name)
				}
			}
			if want := []string{chartFullname + "-env", "tollgate-redis"}; !slices.Equal(refs, want) {
				t.Errorf("envFrom Secrets %q, want %q", refs, want)
			}
			s := get[*corev1.Secret](t, objs, "Secret "+chartFullname+"-env")
			if len(s.StringData) != 2 || s.StringData["OPENAI_API_KEY"] == "" || s.StringData["TOLLGATE_ADMIN_TOKEN"] == "" {
				t.Errorf("Secret keys %v, want OPENAI_API_KEY and TOLLGATE_ADMIN_TOKEN", slices.Sorted(maps.Keys(s.StringData)))
			}
			cm := get[*corev1.ConfigMap](t, objs, "ConfigMap "+chartFullname)
			if strings.Contains(cm.Data["gateway.toml"], "sk-test") || strings.Contains(cm.Data["gateway.toml"], "admin-token") {
				t.Error("a secret value is in the ConfigMap")
			}
			if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil || c.Lifecycle.PreStop.Sleep.Seconds != 3 {
				t.Errorf("preStop %+v, want a 3 s sleep action", c.Lifecycle)
			}
			if _, ok := d.Spec.Template.Annotations["checksum/secret-env"]; !ok {
				t.Error("no checksum/secret-env annotation: a changed key would not roll the pods")
			}
		},
	},
	{
		name: "HorizontalPodAutoscaler on CPU and open streams",
		values: `autoscaling:
  enabled: true
  minReplicas: 3
  maxReplicas: 12
  metrics:
    - type: Pods
      pods:
        metric: {name: tollgate_inflight_requests}
        target: {type: AverageValue, averageValue: "2000"}
`,
		objects: withObjects("HorizontalPodAutoscaler " + chartFullname),
		check: func(t *testing.T, objs manifests, _ *config.Config) {
			h := get[*autoscalingv2.HorizontalPodAutoscaler](t, objs, "HorizontalPodAutoscaler "+chartFullname)
			if h.Spec.ScaleTargetRef.Kind != "Deployment" || h.Spec.ScaleTargetRef.Name != chartFullname {
				t.Errorf("HPA scales %+v", h.Spec.ScaleTargetRef)
			}
			if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas != 3 || h.Spec.MaxReplicas != 12 {
				t.Errorf("HPA replicas %v..%d, want 3..12", h.Spec.MinReplicas, h.Spec.MaxReplicas)
			}
			if len(h.Spec.Metrics) != 2 || h.Spec.Metrics[0].Resource == nil || h.Spec.Metrics[0].Resource.Name != corev1.ResourceCPU ||
				*h.Spec.Metrics[0].Resource.Target.AverageUtilization != 70 || h.Spec.Metrics[1].Pods == nil ||
				h.Spec.Metrics[1].Pods.Metric.Name != "tollgate_inflight_requests" {
				t.Errorf("HPA metrics %+v, want CPU at 70%% and tollgate_inflight_requests per pod", h.Spec.Metrics)
			}
			if d := get[*appsv1.Deployment](t, objs, "Deployment "+chartFullname); d.Spec.Replicas != nil {
				t.Errorf("the Deployment sets replicas (%d) with an autoscaler: each upgrade would reset them", *d.Spec.Replicas)
			}
		},
	},
	{
		name:    "one replica: no PodDisruptionBudget, which would block every drain",
		values:  "replicas: 1\n",
		objects: withoutObjects("PodDisruptionBudget " + chartFullname),
	},
	{
		name: "integers stay integers",
		values: `config:
  server:
    max_event_bytes: 1048576
  metrics:
    latency_buckets: [0, 1000, 8000]
  probe:
    enabled: true
    requests: 4
    concurrency: 2
    targets:
      - upstream: openai
        model: gpt-4o-mini
goMemLimitPercent: 0
`,
		objects: defaultObjects,
		check: func(t *testing.T, objs manifests, cfg *config.Config) {
			if cfg.Server.MaxEventBytes != 1048576 || cfg.Probe.Requests != 4 {
				t.Errorf("max_event_bytes %d, probe.requests %d", cfg.Server.MaxEventBytes, cfg.Probe.Requests)
			}
			for _, e := range get[*appsv1.Deployment](t, objs, "Deployment "+chartFullname).Spec.Template.Spec.Containers[0].Env {
				if e.Name == "GOMEMLIMIT" {
					t.Errorf("GOMEMLIMIT=%s with goMemLimitPercent 0", e.Value)
				}
			}
		},
	},
}

// checkPrometheusRule checks that rule holds the groups of the rule file
// under deploy/: the same groups, rules and expressions, in order.
func checkPrometheusRule(t *testing.T, rule *monitoringv1.PrometheusRule, file string) {
	t.Helper()
	var want struct {
		Groups []struct {
			Name  string
			Rules []struct{ Record, Alert, Expr string }
		}
	}
	if err := yaml.Unmarshal([]byte(readFile(t, ".", file)), &want); err != nil {
		t.Fatal(err)
	}
	got := rule.Spec.Groups
	if len(got) != len(want.Groups) || len(got) == 0 {
		t.Fatalf("PrometheusRule %s has %d groups, deploy/%s %d", rule.Name, len(got), file, len(want.Groups))
	}
	for i, g := range want.Groups {
		if got[i].Name != g.Name || len(got[i].Rules) != len(g.Rules) {
			t.Errorf("PrometheusRule %s group %d: %s with %d rules, deploy/%s: %s with %d", rule.Name, i, got[i].Name, len(got[i].Rules), file, g.Name, len(g.Rules))
			continue
		}
		for j, r := range g.Rules {
			if gr := got[i].Rules[j]; gr.Record != r.Record || gr.Alert != r.Alert || gr.Expr.String() != r.Expr {
				t.Errorf("PrometheusRule %s, group %s, rule %d differs from deploy/%s", rule.Name, g.Name, j, file)
			}
		}
	}
}

// selects reports whether a selector's labels are all among labels.
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// TestHelmLint runs helm lint --strict on the chart, alone and with each
// case's values.
func TestHelmLint(t *testing.T) {
	helmBin := needHelm(t)
	for _, c := range chartCases {
		args := []string{"lint", "--strict", chartDir}
		if c.values != "" {
			args = append(args, "-f", writeValues(t, c.values))
		}
		if out, err := helm(helmBin, args...); err != nil {
			t.Errorf("%s: %v\n%s", c.name, err, out)
		}
	}
}

// TestHelmChart renders each case and checks every object, the gateway's
// Deployment against its rendered config, and what the case adds.
func TestHelmChart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the gateway")
	}
	helmBin := needHelm(t)
	bin := gatewayBinary(t)
	values := chartValues(t)
	root := repoRoot(t)
	df := mustParseDockerfile(t, root)
	for _, c := range chartCases {
		t.Run(c.name, func(t *testing.T) {
			objs := decodeManifests(t, renderChart(t, helmBin, c.values, c.apiVersions...))
			if got := objs.names(); !slices.Equal(got, c.objects) {
				t.Errorf("rendered %q\nwant     %q", got, c.objects)
			}
			caseValues := values
			if c.values != "" {
				var over map[string]any
				if err := yaml.Unmarshal([]byte(c.values), &over); err != nil {
					t.Fatal(err)
				}
				caseValues = mergeValues(values, over)
			}
			cfg := checkGatewayObjects(t, objs, bin, c.env, caseValues, df)
			if c.check != nil && cfg != nil {
				c.check(t, objs, cfg)
			}
		})
	}
}

// mergeValues returns base with over's keys laid over it, maps merged
// recursively, as Helm merges a values file over the chart's.
func mergeValues(base, over map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range base {
		out[k] = v
	}
	for k, v := range over {
		if om, ok := v.(map[string]any); ok {
			if bm, ok := out[k].(map[string]any); ok {
				out[k] = mergeValues(bm, om)
				continue
			}
		}
		out[k] = v
	}
	return out
}

// checkGatewayObjects checks what every install must have and returns the
// rendered config, parsed as the gateway parses it.
func checkGatewayObjects(t *testing.T, objs manifests, bin string, env map[string]string, values map[string]any, df *dockerfile) *config.Config {
	t.Helper()
	d := get[*appsv1.Deployment](t, objs, "Deployment "+chartFullname)
	cm := get[*corev1.ConfigMap](t, objs, "ConfigMap "+chartFullname)
	pod := d.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want the gateway alone", len(pod.Containers))
	}
	c := pod.Containers[0]

	// The config: mounted as a directory, so the kubelet's update
	// reaches the file the gateway watches.
	cfgPath, ok := flagValue(c.Args, "-config")
	if !ok || len(c.Args) == 0 || c.Args[0] != "serve" {
		t.Fatalf("args %q: want serve -config FILE", c.Args)
	}
	var mounted bool
	for _, m := range c.VolumeMounts {
		if m.MountPath != path.Dir(cfgPath) {
			continue
		}
		mounted = true
		if m.SubPath != "" {
			t.Errorf("the config is mounted with subPath %q: a ConfigMap update would never reach it", m.SubPath)
		}
		for _, v := range pod.Volumes {
			if v.Name == m.Name && (v.ConfigMap == nil || v.ConfigMap.Name != cm.Name) {
				t.Errorf("volume %s at %s is not the ConfigMap %s", v.Name, m.MountPath, cm.Name)
			}
		}
	}
	if !mounted {
		t.Errorf("nothing is mounted at %s, the config's directory", path.Dir(cfgPath))
	}
	doc, ok := cm.Data[path.Base(cfgPath)]
	if !ok {
		t.Fatalf("the ConfigMap has no %s", path.Base(cfgPath))
	}

	// The rendered config passes check-config with the pod's secrets, and
	// says what the Deployment assumes.
	file := filepath.Join(t.TempDir(), "gateway.toml")
	if err := os.WriteFile(file, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "check-config", "-config", file)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), file+": ok\n") {
		t.Fatalf("check-config of the rendered gateway.toml: %v\n%s\n%s", err, out, doc)
	}
	for _, v := range env {
		if strings.Contains(string(out), v) {
			t.Error("check-config printed a secret")
		}
	}
	cfg, err := config.Parse([]byte(doc), file, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Server.WatchConfig {
		t.Error("watch_config is off: a ConfigMap update would not be read")
	}
	var port int32
	for _, p := range c.Ports {
		if p.Name == "http" {
			port = p.ContainerPort
		}
	}
	if _, lport, _ := strings.Cut(cfg.Server.Listen, ":"); lport != strconv.Itoa(int(port)) || port == 0 {
		t.Errorf("the gateway listens on %q, the container's http port is %d", cfg.Server.Listen, port)
	}
	for _, p := range []struct {
		what  string
		probe *corev1.Probe
		path  string
	}{{"readiness", c.ReadinessProbe, "/readyz"}, {"liveness", c.LivenessProbe, "/healthz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "http" {
			t.Errorf("%s probe %+v, want GET %s on port http", p.what, p.probe, p.path)
		}
	}

	// Stopping: the grace covers the preStop sleep, the shutdown delay,
	// the drain and what the gateway does after it; a load balancer that
	// follows readiness sees it fail within the delay.
	var preStop float64
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
		preStop = float64(c.Lifecycle.PreStop.Sleep.Seconds)
	}
	afterDrain := number(t, values, "shutdown", "afterDrainSeconds")
	// After the drain: 2 s for cancelled streams, 5 s waiting for billing,
	// then Redis flushes of settlements, spend and conversations (5 s
	// each), the fleet (1 s) and the traces (5 s), as cmd/gateway bounds them.
	if afterDrain < 28 {
		t.Errorf("shutdown.afterDrainSeconds %v is less than the 28 s the gateway may take after its drain", afterDrain)
	}
	want := int64(math.Ceil(preStop + cfg.Server.ShutdownDelaySeconds + cfg.Server.DrainTimeoutSeconds + afterDrain))
	if g := pod.TerminationGracePeriodSeconds; g == nil || *g != want {
		t.Errorf("terminationGracePeriodSeconds %d, want %d = preStop %v + shutdown_delay_seconds %v + drain_timeout_seconds %v + %v after the drain",
			deref(g), want, preStop, cfg.Server.ShutdownDelaySeconds, cfg.Server.DrainTimeoutSeconds, afterDrain)
	}
	if r := c.ReadinessProbe; r != nil && cfg.Server.ShutdownDelaySeconds > 0 &&
		float64(r.PeriodSeconds*r.FailureThreshold) > cfg.Server.ShutdownDelaySeconds+preStop {
		t.Errorf("readiness fails only after %d s × %d, past the %v s the gateway keeps serving after SIGTERM",
			r.PeriodSeconds, r.FailureThreshold, cfg.Server.ShutdownDelaySeconds)
	}
	if s := d.Spec.Strategy.RollingUpdate; s == nil || s.MaxUnavailable == nil || s.MaxUnavailable.IntValue() != 0 {
		t.Errorf("rolling update %+v: want maxUnavailable 0, a new pod ready before an old one drains", s)
	}

	// GOMEMLIMIT from the memory limit.
	var goMemLimit string
	for _, e := range c.Env {
		if e.Name == "GOMEMLIMIT" {
			goMemLimit = e.Value
		}
	}
	pct := number(t, values, "goMemLimitPercent")
	if limit, ok := c.Resources.Limits[corev1.ResourceMemory]; ok && pct > 0 {
		if want := strconv.FormatInt(limit.Value()*int64(pct)/100, 10); goMemLimit != want {
			t.Errorf("GOMEMLIMIT %q, want %s (%v%% of %s)", goMemLimit, want, pct, limit.String())
		}
	}
	if req, ok := c.Resources.Requests[corev1.ResourceMemory]; !ok || req.Cmp(resource.MustParse("64Mi")) < 0 {
		t.Errorf("memory request %v: want one, from the measured figures", req)
	}

	// Security: non-root, read-only root filesystem, no capabilities,
	// no service account token; the image's user and state directory.
	ps, sc := pod.SecurityContext, c.SecurityContext
	if ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || ps.RunAsUser == nil || *ps.RunAsUser == 0 {
		t.Errorf("pod security context %+v: want runAsNonRoot and a non-zero runAsUser", ps)
	} else if user := df.final().lastArgs("USER"); !strings.HasPrefix(user, strconv.FormatInt(*ps.RunAsUser, 10)+":") {
		t.Errorf("runAsUser %d, the image's USER %s", *ps.RunAsUser, user)
	}
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
		t.Errorf("container security context %+v: want a read-only root filesystem, no privilege escalation, every capability dropped", sc)
	}
	if a := pod.AutomountServiceAccountToken; a == nil || *a {
		t.Error("the service account token is mounted: the gateway never calls the Kubernetes API")
	}
	workdir := df.final().lastArgs("WORKDIR")
	var writable bool
	for _, m := range c.VolumeMounts {
		for _, v := range pod.Volumes {
			writable = writable || m.MountPath == workdir && v.Name == m.Name && v.EmptyDir != nil && !m.ReadOnly
		}
	}
	if !writable {
		t.Errorf("the image's working directory %s (state and spill files) is not a writable volume: the root filesystem is read-only", workdir)
	}

	// The Service and the PDB select the gateway's pods.
	svc := get[*corev1.Service](t, objs, "Service "+chartFullname)
	if !selects(svc.Spec.Selector, d.Spec.Template.Labels) || svc.Spec.Ports[0].TargetPort.String() != "http" {
		t.Errorf("Service selector %v, target %v: want the gateway's pods %v, port http", svc.Spec.Selector, svc.Spec.Ports[0].TargetPort, d.Spec.Template.Labels)
	}
	if pdb, ok := objs["PodDisruptionBudget "+chartFullname].(*policyv1.PodDisruptionBudget); ok && !selects(pdb.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
		t.Errorf("PDB selector %v does not select the gateway's pods", pdb.Spec.Selector.MatchLabels)
	}

	// The rules and the dashboard are deploy/'s files, byte for byte.
	for key, want := range map[string]string{
		"ConfigMap " + chartFullname + "-prometheus-rules/recording.yml":  "prometheus/rules/recording.yml",
		"ConfigMap " + chartFullname + "-prometheus-rules/alerts.yml":     "prometheus/rules/alerts.yml",
		"ConfigMap " + chartFullname + "-grafana-dashboard/tollgate.json": "grafana/dashboards/tollgate.json",
	} {
		obj, file, _ := strings.Cut(key, "/")
		m, ok := objs[obj].(*corev1.ConfigMap)
		if !ok {
			continue // turned off in this case
		}
		if m.Data[file] != readFile(t, ".", want) {
			t.Errorf("%s's %s differs from deploy/%s", obj, file, want)
		}
	}
	return cfg
}

// TestHelmRestartChecksum: a change to reloadable keys leaves the pod
// template as it is (the gateway reloads the ConfigMap), and a change to a
// key that needs a restart changes it, so Kubernetes rolls the pods.
func TestHelmRestartChecksum(t *testing.T) {
	helmBin := needHelm(t)
	sum := func(values string) (string, string) {
		t.Helper()
		objs := decodeManifests(t, renderChart(t, helmBin, values))
		d := get[*appsv1.Deployment](t, objs, "Deployment "+chartFullname)
		cm := get[*corev1.ConfigMap](t, objs, "ConfigMap "+chartFullname)
		s := d.Spec.Template.Annotations["checksum/restart-config"]
		if s == "" {
			t.Fatal("no checksum/restart-config annotation")
		}
		return s, cm.Data["gateway.toml"]
	}
	base, baseDoc := sum("")
	for _, c := range []struct {
		name, values string
		restart      bool
	}{
		{"slo and log level", "config:\n  slo:\n    ttft_ms: 1500\n  log:\n    level: debug\n", false},
		{"upstreams", "config:\n  upstreams:\n    - name: openai\n      base_url: https://api.openai.com\n", false},
		{"drain timeout", "config:\n  server:\n    drain_timeout_seconds: 60\n", true},
		{"access log", "config:\n  log:\n    access_log: false\n", true},
		{"redis", "redis:\n  enabled: true\n", true},
	} {
		got, doc := sum(c.values)
		if doc == baseDoc {
			t.Errorf("%s: the ConfigMap did not change", c.name)
		}
		if (got != base) != c.restart {
			t.Errorf("%s: pod template changed %v, want %v", c.name, got != base, c.restart)
		}
	}
}

// TestHelmRefuses: values the chart cannot honour, or does not know, fail
// the render with a message naming them, instead of a gateway that does not
// start or a setting silently left at its default.
func TestHelmRefuses(t *testing.T) {
	helmBin := needHelm(t)
	for _, c := range []struct{ values, want string }{
		{"config:\n  server:\n    listen: \":9000\"\n", "config.server.listen is set by the chart"},
		{"redis:\n  enabled: true\nconfig:\n  redis:\n    addrs: [\"r:6379\"]\n", "config.redis.addrs is set with redis.enabled"},
		{"resources:\n  limits:\n    memory: 1.5Gi\n", `resources.limits.memory "1.5Gi"`},
		// values.schema.json: a misspelt key, a wrong type.
		{"replica: 3\n", "additional properties 'replica' not allowed"},
		{"shutdown:\n  preStopSleepSeconds: 2.5\n", "/shutdown/preStopSleepSeconds"},
	} {
		_, err := helm(helmBin, "template", chartRelease, chartDir, "-f", writeValues(t, c.values))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("values\n%s\nrendered with %v, want an error naming %q", c.values, err, c.want)
		}
	}
}

// TestHelmFilesAreLinks: the chart's files/ are symbolic links to the
// rules and the dashboard under deploy/, which Helm follows, so there is
// one copy of each to keep.
func TestHelmFilesAreLinks(t *testing.T) {
	for link, target := range map[string]string{
		"alerts.yml":    "prometheus/rules/alerts.yml",
		"recording.yml": "prometheus/rules/recording.yml",
		"tollgate.json": "grafana/dashboards/tollgate.json",
	} {
		p := filepath.Join(chartDir, "files", link)
		dest, err := os.Readlink(p)
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		if got := filepath.Clean(filepath.Join(filepath.Dir(p), dest)); got != filepath.Clean(target) {
			t.Errorf("%s links to %s, want %s", p, got, target)
		}
	}
}

// deref returns *p, or 0 for nil.
func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
