package sqlitefs

import (
	"context"
	"fmt"
)

// The page index (visible_page) is filled by merges of the unmerged tail:
// the visible rows newer than visible_page_merged.upto. A merge writes the
// tail's entries in key order, so each conversation's newest leaf is
// rewritten once per merge instead of once per commit.
const (
	mergePageTail = `INSERT INTO visible_page (room, thread_id, created_ts, event_id, seq)
		SELECT room, thread_id, created_ts, event_id, seq FROM visible_messages
		WHERE seq > (SELECT upto FROM visible_page_merged WHERE id = 1)
		ORDER BY room, thread_id, created_ts, event_id`
	countUnmerged = `SELECT count(*) FROM visible_messages
		WHERE seq > (SELECT upto FROM visible_page_merged WHERE id = 1)`
	advancePageMerged = `UPDATE visible_page_merged
		SET upto = max(upto, (SELECT coalesce(max(seq), 0) FROM visible_messages)) WHERE id = 1`
)

// DefaultMaxUnmergedTail bounds the unmerged tail: admission merges it
// inline once this many visible rows wait. Merging more at once dirties
// fewer pages per row; the bound is what a reader may scan besides its page.
const DefaultMaxUnmergedTail = 4096

// MergePageTail moves the unmerged tail into the page index and reports how
// many rows it moved.
func MergePageTail(tx *Tx) (int64, error) {
	r, err := tx.exec(mergePageTail)
	if err != nil {
		return 0, fmt.Errorf("merge page tail: %w", err)
	}
	n, err := r.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("merge page tail: %w", err)
	}
	if _, err := tx.exec(advancePageMerged); err != nil {
		return 0, fmt.Errorf("merge page tail: %w", err)
	}
	tx.db.unmerged.Store(0)
	return n, nil
}

// Unmerged estimates the visible rows waiting in the unmerged tail. It is a
// hint for when to merge: a rolled-back batch can leave it off, never the
// index itself.
func (db *DB) Unmerged() int64 { return db.unmerged.Load() }

// noteVisibleRow counts one new tail row and merges inline when the tail is
// full, so a burst that never lets the writer idle still bounds it.
func noteVisibleRow(tx *Tx) error {
	if tx.db.unmerged.Add(1) < tx.db.maxUnmerged {
		return nil
	}
	_, err := MergePageTail(tx)
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
