package store_test

import (
	"context"
	"database/sql"
	"net/url"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

func TestAnAdmissionWaitsOutAnOutsideWriteLockHeldPastTheBusyTimeout(t *testing.T) {
	const room = "!busy:example.org"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	busy := make(chan time.Duration, 16)
	s := testsupport.MustOpenWith(t, store.Options{StorageDir: t.TempDir(), OnBusy: func(waited time.Duration) {
		select {
		case busy <- waited:
		default:
		}
	}})
	p, err := s.Principal(ctx, "busy", "@busybot:example.org")
	if err != nil {
		t.Fatalf("principal: %v", err)
	}

	// Another connection, as a sqlite3 shell or a backup tool would, takes
	// the write lock and keeps it past the writer's busy timeout.
	outside, err := sql.Open("sqlite3", (&url.URL{Scheme: "file", Path: s.DB().Path, RawQuery: "_txlock=immediate"}).String())
	if err != nil {
		t.Fatalf("open an outside connection: %v", err)
	}
	defer outside.Close()
	lock, err := outside.BeginTx(ctx, nil)
	if err != nil {
		t.Fatalf("take the write lock outside the store: %v", err)
	}
	defer func() { _ = lock.Rollback() }()

	ts := testsupport.DefaultNow.UnixMilli()
	evs := []mx.Ev{mx.Message("$busy-1", "@alice:example.org", ts, "one"), mx.Message("$busy-2", "@alice:example.org", ts+1, "two")}
	admitted := make(chan error, 1)
	go func() {
		_, err := p.AdmitBatch(ctx, mx.Live(room, evs...), "tok-1")
		admitted <- err
	}()
	select {
	case waited := <-busy:
		t.Logf("the writer met the lock after %v and waits", waited)
	case err := <-admitted:
		t.Fatalf("admission while another connection held the write lock: got %v before the writer waited for it", err)
	case <-ctx.Done():
		t.Fatalf("the writer never reported the busy database: %v", ctx.Err())
	}
	if err := lock.Rollback(); err != nil {
		t.Fatalf("release the outside write lock: %v", err)
	}

	select {
	case err := <-admitted:
		if err != nil {
			t.Fatalf("admission once the lock was released: %v", err)
		}
	case <-ctx.Done():
		t.Fatalf("admission never finished: %v", ctx.Err())
	}
	if f := s.Fatal(); f != nil {
		t.Fatalf("the writer stopped: %v", f)
	}
	if tok, err := p.SyncToken(ctx); err != nil || tok != "tok-1" {
		t.Errorf("sync token: got %q, %v, want %q", tok, err, "tok-1")
	}
	page, err := p.Read(ctx, journal.ReadRequest{RoomID: room, Limit: 10})
	if err != nil {
		t.Fatalf("read the room: %v", err)
	}
	if got, want := len(page.Messages), len(evs); got != want {
		t.Errorf("messages admitted during the wait: got %d, want %d", got, want)
	}

	// Later writes go on as before.
	if _, err := p.AdmitBatch(ctx, mx.Live(room, mx.Message("$busy-3", "@alice:example.org", ts+2, "three")), "tok-2"); err != nil {
		t.Fatalf("admission after the wait: %v", err)
	}
	if tok, err := p.SyncToken(ctx); err != nil || tok != "tok-2" {
		t.Errorf("sync token after the wait: got %q, %v, want %q", tok, err, "tok-2")
	}
	select {
	case <-s.Done():
		t.Fatalf("the writer stopped: %v", s.Fatal())
	default:
	}
}
