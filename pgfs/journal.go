package pgfs

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journal"
)

// State values of journal_events.state. The statements below spell the
// pending state as the literal 0: the partial index journal_events_pending
// is chosen only when the planner sees its predicate in the query itself.
const (
	statePending = 0
	stateSettled = 1
)

// maxRejectedRaw bounds how much of a rejected event is kept for inspection.
const maxRejectedRaw = 256 << 10

const (
	selectRoom = `SELECT id, epoch, departed FROM rooms WHERE principal = $1 AND room_id = $2`
	// The no-op update makes RETURNING hand back the row even when another
	// command interned it first.
	insertRoom = `INSERT INTO rooms (principal, room_id) VALUES ($1, $2)
		ON CONFLICT (principal, room_id) DO UPDATE SET room_id = excluded.room_id
		RETURNING id, epoch, departed`
	// One round trip journals the event and, when $13 carries one, its
	// pending payload. A duplicate returns no row and writes nothing.
	insertJournalEvent = `WITH ev AS (
			INSERT INTO journal_events
				(principal, event_id, room_id, thread_id, target_id, kind, class, provenance, state, epoch, received_ms)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
			ON CONFLICT (principal, event_id) DO NOTHING
			RETURNING seq),
		payload AS (
			INSERT INTO journal_payloads (seq, payload)
			SELECT seq, $12::text FROM ev WHERE $12::text IS NOT NULL)
		SELECT seq FROM ev`
	selectThreadOf = `SELECT thread_id FROM journal_events
		WHERE principal = $1 AND event_id = $2 AND room_id = $3`
	insertRejected = `INSERT INTO rejected_events
		(principal, room_id, event_id, fingerprint, reason, raw, received_ms)
		VALUES ($1, $2, $3, $4, $5, $6, $7)
		ON CONFLICT (principal, fingerprint) DO NOTHING`
	// Settling drops the payloads through the journal_events_settled
	// trigger, in the same statement.
	settleEvents = `UPDATE journal_events SET state = 1
		WHERE principal = $1 AND event_id = ANY ($2) AND state = 0`
	settleEventInRoom = `UPDATE journal_events SET state = 1
		WHERE principal = $1 AND event_id = $2 AND room_id = $3 AND state = 0`
	// A pending row without its payload reads as an empty payload, which
	// the reader reports as unreadable rather than hiding.
	selectPending = `SELECT j.seq, j.event_id, j.room_id, j.kind, j.epoch, coalesce(p.payload, '')
		FROM journal_events j LEFT JOIN journal_payloads p ON p.seq = j.seq
		WHERE j.principal = $1 AND j.state = 0 AND j.seq > $2
		ORDER BY j.seq LIMIT $3`
	selectAdmittedEvent = `SELECT room_id, thread_id, state = 0 FROM journal_events
		WHERE principal = $1 AND event_id = $2`
	selectAdmittedThread = `SELECT thread_id FROM journal_events
		WHERE principal = $1 AND event_id = $2 AND room_id = $3`
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
	tx *Tx
	p  Principal
	// rooms holds the rooms Room read in this command, for Projection.
	rooms map[string]roomRef
}

var _ journal.AdmissionStore = (*admission)(nil)

// newAdmission is the admission store of one command of p's.
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
	err := a.tx.queryRow(selectThreadOf, a.p.ID, eventID, room).Scan(&thread)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	return thread, err == nil, err
}

// Insert implements journal.AdmissionStore.
func (a *admission) Insert(ev *journal.Event, thread string, class journal.Class, pending bool, epoch int64) (int64, bool, error) {
	state := stateSettled
	var payload any // NULL: a settled row keeps no payload
	if pending {
		state, payload = statePending, string(ev.Canonical)
	}
	var seq int64
	err := a.tx.queryRow(insertJournalEvent, a.p.ID, ev.ID, ev.RoomID, thread, ev.Target, int16(ev.Kind),
		int16(class), int16(ev.Provenance), int16(state), epoch, a.tx.nowMS(), payload).Scan(&seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil // already admitted
	}
	if err != nil {
		return 0, false, mapErr(err)
	}
	return seq, true, nil
}

// Known implements journal.AdmissionStore.
func (a *admission) Known(room, eventID string) (seq int64, thread string, err error) {
	err = a.tx.queryRow(selectJournaledSeq, a.p.ID, eventID, room).Scan(&seq, &thread)
	return seq, thread, err
}

