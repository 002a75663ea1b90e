// Package store is the embeddable journal on either backend: the SQLite
// file, whose writer actor owns its only read-write connection and
// group-commits every principal's commands, or a PostgreSQL database,
// where each command is a transaction under its principal's row lock. It
// hands out principal-bound views. No operational method takes a
// principal ID: the view supplies it, so one agent cannot read or settle
// another's rows.
package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/actors"
	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/journalsql"
	"github.com/mindroomd/mindroomd/pgfs"
	"github.com/mindroomd/mindroomd/sqlitefs"
	"github.com/mindroomd/mindroomd/store/writer"
)

// DefaultMaxOutstanding bounds the write commands in flight at once. The
// writer's mailbox is unbounded (a bounded protoactor mailbox spins its
// senders and can deadlock the writer's own flush), so the bound lives here,
// at the senders.
const DefaultMaxOutstanding = 4096

// ErrUnknownPrincipal reports, on a read-only journal, a principal the
// journal never registered.
var ErrUnknownPrincipal = errors.New("the journal has no such principal")

// Options configure Open.
type Options struct {
	// StorageDir is the storage root (default ./mindroom_data); the SQLite
	// journal is <StorageDir>/tracking/event_journal.db.
	StorageDir string
	// DatabaseURL, when set, selects the journal in PostgreSQL at this
	// connection string instead of the SQLite file. It usually holds a
	// password: it is never logged, and errors do not repeat it.
	DatabaseURL string
	// ReadOnly opens the journal for reading alone, as status and an
	// offline export do: nothing is migrated or written (on SQLite not
	// even the WAL), a journal of another schema version is refused, and a
	// principal the journal never saw is ErrUnknownPrincipal.
	ReadOnly bool
	// MaxConns bounds the PostgreSQL pool (default pgfs.DefaultMaxConns).
	MaxConns int32
	// PGMaxGroup bounds the commands of one principal a PostgreSQL
	// transaction gathers (default pgfs.MaxGroup); 1 commits every command
	// alone.
	PGMaxGroup int
	// Replica, set on PostgreSQL, makes the store one replica of several
	// under this name: it writes for a principal only while it holds the
	// principal's lease (pgfs.Store.TryLease).
	Replica string
	// Takeover bounds how long a stalled replica keeps its leases
	// (default pgfs.DefaultTakeover).
	Takeover time.Duration
	// LeaseCheck is how often a replica checks its leases' connections
	// (default Takeover/5).
	LeaseCheck time.Duration
	// ListenHeartbeat is how long PostgreSQL's hint listener waits without
	// a notification before it pings its connection (default
	// pgfs.DefaultListenHeartbeat).
	ListenHeartbeat time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Log receives the store's logs (default: discarded).
	Log zerolog.Logger
	// System is the actor system to run the writer in; a private one is
	// created when nil.
	System *actor.ActorSystem
	// Hints receives after-commit wake-ups; a private bus when nil.
	Hints *hint.Bus
	// MaxOutstanding bounds concurrent write commands (default
	// DefaultMaxOutstanding).
	MaxOutstanding int
	// MaxBatch and MaxBatchBytes cap one group commit (writer defaults when
	// zero).
	MaxBatch      int
	MaxBatchBytes int
	// Readers is the reader pool size (default sqlitefs.DefaultReaders).
	Readers int
	// CheckpointInterval spaces WAL checkpoints while commits keep coming
	// and the writer has time (default sqlitefs.DefaultCheckpointInterval);
	// beside a saturated writer they come every
	// sqlitefs.SaturatedCheckpointInterval. It is also the pause between
	// the chunks of a merge cycle, so each chunk's pages are copied by a
	// checkpoint of their own.
	CheckpointInterval time.Duration
	// PageBudget bounds one conversation page's memory (default 16 MiB
	// stored, 64 MiB estimated decoded).
	PageBudget journal.PageBudget
	// MaxUnmergedTail is how many new visible rows may wait outside the
	// page index before admission merges them inline (default
	// sqlitefs.DefaultMaxUnmergedTail).
	MaxUnmergedTail int
	// WALBound is the size in bytes the checkpoints hold the WAL file to
	// while readers allow (default sqlitefs.DefaultWALBound).
	WALBound int64
	// WALBuffer opens the journal through the gathering VFS (package
	// walbuf) instead of SQLite's own; see sqlitefs.Options.WALBuffer and
	// docs/VFS.md. Off by default.
	WALBuffer bool
	// MergeDelay is how long after a commit a merge cycle moves the page
	// index's unmerged tail into it (default DefaultMergeDelay); a tail
	// half MaxUnmergedTail starts one at once.
	MergeDelay time.Duration
	// OnBusy, when set, is called each time the writer finds the journal's
	// write lock still held by another connection (a sqlite3 shell, a
	// backup tool) after the busy timeout, with how long its batch has
	// waited so far. The writer logs the wait and keeps retrying; a metric
	// can count here. It runs on the writer: it must not block.
	OnBusy func(waited time.Duration)
	// OnCommit, when set, learns of every commit: how many commands it held
	// and how long its transaction took (metrics listen here).
	OnCommit func(commands int, took time.Duration)

	// afterMergeCycle, when set, runs after each background merge cycle
	// that did not fail, with whether it finished, so a test can wait for
	// one.
	afterMergeCycle func(finished bool)
}

