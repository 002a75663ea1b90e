package sqlitefs

import (
	"database/sql"
	"errors"
	"fmt"

	"github.com/mindroomd/mindroomd/journal"
)

const (
	selectTombstone = `SELECT 1 FROM redaction_tombstones WHERE principal = ? AND room_id = ? AND event_id = ?`
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
	clearHeldEdit     = `UPDATE unresolved_edits SET content_json = NULL WHERE principal = ? AND room_id = ? AND edit_id = ?`
	selectJournalEdit = `SELECT target_id FROM journal_events
		WHERE principal = ? AND id_hash = ? AND event_id = ? AND room_id = ? AND kind = 3`
)

// revisionIDColumn reads a visible row's revision: a stored ” means the
// original itself is on screen.
const revisionIDColumn = `iif(v.revision_id = '', v.event_id, v.revision_id)`

// storedRevisionID is what revisionIDColumn reads back as rev for the
// original eventID.
func storedRevisionID(rev journal.Revision, eventID string) string {
	if rev.EventID == eventID {
		return ""
	}
	return rev.EventID
}

// project applies one newly admitted event to the visible projection.
func project(tx *Tx, p Principal, ev *journal.Event, seq int64, room roomRef) error {
	switch ev.Kind {
	case journal.KindMessage, journal.KindMedia:
		return projectOriginal(tx, p, ev, seq, room)
	case journal.KindEdit:
		return projectEdit(tx, p, ev, seq, room.epoch)
	case journal.KindRedaction:
		if err := projectRedaction(tx, p, ev, seq); err != nil {
			return err
		}
		// A redaction can be redacted too, before it arrives.
		return settleIfRedacted(tx, p, ev)
	case journal.KindReaction:
		return settleIfRedacted(tx, p, ev)
	}
	return nil
}

// settleIfRedacted settles an event whose redaction arrived before it: it
// was admitted pending, but there is nothing left to answer.
func settleIfRedacted(tx *Tx, p Principal, ev *journal.Event) error {
	dead, err := tombstoned(tx, p, ev.RoomID, ev.ID)
	if err != nil || !dead {
		return err
	}
	_, err = tx.exec(settleEventInRoom, p.ID, IDHash(ev.ID), ev.ID, ev.RoomID)
	return err
}

