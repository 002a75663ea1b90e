package journalsql

import (
	"crypto/sha256"
	"fmt"

	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journal"
)

// maxRejectedRaw bounds how much of a rejected event is kept for inspection.
const maxRejectedRaw = 256 << 10

// AdmitBatch journals one parsed sync batch for p in tx
// (journal.AdmitBatch) and returns the hints to publish after commit.
func AdmitBatch(tx Tx, p Principal, events []journal.Parsed, nextBatch string) ([]journal.AdmitResult, []hint.Hint, error) {
	results, newest, err := journal.AdmitBatch(newAdmission(tx, p), p.UserID, events, nextBatch)
	if err != nil {
		return nil, nil, err
	}
	return results, hint.ForRooms(p.String(), newest), nil
}

// admission implements journal.AdmissionStore and journal.CoverageStore
// for p inside tx.
type admission struct {
	tx Tx
	p  Principal
	// rooms holds the rooms Room read in this command, for Projection.
	rooms map[string]RoomRef
}

var (
	_ journal.AdmissionStore = (*admission)(nil)
	_ journal.CoverageStore  = (*admission)(nil)
)

// newAdmission is the admission store of one command of p's.
func newAdmission(tx Tx, p Principal) *admission {
	return &admission{tx: tx, p: p, rooms: make(map[string]RoomRef)}
}

// Room implements journal.AdmissionStore.
func (a *admission) Room(room string) (journal.RoomState, error) {
	ref, err := a.tx.Room(a.p, room)
	if err != nil {
		return journal.RoomState{}, err
	}
	a.rooms[room] = ref
	return journal.RoomState{Epoch: ref.Epoch, Departed: ref.Departed}, nil
}

// ThreadOf implements journal.AdmissionStore.
func (a *admission) ThreadOf(room, eventID string) (string, bool, error) {
	var thread string
	err := a.tx.QueryRow(SelectThreadOf, a.p.ID, EventKey(eventID), room).Scan(&thread)
	if a.tx.NoRows(err) {
		return "", false, nil
	}
	return thread, err == nil, err
}

// Insert implements journal.AdmissionStore.
func (a *admission) Insert(ev *journal.Event, thread string, class journal.Class, pending bool, epoch int64) (int64, bool, error) {
	return a.tx.InsertEvent(a.p, ev, thread, class, pending, epoch)
}

// Known implements journal.AdmissionStore.
func (a *admission) Known(room, eventID string) (seq int64, thread string, err error) {
	err = a.tx.QueryRow(SelectJournaledSeq, a.p.ID, EventKey(eventID), room).Scan(&seq, &thread)
	return seq, thread, err
}

// RecordRejected implements journal.AdmissionStore. The fingerprint and
// the raw bytes are exact; the room ID and the reason are text, which a
// dialect may keep only in its own form (Dialect.Text), so a malformed
// room ID or a reason quoting one is stored legibly instead of failing the
// batch.
func (a *admission) RecordRejected(in journal.Inbound, eventID string, reason error) error {
	sum := sha256.Sum256(append([]byte(in.RoomID+"\x00"), in.Event...))
	raw := []byte(in.Event)
	if len(raw) > maxRejectedRaw {
		raw = raw[:maxRejectedRaw]
	}
	_, err := a.tx.Exec(InsertRejected, a.p.ID, a.tx.Text(in.RoomID), a.tx.Text(eventID), sum[:],
		a.tx.Text(reason.Error()), raw, a.tx.Now().UnixMilli())
	return err
}

// Projection implements journal.AdmissionStore. The room was read through
// Room earlier in the same command.
func (a *admission) Projection(room string, seq int64, rebuilt bool) journal.ProjectionStore {
	return &projector{tx: a.tx, p: a.p, seq: seq, room: a.rooms[room], rebuilt: rebuilt}
}

// StoreSyncToken implements journal.AdmissionStore.
func (a *admission) StoreSyncToken(token string) error {
	_, err := a.tx.Exec(UpdateSyncToken, token, a.tx.Now().UnixMilli(), a.p.ID)
	return err
}

// Cover implements journal.CoverageStore.
func (a *admission) Cover(room, thread string, epoch int64) error {
	_, err := a.tx.Exec(UpsertCoverage, a.p.ID, room, thread, epoch, a.tx.Now().UnixMilli())
	return err
}

// Settle settles p's pending events, dropping their payloads in the same
// statement. Another principal's rows are never touched.
func Settle(tx Tx, p Principal, eventIDs []string) (int, error) {
	n := 0
	for _, id := range eventIDs {
		k, err := tx.Exec(SettleEvent, p.ID, EventKey(id))
		if err != nil {
			return 0, fmt.Errorf("settle %s: %w", id, err)
		}
		n += int(k)
	}
	return n, nil
}

// InstallHistory installs one chunk of history fetched for p's room under
// epoch (journal.InstallHistory).
func InstallHistory(tx Tx, p Principal, room string, epoch int64, events []journal.Parsed) (journal.HistoryResult, error) {
	return journal.InstallHistory(newAdmission(tx, p), p.UserID, room, epoch, events)
}

// MarkCovered publishes that p's conversation (room, thread "" for the
// room) was hydrated under epoch (journal.MarkCovered).
func MarkCovered(tx Tx, p Principal, room, thread string, epoch int64) error {
	return journal.MarkCovered(newAdmission(tx, p), room, thread, epoch)
}

// RegisterPrincipal interns a principal, returning the existing row if any.
func RegisterPrincipal(tx Tx, p journal.Principal) (Principal, error) {
	var id int64
	if err := tx.QueryRow(InsertPrincipal, p.Agent, p.UserID).Scan(&id); err != nil {
		return Principal{}, fmt.Errorf("register principal: %w", err)
	}
	return Principal{Principal: p, ID: id}, nil
}