// Store is an open journal. It implements journal.Store.
type Store struct {
	b        backend
	readOnly bool
	pg       *pgfs.Store // the PostgreSQL journal; nil on SQLite
	onCommit func(commands int, took time.Duration)
	db       *sqlitefs.DB // the SQLite journal; nil on PostgreSQL
	system   *actor.ActorSystem
	writer   *actor.PID
	hints    *hint.Bus
	log      zerolog.Logger
	now      func() time.Time
	sem      chan struct{}

	afterMergeCycle func(finished bool)

	commits chan struct{} // signalled after each commit, for the checkpointer
	merges  chan struct{} // signalled after each commit, for the page merger

	// The background work (checkpoints, merges) runs until stopBackground
	// cancels its context; background counts its goroutines. The writer is
	// not background work: it stops on its own signal, after them.
	stopBackground context.CancelFunc
	background     sync.WaitGroup

	done      chan struct{} // closed when the writer has stopped
	closing   chan struct{} // closed when Close begins, so a busy wait gives up
	fatalMu   sync.Mutex
	fatal     error
	closeOnce sync.Once
	closeErr  error
}

var _ journal.Store = (*Store)(nil)

// Open opens the journal opts select: PostgreSQL when DatabaseURL is
// set, the SQLite file under StorageDir otherwise, whose writer it starts.
func Open(ctx context.Context, opts Options) (*Store, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Hints == nil {
		opts.Hints = &hint.Bus{}
	}
	switch {
	case opts.DatabaseURL != "":
		return openPostgres(ctx, opts)
	case opts.ReadOnly:
		return openSQLiteReadOnly(ctx, opts)
	}
	return openSQLite(ctx, opts)
}

// openPostgres opens the journal in PostgreSQL.
func openPostgres(ctx context.Context, opts Options) (*Store, error) {
	pg, err := pgfs.Open(ctx, pgfs.Options{URL: opts.DatabaseURL, Now: opts.Now, Log: opts.Log, Hints: opts.Hints,
		MaxConns: opts.MaxConns, PageBudget: opts.PageBudget, ReadOnly: opts.ReadOnly, ListenHeartbeat: opts.ListenHeartbeat,
		MaxGroup: opts.PGMaxGroup, Leases: opts.Replica != "", Replica: opts.Replica, Takeover: opts.Takeover,
		LeaseCheck: opts.LeaseCheck})
	if err != nil {
		return nil, err
	}
	s := &Store{b: pg, pg: pg, readOnly: opts.ReadOnly, hints: opts.Hints, log: opts.Log, now: opts.Now,
		done: make(chan struct{})}
	return s, nil
}

