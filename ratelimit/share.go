package ratelimit

import (
	"sync"
	"time"
)

// While the primary is down, each replica's fallback admits its share of
// the fleet's limits: every limit divided by the replicas that shared the
// primary (rounded up), starting from what the primary last said of each
// subject. A rate bucket's state is the time until it is full again, and
// that time is the same for a share as for the whole (a share of 1/n fills
// at 1/n of the rate from 1/n of the room), so each replica's bucket starts
// where the fleet's was; a budget's share is 1/n of what was left of it, so
// a spent budget stays spent. The fleet then admits, during an outage of
// length T, at most what the shared limits would have admitted plus, per
// subject, one request per replica for rounding, and per subject the
// replica never saw admitted before the outage, one share of its burst.

// shareOf returns s with every limit divided by n, rounded up, for n > 1.
func shareOf(s Subject, n int64) Subject {
	if n <= 1 {
		return s
	}
	div := func(v int64) int64 {
		if v <= 0 {
			return v
		}
		return (v + n - 1) / n
	}
	l := &s.Limits
	l.RPM, l.TPM, l.Concurrency = div(l.RPM), div(l.TPM), div(l.Concurrency)
	l.TokensPerDay, l.CostPerDayMicros, l.CostPerMonthMicros = div(l.TokensPerDay), div(l.CostPerDayMicros), div(l.CostPerMonthMicros)
	return s
}

// shared is what the primary last said of one subject's limits.
type shared struct {
	subject Subject // with the fleet's limits
	// rpmFull and tpmFull are the instants (this process's clock, Unix ns)
	// at which its buckets are full again; 0 when unknown.
	rpmFull, tpmFull int64
	// at is when the budgets were read; the counters belong to its windows.
	at            time.Time
	tpd, cpd, cpm int64
	// budgets says which budget counters are known (bit k-KindTokensPerDay).
	budgets uint8
}

// maxShared bounds the subjects a sharedView remembers. Past it, an
// arbitrary one is forgotten: a subject unknown at an outage's start gets
// a full share of its burst, which is the bound docs/redis.md states.
const maxShared = 100000

// sharedView remembers, per subject, what the primary last said, so that
// the fallback starts an outage where the fleet stood.
type sharedView struct {
	mu sync.Mutex
	m  map[subjectKey]*shared
}

// learn records the states of one decision of the primary, read at now.
func (v *sharedView) learn(subjects []Subject, d Decision, now time.Time) {
	ns := now.UnixNano()
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.m == nil {
		v.m = make(map[subjectKey]*shared)
	}
	for _, s := range subjects {
		if !limited(s.Limits) {
			continue
		}
		k := subjectKey{s.Scope, s.ID}
		sh := v.m[k]
		if sh == nil {
			if len(v.m) >= maxShared {
				for old := range v.m {
					delete(v.m, old)
					break
				}
			}
			sh = &shared{}
			v.m[k] = sh
		}
		sh.subject = s
	}
	for i := range d.States {
		st := &d.States[i]
		if sh := v.m[subjectKey{st.Scope, st.ID}]; sh != nil {
			switch st.Kind {
			case KindRPM:
				sh.rpmFull = ns + int64(st.Reset)
			case KindTPM:
				sh.tpmFull = ns + int64(st.Reset)
			}
		}
	}
	for i := range d.Budgets {
		v.budgetLocked(&d.Budgets[i], now)
	}
	if !d.Allowed && d.Refused.Kind.Budget() {
		v.budgetLocked(&d.Refused, now)
	}
}

// budgetLocked records a budget's state read at now.
func (v *sharedView) budgetLocked(st *State, now time.Time) {
	sh := v.m[subjectKey{st.Scope, st.ID}]
	if sh == nil || !st.Kind.Budget() {
		return
	}
	if !sh.at.Equal(now) {
		sh.at, sh.budgets = now, 0
	}
	switch st.Kind {
	case KindTokensPerDay:
		sh.tpd = st.Used + st.Reserved
	case KindCostPerDay:
		sh.cpd = st.Used + st.Reserved
	default:
		sh.cpm = st.Used + st.Reserved
	}
	sh.budgets |= 1 << (st.Kind - KindTokensPerDay)
}

// snapshot returns a copy of what is remembered.
func (v *sharedView) snapshot() []shared {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([]shared, 0, len(v.m))
	for _, sh := range v.m {
		out = append(out, *sh)
	}
	return out
}

// startShare sets the state of s (whose limits are already its share, of n)
// to sh, the fleet's state the primary last reported: the rate buckets full
// again when the fleet's were, and each budget's window holding the share
// of it that was used (so that its remainder is 1/n of the fleet's). A
// budget read in another window than now's is left alone. The fallback's
// own leases still open (from an earlier outage) keep their reservations on
// top: the primary has not seen them yet, and their Settle takes them back.
func (l *Local) startShare(sh shared, n int64) {
	s, full := shareOf(sh.subject, n), sh.subject.Limits
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	at := l.now()
	now := at.UnixNano()
	e := l.get(s)
	if s.Limits.RPM > 0 && sh.rpmFull > 0 {
		e.rpmTAT = sh.rpmFull
	}
	if s.Limits.TPM > 0 && sh.tpmFull > 0 {
		e.tpmTAT = sh.tpmFull
	}
	used := func(share, whole, fleetUsed int64) int64 {
		return max(share-max(whole-fleetUsed, 0)/n, 0)
	}
	sameDay := sh.at.UTC().Format(time.DateOnly) == at.UTC().Format(time.DateOnly)
	sameMonth := sh.at.UTC().Format("2006-01") == at.UTC().Format("2006-01")
	if sameDay && (sh.budgets&(1<<0|1<<1)) != 0 {
		e.rollDay(at, now)
		if sh.budgets&(1<<0) != 0 && s.Limits.TokensPerDay > 0 {
			e.dayTokens = used(s.Limits.TokensPerDay, full.TokensPerDay, sh.tpd) + e.dayTokensRes
		}
		if sh.budgets&(1<<1) != 0 && s.Limits.CostPerDayMicros > 0 {
			e.dayCost = used(s.Limits.CostPerDayMicros, full.CostPerDayMicros, sh.cpd) + e.dayCostRes
		}
	}
	if sameMonth && sh.budgets&(1<<2) != 0 && s.Limits.CostPerMonthMicros > 0 {
		e.rollMonth(at, now)
		e.monthCost = used(s.Limits.CostPerMonthMicros, full.CostPerMonthMicros, sh.cpm) + e.monthCostRes
	}
	l.trim(now)
}

// wholeState turns st, a state of a share of one of whole's subjects (1/n
// of its limits), into the fleet's: the whole limit, and the share's use
// times n (as if every replica used its share alike), capped at it. A
// spent share is a spent whole and a share that is not spent is not:
// Used < ceil(L/n) gives Used·n < L. Reset is unchanged (a share's
// time-to-full is the fleet's). A state of no subject in whole is
// returned as it is.
func wholeState(st State, whole []Subject, n int64) State {
	for _, s := range whole {
		if s.Scope != st.Scope || s.ID != st.ID {
			continue
		}
		limit := s.Limits.Get(st.Kind)
		if limit <= 0 {
			return st
		}
		scale := func(v int64) int64 { return min(max(v, 0)*n, limit) }
		st.Limit, st.Used, st.Reserved = limit, scale(st.Used), scale(st.Reserved)
		st.Remaining = max(limit-st.Used-st.Reserved, 0)
		return st
	}
	return st
}
