package store

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/journalsql"
	"github.com/mindroomd/mindroomd/sqlitefs"
)

var _ journal.Retention = (*View)(nil)

// Retain implements journal.Retention: each step is a command of its own,
// so admission never waits behind more than one.
func (v *View) Retain(ctx context.Context, policy journal.RetentionPolicy) (journal.RetentionCount, error) {
	var total journal.RetentionCount
	if err := policy.Validate(); err != nil {
		return total, err
	}
	if !policy.Enabled() {
		return total, nil
	}
	st, err := journalsql.SyncTokenStatus(ctx, v.r, v.p)
	if err != nil {
		return total, err
	}
	cutoffs := policy.Cutoffs(v.now(), st)
	var pass journalsql.RetentionPass
	for !pass.Done() {
		var (
			n    journal.RetentionCount
			step journalsql.RetentionPass
		)
		err := v.do(ctx, "retain", 0, func(tx journalsql.Tx) (err error) {
			step = pass
			n, err = journalsql.RetainStep(tx, v.p, cutoffs, &step)
			return err
		})
		if err != nil {
			return total, fmt.Errorf("retain: %w", err)
		}
		pass, total = step, total.Add(n)
	}
	if err := v.do(ctx, "end retention pass", 0, func(tx journalsql.Tx) error {
		return journalsql.EndRetentionPass(tx, v.p, cutoffs)
	}); err != nil {
		return total, fmt.Errorf("retain: %w", err)
	}
	return total, nil
}

// RetentionStatus implements journal.Retention.
func (v *View) RetentionStatus(ctx context.Context) (journal.RetentionStatus, error) {
	return journalsql.RetentionStatus(ctx, v.r, v.p)
}

// IdentityHorizon implements journal.Retention.
func (v *View) IdentityHorizon(ctx context.Context) (int64, error) {
	return journalsql.IdentityHorizon(ctx, v.r, v.p)
}

// Reclaim hands the journal's free pages back to the file system, a chunk
// per turn of the writer so admission waits for at most one, and returns
// the bytes handed back. On PostgreSQL, whose autovacuum does this, and on
// a SQLite journal created before incremental auto-vacuum, it does
// nothing: free pages are reused as they are.
func (s *Store) Reclaim(ctx context.Context) (int64, error) {
	if s.db == nil || s.readOnly {
		return 0, nil
	}
	var total int64
	for {
		var freed, left int64
		err := s.maintain(ctx, "reclaim", func(conn *sql.Conn) (err error) {
			freed, left, err = sqlitefs.ReclaimOn(context.Background(), conn)
			return err
		})
		if err != nil {
			return total, fmt.Errorf("reclaim: %w", err)
		}
		total += freed
		if freed == 0 || left == 0 {
			return total, nil
		}
	}
}
