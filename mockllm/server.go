package mockllm

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-llm/tollgate/llm"
)

// Options configures a Server. The zero value is a usable mock that answers at
// once with 16 tokens, one per event.
type Options struct {
	// TTFT is the delay from t0 (see the package doc) to the first
	// token-bearing event. Zero means no delay; negative is taken as zero.
	TTFT time.Duration
	// ITL is the delay between consecutive token-bearing events.
	ITL time.Duration
	// Jitter gives each deadline a uniform random offset in
	// [-Jitter/2, +Jitter/2], from a PRNG seeded by Seed.
	Jitter time.Duration
	// Seed seeds the jitter; a given Seed and request order repeat the same
	// offsets.
	Seed int64
	// OutputTokens is the number of answer tokens; zero means 16.
	OutputTokens int
	// TokensPerChunk is the number of tokens per token event; zero means 1.
	// The last event of a run may carry fewer.
	TokensPerChunk int
	// MaxConcurrent bounds the requests generating at once; zero means
	// unlimited. Requests beyond it wait for a slot (a queue, as an engine
	// would), which gives a load test a knee.
	MaxConcurrent int
	// RequireKey, when set, is the only API key accepted, as a Bearer token
	// or x-api-key; other requests get a 401 in their dialect.
	RequireKey string
	// Logger receives one Debug record per request; nil discards.
	Logger *slog.Logger
}

// Stats is a snapshot of what the server has seen.
type Stats struct {
	// Requests counts every request received.
	Requests int64
	// Completed counts requests whose handler ran to its end with the client
	// still there: successes, error statuses, error events.
	Completed int64
	// Canceled counts requests whose client went away before the mock was
	// done (seen through the request context or a failed write), including
	// while queued or stalled.
	Canceled int64
	// Faults counts generation requests that took a fault, from their
	// X-Mock-Fault header or from Inject.
	Faults int64
	// Injected counts generation requests that took an injected fault (see
	// Inject) in place of their X-Mock-Fault header, an empty spec included.
	Injected int64
	// Aborted counts connections the mock broke on purpose (disconnect=).
	Aborted int64
	// BadRequests counts requests rejected with a 4xx before generation
	// (bad JSON, bad headers, wrong key, unknown route, wrong method, an
	// unknown stored response or conversation).
	BadRequests int64
	// InFlight is the number of requests holding a slot right now.
	InFlight int64
	// Waiting is the number of requests queued for a slot right now.
	Waiting int64
	// Queued counts requests that had to wait for a slot.
	Queued int64
	// PeakInFlight is the highest InFlight seen.
	PeakInFlight int64
}

// Recorded is one request as the mock received it.
type Recorded struct {
	At     time.Time
	Method string
	Path   string
	Query  string
	Header http.Header
	Body   []byte
}

// recordCap bounds the requests kept for Requests.
const recordCap = 256

// maxBody bounds a request body, like the real Messages API's 32 MB limit.
const maxBody = 32 << 20

// Server is the fake upstream; it implements http.Handler.
type Server struct {
	opts  Options
	log   *slog.Logger
	slots chan struct{} // nil when unlimited
	seq   atomic.Uint64

	mu      sync.Mutex
	stats   Stats
	changed chan struct{} // closed and replaced on every change of stats
	rec     []Recorded    // ring of at most recordCap
	recNext int
	inj     []injection // queued by Inject, oldest first

	// state holds the stored responses and conversations, under its own
	// lock.
	state state
}

// injection is one Inject call not yet used up.
type injection struct {
	f    fault
	left int
}

