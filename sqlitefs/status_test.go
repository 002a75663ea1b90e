package sqlitefs_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/journalsql"
	"github.com/mindroomd/mindroomd/sqlitefs"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

const statusRoom = "!status:example.org"

// statusOf reads the status of the principal agent from db.
func statusOf(t *testing.T, db *sqlitefs.DB, agent string) journal.PrincipalStatus {
	t.Helper()
	st, err := journalsql.Status(context.Background(), db.Reader())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st {
		if s.Agent == agent {
			return s
		}
	}
	t.Fatalf("status has no principal %s: %+v", agent, st)
	return journal.PrincipalStatus{}
}

// Each sync batch stores its token with the batch's time, which is the
// time of the principal's last completed sync; a batch without a token
// leaves both as they were.
func TestTheSyncTokenIsStoredWithTheTimeOfItsBatch(t *testing.T) {
	ctx := context.Background()
	clock := &testsupport.Clock{T: testsupport.DefaultNow}
	s := testsupport.MustOpenWith(t, store.Options{StorageDir: t.TempDir(), Now: clock.Now})
	v, err := s.Principal(ctx, "helper", "@helper:example.org")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Principal(ctx, "idle", "@idle:example.org"); err != nil {
		t.Fatal(err)
	}
	if got := statusOf(t, s.DB(), "helper"); got.HasSyncToken || got.SyncTokenMS != 0 {
		t.Fatalf("before any sync: token %v at %d, want none at 0", got.HasSyncToken, got.SyncTokenMS)
	}

	first := clock.T
	if _, err := v.AdmitBatch(ctx, mx.Live(statusRoom, mx.Message("$a", "@alice:example.org", 1000, "hi")), "s_1"); err != nil {
		t.Fatal(err)
	}
	if got := statusOf(t, s.DB(), "helper"); !got.HasSyncToken || got.SyncTokenMS != first.UnixMilli() {
		t.Fatalf("after the first sync: token %v at %d, want one at %d", got.HasSyncToken, got.SyncTokenMS, first.UnixMilli())
	}

	// An empty sync still completes, and moves the time on.
	clock.T = clock.T.Add(5 * time.Minute)
	second := clock.T
	if _, err := v.AdmitBatch(ctx, nil, "s_2"); err != nil {
		t.Fatal(err)
	}
	clock.T = clock.T.Add(time.Minute)
	if _, err := v.AdmitBatch(ctx, mx.Live(statusRoom, mx.Message("$b", "@alice:example.org", 2000, "no token")), ""); err != nil {
		t.Fatal(err)
	}
	if got := statusOf(t, s.DB(), "helper"); got.SyncTokenMS != second.UnixMilli() {
		t.Fatalf("sync token stored at %d, want %d: the empty sync's time, untouched by a batch without a token",
			got.SyncTokenMS, second.UnixMilli())
	}
	if tok, err := v.SyncToken(ctx); err != nil || tok != "s_2" {
		t.Fatalf("sync token = %q, %v; want s_2", tok, err)
	}
	if got := statusOf(t, s.DB(), "idle"); got.HasSyncToken || got.SyncTokenMS != 0 {
		t.Fatalf("another principal's sync moved idle's token: %+v", got)
	}
}

