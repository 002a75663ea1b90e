package sqlitefs

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journal"
)

// defaultEventType is the event type of a reply that does not name one.
const defaultEventType = "m.room.message"

const (
	deliveryColumns = `id, created_ms, delivery_id, stage, room_id, thread_id, txn_id, turn_id, event_type,
		payload_json, replaces_event_id, epoch, state, device_id, attempts, event_id, last_error`
	selectDelivery = `SELECT ` + deliveryColumns + ` FROM delivery_outbox
		WHERE principal = ? AND delivery_id = ? AND stage = ?`
	selectRetiredStage = `SELECT 1 FROM delivery_outbox WHERE principal = ? AND delivery_id = ? AND state = 4 LIMIT 1`
	selectSource       = `SELECT room_id, epoch FROM journal_events WHERE principal = ? AND id_hash = ? AND event_id = ?`
	insertDelivery     = `INSERT INTO delivery_outbox
		(principal, delivery_id, stage, room_id, thread_id, txn_id, turn_id, event_type, payload_json, epoch, state, created_ms, updated_ms)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?)`
	updateQueuedDelivery = `UPDATE delivery_outbox
		SET room_id = ?, thread_id = ?, turn_id = ?, event_type = ?, payload_json = ?, epoch = ?, updated_ms = ?
		WHERE id = ? AND attempted = 0 AND state = 0`
	claimDelivery = `UPDATE delivery_outbox
		SET attempted = 1, state = 1, device_id = CASE WHEN device_id = '' THEN ? ELSE device_id END,
		    replaces_event_id = ?, attempts = attempts + 1, updated_ms = ?
		WHERE id = ?`
	retireDelivery = `UPDATE delivery_outbox SET state = 4, updated_ms = ? WHERE id = ? AND state = 0`
	adoptDevice    = `UPDATE delivery_outbox SET device_id = ?, updated_ms = ? WHERE id = ? AND state = 1`
	ackDelivery    = `UPDATE delivery_outbox SET state = 2, event_id = ?, last_error = '', updated_ms = ?
		WHERE id = ? AND state <> 2`
	failDelivery = `UPDATE delivery_outbox SET state = CASE WHEN ? THEN 3 ELSE state END, last_error = ?, updated_ms = ?
		WHERE id = ? AND state IN (0, 1)`
	selectUnackedHead = `SELECT ` + deliveryColumns + ` FROM delivery_outbox
		WHERE principal = ? AND state IN (0, 1)
		ORDER BY created_ms, id LIMIT ?`
	selectUnackedAfter = `SELECT ` + deliveryColumns + ` FROM delivery_outbox
		WHERE principal = ? AND state IN (0, 1) AND (created_ms, id) > (?, ?)
		ORDER BY created_ms, id LIMIT ?`
)

