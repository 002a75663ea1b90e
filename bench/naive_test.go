package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/mattn/go-sqlite3"
	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/actors"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/sqlitefs"
	"github.com/mindroomd/mindroomd/store/writer"
)

// The naive baseline is the layout a first implementation would write
// (BenchmarkAdmit/naive reports its rate and WAL bytes per event): plain rowid
// tables, a unique index for the (principal, event_id) dedup key, the
// visible table keyed by (principal, room_id, event_id) — a second index
// on a hashed key — plus the page index, SQLite's default 4096-byte pages
// and default wal_autocheckpoint (1000 pages). Everything else matches the
// store's writer: WAL, synchronous=FULL, foreign keys, the same cache, the
// same writer actor and group commit, and the same per-event work (parse,
// classify, epoch and thread lookups, tombstone and held-edit checks, the
// projection, the sync token). It also keeps the partial pending index,
// which any schema needs (docs/ARCHITECTURE.md), so the comparison is about
// layout only.

// naiveSchemaVersion keys the cached naive fixture; bump it with the DDL.
const naiveSchemaVersion = 1

const naiveDDL = `
CREATE TABLE principals (
    id         INTEGER PRIMARY KEY,
    agent      TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    sync_token TEXT NOT NULL DEFAULT '',
    UNIQUE (agent, user_id)
);
CREATE TABLE events (
    id          INTEGER PRIMARY KEY,
    principal   INTEGER NOT NULL REFERENCES principals (id),
    event_id    TEXT    NOT NULL,
    room_id     TEXT    NOT NULL,
    thread_id   TEXT    NOT NULL,
    target_id   TEXT    NOT NULL,
    kind        INTEGER NOT NULL,
    class       INTEGER NOT NULL,
    provenance  INTEGER NOT NULL,
    state       INTEGER NOT NULL,
    payload     TEXT    NOT NULL,
    epoch       INTEGER NOT NULL,
    received_ms INTEGER NOT NULL
);
CREATE UNIQUE INDEX events_identity ON events (principal, event_id);
CREATE INDEX events_pending ON events (principal, id) WHERE state = 0;
CREATE TABLE visible (
    principal     INTEGER NOT NULL,
    room_id       TEXT    NOT NULL,
    thread_id     TEXT    NOT NULL,
    event_id      TEXT    NOT NULL,
    sender        TEXT    NOT NULL,
    created_ts    INTEGER NOT NULL,
    revision_id   TEXT    NOT NULL,
    revision_ts   INTEGER NOT NULL,
    content_json  TEXT,
    refresh_token INTEGER,
    epoch         INTEGER NOT NULL,
    PRIMARY KEY (principal, room_id, event_id)
);
CREATE INDEX visible_page ON visible (principal, room_id, thread_id, created_ts, event_id);
CREATE TABLE unresolved_edits (
    principal    INTEGER NOT NULL,
    room_id      TEXT    NOT NULL,
    target_id    TEXT    NOT NULL,
    sender       TEXT    NOT NULL,
    edit_id      TEXT    NOT NULL,
    edit_ts      INTEGER NOT NULL,
    content_json TEXT,
    epoch        INTEGER NOT NULL,
    PRIMARY KEY (principal, room_id, target_id, sender)
);
CREATE TABLE redaction_tombstones (
    principal     INTEGER NOT NULL,
    room_id       TEXT    NOT NULL,
    event_id      TEXT    NOT NULL,
    redaction_seq INTEGER NOT NULL,
    PRIMARY KEY (principal, room_id, event_id)
);
CREATE TABLE room_memberships (
    principal INTEGER NOT NULL,
    room_id   TEXT    NOT NULL,
    epoch     INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (principal, room_id)
);`

