package ratelimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/tollgate-llm/tollgate/internal/atomicfile"
)

// spillVersion is the version of the spill file format.
const spillVersion = 1

// spillFile is the JSON form of FailoverOptions.SpillFile: the operations a
// Failover still had queued for its primary when it closed. Each carries
// what its replay needs to be applied once, by whichever process replays
// it and however often: a settlement or undo its lease id (Redis applies a
// lease's settlement only while the lease is in its subjects' lease sets),
// a charge its charge id (Redis keeps a marker per charge id as long as the
// counters it charged). So a file replayed, then left behind by a crash
// before its removal, is harmless when replayed again.
type spillFile struct {
	Version int       `json:"version"`
	SavedAt time.Time `json:"saved_at"`
	Ops     []spillOp `json:"ops"`
}

type spillOp struct {
	// Kind is "settle", "undo" or "charge" (opKind's names).
	Kind string `json:"kind"`
	// LeaseID is the lease settled or undone; for a charge, the fallback's
	// lease (informative only, possibly empty).
	LeaseID string `json:"lease_id,omitempty"`
	// ChargeID is a charge's own id, empty for the other kinds.
	ChargeID string         `json:"charge_id,omitempty"`
	Subjects []spillSubject `json:"subjects"`
	// At is the admission time, whose windows the budgets are settled in.
	At time.Time `json:"at"`
	// EstimateTokens and EstimateCostMicros are the lease's estimates, from
	// which its TPM reservation (and unknown budget holds) are derived.
	EstimateTokens     int64 `json:"estimate_tokens"`
	EstimateCostMicros int64 `json:"estimate_cost_micros"`
	// Holds are the lease's budget reservations per subject, absent when
	// unknown (an undo).
	Holds []spillHold `json:"holds,omitempty"`
	// Tokens and CostMicros are the usage to settle or charge.
	Tokens     int64 `json:"tokens"`
	CostMicros int64 `json:"cost_micros"`
}

type spillSubject struct {
	Scope  string      `json:"scope"`
	ID     string      `json:"id"`
	Limits spillLimits `json:"limits"`
}

// spillLimits is Limits with JSON names (convertible both ways).
type spillLimits struct {
	RPM                int64 `json:"rpm,omitempty"`
	TPM                int64 `json:"tpm,omitempty"`
	Concurrency        int64 `json:"concurrency,omitempty"`
	TokensPerDay       int64 `json:"tokens_per_day,omitempty"`
	CostPerDayMicros   int64 `json:"cost_per_day_micros,omitempty"`
	CostPerMonthMicros int64 `json:"cost_per_month_micros,omitempty"`
}

type spillHold struct {
	TokensPerDay int64 `json:"tokens_per_day"`
	CostPerDay   int64 `json:"cost_per_day"`
	CostPerMonth int64 `json:"cost_per_month"`
	Kept         bool  `json:"kept"`
}

// toSpillOp is p's JSON form.
func toSpillOp(p pendingOp) spillOp {
	l := p.lease
	o := spillOp{Kind: p.kind.String(), LeaseID: l.ID, ChargeID: p.chargeID, At: l.At.UTC(),
		EstimateTokens: l.Tokens, EstimateCostMicros: l.CostMicros, Tokens: p.tokens, CostMicros: p.costMicros,
		Subjects: make([]spillSubject, len(l.Subjects))}
	for i, s := range l.fleetSubjects() {
		o.Subjects[i] = spillSubject{Scope: s.Scope.String(), ID: s.ID, Limits: spillLimits(s.Limits)}
	}
	if p.kind == opSettle && len(l.holds) == len(l.Subjects) {
		o.Holds = make([]spillHold, len(l.holds))
		for i, h := range l.holds {
			o.Holds[i] = spillHold{TokensPerDay: h.tpd, CostPerDay: h.cpd, CostPerMonth: h.cpm, Kept: h.kept}
		}
	}
	return o
}

