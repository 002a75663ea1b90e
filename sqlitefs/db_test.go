package sqlitefs_test

import (
	"context"
	"database/sql"
	"errors"
	"github.com/mindroomd/mindroomd/journalsql"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mattn/go-sqlite3"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/migration"
	"github.com/mindroomd/mindroomd/sqlitefs"
	"github.com/mindroomd/mindroomd/walbuf"
)

// openDB opens the journal under dir and closes it when the test ends.
func openDB(t *testing.T, dir string) *sqlitefs.DB {
	t.Helper()
	db, err := sqlitefs.Open(context.Background(), sqlitefs.Options{StorageDir: dir})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// rawDB opens a file with the plain driver, as another program would.
func rawDB(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite3", path)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// pragmaInt reads one integer pragma through q.
func pragmaInt(t *testing.T, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, pragma string) int64 {
	t.Helper()
	var v int64
	if err := q.QueryRowContext(context.Background(), "PRAGMA "+pragma).Scan(&v); err != nil {
		t.Fatalf("PRAGMA %s: %v", pragma, err)
	}
	return v
}

func TestOpenCreatesAPrivateFile(t *testing.T) {
	dir := t.TempDir()
	db := openDB(t, dir)
	if got, want := db.Path, filepath.Join(dir, "tracking", "event_journal.db"); got != want {
		t.Fatalf("Path = %q, want %q", got, want)
	}
	if got, want := sqlitefs.Path(dir), db.Path; got != want {
		t.Fatalf("sqlitefs.Path = %q, want %q", got, want)
	}
	for path, want := range map[string]os.FileMode{
		db.Path:               0o600,
		db.Path + "-wal":      0o600,
		filepath.Dir(db.Path): 0o700 | os.ModeDir,
	} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatalf("stat: %v", err)
		}
		if got := fi.Mode() & (os.ModePerm | os.ModeDir); got != want {
			t.Fatalf("%s mode = %v, want %v", path, got, want)
		}
	}
}

func TestTheDefaultStorageDirectoryIsUnderTheWorkingDirectory(t *testing.T) {
	work := t.TempDir()
	t.Chdir(work)
	if got, want := sqlitefs.Path(""), filepath.Join(work, "mindroom_data", "tracking", "event_journal.db"); got != want {
		t.Fatalf("Path(\"\") = %q, want %q", got, want)
	}
}

func TestTheWriterConnectionIsDurable(t *testing.T) {
	db := openDB(t, t.TempDir())
	var mode string
	if err := db.WriterPool().QueryRowContext(context.Background(), "PRAGMA journal_mode").Scan(&mode); err != nil {
		t.Fatalf("PRAGMA journal_mode: %v", err)
	}
	if mode != "wal" {
		t.Fatalf("journal_mode = %q, want wal", mode)
	}
	for pragma, want := range map[string]int64{
		"synchronous":  2, // FULL
		"foreign_keys": 1,
		"busy_timeout": 10000,
		"query_only":   0,
		"page_size":    1024,
		// The automatic checkpoint and the truncation of a WAL that starts
		// over both sit at the WAL's bound.
		"wal_autocheckpoint": sqlitefs.DefaultWALBound / (1024 + 24),
		"journal_size_limit": sqlitefs.DefaultWALBound,
	} {
		if got := pragmaInt(t, db.WriterPool(), pragma); got != want {
			t.Fatalf("writer %s = %d, want %d", pragma, got, want)
		}
	}
	if got, want := db.WriterPool().Stats().MaxOpenConnections, 1; got != want {
		t.Fatalf("writer pool allows %d connections, want %d", got, want)
	}
}

func TestEveryReaderConnectionIsReadOnly(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, t.TempDir())
	// Hold every pooled connection at once so each one is checked, not
	// just whichever the pool hands out first.
	conns := make([]*sql.Conn, sqlitefs.DefaultReaders)
	for i := range conns {
		c, err := db.QueryPool().Conn(ctx)
		if err != nil {
			t.Fatalf("reader connection %d: %v", i, err)
		}
		defer c.Close()
		conns[i] = c
	}
	for i, c := range conns {
		for pragma, want := range map[string]int64{
			"query_only":   1,
			"synchronous":  1, // NORMAL
			"busy_timeout": 10000,
		} {
			if got := pragmaInt(t, c, pragma); got != want {
				t.Fatalf("reader %d %s = %d, want %d", i, pragma, got, want)
			}
		}
		_, err := c.ExecContext(ctx, `INSERT INTO store_meta (key, value) VALUES ('intruder', 'x')`)
		var se sqlite3.Error
		if !errors.As(err, &se) || se.Code != sqlite3.ErrReadonly {
			t.Fatalf("reader %d write error = %v, want SQLITE_READONLY", i, err)
		}
	}
	var n int
	if err := db.WriterPool().QueryRowContext(ctx, `SELECT count(*) FROM store_meta WHERE key = 'intruder'`).Scan(&n); err != nil {
		t.Fatalf("count: %v", err)
	}
	if n != 0 {
		t.Fatalf("a reader's write landed")
	}
}

