package pgfs

const (
	selectTombstone = `SELECT EXISTS (SELECT 1 FROM redaction_tombstones
		WHERE principal = $1 AND room_id = $2 AND event_id = $3)`
	// Both are rare for an arriving original, so one probe asks for both
	// and the common case costs one round trip, not two.
	probeOriginal = `SELECT
		EXISTS (SELECT 1 FROM redaction_tombstones WHERE principal = $1 AND room_id = $2 AND event_id = $3),
		EXISTS (SELECT 1 FROM unresolved_edits WHERE principal = $1 AND room_id = $2 AND target_id = $3)`
	insertTombstone = `INSERT INTO redaction_tombstones (principal, room_id, event_id, redaction_seq)
		VALUES ($1, $2, $3, $4) ON CONFLICT (principal, room_id, event_id) DO NOTHING`
	// The visible row of a logical event is found through the journal's
	// identity index: the row's key is the journal seq of its original.
	// A visible row is in the room of its journal row, so the journal's
	// room_id stands in for the visible row's room key.
	selectVisibleByEvent = `SELECT v.seq, v.sender, ` + revisionIDColumn + `, v.revision_ts
		FROM journal_events j JOIN visible_messages v ON v.seq = j.seq
		WHERE j.principal = $1 AND j.event_id = $2 AND j.room_id = $3`
	insertVisible = `INSERT INTO visible_messages
		(seq, room, thread_id, event_id, sender, created_ts, revision_id, revision_ts, content_json, refresh_token, epoch)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`
	updateVisibleRevision = `UPDATE visible_messages
		SET revision_id = $1, revision_ts = $2, content_json = $3, refresh_token = $4
		WHERE seq = $5`
	deleteVisible      = `DELETE FROM visible_messages WHERE seq = $1`
	clearVisibleOnEdit = `UPDATE visible_messages SET content_json = NULL, refresh_token = $1
		WHERE seq = $2 AND revision_id = $3`
	selectHeldEdit = `SELECT edit_id, edit_ts, content_json FROM unresolved_edits
		WHERE principal = $1 AND room_id = $2 AND target_id = $3 AND sender = $4`
	upsertHeldEdit = `INSERT INTO unresolved_edits (principal, room_id, target_id, sender, edit_id, edit_ts, content_json, epoch)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
		ON CONFLICT (principal, room_id, target_id, sender) DO UPDATE
		SET edit_id = excluded.edit_id, edit_ts = excluded.edit_ts, content_json = excluded.content_json, epoch = excluded.epoch`
	deleteHeldEdits  = `DELETE FROM unresolved_edits WHERE principal = $1 AND room_id = $2 AND target_id = $3`
	takeHeldEditsFor = `DELETE FROM unresolved_edits WHERE principal = $1 AND room_id = $2 AND target_id = $3
		RETURNING sender, edit_id, edit_ts, content_json`
	clearHeldEdit = `UPDATE unresolved_edits SET content_json = NULL
		WHERE principal = $1 AND room_id = $2 AND edit_id = $3`
	selectJournalEdit = `SELECT target_id FROM journal_events
		WHERE principal = $1 AND event_id = $2 AND room_id = $3 AND kind = 3`
)

// revisionIDColumn reads a visible row's revision: an empty revision_id
// means the original itself is on screen.
const revisionIDColumn = `CASE WHEN v.revision_id = '' THEN v.event_id ELSE v.revision_id END`
