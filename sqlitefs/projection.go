package sqlitefs

const (
	selectTombstone = `SELECT EXISTS (SELECT 1 FROM redaction_tombstones WHERE principal = ? AND room_id = ? AND event_id = ?)`
	// Both are rare for an arriving original, so one probe asks for both
	// and the common case costs one statement, not two.
	probeOriginal = `SELECT
		EXISTS (SELECT 1 FROM redaction_tombstones WHERE principal = ?1 AND room_id = ?2 AND event_id = ?3),
		EXISTS (SELECT 1 FROM unresolved_edits WHERE principal = ?1 AND room_id = ?2 AND target_id = ?3)`
	insertTombstone = `INSERT INTO redaction_tombstones (principal, room_id, event_id, redaction_seq)
		VALUES (?, ?, ?, ?) ON CONFLICT (principal, room_id, event_id) DO NOTHING`
	// The visible row of a logical event is found through the journal's
	// identity index: the row's key is the journal seq of its original.
	// A visible row is in the room of its journal row, so the journal's
	// room_id stands in for the visible row's room key.
	selectVisibleByEvent = `SELECT v.seq, v.sender, ` + revisionIDColumn + `, v.revision_ts
		FROM journal_events j JOIN visible_messages v ON v.seq = j.seq
		WHERE j.principal = ? AND j.id_hash = ? AND j.event_id = ? AND j.room_id = ?`
	insertVisible = `INSERT INTO visible_messages
		(seq, room, thread_id, event_id, sender, created_ts, revision_id, revision_ts, content_json, refresh_token, epoch)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	updateVisibleRevision = `UPDATE visible_messages
		SET revision_id = ?, revision_ts = ?, content_json = ?, refresh_token = ?
		WHERE seq = ?`
	deleteVisible      = `DELETE FROM visible_messages WHERE seq = ?`
	clearVisibleOnEdit = `UPDATE visible_messages SET content_json = NULL, refresh_token = ? WHERE seq = ? AND revision_id = ?`
	selectHeldEdit     = `SELECT edit_id, edit_ts, content_json FROM unresolved_edits
		WHERE principal = ? AND room_id = ? AND target_id = ? AND sender = ?`
	upsertHeldEdit = `INSERT INTO unresolved_edits (principal, room_id, target_id, sender, edit_id, edit_ts, content_json, epoch)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (principal, room_id, target_id, sender) DO UPDATE
		SET edit_id = excluded.edit_id, edit_ts = excluded.edit_ts, content_json = excluded.content_json, epoch = excluded.epoch`
	deleteHeldEdits  = `DELETE FROM unresolved_edits WHERE principal = ? AND room_id = ? AND target_id = ?`
	takeHeldEditsFor = `DELETE FROM unresolved_edits WHERE principal = ? AND room_id = ? AND target_id = ?
		RETURNING sender, edit_id, edit_ts, content_json`
	// A row rebuilt by history keeps the seq of its original's first
	// admission, which a merge may long have passed: it goes straight into
	// the page index, since no merge will look for it in the tail.
	indexRebuiltRow = `INSERT INTO visible_page (` + mergeColumns + `)
		SELECT ?1, ?2, ?3, ?4, ?5 WHERE ?5 <= ` + mergedUpto + ` ON CONFLICT DO NOTHING`
	clearHeldEdit     = `UPDATE unresolved_edits SET content_json = NULL WHERE principal = ? AND room_id = ? AND edit_id = ?`
	selectJournalEdit = `SELECT target_id FROM journal_events
		WHERE principal = ? AND id_hash = ? AND event_id = ? AND room_id = ? AND kind = 3`
)

// revisionIDColumn reads a visible row's revision: a stored ” means the
// original itself is on screen.
const revisionIDColumn = `iif(v.revision_id = '', v.event_id, v.revision_id)`
