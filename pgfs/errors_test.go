package pgfs

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mindroomd/mindroomd/journal"
)

// The server's codes for a broken uniqueness rule and for corrupted data
// or indexes arrive in the journal's vocabulary, the server's error still
// inside; a corrupted page is not something a test server can be made to
// report on demand, so the errors are the server's as pgx would return
// them.
func TestServerCodesMapOntoTheJournalsErrors(t *testing.T) {
	for _, tc := range []struct {
		code string
		want error
	}{
		{"23505", journal.ErrConflict},
		{"XX001", journal.ErrCorrupt},
		{"XX002", journal.ErrCorrupt},
		{"40P01", nil},
		{"23503", nil},
	} {
		t.Run(tc.code, func(t *testing.T) {
			pe := &pgconn.PgError{Code: tc.code, Message: "from the server"}
			err := mapErr(fmt.Errorf("insert: %w", pe))
			var got *pgconn.PgError
			if !errors.As(err, &got) || got != pe {
				t.Fatalf("mapErr lost the server's error: %v", err)
			}
			for _, e := range []error{journal.ErrConflict, journal.ErrCorrupt} {
				if errors.Is(err, e) != (e == tc.want) {
					t.Fatalf("mapErr(%s) = %v; errors.Is(%v) = %t", tc.code, err, e, errors.Is(err, e))
				}
			}
			if again := mapErr(err); again.Error() != err.Error() {
				t.Fatalf("mapErr mapped twice: %v", again)
			}
		})
	}
}
