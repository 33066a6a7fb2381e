package spend

import (
	"context"
	"errors"
)

// Mirrored is a shared ledger (Redis) with this replica's own part of it
// beside (a Local): every Add goes to both. Query reads the shared ledger;
// QueryOwn reads the replica's part, which is what it can still tell while
// the shared ledger cannot be read. The own part costs one more map update
// per Add.
type Mirrored struct {
	Shared Ledger
	Own    *Local
}

var _ Ledger = (*Mirrored)(nil)

// OwnQuerier is a ledger that can answer from this replica's own part of a
// shared ledger, which is partial: the spend of the other replicas, and of
// this one before its own part began, is missing.
type OwnQuerier interface {
	QueryOwn(ctx context.Context, f Filter) ([]Row, error)
}

// Add implements Ledger.
func (m *Mirrored) Add(k Key, t Totals) {
	m.Shared.Add(k, t)
	m.Own.Add(k, t)
}

// Query implements Ledger: the shared ledger's rows.
func (m *Mirrored) Query(ctx context.Context, f Filter) ([]Row, error) { return m.Shared.Query(ctx, f) }

// QueryOwn returns this replica's own rows.
func (m *Mirrored) QueryOwn(ctx context.Context, f Filter) ([]Row, error) { return m.Own.Query(ctx, f) }

// Flush implements Ledger: both parts, the own one even when the shared
// one fails.
func (m *Mirrored) Flush(ctx context.Context) error {
	return errors.Join(m.Shared.Flush(ctx), m.Own.Flush(ctx))
}

// Close implements Ledger: both parts.
func (m *Mirrored) Close() error { return errors.Join(m.Shared.Close(), m.Own.Close()) }
