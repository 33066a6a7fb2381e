package proxy

import (
	"strconv"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/keystore"
	"github.com/tollgate-llm/tollgate/ratelimit"
)

// BenchmarkIdentify measures identifying a caller by its key headers
// (readKeys: the SHA-256 of the key; governance.identify: the lookups)
// with 10,000 runtime keys indexed: a [[keys]] table's key (found first),
// a runtime key without and with an expiry (the second also reads the
// clock), and an unknown key (both maps missed, the refusal built). It
// also measures building the index of 10,000 keys, which a change of the
// keys costs each replica once.
func BenchmarkIdentify(b *testing.B) {
	cfg := config.Default()
	cfg.Auth.Mode = "keys"
	cfg.Teams = []config.Team{{Name: "search"}}
	cfg.Keys = []config.Key{{Name: "alpha", SHA256: sha(keyAlpha), Team: "search"}}
	gv, err := newGovernance(&cfg, ratelimit.NewLocal(ratelimit.LocalOptions{}), nil)
	if err != nil {
		b.Fatal(err)
	}
	gv.now = time.Now
	const n = 10_000
	snap := keystore.Snapshot{Version: 1}
	secrets := make([]string, n)
	for i := range n {
		secrets[i] = "tg-bench-runtime-key-" + strconv.Itoa(i)
		k := keystore.Key{Key: config.Key{Name: "dev-" + strconv.Itoa(i), SHA256: sha(secrets[i]), Team: "search"}}
		if i%2 == 1 {
			k.Expires = time.Now().Add(time.Hour)
		}
		snap.Keys = append(snap.Keys, k)
	}
	b.Run("index-10k", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			newRuntimeIndex(gv, snap)
		}
	})
	gv.runtime.Store(newRuntimeIndex(gv, snap))
	for _, c := range []struct{ name, key string }{
		{"config-key", keyAlpha},
		{"runtime-key", secrets[0]},
		{"runtime-key-expiring", secrets[1]},
		{"unknown-key", "tg-nobody-has-this-one"},
	} {
		b.Run(c.name, func(b *testing.B) {
			h := map[string][]string{"Authorization": {"Bearer " + c.key}}
			b.ReportAllocs()
			for b.Loop() {
				gv.identify(readKeys(h))
			}
		})
	}
}
