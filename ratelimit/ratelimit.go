// Package ratelimit owns admission and settlement: requests per minute,
// tokens per minute, concurrent requests, and token and cost budgets per day
// and month, for gateway keys and teams. Two backends share one interface and
// one arithmetic: Local, in the process, and Redis, shared by every replica.
//
// Rates (RPM, TPM) are token buckets with x/time/rate's semantics: the burst
// is the per-minute limit and the bucket refills limit/60 per second. They are
// computed as GCRA (a theoretical arrival time per bucket), which is the same
// bucket written so that one number is the whole state. Admission reserves an
// estimate; Settle corrects it to the real usage, refunding what was not used
// or charging the excess, which may leave a bucket in debt so that later
// requests wait for it.
//
// Budgets (tokens per day, cost per day and per month) are counters over UTC
// calendar windows. A window holds the settled usage and the reservations of
// the requests still in flight, counted apart. A budget admits while the two
// together are below the limit, reserving the estimate clamped to what is
// left, so that a request is never refused for its max_tokens alone. A budget
// with nothing left refuses in one of two ways: spent (the settled usage is at
// or above the limit), until the window ends, which is final; or held (the
// reservations make up the rest), which passes again as those requests settle
// and give back what they did not use, so its RetryAfter is short (see
// heldRetry). Settle charges the real usage, so a window can end above its
// limit by what the requests open when it ran out used beyond their clamped
// reservations.
package ratelimit

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// Scope says whom a limit belongs to.
type Scope uint8

const (
	ScopeKey Scope = iota
	ScopeTeam
)

// String returns the scope's label value.
func (s Scope) String() string {
	if s == ScopeTeam {
		return "team"
	}
	return "key"
}

// Kind names a limit.
type Kind uint8

const (
	KindRPM Kind = iota
	KindTPM
	KindConcurrency
	KindTokensPerDay
	KindCostPerDay
	KindCostPerMonth
)

// String returns the kind's label value.
func (k Kind) String() string {
	switch k {
	case KindRPM:
		return "rpm"
	case KindTPM:
		return "tpm"
	case KindConcurrency:
		return "concurrency"
	case KindTokensPerDay:
		return "tokens_per_day"
	case KindCostPerDay:
		return "cost_per_day"
	case KindCostPerMonth:
		return "cost_per_month"
	}
	return "unknown"
}

// Budget reports whether k is a budget over a calendar window rather than a
// rate or a concurrency cap.
func (k Kind) Budget() bool { return k >= KindTokensPerDay }

// Limits are one subject's limits. Zero means unlimited.
type Limits struct {
	RPM                int64 // requests per minute
	TPM                int64 // tokens per minute (input + output)
	Concurrency        int64 // requests open at once
	TokensPerDay       int64 // tokens per UTC day
	CostPerDayMicros   int64 // micro-dollars per UTC day
	CostPerMonthMicros int64 // micro-dollars per UTC month
}

// HasBudget reports whether any budget (tokens per day, cost per day or
// month) is set.
func (l Limits) HasBudget() bool {
	return l.TokensPerDay > 0 || l.CostPerDayMicros > 0 || l.CostPerMonthMicros > 0
}

// Get returns the limit of kind k.
func (l Limits) Get(k Kind) int64 {
	switch k {
	case KindRPM:
		return l.RPM
	case KindTPM:
		return l.TPM
	case KindConcurrency:
		return l.Concurrency
	case KindTokensPerDay:
		return l.TokensPerDay
	case KindCostPerDay:
		return l.CostPerDayMicros
	case KindCostPerMonth:
		return l.CostPerMonthMicros
	}
	return 0
}

// Subject is a key or a team with its limits. ID is a key id (a hash) or a
// team name, never a raw key.
type Subject struct {
	Scope  Scope
	ID     string
	Limits Limits
}

// Request asks to admit one LLM request.
type Request struct {
	// Subjects are checked together: the request is admitted only if every
	// limit of every subject admits it.
	Subjects []Subject
	// Tokens is the estimate reserved against TPM and tokens per day (prompt
	// estimate plus max_tokens, or a configured default), clamped to the TPM
	// limit and to what is left of the day's tokens.
	Tokens int64
	// CostMicros is the estimate reserved against cost budgets, clamped to
	// what is left of each.
	CostMicros int64
}

