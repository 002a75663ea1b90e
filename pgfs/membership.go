package pgfs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mindroomd/mindroomd/journal"
)

const (
	upsertDeparture = `INSERT INTO rooms (principal, room_id, epoch, departed) VALUES ($1, $2, 1, true)
		ON CONFLICT (principal, room_id) DO UPDATE SET epoch = rooms.epoch + 1, departed = true`
	upsertJoin = `INSERT INTO rooms (principal, room_id, epoch, departed) VALUES ($1, $2, 0, false)
		ON CONFLICT (principal, room_id) DO UPDATE SET departed = false`
	insertObservation = `INSERT INTO membership_observations (principal, observation_id, room_id) VALUES ($1, $2, $3)
		ON CONFLICT (principal, observation_id) DO NOTHING`
	insertOwedReport  = `INSERT INTO owed_departure_reports (principal, room_id, owed_ms) VALUES ($1, $2, $3)`
	selectOldestOwed  = `SELECT id FROM owed_departure_reports WHERE principal = $1 AND room_id = $2 AND owed_ms >= $3 ORDER BY id LIMIT 1`
	deleteOwedReport  = `DELETE FROM owed_departure_reports WHERE id = $1`
	deleteExpiredOwed = `DELETE FROM owed_departure_reports WHERE principal = $1 AND room_id = $2 AND owed_ms < $3`
	selectOwedRooms   = `SELECT DISTINCT room_id FROM owed_departure_reports WHERE principal = $1 ORDER BY room_id`
	deleteOwedRooms   = `DELETE FROM owed_departure_reports WHERE principal = $1 AND room_id = ANY($2)`

	// The fence removes what was derived from the ended membership: the
	// visible rows, held edits, tombstones and coverage markers. Attempted
	// outbox rows stay (their outcome is unknown and their frozen payload
	// allows an exact retry); journal rows stay as proof; pending
	// redactions stay because they still owe cleanup.
	fenceVisible = `DELETE FROM visible_messages
		WHERE room = (SELECT id FROM rooms WHERE principal = $1 AND room_id = $2)`
	fenceHeldEdits  = `DELETE FROM unresolved_edits WHERE principal = $1 AND room_id = $2`
	fenceTombstones = `DELETE FROM redaction_tombstones WHERE principal = $1 AND room_id = $2`
	fenceMarkers    = `DELETE FROM hydration_coverage WHERE principal = $1 AND room_id = $2`
	// A row never attempted was never seen by the room, so withdrawing it
	// is exact; it would otherwise answer in a membership that ended.
	fenceUnattempted = `UPDATE delivery_outbox SET state = 4, updated_ms = $1
		WHERE principal = $2 AND room_id = $3 AND state = 0`
	// Pending turn-backed events (messages and media) of the old
	// membership are settled: a turn started from them would answer into
	// a membership that has ended.
	fencePendingTurnWork = `UPDATE journal_events SET state = 1
		WHERE principal = $1 AND state = 0 AND room_id = $2 AND kind IN (1, 2)`
)

// fence implements journal.MembershipStore for p inside tx.
type fence struct {
	tx *Tx
	p  Principal
}

var _ journal.MembershipStore = fence{}

// RecordObservation implements journal.MembershipStore.
func (f fence) RecordObservation(room, observation string) (bool, error) {
	tag, err := f.tx.exec(insertObservation, f.p.ID, observation, room)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() > 0, nil
}

// Membership implements journal.MembershipStore.
func (f fence) Membership(room string) (int64, bool, error) {
	return membershipOf(f.tx.ctx, f.tx.tx, f.p, room)
}

// EndMembership implements journal.MembershipStore: a new epoch, and in
// the same transaction everything derived from the old membership goes.
func (f fence) EndMembership(room string) error {
	for _, q := range []string{upsertDeparture, fenceVisible, fenceHeldEdits, fenceTombstones, fenceMarkers} {
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
	if errors.Is(err, pgx.ErrNoRows) {
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
	tag, err := tx.exec(deleteOwedRooms, p.ID, rooms)
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}

// roomsOwingDepartureReports lists p's rooms with owed echoes.
func (s *Store) roomsOwingDepartureReports(ctx context.Context, p Principal) ([]string, error) {
	rows, err := s.pool.Query(ctx, selectOwedRooms, p.ID)
	if err != nil {
		return nil, fmt.Errorf("read owed reports: %w", err)
	}
	// No rooms is nil, as every backend's is.
	rooms, err := pgx.AppendRows([]string(nil), rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read owed reports: %w", err)
	}
	return rooms, nil
}
