package migration_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/mindroomd/mindroomd/migration"
)

func TestCheckRefusesAForeignNewerOrReadOnlyOlderSchemaAndPassesTheRest(t *testing.T) {
	const known = 5
	var newer *migration.NewerDatabaseError
	var older *migration.OlderDatabaseError
	for _, tc := range []struct {
		name   string
		found  migration.Schema
		access migration.Access
		// refused tells the error Check must return; nil for none.
		refused func(error) bool
	}{
		{"Empty", migration.Schema{}, migration.ReadWrite, nil},
		{"Current", migration.Schema{Version: known, Tables: true}, migration.ReadWrite, nil},
		{"OlderToMigrate", migration.Schema{Version: 2, Tables: true}, migration.ReadWrite, nil},
		{"CurrentReadOnly", migration.Schema{Version: known, Tables: true}, migration.ReadOnly, nil},
		{"ForeignMark", migration.Schema{Version: known, Tables: true, Foreign: "application_id is 0x1"}, migration.ReadWrite,
			func(err error) bool { return errors.Is(err, migration.ErrForeignDatabase) }},
		{"TablesWithoutAVersion", migration.Schema{Tables: true}, migration.ReadWrite,
			func(err error) bool { return errors.Is(err, migration.ErrForeignDatabase) }},
		{"TablesWithoutAVersionReadOnly", migration.Schema{Tables: true}, migration.ReadOnly,
			func(err error) bool { return errors.Is(err, migration.ErrForeignDatabase) }},
		{"Newer", migration.Schema{Version: known + 1, Tables: true}, migration.ReadWrite,
			func(err error) bool {
				return errors.As(err, &newer) && *newer == migration.NewerDatabaseError{Version: known + 1, Known: known}
			}},
		{"NewerReadOnly", migration.Schema{Version: known + 1, Tables: true}, migration.ReadOnly,
			func(err error) bool { return errors.As(err, &newer) && newer.Version == known+1 }},
		{"OlderReadOnly", migration.Schema{Version: 2, Tables: true}, migration.ReadOnly,
			func(err error) bool {
				return errors.As(err, &older) && *older == migration.OlderDatabaseError{Version: 2, Known: known}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := migration.Check(tc.found, known, tc.access)
			switch {
			case tc.refused == nil && err != nil:
				t.Fatalf("Check(%+v) = %v, want nil", tc.found, err)
			case tc.refused != nil && !tc.refused(err):
				t.Fatalf("Check(%+v) = %v, not the refusal wanted", tc.found, err)
			case tc.refused != nil && !migration.Refused(fmt.Errorf("open journal: %w", err)):
				t.Fatalf("Refused does not see %v through a wrap", err)
			}
		})
	}
}

func TestRefusedIsFalseForErrorsThatAreNoRefusal(t *testing.T) {
	for _, err := range []error{nil, errors.New("connection refused"), fmt.Errorf("migrate: %w", errors.New("disk full"))} {
		if migration.Refused(err) {
			t.Fatalf("Refused(%v) = true", err)
		}
	}
}