// openSQLiteReadOnly opens the SQLite journal for reading alone: no
// writer, no background work.
func openSQLiteReadOnly(ctx context.Context, opts Options) (*Store, error) {
	db, err := sqlitefs.OpenReadOnly(ctx, sqlitefs.Options{StorageDir: opts.StorageDir, Readers: opts.Readers,
		PageBudget: opts.PageBudget})
	if err != nil {
		return nil, err
	}
	s := &Store{db: db, readOnly: true, hints: opts.Hints, log: opts.Log, now: opts.Now, done: make(chan struct{})}
	s.b = sqliteBackend{s}
	return s, nil
}

// openSQLite opens the SQLite journal and starts its writer.
func openSQLite(ctx context.Context, opts Options) (*Store, error) {
	if opts.MaxOutstanding <= 0 {
		opts.MaxOutstanding = DefaultMaxOutstanding
	}
	db, err := sqlitefs.Open(ctx, sqlitefs.Options{StorageDir: opts.StorageDir, Readers: opts.Readers,
		PageBudget: opts.PageBudget, MaxUnmergedTail: opts.MaxUnmergedTail, WALBound: opts.WALBound,
		WALBuffer: opts.WALBuffer})
	if err != nil {
		return nil, fmt.Errorf("open journal: %w", err)
	}
	s := &Store{
		db:      db,
		system:  opts.System,
		hints:   opts.Hints,
		log:     opts.Log,
		now:     opts.Now,
		sem:     make(chan struct{}, opts.MaxOutstanding),
		done:    make(chan struct{}),
		closing: make(chan struct{}),

		afterMergeCycle: opts.afterMergeCycle,
		onCommit:        opts.OnCommit,

		commits: make(chan struct{}, 1),
		merges:  make(chan struct{}, 1),
	}
	s.b = sqliteBackend{s}
	if s.system == nil {
		s.system = actors.NewSystem(opts.Log)
	}
	props := writer.Props(writer.Deps{
		DB:            db.WriterPool(),
		Now:           opts.Now,
		Log:           opts.Log.With().Str("actor", "writer").Logger(),
		Publish:       s.hints.Publish,
		IsFatal:       sqlitefs.IsFatal,
		IsBusy:        sqlitefs.IsBusy,
		OnBusy:        opts.OnBusy,
		Closing:       s.closing,
		OnStopped:     s.writerStopped,
		Committed:     s.committed,
		MaxBatch:      opts.MaxBatch,
		MaxBatchBytes: opts.MaxBatchBytes,
	})
	s.writer = s.system.Root.Spawn(props)
	var bg context.Context
	bg, s.stopBackground = context.WithCancel(context.Background())
	s.background.Go(func() {
		s.runMerges(bg, opts.MergeDelay, checkpointInterval(opts.CheckpointInterval))
	})
	s.background.Go(func() { s.runCheckpoints(bg, opts.CheckpointInterval) })
	if db.Unmerged() > 0 {
		s.nudgeMerges() // a tail left by the last process merges soon, not at the next commit
	}
	return s, nil
}

func (s *Store) committed(commands int, took time.Duration) {
	if s.onCommit != nil {
		s.onCommit(commands, took)
	}
	select {
	case s.commits <- struct{}{}:
	default: // a checkpoint is already due
	}
	s.nudgeMerges()
}

// nudgeMerges tells the merger there may be a tail to merge.
func (s *Store) nudgeMerges() {
	select {
	case s.merges <- struct{}{}:
	default: // a merge is already due
	}
}

func (s *Store) writerStopped(err error) {
	s.fatalMu.Lock()
	s.fatal = err
	s.fatalMu.Unlock()
	close(s.done)
}

// Fatal returns the fault that stopped the writer, if any. A daemon exits
// non-zero when it is set.
func (s *Store) Fatal() error {
	s.fatalMu.Lock()
	defer s.fatalMu.Unlock()
	return s.fatal
}

