package config

import (
	"testing"
)

// BenchmarkUpstreamURL is the per-attempt config work of the proxy once
// its upstream is chosen: build the upstream URL.
func BenchmarkUpstreamURL(b *testing.B) {
	u := DefaultUpstream()
	u.Name, u.BaseURL, u.Dialects = "anthropic", "https://api.anthropic.com", []string{"anthropic"}
	b.ReportAllocs()
	var n int
	for b.Loop() {
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
