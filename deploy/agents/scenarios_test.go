package agents_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// How each agent is pointed at the gateway and kept off the network it
// cannot reach here. Each run has a home of its own (HOME, XDG_*,
// CODEX_HOME) and a working folder of its own, and gets no variable from
// the environment but PATH, so a developer's own keys and settings play no
// part.

// claude runs `claude -p` with the key in credVar: ANTHROPIC_API_KEY (sent
// as x-api-key) or ANTHROPIC_AUTH_TOKEN (Authorization: Bearer).
// CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC stops its telemetry, error
// reports, update checks and lookups of api.anthropic.com; it also skips
// its HEAD /api/hello warm-up, which nonessential keeps (and with it the
// rest, on top of the three variables below). hints turns on its gateway
// hint headers (the request class and the rest).
func (r *run) claude(credVar string, nonessential, hints bool) []string {
	r.env = append(r.env, "ANTHROPIC_BASE_URL="+r.base, credVar+"="+r.key,
		"DISABLE_TELEMETRY=1", "DISABLE_ERROR_REPORTING=1", "DISABLE_AUTOUPDATER=1")
	if !nonessential {
		r.env = append(r.env, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1")
	}
	if hints {
		r.env = append(r.env, "CLAUDE_CODE_GATEWAY_HINT_HEADERS=1")
	}
	return []string{pins["claude"].command(r.dir), "-p", prompt}
}

// claudeSubagent runs `claude -p` with its hint headers on, asking for its
// Agent tool: the fake upstream calls it (the prompt names it) with the
// arguments ANTHROPIC_CUSTOM_HEADERS gives it (X-Mock-Tool-Arguments), so
// Claude Code runs an Explore subagent on "say hi", then answers.
func (r *run) claudeSubagent() []string {
	args := r.claude("ANTHROPIC_AUTH_TOKEN", false, true)
	r.env = append(r.env, `ANTHROPIC_CUSTOM_HEADERS=X-Mock-Tool-Arguments: `+
		`{"description":"look around","prompt":"say hi","subagent_type":"Explore","run_in_background":false}`)
	return append(args[:len(args)-1], "Use the Agent tool.")
}

// codexCommon keeps Codex off the network but for the gateway: no update
// check, analytics, feedback or OpenTelemetry export, and no plugin or app
// catalogue (its curated-plugin sync clones github.com/openai/plugins and
// asks api.github.com and chatgpt.com at every start). --strict-config makes
// a key a new Codex no longer knows an error rather than a silent no-op.
const codexCommon = `check_for_update_on_startup = false

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"

[history]
persistence = "none"

[features]
plugins = false
remote_plugin = false
apps = false
`

// codex runs `codex exec` with a config.toml in a CODEX_HOME of its own:
// provider "builtin" is Codex's own OpenAI provider pointed at the gateway
// by openai_base_url (which uses the WebSocket), "http" and "websocket" a
// [model_providers.tollgate] without and with supports_websockets.
func (r *run) codex(provider string) []string {
	codexHome := filepath.Join(r.home, ".codex")
	var cfg string
	switch provider {
	case "builtin", "refused":
		// The built-in provider takes its key from CODEX_API_KEY in exec.
		r.env = append(r.env, "CODEX_API_KEY="+r.key)
		cfg = fmt.Sprintf("openai_base_url = %q\nmodel = \"gpt-5.5\"\n", r.base+"/v1") + codexCommon
	default:
		r.env = append(r.env, "TOLLGATE_API_KEY="+r.key)
		cfg = "model = \"gpt-5.5\"\nmodel_provider = \"tollgate\"\n" + codexCommon +
			fmt.Sprintf("\n[model_providers.tollgate]\nname = \"tollgate\"\nbase_url = %q\nenv_key = \"TOLLGATE_API_KEY\"\nwire_api = \"responses\"\nsupports_websockets = %t\n",
				r.base+"/v1", provider == "websocket")
	}
	r.write(codexHome, "config.toml", cfg)
	r.env = append(r.env, "CODEX_HOME="+codexHome)
	return []string{pins["codex"].command(r.dir), "exec", "--strict-config", "--skip-git-repo-check", "--ephemeral",
		"--color", "never", prompt}
}

// opencode runs `opencode run` with an opencode.json in its working folder
// naming one provider, "tollgate", on the AI SDK package npmPkg. The
// OPENCODE_DISABLE_* variables stop its update check, its models.dev
// catalogue fetch, LSP downloads, default plugins and sharing. It also
// installs @opencode-ai/plugin into its config folder from the npm registry
// in the background at every start; npm_config_registry points that at a
// closed loopback port, so it fails at once without holding the run up.
func (r *run) opencode(npmPkg, model string) []string {
	cfg := map[string]any{
		"$schema":    "https://opencode.ai/config.json",
		"autoupdate": false,
		"share":      "disabled",
		"provider": map[string]any{
			"tollgate": map[string]any{
				"npm":     npmPkg,
				"name":    "tollgate",
				"options": map[string]any{"baseURL": r.base + "/v1", "apiKey": "{env:TOLLGATE_API_KEY}"},
				"models":  map[string]any{model: map[string]any{"name": model}},
			},
		},
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		r.t.Fatal(err)
	}
	r.write(r.work, "opencode.json", string(b))
	r.env = append(r.env, "TOLLGATE_API_KEY="+r.key,
		"OPENCODE_DISABLE_AUTOUPDATE=1", "OPENCODE_DISABLE_MODELS_FETCH=1", "OPENCODE_DISABLE_LSP_DOWNLOAD=1",
		"OPENCODE_DISABLE_DEFAULT_PLUGINS=1", "OPENCODE_DISABLE_SHARE=1",
		"npm_config_registry=http://"+freeAddr(r.t)+"/")
	return []string{pins["opencode"].command(r.dir), "run", "-m", "tollgate/" + model, prompt}
}

// node runs testdata/responses_ws.mjs, two turns on one socket with the
// openai package's ResponsesWS, from a folder whose node_modules is the
// cached install's.
func (r *run) node() []string {
	src, err := os.ReadFile(filepath.Join("testdata", "responses_ws.mjs"))
	if err != nil {
		r.t.Fatal(err)
	}
	r.write(r.work, "responses_ws.mjs", string(src))
	if err := os.Symlink(filepath.Join(r.dir, "node_modules"), filepath.Join(r.work, "node_modules")); err != nil {
		r.t.Fatal(err)
	}
	r.env = append(r.env, "OPENAI_API_KEY="+r.key, "OPENAI_BASE_URL="+r.base+"/v1", "MODEL=gpt-5.5")
	return []string{"node", "responses_ws.mjs"}
}

// write writes a file the scenario needs.
func (r *run) write(dir, name, content string) {
	r.t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		r.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		r.t.Fatal(err)
	}
}
