package ownership

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/tollgate-llm/tollgate/internal/atomicfile"
	"github.com/tollgate-llm/tollgate/internal/jsonl"
)

// The journal is JSON lines, one per change, appended in order; the last
// line for an id wins:
//
//	{"id":"resp_1","owner":"team:a","exp":1767225600}  claim; exp in unix seconds, 0 = none
//	{"id":"resp_1","rel":true}                         release
const maxLine = 64 << 10 // far above the longest line written (about 2 KiB)

// journalLine is the JSON form of one journal line.
type journalLine struct {
	ID    string `json:"id"`
	Owner string `json:"owner"`
	Exp   int64  `json:"exp"`
	Rel   bool   `json:"rel"`
}

// appendClaimLine appends the journal line recording owner as id's owner
// until expNanos (unix nanoseconds, 0 = none).
func appendClaimLine(b []byte, id, owner string, expNanos int64) []byte {
	b = append(b, `{"id":`...)
	b = jsonl.AppendString(b, id)
	b = append(b, `,"owner":`...)
	b = jsonl.AppendString(b, owner)
	b = append(b, `,"exp":`...)
	b = strconv.AppendInt(b, journalExp(expNanos), 10)
	return append(b, "}\n"...)
}

// appendReleaseLine appends the journal line forgetting id.
func appendReleaseLine(b []byte, id string) []byte {
	b = append(b, `{"id":`...)
	b = jsonl.AppendString(b, id)
	return append(b, `,"rel":true}`+"\n"...)
}

// journalExp is the journal's expiry for expNanos: unix seconds rounded up,
// so a reloaded record never ends earlier than it did (it may end up to a
// second later); 0 stays 0 (no expiry).
func journalExp(expNanos int64) int64 {
	if expNanos <= 0 {
		return 0
	}
	s := expNanos / 1e9
	if expNanos%1e9 != 0 {
		s++
	}
	return s
}

// nanosFromJournal is the in-memory expiry of a journal's exp.
func nanosFromJournal(sec int64) int64 {
	if sec > math.MaxInt64/int64(time.Second) {
		return math.MaxInt64
	}
	return sec * int64(time.Second)
}

// parseLine decodes and checks one journal line, newline included.
func parseLine(line []byte) (journalLine, error) {
	var e journalLine
	if err := atomicfile.DecodeJSON(line, &e); err != nil {
		return e, err
	}
	if err := checkID(e.ID); err != nil {
		return e, err
	}
	if e.Rel {
		if e.Owner != "" || e.Exp != 0 {
			return e, errors.New("a release line with an owner or an expiry")
		}
		return e, nil
	}
	if err := checkOwner(e.Owner); err != nil {
		return e, err
	}
	if e.Exp < 0 {
		return e, errors.New("a negative expiry")
	}
	return e, nil
}

// loadJournal reads file into recs; the last line for an id wins. A
// missing file is an empty journal. A torn last line, the trace of a crash
// in the middle of a write (no trailing newline, or a final line that does
// not decode), is ignored with a warning; any other line that does not
// decode is an error, so a damaged journal is never silently reset. Expired
// records are kept here; the caller drops them.
func (l *Local) loadJournal() error {
	res, err := jsonl.Read(l.file, maxLine, func(line []byte) error {
		e, err := parseLine(line)
		if err != nil {
			return err
		}
		if e.Rel {
			delete(l.recs, e.ID)
			return nil
		}
		l.recs[e.ID] = record{owner: l.intern(e.Owner), exp: nanosFromJournal(e.Exp)}
		return nil
	})
	if err != nil {
		return fmt.Errorf("ownership: %w", err)
	}
	if t := res.Torn; t != nil {
		if t.Err == nil {
			l.log.Warn("ownership: ignoring the torn last line of the journal (no trailing newline)",
				"file", l.file, "line", t.Line, "bytes", t.Bytes)
		} else {
			l.log.Warn("ownership: ignoring the torn last line of the journal",
				"file", l.file, "line", t.Line, "error", t.Err)
		}
	}
	return nil
}
