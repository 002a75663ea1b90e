package journalsql

import (
	"context"
	"fmt"

	"github.com/mindroomd/mindroomd/journal"
)

// LookupPrincipal finds an already registered principal.
func LookupPrincipal(ctx context.Context, r Reader, p journal.Principal) (Principal, bool, error) {
	var id int64
	err := r.QueryRow(ctx, SelectPrincipalID, p.Agent, p.UserID).Scan(&id)
	if r.NoRows(err) {
		return Principal{}, false, nil
	}
	if err != nil {
		return Principal{}, false, fmt.Errorf("lookup principal: %w", err)
	}
	return Principal{Principal: p, ID: id}, true, nil
}

// SyncToken returns the principal's stored sync token.
func SyncToken(ctx context.Context, r Reader, p Principal) (string, error) {
	var tok string
	if err := r.QueryRow(ctx, SelectSyncToken, p.ID).Scan(&tok); err != nil {
		return "", fmt.Errorf("read sync token: %w", err)
	}
	return tok, nil
}

// SyncTokenStatus returns when p's sync token was stored, in unix
// milliseconds (0 before the first, or when not known).
func SyncTokenStatus(ctx context.Context, r Reader, p Principal) (int64, error) {
	var ms int64
	if err := r.QueryRow(ctx, SelectSyncTokenMS, p.ID).Scan(&ms); err != nil {
		return 0, fmt.Errorf("read sync token time: %w", err)
	}
	return ms, nil
}

// Pending reads one page of p's pending work in receipt order. A row whose
// payload cannot be decoded is reported and skipped; the page still
// advances past it.
func Pending(ctx context.Context, r Reader, p Principal, limit int, after int64) (journal.PendingPage, error) {
	if err := journal.CheckPendingLimit(limit); err != nil {
		return journal.PendingPage{}, err
	}
	rows, err := r.Query(ctx, SelectPending, p.ID, after, limit)
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
// thread.
func AdmittedThreadID(ctx context.Context, r Reader, p Principal, room, eventID string) (*string, bool, error) {
	var thread string
	err := r.QueryRow(ctx, SelectThreadOf, p.ID, EventKey(eventID), room).Scan(&thread)
	if r.NoRows(err) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("read admitted thread: %w", err)
	}
	return journal.DecodeThread(thread), true, nil
}

// AdmittedEvent finds an event p admitted, by its ID alone: its room, its
// thread, and whether it is still pending.
func AdmittedEvent(ctx context.Context, r Reader, p Principal, eventID string) (journal.AdmittedEvent, bool, error) {
	var (
		e      journal.AdmittedEvent
		thread string
	)
	err := r.QueryRow(ctx, SelectAdmittedEvent, p.ID, EventKey(eventID)).Scan(&e.RoomID, &thread, &e.Pending)
	if r.NoRows(err) {
		return journal.AdmittedEvent{}, false, nil
	}
	if err != nil {
		return journal.AdmittedEvent{}, false, fmt.Errorf("read admitted event: %w", err)
	}
	e.Thread = journal.DecodeThread(thread)
	return e, true, nil
}

// Delivery loads one of p's delivery stages.
func Delivery(ctx context.Context, r Reader, p Principal, deliveryID string, stage journal.Stage) (journal.Delivery, error) {
	d, err := scanDelivery(r.QueryRow(ctx, SelectDelivery, p.ID, deliveryID, int(stage)))
	if r.NoRows(err) {
		return d, fmt.Errorf("%w: %s/%s", journal.ErrNoDelivery, deliveryID, stage)
	}
	if err != nil {
		return d, fmt.Errorf("read delivery: %w", err)
	}
	return d, nil
}

