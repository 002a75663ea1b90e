package pgfs

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/journalsql"
)

// A page is one statement on visible_messages_page, newest first from a
// row-value cursor, which the index takes as where its backward scan
// starts; the disjunctive spelling would bound only created_ts. The page
// queries' arguments are (principal, room, thread, limit[, cursor ts,
// cursor event]). A thread's root is not one of its replies: the root
// closes the thread's last page.
const (
	pageColumns = `v.event_id, v.thread_id, v.sender, v.created_ts, ` + revisionIDColumn + `, v.revision_ts, v.content_json`
	// conversationRows are a conversation's rows; the room's key is a
	// scalar subquery, found once per statement.
	conversationRows = `FROM visible_messages v
		WHERE v.room = (SELECT id FROM rooms WHERE principal = $1 AND room_id = $2)
		AND v.thread_id = $3 AND v.event_id <> $3`
	newestFirst = ` ORDER BY v.created_ts DESC, v.event_id DESC`
	// PageQueryHead and PageQueryAfter are a conversation's newest page
	// and a page older than a cursor; exported so a benchmark can run the
	// reader's own statements bare.
	PageQueryHead  = `SELECT ` + pageColumns + ` ` + conversationRows + newestFirst + ` LIMIT $4`
	PageQueryAfter = `SELECT ` + pageColumns + ` ` + conversationRows + `
		AND (v.created_ts, v.event_id) < ($5, $6)` + newestFirst + ` LIMIT $4`
	// PageColumns and ConversationRows are the pieces the page queries
	// share, for a benchmark's disjunctive variant.
	PageColumns      = pageColumns
	ConversationRows = conversationRows
	// readThreadRoot finds a root through the journal's unique (principal,
	// event_id): the page index does not lead with event_id.
	readThreadRoot = `SELECT ` + pageColumns + ` FROM journal_events j
		JOIN visible_messages v ON v.seq = j.seq
		WHERE j.principal = $1 AND j.event_id = $2 AND j.room_id = $3`
	// readLatestVisible reads a conversation's newest row and whether its
	// revision on screen was redacted, in one statement and so one
	// snapshot; the tombstone is probed for that one row alone.
	readLatestVisible = `SELECT v.event_id, ` + revisionIDColumn + `, v.content_json IS NULL,
		EXISTS (SELECT 1 FROM redaction_tombstones t
			WHERE t.principal = $1 AND t.room_id = $2 AND t.event_id = ` + revisionIDColumn + `)
		` + conversationRows + newestFirst + ` LIMIT 1`
)

// scanMessage reads one row of pageColumns; it reports false for a row
// without a body, which owes a refetch.
func scanMessage(row pgx.Row, room string) (journal.Message, bool, error) {
	var (
		m       = journal.Message{RoomID: room}
		thread  string
		content []byte
	)
	if err := row.Scan(&m.EventID, &thread, &m.Sender, &m.CreatedTS, &m.RevisionID, &m.RevisionTS, &content); err != nil {
		return journal.Message{}, false, err
	}
	// pgx scans a NULL text as a nil slice and any value, '' too, as a
	// non-nil one.
	m.Thread, m.Content = journal.DecodeThread(thread), content
	return m, content != nil, nil
}

// pageQuerier is what a page reads through: the pool, or a read
// transaction of it.
type pageQuerier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Read returns one bounded page of a conversation for p, newest rows read
// first and returned oldest first; package journal decides what the page
// holds.
func (s *Store) Read(ctx context.Context, p journalsql.Principal, req journal.ReadRequest) (journal.Page, error) {
	thread, err := journal.ValidateRead(req)
	if err != nil {
		return journal.Page{}, err
	}
	// A room page is one statement, consistent by itself. A thread page
	// also reads its root, so both run in one repeatable-read transaction
	// and come from the same snapshot.
	var q pageQuerier = s.pool
	if thread != "" {
		tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
		if err != nil {
			return journal.Page{}, fmt.Errorf("read page: %w", redact(err))
		}
		defer func() { _ = tx.Rollback(context.Background()) }()
		q = tx
	}
	var rows pgx.Rows
	if req.Before == nil {
		rows, err = q.Query(ctx, PageQueryHead, p.ID, req.RoomID, thread, req.Limit+1)
	} else {
		rows, err = q.Query(ctx, PageQueryAfter, p.ID, req.RoomID, thread, req.Limit+1,
			req.Before.CreatedTS, req.Before.EventID)
	}
	if err != nil {
		return journal.Page{}, fmt.Errorf("read page: %w", redact(err))
	}
	b := journal.NewPageBuilder(req.Limit, s.budget)
	for rows.Next() {
		m, visible, err := scanMessage(rows, req.RoomID)
		if err != nil {
			rows.Close()
			return journal.Page{}, fmt.Errorf("read page: %w", err)
		}
		if !b.Add(m, visible) {
			break
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return journal.Page{}, fmt.Errorf("read page: %w", err)
	}
	err = journalsql.AddThreadRoot(b, thread, func() (journal.Message, bool, error) {
		return scanMessage(q.QueryRow(ctx, readThreadRoot, p.ID, thread, req.RoomID), req.RoomID)
	}, func(err error) bool { return errors.Is(err, pgx.ErrNoRows) })
	return b.Page(), err
}

// LatestVisibleEventID returns the ID the newest message of a
// conversation answers to; a thread's root does not count as its latest.
func (s *Store) LatestVisibleEventID(ctx context.Context, p journalsql.Principal, room string, thread *string) (string, bool, error) {
	key, err := journal.EncodeThread(thread)
	if err != nil {
		return "", false, err
	}
	var (
		logical, revision  string
		bodyless, redacted bool
	)
	err = s.pool.QueryRow(ctx, readLatestVisible, p.ID, room, key).Scan(&logical, &revision, &bodyless, &redacted)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read latest event: %w", redact(err))
	}
	id, err := journal.LatestVisibleID(logical, revision, bodyless, func() (bool, error) { return redacted, nil })
	if err != nil {
		return "", false, fmt.Errorf("read latest event: %w", err)
	}
	return id, true, nil
}
