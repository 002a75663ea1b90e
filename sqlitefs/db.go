// Package sqlitefs is the SQLite layout of the journal: the file, its
// connections, its embedded migrations, every SQL statement as a constant,
// the write commands as functions over a transaction, and the reader queries.
//
// The writer connection is single (the writer actor owns it): WAL,
// synchronous=FULL, foreign keys on, BEGIN IMMEDIATE. Readers are a separate
// pool with query_only and synchronous=NORMAL. Pragmas are applied per
// connection as it connects, never through a pool.
//
// One process writes the file: Open holds an exclusive lock beside it for
// as long as the DB is open, and a second Open fails with ErrLocked,
// whichever VFS either of them uses. The writer caches what it committed
// (room keys, epochs, the unmerged tail's size) on the strength of that, as
// does the gathering VFS (package walbuf) when Options.WALBuffer asks for
// it. Operator commands read through OpenReadOnly, which takes no lock and
// never writes.
package sqlitefs

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mattn/go-sqlite3"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/journalsql"
	"github.com/mindroomd/mindroomd/walbuf"
)

// Layout under the storage directory.
const (
	trackingDir = "tracking"
	fileName    = "event_journal.db"
)

// busyTimeoutMS is how long a connection waits for a lock held by another
// connection (or process) before reporting SQLITE_BUSY.
const busyTimeoutMS = 10000

// DefaultReaders is the reader pool size when Options.Readers is zero.
const DefaultReaders = 4

// Connection pragmas. Values are fixed fragments, never caller input.
const (
	pragmaPageSize    = `PRAGMA page_size = 1024`
	pragmaJournalWAL  = `PRAGMA journal_mode = WAL`
	pragmaSyncFull    = `PRAGMA synchronous = FULL`
	pragmaSyncNormal  = `PRAGMA synchronous = NORMAL`
	pragmaForeignKeys = `PRAGMA foreign_keys = ON`
	pragmaBusyTimeout = `PRAGMA busy_timeout = 10000`
	pragmaQueryOnly   = `PRAGMA query_only = ON`
	queryPageSize     = `PRAGMA page_size`
	// The writer's automatic checkpoint is only the backstop that bounds the
	// WAL; checkpoints between batches (checkpoint.go) do the copying. It
	// starts at the WAL bound, in frames.
	pragmaAutocheckpt = `PRAGMA wal_autocheckpoint = `
	// A WAL that starts over keeps its file at the size it grew to unless
	// its first commit truncates it; this is the size it truncates to, the
	// WAL bound in bytes.
	pragmaJournalSizeLimit = `PRAGMA journal_size_limit = `
	pragmaCacheSize        = `PRAGMA cache_size = -262144`
	// The writer's cache stays small. Its reads of unchanged pages go
	// through the memory map, so the cache mostly holds pages it changed
	// recently. And SQLite walks the whole page-cache hash at the end of
	// every write transaction that split a B-tree page (balance_nonroot
	// parks a page at the 1 GiB lock-byte page number, which COMMIT then
	// truncates away): with a cache of hundreds of MiB that walk was a
	// large share of the writer's time (bench/README.md, rejected designs).
	pragmaWriterCache = `PRAGMA cache_size = -4096`
	pragmaTempMemory  = `PRAGMA temp_store = MEMORY`
	// Reading pages through a memory map skips a pread syscall per page,
	// which dominates B-tree descents into a cold cache.
	pragmaMmapSize      = `PRAGMA mmap_size = 1073741824`
	walRetryAttempts    = 50
	walRetryBackoffBase = 20 * time.Millisecond
)

// DefaultWALBound is the WAL size, in bytes, when Options.WALBound is zero.
const DefaultWALBound = 64 << 20

// walFrameHeader is the bytes each WAL frame adds to its page.
const walFrameHeader = 24

// connector opens the connections of one pool, each set up by setup before
// the pool sees it. A connector rather than a registered driver, so each
// database's setup can carry its own options.
type connector struct {
	dsn   string
	drv   *sqlite3.SQLiteDriver
	setup func(c *sqlite3.SQLiteConn) error
}

// openPool returns a pool on dsn whose connections setup prepares.
func openPool(dsn string, setup func(c *sqlite3.SQLiteConn) error) *sql.DB {
	return sql.OpenDB(&connector{dsn: dsn, drv: &sqlite3.SQLiteDriver{}, setup: setup})
}

// Connect implements driver.Connector.
func (c *connector) Connect(context.Context) (driver.Conn, error) {
	return openConn(c.drv, c.dsn, c.setup)
}

// Driver implements driver.Connector.
func (c *connector) Driver() driver.Driver { return c.drv }

