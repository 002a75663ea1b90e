package pgfs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journal"
)

const (
	deliveryColumns = `id, created_ms, delivery_id, stage, room_id, thread_id, txn_id, turn_id, event_type,
		payload_json, replaces_event_id, epoch, state, device_id, attempts, event_id, last_error`
	selectDelivery = `SELECT ` + deliveryColumns + ` FROM delivery_outbox
		WHERE principal = $1 AND delivery_id = $2 AND stage = $3`
	selectRetiredStage = `SELECT 1 FROM delivery_outbox WHERE principal = $1 AND delivery_id = $2 AND state = 4 LIMIT 1`
	selectSource       = `SELECT room_id, epoch FROM journal_events WHERE principal = $1 AND event_id = $2`
	insertDelivery     = `INSERT INTO delivery_outbox
		(principal, delivery_id, stage, room_id, thread_id, txn_id, turn_id, event_type, payload_json, epoch, state, created_ms, updated_ms)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 0, $11, $12)`
	// Only a row never attempted may change: what may already be visible
	// in the room never does.
	updateQueuedDelivery = `UPDATE delivery_outbox
		SET room_id = $1, thread_id = $2, turn_id = $3, event_type = $4, payload_json = $5, epoch = $6, updated_ms = $7
		WHERE id = $8 AND NOT attempted AND state = 0`
	// A device already recorded stays: a retry must carry the transaction
	// ID's original device or the homeserver would not deduplicate it.
	claimDelivery = `UPDATE delivery_outbox
		SET attempted = true, state = 1, device_id = CASE WHEN device_id = '' THEN $1 ELSE device_id END,
		    replaces_event_id = $2, attempts = attempts + 1, updated_ms = $3
		WHERE id = $4`
	retireDelivery = `UPDATE delivery_outbox SET state = 4, updated_ms = $1 WHERE id = $2 AND state = 0`
	adoptDevice    = `UPDATE delivery_outbox SET device_id = $1, updated_ms = $2 WHERE id = $3 AND state = 1`
	ackDelivery    = `UPDATE delivery_outbox SET state = 2, event_id = $1, last_error = '', updated_ms = $2
		WHERE id = $3 AND state <> 2`
	// An acknowledged or retired row keeps its state: a late failure report
	// never undoes what the server accepted.
	failDelivery = `UPDATE delivery_outbox SET state = CASE WHEN $1::boolean THEN 3 ELSE state END, last_error = $2, updated_ms = $3
		WHERE id = $4 AND state IN (0, 1)`
	selectUnackedHead = `SELECT ` + deliveryColumns + ` FROM delivery_outbox
		WHERE principal = $1 AND state IN (0, 1)
		ORDER BY created_ms, id LIMIT $2`
	// The row-value comparison keeps the scan on the partial index and
	// continues exactly after the cursor even among rows of one millisecond.
	selectUnackedAfter = `SELECT ` + deliveryColumns + ` FROM delivery_outbox
		WHERE principal = $1 AND state IN (0, 1) AND (created_ms, id) > ($2, $3)
		ORDER BY created_ms, id LIMIT $4`
)

func scanDelivery(row pgx.Row) (journal.Delivery, error) {
	var (
		d       journal.Delivery
		stage   int
		state   int
		thread  string
		payload string
	)
	err := row.Scan(&d.Position, &d.CreatedMS, &d.DeliveryID, &stage, &d.RoomID, &thread, &d.TxnID, &d.TurnID,
		&d.EventType, &payload, &d.ReplacesEventID, &d.Epoch, &state, &d.DeviceID, &d.Attempts, &d.EventID, &d.LastError)
	d.Stage, d.State, d.Thread, d.Content = journal.Stage(stage), journal.DeliveryState(state), journal.DecodeThread(thread), json.RawMessage(payload)
	return d, err
}

// outbox implements journal.OutboxStore for p inside tx.
type outbox struct {
	tx *Tx
	p  Principal
}

var _ journal.OutboxStore = outbox{}

