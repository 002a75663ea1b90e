package journalsql

import (
	"fmt"
	"time"

	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journal"
)

// membershipOf reads the room's epoch and whether p is out of it.
func membershipOf(tx Tx, p Principal, room string) (epoch int64, departed bool, err error) {
	err = tx.QueryRow(SelectMembership, p.ID, room).Scan(&epoch, &departed)
	if tx.NoRows(err) {
		return 0, false, nil
	}
	return epoch, departed, err
}

// fence implements journal.MembershipStore for p inside tx.
type fence struct {
	tx Tx
	p  Principal
}

var _ journal.MembershipStore = fence{}

// RecordObservation implements journal.MembershipStore.
func (f fence) RecordObservation(room, observation string) (bool, error) {
	n, err := f.tx.Exec(InsertObservation, f.p.ID, observation, room)
	return n > 0, err
}

// Membership implements journal.MembershipStore.
func (f fence) Membership(room string) (int64, bool, error) { return membershipOf(f.tx, f.p, room) }

// fenceStatements remove what was derived from the ended membership: the
// epoch moves on, and the visible rows, held edits, tombstones and
// coverage markers go, and so do the events still awaiting their keys
// (settled, their ciphertext dropped: a key that comes later finds nothing
// of the old membership to make work of). Each takes (principal, room).
var fenceStatements = [...]Stmt{UpsertDeparture, FenceVisible, FenceHeldEdits, FenceTombstones, FenceCoverage,
	FenceAwaiting, FenceAwaitingKeys}

// EndMembership implements journal.MembershipStore: a new epoch, and in
// the same transaction everything derived from the old membership goes.
// Attempted outbox rows stay (their outcome is unknown and their frozen
// payload allows an exact retry); journal rows stay as proof; pending
// redactions stay because they still owe cleanup.
func (f fence) EndMembership(room string) error {
	f.tx.ForgetRoom(f.p, room)
	for _, s := range fenceStatements {
		if _, err := f.tx.Exec(s, f.p.ID, room); err != nil {
			return err
		}
	}
	// A row never attempted was never seen by the room, so withdrawing it
	// is exact; it would otherwise answer in a membership that ended.
	if _, err := f.tx.Exec(FenceUnattempted, f.tx.Now().UnixMilli(), f.p.ID, room); err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	if _, err := f.tx.Exec(FencePendingTurnWork, f.p.ID, room); err != nil {
		return fmt.Errorf("pending work: %w", err)
	}
	// An undecided approval of the ended membership is withdrawn for
	// good: a rejoin never revives it.
	if err := withdrawApprovalsInRoom(f.tx, f.p, room); err != nil {
		return fmt.Errorf("approvals: %w", err)
	}
	return nil
}

// Rejoin implements journal.MembershipStore.
func (f fence) Rejoin(room string) error {
	f.tx.ForgetRoom(f.p, room)
	_, err := f.tx.Exec(UpsertJoin, f.p.ID, room)
	return err
}

// OweReport implements journal.MembershipStore.
func (f fence) OweReport(room string, at time.Time) error {
	_, err := f.tx.Exec(InsertOwedReport, f.p.ID, room, at.UnixMilli())
	return err
}

// DropOwedReportsBefore implements journal.MembershipStore.
func (f fence) DropOwedReportsBefore(room string, t time.Time) error {
	_, err := f.tx.Exec(DeleteExpiredOwed, f.p.ID, room, t.UnixMilli())
	return err
}

// TakeOwedReport implements journal.MembershipStore.
func (f fence) TakeOwedReport(room string, since time.Time) (bool, error) {
	var id int64
	err := f.tx.QueryRow(SelectOldestOwed, f.p.ID, room, since.UnixMilli()).Scan(&id)
	if f.tx.NoRows(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	_, err = f.tx.Exec(DeleteOwedReport, id)
	return err == nil, err
}

// FenceDeparture applies one departure observation for p
// (journal.ApplyDeparture); its commit wakes the room's readers.
func FenceDeparture(tx Tx, p Principal, room string, source journal.DepartureSource, observation string) (journal.DepartureOutcome, []hint.Hint, error) {
	o, err := journal.ApplyDeparture(fence{tx, p}, room, source, observation, tx.Now())
	return o, roomHint(p, room), err
}

// RecordJoin marks p back in room under its current (advanced) epoch
// (journal.ApplyJoin).
func RecordJoin(tx Tx, p Principal, room, observation string) error {
	return journal.ApplyJoin(fence{tx, p}, room, observation)
}

// RetireOwedDepartureReports forgets the owed echoes of rooms.
func RetireOwedDepartureReports(tx Tx, p Principal, rooms []string) (int, error) {
	n := 0
	for _, room := range rooms {
		k, err := tx.Exec(DeleteOwedRoom, p.ID, room)
		if err != nil {
			return 0, err
		}
		n += int(k)
	}
	return n, nil
}
