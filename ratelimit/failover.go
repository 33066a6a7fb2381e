package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// ErrUnavailable is Admit's and Peek's error from a Failover in deny mode
// while its primary is down; the proxy answers 503.
var ErrUnavailable = errors.New("ratelimit: limiter unavailable")

// DefaultFailoverRetryAfter is FailoverOptions.RetryAfter when it is zero.
const DefaultFailoverRetryAfter = time.Second

// DefaultMaxPendingSettles is FailoverOptions.MaxPending when it is zero.
const DefaultMaxPendingSettles = 10000

// maxReplayAttempts bounds how often one pending settlement is replayed and
// fails before it is dropped, so that a settlement the primary keeps
// refusing does not hold the queue forever.
const maxReplayAttempts = 3

// FailoverOptions configure a Failover: [ratelimit] on_redis_error.
type FailoverOptions struct {
	// Primary is the shared limiter (Redis). Required.
	Primary Limiter
	// Fallback answers while the primary is down: a Local limiter with the
	// same limits, so each replica enforces them alone. Required unless Deny.
	Fallback Limiter
	// Deny refuses requests (ErrUnavailable) while the primary is down
	// instead of using Fallback: on_redis_error = "deny".
	Deny bool
	// RetryAfter is how long after a primary error requests go to the
	// fallback (or are denied) without touching the primary, before one
	// request probes it again; zero means DefaultFailoverRetryAfter.
	RetryAfter time.Duration
	// MaxPending bounds the settlements kept while the primary is down;
	// zero means DefaultMaxPendingSettles. Past it they are dropped and
	// counted (Dropped).
	MaxPending int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// OnDegraded is called with true when the primary fails and with false
	// when it answers again, on transitions only (for a gauge). It is called
	// with the Failover's lock held: it must be quick and must not call the
	// Failover.
	OnDegraded func(degraded bool)
	// OnDataLost, if set, is called when the primary refuses to decide on
	// data of another generation than it was told is whole (ErrDataLost:
	// Redis restarted empty, and its refill is not done), so that the
	// caller starts that refill now rather than at its next flush. It is
	// called without the Failover's lock, on the admitting goroutine, and
	// must not block.
	OnDataLost func()
	// Logger receives the transitions and dropped settlements; nil discards.
	Logger *slog.Logger
	// Replicas returns how many replicas share the primary (this one
	// included; fleet.Fleet.Live). While the primary is down, the fallback
	// admits 1/Replicas of every limit, from the fleet's state the primary
	// last reported (share.go), so that the fleet as a whole holds the
	// limits. nil means 1: the fallback admits the whole of every limit.
	Replicas func() int
	// SpillFile, if set, keeps what is still queued for the primary when the
	// Failover closes (Redis still down: Retry failed): Close writes it
	// there, and the next NewFailover on the same file queues it again and
	// replays it once the primary answers, so that a restart during an
	// outage loses no settlement and no budget usage. The file is removed
	// once every operation it held has been applied (or dropped). Empty
	// means that Close drops what is queued. Each replica needs its own file.
	SpillFile string
}

// Failover is a Limiter that uses a primary (Redis) while it answers and,
// once it fails, a fallback (or refusal) for RetryAfter before trying it
// again, so that an outage costs one failed call per RetryAfter instead of a
// timeout per request. What the primary missed (settlements, undos of
// admissions that may have run, the fallback's budget usage) is queued and
// replayed by one goroutine once it answers, and what is still queued at
// Close goes to FailoverOptions.SpillFile. An error that blames the
// operation rather than the primary (operationFault) is a fault, not an
// outage: it does not mark the primary down.
type Failover struct {
	primary, fallback Limiter
	charger           Charger    // the primary, if it takes charges; else nil
	raiser            RateRaiser // the primary, if its rates can be raised; else nil
	onDataLost        func()
	deny              bool
	retryAfter        time.Duration
	maxPending        int
	now               func() time.Time
	onDegraded        func(bool)
	log               *slog.Logger
	spillFile         string
	replicas          func() int

	// view is what the primary last said of each subject, which the
	// fallback starts an outage from; share is the divisor of the limits
	// during the current outage, fixed when it starts.
	view  sharedView
	share atomic.Int64

	// degraded and pendingN mirror the fields under mu, so that the healthy
	// path reads two atomics and takes no lock.
	degraded atomic.Bool
	pendingN atomic.Int64
	closed   atomic.Bool
	faults   atomic.Uint64

	// replayCtx is the replay goroutine's context; Close cancels it.
	replayCtx    context.Context
	cancelReplay context.CancelFunc
	wg           sync.WaitGroup

	mu        sync.Mutex
	retryAt   time.Time // when degraded: no probe before it
	probing   bool      // a probe of the primary is in flight
	replaying bool      // the replay goroutine runs
	// returning says that a probe is charging the primary with what waited
	// for it (returnTo): the replay does not end the outage by itself, the
	// probe's admission does, once the primary has counted everything.
	returning bool
	// recoveredAt is when the primary last came back, and flaps how many
	// times in a row it failed again within flapWindowFactor RetryAfters of
	// that: each such
	// flap doubles the wait before the next probe (hysteresis), so that a
	// primary that answers one call in two (a Cluster during a failover)
	// is not switched to and from every RetryAfter.
	recoveredAt time.Time
	flaps       int
	pending     []pendingOp
	dropped     uint64
	fullSaid    bool // the queue's overflow was logged in this degraded period
	// spillOnDisk says that SpillFile exists; spillLeft counts the
	// operations read from it that are still queued or in flight. The file
	// is removed when both say it holds nothing left to apply.
	spillOnDisk bool
	spillLeft   int
}

