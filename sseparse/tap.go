package sseparse

import (
	"time"

	"github.com/tollgate-llm/tollgate/internal/jsonscan"
	"github.com/tollgate-llm/tollgate/llm"
)

// Tap accumulates the observations of one stream with their timestamps:
// first and last token-bearing instants, the gaps between token-bearing
// events (ITL), usage, the terminal marker and errors. The zero Tap decodes
// nothing until Reset gives it a dialect. A Tap is not safe for concurrent
// use.
type Tap struct {
	// ITL, when non-nil, receives each gap between consecutive token-bearing
	// events, in seconds, as it is observed. Reset clears it: set it after
	// Reset for each stream.
	ITL llm.Observer

	dialect     llm.Dialect
	obs         Observation
	first, last time.Time
	tokenEvents int
	tokens      int // sum of Observation.Tokens
	itlCount    int
	itlSum      time.Duration
	itlMax      time.Duration
	usage       usageReport
	terminal    bool
	errSeen     bool
	errType     []byte // decoded type of the first typed error event
	incomplete  []byte // decoded reason of a response.incomplete
	seq         int64  // the last sequence_number seen, -1 before one
	respID      []byte // decoded id of the response response.created named
}

// Reset prepares the tap for a new stream in dialect d, keeping its buffers.
// It sets ITL to nil.
func (t *Tap) Reset(d llm.Dialect) {
	*t = Tap{dialect: d, errType: t.errType[:0], incomplete: t.incomplete[:0], respID: t.respID[:0], seq: -1}
}

// Observe decodes ev and records it at instant now, which should come from
// time.Now (monotonic) when the event was read. It returns the tap's own
// observation of ev, valid until the next Observe. A nil ev (a boundary that
// dispatched nothing) records nothing.
func (t *Tap) Observe(ev *Event, now time.Time) *Observation {
	o := &t.obs
	switch t.dialect {
	case llm.DialectOpenAI:
		DecodeOpenAI(ev, o)
	case llm.DialectAnthropic:
		DecodeAnthropic(ev, o)
	case llm.DialectResponses:
		DecodeResponses(ev, o)
	default:
		*o = Observation{}
	}
	if o.TokenBearing {
		if t.tokenEvents == 0 {
			t.first = now
		} else {
			gap := now.Sub(t.last)
			t.itlCount++
			t.itlSum += gap
			t.itlMax = max(t.itlMax, gap)
			if t.ITL != nil {
				t.ITL.Observe(gap.Seconds())
			}
		}
		t.last = now
		t.tokenEvents++
		t.tokens += o.Tokens
	}
	if o.usage.has&hasObject != 0 {
		if t.dialect != llm.DialectAnthropic {
			t.usage = o.usage // the last usage object wins whole
		} else {
			t.usage.mergeFields(&o.usage)
		}
	}
	if o.Terminal {
		t.terminal = true
	}
	if o.HasSequence {
		t.seq = o.Sequence
	}
	if len(o.ResponseID) > 0 && len(t.respID) == 0 {
		t.respID = jsonscan.AppendUnescape(t.respID[:0], o.ResponseID)
	}
	if o.Incomplete {
		t.incomplete = jsonscan.AppendUnescape(t.incomplete[:0], o.IncompleteReason)
	}
	if o.Error {
		t.errSeen = true
		// The first typed error names the failure; later ones are echoes.
		if len(t.errType) == 0 {
			t.errType = jsonscan.AppendUnescape(t.errType[:0], o.ErrorType)
		}
	}
	return o
}

// FirstToken returns the instant of the first token-bearing event, or the zero
// time if none was seen.
func (t *Tap) FirstToken() time.Time { return t.first }

// LastToken returns the instant of the last token-bearing event, or the zero
// time if none was seen.
func (t *Tap) LastToken() time.Time { return t.last }

// TokenEvents returns the number of token-bearing events seen.
func (t *Tap) TokenEvents() int { return t.tokenEvents }

