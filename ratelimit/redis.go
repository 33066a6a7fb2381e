package ratelimit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisOptions configure a Redis limiter. The zero value is usable.
type RedisOptions struct {
	// Prefix starts every key; empty means "tollgate:rl:". It must not
	// contain '{' or '}', which would move the Cluster hash tag.
	Prefix string
	// LeaseTTL is how long a concurrency lease lives if the replica that
	// holds it dies without settling; zero or less means 15 minutes. It must
	// exceed the longest request, or a live request loses its slot. A lease
	// can still be settled for at least a day after it expires; later, its
	// Settle may be ignored.
	LeaseTTL time.Duration
	// GenerationKey, if set, is the key holding the generation of Redis's
	// data (the spend ledger's): admissions are decided only while it
	// holds what SetGeneration said (generation.go). Empty checks nothing;
	// it must be empty on a Redis Cluster, where the key lives in another
	// slot than the limits'.
	GenerationKey string
}

// Redis is a Limiter shared by every replica through Redis. Each subject's
// limits are checked and reserved by one Lua script on Redis's own clock;
// the subjects of one request go in one pipeline, so an admitted request
// costs one round trip. Its arithmetic is gcra.go's, in microseconds.
//
// Keys are hash-tagged per subject ("{tollgate:rl:key:<id>}:rpm", ":tpm",
// ":leases", ":tpd:<day>", ":cpd:<day>", ":cpm:<month>", each budget's
// ":...:res" beside it, ":hold:<lease>", ":charge:<id>"), so one subject's
// keys share a Redis Cluster slot. ":leases" holds the subject's open
// leases; it makes Settle idempotent on the Redis side and counts
// concurrency. A budget's counter holds its settled usage and its
// reservations, and the ":res" counter beside it the reservations alone.
type Redis struct {
	client   redis.UniversalClient
	prefix   string
	leaseTTL time.Duration
	closed   atomic.Bool
	// typical is how long the requests this replica settled lasted, for a
	// held budget's RetryAfter.
	typical durationEstimate
	// ttlArg and concRetryArg are script arguments boxed once, so that an
	// Admit does not allocate them per subject.
	ttlArg, concRetryArg any
	// genKey and gen are the generation check (generation.go).
	genKey string
	gen    atomic.Pointer[string]
}

var _ Limiter = (*Redis)(nil)

// NewRedis returns a limiter on client, which it does not own: Close leaves
// the client open.
func NewRedis(client redis.UniversalClient, opts RedisOptions) *Redis {
	if opts.Prefix == "" {
		opts.Prefix = "tollgate:rl:"
	}
	if opts.LeaseTTL <= 0 {
		opts.LeaseTTL = 15 * time.Minute
	}
	return &Redis{client: client, prefix: opts.Prefix, leaseTTL: opts.LeaseTTL, genKey: opts.GenerationKey,
		ttlArg: opts.LeaseTTL.Microseconds(), concRetryArg: ConcurrencyRetryAfter.Microseconds()}
}

// maxScriptArg bounds the token counts and costs given to the scripts. Lua
// numbers are IEEE doubles, and Redis turns a Lua number passed to
// redis.call into a string with "%.17g": from 1e17 up that prints as
// "1e+17", which INCRBY refuses ("value is not an integer"), and beyond 2^53
// integers are no longer exact. Below 2^52 every argument, and the sum or
// difference of two, is an exact integer that prints as one. 2^52 tokens or
// µ$ ($4.5 billion) is beyond any real request, so the clamp loses nothing
// real; it only keeps an absurd usage from failing every settlement of it.
const maxScriptArg = 1 << 52

// scriptArg clamps a token count or cost to [0, maxScriptArg].
func scriptArg(v int64) int64 { return min(max(v, 0), maxScriptArg) }

// errBadReply marks a script reply of the wrong shape: Redis answered, so
// it is a bug, not an outage.
var errBadReply = errors.New("unexpected script reply")

