package mockllm

import (
	"strings"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/internal/jsonscan"
)

func TestScheduleOffsets(t *testing.T) {
	const ttft, itl = 200 * time.Millisecond, 15 * time.Millisecond
	t0 := time.Unix(1767225600, 0)

	t.Run("no jitter is exact, no drift", func(t *testing.T) {
		s := newSchedule(t0, params{ttft: ttft, itl: itl}, 1, 1)
		for k := range 1000 {
			if got, want := s.deadline(k), t0.Add(ttft+time.Duration(k)*itl); !got.Equal(want) {
				t.Fatalf("event %d due %v, want %v", k, got.Sub(t0), want.Sub(t0))
			}
		}
	})

	t.Run("jitter stays in its window and repeats for a seed", func(t *testing.T) {
		const jitter = 10 * time.Millisecond
		p := params{ttft: ttft, itl: itl, jitter: jitter}
		a := newSchedule(t0, p, 42, 7)
		b := newSchedule(t0, p, 42, 7)
		c := newSchedule(t0, p, 43, 7)
		d := newSchedule(t0, p, 42, 8)
		var differC, differD, moved int
		for k := range 500 {
			base := ttft + time.Duration(k)*itl
			oa, ob, oc, od := a.offset(k), b.offset(k), c.offset(k), d.offset(k)
			if oa < base-jitter/2 || oa > base+jitter/2 {
				t.Fatalf("event %d offset %v outside %v ± %v", k, oa, base, jitter/2)
			}
			if oa != ob {
				t.Fatalf("event %d: same seed and request gave %v and %v", k, oa, ob)
			}
			if oa != base {
				moved++
			}
			if oa != oc {
				differC++
			}
			if oa != od {
				differD++
			}
		}
		if moved == 0 || differC == 0 || differD == 0 {
			t.Errorf("jitter moved %d offsets; another seed changed %d, another request %d", moved, differC, differD)
		}
	})

	t.Run("never before t0", func(t *testing.T) {
		s := newSchedule(t0, params{jitter: time.Second}, 3, 1)
		for k := range 100 {
			if off := s.offset(k); off < 0 {
				t.Fatalf("event %d offset %v", k, off)
			}
		}
	})
}

func TestPlan(t *testing.T) {
	tests := []struct {
		name                        string
		p                           params
		maxTokens                   int64
		tool                        string
		header                      bool
		reasoning, answer, rEv, aEv int
		truncated                   bool
		frags                       int
	}{
		{name: "text", p: params{outputTokens: 16, tokensPerChunk: 1}, maxTokens: -1, answer: 16, aEv: 16},
		{name: "chunked", p: params{outputTokens: 10, tokensPerChunk: 4}, maxTokens: -1, answer: 10, aEv: 3},
		{name: "limit", p: params{outputTokens: 10, tokensPerChunk: 1, reasoningTokens: 4}, maxTokens: 6,
			reasoning: 4, answer: 2, rEv: 4, aEv: 2, truncated: true},
		{name: "limit eats reasoning", p: params{outputTokens: 10, tokensPerChunk: 3, reasoningTokens: 8}, maxTokens: 5,
			reasoning: 5, answer: 0, rEv: 2, aEv: 0, truncated: true},
		{name: "openai tool", p: params{outputTokens: 16, tokensPerChunk: 1}, maxTokens: -1, tool: "f", header: true,
			answer: 16, aEv: 16, frags: 16},
		{name: "openai tool one event", p: params{outputTokens: 2, tokensPerChunk: 2}, maxTokens: -1, tool: "f", header: true,
			answer: 2, aEv: 1, frags: 1},
		{name: "anthropic tool more tokens than bytes", p: params{outputTokens: 40, tokensPerChunk: 1}, maxTokens: -1, tool: "f",
			answer: 40, aEv: 18, frags: 18},
		{name: "anthropic tool cut", p: params{outputTokens: 6, tokensPerChunk: 1}, maxTokens: 2, tool: "f",
			answer: 2, aEv: 2, frags: 6, truncated: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pl := newPlan(tc.p, tc.maxTokens, tc.tool, tc.header)
			if pl.reasoning != tc.reasoning || pl.answer != tc.answer || pl.reasoningEvents != tc.rEv ||
				pl.answerEvents != tc.aEv || pl.truncated != tc.truncated || len(pl.toolArgs) != tc.frags {
				t.Errorf("plan %+v", pl)
			}
			if tc.tool == "" {
				return
			}
			if got := strings.Join(pl.toolArgs, ""); got != ToolArguments {
				t.Errorf("fragments join to %q", got)
			}
			if tc.header && len(pl.toolArgs) > 1 && pl.toolArgs[0] != "" {
				t.Errorf("header carries arguments %q", pl.toolArgs[0])
			}
			for i, f := range pl.toolArgs {
				if f == "" && !(tc.header && i == 0) {
					t.Errorf("fragment %d is empty", i)
				}
			}
		})
	}
}

func TestAppendJSONString(t *testing.T) {
	for in, want := range map[string]string{
		"plain":              `"plain"`,
		`q"b\`:               `"q\"b\\"`,
		"nl\n\t\r\x01":       `"nl\n\t\r\u0001"`,
		"ünïcødé <&>":        `"ünïcødé <&>"`,
		"":                   `""`,
		`{"city": "Bergen"}`: `"{\"city\": \"Bergen\"}"`,
	} {
		if got := string(jsonscan.AppendString(nil, in)); got != want {
			t.Errorf("%q: got %s, want %s", in, got, want)
		}
	}
}
