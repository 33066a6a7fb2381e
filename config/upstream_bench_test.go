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
