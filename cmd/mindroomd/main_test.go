package main

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"github.com/mindroomd/mindroomd/store"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mattn/go-sqlite3"

	"github.com/mindroomd/mindroomd/config"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/migration"
	"github.com/mindroomd/mindroomd/sqlitefs"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	m := NewMain(&out, io.Discard)
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
	insertMeta         = `INSERT INTO store_meta (key, value) VALUES (?, 'x')`
	setUserVersion     = `PRAGMA user_version = `
	createForeignTable = `CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)`
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
	var oe *migration.OlderDatabaseError
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
	var ne *migration.NewerDatabaseError
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
	if err := runStatus(short, &out, store.Options{StorageDir: dir}, time.Now); err != nil {
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
	err = runStatus(short, io.Discard, store.Options{StorageDir: dir}, time.Now)
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

// The version the test binary is built with; a version the source does not
// spell, so only the linker can have put it there.
const stampedVersion = "v0.0.0-stamped-by-ldflags"

// binDir holds the mindroomd built for the tests that run the real binary;
// TestMain removes it.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "mindroomd-cmd-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// buildOnce builds mindroomd at most once per test run, the way make build
// does: with the version stamped by -ldflags. Under -race it builds with
// -race too, so the build reuses the packages the test run compiled.
var buildOnce = sync.OnceValues(func() (string, error) {
	bin := filepath.Join(binDir, "mindroomd")
	args := []string{"build", "-buildvcs=false", "-ldflags", "-X main.version=" + stampedVersion, "-o", bin}
	if raceEnabled() {
		args = append(args, "-race")
	}
	out, err := exec.Command("go", append(args, ".")...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build: %w\n%s", err, out)
	}
	return bin, nil
})

// raceEnabled reports whether this test binary was built with -race.
func raceEnabled() bool {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range info.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

// mindroomd runs the built binary and returns its exit code and output.
func mindroomd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	// A -race binary otherwise sleeps a second on each clean exit.
	cmd.Env = append(os.Environ(), "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee) && ee.Exited():
		code = ee.ExitCode()
	default:
		t.Fatalf("mindroomd %q: %v\n%s", args, err, errOut.String())
	}
	return code, out.String(), errOut.String()
}

func TestTheVersionCommandPrintsTheBuildVersion(t *testing.T) {
	defer func(v string) { version = v }(version)
	version = "v1.2.3-test"
	if out, err := run(t, "version"); err != nil || out != "mindroomd v1.2.3-test\n" {
		t.Fatalf("version = %q, %v; want %q", out, err, "mindroomd v1.2.3-test\n")
	}
}

// -X names the variable by its full name and silently sets nothing when the
// name is wrong, so only a real build shows that make build's flag reaches
// the version the binary prints.
func TestABuildStampsTheVersionWithLdflags(t *testing.T) {
	code, out, errOut := mindroomd(t, "version")
	if want := "mindroomd " + stampedVersion + "\n"; code != 0 || out != want {
		t.Fatalf("mindroomd version: exit %d, stdout %q, stderr %q; want exit 0, %q", code, out, errOut, want)
	}
}

func TestEachErrorMapsToItsExitCode(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want int
	}{
		{"OK", nil, exitOK},
		{"Help", flag.ErrHelp, exitOK},
		{"UnknownCommand", &usageError{err: errors.New(`unknown command "x"`)}, exitUsage},
		{"BadFlag", fmt.Errorf("parse: %w", &usageError{command: "status", err: errors.New("flag provided but not defined: -x")}), exitUsage},
		{"Config", fmt.Errorf("load: %w", &config.Error{Field: "agents", Err: errors.New("none configured")}), exitConfig},
		{"ForeignDatabase", fmt.Errorf("open: %w: application_id is 0x1", migration.ErrForeignDatabase), exitJournal},
		{"NewerSchema", fmt.Errorf("open: %w", &migration.NewerDatabaseError{Version: 9, Known: 3}), exitJournal},
		{"OlderSchema", &migration.OlderDatabaseError{Version: 2, Known: 3}, exitJournal},
		{"Corrupt", fmt.Errorf("read schema: %w", journal.ErrCorrupt), exitJournal},
		{"Conflict", fmt.Errorf("intern room: %w", journal.ErrConflict), exitFailure},
		{"DiskFull", sqlite3.Error{Code: sqlite3.ErrFull}, exitFailure},
		{"IOError", sqlite3.Error{Code: sqlite3.ErrIoErr}, exitFailure},
		{"Busy", sqlite3.Error{Code: sqlite3.ErrBusy}, exitFailure},
		{"NoJournal", fmt.Errorf("%w at /x: missing", sqlitefs.ErrNoJournal), exitFailure},
		{"Interrupted", context.Canceled, exitFailure},
		{"Other", errors.New("boom"), exitFailure},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := exitCode(tc.err); got != tc.want {
				t.Fatalf("exitCode(%v) = %d, want %d", tc.err, got, tc.want)
			}
		})
	}
}

