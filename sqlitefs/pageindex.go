package sqlitefs

import (
	"context"
	"database/sql"
	"fmt"
)

// The page index (visible_page) is filled by merges of the unmerged tail:
// the visible rows newer than visible_page_merged.upto. A merge writes the
// tail's entries in key order, so each conversation's newest leaf is
// rewritten once per merge instead of once per commit.
//
// Every leaf a merge rewrites is a page the next checkpoint copies to a
// random place in the database file, and on a synced file that copy, not
// the merge, is the cost. A merge cycle therefore takes the tail as it
// stands (up to a boundary seq) and moves it a range of rooms at a time,
// in room order: each conversation's leaf is written once per cycle however
// many chunks the cycle has, and each chunk is small enough that the
// checkpoint after it is short. Until the cycle finishes (advances upto to
// its boundary) readers ignore the index entries it already wrote and read
// those rows from the tail, so a page never sees a row twice. Writing an
// entry that is already there is a no-op, so a cycle cut short by a crash,
// or overtaken by the inline merge, leaves nothing to repair.
const (
	// mergedUpto is the seq up to which visible rows are in the page index.
	mergedUpto = `(SELECT upto FROM visible_page_merged WHERE id = 1)`
	// tailEnd is the boundary of a merge of the whole tail: the newest
	// visible row's seq, or NULL when there are none.
	tailEnd       = `SELECT max(seq) FROM visible_messages`
	mergeColumns  = `room, thread_id, created_ts, event_id, seq`
	mergeTailRows = `FROM visible_messages WHERE seq > ` + mergedUpto + ` AND seq <= ?1`
	mergeKeyOrder = ` ORDER BY room, thread_id, created_ts, event_id ON CONFLICT DO NOTHING`
	// mergePageTail moves the tail up to ?1 in one statement.
	mergePageTail = `INSERT INTO visible_page (` + mergeColumns + `)
		SELECT ` + mergeColumns + ` ` + mergeTailRows + mergeKeyOrder
	// mergePageRooms moves the tail rows up to ?1 of rooms ?2 to ?3.
	mergePageRooms = `INSERT INTO visible_page (` + mergeColumns + `)
		SELECT ` + mergeColumns + ` ` + mergeTailRows + ` AND room BETWEEN ?2 AND ?3` + mergeKeyOrder
	// tailRoomRows counts the tail rows up to ?1 per room, in room order.
	tailRoomRows  = `SELECT room, count(*) ` + mergeTailRows + ` GROUP BY room ORDER BY room`
	countUnmerged = `SELECT count(*) FROM visible_messages WHERE seq > ` + mergedUpto
	// advancePageMerged never moves upto back: an inline merge may have
	// finished past a cycle's boundary while the cycle ran.
	advancePageMerged = `UPDATE visible_page_merged SET upto = ?1 WHERE id = 1 AND upto < ?1`
)

// DefaultMaxUnmergedTail bounds the unmerged tail: admission merges it
// inline once this many visible rows wait. Merging more at once dirties
// fewer pages per row; the bound is what a reader may scan besides its page.
const DefaultMaxUnmergedTail = 4096

// MergePageTail moves the whole unmerged tail into the page index in one
// transaction and reports how many entries it wrote.
func MergePageTail(tx *Tx) (int64, error) {
	var end sql.NullInt64
	if err := tx.queryRow(tailEnd).Scan(&end); err != nil {
		return 0, fmt.Errorf("merge page tail: %w", err)
	}
	if !end.Valid {
		tx.db.unmerged.Store(0)
		return 0, nil
	}
	r, err := tx.exec(mergePageTail, end.Int64)
	if err != nil {
		return 0, fmt.Errorf("merge page tail: %w", err)
	}
	n, err := r.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("merge page tail: %w", err)
	}
	if _, err := tx.exec(advancePageMerged, end.Int64); err != nil {
		return 0, fmt.Errorf("merge page tail: %w", err)
	}
	// The tail ended at end and all of it moved, but only for as long as
	// this transaction does not roll the merge back: until it commits the
	// merge, the next transaction recounts rather than trust the reset.
	tx.db.unmerged.Store(0)
	tx.db.mergedIn = tx
	if tx.afterCommit != nil {
		tx.afterCommit(func() {
			if tx.db.mergedIn == tx {
				tx.db.mergedIn = nil
			}
		})
	}
	return n, nil
}

// RoomRange is an inclusive range of room keys.
type RoomRange struct{ First, Last int64 }

