package pgfs_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"github.com/mindroomd/mindroomd/store"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/mindroomd/mindroomd/journal"
)

const (
	planRoom   = "!plan:example.org"
	planRoot   = "$m000001"
	planT0     = int64(1_790_000_000_000)
	planAgent  = "planner"
	planUserID = "@bot:example.org"

	selectPrincipalID = `SELECT id FROM principals WHERE agent = $1 AND user_id = $2`
	insertPlanRoom    = `INSERT INTO rooms (principal, room_id) VALUES ($1, $2) RETURNING id`
	// insertPlanRows writes n messages of one conversation, event IDs
	// prefix + six digits, one a millisecond from t0 on.
	insertPlanRows = `INSERT INTO visible_messages
		(seq, room, thread_id, event_id, sender, created_ts, revision_id, revision_ts, content_json, epoch)
		SELECT $1::bigint + g, $2, $3, $4 || lpad(g::text, 6, '0'), '@alice:example.org', $5::bigint + g,
			'', $5::bigint + g, '{"body":"' || g || '","msgtype":"m.text"}', 0
		FROM generate_series(1, $6::int) g`
	analyzePlanTables = `ANALYZE`
	// lastReaderStatement is the text of the statement the store's
	// connection ran last, as the server received it: the store's pool has
	// one connection, its listener another that ran only at open.
	lastReaderStatement = `SELECT query FROM pg_stat_activity
		WHERE application_name = $1 AND datname = current_database()
		ORDER BY query_start DESC LIMIT 1`
	explainJSON = `EXPLAIN (FORMAT JSON) `
)

// planNode is one node of EXPLAIN's JSON plan.
type planNode struct {
	NodeType  string     `json:"Node Type"`
	Relation  string     `json:"Relation Name"`
	Index     string     `json:"Index Name"`
	Direction string     `json:"Scan Direction"`
	IndexCond string     `json:"Index Cond"`
	Plans     []planNode `json:"Plans"`
}

// walk visits n and every node below it, subplans included.
func (n planNode) walk(visit func(planNode)) {
	visit(n)
	for _, c := range n.Plans {
		c.walk(visit)
	}
}

