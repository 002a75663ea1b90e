package testsupport

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/store"
)

// Clock is a settable test clock.
type Clock struct{ T time.Time }

// Now returns the clock's time.
func (c *Clock) Now() time.Time { return c.T }

// ShiftClock is a clock a test moves forward: from Base (time.Now when
// zero) plus every Advance so far. Safe for concurrent use: the store's
// writer reads it while the test moves it.
type ShiftClock struct {
	Base  time.Time
	shift atomic.Int64
}

// Now returns the clock's time.
func (c *ShiftClock) Now() time.Time {
	base := c.Base
	if base.IsZero() {
		base = time.Now()
	}
	return base.Add(time.Duration(c.shift.Load()))
}

// Advance moves the clock forward by d.
func (c *ShiftClock) Advance(d time.Duration) { c.shift.Add(int64(d)) }

// DefaultNow is the fixed time test journals start at.
var DefaultNow = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

// MustOpen opens a journal in a fresh temporary directory on a real on-disk
// SQLite file and closes it when the test ends. It returns the store and the
// storage directory, so a test can reopen it to simulate a restart.
func MustOpen(tb testing.TB) (*store.Store, string) {
	tb.Helper()
	dir := tb.TempDir()
	return MustOpenAt(tb, dir), dir
}

// MustOpenAt opens (or reopens) the journal under dir.
func MustOpenAt(tb testing.TB, dir string) *store.Store {
	tb.Helper()
	return MustOpenWith(tb, store.Options{StorageDir: dir})
}

// MustOpenWith opens the journal opts name, on the test clock unless opts
// brings its own.
func MustOpenWith(tb testing.TB, opts store.Options) *store.Store {
	tb.Helper()
	if opts.Now == nil {
		opts.Now = (&Clock{T: DefaultNow}).Now
	}
	s, err := store.Open(context.Background(), opts)
	if err != nil {
		tb.Fatalf("open journal: %v", err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s
}
