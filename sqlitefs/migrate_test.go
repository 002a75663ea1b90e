package sqlitefs

import (
	"context"
	"database/sql"
	"errors"
	"github.com/mindroomd/mindroomd/journalsql"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/migration"
)

// The v2 fixture is written with v2's own shapes, which no v3 statement
// knows any more, so they live here rather than in the package. The checks
// read what no public read path exposes: the payload table and the stored
// revision spelling.
const (
	v2InsertPrincipal  = `INSERT INTO principals (agent, user_id, sync_token) VALUES (?, ?, ?)`
	v2InsertMembership = `INSERT INTO room_memberships (principal, room_id, epoch, departed) VALUES (?, ?, ?, ?)`
	v2InsertEvent      = `INSERT INTO journal_events
		(seq, principal, event_id, room_id, thread_id, target_id, kind, class, provenance, state, payload, epoch, received_ms)
		VALUES (?, ?, ?, ?, '', ?, ?, ?, ?, ?, ?, ?, ?)`
	v2InsertVisible = `INSERT INTO visible_messages
		(seq, principal, room_id, thread_id, event_id, sender, created_ts, revision_id, revision_ts, content_json, refresh_token, epoch)
		VALUES (?, ?, ?, '', ?, ?, ?, ?, ?, ?, NULL, ?)`
	v3SelectPayload        = `SELECT payload FROM journal_payloads WHERE seq = ?`
	v3CountPayloads        = `SELECT count(*) FROM journal_payloads`
	v3SelectStoredRevision = `SELECT revision_id FROM visible_messages WHERE seq = ?`
	v3CountTables          = `SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = ?`
)

const (
	migRoomA = "!alpha:example.org"
	migRoomB = "!beta:example.org"
	migBot   = "@bot:example.org"
	migAlice = "@alice:example.org"
)

// migParse parses a fixture event the way admission does, so the stored
// payload and content are exactly the canonical bytes a v2 writer kept.
func migParse(t *testing.T, room, raw string, now time.Time) *journal.Event {
	t.Helper()
	ev, err := journal.ParseEvent(journal.Inbound{RoomID: room, Provenance: journal.Live, Event: []byte(raw)}, now)
	if err != nil {
		t.Fatalf("parse fixture %s: %v", raw, err)
	}
	return ev
}

