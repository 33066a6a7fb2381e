package config

import (
	"fmt"
	"slices"

	"github.com/tollgate-llm/tollgate/llm"
)

// Warnings returns what a valid configuration holds that does nothing:
// check-config prints it and the gateway logs it at start and on reload,
// each as one sentence naming the setting and how to fix it.
//
// They are warnings, not errors, because each describes a setting that
// was accepted before and whose gateway serves: refusing it would stop,
// after an upgrade, a gateway whose first upstream works.
func (c *Config) Warnings() []string {
	return c.keyScopeWarnings()
}

// keyScopeWarnings names every upstream that is a fallback no caller can
// use: in passthrough mode with require_key every caller brings its own
// key, which never goes to another origin than its route's first upstream
// (CallerKeyMayGo), so an upstream that appears only as a fallback at
// another origin, without caller_keys_on_fallback, never gets a request
// while it looks like a safety net (an outage of the first answers every
// caller with errors while it is healthy).
func (c *Config) keyScopeWarnings() []string {
	if c.Auth.Mode != "passthrough" || !c.Auth.RequireKey {
		return nil
	}
	// The lists of upstreams a request may be sent to, per dialect: each
	// route's (those of its upstreams that serve the dialect) and, for
	// models no route matches, every upstream serving it, in file order.
	type list struct {
		what string
		ups  []int
	}
	var lists []list
	for _, d := range []llm.Dialect{llm.DialectOpenAI, llm.DialectAnthropic} {
		for i, r := range c.Routes {
			l := list{what: fmt.Sprintf("routes[%d] (%s)", i, d)}
			for _, name := range r.Upstreams {
				if j := slices.IndexFunc(c.Upstreams, func(u Upstream) bool { return u.Name == name }); j >= 0 && c.Upstreams[j].Serves(d) {
					l.ups = append(l.ups, j)
				}
			}
			lists = append(lists, l)
		}
		l := list{what: fmt.Sprintf("%s requests no route matches", d)}
		for j := range c.Upstreams {
			if c.Upstreams[j].Serves(d) {
				l.ups = append(l.ups, j)
			}
		}
		lists = append(lists, l)
	}
	reachable := make([]bool, len(c.Upstreams))
	fallbackIn := make([]string, len(c.Upstreams)) // a list where it is an unreachable fallback
	firstOf := make([]int, len(c.Upstreams))
	for _, l := range lists {
		for k, j := range l.ups {
			first := &c.Upstreams[l.ups[0]]
			u := &c.Upstreams[j]
			if CallerKeyMayGo(first.Origin(), u.Origin(), u.CallerKeysOnFallback) {
				reachable[j] = true
			} else if k > 0 && fallbackIn[j] == "" {
				fallbackIn[j], firstOf[j] = l.what, l.ups[0]
			}
		}
	}
	var out []string
	for j := range c.Upstreams {
		if reachable[j] || fallbackIn[j] == "" {
			continue
		}
		u, first := &c.Upstreams[j], &c.Upstreams[firstOf[j]]
		out = append(out, fmt.Sprintf("upstreams[%d]: "+
			"%q is only ever a fallback at another origin (%s) than the first upstream %q (%s) of %s, and no caller can use it: "+
			"in passthrough mode with require_key every caller brings its own key, which never goes to another origin (key_scope). "+
			"Set caller_keys_on_fallback = true on it if it accepts the same keys (a replica of %q), "+
			"or use [auth] mode = \"keys\" so that each upstream gets its own api_key_env key, or remove it",
			j, u.Name, u.Origin(), first.Name, first.Origin(), fallbackIn[j], first.Name))
	}
	return out
}
