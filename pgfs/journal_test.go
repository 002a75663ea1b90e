package pgfs_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/mindroomd/mindroomd/journal"
)

const selectRejected = `SELECT r.room_id, r.raw FROM rejected_events r JOIN principals p ON p.id = r.principal
	WHERE p.agent = $1 AND p.user_id = $2 ORDER BY r.id`

// PostgreSQL text holds neither NUL nor invalid UTF-8; a room ID carrying
// them must still be recorded, with its raw bytes exact, and must not fail
// the batch it came in.
func TestARejectedEventWithNULInItsRoomIDIsRecordedWithoutFailingItsBatch(t *testing.T) {
	ctx := context.Background()
	url := cluster.Schema(t)
	s := mustOpen(t, url)
	v, err := s.Principal(ctx, "agent", "@bot:example.org")
	if err != nil {
		t.Fatalf("Principal: %v", err)
	}
	raw := []byte(`{"event_id":"$bad","type":"m.room.message","sender":"@alice:example.org","origin_server_ts":1000,"content":{"msgtype":"m.text","body":"hi"}}`)
	good := journal.Inbound{RoomID: "!room:example.org", Provenance: journal.Live,
		Event: []byte(`{"event_id":"$good","type":"m.room.message","sender":"@alice:example.org","origin_server_ts":1000,"content":{"msgtype":"m.text","body":"hi"}}`)}
	bad := journal.Inbound{RoomID: "!ro\x00om\xff:example.org", Provenance: journal.Live, Event: raw}
	for delivery := 1; delivery <= 2; delivery++ {
		res, err := v.AdmitBatch(ctx, []journal.Inbound{bad, good}, "s_next")
		if err != nil {
			t.Fatalf("delivery %d: AdmitBatch: %v", delivery, err)
		}
		if res[0].Outcome != journal.Rejected {
			t.Fatalf("delivery %d: the bad event's outcome = %v, want rejected", delivery, res[0].Outcome)
		}
	}

	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, selectRejected, "agent", "@bot:example.org")
	if err != nil {
		t.Fatalf("read rejected events: %v", err)
	}
	type rejected struct {
		room string
		raw  []byte
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (rejected, error) {
		var x rejected
		return x, r.Scan(&x.room, &x.raw)
	})
	if err != nil {
		t.Fatalf("read rejected events: %v", err)
	}
	if len(got) != 1 {
		t.Fatalf("rejected rows = %d, want 1 (the same bytes are kept once)", len(got))
	}
	if want := "!ro\uFFFDom\uFFFD:example.org"; got[0].room != want {
		t.Fatalf("stored room ID = %q, want %q", got[0].room, want)
	}
	if !bytes.Equal(got[0].raw, raw) {
		t.Fatalf("stored raw = %q, want the event as received", got[0].raw)
	}
	page, err := v.Pending(ctx, 10, 0)
	if err != nil {
		t.Fatalf("Pending: %v", err)
	}
	if len(page.Events) != 1 || page.Events[0].EventID != "$good" {
		t.Fatalf("pending = %+v, want $good alone", page.Events)
	}
}
