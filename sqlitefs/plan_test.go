package sqlitefs

import (
	"context"
	"slices"
	"strings"
	"testing"
)

// hotQueries are the statements on the read and write hot paths, with
// arguments of the right types for EXPLAIN QUERY PLAN.
var hotQueries = map[string]struct {
	query string
	args  []any
}{
	"room page head":      {PageQueryHead, []any{1, "!r:x", "", 50}},
	"room page after":     {PageQueryAfter, []any{1, "!r:x", "", 50, int64(5), "$e"}},
	"thread page after":   {PageQueryAfter, []any{1, "!r:x", "$root", 50, int64(5), "$e"}},
	"thread root":         {selectVisibleMessage, []any{1, IDHash("$root"), "$root", "!r:x"}},
	"latest visible":      {selectLatestVisible, []any{1, "!r:x", ""}},
	"pending":             {selectPending, []any{1, int64(0), 100}},
	"admitted event":      {selectAdmittedEvent, []any{1, IDHash("$e"), "$e"}},
	"visible by event":    {selectVisibleByEvent, []any{1, IDHash("$e"), "$e", "!r:x"}},
	"held edit":           {selectHeldEdit, []any{1, "!r:x", "$e", "@a:x"}},
	"take held edits":     {takeHeldEditsFor, []any{1, "!r:x", "$e"}},
	"tombstone":           {selectTombstone, []any{1, "!r:x", "$e"}},
	"outbox scan head":    {selectUnackedHead, []any{1, 100}},
	"outbox scan after":   {selectUnackedAfter, []any{1, int64(0), int64(0), 100}},
	"delivery":            {selectDelivery, []any{1, "d", 2}},
	"delivered event":     {selectDeliveredEvent, []any{1, "!r:x", "$e"}},
	"turn by event":       {selectTurnByEvent, []any{"agent", "$e"}},
	"fence pending work":  {fencePendingTurnWork, []any{1, "!r:x"}},
	"fence visible":       {fenceVisible, []any{1, "!r:x"}},
	"unmerged tail":       {countUnmerged, nil},
	"original probe":      {probeOriginal, []any{1, "!r:x", "$e"}},
	"merge boundary":      {tailEnd, nil},
	"fence outbox":        {fenceUnattempted, []any{int64(0), 1, "!r:x"}},
	"owed report":         {selectOldestOwed, []any{1, "!r:x", int64(0)}},
	"journal insert":      {insertJournalEvent, []any{1, IDHash("$e"), "$e", "!r:x", "", "", 1, 1, 1, 0, 0, int64(0)}},
	"settle":              {settleEvent, []any{1, IDHash("$e"), "$e"}},
	"settle in room":      {settleEventInRoom, []any{1, IDHash("$e"), "$e", "!r:x"}},
	"relation thread":     {selectThreadOf, []any{1, IDHash("$e"), "$e", "!r:x"}},
	"delivery source":     {selectSource, []any{1, IDHash("$e"), "$e"}},
	"retired stage":       {selectRetiredStage, []any{1, "d"}},
	"journal edit lookup": {selectJournalEdit, []any{1, IDHash("$e"), "$e", "!r:x"}},
}

