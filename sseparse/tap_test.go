package sseparse

import (
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/llm"
)

// recorder is an llm.Observer that keeps what it is given.
type recorder struct{ got []float64 }

func (r *recorder) Observe(v float64) { r.got = append(r.got, v) }

func openAIContent(s string) *Event {
	return &Event{Data: []byte(`{"choices":[{"index":0,"delta":{"content":"` + s + `"}}]}`)}
}

func TestTapITL(t *testing.T) {
	var tap Tap
	tap.Reset(llm.DialectOpenAI)
	rec := &recorder{}
	tap.ITL = rec
	ms := func(k int) time.Time { return t0.Add(time.Duration(k) * time.Millisecond) }

	// Token-bearing events at 10, 13, 20 and 21 ms; non-token events between
	// them must neither open nor close a gap.
	tap.Observe(&Event{Data: []byte(`{"choices":[{"delta":{"role":"assistant","content":""}}]}`)}, ms(5))
	tap.Observe(openAIContent("a"), ms(10))
	tap.Observe(openAIContent("b"), ms(13))
	tap.Observe(&Event{Data: []byte(`{"choices":[{"delta":{}}]}`)}, ms(15))
	tap.Observe(openAIContent("c"), ms(20))
	tap.Observe(nil, ms(20))
	tap.Observe(openAIContent("d"), ms(21))
	tap.Observe(&Event{Data: []byte(`[DONE]`)}, ms(30))

	wantGaps := []float64{0.003, 0.007, 0.001}
	if len(rec.got) != len(wantGaps) {
		t.Fatalf("ITL observer got %v, want %v", rec.got, wantGaps)
	}
	for i := range wantGaps {
		if d := rec.got[i] - wantGaps[i]; d > 1e-12 || d < -1e-12 {
			t.Fatalf("ITL observer got %v, want %v", rec.got, wantGaps)
		}
	}
	if !tap.FirstToken().Equal(ms(10)) || !tap.LastToken().Equal(ms(21)) || tap.TokenEvents() != 4 || !tap.TerminalSeen() {
		t.Fatalf("first %v last %v events %d terminal %v", tap.FirstToken(), tap.LastToken(), tap.TokenEvents(), tap.TerminalSeen())
	}

	var r llm.Record
	r.Interruption = llm.InterruptNone
	tap.Fill(&r)
	if r.ITLCount != 3 || r.ITLSum != 11*time.Millisecond || r.ITLMax != 7*time.Millisecond {
		t.Fatalf("ITL count %d sum %v max %v", r.ITLCount, r.ITLSum, r.ITLMax)
	}
	if !r.Estimated || r.Usage.Output != 4 || r.Usage.HasOutput || r.Usage.HasInput {
		t.Fatalf("estimate: %+v estimated %v", r.Usage, r.Estimated)
	}
	if r.Interruption != llm.InterruptNone || r.ErrorType != "" {
		t.Fatalf("no error was seen, got %v %q", r.Interruption, r.ErrorType)
	}
	// TPOT works off the estimate: (21-10) ms over 3.
	if tpot, ok := r.TPOT(); !ok || tpot != 11*time.Millisecond/3 {
		t.Fatalf("TPOT = %v, %v", tpot, ok)
	}

	tap.Reset(llm.DialectOpenAI)
	if tap.ITL != nil || tap.TokenEvents() != 0 || !tap.FirstToken().IsZero() || tap.TerminalSeen() {
		t.Fatal("Reset kept state")
	}
}

func TestTapMultiChoiceEstimate(t *testing.T) {
	var tap Tap
	tap.Reset(llm.DialectOpenAI)
	tap.Observe(&Event{Data: []byte(`{"choices":[{"index":0,"delta":{"content":"a"}},{"index":1,"delta":{"content":"b"}}]}`)}, t0)
	var r llm.Record
	tap.Fill(&r)
	if r.TokenEvents != 1 || r.Usage.Output != 2 || !r.Estimated || r.ITLCount != 0 {
		t.Fatalf("one event with two choices: %+v", r)
	}
}

