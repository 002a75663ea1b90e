package sqlitefs

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
)

const (
	// vacuumInto writes a consistent copy of the whole database, as of one
	// read snapshot, into a new file: a running writer is never blocked,
	// and the copy holds every transaction committed before the snapshot.
	vacuumInto = `VACUUM INTO ?`
	quickCheck = `PRAGMA quick_check`
)

// ErrBackupExists refuses to write a backup over an existing file.
var ErrBackupExists = errors.New("backup file already exists")

// Backup writes a consistent copy of the journal to the new file to,
// through db, a read-only handle (OpenReadOnly), so it runs beside the
// daemon: the copy is one read snapshot, every transaction committed before
// it, and nothing after. It then checks that the copy opens as a journal of
// this schema and passes SQLite's quick check. The file is created private
// (0600); an existing file is never overwritten.
func (db *DB) Backup(ctx context.Context, to string) (err error) {
	f, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return fmt.Errorf("%w: %s", ErrBackupExists, to)
	}
	if err != nil {
		return fmt.Errorf("create backup: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("create backup: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(to)
		}
	}()
	abs, err := filepath.Abs(to)
	if err != nil {
		return fmt.Errorf("backup path: %w", err)
	}
	// A connection of its own: read-only like the handle's, but without
	// query_only, which refuses VACUUM INTO although it writes only the
	// new file.
	src, err := sql.Open("sqlite3", fileURI(db.Path, url.Values{"mode": {"ro"}, "_busy_timeout": {"10000"}}))
	if err != nil {
		return fmt.Errorf("open the journal: %w", err)
	}
	defer src.Close()
	if _, err := src.ExecContext(ctx, vacuumInto, abs); err != nil {
		return fmt.Errorf("copy the journal: %w", readOnlyErr(ctx, db.Path, err))
	}
	return verifyBackup(ctx, abs)
}

// verifyBackup opens a backup read-only, as a restore would, and checks it
// is a whole journal of this schema.
func verifyBackup(ctx context.Context, path string) error {
	copyDB, err := sql.Open("sqlite3", fileURI(path, url.Values{"mode": {"ro"}}))
	if err != nil {
		return fmt.Errorf("open the backup: %w", err)
	}
	defer copyDB.Close()
	version, err := identify(ctx, copyDB)
	if err != nil {
		return fmt.Errorf("verify the backup: %w", err)
	}
	if known := SchemaVersion(); version != known {
		return fmt.Errorf("verify the backup: schema version %d, want %d", version, known)
	}
	var check string
	if err := copyDB.QueryRowContext(ctx, quickCheck).Scan(&check); err != nil {
		return fmt.Errorf("verify the backup: %w", err)
	}
	if check != "ok" {
		return fmt.Errorf("verify the backup: quick check: %s", check)
	}
	return nil
}
