// Package writer is the actor that owns the only read-write connection to
// the journal database.
//
// It group-commits: every command queued when a batch opens joins one
// transaction, each command in its own savepoint, then one COMMIT (one fsync),
// and only then does every sender get its reply. After-commit work and hints
// follow the replies, so nothing that fails after the commit can make a
// committed command look failed. A storage fault or a panic fails the whole
// batch and stops the writer for good; it is never restarted holding a
// leaked transaction. Another connection holding the write lock is no fault:
// the batch waits for it (see Deps.IsBusy).
package writer

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/actors"
	"github.com/mindroomd/mindroomd/hint"
)

// Defaults for Deps' batch caps.
const (
	// DefaultMaxBatch bounds the commands of one transaction, so one batch
	// cannot grow without bound under overload.
	DefaultMaxBatch = 512
	// DefaultMaxBatchBytes bounds the estimated bytes of one transaction.
	DefaultMaxBatchBytes = 16 << 20
)

// ErrStopped is returned for commands the writer will not run because it has
// stopped.
var ErrStopped = errors.New("writer stopped")

// ErrBusy is returned for commands given up while another connection held
// the write lock and the writer was asked to stop (Deps.Closing). They did
// not run; the writer itself is not at fault.
var ErrBusy = errors.New("database busy")

// Backoff between BEGIN attempts on a busy database. Each attempt already
// waits out the connection's busy timeout inside SQLite; the pause only
// keeps a short timeout from spinning.
const (
	busyBackoffMin = 10 * time.Millisecond
	busyBackoffMax = 250 * time.Millisecond
)

// FatalError wraps the fault that failed a whole batch and stopped the writer.
type FatalError struct{ Err error }

// Error implements error.
func (e *FatalError) Error() string { return "writer stopped: " + e.Err.Error() }

// Unwrap returns the underlying fault.
func (e *FatalError) Unwrap() error { return e.Err }

// Deps are the writer's collaborators.
type Deps struct {
	// DB is the read-write pool, limited to one connection whose
	// transactions begin IMMEDIATE.
	DB *sql.DB
	// Now is the clock; defaults to time.Now.
	Now func() time.Time
	// Log receives the writer's logs.
	Log zerolog.Logger
	// Publish receives the hints of each committed batch; may be nil.
	Publish func([]hint.Hint)
	// Committed, when set, is called after every commit with the number of
	// commands it held and how long its transaction took, BEGIN to the end
	// of COMMIT (a checkpointer and metrics listen here).
	Committed func(commands int, took time.Duration)
	// IsFatal reports storage errors that poison the transaction (disk full,
	// I/O error, corruption). Such an error stops the writer.
	IsFatal func(error) bool
	// IsBusy reports the error of a lock held by another connection (a
	// sqlite3 shell, a backup tool) past the busy timeout. A batch whose
	// BEGIN meets it waits and retries, answering the commands whose callers
	// give up meanwhile; it never stops the writer. Nil means no error is.
	IsBusy func(error) bool
	// OnBusy, when set, is called after each BEGIN that met a busy database,
	// with how long the batch has waited so far (a metric listens here).
	OnBusy func(waited time.Duration)
	// Closing, when set, is closed by the owner before an orderly stop. From
	// then on a batch whose BEGIN is still busy gives up instead of waiting
	// again: its commands get ErrBusy, so a lock that is never released
	// holds the stop for at most one busy timeout per batch, not forever.
	// Without it a batch waits for as long as any of its callers does.
	Closing <-chan struct{}
	// OnStopped is called once when the actor has stopped, with the fault
	// that stopped it or nil after an orderly stop.
	OnStopped func(error)
	// MaxBatch and MaxBatchBytes cap one transaction; zero means the default.
	MaxBatch      int
	MaxBatchBytes int
}

// Props returns the writer's props. Supervision is explicit: a failure stops
// the writer instead of restarting it.
func Props(d Deps) *actor.Props {
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.MaxBatch <= 0 {
		d.MaxBatch = DefaultMaxBatch
	}
	if d.MaxBatchBytes <= 0 {
		d.MaxBatchBytes = DefaultMaxBatchBytes
	}
	if d.IsFatal == nil {
		d.IsFatal = func(error) bool { return false }
	}
	if d.IsBusy == nil {
		d.IsBusy = func(error) bool { return false }
	}
	return actor.PropsFromProducer(func() actor.Actor { return &writerActor{deps: d} },
		actor.WithGuardian(actors.StopOnFailure()), actor.WithSupervisor(actors.StopOnFailure()))
}

type queued struct {
	cmd    *Execute
	sender *actor.PID
}

