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
	"strconv"
	"time"

	"github.com/mattn/go-sqlite3"

	"github.com/mindroomd/mindroomd/migration"
)

// Errors of the read-only handle.
var (
	// ErrReadOnly reports a write asked of a DB from OpenReadOnly.
	ErrReadOnly = errors.New("journal is open read-only")
	// ErrNoJournal reports a storage directory without a journal file.
	ErrNoJournal = errors.New("no journal")
	// ErrSharedMemory reports a journal that cannot be read without files
	// SQLite must create beside it: a WAL-mode file is read through its
	// -shm and -wal files, which a daemon that stopped cleanly removed, and
	// a read-only connection may create them, but not in a directory it
	// cannot write.
	ErrSharedMemory = errors.New("cannot read the journal: SQLite must create its -shm and -wal files " +
		"beside it and this user cannot write that directory; run this as the daemon's user")
)

// OpenReadOnly opens the journal under opts.StorageDir for operator
// commands while a daemon may be writing it. It opens the file mode=ro with
// query_only, through SQLite's own VFS whatever opts.WALBuffer says (the
// writer's choice does not bind a reader), never creates, migrates or
// locks it, and never waits for the writer: it refuses a schema older or
// newer than this binary's rather than misread it. The DB it returns
// answers the reader queries (Status, Generation, Read, Pending, ...); its
// Writer and its checkpoints refuse every connection with ErrReadOnly.
//
// SQLite cannot interrupt its wait for a lock, so each read-only
// connection is opened for one call and waits no longer than that call's
// context deadline: a call cut short by its deadline fails with
// context.DeadlineExceeded, even when SQLite reports the lock.
func OpenReadOnly(ctx context.Context, opts Options) (_ *DB, err error) {
	path := Path(opts.StorageDir)
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("%w at %s: %w", ErrNoJournal, path, err)
	}
	db := &DB{Path: path, budget: opts.PageBudget, maxUnmerged: int64(opts.MaxUnmergedTail),
		writer: sql.OpenDB(readOnlyWriter{}), checkpointer: sql.OpenDB(readOnlyWriter{})}
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
	db.readers = sql.OpenDB(&readOnlyConnector{path: path, drv: &sqlite3.SQLiteDriver{}})
	db.readers.SetMaxOpenConns(n)
	// No connection outlives its call, so each one's wait for locks is set
	// from the deadline of the call that opened it.
	db.readers.SetMaxIdleConns(0)
	found, err := readSchema(ctx, db.readers)
	if err != nil {
		return nil, readOnlyErr(ctx, path, err)
	}
	if err := migration.Check(found, SchemaVersion(), migration.ReadOnly); err != nil {
		return nil, err
	}
	if db.pageHead, err = db.readers.PrepareContext(ctx, PageQueryHead); err != nil {
		return nil, fmt.Errorf("prepare page query: %w", readOnlyErr(ctx, path, err))
	}
	if db.pageAfter, err = db.readers.PrepareContext(ctx, PageQueryAfter); err != nil {
		return nil, fmt.Errorf("prepare page query: %w", readOnlyErr(ctx, path, err))
	}
	return db, nil
}

// readOnlyWriter is the connector of a read-only DB's writer: it refuses
// every connection, so each write path fails with ErrReadOnly.
type readOnlyWriter struct{}

// Connect implements driver.Connector.
func (readOnlyWriter) Connect(context.Context) (driver.Conn, error) { return nil, ErrReadOnly }

// Driver implements driver.Connector.
func (w readOnlyWriter) Driver() driver.Driver { return w }

// Open implements driver.Driver.
func (readOnlyWriter) Open(string) (driver.Conn, error) { return nil, ErrReadOnly }

// readOnlyConnector opens read-only connections, each for the call that
// needs it: it waits for locks no longer than that call's deadline.
type readOnlyConnector struct {
	path string
	drv  *sqlite3.SQLiteDriver
}

// Connect implements driver.Connector. The driver sets the wait before it
// runs statements of its own at open, one of which reads the schema.
func (c *readOnlyConnector) Connect(ctx context.Context) (driver.Conn, error) {
	return openConn(c.drv, readOnlyDSN(c.path, busyWithin(ctx)), connectReadOnly)
}

// Driver implements driver.Connector.
func (c *readOnlyConnector) Driver() driver.Driver { return c.drv }

// readOnlyDSN names the file for a read-only connection that waits up to
// busyMS for a lock. It opens through SQLite's own VFS whatever the writer
// uses: the gathering VFS passes reads on unchanged, and a mode=ro
// connection never writes the WAL, so the writer's counts of what reached
// it stay whole. Opens of either VFS share the unix VFS's file locks,
// which the gathering one passes straight through.
func readOnlyDSN(path string, busyMS int64) string {
	return fileURI(path, url.Values{"mode": {"ro"}, "_busy_timeout": {strconv.FormatInt(busyMS, 10)}})
}

// connectReadOnly sets up a read-only connection. It leaves the journal
// mode alone: a read-only connection cannot change it, and the writer set
// it.
func connectReadOnly(c *sqlite3.SQLiteConn) error {
	for _, p := range []string{pragmaQueryOnly, pragmaCacheSize, pragmaTempMemory, pragmaMmapSize} {
		if _, err := c.Exec(p, nil); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	return nil
}

// busyWithin is how many milliseconds a connection opened for ctx may wait
// for a lock: the usual wait, cut to what is left before ctx's deadline.
func busyWithin(ctx context.Context) int64 {
	ms := int64(busyTimeoutMS)
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		ms = min(ms, max(0, (left+time.Millisecond-1).Milliseconds()))
	}
	return ms
}

// readOnlyErr explains the failures a read-only open can meet.
func readOnlyErr(ctx context.Context, path string, err error) error {
	if err = deadlineErr(ctx, err); errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	// Which code says so depends on how the directory refuses: a file
	// system that refuses everyone (the immutable attribute) fails the
	// open, permissions fail the write SQLite then tries.
	var se sqlite3.Error
	if errors.As(err, &se) && (se.Code == sqlite3.ErrCantOpen || se.Code == sqlite3.ErrReadonly) {
		if _, statErr := os.Stat(path + "-shm"); errors.Is(statErr, fs.ErrNotExist) {
			return fmt.Errorf("%w: %w", ErrSharedMemory, err)
		}
	}
	return err
}

// deadlineErr is a reader's error in the journal's vocabulary (mapErr),
// and reports a failure that came once ctx's deadline had passed as the
// deadline it is: a connection opened for ctx gives up waiting for a lock
// at the deadline, and SQLite then reports the lock, not the deadline.
func deadlineErr(ctx context.Context, err error) error {
	if err == nil || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	err = mapErr(err)
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return fmt.Errorf("%w: %w", context.DeadlineExceeded, err)
	}
	return err
}
