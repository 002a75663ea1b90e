package pgfs

import (
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/mindroomd/mindroomd/journal"
)

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
		WHERE principal = $1 AND event_id = $2 AND room_id = $3 AND kind = $4`
)

// revisionIDColumn reads a visible row's revision: an empty revision_id
// means the original itself is on screen.
const revisionIDColumn = `CASE WHEN v.revision_id = '' THEN v.event_id ELSE v.revision_id END`

// storedRevisionID is what revisionIDColumn reads back as rev for the
// original eventID.
func storedRevisionID(rev journal.Revision, eventID string) string {
	if rev.EventID == eventID {
		return ""
	}
	return rev.EventID
}

// projector implements journal.ProjectionStore for p inside tx, while the
// event at journal seq is projected into room. That seq keys the row an
// original adds, the tombstone a redaction writes and any refresh debt.
type projector struct {
	tx   *Tx
	p    Principal
	seq  int64
	room roomRef
}

var _ journal.ProjectionStore = (*projector)(nil)

// refreshToken is the debt a write records: the projecting event's seq, or
// none.
func (j *projector) refreshToken(owesRefetch bool) any {
	if owesRefetch {
		return j.seq
	}
	return nil
}

// nullableBody stores a missing body as NULL.
func nullableBody(body []byte) any {
	if body == nil {
		return nil
	}
	return string(body)
}

// ProbeOriginal implements journal.ProjectionStore.
func (j *projector) ProbeOriginal(room, eventID string) (tombstoned, held bool, err error) {
	err = j.tx.queryRow(probeOriginal, j.p.ID, room, eventID).Scan(&tombstoned, &held)
	return tombstoned, held, err
}

// Tombstoned implements journal.ProjectionStore.
func (j *projector) Tombstoned(room, eventID string) (bool, error) {
	var dead bool
	err := j.tx.queryRow(selectTombstone, j.p.ID, room, eventID).Scan(&dead)
	return dead, err
}

// Tombstone implements journal.ProjectionStore.
func (j *projector) Tombstone(room, eventID string) error {
	_, err := j.tx.exec(insertTombstone, j.p.ID, room, eventID, j.seq)
	return err
}

// Journaled implements journal.ProjectionStore.
func (j *projector) Journaled(room, eventID string) (bool, error) {
	var thread string
	err := j.tx.queryRow(selectThreadOf, j.p.ID, eventID, room).Scan(&thread)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// EditTarget implements journal.ProjectionStore.
func (j *projector) EditTarget(room, eventID string) (string, bool, error) {
	var target string
	err := j.tx.queryRow(selectJournalEdit, j.p.ID, eventID, room, int16(journal.KindEdit)).Scan(&target)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	return target, err == nil, err
}

// Visible implements journal.ProjectionStore.
func (j *projector) Visible(room, eventID string) (journal.VisibleRow, bool, error) {
	var v journal.VisibleRow
	err := j.tx.queryRow(selectVisibleByEvent, j.p.ID, eventID, room).
		Scan(&v.Key, &v.Sender, &v.Revision.EventID, &v.Revision.TS)
	if errors.Is(err, pgx.ErrNoRows) {
		return v, false, nil
	}
	return v, err == nil, err
}

// AddVisible implements journal.ProjectionStore.
func (j *projector) AddVisible(ev *journal.Event, rev journal.Revision, body []byte, owesRefetch bool) error {
	_, err := j.tx.exec(insertVisible, j.seq, j.room.key, ev.Thread, ev.ID, ev.Sender, ev.TS,
		storedRevisionID(rev, ev.ID), rev.TS, nullableBody(body), j.refreshToken(owesRefetch), j.room.epoch)
	return err
}

// ReviseVisible implements journal.ProjectionStore. The revision it puts
// on screen is always an edit.
func (j *projector) ReviseVisible(row journal.VisibleRow, rev journal.Revision, body []byte, owesRefetch bool) error {
	_, err := j.tx.exec(updateVisibleRevision, rev.EventID, rev.TS, nullableBody(body), j.refreshToken(owesRefetch), row.Key)
	return err
}

// DropVisible implements journal.ProjectionStore.
func (j *projector) DropVisible(row journal.VisibleRow) error {
	_, err := j.tx.exec(deleteVisible, row.Key)
	return err
}

// ClearVisible implements journal.ProjectionStore.
func (j *projector) ClearVisible(row journal.VisibleRow, revisionID string) error {
	_, err := j.tx.exec(clearVisibleOnEdit, j.seq, row.Key, revisionID)
	return err
}

// HeldEdit implements journal.ProjectionStore.
func (j *projector) HeldEdit(room, target, sender string) (journal.HeldEdit, bool, error) {
	var h journal.HeldEdit
	err := j.tx.queryRow(selectHeldEdit, j.p.ID, room, target, sender).Scan(&h.Revision.EventID, &h.Revision.TS, &h.Body)
	if errors.Is(err, pgx.ErrNoRows) {
		return h, false, nil
	}
	return h, err == nil, err
}

// HoldEdit implements journal.ProjectionStore.
func (j *projector) HoldEdit(room, target, sender string, h journal.HeldEdit) error {
	_, err := j.tx.exec(upsertHeldEdit, j.p.ID, room, target, sender, h.Revision.EventID, h.Revision.TS,
		nullableBody(h.Body), j.room.epoch)
	return err
}

// TakeHeldEdits implements journal.ProjectionStore, in one statement.
func (j *projector) TakeHeldEdits(room, target string) (map[string]journal.HeldEdit, error) {
	rows, err := j.tx.query(takeHeldEditsFor, j.p.ID, room, target)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var held map[string]journal.HeldEdit
	for rows.Next() {
		var (
			sender string
			h      journal.HeldEdit
		)
		if err := rows.Scan(&sender, &h.Revision.EventID, &h.Revision.TS, &h.Body); err != nil {
			return nil, err
		}
		if held == nil {
			held = make(map[string]journal.HeldEdit)
		}
		held[sender] = h
	}
	return held, rows.Err()
}

// DropHeldEdits implements journal.ProjectionStore.
func (j *projector) DropHeldEdits(room, target string) error {
	_, err := j.tx.exec(deleteHeldEdits, j.p.ID, room, target)
	return err
}

// ClearHeldEdit implements journal.ProjectionStore.
func (j *projector) ClearHeldEdit(room, editID string) error {
	_, err := j.tx.exec(clearHeldEdit, j.p.ID, room, editID)
	return err
}

// Settle implements journal.ProjectionStore.
func (j *projector) Settle(room, eventID string) error {
	_, err := j.tx.exec(settleEventInRoom, j.p.ID, eventID, room)
	return err
}
