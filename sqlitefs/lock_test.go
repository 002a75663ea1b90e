package sqlitefs_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"github.com/mindroomd/mindroomd/journalsql"
	"os"
	"os/exec"
	"testing"

	"github.com/mindroomd/mindroomd/sqlitefs"
)

// The child process of the single-writer tests opens the journal these
// name, says so, and holds it until killed.
const (
	lockChildDirEnv       = "MINDROOMD_LOCK_CHILD_DIR"
	lockChildWALBufferEnv = "MINDROOMD_LOCK_CHILD_WAL_BUFFER"
)

// TestLockChildProcess is that child; run normally it returns at once.
func TestLockChildProcess(t *testing.T) {
	dir := os.Getenv(lockChildDirEnv)
	if dir == "" {
		return
	}
	db, err := sqlitefs.Open(context.Background(), sqlitefs.Options{StorageDir: dir,
		WALBuffer: os.Getenv(lockChildWALBufferEnv) == "1"})
	if err != nil {
		t.Fatalf("child: open: %v", err)
	}
	defer db.Close()
	// os.Stdout is unbuffered: the line is in the pipe when this returns.
	if _, err := os.Stdout.WriteString("OPEN\n"); err != nil {
		os.Exit(2)
	}
	select {} // until SIGKILL
}

// startLockHolder starts the child on dir and returns once it holds the
// journal; the test kills it at the latest when it ends.
func startLockHolder(t *testing.T, dir string, walBuffer bool) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLockChildProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), lockChildDirEnv+"="+dir)
	if walBuffer {
		cmd.Env = append(cmd.Env, lockChildWALBufferEnv+"=1")
	}
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start child: %v", err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() || sc.Text() != "OPEN" {
		t.Fatalf("child did not open the journal: %q %v", sc.Text(), sc.Err())
	}
	return cmd
}

// A second process that opens the journal for writing is refused with
// ErrLocked while the first holds it, whichever VFS either uses; reading
// needs no lock; and a killed holder frees it.
func TestASecondWriterProcessIsRefusedUntilTheFirstDies(t *testing.T) {
	for _, holderBuffered := range []bool{false, true} {
		t.Run(fmt.Sprintf("holder WALBuffer=%v", holderBuffered), func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			db := openDB(t, dir) // a journal with content, closed before the child opens it
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			cmd := startLockHolder(t, dir, holderBuffered)
			for _, buffered := range []bool{false, true} {
				second, err := sqlitefs.Open(ctx, sqlitefs.Options{StorageDir: dir, WALBuffer: buffered})
				if err == nil {
					second.Close()
					t.Fatalf("WALBuffer=%v: a second process opened the journal for writing beside the first", buffered)
				}
				if !errors.Is(err, sqlitefs.ErrLocked) {
					t.Fatalf("WALBuffer=%v: second writer: %v, want ErrLocked", buffered, err)
				}
			}
			ro, err := sqlitefs.OpenReadOnly(ctx, sqlitefs.Options{StorageDir: dir})
			if err != nil {
				t.Fatalf("read-only open beside the writer: %v", err)
			}
			if _, err := journalsql.Status(ctx, ro.Reader()); err != nil {
				t.Fatalf("status beside the writer: %v", err)
			}
			if err := ro.Close(); err != nil {
				t.Fatal(err)
			}

			// SIGKILL: no deferred code runs in the child, the kernel drops its lock.
			if err := cmd.Process.Kill(); err != nil {
				t.Fatalf("kill child: %v", err)
			}
			var exitErr *exec.ExitError
			if err := cmd.Wait(); !errors.As(err, &exitErr) || exitErr.ExitCode() != -1 {
				t.Fatalf("child wait: %v, want death by signal", err)
			}
			after := openDB(t, dir)
			if _, err := after.Generation(ctx); err != nil {
				t.Fatalf("journal after the holder died: %v", err)
			}
		})
	}
}

// flock belongs to an open file, not a process: a second Open in the same
// process is a second writer too.
func TestASecondWriterInTheSameProcessIsRefused(t *testing.T) {
	dir := t.TempDir()
	first := openDB(t, dir)
	second, err := sqlitefs.Open(context.Background(), sqlitefs.Options{StorageDir: dir})
	if err == nil {
		second.Close()
		t.Fatal("a second DB opened the journal for writing beside the first")
	}
	if !errors.Is(err, sqlitefs.ErrLocked) {
		t.Fatalf("second writer: %v, want ErrLocked", err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	openDB(t, dir) // Close released it
}