// answer delivers the reply to whoever is waiting for it.
func (q queued) answer(ctx actor.Context, r *Executed) {
	switch {
	case q.cmd.Reply != nil:
		q.cmd.Reply <- r
	case q.sender != nil:
		ctx.Send(q.sender, r)
	}
}

type writerActor struct {
	deps         Deps
	batch        []queued
	bytes        int
	flushQueued  bool
	failed       error
	conn         *sql.Conn // the single read-write connection, held for life
	controlStmts map[string]*sql.Stmt
}

// Receive implements actor.Actor.
func (a *writerActor) Receive(ctx actor.Context) {
	// A panic outside the batch transaction (in Publish, a reply, a hook)
	// must still stop the writer as a fault: left to supervision it would
	// stop it too, but OnStopped would then see an orderly stop.
	defer func() {
		if r := recover(); r != nil {
			a.fail(ctx, fmt.Errorf("panic in writer: %v", r))
		}
	}()
	switch m := ctx.Message().(type) {
	case *Execute:
		if a.failed != nil {
			queued{cmd: m, sender: ctx.Sender()}.answer(ctx, &Executed{Err: a.failed})
			return
		}
		a.batch = append(a.batch, queued{cmd: m, sender: ctx.Sender()})
		a.bytes += m.Size
		if len(a.batch) >= a.deps.MaxBatch || a.bytes >= a.deps.MaxBatchBytes {
			a.flush(ctx)
			return
		}
		if !a.flushQueued {
			a.flushQueued = true
			ctx.Send(ctx.Self(), &flush{})
		}
	case *flush:
		a.flushQueued = false
		a.flush(ctx)
	case *Maintain:
		a.maintain(ctx, m)
	case *actor.Stopping:
		// An orderly stop drains what was queued with one final commit.
		a.flush(ctx)
	case *actor.Stopped:
		for _, s := range a.controlStmts {
			_ = s.Close()
		}
		if a.conn != nil {
			_ = a.conn.Close() // back to its pool, which its owner closes
		}
		if a.deps.OnStopped != nil {
			a.deps.OnStopped(a.failed)
		}
	}
}

// maintain commits the open batch, then runs m on the idle connection. A
// fatal error or a panic in m stops the writer; either way m is answered.
func (a *writerActor) maintain(ctx actor.Context, m *Maintain) {
	a.flush(ctx)
	err := a.failed
	if err == nil {
		var fatal bool
		if fatal, err = a.runMaintenance(m); fatal {
			a.fail(ctx, fmt.Errorf("%s: %w", m.Name, err))
			err = a.failed
		}
	}
	if m.Reply != nil {
		m.Reply <- err
	}
}

// runMaintenance runs m, reporting whether its error must stop the writer.
func (a *writerActor) runMaintenance(m *Maintain) (fatal bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			fatal, err = true, fmt.Errorf("panic: %v", r)
		}
	}()
	if err := a.connect(); err != nil {
		return true, err
	}
	err = m.Run(a.conn)
	return err != nil && a.deps.IsFatal(err), err
}

// connect takes the writer's connection on first use and keeps it for life.
func (a *writerActor) connect() error {
	if a.conn != nil {
		return nil
	}
	var err error
	if a.conn, err = a.deps.DB.Conn(context.Background()); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	return nil
}

// fail stops the writer for a fault outside a batch transaction, failing
// the commands still waiting in the open batch.
func (a *writerActor) fail(ctx actor.Context, err error) {
	if a.failed == nil {
		a.failed = &FatalError{Err: err}
	}
	a.deps.Log.Error().Err(err).Msg("Writer failed; stopping")
	batch := a.batch
	a.batch, a.bytes = nil, 0
	for _, q := range batch {
		q.answer(ctx, &Executed{Err: a.failed})
	}
	ctx.Stop(ctx.Self())
}

