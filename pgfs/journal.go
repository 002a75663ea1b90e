package pgfs

// State values of journal_events.state. The statements below spell the
// pending state as the literal 0: the partial index journal_events_pending
// is chosen only when the planner sees its predicate in the query itself.
const (
	statePending = 0
	stateSettled = 1
)

const (
	selectRoom = `SELECT id, epoch, departed FROM rooms WHERE principal = $1 AND room_id = $2`
	// The no-op update makes RETURNING hand back the row even when another
	// command interned it first.
	insertRoom = `INSERT INTO rooms (principal, room_id) VALUES ($1, $2)
		ON CONFLICT (principal, room_id) DO UPDATE SET room_id = excluded.room_id
		RETURNING id, epoch, departed`
	// One round trip journals the event and, when $13 carries one, its
	// pending payload. A duplicate returns no row and writes nothing.
	insertJournalEvent = `WITH ev AS (
			INSERT INTO journal_events
				(principal, event_id, room_id, thread_id, target_id, kind, class, provenance, state, epoch, received_ms)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
			ON CONFLICT (principal, event_id) DO NOTHING
			RETURNING seq),
		payload AS (
			INSERT INTO journal_payloads (seq, payload)
			SELECT seq, $12::text FROM ev WHERE $12::text IS NOT NULL)
		SELECT seq FROM ev`
	selectThreadOf = `SELECT thread_id FROM journal_events
		WHERE principal = $1 AND event_id = $2 AND room_id = $3`
	insertRejected = `INSERT INTO rejected_events
		(principal, room_id, event_id, fingerprint, reason, raw, received_ms)
		VALUES ($1, $2, $3, $4, $5, $6, $7)
		ON CONFLICT (principal, fingerprint) DO NOTHING`
	// Settling drops the payloads through the journal_events_settled
	// trigger, in the same statement.
	settleEvent = `UPDATE journal_events SET state = 1
		WHERE principal = $1 AND event_id = $2 AND state = 0`
	settleEventInRoom = `UPDATE journal_events SET state = 1
		WHERE principal = $1 AND event_id = $2 AND room_id = $3 AND state = 0`
	// A pending row without its payload reads as an empty payload, which
	// the reader reports as unreadable rather than hiding.
	selectPending = `SELECT j.seq, j.event_id, j.room_id, j.kind, j.epoch, coalesce(p.payload, '')
		FROM journal_events j LEFT JOIN journal_payloads p ON p.seq = j.seq
		WHERE j.principal = $1 AND j.state = 0 AND j.seq > $2
		ORDER BY j.seq LIMIT $3`
	selectAdmittedEvent = `SELECT room_id, thread_id, state = 0 FROM journal_events
		WHERE principal = $1 AND event_id = $2`
)
