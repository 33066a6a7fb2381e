package ratelimit

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"
)

// DefaultMaxSubjects is LocalOptions.MaxSubjects when it is zero.
const DefaultMaxSubjects = 100000

// evictScan bounds the work one insertion spends looking for an idle
// subject to evict, so that Admit stays O(1) however many subjects are
// protected.
const evictScan = 16

// LocalOptions configure a Local limiter. The zero value is usable.
type LocalOptions struct {
	// Now is the clock; nil means time.Now. Tests inject synthetic instants.
	Now func() time.Time
	// MaxSubjects bounds the per-subject state kept (default
	// DefaultMaxSubjects). Past it, the least recently used idle subjects
	// are evicted; see Local for what idle means.
	MaxSubjects int
}

// Local is the in-process Limiter: every limit of every subject lives in one
// map behind one mutex, which makes Admit atomic across a request's subjects
// without lock ordering; Local never blocks and starts no goroutine.
// MaxSubjects is a soft bound: a subject is evicted only when forgetting it
// changes no decision (no open lease, both rate buckets full, no budget
// usage in its current day or month window), so the map may exceed it.
type Local struct {
	now func() time.Time
	max int

	mu       sync.Mutex
	closed   bool
	seq      uint64
	subjects map[subjectKey]*entry
	lru      entry // sentinel: lru.next is the most recently used
}

var _ Limiter = (*Local)(nil)

type subjectKey struct {
	scope Scope
	id    string
}

// entry is one subject's state. Times are Unix nanoseconds.
type entry struct {
	key        subjectKey
	prev, next *entry

	rpmTAT, tpmTAT int64
	// open counts the subject's unsettled leases, whether or not it has a
	// concurrency limit, so that such subjects are never evicted.
	open int64

	// dayEnd and monthEnd identify the windows the counters belong to.
	dayEnd, monthEnd   int64
	dayTokens, dayCost int64
	monthCost          int64
}

// NewLocal returns an in-process limiter.
func NewLocal(opts LocalOptions) *Local {
	l := &Local{
		now:      opts.Now,
		max:      opts.MaxSubjects,
		subjects: make(map[subjectKey]*entry),
	}
	if l.now == nil {
		l.now = time.Now
	}
	if l.max <= 0 {
		l.max = DefaultMaxSubjects
	}
	l.lru.next, l.lru.prev = &l.lru, &l.lru
	return l
}

// leaseBox lets one allocation carry a lease, its subjects and the
// decision's states for the usual request (a key and its team).
type leaseBox struct {
	lease    Lease
	subjects [2]Subject
	holds    [2]hold
	states   [4]State
	id       [24]byte
}

// refusal tracks the refusing limit with the longest wait, so that a retry
// after RetryAfter passes every limit that refused.
type refusal struct {
	set   bool
	state State
	retry time.Duration
}

func (r *refusal) add(st State, retry time.Duration) {
	if !r.set || retry > r.retry {
		r.set, r.state, r.retry = true, st, retry
	}
}

