package config

import (
	"reflect"
	"slices"
	"testing"
)

// reloadBase is a running configuration with every reloadable table set.
const reloadBase = `
[server]
listen = ":8080"

[log]
level = "info"

[[upstreams]]
name = "a"
base_url = "http://127.0.0.1:9000"

[[models]]
pattern = "gpt-*"
input_usd_per_mtok = 1
output_usd_per_mtok = 2

[[teams]]
name = "search"
rpm = 10
`

// A reload reports the reloadable tables and keys that differ, in the
// file's order, and takes them.
func TestReloadListsWhatChanged(t *testing.T) {
	running := mustParse(t, reloadBase, nil)
	doc := `
[server]
listen = ":8080"

[log]
level = "debug"

[[upstreams]]
name = "a"
base_url = "http://127.0.0.1:9000"

[[upstreams]]
name = "b"
base_url = "http://127.0.0.1:9001"

[[models]]
pattern = "gpt-*"
input_usd_per_mtok = 3
output_usd_per_mtok = 2

[[teams]]
name = "search"
rpm = 20
`
	next, changed, err := ParseReload([]byte(doc), "gateway.toml", noEnv, running)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"upstreams", "log.level", "models", "teams"}; !slices.Equal(changed, want) {
		t.Errorf("changed = %v, want %v", changed, want)
	}
	if next.Log.Level != "debug" || len(next.Upstreams) != 2 {
		t.Errorf("the reloaded config: level %q, %d upstreams", next.Log.Level, len(next.Upstreams))
	}
	_, changed, err = ParseReload([]byte(reloadBase), "gateway.toml", noEnv, running)
	if err != nil || len(changed) != 0 {
		t.Errorf("the same document: changed %v, err %v; want nothing", changed, err)
	}
}

// A reload that changes what only a restart can is refused, every such key
// named with the file and the line that sets it (none for a key the file
// dropped, which went back to its default).
func TestReloadRefusesWhatNeedsARestart(t *testing.T) {
	running := mustParse(t, reloadBase+`
[spend]
state_file = "/var/lib/tollgate/spend.json"
`, nil)
	doc := `
[server]
listen = ":9090"

[[upstreams]]
name = "a"
base_url = "http://127.0.0.1:9000"

[redis]
addrs = ["127.0.0.1:6379"]

[[teams]]
name = "search"
rpm = 10

[[models]]
pattern = "gpt-*"
input_usd_per_mtok = 1
output_usd_per_mtok = 2
`
	_, _, err := ParseReload([]byte(doc), "gateway.toml", noEnv, running)
	want := []string{
		"config: gateway.toml:3: server.listen: differs from the running configuration and cannot change without a restart",
		"config: gateway.toml:10: redis.addrs: differs from the running configuration and cannot change without a restart",
		"config: gateway.toml: spend.state_file: differs from the running configuration and cannot change without a restart",
	}
	if got := errLines(err); !slices.Equal(got, want) {
		t.Errorf("error lines:\n%q\nwant\n%q", got, want)
	}
}

// A document that does not load is refused with Parse's own errors.
func TestReloadRefusesAnInvalidDocument(t *testing.T) {
	running := mustParse(t, reloadBase, nil)
	_, _, err := ParseReload([]byte(reloadBase+"\n[[keys]]\nname = \"k\"\nsha256 = \"zz\"\n"), "gateway.toml", noEnv, running)
	if err == nil {
		t.Fatal("an invalid [[keys]] table reloaded")
	}
	for _, l := range errLines(err) {
		if len(l) < len("config: gateway.toml:") || l[:len("config: gateway.toml:")] != "config: gateway.toml:" {
			t.Errorf("error line %q does not name the file", l)
		}
	}
}

// The fields of an embedded struct (Limits in a team or key) are compared
// as the table's own.
func TestDiffComparesTheFieldsOfAnEmbeddedStruct(t *testing.T) {
	one, two := int64(1), int64(2)
	a := Team{Name: "search", Limits: Limits{RPM: &one}}
	b := Team{Name: "search", Limits: Limits{RPM: &two}}
	if _, fixed := diff(reflect.ValueOf(a), reflect.ValueOf(b), "teams"); !slices.Equal(fixed, []string{"teams.rpm"}) {
		t.Errorf("diff of two teams that differ in rpm: %v, want [teams.rpm]", fixed)
	}
}

// A restart-only key written out empty ("addrs = []", "labels = {}") means
// what leaving it out means: it is no change.
func TestReloadTakesAnEmptyListForAnOmittedOne(t *testing.T) {
	running := mustParse(t, reloadBase, nil)
	for _, extra := range []string{"\n[redis]\naddrs = []\n", "\n[metrics]\nmodels = []\n", "\n[metrics]\nlabels = {}\n"} {
		_, changed, err := ParseReload([]byte(reloadBase+extra), "gateway.toml", noEnv, running)
		if err != nil || len(changed) != 0 {
			t.Errorf("the running document plus %q: changed %v, err %v; want nothing changed", extra, changed, err)
		}
	}
}