// RecordRejected implements journal.AdmissionStore. The fingerprint and
// the raw bytes are exact; the room ID and the reason are text, which
// PostgreSQL keeps only as valid UTF-8 without NUL, so a malformed room ID
// or a reason quoting one is stored legibly instead of failing the batch.
func (a *admission) RecordRejected(in journal.Inbound, eventID string, reason error) error {
	sum := sha256.Sum256(append([]byte(in.RoomID+"\x00"), in.Event...))
	raw := []byte(in.Event)
	if len(raw) > maxRejectedRaw {
		raw = raw[:maxRejectedRaw]
	}
	_, err := a.tx.exec(insertRejected, a.p.ID, storableText(in.RoomID), storableText(eventID), sum[:],
		storableText(reason.Error()), raw, a.tx.nowMS())
	return err
}

// storableText makes s storable as PostgreSQL text: every NUL and every
// invalid UTF-8 sequence becomes U+FFFD.
func storableText(s string) string {
	return strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", "\uFFFD"), "\uFFFD")
}

// Projection implements journal.AdmissionStore. The room was read through
// Room earlier in the same command. A re-projected row needs nothing a
// first one does not: pages find every row through one index.
func (a *admission) Projection(room string, seq int64, _ bool) journal.ProjectionStore {
	return &projector{tx: a.tx, p: a.p, seq: seq, room: a.rooms[room]}
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

// roomOf interns room for p on first sight and reads its membership. It
// is read afresh in every command: another process may have changed it,
// and p's row lock keeps it from changing for the rest of the command.
func roomOf(tx *Tx, p Principal, room string) (roomRef, error) {
	var r roomRef
	err := tx.queryRow(selectRoom, p.ID, room).Scan(&r.key, &r.epoch, &r.departed)
	if errors.Is(err, pgx.ErrNoRows) {
		if err := tx.queryRow(insertRoom, p.ID, room).Scan(&r.key, &r.epoch, &r.departed); err != nil {
			return r, fmt.Errorf("intern room: %w", mapErr(err))
		}
		return r, nil
	}
	if err != nil {
		return r, fmt.Errorf("read membership epoch: %w", err)
	}
	return r, nil
}

// Settle settles p's pending events, dropping their payloads in the same
// statement. Another principal's rows are never touched.
func Settle(tx *Tx, p Principal, eventIDs []string) (int, error) {
	if len(eventIDs) == 0 {
		return 0, nil
	}
	tag, err := tx.exec(settleEvents, p.ID, eventIDs)
	if err != nil {
		return 0, fmt.Errorf("settle: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// pending reads one page of p's pending work in receipt order. A row whose
// payload cannot be decoded is reported and skipped; the page still
// advances past it.
func (s *Store) pending(ctx context.Context, p Principal, limit int, after int64) (journal.PendingPage, error) {
	if err := journal.CheckPendingLimit(limit); err != nil {
		return journal.PendingPage{}, err
	}
	rows, err := s.pool.Query(ctx, selectPending, p.ID, after, limit)
	if err != nil {
		return journal.PendingPage{}, fmt.Errorf("read pending: %w", err)
	}
	defer rows.Close()
	page := journal.PendingPage{Next: after}
	for rows.Next() {
		var (
			e       journal.PendingEvent
			kind    int16
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

// admittedThreadID reports whether p admitted eventID in room, and its
// thread key.
func (s *Store) admittedThreadID(ctx context.Context, p Principal, room, eventID string) (string, bool, error) {
	var thread string
	err := s.pool.QueryRow(ctx, selectAdmittedThread, p.ID, eventID, room).Scan(&thread)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read admitted thread: %w", err)
	}
	return thread, true, nil
}

// admittedEvent finds an event p admitted, by its ID alone: its room, its
// thread key, and whether it is still pending.
func (s *Store) admittedEvent(ctx context.Context, p Principal, eventID string) (room, thread string, pending, seen bool, err error) {
	err = s.pool.QueryRow(ctx, selectAdmittedEvent, p.ID, eventID).Scan(&room, &thread, &pending)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", false, false, nil
	}
	if err != nil {
		return "", "", false, false, fmt.Errorf("read admitted event: %w", err)
	}
	return room, thread, pending, true, nil
}