// Admit implements Limiter. When several limits refuse, Decision.Refused is
// the one with the longest wait and RetryAfter is that wait, so a retry then
// passes all of them unless others spent the room meanwhile.
//
// A Tokens estimate above a subject's TPM limit reserves the whole bucket
// instead (it is admitted once the bucket is full, and Settle charges the
// real excess as debt): a request is never refused forever for its
// max_tokens. Likewise a budget reserves at most what is left of it and
// refuses only once spent (gcra.go's budgetReserve).
//
// Subjects of one request are expected to be distinct (a key and its team).
// Limits of zero or less are unlimited. ctx is unused: Local never blocks.
func (l *Local) Admit(_ context.Context, req Request) (Decision, error) {
	tokens, cost := max(req.Tokens, 0), max(req.CostMicros, 0)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return Decision{}, ErrClosed
	}
	at := l.now()
	now := at.UnixNano()

	var stack [4]*entry
	ents := stack[:0]
	for _, s := range req.Subjects {
		ents = append(ents, l.get(s))
	}
	var hstack [4]hold
	holds := hstack[:0]

	// Check everything before reserving anything.
	var ref refusal
	for i, s := range req.Subjects {
		e, lim := ents[i], s.Limits
		if lim.RPM > 0 {
			if _, ok, wait := rateReserve(e.rpmTAT, now, 1, lim.RPM); !ok {
				ref.add(rateStateOf(s, KindRPM, e.rpmTAT, now), time.Duration(wait))
			}
		}
		if lim.TPM > 0 {
			if _, ok, wait := rateReserve(e.tpmTAT, now, tpmReserve(tokens, lim.TPM), lim.TPM); !ok {
				ref.add(rateStateOf(s, KindTPM, e.tpmTAT, now), time.Duration(wait))
			}
		}
		if lim.Concurrency > 0 && e.open >= lim.Concurrency {
			ref.add(State{Scope: s.Scope, ID: s.ID, Kind: KindConcurrency, Limit: lim.Concurrency,
				Used: e.open, Remaining: 0}, ConcurrencyRetryAfter)
		}
		if lim.TokensPerDay > 0 || lim.CostPerDayMicros > 0 {
			e.rollDay(at, now)
		}
		if lim.CostPerMonthMicros > 0 {
			e.rollMonth(at, now)
		}
		var h hold
		var ok bool
		if lim.TokensPerDay > 0 {
			if h.tpd, ok = budgetReserve(e.dayTokens, tokens, lim.TokensPerDay); !ok {
				st := budgetState(s, KindTokensPerDay, e.dayTokens, e.dayEnd, now)
				ref.add(st, st.Reset)
			}
		}
		if lim.CostPerDayMicros > 0 {
			if h.cpd, ok = budgetReserve(e.dayCost, cost, lim.CostPerDayMicros); !ok {
				st := budgetState(s, KindCostPerDay, e.dayCost, e.dayEnd, now)
				ref.add(st, st.Reset)
			}
		}
		if lim.CostPerMonthMicros > 0 {
			if h.cpm, ok = budgetReserve(e.monthCost, cost, lim.CostPerMonthMicros); !ok {
				st := budgetState(s, KindCostPerMonth, e.monthCost, e.monthEnd, now)
				ref.add(st, st.Reset)
			}
		}
		holds = append(holds, h)
	}
	if ref.set {
		d := Decision{Refused: ref.state, RetryAfter: ref.retry,
			States: l.rateStates(nil, req.Subjects, ents, now)}
		l.trim(now)
		return d, nil
	}

	for i, s := range req.Subjects {
		e, lim := ents[i], s.Limits
		if lim.RPM > 0 {
			e.rpmTAT, _, _ = rateReserve(e.rpmTAT, now, 1, lim.RPM)
		}
		if lim.TPM > 0 {
			e.tpmTAT, _, _ = rateReserve(e.tpmTAT, now, tpmReserve(tokens, lim.TPM), lim.TPM)
		}
		e.open++
		e.dayTokens += holds[i].tpd
		e.dayCost += holds[i].cpd
		e.monthCost += holds[i].cpm
	}

	box := new(leaseBox)
	l.seq++
	id := append(box.id[:0], 'l')
	id = strconv.AppendUint(id, l.seq, 36)
	box.lease.ID = string(id)
	box.lease.Tokens, box.lease.CostMicros, box.lease.At = tokens, cost, at
	var states []State
	if len(req.Subjects) <= len(box.subjects) {
		box.lease.Subjects = box.subjects[:len(req.Subjects)]
		box.lease.holds = box.holds[:len(req.Subjects)]
		states = box.states[:0]
	} else {
		box.lease.Subjects = make([]Subject, len(req.Subjects))
		box.lease.holds = make([]hold, len(req.Subjects))
	}
	copy(box.lease.Subjects, req.Subjects)
	copy(box.lease.holds, holds)
	d := Decision{Allowed: true, Lease: &box.lease,
		States: l.rateStates(states, req.Subjects, ents, now)}
	l.trim(now)
	return d, nil
}

// Settle implements Limiter. tokens and costMicros are the real usage, or
// the usage so far for a cancelled request. Rates are corrected at the time
// of the call; budgets in the windows of l.At, and not at all if that window
// has since ended. A budget is charged the real usage even where it exceeds
// the clamped reservation, which may take a window past its limit. Settle
// never reads ctx, so the context of a cancelled request may be passed.
func (l *Local) Settle(_ context.Context, ls *Lease, tokens, costMicros int64) error {
	if ls == nil {
		return errors.New("ratelimit: settle of a nil lease")
	}
	tokens, costMicros = max(tokens, 0), max(costMicros, 0)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	if !ls.settled.CompareAndSwap(false, true) {
		return nil
	}
	now := l.now().UnixNano()
	var dayEnd, monthEnd int64 // computed once, only for subjects with budgets
	for i, s := range ls.Subjects {
		e, lim := l.get(s), s.Limits
		h, _ := ls.holdOf(i)
		e.open = max(e.open-1, 0)
		if lim.TPM > 0 {
			e.tpmTAT = rateSettle(e.tpmTAT, now, tokens-tpmReserve(ls.Tokens, lim.TPM), lim.TPM)
		}
		if lim.TokensPerDay > 0 || lim.CostPerDayMicros > 0 {
			if dayEnd == 0 {
				_, rem := dayWindow(ls.At)
				dayEnd = ls.At.UnixNano() + int64(rem)
			}
			if e.dayEnd == dayEnd {
				if lim.TokensPerDay > 0 {
					e.dayTokens = max(e.dayTokens+tokens-h.tpd, 0)
				}
				if lim.CostPerDayMicros > 0 {
					e.dayCost = max(e.dayCost+costMicros-h.cpd, 0)
				}
			}
		}
		if lim.CostPerMonthMicros > 0 {
			if monthEnd == 0 {
				_, rem := monthWindow(ls.At)
				monthEnd = ls.At.UnixNano() + int64(rem)
			}
			if e.monthEnd == monthEnd {
				e.monthCost = max(e.monthCost+costMicros-h.cpm, 0)
			}
		}
	}
	l.trim(now)
	return nil
}

