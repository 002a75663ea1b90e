package pgfs_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/mindroomd/mindroomd/store"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/migration"
	"github.com/mindroomd/mindroomd/pgfs"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

const (
	storeRoom  = "!store:example.org"
	storeAlice = "@alice:example.org"
)

func connect(t *testing.T, u string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func view(t *testing.T, s journal.Store, agent, user string) journal.PrincipalStore {
	t.Helper()
	v, err := s.Principal(t.Context(), agent, user)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func admit(ctx context.Context, v journal.PrincipalStore, id string, ts int64) error {
	_, err := v.AdmitBatch(ctx, mx.Live(storeRoom, mx.Message(id, storeAlice, ts, "hi "+id)), "")
	return err
}

// A principal's write waits for the lock another transaction holds on its
// row, and commits after it; another principal's write does not wait.
func TestWritesOfOnePrincipalWaitForEachOtherAndOtherPrincipalsDoNot(t *testing.T) {
	u := cluster.Schema(t)
	s := mustOpen(t, u)
	a, b := view(t, s, "a", "@a:example.org"), view(t, s, "b", "@b:example.org")

	// Hold a's row lock as a write transaction of another process would.
	holder := connect(t, u)
	tx, err := holder.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(t.Context(), `SELECT 1 FROM principals WHERE agent = 'a' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	aDone := make(chan error, 1)
	go func() { aDone <- admit(context.Background(), a, "$a1", 1000) }()

	// b commits while a's write is held.
	if err := admit(t.Context(), b, "$b1", 1000); err != nil {
		t.Fatalf("b's write while a's row is locked: %v", err)
	}
	// a's write is waiting on the lock, not finished: PostgreSQL lists it
	// as waiting for a lock.
	waiting := connect(t, u)
	for deadline := time.Now().Add(30 * time.Second); ; {
		var n int
		if err := waiting.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE 'SELECT lease_generation FROM principals%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		select {
		case err := <-aDone:
			t.Fatalf("a's write finished (%v) while another transaction held a's row", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("a's write never waited on the row lock")
		}
		time.Sleep(10 * time.Millisecond) // PostgreSQL signals no lock wait to a client
	}
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := <-aDone; err != nil {
		t.Fatalf("a's write after the lock was released: %v", err)
	}
}

// With many writers of one principal, a reader paging its pending work by
// position never steps past a row that commits later: positions commit in
// order.
func TestAReaderPagingByPositionMissesNoRowWhileOnePrincipalWritesConcurrently(t *testing.T) {
	s := mustOpen(t, cluster.Schema(t))
	v := view(t, s, "bot", "@bot:example.org")
	const writers, each = 8, 40
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				if err := admit(context.Background(), v, fmt.Sprintf("$w%d-%d", w, i), int64(1000+i)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	seen := map[string]bool{}
	after := int64(0)
	for finished := false; ; {
		select {
		case <-done:
			finished = true
		default:
		}
		page, err := v.Pending(t.Context(), 7, after)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page.Events {
			if seen[e.EventID] {
				t.Fatalf("%s read twice", e.EventID)
			}
			seen[e.EventID] = true
		}
		after = page.Next
		if finished && !page.More {
			break
		}
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(seen) != writers*each {
		t.Fatalf("the reader saw %d of %d events paging by position", len(seen), writers*each)
	}
}

// awaitWake waits for one wake-up of sub.
func awaitWake(t *testing.T, sub *hint.Subscription, what string) {
	t.Helper()
	select {
	case <-sub.C():
	case <-time.After(30 * time.Second):
		t.Fatalf("no wake-up: %s", what)
	}
}

func TestACommitInOneProcessWakesTheSubscribersOfAnother(t *testing.T) {
	u := cluster.Schema(t)
	writer := mustOpen(t, u)
	other, err := store.Open(t.Context(), store.Options{DatabaseURL: u, Hints: &hint.Bus{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close() })
	v := view(t, writer, "bot", "@bot:example.org")
	sub := other.Hints().Subscribe(v.Principal().String())
	defer sub.Close()
	if err := admit(t.Context(), v, "$n1", 1000); err != nil {
		t.Fatal(err)
	}
	awaitWake(t, sub, "a commit in the other store")

	// A store of another schema shares the channel but not the hints.
	stranger := mustOpen(t, cluster.Schema(t))
	sv := view(t, stranger, "bot", "@bot:example.org")
	if err := admit(t.Context(), sv, "$x1", 1000); err != nil {
		t.Fatal(err)
	}
	// Its notification and ours travel on one connection in commit order:
	// once ours arrives, the stranger's was already relayed, or dropped.
	if err := admit(t.Context(), v, "$n2", 1001); err != nil {
		t.Fatal(err)
	}
	awaitWake(t, sub, "the second commit")
	select {
	case <-sub.C():
		t.Fatal("another store's commit woke this store's subscriber")
	default:
	}
}

func TestALostListenerConnectionWakesEverySubscriberOnceItIsBack(t *testing.T) {
	u := cluster.Schema(t)
	s := mustOpen(t, u)
	sub := s.Hints().Subscribe("nobody@@nobody:example.org")
	defer sub.Close()
	select {
	case <-sub.C():
		t.Fatal("a subscriber was woken with nothing committed and nothing lost")
	default:
	}
	admin := connect(t, u)
	var killed int
	if err := admin.QueryRow(t.Context(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE query = 'LISTEN mindroomd_hints' AND datname = current_database() AND pid <> pg_backend_pid()
		AND backend_start >= (SELECT max(backend_start) FROM pg_stat_activity WHERE query = 'LISTEN mindroomd_hints')`).Scan(&killed); err != nil {
		t.Fatal(err)
	}
	if killed != 1 {
		t.Fatalf("terminated %d listeners, want this store's one", killed)
	}
	awaitWake(t, sub, "the listener reconnected")
}

func TestAnOpenRefusesAForeignSchemaAndANewerJournal(t *testing.T) {
	u := cluster.Schema(t)
	conn := connect(t, u)
	if _, err := conn.Exec(t.Context(), `CREATE TABLE invoices (id int)`); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Open(t.Context(), store.Options{DatabaseURL: u}); !errors.Is(err, migration.ErrForeignDatabase) {
		t.Fatalf("open of a schema holding another application's table: %v, want %v", err, migration.ErrForeignDatabase)
	}

	u = cluster.Schema(t)
	s := mustOpen(t, u)
	_ = s.Close()
	conn = connect(t, u)
	if _, err := conn.Exec(t.Context(), `INSERT INTO schema_versions (version) VALUES (99)`); err != nil {
		t.Fatal(err)
	}
	var newer *migration.NewerDatabaseError
	if _, err := store.Open(t.Context(), store.Options{DatabaseURL: u}); !errors.As(err, &newer) || newer.Version != 99 {
		t.Fatalf("open of a journal migrated by a newer binary: %v", err)
	}
	if _, err := store.Open(t.Context(), store.Options{DatabaseURL: u, ReadOnly: true}); !errors.As(err, &newer) {
		t.Fatalf("read-only open of a newer journal: %v", err)
	}
}

func TestAReopenedJournalKeepsItsGenerationAndRowsAndMigratesNothingAgain(t *testing.T) {
	u := cluster.Schema(t)
	s := mustOpen(t, u)
	g1, _ := s.Generation(t.Context())
	if err := admit(t.Context(), view(t, s, "bot", "@bot:example.org"), "$kept", 1000); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	s = mustOpen(t, u)
	g2, _ := s.Generation(t.Context())
	if g1 == "" || g1 != g2 {
		t.Fatalf("generation %q became %q on reopening", g1, g2)
	}
	page, err := view(t, s, "bot", "@bot:example.org").Pending(t.Context(), 10, 0)
	if err != nil || len(page.Events) != 1 || page.Events[0].EventID != "$kept" {
		t.Fatalf("after reopening pending = %+v, %v", page, err)
	}
	var versions int
	if err := connect(t, u).QueryRow(t.Context(), `SELECT count(*) FROM schema_versions`).Scan(&versions); err != nil {
		t.Fatal(err)
	}
	if versions != pgfs.SchemaVersion() {
		t.Fatalf("%d version rows, want one per migration (%d)", versions, pgfs.SchemaVersion())
	}
}

func TestAReadOnlyStoreWritesNothingAndRegistersNoPrincipal(t *testing.T) {
	u := cluster.Schema(t)
	w := mustOpen(t, u)
	if err := admit(t.Context(), view(t, w, "bot", "@bot:example.org"), "$m", 1000); err != nil {
		t.Fatal(err)
	}
	ro, err := store.Open(t.Context(), store.Options{DatabaseURL: u, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if _, err := ro.Principal(t.Context(), "stranger", "@stranger:example.org"); !errors.Is(err, store.ErrUnknownPrincipal) {
		t.Fatalf("read-only Principal of an unknown principal: %v", err)
	}
	v := view(t, ro, "bot", "@bot:example.org")
	page, err := v.Read(t.Context(), journal.ReadRequest{RoomID: storeRoom, Limit: 10})
	if err != nil || len(page.Messages) != 1 {
		t.Fatalf("read-only Read = %+v, %v", page, err)
	}
	if err := admit(t.Context(), v, "$refused", 1001); err == nil {
		t.Fatal("a read-only store admitted an event")
	}
}

func TestNoErrorOfOpeningRepeatsTheDatabasePassword(t *testing.T) {
	const secret = "pw-77a1e9-never-printed"
	for name, raw := range map[string]string{
		"unparsable": "postgres://mindroom:" + secret + "@127.0.0.1:notaport/db",
		"refused":    "postgres://mindroom:" + secret + "@127.0.0.1:1/db?connect_timeout=2",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := store.Open(t.Context(), store.Options{DatabaseURL: raw})
			if err == nil {
				t.Fatal("opened")
			}
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("the error shows the password: %v", err)
			}
		})
	}
	// The cluster's own URL with a wrong user, when the server checks it.
	u, _ := url.Parse(cluster.URL())
	u.User = url.UserPassword("nosuchuser", secret)
	if _, err := store.Open(t.Context(), store.Options{DatabaseURL: u.String()}); err != nil && strings.Contains(err.Error(), secret) {
		t.Fatalf("the error shows the password: %v", err)
	}
}

func TestAStoresOwnCommitWakesItsSubscribersOnceNotAgainThroughTheListener(t *testing.T) {
	u := cluster.Schema(t)
	s := mustOpen(t, u)
	other := mustOpen(t, u)
	p, q := view(t, s, "p", "@p:example.org"), view(t, other, "q", "@q:example.org")
	subP := s.Hints().Subscribe(p.Principal().String())
	defer subP.Close()
	subQ := s.Hints().Subscribe(q.Principal().String())
	defer subQ.Close()
	if err := admit(t.Context(), p, "$own", 1000); err != nil {
		t.Fatal(err)
	}
	awaitWake(t, subP, "the store's own commit")
	// Notifications reach the listener in commit order: once q's commit
	// in the other store has woken subQ, p's notification was handled.
	if err := admit(t.Context(), q, "$theirs", 1000); err != nil {
		t.Fatal(err)
	}
	awaitWake(t, subQ, "the other store's commit")
	select {
	case <-subP.C():
		t.Fatal("the store's own commit woke its subscriber a second time, through the listener")
	default:
	}
}

// What the contract cannot see through the interface: only pending rows
// keep a payload, and settling drops it in the same statement.
func TestSettledRowsKeepNoPayload(t *testing.T) {
	u := cluster.Schema(t)
	s := mustOpen(t, u)
	v := view(t, s, "bot", "@bot:example.org")
	live := mx.Live(storeRoom,
		mx.Message("$pending", storeAlice, 1000, "still owed"),
		mx.Message("$settled", storeAlice, 1001, "answered"),
		mx.Notice("$notice", storeAlice, 1002, "fyi"),
		mx.Message("$echo", "@bot:example.org", 1003, "mine"),
	)
	if _, err := v.AdmitBatch(t.Context(), live, ""); err != nil {
		t.Fatal(err)
	}
	if n, err := v.Settle(t.Context(), "$settled"); err != nil || n != 1 {
		t.Fatalf("Settle = %d, %v", n, err)
	}
	rows, err := connect(t, u).Query(t.Context(), `SELECT j.event_id, j.state, p.seq IS NOT NULL
		FROM journal_events j LEFT JOIN journal_payloads p ON p.seq = j.seq ORDER BY j.seq`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][2]any{}
	for rows.Next() {
		var (
			id    string
			state int16
			kept  bool
		)
		if err := rows.Scan(&id, &state, &kept); err != nil {
			t.Fatal(err)
		}
		got[id] = [2]any{state, kept}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := map[string][2]any{
		"$pending": {int16(0), true}, "$settled": {int16(1), false}, "$notice": {int16(1), false}, "$echo": {int16(1), false},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("(state, payload kept) = %v, want %v", got, want)
	}
}

// A transaction PostgreSQL aborts as a deadlock victim is run again from
// its start: the first insert of the journal fails once, injected by a
// trigger, and the admission still commits, once.
func TestAWriteAbortedAsADeadlockVictimIsRunAgain(t *testing.T) {
	u := cluster.Schema(t)
	s := mustOpen(t, u)
	v := view(t, s, "bot", "@bot:example.org")
	conn := connect(t, u)
	// A sequence is not rolled back with the aborted transaction, so it
	// counts the attempts.
	for _, stmt := range []string{
		`CREATE SEQUENCE attempts`,
		`CREATE FUNCTION fail_first() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF nextval('attempts') = 1 THEN
				RAISE EXCEPTION 'injected deadlock' USING ERRCODE = '40P01';
			END IF;
			RETURN NEW;
		END $$`,
		`CREATE TRIGGER fail_first BEFORE INSERT ON journal_events FOR EACH ROW EXECUTE FUNCTION fail_first()`,
	} {
		if _, err := conn.Exec(t.Context(), stmt); err != nil {
			t.Fatal(err)
		}
	}
	if err := admit(t.Context(), v, "$retried", 1000); err != nil {
		t.Fatalf("an admission whose first attempt was a deadlock victim: %v", err)
	}
	var attempts, rows int64
	if err := conn.QueryRow(t.Context(), `SELECT last_value FROM attempts`).Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(t.Context(), `SELECT count(*) FROM journal_events WHERE event_id = '$retried'`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if attempts != 2 || rows != 1 {
		t.Fatalf("%d attempts and %d rows, want the failed one and one more, and the event once", attempts, rows)
	}
}
