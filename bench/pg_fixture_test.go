package bench

import (
	"context"
	"errors"
	"fmt"
	"github.com/mindroomd/mindroomd/store"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
	"github.com/mindroomd/mindroomd/testsupport/pg"
)

// PostgreSQL fixtures are loaded, not admitted, as the SQLite ones are
// built: the same generator's messages go into a schema pgfs.Open has just
// migrated, visible rows by COPY and their journal rows by one INSERT ...
// SELECT from them, in a few seconds per 10^5 messages where admitting them
// would take minutes. A launched cluster is new in every run, so there is
// no cache. checkPGFixture holds the load to the rows admission writes.
const (
	pgSelectPrincipal = `SELECT id FROM principals WHERE agent = $1 AND user_id = $2`
	pgInsertRoom      = `INSERT INTO rooms (principal, room_id) VALUES ($1, $2) RETURNING id`
	// The journal rows of settled live text messages, one per visible row,
	// at the visible row's seq.
	pgJournalFromVisible = `INSERT INTO journal_events
		(seq, principal, event_id, room_id, thread_id, target_id, kind, class, provenance, state, epoch, received_ms)
		OVERRIDING SYSTEM VALUE
		SELECT v.seq, r.principal, v.event_id, r.room_id, '', '', $1, $2, $3, $4, 0, $5
		FROM visible_messages v JOIN rooms r ON r.id = v.room`
	// The identity sequence moves past the loaded seqs, so admission
	// continues after them.
	pgAdvanceJournalSeq = `SELECT setval(pg_get_serial_sequence('journal_events', 'seq'), $1)`
	// VACUUM leaves the loaded tables as autovacuum would leave them at
	// rest (hint bits set, the visibility map and statistics current), so
	// no benchmark's first pass pays for that; the checkpoint writes the
	// load out, so no measured round shares the disk with it.
	pgVacuumLoaded = `VACUUM (ANALYZE) principals, rooms, journal_events, visible_messages`
	pgCheckpoint   = `CHECKPOINT`
)

// pgVisibleColumns are the columns the load copies into visible_messages.
var pgVisibleColumns = []string{"seq", "room", "thread_id", "event_id", "sender", "created_ts",
	"revision_id", "revision_ts", "content_json", "refresh_token", "epoch"}

// errAllRoomsSeen ends the generator's first pass early.
var errAllRoomsSeen = errors.New("all rooms seen")

// loadPGStore opens the journal at url (a fresh schema), which migrates
// it, registers spec's principals through it and loads spec's
// messages as admission leaves settled live text messages. It returns the
// open store, closed when b ends, and the principals' row IDs.
func loadPGStore(b *testing.B, url string, spec fixtureSpec) (*store.Store, []int64) {
	b.Helper()
	ctx := context.Background()
	s, err := store.Open(ctx, store.Options{DatabaseURL: url})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	for p := range spec.Principals {
		if _, err := s.Principal(ctx, agentName(p), agentUser(p)); err != nil {
			b.Fatal(err)
		}
	}
	ids, err := loadPG(ctx, url, spec)
	if err != nil {
		b.Fatalf("load fixture: %v", err)
	}
	return s, ids
}

// loadPG loads spec's messages into the migrated schema at url, whose
// principals are registered, and returns the principals' row IDs.
func loadPG(ctx context.Context, url string, spec fixtureSpec) (ids []int64, err error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	ids = make([]int64, spec.Principals)
	for p := range ids {
		if err := conn.QueryRow(ctx, pgSelectPrincipal, agentName(p), agentUser(p)).Scan(&ids[p]); err != nil {
			return nil, fmt.Errorf("principal %s: %w", agentName(p), err)
		}
	}
	keys, err := internPGRooms(ctx, conn, spec, ids)
	if err != nil {
		return nil, err
	}
	if err := copyPGVisible(ctx, conn, spec, keys); err != nil {
		return nil, fmt.Errorf("copy visible messages: %w", err)
	}
	if _, err := conn.Exec(ctx, pgJournalFromVisible, int16(journal.KindMessage), int16(journal.Actionable),
		int16(journal.Live), int16(1), fixtureReceivedMS); err != nil {
		return nil, fmt.Errorf("journal rows: %w", err)
	}
	if spec.N > 0 {
		if _, err := conn.Exec(ctx, pgAdvanceJournalSeq, int64(spec.N)); err != nil {
			return nil, fmt.Errorf("advance the journal's sequence: %w", err)
		}
	}
	for _, stmt := range []string{pgVacuumLoaded, pgCheckpoint} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return nil, fmt.Errorf("%s: %w", stmt, err)
		}
	}
	return ids, nil
}

// internPGRooms interns spec's rooms in the order its messages first name
// them, as admission does, so the keys come out the same; it returns them
// by (principal index, room index).
func internPGRooms(ctx context.Context, conn *pgx.Conn, spec fixtureSpec, ids []int64) (map[[2]int]int64, error) {
	var order [][2]int
	seen := map[[2]int]bool{}
	err := spec.each(func(_ int, m fixtureMessage) error {
		k := [2]int{m.Principal, m.Room}
		if !seen[k] {
			seen[k] = true
			order = append(order, k)
		}
		if len(order) == spec.Principals*spec.Rooms {
			return errAllRoomsSeen
		}
		return nil
	})
	if err != nil && !errors.Is(err, errAllRoomsSeen) {
		return nil, err
	}
	keys := make(map[[2]int]int64, len(order))
	for _, k := range order {
		var key int64
		if err := conn.QueryRow(ctx, pgInsertRoom, ids[k[0]], roomID(k[1])).Scan(&key); err != nil {
			return nil, fmt.Errorf("intern room: %w", err)
		}
		keys[k] = key
	}
	return keys, nil
}

