package sqlitefs

import (
	"context"
	"fmt"
	"time"
)

// Checkpoints run mostly off the writer's commit path: a checkpoint inside a
// commit copies megabytes back into the file while every sender of that
// batch waits. A separate connection copies frames passively, never
// blocking the writer or a reader. Under sustained writes that copy never
// finishes (the writer keeps appending), and the WAL only starts over after
// a complete checkpoint, so the writer keeps an automatic checkpoint at a
// high mark (wal_autocheckpoint, 64 MiB of WAL) as the backstop: when it
// fires, the background passes have already copied most frames, it
// completes, and the WAL restarts. That stall is the price of a bounded WAL.
const (
	checkpointPassive  = `PRAGMA wal_checkpoint(PASSIVE)`
	checkpointTruncate = `PRAGMA wal_checkpoint(TRUNCATE)`

	// DefaultCheckpointInterval spaces checkpoints while commits keep
	// coming: long enough to copy many commits' pages at once, short
	// enough that the WAL stays small.
	DefaultCheckpointInterval = 50 * time.Millisecond
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

// Checkpoint copies committed WAL frames into the database file without
// waiting for the writer or readers.
func (db *DB) Checkpoint(ctx context.Context) (CheckpointResult, error) {
	return db.checkpoint(ctx, checkpointPassive)
}

// TruncateWAL checkpoints everything and empties the WAL file. It waits for
// readers, so it is for shutdown, after the writer has stopped.
func (db *DB) TruncateWAL(ctx context.Context) (CheckpointResult, error) {
	return db.checkpoint(ctx, checkpointTruncate)
}

func (db *DB) checkpoint(ctx context.Context, q string) (CheckpointResult, error) {
	var (
		r    CheckpointResult
		busy int
	)
	if err := db.checkpointer.QueryRowContext(ctx, q).Scan(&busy, &r.LogFrames, &r.Checkpointed); err != nil {
		return r, fmt.Errorf("checkpoint: %w", err)
	}
	r.Busy = busy != 0
	return r, nil
}

// RunCheckpoints checkpoints after commits, at most once per interval, until
// ctx ends. commits is signalled after each commit; a burst of commits costs
// one checkpoint. Errors go to onError and the loop goes on: a failed
// checkpoint leaves the WAL longer, never loses data.
func (db *DB) RunCheckpoints(ctx context.Context, commits <-chan struct{}, interval time.Duration, onError func(error)) {
	if interval <= 0 {
		interval = DefaultCheckpointInterval
	}
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-commits:
		}
		// Let the burst this commit belongs to accumulate first.
		t.Reset(interval)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := db.Checkpoint(ctx); err != nil && ctx.Err() == nil {
			onError(err)
		}
	}
}
