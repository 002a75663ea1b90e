package sqlitefs

import (
	"context"
	"fmt"
	"github.com/mindroomd/mindroomd/journalsql"
	"slices"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// collisionNow is the batch time of the collision tests' transactions.
var collisionNow = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

// The identity index keys a hash of the event ID, so two IDs that share a
// hash are two events, and every lookup tells them apart by the ID itself.
// Forcing every ID onto one hash makes each lookup meet the collision.
func TestEventsWhoseIDsShareAHashAreTwoEvents(t *testing.T) {
	const (
		room  = "!collide:example.org"
		alice = "@alice:example.org"
	)
	saved := idHash
	idHash = func(string) int64 { return 42 }
	t.Cleanup(func() { idHash = saved })
	if IDHash("$a") != IDHash("$b") {
		t.Fatal("test setup: the forced hash does not collide")
	}
	ctx := context.Background()
	db, err := Open(ctx, Options{StorageDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var p journalsql.Principal
	writeTx(t, db, func(tx *Tx) (err error) {
		p, err = journalsql.RegisterPrincipal(tx, journal.Principal{Agent: "helper", UserID: "@bot:example.org"})
		return err
	})
	admit := func(evs ...mx.Ev) string {
		t.Helper()
		var res []journal.AdmitResult
		writeTx(t, db, func(tx *Tx) (err error) {
			res, _, err = journalsql.AdmitBatch(tx, p, journal.Parse(mx.Live(room, evs...), collisionNow), "")
			return err
		})
		out := ""
		for _, r := range res {
			out += fmt.Sprintf("%s:%v ", r.EventID, r.Outcome)
		}
		return out
	}

	got := admit(mx.Message("$a", alice, 1000, "first"), mx.Message("$b", alice, 1001, "second"))
	if want := "$a:admitted $b:admitted "; got != want {
		t.Fatalf("admitting two IDs with one hash = %q, want %q", got, want)
	}
	if got, want := admit(mx.Message("$b", alice, 1001, "second")), "$b:duplicate "; got != want {
		t.Fatalf("admitting $b again = %q, want %q", got, want)
	}
	if got, want := admit(mx.Edit("$e", alice, 1002, "$b", "second, edited")), "$e:admitted "; got != want {
		t.Fatalf("admitting an edit of $b = %q, want %q", got, want)
	}

	page, err := db.Read(ctx, p, journal.ReadRequest{RoomID: room, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	var screen []string
	for _, m := range page.Messages {
		screen = append(screen, m.EventID+"="+string(m.Content))
	}
	want := []string{`$a={"body":"first","msgtype":"m.text"}`, `$b={"body":"second, edited","msgtype":"m.text"}`}
	if !slices.Equal(screen, want) {
		t.Fatalf("screen = %q, want %q", screen, want)
	}

	var n int
	writeTx(t, db, func(tx *Tx) (err error) {
		n, err = journalsql.Settle(tx, p, []string{"$a"})
		return err
	})
	if n != 1 {
		t.Fatalf("settling $a changed %d rows, want 1", n)
	}
	pending, err := journalsql.Pending(ctx, db.Reader(), p, 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range pending.Events {
		ids = append(ids, e.EventID)
	}
	if !slices.Equal(ids, []string{"$b"}) {
		t.Fatalf("pending after settling $a = %q, want [$b]", ids)
	}
}

// writeTx runs run in one write transaction on the writer connection, as
// the writer actor would, and commits it.
func writeTx(t *testing.T, db *DB, run func(tx *Tx) error) {
	t.Helper()
	ctx := context.Background()
	conn, err := db.writer.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	if err := run(db.WrapTx(conn, collisionNow, nil)); err != nil {
		_, _ = conn.ExecContext(ctx, "ROLLBACK")
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
}