// State is one limit's state, for rate-limit headers and /admin/limits.
type State struct {
	Scope Scope
	ID    string
	Kind  Kind
	Limit int64
	// Used is the settled usage of a budget's window, the open requests
	// (concurrency) or the bucket's consumed share (rates).
	Used int64
	// Reserved is what the requests in flight hold of a budget's window
	// beyond Used, until they settle; 0 for other limits.
	Reserved int64
	// Remaining is what is left to admit: for a budget, the limit less Used
	// and Reserved.
	Remaining int64
	// Reset is the time until a rate is back to full, or until a budget's
	// window ends; 0 for concurrency.
	Reset time.Duration
}

// Spent reports whether s is a budget whose settled usage has reached its
// limit. A spent budget refuses until its window ends, whatever the requests
// in flight do; one that refuses while not spent is held by their
// reservations and admits again as they settle.
func (s State) Spent() bool { return s.Kind.Budget() && s.Used >= s.Limit }

// budgetState is the state of a budget of s whose window holds held, of
// which reserved by requests in flight (clamped to held, so that Used and
// Reserved add up to what the window holds), and ends in reset.
func budgetState(s Subject, k Kind, held, reserved int64, reset time.Duration) State {
	limit := s.Limits.Get(k)
	reserved = min(max(reserved, 0), max(held, 0))
	return State{Scope: s.Scope, ID: s.ID, Kind: k, Limit: limit, Used: max(held-reserved, 0), Reserved: reserved,
		Remaining: max(limit-held, 0), Reset: reset}
}

// Decision is Admit's answer.
type Decision struct {
	Allowed bool
	// Refused is the limit that refused the request (when !Allowed).
	Refused State
	// RetryAfter is when a retry can pass, from the limiter's state: the time
	// until enough of a rate has refilled (never the whole window), until a
	// spent budget's window ends, until the oldest request holding a held
	// budget is expected to end (heldRetry), or a short fixed wait for
	// concurrency.
	RetryAfter time.Duration
	// States holds the RPM and TPM state of every subject after the
	// decision, for x-ratelimit-* and anthropic-ratelimit-* headers (see
	// Tightest); a refused decision has them too, as they are after the
	// refusal (which reserved nothing).
	States []State
	// Budgets holds, from Redis, the state of every budget of every subject
	// after the decision, which a Failover remembers so that an outage
	// starts from them (Used + Reserved: what is not left); nil from Local.
	// Reserved is told apart from Used only for a subject whose budget has
	// nothing left; otherwise Used includes it.
	Budgets []State
	// Lease is the admitted request's reservation (when Allowed). The caller
	// must Settle it exactly once, also when the request fails or is
	// cancelled.
	Lease *Lease
}

// Tightest returns the RPM state and the TPM state that bind first among
// sts, across subjects: the least Remaining, and on a tie the longest Reset.
// Those are what x-ratelimit-* and anthropic-ratelimit-* headers report,
// for an admitted or a refused request (Decision.States) or for a Peek. A
// kind absent from sts gives nil. The results point into sts.
func Tightest(sts []State) (req, tok *State) {
	for i := range sts {
		s := &sts[i]
		switch s.Kind {
		case KindRPM:
			if tighter(s, req) {
				req = s
			}
		case KindTPM:
			if tighter(s, tok) {
				tok = s
			}
		}
	}
	return req, tok
}

// tighter reports whether a binds before b (nil binds never).
func tighter(a, b *State) bool {
	return b == nil || a.Remaining < b.Remaining || a.Remaining == b.Remaining && a.Reset > b.Reset
}

// Tightest is Tightest(d.States).
func (d Decision) Tightest() (req, tok *State) { return Tightest(d.States) }

