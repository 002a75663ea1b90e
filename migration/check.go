package migration

import (
	"errors"
	"fmt"
)

// ErrForeignDatabase reports a database (an SQLite file, a PostgreSQL
// schema) that belongs to another application. A store refuses it before
// it writes anything, so the other application's data is left as it was.
var ErrForeignDatabase = errors.New("not a mindroomd journal")

// NewerDatabaseError reports a database migrated by a newer binary than
// this one; using it could misread rows this binary does not know.
type NewerDatabaseError struct {
	// Version is the database's schema version; Known is the newest this
	// binary knows.
	Version, Known int
}

// Error implements error.
func (e *NewerDatabaseError) Error() string {
	return fmt.Sprintf("journal schema version %d is newer than this binary supports (%d); upgrade mindroomd", e.Version, e.Known)
}

// OlderDatabaseError reports a database a read-only open found at an older
// schema than this binary's. Reading it would ask for columns and tables
// it does not have, and migrating it is the writer's job.
type OlderDatabaseError struct {
	// Version is the database's schema version; Known this binary's.
	Version, Known int
}

// Error implements error.
func (e *OlderDatabaseError) Error() string {
	return fmt.Sprintf("journal schema version %d is older than this binary's (%d); "+
		"start the daemon of this version once to migrate it, or use the mindroomd that wrote it", e.Version, e.Known)
}

// Refused reports whether err holds one of the refusals of Check: a
// database this binary will not use as it stands, whichever store found
// it. Each waits for someone to act (another binary, a migration, another
// database), so running the same command again cannot mend it.
func Refused(err error) bool {
	var newer *NewerDatabaseError
	var older *OlderDatabaseError
	return errors.Is(err, ErrForeignDatabase) || errors.As(err, &newer) || errors.As(err, &older)
}

// Schema is what a store read of its database before using it, each store
// in its own way.
type Schema struct {
	// Version is the schema version the database records: the number of
	// migrations applied, 0 when none was.
	Version int
	// Foreign names the mark of another application the store found in
	// place of its own stamp (such as another application_id); empty when
	// there is none.
	Foreign string
	// Tables reports that the database holds tables besides the store's
	// version bookkeeping.
	Tables bool
}

// Access is how a store opens its database.
type Access int

const (
	// ReadWrite is a daemon's open: it migrates an older schema.
	ReadWrite Access = iota
	// ReadOnly is an operator command's open: it migrates nothing, so it
	// reads only the schema this binary knows.
	ReadOnly
)

// Check decides whether a store that knows migrations up to known may open
// the database it found as s with access: nil, or ErrForeignDatabase, a
// *NewerDatabaseError or (read-only) an *OlderDatabaseError. Tables
// without a version are another application's, since a journal records
// its version with its first migration.
func Check(s Schema, known int, access Access) error {
	switch {
	case s.Foreign != "":
		return fmt.Errorf("%w: %s", ErrForeignDatabase, s.Foreign)
	case s.Version == 0 && s.Tables:
		return fmt.Errorf("%w: it holds tables of another application", ErrForeignDatabase)
	case s.Version > known:
		return &NewerDatabaseError{Version: s.Version, Known: known}
	case access == ReadOnly && s.Version < known:
		return &OlderDatabaseError{Version: s.Version, Known: known}
	}
	return nil
}
