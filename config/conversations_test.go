package config

import "testing"

// TestBadConversationsConfigs: every [conversations] value the gateway
// cannot use, and a team's budget per conversation it could never spend,
// are refused with their line.
func TestBadConversationsConfigs(t *testing.T) {
	priced := "[[models]]\npattern = \"gpt-*\"\ninput_usd_per_mtok = 1\noutput_usd_per_mtok = 2\n\n"
	cases := []struct {
		name string
		doc  string
		want []string
	}{
		{"values", up + "[conversations]\nheader = \"X Conv\"\nidle_timeout_seconds = 0\nmax_active = 0\nflush_interval_seconds = -1\n",
			[]string{
				`gateway.toml:5: conversations.header: "X Conv" is not a header name (letters, digits and !#$%&'*+-.^_` + "`" + `|~)`,
				`gateway.toml:6: conversations.idle_timeout_seconds: must be greater than 0, not 0`,
				`gateway.toml:7: conversations.max_active: must be at least 1, not 0`,
				`gateway.toml:8: conversations.flush_interval_seconds: must be greater than 0, not -1`,
			}},
		{"empty header", up + "[conversations]\nheader = \"\"\n",
			[]string{`gateway.toml:5: conversations.header: "" is not a header name (letters, digits and !#$%&'*+-.^_` + "`" + `|~)`}},
		{"identity", up + "[conversations]\nidentity = [\"x-claude-code-session-id\", \"session id\", \"X-Claude-Code-Session-Id\"]\n",
			[]string{
				`gateway.toml:5: conversations.identity[1]: "session id" is neither a header name nor one of "header", "baggage", "client_metadata", "responses"`,
				`gateway.toml:5: conversations.identity[2]: "X-Claude-Code-Session-Id" is listed twice`,
			}},
		{"no identity", up + "[conversations]\nidentity = []\n",
			[]string{`gateway.toml:5: conversations.identity: must name at least one source (default ["x-claude-code-session-id" "session-id" "session_id" "x-session-id" "x-session-affinity" "header" "baggage" "client_metadata" "responses"])`}},
		{"class rpm", up + "[[teams]]\nname = \"a\"\nclass_rpm = { auxiliary = 0, chatty = 5, main = 100 }\n",
			[]string{
				`gateway.toml:6: teams[0].class_rpm.auxiliary: a limit of 0 would refuse every request; leave the key out for no limit`,
				`gateway.toml:6: teams[0].class_rpm.chatty: "chatty" is not a request class (one of ["main" "subagent" "workflow" "compaction" "auxiliary" "warmup" "other"])`,
			}},
		{"too many active", up + "[conversations]\nmax_active = 20000000\n",
			[]string{`gateway.toml:5: conversations.max_active: 20000000 is too many (at most 10000000)`}},
		{"budget without conversations", up + priced + "[[teams]]\nname = \"a\"\nmax_cost_per_conversation_usd = 1\n",
			[]string{`gateway.toml:11: teams[0].max_cost_per_conversation_usd: needs [conversations] enabled = true: without it no conversation is tracked and the budget would never be spent`}},
		{"budget of 0", up + priced + "[conversations]\nenabled = true\n\n[[teams]]\nname = \"a\"\nmax_cost_per_conversation_usd = 0\n",
			[]string{`gateway.toml:14: teams[0].max_cost_per_conversation_usd: a budget of 0 would refuse every request; leave the key out for no limit`}},
		{"budget without prices", up + "[conversations]\nenabled = true\n\n[[teams]]\nname = \"a\"\nmax_cost_per_conversation_usd = 2\n",
			[]string{`gateway.toml:9: teams[0].max_cost_per_conversation_usd: no [[models]] table gives a price, so every request would cost 0 and this budget would never be spent; add [[models]] tables with the prices of the models you use`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.doc), "gateway.toml", fakeEnv(nil))
			if err == nil {
				t.Fatalf("Parse accepted:\n%s\n%+v", tc.doc, c)
			}
			for _, want := range tc.want {
				if !containsLine(errLines(err), "config: "+want) {
					t.Errorf("error lacks %q; got:\n%v", want, err)
				}
			}
			if n := len(errLines(err)); n != len(tc.want) {
				t.Errorf("%d problems reported, want %d:\n%v", n, len(tc.want), err)
			}
		})
	}
	// A good one parses.
	c := mustParse(t, up+priced+"[conversations]\nenabled = true\nheader = \"X-Session-Id\"\nidentity = [\"header\", \"responses\"]\n\n[[teams]]\nname = \"a\"\nmax_cost_per_conversation_usd = 2.5\n", nil)
	if !c.Conversations.Enabled || c.Conversations.Header != "X-Session-Id" || *c.Teams[0].MaxCostPerConversationUSD != 2.5 ||
		len(c.Conversations.Identity) != 2 {
		t.Errorf("parsed %+v %+v", c.Conversations, c.Teams[0])
	}
}
