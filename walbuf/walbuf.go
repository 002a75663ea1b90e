// Package walbuf provides the SQLite VFS the journal opens with when asked
// to (store.Options.WALBuffer): the default VFS, except that a WAL file's
// writes are gathered in memory and passed on as one write per commit.
//
// SQLite appends a commit to the WAL frame by frame, two write system calls
// per frame (its header, then the page). A scattered admission batch writes
// hundreds of frames, and the writer spends a share of its time entering and
// leaving the kernel (BenchmarkAdmit/vfs measures what gathering saves; see
// docs/VFS.md). Gathered, a commit is one write followed by the
// same fsync as before: what reaches the disk, and when the commit is
// acknowledged, do not change.
//
// The buffer is passed on before anything can observe the file: before a
// sync, a truncate, a size query, a file control, a read that overlaps it,
// a write elsewhere in the file, and the close. It is also passed on with a
// commit frame's page, and every write SQLite still makes for that commit
// goes straight to the file: the frame headers it rewrites when a
// transaction dirtied again pages it had spilled to the WAL (the commit
// frame's header last, with no page after it), and the padding to a sector
// boundary. SQLite publishes a commit in the shared WAL index as soon as
// those writes return, at NORMAL and OFF without a sync, so a commit that
// other connections can see, or that a SIGKILL interrupts after COMMIT
// returned, is whole in the file. What a transaction spilled and then rolled
// back is dropped, never passed on over another connection's frames.
//
// A WAL sync with nothing to make durable is skipped. A checkpoint starts by
// syncing the WAL, but with synchronous=FULL every commit already has, and
// on this project's disks that wasted sync was about a tenth of a
// checkpoint, during which the writer waits. The VFS counts, per file and
// across all of this process's handles on it, the writes passed on and the
// writes a completed sync covered, by the sync's flags; a sync runs unless
// an earlier one at least as strong covered every write. A request with
// SQLITE_SYNC_FULL (PRAGMA fullfsync or checkpoint_fullfsync; F_FULLFSYNC
// on macOS) is covered only by an earlier FULL sync, one without
// SQLITE_SYNC_DATAONLY only by an earlier sync without it, and a NORMAL
// DATAONLY one by any sync. A file's first sync in a process always runs,
// as does any sync of a file whose identity could not be read and any
// request with flags this VFS does not know.
//
// The counts, like the record of which handle writes the file, are this
// process's: they assume that no other process writes the WAL while this
// one has it open, and that this process writes it only through this VFS.
// A write they cannot see would let a sync be skipped with that write not
// durable. The journal enforces the first when it opens the file: a second
// process that opens it for writing gets an error.
package walbuf

/*
#include "walbuf.h"
*/
import "C"

import (
	"fmt"
	"sync"

	// The amalgamation this VFS registers with.
	_ "github.com/mattn/go-sqlite3"
)

// Name is the VFS name to open a database with (the "vfs" URI parameter).
const Name = "mindroomd-walbuf"

var (
	registerOnce sync.Once
	registerErr  error
	cName        = C.CString(Name) // SQLite keeps the pointer for good
)

// Register makes the VFS available under Name. It is safe to call more than
// once, from any goroutine.
func Register() error {
	registerOnce.Do(func() {
		if rc := C.walbuf_register(cName); rc != 0 {
			registerErr = fmt.Errorf("register sqlite vfs %s: result code %d", Name, int(rc))
		}
	})
	return registerErr
}

// Stats counts, for the whole process, the writes SQLite made to WAL files
// through this VFS and the writes it passed on to the file system, and the
// WAL syncs it passed on and those it skipped.
type Stats struct {
	Received, Passed int64
	Synced, Skipped  int64
}

// ReadStats returns the counters so far.
func ReadStats() Stats {
	var r, p, s, k C.wb_i64
	C.walbuf_stats(&r, &p, &s, &k)
	return Stats{Received: int64(r), Passed: int64(p), Synced: int64(s), Skipped: int64(k)}
}
