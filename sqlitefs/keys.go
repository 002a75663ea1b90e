package sqlitefs

// Encrypted events awaiting their keys (journal_events.state 2) and those
// settled as undecryptable (3).
const (
	markAwaiting   = `UPDATE journal_events SET state = 2 WHERE seq = ?`
	insertAwaiting = `INSERT INTO awaiting_keys (seq, principal, room_id, session_id, event, received_ms)
		VALUES (?, ?, ?, ?, ?, ?)`
	selectAwaitingRow = `SELECT room_id, epoch, provenance FROM journal_events
		WHERE principal = ? AND seq = ? AND state = 2`
	resolveDecrypted = `UPDATE journal_events SET kind = ?, class = ?, thread_id = ?, target_id = ?, state = ?
		WHERE principal = ? AND seq = ? AND state = 2`
	settleUndecryptable = `UPDATE journal_events SET state = 3 WHERE principal = ? AND seq = ? AND state = 2`
	deleteAwaiting      = `DELETE FROM awaiting_keys WHERE principal = ? AND seq = ?`
	selectKeyWaits      = `SELECT DISTINCT room_id, session_id FROM awaiting_keys WHERE principal = ? LIMIT ?`
	selectAwaitingFor   = `SELECT a.seq, j.event_id, j.provenance, a.event, a.received_ms
		FROM awaiting_keys a JOIN journal_events j ON j.seq = a.seq
		WHERE a.principal = ? AND a.room_id = ? AND a.session_id = ?
		ORDER BY a.seq LIMIT ?`
	selectExpiredAwaited = `SELECT seq FROM awaiting_keys WHERE principal = ? AND received_ms < ? ORDER BY seq LIMIT ?`
	fenceAwaiting        = `UPDATE journal_events SET state = 1
		WHERE seq IN (SELECT seq FROM awaiting_keys WHERE principal = ? AND room_id = ?) AND state = 2`
	probeJournaled = `SELECT thread_id FROM journal_events
		WHERE principal = ? AND id_hash = ? AND event_id = ? AND room_id = ? AND state <> 2`
	fenceAwaitingKeys = `DELETE FROM awaiting_keys WHERE principal = ? AND room_id = ?`
)