// pendingOps checks sf and returns its operations to queue, their leases
// issued by primary.
func (sf *spillFile) pendingOps(primary Limiter) ([]pendingOp, error) {
	if len(sf.Ops) == 0 {
		return nil, errors.New("no operations")
	}
	charges := make(map[string]bool)
	ops := make([]pendingOp, len(sf.Ops))
	for i, o := range sf.Ops {
		p, err := o.pendingOp(primary)
		if err != nil {
			return nil, fmt.Errorf("operation %d: %w", i, err)
		}
		if p.kind == opCharge {
			// A repeated id would be skipped as already applied: its usage lost.
			if charges[p.chargeID] {
				return nil, fmt.Errorf("operation %d: repeated charge id %q", i, p.chargeID)
			}
			charges[p.chargeID] = true
		}
		ops[i] = p
	}
	return ops, nil
}

func (o spillOp) pendingOp(primary Limiter) (pendingOp, error) {
	var kind opKind
	switch o.Kind {
	case "settle":
		kind = opSettle
	case "undo":
		kind = opUndo
	case "charge":
		kind = opCharge
	default:
		return pendingOp{}, fmt.Errorf("unknown kind %q", o.Kind)
	}
	switch {
	case kind != opCharge && o.LeaseID == "":
		return pendingOp{}, errors.New("no lease id")
	case (kind == opCharge) != (o.ChargeID != ""):
		return pendingOp{}, fmt.Errorf("a %s with charge id %q", o.Kind, o.ChargeID)
	case len(o.Subjects) == 0:
		return pendingOp{}, errors.New("no subjects")
	case o.At.IsZero():
		return pendingOp{}, errors.New("no admission time")
	case o.Tokens < 0 || o.CostMicros < 0 || o.EstimateTokens < 0 || o.EstimateCostMicros < 0:
		return pendingOp{}, errors.New("negative tokens or cost")
	case kind == opUndo && (o.Tokens != 0 || o.CostMicros != 0):
		return pendingOp{}, errors.New("an undo with usage")
	case o.Holds != nil && (kind != opSettle || len(o.Holds) != len(o.Subjects)):
		return pendingOp{}, fmt.Errorf("%d holds for a %s of %d subjects", len(o.Holds), o.Kind, len(o.Subjects))
	}
	l := &Lease{ID: o.LeaseID, Tokens: o.EstimateTokens, CostMicros: o.EstimateCostMicros, At: o.At.UTC(),
		Subjects: make([]Subject, len(o.Subjects))}
	for i, s := range o.Subjects {
		var scope Scope
		switch s.Scope {
		case "key":
			scope = ScopeKey
		case "team":
			scope = ScopeTeam
		default:
			return pendingOp{}, fmt.Errorf("subject %d: unknown scope %q", i, s.Scope)
		}
		lim := Limits(s.Limits)
		if s.ID == "" || min(lim.RPM, lim.TPM, lim.Concurrency, lim.TokensPerDay, lim.CostPerDayMicros, lim.CostPerMonthMicros) < 0 {
			return pendingOp{}, fmt.Errorf("subject %d: empty id or negative limit", i)
		}
		l.Subjects[i] = Subject{Scope: scope, ID: s.ID, Limits: lim}
	}
	if o.Holds != nil {
		l.holds = make([]hold, len(o.Holds))
		for i, h := range o.Holds {
			if min(h.TokensPerDay, h.CostPerDay, h.CostPerMonth) < 0 {
				return pendingOp{}, fmt.Errorf("hold %d: negative", i)
			}
			l.holds[i] = hold{tpd: h.TokensPerDay, cpd: h.CostPerDay, cpm: h.CostPerMonth, kept: h.Kept}
		}
	}
	if kind != opCharge {
		l.issuer = primary
	}
	return pendingOp{kind: kind, lease: l, tokens: o.Tokens, costMicros: o.CostMicros,
		chargeID: o.ChargeID, spilled: true}, nil
}

