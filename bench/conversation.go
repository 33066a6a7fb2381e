package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tollgate-llm/tollgate/llm"
)

// DefaultConversationHeader is the header a conversation's turns carry when
// Config.ConversationHeader is empty: the one a tollgate reads by default.
const DefaultConversationHeader = "X-Conversation-Id"

// Bounds on what a conversation carries from turn to turn: the first
// answerCap bytes of each answer, and the last historyTurns exchanges
// (answer and follow-up) after the prompt. The body grows like a chat's for a
// few turns and then stays small: it is the conversation, not its content,
// that a multi-turn run measures.
const (
	answerCap    = 1 << 10
	historyTurns = 4
)

// settleTurns validates the conversation fields of cfg and fills their
// defaults.
func settleTurns(cfg *Config) error {
	if cfg.Turns < 0 {
		return fmt.Errorf("bench: turns %d: want 1 or more (0 means 1)", cfg.Turns)
	}
	if cfg.Turns == 0 {
		cfg.Turns = 1
	}
	if cfg.Turns > 1 && cfg.Rate > 0 {
		return errors.New("bench: rate with turns above 1: a conversation's next turn follows its answer, not an arrival process; use concurrency")
	}
	if cfg.ConversationHeader == "" {
		cfg.ConversationHeader = DefaultConversationHeader
	}
	if !ValidHeaderName(cfg.ConversationHeader) {
		return fmt.Errorf("bench: conversation header %q: not a header name", cfg.ConversationHeader)
	}
	switch http.CanonicalHeaderKey(cfg.ConversationHeader) {
	case "Authorization", "X-Api-Key", "Anthropic-Version", "Content-Type", "Accept", "User-Agent":
		return fmt.Errorf("bench: conversation header %q: bench sends that header itself", cfg.ConversationHeader)
	}
	if cfg.Turns > 1 && cfg.RunID == "" {
		var b [8]byte
		_, _ = rand.Read(b[:]) // crypto/rand.Read does not fail
		cfg.RunID = "bench-" + hex.EncodeToString(b[:])
	}
	return nil
}

// ValidHeaderName reports whether s can name an HTTP header: a token (RFC
// 9110 §5.6.2).
func ValidHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// conversations runs a multi-turn run: Concurrency workers, each running
// conversations one after another, one turn at a time. Turn k+1 of a
// conversation is sent after turn k's answer has been read, and only if it
// succeeded: on the Chat Completions and Messages dialects it carries the
// conversation's header and the history so far, on the Responses dialect the
// previous answer's id as previous_response_id (and "store": true, which the
// chain needs), and no header. A conversation takes its turns from Requests
// when it starts, so only the last one is cut short by the bound when
// Requests is no multiple of Turns, and gives back those it did not send
// when it ends early; when the run stops, the conversations under way end
// where they are. It returns the number of requests sent, once they have
// all ended.
func (r *runner) conversations(ctx context.Context, bodies []promptBody, order []int,
	stopped func() bool, record func(int, Sample)) int {
	b := budget{sent: new(atomic.Int64), left: new(atomic.Int64), started: new(atomic.Int64)}
	b.left.Store(int64(r.cfg.Requests))
	var wg sync.WaitGroup
	for range r.cfg.Concurrency {
		wg.Go(func() {
			for !stopped() {
				k := b.take(r.cfg.Turns)
				if k == 0 {
					return
				}
				b.left.Add(int64(k - r.conversation(ctx, bodies, order, k, b, stopped, record)))
			}
		})
	}
	wg.Wait()
	return int(b.sent.Load())
}

// budget is a multi-turn run's share-out of Requests among the workers.
type budget struct {
	sent    *atomic.Int64 // requests sent: the next one's Index
	left    *atomic.Int64 // requests no conversation has taken
	started *atomic.Int64 // conversations started: the last one's number
}

// take takes up to turns requests for a conversation and returns how many
// it took: 0 when none is left.
func (b budget) take(turns int) int {
	for {
		left := b.left.Load()
		if left == 0 {
			return 0
		}
		k := min(int64(turns), left)
		if b.left.CompareAndSwap(left, left-k) {
			return int(k)
		}
	}
}

