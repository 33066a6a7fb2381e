package bench_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/tollgate-llm/tollgate/bench"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
)

func TestLoadPrompts(t *testing.T) {
	long := strings.Repeat("word ", 2000) // 10,000 characters: ~2,500 tokens
	in := strings.Join([]string{
		`{"prompt":"Say hello."}`,
		``,
		`{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}],"id":"x-1"}`,
		`  {"messages":[{"role":"user","content":[{"type":"text","text":"part one"},{"type":"text","text":"part two"}]}]}  `,
		`{"prompt":"` + long + `"}`,
		`{"prompt":"tiny","class":"medium"}`,
	}, "\n")
	set, err := bench.LoadPrompts(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := bench.PromptSet{
		{Class: bench.ClassShort, Messages: []bench.Message{{Role: "user", Content: "Say hello."}}},
		{Class: bench.ClassShort, Messages: []bench.Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi"}}},
		{Class: bench.ClassShort, Messages: []bench.Message{{Role: "user", Content: "part one\npart two"}}},
		{Class: bench.ClassLong, Messages: []bench.Message{{Role: "user", Content: long}}},
		{Class: bench.ClassMedium, Messages: []bench.Message{{Role: "user", Content: "tiny"}}},
	}
	if len(set) != len(want) {
		t.Fatalf("%d prompts, want %d", len(set), len(want))
	}
	for i := range want {
		if set[i].Class != want[i].Class || !slices.Equal(set[i].Messages, want[i].Messages) {
			t.Errorf("prompt %d = %+v, want %+v", i, set[i], want[i])
		}
	}
}

func TestLoadPromptsErrors(t *testing.T) {
	cases := []struct {
		name, line, want string
	}{
		{"not json", `{"prompt":`, "not a JSON object"},
		{"not an object", `["prompt"]`, "not a JSON object"},
		{"trailing garbage", `{"prompt":"a"} x`, "not a JSON object"},
		{"neither", `{"text":"a"}`, `want "messages" or "prompt"`},
		{"both", `{"prompt":"a","messages":[{"role":"user","content":"b"}]}`, "both"},
		{"empty prompt", `{"prompt":""}`, "empty"},
		{"empty messages", `{"messages":[]}`, "empty"},
		{"bad role", `{"messages":[{"role":"tool","content":"a"}]}`, `role "tool"`},
		{"no user", `{"messages":[{"role":"system","content":"a"}]}`, "no user message"},
		{"empty content", `{"messages":[{"role":"user","content":""}]}`, "content is empty"},
		{"image part", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, `type "image_url"`},
		{"content number", `{"messages":[{"role":"user","content":7}]}`, "want a string or an array"},
		{"bad class", `{"prompt":"a","class":"huge"}`, `class "huge"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// The bad line is the third, after a good line and a blank one.
			in := `{"prompt":"fine"}` + "\n\n" + c.line + "\n" + `{"prompt":"also fine"}` + "\n"
			set, err := bench.LoadPrompts(strings.NewReader(in))
			if err == nil || set != nil {
				t.Fatalf("set %v, err nil; want an error", set)
			}
			if !strings.Contains(err.Error(), "line 3") || !strings.Contains(err.Error(), c.want) {
				t.Errorf("err %q, want it to name line 3 and %q", err, c.want)
			}
		})
	}
	if _, err := bench.LoadPrompts(strings.NewReader("\n\n")); err == nil || !strings.Contains(err.Error(), "no prompt") {
		t.Errorf("empty file: err %v", err)
	}
	huge := `{"prompt":"` + strings.Repeat("a", 17<<20) + `"}`
	if _, err := bench.LoadPrompts(strings.NewReader(`{"prompt":"a"}` + "\n" + huge)); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("overlong line: err %v", err)
	}
}

func TestBuiltinPrompts(t *testing.T) {
	set := bench.BuiltinPrompts()
	counts := map[string]int{}
	tokens := map[string][]int{}
	for _, p := range set {
		counts[p.Class]++
		n := bench.EstimateTokens(p.Messages)
		tokens[p.Class] = append(tokens[p.Class], n)
		if bench.ClassOf(n) != p.Class {
			t.Errorf("prompt of %d estimated tokens in class %s", n, p.Class)
		}
	}
	if counts[bench.ClassShort] == 0 || counts[bench.ClassShort] != counts[bench.ClassMedium] || counts[bench.ClassMedium] != counts[bench.ClassLong] {
		t.Errorf("classes %v, want the same number of each", counts)
	}
	t.Logf("estimated tokens by class: %v", tokens)
	// A caller's edits do not reach the next caller's set.
	set[0].Messages[0].Content = "changed"
	if bench.BuiltinPrompts()[0].Messages[0].Content == "changed" {
		t.Error("BuiltinPrompts shares its messages")
	}
	// Deterministic: two calls give the same text.
	if a, b := bench.BuiltinPrompts(), bench.BuiltinPrompts(); a[5].Messages[0] != b[5].Messages[0] {
		t.Error("built-in prompts differ between calls")
	}
}

// TestLoadedPromptsRun sends loaded prompts in both dialects and checks the
// bodies: Anthropic takes system prompts at the top level.
func TestLoadedPromptsRun(t *testing.T) {
	set, err := bench.LoadPrompts(strings.NewReader(
		`{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]}` + "\n" +
			`{"prompt":"` + strings.Repeat("x", 3000) + `"}` + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []llm.Dialect{llm.DialectOpenAI, llm.DialectAnthropic} {
		t.Run(d.String(), func(t *testing.T) {
			m, ts := startMock(t, mockllm.Options{OutputTokens: 3})
			res, err := bench.Run(runCtx(t), bench.Config{BaseURL: ts.URL, Dialect: d, Model: "m",
				Requests: 4, Concurrency: 2, Prompts: set, Seed: 3})
			if err != nil {
				t.Fatal(err)
			}
			if s := res.Summary(bench.ClassShort); s == nil || s.Requests != 2 {
				t.Errorf("short summary %+v, want 2 requests", s)
			}
			if s := res.Summary(bench.ClassMedium); s == nil || s.Requests != 2 {
				t.Errorf("medium summary %+v, want 2 requests", s)
			}
			if res.Summary(bench.ClassLong) != nil {
				t.Error("a long summary without long prompts")
			}
			var sawSystem bool
			for _, r := range m.Requests() {
				body := string(r.Body)
				if !strings.Contains(body, "Be brief.") {
					continue
				}
				sawSystem = true
				wantSys := `"system":"Be brief."`
				if d == llm.DialectOpenAI {
					wantSys = `{"role":"system","content":"Be brief."}`
				}
				if !strings.Contains(body, wantSys) {
					t.Errorf("body %s lacks %s", body, wantSys)
				}
			}
			if !sawSystem {
				t.Error("the prompt with a system message was not sent")
			}
		})
	}
}

// TestPromptOrder checks that a run cycles through the whole set before
// repeating, in an order fixed by the seed.
func TestPromptOrder(t *testing.T) {
	_, ts := startMock(t, mockllm.Options{OutputTokens: 2})
	var set bench.PromptSet
	for i := range 5 {
		set = append(set, bench.Prompt{Class: bench.ClassShort,
			Messages: []bench.Message{{Role: "user", Content: fmt.Sprint("prompt ", i)}}})
	}
	order := func(seed int64) []int {
		res, err := bench.Run(runCtx(t), bench.Config{BaseURL: ts.URL, Dialect: llm.DialectOpenAI,
			Model: "m", Requests: 10, Prompts: set, Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		out := make([]int, len(res.Samples))
		for i, s := range res.Samples {
			out[i] = s.Prompt
		}
		return out
	}
	a := order(1)
	first := slices.Sorted(slices.Values(a[:5]))
	if !slices.Equal(first, []int{0, 1, 2, 3, 4}) || !slices.Equal(a[:5], a[5:]) {
		t.Errorf("order %v: want every prompt once, then the same again", a)
	}
	if b := order(1); !slices.Equal(a, b) {
		t.Errorf("seed 1 gave %v, then %v", a, b)
	}
}
