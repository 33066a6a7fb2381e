package proxy

import (
	"testing"

	"github.com/tollgate-llm/tollgate/llm"
)

// TestExchangeKindAnswersEachQuestionOnce pins what each kind of exchange
// is at construction and what the stages ask of it: which are admitted and
// billed (model calls and metered forwards), which read a non-streamed
// answer's usage (all but a plain forward), and which count in the user
// figures (all but the probe).
func TestExchangeKindAnswersEachQuestionOnce(t *testing.T) {
	for _, c := range []struct {
		name    string
		route   llm.Route
		d       llm.Dialect
		probe   bool
		want    exchangeKind
		billed  bool
		usage   bool
		counted bool
	}{
		{"chat completions", llm.RouteChatCompletions, llm.DialectOpenAI, false, kindModelCall, true, true, true},
		{"messages", llm.RouteMessages, llm.DialectAnthropic, false, kindModelCall, true, true, true},
		{"responses", llm.RouteResponses, llm.DialectResponses, false, kindModelCall, true, true, true},
		{"replay", llm.RouteResponsesRetrieve, llm.DialectResponses, false, kindReplay, false, true, true},
		{"forward", llm.RouteOther, llm.DialectNone, false, kindForward, false, false, true},
		{"probe", llm.RouteChatCompletions, llm.DialectOpenAI, true, kindProbe, false, true, false},
	} {
		k := kindOf(c.route, c.d, c.probe)
		if k != c.want || k.billed() != c.billed || k.admitted() != c.billed || k.readsUsage() != c.usage || k.caller() != c.counted {
			t.Errorf("%s: kind %d billed %v admitted %v usage %v caller %v; want kind %d billed/admitted %v usage %v caller %v",
				c.name, k, k.billed(), k.admitted(), k.readsUsage(), k.caller(), c.want, c.billed, c.usage, c.counted)
		}
	}
	// Retries: never for the probe; a plain or metered forward repeats
	// only an idempotent request after any failure, and a plain forward is
	// retried at all only then.
	for _, c := range []struct {
		k                 exchangeKind
		method            string
		retried, anyFault bool
	}{
		{kindModelCall, "POST", true, true},
		{kindReplay, "GET", true, true},
		{kindProbe, "POST", false, true},
		{kindMetered, "POST", true, false},
		{kindForward, "POST", false, false},
		{kindForward, "GET", true, true},
		{kindForward, "HEAD", true, true},
	} {
		if c.k.retried(c.method) != c.retried || c.k.repeatsAnyFailure(c.method) != c.anyFault {
			t.Errorf("kind %d %s: retried %v, repeats any failure %v; want %v, %v", c.k, c.method,
				c.k.retried(c.method), c.k.repeatsAnyFailure(c.method), c.retried, c.anyFault)
		}
	}
	// A forward whose body names a model becomes metered (inspect): then
	// it is admitted, billed and its usage read like a model call.
	if k := kindMetered; !k.admitted() || !k.billed() || !k.readsUsage() || !k.caller() {
		t.Errorf("metered: admitted %v billed %v usage %v caller %v, want all true", k.admitted(), k.billed(), k.readsUsage(), k.caller())
	}
}
