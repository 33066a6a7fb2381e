package config

import (
	"testing"

	"github.com/tollgate-llm/tollgate/llm"
)

// BenchmarkRoute is the per-request config work of the proxy: pick the
// upstream for a dialect and build the upstream URL.
func BenchmarkRoute(b *testing.B) {
	c := Default()
	oai, ant := DefaultUpstream(), DefaultUpstream()
	oai.Name, oai.BaseURL, oai.Dialects = "openai", "https://api.openai.com", []string{"openai"}
	ant.Name, ant.BaseURL, ant.Dialects = "anthropic", "https://api.anthropic.com", []string{"anthropic"}
	c.Upstreams = []Upstream{oai, ant}
	b.ReportAllocs()
	var n int
	for b.Loop() {
		u := c.UpstreamFor(llm.DialectAnthropic)
		n += len(u.URL("/v1/messages"))
	}
	if n == 0 {
		b.Fatal("no URL built")
	}
}

// BenchmarkRouteFor is the per-request route lookup with a few routes, the
// request's model matched by the last pattern of the last route.
func BenchmarkRouteFor(b *testing.B) {
	c := Default()
	c.Routes = []Route{
		{Models: []string{"gpt-4o-mini*", "o1*", "o3*"}, Upstreams: []string{"openai"}},
		{Models: []string{"claude-opus-4*", "claude-sonnet-4*"}, Upstreams: []string{"anthropic"}},
		{Models: []string{"gpt-4.1*", "gpt-4o*"}, Upstreams: []string{"openai", "azure"}},
	}
	b.ReportAllocs()
	var n int
	for b.Loop() {
		if c.RouteFor("gpt-4o-2024-11-20") != nil {
			n++
		}
	}
	if n == 0 {
		b.Fatal("no route found")
	}
}
