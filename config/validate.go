package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate-llm/tollgate/llm"
)

var (
	// nameRE keeps the names of upstreams, teams and keys usable as metric
	// label values and in logs.
	nameRE = regexp.MustCompile(`^[a-z0-9_-]+$`)
	// envNameRE is the POSIX shell's name for a variable.
	envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	// labelNameRE is Prometheus's label name syntax.
	labelNameRE = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)
)

// ownLabels are the label names tollgate's own series carry (DESIGN 3.4),
// plus "le" and "quantile", which Prometheus gives histogram and summary
// series. A constant label with one of these names would clash with them.
var ownLabels = []string{
	"route", "model", "team", "upstream", "outcome", "input_bucket", "code",
	"type", "estimated", "slo", "cause", "reason", "scope", "limit",
	"le", "quantile",
}

// Validate checks every section and returns all the problems it finds,
// joined (see errors.Join), each naming its key path, e.g.
// "config: upstreams[0].base_url: ...". It returns nil for a usable config.
// Secrets must already be read (Parse and Load do it): an api_key_env,
// password_env or token_env whose value is empty is an error.
func (c *Config) Validate() error {
	var v validator
	c.Server.validate(&v)
	c.Auth.validate(&v, len(c.Keys))
	if len(c.Upstreams) == 0 {
		v.add("", "at least one [[upstreams]] is required")
	}
	seen := make(map[string]int, len(c.Upstreams))
	for i := range c.Upstreams {
		u := &c.Upstreams[i]
		key := "upstreams[" + strconv.Itoa(i) + "]"
		if j, dup := seen[u.Name]; dup && u.Name != "" {
			v.add(key+".name", "%q is already the name of upstreams[%d]; names must be unique", u.Name, j)
		} else {
			seen[u.Name] = i
		}
		u.validate(&v, key)
	}
	c.Metrics.validate(&v)
	c.SLO.validate(&v)
	c.Log.validate(&v)
	c.validateGovernance(&v)
	return errors.Join(v.errs...)
}

// validator collects problems so that one run reports all of them.
type validator struct{ errs []error }

func (v *validator) add(key, format string, args ...any) {
	v.errs = append(v.errs, &fieldError{key: key, msg: fmt.Sprintf(format, args...)})
}

// maxSeconds is the largest number of seconds a time.Duration holds.
const maxSeconds = float64(math.MaxInt64) / float64(time.Second)

// duration checks a time value in unit (time.Second or time.Millisecond)
// that becomes a time.Duration: finite, not too large, and > 0 (or >= 0
// when zero is allowed, meaning "off").
func (v *validator) duration(key string, x float64, unit time.Duration, zeroOK bool) {
	switch {
	case math.IsNaN(x):
		v.add(key, "must be a number, not nan")
	case zeroOK && x < 0:
		v.add(key, "must be 0 (off) or more, not %g", x)
	case !zeroOK && x <= 0:
		v.add(key, "must be greater than 0, not %g", x)
	case x*float64(unit)/float64(time.Second) > maxSeconds:
		v.add(key, "%g is too large", x)
	}
}

func (v *validator) positive(key string, n int64) {
	if n <= 0 {
		v.add(key, "must be greater than 0, not %d", n)
	}
}

func (s *Server) validate(v *validator) {
	if host, port, err := net.SplitHostPort(s.Listen); err != nil {
		v.add("server.listen", "%q is not host:port (e.g. \":8080\" or \"127.0.0.1:8080\")", s.Listen)
	} else if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		v.add("server.listen", "%q: port %q is not a number from 0 to 65535", s.Listen, port)
	} else if strings.ContainsAny(host, " /") {
		v.add("server.listen", "%q: host %q is not a host name or IP address", s.Listen, host)
	}
	v.positive("server.max_body_bytes", s.MaxBodyBytes)
	v.positive("server.max_event_bytes", int64(s.MaxEventBytes))
	v.duration("server.read_header_timeout_seconds", s.ReadHeaderTimeoutSeconds, time.Second, false)
	v.duration("server.idle_timeout_seconds", s.IdleTimeoutSeconds, time.Second, false)
	v.duration("server.shutdown_delay_seconds", s.ShutdownDelaySeconds, time.Second, true)
	v.duration("server.drain_timeout_seconds", s.DrainTimeoutSeconds, time.Second, false)
}

// envVar checks a *_env key: name must be a variable's name, and the
// variable must be set (value is what resolveSecrets read). what names the
// secret ("key", "password") for someone who wrote the secret itself.
func (v *validator) envVar(key, name string, value Secret, what string) bool {
	if name == "" {
		return false
	}
	if !envNameRE.MatchString(name) {
		// What fails here is often the secret itself, pasted by mistake
		// ("sk-..."), so the value is not printed; the line locates it.
		v.add(key, "is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*); give the variable's name, not the %s itself", what)
		return false
	}
	if value == "" {
		v.add(key, "environment variable %s is not set or is empty", name)
		return false
	}
	return true
}

func (a *Auth) validate(v *validator, keys int) {
	switch a.Mode {
	case "passthrough":
	case "keys":
		if keys == 0 {
			v.add("auth.mode", `"keys" admits only callers whose key is listed in [[keys]], and there is none; add a [[keys]] table per caller (sha256 from `+"`gateway hash-key`"+`) or use "passthrough"`)
		}
	default:
		v.add("auth.mode", `%q is not a mode; use "passthrough" or "keys"`, a.Mode)
	}
}