// conversation runs one conversation of at most planned turns and returns
// how many it sent.
func (r *runner) conversation(ctx context.Context, bodies []promptBody, order []int, planned int,
	b budget, stopped func() bool, record func(int, Sample)) int {
	var (
		n       int // the conversation's number, from 1; 0 before its first turn
		base    *promptBody
		history []Message
		prevID  string
		out     = turnOut{wantAnswer: r.cfg.Dialect != llm.DialectResponses}
	)
	for turn := 1; turn <= planned; turn++ {
		if stopped() {
			return turn - 1
		}
		if n == 0 {
			n = int(b.started.Add(1))
			base = &bodies[order[(n-1)%len(order)]]
		}
		idx := int(b.sent.Add(1) - 1)
		p, err := r.turnBody(base, n, turn, history, prevID)
		var s Sample
		if err != nil {
			// Unreachable: the prompt encoded before, and history is text.
			s = Sample{Index: idx, Class: base.class, Prompt: base.index, Err: ErrProtocol}
		} else {
			s = r.do(ctx, idx, &p, 0, &out)
		}
		s.Conversation, s.Turn = n, turn
		record(idx, s)
		if !s.OK() {
			return turn // a failed turn ends its conversation
		}
		if r.cfg.Dialect == llm.DialectResponses {
			if out.responseID == "" {
				return turn // no id to chain from: the conversation cannot go on
			}
			prevID = out.responseID
			continue
		}
		answer := string(out.answer)
		if strings.TrimSpace(answer) == "" {
			answer = "(no text)" // the Messages API refuses an empty turn
		}
		history = append(history,
			Message{Role: "assistant", Content: answer},
			Message{Role: "user", Content: followUp(turn + 1)})
		if len(history) > 2*historyTurns {
			history = history[len(history)-2*historyTurns:]
		}
	}
	return planned
}

// followUp is the user message of turn k > 1: short, as what matters is
// that it continues the conversation.
func followUp(turn int) string {
	return "Turn " + strconv.Itoa(turn) + ": go on, in one or two sentences."
}

// turnBody encodes turn of conversation n from its first prompt base. Turn 1
// is base's body as a single-turn run sends it, with the conversation's
// header (and "store": true on Responses); later turns add history (Chat
// Completions, Messages) or chain from prevID (Responses).
func (r *runner) turnBody(base *promptBody, n, turn int, history []Message, prevID string) (promptBody, error) {
	p := promptBody{index: base.index, class: base.class}
	cfg := &r.cfg
	if cfg.Dialect == llm.DialectResponses {
		store := true
		req := responsesRequest{Model: cfg.Model, MaxOutputTokens: cfg.MaxTokens, Stream: true, Store: &store}
		if turn == 1 {
			req.Input = cfg.Prompts[base.index].Messages
		} else {
			req.Input = []Message{{Role: "user", Content: followUp(turn)}}
			req.PreviousResponseID = prevID
		}
		var err error
		p.body, err = json.Marshal(req)
		return p, err
	}
	p.conversation = cfg.RunID + "-" + strconv.Itoa(n)
	if turn == 1 {
		p.body = base.body
		return p, nil
	}
	msgs := cfg.Prompts[base.index].Messages
	prompt := Prompt{Class: base.class, Messages: append(msgs[:len(msgs):len(msgs)], history...)}
	var err error
	p.body, err = requestBody(cfg.Dialect, cfg.Model, cfg.MaxTokens, &prompt)
	return p, err
}

// appendAnswer appends the text of a token-bearing event's data to answer,
// up to answerCap bytes: Chat Completions choices[0].delta.content, Messages
// delta.text. An event it cannot read adds nothing.
func appendAnswer(answer []byte, d llm.Dialect, data []byte) []byte {
	var text string
	if d == llm.DialectAnthropic {
		var ev struct {
			Delta struct {
				Text string `json:"text"`
			} `json:"delta"`
		}
		if json.Unmarshal(data, &ev) == nil {
			text = ev.Delta.Text
		}
	} else {
		var ev struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal(data, &ev) == nil && len(ev.Choices) > 0 {
			text = ev.Choices[0].Delta.Content
		}
	}
	if room := answerCap - len(answer); len(text) > room {
		text = text[:max(room, 0)]
	}
	return append(answer, text...)
}

