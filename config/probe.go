package config

import (
	"strconv"
	"time"

	"github.com/tollgate-llm/tollgate/llm"
)

// Probe is the [probe] table: the synthetic probe, which makes the gateway
// send a small sample of requests of its own to each target every interval,
// through its own request path, and export the results as tollgate_probe_*
// series, so that a degraded upstream shows even when no user sends
// traffic. Probe requests are kept out of every user figure (requests,
// latency, goodput, spend, limits, /stats).
type Probe struct {
	// Enabled turns the probe on; it then needs at least one target.
	// Default false.
	Enabled bool `toml:"enabled"`
	// IntervalSeconds is the time from the start of one round of a target
	// to the start of its next (a round that overruns it is followed at
	// once). At least 1. Default 300.
	IntervalSeconds float64 `toml:"interval_seconds"`
	// Requests is the number of requests per target per round. From 1 to
	// 1000. Default 10.
	Requests int `toml:"requests"`
	// Concurrency is how many requests of one target are in flight at
	// once. At least 1. Default 2.
	Concurrency int `toml:"concurrency"`
	// MaxTokens caps the answer of each probe request (max_tokens, or
	// max_completion_tokens in the OpenAI dialect). At least 1. Default 16.
	MaxTokens int `toml:"max_tokens"`
	// TimeoutSeconds bounds one probe request whole; one that runs out is
	// counted as result "probe_timeout" (and gives the upstream's breaker no
	// verdict, as a caller that gives up does not). Default 60.
	TimeoutSeconds float64 `toml:"timeout_seconds"`
	// Prompt is the user message of every probe request. Non-empty.
	// Default DefaultProbePrompt.
	Prompt string `toml:"prompt"`
	// Targets are the upstreams and models probed. Default: none.
	Targets []ProbeTarget `toml:"targets"`
}

// ProbeTarget is one [[probe.targets]] table: a model on one upstream,
// probed there and nowhere else (no route, no fallback).
type ProbeTarget struct {
	// Upstream is an [[upstreams]] name. Required.
	Upstream string `toml:"upstream"`
	// Model is the model asked for, sent as it is (no route's rename
	// applies). Required.
	Model string `toml:"model"`
	// Dialect is the API the probe speaks to the upstream, "openai",
	// "anthropic" or "responses" (OpenAI's Responses API, served by an
	// upstream that serves "openai"); it must be one the upstream serves.
	// Default: the upstream's first dialect (filled in at load time).
	Dialect string `toml:"dialect"`
}

// DefaultProbePrompt is the default [probe] prompt: short, and answered in a
// few tokens by any chat model.
const DefaultProbePrompt = "Reply with the single word: ok"

// maxProbeRequests bounds [probe] requests: the probe is a sample, not a
// load test (that is `gateway bench`).
const maxProbeRequests = 1000

// defaultProbe returns the defaults of the [probe] table.
func defaultProbe() Probe {
	return Probe{
		IntervalSeconds: 300,
		Requests:        10,
		Concurrency:     2,
		MaxTokens:       16,
		TimeoutSeconds:  60,
		Prompt:          DefaultProbePrompt,
	}
}

// ProbeDialect returns the dialect target t speaks: its own, or the first
// its upstream serves; DialectNone when neither is known.
func (c *Config) ProbeDialect(t ProbeTarget) llm.Dialect {
	name := t.Dialect
	if name == "" {
		if u := c.UpstreamByName(t.Upstream); u != nil && len(u.Dialects) > 0 {
			name = u.Dialects[0]
		}
	}
	d, _ := parseProbeDialect(name)
	return d
}

// parseProbeDialect reads a probe target's dialect: an upstream's, or
// "responses".
func parseProbeDialect(name string) (llm.Dialect, bool) {
	if name == "responses" {
		return llm.DialectResponses, true
	}
	return llm.ParseDialect(name)
}

