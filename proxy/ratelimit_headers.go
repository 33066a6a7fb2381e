package proxy

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/ratelimit"
)

// rateHeaderNames are the rate-limit header names in canonical form, per
// dialect and unit (requests, tokens), in the order limit, remaining,
// reset; writing them straight into the map skips canonicalising them on
// every request.
var rateHeaderNames = [2][2][3]string{
	{ // OpenAI
		{"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests"},
		{"X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens"},
	},
	{ // Anthropic
		{"Anthropic-Ratelimit-Requests-Limit", "Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Ratelimit-Requests-Reset"},
		{"Anthropic-Ratelimit-Tokens-Limit", "Anthropic-Ratelimit-Tokens-Remaining", "Anthropic-Ratelimit-Tokens-Reset"},
	},
}

// setRateLimitHeaders writes the dialect's rate-limit headers for the
// tightest RPM and TPM limits among states: OpenAI's x-ratelimit-* (resets
// as durations) or Anthropic's anthropic-ratelimit-* (resets as RFC 3339
// times), as the providers send them.
func setRateLimitHeaders(h http.Header, d llm.Dialect, states []ratelimit.State, now time.Time) {
	dialect := 0
	if d == llm.DialectAnthropic {
		dialect = 1
	}
	req, tok := ratelimit.Tightest(states)
	for unit, st := range [...]*ratelimit.State{req, tok} {
		if st == nil {
			continue
		}
		names := &rateHeaderNames[dialect][unit]
		var reset string
		if dialect == 1 {
			reset = ceilSecond(now.Add(st.Reset)).Format(time.RFC3339)
		} else {
			reset = resetDuration(st.Reset)
		}
		h[names[0]] = []string{strconv.FormatInt(st.Limit, 10)}
		h[names[1]] = []string{strconv.FormatInt(max(st.Remaining, 0), 10)}
		h[names[2]] = []string{reset}
	}
}

// deleteUpstreamAccountHeaders removes the upstream's rate-limit headers
// and, when the upstream was called with the gateway's own key
// (ownAccount), the headers naming its organisation and project.
func deleteUpstreamAccountHeaders(h http.Header, ownAccount bool) {
	for k := range h {
		if strings.HasPrefix(k, "X-Ratelimit-") || strings.HasPrefix(k, "Anthropic-Ratelimit-") ||
			strings.HasPrefix(k, "Anthropic-Priority-") ||
			ownAccount && (k == "Openai-Organization" || k == "Openai-Project" || k == "Anthropic-Organization-Id") {
			delete(h, k)
		}
	}
}

// ceilSecond rounds t up to a whole second, in UTC: RFC 3339 resets have
// second precision, and a reset shown early would invite a retry too soon.
func ceilSecond(t time.Time) time.Time {
	t = t.UTC()
	if tr := t.Truncate(time.Second); !tr.Equal(t) {
		return tr.Add(time.Second)
	}
	return t
}

// resetDuration renders a reset like OpenAI does ("1s", "6m0s", "12ms").
func resetDuration(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(10 * time.Millisecond).String()
}

// setRetryAfter writes Retry-After in whole seconds (rounded up, at least 1)
// and retry-after-ms, which the official SDKs read first.
func setRetryAfter(h http.Header, d time.Duration) {
	if d < time.Millisecond {
		d = time.Millisecond
	}
	secs := int64((d + time.Second - 1) / time.Second)
	h.Set("Retry-After", strconv.FormatInt(secs, 10))
	h.Set("Retry-After-Ms", strconv.FormatInt(int64((d+time.Millisecond-1)/time.Millisecond), 10))
}
