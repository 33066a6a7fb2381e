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
	// typical is how long its requests last, for a held budget's RetryAfter.
	typical durationEstimate

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

	// dayEnd and monthEnd identify the windows the counters belong to. Each
	// counter holds the settled usage and the reservations of open leases;
	// the *Res counters are the reservations alone.
	dayEnd, monthEnd         int64
	dayTokens, dayCost       int64
	monthCost                int64
	dayTokensRes, dayCostRes int64
	monthCostRes             int64
	// leases lists the subject's open leases, oldest first, when it has a
	// budget (a sentinel; next is nil until the first).
	leases leaseLink
}

// leaseLink puts an open lease in the list of one subject with a budget, so
// that a budget held by requests in flight can tell when the oldest of them
// is expected to end.
type leaseLink struct {
	prev, next *leaseLink
	at         int64 // admission, Unix ns
}

// link appends lk, admitted at at, to e's open leases.
func (e *entry) link(lk *leaseLink, at int64) {
	if e.leases.next == nil {
		e.leases.next, e.leases.prev = &e.leases, &e.leases
	}
	lk.at = at
	lk.prev, lk.next = e.leases.prev, &e.leases
	e.leases.prev.next = lk
	e.leases.prev = lk
}

// unlink takes lk out of its list, if it is in one.
func (lk *leaseLink) unlink() {
	if lk.next == nil {
		return
	}
	lk.prev.next, lk.next.prev = lk.next, lk.prev
	lk.prev, lk.next = nil, nil
}

// oldestSince returns the admission time of e's oldest open lease admitted
// at or after start (the window's start: earlier ones hold an earlier
// window's budget).
func (e *entry) oldestSince(start int64) (int64, bool) {
	if e.leases.next == nil {
		return 0, false
	}
	for lk := e.leases.next; lk != &e.leases; lk = lk.next {
		if lk.at >= start {
			return lk.at, true
		}
	}
	return 0, false
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
	links    [2]leaseLink
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
// max_tokens. Likewise a budget reserves at most what is left of it
// (gcra.go's budgetReserve); with nothing left it refuses as spent, until the
// window ends, or as held by the requests in flight, for heldRetry: until the
// oldest open lease of the subject in the window is expected to end, by the
// typical duration of the leases this limiter settled.
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
				l.refuseBudget(&ref, s, e, KindTokensPerDay, now)
			}
		}
		if lim.CostPerDayMicros > 0 {
			if h.cpd, ok = budgetReserve(e.dayCost, cost, lim.CostPerDayMicros); !ok {
				l.refuseBudget(&ref, s, e, KindCostPerDay, now)
			}
		}
		if lim.CostPerMonthMicros > 0 {
			if h.cpm, ok = budgetReserve(e.monthCost, cost, lim.CostPerMonthMicros); !ok {
				l.refuseBudget(&ref, s, e, KindCostPerMonth, now)
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
		e.dayTokensRes += holds[i].tpd
		e.dayCostRes += holds[i].cpd
		e.monthCostRes += holds[i].cpm
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
		box.lease.links = box.links[:len(req.Subjects)]
		states = box.states[:0]
	} else {
		box.lease.Subjects = make([]Subject, len(req.Subjects))
		box.lease.holds = make([]hold, len(req.Subjects))
		box.lease.links = make([]leaseLink, len(req.Subjects))
	}
	copy(box.lease.Subjects, req.Subjects)
	copy(box.lease.holds, holds)
	for i, s := range req.Subjects {
		if s.Limits.HasBudget() {
			ents[i].link(&box.lease.links[i], now)
		}
	}
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
	if at := ls.At.UnixNano(); !ls.At.IsZero() && now >= at {
		l.typical.observe(time.Duration(now - at))
	}
	var dayEnd, monthEnd int64 // computed once, only for subjects with budgets
	for i, s := range ls.Subjects {
		e, lim := l.get(s), s.Limits
		h, _ := ls.holdOf(i)
		e.open = max(e.open-1, 0)
		if i < len(ls.links) {
			ls.links[i].unlink()
		}
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
					e.dayTokensRes = max(e.dayTokensRes-h.tpd, 0)
				}
				if lim.CostPerDayMicros > 0 {
					e.dayCost = max(e.dayCost+costMicros-h.cpd, 0)
					e.dayCostRes = max(e.dayCostRes-h.cpd, 0)
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
				e.monthCostRes = max(e.monthCostRes-h.cpm, 0)
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
		dayTokensRes, dayCostRes, monthCostRes := e.dayTokensRes, e.dayCostRes, e.monthCostRes
		if e.dayEnd != dayEnd {
			dayTokens, dayCost, dayTokensRes, dayCostRes = 0, 0, 0, 0
		}
		if e.monthEnd != monthEnd {
			monthCost, monthCostRes = 0, 0
		}
		dayLeft, monthLeft := time.Duration(dayEnd-now), time.Duration(monthEnd-now)
		if lim.TokensPerDay > 0 {
			out = append(out, budgetState(s, KindTokensPerDay, dayTokens, dayTokensRes, dayLeft))
		}
		if lim.CostPerDayMicros > 0 {
			out = append(out, budgetState(s, KindCostPerDay, dayCost, dayCostRes, dayLeft))
		}
		if lim.CostPerMonthMicros > 0 {
			out = append(out, budgetState(s, KindCostPerMonth, monthCost, monthCostRes, monthLeft))
		}
	}
	return out, nil
}

