package pgfs_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/pgfs"
)

// endSessions ends, from a connection of its own, every session whose
// application_name is name, as a lost network or a killed process would.
const endSessions = `SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity WHERE application_name = $1`

// named opens the replica id of several on url.
func named(t *testing.T, url, id string, check time.Duration) *pgfs.Store {
	t.Helper()
	s, err := pgfs.Open(context.Background(), pgfs.Options{URL: url, Leases: true, Replica: id, LeaseCheck: check})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// live is the replicas s sees live, by name.
func live(t *testing.T, s *pgfs.Store) map[string]bool {
	t.Helper()
	reps, err := s.Replicas(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, r := range reps {
		out[r.ID] = r.Live
	}
	return out
}

// end ends the sessions named name, and fails unless there were want.
func end(t *testing.T, url, name string, want int) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, endSessions, name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != want {
		t.Fatalf("ended %d sessions named %q, want %d", n, name, want)
	}
}

func TestAReplicaWhosePresenceSessionEndsStopsCountingAsLiveAtOnce(t *testing.T) {
	ctx := context.Background()
	url := cluster.Schema(t)
	a, b := named(t, url, "a", time.Hour), named(t, url, "b", time.Hour)
	for _, s := range []*pgfs.Store{a, b} {
		if err := s.Beat(ctx, "http://"+s.ReplicaID()); err != nil {
			t.Fatal(err)
		}
	}
	if got := live(t, b); !got["a"] || !got["b"] {
		t.Fatalf("live after both beat: %v", got)
	}
	// a's last beat is fresh, but its presence session is gone.
	end(t, url, "mindroomd replica a", 1)
	if got := live(t, b); got["a"] || !got["b"] {
		t.Fatalf("live after a's presence ended: %v, want b alone", got)
	}
	// Its next beat opens a new session: live again.
	if err := a.Beat(ctx, "http://a"); err == nil {
		t.Fatal("a beat on a session the server ended")
	}
	if err := a.Beat(ctx, "http://a"); err != nil {
		t.Fatal(err)
	}
	if got := live(t, b); !got["a"] {
		t.Fatalf("live after a beat again: %v", got)
	}
	// Leaving takes it out of the list.
	if err := a.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if got := live(t, b); len(got) != 1 || !got["b"] {
		t.Fatalf("replicas after a left: %v, want b alone", got)
	}
}

func TestASecondReplicaOfTheSameNameIsRefused(t *testing.T) {
	ctx := context.Background()
	url := cluster.Schema(t)
	first, second := named(t, url, "twin", time.Hour), named(t, url, "twin", time.Hour)
	if err := first.Beat(ctx, "http://first"); err != nil {
		t.Fatal(err)
	}
	if err := second.Beat(ctx, "http://second"); !errors.Is(err, pgfs.ErrReplicaRunning) {
		t.Fatalf("the second replica of one name beat: %v, want ErrReplicaRunning", err)
	}
}

func TestAnAgentsOwnerIsTheLiveReplicaHoldingItsLease(t *testing.T) {
	ctx := context.Background()
	url := cluster.Schema(t)
	a, b := named(t, url, "a", 50*time.Millisecond), named(t, url, "b", 50*time.Millisecond)
	p, err := a.Register(ctx, journal.Principal{Agent: "owned", UserID: "@owned:example.org"})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*pgfs.Store{a, b} {
		if err := s.Beat(ctx, "http://"+s.ReplicaID()+".internal:8787"); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := b.Owner(ctx, "owned"); !errors.Is(err, pgfs.ErrNoOwner) {
		t.Fatalf("the owner of an agent nobody holds: %v, want ErrNoOwner", err)
	}
	l := takeLease(t, a, p.ID)
	id, url2, err := b.Owner(ctx, "owned")
	if err != nil || id != "a" || url2 != "http://a.internal:8787" {
		t.Fatalf("owner = %q %q %v, want a at its URL", id, url2, err)
	}
	free, err := b.Free(ctx, []int64{p.ID})
	if err != nil || free[p.ID] {
		t.Fatalf("a held lease reads free: %v %v", free, err)
	}
	holders, err := b.Holders(ctx)
	if err != nil || len(holders) != 1 || holders[0].Replica != "a" || holders[0].Generation != l.Generation || holders[0].SinceMS == 0 {
		t.Fatalf("holders = %+v, %v", holders, err)
	}
	// Another replica ends a silent one's lease sessions: the lease is
	// lost on a's side at its next check, and free to take.
	if n, err := b.TerminateLeases(ctx, "a"); err != nil || n != 1 {
		t.Fatalf("ended %d of a's lease sessions: %v", n, err)
	}
	select {
	case <-l.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("a never noticed its lease session ended")
	}
	if free, err := b.Free(ctx, []int64{p.ID}); err != nil || !free[p.ID] {
		t.Fatalf("the ended lease does not read free: %v %v", free, err)
	}
	lb := takeLease(t, b, p.ID)
	if lb.Generation != l.Generation+1 {
		t.Fatalf("b took generation %d after a's %d", lb.Generation, l.Generation)
	}
	// Handed back, the holder is cleared at once.
	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if holders, err := b.Holders(ctx); err != nil || holders[0].Replica != "" {
		t.Fatalf("holders after the release = %+v, %v", holders, err)
	}
	if a.FencedWrites() != 0 {
		t.Fatalf("a counts %d refused writes, having tried none", a.FencedWrites())
	}
	if err := write(a, p.ID, "late"); !errors.Is(err, pgfs.ErrLeaseLost) || a.FencedWrites() != 1 {
		t.Fatalf("a's write after its lease was lost = %v (%d refused), want ErrLeaseLost, counted", err, a.FencedWrites())
	}
}

func TestReplicasOpeningANewDatabaseAtOnceAllMigrateIt(t *testing.T) {
	url := cluster.Schema(t)
	const replicas = 4
	errs := make(chan error, replicas)
	for i := range replicas {
		go func() {
			s, err := pgfs.Open(context.Background(), pgfs.Options{URL: url, Leases: true, Replica: fmt.Sprintf("r%d", i)})
			if err == nil {
				s.Close()
			}
			errs <- err
		}()
	}
	for range replicas {
		if err := <-errs; err != nil {
			t.Fatalf("a replica opening a new database beside others: %v", err)
		}
	}
}