// New returns a Server for opts. Negative durations and counts are taken as
// their zero value.
func New(opts Options) *Server {
	opts.TTFT = max(opts.TTFT, 0)
	opts.ITL = max(opts.ITL, 0)
	opts.Jitter = max(opts.Jitter, 0)
	if opts.OutputTokens <= 0 {
		opts.OutputTokens = 16
	}
	if opts.TokensPerChunk <= 0 {
		opts.TokensPerChunk = 1
	}
	s := &Server{opts: opts, log: opts.Logger, changed: make(chan struct{}), state: newState()}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if opts.MaxConcurrent > 0 {
		s.slots = make(chan struct{}, opts.MaxConcurrent)
	}
	return s
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// WaitStats blocks until cond holds for the counters or ctx ends, and returns
// the snapshot that satisfied it. cond runs under the server's lock and must
// not call back into the Server.
func (s *Server) WaitStats(ctx context.Context, cond func(Stats) bool) (Stats, error) {
	for {
		s.mu.Lock()
		st, ch := s.stats, s.changed
		ok := cond(st)
		s.mu.Unlock()
		if ok {
			return st, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return st, ctx.Err()
		}
	}
}

// WaitCanceled blocks until the mock has counted at least n canceled
// requests, or ctx ends.
func (s *Server) WaitCanceled(ctx context.Context, n int64) error {
	_, err := s.WaitStats(ctx, func(st Stats) bool { return st.Canceled >= n })
	return err
}

// Requests returns the last requests received (at most 256), oldest first.
// The slices are the server's; callers must not modify them.
func (s *Server) Requests() []Recorded {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Recorded, 0, len(s.rec))
	if len(s.rec) == recordCap {
		out = append(out, s.rec[s.recNext:]...)
		return append(out, s.rec[:s.recNext]...)
	}
	return append(out, s.rec...)
}

// Inject makes the next n generation requests (POST /v1/chat/completions
// and /v1/messages) take the fault spec, in the syntax of X-Mock-Fault, in
// place of their own X-Mock-Fault header. Calls queue up: the requests after
// the first call's n take the second call's spec, and so on. An empty spec
// makes its requests answer without a fault. A request takes its fault once
// it has passed validation, so a rejected request (bad JSON, bad headers,
// wrong key) does not use one up. Inject returns an error, and queues
// nothing, when spec does not parse or n is not positive.
func (s *Server) Inject(spec string, n int) error {
	if n <= 0 {
		return fmt.Errorf("mockllm: inject %q: count %d: want a positive count", spec, n)
	}
	f, err := parseFault(spec, "inject")
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.inj = append(s.inj, injection{f: f, left: n})
	s.mu.Unlock()
	return nil
}

// ClearInjected drops every injected fault not yet taken.
func (s *Server) ClearInjected() {
	s.mu.Lock()
	s.inj = nil
	s.mu.Unlock()
}

// takeInjected takes the next injected fault, if any, and counts it.
func (s *Server) takeInjected() (fault, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.inj) == 0 {
		return fault{}, false
	}
	f := s.inj[0].f
	if s.inj[0].left--; s.inj[0].left == 0 {
		s.inj[0] = injection{}
		s.inj = s.inj[1:]
	}
	s.stats.Injected++
	s.notifyLocked()
	return f, true
}

// update applies f to the counters and wakes WaitStats callers.
func (s *Server) update(f func(*Stats)) {
	s.mu.Lock()
	f(&s.stats)
	s.notifyLocked()
	s.mu.Unlock()
}

// notifyLocked wakes WaitStats callers; s.mu must be held.
func (s *Server) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *Server) record(r *http.Request, body []byte, at time.Time) {
	rec := Recorded{At: at, Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery,
		Header: r.Header.Clone(), Body: body}
	s.mu.Lock()
	if len(s.rec) < recordCap {
		s.rec = append(s.rec, rec)
	} else {
		s.rec[s.recNext] = rec
		s.recNext = (s.recNext + 1) % recordCap
	}
	s.mu.Unlock()
}

// outcome is how one exchange ended, for the counters.
type outcome uint8

const (
	outcomeCompleted outcome = iota
	outcomeCanceled
	outcomeAborted
	outcomeBadRequest
)

