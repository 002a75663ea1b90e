package walbuf_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	_ "github.com/mattn/go-sqlite3"

	"github.com/mindroomd/mindroomd/walbuf"
)

// The kill proof re-executes this test binary as a child that commits one
// transaction, says so on stdout and waits to be killed. These name the
// child's database and its synchronous setting.
const (
	killChildDBEnv   = "WALBUF_KILL_CHILD_DB"
	killChildSyncEnv = "WALBUF_KILL_CHILD_SYNCHRONOUS"
)

func TestMain(m *testing.M) {
	if path := os.Getenv(killChildDBEnv); path != "" {
		if err := commitThenWait(path, os.Getenv(killChildSyncEnv)); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		// Stdin closed without a kill: the parent is gone.
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// The rewritten transaction: rewriteRows rows of rewriteSize bytes, a page
// of 1 KiB each, and a page cache of rewriteCache pages.
const (
	rewriteRows  = 200
	rewriteSize  = 900
	rewriteCache = 10
)

// commitThenWait is the child: it commits a transaction that rewrites
// frames it already spilled, prints "committed" once the commit returned,
// and then blocks until it is killed.
func commitThenWait(path, synchronous string) error {
	db, err := openDB(path, true, "PRAGMA page_size = 1024", "PRAGMA synchronous = "+synchronous,
		"PRAGMA cache_size = "+fmt.Sprint(rewriteCache), "PRAGMA wal_autocheckpoint = 0")
	if err != nil {
		return err
	}
	if _, err := db.Exec(`CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB)`); err != nil {
		return err
	}
	// Each row holds body(i + k*rewriteRows) at stage k, down to body(i)
	// once committed.
	err = write(db, func(tx *sql.Tx) error {
		for i := 0; i < rewriteRows; i++ {
			if _, err := tx.Exec(`INSERT INTO t (id, body) VALUES (?, ?)`, i, body(i+2*rewriteRows, rewriteSize)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("insert: %w", err)
	}
	// Ten pages of cache for two hundred updated pages: the first pass
	// spills most of them to the WAL, the second dirties them again, so
	// SQLite overwrites those frames in place and, at the commit, rewrites
	// the checksum of every frame from the first overwritten one on, the
	// commit frame's header last.
	err = write(db, func(tx *sql.Tx) error {
		for stage := 1; stage >= 0; stage-- {
			for i := 0; i < rewriteRows; i++ {
				if _, err := tx.Exec(`UPDATE t SET body = ? WHERE id = ?`, body(i+stage*rewriteRows, rewriteSize), i); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("rewrite: %w", err)
	}
	// os.Stdout is unbuffered: the line is in the pipe when this returns.
	if _, err := fmt.Fprintln(os.Stdout, "committed"); err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, os.Stdin)
	return err
}

// open opens path through the gathering VFS (or the default one) with one
// connection, so the pragmas stick.
func open(t *testing.T, path string, gathering bool, pragmas ...string) *sql.DB {
	t.Helper()
	db, err := openDB(path, gathering, pragmas...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func openDB(path string, gathering bool, pragmas ...string) (*sql.DB, error) {
	if err := walbuf.Register(); err != nil {
		return nil, err
	}
	q := url.Values{}
	if gathering {
		q.Set("vfs", walbuf.Name)
	}
	u := url.URL{Scheme: "file", Path: path, RawQuery: q.Encode()}
	db, err := sql.Open("sqlite3", u.String())
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	// page_size only applies before the file turns to WAL.
	for _, p := range append(pragmas, "PRAGMA journal_mode = WAL") {
		if _, err := db.Exec(p); err != nil {
			_ = db.Close()
			return nil, fmt.Errorf("%s: %w", p, err)
		}
	}
	return db, nil
}

func mustExec(t *testing.T, db *sql.DB, q string, args ...any) {
	t.Helper()
	if _, err := db.Exec(q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// fill inserts rows of size bytes, in one transaction.
func fill(t *testing.T, db *sql.DB, from, rows, size int) {
	t.Helper()
	if err := write(db, func(tx *sql.Tx) error { return insert(tx, from, rows, size) }); err != nil {
		t.Fatal(err)
	}
}

// write runs fn in one transaction and commits it.
func write(db *sql.DB, fn func(*sql.Tx) error) error {
	tx, err := db.Begin()
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

func insert(tx *sql.Tx, from, rows, size int) error {
	for i := from; i < from+rows; i++ {
		if _, err := tx.Exec(`INSERT INTO t (id, body) VALUES (?, ?)`, i, body(i, size)); err != nil {
			return err
		}
	}
	return nil
}

func body(i, size int) []byte {
	b := make([]byte, 0, size)
	for len(b) < size {
		s := sha256.Sum256([]byte(fmt.Sprint(i, len(b))))
		b = append(b, s[:]...)
	}
	return b[:size]
}

// verify checks the file's integrity and that rows [0, rows) hold their
// bodies.
func verify(t *testing.T, db *sql.DB, rows, size int) {
	t.Helper()
	var ok string
	if err := db.QueryRow(`PRAGMA integrity_check`).Scan(&ok); err != nil || ok != "ok" {
		t.Fatalf("integrity_check: %q %v", ok, err)
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM t`).Scan(&n); err != nil || n != rows {
		t.Fatalf("rows: %d %v, want %d", n, err, rows)
	}
	for _, i := range []int{0, rows / 2, rows - 1} {
		var got []byte
		if err := db.QueryRow(`SELECT body FROM t WHERE id = ?`, i).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if string(got) != string(body(i, size)) {
			t.Fatalf("row %d: body differs", i)
		}
	}
}

func TestACommitReachesTheWALAsOneWrite(t *testing.T) {
	db := open(t, filepath.Join(t.TempDir(), "j.db"), true, "PRAGMA synchronous = FULL", "PRAGMA page_size = 1024")
	mustExec(t, db, `CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB)`)
	before := walbuf.ReadStats()
	fill(t, db, 0, 200, 300)
	after := walbuf.ReadStats()
	received, passed := after.Received-before.Received, after.Passed-before.Passed
	// 200 rows of 300 B fill about 70 pages of 1 KiB, two writes each:
	// about 72 KiB, under one buffer.
	if received < 120 || passed != 1 {
		t.Fatalf("received %d writes, passed %d on; want ≥ 120 gathered into 1", received, passed)
	}
	verify(t, db, 200, 300)
}

func TestAnotherConnectionSeesEveryCommitEvenWithoutSync(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j.db")
	w := open(t, path, true, "PRAGMA synchronous = OFF")
	mustExec(t, w, `CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB)`)
	r := open(t, path, false)
	for i := 0; i < 50; i++ {
		fill(t, w, i*10, 10, 700)
		var n int
		if err := r.QueryRow(`SELECT count(*) FROM t`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != (i+1)*10 {
			t.Fatalf("after commit %d another connection counts %d rows, want %d", i, n, (i+1)*10)
		}
	}
	verify(t, r, 500, 700)
}

func TestATransactionLargerThanTheBufferSpillsAndStaysIntact(t *testing.T) {
	// A tiny page cache makes SQLite spill frames mid-transaction and
	// rewrite some of them; 12 MiB is about a hundred buffers.
	db := open(t, filepath.Join(t.TempDir(), "j.db"), true, "PRAGMA synchronous = FULL", "PRAGMA cache_size = 10")
	mustExec(t, db, `CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB)`)
	fill(t, db, 0, 3000, 4000)
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(`UPDATE t SET body = ? WHERE id % 7 = 0`, body(-1, 4000)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	verify(t, db, 3000, 4000)
}

func TestAPageSpilledAndReadBackInOneTransactionIsTheOneWritten(t *testing.T) {
	// With ten pages of cache, updating forty rows a page each spills the
	// first updates to the WAL, where they are still in the buffer when
	// the transaction reads them back.
	db := open(t, filepath.Join(t.TempDir(), "j.db"), true, "PRAGMA synchronous = FULL",
		"PRAGMA page_size = 1024", "PRAGMA cache_size = 10")
	mustExec(t, db, `CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB)`)
	fill(t, db, 0, 40, 900)
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	for i := 0; i < 40; i++ {
		if _, err := tx.Exec(`UPDATE t SET body = ? WHERE id = ?`, body(1000+i, 900), i); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 40; i++ {
		var got []byte
		if err := tx.QueryRow(`SELECT body FROM t WHERE id = ?`, i).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if string(got) != string(body(1000+i, 900)) {
			t.Fatalf("row %d reads back something other than its update", i)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

func TestAFileWrittenThroughTheBufferOpensWithTheDefaultVFS(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j.db")
	w := open(t, path, true, "PRAGMA synchronous = FULL")
	mustExec(t, w, `CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB)`)
	fill(t, w, 0, 400, 900)
	mustExec(t, w, `PRAGMA wal_checkpoint(PASSIVE)`)
	fill(t, w, 400, 400, 900)
	// Closing leaves the file as the default VFS expects it, with the
	// second batch checkpointed on close.
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	r := open(t, path, false)
	verify(t, r, 800, 900)
	conn, err := r.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
}

// syncsDuring reports how many WAL syncs run passed on and skipped.
func syncsDuring(run func()) (synced, skipped int64) {
	before := walbuf.ReadStats()
	run()
	after := walbuf.ReadStats()
	return after.Synced - before.Synced, after.Skipped - before.Skipped
}

// With synchronous=FULL every commit has synced the WAL, so the sync a
// checkpoint starts with has nothing left to do; with synchronous=NORMAL a
// commit leaves the WAL unsynced, and the checkpoint must sync it before it
// copies a page. Either way it does not matter which connection checkpoints.
func TestACheckpointSyncsTheWALOnlyIfACommitLeftItUnsynced(t *testing.T) {
	for _, tc := range []struct {
		commits  string
		wantSync bool
	}{
		{"FULL", false},
		{"NORMAL", true},
	} {
		path := filepath.Join(t.TempDir(), tc.commits+".db")
		writer := open(t, path, true, "PRAGMA synchronous = "+tc.commits, "PRAGMA wal_autocheckpoint = 0")
		other := open(t, path, true, "PRAGMA synchronous = FULL")
		mustExec(t, writer, `CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB)`)
		for name, db := range map[string]*sql.DB{"the committing connection": writer, "another connection": other} {
			fill(t, writer, 0, 10, 100)
			synced, skipped := syncsDuring(func() { mustExec(t, db, `PRAGMA wal_checkpoint(PASSIVE)`) })
			if tc.wantSync && synced < 1 {
				t.Fatalf("a checkpoint on %s after %s commits ran no WAL sync", name, tc.commits)
			}
			if !tc.wantSync && (synced != 0 || skipped != 1) {
				t.Fatalf("a checkpoint on %s after %s commits ran %d WAL syncs and skipped %d, want 0 and 1", name, tc.commits, synced, skipped)
			}
			mustExec(t, writer, `DELETE FROM t`)
		}
	}
}

// A WAL this VFS has not seen written may hold unsynced commits (here made
// through the default VFS, as a previous process might have): its first
// sync runs.
func TestTheFirstSyncOfAFileNotWrittenThroughTheVFSRuns(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inherited.db")
	plain := open(t, path, false, "PRAGMA synchronous = NORMAL", "PRAGMA wal_autocheckpoint = 0")
	mustExec(t, plain, `CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB)`)
	fill(t, plain, 0, 10, 100)
	gathering := open(t, path, true, "PRAGMA synchronous = FULL")
	synced, _ := syncsDuring(func() { mustExec(t, gathering, `PRAGMA wal_checkpoint(PASSIVE)`) })
	if synced < 1 {
		t.Fatal("a checkpoint of commits made through another VFS ran no WAL sync")
	}
}

// A transaction that spilled pages and dirtied them again before COMMIT
// ends in SQLite rewriting frame headers in place, the commit frame's last.
// Once COMMIT has returned, every byte of it must be in the file, whatever
// the synchronous setting: the child is killed with nothing flushed or
// closed, and a fresh process recovering the WAL must find the commit.
func TestATransactionThatRewroteSpilledFramesSurvivesAKillRightAfterCommit(t *testing.T) {
	for _, synchronous := range []string{"OFF", "NORMAL", "FULL"} {
		t.Run(synchronous, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "j.db")
			killAfterCommit(t, path, synchronous)
			if _, err := os.Stat(path + "-wal"); err != nil {
				t.Fatalf("the killed child left no WAL to recover: %v", err)
			}
			verify(t, open(t, path, false), rewriteRows, rewriteSize)
		})
	}
}

// killAfterCommit runs commitThenWait in a child process on path and
// SIGKILLs it as soon as it reports the commit.
func killAfterCommit(t *testing.T, path, synchronous string) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), killChildDBEnv+"="+path, killChildSyncEnv+"="+synchronous)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	if line != "committed\n" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("child said %q before committing; stderr:\n%s", line, stderr.String())
	}
	// SIGKILL: no deferred code, no close, no flush runs in the child.
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, want killed by SIGKILL; stderr:\n%s", cmd.ProcessState, stderr.String())
	}
}

// A checkpoint connection with checkpoint_fullfsync asks for a full fsync
// (SQLITE_SYNC_FULL, F_FULLFSYNC where the system has it) of the WAL. Commits
// that synced it with a plain fsync leave that undone, so it runs; commits
// that made full fsyncs themselves leave nothing for it to do.
func TestAFullFsyncOfTheWALIsSkippedOnlyAfterFullFsyncs(t *testing.T) {
	for _, tc := range []struct {
		commits  string
		wantSync bool
	}{
		{"PRAGMA fullfsync = 0", true},
		{"PRAGMA fullfsync = 1", false},
	} {
		path := filepath.Join(t.TempDir(), "j.db")
		writer := open(t, path, true, "PRAGMA synchronous = FULL", tc.commits, "PRAGMA wal_autocheckpoint = 0")
		checkpointer := open(t, path, true, "PRAGMA checkpoint_fullfsync = 1")
		mustExec(t, writer, `CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB)`)
		fill(t, writer, 0, 10, 100)
		synced, skipped := syncsDuring(func() { mustExec(t, checkpointer, `PRAGMA wal_checkpoint(PASSIVE)`) })
		if tc.wantSync && synced != 1 {
			t.Fatalf("a full-fsync checkpoint after commits with %s ran %d WAL syncs and skipped %d, want 1 run", tc.commits, synced, skipped)
		}
		if !tc.wantSync && (synced != 0 || skipped != 1) {
			t.Fatalf("a full-fsync checkpoint after commits with %s ran %d WAL syncs and skipped %d, want 0 and 1", tc.commits, synced, skipped)
		}
	}
}

// A transaction that spilled pages and rolled back leaves frames SQLite
// abandons; the next transaction, here another connection's, writes its own
// frames over them. Whatever of the abandoned frames the first connection
// still holds must not reach the file after that, as its close would pass
// it on.
func TestFramesOfARolledBackSpillNeverOverwriteAnotherConnectionsCommit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j.db")
	spiller := open(t, path, true, "PRAGMA page_size = 1024", "PRAGMA synchronous = FULL",
		"PRAGMA cache_size = "+fmt.Sprint(rewriteCache), "PRAGMA wal_autocheckpoint = 0")
	committer := open(t, path, true, "PRAGMA synchronous = FULL")
	mustExec(t, spiller, `CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB)`)
	fill(t, spiller, 0, 40, 900)
	tx, err := spiller.Begin()
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 40; i++ {
		if _, err := tx.Exec(`UPDATE t SET body = ? WHERE id = ?`, body(1000+i, 900), i); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	mustExec(t, committer, `DELETE FROM t`)
	fill(t, committer, 0, 40, 900)
	if err := spiller.Close(); err != nil {
		t.Fatal(err)
	}
	fresh, err := openDB(path, false)
	if err != nil {
		t.Fatalf("a fresh connection after the spiller closed: %v", err)
	}
	t.Cleanup(func() { _ = fresh.Close() })
	verify(t, fresh, 40, 900)
}
