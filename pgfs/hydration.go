package pgfs

const (
	selectJournaledSeq = `SELECT seq, thread_id FROM journal_events
		WHERE principal = $1 AND event_id = $2 AND room_id = $3`
	upsertCoverage = `INSERT INTO hydration_coverage (principal, room_id, thread_id, epoch, covered_ms)
		VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (principal, room_id, thread_id) DO UPDATE
		SET epoch = excluded.epoch, covered_ms = excluded.covered_ms`
	// A marker covers only under the epoch it was written in, and never
	// while the principal is out of the room.
	selectCovered = `SELECT EXISTS (SELECT 1 FROM hydration_coverage c JOIN rooms r
		ON r.principal = c.principal AND r.room_id = c.room_id
		WHERE c.principal = $1 AND c.room_id = $2 AND c.thread_id = $3 AND c.epoch = r.epoch AND NOT r.departed)`
	selectDebt = `SELECT v.seq, v.sender, ` + revisionIDColumn + `, v.revision_ts, coalesce(v.refresh_token, 0)
		FROM journal_events j JOIN visible_messages v ON v.seq = j.seq
		WHERE j.principal = $1 AND j.event_id = $2 AND j.room_id = $3`
	selectDebtEpoch = `SELECT coalesce(v.refresh_token, 0), r.epoch, r.departed
		FROM journal_events j JOIN visible_messages v ON v.seq = j.seq JOIN rooms r ON r.id = v.room
		WHERE j.principal = $1 AND j.event_id = $2 AND j.room_id = $3`
	// The server's copy may reduce to the original itself, which the row
	// stores as an empty revision_id.
	installRevision = `UPDATE visible_messages
		SET revision_id = CASE WHEN event_id = $1 THEN '' ELSE $1 END,
			revision_ts = $2, content_json = $3, refresh_token = NULL
		WHERE seq = $4`
)
