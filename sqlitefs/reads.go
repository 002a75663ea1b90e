package sqlitefs

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"unsafe"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/journalsql"
)

// queryer is what a page reads through: the reader pool, or one read
// transaction of it.
type queryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// A page reads two sources in one statement, so one snapshot: the page
// index (visible_page) newest-first with a row-value cursor, so the index
// bounds the scan where the disjunctive spelling would filter; and the
// unmerged tail (pageindex.go), a bounded number of rows found by their
// seq range. The tail's rows come first, unordered, each marked 0; the
// index rows follow, marked 1, in order; pageScan merges them. The page
// queries and their columns are exported so benchmarks time the very SQL
// the reader runs; their arguments are (principal, room, thread, limit[,
// cursor ts, cursor event]).
const (
	// VisibleColumns are the columns a page reads, in scan order.
	VisibleColumns = `v.event_id, v.thread_id, v.sender, v.created_ts, ` + revisionIDColumn + `, v.revision_ts, v.content_json`
	// roomKeyOf finds a room's key from (principal, room ID); as a scalar
	// subquery it runs once per statement, not once per row.
	roomKeyOf = `SELECT id FROM rooms WHERE principal = ?1 AND room_id = ?2`
	// tailRows are a conversation's unmerged rows, indexRows its rows in
	// the page index; both leave a thread's root out, for the root closes
	// the thread's last page. An index entry newer than the merged mark
	// belongs to a merge cycle still running (pageindex.go); its row is
	// still read from the tail.
	tailRows = `FROM visible_messages v WHERE v.seq > ` + mergedUpto + `
		AND v.room = (` + roomKeyOf + `) AND v.thread_id = ?3 AND v.event_id <> ?3`
	indexRows = `FROM visible_page p JOIN visible_messages v ON v.seq = p.seq
		WHERE p.room = (` + roomKeyOf + `) AND p.thread_id = ?3 AND p.event_id <> ?3
		AND p.seq <= ` + mergedUpto
	newestFirst = ` ORDER BY p.created_ts DESC, p.event_id DESC`
	pageTail    = `SELECT 0, ` + VisibleColumns + ` ` + tailRows
	pageIndex   = `SELECT * FROM (SELECT 1, ` + VisibleColumns + ` ` + indexRows
	pageOrder   = newestFirst + ` LIMIT ?4)`
	// PageQueryHead reads the newest page of a conversation.
	PageQueryHead = pageTail + ` UNION ALL ` + pageIndex + pageOrder
	// PageQueryAfter reads the page older than a cursor.
	PageQueryAfter = pageTail + ` AND (v.created_ts, v.event_id) < (?5, ?6)
		UNION ALL ` + pageIndex + ` AND (p.created_ts, p.event_id) < (?5, ?6)` + pageOrder
	selectVisibleMessage = `SELECT ` + VisibleColumns + ` FROM journal_events j
		JOIN visible_messages v ON v.seq = j.seq
		WHERE j.principal = ? AND j.id_hash = ? AND j.event_id = ? AND j.room_id = ?`
	// selectLatestVisible reads the tail's rows and the index's newest; the
	// newest of them all is the conversation's latest.
	latestColumns       = `v.created_ts, v.event_id, ` + revisionIDColumn + `, v.content_json IS NULL`
	selectLatestVisible = `SELECT ` + latestColumns + ` ` + tailRows + `
		UNION ALL SELECT * FROM (SELECT ` + latestColumns + ` ` + indexRows + newestFirst + ` LIMIT 1)`
)

// scanMessage reads one visible row; it reports false for a row without a
// body (owing a refetch).
func scanMessage(row interface{ Scan(...any) error }, room string) (journal.Message, bool, error) {
	var r rowScratch
	if err := row.Scan(r.targets(false)...); err != nil {
		return journal.Message{}, false, err
	}
	m, visible := r.message(room)
	return m, visible, nil
}

// rowScratch is where one visible row is scanned. A page reuses one, so a
// row costs the driver's own allocations and nothing more.
type rowScratch struct {
	src                     int
	eventID, thread, sender string
	revisionID              string
	createdTS, revisionTS   int64
	content                 sql.NullString
	dest                    []any
}

// targets returns the scan destinations, after a leading source column
// when withSource is set.
func (r *rowScratch) targets(withSource bool) []any {
	if r.dest == nil {
		r.dest = []any{&r.src, &r.eventID, &r.thread, &r.sender, &r.createdTS, &r.revisionID, &r.revisionTS, &r.content}
	}
	if withSource {
		return r.dest
	}
	return r.dest[1:]
}

// message builds the scanned row's message. Content takes the driver's
// string bytes instead of a second copy: nothing else refers to them, and
// the copy showed in BenchmarkConversationWalk.
func (r *rowScratch) message(room string) (journal.Message, bool) {
	m := journal.Message{
		EventID: r.eventID, RoomID: room, Thread: journal.DecodeThread(r.thread), Sender: r.sender,
		CreatedTS: r.createdTS, RevisionID: r.revisionID, RevisionTS: r.revisionTS,
	}
	if r.content.Valid {
		m.Content = unsafe.Slice(unsafe.StringData(r.content.String), len(r.content.String))
	}
	return m, r.content.Valid
}

// newer orders messages as pages do: by creation time, then event ID in
// byte order, exactly as the SQL row value compares them.
func newer(a, b *journal.Message) bool {
	if a.CreatedTS != b.CreatedTS {
		return a.CreatedTS > b.CreatedTS
	}
	return a.EventID > b.EventID
}

// scanned is one row of a page query.
type scanned struct {
	m       journal.Message
	visible bool
}

