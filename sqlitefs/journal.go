package sqlitefs

// State values of journal_events.state.
const (
	statePending = 0
	stateSettled = 1
)

const (
	// The identity index holds a 64-bit hash of the event ID, not the ID:
	// three times as many entries per page, so a random insert splits
	// pages a third as often. The ID itself is compared on the row.
	insertJournalEvent = `INSERT INTO journal_events
		(principal, id_hash, event_id, room_id, thread_id, target_id, kind, class, provenance, state, epoch, received_ms)
		SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12
		WHERE NOT EXISTS (SELECT 1 FROM journal_events WHERE principal = ?1 AND id_hash = ?2 AND event_id = ?3)`
	insertPayload  = `INSERT INTO journal_payloads (seq, payload) VALUES (?, ?)`
	selectRoom     = `SELECT id, epoch, departed FROM rooms WHERE principal = ? AND room_id = ?`
	insertRoom     = `INSERT INTO rooms (principal, room_id) VALUES (?, ?)`
	selectThreadOf = `SELECT thread_id FROM journal_events WHERE principal = ? AND id_hash = ? AND event_id = ? AND room_id = ?`
	insertRejected = `INSERT INTO rejected_events
		(principal, room_id, event_id, fingerprint, reason, raw, received_ms)
		VALUES (?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (principal, fingerprint) DO NOTHING`
	// Settling drops the payload through the journal_events_settled trigger.
	settleEvent = `UPDATE journal_events SET state = 1
		WHERE principal = ? AND id_hash = ? AND event_id = ? AND state = 0`
	settleEventInRoom = `UPDATE journal_events SET state = 1
		WHERE principal = ? AND id_hash = ? AND event_id = ? AND room_id = ? AND state = 0`
	// A pending row without its payload reads as an empty payload, which
	// the reader reports as unreadable rather than hiding.
	selectPending = `SELECT j.seq, j.event_id, j.room_id, j.kind, j.epoch, coalesce(p.payload, '')
		FROM journal_events j LEFT JOIN journal_payloads p ON p.seq = j.seq
		WHERE j.principal = ? AND j.state = 0 AND j.seq > ?
		ORDER BY j.seq LIMIT ?`
	selectAdmittedEvent = `SELECT room_id, thread_id, state = 0 FROM journal_events
		WHERE principal = ? AND id_hash = ? AND event_id = ?`
)
