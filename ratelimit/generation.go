package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// A Redis that restarts without persistence comes back empty: every rate
// bucket full, every budget unspent, until the replicas have refilled what
// they know (the spend ledger's own parts, the budgets charged from them,
// and the rate buckets from each replica's fallback). An admission decided
// on it in between admits what the limits had refused. So the admit script
// first compares the generation of Redis's data (a key the spend ledger
// writes, RedisOptions.GenerationKey) with the one the limiter was told is
// whole (SetGeneration), and decides nothing when they differ: Admit
// returns ErrDataLost, and a Failover admits on its fallback, as in an
// outage, until the generation it expects is Redis's again.

// ErrDataLost is Redis.Admit's error when Redis's data is not of the
// generation the limiter expects: Redis lost its data since (or has not
// been refilled yet). The script admitted nothing.
var ErrDataLost = errors.New("ratelimit: Redis's data is not the generation the limits were kept in; the replicas are refilling it")

// errGenerationReply starts the admit script's refusal to decide on data
// of another generation.
const errGenerationReply = "TOLLGATE_GENERATION"

// isGenerationReply reports whether err is the admit script's refusal.
func isGenerationReply(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), errGenerationReply)
}

// SetGeneration tells the limiter which generation of Redis's data holds
// whole limits: admissions are decided on Redis only while its generation
// key holds gen. The spend ledger calls it once the fleet has refilled a
// Redis that lost its data (and when it first learns the generation).
// Empty, or without RedisOptions.GenerationKey, nothing is checked.
func (r *Redis) SetGeneration(gen string) { r.gen.Store(&gen) }

// generationArgs are the admit script's last two arguments: the generation
// key and the generation expected, both empty when nothing is checked.
func (r *Redis) generationArgs() (key, gen string) {
	if r.genKey == "" {
		return "", ""
	}
	if g := r.gen.Load(); g != nil && *g != "" {
		return r.genKey, *g
	}
	return "", ""
}

// RateFloor is what a replica's fallback holds of one subject's rate
// buckets: the time until each is full again. Redis's buckets are raised
// to it when the primary returns, so that what the fallback admitted
// counts there too, and a Redis that came back empty starts where the
// fleet stood rather than full.
type RateFloor struct {
	Subject Subject
	RPMFull time.Duration // until the RPM bucket is full; 0: full or none
	TPMFull time.Duration
}

// RateRaiser is a limiter whose rate buckets can be raised to floors: a
// Failover does it with its fallback's state before it admits on the
// primary again.
type RateRaiser interface {
	// RaiseRates empties each subject's RPM and TPM bucket to at least its
	// floor (the bucket full no sooner than the floor says), leaving a
	// bucket already emptier alone, so that raising twice, or from every
	// replica, raises once.
	RaiseRates(ctx context.Context, floors []RateFloor) error
}

var _ RateRaiser = (*Redis)(nil)

// RaiseRates implements RateRaiser: one script per subject, pipelined, on
// Redis's clock.
func (r *Redis) RaiseRates(ctx context.Context, floors []RateFloor) error {
	if r.closed.Load() {
		return ErrClosed
	}
	var calls []scriptCall
	for _, f := range floors {
		if !limited(f.Subject.Limits) {
			continue
		}
		l := f.Subject.Limits
		rpm := f.RPMFull.Microseconds()
		tpm := f.TPMFull.Microseconds()
		if l.RPM <= 0 {
			rpm = 0
		}
		if l.TPM <= 0 {
			tpm = 0
		}
		if rpm <= 0 && tpm <= 0 {
			continue
		}
		k := r.keys(f.Subject)
		calls = append(calls, scriptCall{keys: []string{k.rpm, k.tpm}, args: []any{rpm, tpm}})
	}
	for len(calls) > 0 {
		n := min(len(calls), 500)
		r.run(ctx, raiseRatesScript, calls[:n])
		for _, c := range calls[:n] {
			if c.err != nil {
				return fmt.Errorf("ratelimit: redis raise rates: %w", c.err)
			}
		}
		calls = calls[n:]
	}
	return nil
}

// rateFloors returns the floors of the subjects in subjects (whole limits)
// from l's state: the time until each share bucket is full again, which is
// the same for the fleet's bucket (see share.go).
func (l *Local) rateFloors(subjects []Subject) []RateFloor {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	now := l.now().UnixNano()
	out := make([]RateFloor, 0, len(subjects))
	for _, s := range subjects {
		e := l.subjects[subjectKey{s.Scope, s.ID}]
		if e == nil {
			continue
		}
		f := RateFloor{Subject: s, RPMFull: time.Duration(max(e.rpmTAT-now, 0)), TPMFull: time.Duration(max(e.tpmTAT-now, 0))}
		if f.RPMFull > 0 || f.TPMFull > 0 {
			out = append(out, f)
		}
	}
	return out
}
