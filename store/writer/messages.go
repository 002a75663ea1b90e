package writer

import (
	"context"
	"database/sql"
	"time"

	"github.com/mindroomd/mindroomd/hint"
)

// Command is one unit of work run inside the batch transaction, in its own
// savepoint: if it returns an ordinary error only its own writes roll back.
type Command func(tx *Tx) (result any, err error)

// Tx is the batch transaction as a command sees it: the writer's
// connection with a transaction open on it.
type Tx struct {
	conn *sql.Conn
	// Now is taken once per batch, so every command of a commit agrees on
	// the time.
	Now time.Time
	// Local is per-transaction state the command layer may keep (such as
	// statements bound to this transaction); the writer never reads it.
	Local       any
	hints       []hint.Hint
	afterCommit []func()
}

// Conn is the writer's connection; everything run on it until the batch
// ends is inside the batch transaction.
func (t *Tx) Conn() *sql.Conn { return t.conn }

// Exec runs a statement inside the transaction.
func (t *Tx) Exec(query string, args ...any) (sql.Result, error) {
	return t.conn.ExecContext(context.Background(), query, args...)
}

// Query runs a query inside the transaction.
func (t *Tx) Query(query string, args ...any) (*sql.Rows, error) {
	return t.conn.QueryContext(context.Background(), query, args...)
}

// QueryRow runs a one-row query inside the transaction.
func (t *Tx) QueryRow(query string, args ...any) *sql.Row {
	return t.conn.QueryRowContext(context.Background(), query, args...)
}

// Hint records a wake-up to publish after the batch commits. A hint from a
// command that rolls back is discarded with it.
func (t *Tx) Hint(h hint.Hint) { t.hints = append(t.hints, h) }

// AfterCommit records f to run once the batch has committed, on the
// writer's goroutine before the next batch begins, in the order recorded.
// It is for state kept beside the database that may only show what is
// committed. Like a hint, f is discarded with a command that rolls back,
// and with the whole batch if it does not commit. It runs after the batch's
// replies have gone out: a panic in f stops the writer as a fault, but the
// commands it answered stay committed and answered as such.
func (t *Tx) AfterCommit(f func()) { t.afterCommit = append(t.afterCommit, f) }

// Execute asks the writer to run a command in the next group commit. The
// reply, an *Executed, is sent only after COMMIT.
type Execute struct {
	// Ctx lets a caller that gave up have its command skipped if it has not
	// started yet. Nil means never cancelled.
	Ctx context.Context
	// Name labels the command in logs.
	Name string
	// Size estimates the bytes the command writes, for the batch byte cap.
	Size int
	// Run is the command.
	Run Command
	// Reply, when set, receives the answer instead of the sending actor. It
	// must have room for one value. Go callers outside the actor system use
	// it so they can wait on their context and on the writer stopping at
	// once, without a goroutine per request or a future timeout.
	Reply chan<- *Executed
}

// Executed answers an Execute after its batch committed (or failed).
type Executed struct {
	Result any
	Err    error
}

// Maintain asks the writer to run Run on its connection between batches,
// outside any transaction: the batch open when it arrives commits first,
// and the next begins after Run returns. It is for work that must not
// overlap a commit, such as a WAL checkpoint, whose file syncs would
// otherwise queue behind (and in front of) the commits' own.
type Maintain struct {
	// Name labels the work in logs.
	Name string
	// Run is the work; its error is the reply. A fatal error (Deps.IsFatal)
	// stops the writer as a storage fault would.
	Run func(conn *sql.Conn) error
	// Reply, when set, receives Run's error. It must have room for one value.
	Reply chan<- error
}

// flush is the self-sent marker that closes a batch: commands already queued
// when the batch opened arrive before it and join the batch.
type flush struct{}