var _ Limiter = (*Failover)(nil)

// opKind says what a pendingOp does on the primary.
type opKind uint8

const (
	// opSettle settles a primary lease.
	opSettle opKind = iota
	// opUndo settles with zero usage the attempted lease of a primary
	// admission that failed, taking back whatever it reserved.
	opUndo
	// opCharge charges a settled fallback lease's usage to the primary's
	// budgets (Charger.Charge).
	opCharge
)

// String returns the kind's name in the spill file.
func (k opKind) String() string {
	switch k {
	case opUndo:
		return "undo"
	case opCharge:
		return "charge"
	}
	return "settle"
}

// pendingOp is a primary settlement, undo or charge of a fallback lease's
// usage, waiting for the primary.
type pendingOp struct {
	kind               opKind
	lease              *Lease
	tokens, costMicros int64
	// chargeID is the charge's own id (opCharge).
	chargeID string
	attempts int
	// spilled says that the op was read from the spill file.
	spilled bool
}

// apply performs p on the primary.
func (f *Failover) apply(ctx context.Context, p pendingOp) error {
	if p.kind == opCharge {
		return f.charger.Charge(ctx, p.lease.fleetSubjects(), p.lease.At, p.tokens, p.costMicros, p.chargeID)
	}
	return f.primary.Settle(ctx, p.lease, p.tokens, p.costMicros)
}

