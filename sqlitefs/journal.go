package sqlitefs

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"

	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journal"
)

// State values of journal_events.state.
const (
	statePending = 0
	stateSettled = 1
)

// maxRejectedRaw bounds how much of a rejected event is kept for inspection.
const maxRejectedRaw = 256 << 10

const (
	// The identity index holds a 64-bit hash of the event ID, not the ID:
	// three times as many entries per page, so a random insert splits
	// pages a third as often. The ID itself is compared on the row.
	insertJournalEvent = `INSERT INTO journal_events
		(principal, id_hash, event_id, room_id, thread_id, target_id, kind, class, provenance, state, epoch, received_ms)
		SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12
		WHERE NOT EXISTS (SELECT 1 FROM journal_events WHERE principal = ?1 AND id_hash = ?2 AND event_id = ?3)`
	insertPayload  = `INSERT INTO journal_payloads (seq, payload) VALUES (?, ?)`
	selectRoom     = `SELECT id, epoch, departed FROM rooms WHERE principal = ? AND room_id = ?`
	insertRoom     = `INSERT INTO rooms (principal, room_id) VALUES (?, ?)`
	selectThreadOf = `SELECT thread_id FROM journal_events WHERE principal = ? AND id_hash = ? AND event_id = ? AND room_id = ?`
	insertRejected = `INSERT INTO rejected_events
		(principal, room_id, event_id, fingerprint, reason, raw, received_ms)
		VALUES (?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (principal, fingerprint) DO NOTHING`
	// Settling drops the payload through the journal_events_settled trigger.
	settleEvent = `UPDATE journal_events SET state = 1
		WHERE principal = ? AND id_hash = ? AND event_id = ? AND state = 0`
	settleEventInRoom = `UPDATE journal_events SET state = 1
		WHERE principal = ? AND id_hash = ? AND event_id = ? AND room_id = ? AND state = 0`
	// A pending row without its payload reads as an empty payload, which
	// the reader reports as unreadable rather than hiding.
	selectPending = `SELECT j.seq, j.event_id, j.room_id, j.kind, j.epoch, coalesce(p.payload, '')
		FROM journal_events j LEFT JOIN journal_payloads p ON p.seq = j.seq
		WHERE j.principal = ? AND j.state = 0 AND j.seq > ?
		ORDER BY j.seq LIMIT ?`
	selectAdmittedEvent = `SELECT room_id, thread_id, state = 0 FROM journal_events
		WHERE principal = ? AND id_hash = ? AND event_id = ?`
	selectAdmittedThread = `SELECT thread_id FROM journal_events
		WHERE principal = ? AND id_hash = ? AND event_id = ? AND room_id = ?`
)

// AdmitBatch journals one parsed sync batch for p in tx
// (journal.AdmitBatch) and returns the hints to publish after commit.
func AdmitBatch(tx *Tx, p Principal, events []journal.Parsed, nextBatch string) ([]journal.AdmitResult, []hint.Hint, error) {
	results, newest, err := journal.AdmitBatch(newAdmission(tx, p), p.UserID, events, nextBatch)
	if err != nil {
		return nil, nil, err
	}
	return results, hint.ForRooms(p.String(), newest), nil
}

// admission implements journal.AdmissionStore for p inside tx.
type admission struct {
	tx    *Tx
	p     Principal
	rooms map[string]roomRef
}

var _ journal.AdmissionStore = (*admission)(nil)

func newAdmission(tx *Tx, p Principal) *admission {
	return &admission{tx: tx, p: p, rooms: make(map[string]roomRef)}
}

// Room implements journal.AdmissionStore.
func (a *admission) Room(room string) (journal.RoomState, error) {
	ref, err := roomOf(a.tx, a.p, room)
	if err != nil {
		return journal.RoomState{}, err
	}
	a.rooms[room] = ref
	return journal.RoomState{Epoch: ref.epoch, Departed: ref.departed}, nil
}

// ThreadOf implements journal.AdmissionStore.
func (a *admission) ThreadOf(room, eventID string) (string, bool, error) {
	var thread string
	err := a.tx.queryRow(selectThreadOf, a.p.ID, IDHash(eventID), eventID, room).Scan(&thread)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	return thread, err == nil, err
}

// Insert implements journal.AdmissionStore.
func (a *admission) Insert(ev *journal.Event, thread string, class journal.Class, pending bool, epoch int64) (int64, bool, error) {
	state := stateSettled
	if pending {
		state = statePending
	}
	// Exec rather than RETURNING: a query in a transaction costs
	// database/sql a goroutine, an insert does not.
	r, err := a.tx.exec(insertJournalEvent, a.p.ID, IDHash(ev.ID), ev.ID, ev.RoomID, thread, ev.Target, int(ev.Kind),
		int(class), int(ev.Provenance), state, epoch, a.tx.nowMS())
	if err != nil {
		return 0, false, err
	}
	if n, err := r.RowsAffected(); err != nil || n == 0 {
		return 0, false, err // already admitted
	}
	seq, err := r.LastInsertId()
	if err != nil {
		return 0, false, err
	}
	if pending {
		if _, err := a.tx.exec(insertPayload, seq, string(ev.Canonical)); err != nil {
			return 0, false, err
		}
	}
	return seq, true, nil
}

// Known implements journal.AdmissionStore.
func (a *admission) Known(room, eventID string) (seq int64, thread string, err error) {
	err = a.tx.queryRow(selectJournaledSeq, a.p.ID, IDHash(eventID), eventID, room).Scan(&seq, &thread)
	return seq, thread, err
}

