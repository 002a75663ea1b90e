package store

import (
	"context"
	"database/sql"
	"time"

	"github.com/mindroomd/mindroomd/sqlitefs"
	"github.com/mindroomd/mindroomd/store/writer"
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
// Either way, a WAL past half its bound is then started over when readers
// allow (sqlitefs.RestartWALOn).
func (s *Store) runCheckpoints(ctx context.Context, interval time.Duration) {
	interval = checkpointInterval(interval)
	var st checkpointState
	afterCommits(ctx, s.commits, interval, func() bool { return true }, nil, func() {
		if err := s.checkpoint(ctx, &st); err != nil && ctx.Err() == nil {
			s.log.Warn().Err(err).Msg("Checkpoint failed; the WAL grows until one succeeds")
		}
	})
}

// checkpointState is what the checkpointer remembers between checkpoints.
type checkpointState struct {
	// lastBeside is when a checkpoint last ran beside the writer,
	// lastRestart when the WAL was last started over or tried to be.
	lastBeside, lastRestart time.Time
}

// checkpoint runs one checkpoint, and starts the WAL over after it if the
// WAL holds half its bound. A try to start it over waits for readers with
// the writer stopped, so tries come no more often than
// sqlitefs.SaturatedCheckpointInterval.
func (s *Store) checkpoint(ctx context.Context, st *checkpointState) error {
	now := time.Now()
	mayRestart := now.Sub(st.lastRestart) >= sqlitefs.SaturatedCheckpointInterval
	var restarted bool // set on the writer's goroutine, read after its reply
	restart := func(conn *sql.Conn) error {
		restarted = true
		_, err := sqlitefs.RestartWALOn(context.Background(), conn)
		return err
	}
	var err error
	if s.busy() {
		if now.Sub(st.lastBeside) < sqlitefs.SaturatedCheckpointInterval {
			return nil // the commits that keep coming bring the next chance
		}
		st.lastBeside = now
		r, cerr := s.db.Checkpoint(ctx)
		if cerr != nil || !mayRestart || !s.db.RestartDue(r) {
			return cerr
		}
		err = s.maintain(ctx, "restart_wal", restart)
	} else {
		err = s.maintain(ctx, "checkpoint", func(conn *sql.Conn) error {
			r, err := sqlitefs.CheckpointOn(context.Background(), conn)
			if err != nil || !mayRestart || !s.db.RestartDue(r) {
				return err
			}
			return restart(conn)
		})
	}
	if err == nil && restarted {
		st.lastRestart = now
	}
	return err
}

// maintain runs work on the writer's connection between its batches and
// waits for it, or for ctx. The work itself takes no ctx: once it has
// started on the writer's connection it finishes, and Close checkpoints
// everything after the writer stops anyway.
func (s *Store) maintain(ctx context.Context, name string, work func(conn *sql.Conn) error) error {
	return writer.RequestMaintenance(ctx, s.system.Root, s.writer, &writer.Maintain{Name: name, Run: work}, s.done)
}

// checkpointInterval is the configured interval, or the default.
func checkpointInterval(configured time.Duration) time.Duration {
	if configured <= 0 {
		return sqlitefs.DefaultCheckpointInterval
	}
	return configured
}

// afterCommits calls run delay after a commit signal that finds due true,
// until ctx ends. Signals during the delay fold into that one run, so a
// burst of commits costs one. With early set, a signal that finds early
// true runs it at once.
func afterCommits(ctx context.Context, signals <-chan struct{}, delay time.Duration, due, early func() bool, run func()) {
	t := time.NewTimer(delay)
	defer t.Stop()
	var hurry <-chan struct{} // nil, never ready, unless early is set
	if early != nil {
		hurry = signals
	}
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
	wait:
		for early == nil || !early() {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				break wait
			case <-hurry:
			}
		}
		t.Stop()
		run()
	}
}

// DefaultMergeDelay is how long after a commit a merge cycle starts, and
// MergeChunk about how many rows one chunk of a cycle moves. The longer the
// delay, the more rows each conversation's leaf takes per write; a tail
// half its bound starts a cycle at once, so a load short of saturation
// never reaches the inline merge. A chunk of this size dirties a few dozen
// index pages, a short checkpoint's worth.
const (
	DefaultMergeDelay = time.Second
	MergeChunk        = 128
)

