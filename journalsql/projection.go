package journalsql

import "github.com/mindroomd/mindroomd/journal"

// projector implements journal.ProjectionStore for p inside tx, while the
// event at journal seq is projected into room. That seq keys the row an
// original adds, the tombstone a redaction writes and any refresh debt.
type projector struct {
	tx   Tx
	p    Principal
	seq  int64
	room RoomRef
	// rebuilt is set when the event was admitted before (history
	// re-projecting it), so seq may be older than a page index's mark.
	rebuilt bool
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

// storedRevisionID is what a visible row stores as its revision: empty
// when the original itself is on screen (the reads put the event ID back).
func storedRevisionID(rev journal.Revision, eventID string) string {
	if rev.EventID == eventID {
		return ""
	}
	return rev.EventID
}

// exists runs a statement that answers one boolean.
func exists(tx Tx, s Stmt, args ...any) (bool, error) {
	var yes bool
	err := tx.QueryRow(s, args...).Scan(&yes)
	return yes, err
}

// ProbeOriginal implements journal.ProjectionStore.
func (j *projector) ProbeOriginal(room, eventID string) (tombstoned, held bool, err error) {
	err = j.tx.QueryRow(ProbeOriginal, j.p.ID, room, eventID).Scan(&tombstoned, &held)
	return tombstoned, held, err
}

// Tombstoned implements journal.ProjectionStore.
func (j *projector) Tombstoned(room, eventID string) (bool, error) {
	return exists(j.tx, SelectTombstone, j.p.ID, room, eventID)
}

// Tombstone implements journal.ProjectionStore.
func (j *projector) Tombstone(room, eventID string) error {
	_, err := j.tx.Exec(InsertTombstone, j.p.ID, room, eventID, j.seq)
	return err
}

// Journaled implements journal.ProjectionStore.
func (j *projector) Journaled(room, eventID string) (bool, error) {
	var thread string
	err := j.tx.QueryRow(ProbeJournaled, j.p.ID, EventKey(eventID), room).Scan(&thread)
	if j.tx.NoRows(err) {
		return false, nil
	}
	return err == nil, err
}

// EditTarget implements journal.ProjectionStore.
func (j *projector) EditTarget(room, eventID string) (string, bool, error) {
	var target string
	err := j.tx.QueryRow(SelectJournalEdit, j.p.ID, EventKey(eventID), room).Scan(&target)
	if j.tx.NoRows(err) {
		return "", false, nil
	}
	return target, err == nil, err
}

// Visible implements journal.ProjectionStore.
func (j *projector) Visible(room, eventID string) (journal.VisibleRow, bool, error) {
	return visibleRow(j.tx, j.p, room, eventID)
}

// visibleRow reads the visible row of p's logical message eventID.
func visibleRow(tx Tx, p Principal, room, eventID string) (journal.VisibleRow, bool, error) {
	var v journal.VisibleRow
	err := tx.QueryRow(SelectVisibleByEvent, p.ID, EventKey(eventID), room).
		Scan(&v.Key, &v.Sender, &v.Revision.EventID, &v.Revision.TS)
	if tx.NoRows(err) {
		return v, false, nil
	}
	return v, err == nil, err
}

// AddVisible implements journal.ProjectionStore.
func (j *projector) AddVisible(ev *journal.Event, rev journal.Revision, body []byte, owesRefetch bool) error {
	if _, err := j.tx.Exec(InsertVisible, j.seq, j.room.Key, ev.Thread, ev.ID, ev.Sender, ev.TS,
		storedRevisionID(rev, ev.ID), rev.TS, nullableBody(body), j.refreshToken(owesRefetch), j.room.Epoch); err != nil {
		return err
	}
	return j.tx.IndexVisible(j.room, ev, j.seq, j.rebuilt)
}

// ReviseVisible implements journal.ProjectionStore. The revision it puts
// on screen is always an edit.
func (j *projector) ReviseVisible(row journal.VisibleRow, rev journal.Revision, body []byte, owesRefetch bool) error {
	_, err := j.tx.Exec(UpdateVisibleRevision, rev.EventID, rev.TS, nullableBody(body), j.refreshToken(owesRefetch), row.Key)
	return err
}

// DropVisible implements journal.ProjectionStore.
func (j *projector) DropVisible(row journal.VisibleRow) error {
	_, err := j.tx.Exec(DeleteVisible, row.Key)
	return err
}

// ClearVisible implements journal.ProjectionStore.
func (j *projector) ClearVisible(row journal.VisibleRow, revisionID string) error {
	_, err := j.tx.Exec(ClearVisibleOnEdit, j.seq, row.Key, revisionID)
	return err
}

// HeldEdit implements journal.ProjectionStore.
func (j *projector) HeldEdit(room, target, sender string) (journal.HeldEdit, bool, error) {
	var h journal.HeldEdit
	err := j.tx.QueryRow(SelectHeldEdit, j.p.ID, room, target, sender).Scan(&h.Revision.EventID, &h.Revision.TS, &h.Body)
	if j.tx.NoRows(err) {
		return h, false, nil
	}
	return h, err == nil, err
}

// HoldEdit implements journal.ProjectionStore.
func (j *projector) HoldEdit(room, target, sender string, h journal.HeldEdit) error {
	_, err := j.tx.Exec(UpsertHeldEdit, j.p.ID, room, target, sender, h.Revision.EventID, h.Revision.TS,
		nullableBody(h.Body), j.room.Epoch)
	return err
}

// TakeHeldEdits implements journal.ProjectionStore, in one statement.
func (j *projector) TakeHeldEdits(room, target string) (map[string]journal.HeldEdit, error) {
	rows, err := j.tx.Query(TakeHeldEdits, j.p.ID, room, target)
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
	_, err := j.tx.Exec(DeleteHeldEdits, j.p.ID, room, target)
	return err
}

// ClearHeldEdit implements journal.ProjectionStore.
func (j *projector) ClearHeldEdit(room, editID string) error {
	_, err := j.tx.Exec(ClearHeldEdit, j.p.ID, room, editID)
	return err
}

// Settle implements journal.ProjectionStore.
func (j *projector) Settle(room, eventID string) error {
	_, err := j.tx.Exec(SettleEventInRoom, j.p.ID, EventKey(eventID), room)
	return err
}
