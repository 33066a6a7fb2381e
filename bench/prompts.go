package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Input-size classes. A prompt's class comes from its estimated input tokens
// (see EstimateTokens): under 500 is short, under 2,000 medium, the rest
// long. The edges are the first edges of the gateway's default
// metrics.latency_buckets, so a class lines up with the gateway's
// input_bucket segments.
const (
	ClassShort  = "short"
	ClassMedium = "medium"
	ClassLong   = "long"
	// ClassAll names the summary over every request.
	ClassAll = "all"
)

// classEdges are the estimated-token lower bounds of medium and long.
const (
	mediumFrom = 500
	longFrom   = 2000
)

// classOrder is the order summaries are reported in.
var classOrder = []string{ClassShort, ClassMedium, ClassLong}

// Message is one chat message of a prompt.
type Message struct {
	// Role is "system", "developer", "user" or "assistant". On the Anthropic
	// dialect, system and developer messages go into the top-level system
	// field.
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Prompt is one request's input.
type Prompt struct {
	// Class is the prompt's input-size class (ClassShort, ClassMedium or
	// ClassLong).
	Class    string
	Messages []Message
}

// PromptSet is the prompts a run draws from, in a seeded order that cycles
// through the whole set before repeating.
type PromptSet []Prompt

// EstimateTokens estimates the input tokens of messages as a quarter of their
// characters, rounded up: OpenAI's rule of thumb for English, and the count
// mockllm reports, so no tokenizer is needed to classify a prompt.
func EstimateTokens(messages []Message) int {
	n := 0
	for _, m := range messages {
		n += len(m.Content)
	}
	return (n + 3) / 4
}

// ClassOf returns the input-size class of an estimated token count.
func ClassOf(tokens int) string {
	switch {
	case tokens >= longFrom:
		return ClassLong
	case tokens >= mediumFrom:
		return ClassMedium
	}
	return ClassShort
}

// builtinVariants is the number of built-in prompts per class. Several
// distinct texts per class keep an engine's prefix cache from answering every
// request of a class from one cached prompt.
const builtinVariants = 4

// builtinWords are short common English words, each a single token in the
// usual BPE vocabularies, so a prompt of n words is close to n tokens.
var builtinWords = strings.Fields(`the of and to in is it that for on was with as at by
this be from or an are but not have had what all were when we there can
your which their said if do will each about how up out them then she many
some so these would other into has more her two like him see time could no
make than first been its who now people my made over did down only way find
use may water long little very after words called just where most know get
through back much go good new write our me man too any day same right look
think also around another came come work three word must because does part`)

// builtinLengths are the approximate token lengths of the built-in classes.
var builtinLengths = []struct {
	class string
	words int
}{
	{ClassShort, 100},
	{ClassMedium, 1000},
	{ClassLong, 4000},
}

var builtinOnce = sync.OnceValue(func() PromptSet {
	var set PromptSet
	for ci, l := range builtinLengths {
		for v := range builtinVariants {
			// A fixed seed per prompt: the built-in set is the same in every
			// run and every build, so runs compare.
			rng := rand.New(rand.NewPCG(uint64(ci), uint64(v)))
			var b strings.Builder
			b.WriteString("Document ")
			b.WriteString(strconv.Itoa(ci*builtinVariants + v + 1))
			b.WriteString(". Summarise the following notes in one short paragraph.\n\n")
			for i := range l.words {
				if i > 0 {
					b.WriteByte(' ')
				}
				b.WriteString(builtinWords[rng.IntN(len(builtinWords))])
			}
			msgs := []Message{{Role: "user", Content: b.String()}}
			set = append(set, Prompt{Class: ClassOf(EstimateTokens(msgs)), Messages: msgs})
		}
	}
	return set
})

// BuiltinPrompts returns the built-in prompt set: four prompts in each of
// the short, medium and long classes, of about 100, 1,000 and 4,000 tokens
// of text. The set is the same in every run.
func BuiltinPrompts() PromptSet {
	set := builtinOnce()
	out := make(PromptSet, len(set))
	for i, p := range set {
		out[i] = Prompt{Class: p.Class, Messages: slices.Clone(p.Messages)}
	}
	return out
}

// maxPromptLine bounds one JSONL line; a long-context prompt of a few hundred
// thousand tokens fits.
const maxPromptLine = 16 << 20

// promptLine is one JSONL line as written.
type promptLine struct {
	Messages json.RawMessage `json:"messages"`
	Prompt   *string         `json:"prompt"`
	Class    string          `json:"class"`
}

// wireMessage is a message as written, with content a string or an array of
// text parts (the OpenAI and Anthropic shapes agree on {"type":"text","text"}).
type wireMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type textPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// LoadPrompts reads a prompt set from JSONL: one JSON object per line, either
// {"messages":[{"role":…,"content":…},…]} or {"prompt":"…"} (a single user
// message), with an optional "class" ("short", "medium" or "long") that
// overrides the class estimated from the text. Content is a string or an
// array of text parts; other part types are rejected, as the benchmark sends
// text only. Blank lines are skipped and unknown fields ignored, so dataset
// files with extra fields load as they are. Errors name the line.
func LoadPrompts(r io.Reader) (PromptSet, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxPromptLine)
	var set PromptSet
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		p, err := parsePromptLine(b)
		if err != nil {
			return nil, fmt.Errorf("bench: prompts line %d: %w", line, err)
		}
		set = append(set, p)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("bench: prompts line %d: longer than %d bytes: %w", line+1, maxPromptLine, err)
		}
		return nil, fmt.Errorf("bench: reading prompts after line %d: %w", line, err)
	}
	if len(set) == 0 {
		return nil, errors.New("bench: prompts: no prompt in the file")
	}
	return set, nil
}