// unavailableReplies are the prefixes of the Redis error replies that say
// the server cannot serve now, whatever the command: it is loading its
// data, busy in a script, a replica (after a failover) or cut from its
// master, part of a cluster that is down or resharding, refusing writes for
// lack of memory, replicas or disk, or refusing this client (too many
// clients, authentication or ACL). Any other error reply comes from the
// command itself (a script error, a key of the wrong type): retrying it
// later would fail the same way.
var unavailableReplies = []string{
	"LOADING ", "BUSY ", "MASTERDOWN ", "CLUSTERDOWN ", "TRYAGAIN ", "READONLY ",
	"NOREPLICAS ", "MISCONF ", "OOM ", "MOVED ", "ASK ", "NOAUTH ", "WRONGPASS ", "NOPERM ",
	"ERR max number of clients reached",
}

// operationFault reports whether err, from a Redis call, blames the
// operation rather than Redis's availability: an error reply other than
// unavailableReplies, or a reply of the wrong shape. Network errors,
// timeouts, a closed client and the replies above are outages.
func operationFault(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, errBadReply) {
		return true
	}
	if errors.Is(err, ErrDataLost) {
		return false
	}
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	msg := re.Error()
	for _, p := range unavailableReplies {
		// Redis before 7 wraps an error raised inside a script as
		// "ERR Error running script ... -READONLY ...": look for the
		// original reply after a "-" too.
		if strings.HasPrefix(msg, p) || strings.HasPrefix(msg, "ERR Error running script") && strings.Contains(msg, "-"+p) {
			return false
		}
	}
	return true
}

// subjectKeys are one subject's key names; base prefixes the budget keys,
// whose window names the scripts take from Redis's clock.
type subjectKeys struct {
	base             string
	rpm, tpm, leases string
}

func (r *Redis) keys(s Subject) subjectKeys {
	base := "{" + r.prefix + s.Scope.String() + ":" + s.ID + "}:"
	return subjectKeys{base: base, rpm: base + "rpm", tpm: base + "tpm", leases: base + "leases"}
}

// limited reports whether a subject has any limit, i.e. whether Redis needs
// to hear about it.
func limited(l Limits) bool { return l.RPM > 0 || needsSettle(l) }

// needsSettle reports whether Settle has anything to correct for a subject: a
// TPM reservation, a concurrency slot or a budget. A request counts in RPM
// whatever its size, so an RPM-only subject is never settled. The scripts
// apply the same test to decide which subjects keep a lease set.
func needsSettle(l Limits) bool {
	return l.TPM > 0 || l.Concurrency > 0 || l.TokensPerDay > 0 ||
		l.CostPerDayMicros > 0 || l.CostPerMonthMicros > 0
}

// admitReply is admitScript's reply; times are µs.
type admitReply struct {
	allowed                bool
	now                    int64
	refused                Kind
	retry                  int64
	rpmD, tpmD             int64
	conc, tpd, cpd, cpm    int64
	dayLeft, monthLeft     int64
	hold                   hold
	tpdRes, cpdRes, cpmRes int64
}

