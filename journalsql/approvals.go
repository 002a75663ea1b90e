package journalsql

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journal"
)

// scanApproval reads one row in the dialects' approval column order:
// call_id, event_id, room_id, thread_id, tool, arguments, secret,
// approvers, rendering, call_hash, expires_ms, epoch, created_ms, state,
// decided_by, decision_event_id, decided_ms, reason, context, run_state,
// run_result.
func scanApproval(row Row) (journal.Approval, error) {
	var (
		a                                   journal.Approval
		thread, args, secret, apps, context string
		state, run                          int
	)
	err := row.Scan(&a.CallID, &a.EventID, &a.RoomID, &thread, &a.Tool, &args, &secret, &apps, &a.Rendering,
		&a.CallHash, &a.ExpiresMS, &a.Epoch, &a.CreatedMS, &state, &a.DecidedBy, &a.DecisionEventID, &a.DecidedMS, &a.Reason,
		&context, &run, &a.RunResult)
	if err != nil {
		return a, err
	}
	a.Thread, a.Arguments, a.State = journal.DecodeThread(thread), json.RawMessage(args), journal.ApprovalState(state)
	a.Run = journal.ToolRunState(run)
	if context != "" {
		a.Context = json.RawMessage(context)
	}
	if err := json.Unmarshal([]byte(secret), &a.Secret); err != nil {
		return a, fmt.Errorf("%w: approval %s: secret: %v", journal.ErrCorrupt, a.CallID, err)
	}
	if err := json.Unmarshal([]byte(apps), &a.Approvers); err != nil {
		return a, fmt.Errorf("%w: approval %s: approvers: %v", journal.ErrCorrupt, a.CallID, err)
	}
	return a, nil
}

// loadApproval reads p's approval of callID inside tx.
func loadApproval(tx Tx, p Principal, callID string) (journal.Approval, bool, error) {
	a, err := scanApproval(tx.QueryRow(SelectApproval, p.ID, callID))
	if tx.NoRows(err) {
		return a, false, nil
	}
	return a, err == nil, err
}

