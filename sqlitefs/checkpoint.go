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
// its own (Checkpoint) on the other core, and the writer's automatic
// checkpoint (wal_autocheckpoint) bounds the WAL as a backstop.
const (
	checkpointPassive  = `PRAGMA wal_checkpoint(PASSIVE)`
	checkpointTruncate = `PRAGMA wal_checkpoint(TRUNCATE)`

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
	return checkpoint(db.checkpointer.QueryRowContext(ctx, checkpointPassive))
}

// CheckpointOn copies committed WAL frames into the database file on conn,
// the writer's connection with no transaction open.
func CheckpointOn(ctx context.Context, conn *sql.Conn) (CheckpointResult, error) {
	return checkpoint(conn.QueryRowContext(ctx, checkpointPassive))
}

// TruncateWAL checkpoints everything and empties the WAL file. It waits for
// readers, so it is for shutdown, after the writer has stopped.
func (db *DB) TruncateWAL(ctx context.Context) (CheckpointResult, error) {
	return checkpoint(db.Writer.QueryRowContext(ctx, checkpointTruncate))
}

func checkpoint(row *sql.Row) (CheckpointResult, error) {
	var (
		r    CheckpointResult
		busy int
	)
	if err := row.Scan(&busy, &r.LogFrames, &r.Checkpointed); err != nil {
		return r, fmt.Errorf("checkpoint: %w", err)
	}
	r.Busy = busy != 0
	return r, nil
}
