package store

import (
	"context"
	"fmt"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/journalsql"
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