// RequestApproval records an approval request and enqueues its card, in
// tx: the same call ID again with the same call is the recorded approval
// (created false), with another call ErrCallConflict. The event must be
// one p admitted and still owes its turn; the request is made under the
// room's current membership, and its approvers default to the event's
// sender.
func RequestApproval(tx Tx, p Principal, req journal.ApprovalRequest, keys journal.ApprovalKeys) (journal.Approval, bool, []hint.Hint, error) {
	if err := journal.ValidateApproval(req, tx.Now()); err != nil {
		return journal.Approval{}, false, nil, err
	}
	hash, err := journal.CallHash(req.Tool, req.Arguments)
	if err != nil {
		return journal.Approval{}, false, nil, err
	}
	if a, ok, err := loadApproval(tx, p, req.CallID); err != nil || ok {
		if err == nil && (a.CallHash != hash || a.EventID != req.EventID) {
			err = fmt.Errorf("%w: %s", journal.ErrCallConflict, req.CallID)
		}
		return a, false, nil, err
	}
	var (
		room, threadKey, payload string
		pending                  bool
	)
	err = tx.QueryRow(SelectApprovalSource, p.ID, EventKey(req.EventID)).Scan(&room, &threadKey, &pending, &payload)
	switch {
	case tx.NoRows(err):
		return journal.Approval{}, false, nil, fmt.Errorf("%w: %s", journal.ErrUnknownSource, req.EventID)
	case err != nil:
		return journal.Approval{}, false, nil, fmt.Errorf("read event: %w", err)
	case !pending:
		return journal.Approval{}, false, nil, fmt.Errorf("%w: %s is not pending", journal.ErrNotPending, req.EventID)
	}
	var source struct {
		Sender string `json:"sender"`
	}
	if err := json.Unmarshal([]byte(payload), &source); err != nil || source.Sender == "" {
		return journal.Approval{}, false, nil, fmt.Errorf("%w: %s: its payload cannot be read", journal.ErrCorrupt, req.EventID)
	}
	sender := source.Sender
	ref, err := tx.Room(p, room)
	if err != nil {
		return journal.Approval{}, false, nil, err
	}
	if ref.Departed {
		return journal.Approval{}, false, nil, fmt.Errorf("%w: not in %s", journal.ErrMembershipEnded, room)
	}
	a := journal.Approval{ApprovalRequest: req, RoomID: room, Thread: journal.DecodeThread(threadKey), CallHash: hash,
		Epoch: ref.Epoch, CreatedMS: tx.Now().UnixMilli()}
	a.Arguments, _ = journal.CanonicalJSON(req.Arguments)
	if len(a.Approvers) == 0 {
		a.Approvers = []string{sender}
	}
	if a.Secret == nil {
		a.Secret = []string{}
	}
	card, err := journal.CardContent(a, keys)
	if err != nil {
		return a, false, nil, err
	}
	secret, _ := json.Marshal(a.Secret)
	approvers, _ := json.Marshal(a.Approvers)
	_, err = tx.Exec(InsertApproval, p.ID, a.CallID, a.EventID, a.RoomID, threadKey, a.Tool, tx.Text(string(a.Arguments)),
		tx.Text(string(secret)), tx.Text(string(approvers)), tx.Text(a.Rendering), a.CallHash,
		journal.ApprovalDeliveryID(a.CallID), a.ExpiresMS, a.Epoch, a.CreatedMS, tx.Text(string(a.Context)))
	if err != nil {
		return a, false, nil, fmt.Errorf("insert approval: %w", err)
	}
	_, hints, err := EnqueueAndSettle(tx, p, journal.EnqueueRequest{DeliveryID: journal.ApprovalDeliveryID(a.CallID),
		Stage: journal.StageInitial, RoomID: a.RoomID, Thread: a.Thread, Content: card})
	if err != nil {
		return a, false, nil, fmt.Errorf("enqueue card: %w", err)
	}
	return a, true, hints, nil
}

// DecideApproval writes the decision d of p's approval callID, in tx, if
// it is still open: the first decision wins, and a later one changes
// nothing (decided false, the approval as decided before). The card is
// edited once to show it: the edit is enqueued as the card's final stage
// when the card was sent or is being sent; a card never attempted is
// retired instead, never shown. The events in d.Settle (the vote) are
// settled in the same transaction, whatever the outcome.
func DecideApproval(tx Tx, p Principal, callID string, d journal.ApprovalDecision) (journal.Approval, bool, []hint.Hint, error) {
	if d.State == journal.ApprovalOpen {
		return journal.Approval{}, false, nil, fmt.Errorf("%w: a decision must not be open", journal.ErrInvalidArgument)
	}
	a, ok, err := loadApproval(tx, p, callID)
	switch {
	case err != nil:
		return a, false, nil, err
	case !ok:
		return a, false, nil, fmt.Errorf("%w: %s", journal.ErrNoApproval, callID)
	}
	hints := roomHint(p, a.RoomID)
	for _, id := range d.Settle {
		if _, err := tx.Exec(SettleEventInRoom, p.ID, EventKey(id), a.RoomID); err != nil {
			return a, false, nil, fmt.Errorf("settle vote: %w", err)
		}
	}
	if a.State != journal.ApprovalOpen {
		return a, false, hints, nil
	}
	now := tx.Now().UnixMilli()
	n, err := tx.Exec(DecideApprovalRow, int(d.State), d.By, d.EventID, now, d.Reason, p.ID, callID)
	if err != nil {
		return a, false, nil, fmt.Errorf("decide approval: %w", err)
	}
	if n == 0 {
		return a, false, hints, nil
	}
	a = journal.Decided(a, d.State, d.By, d.EventID, now)
	a.Reason = d.Reason
	if err := editCard(tx, p, a); err != nil {
		return a, false, nil, err
	}
	return a, true, hints, nil
}

