package spend

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/tollgate-llm/tollgate/internal/atomicfile"
)

// spillVersion is the version of the spill file format.
const spillVersion = 1

// spillFile is the JSON form of a Redis ledger's spill file: the batches
// Close could not write, each with the id and hash tag it was (or would
// have been) sent with. Pending rows are cut into batches before they are
// spilled, so that every row in the file has an id from the start and a
// replay after a crash in the middle of recovery cannot count it twice.
type spillFile struct {
	Version int       `json:"version"`
	SavedAt time.Time `json:"saved_at"`
	// Replica is the writer's replica id and nonce, for the operator.
	Replica string       `json:"replica"`
	Batches []spillBatch `json:"batches"`
}

type spillBatch struct {
	ID string `json:"id"`
	// Tag is the hash tag ("{<prefix>spend}") of the batch's keys. A batch
	// goes where it was meant to go, even if the prefix changed meanwhile,
	// because only there does its marker tell whether it was applied.
	Tag  string     `json:"tag"`
	Rows []stateRow `json:"rows"`
}

func toStateRow(r Row) stateRow {
	return stateRow{Day: r.Day, Team: r.Team, KeyID: r.KeyID, Model: r.Model,
		Requests: r.Requests, Input: r.Input, Output: r.Output, CacheRead: r.CacheRead,
		CacheWrite: r.CacheWrite, Reasoning: r.Reasoning, CostMicros: r.CostMicros}
}

func (s stateRow) row() Row {
	return Row{Key{Day: s.Day, KeyID: s.KeyID, Team: s.Team, Model: s.Model},
		Totals{Requests: s.Requests, Input: s.Input, Output: s.Output, CacheRead: s.CacheRead,
			CacheWrite: s.CacheWrite, Reasoning: s.Reasoning, CostMicros: s.CostMicros}}
}

// readSpill reads and checks the spill file name; a missing file is nil.
func readSpill(name string) (*spillFile, error) {
	var sf spillFile
	if found, err := atomicfile.ReadJSON("spend", "spill file", name, &sf); !found || err != nil {
		return nil, err
	}
	if sf.Version != spillVersion {
		return nil, fmt.Errorf("spend: spill file %s has version %d, want %d", name, sf.Version, spillVersion)
	}
	ids := make(map[string]bool, len(sf.Batches))
	for i, b := range sf.Batches {
		// A repeated id would be skipped as already applied: its rows lost.
		if b.ID == "" || ids[b.ID] {
			return nil, fmt.Errorf("spend: spill file %s is corrupt: batch %d: empty or repeated id %q", name, i, b.ID)
		}
		ids[b.ID] = true
		if err := checkTag(b.Tag); err != nil {
			return nil, fmt.Errorf("spend: spill file %s is corrupt: batch %s: %w", name, b.ID, err)
		}
		if len(b.Rows) == 0 {
			return nil, fmt.Errorf("spend: spill file %s is corrupt: batch %s has no rows", name, b.ID)
		}
		for j, r := range b.Rows {
			if _, err := time.Parse(DayLayout, r.Day); err != nil {
				return nil, fmt.Errorf("spend: spill file %s is corrupt: batch %s row %d: day %q: %w", name, b.ID, j, r.Day, err)
			}
		}
	}
	return &sf, nil
}

// pickNonce returns a nonce from gen such that no batch id of this replica
// can equal one of used (the spill file's and the journal's): those were
// made by an earlier process, and a new batch under one of their ids would
// be skipped as already applied.
func pickNonce(replicaID string, used []string, gen func() string) (string, error) {
	for range 8 {
		n := gen()
		p := replicaID + ":" + n + ":"
		clash := false
		for _, id := range used {
			clash = clash || strings.HasPrefix(id, p)
		}
		if !clash {
			return n, nil
		}
	}
	return "", errors.New("spend: cannot pick a batch id nonce that the spill file does not use")
}

// queueSpilled queues sf's batches with their ids, before anything this
// process adds. The file stays until they are all applied, so that a crash
// before then loses nothing; sending them again then is harmless.
func (r *Redis) queueSpilled(sf *spillFile) {
	rows := 0
	for _, sb := range sf.Batches {
		rs := make([]Row, len(sb.Rows))
		for i, x := range sb.Rows {
			rs[i] = x.row()
		}
		sortRows(rs) // makeBatch wants one day's rows adjacent
		r.queue = append(r.queue, makeBatch(sb.Tag, sb.ID, rs))
		rows += len(rs)
	}
	r.queuedRows.Store(int64(rows))
	r.spillOnDisk = true
	r.spillLeft = len(r.queue)
	age := time.Since(sf.SavedAt)
	r.log.Info("spend: spend from the spill file will be written to Redis", "spill_file", r.spillFile,
		"batches", len(sf.Batches), "rows", rows, "written_by", sf.Replica, "age", age.Round(time.Second))
	if age > batchTTL {
		// Redis has forgotten which of these batches it applied.
		r.log.Error("spend: the spill file is older than Redis remembers applied batches; a batch that reached Redis before it was spilled will be counted twice",
			"spill_file", r.spillFile, "saved_at", sf.SavedAt, "batch_ttl", batchTTL)
	}
}

// spillLocked cuts the pending rows into batches behind the queue and
// writes the whole queue to the spill file, replacing what it held: the
// file's earlier batches are either applied or still in the queue.
func (r *Redis) spillLocked() error {
	// The journal records the cut, so that a start finding both files
	// sends each batch once.
	r.cutLocked(false)
	if len(r.queue) == 0 {
		return nil
	}
	sf := spillFile{Version: spillVersion, SavedAt: time.Now().UTC(), Replica: r.replica,
		Batches: make([]spillBatch, len(r.queue))}
	for i, b := range r.queue {
		sb := spillBatch{ID: b.id, Tag: b.tag, Rows: make([]stateRow, len(b.rows))}
		for j, row := range b.rows {
			sb.Rows[j] = toStateRow(row)
		}
		sf.Batches[i] = sb
	}
	data, err := json.MarshalIndent(sf, "", " ")
	if err != nil {
		return fmt.Errorf("spend: encoding spill file: %w", err)
	}
	if err := writeAtomic("spill file", r.spillFile, append(data, '\n')); err != nil {
		return err
	}
	r.spillOnDisk = true
	r.spillLeft = len(r.queue)
	return nil
}

// removeSpillLocked removes the spill file once every batch it holds is in
// Redis. Failing to is an error: the file's batches would be sent again at
// the next start, harmless only while Redis remembers them (batchTTL).
func (r *Redis) removeSpillLocked() error {
	if !r.spillOnDisk || r.spillLeft > 0 {
		return nil
	}
	if err := os.Remove(r.spillFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
		err = fmt.Errorf("spend: removing spill file %s, whose batches are all in Redis: %w", r.spillFile, err)
		if !r.spillRmFailed { // the flusher retries every interval: log once
			r.spillRmFailed = true
			r.log.Error("spend: cannot remove the spill file; will retry", "err", err)
		}
		return err
	}
	r.spillOnDisk, r.spillRmFailed = false, false
	r.log.Info("spend: spend from the spill file is in Redis; spill file removed", "spill_file", r.spillFile)
	return nil
}
