package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"path"
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

// ownLabels are the label names tollgate's own series carry (see metrics),
// plus "le" and "quantile", which Prometheus gives histogram and summary
// series. A constant label with one of these names would clash with them.
var ownLabels = []string{
	"route", "model", "team", "upstream", "outcome", "input_bucket", "code",
	"type", "estimated", "slo", "cause", "reason", "scope", "limit",
	"result", "why", "from", "to", "component", "window", "completed", "errored",
	"class", "part", "le", "quantile",
}

// Validate checks every section and returns all the problems it finds,
// joined (see errors.Join), each naming its key path, e.g.
// "config: upstreams[0].base_url: ...". It returns nil for a usable config.
// Secrets must already be read (Parse and Load do it): an api_key_env,
// password_env or token_env whose value is empty is an error.
func (c *Config) Validate() error {
	var v validator
	c.Server.validate(&v)
	c.Auth.validate(&v, len(c.Keys), c.RuntimeKeys.Enabled)
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
	c.validateRoutes(&v)
	c.Metrics.validate(&v)
	c.SLO.validate(&v)
	c.Log.validate(&v)
	c.validateGovernance(&v)
	c.validateProbe(&v)
	c.validateTracing(&v)
	c.Conversations.validate(&v)
	return errors.Join(v.errs...)
}

// validator collects problems so that one run reports all of them.
type validator struct{ errs []error }

func (v *validator) add(key, format string, args ...any) {
	v.errs = append(v.errs, &fieldError{key: key, msg: fmt.Sprintf(format, args...)})
}

// maxSeconds is the largest number of seconds a time.Duration holds.
const maxSeconds = float64(math.MaxInt64) / float64(time.Second)

// maxHeaderBytes bounds server.max_header_bytes: the listener keeps up to
// twice it per connection while reading headers.
const maxHeaderBytes = 16 << 20

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

// atLeast checks an integer against its lowest allowed value.
func (v *validator) atLeast(key string, n, lowest int64) {
	if n < lowest {
		v.add(key, "must be at least %d, not %d", lowest, n)
	}
}

