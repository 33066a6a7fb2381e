package proxy

import (
	"net/http"

	"github.com/tollgate-llm/tollgate/llm"
)

// exchangeKind is what an exchange is. It decides the questions every stage
// asks of an exchange (admitted? billed? retried? in the user figures?), so
// that each is answered in one place.
type exchangeKind uint8

const (
	// kindForward is another /v1/* path whose body names no model: it goes
	// upstream unchanged, and only its end-to-end latency is measured.
	kindForward exchangeKind = iota
	// kindMetered is another /v1/* path whose body names a model
	// (embeddings, images, ...): admitted and billed like a model call.
	kindMetered
	// kindModelCall is a request on a dialect route: chat completions,
	// messages, the Responses API.
	kindModelCall
	// kindReplay is GET /v1/responses/{id} streamed again: measured as a
	// stream, neither admitted nor billed (its creation was).
	kindReplay
	// kindProbe is the gateway's own synthetic probe (Gateway.Probe): one
	// attempt, no retry, no fallback, kept out of every user figure.
	kindProbe
	// kindCountTokens is a token count (isTokenCount): forwarded in every
	// mode, limited by its own optional rate (count_tokens_rpm), never
	// billed, its answer's input_tokens no usage. A Responses count may
	// name a stored response or conversation, whose owner is checked as
	// for a model call.
	kindCountTokens
)

// kindOf is an exchange's kind at construction; reading a forward's body
// may make it kindMetered (meterForwarded).
func kindOf(route llm.Route, d llm.Dialect, probe bool) exchangeKind {
	switch {
	case probe:
		return kindProbe
	case route == llm.RouteResponsesRetrieve:
		return kindReplay
	case route == llm.RouteCountTokens:
		return kindCountTokens
	case d != llm.DialectNone:
		return kindModelCall
	}
	return kindForward
}

// admitted reports whether the exchange passes admission (the team's
// models, limits, budgets) and is a conversation's turn.
func (k exchangeKind) admitted() bool { return k == kindModelCall || k == kindMetered }

// limited reports whether the exchange passes the limiter: an admitted
// one under its caller's limits, a token count under its own rate.
func (k exchangeKind) limited() bool { return k.admitted() || k == kindCountTokens }

// billed reports whether the exchange's usage is settled and billed.
func (k exchangeKind) billed() bool { return k.admitted() }

// readsUsage reports whether the usage of a non-streamed answer is read
// from its body: every exchange but a plain forward.
func (k exchangeKind) readsUsage() bool { return k != kindForward && k != kindCountTokens }

// caller reports whether the exchange is a caller's request, counted in the
// user figures (metrics, /stats, traces, conversations), not the probe.
func (k exchangeKind) caller() bool { return k != kindProbe }

// retried reports whether a failed attempt of the exchange may be followed
// by another (a retry or a fallback), for a request of method: not for the
// probe, which must see its upstream's own health; a plain forward only
// when it is idempotent (a file upload retried could be stored twice).
func (k exchangeKind) retried(method string) bool {
	return k != kindProbe && (k != kindForward || safeMethod(method))
}

// repeatsAnyFailure reports whether an attempt that failed in any way may
// be sent again: a dialect route's request, or a GET or HEAD. Other
// forwards, metered or not, may create things (fine-tuning jobs, images,
// stored objects), so they are sent again only when the upstream surely
// did not act on them (repeatable).
func (k exchangeKind) repeatsAnyFailure(method string) bool {
	return k == kindModelCall || k == kindReplay || k == kindProbe || k == kindCountTokens || safeMethod(method)
}

// safeMethod reports whether method is GET or HEAD.
func safeMethod(method string) bool { return method == http.MethodGet || method == http.MethodHead }
