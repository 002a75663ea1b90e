package journalsql

import (
	"context"
	"fmt"

	"github.com/mindroomd/mindroomd/journal"
)

// RetentionBatch is the most rows one step of a retention pass reads or
// changes: one step is one command of the writer, so admission waits for
// at most one such step beside its own work.
const RetentionBatch = 256

// retentionStep is one kind of data a pass prunes, in the order a pass
// takes them: bodies before identities, so an event whose body goes in
// a pass may lose its identity in the same pass.
type retentionStep uint8

const (
	stepBodies retentionStep = iota
	stepEdits
	stepPayloads
	stepTurns
	stepRejected
	stepIdentities
	stepApprovals
	stepDeliveries
	stepsDone
)

// RetentionPass is where one retention pass is: the kind it prunes now
// and how far its walk through that kind's rows got. The zero pass starts
// at the beginning.
type RetentionPass struct {
	step  retentionStep
	after int64
}

// Done reports whether the pass is over.
func (r *RetentionPass) Done() bool { return r.step >= stepsDone }

// next moves the pass to its next kind.
func (r *RetentionPass) next() { r.step, r.after = r.step+1, 0 }

// RetainStep runs one bounded step of p's retention pass r at cutoffs c,
// in tx, and moves r on. Rows are walked in the order they were written,
// oldest first: a scan finds where the rows older than a cutoff end among
// the next RetentionBatch, and one statement prunes that range, under the
// guards that keep what is pending or owed.
func RetainStep(tx Tx, p Principal, c journal.RetentionCutoffs, r *RetentionPass) (journal.RetentionCount, error) {
	var (
		n   journal.RetentionCount
		err error
	)
	switch r.step {
	case stepBodies:
		n, err = retainBodies(tx, p, c.Bodies, r)
	case stepEdits:
		n.Edits, err = retainOldest(tx, RetainEdits, p.ID, c.Bodies, r)
	case stepPayloads:
		n, err = retainPayloads(tx, p, c.Payloads, r)
	case stepTurns:
		n.Turns, err = retainTurns(tx, p, c.Turns, r)
	case stepRejected:
		n.Rejected, err = retainOldest(tx, RetainRejected, p.ID, c.Rejected, r)
	case stepIdentities:
		n.Identities, err = retainRange(tx, RetainScanEvents, RetainIdentities, p, c.Identities, r)
	case stepApprovals:
		n.Approvals, err = retainOldest(tx, RetainApprovals, p.ID, c.Identities, r)
	case stepDeliveries:
		n.Deliveries, err = retainRange(tx, RetainScanOutbox, RetainDeliveries, p, c.Identities, r)
	default:
		return n, nil
	}
	if err != nil {
		return n, fmt.Errorf("retention step %d: %w", r.step, err)
	}
	if _, err := tx.Exec(AddRetentionTotals, p.ID, n.Bodies, n.Edits, n.Payloads, n.Turns, n.Rejected, n.Identities,
		n.Deliveries, n.Approvals, n.Bytes); err != nil {
		return n, fmt.Errorf("count retention: %w", err)
	}
	return n, nil
}

// EndRetentionPass records a finished pass of p at cutoffs c.
func EndRetentionPass(tx Tx, p Principal, c journal.RetentionCutoffs) error {
	_, err := tx.Exec(EndRetentionPassRow, p.ID, tx.Now().UnixMilli(), c.Identities)
	return err
}

// scanTo finds, among the RetentionBatch rows of p after r.after in key
// order (s reads key and age), the last one older than cutoff: upto. The
// kind is walked to its end when the scan met a younger row or the
// table's end.
func scanTo(tx Tx, s Stmt, p Principal, cutoff int64, r *RetentionPass) (upto int64, end bool, err error) {
	rows, err := tx.Query(s, p.ID, r.after, RetentionBatch)
	if err != nil {
		return 0, false, err
	}
	defer rows.Close()
	upto, seen := r.after, 0
	for rows.Next() {
		var key, age int64
		if err := rows.Scan(&key, &age); err != nil {
			return 0, false, err
		}
		if age >= cutoff {
			return upto, true, rows.Err()
		}
		upto, seen = key, seen+1
	}
	return upto, seen < RetentionBatch, rows.Err()
}

// walk prunes, with prune, the range of p's rows scan finds older than
// cutoff after r, and moves r past it; zero cutoff prunes none.
func walk(tx Tx, scan Stmt, p Principal, cutoff int64, r *RetentionPass, prune func(upto int64) error) error {
	if cutoff == 0 {
		r.next()
		return nil
	}
	upto, end, err := scanTo(tx, scan, p, cutoff, r)
	if err != nil {
		return err
	}
	if upto > r.after {
		if err := prune(upto); err != nil {
			return err
		}
		r.after = upto
	}
	if end {
		r.next()
	}
	return nil
}