func (u *Upstream) validate(v *validator, key string) {
	switch {
	case u.Name == "":
		v.add(key+".name", "is required")
	case !nameRE.MatchString(u.Name):
		v.add(key+".name", "%q may hold only a-z, 0-9, _ and - (it becomes a metric label value)", u.Name)
	}
	validateBaseURL(v, key+".base_url", u.BaseURL)

	if len(u.Dialects) == 0 {
		v.add(key+".dialects", `must list at least one of "openai", "anthropic"`)
	}
	for i, d := range u.Dialects {
		if _, ok := llm.ParseDialect(d); !ok {
			v.add(fmt.Sprintf("%s.dialects[%d]", key, i), `%q is not a dialect; use "openai" or "anthropic"`, d)
		} else if slices.Index(u.Dialects, d) < i {
			v.add(fmt.Sprintf("%s.dialects[%d]", key, i), "%q is listed twice", d)
		}
	}

	v.envVar(key+".api_key_env", u.APIKeyEnv, u.APIKey, "key")

	v.duration(key+".timeout_seconds", u.TimeoutSeconds, time.Second, false)
	v.duration(key+".connect_timeout_seconds", u.ConnectTimeoutSeconds, time.Second, false)
	v.positive(key+".max_idle_conns", int64(u.MaxIdleConns))
}

// validateBaseURL checks an upstream endpoint. Messages show the URL with any
// password masked.
func validateBaseURL(v *validator, key, raw string) {
	if raw == "" {
		v.add(key, `is required (e.g. "https://api.openai.com")`)
		return
	}
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // its text repeats the URL, password included
		}
		if strings.Contains(raw, "@") {
			v.add(key, "is not a URL: %v", err)
		} else {
			v.add(key, "%q is not a URL: %v", raw, err)
		}
		return
	}
	shown := u.Redacted()
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		v.add(key, "%q: scheme must be http or https", shown)
	case u.Host == "":
		v.add(key, "%q has no host", shown)
	case u.User != nil:
		v.add(key, "%q holds credentials; put the key in an environment variable and name it in api_key_env", shown)
	case u.RawQuery != "" || u.ForceQuery:
		v.add(key, "%q must not have a query", shown)
	case u.Fragment != "" || strings.Contains(raw, "#"):
		v.add(key, "%q must not have a fragment", shown)
	case strings.HasSuffix(strings.TrimRight(u.Path, "/"), "/v1"):
		// SDKs are configured with ".../v1"; the gateway appends "/v1/..."
		// itself, so keeping it here would request "/v1/v1/...".
		v.add(key, "%q ends in /v1; leave it out, the gateway appends /v1/... to base_url", shown)
	}
	if _, err := strconv.ParseUint(u.Port(), 10, 16); u.Port() != "" && err != nil {
		v.add(key, "%q: port %q is not a number from 0 to 65535", shown, u.Port())
	}
}

func (m *Metrics) validate(v *validator) {
	if len(m.LatencyBuckets) == 0 {
		v.add("metrics.latency_buckets", "must list at least one edge, starting at 0")
	} else if m.LatencyBuckets[0] != 0 {
		v.add("metrics.latency_buckets", "must start at 0, not %d", m.LatencyBuckets[0])
	}
	for i := 1; i < len(m.LatencyBuckets); i++ {
		if m.LatencyBuckets[i] <= m.LatencyBuckets[i-1] {
			v.add(fmt.Sprintf("metrics.latency_buckets[%d]", i),
				"must be strictly ascending: %d follows %d", m.LatencyBuckets[i], m.LatencyBuckets[i-1])
		}
	}

	names := make([]string, 0, len(m.Labels))
	for name := range m.Labels {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		key := joinKey("metrics.labels", name)
		switch {
		case !labelNameRE.MatchString(name):
			v.add(key, "%q is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)", name)
		case strings.HasPrefix(name, "__"):
			v.add(key, "%q: names starting with __ are reserved by Prometheus", name)
		case slices.Contains(ownLabels, name):
			v.add(key, "%q is one of tollgate's own labels (%s)", name, strings.Join(ownLabels, ", "))
		}
	}

	for i, name := range m.Models {
		if name == "" {
			v.add(fmt.Sprintf("metrics.models[%d]", i), "must not be empty")
		}
	}
	if m.MaxModels < 1 {
		v.add("metrics.max_models", "must be at least 1, not %d", m.MaxModels)
	}
}

func (s *SLO) validate(v *validator) {
	v.duration("slo.ttft_ms", s.TTFTMs, time.Millisecond, true)
	v.duration("slo.tpot_ms", s.TPOTMs, time.Millisecond, true)
	v.duration("slo.e2el_ms", s.E2ELMs, time.Millisecond, true)
}

func (l *Log) validate(v *validator) {
	switch l.Level {
	case "debug", "info", "warn", "error":
	default:
		v.add("log.level", `%q is not a level; use "debug", "info", "warn" or "error"`, l.Level)
	}
	switch l.Format {
	case "json", "text":
	default:
		v.add("log.format", `%q is not a format; use "json" or "text"`, l.Format)
	}
}
