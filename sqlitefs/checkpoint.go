package sqlitefs

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// Checkpoints run in one of two places. Under light load they run on the
// writer's own connection between its batches (writer.Maintain): a
// checkpoint beside a commit has its sync of the database file queue in
// front of the commit's WAL sync, and that was the tail of command
// latency; between batches it copies only what the last commits wrote,
// completes, and the next transaction starts the WAL over. Under full load
// the writer has no time to spare, so the copying moves to a connection of
// its own (Checkpoint) on the other core.
//
// Copying is not enough to keep the WAL small. SQLite starts the WAL over
// only at a write transaction that finds every frame copied and no reader
// still reading frames; a reader that began before the last copy ended
// holds its frames until it finishes. Beside a saturated writer, readers
// that never pause nearly always have one such reader, and with copying
// alone the WAL grew far past the writer's automatic checkpoint at 64 MiB
// (to 107 and 171 MiB in two 120 s runs of BenchmarkWALBound). So once the
// WAL holds half its bound (RestartDue), a RESTART checkpoint on the
// writer's connection (RestartWALOn) waits briefly for the readers of
// older frames; readers that start meanwhile read the file, the next
// transaction starts the WAL over, and its first commit truncates a file
// grown past the bound back to it (journal_size_limit). The same runs then
// peaked at 41 and 40 MiB.
const (
	checkpointPassive  = `PRAGMA wal_checkpoint(PASSIVE)`
	checkpointRestart  = `PRAGMA wal_checkpoint(RESTART)`
	checkpointTruncate = `PRAGMA wal_checkpoint(TRUNCATE)`

	// A RESTART checkpoint holds the write lock while it waits for readers,
	// so the writer waits with it: at most about this long for the readers
	// of old frames and as long again for readers still on the WAL, and then
	// it gives up until the next try. A page read takes a millisecond or
	// two.
	pragmaBusyRestart = `PRAGMA busy_timeout = 10`

	// DefaultCheckpointInterval spaces checkpoints while commits keep
	// coming. A checkpoint stalls the writer for as long as it takes to
	// copy and sync the pages changed since the last one, most of them at
	// random places in the file; a short interval keeps each stall to a
	// millisecond or two, where a long one saves a few pages rewritten
	// twice but stalls commands for much longer.
	DefaultCheckpointInterval = 5 * time.Millisecond

	// SaturatedCheckpointInterval spaces the checkpoints that run beside a
	// saturated writer. A page rewritten by many commits in between is
	// copied and synced once, and the checkpoint's sync of the database
	// file, which slows the commits' WAL syncs while it runs, comes ten
	// times less often.
	SaturatedCheckpointInterval = 250 * time.Millisecond
)

// CheckpointResult is what one checkpoint reported.
type CheckpointResult struct {
	// Busy is true when the checkpoint could not finish (a reader still
	// needed older frames); the next one carries on.
	Busy bool
	// LogFrames is the WAL's size in frames; Checkpointed how many of them
	// are now in the database file.
	LogFrames, Checkpointed int
}

// Checkpoint copies committed WAL frames into the database file on a
// connection of its own, without waiting for the writer or readers.
func (db *DB) Checkpoint(ctx context.Context) (CheckpointResult, error) {
	r, err := checkpoint(db.checkpointer.QueryRowContext(ctx, checkpointPassive))
	if err != nil {
		return r, fmt.Errorf("checkpoint: %w", err)
	}
	return r, nil
}

// RestartDue reports whether the WAL a checkpoint reported on holds half
// its bound (Options.WALBound) or more, so that it is time to start it over
// with RestartWALOn.
func (db *DB) RestartDue(r CheckpointResult) bool {
	return r.LogFrames >= db.restartFrames
}

// RestartWALOn checkpoints everything on conn, the writer's connection with
// no transaction open, then waits a little for readers still reading WAL
// frames, so that the next transaction starts the WAL over. Busy in the
// result means a reader kept reading the WAL past the wait; the WAL then
// grows on until a later try.
func RestartWALOn(ctx context.Context, conn *sql.Conn) (_ CheckpointResult, err error) {
	if _, err := conn.ExecContext(ctx, pragmaBusyRestart); err != nil {
		return CheckpointResult{}, fmt.Errorf("set the restart's busy timeout: %w", err)
	}
	defer func() {
		// The writer's own wait comes back even if ctx has ended.
		if _, e := conn.ExecContext(context.Background(), pragmaBusyTimeout); e != nil && err == nil {
			err = fmt.Errorf("restore the busy timeout: %w", e)
		}
	}()
	return checkpoint(conn.QueryRowContext(ctx, checkpointRestart))
}

// CheckpointOn copies committed WAL frames into the database file on conn,
// the writer's connection with no transaction open.
func CheckpointOn(ctx context.Context, conn *sql.Conn) (CheckpointResult, error) {
	return checkpoint(conn.QueryRowContext(ctx, checkpointPassive))
}

// TruncateWAL checkpoints everything and empties the WAL file. It waits for
// readers, so it is for shutdown, after the writer has stopped.
func (db *DB) TruncateWAL(ctx context.Context) (CheckpointResult, error) {
	r, err := checkpoint(db.writer.QueryRowContext(ctx, checkpointTruncate))
	if err != nil {
		return r, fmt.Errorf("truncate the WAL: %w", err)
	}
	return r, nil
}

func checkpoint(row *sql.Row) (CheckpointResult, error) {
	var (
		r    CheckpointResult
		busy int
	)
	// The writer names the maintenance it runs, and Checkpoint and
	// TruncateWAL name theirs: the error is left bare here.
	if err := row.Scan(&busy, &r.LogFrames, &r.Checkpointed); err != nil {
		return r, err
	}
	r.Busy = busy != 0
	return r, nil
}
