package bench

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// flagN sizes the walked conversation. It is a test-binary flag, passed
// after -args (`go test -bench . ./bench/ -args -n 100000`).
var flagN = flag.Int("n", 1_000_000, "messages in the walked conversation")

// sizes are the knobs of one run. Full sizes are those bench/README.md lists;
// -short shrinks everything so the suite is a smoke test that cannot rot.
type sizes struct {
	// walkN is the conversation the walk and deep-page benchmarks read.
	walkN int
	// admitBase is the messages already in the database admission runs
	// against, spread over admitPrincipals × admitRooms.
	admitBase int
	// admitEvents is the events one admission round offers, and maxRound
	// the longest a round may run before its senders stop early.
	admitEvents int
	maxRound    time.Duration
	// latencyEvents is the events the fixed-load latency phase offers.
	latencyEvents int
	// storageMsgs is the messages the storage benchmark admits.
	storageMsgs int
	// minMeasure is how long a repeated page query runs before its mean
	// is trusted.
	minMeasure time.Duration
}

func benchSizes() sizes {
	if testing.Short() {
		return sizes{walkN: 2000, admitBase: 300, admitEvents: 256, maxRound: 5 * time.Second, latencyEvents: 100, storageMsgs: 1000, minMeasure: 5 * time.Millisecond}
	}
	return sizes{walkN: *flagN, admitBase: 300_000, admitEvents: 30_000, maxRound: 15 * time.Second, latencyEvents: 6_000, storageMsgs: 100_000, minMeasure: 300 * time.Millisecond}
}

// The admission layout: principals × rooms, as bench/README.md describes it.
const (
	admitPrincipals = 16
	admitRooms      = 32
)

// TestMain releases what benchmarks share across functions (the walk
// fixture's per-run copy) once every benchmark has finished.
func TestMain(m *testing.M) {
	code := m.Run()
	closeWalkEnv()
	os.Exit(code)
}

// cacheDir is <repo>/.cache/bench, found by walking up to go.mod so the
// cache does not depend on where `go test` was started.
func cacheDir() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			dir := filepath.Join(d, ".cache", "bench")
			return dir, os.MkdirAll(dir, 0o755)
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", errors.New("no go.mod above " + wd)
		}
		d = parent
	}
}

// copyFile copies a cached fixture to dst so a run never mutates the cache.
// With durable set the copy is fsynced: otherwise the first checkpoint of
// the measured run would pay for flushing the whole copied file.
func copyFile(src, dst string, durable bool) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", src, err)
	}
	if durable {
		if err := out.Sync(); err != nil {
			out.Close()
			return err
		}
	}
	return out.Close()
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}
