package mockllm

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// ToolArguments is the JSON the mock passes to the tool it calls, when a
// request asks for a call (see the package doc, Tool calls).
const ToolArguments = `{"city": "Bergen"}`

// signature is the opaque signature of a mock thinking block.
const signature = "c2lnLW1vY2s="

// Text returns the answer text of n tokens: " tok1 tok2 … tok<n>".
func Text(n int) string {
	return string(appendWords(nil, " tok", 1, n))
}

// ReasoningText returns the reasoning text of n tokens: " think1 … think<n>".
func ReasoningText(n int) string {
	return string(appendWords(nil, " think", 1, n))
}

// InputTokens returns the base input-token count the mock reports for a
// request body: ceil(len(body)/4), the usual four characters per token.
func InputTokens(body []byte) int {
	return (len(body) + 3) / 4
}

// appendWords appends prefix+i for i in [from, to].
func appendWords(b []byte, prefix string, from, to int) []byte {
	for i := from; i <= to; i++ {
		b = append(b, prefix...)
		b = strconv.AppendInt(b, int64(i), 10)
	}
	return b
}

// plan is what one request generates, independent of the dialect.
type plan struct {
	tpc       int
	reasoning int // R'
	answer    int // N'
	truncated bool

	// tool is the name of the called tool, "" for a text answer.
	tool string
	// toolArgs are the argument fragments, one per answer event. With
	// toolHeader, event 0 is the call's header (id, type, name) carrying
	// toolArgs[0] as its arguments (OpenAI).
	toolArgs   []string
	toolHeader bool

	reasoningEvents int
	answerEvents    int
}

// newPlan computes the generation for p, an optional max-tokens limit
// (maxTokens < 0 for none), and the tool name ("" for text).
func newPlan(p params, maxTokens int64, tool string, toolHeader bool) plan {
	pl := plan{tpc: p.tokensPerChunk, reasoning: p.reasoningTokens, answer: p.outputTokens, tool: tool}
	if maxTokens >= 0 {
		pl.reasoning = int(min(int64(pl.reasoning), maxTokens))
		pl.answer = int(min(int64(pl.answer), maxTokens-int64(pl.reasoning)))
	}
	pl.truncated = pl.answer < p.outputTokens
	pl.reasoningEvents = ceilDiv(pl.reasoning, pl.tpc)
	pl.answerEvents = ceilDiv(pl.answer, pl.tpc)
	if tool != "" {
		full := ceilDiv(p.outputTokens, pl.tpc)
		pl.toolHeader = toolHeader
		args := p.toolArgs
		if args == "" {
			args = ToolArguments
		}
		if toolHeader {
			if full <= 1 {
				pl.toolArgs = []string{args}
			} else {
				pl.toolArgs = append([]string{""}, split(args, full-1)...)
			}
		} else {
			pl.toolArgs = split(args, full)
		}
		pl.answerEvents = min(pl.answerEvents, len(pl.toolArgs))
	}
	return pl
}

// events is the number of token events.
func (pl *plan) events() int { return pl.reasoningEvents + pl.answerEvents }

// output is the number of output tokens reported in usage.
func (pl *plan) output() int { return pl.reasoning + pl.answer }

// appendReasoning appends the text of reasoning event j.
func (pl *plan) appendReasoning(b []byte, j int) []byte {
	return appendWords(b, " think", j*pl.tpc+1, min((j+1)*pl.tpc, pl.reasoning))
}

// appendAnswer appends the text of answer event j (text answers only).
func (pl *plan) appendAnswer(b []byte, j int) []byte {
	return appendWords(b, " tok", j*pl.tpc+1, min((j+1)*pl.tpc, pl.answer))
}

// reasoningText is the whole reasoning, as the stream accumulates it.
func (pl *plan) reasoningText() string {
	return string(appendWords(nil, " think", 1, pl.reasoning))
}

// answerText is the whole text answer.
func (pl *plan) answerText() string {
	return string(appendWords(nil, " tok", 1, pl.answer))
}

// toolText is the tool arguments as the stream accumulates them.
func (pl *plan) toolText() string {
	return strings.Join(pl.toolArgs[:pl.answerEvents], "")
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// split cuts s into n pieces of nearly equal length (at most one per byte),
// never inside a UTF-8 sequence: each piece is sent as a JSON string of
// its own. A piece may be empty when a sequence spans its share.
func split(s string, n int) []string {
	n = max(1, min(n, len(s)))
	out := make([]string, n)
	cut := func(i int) int {
		b := i * len(s) / n
		for b < len(s) && !utf8.RuneStart(s[b]) {
			b++
		}
		return b
	}
	for i := range n {
		out[i] = s[cut(i):cut(i+1)]
	}
	return out
}

// schedule gives the deadline of each token event (package doc, Schedule).
type schedule struct {
	t0     time.Time
	ttft   time.Duration
	itl    time.Duration
	jitter time.Duration
	rng    *rand.Rand // nil without jitter
	next   int        // the k the next offset call must ask for
}

func newSchedule(t0 time.Time, p params, seed int64, seq uint64) schedule {
	s := schedule{t0: t0, ttft: p.ttft, itl: p.itl, jitter: p.jitter}
	if p.jitter > 0 {
		s.rng = rand.New(rand.NewPCG(uint64(seed), seq))
	}
	return s
}

// offset returns the delay from t0 of token event k. It must be called once
// for each k in order, since each call draws the next jitter value.
func (s *schedule) offset(k int) time.Duration {
	if k != s.next {
		panic("mockllm: schedule offsets out of order")
	}
	s.next++
	d := s.ttft + time.Duration(k)*s.itl
	if s.rng != nil {
		d += time.Duration(s.rng.Int64N(int64(s.jitter)+1)) - s.jitter/2
	}
	return max(d, 0)
}

// deadline returns the moment token event k is due.
func (s *schedule) deadline(k int) time.Time { return s.t0.Add(s.offset(k)) }
