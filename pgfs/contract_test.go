package pgfs_test

import (
	"context"
	"github.com/mindroomd/mindroomd/store"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mindroomd/mindroomd/contract"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/pg"
)

// cluster is the test binary's throwaway PostgreSQL; each backend gets a
// schema of its own in it.
var cluster *pg.Cluster

func TestMain(m *testing.M) {
	if os.Getenv(crashChildURLEnv) != "" {
		// The crash proof's child admits into its parent's schema.
		os.Exit(m.Run())
	}
	os.Exit(pg.RunTests(m, func(c *pg.Cluster) { cluster = c }))
}

// pgBackend is one journal in a fresh schema.
type pgBackend struct {
	url   string
	clock testsupport.ShiftClock
}

func pgFactory(tb testing.TB) contract.Backend { return &pgBackend{url: cluster.Schema(tb)} }

// Open implements contract.Backend.
func (b *pgBackend) Open(tb testing.TB) journal.Store {
	tb.Helper()
	return mustOpenOn(tb, b.url, b.clock.Now)
}

// Advance implements contract.Backend.
func (b *pgBackend) Advance(d time.Duration) { b.clock.Advance(d) }

func mustOpen(tb testing.TB, url string) *store.Store {
	tb.Helper()
	return mustOpenOn(tb, url, nil)
}

// mustOpenOn opens the journal at url on the clock now (time.Now when nil).
func mustOpenOn(tb testing.TB, url string, now func() time.Time) *store.Store {
	tb.Helper()
	s, err := store.Open(context.Background(), store.Options{DatabaseURL: url, Now: now})
	if err != nil {
		tb.Fatalf("open journal: %v", err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s
}

// corruptPayload overwrites one pending payload with bytes that do not
// decode, as a foreign writer would.
const corruptPayload = `UPDATE journal_payloads SET payload = $1
	WHERE seq = (SELECT j.seq FROM journal_events j JOIN principals p ON p.id = j.principal
		WHERE p.agent = $2 AND p.user_id = $3 AND j.event_id = $4)`

// CorruptPayload implements contract.Backend, through a connection of its
// own while the store stays open.
func (b *pgBackend) CorruptPayload(tb testing.TB, p journal.Principal, eventID string) {
	tb.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, b.url)
	if err != nil {
		tb.Fatalf("connect for corruption: %v", err)
	}
	defer conn.Close(ctx)
	tag, err := conn.Exec(ctx, corruptPayload, "{not json", p.Agent, p.UserID, eventID)
	if err != nil {
		tb.Fatalf("corrupt %s: %v", eventID, err)
	}
	if tag.RowsAffected() != 1 {
		tb.Fatalf("corrupt %s: %d rows changed, want 1", eventID, tag.RowsAffected())
	}
}

func TestContract(t *testing.T) { contract.Run(t, pgFactory) }

func TestDeliveryContract(t *testing.T) { contract.RunDelivery(t, pgFactory) }

func TestReadContract(t *testing.T) { contract.RunReads(t, pgFactory) }
