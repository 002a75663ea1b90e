package sqlitefs

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/mindroomd/mindroomd/journal"
)

// OwedReportWindow is how long a local leave's owed echo may absorb a
// reported departure. A report that never arrives must not swallow a later,
// real departure forever.
const OwedReportWindow = 24 * time.Hour

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

// FenceDeparture applies one departure observation for p. A local leave
// fences at once and owes one echo; a reported leave consumes an owed echo
// if there is one, fences otherwise; a removal (kick or ban) cannot be an
// echo and fences unless p is already out. Each is applied only once.
func FenceDeparture(tx *Tx, p Principal, room string, source journal.DepartureSource, observation string) (journal.DepartureOutcome, error) {
	if !journal.ValidRoomID(room) {
		return 0, fmt.Errorf("%w: %q is not a room ID", journal.ErrInvalidArgument, room)
	}
	if observation != "" {
		r, err := tx.exec(insertObservation, p.ID, observation, room)
		if err != nil {
			return 0, fmt.Errorf("record observation: %w", err)
		}
		if n, _ := r.RowsAffected(); n == 0 {
			return journal.RepeatedReport, nil
		}
	}
	_, departed, err := membershipOf(tx, p, room)
	if err != nil {
		return 0, err
	}
	switch source {
	case journal.DepartureLocal:
		if departed {
			return journal.AlreadyFenced, nil
		}
		if err := advanceEpoch(tx, p, room); err != nil {
			return 0, err
		}
		if _, err := tx.exec(insertOwedReport, p.ID, room, tx.nowMS()); err != nil {
			return 0, fmt.Errorf("owe departure report: %w", err)
		}
		return journal.Fenced, nil
	case journal.DepartureReported:
		horizon := tx.now.Add(-OwedReportWindow).UnixMilli()
		if _, err := tx.exec(deleteExpiredOwed, p.ID, room, horizon); err != nil {
			return 0, err
		}
		var owed int64
		err := tx.queryRow(selectOldestOwed, p.ID, room, horizon).Scan(&owed)
		switch {
		case err == nil:
			if _, err := tx.exec(deleteOwedReport, owed); err != nil {
				return 0, err
			}
			return journal.OwedReportConsumed, nil
		case !errors.Is(err, sql.ErrNoRows):
			return 0, err
		case departed:
			return journal.AlreadyFenced, nil
		}
		if err := advanceEpoch(tx, p, room); err != nil {
			return 0, err
		}
		return journal.Fenced, nil
	case journal.DepartureRemoved:
		if departed {
			return journal.AlreadyFenced, nil
		}
		if err := advanceEpoch(tx, p, room); err != nil {
			return 0, err
		}
		return journal.Fenced, nil
	}
	return 0, fmt.Errorf("%w: unknown departure source %d", journal.ErrInvalidArgument, source)
}

// advanceEpoch ends p's membership of room: a new epoch, and in the same
// transaction everything derived from the old membership goes. Attempted
// outbox rows stay (their outcome is unknown and their frozen payload allows
// an exact retry); journal rows stay as proof; pending redactions stay
// because they still owe cleanup.
func advanceEpoch(tx *Tx, p Principal, room string) error {
	forgetRoom(tx, p, room)
	for _, q := range []string{upsertDeparture, fenceVisible, fenceVisibleTail, fenceHeldEdits, fenceTombstones} {
		if _, err := tx.exec(q, p.ID, room); err != nil {
			return fmt.Errorf("fence: %w", err)
		}
	}
	if _, err := tx.exec(fenceUnattempted, tx.nowMS(), p.ID, room); err != nil {
		return fmt.Errorf("fence outbox: %w", err)
	}
	if _, err := tx.exec(fencePendingTurnWork, p.ID, room); err != nil {
		return fmt.Errorf("fence pending work: %w", err)
	}
	return nil
}

// RecordJoin marks p back in room under its current (advanced) epoch.
func RecordJoin(tx *Tx, p Principal, room, observation string) error {
	if !journal.ValidRoomID(room) {
		return fmt.Errorf("%w: %q is not a room ID", journal.ErrInvalidArgument, room)
	}
	if observation != "" {
		r, err := tx.exec(insertObservation, p.ID, observation, room)
		if err != nil {
			return fmt.Errorf("record observation: %w", err)
		}
		if n, _ := r.RowsAffected(); n == 0 {
			return nil // an old join replayed cannot re-arm a newer departure
		}
	}
	forgetRoom(tx, p, room)
	_, err := tx.exec(upsertJoin, p.ID, room)
	return err
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
	err := db.Readers.QueryRowContext(ctx, selectMembership, p.ID, room).Scan(&epoch, &departed)
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
	rows, err := db.Readers.QueryContext(ctx, selectOwedRooms, p.ID)
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
