package sqlitefs

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"unsafe"

	"github.com/mindroomd/mindroomd/journal"
)

// queryer is what a page reads through: the reader pool, or one read
// transaction of it.
type queryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// MaxPageLimit bounds the rows one page may ask for.
const MaxPageLimit = 10000

// Page queries walk the page index newest-first. The cursor is a row value
// so the index bounds the scan; the disjunctive spelling would filter. The
// page queries and their columns are exported so benchmarks time the very
// SQL the reader runs; their arguments are (principal, room, thread,
// thread[, cursor ts, cursor event], limit).
const (
	// VisibleColumns are the columns a page reads, in scan order.
	VisibleColumns = `v.event_id, v.thread_id, v.sender, v.created_ts, ` + revisionIDColumn + `, v.revision_ts, v.content_json`
	// PageQueryHead reads the newest page of a conversation.
	PageQueryHead = `SELECT ` + VisibleColumns + ` FROM visible_messages v
		WHERE v.room = (` + roomKeyOf + `) AND v.thread_id = ? AND v.event_id <> ?
		ORDER BY v.created_ts DESC, v.event_id DESC LIMIT ?`
	// PageQueryAfter reads the page older than a cursor.
	PageQueryAfter = `SELECT ` + VisibleColumns + ` FROM visible_messages v
		WHERE v.room = (` + roomKeyOf + `) AND v.thread_id = ? AND v.event_id <> ?
		AND (v.created_ts, v.event_id) < (?, ?)
		ORDER BY v.created_ts DESC, v.event_id DESC LIMIT ?`
	selectVisibleMessage = `SELECT ` + VisibleColumns + ` FROM journal_events j
		JOIN visible_messages v ON v.seq = j.seq
		WHERE j.principal = ? AND j.event_id = ? AND j.room_id = ?`
	selectLatestVisible = `SELECT v.event_id, ` + revisionIDColumn + `, v.content_json IS NULL FROM visible_messages v
		WHERE v.room = (` + roomKeyOf + `) AND v.thread_id = ? AND v.event_id <> ?
		ORDER BY v.created_ts DESC, v.event_id DESC LIMIT 1`
)

// roomKeyOf finds a room's key from (principal, room ID); as a scalar
// subquery it runs once per statement, not once per row.
const roomKeyOf = `SELECT id FROM rooms WHERE principal = ? AND room_id = ?`

// scanMessage reads one visible row; it reports false for a row without a
// body (owing a refetch). Content is scanned straight into its own bytes.
func scanMessage(row interface{ Scan(...any) error }, room string) (journal.Message, bool, error) {
	var (
		m       journal.Message
		thread  string
		content sql.NullString
	)
	if err := row.Scan(&m.EventID, &thread, &m.Sender, &m.CreatedTS, &m.RevisionID, &m.RevisionTS, &content); err != nil {
		return m, false, err
	}
	m.RoomID, m.Thread = room, journal.DecodeThread(thread)
	if content.Valid {
		// The driver allocated this string for this row alone and nothing
		// else refers to it, so the message takes its bytes instead of a
		// second copy: the copy was a fifth of a page walk's cost.
		m.Content = unsafe.Slice(unsafe.StringData(content.String), len(content.String))
	}
	return m, content.Valid, nil
}

func validateRead(req journal.ReadRequest) (thread string, err error) {
	if req.Limit <= 0 || req.Limit > MaxPageLimit {
		return "", fmt.Errorf("%w: limit %d must be in 1..%d", journal.ErrInvalidArgument, req.Limit, MaxPageLimit)
	}
	if !journal.ValidRoomID(req.RoomID) {
		return "", fmt.Errorf("%w: %q is not a room ID", journal.ErrInvalidArgument, req.RoomID)
	}
	if req.Before != nil && !journal.ValidEventID(req.Before.EventID) {
		return "", fmt.Errorf("%w: cursor event %q is not an event ID", journal.ErrInvalidArgument, req.Before.EventID)
	}
	return journal.EncodeThread(req.Thread)
}