// outboxFixture gives helper, in statusRoom, a different number of replies
// in each outbox state (queued 1, attempted 2, acknowledged 3, failed 4,
// retired 5) and two owed departure echoes in another room; quiet gets
// nothing.
func outboxFixture(t *testing.T, s *store.Store) {
	t.Helper()
	ctx := context.Background()
	v, err := s.Principal(ctx, "helper", "@helper:example.org")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Principal(ctx, "quiet", "@quiet:example.org"); err != nil {
		t.Fatal(err)
	}
	for i, state := range []journal.DeliveryState{journal.DeliveryQueued, journal.DeliveryAttempted,
		journal.DeliveryAcknowledged, journal.DeliveryFailed, journal.DeliveryRetired} {
		for j := range i + 1 {
			source := fmt.Sprintf("$%s-%d", state, j)
			if _, err := v.AdmitBatch(ctx, mx.Live(statusRoom, mx.Message(source, "@alice:example.org", int64(1000+10*i+j), "q")), ""); err != nil {
				t.Fatal(err)
			}
			id := journal.ReplyDeliveryID(source)
			if _, err := v.EnqueueAndSettle(ctx, journal.EnqueueRequest{DeliveryID: id, Stage: journal.StageFinal,
				RoomID: statusRoom, Content: []byte(`{"msgtype":"m.text","body":"a"}`), Sources: []string{source}}); err != nil {
				t.Fatal(err)
			}
			switch state {
			case journal.DeliveryRetired:
				err = v.Retire(ctx, id, journal.StageFinal)
			case journal.DeliveryAttempted, journal.DeliveryAcknowledged, journal.DeliveryFailed:
				_, err = v.Claim(ctx, id, journal.StageFinal, "DEVICE")
			}
			if err != nil {
				t.Fatal(err)
			}
			switch state {
			case journal.DeliveryAcknowledged:
				_, err = v.Acknowledge(ctx, id, journal.StageFinal, journal.Sent{EventID: "$sent" + source[1:]})
			case journal.DeliveryFailed:
				err = v.Fail(ctx, id, journal.StageFinal, "M_FORBIDDEN", true)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	// Two local leaves, a rejoin between them, before either echo came:
	// two echoes owed.
	const left = "!left:example.org"
	if _, err := v.FenceDeparture(ctx, left, journal.DepartureLocal, "leave-1"); err != nil {
		t.Fatal(err)
	}
	if err := v.RecordJoin(ctx, left, "join-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := v.FenceDeparture(ctx, left, journal.DepartureLocal, "leave-2"); err != nil {
		t.Fatal(err)
	}
}

func TestStatusCountsTheOutboxByStateAndTheOwedDepartureEchoes(t *testing.T) {
	s, _ := testsupport.MustOpen(t)
	outboxFixture(t, s)
	got := statusOf(t, s.DB(), "helper")
	want := journal.PrincipalStatus{Agent: "helper", UserID: "@helper:example.org", Events: 15, Pending: 0, Visible: 15,
		Queued: 1, Attempted: 2, Acknowledged: 3, Failed: 4, Retired: 5, OwedDepartures: 2}
	if got != want {
		t.Fatalf("status =\n%+v, want\n%+v", got, want)
	}
	if got := statusOf(t, s.DB(), "quiet"); got != (journal.PrincipalStatus{Agent: "quiet", UserID: "@quiet:example.org"}) {
		t.Fatalf("quiet's status = %+v, want nothing counted: helper's rows are not its", got)
	}
}

// The sizes are those of the files themselves: the journal, and its WAL
// while a writer keeps one; none after an orderly close.
func TestSizesAreThoseOfTheJournalAndItsWAL(t *testing.T) {
	ctx := context.Background()
	// No checkpoint may run between the reading and the stat it is checked
	// against: the pages stay in the WAL until the orderly close.
	dir := t.TempDir()
	s := testsupport.MustOpenWith(t, store.Options{StorageDir: dir, CheckpointInterval: time.Hour})
	v, err := s.Principal(ctx, "helper", "@helper:example.org")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.AdmitBatch(ctx, mx.Live(statusRoom, mx.Message("$a", "@alice:example.org", 1000, "hi")), "s_1"); err != nil {
		t.Fatal(err)
	}
	path := sqlitefs.Path(dir)
	ro := openRO(t, dir)
	sz, err := ro.Sizes()
	if err != nil {
		t.Fatal(err)
	}
	db, wal := fileSize(t, path), fileSize(t, path+"-wal")
	if sz.Database != db || sz.WAL != wal || wal == 0 {
		t.Fatalf("sizes = %+v, want the files' %d and %d (a WAL beside an open writer)", sz, db, wal)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if sz, err = ro.Sizes(); err != nil || sz.WAL != 0 || sz.Database != fileSize(t, path) {
		t.Fatalf("sizes after an orderly close = %+v, %v; want the file's %d and no WAL", sz, err, fileSize(t, path))
	}
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}
