package sqlitefs

import (
	"errors"
	"fmt"

	"github.com/mattn/go-sqlite3"
)

// Errors of the storage boundary.
var (
	// ErrForeignDatabase reports a file that belongs to another application.
	ErrForeignDatabase = errors.New("not a mindroomd journal")
	// ErrConflict reports a uniqueness or primary-key violation.
	ErrConflict = errors.New("conflict")
)

// NewerDatabaseError reports a database migrated by a newer binary than this
// one; opening it could misread rows this binary does not understand.
type NewerDatabaseError struct {
	// Version is the database's schema version; Known is the newest this
	// binary knows.
	Version, Known int
}

// Error implements error.
func (e *NewerDatabaseError) Error() string {
	return fmt.Sprintf("journal schema version %d is newer than this binary supports (%d); upgrade mindroomd", e.Version, e.Known)
}

// IsFatal reports storage errors that poison a transaction: the disk is
// full, an I/O error occurred, or the file is corrupt. The writer stops on
// them rather than carry on with a connection in an unknown state.
func IsFatal(err error) bool {
	var se sqlite3.Error
	if !errors.As(err, &se) {
		return false
	}
	switch se.Code {
	case sqlite3.ErrIoErr, sqlite3.ErrCorrupt, sqlite3.ErrFull, sqlite3.ErrNotADB,
		sqlite3.ErrCantOpen, sqlite3.ErrNomem, sqlite3.ErrProtocol:
		return true
	}
	return false
}

// IsCorrupt reports a file SQLite finds damaged or not a database at all:
// unlike a full disk or an I/O error, it does not pass by itself.
func IsCorrupt(err error) bool {
	var se sqlite3.Error
	return errors.As(err, &se) && (se.Code == sqlite3.ErrCorrupt || se.Code == sqlite3.ErrNotADB)
}

// IsBusy reports the error of a lock another connection or process holds
// past the busy timeout (a sqlite3 shell, a backup tool): the writer waits
// it out rather than stopping, and a caller may retry.
func IsBusy(err error) bool {
	var se sqlite3.Error
	return errors.As(err, &se) && (se.Code == sqlite3.ErrBusy || se.Code == sqlite3.ErrLocked)
}

// mapErr translates constraint codes into domain errors at this boundary, by
// code and never by message text.
func mapErr(err error) error {
	var se sqlite3.Error
	if errors.As(err, &se) && se.Code == sqlite3.ErrConstraint {
		switch se.ExtendedCode {
		case sqlite3.ErrConstraintUnique, sqlite3.ErrConstraintPrimaryKey:
			return fmt.Errorf("%w: %w", ErrConflict, err)
		}
	}
	return err
}
