// Package agents holds no code. Its test, TestAgents, runs the coding
// agents people point at the gateway (Claude Code, Codex and opencode) and
// the openai package's Responses API WebSocket client, each at a pinned npm
// version, non-interactively against a gateway in front of the fake
// upstream, in mode passthrough and in mode keys. It checks what the agents
// printed and what the gateway saw: every model call in the access log with
// its TTFT, tokens and (mode keys) cost, no line with an outcome other than
// ok, and Codex and the SDK on the WebSocket transport with no refused
// upgrade and no fallback to HTTP.
//
// The agents talk to a recording reverse proxy in front of the gateway, so
// that a failure names what the agent sent (method, path, header names) and
// what the gateway answered, next to the gateway's access-log lines.
//
// It needs Node.js, npm and the npm registry (the first run installs the
// agents into a cache folder kept between runs), so it runs only when
// TOLLGATE_AGENTS is set: `make agents`, or .ci/agents, which CI runs.
// CONTRIBUTING.md says what it needs and how long it takes.
package agents
