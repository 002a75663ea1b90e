package sqlitefs_test

import (
	"context"
	"database/sql"
	"errors"
	"github.com/mindroomd/mindroomd/journalsql"
	"strconv"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/sqlitefs"
)

// batchTx runs commands the way the writer does (store/writer): one
// transaction, each command in a savepoint, and the command's after-commit
// work kept only if it succeeds and run, in order, only after COMMIT.
type batchTx struct {
	t     *testing.T
	conn  *sql.Conn
	tx    *sqlitefs.Tx
	after []func()
}

var cacheClock = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

func beginBatch(t *testing.T, db *sqlitefs.DB) *batchTx {
	t.Helper()
	conn, err := db.WriterPool().Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	b := &batchTx{t: t, conn: conn}
	b.exec("BEGIN IMMEDIATE")
	b.tx = db.WrapTx(conn, cacheClock, func(f func()) { b.after = append(b.after, f) })
	return b
}

func (b *batchTx) exec(q string) {
	b.t.Helper()
	if _, err := b.conn.ExecContext(context.Background(), q); err != nil {
		b.t.Fatalf("%s: %v", q, err)
	}
}

// command runs run in a savepoint; an error rolls back its writes and its
// after-commit work.
func (b *batchTx) command(run func(tx *sqlitefs.Tx) error) error {
	b.t.Helper()
	b.exec("SAVEPOINT command")
	mark := len(b.after)
	err := run(b.tx)
	if err != nil {
		b.after = b.after[:mark]
		b.exec("ROLLBACK TO command")
	}
	b.exec("RELEASE command")
	return err
}

func (b *batchTx) commit() {
	b.t.Helper()
	b.exec("COMMIT")
	for _, f := range b.after {
		f()
	}
	if err := b.conn.Close(); err != nil {
		b.t.Fatal(err)
	}
}

func admitText(b *batchTx, p journalsql.Principal, room, id string, ts int) error {
	ev := `{"event_id":"` + id + `","type":"m.room.message","sender":"@alice:example.org","origin_server_ts":` +
		strconv.Itoa(ts) + `,"content":{"msgtype":"m.text","body":"` + id + `"}}`
	res, _, err := journalsql.AdmitBatch(b.tx, p, journal.Parse([]journal.Inbound{
		{RoomID: room, Provenance: journal.Live, Event: []byte(ev)}}, cacheClock), "")
	if err == nil && res[0].Outcome != journal.Admitted {
		err = errors.New("not admitted")
	}
	return err
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func pendingEpochs(t *testing.T, db *sqlitefs.DB, p journalsql.Principal) map[string]int64 {
	t.Helper()
	page, err := journalsql.Pending(context.Background(), db.Reader(), p, 100, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, e := range page.Events {
		out[e.EventID] = e.Epoch
	}
	return out
}

func TestAFenceOutlivesTheEpochsReadBeforeItInItsBatch(t *testing.T) {
	db := openDB(t, t.TempDir())
	const r, s = "!r:example.org", "!s:example.org"
	fence := func(b *batchTx, p journalsql.Principal, room string) {
		must(t, b.command(func(tx *sqlitefs.Tx) error {
			_, _, err := journalsql.FenceDeparture(tx, p, room, journal.DepartureReported, "")
			return err
		}))
		must(t, b.command(func(tx *sqlitefs.Tx) error { return journalsql.RecordJoin(tx, p, room, "") }))
	}
	admit := func(b *batchTx, p journalsql.Principal, room, id string, ts int) {
		must(t, b.command(func(*sqlitefs.Tx) error { return admitText(b, p, room, id, ts) }))
	}

	b := beginBatch(t, db)
	var p journalsql.Principal
	must(t, b.command(func(tx *sqlitefs.Tx) (err error) {
		p, err = journalsql.RegisterPrincipal(tx, journal.Principal{Agent: "helper", UserID: "@bot:example.org"})
		return err
	}))
	// Both rooms are read at epoch 0; s is fenced later in the same batch,
	// so what was read of it must not be remembered past the commit.
	admit(b, p, r, "$r1", 1000)
	admit(b, p, s, "$s1", 1001)
	fence(b, p, s)
	b.commit()

	// r is remembered at epoch 0 now; its fence must forget it at once, for
	// the admission after it in the same batch.
	b = beginBatch(t, db)
	admit(b, p, r, "$r2", 2000)
	fence(b, p, r)
	admit(b, p, r, "$r3", 2001)
	b.commit()

	b = beginBatch(t, db)
	admit(b, p, s, "$s2", 3000)
	admit(b, p, r, "$r4", 3001)
	b.commit()

	got := pendingEpochs(t, db, p)
	for _, id := range []string{"$r3", "$s2", "$r4"} {
		if got[id] != 1 {
			t.Fatalf("pending epochs %v: %s was admitted after its room's fence, under epoch 1", got, id)
		}
	}
}

func TestARoomInternedByACommandThatRolledBackIsInternedAgain(t *testing.T) {
	db := openDB(t, t.TempDir())
	const room = "!new:example.org"
	b := beginBatch(t, db)
	var p journalsql.Principal
	must(t, b.command(func(tx *sqlitefs.Tx) (err error) {
		p, err = journalsql.RegisterPrincipal(tx, journal.Principal{Agent: "helper", UserID: "@bot:example.org"})
		return err
	}))
	failed := errors.New("the command fails after interning the room")
	err := b.command(func(*sqlitefs.Tx) error {
		must(t, admitText(b, p, room, "$b1", 1000))
		return failed
	})
	if !errors.Is(err, failed) {
		t.Fatalf("command: %v", err)
	}
	b.commit()

	b = beginBatch(t, db)
	must(t, b.command(func(*sqlitefs.Tx) error { return admitText(b, p, room, "$b2", 2000) }))
	b.commit()

	page, err := db.Read(context.Background(), p, journal.ReadRequest{RoomID: room, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Messages) != 1 || page.Messages[0].EventID != "$b2" {
		t.Fatalf("room reads %+v; want only $b2, under the room as interned again", page.Messages)
	}
}
