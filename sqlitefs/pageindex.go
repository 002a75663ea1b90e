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
const (
	// mergedUpto is the seq up to which visible rows are in the page index.
	mergedUpto = `(SELECT upto FROM visible_page_merged WHERE id = 1)`
	// tailBoundary is the seq that ends a merge of at most ?1 tail rows,
	// oldest first; NULL when there is no tail.
	tailBoundary = `SELECT max(seq) FROM (SELECT seq FROM visible_messages
		WHERE seq > ` + mergedUpto + `
		ORDER BY seq LIMIT ?)`
	mergePageTail = `INSERT INTO visible_page (room, thread_id, created_ts, event_id, seq)
		SELECT room, thread_id, created_ts, event_id, seq FROM visible_messages
		WHERE seq > ` + mergedUpto + ` AND seq <= ?
		ORDER BY room, thread_id, created_ts, event_id`
	countUnmerged     = `SELECT count(*) FROM visible_messages WHERE seq > ` + mergedUpto
	advancePageMerged = `UPDATE visible_page_merged SET upto = ? WHERE id = 1`
)

// DefaultMaxUnmergedTail bounds the unmerged tail: admission merges it
// inline once this many visible rows wait. Merging more at once dirties
// fewer pages per row; the bound is what a reader may scan besides its page.
const DefaultMaxUnmergedTail = 4096

// MergePageTail moves up to limit of the oldest unmerged rows into the page
// index (all of them when limit <= 0) and reports how many it moved. A
// bounded merge keeps the transaction that carries it short.
func MergePageTail(tx *Tx, limit int) (int64, error) {
	if limit <= 0 {
		limit = -1 // SQLite: no limit
	}
	var boundary sql.NullInt64
	if err := tx.queryRow(tailBoundary, limit).Scan(&boundary); err != nil {
		return 0, fmt.Errorf("merge page tail: %w", err)
	}
	if !boundary.Valid {
		tx.db.unmerged.Store(0)
		return 0, nil
	}
	r, err := tx.exec(mergePageTail, boundary.Int64)
	if err != nil {
		return 0, fmt.Errorf("merge page tail: %w", err)
	}
	n, err := r.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("merge page tail: %w", err)
	}
	if _, err := tx.exec(advancePageMerged, boundary.Int64); err != nil {
		return 0, fmt.Errorf("merge page tail: %w", err)
	}
	if left := tx.db.unmerged.Add(-n); left < 0 {
		tx.db.unmerged.Store(0)
	}
	return n, nil
}

// Unmerged estimates the visible rows waiting in the unmerged tail. It is a
// hint for when to merge: a rolled-back batch can leave it off, never the
// index itself.
func (db *DB) Unmerged() int64 { return db.unmerged.Load() }

// noteVisibleRow counts one new tail row and merges the whole tail inline
// when it is full, so a burst that never lets the writer idle still bounds
// it.
func noteVisibleRow(tx *Tx) error {
	if tx.db.unmerged.Add(1) < tx.db.maxUnmerged {
		return nil
	}
	_, err := MergePageTail(tx, 0)
	return err
}

// countTail starts the estimate from the tail a previous process left.
func (db *DB) countTail(ctx context.Context) error {
	var n int64
	if err := db.Readers.QueryRowContext(ctx, countUnmerged).Scan(&n); err != nil {
		return fmt.Errorf("count unmerged page tail: %w", err)
	}
	db.unmerged.Store(n)
	return nil
}
