// Package pgfs is the journal on PostgreSQL: the same commands and reader
// queries as sqlitefs, in PostgreSQL's SQL, deciding nothing itself (the
// rules live in package journal). There is no single writer: a write
// transaction locks its principal's row first, so one principal's writes
// commit in the order their positions were taken while different
// principals write in parallel. After-commit hints travel over
// LISTEN/NOTIFY, so a reader in another process wakes too.
package pgfs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/journalsql"
	"github.com/mindroomd/mindroomd/migration"
)

const (
	insertGeneration = `INSERT INTO store_meta (key, value) VALUES ('generation', $1) ON CONFLICT (key) DO NOTHING`
	selectGeneration = `SELECT value FROM store_meta WHERE key = 'generation'`
	// lockPrincipal serializes a principal's write transactions and reads
	// the lease generation a replica will check before it commits.
	lockPrincipal = `SELECT lease_generation FROM principals WHERE id = $1 FOR UPDATE`
)

// DefaultMaxConns is the pool size when Options.MaxConns is zero.
const DefaultMaxConns = 16

// DefaultListenHeartbeat is the hint listener's heartbeat when
// Options.ListenHeartbeat is zero.
const DefaultListenHeartbeat = 30 * time.Second

// Errors of the storage boundary.
var (
	// ErrNoJournal reports a database (or schema) holding no journal yet.
	ErrNoJournal = errors.New("no mindroomd journal in this database")
)

// Options configure Open.
type Options struct {
	// URL is the connection string. It usually holds a password: it is
	// never logged, and errors from connecting do not repeat it.
	URL string
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Log receives the store's logs (default: discarded).
	Log zerolog.Logger
	// Hints receives after-commit wake-ups, this process's and other
	// processes' alike; a private bus when nil.
	Hints *hint.Bus
	// MaxConns bounds the pool (default DefaultMaxConns).
	MaxConns int32
	// PageBudget bounds the memory of one conversation page; zero limits
	// take the journal's defaults.
	PageBudget journal.PageBudget
	// ListenHeartbeat is how long the hint listener waits without a
	// notification before it pings its connection (default
	// DefaultListenHeartbeat). A ping unanswered within the same interval,
	// and at most 5 s, drops the connection as lost, so a connection gone
	// half-open (a NAT timeout, a vanished server or proxy) delays hints
	// by a heartbeat and a ping, not for ever.
	ListenHeartbeat time.Duration
	// ReadOnly opens the journal for reading alone, as status and an
	// offline export do: nothing is migrated or written, no listener
	// starts, and a journal of another schema version is refused.
	ReadOnly bool
	// MaxGroup bounds the commands of one principal a transaction gathers
	// (group.go); zero means MaxGroup, 1 commits every command alone.
	MaxGroup int
	// Leases makes the store one replica of several (lease.go): it writes
	// for a principal only while it holds the principal's lease.
	Leases bool
	// LeaseCheck is how often a held lease's connection is checked
	// (default Takeover/5).
	LeaseCheck time.Duration
	// Replica names this replica in the principals' lease holders and
	// among the replicas' heartbeats.
	Replica string
	// Takeover bounds how long a stalled replica keeps its leases
	// (default DefaultTakeover): the server ends a lease's connection left
	// idle for half of it, and a transaction left idle as long, so a
	// replica paused or cut off loses its locks, and its row locks, in
	// time for another to take its principals within Takeover.
	Takeover time.Duration
}

// Store is an open journal on PostgreSQL. It implements journal.Store.
type Store struct {
	pool       *pgxpool.Pool
	now        func() time.Time
	log        zerolog.Logger
	hints      *hint.Bus
	generation string
	// origin tells this store's notifications from other processes'.
	origin   string
	readOnly bool
	budget   journal.PageBudget
	// heartbeat is the listener's idle time before a ping.
	heartbeat time.Duration

	stopListen context.CancelFunc
	listening  sync.WaitGroup
	closeOnce  sync.Once
	// queues are the principals' waiting commands (group.go), by row ID;
	// maxGroup the most one transaction gathers.
	queues   sync.Map
	maxGroup int
	// leasing is set for a replica of several; leases holds the
	// generation of each principal whose lease this replica holds, by row
	// ID, and leaseConfig is how a lease's own connection is opened.
	leasing     bool
	leases      sync.Map
	leaseConfig *pgx.ConnConfig
	leaseCheck  time.Duration
	replica     string
	takeover    time.Duration
	// fenced counts the writes checkLease refused.
	fenced atomic.Int64
	// presence is the connection this replica beats on, holding its
	// presence lock (replicas.go); nil before the first beat and after it
	// failed.
	presenceMu sync.Mutex
	presence   *pgx.Conn
}

