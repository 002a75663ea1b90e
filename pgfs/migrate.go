package pgfs

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mindroomd/mindroomd/migration"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

const (
	createVersions = `CREATE TABLE IF NOT EXISTS schema_versions (
		version    integer PRIMARY KEY,
		applied_at timestamptz NOT NULL DEFAULT now())`
	// Replicas opening one database at once migrate one at a time.
	lockMigrations = `SELECT pg_advisory_xact_lock(7236281730651218689)`
	selectVersion  = `SELECT coalesce(max(version), 0) FROM schema_versions`
	insertVersion  = `INSERT INTO schema_versions (version) VALUES ($1)`
	// The versions table is missing until a daemon first opened the
	// database: a read-only open asks before it reads.
	selectHasVersions = `SELECT to_regclass('schema_versions') IS NOT NULL`
	selectHasTables   = `SELECT count(*) FROM pg_tables WHERE schemaname = current_schema() AND tablename <> 'schema_versions'`
)

// migrations are the store's embedded migrations, in version order.
func migrations() []migration.File { return migration.Load(migrationFS, "migrations") }

// SchemaVersion is the newest schema this binary knows.
func SchemaVersion() int { return len(migrations()) }

// NewerDatabaseError reports a database migrated by a newer binary than
// this one; writing to it could misread rows this binary does not know.
type NewerDatabaseError struct {
	// Version is the database's schema version; Known is the newest this
	// binary knows.
	Version, Known int
}

// Error implements error.
func (e *NewerDatabaseError) Error() string {
	return fmt.Sprintf("journal schema version %d is newer than this binary supports (%d); upgrade mindroomd", e.Version, e.Known)
}

// migrate applies the migrations the database lacks, each in one
// transaction with its version row. A schema holding other tables and no
// versions belongs to someone else and is refused.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, createVersions); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	for _, m := range migrations() {
		if err := apply(ctx, pool, m); err != nil {
			return fmt.Errorf("migrate %s: %w", m.Name, err)
		}
	}
	return nil
}

// schemaVersion reads the journal's schema version without creating
// anything: 0 when there is no journal.
func schemaVersion(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	var exists bool
	if err := pool.QueryRow(ctx, selectHasVersions).Scan(&exists); err != nil || !exists {
		return 0, err
	}
	var v int
	if err := pool.QueryRow(ctx, selectVersion).Scan(&v); err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	return v, nil
}

func apply(ctx context.Context, pool *pgxpool.Pool, m migration.File) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, lockMigrations); err != nil {
		return err
	}
	var version, tables int
	if err := tx.QueryRow(ctx, selectVersion).Scan(&version); err != nil {
		return err
	}
	if version > SchemaVersion() {
		return &NewerDatabaseError{Version: version, Known: SchemaVersion()}
	}
	if version >= m.Version {
		return nil
	}
	if version == 0 {
		if err := tx.QueryRow(ctx, selectHasTables).Scan(&tables); err != nil {
			return err
		}
		if tables > 0 {
			return ErrForeignDatabase
		}
	}
	// A migration file is several statements: the simple protocol runs
	// them in one round trip, inside this transaction.
	if _, err := tx.Exec(ctx, m.SQL); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, insertVersion, m.Version); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