// Conversations summarises the conversations of a multi-turn run, from its
// samples: a conversation is the samples that carry its number.
type Conversations struct {
	// Turns is the turns each conversation was to have.
	Turns int `json:"turns"`
	// Header is the header that carried the conversation's id; empty on
	// the Responses dialect, whose turns chain through
	// previous_response_id.
	Header string `json:"header,omitempty"`
	// RunID prefixes the conversation ids: "<run_id>-<n>", n from 1, so a
	// conversation can be looked up at the gateway. It is bench's own
	// random name, no user's.
	RunID string `json:"run_id,omitempty"`
	// Started counts the conversations whose first turn was sent;
	// Completed those whose every turn was sent and succeeded; Failed
	// those that a failed turn ended; Cut those that the run's end (the
	// request bound, an interruption, the stop after 401s) or a Responses
	// answer without an id cut short.
	Started   int `json:"started"`
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
	Cut       int `json:"cut"`
	// TurnsPerConversation is the mean of the turns sent per conversation
	// started.
	TurnsPerConversation float64 `json:"turns_per_conversation"`
	// FirstTurnTTFT and LaterTurnTTFT are the TTFT of the successful first
	// turns and of the successful later ones: what a gateway's
	// per-conversation work (or an engine's prefix cache) costs shows in
	// the difference.
	FirstTurnTTFT Stats `json:"first_turn_ttft_ms"`
	LaterTurnTTFT Stats `json:"later_turns_ttft_ms"`
}

// summarizeConversations returns the conversation summary of samples, or nil
// for a single-turn run.
func summarizeConversations(cfg Config, samples []Sample) *Conversations {
	if cfg.Turns <= 1 {
		return nil
	}
	c := &Conversations{Turns: cfg.Turns, RunID: cfg.RunID}
	if cfg.Dialect != llm.DialectResponses {
		c.Header = cfg.ConversationHeader
	}
	type conv struct {
		turns int
		last  *Sample // the highest turn sent
	}
	byNum := map[int]*conv{}
	var first, later []float64
	for i := range samples {
		s := &samples[i]
		if s.Conversation == 0 {
			continue
		}
		cv := byNum[s.Conversation]
		if cv == nil {
			cv = &conv{}
			byNum[s.Conversation] = cv
		}
		cv.turns++
		if cv.last == nil || s.Turn > cv.last.Turn {
			cv.last = s
		}
		if s.OK() {
			if s.Turn == 1 {
				first = append(first, ms(s.TTFT))
			} else {
				later = append(later, ms(s.TTFT))
			}
		}
	}
	turns := 0
	for _, cv := range byNum {
		turns += cv.turns
		switch {
		case cv.last.OK() && cv.turns == cfg.Turns:
			c.Completed++
		case cv.last.OK() || cv.last.Err == ErrCanceled:
			c.Cut++
		default:
			c.Failed++
		}
	}
	c.Started = len(byNum)
	if c.Started > 0 {
		c.TurnsPerConversation = float64(turns) / float64(c.Started)
	}
	c.FirstTurnTTFT, c.LaterTurnTTFT = stats(first), stats(later)
	return c
}

// writeTable writes the conversations' part of the table report.
func (c *Conversations) writeTable(b *strings.Builder) {
	how := "id in " + c.Header
	if c.Header == "" {
		how = "chained by previous_response_id"
	}
	fmt.Fprintf(b, "\nconversations of %d turns (%s)\n", c.Turns, how)
	fmt.Fprintf(b, "started %d, completed %d, failed %d, cut short %d; %.2f turns per conversation\n",
		c.Started, c.Completed, c.Failed, c.Cut, c.TurnsPerConversation)
	fmt.Fprintf(b, "%-12s %8s %8s %6s\n", "TTFT ms", "P50", "P99", "count")
	for _, row := range []struct {
		name string
		st   *Stats
	}{{"first turn", &c.FirstTurnTTFT}, {"later turns", &c.LaterTurnTTFT}} {
		fmt.Fprintf(b, "%-12s %8s %8s %6d\n", row.name,
			msCell(row.st, row.st.Median), msCell(row.st, row.st.P99), row.st.Count)
	}
}