// copyPGVisible streams spec's messages into visible_messages with COPY,
// the generator running beside it.
func copyPGVisible(ctx context.Context, conn *pgx.Conn, spec fixtureSpec, keys map[[2]int]int64) error {
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rows := make(chan []any, 4096)
	var genErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(rows)
		genErr = spec.each(func(i int, m fixtureMessage) error {
			row := []any{int64(i + 1), keys[[2]int{m.Principal, m.Room}], "", m.EventID, m.Sender, m.TS,
				"", m.TS, contentJSON(m.Body), nil, int64(0)}
			select {
			case rows <- row:
				return nil
			case <-gctx.Done():
				return gctx.Err()
			}
		})
	}()
	n, err := conn.CopyFrom(ctx, pgx.Identifier{"visible_messages"}, pgVisibleColumns, pgx.CopyFromFunc(func() ([]any, error) {
		// A closed channel ends the copy: nil row, nil error.
		return <-rows, nil
	}))
	cancel()
	<-done
	switch {
	case err != nil:
		return err
	case genErr != nil:
		return genErr
	case n != int64(spec.N):
		return fmt.Errorf("copied %d rows of %d", n, spec.N)
	}
	return nil
}

// What checkPGFixture compares. The principals' sync tokens are left
// out: the load does not admit, so it stores none.
const (
	pgDumpJournal    = `SELECT * FROM journal_events ORDER BY seq`
	pgDumpVisible    = `SELECT * FROM visible_messages ORDER BY seq`
	pgDumpPrincipals = `SELECT id, agent, user_id, lease_generation FROM principals ORDER BY id`
	pgDumpRooms      = `SELECT * FROM rooms ORDER BY id`
	pgCountPayloads  = `SELECT count(*) FROM journal_payloads`
	pgCountHeldEdits = `SELECT count(*) FROM unresolved_edits`
)

// pgEquivSpec is the population checkPGFixture loads and admits.
var pgEquivSpec = fixtureSpec{Layout: "equiv", N: 150, Principals: 3, Rooms: 4}

// checkPGFixture holds the load to the rows real admission writes: the
// same messages admitted live through pgfs and then settled must leave
// the same journal, projection, room and principal rows. If admission
// changes what it stores, the PG benchmarks fail until the load follows.
func checkPGFixture(b *testing.B, c *pg.Cluster) {
	b.Helper()
	ctx := context.Background()
	spec := pgEquivSpec
	loadedURL, admittedURL := c.Schema(b), c.Schema(b)
	loaded, _ := loadPGStore(b, loadedURL, spec)
	if err := loaded.Close(); err != nil {
		b.Fatal(err)
	}

	clock := &testsupport.Clock{T: time.UnixMilli(fixtureReceivedMS)}
	s, err := store.Open(ctx, store.Options{DatabaseURL: admittedURL, Now: clock.Now})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	views := make([]journal.PrincipalStore, spec.Principals)
	for p := range views {
		if views[p], err = s.Principal(ctx, agentName(p), agentUser(p)); err != nil {
			b.Fatal(err)
		}
	}
	admittedIDs := make([][]string, spec.Principals)
	err = spec.each(func(_ int, m fixtureMessage) error {
		res, err := views[m.Principal].AdmitBatch(ctx, mx.Live(roomID(m.Room), mx.Message(m.EventID, m.Sender, m.TS, m.Body)), "")
		if err != nil {
			return err
		}
		if res[0].Outcome != journal.Admitted {
			return fmt.Errorf("%s: %v %v", m.EventID, res[0].Outcome, res[0].Err)
		}
		admittedIDs[m.Principal] = append(admittedIDs[m.Principal], m.EventID)
		return nil
	})
	if err != nil {
		b.Fatalf("admit: %v", err)
	}
	for p, ids := range admittedIDs {
		if n, err := views[p].Settle(ctx, ids...); err != nil || n != len(ids) {
			b.Fatalf("settle: %d of %d, %v", n, len(ids), err)
		}
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}

	for _, q := range []string{pgDumpJournal, pgDumpVisible, pgDumpPrincipals, pgDumpRooms, pgCountPayloads, pgCountHeldEdits} {
		want, err := dumpPGRows(ctx, admittedURL, q)
		if err != nil {
			b.Fatal(err)
		}
		got, err := dumpPGRows(ctx, loadedURL, q)
		if err != nil {
			b.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			for i := range min(len(got), len(want)) {
				if !reflect.DeepEqual(got[i], want[i]) {
					b.Errorf("%s: row %d\n loaded:   %v\n admitted: %v", q, i, got[i], want[i])
					break
				}
			}
			b.Fatalf("%s: the load left %d rows, admission %d, and they differ", q, len(got), len(want))
		}
	}
}

// dumpPGRows reads every row of q from the schema at url, as strings.
func dumpPGRows(ctx context.Context, url, q string) ([][]string, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, q)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out [][]string
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return nil, err
		}
		row := make([]string, len(vals))
		for i, v := range vals {
			row[i] = fmt.Sprintf("%T:%v", v, v)
		}
		out = append(out, row)
	}
	return out, rows.Err()
}