// ServeHTTP routes a request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v1/responses" && isSocketUpgrade(r) {
		// Not a request itself: each turn on it is one (socket.go).
		if !s.keyOK(r) {
			s.reject(w, llm.DialectResponses, "req_mock"+pad(s.seq.Add(1)), http.StatusUnauthorized, "")
			return
		}
		s.serveSocket(w, r)
		return
	}
	arrival := time.Now()
	s.update(func(st *Stats) { st.Requests++ })
	// Until a handler decides otherwise, a panic (the disconnect fault)
	// is an abort.
	oc := outcomeAborted
	defer func() { s.finish(oc) }()

	route := llm.RouteOther
	switch r.URL.Path {
	case "/v1/chat/completions":
		route = llm.RouteChatCompletions
	case "/v1/messages":
		route = llm.RouteMessages
	case "/v1/responses":
		route = llm.RouteResponses
	}
	dialect := llm.DialectOpenAI
	switch {
	case strings.HasPrefix(r.URL.Path, "/v1/messages"):
		dialect = llm.DialectAnthropic
	case r.URL.Path == "/v1/responses":
		dialect = llm.DialectResponses
	}
	seq := s.seq.Add(1)
	reqID := "req_mock" + pad(seq)

	var body []byte
	if r.Body != nil {
		var err error
		body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				oc = s.reject(w, dialect, reqID, http.StatusRequestEntityTooLarge, "request body too large")
			} else {
				oc = outcomeCanceled
			}
			return
		}
	}
	s.record(r, body, arrival)

	if !s.keyOK(r) {
		oc = s.reject(w, dialect, reqID, http.StatusUnauthorized, "")
		return
	}
	if stored, ok := s.serveStored(w, r, reqID, seq, arrival, body); ok {
		oc = stored
		return
	}

	method := http.MethodPost
	switch r.URL.Path {
	case "/v1/models":
		method = http.MethodGet
	case "/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/messages/count_tokens",
		"/v1/responses/input_tokens", "/v1/embeddings":
	default:
		// OpenAI's answer to an unknown route; its code is null, unlike a
		// 404 for an unknown model.
		writeError(w, llm.DialectOpenAI, reqID, apiError{status: http.StatusNotFound,
			typ: "invalid_request_error", msg: "Invalid URL (" + r.Method + " " + r.URL.Path + ")"})
		oc = outcomeBadRequest
		return
	}
	if r.Method != method {
		w.Header().Set("Allow", method)
		oc = s.reject(w, dialect, reqID, http.StatusMethodNotAllowed,
			"Method "+r.Method+" not allowed for "+r.URL.Path)
		return
	}

	switch r.URL.Path {
	case "/v1/models":
		oc = s.serveModels(w, reqID)
		return
	case "/v1/embeddings":
		oc = s.serveEmbeddings(w, reqID, body)
		return
	case "/v1/messages/count_tokens":
		oc = s.serveCountTokens(w, reqID, body)
		return
	case "/v1/responses/input_tokens":
		oc = s.serveInputTokens(w, reqID, body)
		return
	}

	x := &exchange{srv: s, w: w, rc: http.NewResponseController(w), ctx: r.Context(),
		dialect: dialect, route: route, reqID: reqID, seq: seq, arrival: arrival}
	oc = x.serve(r, body)
}

// finish counts how an exchange ended.
func (s *Server) finish(oc outcome) {
	s.update(func(st *Stats) {
		switch oc {
		case outcomeCompleted:
			st.Completed++
		case outcomeCanceled:
			st.Canceled++
		case outcomeAborted:
			st.Aborted++
		case outcomeBadRequest:
			st.BadRequests++
		}
	})
}

// keyOK reports whether the request presents the required key, if any.
func (s *Server) keyOK(r *http.Request) bool {
	if s.opts.RequireKey == "" {
		return true
	}
	key := r.Header.Get("x-api-key")
	if key == "" {
		if a := r.Header.Get("Authorization"); len(a) > 7 && strings.EqualFold(a[:7], "bearer ") {
			key = a[7:]
		}
	}
	return subtle.ConstantTimeCompare([]byte(key), []byte(s.opts.RequireKey)) == 1
}

// acquire takes a generation slot, waiting in the queue if MaxConcurrent is
// reached. It reports false when ctx ended first.
func (s *Server) acquire(ctx context.Context) bool {
	if s.slots != nil {
		select {
		case s.slots <- struct{}{}:
		default:
			s.update(func(st *Stats) { st.Waiting++; st.Queued++ })
			select {
			case s.slots <- struct{}{}:
				s.update(func(st *Stats) { st.Waiting-- })
			case <-ctx.Done():
				s.update(func(st *Stats) { st.Waiting-- })
				return false
			}
		}
	}
	s.update(func(st *Stats) {
		st.InFlight++
		st.PeakInFlight = max(st.PeakInFlight, st.InFlight)
	})
	return true
}

func (s *Server) release() {
	s.update(func(st *Stats) { st.InFlight-- })
	if s.slots != nil {
		<-s.slots
	}
}

// pad renders a sequence number as 8 digits, for ids.
func pad(n uint64) string {
	var b [20]byte
	i := len(b)
	for n > 0 || i > len(b)-8 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return string(b[i:])
}