// RecordRejected implements journal.AdmissionStore.
func (a *admission) RecordRejected(in journal.Inbound, eventID string, reason error) error {
	sum := sha256.Sum256(append([]byte(in.RoomID+"\x00"), in.Event...))
	raw := []byte(in.Event)
	if len(raw) > maxRejectedRaw {
		raw = raw[:maxRejectedRaw]
	}
	_, err := a.tx.exec(insertRejected, a.p.ID, in.RoomID, eventID, sum[:], reason.Error(), raw, a.tx.nowMS())
	return err
}

// Projection implements journal.AdmissionStore. The room was read through
// Room earlier in the same command.
func (a *admission) Projection(room string, seq int64, rebuilt bool) journal.ProjectionStore {
	return &projector{tx: a.tx, p: a.p, seq: seq, room: a.rooms[room], rebuilt: rebuilt}
}

// StoreSyncToken implements journal.AdmissionStore.
func (a *admission) StoreSyncToken(token string) error {
	_, err := a.tx.exec(updateSyncToken, token, a.tx.nowMS(), a.p.ID)
	return err
}

// roomRef is a room as p's rows key it: its interned key, and the
// membership epoch current in this transaction and whether p is out of the
// room.
type roomRef struct {
	key, epoch int64
	departed   bool
}

// roomName names a room of a principal.
type roomName struct {
	principal int64
	room      string
}

// roomOf interns room for p on first sight and reads its epoch. Every
// admitted event needs both, so they are cached (DB.rooms); an entry
// appears only once the transaction that read it has committed, and the
// fence and a join, the only things that change a membership, drop it
// (forgetRoom).
func roomOf(tx *Tx, p Principal, room string) (roomRef, error) {
	name := roomName{p.ID, room}
	if r, ok := tx.db.rooms[name]; ok {
		return r, nil
	}
	var r roomRef
	err := tx.queryRow(selectRoom, p.ID, room).Scan(&r.key, &r.epoch, &r.departed)
	if errors.Is(err, sql.ErrNoRows) {
		res, err := tx.exec(insertRoom, p.ID, room)
		if err != nil {
			return r, fmt.Errorf("intern room: %w", err)
		}
		if r.key, err = res.LastInsertId(); err != nil {
			return r, err
		}
	} else if err != nil {
		return r, fmt.Errorf("read membership epoch: %w", err)
	}
	if tx.afterCommit != nil {
		tx.afterCommit(func() { tx.db.rooms[name] = r })
	}
	return r, nil
}

// forgetRoom drops p's room from the cache at once, for the rest of this
// transaction, and again after it commits, after whatever an earlier
// command of the same transaction would add.
func forgetRoom(tx *Tx, p Principal, room string) {
	name := roomName{p.ID, room}
	delete(tx.db.rooms, name)
	if tx.afterCommit != nil {
		tx.afterCommit(func() { delete(tx.db.rooms, name) })
	}
}

// Settle settles p's pending events, dropping their payloads in the same
// statement. Another principal's rows are never touched.
func Settle(tx *Tx, p Principal, eventIDs []string) (int, error) {
	n := 0
	for _, id := range eventIDs {
		r, err := tx.exec(settleEvent, p.ID, IDHash(id), id)
		if err != nil {
			return 0, fmt.Errorf("settle %s: %w", id, err)
		}
		k, _ := r.RowsAffected()
		n += int(k)
	}
	return n, nil
}

// Pending reads one page of p's pending work in receipt order. A row whose
// payload cannot be decoded is reported and skipped; the page still
// advances past it.
func (db *DB) Pending(ctx context.Context, p Principal, limit int, after int64) (journal.PendingPage, error) {
	if err := journal.CheckPendingLimit(limit); err != nil {
		return journal.PendingPage{}, err
	}
	rows, err := db.readers.QueryContext(ctx, selectPending, p.ID, after, limit)
	if err != nil {
		return journal.PendingPage{}, fmt.Errorf("read pending: %w", err)
	}
	defer rows.Close()
	page := journal.PendingPage{Next: after}
	for rows.Next() {
		var (
			e       journal.PendingEvent
			kind    int
			payload string
		)
		if err := rows.Scan(&e.Seq, &e.EventID, &e.RoomID, &kind, &e.Epoch, &payload); err != nil {
			return journal.PendingPage{}, fmt.Errorf("read pending: %w", err)
		}
		e.Kind = journal.Kind(kind)
		page.Add(e, payload)
	}
	if err := rows.Err(); err != nil {
		return journal.PendingPage{}, fmt.Errorf("read pending: %w", err)
	}
	page.Filled(limit)
	return page, nil
}

// AdmittedThreadID reports whether p admitted eventID in room, and its
// thread key.
func (db *DB) AdmittedThreadID(ctx context.Context, p Principal, room, eventID string) (string, bool, error) {
	var thread string
	err := db.readers.QueryRowContext(ctx, selectAdmittedThread, p.ID, IDHash(eventID), eventID, room).Scan(&thread)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read admitted thread: %w", err)
	}
	return thread, true, nil
}

// AdmittedEvent finds an event p admitted, by its ID alone: its room, its
// thread key, and whether it is still pending.
func (db *DB) AdmittedEvent(ctx context.Context, p Principal, eventID string) (room, thread string, pending, seen bool, err error) {
	err = db.readers.QueryRowContext(ctx, selectAdmittedEvent, p.ID, IDHash(eventID), eventID).Scan(&room, &thread, &pending)
	if errors.Is(err, sql.ErrNoRows) {
		return "", "", false, false, nil
	}
	if err != nil {
		return "", "", false, false, fmt.Errorf("read admitted event: %w", err)
	}
	return room, thread, pending, true, nil
}