// pageScan yields a page query's rows newest first, merging the unmerged
// tail's rows (which arrive first, unordered) into the index's.
type pageScan struct {
	rows              *sql.Rows
	room              string
	scratch           rowScratch
	tail              []scanned // newest first
	peek              scanned   // the next index row, read ahead, when havePeek
	havePeek, started bool
}

// next returns the next row newest first; ok is false at the end.
func (s *pageScan) next() (r scanned, ok bool, err error) {
	if !s.started {
		s.started = true
		if err := s.fill(); err != nil {
			return r, false, err
		}
		slices.SortFunc(s.tail, func(a, b scanned) int {
			if newer(&a.m, &b.m) {
				return -1
			}
			return 1
		})
	}
	if !s.havePeek {
		if err := s.fill(); err != nil {
			return r, false, err
		}
	}
	switch {
	case s.havePeek && (len(s.tail) == 0 || newer(&s.peek.m, &s.tail[0].m)):
		s.havePeek = false
		return s.peek, true, nil
	case len(s.tail) > 0:
		r, s.tail = s.tail[0], s.tail[1:]
		return r, true, nil
	}
	return r, false, nil
}

// fill reads rows until it holds the next index row or the rows end; tail
// rows met on the way are collected.
func (s *pageScan) fill() error {
	dest := s.scratch.targets(true)
	for !s.havePeek && s.rows.Next() {
		if err := s.rows.Scan(dest...); err != nil {
			return err
		}
		m, visible := s.scratch.message(s.room)
		if s.scratch.src == 0 {
			s.tail = append(s.tail, scanned{m, visible})
			continue
		}
		s.peek, s.havePeek = scanned{m, visible}, true
	}
	return s.rows.Err()
}

// Read returns one bounded page of a conversation for p, newest rows read
// first and returned oldest first. A thread page ends with its root, exactly
// once, on the last page. Rows owing a refetch are listed and omitted; they
// count against the limit so a page is bounded by the rows it reads.
func (db *DB) Read(ctx context.Context, p journalsql.Principal, req journal.ReadRequest) (journal.Page, error) {
	thread, err := journal.ValidateRead(req)
	if err != nil {
		return journal.Page{}, err
	}
	// A room page is one statement, consistent by itself. A thread page
	// also reads its root, so both run in one read transaction and come
	// from the same snapshot.
	var (
		q       queryer = db.readers
		head            = db.pageHead
		after           = db.pageAfter
		release         = func() {}
	)
	if thread != "" {
		tx, err := db.readers.BeginTx(ctx, nil)
		if err != nil {
			return journal.Page{}, fmt.Errorf("read page: %w", err)
		}
		q, head, after = tx, tx.StmtContext(ctx, head), tx.StmtContext(ctx, after)
		release = func() { _ = tx.Rollback() }
	}
	defer release()

	var rows *sql.Rows
	if req.Before == nil {
		rows, err = head.QueryContext(ctx, p.ID, req.RoomID, thread, req.Limit+1)
	} else {
		rows, err = after.QueryContext(ctx, p.ID, req.RoomID, thread, req.Limit+1,
			req.Before.CreatedTS, req.Before.EventID)
	}
	if err != nil {
		return journal.Page{}, fmt.Errorf("read page: %w", err)
	}
	b := journal.NewPageBuilder(req.Limit, db.budget)
	scan := &pageScan{rows: rows, room: req.RoomID}
	for {
		r, ok, err := scan.next()
		if err != nil {
			rows.Close()
			return journal.Page{}, fmt.Errorf("read page: %w", err)
		}
		if !ok || !b.Add(r.m, r.visible) {
			break
		}
	}
	if err := rows.Close(); err != nil {
		return journal.Page{}, fmt.Errorf("read page: %w", err)
	}
	err = journalsql.AddThreadRoot(b, thread, func() (journal.Message, bool, error) {
		return scanMessage(q.QueryRowContext(ctx, selectVisibleMessage, p.ID, IDHash(thread), thread, req.RoomID), req.RoomID)
	}, func(err error) bool { return errors.Is(err, sql.ErrNoRows) })
	return b.Page(), err
}

// LatestVisibleEventID returns the revision on screen of the newest message
// of a conversation, or its logical ID when that revision was redacted. A
// thread's root does not count as its latest event.
func (db *DB) LatestVisibleEventID(ctx context.Context, p journalsql.Principal, room string, thread *string) (string, bool, error) {
	key, err := journal.EncodeThread(thread)
	if err != nil {
		return "", false, err
	}
	tx, err := db.readers.BeginTx(ctx, nil)
	if err != nil {
		return "", false, fmt.Errorf("read latest event: %w", err)
	}
	defer tx.Rollback()
	var (
		latest            journal.Message
		logical, revision string
		bodyless, found   bool
	)
	rows, err := tx.QueryContext(ctx, selectLatestVisible, p.ID, room, key)
	if err != nil {
		return "", false, fmt.Errorf("read latest event: %w", err)
	}
	for rows.Next() {
		var (
			m    journal.Message
			rev  string
			none bool
		)
		if err := rows.Scan(&m.CreatedTS, &m.EventID, &rev, &none); err != nil {
			rows.Close()
			return "", false, fmt.Errorf("read latest event: %w", err)
		}
		if !found || newer(&m, &latest) {
			latest, logical, revision, bodyless, found = m, m.EventID, rev, none, true
		}
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return "", false, fmt.Errorf("read latest event: %w", err)
	}
	if !found {
		return "", false, nil
	}
	id, err := journal.LatestVisibleID(logical, revision, bodyless, func() (bool, error) {
		var dead bool
		err := tx.QueryRowContext(ctx, selectTombstone, p.ID, room, revision).Scan(&dead)
		return dead, err
	})
	if err != nil {
		return "", false, fmt.Errorf("read latest event: %w", err)
	}
	return id, true, nil
}
