package testsupport

import (
	"database/sql"
	"testing"

	// The plain driver, so tests can reach under the store like bit rot would.
	_ "github.com/mattn/go-sqlite3"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/sqlitefs"
)

const corruptPayload = `UPDATE journal_payloads SET payload = ?
	WHERE seq = (SELECT seq FROM journal_events
		WHERE principal = (SELECT id FROM principals WHERE agent = ? AND user_id = ?) AND id_hash = ? AND event_id = ?)`

// MustCorruptPayload overwrites the stored payload of one of p's events in
// the journal under dir with bytes that do not decode.
func MustCorruptPayload(tb testing.TB, dir string, p journal.Principal, eventID string) {
	tb.Helper()
	db, err := sql.Open("sqlite3", sqlitefs.Path(dir)+"?_busy_timeout=10000")
	if err != nil {
		tb.Fatalf("open for corruption: %v", err)
	}
	defer db.Close()
	r, err := db.Exec(corruptPayload, "\x00{not json", p.Agent, p.UserID, sqlitefs.IDHash(eventID), eventID)
	if err != nil {
		tb.Fatalf("corrupt %s: %v", eventID, err)
	}
	if n, _ := r.RowsAffected(); n != 1 {
		tb.Fatalf("corrupt %s: %d rows changed, want 1", eventID, n)
	}
}