// A deep page must cost what the newest does: the reader's statements walk
// visible_messages_page backward from the cursor, the row value bounding
// the index scan itself, and never sort. The table holds enough rows, and
// statistics of them, that a plan reading the conversation whole would
// show. Each statement EXPLAINed is the one the store just ran, read back
// from the server, so the check follows the reader's SQL wherever it
// lives.
func TestPlanPagesWalkTheIndexBackwardFromTheCursor(t *testing.T) {
	ctx := context.Background()
	raw := cluster.Schema(t)
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("parse the schema URL: %v", err)
	}
	app := "pgfs-plan-" + strings.ToLower(rand.Text())
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	s, err := store.Open(ctx, store.Options{DatabaseURL: u.String(), MaxConns: 1})
	if err != nil {
		t.Fatalf("open journal: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	view, err := s.Principal(ctx, planAgent, planUserID)
	if err != nil {
		t.Fatalf("principal: %v", err)
	}
	admin, err := pgx.Connect(ctx, raw)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = admin.Close(context.Background()) })

	var principal int64
	if err := admin.QueryRow(ctx, selectPrincipalID, planAgent, planUserID).Scan(&principal); err != nil {
		t.Fatalf("principal row: %v", err)
	}
	rooms := make(map[string]int64)
	for _, roomID := range []string{planRoom, "!a:example.org", "!b:example.org", "!c:example.org"} {
		var room int64
		if err := admin.QueryRow(ctx, insertPlanRoom, principal, roomID).Scan(&room); err != nil {
			t.Fatalf("room %s: %v", roomID, err)
		}
		rooms[roomID] = room
	}
	seq := int64(0)
	fill := func(roomID, thread, prefix string, n int) {
		if _, err := admin.Exec(ctx, insertPlanRows, seq, rooms[roomID], thread, prefix, planT0, n); err != nil {
			t.Fatalf("rows of %s: %v", roomID, err)
		}
		seq += int64(n)
	}
	fill(planRoom, "", "$m", 20000)
	fill(planRoom, planRoot, "$t", 2000)
	for _, other := range []string{"!a:example.org", "!b:example.org", "!c:example.org"} {
		fill(other, "", "$m", 5000)
	}
	if _, err := admin.Exec(ctx, analyzePlanTables); err != nil {
		t.Fatalf("analyze: %v", err)
	}

	explain := func(t *testing.T, query string, args ...any) planNode {
		t.Helper()
		var doc []byte
		if err := admin.QueryRow(ctx, explainJSON+query, args...).Scan(&doc); err != nil {
			t.Fatalf("explain %s: %v", query, err)
		}
		var plans []struct{ Plan planNode }
		if err := json.Unmarshal(doc, &plans); err != nil || len(plans) != 1 {
			t.Fatalf("explain output %s: %v", doc, err)
		}
		return plans[0].Plan
	}
	// lastStatement is what the store's connection ran last.
	lastStatement := func(t *testing.T) string {
		t.Helper()
		var query string
		if err := admin.QueryRow(ctx, lastReaderStatement, app).Scan(&query); err != nil {
			t.Fatalf("the store's last statement: %v", err)
		}
		return query
	}
	// requireBackwardScan fails unless every read of visible_messages is a
	// backward scan of visible_messages_page whose condition holds cond,
	// and nothing sorts.
	requireBackwardScan := func(t *testing.T, plan planNode, cond string) {
		t.Helper()
		scans := 0
		plan.walk(func(n planNode) {
			if strings.Contains(n.NodeType, "Sort") {
				t.Errorf("the plan sorts (%s)", n.NodeType)
			}
			if n.Relation != "visible_messages" {
				return
			}
			scans++
			if n.NodeType != "Index Scan" || n.Index != "visible_messages_page" || n.Direction != "Backward" {
				t.Errorf("visible_messages is read by %s %s %s, want a backward Index Scan of visible_messages_page",
					n.NodeType, n.Index, n.Direction)
			}
			if !strings.Contains(n.IndexCond, cond) {
				t.Errorf("the index condition %q lacks %q", n.IndexCond, cond)
			}
		})
		if scans != 1 {
			t.Errorf("visible_messages is read %d times, want once", scans)
		}
		if t.Failed() {
			out, _ := json.MarshalIndent(plan, "", "  ")
			t.Fatalf("plan:\n%s", out)
		}
	}
	const rowValue = "ROW(created_ts, event_id) < ROW("

	// A deep page: 19,000 newer rows lie between the cursor and the head.
	page, err := view.Read(ctx, journal.ReadRequest{RoomID: planRoom, Limit: 50,
		Before: &journal.Cursor{CreatedTS: planT0 + 1000, EventID: "$m001000"}})
	if err != nil {
		t.Fatalf("read a deep page: %v", err)
	}
	if n := len(page.Messages); n != 50 || page.Messages[0].EventID != "$m000950" || page.Messages[49].EventID != "$m000999" {
		t.Fatalf("deep page holds %d messages, %+v", n, page.Messages)
	}
	if page.NextCursor == nil || *page.NextCursor != (journal.Cursor{CreatedTS: planT0 + 950, EventID: "$m000950"}) {
		t.Fatalf("deep page's next cursor = %+v, want at $m000950", page.NextCursor)
	}
	pageAfter := lastStatement(t)

	t.Run("DeepRoomPage", func(t *testing.T) {
		requireBackwardScan(t, explain(t, pageAfter, principal, planRoom, "", 51, planT0+1000, "$m001000"), rowValue)
	})
	t.Run("DeepThreadPage", func(t *testing.T) {
		// A thread page runs the same statement with the thread's key.
		requireBackwardScan(t, explain(t, pageAfter, principal, planRoom, planRoot, 51, planT0+1000, "$t001000"), rowValue)
	})
	t.Run("NewestPage", func(t *testing.T) {
		page, err := view.Read(ctx, journal.ReadRequest{RoomID: planRoom, Limit: 50})
		if err != nil {
			t.Fatalf("read the newest page: %v", err)
		}
		if n := len(page.Messages); n != 50 || page.Messages[49].EventID != "$m020000" {
			t.Fatalf("newest page holds %d messages, %+v", n, page.Messages)
		}
		requireBackwardScan(t, explain(t, lastStatement(t), principal, planRoom, "", 51), "thread_id =")
	})
	t.Run("LatestVisible", func(t *testing.T) {
		id, ok, err := view.LatestVisibleEventID(ctx, planRoom, nil)
		if err != nil || !ok || id != "$m020000" {
			t.Fatalf("latest visible = %q, %v, %v; want $m020000", id, ok, err)
		}
		requireBackwardScan(t, explain(t, lastStatement(t), principal, planRoom, ""), "thread_id =")
	})
}