const (
	naiveInsertPrincipal = `INSERT INTO principals (id, agent, user_id) VALUES (?, ?, ?)`
	naiveFixtureEvent    = `INSERT INTO events
		(id, principal, event_id, room_id, thread_id, target_id, kind, class, provenance, state, payload, epoch, received_ms)
		VALUES (?, ?, ?, ?, '', '', ?, ?, ?, 1, '', 0, ?)`
	naiveFixtureVisible = `INSERT INTO visible
		(principal, room_id, thread_id, event_id, sender, created_ts, revision_id, revision_ts, content_json, refresh_token, epoch)
		VALUES (?, ?, '', ?, ?, ?, ?, ?, ?, NULL, 0)`

	naiveSelectEpoch  = `SELECT epoch FROM room_memberships WHERE principal = ? AND room_id = ?`
	naiveSelectThread = `SELECT thread_id FROM events WHERE principal = ? AND event_id = ? AND room_id = ?`
	naiveInsertEvent  = `INSERT INTO events
		(principal, event_id, room_id, thread_id, target_id, kind, class, provenance, state, payload, epoch, received_ms)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (principal, event_id) DO NOTHING
		RETURNING id`
	naiveSelectTombstone = `SELECT 1 FROM redaction_tombstones WHERE principal = ? AND room_id = ? AND event_id = ?`
	naiveSelectHeld      = `SELECT edit_id, edit_ts, content_json FROM unresolved_edits
		WHERE principal = ? AND room_id = ? AND target_id = ? AND sender = ?`
	naiveDeleteHeld = `DELETE FROM unresolved_edits WHERE principal = ? AND room_id = ? AND target_id = ?`
	naiveUpsertHeld = `INSERT INTO unresolved_edits (principal, room_id, target_id, sender, edit_id, edit_ts, content_json, epoch)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (principal, room_id, target_id, sender) DO UPDATE
		SET edit_id = excluded.edit_id, edit_ts = excluded.edit_ts, content_json = excluded.content_json, epoch = excluded.epoch`
	naiveInsertVisible = `INSERT INTO visible
		(principal, room_id, thread_id, event_id, sender, created_ts, revision_id, revision_ts, content_json, refresh_token, epoch)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	naiveSelectVisible = `SELECT sender, revision_id, revision_ts FROM visible
		WHERE principal = ? AND room_id = ? AND event_id = ?`
	naiveUpdateVisible = `UPDATE visible SET revision_id = ?, revision_ts = ?, content_json = ?, refresh_token = ?
		WHERE principal = ? AND room_id = ? AND event_id = ?`
	naiveUpdateToken = `UPDATE principals SET sync_token = ? WHERE id = ?`
)

// naiveFixture returns the cached naive-schema file holding spec's
// messages: the same messages, IDs and bodies as the store fixture.
func naiveFixture(tb testing.TB, spec fixtureSpec) string {
	tb.Helper()
	name := fixtureName("naive", spec, naiveSchemaVersion)
	return cachedFixture(tb, name, staleFixtures("naive", spec), func(dir string) (string, error) {
		return buildNaiveFixture(context.Background(), dir, spec)
	})
}

func buildNaiveFixture(ctx context.Context, dir string, spec fixtureSpec) (string, error) {
	path := filepath.Join(dir, "naive.db")
	db, err := openBuild(ctx, path)
	if err != nil {
		return "", err
	}
	if _, err := db.ExecContext(ctx, naiveDDL); err != nil {
		db.Close()
		return "", err
	}
	for p := 0; p < spec.Principals; p++ {
		if _, err := db.ExecContext(ctx, naiveInsertPrincipal, p+1, agentName(p), agentUser(p)); err != nil {
			db.Close()
			return "", err
		}
	}
	if err := db.Close(); err != nil {
		return "", err
	}
	err = bulkLoad(ctx, path, []string{naiveFixtureEvent, naiveFixtureVisible}, spec,
		func(stmts []*sql.Stmt, i int, m fixtureMessage) error {
			pid := int64(m.Principal + 1)
			if _, err := stmts[0].Exec(i+1, pid, m.EventID, roomID(m.Room),
				int(journal.KindMessage), int(journal.Actionable), int(journal.Live), fixtureReceivedMS); err != nil {
				return err
			}
			_, err := stmts[1].Exec(pid, roomID(m.Room), m.EventID, m.Sender, m.TS, m.EventID, m.TS, contentJSON(m.Body))
			return err
		})
	return path, err
}

// naiveStore runs the naive layout behind the project's own writer actor.
type naiveStore struct {
	path   string
	db     *sql.DB
	stmts  map[string]*sql.Stmt
	system *actor.ActorSystem
	pid    *actor.PID
	done   chan struct{}
	users  []string // principal index -> Matrix user ID; principal id = index+1
}

// naiveDriver applies the writer pragmas per connection in a connect
// hook, as sqlitefs does. temp_store=MEMORY matters beyond taste: without
// it the savepoint each command runs in spills its sub-journal to a temp
// file, ~11 KB of extra writes per event that have nothing to do with the
// layout under comparison.
const naiveDriver = "mindroomd_bench_naive"

var naivePragmas = []string{
	`PRAGMA busy_timeout = 10000`,
	`PRAGMA journal_mode = WAL`,
	`PRAGMA synchronous = FULL`,
	`PRAGMA foreign_keys = ON`,
	`PRAGMA cache_size = -65536`,
	`PRAGMA temp_store = MEMORY`,
}

func init() {
	sql.Register(naiveDriver, &sqlite3.SQLiteDriver{ConnectHook: func(c *sqlite3.SQLiteConn) error {
		for _, p := range naivePragmas {
			if _, err := c.Exec(p, nil); err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
		}
		return nil
	}})
}

func openNaive(ctx context.Context, path string, principals int) (_ *naiveStore, err error) {
	n := &naiveStore{path: path, stmts: map[string]*sql.Stmt{}, done: make(chan struct{})}
	// BEGIN IMMEDIATE, like the store's writer: the write lock is taken
	// up front, never upgraded mid-transaction. SQLite's own VFS, the
	// store's default, so group/naive compares schemas and not VFS.
	u := url.URL{Scheme: "file", Path: path, RawQuery: url.Values{"_txlock": {"immediate"}}.Encode()}
	if n.db, err = sql.Open(naiveDriver, u.String()); err != nil {
		return nil, err
	}
	n.db.SetMaxOpenConns(1)
	n.db.SetMaxIdleConns(1)
	n.db.SetConnMaxLifetime(0)
	n.db.SetConnMaxIdleTime(0)
	defer func() {
		if err != nil {
			n.closeDB()
		}
	}()
	for p := 0; p < principals; p++ {
		n.users = append(n.users, agentUser(p))
	}
	n.system = actors.NewSystem(zerolog.Nop())
	n.pid = n.system.Root.Spawn(writer.Props(writer.Deps{
		DB:        n.db,
		Log:       zerolog.Nop(),
		IsFatal:   sqlitefs.IsFatal,
		OnStopped: func(error) { close(n.done) },
	}))
	return n, nil
}

func (n *naiveStore) closeDB() {
	for _, st := range n.stmts {
		st.Close()
	}
	n.db.Close()
}

func (n *naiveStore) close() {
	n.system.Root.Poison(n.pid)
	<-n.done
	n.closeDB()
}

// admit implements admitter: one event, one command, one reply after the
// group commit that carried it.
func (n *naiveStore) admit(ctx context.Context, e planned) error {
	// Parsed in the caller's goroutine, as the store does.
	parsed := journal.Parse([]journal.Inbound{e.in}, time.Now())[0]
	res, err := writer.Request(ctx, n.system.Root, n.pid, &writer.Execute{
		Name: "naive_admit",
		Size: len(e.in.Event) + len(e.token),
		Run: func(tx *writer.Tx) (any, error) {
			return n.admitTx(tx, e.principal, parsed, e.token)
		},
	}, n.done)
	if err != nil {
		return err
	}
	if !res.(bool) {
		return fmt.Errorf("naive admit: %s was a duplicate", e.id)
	}
	return nil
}

// admitTx is the naive layout's AdmitBatch for one event: the same
// reads and writes sqlitefs does, against the naive tables.
func (n *naiveStore) admitTx(tx *writer.Tx, principal int, in journal.Parsed, token string) (bool, error) {
	// Prepared once on the writer's connection, as sqlitefs does.
	st := func(q string) *sql.Stmt {
		if s, ok := n.stmts[q]; ok {
			return s
		}
		s, err := tx.Conn().PrepareContext(context.Background(), q)
		if err != nil {
			panic(fmt.Sprintf("prepare %q: %v", q, err))
		}
		n.stmts[q] = s
		return s
	}
	pid, self := int64(principal+1), n.users[principal]
	ev, err := in.Event, in.Err
	if err != nil {
		return false, err
	}
	class := journal.Classify(ev, self, false)
	var epoch int64
	if err := st(naiveSelectEpoch).QueryRow(pid, ev.RoomID).Scan(&epoch); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return false, err
	}
	thread := ev.Thread
	if ev.Kind == journal.KindEdit || ev.Kind == journal.KindReaction {
		if err := st(naiveSelectThread).QueryRow(pid, ev.Target, ev.RoomID).Scan(&thread); err != nil && !errors.Is(err, sql.ErrNoRows) {
			return false, err
		}
	}
	state, payload := 1, ""
	if class == journal.Actionable {
		state, payload = 0, string(ev.Canonical)
	}
	var id int64
	err = st(naiveInsertEvent).QueryRow(pid, ev.ID, ev.RoomID, thread, ev.Target, int(ev.Kind), int(class),
		int(ev.Provenance), state, payload, epoch, tx.Now.UnixMilli()).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	tombstoned := func(eventID string) (bool, error) {
		var one int
		err := st(naiveSelectTombstone).QueryRow(pid, ev.RoomID, eventID).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			return false, nil
		}
		return err == nil, err
	}
	body := func(content []byte) (any, any) {
		if journal.IsSidecarPreview(content) {
			return nil, id
		}
		return string(content), nil
	}
	switch ev.Kind {
	case journal.KindMessage, journal.KindMedia:
		if dead, err := tombstoned(ev.ID); err != nil || dead {
			return err == nil, err
		}
		var (
			heldID   string
			heldTS   int64
			heldBody sql.NullString
		)
		err := st(naiveSelectHeld).QueryRow(pid, ev.RoomID, ev.ID, ev.Sender).Scan(&heldID, &heldTS, &heldBody)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return false, err
		}
		if _, err := st(naiveDeleteHeld).Exec(pid, ev.RoomID, ev.ID); err != nil {
			return false, err
		}
		content, refresh := body(ev.Content)
		if _, err := st(naiveInsertVisible).Exec(pid, ev.RoomID, thread, ev.ID, ev.Sender, ev.TS,
			ev.ID, ev.TS, content, refresh, epoch); err != nil {
			return false, err
		}
	case journal.KindEdit:
		if journal.IsTransportProgress(ev, self) {
			break
		}
		for _, target := range []string{ev.ID, ev.Target} {
			if dead, err := tombstoned(target); err != nil || dead {
				return err == nil, err
			}
		}
		rev := journal.Revision{TS: ev.TS, EventID: ev.ID}
		var (
			sender string
			cur    journal.Revision
		)
		err := st(naiveSelectVisible).QueryRow(pid, ev.RoomID, ev.Target).Scan(&sender, &cur.EventID, &cur.TS)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			if _, err := st(naiveUpsertHeld).Exec(pid, ev.RoomID, ev.Target, ev.Sender, ev.ID, ev.TS,
				string(ev.NewContent), epoch); err != nil {
				return false, err
			}
		case err != nil:
			return false, err
		case sender == ev.Sender && rev.After(cur):
			content, refresh := body(ev.NewContent)
			if _, err := st(naiveUpdateVisible).Exec(ev.ID, ev.TS, content, refresh, pid, ev.RoomID, ev.Target); err != nil {
				return false, err
			}
		}
	}
	if token != "" {
		if _, err := st(naiveUpdateToken).Exec(token, pid); err != nil {
			return false, err
		}
	}
	return true, nil
}