// number checks a float that is not a duration: finite and in [lo, hi]
// (no upper bound when hi is +Inf).
func (v *validator) number(key string, x, lo, hi float64) {
	switch {
	case math.IsNaN(x):
		v.add(key, "must be a number, not nan")
	case math.IsInf(x, 0):
		v.add(key, "must be a finite number, not %g", x)
	case x < lo && math.IsInf(hi, 1):
		v.add(key, "must be %g or more, not %g", lo, x)
	case x < lo || x > hi:
		v.add(key, "must be from %g to %g, not %g", lo, hi, x)
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
	v.positive("server.max_header_bytes", int64(s.MaxHeaderBytes))
	if s.MaxHeaderBytes > maxHeaderBytes {
		v.add("server.max_header_bytes", "%d is more than %d (16 MiB)", s.MaxHeaderBytes, maxHeaderBytes)
	}
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

func (a *Auth) validate(v *validator, keys int, runtimeKeys bool) {
	switch a.Mode {
	case "passthrough":
	case "keys":
		if keys == 0 && !runtimeKeys {
			v.add("auth.mode", `"keys" admits only callers whose key is listed in [[keys]], and there is none; add a [[keys]] table per caller (sha256 from `+"`gateway hash-key`"+`), turn [runtime_keys] on, or use "passthrough"`)
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
	if u.H2C && strings.HasPrefix(strings.ToLower(u.BaseURL), "https:") {
		// Over TLS the protocol is negotiated (ALPN), HTTP/2 included:
		// prior knowledge would only be a second, conflicting answer.
		v.add(key+".h2c", "is for http:// upstreams (HTTP/2 without TLS); an https:// base_url negotiates HTTP/2 by itself, so leave h2c out")
	}

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

	v.duration(key+".header_timeout_seconds", u.HeaderTimeoutSeconds, time.Second, true)
	v.duration(key+".first_token_timeout_seconds", u.FirstTokenTimeoutSeconds, time.Second, true)
	v.duration(key+".idle_timeout_seconds", u.IdleTimeoutSeconds, time.Second, true)

	if u.MaxConcurrent < 0 {
		v.add(key+".max_concurrent", "must be 0 (no cap) or more, not %d", u.MaxConcurrent)
	}
	v.number(key+".requests_per_second", u.RequestsPerSecond, 0, math.Inf(1))
	if u.QueueSize < 0 {
		v.add(key+".queue_size", "must be 0 (no waiting) or more, not %d", u.QueueSize)
	}
	v.duration(key+".queue_timeout_seconds", u.QueueTimeoutSeconds, time.Second, false)

	u.Retry.validate(v, key+".retry")
	if u.Breaker.Enabled {
		u.Breaker.validate(v, key+".breaker")
	}
}

// maxAttempts bounds retry.max_attempts: more attempts on one upstream only
// hold a caller longer on an upstream that keeps failing.
const maxAttempts = 10

// maxBudgetRatio bounds retry.budget_ratio: beyond it the budget no longer
// keeps an outage from multiplying an upstream's load.
const maxBudgetRatio = 10

func (r *Retry) validate(v *validator, key string) {
	if r.MaxAttempts < 1 || r.MaxAttempts > maxAttempts {
		v.add(key+".max_attempts", "must be from 1 (no retry) to %d, not %d", maxAttempts, r.MaxAttempts)
	}
	v.duration(key+".base_delay_ms", r.BaseDelayMs, time.Millisecond, false)
	v.duration(key+".max_delay_ms", r.MaxDelayMs, time.Millisecond, false)
	if r.BaseDelayMs > 0 && r.MaxDelayMs > 0 && r.MaxDelayMs < r.BaseDelayMs {
		v.add(key+".max_delay_ms", "must be at least base_delay_ms (%g), not %g", r.BaseDelayMs, r.MaxDelayMs)
	}
	v.number(key+".multiplier", r.Multiplier, 1, math.Inf(1))
	v.duration(key+".max_wait_seconds", r.MaxWaitSeconds, time.Second, true)
	for i, s := range r.Statuses {
		sk := fmt.Sprintf("%s.statuses[%d]", key, i)
		switch {
		case s < 400 || s > 599:
			v.add(sk, "%d is not an HTTP error status (400 to 599)", s)
		case slices.Index(r.Statuses, s) < i:
			v.add(sk, "%d is listed twice", s)
		}
	}
	v.number(key+".budget_ratio", r.BudgetRatio, 0, maxBudgetRatio)
	v.number(key+".budget_min_per_second", r.BudgetMinPerSecond, 0, math.Inf(1))
}

func (b *Breaker) validate(v *validator, key string) {
	v.atLeast(key+".consecutive_failures", int64(b.ConsecutiveFailures), 1)
	if math.IsNaN(b.FailureRatio) || b.FailureRatio <= 0 || b.FailureRatio > 1 {
		v.add(key+".failure_ratio", "must be greater than 0 and at most 1, not %g", b.FailureRatio)
	}
	v.atLeast(key+".min_requests", int64(b.MinRequests), 1)
	v.duration(key+".window_seconds", b.WindowSeconds, time.Second, false)
	v.duration(key+".cooldown_seconds", b.CooldownSeconds, time.Second, false)
	v.atLeast(key+".half_open_probes", int64(b.HalfOpenProbes), 1)
}

// validateRoutes checks the [[routes]] tables against the [[upstreams]]
// names.
func (c *Config) validateRoutes(v *validator) {
	for i := range c.Routes {
		r := &c.Routes[i]
		key := "routes[" + strconv.Itoa(i) + "]"
		if len(r.Models) == 0 {
			v.add(key+".models", `must list at least one model name, or a pattern such as "gpt-4o*"`)
		}
		for j, p := range r.Models {
			mk := fmt.Sprintf("%s.models[%d]", key, j)
			switch _, err := path.Match(p, ""); {
			case p == "":
				v.add(mk, `must not be empty: a model name, or a pattern such as "gpt-4o*"`)
			case err != nil:
				v.add(mk, `%q is not a valid pattern: %v (syntax of Go's path.Match: *, ?, [a-z], \ escapes)`, p, err)
			case slices.Index(r.Models, p) < j:
				v.add(mk, "%q is listed twice", p)
			}
		}
		if len(r.Upstreams) == 0 {
			v.add(key+".upstreams", "must list at least one [[upstreams]] name")
		}
		for j, name := range r.Upstreams {
			uk := fmt.Sprintf("%s.upstreams[%d]", key, j)
			switch {
			case c.UpstreamByName(name) == nil:
				v.add(uk, "%q is not the name of any [[upstreams]] table", name)
			case slices.Index(r.Upstreams, name) < j:
				v.add(uk, "%q is listed twice", name)
			}
		}
		names := make([]string, 0, len(r.Rename))
		for name := range r.Rename {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			rk := joinKey(key+".rename", name)
			if !slices.Contains(r.Upstreams, name) {
				v.add(rk, "%q is not one of this route's upstreams; rename maps an upstream name to the model sent to it", name)
			}
			if r.Rename[name] == "" {
				v.add(rk, "must not be empty: the model name to send to %q", name)
			}
		}
	}
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
