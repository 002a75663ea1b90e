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

// migrate applies the migrations the database lacks, each in one
// transaction with its version row. A schema holding other tables and no
// versions belongs to someone else and is refused.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if err := createVersionsTable(ctx, pool); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	for _, m := range migrations() {
		if err := apply(ctx, pool, m); err != nil {
			return fmt.Errorf("migrate %s: %w", m.Name, err)
		}
	}
	return nil
}

// createVersionsTable creates the versions table under the migrations'
// lock: IF NOT EXISTS alone does not keep two replicas starting at once on
// a new database from both creating it, one of them failing on the
// catalog's unique index.
func createVersionsTable(ctx context.Context, pool *pgxpool.Pool) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, lockMigrations); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, createVersions); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// readSchema reads the journal's schema version, and whether the schema
// holds other tables, without creating anything: version 0 when there is
// no journal.
func readSchema(ctx context.Context, q querier) (migration.Schema, error) {
	var found migration.Schema
	var exists bool
	if err := q.QueryRow(ctx, selectHasVersions).Scan(&exists); err != nil {
		return found, fmt.Errorf("read schema version: %w", mapErr(err))
	}
	if exists {
		if err := q.QueryRow(ctx, selectVersion).Scan(&found.Version); err != nil {
			return found, fmt.Errorf("read schema version: %w", mapErr(err))
		}
	}
	var tables int
	if err := q.QueryRow(ctx, selectHasTables).Scan(&tables); err != nil {
		return found, fmt.Errorf("read schema: %w", mapErr(err))
	}
	found.Tables = tables > 0
	return found, nil
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
	found, err := readSchema(ctx, tx)
	if err != nil {
		return err
	}
	if err := migration.Check(found, SchemaVersion(), migration.ReadWrite); err != nil {
		return err
	}
	if found.Version >= m.Version {
		return nil
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
