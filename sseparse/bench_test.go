package sseparse

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate-llm/tollgate/llm"
)

// openAIStream builds a realistic chat completion stream: a role chunk, n
// content chunks shaped like the API's (about 330 bytes each), a finish
// chunk and the include_usage chunk.
func openAIStream(n int) []byte {
	const head = `data: {"id":"chatcmpl-tg0001","object":"chat.completion.chunk","created":1767225600,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_tg01","service_tier":"default","choices":[{"index":0,"delta":`
	var b bytes.Buffer
	b.WriteString(head + `{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null,"obfuscation":"q3Zp"}` + "\n\n")
	words := []string{"Oslo", " is", " the", " capital", " of", " Norway", ".", " It", " lies", " at\\n"}
	for i := range n {
		fmt.Fprintf(&b, head+`{"content":"%s"},"logprobs":null,"finish_reason":null}],"usage":null,"obfuscation":"x%d"}`+"\n\n", words[i%len(words)], i%97)
	}
	b.WriteString(head + `{},"logprobs":null,"finish_reason":"stop"}],"usage":null,"obfuscation":"aZ7"}` + "\n\n")
	b.WriteString(`data: {"id":"chatcmpl-tg0001","object":"chat.completion.chunk","created":1767225600,"model":"gpt-4o-mini-2024-07-18","choices":[],"usage":{"prompt_tokens":19,"completion_tokens":8,"total_tokens":27}}` + "\n\n")
	return b.Bytes()
}

// eventCursor hands out one event at a time from a stream that ends on a
// boundary, starting over at its end.
type eventCursor struct {
	f      *Framer
	stream []byte
	pos    int
}

func (c *eventCursor) next(tb testing.TB) *Event {
	for {
		if c.pos == len(c.stream) {
			c.pos = 0
		}
		n, boundary, err := c.f.Push(c.stream[c.pos:])
		c.pos += n
		if err != nil {
			tb.Fatal(err)
		}
		if boundary {
			if ev := c.f.Event(); ev != nil {
				return ev
			}
		}
	}
}

func BenchmarkFramer(b *testing.B) {
	stream := openAIStream(200)
	c := &eventCursor{f: NewFramer(0), stream: stream}
	b.SetBytes(int64(len(stream) / 203))
	b.ReportAllocs()
	for b.Loop() {
		c.next(b)
	}
}

func BenchmarkReader(b *testing.B) {
	stream := openAIStream(200)
	rd := NewReader(bytes.NewReader(stream), 0)
	b.SetBytes(int64(len(stream) / 203))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := rd.Next(); err != nil {
			rd.Reset(bytes.NewReader(stream))
		}
	}
}

func benchDecode(b *testing.B, decode func(*Event, *Observation), typ, data string) {
	ev := &Event{Type: []byte(typ), Data: []byte(data)}
	var o Observation
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		decode(ev, &o)
	}
}

func BenchmarkDecodeOpenAI(b *testing.B) {
	cases := []struct{ name, data string }{
		{"content", `{"id":"chatcmpl-tg0001","object":"chat.completion.chunk","created":1767225600,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_tg01","service_tier":"default","choices":[{"index":0,"delta":{"content":" is the capital of Norway."},"logprobs":null,"finish_reason":null}],"usage":null,"obfuscation":"Lk"}`},
		{"tool_call", `{"id":"chatcmpl-tg0002","object":"chat.completion.chunk","created":1767225660,"model":"gpt-4.1-2025-04-14","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":" \"Bergen\"}"}}]},"logprobs":null,"finish_reason":null}],"usage":null}`},
		{"usage", `{"id":"chatcmpl-tg0001","object":"chat.completion.chunk","created":1767225600,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_tg01","service_tier":"default","choices":[],"usage":{"prompt_tokens":19,"completion_tokens":8,"total_tokens":27,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"obfuscation":"p"}`},
		{"done", `[DONE]`},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) { benchDecode(b, DecodeOpenAI, "", c.data) })
	}
}

func BenchmarkDecodeAnthropic(b *testing.B) {
	cases := []struct{ name, typ, data string }{
		{"text_delta", "content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" is the capital of Norway."}}`},
		{"message_start", "message_start", `{"type":"message_start","message":{"id":"msg_tg0001","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":21,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}}}`},
		{"message_delta", "message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":9}}`},
		{"no_event_name", "", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Oslo"}}`},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) { benchDecode(b, DecodeAnthropic, c.typ, c.data) })
	}
}

// BenchmarkTap measures the relay's whole per-event parsing cost: framing,
// decoding and the tap's bookkeeping.
func BenchmarkTap(b *testing.B) {
	stream := openAIStream(200)
	c := &eventCursor{f: NewFramer(0), stream: stream}
	var tap Tap
	tap.Reset(llm.DialectOpenAI)
	tap.ITL = discard{}
	now := t0
	b.SetBytes(int64(len(stream) / 203))
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Millisecond)
		tap.Observe(c.next(b), now)
	}
}

type discard struct{}

func (discard) Observe(float64) {}

// TestNoAllocsPerEvent proves the hot-path contract: once the buffers have
// grown, framing, decoding and tapping an event allocate nothing, whatever
// the event (every transcript in testdata/transcripts is cycled through,
// errors and usage included).
func TestNoAllocsPerEvent(t *testing.T) {
	streams := map[llm.Dialect][]string{
		llm.DialectOpenAI:    {"7.1.sse", "7.2.sse", "7.3-vllm"},
		llm.DialectAnthropic: {"7.4.sse", "7.5.sse", "7.6.sse"},
	}
	for d, files := range streams {
		var stream []byte
		for _, f := range files {
			stream = append(stream, withEndings(loadTranscript(t, f), "\r\n")...)
		}
		c := &eventCursor{f: NewFramer(0), stream: stream}
		var tap Tap
		tap.Reset(d)
		tap.ITL = discard{}
		now := t0
		tokens, errs, terminals := 0, 0, 0
		step := func() {
			now = now.Add(time.Millisecond)
			if c.pos == len(c.stream) {
				tap.Reset(d)
				tap.ITL = discard{}
			}
			o := tap.Observe(c.next(t), now)
			tokens += o.Tokens
			if o.Error {
				errs++
			}
			if o.Terminal {
				terminals++
			}
		}
		for range 100 { // warm up: grow the buffers
			step()
		}
		if allocs := testing.AllocsPerRun(500, step); allocs != 0 {
			t.Errorf("%v: %v allocations per event, want 0", d, allocs)
		}
		if tokens == 0 || errs == 0 || terminals == 0 {
			t.Errorf("%v: the loop saw %d tokens, %d errors, %d terminals; want all kinds", d, tokens, errs, terminals)
		}
	}
}
