package sqlitefs

import (
	"errors"
	"fmt"

	"github.com/mattn/go-sqlite3"

	"github.com/mindroomd/mindroomd/journal"
)

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

// IsBusy reports the error of a lock another connection or process holds
// past the busy timeout (a sqlite3 shell, a backup tool): the writer waits
// it out rather than stopping, and a caller may retry.
func IsBusy(err error) bool {
	var se sqlite3.Error
	return errors.As(err, &se) && (se.Code == sqlite3.ErrBusy || se.Code == sqlite3.ErrLocked)
}

// mapErr translates SQLite's result codes into the journal's error
// vocabulary at this boundary, by code and never by message text: a
// uniqueness or primary-key violation is journal.ErrConflict, a file SQLite
// finds damaged or not a database at all is journal.ErrCorrupt. The
// driver's error stays wrapped, so IsFatal and IsBusy still see its code.
func mapErr(err error) error {
	var se sqlite3.Error
	if !errors.As(err, &se) || errors.Is(err, journal.ErrConflict) || errors.Is(err, journal.ErrCorrupt) {
		return err
	}
	switch {
	case se.Code == sqlite3.ErrConstraint &&
		(se.ExtendedCode == sqlite3.ErrConstraintUnique || se.ExtendedCode == sqlite3.ErrConstraintPrimaryKey):
		return fmt.Errorf("%w: %w", journal.ErrConflict, err)
	case se.Code == sqlite3.ErrCorrupt || se.Code == sqlite3.ErrNotADB:
		return fmt.Errorf("%w: %w", journal.ErrCorrupt, err)
	}
	return err
}
