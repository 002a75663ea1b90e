// Package writer is the actor that owns the only read-write connection to
// the journal database.
//
// It group-commits: every command queued when a batch opens joins one
// transaction, each command in its own savepoint, then one COMMIT (one fsync),
// and only then does every sender get its reply. Hints go out after the
// commit. A storage fault or a panic fails the whole batch and stops the
// writer for good; it is never restarted holding a leaked transaction.
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
	// commands it held (a checkpointer and metrics listen here).
	Committed func(commands int)
	// IsFatal reports storage errors that poison the transaction (disk full,
	// I/O error, corruption). Such an error stops the writer.
	IsFatal func(error) bool
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
	replies, tx, err := a.run(batch)
	if err != nil {
		a.failed = &FatalError{Err: err}
		a.deps.Log.Error().Err(err).Int("commands", len(batch)).Msg("Batch failed; stopping the writer")
		for _, q := range batch {
			q.answer(ctx, &Executed{Err: a.failed})
		}
		ctx.Stop(ctx.Self())
		return
	}
	for _, f := range tx.afterCommit {
		f()
	}
	for i, q := range batch {
		q.answer(ctx, replies[i])
	}
	if len(tx.hints) > 0 && a.deps.Publish != nil {
		a.deps.Publish(tx.hints)
	}
	if a.deps.Committed != nil {
		a.deps.Committed(len(batch))
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

// run executes one batch in one transaction. A returned error is fatal: the
// transaction was rolled back and no command of the batch took effect.
//
// The writer drives BEGIN and COMMIT itself on a connection it holds for its
// whole life rather than through *sql.Tx: database/sql starts a goroutine
// for every query inside an *sql.Tx, and admission runs several queries per
// event.
func (a *writerActor) run(batch []queued) (replies []*Executed, committed *Tx, err error) {
	if err := a.connect(); err != nil {
		return nil, nil, err
	}
	if err := a.control(beginImmediate); err != nil {
		return nil, nil, fmt.Errorf("begin: %w", err)
	}
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

// await waits for a reply, for ctx, or for the writer to stop. A reply sent
// before the writer stopped is always preferred over ErrStopped, so work the
// writer answered is never reported as lost.
func await[T any](ctx context.Context, reply <-chan T, done <-chan struct{}) (T, error) {
	var zero T
	select {
	case r := <-reply:
		return r, nil
	case <-done:
		select {
		case r := <-reply:
			return r, nil
		default:
			return zero, ErrStopped
		}
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}
