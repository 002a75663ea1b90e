package pgfs

const (
	upsertDeparture = `INSERT INTO rooms (principal, room_id, epoch, departed) VALUES ($1, $2, 1, true)
		ON CONFLICT (principal, room_id) DO UPDATE SET epoch = rooms.epoch + 1, departed = true`
	upsertJoin = `INSERT INTO rooms (principal, room_id, epoch, departed) VALUES ($1, $2, 0, false)
		ON CONFLICT (principal, room_id) DO UPDATE SET departed = false`
	insertObservation = `INSERT INTO membership_observations (principal, observation_id, room_id) VALUES ($1, $2, $3)
		ON CONFLICT (principal, observation_id) DO NOTHING`
	insertOwedReport  = `INSERT INTO owed_departure_reports (principal, room_id, owed_ms) VALUES ($1, $2, $3)`
	selectOldestOwed  = `SELECT id FROM owed_departure_reports WHERE principal = $1 AND room_id = $2 AND owed_ms >= $3 ORDER BY id LIMIT 1`
	deleteOwedReport  = `DELETE FROM owed_departure_reports WHERE id = $1`
	deleteExpiredOwed = `DELETE FROM owed_departure_reports WHERE principal = $1 AND room_id = $2 AND owed_ms < $3`
	selectOwedRooms   = `SELECT DISTINCT room_id FROM owed_departure_reports WHERE principal = $1 ORDER BY room_id`
	// The newest message is the main timeline's, read off the page index;
	// pending events are counted off the pending index.
	selectRoomActivity = `SELECT r.room_id, r.epoch, r.departed,
		COALESCE((SELECT MAX(v.created_ts) FROM visible_messages v WHERE v.room = r.id AND v.thread_id = ''), 0),
		(SELECT COUNT(*) FROM journal_events e WHERE e.principal = r.principal AND e.state = 0 AND e.room_id = r.room_id)
		FROM rooms r WHERE r.principal = $1 ORDER BY r.room_id`
	deleteOwedRoom = `DELETE FROM owed_departure_reports WHERE principal = $1 AND room_id = $2`

	// The fence removes what was derived from the ended membership: the
	// visible rows, held edits, tombstones and coverage markers. Attempted
	// outbox rows stay (their outcome is unknown and their frozen payload
	// allows an exact retry); journal rows stay as proof; pending
	// redactions stay because they still owe cleanup.
	fenceVisible = `DELETE FROM visible_messages
		WHERE room = (SELECT id FROM rooms WHERE principal = $1 AND room_id = $2)`
	fenceHeldEdits  = `DELETE FROM unresolved_edits WHERE principal = $1 AND room_id = $2`
	fenceTombstones = `DELETE FROM redaction_tombstones WHERE principal = $1 AND room_id = $2`
	fenceCoverage   = `DELETE FROM hydration_coverage WHERE principal = $1 AND room_id = $2`
	// A row never attempted was never seen by the room, so withdrawing it
	// is exact; it would otherwise answer in a membership that ended.
	fenceUnattempted = `UPDATE delivery_outbox SET state = 4, updated_ms = $1
		WHERE principal = $2 AND room_id = $3 AND state = 0`
	// Pending turn-backed events (messages and media) of the old
	// membership are settled: a turn started from them would answer into
	// a membership that has ended.
	fencePendingTurnWork = `UPDATE journal_events SET state = 1
		WHERE principal = $1 AND state = 0 AND room_id = $2 AND kind IN (1, 2)`
)