// Admit implements Limiter. When several limits refuse, Decision.Refused is
// the one with the longest wait and RetryAfter is that wait, as for Local: a
// held budget's from the oldest live lease of the subject admitted in the
// window and the typical duration of the leases this replica settled. A
// Redis error is returned as is (wrapped): whether to admit then is the
// caller's policy.
//
// An error may come after Redis ran the admission (a read timeout while a
// slow Redis still works, a lost reply): it would then hold a concurrency
// slot until LeaseTTL and its TPM and budget reservations for good. So with
// the error, Admit returns Decision{Lease: attempted}, not Allowed: the lease
// id it sent, whenever some subject has a limit that Settle corrects. The
// caller must Settle it with zero usage (Failover queues that for replay);
// Redis then takes back whatever the admission reserved, except the RPM
// request, and does nothing if the admission never ran.
func (r *Redis) Admit(ctx context.Context, req Request) (Decision, error) {
	if r.closed.Load() {
		return Decision{}, ErrClosed
	}
	tokens, cost := scriptArg(req.Tokens), scriptArg(req.CostMicros)
	id, err := newLeaseID()
	if err != nil {
		return Decision{}, err
	}
	idx := make([]int, 0, len(req.Subjects)) // subjects Redis must see
	for i, s := range req.Subjects {
		if limited(s.Limits) {
			idx = append(idx, i)
		}
	}
	// The lease id is chosen here, before the call, so that an admission
	// whose reply is lost can still be undone.
	lease := &Lease{ID: id, Subjects: append([]Subject(nil), req.Subjects...), Tokens: tokens, CostMicros: cost}
	if len(idx) == 0 {
		lease.At = time.Now().UTC()
		return Decision{Allowed: true, Lease: lease}, nil
	}

	calls := make([]scriptCall, len(idx))
	typical := any(r.typical.get().Microseconds())
	genKey, gen := r.generationArgs()
	for j, i := range idx {
		s := req.Subjects[i]
		k := r.keys(s)
		l := s.Limits
		calls[j] = scriptCall{keys: []string{k.rpm, k.tpm, k.leases}, args: []any{
			l.RPM, l.TPM, l.Concurrency, l.TokensPerDay, l.CostPerDayMicros, l.CostPerMonthMicros,
			tokens, cost, id, r.ttlArg, k.base, r.concRetryArg,
			tpmReserve(tokens, l.TPM), typical, genKey, gen,
		}}
	}
	r.run(ctx, admitScript, calls)

	replies := make([]admitReply, len(idx))
	var firstErr error
	refusedAt := -1
	ranAll := true // every failed call ran nothing (a generation refusal)
	for j := range calls {
		if calls[j].err == nil {
			replies[j], calls[j].err = parseAdmit(calls[j].res)
		}
		if isGenerationReply(calls[j].err) {
			calls[j].err = ErrDataLost
			if firstErr == nil {
				firstErr = fmt.Errorf("ratelimit: redis admit: %w", ErrDataLost)
			}
			continue
		}
		if calls[j].err != nil {
			ranAll = false
			if firstErr == nil {
				firstErr = fmt.Errorf("ratelimit: redis admit: %w", calls[j].err)
			}
			continue
		}
		if !replies[j].allowed && (refusedAt < 0 || replies[j].retry > replies[refusedAt].retry) {
			refusedAt = j
		}
	}

	if firstErr != nil || refusedAt >= 0 {
		// Some subjects may have reserved while another refused or failed:
		// take their reservations back so that a refused request holds
		// nothing. This second round trip happens only on this path.
		var undo []scriptCall
		var undone []int
		for j, i := range idx {
			if calls[j].err != nil || !replies[j].allowed {
				continue
			}
			at := time.UnixMicro(replies[j].now).UTC()
			undo = append(undo, r.settleCall(req.Subjects[i], id, at, true,
				-tpmReserve(tokens, req.Subjects[i].Limits.TPM), 0, 0, replies[j].hold, true))
			undone = append(undone, j)
		}
		if len(undo) > 0 {
			r.run(ctx, settleScript, undo)
			for u, j := range undone {
				v, err := replyInts(undo[u].res, undo[u].err, 4)
				if err != nil {
					ranAll = false
					if firstErr == nil {
						firstErr = fmt.Errorf("ratelimit: redis undo reservation: %w", err)
					}
					continue
				}
				replies[j].rpmD, replies[j].tpmD = v[2], v[3]
				h := replies[j].hold
				replies[j].tpd, replies[j].cpd, replies[j].cpm = replies[j].tpd-h.tpd, replies[j].cpd-h.cpd, replies[j].cpm-h.cpm
			}
		}
		if firstErr != nil {
			if ranAll {
				// Refused for the generation: nothing reserved that the
				// undo above did not take back.
				return Decision{}, firstErr
			}
			// Subjects whose script ran but whose reply was lost keep their
			// reservation: the attempted lease undoes them.
			lease.At = time.Now().UTC()
			for _, i := range idx {
				if needsSettle(req.Subjects[i].Limits) {
					return Decision{Lease: lease}, firstErr
				}
			}
			return Decision{}, firstErr
		}
		rep := replies[refusedAt]
		states, budgets := r.states(req.Subjects, idx, replies)
		return Decision{
			Refused:    refusedState(req.Subjects[idx[refusedAt]], rep),
			RetryAfter: time.Duration(rep.retry) * time.Microsecond,
			States:     states,
			Budgets:    budgets,
		}, nil
	}

	lease.At = time.UnixMicro(replies[0].now).UTC()
	lease.holds = make([]hold, len(req.Subjects))
	for j, i := range idx {
		lease.holds[i] = replies[j].hold
	}
	states, budgets := r.states(req.Subjects, idx, replies)
	return Decision{Allowed: true, Lease: lease, States: states, Budgets: budgets}, nil
}