// runMerges runs a merge cycle a delay after commits that left a tail,
// until ctx ends; readers of a journal at rest scan no tail. pause spaces a
// cycle's chunks, so each is copied by a checkpoint of its own.
func (s *Store) runMerges(ctx context.Context, delay, pause time.Duration) {
	if delay <= 0 {
		delay = DefaultMergeDelay
	}
	due := func() bool { return s.db.Unmerged() > 0 }
	early := func() bool { return s.db.Unmerged() >= s.db.MaxUnmerged()/2 }
	retry := time.AfterFunc(delay, s.nudgeMerges)
	retry.Stop()
	defer retry.Stop()
	afterCommits(ctx, s.merges, delay, due, early, func() {
		finished, err := s.mergeCycle(ctx, MergeChunk, pause)
		switch {
		case err != nil:
			if ctx.Err() == nil {
				s.log.Warn().Err(err).Msg("Page index merge failed; the unmerged tail waits for the next")
			}
			return
		case !finished:
			// A saturated writer left it to the inline merge. Try again a
			// delay after the last such try, in case the burst ends with no
			// commit to come.
			retry.Reset(delay)
		case s.db.Unmerged() > 0:
			s.nudgeMerges() // rows that arrived during the cycle have their own
		}
		if s.afterMergeCycle != nil {
			s.afterMergeCycle(finished)
		}
	})
}

// mergeCycle merges the tail as it stands, a chunk of rooms per writer
// command, and reports whether it finished. A saturated writer has no time
// for it: the cycle gives up, and the writer merges the whole tail inline
// at its bound, many rows per conversation at once.
func (s *Store) mergeCycle(ctx context.Context, chunkRows int, pause time.Duration) (bool, error) {
	if s.busy() {
		return false, nil
	}
	plan, err := s.planMerge(ctx, chunkRows)
	if err != nil || len(plan.Chunks) == 0 {
		return err == nil, err
	}
	t := time.NewTimer(pause)
	defer t.Stop()
	for i, rooms := range plan.Chunks {
		if i > 0 {
			t.Reset(pause)
			select {
			case <-ctx.Done():
				return false, ctx.Err()
			case <-t.C:
			}
		}
		if s.busy() {
			return false, nil
		}
		if err := s.mergeRooms(ctx, plan.Boundary, rooms); err != nil {
			return false, err
		}
	}
	err = s.finishMerge(ctx, plan.Boundary)
	return err == nil, err
}

// planMerge, mergeRooms and finishMerge are the steps of a cycle, each one
// writer command.
func (s *Store) planMerge(ctx context.Context, chunkRows int) (sqlitefs.PageMergePlan, error) {
	return command(ctx, s, "plan_page_merge", func(tx *sqlitefs.Tx) (sqlitefs.PageMergePlan, error) {
		return sqlitefs.PlanPageMerge(tx, chunkRows)
	})
}

func (s *Store) mergeRooms(ctx context.Context, boundary int64, rooms sqlitefs.RoomRange) error {
	_, err := command(ctx, s, "merge_page_rooms", func(tx *sqlitefs.Tx) (int64, error) {
		return sqlitefs.MergePageRooms(tx, boundary, rooms)
	})
	return err
}

func (s *Store) finishMerge(ctx context.Context, boundary int64) error {
	_, err := command(ctx, s, "finish_page_merge", func(tx *sqlitefs.Tx) (struct{}, error) {
		return struct{}{}, sqlitefs.FinishPageMerge(tx, boundary)
	})
	return err
}

// MergePageTail moves the page index's whole unmerged tail into it now, in
// one transaction, and reports how many entries it wrote. The store merges
// on its own after commits; this is for tools and benchmarks that want to
// start from a merged index.
func (s *Store) MergePageTail(ctx context.Context) (int64, error) {
	return command(ctx, s, "merge_page_tail", sqlitefs.MergePageTail)
}