func (a *writerActor) flush(ctx actor.Context) {
	if len(a.batch) == 0 {
		return
	}
	batch := a.batch
	a.batch, a.bytes = nil, 0
	batch, err := a.begin(ctx, batch)
	if errors.Is(err, ErrBusy) {
		for _, q := range batch {
			q.answer(ctx, &Executed{Err: err})
		}
		return
	}
	if err == nil && len(batch) == 0 {
		return // every caller gave up while the database was busy
	}
	var (
		replies []*Executed
		tx      *Tx
		took    time.Duration
	)
	if err == nil {
		// Measured on the monotonic clock: the transaction, from BEGIN to
		// the end of COMMIT's sync.
		start := time.Now()
		replies, tx, err = a.run(batch)
		took = time.Since(start)
	}
	if err != nil {
		a.failed = &FatalError{Err: err}
		a.deps.Log.Error().Err(err).Int("commands", len(batch)).Msg("Batch failed; stopping the writer")
		for _, q := range batch {
			q.answer(ctx, &Executed{Err: a.failed})
		}
		ctx.Stop(ctx.Self())
		return
	}
	// The batch is durable: its replies go out before anything that could
	// still fail, and nothing after this point may turn them into errors.
	for i, q := range batch {
		q.answer(ctx, replies[i])
	}
	// Each step is guarded on its own: the hints and the commit count
	// describe durable work, so they still go out if an earlier step fails.
	fault := guard("after-commit work", func() {
		for _, f := range tx.afterCommit {
			f()
		}
	})
	if len(tx.hints) > 0 && a.deps.Publish != nil {
		fault = errors.Join(fault, guard("publish", func() { a.deps.Publish(tx.hints) }))
	}
	if a.deps.Committed != nil {
		fault = errors.Join(fault, guard("committed", func() { a.deps.Committed(len(batch), took) }))
	}
	if fault != nil {
		// After-commit work keeps state beside the database in step with
		// it; once some of it failed that state is unknown, so the writer
		// must not run another batch against it.
		a.fail(ctx, fault)
	}
}

// guard runs f, returning a panic in it as an error.
func guard(what string, f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic in %s: %v", what, r)
		}
	}()
	f()
	return nil
}

// begin opens the batch transaction, on the writer's connection. While
// another connection holds the write lock it waits and retries: a busy
// database is not a fault. The commands whose callers give up meanwhile are
// answered with their context's error and left out of what it returns; if
// every caller gives up it returns none and opens nothing. A returned
// ErrBusy (the owner is stopping the writer) opened nothing either.
//
// Only BEGIN waits. From BEGIN IMMEDIATE to COMMIT the writer holds the WAL
// write lock, and in WAL mode writing frames, committing included, never
// waits for another lock; a busy error from a command is its own ordinary
// failure.
func (a *writerActor) begin(ctx actor.Context, batch []queued) ([]queued, error) {
	if err := a.connect(); err != nil {
		return batch, err
	}
	// The wait is measured on the monotonic clock, not Deps.Now: it is
	// never stored, and a test's clock stands still.
	start := time.Now()
	backoff := busyBackoffMin
	for attempt := 0; ; attempt++ {
		err := a.control(beginImmediate)
		if err == nil {
			if attempt > 0 {
				a.deps.Log.Info().Dur("waited", time.Since(start)).Int("commands", len(batch)).
					Msg("Database no longer busy; batch goes on")
			}
			return batch, nil
		}
		if !a.deps.IsBusy(err) {
			return batch, fmt.Errorf("begin: %w", err)
		}
		waited := time.Since(start)
		if attempt == 0 {
			a.deps.Log.Warn().Err(err).Int("commands", len(batch)).
				Msg("Database busy: another connection holds the write lock; waiting")
		}
		if a.deps.OnBusy != nil {
			a.deps.OnBusy(waited)
		}
		batch = abandonGivenUp(ctx, batch)
		if len(batch) == 0 {
			a.deps.Log.Info().Dur("waited", waited).Msg("Every caller gave up while the database was busy")
			return nil, nil
		}
		if closed(a.deps.Closing) {
			a.deps.Log.Warn().Dur("waited", waited).Int("commands", len(batch)).
				Msg("Database still busy while stopping; giving the batch up")
			return batch, fmt.Errorf("%w: %w", ErrBusy, err)
		}
		select {
		case <-time.After(backoff):
		case <-a.deps.Closing: // one more try, then give up
		}
		backoff = min(2*backoff, busyBackoffMax)
	}
}

// abandonGivenUp answers the commands whose callers gave up with their
// context's error and returns the rest.
func abandonGivenUp(ctx actor.Context, batch []queued) []queued {
	kept := batch[:0]
	for _, q := range batch {
		if q.cmd.Ctx != nil && q.cmd.Ctx.Err() != nil {
			q.answer(ctx, &Executed{Err: q.cmd.Ctx.Err()})
			continue
		}
		kept = append(kept, q)
	}
	return kept
}

// closed reports whether c is closed; a nil c never is.
func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// Transaction control, issued on the writer's own connection.
const (
	beginImmediate = `BEGIN IMMEDIATE`
	commit         = `COMMIT`
	rollback       = `ROLLBACK`
	savepoint      = `SAVEPOINT command`
	rollbackTo     = `ROLLBACK TO command`
	release        = `RELEASE command`
)

