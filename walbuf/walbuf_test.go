package walbuf_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"fmt"
	"net/url"
	"path/filepath"
	"testing"

	_ "github.com/mattn/go-sqlite3"

	"github.com/mindroomd/mindroomd/walbuf"
)

// open opens path through the gathering VFS (or the default one) with one
// connection, so the pragmas stick.
func open(t *testing.T, path string, gathering bool, pragmas ...string) *sql.DB {
	t.Helper()
	if err := walbuf.Register(); err != nil {
		t.Fatal(err)
	}
	q := url.Values{}
	if gathering {
		q.Set("vfs", walbuf.Name)
	}
	u := url.URL{Scheme: "file", Path: path, RawQuery: q.Encode()}
	db, err := sql.Open("sqlite3", u.String())
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { _ = db.Close() })
	// page_size only applies before the file turns to WAL.
	for _, p := range append(pragmas, "PRAGMA journal_mode = WAL") {
		if _, err := db.Exec(p); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
	}
	return db
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
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	for i := from; i < from+rows; i++ {
		if _, err := tx.Exec(`INSERT INTO t (id, body) VALUES (?, ?)`, i, body(i, size)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
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