// Peek implements Limiter: one State per non-zero limit of each subject, in
// Kind order. A subject never seen reports full buckets and empty budgets.
func (l *Local) Peek(_ context.Context, subjects []Subject) ([]State, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, ErrClosed
	}
	at := l.now()
	now := at.UnixNano()
	var out []State
	var dayEnd, monthEnd int64
	for _, s := range subjects {
		e := l.subjects[subjectKey{s.Scope, s.ID}]
		if e == nil {
			e = &entry{}
		}
		lim := s.Limits
		if lim.RPM > 0 {
			out = append(out, rateStateOf(s, KindRPM, e.rpmTAT, now))
		}
		if lim.TPM > 0 {
			out = append(out, rateStateOf(s, KindTPM, e.tpmTAT, now))
		}
		if lim.Concurrency > 0 {
			out = append(out, State{Scope: s.Scope, ID: s.ID, Kind: KindConcurrency,
				Limit: lim.Concurrency, Used: e.open, Remaining: max(lim.Concurrency-e.open, 0)})
		}
		if (lim.TokensPerDay > 0 || lim.CostPerDayMicros > 0) && dayEnd == 0 {
			_, rem := dayWindow(at)
			dayEnd = now + int64(rem)
		}
		if lim.CostPerMonthMicros > 0 && monthEnd == 0 {
			_, rem := monthWindow(at)
			monthEnd = now + int64(rem)
		}
		// Counters of an ended window read as zero without being reset:
		// Peek changes nothing.
		dayTokens, dayCost, monthCost := e.dayTokens, e.dayCost, e.monthCost
		if e.dayEnd != dayEnd {
			dayTokens, dayCost = 0, 0
		}
		if e.monthEnd != monthEnd {
			monthCost = 0
		}
		if lim.TokensPerDay > 0 {
			out = append(out, budgetState(s, KindTokensPerDay, dayTokens, dayEnd, now))
		}
		if lim.CostPerDayMicros > 0 {
			out = append(out, budgetState(s, KindCostPerDay, dayCost, dayEnd, now))
		}
		if lim.CostPerMonthMicros > 0 {
			out = append(out, budgetState(s, KindCostPerMonth, monthCost, monthEnd, now))
		}
	}
	return out, nil
}

// Seed adds usage recorded elsewhere (the spend ledger, at startup) to s's
// budget windows holding at: dayTokens and dayCostMicros to its UTC day,
// monthCostMicros to its UTC month. Without it a restart would hand every
// subject a fresh daily and monthly budget. Amounts below zero count as
// zero. A window that has already given way to a later one in s's state is
// left alone; an earlier one is replaced. A subject holding usage in its
// current windows is never evicted, so the seed lasts until they end. Seed
// does nothing after Close.
func (l *Local) Seed(s Subject, at time.Time, dayTokens, dayCostMicros, monthCostMicros int64) {
	dayTokens, dayCostMicros, monthCostMicros = max(dayTokens, 0), max(dayCostMicros, 0), max(monthCostMicros, 0)
	if dayTokens == 0 && dayCostMicros == 0 && monthCostMicros == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	e := l.get(s)
	if dayTokens > 0 || dayCostMicros > 0 {
		_, rem := dayWindow(at)
		end := at.UnixNano() + int64(rem)
		if e.dayEnd < end {
			e.dayEnd, e.dayTokens, e.dayCost = end, 0, 0
		}
		if e.dayEnd == end {
			e.dayTokens += dayTokens
			e.dayCost += dayCostMicros
		}
	}
	if monthCostMicros > 0 {
		_, rem := monthWindow(at)
		end := at.UnixNano() + int64(rem)
		if e.monthEnd < end {
			e.monthEnd, e.monthCost = end, 0
		}
		if e.monthEnd == end {
			e.monthCost += monthCostMicros
		}
	}
	l.trim(l.now().UnixNano())
}