func TestTheFileIsStampedAsAJournal(t *testing.T) {
	db := openDB(t, t.TempDir())
	if got, want := pragmaInt(t, db.WriterPool(), "application_id"), int64(sqlitefs.ApplicationID); got != want {
		t.Fatalf("application_id = %#x, want %#x", got, want)
	}
	if got, want := pragmaInt(t, db.WriterPool(), "user_version"), int64(sqlitefs.SchemaVersion()); got != want {
		t.Fatalf("user_version = %d, want %d", got, want)
	}
	if sqlitefs.SchemaVersion() < 1 {
		t.Fatalf("SchemaVersion = %d, want at least 1", sqlitefs.SchemaVersion())
	}
}

func TestANewerDatabaseIsRefused(t *testing.T) {
	dir := t.TempDir()
	db := openDB(t, dir)
	if err := db.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	newer := sqlitefs.SchemaVersion() + 1
	raw := rawDB(t, sqlitefs.Path(dir))
	if _, err := raw.Exec("PRAGMA user_version = " + strconv.Itoa(newer)); err != nil {
		t.Fatalf("set user_version: %v", err)
	}
	if err := raw.Close(); err != nil {
		t.Fatalf("close raw: %v", err)
	}

	db2, err := sqlitefs.Open(context.Background(), sqlitefs.Options{StorageDir: dir})
	if err == nil {
		db2.Close()
		t.Fatalf("Open accepted a database at schema version %d", newer)
	}
	var ne *migration.NewerDatabaseError
	if !errors.As(err, &ne) {
		t.Fatalf("error = %v, want a *NewerDatabaseError", err)
	}
	if ne.Version != newer || ne.Known != sqlitefs.SchemaVersion() {
		t.Fatalf("NewerDatabaseError = %+v, want version %d known %d", ne, newer, sqlitefs.SchemaVersion())
	}
}

func TestAForeignDatabaseIsRefused(t *testing.T) {
	for _, c := range []struct {
		name  string
		setup string
	}{
		{"AnotherApplicationsTables", `CREATE TABLE accounts (id INTEGER PRIMARY KEY, name TEXT)`},
		{"AnotherApplicationID", `PRAGMA application_id = 1234`},
		{"AnotherApplicationIDWithTables", `PRAGMA application_id = 1234; CREATE TABLE store_meta (key TEXT)`},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			path := sqlitefs.Path(dir)
			if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				t.Fatalf("mkdir: %v", err)
			}
			raw := rawDB(t, path)
			if _, err := raw.Exec(c.setup); err != nil {
				t.Fatalf("setup: %v", err)
			}
			before := schemaOf(t, raw)

			db, err := sqlitefs.Open(context.Background(), sqlitefs.Options{StorageDir: dir})
			if err == nil {
				db.Close()
				t.Fatalf("Open adopted a foreign database")
			}
			if !errors.Is(err, migration.ErrForeignDatabase) {
				t.Fatalf("error = %v, want ErrForeignDatabase", err)
			}
			// Refusing must leave the other program's file as it was.
			if after := schemaOf(t, raw); after != before {
				t.Fatalf("schema changed from %q to %q", before, after)
			}
		})
	}
}

// schemaOf summarises a file's identity and tables.
func schemaOf(t *testing.T, db *sql.DB) string {
	t.Helper()
	rows, err := db.Query(`SELECT name FROM sqlite_schema ORDER BY name`)
	if err != nil {
		t.Fatalf("read schema: %v", err)
	}
	defer rows.Close()
	var mode string
	if err := db.QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil {
		t.Fatalf("read journal_mode: %v", err)
	}
	out := "app=" + strconv.Itoa(int(pragmaInt(t, db, "application_id"))) + " version=" + strconv.Itoa(int(pragmaInt(t, db, "user_version"))) + " journal=" + mode
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatalf("scan: %v", err)
		}
		out += " " + name
	}
	return out
}