// readSpill reads the spill file name; a missing file is nil. A file that
// does not parse strictly, or of another version, is an error.
func readSpill(name string) (*spillFile, error) {
	var sf spillFile
	if found, err := atomicfile.ReadJSON("ratelimit", "spill file", name, &sf); !found || err != nil {
		return nil, err
	}
	if sf.Version != spillVersion {
		return nil, fmt.Errorf("ratelimit: spill file %s has version %d, want %d", name, sf.Version, spillVersion)
	}
	return &sf, nil
}

// writeSpill replaces the spill file name with ops.
func writeSpill(name string, ops []pendingOp) error {
	sf := spillFile{Version: spillVersion, SavedAt: time.Now().UTC(), Ops: make([]spillOp, len(ops))}
	for i, p := range ops {
		sf.Ops[i] = toSpillOp(p)
	}
	data, err := json.MarshalIndent(sf, "", " ")
	if err != nil {
		return fmt.Errorf("ratelimit: encoding spill file: %w", err)
	}
	return writeAtomic("spill file", name, append(data, '\n'))
}

// spill empties the queue at Close: into the spill file, or dropped
// without one. With nothing queued, it removes a spill file whose
// operations are all applied but whose removal failed.
func (f *Failover) spill() error {
	f.mu.Lock()
	ops := f.pending
	f.pending = nil
	f.pendingN.Store(0)
	onDisk := f.spillOnDisk
	f.mu.Unlock()
	n := len(ops)
	switch {
	case n == 0 && onDisk:
		return f.removeSpill()
	case n == 0:
		return nil
	case f.spillFile == "":
		f.mu.Lock()
		f.dropped += uint64(n)
		f.mu.Unlock()
		f.log.Warn("ratelimit: settlements dropped at close, the primary never took them", "count", n)
		return nil
	}
	if err := writeSpill(f.spillFile, ops); err != nil {
		f.mu.Lock()
		f.dropped += uint64(n)
		f.mu.Unlock()
		f.log.Error("ratelimit: settlements dropped at close, the spill file cannot be written", "count", n, "err", err)
		return err
	}
	f.mu.Lock()
	f.spillOnDisk, f.spillLeft = true, n
	f.mu.Unlock()
	f.log.Warn("ratelimit: settlements the primary never took are in the spill file; the next start replays them",
		"spill_file", f.spillFile, "count", n)
	return nil
}

// doneLocked records that p left the queue for good (applied or dropped)
// and reports whether the spill file is now to be removed (by the caller,
// with removeSpill, without mu).
func (f *Failover) doneLocked(p pendingOp) bool {
	if !p.spilled {
		return false
	}
	f.spillLeft--
	if f.spillLeft > 0 || !f.spillOnDisk {
		return false
	}
	f.spillOnDisk = false // this caller removes it
	return true
}

// removeSpill removes the spill file, whose operations are all done. If it
// cannot, the file stays marked on disk, so that Close tries again; were it
// left behind, the next start would replay operations Redis already applied,
// which changes nothing.
func (f *Failover) removeSpill() error {
	if err := os.Remove(f.spillFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
		f.mu.Lock()
		f.spillOnDisk = true
		f.mu.Unlock()
		err = fmt.Errorf("ratelimit: removing spill file %s, whose operations are all applied: %w", f.spillFile, err)
		f.log.Error("ratelimit: cannot remove the spill file", "err", err)
		return err
	}
	f.log.Info("ratelimit: the spill file's operations are applied; spill file removed", "spill_file", f.spillFile)
	return nil
}

// writeAtomic replaces name, a file described as what in errors, with data
// (atomicfile.Write: a crash leaves the old file or the new one).
func writeAtomic(what, name string, data []byte) error {
	if err := atomicfile.Write(name, data); err != nil {
		return fmt.Errorf("ratelimit: writing %s %s: %w", what, name, err)
	}
	return nil
}