// Delivery implements journal.OutboxStore.
func (o outbox) Delivery(deliveryID string, stage journal.Stage) (journal.Delivery, bool, error) {
	d, err := scanDelivery(o.tx.queryRow(selectDelivery, o.p.ID, deliveryID, int(stage)))
	if errors.Is(err, pgx.ErrNoRows) {
		return d, false, nil
	}
	return d, err == nil, err
}

// HasRetiredStage implements journal.OutboxStore.
func (o outbox) HasRetiredStage(deliveryID string) (bool, error) {
	var one int
	err := o.tx.queryRow(selectRetiredStage, o.p.ID, deliveryID).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// Membership implements journal.OutboxStore.
func (o outbox) Membership(room string) (int64, bool, error) {
	return membershipOf(o.tx.ctx, o.tx.tx, o.p, room)
}

// Source implements journal.OutboxStore.
func (o outbox) Source(eventID string) (string, int64, bool, error) {
	var (
		room  string
		epoch int64
	)
	err := o.tx.queryRow(selectSource, o.p.ID, eventID).Scan(&room, &epoch)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", 0, false, nil
	}
	return room, epoch, err == nil, err
}

// InsertStage implements journal.OutboxStore.
func (o outbox) InsertStage(req journal.EnqueueRequest, txnID string, epoch int64) error {
	thread, eventType, err := journal.StageColumns(req)
	if err != nil {
		return err
	}
	now := o.tx.nowMS()
	_, err = o.tx.exec(insertDelivery, o.p.ID, req.DeliveryID, int(req.Stage), req.RoomID, thread, txnID,
		req.TurnID, eventType, string(req.Content), epoch, now, now)
	return err
}

// UpdateStage implements journal.OutboxStore.
func (o outbox) UpdateStage(d journal.Delivery, req journal.EnqueueRequest, epoch int64) error {
	thread, eventType, err := journal.StageColumns(req)
	if err != nil {
		return err
	}
	_, err = o.tx.exec(updateQueuedDelivery, req.RoomID, thread, req.TurnID, eventType, string(req.Content),
		epoch, o.tx.nowMS(), d.Position)
	return err
}

// Settle implements journal.OutboxStore.
func (o outbox) Settle(eventIDs []string) error {
	_, err := Settle(o.tx, o.p, eventIDs)
	return err
}

// MarkAttempted implements journal.OutboxStore.
func (o outbox) MarkAttempted(d journal.Delivery, deviceID, replaces string) error {
	_, err := o.tx.exec(claimDelivery, deviceID, replaces, o.tx.nowMS(), d.Position)
	return err
}

// MarkRetired implements journal.OutboxStore.
func (o outbox) MarkRetired(d journal.Delivery) error {
	_, err := o.tx.exec(retireDelivery, o.tx.nowMS(), d.Position)
	return err
}

// MarkFailed implements journal.OutboxStore.
func (o outbox) MarkFailed(d journal.Delivery, reason string, permanent bool) error {
	_, err := o.tx.exec(failDelivery, permanent, reason, o.tx.nowMS(), d.Position)
	return err
}

// MarkAcknowledged implements journal.OutboxStore.
func (o outbox) MarkAcknowledged(d journal.Delivery, eventID string) error {
	_, err := o.tx.exec(ackDelivery, eventID, o.tx.nowMS(), d.Position)
	return err
}

// AssignDevice implements journal.OutboxStore.
func (o outbox) AssignDevice(d journal.Delivery, deviceID string) error {
	_, err := o.tx.exec(adoptDevice, deviceID, o.tx.nowMS(), d.Position)
	return err
}

// RecordTurn implements journal.OutboxStore.
func (o outbox) RecordTurn(rec journal.TurnRecord) error { return UpsertTurn(o.tx, o.p.Agent, rec) }

// CompleteTurn implements journal.OutboxStore.
func (o outbox) CompleteTurn(turnID, eventID string) error {
	return completeTurn(o.tx, o.p.Agent, turnID, eventID)
}