// Settle implements Limiter. tokens and costMicros are the real usage (so
// far, for a cancelled request). Rates are corrected on Redis's clock at the
// time of the call, budgets in the windows of l.At. ctx must not be the
// cancelled request's own context: a cancelled ctx fails the call.
//
// When Redis fails, the lease stays unsettled and Settle may be called again
// (Failover replays it): the script applies a lease's settlement only while
// the lease is in its subjects' lease sets, so a settlement that did reach
// Redis before the error is not applied twice. A lease is kept there for at
// least a day after its LeaseTTL; a Settle later than that may be ignored.
func (r *Redis) Settle(ctx context.Context, l *Lease, tokens, costMicros int64) error {
	if l == nil {
		return errors.New("ratelimit: settle of a nil lease")
	}
	if r.closed.Load() {
		return ErrClosed
	}
	if !l.settled.CompareAndSwap(false, true) {
		return nil
	}
	// The lease's estimates are clamped too, for a lease built elsewhere
	// (Admit's already are): they make the TPM delta and the unknown holds.
	tokens, costMicros = scriptArg(tokens), scriptArg(costMicros)
	estTokens, estCost := scriptArg(l.Tokens), scriptArg(l.CostMicros)
	var calls []scriptCall
	for i, s := range l.Subjects {
		lim := s.Limits
		if !needsSettle(lim) {
			continue
		}
		h, known := l.holdOf(i)
		if !known {
			h = hold{tpd: estTokens, cpd: estCost, cpm: estCost}
		}
		calls = append(calls, r.settleCall(s, l.ID, l.At, false,
			tokens-tpmReserve(estTokens, lim.TPM), tokens, costMicros, h, known))
	}
	if len(calls) == 0 {
		return nil
	}
	r.run(ctx, settleScript, calls)
	for _, c := range calls {
		if _, err := replyInts(c.res, c.err, 4); err != nil {
			l.settled.Store(false)
			return fmt.Errorf("ratelimit: redis settle: %w", err)
		}
	}
	// A settlement later than LeaseTTL (a replay after an outage) says
	// nothing about how long requests last.
	if d := time.Since(l.At); d >= 0 && d <= r.leaseTTL {
		r.typical.observe(d)
	}
	return nil
}

