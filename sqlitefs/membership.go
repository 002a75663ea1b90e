package sqlitefs

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/mindroomd/mindroomd/journal"
)

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
	deleteOwedRoom    = `DELETE FROM owed_departure_reports WHERE principal = ? AND room_id = ?`
	// The merged rows are found through the page index, the unmerged tail
	// by its seq range; the delete trigger takes their index entries.
	fenceVisible = `DELETE FROM visible_messages WHERE seq IN
		(SELECT seq FROM visible_page WHERE room = (` + roomKeyOf + `))`
	fenceVisibleTail = `DELETE FROM visible_messages
		WHERE seq > ` + mergedUpto + ` AND room = (` + roomKeyOf + `)`
	fenceHeldEdits       = `DELETE FROM unresolved_edits WHERE principal = ? AND room_id = ?`
	fenceTombstones      = `DELETE FROM redaction_tombstones WHERE principal = ? AND room_id = ?`
	fenceUnattempted     = `UPDATE delivery_outbox SET state = 4, updated_ms = ? WHERE principal = ? AND room_id = ? AND state = 0`
	fencePendingTurnWork = `UPDATE journal_events SET state = 1
		WHERE principal = ? AND state = 0 AND room_id = ? AND kind IN (1, 2)`
)

// membershipOf reads the room's epoch and whether p is out of it.
func membershipOf(tx *Tx, p Principal, room string) (epoch int64, departed bool, err error) {
	err = tx.queryRow(selectMembership, p.ID, room).Scan(&epoch, &departed)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	return epoch, departed, err
}

// fence implements journal.MembershipStore for p inside tx.
type fence struct {
	tx *Tx
	p  Principal
}

var _ journal.MembershipStore = fence{}

// RecordObservation implements journal.MembershipStore.
func (f fence) RecordObservation(room, observation string) (bool, error) {
	r, err := f.tx.exec(insertObservation, f.p.ID, observation, room)
	if err != nil {
		return false, err
	}
	n, err := r.RowsAffected()
	return n > 0, err
}

// Membership implements journal.MembershipStore.
func (f fence) Membership(room string) (int64, bool, error) { return membershipOf(f.tx, f.p, room) }

// EndMembership implements journal.MembershipStore: a new epoch, and in
// the same transaction everything derived from the old membership goes.
// Attempted outbox rows stay (their outcome is unknown and their frozen
// payload allows an exact retry); journal rows stay as proof; pending
// redactions stay because they still owe cleanup.
func (f fence) EndMembership(room string) error {
	forgetRoom(f.tx, f.p, room)
	for _, q := range []string{upsertDeparture, fenceVisible, fenceVisibleTail, fenceHeldEdits, fenceTombstones, fenceCoverage} {
		if _, err := f.tx.exec(q, f.p.ID, room); err != nil {
			return err
		}
	}
	if _, err := f.tx.exec(fenceUnattempted, f.tx.nowMS(), f.p.ID, room); err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	if _, err := f.tx.exec(fencePendingTurnWork, f.p.ID, room); err != nil {
		return fmt.Errorf("pending work: %w", err)
	}
	return nil
}

// Rejoin implements journal.MembershipStore.
func (f fence) Rejoin(room string) error {
	forgetRoom(f.tx, f.p, room)
	_, err := f.tx.exec(upsertJoin, f.p.ID, room)
	return err
}

// OweReport implements journal.MembershipStore.
func (f fence) OweReport(room string, at time.Time) error {
	_, err := f.tx.exec(insertOwedReport, f.p.ID, room, at.UnixMilli())
	return err
}

// DropOwedReportsBefore implements journal.MembershipStore.
func (f fence) DropOwedReportsBefore(room string, t time.Time) error {
	_, err := f.tx.exec(deleteExpiredOwed, f.p.ID, room, t.UnixMilli())
	return err
}

// TakeOwedReport implements journal.MembershipStore.
func (f fence) TakeOwedReport(room string, since time.Time) (bool, error) {
	var id int64
	err := f.tx.queryRow(selectOldestOwed, f.p.ID, room, since.UnixMilli()).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	_, err = f.tx.exec(deleteOwedReport, id)
	return err == nil, err
}

// FenceDeparture applies one departure observation for p
// (journal.ApplyDeparture).
func FenceDeparture(tx *Tx, p Principal, room string, source journal.DepartureSource, observation string) (journal.DepartureOutcome, error) {
	return journal.ApplyDeparture(fence{tx, p}, room, source, observation, tx.now)
}

// RecordJoin marks p back in room under its current (advanced) epoch
// (journal.ApplyJoin).
func RecordJoin(tx *Tx, p Principal, room, observation string) error {
	return journal.ApplyJoin(fence{tx, p}, room, observation)
}

// RetireOwedDepartureReports forgets the owed echoes of rooms.
func RetireOwedDepartureReports(tx *Tx, p Principal, rooms []string) (int, error) {
	n := 0
	for _, room := range rooms {
		r, err := tx.exec(deleteOwedRoom, p.ID, room)
		if err != nil {
			return 0, err
		}
		k, _ := r.RowsAffected()
		n += int(k)
	}
	return n, nil
}

// RoomEpoch reads the room's epoch and departure through a reader.
func (db *DB) RoomEpoch(ctx context.Context, p Principal, room string) (int64, bool, error) {
	var (
		epoch    int64
		departed bool
	)
	err := db.readers.QueryRowContext(ctx, selectMembership, p.ID, room).Scan(&epoch, &departed)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("read membership: %w", err)
	}
	return epoch, departed, nil
}

// RoomsOwingDepartureReports lists p's rooms with owed echoes.
func (db *DB) RoomsOwingDepartureReports(ctx context.Context, p Principal) ([]string, error) {
	rows, err := db.readers.QueryContext(ctx, selectOwedRooms, p.ID)
	if err != nil {
		return nil, fmt.Errorf("read owed reports: %w", err)
	}
	defer rows.Close()
	var rooms []string
	for rows.Next() {
		var r string
		if err := rows.Scan(&r); err != nil {
			return nil, err
		}
		rooms = append(rooms, r)
	}
	return rooms, rows.Err()
}