func scanDelivery(row interface{ Scan(...any) error }) (journal.Delivery, error) {
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

func loadDelivery(tx *Tx, p Principal, deliveryID string, stage journal.Stage) (journal.Delivery, error) {
	d, err := scanDelivery(tx.queryRow(selectDelivery, p.ID, deliveryID, int(stage)))
	if errors.Is(err, sql.ErrNoRows) {
		return d, fmt.Errorf("%w: %s/%s", journal.ErrNoDelivery, deliveryID, stage)
	}
	return d, err
}

func validStage(s journal.Stage) error {
	if s != journal.StageInitial && s != journal.StageFinal {
		return fmt.Errorf("%w: unknown stage %d", journal.ErrInvalidArgument, s)
	}
	return nil
}

// EnqueueAndSettle writes (or updates, while unattempted) one delivery
// stage and settles its sources, in tx. It refuses when the membership that
// admitted a source has ended, when a source was admitted in another room,
// and when any stage of the delivery is retired.
func EnqueueAndSettle(tx *Tx, p Principal, req journal.EnqueueRequest) (journal.EnqueueResult, []hint.Hint, error) {
	var res journal.EnqueueResult
	if err := req.Validate(); err != nil {
		return res, nil, err
	}
	thread, err := journal.EncodeThread(req.Thread)
	if err != nil {
		return res, nil, err
	}
	eventType := req.EventType
	if eventType == "" {
		eventType = defaultEventType
	}
	existing, err := loadDelivery(tx, p, req.DeliveryID, req.Stage)
	if err != nil && !errors.Is(err, journal.ErrNoDelivery) {
		return res, nil, err
	}
	exists := err == nil
	// Replaying a stage already attempted is a no-op whatever happened to
	// its sibling (a final's claim retires its unsent placeholder); only a
	// stage not yet sent must not adopt a delivery with a retired stage.
	if !exists || existing.State == journal.DeliveryQueued || existing.State == journal.DeliveryRetired {
		var one int
		switch err := tx.queryRow(selectRetiredStage, p.ID, req.DeliveryID).Scan(&one); {
		case err == nil:
			return res, nil, fmt.Errorf("%w: %s", journal.ErrDeliveryRetired, req.DeliveryID)
		case !errors.Is(err, sql.ErrNoRows):
			return res, nil, err
		}
	}
	epoch, departed, err := membershipOf(tx, p, req.RoomID)
	if err != nil {
		return res, nil, err
	}
	if departed {
		return res, nil, fmt.Errorf("%w: not in %s", journal.ErrMembershipEnded, req.RoomID)
	}
	for _, src := range req.Sources {
		var (
			room     string
			srcEpoch int64
		)
		err := tx.queryRow(selectSource, p.ID, IDHash(src), src).Scan(&room, &srcEpoch)
		if errors.Is(err, sql.ErrNoRows) || (err == nil && room != req.RoomID) {
			return res, nil, fmt.Errorf("%w: %s in %s", journal.ErrUnknownSource, src, req.RoomID)
		}
		if err != nil {
			return res, nil, err
		}
		if srcEpoch != epoch {
			return res, nil, fmt.Errorf("%w: %s was admitted under epoch %d, the room is at %d", journal.ErrMembershipEnded, src, srcEpoch, epoch)
		}
	}
	// Both stages of one delivery answer under one membership.
	for _, other := range []journal.Stage{journal.StageInitial, journal.StageFinal} {
		if other == req.Stage {
			continue
		}
		d, err := loadDelivery(tx, p, req.DeliveryID, other)
		if err == nil && d.Epoch != epoch {
			return res, nil, fmt.Errorf("%w: stage %s was enqueued under epoch %d", journal.ErrMembershipEnded, other, d.Epoch)
		}
		if err != nil && !errors.Is(err, journal.ErrNoDelivery) {
			return res, nil, err
		}
	}

	res.TxnID, res.Epoch = journal.TxnID(p.Principal, req.DeliveryID, req.Stage), epoch
	switch {
	case !exists:
		now := tx.nowMS()
		if _, err := tx.exec(insertDelivery, p.ID, req.DeliveryID, int(req.Stage), req.RoomID, thread, res.TxnID,
			req.TurnID, eventType, string(req.Content), epoch, now, now); err != nil {
			return res, nil, fmt.Errorf("insert delivery: %w", err)
		}
		res.Outcome = journal.EnqueueCreated
	case existing.State == journal.DeliveryQueued:
		if _, err := tx.exec(updateQueuedDelivery, req.RoomID, thread, req.TurnID, eventType, string(req.Content),
			epoch, tx.nowMS(), existing.Position); err != nil {
			return res, nil, fmt.Errorf("update delivery: %w", err)
		}
		res.Outcome = journal.EnqueueUpdated
	default:
		// Attempted (or done): what may already be visible never changes.
		res.Outcome, res.Epoch = journal.EnqueueFrozen, existing.Epoch
	}
	if _, err := Settle(tx, p, req.Sources); err != nil {
		return res, nil, err
	}
	return res, []hint.Hint{{Principal: p.String(), Room: req.RoomID}}, nil
}

// ErrPlaceholderSuperseded refuses to claim an initial whose final already
// owns the delivery. Claim retires the placeholder as it refuses, and unlike
// other refusals that write must commit, or the scan offers it forever.
var ErrPlaceholderSuperseded = fmt.Errorf("%w: the final already owns the delivery", journal.ErrNotClaimable)

// Claim freezes one delivery stage for sending: attempted=1 and the sending
// device are committed before any network I/O. A final learns here whether
// it edits its acknowledged initial; an initial that was never attempted is
// dropped in favour of the final, and an initial can never become visible
// once its final owns the delivery.
func Claim(tx *Tx, p Principal, deliveryID string, stage journal.Stage, deviceID string) (journal.Delivery, error) {
	if err := validStage(stage); err != nil {
		return journal.Delivery{}, err
	}
	d, err := loadDelivery(tx, p, deliveryID, stage)
	if err != nil {
		return d, err
	}
	switch d.State {
	case journal.DeliveryAttempted:
		if d.DeviceID != "" && d.DeviceID != deviceID {
			return d, fmt.Errorf("%w: %s/%s was sent from %s", journal.ErrDeviceChanged, deliveryID, stage, d.DeviceID)
		}
		// A retry: the identical delivery, same payload and transaction ID.
		if _, err := tx.exec(claimDelivery, deviceID, d.ReplacesEventID, tx.nowMS(), d.Position); err != nil {
			return d, err
		}
		return loadDelivery(tx, p, deliveryID, stage)
	case journal.DeliveryQueued:
	default:
		return d, fmt.Errorf("%w: %s/%s is %s", journal.ErrNotClaimable, deliveryID, stage, d.State)
	}
	replaces := ""
	other := journal.StageFinal
	if stage == journal.StageFinal {
		other = journal.StageInitial
	}
	o, err := loadDelivery(tx, p, deliveryID, other)
	switch {
	case errors.Is(err, journal.ErrNoDelivery):
	case err != nil:
		return d, err
	case stage == journal.StageInitial && o.State != journal.DeliveryQueued:
		// The final already owns the delivery: the placeholder never shows.
		if _, err := tx.exec(retireDelivery, tx.nowMS(), d.Position); err != nil {
			return d, err
		}
		return d, fmt.Errorf("%w: %s", ErrPlaceholderSuperseded, deliveryID)
	case stage == journal.StageFinal && o.State == journal.DeliveryAttempted:
		return d, fmt.Errorf("%w: %s", journal.ErrStageBlocked, deliveryID)
	case stage == journal.StageFinal && o.State == journal.DeliveryAcknowledged:
		replaces = o.EventID
	case stage == journal.StageFinal && o.State == journal.DeliveryQueued:
		// Never attempted, so never visible: drop the placeholder.
		if _, err := tx.exec(retireDelivery, tx.nowMS(), o.Position); err != nil {
			return d, err
		}
	}
	if _, err := tx.exec(claimDelivery, deviceID, replaces, tx.nowMS(), d.Position); err != nil {
		return d, fmt.Errorf("claim: %w", err)
	}
	return loadDelivery(tx, p, deliveryID, stage)
}

// AdoptDevice moves an attempted row to deviceID after reconciliation
// found no copy of it in the room: from then on its retries are
// deduplicated per the new device.
func AdoptDevice(tx *Tx, p Principal, deliveryID string, stage journal.Stage, deviceID string) error {
	if deviceID == "" {
		return fmt.Errorf("%w: device ID is required", journal.ErrInvalidArgument)
	}
	d, err := loadDelivery(tx, p, deliveryID, stage)
	if err != nil {
		return err
	}
	if d.State != journal.DeliveryAttempted {
		return fmt.Errorf("%w: %s/%s is %s", journal.ErrNotClaimable, deliveryID, stage, d.State)
	}
	_, err = tx.exec(adoptDevice, deviceID, tx.nowMS(), d.Position)
	return err
}

// Acknowledge records the event ID the homeserver returned. The first
// acknowledger also completes the turn record and, while the epoch that
// authorized the row is still current and the server's timestamp of the
// event is known, projects the delivered event; a later acknowledger writes
// nothing and learns the first's event ID.
func Acknowledge(tx *Tx, p Principal, deliveryID string, stage journal.Stage, sent journal.Sent) (journal.AckResult, []hint.Hint, error) {
	if !journal.ValidEventID(sent.EventID) {
		return journal.AckResult{}, nil, fmt.Errorf("%w: %q is not an event ID", journal.ErrInvalidArgument, sent.EventID)
	}
	if sent.ServerTS < 0 {
		return journal.AckResult{}, nil, fmt.Errorf("%w: negative server timestamp %d", journal.ErrInvalidArgument, sent.ServerTS)
	}
	d, err := loadDelivery(tx, p, deliveryID, stage)
	if err != nil {
		return journal.AckResult{}, nil, err
	}
	if d.State == journal.DeliveryAcknowledged {
		return journal.AckResult{EventID: d.EventID}, nil, nil
	}
	if _, err := tx.exec(ackDelivery, sent.EventID, tx.nowMS(), d.Position); err != nil {
		return journal.AckResult{}, nil, fmt.Errorf("acknowledge: %w", err)
	}
	res := journal.AckResult{EventID: sent.EventID, First: true}
	if d.TurnID != "" && stage == journal.StageFinal {
		if err := completeTurn(tx, p.Agent, d.TurnID, sent.EventID); err != nil {
			return journal.AckResult{}, nil, err
		}
	}
	epoch, departed, err := membershipOf(tx, p, d.RoomID)
	if err != nil {
		return journal.AckResult{}, nil, err
	}
	if epoch == d.Epoch && !departed && sent.ServerTS > 0 {
		if res.Projected, err = projectDelivered(tx, p, d, sent); err != nil {
			return journal.AckResult{}, nil, err
		}
	}
	return res, []hint.Hint{{Principal: p.String(), Room: d.RoomID}}, nil
}

// projectDelivered admits the delivered event exactly as its sync echo
// reads, server timestamp included, so whichever of the two comes first
// projects it and the other deduplicates against it, and the projection
// rules stay one. An event the rules refuse (a timestamp the parser finds
// absurd) is recorded as rejected and left to its echo.
func projectDelivered(tx *Tx, p Principal, d journal.Delivery, sent journal.Sent) (bool, error) {
	content, err := journal.WireContent(d)
	if err != nil {
		return false, fmt.Errorf("project delivered: %w", err)
	}
	raw, err := json.Marshal(map[string]any{
		"event_id": sent.EventID, "type": d.EventType, "sender": p.UserID,
		"origin_server_ts": sent.ServerTS, "content": content,
	})
	if err != nil {
		return false, fmt.Errorf("project delivered: %w", err)
	}
	res, _, err := AdmitBatch(tx, p, Parse([]journal.Inbound{{RoomID: d.RoomID, Provenance: journal.Live, Event: raw}}, tx.now), "")
	if err != nil {
		return false, err
	}
	return res[0].Outcome != journal.Rejected, nil
}

// Fail records a failed send. A permanent failure takes the row out of
// recovery; an acknowledged row is never failed afterwards.
func Fail(tx *Tx, p Principal, deliveryID string, stage journal.Stage, reason string, permanent bool) error {
	d, err := loadDelivery(tx, p, deliveryID, stage)
	if err != nil {
		return err
	}
	_, err = tx.exec(failDelivery, permanent, reason, tx.nowMS(), d.Position)
	return err
}

// Retire withdraws a stage that was never attempted. An attempted stage's
// outcome is unknown, so it is kept for an exact retry instead.
func Retire(tx *Tx, p Principal, deliveryID string, stage journal.Stage) error {
	d, err := loadDelivery(tx, p, deliveryID, stage)
	if err != nil {
		return err
	}
	if d.State != journal.DeliveryQueued && d.State != journal.DeliveryRetired {
		return fmt.Errorf("%w: %s/%s is %s", journal.ErrNotClaimable, deliveryID, stage, d.State)
	}
	_, err = tx.exec(retireDelivery, tx.nowMS(), d.Position)
	return err
}

// Delivery loads one stage through a reader.
func (db *DB) Delivery(ctx context.Context, p Principal, deliveryID string, stage journal.Stage) (journal.Delivery, error) {
	d, err := scanDelivery(db.Readers.QueryRowContext(ctx, selectDelivery, p.ID, deliveryID, int(stage)))
	if errors.Is(err, sql.ErrNoRows) {
		return d, fmt.Errorf("%w: %s/%s", journal.ErrNoDelivery, deliveryID, stage)
	}
	return d, err
}

// Unacknowledged scans p's queued and attempted rows, oldest first, with a
// row-value cursor.
func (db *DB) Unacknowledged(ctx context.Context, p Principal, limit int, after *journal.DeliveryCursor) ([]journal.Delivery, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("%w: limit must be positive", journal.ErrInvalidArgument)
	}
	var (
		rows *sql.Rows
		err  error
	)
	if after == nil {
		rows, err = db.Readers.QueryContext(ctx, selectUnackedHead, p.ID, limit)
	} else {
		rows, err = db.Readers.QueryContext(ctx, selectUnackedAfter, p.ID, after.CreatedMS, after.Position, limit)
	}
	if err != nil {
		return nil, fmt.Errorf("scan outbox: %w", err)
	}
	defer rows.Close()
	var out []journal.Delivery
	for rows.Next() {
		d, err := scanDelivery(rows)
		if err != nil {
			return nil, fmt.Errorf("scan outbox: %w", err)
		}
		out = append(out, d)
	}
	return out, rows.Err()
}
