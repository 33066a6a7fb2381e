// Package ownership records which principal (a team, or a key without a
// team) created each stored upstream object, such as a Responses API
// response ("resp_…") or a conversation ("conv_…"). When every gateway key
// shares one upstream account, anyone holding such an id could read, chain
// onto or delete it; the proxy claims each new id for the principal whose
// request created it and lets only that principal name it afterwards.
//
// Two stores implement Store: Local keeps the record in the process, with
// a journal file so that it survives a restart, and Redis shares it between
// replicas.
package ownership

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// Store records which principal created each stored upstream object.
type Store interface {
	// Claim records owner as id's owner for ttl (ttl <= 0: until released), unless
	// a live record names another owner. It returns the owner recorded afterwards:
	// owner itself when the claim took (or was already its), else the other one.
	// Claiming again as the same owner renews the ttl.
	Claim(ctx context.Context, id, owner string, ttl time.Duration) (holder string, err error)
	// Owner returns id's owner, "" when none is recorded (never claimed, released, or expired).
	Owner(ctx context.Context, id string) (string, error)
	// Release forgets id if owner holds it.
	Release(ctx context.Context, id, owner string) error
	// Close releases the store's resources (the local one writes and closes its file).
	Close() error
}

// MaxLen is the longest id or owner, in bytes, a store accepts.
const MaxLen = 512

// ErrInvalid is wrapped by the error every method returns for an id or an
// owner it refuses: empty, longer than MaxLen, holding a control character
// (below 0x20, or 0x7f) or not valid UTF-8. Ids come from upstream JSON, so
// the caller can tell a bad id (refuse the request) from a store that
// failed (retry, or answer 503).
var ErrInvalid = errors.New("ownership: invalid id or owner")

// checkID and checkOwner refuse what the stores do not keep. Invalid UTF-8
// is refused too: the journal is JSON, which cannot carry it unchanged, so
// a reloaded id would differ from the one claimed.
func checkID(id string) error       { return check("id", id) }
func checkOwner(owner string) error { return check("owner", owner) }

func check(what, s string) error {
	if s == "" {
		return fmt.Errorf("%w: empty %s", ErrInvalid, what)
	}
	if len(s) > MaxLen {
		return fmt.Errorf("%w: %s longer than %d bytes", ErrInvalid, what, MaxLen)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == 0x7f {
			return fmt.Errorf("%w: %s holds a control character", ErrInvalid, what)
		}
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalid, what)
	}
	return nil
}
