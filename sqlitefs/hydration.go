package sqlitefs

const (
	selectJournaledSeq = `SELECT seq, thread_id FROM journal_events
		WHERE principal = ? AND id_hash = ? AND event_id = ? AND room_id = ?`
	upsertCoverage = `INSERT INTO hydration_coverage (principal, room_id, thread_id, epoch, covered_ms)
		VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (principal, room_id, thread_id) DO UPDATE
		SET epoch = excluded.epoch, covered_ms = excluded.covered_ms`
	// A marker covers only under the epoch it was written in, and never
	// while the principal is out of the room.
	selectCovered = `SELECT EXISTS (SELECT 1 FROM hydration_coverage c JOIN rooms r
		ON r.principal = c.principal AND r.room_id = c.room_id
		WHERE c.principal = ? AND c.room_id = ? AND c.thread_id = ? AND c.epoch = r.epoch AND r.departed = 0)`
	fenceCoverage = `DELETE FROM hydration_coverage WHERE principal = ? AND room_id = ?`
	selectDebt    = `SELECT v.seq, v.sender, ` + revisionIDColumn + `, v.revision_ts, coalesce(v.refresh_token, 0)
		FROM journal_events j JOIN visible_messages v ON v.seq = j.seq
		WHERE j.principal = ? AND j.id_hash = ? AND j.event_id = ? AND j.room_id = ?`
	selectDebtEpoch = `SELECT coalesce(v.refresh_token, 0), r.epoch, r.departed
		FROM journal_events j JOIN visible_messages v ON v.seq = j.seq JOIN rooms r ON r.id = v.room
		WHERE j.principal = ? AND j.id_hash = ? AND j.event_id = ? AND j.room_id = ?`
	installRevision = `UPDATE visible_messages
		SET revision_id = ?, revision_ts = ?, content_json = ?, refresh_token = NULL
		WHERE seq = ?`
)
