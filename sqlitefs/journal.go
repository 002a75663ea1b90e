package sqlitefs

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

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

// Parsed is one inbound event after validation, which needs no database and
// so runs in the caller's goroutine, off the writer's single thread.
type Parsed struct {
	In    journal.Inbound
	Event *journal.Event // nil when Err is set
	Err   error
}

// Parse validates a batch against the clock's now.
func Parse(events []journal.Inbound, now time.Time) []Parsed {
	out := make([]Parsed, len(events))
	for i, in := range events {
		ev, err := journal.ParseEvent(in, now)
		out[i] = Parsed{In: in, Event: ev, Err: err}
	}
	return out
}

// AdmitBatch journals one parsed sync batch for p: each event is inserted or
// recognised as a duplicate, projected, and the sync token stored, all
// inside tx. Malformed events are recorded in rejected_events and skipped.
// It returns one result per event and the hints to publish after commit.
func AdmitBatch(tx *Tx, p Principal, events []Parsed, nextBatch string) ([]journal.AdmitResult, []hint.Hint, error) {
	results := make([]journal.AdmitResult, len(events))
	rooms := make(map[string]roomRef)
	newest := make(map[string]int64)
	for i, pe := range events {
		ev := pe.Event
		if pe.Err != nil {
			results[i] = journal.AdmitResult{EventID: peekEventID(pe.In.Event), Outcome: journal.Rejected, Err: pe.Err}
			if err := recordRejected(tx, p, pe.In, results[i].EventID, pe.Err); err != nil {
				return nil, nil, err
			}
			continue
		}
		room, ok := rooms[ev.RoomID]
		if !ok {
			var err error
			if room, err = roomOf(tx, p, ev.RoomID); err != nil {
				return nil, nil, err
			}
			rooms[ev.RoomID] = room
		}
		class := journal.Classify(ev, p.UserID, room.departed)
		seq, admitted, err := insertEvent(tx, p, ev, class, room.epoch)
		if err != nil {
			return nil, nil, fmt.Errorf("admit %s: %w", ev.ID, err)
		}
		if !admitted {
			results[i] = journal.AdmitResult{EventID: ev.ID, Outcome: journal.Duplicate}
			continue
		}
		pj := projector{tx: tx, p: p, seq: seq, room: room}
		if err := journal.Project(&pj, ev, p.UserID, room.departed); err != nil {
			return nil, nil, err
		}
		results[i] = journal.AdmitResult{EventID: ev.ID, Outcome: journal.Admitted, Class: class}
		newest[ev.RoomID] = seq
	}
	if nextBatch != "" {
		if _, err := tx.exec(updateSyncToken, nextBatch, tx.nowMS(), p.ID); err != nil {
			return nil, nil, fmt.Errorf("store sync token: %w", err)
		}
	}
	hints := make([]hint.Hint, 0, len(newest))
	for room, seq := range newest {
		hints = append(hints, hint.Hint{Principal: p.String(), Room: room, Position: seq})
	}
	return results, hints, nil
}

// insertEvent journals ev unless p already has it. Actionable events keep
// their canonical payload; context-only events are settled from the start.
func insertEvent(tx *Tx, p Principal, ev *journal.Event, class journal.Class, epoch int64) (seq int64, admitted bool, err error) {
	state := stateSettled
	if class == journal.Actionable {
		state = statePending
	}
	thread := ev.Thread
	if ev.Kind == journal.KindEdit || ev.Kind == journal.KindReaction {
		// A relation belongs to the thread of the event it relates to.
		err := tx.queryRow(selectThreadOf, p.ID, IDHash(ev.Target), ev.Target, ev.RoomID).Scan(&thread)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return 0, false, err
		}
	}
	// Exec rather than RETURNING: a query in a transaction costs
	// database/sql a goroutine, an insert does not.
	r, err := tx.exec(insertJournalEvent, p.ID, IDHash(ev.ID), ev.ID, ev.RoomID, thread, ev.Target, int(ev.Kind),
		int(class), int(ev.Provenance), state, epoch, tx.nowMS())
	if err != nil {
		return 0, false, err
	}
	if n, err := r.RowsAffected(); err != nil || n == 0 {
		return 0, false, err // already admitted
	}
	if seq, err = r.LastInsertId(); err != nil {
		return 0, false, err
	}
	if state == statePending {
		if _, err := tx.exec(insertPayload, seq, string(ev.Canonical)); err != nil {
			return 0, false, err
		}
	}
	ev.Thread = thread
	return seq, true, nil
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

func recordRejected(tx *Tx, p Principal, in journal.Inbound, eventID string, reason error) error {
	sum := sha256.Sum256(append([]byte(in.RoomID+"\x00"), in.Event...))
	raw := []byte(in.Event)
	if len(raw) > maxRejectedRaw {
		raw = raw[:maxRejectedRaw]
	}
	if _, err := tx.exec(insertRejected, p.ID, in.RoomID, eventID, sum[:], reason.Error(), raw, tx.nowMS()); err != nil {
		return fmt.Errorf("record rejected event: %w", err)
	}
	return nil
}

// peekEventID salvages an event ID from a rejected event for its report.
func peekEventID(raw json.RawMessage) string {
	var e struct {
		EventID string `json:"event_id"`
	}
	if json.Unmarshal(raw, &e) != nil || !journal.ValidEventID(e.EventID) {
		return ""
	}
	return e.EventID
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
	if limit <= 0 {
		return journal.PendingPage{}, fmt.Errorf("%w: limit must be positive", journal.ErrInvalidArgument)
	}
	rows, err := db.readers.QueryContext(ctx, selectPending, p.ID, after, limit)
	if err != nil {
		return journal.PendingPage{}, fmt.Errorf("read pending: %w", err)
	}
	defer rows.Close()
	page := journal.PendingPage{Next: after}
	read := 0
	for rows.Next() {
		var (
			e       journal.PendingEvent
			kind    int
			payload string
		)
		if err := rows.Scan(&e.Seq, &e.EventID, &e.RoomID, &kind, &e.Epoch, &payload); err != nil {
			return journal.PendingPage{}, fmt.Errorf("read pending: %w", err)
		}
		read++
		page.Next = e.Seq
		e.Kind = journal.Kind(kind)
		if err := checkPayload(payload, e.EventID); err != nil {
			page.Unreadable = append(page.Unreadable, journal.UnreadableEvent{Seq: e.Seq, EventID: e.EventID, Err: err})
			continue
		}
		e.Event = json.RawMessage(payload)
		page.Events = append(page.Events, e)
	}
	if err := rows.Err(); err != nil {
		return journal.PendingPage{}, fmt.Errorf("read pending: %w", err)
	}
	page.More = read == limit
	return page, nil
}

// checkPayload confirms a stored payload is the event it claims to be.
func checkPayload(payload, eventID string) error {
	var e struct {
		EventID string `json:"event_id"`
	}
	if err := json.Unmarshal([]byte(payload), &e); err != nil {
		return fmt.Errorf("stored payload does not decode: %w", err)
	}
	if e.EventID != eventID {
		return fmt.Errorf("stored payload names event %q", e.EventID)
	}
	return nil
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