// ChargeRates charges s's RPM with requests and its TPM with tokens as of
// at, an instant that may be past, as if they had been admitted then: each
// bucket's TAT becomes max(TAT, at) + n·T (GCRA), which a charge older than
// a minute's worth leaves full. Without it a restart would hand every
// subject a full burst again; cmd/gateway replays the spend journal through
// it at startup. It refuses nothing (the requests were admitted) and may
// leave a bucket in debt, as Settle does. Charges in order of at rebuild
// the buckets exactly; out of order, a bucket ends no fuller than that
// (each charge starts from the later TAT). Concurrency and budgets are not
// touched (Seed restores budgets). Amounts below zero count as zero; limits
// of zero or less are unlimited. ChargeRates does nothing after Close.
func (l *Local) ChargeRates(s Subject, at time.Time, requests, tokens int64) {
	requests, tokens = max(requests, 0), max(tokens, 0)
	lim := s.Limits
	rpm, tpm := lim.RPM > 0 && requests > 0, lim.TPM > 0 && tokens > 0
	if !rpm && !tpm {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	e, t := l.get(s), at.UnixNano()
	if rpm {
		e.rpmTAT = rateSettle(e.rpmTAT, t, requests, lim.RPM)
	}
	if tpm {
		e.tpmTAT = rateSettle(e.tpmTAT, t, tokens, lim.TPM)
	}
	l.trim(l.now().UnixNano())
}

// Close implements Limiter; later calls return ErrClosed.
func (l *Local) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	l.subjects = nil
	l.lru.next, l.lru.prev = &l.lru, &l.lru
	return nil
}

// get returns s's entry, creating it, and marks it most recently used.
func (l *Local) get(s Subject) *entry {
	k := subjectKey{s.Scope, s.ID}
	e := l.subjects[k]
	if e == nil {
		e = &entry{key: k}
		l.subjects[k] = e
	} else {
		e.prev.next, e.next.prev = e.next, e.prev
	}
	e.prev, e.next = &l.lru, l.lru.next
	l.lru.next.prev = e
	l.lru.next = e
	return e
}

// trim evicts idle subjects from the least recently used end while the map
// is over its bound. A subject that is not idle is moved to the front, so the
// next scan looks at others; at most evictScan subjects are looked at.
func (l *Local) trim(now int64) {
	for range evictScan {
		if len(l.subjects) <= l.max {
			return
		}
		e := l.lru.prev
		if e == &l.lru {
			return
		}
		e.prev.next, e.next.prev = e.next, e.prev
		if e.idle(now) {
			delete(l.subjects, e.key)
			continue
		}
		e.prev, e.next = &l.lru, l.lru.next
		l.lru.next.prev = e
		l.lru.next = e
	}
}

// idle reports whether forgetting e would change no decision.
func (e *entry) idle(now int64) bool {
	return e.open == 0 && e.rpmTAT <= now && e.tpmTAT <= now &&
		(now >= e.dayEnd || e.dayTokens == 0 && e.dayCost == 0) &&
		(now >= e.monthEnd || e.monthCost == 0)
}

// rollDay starts a new day window when the one the counters belong to has
// ended. dayWindow is called only then, so Admit formats no window name.
func (e *entry) rollDay(at time.Time, now int64) {
	if now >= e.dayEnd {
		_, rem := dayWindow(at)
		e.dayEnd, e.dayTokens, e.dayCost = now+int64(rem), 0, 0
	}
}

func (e *entry) rollMonth(at time.Time, now int64) {
	if now >= e.monthEnd {
		_, rem := monthWindow(at)
		e.monthEnd, e.monthCost = now+int64(rem), 0
	}
}

// rateStates appends the RPM and TPM state of every subject that has them.
func (l *Local) rateStates(dst []State, subjects []Subject, ents []*entry, now int64) []State {
	if dst == nil {
		n := 0
		for _, s := range subjects {
			if s.Limits.RPM > 0 {
				n++
			}
			if s.Limits.TPM > 0 {
				n++
			}
		}
		if n == 0 {
			return nil
		}
		dst = make([]State, 0, n)
	}
	for i, s := range subjects {
		if s.Limits.RPM > 0 {
			dst = append(dst, rateStateOf(s, KindRPM, ents[i].rpmTAT, now))
		}
		if s.Limits.TPM > 0 {
			dst = append(dst, rateStateOf(s, KindTPM, ents[i].tpmTAT, now))
		}
	}
	return dst
}

func rateStateOf(s Subject, k Kind, tat, now int64) State {
	limit := s.Limits.Get(k)
	used, rem, reset := rateState(tat, now, limit)
	return State{Scope: s.Scope, ID: s.ID, Kind: k, Limit: limit, Used: used, Remaining: rem, Reset: reset}
}

func budgetState(s Subject, k Kind, used, end, now int64) State {
	limit := s.Limits.Get(k)
	return State{Scope: s.Scope, ID: s.ID, Kind: k, Limit: limit, Used: used,
		Remaining: max(limit-used, 0), Reset: time.Duration(end - now)}
}
