package sqlitefs_test

import (
	"context"
	"database/sql"
	"errors"
	"github.com/mindroomd/mindroomd/journalsql"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/sqlitefs"
)

const countJournalRows = `SELECT count(*) FROM journal_events`

// A backup taken while the journal is being written holds every
// transaction committed before it started, opens as a journal, and never
// overwrites a file.
func TestABackupBesideAWritingJournalHoldsEverythingCommittedBeforeIt(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db := openDB(t, dir)
	var p journalsql.Principal
	b := beginBatch(t, db)
	must(t, b.command(func(tx *sqlitefs.Tx) (err error) {
		p, err = journalsql.RegisterPrincipal(tx, journal.Principal{Agent: "helper", UserID: "@bot:example.org"})
		return err
	}))
	b.commit()
	admit := func(n int) {
		b := beginBatch(t, db)
		must(t, b.command(func(*sqlitefs.Tx) error { return admitText(b, p, "!r:example.org", "$e"+strconv.Itoa(n), 1000+n) }))
		b.commit()
	}
	for i := range 50 {
		admit(i)
	}

	// The writer goes on while the backup copies.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 50; ; i++ {
			select {
			case <-stop:
				return
			default:
				admit(i)
			}
		}
	}()
	ro, err := sqlitefs.OpenReadOnly(ctx, sqlitefs.Options{StorageDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	to := filepath.Join(t.TempDir(), "journal.backup")
	err = ro.Backup(ctx, to)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("Backup: %v", err)
	}

	fi, err := os.Stat(to)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("backup mode = %v, want 0600", fi.Mode().Perm())
	}
	copyDB, err := sql.Open("sqlite3", "file:"+to+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer copyDB.Close()
	var n int
	if err := copyDB.QueryRowContext(ctx, countJournalRows).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n < 50 {
		t.Fatalf("the backup holds %d journal rows, want at least the 50 committed before it", n)
	}

	if err := ro.Backup(ctx, to); !errors.Is(err, sqlitefs.ErrBackupExists) {
		t.Fatalf("a second backup to the same file = %v, want %v", err, sqlitefs.ErrBackupExists)
	}
}