// PageMergePlan is one merge cycle: the tail up to Boundary, cut into
// chunks of whole rooms.
type PageMergePlan struct {
	Boundary int64
	Chunks   []RoomRange
}

// PlanPageMerge plans a cycle over the tail as it stands, in chunks of
// about chunkRows rows. A room is never split, so a chunk holds more when
// one room alone does. The plan is empty when there is no tail, and then
// the estimate (Unmerged) is corrected to match: a batch that rolled back
// may have left it high, and a merger that trusted it would never rest.
func PlanPageMerge(tx *Tx, chunkRows int) (PageMergePlan, error) {
	var (
		plan PageMergePlan
		end  sql.NullInt64
	)
	if err := tx.queryRow(tailEnd).Scan(&end); err != nil {
		return plan, fmt.Errorf("plan page merge: %w", err)
	}
	if !end.Valid {
		tx.db.unmerged.Store(0)
		return plan, nil
	}
	plan.Boundary = end.Int64
	rows, err := tx.query(tailRoomRows, plan.Boundary)
	if err != nil {
		return plan, fmt.Errorf("plan page merge: %w", err)
	}
	defer rows.Close()
	var inChunk int64
	for rows.Next() {
		var room, n int64
		if err := rows.Scan(&room, &n); err != nil {
			return plan, fmt.Errorf("plan page merge: %w", err)
		}
		if last := len(plan.Chunks) - 1; last >= 0 && inChunk+n <= int64(chunkRows) {
			plan.Chunks[last].Last = room
			inChunk += n
			continue
		}
		plan.Chunks = append(plan.Chunks, RoomRange{First: room, Last: room})
		inChunk = n
	}
	if err := rows.Err(); err != nil {
		return plan, fmt.Errorf("plan page merge: %w", err)
	}
	if len(plan.Chunks) == 0 {
		tx.db.unmerged.Store(0)
	}
	return plan, nil
}

// MergePageRooms writes the index entries of one chunk of a cycle and
// reports how many it wrote. Readers see them once FinishPageMerge ends the
// cycle.
func MergePageRooms(tx *Tx, boundary int64, rooms RoomRange) (int64, error) {
	r, err := tx.exec(mergePageRooms, boundary, rooms.First, rooms.Last)
	if err != nil {
		return 0, fmt.Errorf("merge page rooms: %w", err)
	}
	n, err := r.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("merge page rooms: %w", err)
	}
	return n, nil
}

// FinishPageMerge ends a cycle whose chunks are all written: the rows up to
// boundary are read from the index from now on.
func FinishPageMerge(tx *Tx, boundary int64) error {
	if _, err := tx.exec(advancePageMerged, boundary); err != nil {
		return fmt.Errorf("finish page merge: %w", err)
	}
	var left int64
	if err := tx.queryRow(countUnmerged).Scan(&left); err != nil {
		return fmt.Errorf("finish page merge: %w", err)
	}
	tx.db.unmerged.Store(left)
	return nil
}

// Unmerged estimates the visible rows waiting in the unmerged tail. It is a
// hint for when to merge: a rolled-back batch can leave it off, never the
// index itself.
func (db *DB) Unmerged() int64 { return db.unmerged.Load() }

// MaxUnmerged is the tail's bound, where admission merges it inline.
func (db *DB) MaxUnmerged() int64 { return db.maxUnmerged }

// noteVisibleRow counts one new tail row and merges the whole tail inline
// when it is full, so a burst that never lets the writer idle still bounds
// it.
func noteVisibleRow(tx *Tx) error {
	if m := tx.db.mergedIn; m != nil && m != tx {
		// An inline merge that reset the estimate was rolled back with the
		// command that ran it: its tail is still there.
		var n int64
		if err := tx.queryRow(countUnmerged).Scan(&n); err != nil {
			return fmt.Errorf("count unmerged page tail: %w", err)
		}
		tx.db.unmerged.Store(n)
		tx.db.mergedIn = nil
	}
	if tx.db.unmerged.Add(1) < tx.db.maxUnmerged {
		return nil
	}
	_, err := MergePageTail(tx)
	return err
}

// countTail starts the estimate from the tail a previous process left.
func (db *DB) countTail(ctx context.Context) error {
	var n int64
	if err := db.readers.QueryRowContext(ctx, countUnmerged).Scan(&n); err != nil {
		return fmt.Errorf("count unmerged page tail: %w", err)
	}
	db.unmerged.Store(n)
	return nil
}