// Unacknowledged scans p's queued and attempted rows, oldest first, with a
// row-value cursor, which continues exactly after it even among rows of
// one millisecond.
func Unacknowledged(ctx context.Context, r Reader, p Principal, limit int, after *journal.DeliveryCursor) ([]journal.Delivery, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("%w: limit must be positive", journal.ErrInvalidArgument)
	}
	var (
		rows Rows
		err  error
	)
	if after == nil {
		rows, err = r.Query(ctx, SelectUnackedHead, p.ID, limit)
	} else {
		rows, err = r.Query(ctx, SelectUnackedAfter, p.ID, after.CreatedMS, after.Position, limit)
	}
	if err != nil {
		return nil, fmt.Errorf("scan outbox: %w", err)
	}
	defer rows.Close()
	var out []journal.Delivery
	for rows.Next() {
		d, err := scanDelivery(rows)
		if err != nil {
			return nil, fmt.Errorf("scan outbox: %w", err)
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// DeliveredEvent reports whether eventID is the acknowledged event of one
// of p's deliveries to room.
func DeliveredEvent(ctx context.Context, r Reader, p Principal, room, eventID string) (bool, error) {
	var yes bool
	if err := r.QueryRow(ctx, SelectDeliveredEvent, p.ID, room, eventID).Scan(&yes); err != nil {
		return false, fmt.Errorf("read delivered event: %w", err)
	}
	return yes, nil
}

// RoomEpoch reads p's membership epoch of room and whether p is out of it.
func RoomEpoch(ctx context.Context, r Reader, p Principal, room string) (int64, bool, error) {
	var (
		epoch    int64
		departed bool
	)
	err := r.QueryRow(ctx, SelectMembership, p.ID, room).Scan(&epoch, &departed)
	if r.NoRows(err) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("read membership: %w", err)
	}
	return epoch, departed, nil
}

// Joined reports whether the journal has p in room: it recorded the room
// and p has not left it since.
func Joined(ctx context.Context, r Reader, p Principal, room string) (bool, error) {
	var (
		epoch    int64
		departed bool
	)
	err := r.QueryRow(ctx, SelectMembership, p.ID, room).Scan(&epoch, &departed)
	if r.NoRows(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read membership: %w", err)
	}
	return !departed, nil
}

// Rooms lists what the journal knows of each of p's rooms.
func Rooms(ctx context.Context, r Reader, p Principal) ([]journal.RoomActivity, error) {
	rows, err := r.Query(ctx, SelectRoomActivity, p.ID)
	if err != nil {
		return nil, fmt.Errorf("read rooms: %w", err)
	}
	defer rows.Close()
	var out []journal.RoomActivity
	for rows.Next() {
		var a journal.RoomActivity
		if err := rows.Scan(&a.RoomID, &a.Epoch, &a.Departed, &a.NewestTS, &a.Pending); err != nil {
			return nil, fmt.Errorf("read rooms: %w", err)
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

// RoomsOwingDepartureReports lists p's rooms with owed echoes.
func RoomsOwingDepartureReports(ctx context.Context, r Reader, p Principal) ([]string, error) {
	rows, err := r.Query(ctx, SelectOwedRooms, p.ID)
	if err != nil {
		return nil, fmt.Errorf("read owed reports: %w", err)
	}
	defer rows.Close()
	var rooms []string
	for rows.Next() {
		var room string
		if err := rows.Scan(&room); err != nil {
			return nil, fmt.Errorf("read owed reports: %w", err)
		}
		rooms = append(rooms, room)
	}
	return rooms, rows.Err()
}

// Covered reports whether p's conversation was hydrated under the room's
// current membership.
func Covered(ctx context.Context, r Reader, p Principal, room string, thread *string) (bool, error) {
	key, err := journal.EncodeThread(thread)
	if err != nil {
		return false, err
	}
	var covered bool
	if err := r.QueryRow(ctx, SelectCovered, p.ID, room, key).Scan(&covered); err != nil {
		return false, fmt.Errorf("read coverage: %w", err)
	}
	return covered, nil
}

// RefreshDebt reads the refresh debt of p's logical message eventID: its
// token and the membership epoch it is owed under. ok is false when the
// message is not on screen, owes nothing, or p is out of the room.
func RefreshDebt(ctx context.Context, r Reader, p Principal, room, eventID string) (journal.RefreshDebt, bool, error) {
	d := journal.RefreshDebt{RoomID: room, EventID: eventID}
	var departed bool
	err := r.QueryRow(ctx, SelectDebtEpoch, p.ID, EventKey(eventID), room).Scan(&d.Token, &d.Epoch, &departed)
	if r.NoRows(err) {
		return d, false, nil
	}
	if err != nil {
		return d, false, fmt.Errorf("read refresh debt: %w", err)
	}
	return d, d.Owed(departed), nil
}

// Status summarises every principal. It counts rows, so it is an operator
// command, not a hot path.
func Status(ctx context.Context, r Reader) ([]journal.PrincipalStatus, error) {
	return readAll(ctx, r, SelectStatus, "read status", func(row Row) (journal.PrincipalStatus, error) {
		var s journal.PrincipalStatus
		err := row.Scan(&s.Agent, &s.UserID, &s.HasSyncToken, &s.SyncTokenMS, &s.Events, &s.Pending, &s.Visible,
			&s.Queued, &s.Attempted, &s.Acknowledged, &s.Failed, &s.Retired, &s.OwedDepartures,
			&s.AwaitingKeys, &s.Undecryptable)
		return s, err
	})
}

// Backlogs reads what every principal still owes, cheaply enough for each
// metrics scrape.
func Backlogs(ctx context.Context, r Reader) ([]journal.Backlog, error) {
	return readAll(ctx, r, SelectBacklog, "read backlog", func(row Row) (journal.Backlog, error) {
		var b journal.Backlog
		err := row.Scan(&b.Agent, &b.UserID, &b.Pending, &b.Queued, &b.Attempted, &b.AwaitingKeys)
		return b, err
	})
}

// readAll reads every row of a statement that takes no argument.
func readAll[T any](ctx context.Context, r Reader, s Stmt, what string, scan func(Row) (T, error)) ([]T, error) {
	rows, err := r.Query(ctx, s)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// AddThreadRoot closes a thread's last page with its root, read by read,
// once the replies are exhausted and the page still has room; noRows tells
// a root that is not on screen. Nothing is read for a room's page.
func AddThreadRoot(b *journal.PageBuilder, thread string, read func() (journal.Message, bool, error), noRows func(error) bool) error {
	if thread == "" || b.Full() {
		return nil
	}
	root, visible, err := read()
	switch {
	case noRows(err):
		return nil
	case err != nil:
		return fmt.Errorf("read thread root: %w", err)
	}
	b.Add(root, visible)
	return nil
}
