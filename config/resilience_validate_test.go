package config

import (
	"math"
	"testing"
)

// resilienceCases extends TestBadConfigs with the upstream resilience keys:
// phase timeouts, shaping, [upstreams.retry], [upstreams.breaker] and
// [[routes]].
var resilienceCases = []struct {
	name string
	doc  string
	env  map[string]string
	want []string
}{
	// Phase timeouts and shaping.
	{"phase timeouts", up + "header_timeout_seconds = -1\nfirst_token_timeout_seconds = nan\nidle_timeout_seconds = 1e300\nqueue_timeout_seconds = 0\n",
		nil, []string{
			`gateway.toml:4: upstreams[0].header_timeout_seconds: must be 0 (off) or more, not -1`,
			`gateway.toml:5: upstreams[0].first_token_timeout_seconds: must be a number, not nan`,
			`gateway.toml:6: upstreams[0].idle_timeout_seconds: 1e+300 is too large`,
			`gateway.toml:7: upstreams[0].queue_timeout_seconds: must be greater than 0, not 0`,
		}},
	{"shaping", up + "max_concurrent = -1\nrequests_per_second = -0.5\nqueue_size = -1\n",
		nil, []string{
			`gateway.toml:4: upstreams[0].max_concurrent: must be 0 (no cap) or more, not -1`,
			`gateway.toml:5: upstreams[0].requests_per_second: must be 0 or more, not -0.5`,
			`gateway.toml:6: upstreams[0].queue_size: must be 0 (no waiting) or more, not -1`,
		}},
	{"infinite rate", up + "requests_per_second = inf\n",
		nil, []string{`gateway.toml:4: upstreams[0].requests_per_second: must be a finite number, not +Inf`}},
	{"nan rate", up + "requests_per_second = nan\n",
		nil, []string{`gateway.toml:4: upstreams[0].requests_per_second: must be a number, not nan`}},
	{"fractional queue size", up + "queue_size = 1.5\n",
		nil, []string{`gateway.toml:4: upstreams[0].queue_size: must be an integer, not a float`}},
	{"timeout in the second upstream", up + up + "header_timeout_seconds = -5\n",
		nil, []string{`gateway.toml:7: upstreams[1].header_timeout_seconds: must be 0 (off) or more, not -5`}},

	// [upstreams.retry].
	{"no attempt", up + "[upstreams.retry]\nmax_attempts = 0\n",
		nil, []string{`gateway.toml:5: upstreams[0].retry.max_attempts: must be from 1 (no retry) to 10, not 0`}},
	{"too many attempts", up + "[upstreams.retry]\nmax_attempts = 11\n",
		nil, []string{`gateway.toml:5: upstreams[0].retry.max_attempts: must be from 1 (no retry) to 10, not 11`}},
	{"inline retry", up + "retry = { max_attempts = -1 }\n",
		nil, []string{`gateway.toml:4: upstreams[0].retry.max_attempts: must be from 1 (no retry) to 10, not -1`}},
	{"dotted retry key", up + "retry.max_attempts = 20\n",
		nil, []string{`gateway.toml:4: upstreams[0].retry.max_attempts: must be from 1 (no retry) to 10, not 20`}},
	{"retry delays", up + "[upstreams.retry]\nbase_delay_ms = 0\nmax_delay_ms = -1\nmultiplier = 0.5\nmax_wait_seconds = -1\n",
		nil, []string{
			`gateway.toml:5: upstreams[0].retry.base_delay_ms: must be greater than 0, not 0`,
			`gateway.toml:6: upstreams[0].retry.max_delay_ms: must be greater than 0, not -1`,
			`gateway.toml:7: upstreams[0].retry.multiplier: must be 1 or more, not 0.5`,
			`gateway.toml:8: upstreams[0].retry.max_wait_seconds: must be 0 (off) or more, not -1`,
		}},
	{"max delay below base delay", up + "[upstreams.retry]\nbase_delay_ms = 500\nmax_delay_ms = 100\n",
		nil, []string{`gateway.toml:6: upstreams[0].retry.max_delay_ms: must be at least base_delay_ms (500), not 100`}},
	{"max delay below the default base delay", up + "[upstreams.retry]\nmax_delay_ms = 100\n",
		nil, []string{`gateway.toml:5: upstreams[0].retry.max_delay_ms: must be at least base_delay_ms (250), not 100`}},
	{"delays too large", up + "[upstreams.retry]\nmax_delay_ms = inf\nmax_wait_seconds = 1e300\n",
		nil, []string{
			`gateway.toml:5: upstreams[0].retry.max_delay_ms: +Inf is too large`,
			`gateway.toml:6: upstreams[0].retry.max_wait_seconds: 1e+300 is too large`,
		}},
	{"multiplier not finite", up + "[upstreams.retry]\nmultiplier = inf\n[[upstreams]]\nname = \"b\"\nbase_url = \"http://h\"\nretry.multiplier = nan\n",
		nil, []string{
			`gateway.toml:5: upstreams[0].retry.multiplier: must be a finite number, not +Inf`,
			`gateway.toml:9: upstreams[1].retry.multiplier: must be a number, not nan`,
		}},
	{"statuses", up + "[upstreams.retry]\nstatuses = [429, 200, 600, 429, 503]\n",
		nil, []string{
			`gateway.toml:5: upstreams[0].retry.statuses[1]: 200 is not an HTTP error status (400 to 599)`,
			`gateway.toml:5: upstreams[0].retry.statuses[2]: 600 is not an HTTP error status (400 to 599)`,
			`gateway.toml:5: upstreams[0].retry.statuses[3]: 429 is listed twice`,
		}},
	{"statuses of the wrong type", up + "[upstreams.retry]\nstatuses = [\"429\"]\n",
		nil, []string{`gateway.toml:5: upstreams[0].retry.statuses: each element must be an integer, not a string`}},
	{"budget", up + "[upstreams.retry]\nbudget_ratio = 11\nbudget_min_per_second = -1\n",
		nil, []string{
			`gateway.toml:5: upstreams[0].retry.budget_ratio: must be from 0 to 10, not 11`,
			`gateway.toml:6: upstreams[0].retry.budget_min_per_second: must be 0 or more, not -1`,
		}},
	{"budget not finite", up + "[upstreams.retry]\nbudget_ratio = nan\nbudget_min_per_second = inf\n",
		nil, []string{
			`gateway.toml:5: upstreams[0].retry.budget_ratio: must be a number, not nan`,
			`gateway.toml:6: upstreams[0].retry.budget_min_per_second: must be a finite number, not +Inf`,
		}},
	{"negative budget ratio", up + "[upstreams.retry]\nbudget_ratio = -0.1\n",
		nil, []string{`gateway.toml:5: upstreams[0].retry.budget_ratio: must be from 0 to 10, not -0.1`}},
	{"misspelt retry key", up + "[upstreams.retry]\nmax_attempt = 2\n",
		nil, []string{`gateway.toml:5: upstreams[0].retry.max_attempt: unknown key; did you mean "max_attempts"?`}},
	{"retry table for a value", up + "retry = 3\n",
		nil, []string{`gateway.toml:4: upstreams[0].retry: must be a table, not an integer`}},

	// [upstreams.breaker].
	{"breaker", up + "[upstreams.breaker]\nconsecutive_failures = 0\nfailure_ratio = 0\nmin_requests = 0\nwindow_seconds = 0\ncooldown_seconds = -1\nhalf_open_probes = 0\n",
		nil, []string{
			`gateway.toml:5: upstreams[0].breaker.consecutive_failures: must be at least 1, not 0`,
			`gateway.toml:6: upstreams[0].breaker.failure_ratio: must be greater than 0 and at most 1, not 0`,
			`gateway.toml:7: upstreams[0].breaker.min_requests: must be at least 1, not 0`,
			`gateway.toml:8: upstreams[0].breaker.window_seconds: must be greater than 0, not 0`,
			`gateway.toml:9: upstreams[0].breaker.cooldown_seconds: must be greater than 0, not -1`,
			`gateway.toml:10: upstreams[0].breaker.half_open_probes: must be at least 1, not 0`,
		}},
	{"breaker ratio above 1", up + "[upstreams.breaker]\nfailure_ratio = 1.5\n",
		nil, []string{`gateway.toml:5: upstreams[0].breaker.failure_ratio: must be greater than 0 and at most 1, not 1.5`}},
	{"breaker ratio nan", up + "breaker = { failure_ratio = nan }\n",
		nil, []string{`gateway.toml:4: upstreams[0].breaker.failure_ratio: must be greater than 0 and at most 1, not NaN`}},
	{"unknown key in the second upstream's breaker", up + "[upstreams.retry]\nmax_attempts = 2\n" + up + "[upstreams.breaker]\ncooldown = 1\n",
		nil, []string{`gateway.toml:10: upstreams[1].breaker.cooldown: unknown key; did you mean "cooldown_seconds"?`}},
	{"breaker error in the second upstream", up + up + "[upstreams.breaker]\nhalf_open_probes = -1\n",
		nil, []string{`gateway.toml:8: upstreams[1].breaker.half_open_probes: must be at least 1, not -1`}},
	{"breaker enabled of the wrong type", up + "[upstreams.breaker]\nenabled = \"no\"\n",
		nil, []string{`gateway.toml:5: upstreams[0].breaker.enabled: must be a boolean (true or false), not a string`}},

	// [[routes]].
	{"empty route", up + "[[routes]]\n",
		nil, []string{
			`gateway.toml:4: routes[0].models: must list at least one model name, or a pattern such as "gpt-4o*"`,
			`gateway.toml:4: routes[0].upstreams: must list at least one [[upstreams]] name`,
		}},
	{"route with empty lists", up + "[[routes]]\nmodels = []\nupstreams = []\n",
		nil, []string{
			`gateway.toml:5: routes[0].models: must list at least one model name`,
			`gateway.toml:6: routes[0].upstreams: must list at least one [[upstreams]] name`,
		}},
	{"route patterns", up + "[[routes]]\nmodels = [\"gpt-[4\", \"\", \"a*\", \"a*\", 'b\\']\nupstreams = [\"a\"]\n",
		nil, []string{
			`gateway.toml:5: routes[0].models[0]: "gpt-[4" is not a valid pattern: syntax error in pattern (syntax of Go's path.Match: *, ?, [a-z], \ escapes)`,
			`gateway.toml:5: routes[0].models[1]: must not be empty: a model name, or a pattern such as "gpt-4o*"`,
			`gateway.toml:5: routes[0].models[3]: "a*" is listed twice`,
			`gateway.toml:5: routes[0].models[4]: "b\\" is not a valid pattern`,
		}},
	{"route upstreams", up + "[[routes]]\nmodels = [\"x\"]\nupstreams = [\"a\", \"b\", \"a\", \"\"]\n",
		nil, []string{
			`gateway.toml:6: routes[0].upstreams[1]: "b" is not the name of any [[upstreams]] table`,
			`gateway.toml:6: routes[0].upstreams[2]: "a" is listed twice`,
			`gateway.toml:6: routes[0].upstreams[3]: "" is not the name of any [[upstreams]] table`,
		}},
	{"route rename", up + "[[routes]]\nmodels = [\"x\"]\nupstreams = [\"a\"]\n[routes.rename]\na = \"\"\nb = \"y\"\n",
		nil, []string{
			`gateway.toml:8: routes[0].rename.a: must not be empty: the model name to send to "a"`,
			`gateway.toml:9: routes[0].rename.b: "b" is not one of this route's upstreams; rename maps an upstream name to the model sent to it`,
		}},
	{"inline rename in the second route", up + "[[routes]]\nmodels = [\"x\"]\nupstreams = [\"a\"]\n[[routes]]\nmodels = [\"y\"]\nupstreams = [\"a\"]\nrename = { \"a b\" = \"z\" }\n",
		nil, []string{`gateway.toml:10: routes[1].rename."a b": "a b" is not one of this route's upstreams`}},
	{"rename of an upstream not in the route", up + "[[upstreams]]\nname = \"b\"\nbase_url = \"http://h\"\n[[routes]]\nmodels = [\"x\"]\nupstreams = [\"a\"]\nrename = { b = \"y\" }\n",
		nil, []string{`gateway.toml:10: routes[0].rename.b: "b" is not one of this route's upstreams`}},
	{"route models of the wrong type", up + "[[routes]]\nmodels = \"gpt-4o\"\nupstreams = [\"a\"]\n",
		nil, []string{`gateway.toml:5: routes[0].models: must be an array of strings, not a string`}},
	{"rename value of the wrong type", up + "[[routes]]\nmodels = [\"x\"]\nupstreams = [\"a\"]\nrename = { a = 1 }\n",
		nil, []string{`gateway.toml:7: routes[0].rename: each value must be a string, not an integer`}},
	{"misspelt route key", up + "[[routes]]\nmodel = [\"x\"]\nupstreams = [\"a\"]\n",
		nil, []string{`gateway.toml:5: routes[0].model: unknown key; did you mean "models"?`}},
}