// retainRange prunes, with the range statement act, what walk finds.
func retainRange(tx Tx, scan, act Stmt, p Principal, cutoff int64, r *RetentionPass) (n int64, err error) {
	err = walk(tx, scan, p, cutoff, r, func(upto int64) (err error) {
		n, err = tx.Exec(act, p.ID, r.after, upto, cutoff)
		return err
	})
	return n, err
}

// retainOldest prunes, with act, up to RetentionBatch rows of the
// principal (keyed by who) older than cutoff; the kind is done once fewer
// were left.
func retainOldest(tx Tx, act Stmt, who any, cutoff int64, r *RetentionPass) (int64, error) {
	if cutoff == 0 {
		r.next()
		return 0, nil
	}
	n, err := tx.Exec(act, who, cutoff, RetentionBatch)
	if err != nil {
		return 0, err
	}
	if n < RetentionBatch {
		r.next()
	}
	return n, nil
}

// retainTurns removes answered turns' records older than cutoff, their
// sources first (both statements pick the same turns).
func retainTurns(tx Tx, p Principal, cutoff int64, r *RetentionPass) (int64, error) {
	if cutoff == 0 {
		r.next()
		return 0, nil
	}
	if _, err := tx.Exec(RetainTurnSources, p.Agent, cutoff, RetentionBatch); err != nil {
		return 0, err
	}
	return retainOldest(tx, RetainTurnRecords, p.Agent, cutoff, r)
}

// retainBodies removes the visible messages older than cutoff from the
// conversation, in rooms with nothing pending or owed, and marks each
// room's pruned range.
func retainBodies(tx Tx, p Principal, cutoff int64, r *RetentionPass) (n journal.RetentionCount, err error) {
	err = walk(tx, RetainScanVisible, p, cutoff, r, func(upto int64) error {
		rows, err := tx.Query(RetainBodies, p.ID, r.after, upto)
		if err != nil {
			return err
		}
		newest := map[int64]int64{}
		for rows.Next() {
			var room, ts, size int64
			if err := rows.Scan(&room, &ts, &size); err != nil {
				rows.Close()
				return err
			}
			newest[room] = max(newest[room], ts)
			n.Bodies, n.Bytes = n.Bodies+1, n.Bytes+size
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for room, ts := range newest {
			if _, err := tx.Exec(MarkPrunedBefore, ts, room); err != nil {
				return err
			}
		}
		return nil
	})
	return n, err
}

// retainPayloads clears the content of finished deliveries older than
// cutoff; their identities stay.
func retainPayloads(tx Tx, p Principal, cutoff int64, r *RetentionPass) (n journal.RetentionCount, err error) {
	err = walk(tx, RetainScanOutbox, p, cutoff, r, func(upto int64) error {
		if err := tx.QueryRow(RetainPayloadBytes, p.ID, r.after, upto, cutoff).Scan(&n.Payloads, &n.Bytes); err != nil {
			return err
		}
		_, err := tx.Exec(RetainPayloads, p.ID, r.after, upto, cutoff)
		return err
	})
	return n, err
}

// RetentionStatus reads p's retention so far.
func RetentionStatus(ctx context.Context, r Reader, p Principal) (journal.RetentionStatus, error) {
	var (
		s journal.RetentionStatus
		t = &s.Total
	)
	err := r.QueryRow(ctx, SelectRetentionTotals, p.ID).Scan(&s.Passes, &s.LastPassMS, &t.Bodies, &t.Edits, &t.Payloads,
		&t.Turns, &t.Rejected, &t.Identities, &t.Deliveries, &t.Approvals, &t.Bytes, &s.IdentitiesBeforeMS)
	if err != nil && !r.NoRows(err) {
		return s, fmt.Errorf("read retention totals: %w", err)
	}
	if err := r.QueryRow(ctx, SelectOldestBody, p.ID).Scan(&s.OldestBodyMS); err != nil {
		return s, fmt.Errorf("read oldest body: %w", err)
	}
	return s, nil
}

// PrunedBefore reads the origin time up to which retention removed the
// messages of p's room (0 when it removed none).
func PrunedBefore(ctx context.Context, r Reader, p Principal, room string) (int64, error) {
	var ts int64
	err := r.QueryRow(ctx, SelectPrunedBefore, p.ID, room).Scan(&ts)
	if r.NoRows(err) {
		return 0, nil
	}
	return ts, err
}

// IdentityHorizon reads the newest cutoff p's identities were pruned at,
// 0 when none were.
func IdentityHorizon(ctx context.Context, r Reader, p Principal) (int64, error) {
	var ms int64
	err := r.QueryRow(ctx, SelectIdentityHorizon, p.ID).Scan(&ms)
	if r.NoRows(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read identity horizon: %w", err)
	}
	return ms, nil
}