// settleCall builds a settleScript call for subject s of lease id admitted
// at at, whose budgets reserved h (known), or whose admission's reply never
// came (!known: h is then the unclamped estimate, and Redis knows better).
func (r *Redis) settleCall(s Subject, id string, at time.Time, refund bool, tpmDelta, tokens, cost int64, h hold, known bool) scriptCall {
	k := r.keys(s)
	day, dayLeft := dayWindow(at)
	month, monthLeft := monthWindow(at)
	l := s.Limits
	mode := 0
	switch {
	case !known:
		mode = 2
	case h.kept:
		mode = 1
	}
	refundArg := 0
	if refund {
		refundArg = 1
	}
	return scriptCall{
		keys: []string{k.rpm, k.tpm, k.leases, k.base + "tpd:" + day, k.base + "cpd:" + day, k.base + "cpm:" + month,
			k.base + "hold:" + id},
		args: []any{
			l.RPM, l.TPM, l.Concurrency, l.TokensPerDay, l.CostPerDayMicros, l.CostPerMonthMicros,
			tpmDelta, tokens, cost, h.tpd, h.cpd, h.cpm, id, refundArg,
			at.Add(dayLeft).UnixMilli(), at.Add(monthLeft).UnixMilli(),
			mode, k.base, r.leaseTTL.Microseconds(),
		},
	}
}

// Charger is a limiter that can be told about usage admitted elsewhere:
// Failover charges it with what its fallback admitted while it was down, so
// that its budgets count that usage too.
type Charger interface {
	// Charge adds tokens and costMicros to the budgets (tokens per day,
	// cost per day and per month) of every subject that has them, in the
	// windows holding at. It applies a charge id at most once, so that a
	// charge retried after an error is not counted twice.
	Charge(ctx context.Context, subjects []Subject, at time.Time, tokens, costMicros int64, id string) error
}

var _ Charger = (*Redis)(nil)

// chargeable reports whether charging tokens and costMicros to s changes
// any of its budgets.
func chargeable(s Subject, tokens, costMicros int64) bool {
	l := s.Limits
	return tokens > 0 && l.TokensPerDay > 0 || costMicros > 0 && (l.CostPerDayMicros > 0 || l.CostPerMonthMicros > 0)
}

// Charge implements Charger, in one round trip: a script per subject with
// budgets, pipelined. id must be unique per charge across replicas (Failover
// uses a random one) and the same when a charge is retried; Redis keeps it,
// per subject, as long as the counters it charged live. Rates are not
// charged: they refill within a minute. A charge whose windows' counters
// have expired (a day after the window ended) is ignored.
func (r *Redis) Charge(ctx context.Context, subjects []Subject, at time.Time, tokens, costMicros int64, id string) error {
	if r.closed.Load() {
		return ErrClosed
	}
	if id == "" {
		return errors.New("ratelimit: redis charge without an id")
	}
	tokens, costMicros = scriptArg(tokens), scriptArg(costMicros)
	day, dayLeft := dayWindow(at)
	month, monthLeft := monthWindow(at)
	var calls []scriptCall
	for _, s := range subjects {
		if !chargeable(s, tokens, costMicros) {
			continue
		}
		k := r.keys(s)
		l := s.Limits
		calls = append(calls, scriptCall{
			keys: []string{k.base + "tpd:" + day, k.base + "cpd:" + day, k.base + "cpm:" + month, k.base + "charge:" + id},
			args: []any{l.TokensPerDay, l.CostPerDayMicros, l.CostPerMonthMicros, tokens, costMicros,
				at.Add(dayLeft).UnixMilli(), at.Add(monthLeft).UnixMilli()},
		})
	}
	if len(calls) == 0 {
		return nil
	}
	r.run(ctx, chargeScript, calls)
	for _, c := range calls {
		if c.err != nil {
			return fmt.Errorf("ratelimit: redis charge: %w", c.err)
		}
		if _, ok := c.res.(int64); !ok {
			return fmt.Errorf("ratelimit: redis charge: %w %T", errBadReply, c.res)
		}
	}
	return nil
}

