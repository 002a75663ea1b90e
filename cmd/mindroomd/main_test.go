package main

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/sqlitefs"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	m := NewMain(&out)
	ctx := context.Background()
	if err := m.ParseFlags(ctx, args); err != nil {
		return out.String(), err
	}
	err := m.Run(ctx)
	if cerr := m.Close(); err == nil {
		err = cerr
	}
	return out.String(), err
}

func TestStatusSummarisesEachPrincipal(t *testing.T) {
	s, dir := testsupport.MustOpen(t)
	ctx := context.Background()
	v, err := s.Principal(ctx, "helper", "@helper:example.org")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.AdmitBatch(ctx, mx.Live("!r:example.org",
		mx.Message("$a", "@alice:example.org", 1000, "hi"),
		mx.Notice("$b", "@alice:example.org", 1001, "fyi")), "tok"); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "status", "-storage", dir)
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	if !strings.Contains(out, "helper@@helper:example.org  2       1        2        0") {
		t.Fatalf("status output:\n%s", out)
	}
}

func TestStatusRefusesAMissingJournal(t *testing.T) {
	if out, err := run(t, "status", "-storage", t.TempDir()); err == nil || !strings.Contains(err.Error(), "no journal") {
		t.Fatalf("err=%v out=%s, want a missing-journal error", err, out)
	}
}

func TestAnUnknownCommandIsAnError(t *testing.T) {
	if _, err := run(t, "frobnicate"); err == nil {
		t.Fatal("unknown command accepted")
	}
}

// Test SQL, run on the journal from outside the daemon.
const (
	insertMeta     = `INSERT INTO store_meta (key, value) VALUES (?, 'x')`
	setUserVersion = `PRAGMA user_version = `
)

// closedJournal makes a journal with one principal and one event, and
// closes it, leaving only its file.
func closedJournal(t *testing.T) string {
	t.Helper()
	s, dir := testsupport.MustOpen(t)
	ctx := context.Background()
	v, err := s.Principal(ctx, "helper", "@helper:example.org")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.AdmitBatch(ctx, mx.Live("!r:example.org", mx.Message("$a", "@alice:example.org", 1000, "hi")), "tok"); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// rawJournal opens the journal under dir with the plain driver, as another
// program would.
func rawJournal(t *testing.T, dir, params string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+sqlitefs.Path(dir)+params)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// setVersion stamps the closed journal under dir with a schema version.
func setVersion(t *testing.T, dir string, version int) {
	t.Helper()
	raw := rawJournal(t, dir, "")
	if _, err := raw.Exec(setUserVersion + strconv.Itoa(version)); err != nil {
		t.Fatal(err)
	}
	if err := raw.Close(); err != nil {
		t.Fatal(err)
	}
}

func mustReadFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestStatusLeavesTheJournalAsItWas(t *testing.T) {
	dir := closedJournal(t)
	before := mustReadFile(t, sqlitefs.Path(dir))
	if out, err := run(t, "status", "-storage", dir); err != nil || !strings.Contains(out, "helper@@helper:example.org") {
		t.Fatalf("status: %v\n%s", err, out)
	}
	if after := mustReadFile(t, sqlitefs.Path(dir)); !bytes.Equal(before, after) {
		t.Fatal("status changed the journal file")
	}
}

// A journal one schema version behind is the running daemon's to migrate,
// or an older daemon's still in use: status refuses it and changes
// nothing, its version included.
func TestStatusRefusesAnOlderJournalWithoutMigratingIt(t *testing.T) {
	dir := closedJournal(t)
	older := sqlitefs.SchemaVersion() - 1
	setVersion(t, dir, older)
	before := mustReadFile(t, sqlitefs.Path(dir))
	_, err := run(t, "status", "-storage", dir)
	var oe *sqlitefs.OlderDatabaseError
	if !errors.As(err, &oe) || !strings.Contains(err.Error(), "older than this binary") {
		t.Fatalf("status of a v%d journal: %v, want an older-schema error", older, err)
	}
	if after := mustReadFile(t, sqlitefs.Path(dir)); !bytes.Equal(before, after) {
		t.Fatal("status changed an older journal")
	}
}

func TestStatusRefusesANewerJournal(t *testing.T) {
	dir := closedJournal(t)
	newer := sqlitefs.SchemaVersion() + 1
	setVersion(t, dir, newer)
	_, err := run(t, "status", "-storage", dir)
	var ne *sqlitefs.NewerDatabaseError
	if !errors.As(err, &ne) || !strings.Contains(err.Error(), "upgrade mindroomd") {
		t.Fatalf("status of a v%d journal: %v, want a newer-schema error", newer, err)
	}
}

// Status needs no write lock: it reads while another connection holds
// one, as the daemon does through every batch and every migration. Had it
// waited, it would have run into its deadline.
func TestStatusReadsWhileTheWriteLockIsHeld(t *testing.T) {
	ctx := context.Background()
	s, dir := testsupport.MustOpen(t)
	v, err := s.Principal(ctx, "helper", "@helper:example.org")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.AdmitBatch(ctx, mx.Live("!r:example.org", mx.Message("$a", "@alice:example.org", 1000, "hi")), "tok"); err != nil {
		t.Fatal(err)
	}
	conn, err := rawJournal(t, dir, "").Conn(ctx)
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
	short, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var out bytes.Buffer
	if err := runStatus(short, &out, dir); err != nil {
		t.Fatalf("status while the write lock is held: %v", err)
	}
	if !strings.Contains(out.String(), "helper@@helper:example.org  1") {
		t.Fatalf("status output:\n%s", out.String())
	}
}

// Status runs again and again beside a daemon that keeps admitting, and
// the daemon's admissions all go through.
func TestStatusRunsBesideAnAdmittingDaemon(t *testing.T) {
	ctx := context.Background()
	s, dir := testsupport.MustOpen(t)
	v, err := s.Principal(ctx, "helper", "@helper:example.org")
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	admitted := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				admitted <- nil
				return
			default:
			}
			ev := mx.Message(fmt.Sprintf("$m%d", i), "@alice:example.org", int64(1000+i), "hi")
			if _, err := v.AdmitBatch(ctx, mx.Live("!r:example.org", ev), "tok"); err != nil {
				admitted <- err
				return
			}
		}
	}()
	for range 5 {
		if out, err := run(t, "status", "-storage", dir); err != nil {
			close(stop)
			t.Fatalf("status beside the daemon: %v\n%s", err, out)
		}
	}
	close(stop)
	if err := <-admitted; err != nil {
		t.Fatalf("admission beside status: %v", err)
	}
}

