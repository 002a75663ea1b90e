package store_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/crash"
)

// The crash proof (package crash) re-executes this test binary as a child
// that admits into the journal its environment names.
const (
	// crashChildDirEnv, when set, makes TestCrashChildProcess the child,
	// admitting into the journal under that storage directory.
	crashChildDirEnv = "MINDROOMD_CRASH_CHILD_DIR"
	// crashWALBufferEnv, set to 1, opens the child's journal with the WAL
	// buffer (Options.WALBuffer).
	crashWALBufferEnv = "MINDROOMD_CRASH_WAL_BUFFER"
)

// crashMaxUnmergedTail is the crash journal's page-index tail bound.
const crashMaxUnmergedTail = 7

const listCrashEvents = `SELECT event_id FROM journal_events`

func openCrashStore(ctx context.Context, dir string, walBuffer bool) (*store.Store, error) {
	// A tiny tail bound merges the page index every few batches, so kills
	// also land inside merges and the reopened journal has rows in both.
	return store.Open(ctx, store.Options{StorageDir: dir, Now: func() time.Time { return testsupport.DefaultNow },
		MaxUnmergedTail: crashMaxUnmergedTail, WALBuffer: walBuffer})
}

// crashEventIDs reads the journal's rows beneath the store, on its reader
// pool.
func crashEventIDs(ctx context.Context, s *store.Store) ([]string, error) {
	rows, err := s.DB().QueryPool().QueryContext(ctx, listCrashEvents)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// TestCrashChildProcess is the child half of the crash proof; run normally
// it returns at once. As the child it never returns: it admits batches until
// it is killed.
func TestCrashChildProcess(t *testing.T) {
	dir := os.Getenv(crashChildDirEnv)
	if dir == "" {
		return
	}
	walBuffer := os.Getenv(crashWALBufferEnv) == "1"
	crash.Child(t, func(ctx context.Context) (*store.Store, error) { return openCrashStore(ctx, dir, walBuffer) })
}

func TestCrashSIGKILLMidAdmissionLosesNoAcknowledgedBatchAndTearsNone(t *testing.T) {
	if os.Getenv(crashChildDirEnv) != "" {
		return // this process is a child
	}
	rng := crash.Seed(t)
	// The reopen that checks each kill uses the same VFS as the child, as
	// a restarted daemon would.
	for _, walBuffer := range []bool{false, true} {
		t.Run(fmt.Sprintf("WALBuffer=%v", walBuffer), func(t *testing.T) {
			dir := t.TempDir()
			env := []string{crashChildDirEnv + "=" + dir}
			if walBuffer {
				env = append(env, crashWALBufferEnv+"=1")
			}
			crash.Run(t, rng, crash.Journal[*store.Store]{
				ChildTest: "TestCrashChildProcess",
				Env:       env,
				Open:      func(ctx context.Context) (*store.Store, error) { return openCrashStore(ctx, dir, walBuffer) },
				EventIDs:  crashEventIDs,
			})
		})
	}
}