// StartToolRun claims the run of p's approved call callID, in tx: started
// is true when this transaction claimed it; false when it was claimed
// before, the approval then saying how far the run got.
func StartToolRun(tx Tx, p Principal, callID string) (journal.Approval, bool, error) {
	a, ok, err := loadApproval(tx, p, callID)
	switch {
	case err != nil:
		return a, false, err
	case !ok:
		return a, false, fmt.Errorf("%w: %s", journal.ErrNoApproval, callID)
	case a.State != journal.ApprovalApproved:
		return a, false, fmt.Errorf("%w: %s is %s", journal.ErrNotApproved, callID, a.State)
	case a.Run != journal.ToolRunNone:
		return a, false, nil
	}
	if _, err := tx.Exec(StartToolRunRow, p.ID, callID); err != nil {
		return a, false, fmt.Errorf("start tool run: %w", err)
	}
	a.Run = journal.ToolRunStarted
	return a, true, nil
}

// FinishToolRun records the result of p's started run of callID, in tx;
// a run finished before keeps its first result.
func FinishToolRun(tx Tx, p Principal, callID, result string) (journal.Approval, error) {
	if len(result) > journal.MaxToolResultBytes {
		return journal.Approval{}, fmt.Errorf("%w: a tool result is larger than %d bytes", journal.ErrInvalidArgument, journal.MaxToolResultBytes)
	}
	a, ok, err := loadApproval(tx, p, callID)
	switch {
	case err != nil:
		return a, err
	case !ok:
		return a, fmt.Errorf("%w: %s", journal.ErrNoApproval, callID)
	case a.Run == journal.ToolRunFinished:
		return a, nil
	case a.Run != journal.ToolRunStarted:
		return a, fmt.Errorf("%w: the run of %s was never started", journal.ErrInvalidArgument, callID)
	}
	if _, err := tx.Exec(FinishToolRunRow, tx.Text(result), p.ID, callID); err != nil {
		return a, fmt.Errorf("finish tool run: %w", err)
	}
	a.Run, a.RunResult = journal.ToolRunFinished, tx.Text(result)
	return a, nil
}

// editCard enqueues the decided card's one edit, or retires a card never
// attempted. A card of a membership that has ended is left as it is:
// nothing may be sent under another membership.
func editCard(tx Tx, p Principal, a journal.Approval) error {
	id := journal.ApprovalDeliveryID(a.CallID)
	card, ok, err := outbox{tx, p}.Delivery(id, journal.StageInitial)
	if err != nil || !ok {
		return err
	}
	switch card.State {
	case journal.DeliveryQueued:
		return Retire(tx, p, id, journal.StageInitial)
	case journal.DeliveryAttempted, journal.DeliveryAcknowledged:
	default:
		return nil
	}
	content, err := journal.DecisionContent(a)
	if err != nil {
		return err
	}
	_, _, err = EnqueueAndSettle(tx, p, journal.EnqueueRequest{DeliveryID: id, Stage: journal.StageFinal,
		RoomID: a.RoomID, Thread: a.Thread, Content: content})
	if journal.DropsTurn(err) {
		return nil
	}
	return err
}