// RaiseTo raises the budgets of s (the windows s.Limits has) holding at to
// at least dayTokens and dayCostMicros for the day and monthCostMicros for
// the month, as a ledger says they were used; a window already past its
// figure is left alone, so raising twice raises once. It tells a budget
// that a reload added what was spent before it. It does nothing after
// Close.
func (l *Local) RaiseTo(s Subject, at time.Time, dayTokens, dayCostMicros, monthCostMicros int64) {
	lim := s.Limits
	if !lim.HasBudget() {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	e := l.get(s)
	e.rollDay(at, at.UnixNano())
	e.rollMonth(at, at.UnixNano())
	if lim.TokensPerDay > 0 {
		e.dayTokens = max(e.dayTokens, dayTokens)
	}
	if lim.CostPerDayMicros > 0 {
		e.dayCost = max(e.dayCost, dayCostMicros)
	}
	if lim.CostPerMonthMicros > 0 {
		e.monthCost = max(e.monthCost, monthCostMicros)
	}
	l.trim(l.now().UnixNano())
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
			e.dayEnd, e.dayTokens, e.dayCost, e.dayTokensRes, e.dayCostRes = end, 0, 0, 0, 0
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
			e.monthEnd, e.monthCost, e.monthCostRes = end, 0, 0
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
		e.dayEnd, e.dayTokens, e.dayCost, e.dayTokensRes, e.dayCostRes = now+int64(rem), 0, 0, 0, 0
	}
}

func (e *entry) rollMonth(at time.Time, now int64) {
	if now >= e.monthEnd {
		_, rem := monthWindow(at)
		e.monthEnd, e.monthCost, e.monthCostRes = now+int64(rem), 0, 0
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

// refuseBudget adds to ref the refusal of e's budget of kind k, which has
// nothing left at now: until the window ends if it is spent, else for
// heldRetry.
func (l *Local) refuseBudget(ref *refusal, s Subject, e *entry, k Kind, now int64) {
	var st State
	var start int64
	switch k {
	case KindTokensPerDay:
		st = budgetState(s, k, e.dayTokens, e.dayTokensRes, time.Duration(e.dayEnd-now))
	case KindCostPerDay:
		st = budgetState(s, k, e.dayCost, e.dayCostRes, time.Duration(e.dayEnd-now))
	default:
		st = budgetState(s, k, e.monthCost, e.monthCostRes, time.Duration(e.monthEnd-now))
	}
	if st.Spent() {
		ref.add(st, st.Reset)
		return
	}
	end := now + int64(st.Reset)
	if k == KindCostPerMonth {
		start = time.Unix(0, end).UTC().AddDate(0, -1, 0).UnixNano()
	} else {
		start = end - int64(24*time.Hour)
	}
	oldest, found := e.oldestSince(start)
	ref.add(st, time.Duration(heldRetry(oldest, found, int64(l.typical.get()), now, end)))
}
