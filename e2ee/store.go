// Package e2ee is mindroomd's end-to-end encryption: one olm account and
// device per agent, kept in a crypto database apart from the journal,
// mautrix's OlmMachine driven by the principal's own sync loop (never by a
// goroutine of its own, so the journal decides when an event counts), the
// decryption of what a sync or a walk brings, and the sealing of what the
// agent sends into an encrypted room.
package e2ee

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	_ "github.com/mattn/go-sqlite3" // the crypto database's driver
	"go.mau.fi/util/dbutil"
	"maunium.net/go/mautrix/crypto"
	"maunium.net/go/mautrix/sqlstatestore"
)

// FileName is the crypto database's file beside the journal's.
const FileName = "crypto.db"

// ErrRefused is the error of a crypto store the daemon may not use: a
// pickle key that does not open it, an olm account whose keys are not the
// ones the homeserver publishes for the agent's device, or a recovery key
// that does not open the account's secret storage.
var ErrRefused = errors.New("crypto store refused")

// Store is the crypto database every agent of one daemon shares: each
// agent's olm account, sessions and device lists under its own account ID,
// and the room state encryption needs (members, encryption settings).
type Store struct {
	db    *dbutil.Database
	state *sqlstatestore.SQLStateStore
}

// OpenSQLite opens (creating it 0600 when absent) the crypto database at
// path, a file of its own: the journal's single writer stays alone in the
// journal's file.
func OpenSQLite(ctx context.Context, path string) (*Store, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("crypto store directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open crypto store: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("open crypto store: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		return nil, fmt.Errorf("open crypto store: %w", err)
	}
	// Several agents write here at once: WAL lets readers on, the busy
	// timeout queues writers, immediate transactions take the write lock
	// up front instead of failing to upgrade a read lock midway.
	q := url.Values{"_journal_mode": {"WAL"}, "_busy_timeout": {"30000"}, "_foreign_keys": {"on"},
		"_txlock": {"immediate"}, "_synchronous": {"FULL"}}
	raw, err := sql.Open("sqlite3", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("open crypto store: %w", err)
	}
	return open(ctx, raw, "sqlite3")
}

// open upgrades the crypto database's schemas, once for every agent.
func open(ctx context.Context, raw *sql.DB, dialect string) (*Store, error) {
	db, err := dbutil.NewWithDB(raw, dialect)
	if err != nil {
		raw.Close()
		return nil, fmt.Errorf("open crypto store: %w", err)
	}
	s := &Store{db: db, state: sqlstatestore.NewSQLStateStore(db, nil, false)}
	if dialect == "postgres" {
		// Replicas starting at once on a new database upgrade one at a
		// time: the upgrades create their version tables unlocked.
		unlock, err := lockUpgrade(ctx, raw)
		if err != nil {
			raw.Close()
			return nil, fmt.Errorf("upgrade crypto store: %w", err)
		}
		defer unlock()
	}
	if err := crypto.NewSQLCryptoStore(db, nil, "", "", nil).DB.Upgrade(ctx); err != nil {
		raw.Close()
		return nil, fmt.Errorf("upgrade crypto store: %w", err)
	}
	if err := s.state.Upgrade(ctx); err != nil {
		raw.Close()
		return nil, fmt.Errorf("upgrade room state store: %w", err)
	}
	if dialect == "postgres" {
		if _, err := raw.ExecContext(ctx, installFence); err != nil {
			raw.Close()
			return nil, fmt.Errorf("install the crypto store's lease fence: %w", err)
		}
	}
	return s, nil
}

// The advisory lock of the crypto store's upgrades on PostgreSQL.
const (
	lockUpgrades   = `SELECT pg_advisory_lock(7236281730651218690)`
	unlockUpgrades = `SELECT pg_advisory_unlock(7236281730651218690)`
)

// lockUpgrade takes the upgrades' lock on a connection of its own and
// returns its release.
func lockUpgrade(ctx context.Context, raw *sql.DB) (func(), error) {
	conn, err := raw.Conn(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := conn.ExecContext(ctx, lockUpgrades); err != nil {
		conn.Close()
		return nil, err
	}
	return func() {
		_, _ = conn.ExecContext(context.Background(), unlockUpgrades)
		conn.Close()
	}, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.RawDB.Close() }

// OpenPostgres opens the crypto store in the journal's PostgreSQL
// database, under tables of its own (crypto_*, mx_*). replica names the
// replica of several sharing the database whose store this is: its writes
// of an agent's account are refused unless it holds the agent's lease
// (fence.go). Empty for a daemon running alone.
func OpenPostgres(ctx context.Context, databaseURL, replica string) (*Store, error) {
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return nil, errors.New("open crypto store: the database URL does not parse")
	}
	if replica != "" {
		cfg.RuntimeParams[replicaSetting] = replica
	}
	return open(ctx, stdlib.OpenDB(*cfg), "postgres")
}