// ProjectDelivered implements journal.OutboxStore (journal.AdmitDelivered).
func (o outbox) ProjectDelivered(d journal.Delivery, sent journal.Sent) (bool, error) {
	return journal.AdmitDelivered(newAdmission(o.tx, o.p), o.p.UserID, d, sent, o.tx.now)
}

// EnqueueAndSettle writes (or updates, while unattempted) one delivery
// stage and settles its sources, in tx (journal.EnqueueStage).
func EnqueueAndSettle(tx *Tx, p Principal, req journal.EnqueueRequest) (journal.EnqueueResult, []hint.Hint, error) {
	res, err := journal.EnqueueStage(outbox{tx, p}, p.Principal, req)
	if err != nil {
		return res, nil, err
	}
	return res, []hint.Hint{{Principal: p.String(), Room: req.RoomID}}, nil
}

// Claim freezes one delivery stage for sending (journal.ClaimStage).
func Claim(tx *Tx, p Principal, deliveryID string, stage journal.Stage, deviceID string) (journal.Delivery, error) {
	return journal.ClaimStage(outbox{tx, p}, deliveryID, stage, deviceID)
}

// AdoptDevice moves an attempted row to deviceID after reconciliation
// found no copy of it in the room (journal.AdoptStageDevice).
func AdoptDevice(tx *Tx, p Principal, deliveryID string, stage journal.Stage, deviceID string) error {
	return journal.AdoptStageDevice(outbox{tx, p}, deliveryID, stage, deviceID)
}

// Acknowledge records the server's record of a sent stage
// (journal.AcknowledgeStage).
func Acknowledge(tx *Tx, p Principal, deliveryID string, stage journal.Stage, sent journal.Sent) (journal.AckResult, []hint.Hint, error) {
	res, err := journal.AcknowledgeStage(outbox{tx, p}, deliveryID, stage, sent)
	if err != nil || !res.First {
		return res, nil, err
	}
	return res, []hint.Hint{{Principal: p.String(), Room: res.RoomID}}, nil
}

// Fail records a failed send (journal.FailStage).
func Fail(tx *Tx, p Principal, deliveryID string, stage journal.Stage, reason string, permanent bool) error {
	return journal.FailStage(outbox{tx, p}, deliveryID, stage, reason, permanent)
}

// Retire withdraws a stage that was never attempted (journal.RetireStage).
func Retire(tx *Tx, p Principal, deliveryID string, stage journal.Stage) error {
	return journal.RetireStage(outbox{tx, p}, deliveryID, stage)
}

// delivery loads one stage outside a write transaction.
func (s *Store) delivery(ctx context.Context, p Principal, deliveryID string, stage journal.Stage) (journal.Delivery, error) {
	d, err := scanDelivery(s.pool.QueryRow(ctx, selectDelivery, p.ID, deliveryID, int(stage)))
	if errors.Is(err, pgx.ErrNoRows) {
		return d, fmt.Errorf("%w: %s/%s", journal.ErrNoDelivery, deliveryID, stage)
	}
	return d, err
}

// unacknowledged scans p's queued and attempted rows, oldest first, with a
// row-value cursor.
func (s *Store) unacknowledged(ctx context.Context, p Principal, limit int, after *journal.DeliveryCursor) ([]journal.Delivery, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("%w: limit must be positive", journal.ErrInvalidArgument)
	}
	var (
		rows pgx.Rows
		err  error
	)
	if after == nil {
		rows, err = s.pool.Query(ctx, selectUnackedHead, p.ID, limit)
	} else {
		rows, err = s.pool.Query(ctx, selectUnackedAfter, p.ID, after.CreatedMS, after.Position, limit)
	}
	if err != nil {
		return nil, fmt.Errorf("scan outbox: %w", err)
	}
	// A scan with no rows is nil, as every backend's is.
	out, err := pgx.AppendRows([]journal.Delivery(nil), rows, func(r pgx.CollectableRow) (journal.Delivery, error) { return scanDelivery(r) })
	if err != nil {
		return nil, fmt.Errorf("scan outbox: %w", err)
	}
	return out, nil
}
