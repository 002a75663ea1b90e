// Package sqlitefs is the SQLite layout of the journal: the file, its
// connections, its embedded migrations, every SQL statement as a constant,
// the write commands as functions over a transaction, and the reader queries.
//
// The writer connection is single (the writer actor owns it): WAL,
// synchronous=FULL, foreign keys on, BEGIN IMMEDIATE. Readers are a separate
// pool with query_only and synchronous=NORMAL. Pragmas are applied per
// connection in the driver's connect hook, never through a pool.
package sqlitefs

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mattn/go-sqlite3"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/walbuf"
)

// Driver names registered by this package.
const (
	writerDriver = "mindroomd_sqlite_writer"
	readerDriver = "mindroomd_sqlite_reader"
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
	// The writer's automatic checkpoint is only the backstop that bounds the
	// WAL; checkpoints between batches (checkpoint.go) do the copying.
	pragmaAutocheckpt = `PRAGMA wal_autocheckpoint = 65536`
	pragmaCacheSize   = `PRAGMA cache_size = -262144`
	// The writer's cache stays small. Its reads of unchanged pages go
	// through the memory map, so the cache mostly holds pages it changed
	// recently. And SQLite walks the whole page-cache hash at the end of
	// every write transaction that split a B-tree page (balance_nonroot
	// parks a page at the 1 GiB lock-byte page number, which COMMIT then
	// truncates away): with 256 MiB of 1 KiB pages that walk was a fifth
	// of the writer's time.
	pragmaWriterCache = `PRAGMA cache_size = -4096`
	pragmaTempMemory  = `PRAGMA temp_store = MEMORY`
	// Reading pages through a memory map skips a pread syscall per page,
	// which dominates B-tree descents into a cold cache.
	pragmaMmapSize      = `PRAGMA mmap_size = 1073741824`
	walRetryAttempts    = 50
	walRetryBackoffBase = 20 * time.Millisecond
)

func init() {
	sql.Register(writerDriver, &sqlite3.SQLiteDriver{ConnectHook: connectWriter})
	sql.Register(readerDriver, &sqlite3.SQLiteDriver{ConnectHook: connectReader})
}

func connectWriter(c *sqlite3.SQLiteConn) error {
	if err := c.RegisterFunc(idHashFunc, IDHash, true); err != nil {
		return fmt.Errorf("register %s: %w", idHashFunc, err)
	}
	// page_size only takes effect on a new file, and only before WAL is set:
	// small pages cut the WAL bytes each scattered index update costs.
	for _, p := range []string{pragmaBusyTimeout, pragmaPageSize} {
		if _, err := c.Exec(p, nil); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	if err := enableWAL(c); err != nil {
		return err
	}
	for _, p := range []string{pragmaSyncFull, pragmaForeignKeys, pragmaAutocheckpt, pragmaWriterCache, pragmaTempMemory, pragmaMmapSize} {
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
		var se sqlite3.Error
		if !errors.As(err, &se) || (se.Code != sqlite3.ErrBusy && se.Code != sqlite3.ErrLocked) {
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
}

// DB is an open journal file: the single writer connection (for the writer
// actor) and the reader pool.
type DB struct {
	// Path is the database file.
	Path string
	// Writer is the read-write pool, capped at one connection.
	Writer *sql.DB
	// Readers is the query_only pool.
	Readers *sql.DB
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

	// rooms caches each admitted-to room's key and membership epoch as
	// committed (journal.go, roomOf). Only the writer's goroutine touches
	// it: commands and their after-commit work run there one at a time.
	// It assumes this process is the file's only writer, as everything
	// else here does.
	rooms map[roomName]roomRef

	// stmts are the writer's statements, prepared on stmtConn, its
	// connection.
	stmtMu   sync.Mutex
	stmtConn *sql.Conn
	stmts    map[string]*sql.Stmt
}

// Path returns the journal file path under a storage directory.
func Path(storageDir string) string {
	if storageDir == "" {
		storageDir = "mindroom_data"
	}
	return filepath.Join(storageDir, trackingDir, fileName)
}

// Open opens (creating if needed) the journal under opts.StorageDir, applies
// pending migrations, and refuses a database written by a newer binary or by
// another application.
func Open(ctx context.Context, opts Options) (_ *DB, err error) {
	if err := walbuf.Register(); err != nil {
		return nil, err
	}
	path := Path(opts.StorageDir)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create storage directory: %w", err)
	}
	// Create the file ourselves so it is private from the first byte; SQLite
	// gives its -wal and -shm files the same mode.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create journal file: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("create journal file: %w", err)
	}

	db := &DB{Path: path, stmts: make(map[string]*sql.Stmt), budget: opts.PageBudget, maxUnmerged: int64(opts.MaxUnmergedTail),
		rooms: make(map[roomName]roomRef)}
	if db.maxUnmerged <= 0 {
		db.maxUnmerged = DefaultMaxUnmergedTail
	}
	defer func() {
		if err != nil {
			_ = db.Close()
		}
	}()
	n := opts.Readers
	if n <= 0 {
		n = DefaultReaders
	}
	if db.Readers, err = sql.Open(readerDriver, dsn(path, false)); err != nil {
		return nil, fmt.Errorf("open readers: %w", err)
	}
	db.Readers.SetMaxOpenConns(n)
	db.Readers.SetMaxIdleConns(n)
	version, err := identify(ctx, db.Readers)
	if err != nil {
		return nil, err
	}
	if db.Writer, err = sql.Open(writerDriver, dsn(path, true)); err != nil {
		return nil, fmt.Errorf("open writer: %w", err)
	}
	db.Writer.SetMaxOpenConns(1)
	db.Writer.SetMaxIdleConns(1)
	db.Writer.SetConnMaxLifetime(0)
	db.Writer.SetConnMaxIdleTime(0)
	if err := db.Writer.PingContext(ctx); err != nil {
		return nil, fmt.Errorf("open writer: %w", err)
	}
	if err := migrate(ctx, db.Writer, version); err != nil {
		return nil, err
	}
	if err := mintGeneration(ctx, db.Writer); err != nil {
		return nil, err
	}

	if err := db.Readers.PingContext(ctx); err != nil {
		return nil, fmt.Errorf("open readers: %w", err)
	}
	if db.checkpointer, err = sql.Open(writerDriver, dsn(path, false)); err != nil {
		return nil, fmt.Errorf("open checkpointer: %w", err)
	}
	db.checkpointer.SetMaxOpenConns(1)
	if err := db.countTail(ctx); err != nil {
		return nil, err
	}
	if db.pageHead, err = db.Readers.PrepareContext(ctx, PageQueryHead); err != nil {
		return nil, fmt.Errorf("prepare page query: %w", err)
	}
	if db.pageAfter, err = db.Readers.PrepareContext(ctx, PageQueryAfter); err != nil {
		return nil, fmt.Errorf("prepare page query: %w", err)
	}
	return db, nil
}

// dsn names the file for the driver. Every connection opens it through the
// gathering VFS (package walbuf); only connections that write use its buffer.
func dsn(path string, writer bool) string {
	q := url.Values{"vfs": {walbuf.Name}}
	if writer {
		q.Set("_txlock", "immediate")
	}
	u := url.URL{Scheme: "file", Path: path, RawQuery: q.Encode()}
	return u.String()
}

// Close closes both pools. The writer actor must have stopped first.
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
	for _, p := range []*sql.DB{db.Readers, db.checkpointer, db.Writer} {
		if p == nil {
			continue
		}
		if e := p.Close(); e != nil && err == nil {
			err = e
		}
	}
	return err
}
