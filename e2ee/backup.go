package e2ee

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
)

// Backing up the crypto store copies it as one transaction sees it
// (VACUUM INTO), beside a running daemon.
const (
	vacuumInto     = `VACUUM INTO ?`
	integrityCheck = `PRAGMA integrity_check`
	countAccounts  = `SELECT count(*) FROM crypto_account`
)

// ErrNoCryptoStore is the error of a backup of a storage directory whose
// daemon never opened a crypto store.
var ErrNoCryptoStore = errors.New("no crypto store")

// BackupSQLite writes a consistent copy of the crypto store at from to the
// new file to (never overwritten), then verifies the copy: a whole SQLite
// file holding the crypto tables. It returns how many olm accounts the
// copy holds.
func BackupSQLite(ctx context.Context, from, to string) (accounts int, err error) {
	if _, err := os.Stat(from); errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("%w at %s", ErrNoCryptoStore, from)
	}
	f, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, fmt.Errorf("create crypto store backup: %w", err)
	}
	if err := f.Close(); err != nil {
		return 0, fmt.Errorf("create crypto store backup: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(to)
		}
	}()
	abs, err := filepath.Abs(to)
	if err != nil {
		return 0, fmt.Errorf("crypto store backup path: %w", err)
	}
	src, err := sql.Open("sqlite3", "file:"+from+"?"+url.Values{"mode": {"ro"}, "_busy_timeout": {"10000"}}.Encode())
	if err != nil {
		return 0, fmt.Errorf("open the crypto store: %w", err)
	}
	defer src.Close()
	if _, err := src.ExecContext(ctx, vacuumInto, abs); err != nil {
		return 0, fmt.Errorf("copy the crypto store: %w", err)
	}
	dst, err := sql.Open("sqlite3", "file:"+abs+"?"+url.Values{"mode": {"ro"}}.Encode())
	if err != nil {
		return 0, fmt.Errorf("open the crypto store backup: %w", err)
	}
	defer dst.Close()
	var verdict string
	if err := dst.QueryRowContext(ctx, integrityCheck).Scan(&verdict); err != nil || verdict != "ok" {
		return 0, fmt.Errorf("verify the crypto store backup: %q, %v", verdict, err)
	}
	if err := dst.QueryRowContext(ctx, countAccounts).Scan(&accounts); err != nil {
		return 0, fmt.Errorf("verify the crypto store backup: %w", err)
	}
	return accounts, nil
}