// Read returns one bounded page of a conversation for p, newest rows read
// first and returned oldest first. A thread page ends with its root, exactly
// once, on the last page. Rows owing a refetch are listed and omitted; they
// count against the limit so a page is bounded by the rows it reads.
func (db *DB) Read(ctx context.Context, p Principal, req journal.ReadRequest) (journal.Page, error) {
	thread, err := validateRead(req)
	if err != nil {
		return journal.Page{}, err
	}
	// A room page is one statement, consistent by itself. A thread page
	// also reads its root, so both run in one read transaction and come
	// from the same snapshot.
	var (
		q       queryer = db.Readers
		head            = db.pageHead
		after           = db.pageAfter
		release         = func() {}
	)
	if thread != "" {
		tx, err := db.Readers.BeginTx(ctx, nil)
		if err != nil {
			return journal.Page{}, fmt.Errorf("read page: %w", err)
		}
		q, head, after = tx, tx.StmtContext(ctx, head), tx.StmtContext(ctx, after)
		release = func() { _ = tx.Rollback() }
	}
	defer release()

	var rows *sql.Rows
	if req.Before == nil {
		rows, err = head.QueryContext(ctx, p.ID, req.RoomID, thread, thread, req.Limit+1)
	} else {
		rows, err = after.QueryContext(ctx, p.ID, req.RoomID, thread, thread,
			req.Before.CreatedTS, req.Before.EventID, req.Limit+1)
	}
	if err != nil {
		return journal.Page{}, fmt.Errorf("read page: %w", err)
	}
	var (
		page     journal.Page
		newest   = make([]journal.Message, 0, min(req.Limit, 512)) // newest first
		budget   = db.budget
		read     int
		cut      bool
		lastRead journal.Cursor // the oldest row read: where a next page starts
	)
	for rows.Next() {
		if read == req.Limit {
			cut = true // a row beyond the limit exists
			break
		}
		m, visible, err := scanMessage(rows, req.RoomID)
		if err != nil {
			rows.Close()
			return journal.Page{}, fmt.Errorf("read page: %w", err)
		}
		if visible && !budget.Admit(m.Content, len(newest) == 0) {
			cut = true
			break
		}
		read++
		lastRead = journal.Cursor{CreatedTS: m.CreatedTS, EventID: m.EventID}
		if !visible {
			page.OwedRefetch = append(page.OwedRefetch, m.EventID)
			continue
		}
		newest = append(newest, m)
	}
	if err := rows.Close(); err != nil {
		return journal.Page{}, fmt.Errorf("read page: %w", err)
	}
	switch {
	case cut:
		page.NextCursor = &lastRead
	case thread != "":
		// The replies are exhausted: the root closes the thread's last page,
		// if it still fits.
		root, visible, err := scanMessage(q.QueryRowContext(ctx, selectVisibleMessage, p.ID, thread, req.RoomID), req.RoomID)
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return journal.Page{}, fmt.Errorf("read thread root: %w", err)
		case read == req.Limit || (visible && !budget.Admit(root.Content, len(newest) == 0)):
			page.NextCursor = &lastRead
		case !visible:
			page.OwedRefetch = append(page.OwedRefetch, root.EventID)
		default:
			newest = append(newest, root)
		}
	}
	slices.Reverse(newest)
	page.Messages = newest
	return page, nil
}

// LatestVisibleEventID returns the revision on screen of the newest message
// of a conversation, or its logical ID when that revision was redacted. A
// thread's root does not count as its latest event.
func (db *DB) LatestVisibleEventID(ctx context.Context, p Principal, room string, thread *string) (string, bool, error) {
	key, err := journal.EncodeThread(thread)
	if err != nil {
		return "", false, err
	}
	tx, err := db.Readers.BeginTx(ctx, nil)
	if err != nil {
		return "", false, fmt.Errorf("read latest event: %w", err)
	}
	defer tx.Rollback()
	var (
		logical, revision string
		bodyless          bool
	)
	err = tx.QueryRowContext(ctx, selectLatestVisible, p.ID, room, key, key).Scan(&logical, &revision, &bodyless)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read latest event: %w", err)
	}
	if bodyless && revision != logical {
		var one int
		err := tx.QueryRowContext(ctx, selectTombstone, p.ID, room, revision).Scan(&one)
		if err == nil {
			return logical, true, nil // the revision on screen was redacted
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return "", false, fmt.Errorf("read latest event: %w", err)
		}
	}
	return revision, true, nil
}