// normalizeProbe fills in each target's default dialect, so that
// check-config shows the effective one, and makes an empty target list nil.
func (c *Config) normalizeProbe() {
	if len(c.Probe.Targets) == 0 {
		c.Probe.Targets = nil
	}
	for i := range c.Probe.Targets {
		t := &c.Probe.Targets[i]
		if t.Dialect != "" {
			continue
		}
		if u := c.UpstreamByName(t.Upstream); u != nil && len(u.Dialects) > 0 {
			t.Dialect = u.Dialects[0]
		}
	}
}

// validateProbe checks the [probe] table. Its values are checked whether or
// not it is enabled, so that turning it on never meets a stale target.
func (c *Config) validateProbe(v *validator) {
	p := &c.Probe
	v.duration("probe.interval_seconds", p.IntervalSeconds, time.Second, false)
	if p.IntervalSeconds > 0 && p.IntervalSeconds < 1 {
		v.add("probe.interval_seconds", "must be at least 1, not %g: the probe is a sample, not load", p.IntervalSeconds)
	}
	if p.Requests < 1 || p.Requests > maxProbeRequests {
		v.add("probe.requests", "must be from 1 to %d, not %d", maxProbeRequests, p.Requests)
	}
	v.atLeast("probe.concurrency", int64(p.Concurrency), 1)
	v.atLeast("probe.max_tokens", int64(p.MaxTokens), 1)
	v.duration("probe.timeout_seconds", p.TimeoutSeconds, time.Second, false)
	if p.Prompt == "" {
		v.add("probe.prompt", "must not be empty")
	}
	// A round is cut at the next one's start; a request still within its
	// timeout then would count as a failure of a healthy, slow upstream.
	if p.Requests >= 1 && p.Concurrency >= 1 && p.IntervalSeconds >= 1 && p.TimeoutSeconds > 0 {
		waves := (p.Requests + p.Concurrency - 1) / p.Concurrency
		if longest := float64(waves) * p.TimeoutSeconds; longest > p.IntervalSeconds {
			v.add("probe.timeout_seconds", "a round of %d requests, %d at a time, may take %d × %g = %g s, "+
				"longer than interval_seconds (%g), where it is cut: lower timeout_seconds or requests, "+
				"or raise concurrency or interval_seconds", p.Requests, p.Concurrency, waves, p.TimeoutSeconds,
				longest, p.IntervalSeconds)
		}
	}
	if p.Enabled && len(p.Targets) == 0 {
		v.add("probe.enabled", "the probe needs at least one [[probe.targets]] table (upstream and model) to probe; add one or set enabled = false")
	}
	seen := make(map[[2]string]int, len(p.Targets))
	for i := range p.Targets {
		t := &p.Targets[i]
		key := "probe.targets[" + strconv.Itoa(i) + "]"
		u := c.UpstreamByName(t.Upstream)
		switch {
		case t.Upstream == "":
			v.add(key+".upstream", "is required: the name of the [[upstreams]] table to probe")
		case u == nil:
			v.add(key+".upstream", "%q is not the name of any [[upstreams]] table", t.Upstream)
		}
		if t.Model == "" {
			v.add(key+".model", "is required: the model to ask for")
		}
		if t.Dialect != "" {
			d, ok := parseProbeDialect(t.Dialect)
			switch {
			case !ok:
				v.add(key+".dialect", `%q is not a dialect; use "openai", "anthropic" or "responses"`, t.Dialect)
			case u != nil && !u.Serves(d):
				v.add(key+".dialect", "%q is not served by upstream %q (its dialects: %v)", t.Dialect, u.Name, u.Dialects)
			case d == llm.DialectResponses && c.Probe.MaxTokens >= 1 && c.Probe.MaxTokens < 16:
				v.add(key+".dialect", "the Responses API wants max_output_tokens of at least 16; probe.max_tokens is %d",
					c.Probe.MaxTokens)
			}
		}
		// The probe's series are labelled by upstream and model only.
		pair := [2]string{t.Upstream, t.Model}
		if j, dup := seen[pair]; dup && t.Upstream != "" && t.Model != "" {
			v.add(key, "upstream %q and model %q are already probed by probe.targets[%d]", t.Upstream, t.Model, j)
		} else {
			seen[pair] = i
		}
	}
}
