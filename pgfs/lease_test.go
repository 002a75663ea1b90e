package pgfs_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/pgfs"
)

// terminateLeaseHolder ends, from a connection of its own, the session
// that holds principal's lease, as a lost network or a killed replica
// would.
const terminateLeaseHolder = `SELECT count(pg_terminate_backend(pid)) FROM pg_locks
	WHERE locktype = 'advisory' AND objsubid = 1 AND granted
	  AND ((classid::bigint << 32) | objid::bigint) = $1`

// replica opens one replica of several on url.
func replica(t *testing.T, url string, check time.Duration) *pgfs.Store {
	t.Helper()
	s, err := pgfs.Open(context.Background(), pgfs.Options{URL: url, Leases: true, LeaseCheck: check})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// write stores key through s's group commit for principal.
func write(s *pgfs.Store, principal int64, key string) error {
	return s.Group(context.Background(), principal, func(tx *pgfs.Tx) error { return tx.Raw(insertMeta, key) })
}

// takeLease takes principal's lease on s, waiting for a holder the test
// cut off to be gone.
func takeLease(t *testing.T, s *pgfs.Store, principal int64) *pgfs.Lease {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		l, held, err := s.TryLease(context.Background(), principal)
		if err != nil {
			t.Fatal(err)
		}
		if held {
			return l
		}
		if time.Now().After(deadline) {
			t.Fatal("the lease was never free")
		}
	}
}

func TestAReplicaThatLostItsLeaseCommitsNothingMore(t *testing.T) {
	ctx := context.Background()
	url := cluster.Schema(t)
	// a checks its lease's connection once an hour: it goes on believing
	// it holds the lease, as a paused or partitioned replica does.
	a, b := replica(t, url, time.Hour), replica(t, url, time.Hour)
	p, err := a.Register(ctx, journal.Principal{Agent: "leased", UserID: "@leased:example.org"})
	if err != nil {
		t.Fatal(err)
	}
	if err := write(a, p.ID, "unleased"); !errors.Is(err, pgfs.ErrLeaseLost) {
		t.Fatalf("a write without the lease = %v, want ErrLeaseLost", err)
	}
	la := takeLease(t, a, p.ID)
	if _, held, err := b.TryLease(ctx, p.ID); err != nil || held {
		t.Fatalf("a second replica took a held lease: %v, %v", held, err)
	}
	if err := write(a, p.ID, "a1"); err != nil {
		t.Fatalf("the holder's write: %v", err)
	}
	if err := write(b, p.ID, "b0"); !errors.Is(err, pgfs.ErrLeaseLost) {
		t.Fatalf("the other replica's write = %v, want ErrLeaseLost", err)
	}

	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	var ended int
	if err := admin.QueryRow(ctx, terminateLeaseHolder, a.LeaseKey(p.ID)).Scan(&ended); err != nil || ended != 1 {
		t.Fatalf("terminated %d sessions (%v), want the lease holder's", ended, err)
	}
	lb := takeLease(t, b, p.ID)
	if lb.Generation != la.Generation+1 {
		t.Fatalf("the new lease's generation = %d, want %d", lb.Generation, la.Generation+1)
	}
	// a has not noticed: its write is refused by the generation alone.
	err = write(a, p.ID, "a2")
	if !errors.Is(err, pgfs.ErrLeaseLost) || !strings.Contains(err.Error(), "the lease took") {
		t.Fatalf("the old holder's write = %v, want it fenced by the generation", err)
	}
	if err := write(b, p.ID, "b1"); err != nil {
		t.Fatalf("the new holder's write: %v", err)
	}
	// Handed back, the lease is free at once.
	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lb.Lost():
	default:
		t.Fatal("a released lease is not lost")
	}
	if err := write(b, p.ID, "b2"); !errors.Is(err, pgfs.ErrLeaseLost) {
		t.Fatalf("a write after the release = %v, want ErrLeaseLost", err)
	}
	if _, held, err := a.TryLease(ctx, p.ID); err != nil || !held {
		t.Fatalf("the released lease: %v, %v; want it free", held, err)
	}
	for key, want := range map[string]int{"unleased": 0, "a1": 1, "b0": 0, "a2": 0, "b1": 1, "b2": 0} {
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM store_meta WHERE key = $1`, key).Scan(&n); err != nil || n != want {
			t.Fatalf("%s is stored %d times (%v), want %d", key, n, err, want)
		}
	}
}

func TestALeaseWhoseConnectionDiesIsGivenUp(t *testing.T) {
	ctx := context.Background()
	url := cluster.Schema(t)
	a := replica(t, url, 20*time.Millisecond)
	p, err := a.Register(ctx, journal.Principal{Agent: "watched", UserID: "@watched:example.org"})
	if err != nil {
		t.Fatal(err)
	}
	l := takeLease(t, a, p.ID)
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, terminateLeaseHolder, a.LeaseKey(p.ID)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("the lease was not given up after its connection died")
	}
	if err := write(a, p.ID, "after"); !errors.Is(err, pgfs.ErrLeaseLost) {
		t.Fatalf("a write after the loss = %v, want ErrLeaseLost", err)
	}
}
