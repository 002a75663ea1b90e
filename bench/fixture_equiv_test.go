package bench

import (
	"context"
	"database/sql"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// TestFixtureMatchesAdmission holds the bulk-built fixture to the rows
// real admission writes: the same messages admitted live through the
// writer and then settled must leave byte-identical journal, projection
// and principal rows. If admission changes what it stores, this fails
// and genVersion (or the fixture SQL) must follow.
func TestFixtureMatchesAdmission(t *testing.T) {
	ctx := context.Background()
	spec := fixtureSpec{Layout: "equiv", N: 150, Principals: 3, Rooms: 4}

	bulkPath, err := buildStoreFixture(ctx, t.TempDir(), spec)
	if err != nil {
		t.Fatalf("build fixture: %v", err)
	}

	dir := t.TempDir()
	clock := &testsupport.Clock{T: time.UnixMilli(fixtureReceivedMS)}
	s, err := store.Open(ctx, store.Options{StorageDir: dir, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	views := make([]journal.PrincipalStore, spec.Principals)
	for p := range views {
		if views[p], err = s.Principal(ctx, agentName(p), agentUser(p)); err != nil {
			t.Fatal(err)
		}
	}
	admittedIDs := make([][]string, spec.Principals)
	err = spec.each(func(_ int, m fixtureMessage) error {
		in := mx.Live(roomID(m.Room), mx.Message(m.EventID, m.Sender, m.TS, m.Body))
		res, err := views[m.Principal].AdmitBatch(ctx, in, "")
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
		t.Fatalf("admit: %v", err)
	}
	for p, ids := range admittedIDs {
		if n, err := views[p].Settle(ctx, ids...); err != nil || n != len(ids) {
			t.Fatalf("settle: %d of %d, %v", n, len(ids), err)
		}
	}
	if _, err := s.MergePageTail(ctx); err != nil {
		t.Fatal(err)
	}
	admitPath := s.DB().Path
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	for _, q := range []string{
		`SELECT * FROM journal_events ORDER BY seq`,
		`SELECT * FROM visible_messages ORDER BY seq`,
		`SELECT id, agent, user_id FROM principals ORDER BY id`,
		`SELECT count(*) FROM unresolved_edits`,
		`SELECT * FROM rooms ORDER BY id`,
		`SELECT * FROM visible_page ORDER BY room, thread_id, created_ts, event_id`,
		`SELECT * FROM visible_page_merged`,
		`SELECT count(*) FROM journal_payloads`,
	} {
		want, err := dumpRows(ctx, admitPath, q)
		if err != nil {
			t.Fatal(err)
		}
		got, err := dumpRows(ctx, bulkPath, q)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			for i := range min(len(got), len(want)) {
				if !reflect.DeepEqual(got[i], want[i]) {
					t.Errorf("%s: row %d\n fixture:   %v\n admission: %v", q, i, got[i], want[i])
					break
				}
			}
			t.Fatalf("%s: fixture has %d rows, admission %d, and they differ", q, len(got), len(want))
		}
	}
}

// TestFixtureReadsBack checks a bulk-built conversation through the
// public reader: order, cursors and the full count.
func TestFixtureReadsBack(t *testing.T) {
	ctx := context.Background()
	spec := fixtureSpec{Layout: "readback", N: 180, Principals: 1, Rooms: 1}
	dir := t.TempDir()
	if _, err := buildStoreFixture(ctx, dir, spec); err != nil {
		t.Fatal(err)
	}
	s, err := store.Open(ctx, store.Options{StorageDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	v, err := s.Principal(ctx, agentName(0), agentUser(0))
	if err != nil {
		t.Fatal(err)
	}
	ids, err := principalIDs(ctx, s, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := verifyConversation(ctx, s, v, ids[0], roomID(0), spec.N); err != nil {
		t.Fatal(err)
	}
	if total, err := readerWalk(ctx, v, roomID(0), 7); err != nil || total != spec.N {
		t.Fatalf("walk: %d of %d, %v", total, spec.N, err)
	}
	f, err := newFloor(ctx, s.DB().QueryPool())
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	if total, err := f.walk(ctx, ids[0], roomID(0), 7); err != nil || total != spec.N {
		t.Fatalf("floor walk: %d of %d, %v", total, spec.N, err)
	}
	if err := checkFloorMatchesReader(ctx, f, v, ids[0], roomID(0)); err != nil {
		t.Fatal(err)
	}
}

// dumpRows reads every row of q from the file at path, as strings.
func dumpRows(ctx context.Context, path, q string) ([][]string, error) {
	db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
	if err != nil {
		return nil, err
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, q)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, err
	}
	var out [][]string
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return nil, err
		}
		row := make([]string, len(cols))
		for i, v := range vals {
			if b, ok := v.([]byte); ok {
				v = string(b)
			}
			row[i] = fmt.Sprintf("%T:%v", v, v)
		}
		out = append(out, row)
	}
	return out, rows.Err()
}