func TestTapOpenAIUsageLastWins(t *testing.T) {
	var tap Tap
	tap.Reset(llm.DialectOpenAI)
	// vLLM continuous_usage_stats: usage on every chunk; the last one counts,
	// whole (a later object without details drops the earlier details).
	tap.Observe(&Event{Data: []byte(`{"choices":[{"delta":{"content":"a"}}],"usage":{"prompt_tokens":5,"completion_tokens":1,"completion_tokens_details":{"reasoning_tokens":1}}}`)}, t0)
	tap.Observe(&Event{Data: []byte(`{"choices":[{"delta":{"content":"b"}}],"usage":{"prompt_tokens":5,"completion_tokens":2}}`)}, t0)
	u, ok := tap.Usage()
	want := llm.Usage{Input: 5, Output: 2, HasInput: true, HasOutput: true}
	if !ok || u != want {
		t.Fatalf("usage %+v", u)
	}
	var r llm.Record
	tap.Fill(&r)
	if r.Estimated || r.Usage != want {
		t.Fatalf("Fill: %+v estimated %v", r.Usage, r.Estimated)
	}
}

func TestTapAnthropicUsage(t *testing.T) {
	var tap Tap
	tap.Reset(llm.DialectAnthropic)
	ev := func(typ, data string) *Event { return &Event{Type: []byte(typ), Data: []byte(data)} }
	tap.Observe(ev("message_start", `{"type":"message_start","message":{"usage":{"input_tokens":10,"cache_creation_input_tokens":3,"cache_read_input_tokens":100,"output_tokens":1}}}`), t0)
	if u, _ := tap.Usage(); u.HasOutput || u.Input != 113 {
		t.Fatalf("after message_start: %+v (initial output_tokens must not count)", u)
	}
	tap.Observe(ev("content_block_delta", `{"type":"content_block_delta","delta":{"type":"text_delta","text":"x"}}`), t0)
	tap.Observe(ev("message_delta", `{"type":"message_delta","usage":{"output_tokens":4}}`), t0)
	// A later cumulative message_delta replacing only some input fields.
	tap.Observe(ev("message_delta", `{"type":"message_delta","usage":{"cache_read_input_tokens":200,"output_tokens":9}}`), t0)
	var r llm.Record
	tap.Fill(&r)
	want := llm.Usage{Input: 213, Output: 9, CacheRead: 200, CacheWrite: 3, HasInput: true, HasOutput: true}
	if r.Usage != want || r.Estimated {
		t.Fatalf("usage %+v estimated %v, want %+v", r.Usage, r.Estimated, want)
	}
}

func TestTapErrors(t *testing.T) {
	var tap Tap
	tap.Reset(llm.DialectAnthropic)
	tap.Observe(&Event{Type: []byte("error"), Data: []byte(`{"type":"error","error":{"type":"overloaded\u005ferror"}}`)}, t0)
	tap.Observe(&Event{Type: []byte("error"), Data: []byte(`{"type":"error","error":{"type":"api_error"}}`)}, t0)
	var r llm.Record
	tap.Fill(&r)
	if !tap.ErrorSeen() || r.ErrorType != "overloaded_error" || r.Interruption != llm.InterruptUpstreamErrorEvent {
		t.Fatalf("error %v type %q interruption %v", tap.ErrorSeen(), r.ErrorType, r.Interruption)
	}

	// An untyped error still interrupts, and leaves a type set elsewhere.
	tap.Reset(llm.DialectOpenAI)
	tap.Observe(&Event{Data: []byte(`{"error":"boom"}`)}, t0)
	r = llm.Record{ErrorType: "from_body"}
	tap.Fill(&r)
	if r.ErrorType != "from_body" || r.Interruption != llm.InterruptUpstreamErrorEvent {
		t.Fatalf("type %q interruption %v", r.ErrorType, r.Interruption)
	}
}

func TestTapNoDialect(t *testing.T) {
	var tap Tap // zero Tap: DialectNone
	o := tap.Observe(openAIContent("a"), t0)
	if o.TokenBearing || tap.TokenEvents() != 0 {
		t.Fatal("a tap without a dialect decoded an event")
	}
}
