package sqlitefs

const (
	deliveryColumns = `id, created_ms, delivery_id, stage, room_id, thread_id, txn_id, turn_id, event_type,
		payload_json, replaces_event_id, epoch, state, device_id, attempts, event_id, last_error`
	selectDelivery = `SELECT ` + deliveryColumns + ` FROM delivery_outbox
		WHERE principal = ? AND delivery_id = ? AND stage = ?`
	selectRetiredStage = `SELECT EXISTS (SELECT 1 FROM delivery_outbox WHERE principal = ? AND delivery_id = ? AND state = 4)`
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
	// Walks the room's acknowledged rows on delivery_outbox_room: it runs
	// only while a reconciliation weighs a redacted event.
	selectDeliveredEvent = `SELECT EXISTS (SELECT 1 FROM delivery_outbox
		WHERE principal = ? AND room_id = ? AND state = 2 AND event_id = ?)`
)