// openConn opens one connection on dsn and sets it up.
func openConn(drv *sqlite3.SQLiteDriver, dsn string, setup func(c *sqlite3.SQLiteConn) error) (driver.Conn, error) {
	dc, err := drv.Open(dsn)
	if err != nil {
		return nil, err
	}
	if err := setup(dc.(*sqlite3.SQLiteConn)); err != nil {
		_ = dc.Close()
		return nil, err
	}
	return dc, nil
}

// writerSetup prepares the writer's connection and the checkpointer's for
// a WAL bound of walBound bytes.
func writerSetup(walBound int64) func(*sqlite3.SQLiteConn) error {
	return func(c *sqlite3.SQLiteConn) error { return connectWriter(c, walBound) }
}

func connectWriter(c *sqlite3.SQLiteConn, walBound int64) error {
	if err := c.RegisterFunc(idHashFunc, IDHash, true); err != nil {
		return fmt.Errorf("register %s: %w", idHashFunc, err)
	}
	// page_size only takes effect on a new file, and only before WAL is set:
	// small pages cut the WAL bytes each scattered index update costs.
	// auto_vacuum too takes effect only before the first table (reclaim.go).
	for _, p := range []string{pragmaBusyTimeout, pragmaPageSize, pragmaAutoVacuumIncremental} {
		if _, err := c.Exec(p, nil); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	if err := enableWAL(c); err != nil {
		return err
	}
	pageSize, err := pragmaText(c, queryPageSize)
	if err != nil {
		return fmt.Errorf("%s: %w", queryPageSize, err)
	}
	size, err := strconv.ParseInt(pageSize, 10, 64)
	if err != nil {
		return fmt.Errorf("%s: %w", queryPageSize, err)
	}
	// Pragma values cannot be bound; these are integers computed here.
	bound := []string{
		pragmaAutocheckpt + strconv.FormatInt(max(1, walBound/(size+walFrameHeader)), 10),
		pragmaJournalSizeLimit + strconv.FormatInt(walBound, 10),
	}
	for _, p := range append([]string{pragmaSyncFull, pragmaForeignKeys, pragmaWriterCache, pragmaTempMemory, pragmaMmapSize}, bound...) {
		if _, err := c.Exec(p, nil); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	return nil
}

func connectReader(c *sqlite3.SQLiteConn) error {
	for _, p := range []string{pragmaBusyTimeout, pragmaSyncNormal, pragmaQueryOnly, pragmaCacheSize, pragmaTempMemory, pragmaMmapSize} {
		if _, err := c.Exec(p, nil); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	return nil
}

// enableWAL switches the file to WAL and checks the answer. Changing the
// journal mode does not use the busy handler, so SQLITE_BUSY is retried here.
func enableWAL(c *sqlite3.SQLiteConn) error {
	var lastErr error
	for attempt := 0; attempt < walRetryAttempts; attempt++ {
		mode, err := pragmaText(c, pragmaJournalWAL)
		if err == nil {
			if mode != "wal" {
				return fmt.Errorf("journal_mode: got %q, want wal", mode)
			}
			return nil
		}
		lastErr = err
		if !IsBusy(err) {
			break
		}
		time.Sleep(walRetryBackoffBase)
	}
	return fmt.Errorf("set journal_mode=wal: %w", lastErr)
}

func pragmaText(c *sqlite3.SQLiteConn, q string) (string, error) {
	rows, err := c.Query(q, nil)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	dest := make([]driver.Value, len(rows.Columns()))
	if err := rows.Next(dest); err != nil {
		return "", err
	}
	switch v := dest[0].(type) {
	case string:
		return v, nil
	case []byte:
		return string(v), nil
	default:
		return fmt.Sprint(v), nil
	}
}

// Options configure Open.
type Options struct {
	// StorageDir is the storage root; the file lives at
	// <StorageDir>/tracking/event_journal.db. Default ./mindroom_data.
	StorageDir string
	// Readers is the reader pool size; default DefaultReaders.
	Readers int
	// PageBudget bounds the memory of one conversation page; zero limits
	// mean journal.PageStoredBudget and journal.PageDecodedBudget.
	PageBudget journal.PageBudget
	// MaxUnmergedTail is how many visible rows may wait outside the page
	// index before admission merges them inline; default
	// DefaultMaxUnmergedTail. A reader scans at most about this many rows
	// besides its page.
	MaxUnmergedTail int
	// WALBound is the size in bytes the WAL file is held to; default
	// DefaultWALBound. The writer's automatic checkpoint starts there, a
	// WAL that starts over is truncated back to it, and the background
	// checkpointer starts the WAL over (RestartWALOn) once it holds half of
	// it. Only a reader that keeps one snapshot open stops the WAL from
	// starting over, and so lets it grow past the bound.
	WALBound int64
	// WALBuffer opens every connection through the gathering VFS (package
	// walbuf) instead of SQLite's own: a commit reaches the WAL in one
	// write, and a WAL sync with nothing to make durable is skipped. It
	// pays off only at admission rates far above a chat's, and its
	// reasoning rests on this process being the file's only writer;
	// docs/VFS.md gives its invariants and limits. Off by default.
	WALBuffer bool
}

// DB is an open journal file: the single writer connection (for the writer
// actor) and the reader pool.
type DB struct {
	// Path is the database file.
	Path string
	// writer is the read-write pool, capped at one connection; readers is
	// the query_only pool.
	writer, readers *sql.DB
	// checkpointer copies the WAL back into the file beside the writer
	// when the writer is too busy to do it between batches.
	checkpointer *sql.DB

	// budget is the template each page's budget starts from.
	budget journal.PageBudget
	// pageHead and pageAfter are the hot page queries, prepared once on the
	// reader pool.
	pageHead, pageAfter *sql.Stmt

	// unmerged estimates the page index's unmerged tail (pageindex.go);
	// maxUnmerged is where admission merges it inline.
	unmerged    atomic.Int64
	maxUnmerged int64
	// mergedIn is the transaction whose inline merge last reset unmerged,
	// until that transaction commits the merge (pageindex.go).
	mergedIn *Tx

	// rooms caches each admitted-to room's key and membership epoch as
	// committed (journal.go, roomOf). Only the writer's goroutine touches
	// it: commands and their after-commit work run there one at a time.
	// It assumes this process is the file's only writer, as everything
	// else here does; lock enforces that.
	rooms map[roomName]journalsql.RoomRef

	// lock is held for as long as the DB is open for writing (lock.go);
	// nil for a read-only DB.
	lock *os.File
	// restartFrames is the WAL size, in frames, from which the WAL is due
	// to start over (RestartDue).
	restartFrames int

	// stmts are the writer's statements, prepared on stmtConn, its
	// connection.
	stmtMu   sync.Mutex
	stmtConn *sql.Conn
	stmts    map[string]*sql.Stmt
}

// WriterPool is the read-write pool of one connection. The writer actor
// is its only user: every write goes through it, so that one connection,
// and one transaction at a time, writes the journal.
func (db *DB) WriterPool() *sql.DB { return db.writer }

// QueryPool is the query_only pool, for operational tools and benchmarks
// that read the tables directly; nothing can write through it.
func (db *DB) QueryPool() *sql.DB { return db.readers }

// Path returns the absolute journal file path under a storage directory.
func Path(storageDir string) string {
	if storageDir == "" {
		storageDir = journal.DefaultStorageDir
	}
	path := filepath.Join(storageDir, trackingDir, fileName)
	// Absolute, so the URI that names it for SQLite (fileURI) has no
	// authority; the working directory only fails to resolve if it was
	// removed, and then the open fails with a clear error of its own.
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	return path
}

// keepPrivate gives the storage directories and the journal's files the
// modes they are created with, should they exist with looser ones (made by
// hand, restored from a backup, or by an older release): the journal holds
// every conversation an agent saw.
func keepPrivate(path string) error {
	tracking := filepath.Dir(path)
	for name, mode := range map[string]os.FileMode{
		filepath.Dir(tracking): 0o700, tracking: 0o700,
		path: 0o600, path + "-wal": 0o600, path + "-shm": 0o600, path + lockSuffix: 0o600,
	} {
		if err := os.Chmod(name, mode); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("make %s private: %w", name, err)
		}
	}
	return nil
}

// Open opens (creating if needed) the journal under opts.StorageDir for
// writing, applies pending migrations, and refuses a database written by a
// newer binary or by another application. It fails with ErrLocked while
// another DB has the journal open for writing, in this process or another.
func Open(ctx context.Context, opts Options) (_ *DB, err error) {
	if opts.WALBuffer {
		if err := walbuf.Register(); err != nil {
			return nil, err
		}
	}
	path := Path(opts.StorageDir)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create storage directory: %w", err)
	}
	if err := keepPrivate(path); err != nil {
		return nil, err
	}
	// The lock comes before any connection, through either VFS, so a
	// second writer is refused before it can touch the file.
	lock, err := lockWriter(path)
	if err != nil {
		return nil, err
	}
	walBound := opts.WALBound
	if walBound <= 0 {
		walBound = DefaultWALBound
	}
	db := &DB{Path: path, stmts: make(map[string]*sql.Stmt), budget: opts.PageBudget, maxUnmerged: int64(opts.MaxUnmergedTail),
		rooms: make(map[roomName]journalsql.RoomRef), lock: lock}
	if db.maxUnmerged <= 0 {
		db.maxUnmerged = DefaultMaxUnmergedTail
	}
	defer func() {
		if err != nil {
			_ = db.Close()
		}
	}()
	// Create the file ourselves so it is private from the first byte; SQLite
	// gives its -wal and -shm files the same mode.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create journal file: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("create journal file: %w", err)
	}

	n := opts.Readers
	if n <= 0 {
		n = DefaultReaders
	}
	db.readers = openPool(dsn(path, false, opts.WALBuffer), connectReader)
	db.readers.SetMaxOpenConns(n)
	db.readers.SetMaxIdleConns(n)
	version, err := identify(ctx, db.readers)
	if err != nil {
		return nil, err
	}
	db.writer = openPool(dsn(path, true, opts.WALBuffer), writerSetup(walBound))
	db.writer.SetMaxOpenConns(1)
	db.writer.SetMaxIdleConns(1)
	db.writer.SetConnMaxLifetime(0)
	db.writer.SetConnMaxIdleTime(0)
	if err := db.writer.PingContext(ctx); err != nil {
		return nil, fmt.Errorf("open writer: %w", err)
	}
	if err := migrate(ctx, db.writer, version); err != nil {
		return nil, err
	}
	if err := mintGeneration(ctx, db.writer); err != nil {
		return nil, err
	}
	var pageSize int
	if err := db.writer.QueryRowContext(ctx, queryPageSize).Scan(&pageSize); err != nil {
		return nil, fmt.Errorf("read page size: %w", err)
	}
	db.restartFrames = int(walBound / 2 / int64(pageSize+walFrameHeader))

	if err := db.readers.PingContext(ctx); err != nil {
		return nil, fmt.Errorf("open readers: %w", err)
	}
	db.checkpointer = openPool(dsn(path, false, opts.WALBuffer), writerSetup(walBound))
	db.checkpointer.SetMaxOpenConns(1)
	if err := db.countTail(ctx); err != nil {
		return nil, err
	}
	if db.pageHead, err = db.readers.PrepareContext(ctx, PageQueryHead); err != nil {
		return nil, fmt.Errorf("prepare page query: %w", err)
	}
	if db.pageAfter, err = db.readers.PrepareContext(ctx, PageQueryAfter); err != nil {
		return nil, fmt.Errorf("prepare page query: %w", err)
	}
	return db, nil
}