// Open connects, migrates the schema and starts the hint listener.
func Open(ctx context.Context, opts Options) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(opts.URL)
	if err != nil {
		// pgx's parse errors quote the string; this one must not.
		return nil, errors.New("open journal: the database URL does not parse")
	}
	cfg.MaxConns = opts.MaxConns
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	s := &Store{now: opts.Now, log: opts.Log, hints: opts.Hints, readOnly: opts.ReadOnly, budget: opts.PageBudget, origin: uuid.NewString(),
		heartbeat: opts.ListenHeartbeat}
	if s.heartbeat <= 0 {
		s.heartbeat = DefaultListenHeartbeat
	}
	if s.maxGroup = opts.MaxGroup; s.maxGroup <= 0 {
		s.maxGroup = MaxGroup
	}
	s.leasing, s.leaseCheck, s.replica, s.takeover = opts.Leases, opts.LeaseCheck, opts.Replica, opts.Takeover
	if s.takeover <= 0 {
		s.takeover = DefaultTakeover
	}
	if s.leaseCheck <= 0 {
		s.leaseCheck = s.takeover / 5
	}
	if s.leasing {
		// The server's limit outlasts two checks, or a replica that checks
		// seldom would lose a lease it keeps alive.
		idle := strconv.FormatInt(max(s.takeover/2, 2*s.leaseCheck).Milliseconds(), 10)
		cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = strconv.FormatInt((s.takeover / 2).Milliseconds(), 10)
		s.leaseConfig = cfg.ConnConfig.Copy()
		s.leaseConfig.RuntimeParams["idle_session_timeout"] = idle
		// An operator, or a replica taking a stalled one's leases, tells a
		// replica's leases apart in pg_stat_activity.
		s.leaseConfig.RuntimeParams["application_name"] = leaseApplication + s.replica
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.hints == nil {
		s.hints = &hint.Bus{}
	}
	if opts.ReadOnly {
		// PostgreSQL itself refuses every write of such a session.
		cfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	}
	if s.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, fmt.Errorf("open journal: %w", redact(err))
	}
	if err := s.pool.Ping(ctx); err != nil {
		s.pool.Close()
		return nil, fmt.Errorf("open journal: %w", redact(err))
	}
	if opts.ReadOnly {
		if err := s.openReadOnly(ctx); err != nil {
			s.pool.Close()
			return nil, fmt.Errorf("open journal: %w", err)
		}
		return s, nil
	}
	if err := migrate(ctx, s.pool); err != nil {
		s.pool.Close()
		return nil, fmt.Errorf("open journal: %w", err)
	}
	if s.generation, err = mintGeneration(ctx, s.pool); err != nil {
		s.pool.Close()
		return nil, fmt.Errorf("open journal: %w", err)
	}
	lconf := cfg.ConnConfig.Copy()
	conn, err := listenConn(ctx, lconf)
	if err != nil {
		s.pool.Close()
		return nil, fmt.Errorf("open journal: listen for hints: %w", err)
	}
	lctx, stop := context.WithCancel(context.Background())
	s.stopListen = stop
	s.listening.Add(1)
	go func() {
		defer s.listening.Done()
		s.listen(lctx, lconf, conn)
	}()
	return s, nil
}

// openReadOnly checks the journal is one this binary reads as it stands
// and reads its generation.
func (s *Store) openReadOnly(ctx context.Context) error {
	found, err := readSchema(ctx, s.pool)
	if err != nil {
		return err
	}
	if found.Version == 0 && !found.Tables {
		return ErrNoJournal
	}
	if err := migration.Check(found, SchemaVersion(), migration.ReadOnly); err != nil {
		return err
	}
	if err := s.pool.QueryRow(ctx, selectGeneration).Scan(&s.generation); err != nil {
		return fmt.Errorf("read generation: %w", err)
	}
	s.stopListen = func() {}
	return nil
}

