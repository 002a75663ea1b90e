package store

import (
	"context"

	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/journalsql"
)

var _ journal.Approvals = (*View)(nil)

// RequestApproval implements journal.Approvals.
func (v *View) RequestApproval(ctx context.Context, req journal.ApprovalRequest, keys journal.ApprovalKeys) (journal.Approval, journal.ApprovalOutcome, error) {
	var (
		a       journal.Approval
		created bool
	)
	err := v.w.Do(ctx, "request approval", len(req.Arguments), func(tx journalsql.Tx) (hints []hint.Hint, err error) {
		a, created, hints, err = journalsql.RequestApproval(tx, v.p, req, keys)
		return hints, err
	})
	if err != nil {
		return a, 0, err
	}
	if created {
		return a, journal.ApprovalCreated, nil
	}
	return a, journal.ApprovalReplayed, nil
}

// DecideApproval implements journal.Approvals.
func (v *View) DecideApproval(ctx context.Context, callID string, d journal.ApprovalDecision) (journal.Approval, bool, error) {
	var (
		a       journal.Approval
		decided bool
	)
	err := v.w.Do(ctx, "decide approval", 0, func(tx journalsql.Tx) (hints []hint.Hint, err error) {
		a, decided, hints, err = journalsql.DecideApproval(tx, v.p, callID, d)
		return hints, err
	})
	return a, decided, err
}

// Approval implements journal.Approvals.
func (v *View) Approval(ctx context.Context, callID string) (journal.Approval, string, bool, error) {
	return journalsql.Approval(ctx, v.r, v.p, callID)
}

// CardApproval implements journal.Approvals.
func (v *View) CardApproval(ctx context.Context, cardEventID string) (journal.Approval, bool, error) {
	return journalsql.CardApproval(ctx, v.r, v.p, cardEventID)
}

// ApprovalsForEvent implements journal.Approvals.
func (v *View) ApprovalsForEvent(ctx context.Context, eventID string) ([]journal.Approval, error) {
	return journalsql.ApprovalsForEvent(ctx, v.r, v.p, eventID)
}

// OpenApprovals implements journal.Approvals.
func (v *View) OpenApprovals(ctx context.Context, roomID string) ([]journal.Approval, error) {
	return journalsql.OpenApprovals(ctx, v.r, v.p, roomID)
}

// DecidedAfter implements journal.Approvals.
func (v *View) DecidedAfter(ctx context.Context, after int64, limit int) ([]journal.Approval, []int64, error) {
	return journalsql.DecidedAfter(ctx, v.r, v.p, after, limit)
}

// DueApprovals implements journal.Approvals.
func (v *View) DueApprovals(ctx context.Context, nowMS int64, limit int) ([]journal.Approval, error) {
	return journalsql.DueApprovals(ctx, v.r, v.p, nowMS, limit)
}

// StartToolRun implements journal.ToolRuns.
func (v *View) StartToolRun(ctx context.Context, callID string) (journal.Approval, bool, error) {
	var (
		a       journal.Approval
		started bool
	)
	err := v.w.Do(ctx, "start tool run", 0, func(tx journalsql.Tx) (_ []hint.Hint, err error) {
		a, started, err = journalsql.StartToolRun(tx, v.p, callID)
		return nil, err
	})
	return a, started, err
}

// FinishToolRun implements journal.ToolRuns.
func (v *View) FinishToolRun(ctx context.Context, callID, result string) (journal.Approval, error) {
	var a journal.Approval
	err := v.w.Do(ctx, "finish tool run", len(result), func(tx journalsql.Tx) (_ []hint.Hint, err error) {
		a, err = journalsql.FinishToolRun(tx, v.p, callID, result)
		return nil, err
	})
	return a, err
}