// A deadline bounds status even when the file is locked against readers:
// SQLite's own wait for the lock cannot be interrupted, so status must not
// start one longer than its deadline.
func TestStatusGivesUpAtItsDeadlineOnALockedJournal(t *testing.T) {
	ctx := context.Background()
	dir := closedJournal(t)
	conn, err := rawJournal(t, dir, "?_locking_mode=EXCLUSIVE").Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN EXCLUSIVE"); err != nil {
		t.Fatal(err)
	}
	defer conn.ExecContext(ctx, "ROLLBACK")
	if _, err := conn.ExecContext(ctx, insertMeta, "exclusive"); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = runStatus(short, io.Discard, dir)
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("status of a locked journal: %v, want context.DeadlineExceeded", err)
	}
	// The driver's own wait is 5 s and the journal's 10 s.
	if took >= 2*time.Second {
		t.Fatalf("status gave up after %v, not at its 200 ms deadline", took)
	}
}

// status takes the storage directory as typed: relative to the working
// directory, or with characters a URI gives meaning to.
func TestStatusReadsAJournalNamedRelativeToTheWorkingDirectory(t *testing.T) {
	for _, dir := range []string{"st", "./mindroom_data", "with space", "odd?#%dir"} {
		t.Run(dir, func(t *testing.T) {
			t.Chdir(t.TempDir())
			s := testsupport.MustOpenAt(t, dir)
			v, err := s.Principal(context.Background(), "helper", "@helper:example.org")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := v.AdmitBatch(context.Background(), mx.Live("!r:example.org",
				mx.Message("$a", "@alice:example.org", 1000, "hi")), "tok"); err != nil {
				t.Fatal(err)
			}
			out, err := run(t, "status", "-storage", dir)
			if err != nil {
				t.Fatalf("status -storage %q: %v\n%s", dir, err, out)
			}
			if !strings.Contains(out, "helper@@helper:example.org") {
				t.Fatalf("status output:\n%s", out)
			}
		})
	}
}
