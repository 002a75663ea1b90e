package store

import (
	"context"
	"database/sql"
	"time"

	"github.com/mindroomd/mindroomd/actors/writer"
	"github.com/mindroomd/mindroomd/sqlitefs"
)

// busyOutstanding is the number of write commands in flight from which the
// writer counts as saturated: background work then stays off its thread.
const busyOutstanding = 16

// busy reports whether the writer is saturated right now.
func (s *Store) busy() bool { return len(s.sem) >= busyOutstanding }

// runCheckpoints checkpoints the WAL a while after commits, until ctx
// ends: interval after the first commit of a burst, so one checkpoint
// copies many commits' pages. Under light load the checkpoint runs between
// the writer's batches (writer.Maintain), never beside a commit; a
// saturated writer has no time for it, so it runs beside, and less often.
func (s *Store) runCheckpoints(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = sqlitefs.DefaultCheckpointInterval
	}
	var lastBeside time.Time
	afterCommits(ctx, s.commits, interval, func() bool { return true }, func() {
		var err error
		if s.busy() {
			if time.Since(lastBeside) < sqlitefs.SaturatedCheckpointInterval {
				return // the commits that keep coming bring the next chance
			}
			lastBeside = time.Now()
			_, err = s.db.Checkpoint(ctx)
		} else {
			err = writer.RequestMaintenance(ctx, s.system.Root, s.writer, &writer.Maintain{
				Name: "checkpoint",
				// Never interrupted: it runs on the writer's connection, and
				// Close checkpoints everything after the writer stops anyway.
				Run: func(conn *sql.Conn) error {
					_, err := sqlitefs.CheckpointOn(context.Background(), conn)
					return err
				},
			}, s.done)
		}
		if err != nil && ctx.Err() == nil {
			s.log.Warn().Err(err).Msg("Checkpoint failed; the WAL grows until one succeeds")
		}
	})
}

// afterCommits calls run delay after a commit signal that finds due true,
// until ctx ends. Signals during the delay fold into that one run, so a
// burst of commits costs one.
func afterCommits(ctx context.Context, signals <-chan struct{}, delay time.Duration, due func() bool, run func()) {
	t := time.NewTimer(delay)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-signals:
		}
		if !due() {
			continue
		}
		t.Reset(delay)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		run()
	}
}

// DefaultMergeDelay is how long after a commit the unmerged tail of the
// page index is merged in the background, and MergeChunk the most rows one
// background merge moves. Small merges keep each one a short command that
// a group commit barely notices; under full load admission's inline merge
// at the tail bound moves the most rows per merge, which is what makes
// merging cheap, and the background has little left to do.
const (
	DefaultMergeDelay = 100 * time.Millisecond
	MergeChunk        = 64
)

// runMerges merges the page index's unmerged tail, a chunk at a time, a
// delay after commits that left one, until ctx ends; readers of a journal
// at rest scan no tail.
func (s *Store) runMerges(ctx context.Context, delay time.Duration) {
	if delay <= 0 {
		delay = DefaultMergeDelay
	}
	// A commit that was a merge, or left no tail, is not due.
	due := func() bool { return s.db.Unmerged() > 0 }
	afterCommits(ctx, s.merges, delay, due, func() {
		// A saturated writer merges the whole tail inline at its bound, many
		// rows per conversation at once; chunks would only cost it more.
		for s.db.Unmerged() > 0 && !s.busy() && ctx.Err() == nil {
			n, err := s.mergeTail(ctx, MergeChunk)
			if err != nil && ctx.Err() == nil {
				s.log.Warn().Err(err).Msg("Page index merge failed; the unmerged tail waits for the next")
			}
			if err != nil || n == 0 {
				break
			}
		}
	})
}

// mergeTail merges up to limit tail rows (all when limit <= 0) as one
// writer command.
func (s *Store) mergeTail(ctx context.Context, limit int) (int64, error) {
	n, err := s.exec(ctx, "merge_page_tail", 0, func(t *writer.Tx) (any, error) {
		return sqlitefs.MergePageTail(s.tx(t), limit)
	})
	if err != nil {
		return 0, err
	}
	return n.(int64), nil
}

// MergePageTail moves the page index's whole unmerged tail into it now and
// reports how many rows moved. The store merges on its own after commits;
// this is for tools and benchmarks that want to start from a merged index.
func (s *Store) MergePageTail(ctx context.Context) (int64, error) { return s.mergeTail(ctx, 0) }