func TestReopeningKeepsTheJournal(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db := openDB(t, dir)
	gen, err := db.Generation(ctx)
	if err != nil {
		t.Fatalf("Generation: %v", err)
	}

	conn, err := db.WriterPool().Conn(ctx)
	if err != nil {
		t.Fatalf("conn: %v", err)
	}
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatalf("begin: %v", err)
	}
	wtx := db.WrapTx(conn, time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC), nil)
	p, err := journalsql.RegisterPrincipal(wtx, journal.Principal{Agent: "helper", UserID: "@bot:example.org"})
	if err != nil {
		t.Fatalf("RegisterPrincipal: %v", err)
	}
	ev := []byte(`{"event_id":"$m1","type":"m.room.message","sender":"@alice:example.org","origin_server_ts":1000,"content":{"msgtype":"m.text","body":"kept"}}`)
	in := []journal.Inbound{{RoomID: "!room:example.org", Provenance: journal.Live, Event: ev}}
	res, _, err := journalsql.AdmitBatch(wtx, p, journal.Parse(in, time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)), "s_1")
	if err != nil || len(res) != 1 || res[0].Outcome != journal.Admitted {
		t.Fatalf("AdmitBatch = %+v, %v; want one admitted event", res, err)
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		t.Fatalf("commit: %v", err)
	}
	if err := conn.Close(); err != nil {
		t.Fatalf("release conn: %v", err)
	}
	if err := db.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	db = openDB(t, dir)
	if got, err := db.Generation(ctx); err != nil || got != gen {
		t.Fatalf("generation after reopen = %q, %v; want %q", got, err, gen)
	}
	if got, want := pragmaInt(t, db.WriterPool(), "user_version"), int64(sqlitefs.SchemaVersion()); got != want {
		t.Fatalf("user_version after reopen = %d, want %d", got, want)
	}
	found, ok, err := journalsql.LookupPrincipal(ctx, db.Reader(), p.Principal)
	if err != nil || !ok || found.ID != p.ID {
		t.Fatalf("LookupPrincipal = %+v, %v, %v; want id %d", found, ok, err, p.ID)
	}
	if tok, err := journalsql.SyncToken(ctx, db.Reader(), found); err != nil || tok != "s_1" {
		t.Fatalf("SyncToken = %q, %v; want s_1", tok, err)
	}
	page, err := journalsql.Pending(ctx, db.Reader(), found, 10, 0)
	if err != nil {
		t.Fatalf("Pending: %v", err)
	}
	if len(page.Events) != 1 || page.Events[0].EventID != "$m1" {
		t.Fatalf("pending after reopen = %+v, want $m1", page.Events)
	}
}

// Test SQL: a table of filler, so a test can grow the WAL at will.
const (
	createBallast = `CREATE TABLE ballast (b BLOB)`
	insertBallast = `INSERT INTO ballast (b) VALUES (zeroblob(?))`
	insertMeta    = `INSERT INTO store_meta (key, value) VALUES (?, 'x')`
	beginRead     = `BEGIN`
	readMeta      = `SELECT count(*) FROM store_meta`
)

// walSize is the size of the journal's WAL file.
func walSize(t *testing.T, db *sqlitefs.DB) int64 {
	t.Helper()
	fi, err := os.Stat(db.Path + "-wal")
	if err != nil {
		t.Fatalf("stat WAL: %v", err)
	}
	return fi.Size()
}

