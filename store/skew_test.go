package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// The projection of our own replies follows the homeserver's clock, never
// the daemon's: revisions and pages are ordered by origin_server_ts, and
// two clocks in one order put replies in the wrong place and let a
// placeholder outrank its own final answer.
func TestRepliesAreOrderedByTheServersClockWhateverTheLocalClockSays(t *testing.T) {
	for _, skew := range []time.Duration{60 * time.Second, -60 * time.Second} {
		t.Run(fmt.Sprintf("local clock %+v", skew), func(t *testing.T) {
			ctx := context.Background()
			const (
				room   = "!skew:example.org"
				person = "@person:example.org"
				bot    = "@bot:example.org"
			)
			server := testsupport.DefaultNow.UnixMilli()
			local := &testsupport.Clock{T: testsupport.DefaultNow.Add(skew)}
			s := testsupport.MustOpenWith(t, store.Options{StorageDir: t.TempDir(), Now: local.Now})
			v, err := s.Principal(ctx, "helper", bot)
			if err != nil {
				t.Fatal(err)
			}
			admit := func(evs ...journal.Inbound) []journal.AdmitResult {
				t.Helper()
				res, err := v.AdmitBatch(ctx, evs, "")
				if err != nil {
					t.Fatalf("AdmitBatch: %v", err)
				}
				return res
			}
			admit(mx.Message("$q1", person, server, "question").In(room, journal.Live))

			// The placeholder goes out and the server stamps it a second later.
			enqueue(t, v, journal.EnqueueRequest{DeliveryID: "d1", Stage: journal.StageInitial, RoomID: room,
				Content: json.RawMessage(`{"body":"thinking","msgtype":"m.text"}`), Sources: []string{"$q1"}})
			claim(t, v, "d1", journal.StageInitial)
			ack := acknowledge(t, v, "d1", journal.StageInitial, journal.Sent{EventID: "$p", ServerTS: server + 1000})
			if !ack.Projected {
				t.Fatalf("placeholder acknowledged with the server's timestamp was not projected")
			}
			// The person writes again while the answer is made.
			admit(mx.Message("$q2", person, server+2000, "another").In(room, journal.Live))

			// The final edits the placeholder; its sync echo arrives before
			// its acknowledgement.
			enqueue(t, v, journal.EnqueueRequest{DeliveryID: "d1", Stage: journal.StageFinal, RoomID: room,
				Content: json.RawMessage(`{"body":"the answer","msgtype":"m.text"}`)})
			final := claim(t, v, "d1", journal.StageFinal)
			if final.ReplacesEventID != "$p" {
				t.Fatalf("final replaces %q, want $p", final.ReplacesEventID)
			}
			wire, err := journal.WireContent(final)
			if err != nil {
				t.Fatal(err)
			}
			echo := json.RawMessage(fmt.Sprintf(`{"event_id":"$f","type":"m.room.message","sender":%q,"origin_server_ts":%d,"content":%s}`,
				bot, server+3000, wire))
			if res := admit(journal.Inbound{RoomID: room, Provenance: journal.Live, Event: echo}); res[0].Outcome != journal.Admitted {
				t.Fatalf("echo of the final: %v %v", res[0].Outcome, res[0].Err)
			}
			if ack := acknowledge(t, v, "d1", journal.StageFinal, journal.Sent{EventID: "$f", ServerTS: server + 3000}); !ack.First {
				t.Fatalf("final acknowledgement = %+v, want the first", ack)
			}

			page, err := v.Read(ctx, journal.ReadRequest{RoomID: room, Limit: 10})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, m := range page.Messages {
				var c struct {
					Body string `json:"body"`
				}
				if err := json.Unmarshal(m.Content, &c); err != nil {
					t.Fatal(err)
				}
				got = append(got, fmt.Sprintf("%s@%d:%s", m.EventID, m.CreatedTS-server, c.Body))
			}
			want := []string{"$q1@0:question", "$p@1000:the answer", "$q2@2000:another"}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("screen = %v, want %v", got, want)
			}
		})
	}
}

func TestAnAcknowledgementWithoutTheServersTimestampLeavesTheReplyToItsEcho(t *testing.T) {
	ctx := context.Background()
	const (
		room   = "!echo:example.org"
		person = "@person:example.org"
		bot    = "@bot:example.org"
	)
	s, _ := testsupport.MustOpen(t)
	v, err := s.Principal(ctx, "helper", bot)
	if err != nil {
		t.Fatal(err)
	}
	server := testsupport.DefaultNow.UnixMilli() - 5000
	if _, err := v.AdmitBatch(ctx, mx.Live(room, mx.Message("$q1", person, server, "question")), ""); err != nil {
		t.Fatal(err)
	}
	enqueue(t, v, journal.EnqueueRequest{DeliveryID: "d1", Stage: journal.StageFinal, RoomID: room,
		Content: json.RawMessage(`{"body":"answer","msgtype":"m.text"}`), Sources: []string{"$q1"}})
	d := claim(t, v, "d1", journal.StageFinal)
	if ack := acknowledge(t, v, "d1", journal.StageFinal, journal.Sent{EventID: "$a1"}); ack.Projected || !ack.First {
		t.Fatalf("acknowledgement without a server timestamp = %+v, want first and not projected", ack)
	}
	if page := read(t, v, room); len(page.Messages) != 1 {
		t.Fatalf("before the echo the room shows %d messages, want only the question", len(page.Messages))
	}
	wire, err := journal.WireContent(d)
	if err != nil {
		t.Fatal(err)
	}
	echo := json.RawMessage(fmt.Sprintf(`{"event_id":"$a1","type":"m.room.message","sender":%q,"origin_server_ts":%d,"content":%s}`,
		bot, server+1, wire))
	res, err := v.AdmitBatch(ctx, []journal.Inbound{{RoomID: room, Provenance: journal.Live, Event: echo}}, "")
	if err != nil || res[0].Outcome != journal.Admitted {
		t.Fatalf("echo: %+v, %v; want admitted", res, err)
	}
	page := read(t, v, room)
	if len(page.Messages) != 2 || page.Messages[1].EventID != "$a1" || page.Messages[1].CreatedTS != server+1 {
		t.Fatalf("after the echo the room = %+v, want the answer at the server's timestamp", page.Messages)
	}
}

func enqueue(t *testing.T, v journal.PrincipalStore, req journal.EnqueueRequest) {
	t.Helper()
	if _, err := v.EnqueueAndSettle(context.Background(), req); err != nil {
		t.Fatalf("EnqueueAndSettle(%s/%s): %v", req.DeliveryID, req.Stage, err)
	}
}

func claim(t *testing.T, v journal.PrincipalStore, id string, stage journal.Stage) journal.Delivery {
	t.Helper()
	d, err := v.Claim(context.Background(), id, stage, "DEV")
	if err != nil {
		t.Fatalf("Claim(%s/%s): %v", id, stage, err)
	}
	return d
}

func acknowledge(t *testing.T, v journal.PrincipalStore, id string, stage journal.Stage, sent journal.Sent) journal.AckResult {
	t.Helper()
	r, err := v.Acknowledge(context.Background(), id, stage, sent)
	if err != nil {
		t.Fatalf("Acknowledge(%s/%s): %v", id, stage, err)
	}
	return r
}

func read(t *testing.T, v journal.PrincipalStore, room string) journal.Page {
	t.Helper()
	p, err := v.Read(context.Background(), journal.ReadRequest{RoomID: room, Limit: 50})
	if err != nil {
		t.Fatalf("Read(%s): %v", room, err)
	}
	return p
}
