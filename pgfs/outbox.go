package pgfs

const (
	deliveryColumns = `id, created_ms, delivery_id, stage, room_id, thread_id, txn_id, turn_id, event_type,
		payload_json, replaces_event_id, epoch, state, device_id, attempts, event_id, last_error`
	selectDelivery = `SELECT ` + deliveryColumns + ` FROM delivery_outbox
		WHERE principal = $1 AND delivery_id = $2 AND stage = $3`
	selectRetiredStage = `SELECT EXISTS (SELECT 1 FROM delivery_outbox WHERE principal = $1 AND delivery_id = $2 AND state = 4)`
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
	// Walks the room's acknowledged rows on delivery_outbox_room: it runs
	// only while a reconciliation weighs a redacted event.
	selectDeliveredEvent = `SELECT EXISTS (SELECT 1 FROM delivery_outbox
		WHERE principal = $1 AND room_id = $2 AND state = 2 AND event_id = $3)`
)