// A reader that keeps one snapshot open lets the WAL grow past its bound,
// and while it reads, the WAL cannot start over. Once it is done, the WAL
// starts over and its first commit shrinks the file back to the bound.
func TestTheWALShrinksBackToItsBoundOnceReadersAllow(t *testing.T) {
	ctx := context.Background()
	const bound = 128 << 10
	db, err := sqlitefs.Open(ctx, sqlitefs.Options{StorageDir: t.TempDir(), WALBound: bound})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	for pragma, want := range map[string]int64{"journal_size_limit": bound, "wal_autocheckpoint": bound / (1024 + 24)} {
		if got := pragmaInt(t, db.WriterPool(), pragma); got != want {
			t.Fatalf("writer %s = %d, want %d for a bound of %d bytes", pragma, got, want, bound)
		}
	}
	w, err := db.WriterPool().Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	write := func(q string, args ...any) {
		t.Helper()
		if _, err := w.ExecContext(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}

	r, err := db.QueryPool().Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.ExecContext(ctx, beginRead); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := r.QueryRowContext(ctx, readMeta).Scan(&n); err != nil {
		t.Fatal(err)
	}
	write(createBallast)
	write(insertBallast, 4*bound)
	if got := walSize(t, db); got <= bound {
		t.Fatalf("the WAL is %d bytes after %d bytes of filler, want more than its bound %d", got, 4*bound, bound)
	}
	res, err := db.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !db.RestartDue(res) {
		t.Fatalf("a WAL of %d frames past its bound of %d bytes is not due to start over", res.LogFrames, bound)
	}
	res, err = sqlitefs.RestartWALOn(ctx, w)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Busy {
		t.Fatalf("the WAL started over under a reader's snapshot: %+v", res)
	}
	write(insertMeta, "beside the reader") // the writer waits no longer than the try
	if got := walSize(t, db); got <= bound {
		t.Fatalf("the WAL shrank to %d bytes under a reader's snapshot", got)
	}

	if _, err := r.ExecContext(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	res, err = sqlitefs.RestartWALOn(ctx, w)
	if err != nil {
		t.Fatal(err)
	}
	if res.Busy || res.Checkpointed != res.LogFrames {
		t.Fatalf("with no reader left the WAL did not start over: %+v", res)
	}
	write(insertMeta, "after the reader")
	if got := walSize(t, db); got > bound {
		t.Fatalf("the WAL is %d bytes after it started over, want at most its bound %d", got, bound)
	}
	if got := pragmaInt(t, w, "busy_timeout"); got != 10000 {
		t.Fatalf("the writer waits %d ms for locks after a restart, want its own 10000 back", got)
	}
}

// writesThroughWALBuffer reports whether a commit on db went through the
// gathering VFS: its counters are the process's, and no test of this
// package runs beside another.
func writesThroughWALBuffer(t *testing.T, db *sqlitefs.DB, key string) bool {
	t.Helper()
	before := walbuf.ReadStats().Received
	if _, err := db.WriterPool().ExecContext(context.Background(), insertMeta, key); err != nil {
		t.Fatalf("write: %v", err)
	}
	return walbuf.ReadStats().Received > before
}

func TestTheJournalOpensThroughSQLitesOwnVFSUnlessTheWALBufferIsAskedFor(t *testing.T) {
	ctx := context.Background()
	stock := openDB(t, t.TempDir())
	if writesThroughWALBuffer(t, stock, "stock") {
		t.Fatal("a journal opened with default options wrote its WAL through the gathering VFS")
	}
	buffered, err := sqlitefs.Open(ctx, sqlitefs.Options{StorageDir: t.TempDir(), WALBuffer: true})
	if err != nil {
		t.Fatalf("Open with the WAL buffer: %v", err)
	}
	t.Cleanup(func() { _ = buffered.Close() })
	if !writesThroughWALBuffer(t, buffered, "buffered") {
		t.Fatal("a journal opened with WALBuffer wrote its WAL past the gathering VFS")
	}
}

// The writer's lock is taken before any connection, so it keeps a second
// writer out whichever VFS each of them asks for.
func TestASecondWriterIsRefusedWhicheverVFSEitherUses(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name          string
		first, second bool
	}{
		{"StockThenBuffered", false, true},
		{"BufferedThenStock", true, false},
		{"BufferedThenBuffered", true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			first, err := sqlitefs.Open(ctx, sqlitefs.Options{StorageDir: dir, WALBuffer: c.first})
			if err != nil {
				t.Fatalf("first writer: %v", err)
			}
			defer first.Close()
			second, err := sqlitefs.Open(ctx, sqlitefs.Options{StorageDir: dir, WALBuffer: c.second})
			if err == nil {
				second.Close()
				t.Fatal("a second DB opened the journal for writing beside the first")
			}
			if !errors.Is(err, sqlitefs.ErrLocked) {
				t.Fatalf("second writer: %v, want ErrLocked", err)
			}
		})
	}
}

func TestOpeningMakesLooseStorageModesPrivate(t *testing.T) {
	dir := t.TempDir()
	path := sqlitefs.Path(dir)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{dir, filepath.Dir(path)} {
		if err := os.Chmod(name, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	db, err := sqlitefs.Open(context.Background(), sqlitefs.Options{StorageDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for name, want := range map[string]os.FileMode{dir: 0o700, filepath.Dir(path): 0o700, path: 0o600, path + ".lock": 0o600} {
		fi, err := os.Stat(name)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != want {
			t.Errorf("%s has mode %o, want %o", name, got, want)
		}
	}
}

// The writer names the maintenance it runs ("checkpoint"), so a checkpoint
// run on its connection reports its failure bare, not named a second time.
func TestACheckpointOnTheWritersConnectionLeavesItsErrorToBeNamedByTheWriter(t *testing.T) {
	db, err := sql.Open("sqlite3", filepath.Join(t.TempDir(), "x.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.Close()
	_, err = sqlitefs.CheckpointOn(context.Background(), conn)
	if err == nil {
		t.Fatal("a checkpoint on a closed connection succeeded")
	}
	if strings.Contains(err.Error(), "checkpoint") {
		t.Fatalf("the error names itself, so the writer's name would repeat it: %v", err)
	}
}
