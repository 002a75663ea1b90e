package sqlitefs

const (
	selectMembership = `SELECT epoch, departed FROM rooms WHERE principal = ? AND room_id = ?`
	upsertDeparture  = `INSERT INTO rooms (principal, room_id, epoch, departed) VALUES (?, ?, 1, 1)
		ON CONFLICT (principal, room_id) DO UPDATE SET epoch = epoch + 1, departed = 1`
	upsertJoin = `INSERT INTO rooms (principal, room_id, epoch, departed) VALUES (?, ?, 0, 0)
		ON CONFLICT (principal, room_id) DO UPDATE SET departed = 0`
	insertObservation = `INSERT INTO membership_observations (principal, observation_id, room_id) VALUES (?, ?, ?)
		ON CONFLICT (principal, observation_id) DO NOTHING`
	insertOwedReport  = `INSERT INTO owed_departure_reports (principal, room_id, owed_ms) VALUES (?, ?, ?)`
	selectOldestOwed  = `SELECT id FROM owed_departure_reports WHERE principal = ? AND room_id = ? AND owed_ms >= ? ORDER BY id LIMIT 1`
	deleteOwedReport  = `DELETE FROM owed_departure_reports WHERE id = ?`
	deleteExpiredOwed = `DELETE FROM owed_departure_reports WHERE principal = ? AND room_id = ? AND owed_ms < ?`
	selectOwedRooms   = `SELECT DISTINCT room_id FROM owed_departure_reports WHERE principal = ? ORDER BY room_id`
	// The newest message is the main timeline's, read off the page index;
	// pending events are counted off the pending index.
	selectRoomActivity = `SELECT r.room_id, r.epoch, r.departed,
		COALESCE((SELECT MAX(v.created_ts) FROM visible_messages v WHERE v.room = r.id AND v.thread_id = ''), 0),
		(SELECT COUNT(*) FROM journal_events e WHERE e.principal = r.principal AND e.state = 0 AND e.room_id = r.room_id)
		FROM rooms r WHERE r.principal = ? ORDER BY r.room_id`
	deleteOwedRoom = `DELETE FROM owed_departure_reports WHERE principal = ? AND room_id = ?`
	// The merged rows are found through the page index, the unmerged tail
	// by its seq range; the delete trigger takes their index entries.
	fenceVisible = `DELETE FROM visible_messages WHERE seq IN
		(SELECT seq FROM visible_page WHERE room = (` + roomKeyOf + `)
		 UNION ALL
		 SELECT seq FROM visible_messages WHERE seq > ` + mergedUpto + ` AND room = (` + roomKeyOf + `))`
	fenceHeldEdits       = `DELETE FROM unresolved_edits WHERE principal = ? AND room_id = ?`
	fenceTombstones      = `DELETE FROM redaction_tombstones WHERE principal = ? AND room_id = ?`
	fenceUnattempted     = `UPDATE delivery_outbox SET state = 4, updated_ms = ? WHERE principal = ? AND room_id = ? AND state = 0`
	fencePendingTurnWork = `UPDATE journal_events SET state = 1
		WHERE principal = ? AND state = 0 AND room_id = ? AND kind IN (1, 2)`
)