// RaiseTo raises the budgets of s (the windows s.Limits has) holding at to
// at least dayTokens and dayCostMicros for the day and monthCostMicros for
// the month, as a ledger says they were used: a counter already past its
// figure is left alone, so raising twice, or from two replicas, raises
// once. It tells a budget that a reload added what was spent before it.
func (r *Redis) RaiseTo(ctx context.Context, s Subject, at time.Time, dayTokens, dayCostMicros, monthCostMicros int64) error {
	if r.closed.Load() {
		return ErrClosed
	}
	l := s.Limits
	if !l.HasBudget() {
		return nil
	}
	day, dayLeft := dayWindow(at)
	month, monthLeft := monthWindow(at)
	k := r.keys(s)
	calls := []scriptCall{{
		keys: []string{k.base + "tpd:" + day, k.base + "cpd:" + day, k.base + "cpm:" + month},
		args: []any{l.TokensPerDay, l.CostPerDayMicros, l.CostPerMonthMicros, scriptArg(dayTokens), scriptArg(dayCostMicros),
			scriptArg(monthCostMicros), at.Add(dayLeft).UnixMilli(), at.Add(monthLeft).UnixMilli()},
	}}
	r.run(ctx, raiseScript, calls)
	if calls[0].err != nil {
		return fmt.Errorf("ratelimit: redis raise: %w", calls[0].err)
	}
	return nil
}

// Peek implements Limiter: one State per non-zero limit of each subject, in
// Kind order, as for Local. It reserves nothing.
func (r *Redis) Peek(ctx context.Context, subjects []Subject) ([]State, error) {
	if r.closed.Load() {
		return nil, ErrClosed
	}
	var calls []scriptCall
	var idx []int
	for i, s := range subjects {
		if !limited(s.Limits) {
			continue
		}
		k := r.keys(s)
		calls = append(calls, scriptCall{keys: []string{k.rpm, k.tpm, k.leases}, args: []any{k.base}})
		idx = append(idx, i)
	}
	if len(calls) == 0 {
		return nil, nil
	}
	r.run(ctx, peekScript, calls)
	var out []State
	for j, c := range calls {
		v, err := replyInts(c.res, c.err, 12)
		if err != nil {
			return nil, fmt.Errorf("ratelimit: redis peek: %w", err)
		}
		s, lim := subjects[idx[j]], subjects[idx[j]].Limits
		if lim.RPM > 0 {
			out = append(out, rateStateMicros(s, KindRPM, v[1]))
		}
		if lim.TPM > 0 {
			out = append(out, rateStateMicros(s, KindTPM, v[2]))
		}
		if lim.Concurrency > 0 {
			out = append(out, State{Scope: s.Scope, ID: s.ID, Kind: KindConcurrency,
				Limit: lim.Concurrency, Used: v[3], Remaining: max(lim.Concurrency-v[3], 0)})
		}
		dayLeft, monthLeft := time.Duration(v[7])*time.Microsecond, time.Duration(v[8])*time.Microsecond
		if lim.TokensPerDay > 0 {
			out = append(out, budgetState(s, KindTokensPerDay, v[4], v[9], dayLeft))
		}
		if lim.CostPerDayMicros > 0 {
			out = append(out, budgetState(s, KindCostPerDay, v[5], v[10], dayLeft))
		}
		if lim.CostPerMonthMicros > 0 {
			out = append(out, budgetState(s, KindCostPerMonth, v[6], v[11], monthLeft))
		}
	}
	return out, nil
}

// Close implements Limiter. It does not close the client, which the caller
// owns.
func (r *Redis) Close() error {
	r.closed.Store(true)
	return nil
}

// scriptCall is one script invocation and its outcome.
type scriptCall struct {
	keys []string
	args []any
	res  any
	err  error
}

