package pgfs

// Encrypted events awaiting their keys (journal_events.state 2) and those
// settled as undecryptable (3).
const (
	markAwaiting   = `UPDATE journal_events SET state = 2 WHERE seq = $1`
	insertAwaiting = `INSERT INTO awaiting_keys (seq, principal, room_id, session_id, event, received_ms)
		VALUES ($1, $2, $3, $4, $5, $6)`
	selectAwaitingRow = `SELECT room_id, epoch, provenance FROM journal_events
		WHERE principal = $1 AND seq = $2 AND state = 2`
	resolveDecrypted = `UPDATE journal_events SET kind = $1, class = $2, thread_id = $3, target_id = $4, state = $5
		WHERE principal = $6 AND seq = $7 AND state = 2`
	settleUndecryptable = `UPDATE journal_events SET state = 3 WHERE principal = $1 AND seq = $2 AND state = 2`
	deleteAwaiting      = `DELETE FROM awaiting_keys WHERE principal = $1 AND seq = $2`
	selectKeyWaits      = `SELECT DISTINCT room_id, session_id FROM awaiting_keys WHERE principal = $1 LIMIT $2`
	selectAwaitingFor   = `SELECT a.seq, j.event_id, j.provenance, a.event, a.received_ms
		FROM awaiting_keys a JOIN journal_events j ON j.seq = a.seq
		WHERE a.principal = $1 AND a.room_id = $2 AND a.session_id = $3
		ORDER BY a.seq LIMIT $4`
	selectExpiredAwaited = `SELECT seq FROM awaiting_keys WHERE principal = $1 AND received_ms < $2 ORDER BY seq LIMIT $3`
	fenceAwaiting        = `UPDATE journal_events SET state = 1
		WHERE seq IN (SELECT seq FROM awaiting_keys WHERE principal = $1 AND room_id = $2) AND state = 2`
	probeJournaled = `SELECT thread_id FROM journal_events
		WHERE principal = $1 AND event_id = $2 AND room_id = $3 AND state <> 2`
	fenceAwaitingKeys = `DELETE FROM awaiting_keys WHERE principal = $1 AND room_id = $2`
	insertPayload     = `INSERT INTO journal_payloads (seq, payload) VALUES ($1, $2)`
)