// Help is what was asked for: it goes to stdout and exits 0, at the top
// level and for each command.
func TestAskingForHelpPrintsItAndExitsZero(t *testing.T) {
	for _, args := range [][]string{
		{"-h"}, {"-help"}, {"--help"}, {"help"},
		{"status", "-h"}, {"status", "-help"}, {"help", "status"},
		{"version", "-h"}, {"help", "version"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			code, out, errOut := mindroomd(t, args...)
			if code != exitOK || errOut != "" {
				t.Fatalf("exit %d, stderr %q; want exit 0 and nothing on stderr", code, errOut)
			}
			want := "usage: mindroomd <command>"
			switch {
			case slices.Contains(args, "status"):
				want = "-storage"
			case slices.Contains(args, "version"):
				want = "usage: mindroomd version"
			}
			if !strings.Contains(out, want) {
				t.Fatalf("stdout %q, want it to hold %q", out, want)
			}
		})
	}
}

func TestTheTopLevelHelpDocumentsEveryExitCode(t *testing.T) {
	var b bytes.Buffer
	writeUsage(&b)
	out := b.String()
	for _, c := range []int{exitOK, exitFailure, exitUsage, exitConfig, exitJournal} {
		if !strings.Contains(out, "\n  "+strconv.Itoa(c)+"  ") {
			t.Fatalf("help does not document exit code %d:\n%s", c, out)
		}
	}
}

// Each failure exits with its own code from the real binary, with the
// error on stderr and nothing on stdout.
func TestTheBinaryExitsWithTheCodeOfItsFailure(t *testing.T) {
	for _, tc := range []struct {
		name    string
		journal func(t *testing.T) string // makes a storage directory
		args    []string                  // after "status -storage DIR" when journal is set
		want    int
		stderr  string
	}{
		{name: "NoCommand", want: exitUsage, stderr: "no command"},
		{name: "UnknownCommand", args: []string{"frobnicate"}, want: exitUsage, stderr: `unknown command "frobnicate"`},
		{name: "UnknownFlag", args: []string{"status", "-nosuch"}, want: exitUsage, stderr: "run 'mindroomd status -h' for usage"},
		{name: "StrayArgument", journal: closedJournal, args: []string{"extra"}, want: exitUsage, stderr: `unexpected argument "extra"`},
		{name: "NoJournal", journal: func(t *testing.T) string { return t.TempDir() }, want: exitFailure, stderr: "no journal"},
		{name: "NewerSchema", journal: func(t *testing.T) string {
			dir := closedJournal(t)
			setVersion(t, dir, sqlitefs.SchemaVersion()+1)
			return dir
		}, want: exitJournal, stderr: "upgrade mindroomd"},
		{name: "OlderSchema", journal: func(t *testing.T) string {
			dir := closedJournal(t)
			setVersion(t, dir, sqlitefs.SchemaVersion()-1)
			return dir
		}, want: exitJournal, stderr: "older than this binary"},
		{name: "ForeignDatabase", journal: foreignJournal, want: exitJournal, stderr: "not a mindroomd journal"},
		{name: "NotADatabase", journal: garbageJournal, want: exitJournal, stderr: "file is not a database"},
		{name: "CorruptSchema", journal: corruptJournal, want: exitJournal, stderr: "malformed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if tc.journal != nil {
				args = append([]string{"status", "-storage", tc.journal(t)}, args...)
			}
			code, out, errOut := mindroomd(t, args...)
			if code != tc.want || out != "" || !strings.Contains(errOut, tc.stderr) {
				t.Fatalf("mindroomd %q: exit %d, stdout %q, stderr %q; want exit %d and %q on stderr",
					args, code, out, errOut, tc.want, tc.stderr)
			}
		})
	}
}

func TestTheBinaryExitsZeroOnAHealthyJournal(t *testing.T) {
	code, out, errOut := mindroomd(t, "status", "-storage", closedJournal(t))
	if code != exitOK || errOut != "" || !strings.Contains(out, "helper@@helper:example.org") {
		t.Fatalf("exit %d, stdout %q, stderr %q; want exit 0 and the principal", code, out, errOut)
	}
}

// foreignJournal puts another application's SQLite file where the journal
// belongs.
func foreignJournal(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Dir(sqlitefs.Path(dir)), 0o700); err != nil {
		t.Fatal(err)
	}
	raw := rawJournal(t, dir, "")
	if _, err := raw.Exec(createForeignTable); err != nil {
		t.Fatal(err)
	}
	if err := raw.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// garbageJournal puts a file that is no SQLite database at all where the
// journal belongs.
func garbageJournal(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	path := sqlitefs.Path(dir)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, bytes.Repeat([]byte("not a database "), 300), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// corruptJournal overwrites the first page of a closed journal after its
// 100-byte file header, where the schema table's root page starts: the
// header still names an SQLite file, but SQLite cannot read its schema.
func corruptJournal(t *testing.T) string {
	t.Helper()
	dir := closedJournal(t)
	path := sqlitefs.Path(dir)
	b := mustReadFile(t, path)
	pageSize := int(b[16])<<8 | int(b[17])
	if pageSize == 1 {
		pageSize = 65536
	}
	copy(b[100:pageSize], bytes.Repeat([]byte{0xff}, pageSize-100))
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}