// run executes calls of one script in one round trip: EVALSHA, in a
// pipeline when there are several. The calls that meet NOSCRIPT (a restarted
// or flushed Redis, or a Cluster node not yet warmed) are sent again with
// EVAL, which carries the source; the others are not, since they ran.
//
// Each command is sent once (onceCmd): a ClusterClient would otherwise send a
// command again after a timeout or a broken connection, up to MaxRedirects
// times whatever MaxRetries says, and an admission that Redis ran before its
// reply was lost would then reserve twice while its lease undoes one. What
// follows an error is the caller's (Failover's) decision. Redirections
// (MOVED, ASK) are still followed: Redis ran nothing then.
func (r *Redis) run(ctx context.Context, sc script, calls []scriptCall) {
	r.send(ctx, sc, calls, false)
	// A ClusterClient learns of a new layout (a replica promoted, slots
	// moved) from the redirections its commands meet. A command sent once
	// to a dead master meets none, and the client would wait for its
	// periodic reload (a minute) before it sent anything elsewhere: reload
	// now, in the background, after a failure that is not Redis's reply.
	if cc, ok := r.client.(*redis.ClusterClient); ok && slices.ContainsFunc(calls, unanswered) {
		cc.ReloadState(ctx)
	}
	var missing []scriptCall
	var at []int
	for i := range calls {
		if isNoScript(calls[i].err) {
			missing = append(missing, calls[i])
			at = append(at, i)
		}
	}
	if len(missing) == 0 {
		return
	}
	r.send(ctx, sc, missing, true)
	for j, i := range at {
		calls[i] = missing[j]
	}
}

// send sends calls of sc once each, with EVAL when eval is set, else
// EVALSHA, and records their outcomes.
func (r *Redis) send(ctx context.Context, sc script, calls []scriptCall, eval bool) {
	cmds := make([]onceCmd, len(calls))
	for i, c := range calls {
		args := make([]any, 0, 3+len(c.keys)+len(c.args))
		if eval {
			args = append(args, "eval", sc.src)
		} else {
			args = append(args, "evalsha", sc.Hash())
		}
		args = append(args, len(c.keys))
		for _, k := range c.keys {
			args = append(args, k)
		}
		cmds[i] = onceCmd{redis.NewCmd(ctx, append(args, c.args...)...)}
	}
	if len(cmds) == 1 {
		_ = r.client.Process(ctx, cmds[0])
	} else {
		// Pipelined's error is the first command's error; each is read below.
		_, _ = r.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, c := range cmds {
				_ = p.Process(ctx, c)
			}
			return nil
		})
	}
	for i := range calls {
		calls[i].res, calls[i].err = cmds[i].Result()
	}
}

// unanswered reports whether c failed without a reply from Redis (a
// network error, a timeout), unless the caller gave up.
func unanswered(c scriptCall) bool {
	var re redis.Error
	return c.err != nil && !errors.As(c.err, &re) &&
		!errors.Is(c.err, context.Canceled) && !errors.Is(c.err, context.DeadlineExceeded)
}

// onceCmd is a command that go-redis sends at most once (see run).
type onceCmd struct{ *redis.Cmd }

// NoRetry implements redis.Cmder.
func (onceCmd) NoRetry() bool { return true }

func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}

// replyInts checks that a script reply is an array of n integers.
func replyInts(res any, err error, n int) ([]int64, error) {
	if err != nil {
		return nil, err
	}
	arr, ok := res.([]any)
	if !ok || len(arr) != n {
		return nil, fmt.Errorf("%w %T of %d values, want %d", errBadReply, res, len(arr), n)
	}
	out := make([]int64, n)
	for i, x := range arr {
		v, ok := x.(int64)
		if !ok {
			return nil, fmt.Errorf("%w: value %d is %T, want int64", errBadReply, i, x)
		}
		out[i] = v
	}
	return out, nil
}

func parseAdmit(res any) (admitReply, error) {
	v, err := replyInts(res, nil, 19)
	if err != nil {
		return admitReply{}, err
	}
	rep := admitReply{
		allowed: v[0] == 1, now: v[1], retry: v[3], rpmD: v[4], tpmD: v[5],
		conc: v[6], tpd: v[7], cpd: v[8], cpm: v[9], dayLeft: v[10], monthLeft: v[11],
		hold:   hold{tpd: v[12], cpd: v[13], cpm: v[14], kept: v[15] == 1},
		tpdRes: v[16], cpdRes: v[17], cpmRes: v[18],
	}
	if !rep.allowed {
		if v[2] < int64(KindRPM) || v[2] > int64(KindCostPerMonth) {
			return admitReply{}, fmt.Errorf("%w: refused kind %d", errBadReply, v[2])
		}
		rep.refused = Kind(v[2])
	}
	return rep, nil
}

