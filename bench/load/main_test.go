package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/mattn/go-sqlite3"
)

// smallConfig is a short run on a handful of conversations.
func smallConfig(t *testing.T) config {
	t.Helper()
	cfg, err := parseFlags([]string{"-short", "-duration", "1s", "-principals", "3", "-rooms", "2",
		"-rate", "60", "-history", "700", "-readers", "2", "-exporters", "1", "-drain-timeout", "30s",
		"-storage", t.TempDir()}, io.Discard)
	if err != nil {
		t.Fatalf("flags: %v", err)
	}
	return cfg
}

func TestAQuietRunPassesAndAnswersEveryActionableEvent(t *testing.T) {
	res, err := run(context.Background(), smallConfig(t), io.Discard)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	var report strings.Builder
	res.print(&report)
	if len(res.failures) > 0 {
		t.Fatalf("a run without interference failed: %v\n%s", res.failures, report.String())
	}
	if res.events == 0 || res.actionable == 0 {
		t.Fatalf("nothing admitted: %d events, %d actionable", res.events, res.actionable)
	}
	if res.historyEvents != 3*2*(700+1) {
		t.Errorf("history events: got %d, want %d (a join and 700 messages a room)", res.historyEvents, 3*2*701)
	}
	// A redaction settles its target if the target is still pending, so
	// a redacted event may go unanswered; no other event may.
	if res.acked != res.enqueued || res.enqueued > res.actionable || res.actionable-res.enqueued > res.byKind[kindRedaction] {
		t.Errorf("answers: %d actionable events, %d redactions, %d enqueued, %d acknowledged",
			res.actionable, res.byKind[kindRedaction], res.enqueued, res.acked)
	}
	if res.admit.N != int(res.batches) {
		t.Errorf("admission latencies: %d for %d batches", res.admit.N, res.batches)
	}
	if res.pages == 0 || res.exports == 0 || res.exportPages < 2*res.exports {
		t.Errorf("readers read %d pages, exporters %d conversations in %d pages; want some, each over two pages",
			res.pages, res.exports, res.exportPages)
	}
	for _, want := range []string{"no homeserver", "lock errors 0", "PASS"} {
		if !strings.Contains(report.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, report.String())
		}
	}
}

func TestAWriteLockHeldOutsideTheStoreFailsTheRun(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIPPED under -short: this test waits out the writer's 10 s busy timeout; run it without -short (make test does)")
	}
	cfg := smallConfig(t)
	var (
		outside *sql.DB
		lock    *sql.Tx
		release sync.Once
	)
	// Another connection, as a sqlite3 shell would, takes the write lock
	// as soon as the store is open and keeps it until the writer reports
	// the wait.
	cfg.afterOpen = func(dbPath string) {
		var err error
		outside, err = sql.Open("sqlite3", (&url.URL{Scheme: "file", Path: dbPath, RawQuery: "_txlock=immediate"}).String())
		if err == nil {
			lock, err = outside.BeginTx(context.Background(), nil)
		}
		if err != nil {
			t.Errorf("take the write lock outside the store: %v", err)
		}
	}
	cfg.onBusy = func() { release.Do(func() { go func() { _ = lock.Rollback() }() }) }
	res, err := run(context.Background(), cfg, io.Discard)
	if outside != nil {
		outside.Close()
	}
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if res.busyWaits == 0 || res.logs.Locks == 0 {
		t.Errorf("the writer's wait went unseen: OnBusy %d, log lines %d", res.busyWaits, res.logs.Locks)
	}
	if len(res.failures) == 0 || !strings.Contains(res.failures[0], "lock errors") {
		t.Errorf("failures: got %q, want the lock errors first", res.failures)
	}
}

func TestAnErrorIsALockErrorByItsCodeOrItsText(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"SQLITE_BUSY", fmt.Errorf("admit batch: %w", sqlite3.Error{Code: sqlite3.ErrBusy}), true},
		{"SQLITE_LOCKED", fmt.Errorf("read: %w", sqlite3.Error{Code: sqlite3.ErrLocked}), true},
		{"TextOnly", errors.New("begin: database is locked"), true},
		{"WriterBusy", errors.New("enqueue: database busy"), true},
		{"Constraint", fmt.Errorf("admit batch: %w", sqlite3.Error{Code: sqlite3.ErrConstraint}), false},
		{"Other", errors.New("no such delivery"), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := isLockError(c.err); got != c.want {
				t.Errorf("isLockError(%v) = %v, want %v", c.err, got, c.want)
			}
		})
	}
}

func TestTheRunsOwnStopIsNotAnError(t *testing.T) {
	tally := newErrorTally()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	tally.add(ctx, "read", fmt.Errorf("read page: %w", context.Canceled))
	tally.add(ctx, "read", sqlite3.Error{Code: sqlite3.ErrBusy})
	s := tally.summary()
	if s.Total != 1 || s.Locks != 1 {
		t.Errorf("after a cancelled read and a busy one: %d errors, %d lock errors; want 1 and 1", s.Total, s.Locks)
	}
}

func TestMemoryIsReadFromProcStatus(t *testing.T) {
	m, err := readMemory()
	if err != nil {
		t.Fatalf("read memory: %v", err)
	}
	if m.Peak < 1<<20 || m.Anon <= 0 || m.File <= 0 || m.Anon+m.File > m.Peak {
		t.Errorf("memory: %+v; want a peak of at least 1 MiB holding both parts", m)
	}
}

func TestLogLinesAreCountedByLevelAndLock(t *testing.T) {
	c := newLogCapture()
	for _, line := range []string{
		`{"level":"debug","message":"Spawned"}`,
		`{"level":"warn","actor":"writer","waited":10000,"message":"Database busy: another connection holds the write lock; waiting"}`,
		`{"level":"error","error":"database is locked","message":"Claim failed"}`,
	} {
		if _, err := c.Write([]byte(line + "\n")); err != nil {
			t.Fatal(err)
		}
	}
	s := c.summary()
	if s.Lines != 3 || s.ByLevel["debug"] != 1 || s.ByLevel["warn"] != 1 || s.ByLevel["error"] != 1 || s.Locks != 2 || len(s.Kept) != 2 {
		t.Errorf("summary: %+v", s)
	}
}
