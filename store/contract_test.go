package store_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3"

	"github.com/mindroomd/mindroomd/contract"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/sqlitefs"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
	"github.com/mindroomd/mindroomd/walbuf"
)

// sqliteBackend is one journal directory on a real on-disk SQLite file.
type sqliteBackend struct {
	dir             string
	maxUnmergedTail int
	walBuffer       bool
	clock           testsupport.ShiftClock
}

func sqliteFactory(tb testing.TB) contract.Backend { return &sqliteBackend{dir: tb.TempDir()} }

// mergingFactory opens journals that merge the page index's tail every n
// new visible rows. With the default bound the contract's small journals
// never leave the tail; n = 1 puts every row in the index, n = 3 spreads
// conversations over both.
func mergingFactory(n int) contract.Factory {
	return func(tb testing.TB) contract.Backend {
		return &sqliteBackend{dir: tb.TempDir(), maxUnmergedTail: n}
	}
}

// walBufferFactory opens journals through the gathering VFS (package
// walbuf), so the contract holds under both VFS the store can use.
func walBufferFactory(tb testing.TB) contract.Backend {
	return &sqliteBackend{dir: tb.TempDir(), walBuffer: true}
}

// Open implements contract.Backend.
func (b *sqliteBackend) Open(tb testing.TB) journal.Store {
	tb.Helper()
	if b.clock.Base.IsZero() {
		b.clock.Base = testsupport.DefaultNow
	}
	return testsupport.MustOpenWith(tb, store.Options{StorageDir: b.dir, MaxUnmergedTail: b.maxUnmergedTail, WALBuffer: b.walBuffer,
		Now: b.clock.Now})
}

// Advance implements contract.Backend.
func (b *sqliteBackend) Advance(d time.Duration) { b.clock.Advance(d) }

// CorruptPayload implements contract.Backend: the write a foreign process
// would do, through its own connection, while the store stays open.
func (b *sqliteBackend) CorruptPayload(tb testing.TB, p journal.Principal, eventID string) {
	tb.Helper()
	testsupport.MustCorruptPayload(tb, b.dir, p, eventID)
}

// openRaw opens the journal file with the plain driver, outside the store.
func openRaw(tb testing.TB, dir string) *sql.DB {
	tb.Helper()
	db, err := sql.Open("sqlite3", sqlitefs.Path(dir)+"?_busy_timeout=10000")
	if err != nil {
		tb.Fatalf("open raw journal: %v", err)
	}
	tb.Cleanup(func() { _ = db.Close() })
	return db
}

func TestContract(t *testing.T) { contract.Run(t, sqliteFactory) }

func TestContractWithEveryRowMergedIntoThePageIndex(t *testing.T) {
	contract.Run(t, mergingFactory(1))
}

func TestContractWithConversationsSplitBetweenIndexAndTail(t *testing.T) {
	contract.Run(t, mergingFactory(3))
}

func TestContractWithTheWALBuffer(t *testing.T) { contract.Run(t, walBufferFactory) }

// Each backend admits through the VFS it names, so the two contract runs
// are of two VFS and not one twice. walbuf's counters are the process's;
// no test here runs beside another.
func TestEachBackendAdmitsThroughItsOwnVFS(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name     string
		factory  contract.Factory
		buffered bool
	}{
		{"Stock", sqliteFactory, false},
		{"WALBuffer", walBufferFactory, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := c.factory(t).Open(t)
			v, err := s.Principal(ctx, "helper", "@bot:example.org")
			if err != nil {
				t.Fatalf("Principal: %v", err)
			}
			before := walbuf.ReadStats().Received
			in := mx.Live("!room:example.org", mx.Message("$m", "@alice:example.org", 1000, "hi"))
			if _, err := v.AdmitBatch(ctx, in, ""); err != nil {
				t.Fatalf("AdmitBatch: %v", err)
			}
			if got := walbuf.ReadStats().Received > before; got != c.buffered {
				t.Fatalf("the admission's WAL writes went through the gathering VFS: %v, want %v", got, c.buffered)
			}
		})
	}
}

// TestSettledRowsKeepNoPayloadOnDisk checks what the contract cannot see
// through the interface: context-only and settled rows keep their identity
// and nothing else, so the journal never turns into a raw-event cache.
func TestSettledRowsKeepNoPayloadOnDisk(t *testing.T) {
	ctx := context.Background()
	s, dir := testsupport.MustOpen(t)
	v, err := s.Principal(ctx, "helper", "@bot:example.org")
	if err != nil {
		t.Fatalf("Principal: %v", err)
	}
	live := mx.Live("!room:example.org",
		mx.Message("$pending", "@alice:example.org", 1000, "still owed"),
		mx.Message("$settled", "@alice:example.org", 1001, "answered"),
		mx.Notice("$notice", "@alice:example.org", 1002, "fyi"),
		mx.Message("$echo", "@bot:example.org", 1003, "mine"),
		mx.Message("$redacted", "@alice:example.org", 1004, "oops"),
		mx.Redaction("$x", "@alice:example.org", 1005, "$redacted"),
	)
	history := mx.In("!room:example.org", journal.History, mx.Message("$old", "@alice:example.org", 500, "old"))
	for _, in := range [][]journal.Inbound{live, history} {
		if _, err := v.AdmitBatch(ctx, in, ""); err != nil {
			t.Fatalf("AdmitBatch: %v", err)
		}
	}
	if n, err := v.Settle(ctx, "$settled"); err != nil || n != 1 {
		t.Fatalf("Settle = %d, %v; want 1", n, err)
	}

	rows, err := openRaw(t, dir).QueryContext(ctx, `SELECT j.event_id, j.state, p.seq IS NOT NULL
		FROM journal_events j LEFT JOIN journal_payloads p ON p.seq = j.seq ORDER BY j.seq`)
	if err != nil {
		t.Fatalf("query journal: %v", err)
	}
	defer rows.Close()
	got := map[string][2]int{}
	for rows.Next() {
		var (
			id          string
			state       int
			payloadKept bool
		)
		if err := rows.Scan(&id, &state, &payloadKept); err != nil {
			t.Fatalf("scan: %v", err)
		}
		kept := 0
		if payloadKept {
			kept = 1
		}
		got[id] = [2]int{state, kept}
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("rows: %v", err)
	}
	// state 0 is pending, 1 settled; only pending rows keep a payload.
	want := map[string][2]int{
		"$pending": {0, 1}, "$settled": {1, 0}, "$notice": {1, 0}, "$echo": {1, 0},
		"$redacted": {1, 0}, "$x": {0, 1}, "$old": {1, 0},
	}
	if len(got) != len(want) {
		t.Fatalf("journal rows = %v, want %v", got, want)
	}
	for id, w := range want {
		if got[id] != w {
			t.Fatalf("%s: (state, payload kept) = %v, want %v", id, got[id], w)
		}
	}
}