func parsePromptLine(b []byte) (Prompt, error) {
	var pl promptLine
	if err := json.Unmarshal(b, &pl); err != nil {
		return Prompt{}, fmt.Errorf("not a JSON object: %w", err)
	}
	hasMsgs := len(pl.Messages) > 0 && string(pl.Messages) != "null"
	var msgs []Message
	switch {
	case hasMsgs && pl.Prompt != nil:
		return Prompt{}, errors.New(`has both "messages" and "prompt"; want one`)
	case pl.Prompt != nil:
		if *pl.Prompt == "" {
			return Prompt{}, errors.New(`"prompt" is empty`)
		}
		msgs = []Message{{Role: "user", Content: *pl.Prompt}}
	case hasMsgs:
		var err error
		if msgs, err = parseMessages(pl.Messages); err != nil {
			return Prompt{}, err
		}
	default:
		return Prompt{}, errors.New(`want "messages" or "prompt"`)
	}
	class := ClassOf(EstimateTokens(msgs))
	switch pl.Class {
	case "":
	case ClassShort, ClassMedium, ClassLong:
		class = pl.Class
	default:
		return Prompt{}, fmt.Errorf("class %q: want short, medium or long", pl.Class)
	}
	return Prompt{Class: class, Messages: msgs}, nil
}

func parseMessages(raw json.RawMessage) ([]Message, error) {
	var wms []wireMessage
	if err := json.Unmarshal(raw, &wms); err != nil {
		return nil, fmt.Errorf(`"messages": want an array of {"role","content"}: %w`, err)
	}
	if len(wms) == 0 {
		return nil, errors.New(`"messages" is empty`)
	}
	msgs := make([]Message, 0, len(wms))
	users := 0
	for i, wm := range wms {
		switch wm.Role {
		case "user":
			users++
		case "system", "developer", "assistant":
		default:
			return nil, fmt.Errorf("message %d: role %q: want system, developer, user or assistant", i+1, wm.Role)
		}
		text, err := contentText(wm.Content)
		if err != nil {
			return nil, fmt.Errorf("message %d: %w", i+1, err)
		}
		msgs = append(msgs, Message{Role: wm.Role, Content: text})
	}
	if users == 0 {
		return nil, errors.New("no user message")
	}
	return msgs, nil
}

// contentText returns a message's text: the string, or its text parts joined
// with newlines.
func contentText(raw json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		if s == "" {
			return "", errors.New("content is empty")
		}
		return s, nil
	}
	var parts []textPart
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("content: want a string or an array of text parts")
	}
	var b strings.Builder
	for i, p := range parts {
		if p.Type != "text" {
			return "", fmt.Errorf("content part %d: type %q: only text parts are supported", i+1, p.Type)
		}
		if b.Len() > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(p.Text)
	}
	if b.Len() == 0 {
		return "", errors.New("content is empty")
	}
	return b.String(), nil
}