// Lease is an admitted request's reservation: one concurrency slot per
// subject that has a concurrency limit, and the reserved tokens and cost.
type Lease struct {
	ID       string
	Subjects []Subject
	// Tokens and CostMicros are the request's estimates. What each limit
	// reserved may be less: the TPM reservation is clamped to the limit, a
	// budget's to what was left of it (the lease remembers how much).
	Tokens     int64
	CostMicros int64
	// At is the admission time; budgets settle into the windows of At, so a
	// request that spans midnight is billed to the day it started.
	At time.Time

	// settled makes Settle idempotent: CompareAndSwap(false, true) wins once.
	settled atomic.Bool
	// charged makes a Failover charge a fallback lease's usage to the
	// primary's budgets once, however often the lease is settled.
	charged atomic.Bool
	// whole are the subjects with the fleet's limits, for a fallback lease
	// that a Failover admitted on a share of them (Subjects): its usage is
	// charged to the primary's budgets as theirs.
	whole []Subject
	// issuer is the backend that issued the lease, set by Failover so that
	// Settle goes back to it; nil for a lease from a bare backend.
	issuer Limiter
	// holds are the budget reservations, one per subject (parallel to
	// Subjects). nil means unknown: a Redis admission that failed without
	// a reply, whose reservations, if any, Redis itself remembers.
	holds []hold
	// links put a Local lease in the open-lease list of each subject with
	// a budget (parallel to Subjects); nil for other leases.
	links []leaseLink
}

// hold is what one subject's budgets reserved for a lease.
type hold struct {
	tpd, cpd, cpm int64
	// kept says that Redis stored the hold under the lease id, because it
	// differs from the estimate (a clamped reservation): settling the lease
	// deletes it.
	kept bool
}

// fleetSubjects returns the subjects with the limits the primary holds,
// which a fallback lease's usage is charged to.
func (l *Lease) fleetSubjects() []Subject {
	if l.whole != nil {
		return l.whole
	}
	return l.Subjects
}

// holdOf returns the budget reservation of subject i and whether it is
// known. An unknown one is the unclamped estimate.
func (l *Lease) holdOf(i int) (hold, bool) {
	if i < len(l.holds) {
		return l.holds[i], true
	}
	return hold{tpd: l.Tokens, cpd: l.CostMicros, cpm: l.CostMicros}, false
}

// Limiter admits and settles requests. Implementations are safe for
// concurrent use.
type Limiter interface {
	// Admit checks every limit of every subject and, only if all pass,
	// reserves one request (RPM), Tokens (TPM, tokens per day), CostMicros
	// (cost budgets) and a concurrency slot, each estimate clamped to the
	// TPM limit and to what is left of a budget. A refused request reserves
	// nothing.
	Admit(ctx context.Context, req Request) (Decision, error)
	// Settle corrects a lease to the real usage (tokens, costMicros): it
	// refunds what was reserved and not used, charges what was used beyond
	// it, and releases the concurrency slots. A second Settle of the same
	// lease does nothing.
	Settle(ctx context.Context, l *Lease, tokens, costMicros int64) error
	// Peek returns the state of every configured limit of the subjects,
	// without consuming anything.
	Peek(ctx context.Context, subjects []Subject) ([]State, error)
	// Close releases the limiter's resources; it starts no goroutine that
	// outlives it.
	Close() error
}

// ErrClosed is returned by a limiter used after Close.
var ErrClosed = errors.New("ratelimit: limiter closed")

// ConcurrencyRetryAfter is the RetryAfter given when a concurrency cap
// refuses: a slot frees when some open request ends, which no limiter can
// predict.
const ConcurrencyRetryAfter = time.Second

// durationEstimate is a limiter's typical request duration: a moving average
// (weight 1/8 per sample) of how long the leases it settled lasted, from
// admission to settlement. A held budget expects its oldest reservation to
// end that long after the admission (heldRetry). Zero means no sample yet.
type durationEstimate struct{ ns atomic.Int64 }

func (e *durationEstimate) observe(d time.Duration) {
	d = max(d, 1) // zero means no sample
	for {
		old := e.ns.Load()
		next := int64(d)
		if old > 0 {
			next = old + (int64(d)-old)/8
		}
		if e.ns.CompareAndSwap(old, next) {
			return
		}
	}
}

func (e *durationEstimate) get() time.Duration { return time.Duration(e.ns.Load()) }

// dayWindow and monthWindow name the UTC calendar windows holding t, and
// return how long they still run.
func dayWindow(t time.Time) (string, time.Duration) {
	t = t.UTC()
	end := time.Date(t.Year(), t.Month(), t.Day()+1, 0, 0, 0, 0, time.UTC)
	return t.Format("2006-01-02"), end.Sub(t)
}

func monthWindow(t time.Time) (string, time.Duration) {
	t = t.UTC()
	end := time.Date(t.Year(), t.Month()+1, 1, 0, 0, 0, 0, time.UTC)
	return t.Format("2006-01"), end.Sub(t)
}
