package proxy

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/tollgate-llm/tollgate/llm"
)

// FuzzAddIncludeUsage checks the request rewrite on arbitrary bodies: it
// never panics; when it edits, the result is valid JSON asking for usage and
// every other top-level member decodes exactly as before; when it does not,
// the body is returned unchanged.
func FuzzAddIncludeUsage(f *testing.F) {
	for _, seed := range []string{
		`{"model":"m","stream":true}`,
		`{}`,
		`{"stream_options":null}`,
		`{"stream_options":{}}`,
		`{"stream_options":{"include_usage":false,"x":[1,{"y":"}"}]}}`,
		`{"stream_options":"x"}`,
		`{"a":"\"stream_options\":{}","stream_options":{"include_usage":null}}`,
		` { "model" : "m" } `,
		`[1,2]`,
		`{"model":`,
		`{"stream_options":{},"stream_options":{"include_usage":true}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		orig := bytes.Clone(body)
		out, ok := addIncludeUsage(body)
		if !bytes.Equal(body, orig) {
			t.Fatal("the input was modified in place")
		}
		if !ok {
			if !bytes.Equal(out, body) {
				t.Fatalf("not ok but changed: %q -> %q", body, out)
			}
			return
		}
		var before, after map[string]json.RawMessage
		if json.Unmarshal(body, &before) != nil {
			// The gateway validates bodies before rewriting; an invalid one
			// may be edited but must not be made valid-looking garbage.
			return
		}
		if err := json.Unmarshal(out, &after); err != nil {
			t.Fatalf("rewrite of valid %q is invalid %q: %v", body, out, err)
		}
		var so struct {
			IncludeUsage bool `json:"include_usage"`
		}
		if err := json.Unmarshal(after["stream_options"], &so); err != nil || !so.IncludeUsage {
			t.Fatalf("rewrite %q does not ask for usage", out)
		}
		for k, v := range before {
			if k == "stream_options" {
				continue
			}
			if !bytes.Equal(v, after[k]) {
				t.Fatalf("member %q changed: %s -> %s", k, v, after[k])
			}
		}
		if _, aerr := inspectRequest(llm.DialectOpenAI, out); aerr == nil {
			if info, _ := inspectRequest(llm.DialectOpenAI, out); !info.IncludeUsage {
				t.Fatalf("inspectRequest does not see include_usage in %q", out)
			}
		}
	})
}