func TestEveryHotQueryIsIndexCovered(t *testing.T) {
	ctx := context.Background()
	db, err := Open(ctx, Options{StorageDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for name, q := range hotQueries {
		t.Run(name, func(t *testing.T) {
			plan := explainPlan(t, db, q.query, q.args...)
			if strings.HasPrefix(strings.TrimSpace(q.query), "SELECT") && len(plan) == 0 {
				t.Fatalf("no plan for a query")
			}
			requireNoFullScan(t, plan)
		})
	}
}

// pageQueries are every query that reads one page of a longer sequence,
// each with a cursor, and the index searches its plan must contain: each
// source of the page starts at the cursor, so a deep page costs what a
// shallow one does. The list is explicit, not found by the text of the
// queries, so a cursor reworded into a form the planner cannot bound
// still faces its check.
var pageQueries = map[string]struct {
	query  string
	args   []any
	bounds []string
}{
	"room page after": {PageQueryAfter, []any{1, "!r:x", "", 50, int64(5), "$e"}, []string{
		// The unmerged tail is bounded by its seq range, the index by the
		// cursor as a row value: the disjunctive spelling bounds only
		// created_ts.
		"SEARCH v USING INTEGER PRIMARY KEY (rowid>?)",
		"SEARCH p USING PRIMARY KEY (room=? AND thread_id=? AND (created_ts,event_id)<(?,?))",
	}},
	"thread page after": {PageQueryAfter, []any{1, "!r:x", "$root", 50, int64(5), "$e"}, []string{
		"SEARCH v USING INTEGER PRIMARY KEY (rowid>?)",
		"SEARCH p USING PRIMARY KEY (room=? AND thread_id=? AND (created_ts,event_id)<(?,?))",
	}},
	"pending after": {selectPending, []any{1, int64(7), 100}, []string{
		"SEARCH j USING INDEX journal_events_pending (principal=? AND seq>?)",
	}},
	"outbox scan after": {selectUnackedAfter, []any{1, int64(0), int64(0), 100}, []string{
		"SEARCH delivery_outbox USING INDEX delivery_outbox_unacknowledged (principal=? AND created_ms>?)",
	}},
	"turns after": {selectTurnsAfter, []any{"agent", "turn-7", 100}, []string{
		"SEARCH turn_records USING PRIMARY KEY (agent=? AND turn_id>?)",
	}},
}

func TestEveryPageQuerySearchesItsIndexFromTheCursor(t *testing.T) {
	ctx := context.Background()
	db, err := Open(ctx, Options{StorageDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for name, q := range pageQueries {
		t.Run(name, func(t *testing.T) {
			plan := explainPlan(t, db, q.query, q.args...)
			for _, bound := range q.bounds {
				if !slices.Contains(plan, bound) {
					t.Fatalf("the cursor does not bound the index search: no %q in\n%s", bound, strings.Join(plan, "\n"))
				}
			}
			requireNoFullScan(t, plan)
		})
	}
}

// A merge sorts what it moves, on purpose: that is the point of merging.
// What it must not do is read more than the tail.
func TestTheMergeReadsOnlyTheUnmergedTail(t *testing.T) {
	ctx := context.Background()
	db, err := Open(ctx, Options{StorageDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for name, q := range map[string]struct {
		query string
		args  []any
	}{
		"whole tail":  {mergePageTail, []any{100}},
		"merge plan":  {tailRoomRows, []any{100}},
		"merge rooms": {mergePageRooms, []any{100, 1, 5}},
	} {
		plan := explainPlan(t, db, q.query, q.args...)
		if !slices.Contains(plan, "SEARCH visible_messages USING INTEGER PRIMARY KEY (rowid>? AND rowid<?)") {
			t.Fatalf("the %s does not read the tail by its seq range:\n%s", name, strings.Join(plan, "\n"))
		}
	}
}

// requireNoFullScan fails the test on a plan step that scans a table or
// sorts into a temporary B-tree.
func requireNoFullScan(t *testing.T, plan []string) {
	t.Helper()
	for _, step := range plan {
		// Reading back a subquery's own rows is bounded by its LIMIT; a
		// SELECT without FROM yields its one row.
		bounded := strings.HasPrefix(step, "SCAN (subquery-") || step == "SCAN CONSTANT ROW"
		if (strings.HasPrefix(step, "SCAN") && !bounded) || strings.Contains(step, "TEMP B-TREE") {
			t.Fatalf("plan falls back to %q:\n%s", step, strings.Join(plan, "\n"))
		}
	}
}

// explainPlan returns the detail column of EXPLAIN QUERY PLAN for query.
func explainPlan(t *testing.T, db *DB, query string, args ...any) []string {
	t.Helper()
	rows, err := db.writer.QueryContext(context.Background(), "EXPLAIN QUERY PLAN "+query, args...)
	if err != nil {
		t.Fatalf("explain: %v", err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, notused int
		var detail string
		if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return plan
}

// The backlog is read at every metrics scrape: one pass over the principals,
// each count through a partial index of what is still owed, never through
// the rows already settled or acknowledged.
func TestTheBacklogCountsOnlyWhatIsOwed(t *testing.T) {
	db, err := Open(context.Background(), Options{StorageDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	plan := explainPlan(t, db, selectBacklog)
	want := []string{
		"SEARCH j USING COVERING INDEX journal_events_pending (principal=?)",
		"SEARCH o USING INDEX delivery_outbox_unacknowledged (principal=?)",
	}
	for _, w := range want {
		if !slices.Contains(plan, w) {
			t.Fatalf("plan lacks %q:\n%s", w, strings.Join(plan, "\n"))
		}
	}
	for _, step := range plan {
		if strings.Contains(step, "delivery_outbox_room") || strings.Contains(step, "TEMP B-TREE") ||
			(strings.HasPrefix(step, "SCAN") && !strings.HasPrefix(step, "SCAN p ")) {
			t.Fatalf("plan reads more than the backlog: %q\n%s", step, strings.Join(plan, "\n"))
		}
	}
}