// migWrite runs write inside one writer transaction, the way the writer
// actor does: BEGIN IMMEDIATE on the writer's only connection.
func migWrite(t *testing.T, db *DB, now time.Time, write func(*Tx) error) {
	t.Helper()
	ctx := context.Background()
	conn, err := db.writer.Conn(ctx)
	if err != nil {
		t.Fatalf("writer connection: %v", err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatalf("begin: %v", err)
	}
	if err := write(db.WrapTx(conn, now, nil)); err != nil {
		_, _ = conn.ExecContext(ctx, "ROLLBACK")
		t.Fatalf("write: %v", err)
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		t.Fatalf("commit: %v", err)
	}
}

// migCount reads one integer through the query-only reader pool.
func migCount(t *testing.T, db *DB, query string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := db.readers.QueryRowContext(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// migPage reads a whole room page and checks which messages it holds, in
// order, with the revision on screen and the content of each.
func migPage(t *testing.T, db *DB, p journalsql.Principal, room string, want []journal.Message) {
	t.Helper()
	page, err := db.Read(context.Background(), p, journal.ReadRequest{RoomID: room, Limit: 10})
	if err != nil {
		t.Fatalf("Read %s: %v", room, err)
	}
	if page.NextCursor != nil || len(page.OwedRefetch) != 0 {
		t.Fatalf("Read %s: cursor %v, owed %v; want one complete page", room, page.NextCursor, page.OwedRefetch)
	}
	if len(page.Messages) != len(want) {
		t.Fatalf("Read %s: %d messages, want %d: %+v", room, len(page.Messages), len(want), page.Messages)
	}
	for i, got := range page.Messages {
		w := want[i]
		if got.EventID != w.EventID || got.RoomID != room || got.Thread != nil || got.Sender != w.Sender ||
			got.CreatedTS != w.CreatedTS || got.RevisionID != w.RevisionID || got.RevisionTS != w.RevisionTS ||
			string(got.Content) != string(w.Content) {
			t.Fatalf("Read %s message %d = %+v (content %s), want %+v (content %s)",
				room, i, got, got.Content, w, w.Content)
		}
	}
}

// A journal written by the previous release must come through the v3
// migration with its backlog, its membership epochs and its visible history
// intact: a lost payload is an unanswered message, a lost epoch lets a
// fenced turn act in a later membership, and a lost revision shows stale
// text.
func TestAVersion2JournalMigratesWithNothingLost(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	dir := t.TempDir()
	path := Path(dir)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatalf("mkdir: %v", err)
	}

	// $a1 is a question still owed its answer in room A, whose membership
	// ended once (epoch 2) and resumed. Room B has no membership row at
	// all: it is known only through its visible messages. $b1 was answered
	// and later edited by its author ($b1e); $b2 is the bot's own reply.
	a1 := migParse(t, migRoomA, `{"event_id":"$a1","type":"m.room.message","sender":"@alice:example.org","origin_server_ts":1700000002000,"content":{"msgtype":"m.text","body":"still owed"}}`, now)
	b1 := migParse(t, migRoomB, `{"event_id":"$b1","type":"m.room.message","sender":"@alice:example.org","origin_server_ts":1700000001000,"content":{"msgtype":"m.text","body":"first draft"}}`, now)
	b1e := migParse(t, migRoomB, `{"event_id":"$b1e","type":"m.room.message","sender":"@alice:example.org","origin_server_ts":1700000003500,"content":{"msgtype":"m.text","body":"* final","m.new_content":{"msgtype":"m.text","body":"final"},"m.relates_to":{"rel_type":"m.replace","event_id":"$b1"}}}`, now)
	b2 := migParse(t, migRoomB, `{"event_id":"$b2","type":"m.room.message","sender":"@bot:example.org","origin_server_ts":1700000004000,"content":{"msgtype":"m.text","body":"answered"}}`, now)

	var generation string
	func() {
		raw, err := sql.Open("sqlite3", path)
		if err != nil {
			t.Fatalf("open raw: %v", err)
		}
		defer raw.Close()
		// One connection, so the pragmas below hold for every statement.
		raw.SetMaxOpenConns(1)
		// The file a v2 writer left behind: small pages, WAL, and exactly
		// the first two migrations applied by the same code that applied
		// them in the field.
		for _, p := range []string{pragmaPageSize, pragmaJournalWAL} {
			if _, err := raw.ExecContext(ctx, p); err != nil {
				t.Fatalf("%s: %v", p, err)
			}
		}
		for _, m := range migrations()[:2] {
			if err := apply(ctx, raw, m); err != nil {
				t.Fatalf("apply %s: %v", m.Name, err)
			}
		}
		if err := mintGeneration(ctx, raw); err != nil {
			t.Fatal(err)
		}
		if err := raw.QueryRowContext(ctx, selectGeneration).Scan(&generation); err != nil {
			t.Fatalf("read generation: %v", err)
		}

		res, err := raw.ExecContext(ctx, v2InsertPrincipal, "helper", migBot, "s_41")
		if err != nil {
			t.Fatalf("insert principal: %v", err)
		}
		pid, err := res.LastInsertId()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := raw.ExecContext(ctx, v2InsertMembership, pid, migRoomA, 2, 0); err != nil {
			t.Fatalf("insert membership: %v", err)
		}
		received := now.UnixMilli()
		for _, e := range []struct {
			seq     int64
			ev      *journal.Event
			class   journal.Class
			state   int
			payload string
			epoch   int64
		}{
			{1, b1, journal.Actionable, stateSettled, "", 0},
			{2, a1, journal.Actionable, statePending, string(a1.Canonical), 2},
			{3, b1e, journal.ContextOnly, stateSettled, "", 0},
			{4, b2, journal.ContextOnly, stateSettled, "", 0},
		} {
			if _, err := raw.ExecContext(ctx, v2InsertEvent, e.seq, pid, e.ev.ID, e.ev.RoomID, e.ev.Target,
				int(e.ev.Kind), int(e.class), int(e.ev.Provenance), e.state, e.payload, e.epoch, received); err != nil {
				t.Fatalf("insert journal row %s: %v", e.ev.ID, err)
			}
		}
		// v2 spelled an unedited row's revision as its own event ID.
		for _, v := range []struct {
			seq     int64
			ev      *journal.Event
			rev     *journal.Event
			content []byte
			epoch   int64
		}{
			{1, b1, b1e, b1e.NewContent, 0},
			{2, a1, a1, a1.Content, 2},
			{4, b2, b2, b2.Content, 0},
		} {
			if _, err := raw.ExecContext(ctx, v2InsertVisible, v.seq, pid, v.ev.RoomID, v.ev.ID, v.ev.Sender,
				v.ev.TS, v.rev.ID, v.rev.TS, string(v.content), v.epoch); err != nil {
				t.Fatalf("insert visible row %s: %v", v.ev.ID, err)
			}
		}
		if err := raw.Close(); err != nil {
			t.Fatalf("close raw: %v", err)
		}
	}()

	db, err := Open(ctx, Options{StorageDir: dir})
	if err != nil {
		t.Fatalf("Open a v2 journal: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })

	if got, want := migCount(t, db, queryUserVersion), int64(SchemaVersion()); got != want || want != 9 {
		t.Fatalf("user_version = %d, want %d (schema version 9)", got, want)
	}
	if got, err := db.Generation(ctx); err != nil || got != generation {
		t.Fatalf("generation = %q, %v; want the v2 file's %q", got, err, generation)
	}
	if n := migCount(t, db, v3CountTables, "room_memberships"); n != 0 {
		t.Fatalf("room_memberships survived the migration")
	}
	p, ok, err := journalsql.LookupPrincipal(ctx, db.Reader(), journal.Principal{Agent: "helper", UserID: migBot})
	if err != nil || !ok {
		t.Fatalf("LookupPrincipal = %v, %v; want the v2 principal", ok, err)
	}
	if tok, err := journalsql.SyncToken(ctx, db.Reader(), p); err != nil || tok != "s_41" {
		t.Fatalf("SyncToken = %q, %v; want s_41", tok, err)
	}

	// The backlog: $a1 alone, under its epoch, byte for byte.
	pending, err := journalsql.Pending(ctx, db.Reader(), p, 10, 0)
	if err != nil {
		t.Fatalf("Pending: %v", err)
	}
	if len(pending.Unreadable) != 0 || len(pending.Events) != 1 {
		t.Fatalf("pending after migration = %+v, want $a1 alone", pending)
	}
	if e := pending.Events[0]; e.Seq != 2 || e.EventID != "$a1" || e.RoomID != migRoomA ||
		e.Kind != journal.KindMessage || e.Epoch != 2 || string(e.Event) != string(a1.Canonical) {
		t.Fatalf("pending $a1 = %+v (payload %s), want seq 2 epoch 2 payload %s", e, e.Event, a1.Canonical)
	}
	// Settled rows kept no payload in v2 and must not gain a row now.
	if n := migCount(t, db, v3CountPayloads); n != 1 {
		t.Fatalf("journal_payloads holds %d rows, want only $a1's", n)
	}

	if epoch, departed, err := journalsql.RoomEpoch(ctx, db.Reader(), p, migRoomA); err != nil || epoch != 2 || departed {
		t.Fatalf("room A membership = epoch %d departed %v (%v), want epoch 2 present", epoch, departed, err)
	}
	if epoch, departed, err := journalsql.RoomEpoch(ctx, db.Reader(), p, migRoomB); err != nil || epoch != 0 || departed {
		t.Fatalf("room B membership = epoch %d departed %v (%v), want epoch 0 present", epoch, departed, err)
	}

	// The unedited rows are stored without a second copy of their ID yet
	// read back as their own revision; the edit keeps its own ID.
	for seq, want := range map[int64]string{1: "$b1e", 2: "", 4: ""} {
		var got string
		if err := db.readers.QueryRowContext(ctx, v3SelectStoredRevision, seq).Scan(&got); err != nil || got != want {
			t.Fatalf("stored revision of seq %d = %q, %v; want %q", seq, got, err, want)
		}
	}
	wantA := []journal.Message{
		{EventID: "$a1", Sender: migAlice, CreatedTS: a1.TS, RevisionID: "$a1", RevisionTS: a1.TS, Content: a1.Content},
	}
	wantB := []journal.Message{
		{EventID: "$b1", Sender: migAlice, CreatedTS: b1.TS, RevisionID: "$b1e", RevisionTS: b1e.TS, Content: b1e.NewContent},
		{EventID: "$b2", Sender: migBot, CreatedTS: b2.TS, RevisionID: "$b2", RevisionTS: b2.TS, Content: b2.Content},
	}
	migPage(t, db, p, migRoomA, wantA)
	migPage(t, db, p, migRoomB, wantB)

	// Admission after the migration must find the migrated rooms, not
	// intern a second key beside them: room A's new event carries epoch 2
	// and room B's lands on the page that already holds $b1 and $b2.
	a3 := `{"event_id":"$a3","type":"m.room.message","sender":"@alice:example.org","origin_server_ts":1700000005000,"content":{"msgtype":"m.text","body":"and another"}}`
	b3 := `{"event_id":"$b3","type":"m.room.message","sender":"@alice:example.org","origin_server_ts":1700000006000,"content":{"msgtype":"m.text","body":"thanks"}}`
	migWrite(t, db, now, func(tx *Tx) error {
		res, _, err := journalsql.AdmitBatch(tx, p, journal.Parse([]journal.Inbound{
			{RoomID: migRoomA, Provenance: journal.Live, Event: []byte(a3)},
			{RoomID: migRoomB, Provenance: journal.Live, Event: []byte(b3)},
		}, now), "s_42")
		for _, r := range res {
			if r.Outcome != journal.Admitted {
				t.Errorf("admit %s after migration: %v %v", r.EventID, r.Outcome, r.Err)
			}
		}
		return err
	})
	pending, err = journalsql.Pending(ctx, db.Reader(), p, 10, 0)
	if err != nil {
		t.Fatalf("Pending: %v", err)
	}
	var epochs []int64
	for _, e := range pending.Events {
		epochs = append(epochs, e.Epoch)
	}
	if len(pending.Events) != 3 || pending.Events[1].EventID != "$a3" || pending.Events[2].EventID != "$b3" ||
		!slices.Equal(epochs, []int64{2, 2, 0}) {
		t.Fatalf("pending after admission = %+v, want $a1, $a3 at epoch 2 then $b3 at epoch 0", pending.Events)
	}
	b3ev := migParse(t, migRoomB, b3, now)
	migPage(t, db, p, migRoomB, append(wantB,
		journal.Message{EventID: "$b3", Sender: migAlice, CreatedTS: b3ev.TS, RevisionID: "$b3", RevisionTS: b3ev.TS, Content: b3ev.Content}))

	// Settling the migrated event must free its payload through the trigger
	// the migration installed, leaving the others' payloads alone.
	migWrite(t, db, now, func(tx *Tx) error {
		n, err := journalsql.Settle(tx, p, []string{"$a1"})
		if err == nil && n != 1 {
			t.Errorf("journalsql.Settle($a1) settled %d rows, want 1", n)
		}
		return err
	})
	var payload string
	if err := db.readers.QueryRowContext(ctx, v3SelectPayload, 2).Scan(&payload); !errors.Is(err, sql.ErrNoRows) {
		t.Fatalf("payload of settled $a1 = %q, %v; want no row", payload, err)
	}
	if n := migCount(t, db, v3CountPayloads); n != 2 {
		t.Fatalf("journal_payloads holds %d rows after settling $a1, want $a3's and $b3's", n)
	}
	pending, err = journalsql.Pending(ctx, db.Reader(), p, 10, 0)
	if err != nil || len(pending.Events) != 2 || pending.Events[0].EventID != "$a3" {
		t.Fatalf("pending after settling $a1 = %+v, %v; want $a3 and $b3", pending.Events, err)
	}
}

// A read-only open never migrates: it refuses a journal one migration
// behind, and leaves it byte for byte as the previous release wrote it, for
// the daemon of this release to migrate.
func TestAReadOnlyOpenRefusesAnOlderSchemaAndLeavesItAlone(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := Path(dir)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	older := SchemaVersion() - 1
	func() {
		raw := rawWithIDHash(path)
		defer raw.Close()
		for _, p := range []string{pragmaPageSize, pragmaJournalWAL} {
			if _, err := raw.ExecContext(ctx, p); err != nil {
				t.Fatalf("%s: %v", p, err)
			}
		}
		for _, m := range migrations()[:older] {
			if err := apply(ctx, raw, m); err != nil {
				t.Fatalf("apply %s: %v", m.Name, err)
			}
		}
		if err := mintGeneration(ctx, raw); err != nil {
			t.Fatal(err)
		}
	}()
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}

	db, err := OpenReadOnly(ctx, Options{StorageDir: dir})
	if err == nil {
		db.Close()
		t.Fatalf("read-only open accepted a journal at schema version %d", older)
	}
	var oe *migration.OlderDatabaseError
	if !errors.As(err, &oe) || oe.Version != older || oe.Known != SchemaVersion() {
		t.Fatalf("error = %v, want an OlderDatabaseError for version %d", err, older)
	}
	after, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(before, after) {
		t.Fatal("a refused read-only open changed the journal file")
	}
}

// The rows a v1 and a v2 writer left behind, in those versions' own shapes.
// journal_events and visible_messages kept v1's shape through v2, so the v2
// statements above write them at v1 too.
const (
	v1InsertMembership = `INSERT INTO room_memberships (principal, room_id, epoch) VALUES (?, ?, ?)`
	v2InsertTurn       = `INSERT INTO turn_records (agent, turn_id, room_id, state, record_json, updated_ms)
		VALUES (?, ?, ?, ?, ?, ?)`
	selectSchema = `SELECT type, name, tbl_name, sql FROM sqlite_schema ORDER BY type, name`
)

// schemaRow is one row of sqlite_schema, less its root page: the same
// schema lays out its pages differently when it was built over rows.
type schemaRow struct {
	typ, name, table string
	sql              sql.NullString // NULL for the indexes UNIQUE and PRIMARY KEY imply
}

// rawStep opens the journal file at path with the plain driver, as the
// release of that version did, runs step on it and closes it, so each
// version's rows reach the file before the next version opens it.
func rawStep(t *testing.T, path string, step func(context.Context, *sql.DB) error) {
	t.Helper()
	raw, err := sql.Open("sqlite3", path)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	// One connection, so the pragmas hold for every statement.
	raw.SetMaxOpenConns(1)
	if err := step(context.Background(), raw); err != nil {
		t.Fatal(err)
	}
	if err := raw.Close(); err != nil {
		t.Fatal(err)
	}
}

// schemaOf reads the schema of the closed journal under dir.
func schemaOf(t *testing.T, dir string) []schemaRow {
	t.Helper()
	var rows []schemaRow
	rawStep(t, Path(dir), func(ctx context.Context, raw *sql.DB) error {
		rs, err := raw.QueryContext(ctx, selectSchema)
		if err != nil {
			return err
		}
		defer rs.Close()
		for rs.Next() {
			var r schemaRow
			if err := rs.Scan(&r.typ, &r.name, &r.table, &r.sql); err != nil {
				return err
			}
			rows = append(rows, r)
		}
		return rs.Err()
	})
	return rows
}

// A journal that lived through every release, opened by each in turn with
// rows written in between, must end with exactly the schema a fresh journal
// gets: a table, index or trigger that only one of them has is a query
// that works on one machine and fails on the other. The SQL text is
// compared as stored, without normalising it: ALTER TABLE rewrites that
// text (ADD COLUMN appends to it, RENAME quotes the new name), so a
// difference in it is a difference in what the two files went through.
func TestAJournalMigratedStepByStepHasTheSchemaOfAFreshOne(t *testing.T) {
	ctx := context.Background()
	old := t.TempDir()
	path := Path(old)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	ms := migrations()
	if len(ms) < 3 {
		t.Fatalf("%d migrations; this test writes v1 and v2 rows and needs a later version to migrate them", len(ms))
	}

	// v1: the file as the first release made it, with rows in every table
	// a later migration rebuilds or moves.
	rawStep(t, path, func(ctx context.Context, raw *sql.DB) error {
		for _, p := range []string{pragmaPageSize, pragmaJournalWAL} {
			if _, err := raw.ExecContext(ctx, p); err != nil {
				return err
			}
		}
		if err := apply(ctx, raw, ms[0]); err != nil {
			return err
		}
		if err := mintGeneration(ctx, raw); err != nil {
			return err
		}
		if _, err := raw.ExecContext(ctx, v2InsertPrincipal, "helper", migBot, "s_1"); err != nil {
			return err
		}
		if _, err := raw.ExecContext(ctx, v1InsertMembership, 1, migRoomA, 1); err != nil {
			return err
		}
		if _, err := raw.ExecContext(ctx, v2InsertEvent, 1, 1, "$v1", migRoomA, "", 0, 0, 0, statePending,
			`{"event_id":"$v1"}`, 1, 1000); err != nil {
			return err
		}
		_, err := raw.ExecContext(ctx, v2InsertVisible, 1, 1, migRoomA, "$v1", migAlice, 1000, "$v1", 1000,
			`{"body":"v1"}`, 1)
		return err
	})
	// v2: the next release migrated it and wrote its own rows.
	rawStep(t, path, func(ctx context.Context, raw *sql.DB) error {
		if err := apply(ctx, raw, ms[1]); err != nil {
			return err
		}
		if _, err := raw.ExecContext(ctx, v2InsertMembership, 1, migRoomB, 3, 1); err != nil {
			return err
		}
		if _, err := raw.ExecContext(ctx, v2InsertTurn, "helper", "t1", migRoomA, 0, `{}`, 2000); err != nil {
			return err
		}
		if _, err := raw.ExecContext(ctx, v2InsertEvent, 2, 1, "$v2", migRoomB, "", 0, 0, 0, stateSettled,
			"", 3, 2000); err != nil {
			return err
		}
		_, err := raw.ExecContext(ctx, v2InsertVisible, 2, 1, migRoomB, "$v2", migAlice, 2000, "$v2", 2000,
			`{"body":"v2"}`, 3)
		return err
	})
	// Every later version: this binary's Open migrates what is left, the way
	// the daemon does.
	migrated, err := Open(ctx, Options{StorageDir: old})
	if err != nil {
		t.Fatalf("Open the v2 journal: %v", err)
	}
	if got := migCount(t, migrated, queryUserVersion); got != int64(len(ms)) {
		t.Fatalf("migrated journal at user_version %d, want %d", got, len(ms))
	}
	if err := migrated.Close(); err != nil {
		t.Fatal(err)
	}

	fresh := t.TempDir()
	db, err := Open(ctx, Options{StorageDir: fresh})
	if err != nil {
		t.Fatalf("Open a fresh journal: %v", err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	got, want := schemaOf(t, old), schemaOf(t, fresh)
	if len(want) == 0 {
		t.Fatal("a fresh journal has no schema")
	}
	if !slices.Equal(got, want) {
		for _, r := range got {
			if !slices.Contains(want, r) {
				t.Errorf("only the migrated journal has %s %s: %s", r.typ, r.name, r.sql.String)
			}
		}
		for _, r := range want {
			if !slices.Contains(got, r) {
				t.Errorf("only the fresh journal has %s %s: %s", r.typ, r.name, r.sql.String)
			}
		}
		t.Fatal("the migrated journal's schema differs from a fresh one's")
	}
}