func tombstoned(tx *Tx, p Principal, room, eventID string) (bool, error) {
	var one int
	err := tx.queryRow(selectTombstone, p.ID, room, eventID).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

type visibleRow struct {
	seq      int64
	sender   string
	revision journal.Revision
}

func visibleByEvent(tx *Tx, p Principal, room, eventID string) (visibleRow, bool, error) {
	var v visibleRow
	err := tx.queryRow(selectVisibleByEvent, p.ID, IDHash(eventID), eventID, room).Scan(&v.seq, &v.sender, &v.revision.EventID, &v.revision.TS)
	if errors.Is(err, sql.ErrNoRows) {
		return v, false, nil
	}
	return v, err == nil, err
}

// visibleBody decides what a revision puts on screen: its content, or no
// body and a refresh debt when there is none or it is only a sidecar
// preview.
func visibleBody(content []byte, preview bool, seq int64) (body any, refresh any) {
	if content == nil || preview {
		return nil, seq
	}
	return string(content), nil
}

type heldEdit struct {
	revision journal.Revision
	body     []byte
}

// takeHeldEdits deletes every edit held for target and returns them by
// sender, in one statement.
func takeHeldEdits(tx *Tx, p Principal, room, target string) (map[string]heldEdit, error) {
	rows, err := tx.query(takeHeldEditsFor, p.ID, room, target)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var held map[string]heldEdit
	for rows.Next() {
		var (
			sender string
			h      heldEdit
		)
		if err := rows.Scan(&sender, &h.revision.EventID, &h.revision.TS, &h.body); err != nil {
			return nil, err
		}
		if held == nil {
			held = make(map[string]heldEdit)
		}
		held[sender] = h
	}
	return held, rows.Err()
}

func projectOriginal(tx *Tx, p Principal, ev *journal.Event, seq int64, room roomRef) error {
	var dead, anyHeld bool
	if err := tx.queryRow(probeOriginal, p.ID, ev.RoomID, ev.ID).Scan(&dead, &anyHeld); err != nil {
		return err
	}
	if dead {
		// Redacted before it arrived: it never becomes visible, nothing held
		// against it ever will either, and it is owed no answer.
		if _, err := tx.exec(deleteHeldEdits, p.ID, ev.RoomID, ev.ID); err != nil {
			return err
		}
		_, err := tx.exec(settleEventInRoom, p.ID, IDHash(ev.ID), ev.ID, ev.RoomID)
		return err
	}
	revision := journal.Revision{TS: ev.TS, EventID: ev.ID}
	content, preview := []byte(ev.Content), ev.Preview
	if anyHeld {
		// Every edit held for this target goes now; only the author's own
		// may apply, and only if it is newer.
		held, err := takeHeldEdits(tx, p, ev.RoomID, ev.ID)
		if err != nil {
			return err
		}
		if h, ok := held[ev.Sender]; ok && h.revision.After(revision) {
			// A redacted held edit has no body: it owes a refetch.
			revision, content, preview = h.revision, h.body, journal.IsSidecarPreview(h.body)
		}
	}
	body, refresh := visibleBody(content, preview, seq)
	if _, err := tx.exec(insertVisible, seq, room.key, ev.Thread, ev.ID, ev.Sender, ev.TS,
		storedRevisionID(revision, ev.ID), revision.TS, body, refresh, room.epoch); err != nil {
		return err
	}
	return noteVisibleRow(tx)
}

func projectEdit(tx *Tx, p Principal, ev *journal.Event, seq, epoch int64) error {
	if journal.IsTransportProgress(ev, p.UserID) {
		return nil
	}
	if dead, err := tombstoned(tx, p, ev.RoomID, ev.Target); err != nil || dead {
		return err
	}
	// An edit whose redaction came first still takes its place among the
	// author's revisions, bodiless, exactly as if it had arrived first and
	// been redacted then: arrival order must not decide whether an older
	// revision comes back on screen. Recovering its body is the server's
	// answer to a refetch, never local history.
	redacted, err := tombstoned(tx, p, ev.RoomID, ev.ID)
	if err != nil {
		return err
	}
	content, preview := []byte(ev.NewContent), ev.Preview
	if redacted {
		content, preview = nil, false
	}
	revision := journal.Revision{TS: ev.TS, EventID: ev.ID}
	row, ok, err := visibleByEvent(tx, p, ev.RoomID, ev.Target)
	if err != nil {
		return err
	}
	if ok {
		if row.sender != ev.Sender || !revision.After(row.revision) {
			return nil
		}
		body, refresh := visibleBody(content, preview, seq)
		_, err := tx.exec(updateVisibleRevision, ev.ID, ev.TS, body, refresh, row.seq)
		return err
	}
	// A target the journal already holds but does not show (undecryptable,
	// fenced, admitted while out of the room, itself an edit) will never
	// project: a held edit of it would keep its plaintext for good, so it is
	// dropped. Only a target not yet seen is waited for.
	var thread string
	switch err := tx.queryRow(selectThreadOf, p.ID, IDHash(ev.Target), ev.Target, ev.RoomID).Scan(&thread); {
	case err == nil:
		return nil
	case !errors.Is(err, sql.ErrNoRows):
		return err
	}
	// The target has not arrived: hold the newest edit per (target, sender).
	var (
		held     journal.Revision
		heldBody sql.NullString
	)
	err = tx.queryRow(selectHeldEdit, p.ID, ev.RoomID, ev.Target, ev.Sender).Scan(&held.EventID, &held.TS, &heldBody)
	if err == nil && !revision.After(held) {
		return nil
	}
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	var body any
	if content != nil {
		body = string(content)
	}
	_, err = tx.exec(upsertHeldEdit, p.ID, ev.RoomID, ev.Target, ev.Sender, ev.ID, ev.TS, body, epoch)
	return err
}

func projectRedaction(tx *Tx, p Principal, ev *journal.Event, seq int64) error {
	room, target := ev.RoomID, ev.Target
	// The tombstone comes first, so nothing arriving later can resurrect the
	// target.
	if _, err := tx.exec(insertTombstone, p.ID, room, target, seq); err != nil {
		return fmt.Errorf("tombstone: %w", err)
	}
	// Whatever was held against the target goes, whether the target is a
	// visible original or never arrived.
	if _, err := tx.exec(deleteHeldEdits, p.ID, room, target); err != nil {
		return err
	}
	row, ok, err := visibleByEvent(tx, p, room, target)
	if err != nil {
		return err
	}
	if ok {
		if _, err := tx.exec(deleteVisible, row.seq); err != nil {
			return err
		}
	} else {
		// A redacted edit: if it is the revision on screen, the body goes now
		// and the row owes a refetch; a superseded edit changes nothing.
		var logical string
		err := tx.queryRow(selectJournalEdit, p.ID, IDHash(target), target, room).Scan(&logical)
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return err
		default:
			if row, ok, err := visibleByEvent(tx, p, room, logical); err != nil {
				return err
			} else if ok {
				if _, err := tx.exec(clearVisibleOnEdit, seq, row.seq, target); err != nil {
					return err
				}
			}
		}
		// A held edit keeps its identity and ordering but loses its body.
		if _, err := tx.exec(clearHeldEdit, p.ID, room, target); err != nil {
			return err
		}
	}
	// A redacted source has nothing left to answer.
	if _, err := tx.exec(settleEventInRoom, p.ID, IDHash(target), target, room); err != nil {
		return fmt.Errorf("settle redacted source: %w", err)
	}
	return nil
}