// states lists the RPM and TPM states of every subject with such limits,
// then the states of its budgets, in request order, in one allocation.
func (r *Redis) states(subjects []Subject, idx []int, replies []admitReply) (rates, budgets []State) {
	nr, nb := 0, 0
	for _, i := range idx {
		l := subjects[i].Limits
		nr += b2i(l.RPM > 0) + b2i(l.TPM > 0)
		nb += b2i(l.TokensPerDay > 0) + b2i(l.CostPerDayMicros > 0) + b2i(l.CostPerMonthMicros > 0)
	}
	if nr+nb == 0 {
		return nil, nil
	}
	out := make([]State, 0, nr+nb)
	for j, i := range idx {
		s := subjects[i]
		if s.Limits.RPM > 0 {
			out = append(out, rateStateMicros(s, KindRPM, replies[j].rpmD))
		}
		if s.Limits.TPM > 0 {
			out = append(out, rateStateMicros(s, KindTPM, replies[j].tpmD))
		}
	}
	for j, i := range idx {
		s, rep := subjects[i], &replies[j]
		if s.Limits.TokensPerDay > 0 {
			out = append(out, budgetState(s, KindTokensPerDay, rep.tpd, rep.tpdRes, time.Duration(rep.dayLeft)*time.Microsecond))
		}
		if s.Limits.CostPerDayMicros > 0 {
			out = append(out, budgetState(s, KindCostPerDay, rep.cpd, rep.cpdRes, time.Duration(rep.dayLeft)*time.Microsecond))
		}
		if s.Limits.CostPerMonthMicros > 0 {
			out = append(out, budgetState(s, KindCostPerMonth, rep.cpm, rep.cpmRes, time.Duration(rep.monthLeft)*time.Microsecond))
		}
	}
	if nr == 0 {
		return nil, out
	}
	return out[:nr:nr], out[nr:]
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// refusedState is the state of the limit that refused s.
func refusedState(s Subject, rep admitReply) State {
	lim := s.Limits
	switch rep.refused {
	case KindRPM:
		return rateStateMicros(s, KindRPM, rep.rpmD)
	case KindTPM:
		return rateStateMicros(s, KindTPM, rep.tpmD)
	case KindConcurrency:
		return State{Scope: s.Scope, ID: s.ID, Kind: KindConcurrency, Limit: lim.Concurrency, Used: rep.conc}
	case KindTokensPerDay:
		return budgetState(s, KindTokensPerDay, rep.tpd, rep.tpdRes, time.Duration(rep.dayLeft)*time.Microsecond)
	case KindCostPerDay:
		return budgetState(s, KindCostPerDay, rep.cpd, rep.cpdRes, time.Duration(rep.dayLeft)*time.Microsecond)
	default:
		return budgetState(s, KindCostPerMonth, rep.cpm, rep.cpmRes, time.Duration(rep.monthLeft)*time.Microsecond)
	}
}

// rateStateMicros reports a bucket whose TAT is d µs ahead of now, with
// gcra.go's rateState.
func rateStateMicros(s Subject, k Kind, d int64) State {
	limit := s.Limits.Get(k)
	used, rem, reset := rateState(d*int64(time.Microsecond), 0, limit)
	return State{Scope: s.Scope, ID: s.ID, Kind: k, Limit: limit, Used: used, Remaining: rem, Reset: reset}
}

// newLeaseID returns 16 random bytes in hex: lease ids of every replica meet
// in one concurrency set, so they must not collide.
func newLeaseID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("ratelimit: lease id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}
