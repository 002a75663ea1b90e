package sqlitefs

import (
	"context"
	"database/sql"
	"github.com/mindroomd/mindroomd/journalsql"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/mattn/go-sqlite3"

	"github.com/mindroomd/mindroomd/journal"
)

// rawWithIDHash opens the journal file at path with one plain connection,
// as an earlier release did, with the ID hash registered: the migrations
// from v3 on call it, as the writer's connections do.
func rawWithIDHash(path string) *sql.DB {
	raw := openPool(path, func(c *sqlite3.SQLiteConn) error { return c.RegisterFunc(idHashFunc, IDHash, true) })
	// One connection, so the pragmas hold for every statement.
	raw.SetMaxOpenConns(1)
	return raw
}

// A sync token stored before version 4 kept no time. It survives the
// migration with its time unknown (0), so status says so instead of
// inventing an age, and the next sync stores the token with its time.
func TestASyncTokenStoredBeforeVersion4KeepsItsValueAndAnUnknownTime(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := Path(dir)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	func() {
		raw := rawWithIDHash(path)
		defer raw.Close()
		for _, p := range []string{pragmaPageSize, pragmaJournalWAL} {
			if _, err := raw.ExecContext(ctx, p); err != nil {
				t.Fatal(err)
			}
		}
		for _, m := range migrations()[:3] {
			if err := apply(ctx, raw, m); err != nil {
				t.Fatalf("apply %s: %v", m.Name, err)
			}
		}
		if err := mintGeneration(ctx, raw); err != nil {
			t.Fatal(err)
		}
		if _, err := raw.ExecContext(ctx, v2InsertPrincipal, "helper", migBot, "s_v3"); err != nil {
			t.Fatal(err)
		}
		if err := raw.Close(); err != nil {
			t.Fatal(err)
		}
	}()

	db, err := Open(ctx, Options{StorageDir: dir})
	if err != nil {
		t.Fatalf("Open a v3 journal: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	p, ok, err := journalsql.LookupPrincipal(ctx, db.Reader(), journal.Principal{Agent: "helper", UserID: migBot})
	if err != nil || !ok {
		t.Fatalf("principal after the migration: %v, %v", ok, err)
	}
	if tok, err := journalsql.SyncToken(ctx, db.Reader(), p); err != nil || tok != "s_v3" {
		t.Fatalf("sync token after the migration = %q, %v; want the v3 token s_v3", tok, err)
	}
	st, err := journalsql.Status(ctx, db.Reader())
	if err != nil || len(st) != 1 || !st[0].HasSyncToken || st[0].SyncTokenMS != 0 {
		t.Fatalf("status after the migration = %+v, %v; want a token whose time is unknown (0)", st, err)
	}

	now := time.Date(2026, 11, 2, 8, 30, 0, 0, time.UTC)
	migWrite(t, db, now, func(tx *Tx) error {
		_, _, err := journalsql.AdmitBatch(tx, p, nil, "s_v4")
		return err
	})
	if st, err = journalsql.Status(ctx, db.Reader()); err != nil || st[0].SyncTokenMS != now.UnixMilli() {
		t.Fatalf("status after the next sync = %+v, %v; want the token stored at %d", st, err, now.UnixMilli())
	}
}
