package sqlitefs

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"strconv"

	"github.com/google/uuid"

	"github.com/mindroomd/mindroomd/migration"
)

// ApplicationID stamps the file as a mindroomd journal ("MRDJ").
const ApplicationID = 0x4d52444a

//go:embed migrations/*.sql
var migrationFS embed.FS

const (
	queryApplicationID = `PRAGMA application_id`
	queryUserVersion   = `PRAGMA user_version`
	queryHasTables     = `SELECT count(*) FROM sqlite_schema WHERE name NOT LIKE 'sqlite_%'`
	// Pragma values cannot be bound; these take an integer from the
	// embedded migration names or the constant above.
	pragmaSetUserVersion   = `PRAGMA user_version = `
	pragmaSetApplicationID = `PRAGMA application_id = `
	insertGeneration       = `INSERT INTO store_meta (key, value) VALUES ('generation', ?) ON CONFLICT (key) DO NOTHING`
	selectGeneration       = `SELECT value FROM store_meta WHERE key = 'generation'`
)

// migrations are the store's embedded migrations, in version order.
func migrations() []migration.File { return migration.Load(migrationFS, "migrations") }

// SchemaVersion is the newest schema this binary knows.
func SchemaVersion() int { return len(migrations()) }

// identify refuses a file the writer may not use, as migration decides,
// and returns its schema version. It runs on a query-only connection
// before the writer's first connection switches the file to WAL, so a
// refused file is left exactly as it was found.
func identify(ctx context.Context, db *sql.DB) (version int, err error) {
	found, err := readSchema(ctx, db)
	if err != nil {
		return 0, err
	}
	if err := migration.Check(found, SchemaVersion(), migration.ReadWrite); err != nil {
		return 0, err
	}
	return found.Version, nil
}

// readSchema reads the file's schema version and application stamp.
func readSchema(ctx context.Context, db *sql.DB) (migration.Schema, error) {
	var appID, version, tables int
	if err := db.QueryRowContext(ctx, queryApplicationID).Scan(&appID); err != nil {
		return migration.Schema{}, fmt.Errorf("read application_id: %w", mapErr(err))
	}
	if err := db.QueryRowContext(ctx, queryUserVersion).Scan(&version); err != nil {
		return migration.Schema{}, fmt.Errorf("read user_version: %w", mapErr(err))
	}
	if err := db.QueryRowContext(ctx, queryHasTables).Scan(&tables); err != nil {
		return migration.Schema{}, fmt.Errorf("read schema: %w", mapErr(err))
	}
	found := migration.Schema{Version: version, Tables: tables > 0}
	switch {
	case appID != 0 && appID != ApplicationID:
		found.Foreign = fmt.Sprintf("application_id is %#x", appID)
	case appID == 0 && tables > 0:
		// Every migration stamps the file, so tables without the stamp
		// are another application's whatever user_version says.
		found.Foreign = "the file holds tables of another application"
	}
	return found, nil
}

// migrate applies the migrations newer than version.
func migrate(ctx context.Context, db *sql.DB, version int) error {
	for _, m := range migrations()[version:] {
		if err := apply(ctx, db, m); err != nil {
			return fmt.Errorf("migrate to v%d (%s): %w", m.Version, m.Name, mapErr(err))
		}
	}
	return nil
}

// apply runs one migration and its version bump in one transaction.
func apply(ctx context.Context, db *sql.DB, m migration.File) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, pragmaSetUserVersion+strconv.Itoa(m.Version)); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, pragmaSetApplicationID+strconv.Itoa(ApplicationID)); err != nil {
		return err
	}
	return tx.Commit()
}

// mintGeneration gives the database its identity once; later opens keep it.
func mintGeneration(ctx context.Context, db *sql.DB) error {
	if _, err := db.ExecContext(ctx, insertGeneration, uuid.NewString()); err != nil {
		return fmt.Errorf("mint generation: %w", mapErr(err))
	}
	return nil
}

// Generation returns the database's identity.
func (db *DB) Generation(ctx context.Context) (string, error) {
	var g string
	if err := db.readers.QueryRowContext(ctx, selectGeneration).Scan(&g); err != nil {
		return "", fmt.Errorf("read generation: %w", deadlineErr(ctx, err))
	}
	return g, nil
}
