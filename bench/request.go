package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"mime"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/tollgate-llm/tollgate/internal/retryhint"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/sseparse"
)

// anthropicVersion is the anthropic-version header every Anthropic SDK sends.
const anthropicVersion = "2023-06-01"

// maxRetries is how many times a 429 or 5xx answer is retried.
const maxRetries = 3

// Backoff without a server hint follows the official OpenAI SDKs:
// min(0.5 s · 2^n, 8 s), less up to 25 % jitter.
const (
	backoffBase = 500 * time.Millisecond
	backoffMax  = 8 * time.Second
)

// errBodyCap bounds what is read of an error answer: enough for its type,
// and reading it lets the connection be reused.
const errBodyCap = 64 << 10

// errAttemptTimeout is the cause of an attempt's context when Config.Timeout
// ran out, which tells a timeout from the run being cancelled.
var errAttemptTimeout = errors.New("bench: request timeout")

// openAIRequest is the Chat Completions body. It asks for streamed usage so
// that TPOT divides by the server's token count (OpenAI streams usage only
// when stream_options.include_usage is set), and sets
// max_completion_tokens as vLLM's benchmark client does.
type openAIRequest struct {
	Model               string        `json:"model"`
	Messages            []Message     `json:"messages"`
	MaxCompletionTokens int           `json:"max_completion_tokens"`
	Stream              bool          `json:"stream"`
	StreamOptions       streamOptions `json:"stream_options"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// anthropicRequest is the Messages body; system prompts go in System.
type anthropicRequest struct {
	Model     string    `json:"model"`
	System    string    `json:"system,omitempty"`
	Messages  []Message `json:"messages"`
	MaxTokens int       `json:"max_tokens"`
	Stream    bool      `json:"stream"`
}

// responsesRequest is the Responses API body: the messages as input items,
// system and developer ones included (the API takes those roles in input).
type responsesRequest struct {
	Model           string    `json:"model"`
	Input           []Message `json:"input"`
	MaxOutputTokens int       `json:"max_output_tokens"`
	Stream          bool      `json:"stream"`
	// Store and PreviousResponseID are set on the turns of a conversation
	// only, so a single-turn body is what it always was.
	Store              *bool  `json:"store,omitempty"`
	PreviousResponseID string `json:"previous_response_id,omitempty"`
}

// requestBody encodes p as a streamed request in dialect d.
func requestBody(d llm.Dialect, model string, maxTokens int, p *Prompt) ([]byte, error) {
	if d == llm.DialectResponses {
		return json.Marshal(responsesRequest{Model: model, Input: p.Messages, MaxOutputTokens: maxTokens, Stream: true})
	}
	if d == llm.DialectAnthropic {
		req := anthropicRequest{Model: model, MaxTokens: maxTokens, Stream: true}
		var system []string
		for _, m := range p.Messages {
			if m.Role == "system" || m.Role == "developer" {
				system = append(system, m.Content)
				continue
			}
			req.Messages = append(req.Messages, m)
		}
		req.System = strings.Join(system, "\n\n")
		return json.Marshal(req)
	}
	return json.Marshal(openAIRequest{
		Model:               model,
		Messages:            p.Messages,
		MaxCompletionTokens: maxTokens,
		Stream:              true,
		StreamOptions:       streamOptions{IncludeUsage: true},
	})
}

// stampReader records when it last returned bytes: the instant an SSE event
// was completed is the instant of the read that brought its last byte, since
// sseparse.Reader reads only when no complete event is buffered.
type stampReader struct {
	r    io.Reader
	last time.Time
}

func (s *stampReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if n > 0 {
		s.last = time.Now()
	}
	return n, err
}

// turnOut is what a conversation's next turn needs from this one's answer:
// the response id (Responses) and the start of the answer's text
// (Chat Completions and Messages, when answer is wanted).
type turnOut struct {
	wantAnswer bool
	responseID string
	answer     []byte
}

// do sends request idx with prompt p, retrying 429 and 5xx answers, and
// returns its sample. The figures time the last attempt (see Sample). A
// non-nil out receives what the last attempt's stream said of the answer.
func (r *runner) do(ctx context.Context, idx int, p *promptBody, queueWait time.Duration, out *turnOut) Sample {
	var retried429, retried5xx int
	var waited time.Duration
	for attempts := 1; ; attempts++ {
		s := Sample{Index: idx, Class: p.class, Prompt: p.index, QueueWait: queueWait}
		retry, wait := r.attempt(ctx, p, &s, attempts, out)
		if retry {
			if s.Status == http.StatusTooManyRequests {
				retried429++
			} else {
				retried5xx++
			}
		}
		s.Attempts, s.Retried429, s.Retried5xx, s.RetryWait = attempts, retried429, retried5xx, waited
		if !retry {
			return s
		}
		waited += wait
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			s.Err, s.RetryWait = ErrCanceled, waited
			return s
		}
	}
}

// attempt sends the attempt-th attempt of a request and fills s with what
// it learned. It reports whether to retry, and after how long.
func (r *runner) attempt(ctx context.Context, p *promptBody, s *Sample, attempt int, out *turnOut) (retry bool, wait time.Duration) {
	actx, cancel := context.WithTimeoutCause(ctx, r.cfg.Timeout, errAttemptTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(actx, http.MethodPost, r.url, bytes.NewReader(p.body))
	if err != nil {
		s.Err = ErrConnect // the URL was validated; this is unreachable in practice
		return false, 0
	}
	r.setHeaders(req.Header)
	if p.conversation != "" {
		req.Header.Set(r.cfg.ConversationHeader, p.conversation)
	}

	start := time.Now()
	s.Start = start.Sub(r.start)
	resp, err := r.client.Do(req)
	if err != nil {
		s.Err = r.transportError(actx, ctx, err)
		s.E2E = time.Since(start)
		return false, 0
	}
	defer resp.Body.Close()
	s.Status = resp.StatusCode

	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, errBodyCap))
		s.E2E = time.Since(start)
		s.ErrorType = sseparse.ErrorTypeFromBody(body)
		rateLimited := resp.StatusCode == http.StatusTooManyRequests
		switch {
		case rateLimited:
			s.Err = ErrRateLimited
		case resp.StatusCode == http.StatusUnauthorized:
			s.Err = ErrUnauthorized
		default:
			s.Err = ErrStatus
		}
		if !rateLimited && resp.StatusCode < 500 || attempt > maxRetries {
			return false, 0
		}
		if retry, said := retryhint.ShouldRetry(resp.Header); said && !retry {
			// The server says a retry cannot help (a spent budget:
			// insufficient_quota), and the official SDKs obey it.
			return false, 0
		}
		wait := retryWait(resp.Header, time.Now(), attempt-1)
		if wait > r.cfg.Timeout {
			// A hint longer than a whole attempt is the server saying "not
			// soon": report the answer rather than stall the run.
			return false, 0
		}
		return true, wait
	}

	if ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); ct != "text/event-stream" {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, errBodyCap))
		s.E2E = time.Since(start)
		s.Err = ErrProtocol
		return false, 0
	}
	r.readStream(actx, ctx, resp.Body, start, s, out)
	return false, 0
}

// readStream reads a 200 event stream and fills s with its figures, or with
// the way it failed.
func (r *runner) readStream(actx, ctx context.Context, body io.Reader, start time.Time, s *Sample, out *turnOut) {
	sr := &stampReader{r: body, last: time.Now()}
	rd := sseparse.NewReader(sr, 0)
	var tap sseparse.Tap
	tap.Reset(r.cfg.Dialect)
	var tokenTimes []time.Time
	var rerr error
	if out != nil {
		out.answer, out.responseID = out.answer[:0], ""
	}
	for {
		ev, err := rd.Next()
		if err != nil {
			if err != io.EOF {
				rerr = err
			}
			break
		}
		if tap.Observe(ev, sr.last).TokenBearing {
			tokenTimes = append(tokenTimes, sr.last)
			if out != nil && out.wantAnswer && len(out.answer) < answerCap {
				out.answer = appendAnswer(out.answer, r.cfg.Dialect, ev.Data)
			}
		}
	}
	if out != nil {
		out.responseID = string(tap.ResponseID())
	}

	rec := llm.Record{Dialect: r.cfg.Dialect, Stream: true, Status: http.StatusOK}
	rec.Timing.In = start
	rec.Timing.End = sr.last
	tap.Fill(&rec)
	rec.Timing.FirstTokenOut = rec.Timing.FirstToken
	s.E2E = rec.E2E()
	s.TokenEvents = rec.TokenEvents
	s.OutputTokens = rec.Usage.Output
	s.Estimated = rec.Estimated
	if rec.Usage.HasInput {
		s.InputTokens = rec.Usage.Input
	}
	s.ErrorType = rec.ErrorType

	switch {
	case rerr != nil && errors.Is(rerr, sseparse.ErrEventTooLarge):
		s.Err = ErrProtocol
	case rerr != nil:
		s.Err = r.transportError(actx, ctx, rerr)
		if s.Err == ErrConnect {
			s.Err = ErrTruncated // the body broke after the answer began
		}
	case tap.ErrorSeen():
		s.Err = ErrStreamError
	case !tap.TerminalSeen():
		s.Err = ErrTruncated
	case rec.TokenEvents == 0:
		s.Err = ErrNoTokens
	}
	if s.Err != "" {
		return
	}

	s.TTFT = rec.TTFT()
	if tpot, ok := rec.TPOT(); ok {
		s.TPOT, s.HasTPOT = tpot, true
	}
	if len(tokenTimes) > 1 {
		s.ITL = make([]time.Duration, len(tokenTimes)-1)
		for i := range s.ITL {
			s.ITL[i] = tokenTimes[i+1].Sub(tokenTimes[i])
		}
	}
}

// transportError classifies an error from the round trip or the body read:
// the attempt's own timeout, the run being cancelled, a network timeout, or
// a connection failure.
func (r *runner) transportError(actx, ctx context.Context, err error) ErrorKind {
	if errors.Is(context.Cause(actx), errAttemptTimeout) {
		return ErrTimeout
	}
	if ctx.Err() != nil {
		return ErrCanceled
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return ErrTimeout
	}
	return ErrConnect
}

func (r *runner) setHeaders(h http.Header) {
	h.Set("Content-Type", "application/json")
	h.Set("Accept", "text/event-stream")
	h.Set("User-Agent", "tollgate-bench")
	if r.cfg.Dialect == llm.DialectAnthropic {
		h.Set("anthropic-version", anthropicVersion)
		if r.cfg.APIKey != "" {
			h.Set("x-api-key", r.cfg.APIKey)
		}
		return
	}
	if r.cfg.APIKey != "" {
		h.Set("Authorization", "Bearer "+r.cfg.APIKey)
	}
}

// retryWait returns how long to wait before the retry that follows retry
// earlier ones: the server's hint when it gave one (retry-after-ms, then
// Retry-After in seconds or as a date, the order the official SDKs read
// them), else the SDKs' backoff. A hint that does not parse is ignored.
func retryWait(h http.Header, now time.Time, retry int) time.Duration {
	if d, ok := retryhint.Parse(h, now); ok {
		return d
	}
	c := min(backoffBase<<min(retry, 5), backoffMax)
	return time.Duration(float64(c) * (1 - 0.25*rand.Float64()))
}
