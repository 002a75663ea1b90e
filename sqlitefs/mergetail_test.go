package sqlitefs_test

import (
	"context"
	"errors"
	"github.com/mindroomd/mindroomd/journalsql"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/sqlitefs"
)

const countTailRows = `SELECT count(*) FROM visible_messages WHERE seq > (SELECT upto FROM visible_page_merged WHERE id = 1)`

// The unmerged tail is what a reader scans besides its page, so it must stay
// within its bound even when an inline merge is rolled back with the command
// that ran it.
func TestTheUnmergedTailStaysBoundedWhenAnInlineMergeRollsBack(t *testing.T) {
	const bound = 4
	db, err := sqlitefs.Open(context.Background(), sqlitefs.Options{StorageDir: t.TempDir(), MaxUnmergedTail: bound})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	const room = "!tail:example.org"
	tail := func() int {
		t.Helper()
		var n int
		if err := db.QueryPool().QueryRowContext(context.Background(), countTailRows).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	b := beginBatch(t, db)
	var p journalsql.Principal
	must(t, b.command(func(tx *sqlitefs.Tx) (err error) {
		p, err = journalsql.RegisterPrincipal(tx, journal.Principal{Agent: "helper", UserID: "@bot:example.org"})
		return err
	}))
	for i, id := range []string{"$m1", "$m2", "$m3"} {
		must(t, b.command(func(*sqlitefs.Tx) error { return admitText(b, p, room, id, 1000+i) }))
	}
	b.commit()

	// The fourth row fills the tail and merges it inline; then the command
	// fails, and the merge goes with it.
	b = beginBatch(t, db)
	failed := errors.New("the command fails after merging")
	if err := b.command(func(*sqlitefs.Tx) error {
		must(t, admitText(b, p, room, "$m4", 1003))
		return failed
	}); !errors.Is(err, failed) {
		t.Fatalf("command: %v", err)
	}
	b.commit()
	if got := tail(); got != 3 {
		t.Fatalf("tail after the rolled-back merge = %d, want the 3 rows before it", got)
	}

	for i, id := range []string{"$m5", "$m6", "$m7", "$m8"} {
		b = beginBatch(t, db)
		must(t, b.command(func(*sqlitefs.Tx) error { return admitText(b, p, room, id, 2000+i) }))
		b.commit()
		if got := tail(); got > bound {
			t.Fatalf("after %s the unmerged tail holds %d rows, past its bound %d", id, got, bound)
		}
	}
}