// dsn names the file for the driver, through SQLite's own VFS unless
// walBuffer is set. With it, every connection of the DB opens the file
// through the gathering VFS, readers too: its sync counts hold only if
// every write of this process goes through it, and whichever connection
// closes last, a reader among them, checkpoints the file and removes the
// WAL. Only connections that append frames use its buffer.
func dsn(path string, writer, walBuffer bool) string {
	q := url.Values{}
	if walBuffer {
		q.Set("vfs", walbuf.Name)
	}
	if writer {
		q.Set("_txlock", "immediate")
	}
	return fileURI(path, q)
}

// fileURI names path as a SQLite file: URI with query q. The path must be
// absolute (Path makes it so): a relative one would put its first segment
// in the URI's authority, which SQLite refuses. url.URL escapes what a URI
// gives a meaning to (space, ?, #, %), and SQLite decodes it again.
func fileURI(path string, q url.Values) string {
	u := url.URL{Scheme: "file", Path: filepath.ToSlash(path), RawQuery: q.Encode()}
	return u.String()
}

// Close closes the pools and releases the writer's lock. The writer actor
// must have stopped first.
func (db *DB) Close() error {
	var err error
	db.stmtMu.Lock()
	for _, s := range db.stmts {
		if e := s.Close(); e != nil && err == nil {
			err = e
		}
	}
	db.stmts = nil
	db.stmtMu.Unlock()
	for _, s := range []*sql.Stmt{db.pageHead, db.pageAfter} {
		if s == nil {
			continue
		}
		if e := s.Close(); e != nil && err == nil {
			err = e
		}
	}
	for _, p := range []*sql.DB{db.readers, db.checkpointer, db.writer} {
		if p == nil {
			continue
		}
		if e := p.Close(); e != nil && err == nil {
			err = e
		}
	}
	// Last, once nothing of this DB can write any more.
	if db.lock != nil {
		if e := db.lock.Close(); e != nil && err == nil {
			err = e
		}
		db.lock = nil
	}
	return err
}