func mintGeneration(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	if _, err := pool.Exec(ctx, insertGeneration, uuid.NewString()); err != nil {
		return "", fmt.Errorf("mint generation: %w", err)
	}
	var g string
	if err := pool.QueryRow(ctx, selectGeneration).Scan(&g); err != nil {
		return "", fmt.Errorf("read generation: %w", err)
	}
	return g, nil
}

// Generation implements journal.Store.
func (s *Store) Generation(context.Context) (string, error) { return s.generation, nil }

// Hints returns the bus on which every commit to this database is
// published, whichever process made it.
func (s *Store) Hints() *hint.Bus { return s.hints }

// Close stops the listener and closes the pool. Every command that
// returned has committed.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.presenceMu.Lock()
		if s.presence != nil {
			_ = s.presence.Close(context.Background())
			s.presence = nil
		}
		s.presenceMu.Unlock()
		s.stopListen()
		s.listening.Wait()
		s.pool.Close()
	})
	return nil
}

// Tx is a write transaction as the commands in this package see it: one
// principal's, with its row locked, and the command's time.
type Tx struct {
	ctx context.Context
	tx  pgx.Tx
	now time.Time
}

func (t *Tx) exec(query string, args ...any) (pgconn.CommandTag, error) {
	tag, err := t.tx.Exec(t.ctx, query, args...)
	return tag, mapErr(err)
}

func (t *Tx) query(query string, args ...any) (pgx.Rows, error) {
	rows, err := t.tx.Query(t.ctx, query, args...)
	return rows, mapErr(err)
}

func (t *Tx) queryRow(query string, args ...any) pgx.Row { return t.tx.QueryRow(t.ctx, query, args...) }

// nowMS is the command's time in integer milliseconds, the stored form.
func (t *Tx) nowMS() int64 { return t.now.UnixMilli() }

// Retries of a transaction PostgreSQL aborted to break a deadlock or a
// serialization conflict: the command is run again from the start.
const maxAttempts = 5

// writeOnce runs one command of principal in its own transaction, after
// locking the principal's row, and queues its hints as notifications that
// PostgreSQL delivers on commit.
func (s *Store) writeOnce(ctx context.Context, principal int64, run func(journalsql.Tx) ([]hint.Hint, error)) ([]hint.Hint, error) {
	var hints []hint.Hint
	err := s.transaction(ctx, principal, func(t *Tx) (err error) {
		if hints, err = run(t); err != nil {
			return err
		}
		return s.notify(t, hints)
	})
	return hints, err
}

// transaction runs work in one transaction that first locks principal's
// row, and commits it when work succeeds.
func (s *Store) transaction(ctx context.Context, principal int64, work func(*Tx) error) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return redact(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	var lease int64
	if err := tx.QueryRow(ctx, lockPrincipal, principal).Scan(&lease); err != nil {
		return fmt.Errorf("lock principal: %w", err)
	}
	if err := s.checkLease(principal, lease); err != nil {
		return err
	}
	if err := work(&Tx{ctx: ctx, tx: tx, now: s.now()}); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return mapErr(err)
	}
	return nil
}

// retryable reports the aborts PostgreSQL asks a client to retry.
func retryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01")
}

// PostgreSQL's SQLSTATEs that mapErr names.
const (
	sqlstateUniqueViolation = "23505"
	sqlstateDataCorrupted   = "XX001"
	sqlstateIndexCorrupted  = "XX002"
)

// mapErr translates PostgreSQL's SQLSTATEs into the journal's error
// vocabulary at this boundary, by code and never by message text: a
// unique violation is journal.ErrConflict, data or an index the server
// finds corrupted is journal.ErrCorrupt. The server's error stays wrapped.
func mapErr(err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || errors.Is(err, journal.ErrConflict) || errors.Is(err, journal.ErrCorrupt) {
		return err
	}
	switch pe.Code {
	case sqlstateUniqueViolation:
		return fmt.Errorf("%w: %w", journal.ErrConflict, err)
	case sqlstateDataCorrupted, sqlstateIndexCorrupted:
		return fmt.Errorf("%w: %w", journal.ErrCorrupt, err)
	}
	return err
}

// redact keeps connection errors from repeating the connection string:
// pgx's connect errors name the host and user, never the password, but a
// parse error would quote it, so only the server's own error passes.
func redact(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return err
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return fmt.Errorf("connect to the database: %w", errors.Unwrap(ce))
	}
	return err
}