// Done is closed once the journal stopped taking writes: after Close, or
// on SQLite when a fatal fault stopped the writer (Fatal says which). A
// PostgreSQL journal has no single writer to lose: each command reports
// its own error and the pool replaces a lost connection.
func (s *Store) Done() <-chan struct{} { return s.done }

// Backlogs reads what every principal still owes, cheaply enough for each
// metrics scrape.
func (s *Store) Backlogs(ctx context.Context) ([]journal.Backlog, error) {
	return journalsql.Backlogs(ctx, s.b.Reader())
}

// Status summarises every principal, for the status command.
func (s *Store) Status(ctx context.Context) ([]journal.PrincipalStatus, error) {
	return journalsql.Status(ctx, s.b.Reader())
}

// Kind names the backend: "postgresql" or "sqlite".
func (s *Store) Kind() string {
	if s.pg != nil {
		return "postgresql"
	}
	return "sqlite"
}

// Postgres exposes the PostgreSQL layer for operational tools; nil on
// SQLite.
func (s *Store) Postgres() *pgfs.Store { return s.pg }

// Hints returns the bus after-commit wake-ups are published on.
func (s *Store) Hints() *hint.Bus { return s.hints }

// DB exposes the SQLite layer for benchmarks and operational tools; nil
// on PostgreSQL.
func (s *Store) DB() *sqlitefs.DB { return s.db }

// Close stops the background work and waits for it, stops accepting
// commands, lets the writer commit everything already queued, checkpoints
// the WAL into the file unless a fault stopped the writer, then closes the
// database. It is safe to call more than once.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		if s.writer == nil {
			// PostgreSQL, or SQLite read-only: every command that
			// returned has committed, and nothing runs in the background.
			if s.pg != nil {
				s.closeErr = s.pg.Close()
			} else {
				s.closeErr = s.db.Close()
			}
			close(s.done)
			return
		}
		// The background work goes first: it sends the writer work.
		s.stopBackground()
		s.background.Wait()
		// Poison is queued behind every command already sent, so those
		// commit first; the writer's stop flushes whatever batch is open.
		// If another connection holds the write lock meanwhile, a batch
		// gives up after one more busy timeout rather than hold Close for
		// as long as that lock lasts.
		close(s.closing)
		s.system.Root.Poison(s.writer)
		<-s.done
		if s.Fatal() == nil {
			// Leave the file whole and the WAL empty for the next open.
			if _, err := s.db.TruncateWAL(context.Background()); err != nil {
				s.log.Warn().Err(err).Msg("Final checkpoint failed")
			}
		}
		s.closeErr = s.db.Close()
		if f := s.Fatal(); f != nil && s.closeErr == nil {
			s.closeErr = f
		}
	})
	return s.closeErr
}

// exec runs one command through the writer and waits for its commit.
func (s *Store) exec(ctx context.Context, name string, size int, run writer.Command) (any, error) {
	if s.readOnly {
		return nil, sqlitefs.ErrReadOnly
	}
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.done:
		return nil, s.stoppedErr()
	}
	defer func() { <-s.sem }()
	res, err := writer.Request(ctx, s.system.Root, s.writer, &writer.Execute{Name: name, Size: size, Run: run}, s.done)
	if errors.Is(err, writer.ErrStopped) {
		return nil, s.stoppedErr()
	}
	return res, err
}

// command runs a sqlitefs command of the store's own (not a principal's)
// through the writer and returns its result.
func command[T any](ctx context.Context, s *Store, name string, run func(tx *sqlitefs.Tx) (T, error)) (T, error) {
	res, err := s.exec(ctx, name, 0, func(t *writer.Tx) (any, error) { return run(s.tx(t)) })
	if err != nil {
		var zero T
		return zero, err
	}
	return res.(T), nil
}