// control runs a transaction-control statement. Each is prepared once per
// connection: every command opens and releases a savepoint, and parsing
// them afresh each time is a measurable share of a small command.
func (a *writerActor) control(query string) error {
	s, ok := a.controlStmts[query]
	if !ok {
		var err error
		if s, err = a.conn.PrepareContext(context.Background(), query); err != nil {
			return err
		}
		if a.controlStmts == nil {
			a.controlStmts = make(map[string]*sql.Stmt)
		}
		a.controlStmts[query] = s
	}
	_, err := s.Exec()
	return err
}

// run executes one batch in the transaction begin opened, and commits it. A
// returned error is fatal: the transaction was rolled back and no command of
// the batch took effect.
//
// The writer drives BEGIN and COMMIT itself on a connection it holds for its
// whole life rather than through *sql.Tx: database/sql starts a goroutine
// for every query inside an *sql.Tx, and admission runs several queries per
// event.
func (a *writerActor) run(batch []queued) (replies []*Executed, committed *Tx, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic in batch: %v", r)
		}
		if err != nil {
			_ = a.control(rollback)
		}
	}()
	tx := &Tx{conn: a.conn, Now: a.deps.Now()}
	replies = make([]*Executed, len(batch))
	for i, q := range batch {
		if q.cmd.Ctx != nil && q.cmd.Ctx.Err() != nil {
			replies[i] = &Executed{Err: q.cmd.Ctx.Err()}
			continue
		}
		reply, err := a.runOne(tx, q.cmd)
		if err != nil {
			return nil, nil, err
		}
		replies[i] = reply
	}
	if err := a.control(commit); err != nil {
		return nil, nil, fmt.Errorf("commit: %w", err)
	}
	return replies, tx, nil
}

// runOne runs a command inside its own savepoint. Only a fault that poisons
// the transaction is returned as an error; the command's own failure is its
// reply.
func (a *writerActor) runOne(tx *Tx, cmd *Execute) (*Executed, error) {
	if err := a.control(savepoint); err != nil {
		return nil, fmt.Errorf("savepoint: %w", err)
	}
	hintMark, afterMark := len(tx.hints), len(tx.afterCommit)
	result, cmdErr := cmd.Run(tx)
	if cmdErr != nil {
		if a.deps.IsFatal(cmdErr) {
			return nil, fmt.Errorf("%s: %w", cmd.Name, cmdErr)
		}
		tx.hints, tx.afterCommit = tx.hints[:hintMark], tx.afterCommit[:afterMark]
		if err := a.control(rollbackTo); err != nil {
			return nil, fmt.Errorf("rollback to savepoint: %w", err)
		}
	}
	if err := a.control(release); err != nil {
		return nil, fmt.Errorf("release savepoint: %w", err)
	}
	return &Executed{Result: result, Err: cmdErr}, nil
}

// RequestMaintenance sends m to the writer at pid and waits for Run's
// error, for ctx, or for the writer to stop, whichever comes first.
func RequestMaintenance(ctx context.Context, root *actor.RootContext, pid *actor.PID, m *Maintain, done <-chan struct{}) error {
	reply := make(chan error, 1)
	m.Reply = reply
	root.Send(pid, m)
	err, waitErr := await(ctx, reply, done)
	if waitErr != nil {
		return waitErr
	}
	return err
}

// Request sends cmd to the writer at pid and waits for its reply, for ctx, or
// for the writer to stop (done closed), whichever comes first.
func Request(ctx context.Context, root *actor.RootContext, pid *actor.PID, cmd *Execute, done <-chan struct{}) (any, error) {
	if cmd.Ctx == nil {
		cmd.Ctx = ctx
	}
	reply := make(chan *Executed, 1)
	cmd.Reply = reply
	root.Send(pid, cmd)
	r, err := await(ctx, reply, done)
	if err != nil {
		return nil, err
	}
	return r.Result, r.Err
}

// await waits for a reply, for ctx, or for the writer to stop. A reply that
// has arrived always wins over ErrStopped and over ctx's end, whichever
// select picks: work the writer answered, committed work above all, is
// never reported as lost or abandoned.
func await[T any](ctx context.Context, reply <-chan T, done <-chan struct{}) (T, error) {
	var zero T
	select {
	case r := <-reply:
		return r, nil
	case <-done:
		if r, ok := ready(reply); ok {
			return r, nil
		}
		return zero, ErrStopped
	case <-ctx.Done():
		if r, ok := ready(reply); ok {
			return r, nil
		}
		return zero, ctx.Err()
	}
}

// ready returns the reply if it has arrived, without waiting.
func ready[T any](reply <-chan T) (T, bool) {
	select {
	case r := <-reply:
		return r, true
	default:
		var zero T
		return zero, false
	}
}