// Usage returns the usage the upstream reported so far, normalised (Input
// includes cache reads and writes in both dialects). ok is false when no
// input or output count was reported.
func (t *Tap) Usage() (u llm.Usage, ok bool) {
	u = t.usage.normalize(t.dialect)
	return u, u.HasInput || u.HasOutput
}

// TerminalSeen reports whether the stream's end marker ([DONE] or
// message_stop) was seen.
func (t *Tap) TerminalSeen() bool { return t.terminal }

// ErrorSeen reports whether an error event was seen.
func (t *Tap) ErrorSeen() bool { return t.errSeen }

// Sequence returns the last sequence_number of a Responses stream, -1
// before any.
func (t *Tap) Sequence() int64 { return t.seq }

// ResponseID returns the id of the response a Responses stream's
// response.created named, decoded; empty before it. It is the tap's buffer,
// valid until the next Reset.
func (t *Tap) ResponseID() []byte { return t.respID }

// Summary is what a tap read of one stream, as a value that outlives the
// tap (Reset reuses its buffers): the token instants and counts, the gaps,
// the usage, the terminal marker, an incomplete answer's reason and the
// error event. Fill writes it on a record.
type Summary struct {
	FirstToken, LastToken time.Time
	TokenEvents           int
	ITLCount              int
	ITLSum, ITLMax        time.Duration
	// Usage is the reported usage; when no output count was reported,
	// Output is the number of token-bearing deltas and Estimated is true
	// (Usage.HasOutput stays false).
	Usage            llm.Usage
	Estimated        bool
	TerminalSeen     bool
	IncompleteReason string
	// ErrorSeen: an error event was seen; ErrorType is its type, when it
	// named one.
	ErrorSeen bool
	ErrorType string
}

// Summary returns the stream's results so far. It allocates only for an
// incomplete answer's reason and an error event's type.
func (t *Tap) Summary() Summary {
	s := Summary{FirstToken: t.first, LastToken: t.last, TokenEvents: t.tokenEvents,
		ITLCount: t.itlCount, ITLSum: t.itlSum, ITLMax: t.itlMax, TerminalSeen: t.terminal, ErrorSeen: t.errSeen}
	s.Usage, _ = t.Usage()
	if s.Estimated = !s.Usage.HasOutput; s.Estimated {
		s.Usage.Output = int64(t.tokens)
	}
	if len(t.incomplete) > 0 {
		s.IncompleteReason = string(t.incomplete)
	}
	if t.errSeen && len(t.errType) > 0 {
		s.ErrorType = string(t.errType)
	}
	return s
}

// Fill copies the stream's results into r: Timing.FirstToken and
// Timing.LastToken, TokenEvents, ITLCount, ITLSum, ITLMax, Usage, Estimated,
// TerminalSeen, and, when an error event was seen, Interruption
// (InterruptUpstreamErrorEvent) and ErrorType (when the event named one).
// Other fields are left alone.
//
// When the upstream reported no output count, Usage.Output is the number of
// token-bearing deltas and Estimated is true; Usage.HasOutput stays false
// (not reported) and a reported Input is kept.
func (t *Tap) Fill(r *llm.Record) {
	s := t.Summary()
	s.Fill(r)
}

// Fill writes the summary on r, as Tap.Fill does.
func (s *Summary) Fill(r *llm.Record) {
	r.Timing.FirstToken = s.FirstToken
	r.Timing.LastToken = s.LastToken
	r.TokenEvents = s.TokenEvents
	r.ITLCount = s.ITLCount
	r.ITLSum = s.ITLSum
	r.ITLMax = s.ITLMax
	r.Estimated = s.Estimated
	r.Usage = s.Usage
	r.TerminalSeen = s.TerminalSeen
	if s.IncompleteReason != "" {
		r.IncompleteReason = s.IncompleteReason
	}
	if s.ErrorSeen {
		r.Interruption = llm.InterruptUpstreamErrorEvent
		if s.ErrorType != "" {
			r.ErrorType = s.ErrorType
		}
	}
}