func (s *Store) stoppedErr() error {
	if f := s.Fatal(); f != nil {
		return f
	}
	return journal.ErrClosed
}

// tx adapts the writer's transaction for sqlitefs commands, once per
// transaction so its commands share the statements bound to it.
func (s *Store) tx(t *writer.Tx) *sqlitefs.Tx {
	if tx, ok := t.Local.(*sqlitefs.Tx); ok {
		return tx
	}
	tx := s.db.WrapTx(t.Conn(), t.Now, t.AfterCommit)
	t.Local = tx
	return tx
}

// Generation identifies this database.
func (s *Store) Generation(ctx context.Context) (string, error) {
	if s.pg != nil {
		return s.pg.Generation(ctx)
	}
	return s.db.Generation(ctx)
}

// Principal returns the view bound to (agent, userID), registering the
// principal on first use.
func (s *Store) Principal(ctx context.Context, agent, userID string) (journal.PrincipalStore, error) {
	jp, err := journal.NewPrincipal(agent, userID)
	if err != nil {
		return nil, err
	}
	var p journalsql.Principal
	if s.readOnly {
		var ok bool
		p, ok, err = journalsql.LookupPrincipal(ctx, s.b.Reader(), jp)
		if err == nil && !ok {
			err = fmt.Errorf("%w: %s", ErrUnknownPrincipal, jp)
		}
	} else {
		p, err = s.b.Register(ctx, jp)
	}
	if err != nil {
		return nil, err
	}
	return newView(s.b, p, s.hints, s.now), nil
}

// PrincipalID is the journal's row ID of a principal, registering it
// first when the journal never saw it.
func (s *Store) PrincipalID(ctx context.Context, agent, userID string) (int64, error) {
	jp, err := journal.NewPrincipal(agent, userID)
	if err != nil {
		return 0, err
	}
	p, err := s.b.Register(ctx, jp)
	return p.ID, err
}

// sqliteBackend is the journal in its SQLite file: writes group-commit
// through the writer actor, reads run on the reader pool.
type sqliteBackend struct{ s *Store }

var _ backend = sqliteBackend{}

// Writer implements backend.
func (b sqliteBackend) Writer(journalsql.Principal) journalsql.Writer { return sqliteWriter(b) }

// Reader implements backend.
func (b sqliteBackend) Reader() journalsql.Reader { return b.s.db.Reader() }

// Read implements backend.
func (b sqliteBackend) Read(ctx context.Context, p journalsql.Principal, req journal.ReadRequest) (journal.Page, error) {
	return b.s.db.Read(ctx, p, req)
}

// LatestVisibleEventID implements backend.
func (b sqliteBackend) LatestVisibleEventID(ctx context.Context, p journalsql.Principal, room string, thread *string) (string, bool, error) {
	return b.s.db.LatestVisibleEventID(ctx, p, room, thread)
}

// Register implements backend: a principal already registered is found by
// a reader, without a write.
func (b sqliteBackend) Register(ctx context.Context, jp journal.Principal) (journalsql.Principal, error) {
	p, ok, err := journalsql.LookupPrincipal(ctx, b.Reader(), jp)
	if err != nil || ok {
		return p, err
	}
	return command(ctx, b.s, "register_principal", func(tx *sqlitefs.Tx) (journalsql.Principal, error) {
		return journalsql.RegisterPrincipal(tx, jp)
	})
}

// sqliteWriter gathers every principal's commands into the writer's group
// commits: each command runs in its own savepoint of a shared transaction.
type sqliteWriter struct{ s *Store }

// Do implements journalsql.Writer.
func (w sqliteWriter) Do(ctx context.Context, name string, size int, run func(journalsql.Tx) ([]hint.Hint, error)) error {
	_, err := w.s.exec(ctx, name, size, func(t *writer.Tx) (any, error) {
		hints, err := run(w.s.tx(t))
		if err != nil {
			return nil, err
		}
		for _, h := range hints {
			t.Hint(h)
		}
		return nil, nil
	})
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}
