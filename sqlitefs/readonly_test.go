package sqlitefs_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"github.com/mindroomd/mindroomd/journalsql"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/mattn/go-sqlite3"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/migration"
	"github.com/mindroomd/mindroomd/sqlitefs"
)

// closedJournal makes a journal under a fresh directory, with one admitted
// event, and closes it, leaving only its file.
func closedJournal(t *testing.T) (dir string, p journalsql.Principal) {
	t.Helper()
	ctx := context.Background()
	dir = t.TempDir()
	db := openDB(t, dir)
	conn, err := db.WriterPool().Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	wtx := db.WrapTx(conn, now, nil)
	if p, err = journalsql.RegisterPrincipal(wtx, journal.Principal{Agent: "helper", UserID: "@bot:example.org"}); err != nil {
		t.Fatal(err)
	}
	ev := []byte(`{"event_id":"$m1","type":"m.room.message","sender":"@alice:example.org","origin_server_ts":1000,"content":{"msgtype":"m.text","body":"hi"}}`)
	in := []journal.Inbound{{RoomID: "!room:example.org", Provenance: journal.Live, Event: ev}}
	if _, _, err := journalsql.AdmitBatch(wtx, p, journal.Parse(in, now), "s_1"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	return dir, p
}

// openRO opens the journal under dir read-only and closes it when the test
// ends.
func openRO(t *testing.T, dir string) *sqlitefs.DB {
	t.Helper()
	db, err := sqlitefs.OpenReadOnly(context.Background(), sqlitefs.Options{StorageDir: dir})
	if err != nil {
		t.Fatalf("OpenReadOnly: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Reading the journal with every reader query leaves its file byte for
// byte as it was, generation and all.
func TestAReadOnlyOpenLeavesTheFileAsItWas(t *testing.T) {
	ctx := context.Background()
	dir, p := closedJournal(t)
	path := sqlitefs.Path(dir)
	before := mustRead(t, path)

	db := openRO(t, dir)
	st, err := journalsql.Status(ctx, db.Reader())
	if err != nil || len(st) != 1 || st[0].Events != 1 {
		t.Fatalf("Status = %+v, %v; want one principal with one event", st, err)
	}
	if _, err := db.Generation(ctx); err != nil {
		t.Fatal(err)
	}
	page, err := db.Read(ctx, p, journal.ReadRequest{RoomID: "!room:example.org", Limit: 10})
	if err != nil || len(page.Messages) != 1 {
		t.Fatalf("Read = %+v, %v; want the one message", page, err)
	}
	pending, err := journalsql.Pending(ctx, db.Reader(), p, 10, 0)
	if err != nil || len(pending.Events) != 1 {
		t.Fatalf("Pending = %+v, %v; want the one event", pending, err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if after := mustRead(t, path); !bytes.Equal(before, after) {
		t.Fatal("a read-only open changed the journal file")
	}
}

// Every way to write through a read-only DB fails with ErrReadOnly, and
// its reader connections refuse writes in SQLite itself.
func TestAReadOnlyDBRefusesEveryWrite(t *testing.T) {
	ctx := context.Background()
	dir, _ := closedJournal(t)
	db := openRO(t, dir)
	if _, err := db.WriterPool().Conn(ctx); !errors.Is(err, sqlitefs.ErrReadOnly) {
		t.Fatalf("writer connection: %v, want ErrReadOnly", err)
	}
	if _, err := db.Checkpoint(ctx); !errors.Is(err, sqlitefs.ErrReadOnly) {
		t.Fatalf("Checkpoint: %v, want ErrReadOnly", err)
	}
	if _, err := db.TruncateWAL(ctx); !errors.Is(err, sqlitefs.ErrReadOnly) {
		t.Fatalf("TruncateWAL: %v, want ErrReadOnly", err)
	}
	_, err := db.QueryPool().ExecContext(ctx, insertMeta, "intruder")
	var se sqlite3.Error
	if !errors.As(err, &se) || se.Code != sqlite3.ErrReadonly {
		t.Fatalf("reader write: %v, want SQLITE_READONLY", err)
	}
}

// A read-only open takes no lock and waits for no writer: it reads beside
// a writer that is in the middle of a write transaction.
func TestAReadOnlyOpenReadsBesideAWriteInProgress(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	w := openDB(t, dir)
	conn, err := w.WriterPool().Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	defer conn.ExecContext(ctx, "ROLLBACK")
	if _, err := conn.ExecContext(ctx, insertMeta, "uncommitted"); err != nil {
		t.Fatal(err)
	}
	// A writer would wait the full busy timeout for the lock; the deadline
	// is far shorter.
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	db, err := sqlitefs.OpenReadOnly(short, sqlitefs.Options{StorageDir: dir})
	if err != nil {
		t.Fatalf("OpenReadOnly beside a write: %v", err)
	}
	defer db.Close()
	if _, err := db.Generation(short); err != nil {
		t.Fatalf("Generation beside a write: %v", err)
	}
}

func TestAReadOnlyOpenRefusesANewerSchema(t *testing.T) {
	dir, _ := closedJournal(t)
	newer := sqlitefs.SchemaVersion() + 1
	raw := rawDB(t, sqlitefs.Path(dir))
	if _, err := raw.Exec("PRAGMA user_version = " + strconv.Itoa(newer)); err != nil {
		t.Fatal(err)
	}
	raw.Close()
	db, err := sqlitefs.OpenReadOnly(context.Background(), sqlitefs.Options{StorageDir: dir})
	if err == nil {
		db.Close()
		t.Fatalf("read-only open accepted schema version %d", newer)
	}
	var ne *migration.NewerDatabaseError
	if !errors.As(err, &ne) || ne.Version != newer || ne.Known != sqlitefs.SchemaVersion() {
		t.Fatalf("error = %v, want a NewerDatabaseError for %d", err, newer)
	}
}

func TestAReadOnlyOpenRefusesAMissingJournal(t *testing.T) {
	dir := t.TempDir()
	db, err := sqlitefs.OpenReadOnly(context.Background(), sqlitefs.Options{StorageDir: dir})
	if err == nil {
		db.Close()
		t.Fatal("read-only open of a directory without a journal succeeded")
	}
	if !errors.Is(err, sqlitefs.ErrNoJournal) {
		t.Fatalf("error = %v, want ErrNoJournal", err)
	}
	if _, err := os.Stat(sqlitefs.Path(dir)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the refused open left a file behind: %v", err)
	}
}

// SQLite cannot interrupt a wait for a lock, so a read-only open that meets
// a file locked by another connection must give up at its deadline by
// itself, not at the end of the 10 s busy timeout.
func TestAReadOnlyOpenGivesUpAtItsDeadlineOnALockedFile(t *testing.T) {
	ctx := context.Background()
	dir, _ := closedJournal(t)
	hold := lockExclusively(t, sqlitefs.Path(dir))
	defer hold()

	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	db, err := sqlitefs.OpenReadOnly(short, sqlitefs.Options{StorageDir: dir})
	took := time.Since(start)
	if err == nil {
		db.Close()
		t.Fatal("read-only open read a file another connection holds exclusively")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error = %v, want context.DeadlineExceeded", err)
	}
	// The driver's own wait is 5 s and the journal's 10 s; either would
	// show here.
	if took >= 2*time.Second {
		t.Fatalf("gave up after %v: it waited out a busy timeout, not the 200 ms deadline", took)
	}
}

// lockExclusively holds the file at path locked against every other
// connection, as a writer in exclusive locking mode does, until the
// returned function is called.
func lockExclusively(t *testing.T, path string) func() {
	t.Helper()
	ctx := context.Background()
	db, err := sql.Open("sqlite3", "file:"+path+"?_locking_mode=EXCLUSIVE")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "BEGIN EXCLUSIVE"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, insertMeta, "exclusive"); err != nil {
		t.Fatal(err)
	}
	return func() {
		_, _ = conn.ExecContext(ctx, "ROLLBACK")
		conn.Close()
		db.Close()
	}
}

// A journal whose daemon stopped cleanly has no -shm or -wal file, and a
// read-only connection must create them to read it. In a directory it
// cannot write, the error says what is missing and what to do.
//
// Permissions do not stop root, so as root the open runs in a child process
// of this test binary under an unprivileged user: the same check on any
// file system, with no tool or attribute it depends on.
func TestAReadOnlyOpenExplainsAnUnwritableDirectory(t *testing.T) {
	dir, _ := closedJournal(t)
	tracking := filepath.Dir(sqlitefs.Path(dir))
	if os.Geteuid() != 0 {
		if err := os.Chmod(tracking, 0o500); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.Chmod(tracking, 0o700) })
		assertSharedMemoryErr(t, openReadOnlyErr(dir))
		return
	}
	// The unprivileged user may read the journal and walk to it, but not
	// write its directory; the test binary is copied where it may run it.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(tracking, 0o555); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sqlitefs.Path(dir), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(filepath.Dir(dir), "sqlitefs.test")
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^TestReadOnlyOpenChildProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), readOnlyChildDirEnv+"="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the unprivileged open: %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte(sharedMemoryVerdict)) {
		t.Fatalf("the unprivileged open did not explain the missing -shm file:\n%s", out)
	}
}

// The child of TestAReadOnlyOpenExplainsAnUnwritableDirectory names the
// directory it opens read-only; it prints sharedMemoryVerdict when the
// open fails with ErrSharedMemory.
const (
	readOnlyChildDirEnv = "MINDROOMD_READONLY_CHILD_DIR"
	sharedMemoryVerdict = "READONLY-OPEN: ErrSharedMemory"
	nobody              = 65534
)

// TestReadOnlyOpenChildProcess is that child; run normally it returns at
// once.
func TestReadOnlyOpenChildProcess(t *testing.T) {
	dir := os.Getenv(readOnlyChildDirEnv)
	if dir == "" {
		return
	}
	assertSharedMemoryErr(t, openReadOnlyErr(dir))
	fmt.Println(sharedMemoryVerdict)
}

// openReadOnlyErr opens the journal under dir read-only and returns the
// error; an open that succeeds is closed and reported as no error.
func openReadOnlyErr(dir string) error {
	db, err := sqlitefs.OpenReadOnly(context.Background(), sqlitefs.Options{StorageDir: dir})
	if err == nil {
		db.Close()
	}
	return err
}

func assertSharedMemoryErr(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, sqlitefs.ErrSharedMemory) {
		t.Fatalf("read-only open in an unwritable directory: error = %v, want ErrSharedMemory", err)
	}
}
