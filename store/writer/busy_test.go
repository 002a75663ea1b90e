package writer_test

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/mattn/go-sqlite3"

	"github.com/mindroomd/mindroomd/store/writer"
)

// shortBusyTimeout is the writer's busy timeout in these tests: a lock held
// until the test says so outlasts it many times over.
const shortBusyTimeout = 50 * time.Millisecond

// holdWriteLock takes the journal's write lock on a connection outside the
// writer, as a sqlite3 shell's BEGIN IMMEDIATE does, and returns what
// releases it.
func (h *harness) holdWriteLock(t *testing.T) (release func()) {
	t.Helper()
	outside, err := sql.Open("sqlite3", (&url.URL{Scheme: "file", Path: h.db.Path, RawQuery: "_txlock=immediate"}).String())
	if err != nil {
		t.Fatalf("open an outside connection: %v", err)
	}
	tx, err := outside.BeginTx(h.ctx, nil)
	if err != nil {
		_ = outside.Close()
		t.Fatalf("take the write lock outside the writer: %v", err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			if err := tx.Rollback(); err != nil {
				t.Errorf("release the outside write lock: %v", err)
			}
			if err := outside.Close(); err != nil {
				t.Errorf("close the outside connection: %v", err)
			}
		})
	}
	t.Cleanup(release)
	return release
}

// busySignals returns an OnBusy hook and the channel it reports each wait
// on, without ever blocking the writer.
func busySignals() (func(time.Duration), <-chan time.Duration) {
	ch := make(chan time.Duration, 64)
	return func(waited time.Duration) {
		select {
		case ch <- waited:
		default: // the test has seen enough of them
		}
	}, ch
}

// awaitBusy waits until the writer reports a BEGIN that met the lock past
// its busy timeout, failing t if the writer stops instead.
func (h *harness) awaitBusy(t *testing.T, busy <-chan time.Duration) time.Duration {
	t.Helper()
	select {
	case waited := <-busy:
		return waited
	case <-h.done:
		t.Fatalf("the writer stopped on a busy database: %v", h.stopErr())
	case <-h.ctx.Done():
		t.Fatalf("the writer never reported the busy database: %v", h.ctx.Err())
	}
	return 0
}

func TestAWriterWaitsOutAnOutsideWriteLockAndLosesNothing(t *testing.T) {
	onBusy, busy := busySignals()
	h := newHarness(t, harnessOptions{busyTimeout: shortBusyTimeout, onBusy: onBusy})
	release := h.holdWriteLock(t)

	// G is the first command, so it is in the batch that meets the lock;
	// its caller gives up during the wait.
	gaveUp, cancel := context.WithCancel(h.ctx)
	defer cancel()
	g := make(chan *writer.Executed, 1)
	h.root.Send(h.pid, &writer.Execute{Ctx: gaveUp, Name: "G", Run: insert("g"), Reply: g})
	keys := []string{"a", "b", "c"}
	replies := make([]<-chan *writer.Executed, len(keys))
	for i, k := range keys {
		replies[i] = h.send(k, insert(k))
	}

	if waited := h.awaitBusy(t, busy); waited <= 0 {
		t.Errorf("OnBusy: got a wait of %v, want it positive", waited)
	}
	cancel()
	// The waiting batch lets go of G while the lock is still held.
	if r := h.replyOrStop(t, "G", g); !errors.Is(r.Err, context.Canceled) {
		t.Errorf("G, whose caller gave up during the wait: got %v, want %v", r.Err, context.Canceled)
	}
	for i, k := range keys {
		select {
		case r := <-replies[i]:
			t.Fatalf("%s answered while another connection held the write lock: %v", k, r.Err)
		default:
		}
	}
	h.mustBeRunning(t, "waiting for the write lock")

	release()
	for i, k := range keys {
		if r := h.replyOrStop(t, k, replies[i]); r.Err != nil {
			t.Errorf("%s: got %v, want nil once the lock was released", k, r.Err)
		}
		if !h.present(k) {
			t.Errorf("row %q not committed after the lock was released", k)
		}
	}
	if h.present("g") {
		t.Errorf("G ran though its caller gave up before its batch began")
	}
	if _, err := writer.Request(h.ctx, h.root, h.pid, &writer.Execute{Name: "later", Run: insert("later")}, h.done); err != nil {
		t.Fatalf("command after the wait: %v", err)
	}
	h.mustBeRunning(t, "the lock was released")
}

func TestAnOrderlyStopGivesUpABatchStillWaitingForABusyDatabase(t *testing.T) {
	onBusy, busy := busySignals()
	closing := make(chan struct{})
	h := newHarness(t, harnessOptions{busyTimeout: shortBusyTimeout, onBusy: onBusy, closing: closing})
	// Held until the test ends: the stop must not wait for it.
	h.holdWriteLock(t)

	// A's caller never gives up (no Ctx), so only the stop ends its wait.
	a := h.send("A", insert("a"))
	h.awaitBusy(t, busy)
	close(closing)
	h.root.Poison(h.pid)

	r := h.replyOrStop(t, "A", a)
	if !errors.Is(r.Err, writer.ErrBusy) {
		t.Errorf("A: got %v, want %v", r.Err, writer.ErrBusy)
	}
	var se sqlite3.Error
	if !errors.As(r.Err, &se) || se.Code != sqlite3.ErrBusy {
		t.Errorf("A: got %v, want it to wrap SQLITE_BUSY", r.Err)
	}
	if err := h.stopErr(); err != nil {
		t.Errorf("OnStopped: got %v, want nil: a busy database is no fault", err)
	}
	if h.present("a") {
		t.Errorf("row %q committed though it was given up", "a")
	}
}
