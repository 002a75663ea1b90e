package journalsql

import (
	"encoding/json"

	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journal"
)

// scanDelivery reads one row of the DeliveryColumns shape.
func scanDelivery(row Row) (journal.Delivery, error) {
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
	tx Tx
	p  Principal
}

var _ journal.OutboxStore = outbox{}

// nowMS is the transaction's time in the stored form.
func (o outbox) nowMS() int64 { return o.tx.Now().UnixMilli() }

// Delivery implements journal.OutboxStore.
func (o outbox) Delivery(deliveryID string, stage journal.Stage) (journal.Delivery, bool, error) {
	d, err := scanDelivery(o.tx.QueryRow(SelectDelivery, o.p.ID, deliveryID, int(stage)))
	if o.tx.NoRows(err) {
		return d, false, nil
	}
	return d, err == nil, err
}

// HasRetiredStage implements journal.OutboxStore.
func (o outbox) HasRetiredStage(deliveryID string) (bool, error) {
	return exists(o.tx, SelectRetiredStage, o.p.ID, deliveryID)
}

// Membership implements journal.OutboxStore.
func (o outbox) Membership(room string) (int64, bool, error) { return membershipOf(o.tx, o.p, room) }

// Source implements journal.OutboxStore.
func (o outbox) Source(eventID string) (string, int64, bool, error) {
	var (
		room  string
		epoch int64
	)
	err := o.tx.QueryRow(SelectSource, o.p.ID, EventKey(eventID)).Scan(&room, &epoch)
	if o.tx.NoRows(err) {
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
	now := o.nowMS()
	_, err = o.tx.Exec(InsertDelivery, o.p.ID, req.DeliveryID, int(req.Stage), req.RoomID, thread, txnID,
		req.TurnID, eventType, string(req.Content), epoch, now, now)
	return err
}

// UpdateStage implements journal.OutboxStore.
func (o outbox) UpdateStage(d journal.Delivery, req journal.EnqueueRequest, epoch int64) error {
	thread, eventType, err := journal.StageColumns(req)
	if err != nil {
		return err
	}
	_, err = o.tx.Exec(UpdateQueuedDelivery, req.RoomID, thread, req.TurnID, eventType, string(req.Content),
		epoch, o.nowMS(), d.Position)
	return err
}

// Settle implements journal.OutboxStore.
func (o outbox) Settle(eventIDs []string) error {
	_, err := Settle(o.tx, o.p, eventIDs)
	return err
}

// MarkAttempted implements journal.OutboxStore.
func (o outbox) MarkAttempted(d journal.Delivery, deviceID, replaces string) error {
	_, err := o.tx.Exec(ClaimDelivery, deviceID, replaces, o.nowMS(), d.Position)
	return err
}

// MarkRetired implements journal.OutboxStore.
func (o outbox) MarkRetired(d journal.Delivery) error {
	_, err := o.tx.Exec(RetireDelivery, o.nowMS(), d.Position)
	return err
}

// MarkFailed implements journal.OutboxStore.
func (o outbox) MarkFailed(d journal.Delivery, reason string, permanent bool) error {
	_, err := o.tx.Exec(FailDelivery, permanent, reason, o.nowMS(), d.Position)
	return err
}

// MarkAcknowledged implements journal.OutboxStore.
func (o outbox) MarkAcknowledged(d journal.Delivery, eventID string) error {
	_, err := o.tx.Exec(AckDelivery, eventID, o.nowMS(), d.Position)
	return err
}

// AssignDevice implements journal.OutboxStore.
func (o outbox) AssignDevice(d journal.Delivery, deviceID string) error {
	_, err := o.tx.Exec(MoveDevice, deviceID, o.nowMS(), d.Position)
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
	return journal.AdmitDelivered(newAdmission(o.tx, o.p), o.p.UserID, d, sent, o.tx.Now())
}

// roomHint is the wake-up of a commit that changed p's room.
func roomHint(p Principal, room string) []hint.Hint {
	return []hint.Hint{{Principal: p.String(), Room: room}}
}

// EnqueueAndSettle writes (or updates, while unattempted) one delivery
// stage and settles its sources, in tx (journal.EnqueueStage).
func EnqueueAndSettle(tx Tx, p Principal, req journal.EnqueueRequest) (journal.EnqueueResult, []hint.Hint, error) {
	res, err := journal.EnqueueStage(outbox{tx, p}, p.Principal, req)
	if err != nil {
		return res, nil, err
	}
	return res, roomHint(p, req.RoomID), nil
}

// Claim freezes one delivery stage for sending (journal.ClaimStage).
func Claim(tx Tx, p Principal, deliveryID string, stage journal.Stage, deviceID string) (journal.Delivery, error) {
	return journal.ClaimStage(outbox{tx, p}, deliveryID, stage, deviceID)
}

// AdoptDevice moves an attempted row to deviceID after reconciliation
// found no copy of it in the room (journal.AdoptStageDevice).
func AdoptDevice(tx Tx, p Principal, deliveryID string, stage journal.Stage, deviceID string) error {
	return journal.AdoptStageDevice(outbox{tx, p}, deliveryID, stage, deviceID)
}

// Acknowledge records the server's record of a sent stage
// (journal.AcknowledgeStage).
func Acknowledge(tx Tx, p Principal, deliveryID string, stage journal.Stage, sent journal.Sent) (journal.AckResult, []hint.Hint, error) {
	res, err := journal.AcknowledgeStage(outbox{tx, p}, deliveryID, stage, sent)
	if err != nil || !res.First {
		return res, nil, err
	}
	return res, roomHint(p, res.RoomID), nil
}

// Fail records a failed send (journal.FailStage).
func Fail(tx Tx, p Principal, deliveryID string, stage journal.Stage, reason string, permanent bool) error {
	return journal.FailStage(outbox{tx, p}, deliveryID, stage, reason, permanent)
}

// Retire withdraws a stage that was never attempted (journal.RetireStage).
func Retire(tx Tx, p Principal, deliveryID string, stage journal.Stage) error {
	return journal.RetireStage(outbox{tx, p}, deliveryID, stage)
}