// withdrawApprovalsInRoom withdraws p's open approvals of room, in the
// transaction that fences p's membership of it, one decision each, so
// each takes its place in the decision order. Their cards are left as
// they are: nothing may be sent under the ended membership.
func withdrawApprovalsInRoom(tx Tx, p Principal, room string) error {
	rows, err := tx.Query(SelectOpenApprovalsInRoom, p.ID, room)
	if err != nil {
		return err
	}
	var open []string
	for rows.Next() {
		a, err := scanApproval(rows)
		if err != nil {
			rows.Close()
			return err
		}
		open = append(open, a.CallID)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	now := tx.Now().UnixMilli()
	for _, id := range open {
		if _, err := tx.Exec(DecideApprovalRow, int(journal.ApprovalWithdrawn), "", "", now, withdrawnByDeparture, p.ID, id); err != nil {
			return err
		}
	}
	return nil
}

// withdrawnByDeparture is the reason of an approval the agent's departure
// withdrew.
const withdrawnByDeparture = "the agent left the room"

// Approval reads p's approval of callID and its card's acknowledged event
// ID ("" until the homeserver took the card).
func Approval(ctx context.Context, r Reader, p Principal, callID string) (journal.Approval, string, bool, error) {
	a, err := scanApproval(r.QueryRow(ctx, SelectApproval, p.ID, callID))
	if r.NoRows(err) {
		return a, "", false, nil
	}
	if err != nil {
		return a, "", false, fmt.Errorf("read approval: %w", err)
	}
	card, err := scanDelivery(r.QueryRow(ctx, SelectDelivery, p.ID, journal.ApprovalDeliveryID(callID), int(journal.StageInitial)))
	switch {
	case r.NoRows(err):
		return a, "", true, nil
	case err != nil:
		return a, "", false, fmt.Errorf("read card: %w", err)
	case card.State != journal.DeliveryAcknowledged:
		return a, "", true, nil
	}
	return a, card.EventID, true, nil
}

// CardApproval finds p's approval whose card the homeserver acknowledged
// as cardEventID.
func CardApproval(ctx context.Context, r Reader, p Principal, cardEventID string) (journal.Approval, bool, error) {
	a, err := scanApproval(r.QueryRow(ctx, SelectCardApproval, p.ID, cardEventID))
	if r.NoRows(err) {
		return a, false, nil
	}
	if err != nil {
		return a, false, fmt.Errorf("read card approval: %w", err)
	}
	return a, true, nil
}

// queryApprovals reads the approvals a statement selects.
func queryApprovals(ctx context.Context, r Reader, s Stmt, args ...any) ([]journal.Approval, error) {
	rows, err := r.Query(ctx, s, args...)
	if err != nil {
		return nil, fmt.Errorf("read approvals: %w", err)
	}
	defer rows.Close()
	var out []journal.Approval
	for rows.Next() {
		a, err := scanApproval(rows)
		if err != nil {
			return nil, fmt.Errorf("read approvals: %w", err)
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

// ApprovalsForEvent lists p's approvals of the turn of eventID, oldest
// first.
func ApprovalsForEvent(ctx context.Context, r Reader, p Principal, eventID string) ([]journal.Approval, error) {
	return queryApprovals(ctx, r, SelectApprovalsForEvent, p.ID, eventID)
}

// OpenApprovals lists p's open approvals of room.
func OpenApprovals(ctx context.Context, r Reader, p Principal, room string) ([]journal.Approval, error) {
	return queryApprovals(ctx, r, SelectOpenApprovalsInRoom, p.ID, room)
}

// DecidedAfter lists up to limit of p's decisions after the decision
// numbered after, in the order they were written, with each one's number.
func DecidedAfter(ctx context.Context, r Reader, p Principal, after int64, limit int) ([]journal.Approval, []int64, error) {
	rows, err := r.Query(ctx, SelectDecidedAfter, p.ID, after, limit)
	if err != nil {
		return nil, nil, fmt.Errorf("read decisions: %w", err)
	}
	defer rows.Close()
	var (
		out  []journal.Approval
		seqs []int64
	)
	for rows.Next() {
		var seq int64
		a, err := scanApproval(seqRow{rows, &seq})
		if err != nil {
			return nil, nil, fmt.Errorf("read decisions: %w", err)
		}
		out, seqs = append(out, a), append(seqs, seq)
	}
	return out, seqs, rows.Err()
}

// seqRow scans an approval row followed by one more column into seq.
type seqRow struct {
	Row
	seq *int64
}

// Scan implements Row.
func (r seqRow) Scan(dest ...any) error { return r.Row.Scan(append(dest, r.seq)...) }

// DueApprovals lists up to limit of p's open approvals that expire at or
// before nowMS, soonest first.
func DueApprovals(ctx context.Context, r Reader, p Principal, nowMS int64, limit int) ([]journal.Approval, error) {
	return queryApprovals(ctx, r, SelectDueApprovals, p.ID, nowMS, limit)
}
