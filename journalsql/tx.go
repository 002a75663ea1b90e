// Package journalsql is the journal's work inside a SQL store, written once
// for every dialect: the implementations of journal's store ports over one
// write transaction, the commands built on them, and the reads every store
// answers the same way. A dialect (sqlitefs, pgfs) supplies a Tx and a
// Reader that run this package's statements in its own SQL text, and the
// few operations whose shape differs between engines (Dialect). Nothing
// here knows which engine it runs on.
package journalsql

import (
	"context"
	"time"

	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journal"
)

// Principal is a principal with its interned row ID. Commands take it from
// a principal-bound view, never from a caller.
type Principal struct {
	journal.Principal
	ID int64
}

// EventKey stands for an event ID among a statement's arguments. A dialect
// binds it as its identity index needs: SQLite as the ID's hash followed by
// the ID, PostgreSQL as the ID alone.
type EventKey string

// Row is one row of a query, read by Scan.
type Row interface {
	Scan(dest ...any) error
}

// Rows is the cursor of a query.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// Tx is one write transaction as the shared work sees it. Statements are
// named, never written here: the dialect holds their text.
type Tx interface {
	// Exec runs a statement and reports how many rows it changed.
	Exec(s Stmt, args ...any) (int64, error)
	QueryRow(s Stmt, args ...any) Row
	Query(s Stmt, args ...any) (Rows, error)
	// NoRows reports whether err is the driver's "no row" from Scan.
	NoRows(err error) bool
	// Now is the transaction's time.
	Now() time.Time
	Dialect
}

// Dialect is the in-transaction work whose shape differs between engines.
type Dialect interface {
	// InsertEvent journals one event for p, with its payload when pending;
	// inserted is false (and nothing is written) for an event p already
	// holds.
	InsertEvent(p Principal, ev *journal.Event, thread string, class journal.Class, pending bool, epoch int64) (seq int64, inserted bool, err error)
	// Room interns p's room on first sight and reads its membership.
	Room(p Principal, room string) (RoomRef, error)
	// ForgetRoom drops anything the dialect remembers of p's room's
	// membership, which is about to change.
	ForgetRoom(p Principal, room string)
	// IndexVisible is called after a visible row is added at seq; rebuilt
	// is set when the event was admitted before (history re-projecting it).
	IndexVisible(room RoomRef, ev *journal.Event, seq int64, rebuilt bool) error
	// Text makes s storable as the dialect's text type.
	Text(s string) string
}

// RoomRef is a room as p's rows key it: its interned key, and the
// membership epoch current in this transaction and whether p is out of the
// room.
type RoomRef struct {
	Key, Epoch int64
	Departed   bool
}

// Reader runs read statements outside the writer.
type Reader interface {
	QueryRow(ctx context.Context, s Stmt, args ...any) Row
	Query(ctx context.Context, s Stmt, args ...any) (Rows, error)
	NoRows(err error) bool
	// Snapshot runs read with a Reader whose statements all see one
	// snapshot of the database.
	Snapshot(ctx context.Context, read func(Reader) error) error
}

// Writer runs write commands of one principal. Do runs run inside a write
// transaction and publishes the hints it returns once that transaction
// has committed; a command's results are captured by run itself. size is
// the command's payload in bytes, which a writer that gathers commands
// may bound its batches by.
type Writer interface {
	Do(ctx context.Context, name string, size int, run func(Tx) ([]hint.Hint, error)) error
}
