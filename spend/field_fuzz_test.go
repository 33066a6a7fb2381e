package spend

import "testing"

// FuzzParseField: a ledger hash field encodes team, key id and model
// length-prefixed, so any names, separators included, come back exactly;
// and whatever a hash holds, decoding it never panics.
func FuzzParseField(f *testing.F) {
	f.Add("search", "alpha", "gpt-4o", "r", "")
	f.Add("", "", "", "i", "0:0:0:")
	f.Add("a:b", "1:x", "m:9:", "cw", "3:abc")
	f.Add("t", "k", "claude-sonnet-4-5", "co", "12:")
	f.Add("名前", "k\x00", "m\n", "o", "-1:x")
	f.Fuzz(func(t *testing.T, team, keyID, model, counter, raw string) {
		k := Key{Team: team, KeyID: keyID, Model: model}
		gt, gk, gm, gc, err := parseField(rowPrefix(k) + counter)
		if err != nil || gt != team || gk != keyID || gm != model || gc != counter {
			t.Fatalf("round trip of %q %q %q %q: %q %q %q %q %v", team, keyID, model, counter, gt, gk, gm, gc, err)
		}
		if gt, gk, gm, gc, err := parseField(raw); err == nil && len(gt)+len(gk)+len(gm)+len(gc) > len(raw) {
			t.Fatalf("parseField(%q) returned more than it was given: %q %q %q %q", raw, gt, gk, gm, gc)
		}
	})
}