// NewFailover returns a Failover. Its error is a wiring error (no Primary,
// no Fallback without Deny), or a SpillFile that cannot be read or is
// corrupt: the operations it holds would be lost, so the caller must not
// start without them (an operator can move a corrupt file aside). A spill
// file's operations are queued before anything else and replayed once the
// primary answers.
func NewFailover(o FailoverOptions) (*Failover, error) {
	if o.Primary == nil {
		return nil, errors.New("ratelimit: NewFailover without a primary")
	}
	if o.Fallback == nil && !o.Deny {
		return nil, errors.New("ratelimit: NewFailover without a fallback needs Deny")
	}
	if o.RetryAfter <= 0 {
		o.RetryAfter = DefaultFailoverRetryAfter
	}
	if o.MaxPending <= 0 {
		o.MaxPending = DefaultMaxPendingSettles
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.OnDegraded == nil {
		o.OnDegraded = func(bool) {}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Replicas == nil {
		o.Replicas = func() int { return 1 }
	}
	charger, _ := o.Primary.(Charger)
	raiser, _ := o.Primary.(RateRaiser)
	var ops []pendingOp
	if o.SpillFile != "" {
		sf, err := readSpill(o.SpillFile)
		if err != nil {
			return nil, err
		}
		if sf != nil {
			if ops, err = sf.pendingOps(o.Primary); err != nil {
				return nil, fmt.Errorf("ratelimit: spill file %s is corrupt: %w", o.SpillFile, err)
			}
			for _, p := range ops {
				if p.kind == opCharge && charger == nil {
					return nil, fmt.Errorf("ratelimit: spill file %s holds charges, but the primary takes none", o.SpillFile)
				}
			}
			o.Logger.Info("ratelimit: operations from the spill file will be replayed on the primary",
				"spill_file", o.SpillFile, "count", len(ops), "saved_at", sf.SavedAt)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &Failover{
		charger: charger, raiser: raiser, onDataLost: o.OnDataLost,
		primary: o.Primary, fallback: o.Fallback, deny: o.Deny,
		retryAfter: o.RetryAfter, maxPending: o.MaxPending, now: o.Now,
		onDegraded: o.OnDegraded, log: o.Logger, spillFile: o.SpillFile, replicas: o.Replicas,
		replayCtx: ctx, cancelReplay: cancel,
		pending: ops, spillOnDisk: ops != nil, spillLeft: len(ops),
	}
	f.pendingN.Store(int64(len(ops)))
	f.share.Store(1)
	return f, nil
}

// Admit implements Limiter. A failing primary is answered by the fallback,
// or by ErrUnavailable in deny mode. Its error is ctx's when ctx was done
// before the call or was cancelled during it, which says nothing about the
// primary; a deadline that passes during the primary's call counts as a
// primary failure (too slow for the caller). An attempted lease that comes
// with the primary's error is never handed out: its undo is queued.
func (f *Failover) Admit(ctx context.Context, req Request) (Decision, error) {
	if f.closed.Load() {
		return Decision{}, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return Decision{}, err
	}
	usePrimary, probe := f.route()
	if !usePrimary {
		return f.degradedAdmit(ctx, req)
	}
	if probe {
		if err := f.returnTo(ctx); err != nil {
			if !f.primaryFailed(ctx, err, probe) {
				return Decision{}, err
			}
			return f.degradedAdmit(ctx, req)
		}
	}
	d, err := f.primary.Admit(ctx, req)
	if errors.Is(err, ErrDataLost) {
		f.primaryLost(err, probe)
		return f.degradedAdmit(ctx, req)
	}
	if err != nil {
		if d.Lease != nil {
			// The primary may have admitted before failing to answer (or its
			// script may have failed after some writes): settling with zero
			// usage takes its reservations back, and does nothing if it
			// never admitted.
			_ = f.enqueue(pendingOp{kind: opUndo, lease: d.Lease})
		}
		if operationFault(err) {
			f.primaryFaulted("admission", err, probe)
			return f.degradedAdmit(ctx, req)
		}
		if !f.primaryFailed(ctx, err, probe) {
			return Decision{}, err
		}
		return f.degradedAdmit(ctx, req)
	}
	f.primaryAnswered(probe)
	if d.Lease != nil {
		d.Lease.issuer = f.primary
	}
	if _, ok := f.fallback.(*Local); ok {
		f.view.learn(req.Subjects, d, f.now())
	}
	return d, nil
}

// degradedAdmit admits on the fallback, each limit divided by the share
// fixed when the outage started.
func (f *Failover) degradedAdmit(ctx context.Context, req Request) (Decision, error) {
	if f.deny {
		return Decision{}, ErrUnavailable
	}
	whole := req.Subjects
	n := f.share.Load()
	var stack [2]Subject
	if n > 1 {
		req.Subjects = stack[:0]
		for _, s := range whole {
			req.Subjects = append(req.Subjects, shareOf(s, n))
		}
	}
	d, err := f.fallback.Admit(ctx, req)
	if n > 1 && err == nil {
		// What the caller is told (the refusal's message, the rate-limit
		// headers) is the fleet's limit, not this replica's share of it.
		d.Refused = wholeState(d.Refused, whole, n)
		for i := range d.States {
			d.States[i] = wholeState(d.States[i], whole, n)
		}
	}
	if d.Lease != nil {
		d.Lease.issuer = f.fallback
		if n > 1 {
			d.Lease.whole = append([]Subject(nil), whole...)
		}
		// Remembered, so that the primary's rates count this admission
		// when it returns (raiseRates).
		f.view.learn(whole, Decision{}, f.now())
	}
	return d, err
}

// returnTo prepares the primary for the probe's admission, the first it
// decides after an outage: it raises its rate buckets to the fallback's
// state (what the fallback admitted of every rate, and, on a Redis that
// came back empty, what the fleet had used of it before) and replays what
// waited for it, the fallback's budget usage among it. Other admissions
// stay on the fallback meanwhile (the probe is in flight). Its error is the
// primary's: the outage goes on.
func (f *Failover) returnTo(ctx context.Context) error {
	if err := f.raiseRates(ctx); err != nil {
		return err
	}
	if f.pendingN.Load() == 0 {
		return nil
	}
	f.mu.Lock()
	f.returning = true
	f.mu.Unlock()
	err := f.replay(ctx)
	f.mu.Lock()
	f.returning = false
	f.mu.Unlock()
	if operationFault(err) {
		return nil // dropped and logged; the primary answered
	}
	return err
}

// raiseRates raises the primary's rate buckets to what this replica knows
// of every subject (generation.go's RateRaiser): the state the primary
// last reported, advanced by what the fallback admitted since.
func (f *Failover) raiseRates(ctx context.Context) error {
	if f.raiser == nil {
		return nil
	}
	known := f.view.snapshot()
	now := f.now().UnixNano()
	byKey := make(map[subjectKey]int, len(known))
	floors := make([]RateFloor, 0, len(known))
	for _, sh := range known {
		byKey[subjectKey{sh.subject.Scope, sh.subject.ID}] = len(floors)
		floors = append(floors, RateFloor{Subject: sh.subject,
			RPMFull: time.Duration(max(sh.rpmFull-now, 0)), TPMFull: time.Duration(max(sh.tpmFull-now, 0))})
	}
	if l, ok := f.fallback.(*Local); ok && !f.deny {
		subjects := make([]Subject, len(known))
		for i := range known {
			subjects[i] = known[i].subject
		}
		for _, lf := range l.rateFloors(subjects) {
			fl := &floors[byKey[subjectKey{lf.Subject.Scope, lf.Subject.ID}]]
			fl.RPMFull, fl.TPMFull = max(fl.RPMFull, lf.RPMFull), max(fl.TPMFull, lf.TPMFull)
		}
	}
	return f.raiser.RaiseRates(ctx, floors)
}

// RestoreRates raises the primary's rate buckets to what this replica
// knows of them (the state the primary last reported of each subject,
// and what the fallback admitted since), leaving emptier buckets alone.
// A refill of a Redis that lost its data calls it before the ledger is
// whole, so that the limiter, back on Redis, finds the buckets where the
// fleet left them rather than full. The probe that ends an outage does
// the same. It is safe to call from every replica.
func (f *Failover) RestoreRates(ctx context.Context) error {
	if f.closed.Load() {
		return ErrClosed
	}
	return f.raiseRates(ctx)
}

// startSharesLocked fixes the share of the outage that starts and sets the
// fallback's state of every subject the primary reported on to the fleet's
// share of it.
func (f *Failover) startSharesLocked() {
	l, ok := f.fallback.(*Local)
	if !ok || f.deny {
		return
	}
	n := int64(max(f.replicas(), 1))
	f.share.Store(n)
	known := f.view.snapshot()
	for _, sh := range known {
		l.startShare(sh, n)
	}
	f.log.Warn("ratelimit: the fallback admits this replica's share of every limit",
		"replicas", n, "subjects_known", len(known))
}

// Settle implements Limiter. A fallback lease settles on the fallback, and
// its usage is then charged to the primary's budgets (once per lease). A
// primary lease settles on the primary when it is up. A settlement or
// charge for the primary while it is down, or whose call fails, is queued
// for replay and Settle returns nil, or an error if the queue is full and
// it was dropped. One the primary refuses (an operation fault) is dropped
// with an error.
func (f *Failover) Settle(ctx context.Context, l *Lease, tokens, costMicros int64) error {
	if l == nil {
		return errors.New("ratelimit: settle of a nil lease")
	}
	if f.closed.Load() {
		return ErrClosed
	}
	if l.issuer != nil && l.issuer == f.fallback {
		if err := f.fallback.Settle(ctx, l, tokens, costMicros); err != nil {
			return err
		}
		return f.charge(ctx, l, max(tokens, 0), max(costMicros, 0))
	}
	if f.degraded.Load() || ctx.Err() != nil {
		if l.settled.Load() {
			// Settled on the primary already, or being settled there by a
			// call that queues it if it fails.
			return nil
		}
		// Settlements never probe: during an outage they would each wait
		// for a dial timeout. A done ctx could not reach the primary.
		return f.enqueue(pendingOp{kind: opSettle, lease: l, tokens: tokens, costMicros: costMicros})
	}
	return f.toPrimary(ctx, pendingOp{kind: opSettle, lease: l, tokens: tokens, costMicros: costMicros})
}

// charge sends the usage of a settled fallback lease to the primary's
// budgets, or queues it, once per lease.
func (f *Failover) charge(ctx context.Context, l *Lease, tokens, costMicros int64) error {
	if f.charger == nil || !l.charged.CompareAndSwap(false, true) {
		return nil
	}
	needed := false
	for _, s := range l.fleetSubjects() {
		needed = needed || chargeable(s, tokens, costMicros)
	}
	if !needed {
		return nil
	}
	// The id is the charge's own: fallback lease ids are per process and
	// would meet those of other replicas in Redis.
	id, err := newLeaseID()
	if err != nil {
		return err
	}
	p := pendingOp{kind: opCharge, lease: l, tokens: tokens, costMicros: costMicros, chargeID: id}
	if f.degraded.Load() || ctx.Err() != nil {
		return f.enqueue(p)
	}
	return f.toPrimary(ctx, p)
}

// toPrimary performs p on the primary, which is thought up, and queues it
// if that fails.
func (f *Failover) toPrimary(ctx context.Context, p pendingOp) error {
	err := f.apply(ctx, p)
	if err == nil {
		f.primaryAnswered(false)
		return nil
	}
	if errors.Is(err, ErrClosed) {
		return err
	}
	if operationFault(err) {
		f.faults.Add(1)
		f.mu.Lock()
		f.dropFaultLocked(p, err)
		f.mu.Unlock()
		f.primaryAnswered(false)
		return fmt.Errorf("ratelimit: %s of lease %s dropped, the primary refused it: %w", p.kind, p.lease.ID, err)
	}
	// It is queued also when the caller cancelled it: it must not be lost,
	// though that says nothing about the primary.
	f.primaryFailed(ctx, err, false)
	return f.enqueue(p)
}

// Peek implements Limiter: the primary's state, or the fallback's while the
// primary is down (this replica's share of each limit; ErrUnavailable in
// deny mode).
func (f *Failover) Peek(ctx context.Context, subjects []Subject) ([]State, error) {
	if f.closed.Load() {
		return nil, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// A Peek never probes a degraded primary: only an admission's probe
	// first raises the primary's rates and checks its generation.
	if !f.degraded.Load() {
		sts, err := f.primary.Peek(ctx, subjects)
		if err == nil {
			return sts, nil
		}
		if operationFault(err) {
			f.primaryFaulted("peek", err, false)
		} else if !f.primaryFailed(ctx, err, false) {
			return nil, err
		}
	}
	if f.deny {
		return nil, ErrUnavailable
	}
	// This replica's share, which is what it admits, reported as the
	// fleet's.
	n := f.share.Load()
	if n <= 1 {
		return f.fallback.Peek(ctx, subjects)
	}
	own := make([]Subject, len(subjects))
	for i, s := range subjects {
		own[i] = shareOf(s, n)
	}
	sts, err := f.fallback.Peek(ctx, own)
	for i := range sts {
		sts[i] = wholeState(sts[i], subjects, n)
	}
	return sts, err
}

// Retry replays the queued settlements on the primary now, whatever
// RetryAfter says, and returns the first failure (after the rest of the
// queue, for an operation the primary refused and that was dropped). A
// replay that succeeds ends a degraded period; one that fails starts one.
// With nothing queued it does nothing. The proxy calls it before Close at
// shutdown, so that nothing is left to spill when Redis is up. Close
// cancels it.
func (f *Failover) Retry(ctx context.Context) error {
	f.mu.Lock()
	if f.closed.Load() {
		f.mu.Unlock()
		return ErrClosed
	}
	// Close waits for it, so that an operation in flight is queued again
	// before Close spills the queue.
	f.wg.Add(1)
	f.mu.Unlock()
	defer f.wg.Done()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(f.replayCtx, cancel)()
	return f.replay(ctx)
}

// Degraded reports whether the primary is considered down.
func (f *Failover) Degraded() bool { return f.degraded.Load() }

// Pending returns how many settlements, undos of failed admissions and
// charges of fallback usage wait for the primary.
func (f *Failover) Pending() int { return int(f.pendingN.Load()) }

// Dropped returns how many settlements (undos and charges included) were
// dropped because the queue was full, failed maxReplayAttempts replays, were
// refused by the primary (an operation fault), or were still queued at
// Close without a SpillFile (or with one that could not be written).
func (f *Failover) Dropped() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.dropped
}

// Faults returns how many primary calls failed with an error that blames
// the operation rather than the primary's availability (a Redis error reply
// such as a script error or a key of the wrong type): a bug or bad data,
// which does not mark the primary down.
func (f *Failover) Faults() uint64 { return f.faults.Load() }

// Close implements Limiter: it stops the replay, writes what is still
// queued to SpillFile (or drops it without one; call Retry first to flush
// it to the primary) and closes both limiters. Its error includes a spill
// file that could not be written or removed.
func (f *Failover) Close() error {
	f.mu.Lock()
	if f.closed.Load() {
		f.mu.Unlock()
		return nil
	}
	// Under mu, so that no replay starts after the Wait below.
	f.closed.Store(true)
	f.mu.Unlock()
	f.cancelReplay()
	f.wg.Wait()

	var errs []error
	errs = append(errs, f.spill())
	errs = append(errs, f.primary.Close())
	if f.fallback != nil {
		errs = append(errs, f.fallback.Close())
	}
	return errors.Join(errs...)
}

// route says whether a call goes to the primary and whether it is the probe
// of a degraded primary (one at a time, once RetryAfter has passed).
func (f *Failover) route() (usePrimary, probe bool) {
	if !f.degraded.Load() {
		return true, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.degraded.Load() {
		return true, false
	}
	if f.probing || f.now().Before(f.retryAt) {
		return false, false
	}
	f.probing = true
	return true, true
}

// primaryFailed records a primary error and reports whether the call should
// be answered by the fallback instead. A cancelled ctx or a closed limiter
// says nothing about the primary: the error is the caller's. A deadline that
// passed during the call does: the primary was too slow.
func (f *Failover) primaryFailed(ctx context.Context, err error, probe bool) bool {
	callers := errors.Is(ctx.Err(), context.Canceled) || errors.Is(err, ErrClosed)
	f.mu.Lock()
	defer f.mu.Unlock()
	if probe {
		f.probing = false
	}
	if callers {
		return false
	}
	f.degradeLocked("ratelimit: primary limiter failed, using the fallback", err)
	return true
}

// primaryLost records that the primary refused to decide on data of
// another generation (ErrDataLost): the fallback answers, as in an outage,
// and the caller's refill is started.
func (f *Failover) primaryLost(err error, probe bool) {
	f.mu.Lock()
	if probe {
		f.probing = false
	}
	f.degradeLocked("ratelimit: Redis lost its data; the fallback admits until the replicas have refilled it", err)
	f.mu.Unlock()
	if f.onDataLost != nil {
		f.onDataLost()
	}
}

// flapWindowFactor·RetryAfter is how soon after a return a new failure of
// the primary counts as a flap; maxFlaps bounds the doubling of the
// probe's wait (2^maxFlaps·RetryAfter).
const (
	flapWindowFactor = 10
	maxFlaps         = 4
)

// degradeLocked marks the primary down until the next probe, which waits
// RetryAfter doubled per flap, and starts an outage if none was going on.
func (f *Failover) degradeLocked(msg string, err error) {
	now := f.now()
	f.returning = false
	if !f.degraded.Load() {
		if !f.recoveredAt.IsZero() && now.Sub(f.recoveredAt) < flapWindowFactor*f.retryAfter {
			f.flaps = min(f.flaps+1, maxFlaps)
		} else {
			f.flaps = 0
		}
		f.degraded.Store(true)
		f.fullSaid = false
		f.onDegraded(true)
		f.log.Warn(msg, "err", err, "deny", f.deny, "retry_after", f.retryAfter<<f.flaps, "flaps", f.flaps)
		f.startSharesLocked()
	}
	f.retryAt = now.Add(f.retryAfter << f.flaps)
}

// primaryFaulted records an operation fault of the primary (what, e.g.
// "admission", failed with err): it is counted and logged, and since the
// primary answered, it counts as an answer.
func (f *Failover) primaryFaulted(what string, err error, probe bool) {
	f.faults.Add(1)
	f.log.Error("ratelimit: the primary limiter refused an operation; a bug or bad data, not an outage",
		"op", what, "err", err)
	f.primaryAnswered(probe)
}

// dropFaultLocked drops p, which the primary refused.
func (f *Failover) dropFaultLocked(p pendingOp, err error) {
	f.dropped++
	f.log.Error("ratelimit: operation dropped, the primary refused it", "op", p.kind.String(),
		"lease", p.lease.ID, "tokens", p.tokens, "cost_micros", p.costMicros, "err", err)
}

// primaryAnswered records a primary success: the probe's ends a degraded
// period, and any success starts the replay of queued settlements.
func (f *Failover) primaryAnswered(probe bool) {
	if !probe && f.pendingN.Load() == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if probe {
		f.probing = false
		f.recoveredLocked()
	}
	if f.degraded.Load() || f.closed.Load() || f.replaying || len(f.pending) == 0 {
		return
	}
	f.replaying = true
	f.wg.Add(1)
	go f.replayLoop()
}

// replayLoop drains the queue in the background. It checks for more under
// the lock that enqueue takes, so a settlement queued while it finishes is
// not left waiting for the next primary call.
func (f *Failover) replayLoop() {
	defer f.wg.Done()
	for {
		err := f.replay(f.replayCtx)
		f.mu.Lock()
		// An operation fault was dropped and does not stop the replay.
		if err != nil && !operationFault(err) || len(f.pending) == 0 || f.degraded.Load() || f.closed.Load() {
			f.replaying = false
			f.mu.Unlock()
			return
		}
		f.mu.Unlock()
	}
}

func (f *Failover) recoveredLocked() {
	f.returning = false
	if !f.degraded.Load() {
		return
	}
	f.recoveredAt = f.now()
	f.degraded.Store(false)
	f.onDegraded(false)
	f.log.Info("ratelimit: primary limiter answers again", "pending_settles", len(f.pending),
		"dropped_settles", f.dropped)
}

// enqueue keeps a primary settlement, undo or charge for replay.
func (f *Failover) enqueue(p pendingOp) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed.Load() {
		return ErrClosed
	}
	if len(f.pending) >= f.maxPending {
		f.dropped++
		if !f.fullSaid {
			f.fullSaid = true
			f.log.Warn("ratelimit: settlement queue full, dropping settlements until the primary answers",
				"max", f.maxPending)
		}
		return fmt.Errorf("ratelimit: %s of lease %s dropped: %d already wait for the primary", p.kind, p.lease.ID, len(f.pending))
	}
	f.pending = append(f.pending, p)
	f.pendingN.Store(int64(len(f.pending)))
	return nil
}

// replay settles queued settlements on the primary, oldest first, until
// none is left or one fails with an outage; the failed one goes back to the
// head of the queue unless it has failed maxReplayAttempts times. One the
// primary refuses (an operation fault) is dropped and the replay goes on;
// the first such error is returned when the queue is empty.
func (f *Failover) replay(ctx context.Context) error {
	var faultErr error
	for {
		f.mu.Lock()
		if len(f.pending) == 0 {
			f.mu.Unlock()
			return faultErr
		}
		p := f.pending[0]
		f.pending[0] = pendingOp{}
		f.pending = f.pending[1:]
		f.pendingN.Store(int64(len(f.pending)))
		f.mu.Unlock()

		err := f.apply(ctx, p)
		if err == nil || operationFault(err) {
			if err != nil {
				f.faults.Add(1)
				if faultErr == nil {
					faultErr = fmt.Errorf("ratelimit: replay %s: %w", p.kind, err)
				}
			}
			f.mu.Lock()
			if err != nil {
				f.dropFaultLocked(p, err)
			}
			if !f.returning {
				f.recoveredLocked()
			}
			rm := f.doneLocked(p)
			f.mu.Unlock()
			if rm {
				f.removeSpill()
			}
			continue
		}
		f.mu.Lock()
		if !errors.Is(ctx.Err(), context.Canceled) {
			p.attempts++
		}
		rm := false
		if p.attempts >= maxReplayAttempts || errors.Is(err, ErrClosed) {
			f.dropped++
			f.log.Warn("ratelimit: settlement dropped after failed replays", "op", p.kind.String(),
				"lease", p.lease.ID, "attempts", p.attempts, "err", err)
			rm = f.doneLocked(p)
		} else {
			f.pending = append([]pendingOp{p}, f.pending...)
			f.pendingN.Store(int64(len(f.pending)))
		}
		f.mu.Unlock()
		if rm {
			f.removeSpill()
		}
		f.primaryFailed(ctx, err, false)
		return fmt.Errorf("ratelimit: replay %s: %w", p.kind, err)
	}
}