// TestResilienceEdges checks that the limits of each issue-4 rule are
// accepted, and that a disabled breaker's keys are not checked.
func TestResilienceEdges(t *testing.T) {
	base := DemoConfig("http://127.0.0.1:1")
	cases := []struct {
		name string
		edit func(c *Config)
	}{
		{"every phase timeout off", func(c *Config) {
			u := &c.Upstreams[0]
			u.HeaderTimeoutSeconds, u.FirstTokenTimeoutSeconds, u.IdleTimeoutSeconds = 0, 0, 0
		}},
		{"no shaping, no queue", func(c *Config) {
			u := &c.Upstreams[0]
			u.MaxConcurrent, u.RequestsPerSecond, u.QueueSize = 0, 0, 0
		}},
		{"small queue timeout and fractional rate", func(c *Config) {
			c.Upstreams[0].QueueTimeoutSeconds = 0.001
			c.Upstreams[0].RequestsPerSecond = 0.1
		}},
		{"one attempt", func(c *Config) { c.Upstreams[0].Retry.MaxAttempts = 1 }},
		{"ten attempts", func(c *Config) { c.Upstreams[0].Retry.MaxAttempts = 10 }},
		{"flat delays", func(c *Config) {
			r := &c.Upstreams[0].Retry
			r.BaseDelayMs, r.MaxDelayMs, r.Multiplier, r.MaxWaitSeconds = 100, 100, 1, 0
		}},
		{"edge statuses", func(c *Config) { c.Upstreams[0].Retry.Statuses = []int{400, 599} }},
		{"no status", func(c *Config) { c.Upstreams[0].Retry.Statuses = nil }},
		{"no budget", func(c *Config) {
			c.Upstreams[0].Retry.BudgetRatio, c.Upstreams[0].Retry.BudgetMinPerSecond = 0, 0
		}},
		{"largest budget", func(c *Config) { c.Upstreams[0].Retry.BudgetRatio = 10 }},
		{"breaker on its edges", func(c *Config) {
			c.Upstreams[0].Breaker = Breaker{Enabled: true, ConsecutiveFailures: 1, FailureRatio: 1,
				MinRequests: 1, WindowSeconds: 0.5, CooldownSeconds: 0.1, HalfOpenProbes: 1}
		}},
		{"disabled breaker unchecked", func(c *Config) {
			c.Upstreams[0].Breaker = Breaker{Enabled: false, ConsecutiveFailures: -1, FailureRatio: 7,
				WindowSeconds: -1, CooldownSeconds: math.NaN()}
		}},
		{"routes", func(c *Config) {
			b := c.Upstreams[0]
			b.Name = "b"
			c.Upstreams = append(c.Upstreams, b)
			c.Routes = []Route{
				{Models: []string{"gpt-4o*", "o[134]-*", `lit\*`}, Upstreams: []string{"b", "mock"},
					Rename: map[string]string{"b": "deploy-1", "mock": "gpt-4o"}},
				{Models: []string{"*"}, Upstreams: []string{"mock"}},
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			c.Upstreams = []Upstream{DefaultUpstream()}
			c.Upstreams[0].Name, c.Upstreams[0].BaseURL = "mock", "http://127.0.0.1:1"
			tc.edit(&c)
			if err := c.Validate(); err != nil {
				t.Error(err)
			}
		})
	}
}
