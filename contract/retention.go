package contract

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
)

// retentionPolicy prunes bodies, payloads, turns and rejected records an
// hour after they settle, and identities after the least window.
var retentionPolicy = journal.RetentionPolicy{Bodies: time.Hour, Payloads: time.Hour, Turns: time.Hour,
	Rejected: time.Hour, Identities: journal.MinIdentityWindow}

// synced admits evs in room as one live batch that stores token.
func (fx *fixture) synced(roomID, token string, evs ...event) []journal.AdmitResult {
	fx.t.Helper()
	in := make([]journal.Inbound, len(evs))
	for i, e := range evs {
		in[i] = e.In(roomID, journal.Live)
	}
	return fx.admit(fx.v, in, token)
}

// retain runs a retention pass of policy and returns what it pruned.
func (fx *fixture) retain(policy journal.RetentionPolicy) journal.RetentionCount {
	fx.t.Helper()
	n, err := fx.v.Retain(context.Background(), policy)
	if err != nil {
		fx.t.Fatalf("Retain: %v", err)
	}
	return n
}

// answer enqueues the answer to source, records its turn, and has the
// homeserver acknowledge it as eventID.
func (fx *fixture) answer(roomID, source, eventID string) {
	fx.t.Helper()
	ctx := context.Background()
	req := journal.FinalReply(roomID, source, nil, []byte(text("answer to "+source)), true)
	if _, err := fx.v.EnqueueAndSettle(ctx, req); err != nil {
		fx.t.Fatalf("enqueue the answer to %s: %v", source, err)
	}
	if _, err := fx.v.Claim(ctx, req.DeliveryID, journal.StageFinal, "DEV"); err != nil {
		fx.t.Fatalf("claim: %v", err)
	}
	if _, err := fx.v.Acknowledge(ctx, req.DeliveryID, journal.StageFinal, journal.Sent{EventID: eventID}); err != nil {
		fx.t.Fatalf("acknowledge: %v", err)
	}
}

// TestRetention checks that retention prunes what has settled past its
// window and keeps the identities exactly-once depends on: a redelivered
// event is still a duplicate once its body is gone, a finished delivery
// is still recognised once its payload is gone, nothing pending or owed is
// touched, and a page says where the pruned range begins.
func TestRetention(t *testing.T, f Factory) {
	ctx := context.Background()

	t.Run("ARedeliveredEventAfterItsBodyWasPrunedIsStillADuplicate", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.synced(room, "s1", msg("$a", alice, 1000, "first"), msg("$b", alice, 2000, "second"))
		fx.settle(fx.v, "$a", "$b")
		fx.b.Advance(2 * time.Hour)
		if n := fx.retain(retentionPolicy); n.Bodies != 2 || n.Identities != 0 || n.Bytes == 0 {
			t.Fatalf("pruned %+v, want the two bodies (with their bytes) and no identity", n)
		}
		page := fx.read(fx.v, room, nil, 10)
		if len(page.Messages) != 0 || page.PrunedBefore != 2000 {
			t.Fatalf("page = %v, pruned before %d; want empty, marked pruned up to 2000", screen(page), page.PrunedBefore)
		}
		res := fx.synced(room, "s2", msg("$a", alice, 1000, "first"))
		if res[0].Outcome != journal.Duplicate {
			t.Fatalf("the redelivered event is %v, want a duplicate", res[0].Outcome)
		}
		fx.restart()
		if got := fx.pendingIDs(fx.v); len(got) != 0 {
			t.Fatalf("pending = %v after the redelivery, want nothing", got)
		}
		if page := fx.read(fx.v, room, nil, 10); len(page.Messages) != 0 {
			t.Fatalf("the pruned body came back: %v", screen(page))
		}
	})

	t.Run("AFinishedDeliveryWhosePayloadWasPrunedIsStillRecognisedAndNeverSentAgain", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.synced(room, "s1", msg("$q", alice, 1000, "question"))
		fx.answer(room, "$q", "$ans")
		fx.b.Advance(2 * time.Hour)
		if n := fx.retain(retentionPolicy); n.Payloads != 1 || n.Turns != 1 {
			t.Fatalf("pruned %+v, want the answer's payload and its turn record", n)
		}
		id := journal.ReplyDeliveryID("$q")
		d, err := fx.v.Delivery(ctx, id, journal.StageFinal)
		if err != nil || d.State != journal.DeliveryAcknowledged || d.EventID != "$ans" || len(d.Content) != 0 {
			t.Fatalf("the answer's delivery = %+v, %v; want acknowledged as $ans, its payload cleared", d, err)
		}
		// The agent, recovering from a crash, answers again: the delivery
		// is the one acknowledged, and nothing is owed.
		fx.restart()
		again := journal.FinalReply(room, "$q", nil, []byte(text("answer to $q")), false)
		if res, err := fx.v.EnqueueAndSettle(ctx, again); !errors.Is(err, journal.ErrNotPending) && (err != nil || res.Outcome == journal.EnqueueCreated) {
			t.Fatalf("the answer again = %+v, %v; want it replayed or refused, never a new delivery", res, err)
		}
		if rows, err := fx.v.Unacknowledged(ctx, 10, nil); err != nil || len(rows) != 0 {
			t.Fatalf("unacknowledged = %+v, %v; want nothing to send", rows, err)
		}
		if ok, err := fx.v.DeliveredEvent(ctx, room, "$ans"); err != nil || !ok {
			t.Fatalf("DeliveredEvent($ans) = %v, %v; want the agent's own answer recognised", ok, err)
		}
		if _, found, err := fx.v.TurnForEvent(ctx, "$q"); err != nil || found {
			t.Fatalf("the answered turn's record = %v, %v; want it pruned", found, err)
		}
	})

	t.Run("NothingPendingOrOwedIsTouched", func(t *testing.T) {
		fx := newFixture(t, f)
		// room: settled history and one event still pending; otherRoom:
		// settled history and a send not yet acknowledged; quietRoom:
		// settled, nothing owed.
		const quietRoom = "!quiet:example.org"
		fx.synced(room, "s1", msg("$r1", alice, 1000, "old"), msg("$r2", alice, 1001, "waiting"))
		fx.synced(otherRoom, "s2", msg("$o1", alice, 1000, "old"))
		fx.synced(quietRoom, "s3", msg("$q1", alice, 1000, "old"))
		fx.settle(fx.v, "$r1", "$o1", "$q1")
		send := journal.EnqueueRequest{DeliveryID: "send:x", Stage: journal.StageFinal, RoomID: otherRoom,
			Content: []byte(text("not yet sent"))}
		if _, err := fx.v.EnqueueAndSettle(ctx, send); err != nil {
			t.Fatal(err)
		}
		fx.b.Advance(72 * time.Hour)
		fx.synced(quietRoom, "s4")
		n := fx.retain(retentionPolicy)
		if n.Bodies != 1 || n.Identities != 1 {
			t.Fatalf("pruned %+v, want the quiet room's one body and then its identity", n)
		}
		if got := fx.pendingIDs(fx.v); len(got) != 1 || got[0] != "$r2" {
			t.Fatalf("pending = %v, want $r2 still owed", got)
		}
		if page := fx.read(fx.v, room, nil, 10); len(page.Messages) != 2 || page.PrunedBefore != 0 {
			t.Fatalf("the pending room's page = %v (pruned before %d), want both messages kept", screen(page), page.PrunedBefore)
		}
		if page := fx.read(fx.v, otherRoom, nil, 10); len(page.Messages) != 1 || page.PrunedBefore != 0 {
			t.Fatalf("the owing room's page = %v, want its message kept", screen(page))
		}
		d, err := fx.v.Delivery(ctx, "send:x", journal.StageFinal)
		if err != nil || d.State != journal.DeliveryQueued || !sameJSON(d.Content, send.Content) {
			t.Fatalf("the send not yet made = %+v, %v; want it queued with its content", d, err)
		}
		if page := fx.read(fx.v, quietRoom, nil, 10); len(page.Messages) != 0 || page.PrunedBefore != 1000 {
			t.Fatalf("the quiet room's page = %v (pruned before %d), want it pruned up to 1000", screen(page), page.PrunedBefore)
		}
		// The pending event's payload is whole: the agent can still answer.
		if ev := fx.pending(fx.v); len(ev) != 1 || len(ev[0].Event) == 0 {
			t.Fatalf("pending events = %+v", ev)
		}
	})

	t.Run("IdentitiesOutliveTheSyncTokenByTheLeastWindow", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.synced(room, "s1", msg("$a", alice, 1000, "old"))
		fx.settle(fx.v, "$a")
		// Stopped for three days: the token is as old. What the first sync
		// after it may bring again is still known.
		fx.b.Advance(72 * time.Hour)
		if n := fx.retain(retentionPolicy); n.Bodies != 1 || n.Identities != 0 {
			t.Fatalf("pruned %+v before a new sync, want the body and no identity", n)
		}
		if res := fx.synced(room, "s2", msg("$a", alice, 1000, "old")); res[0].Outcome != journal.Duplicate {
			t.Fatalf("the redelivery after the stop = %v, want a duplicate", res[0].Outcome)
		}
		if n := fx.retain(retentionPolicy); n.Identities != 1 {
			t.Fatalf("pruned %+v after the new sync, want the identity", n)
		}
		st, err := fx.v.RetentionStatus(ctx)
		if err != nil || st.Passes != 2 || st.Total.Bodies != 1 || st.Total.Identities != 1 || st.IdentitiesBeforeMS == 0 {
			t.Fatalf("status = %+v, %v; want two passes, one body, one identity, its cutoff", st, err)
		}
	})

	t.Run("APageMarksWhereThePrunedRangeBegins", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.synced(room, "s1", msg("$m1", alice, 1000, "one"), msg("$m2", alice, 2000, "two"), msg("$root", alice, 3000, "root"),
			reply("$t1", bob, 3500, "$root", "in the thread"))
		fx.settle(fx.v, "$m1", "$m2", "$root", "$t1")
		fx.b.Advance(2 * time.Hour)
		fx.synced(room, "s2", msg("$m4", alice, 4000, "four"), msg("$m5", alice, 5000, "five"),
			reply("$t2", bob, 5500, "$root", "later in the thread"))
		fx.settle(fx.v, "$m4", "$m5", "$t2")
		if n := fx.retain(journal.RetentionPolicy{Bodies: time.Hour}); n.Bodies != 4 {
			t.Fatalf("pruned %+v, want the four old bodies", n)
		}
		// The mark is the room's: the newest message pruned anywhere in
		// it, its threads' included.
		full := fx.read(fx.v, room, nil, 10)
		if got := screen(full); len(got) != 2 || full.PrunedBefore != 3500 {
			t.Fatalf("page = %v, pruned before %d; want $m4 and $m5, marked pruned up to 3500", got, full.PrunedBefore)
		}
		first := fx.read(fx.v, room, nil, 1)
		if first.NextCursor == nil || first.PrunedBefore != 0 {
			t.Fatalf("a page with more behind it = %+v, want no marker yet", first)
		}
		rest, err := fx.v.Read(ctx, journal.ReadRequest{RoomID: room, Limit: 10, Before: first.NextCursor})
		if err != nil || len(rest.Messages) != 1 || rest.PrunedBefore != 3500 {
			t.Fatalf("the page after = %v, %v (pruned before %d); want $m4 and the marker", screen(rest), err, rest.PrunedBefore)
		}
		thread := fx.read(fx.v, room, ptr("$root"), 10)
		if got := screen(thread); len(got) != 1 || thread.PrunedBefore != 3500 {
			t.Fatalf("thread page = %v, pruned before %d; want the later reply alone, marked", got, thread.PrunedBefore)
		}
	})

	t.Run("ARejectedRecordAndADecidedApprovalGoWithTheirWindows", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.synced(room, "s1", msg("$q", alice, 1000, "mail bob"))
		bad := msg("$bad", alice, 1001, "x").With("event_id", "not an event ID")
		if res := fx.synced(room, "s2", bad); res[0].Outcome != journal.Rejected {
			t.Fatalf("the malformed event = %v", res[0].Outcome)
		}
		if _, _, err := fx.askApproval("$q", "c1", `{"to":"bob"}`); err != nil {
			t.Fatal(err)
		}
		fx.sendCard("c1", "$card")
		if _, _, err := fx.v.DecideApproval(ctx, "c1", journal.ApprovalDecision{State: journal.ApprovalDenied, By: alice}); err != nil {
			t.Fatal(err)
		}
		if _, err := fx.v.Claim(ctx, journal.ApprovalDeliveryID("c1"), journal.StageFinal, "DEV"); err != nil {
			t.Fatal(err)
		}
		if _, err := fx.v.Acknowledge(ctx, journal.ApprovalDeliveryID("c1"), journal.StageFinal, journal.Sent{EventID: "$edit"}); err != nil {
			t.Fatal(err)
		}
		fx.b.Advance(72 * time.Hour)
		fx.synced(room, "s3")
		// The turn still waits for its agent: the decision stays.
		if n := fx.retain(retentionPolicy); n.Rejected != 1 || n.Approvals != 0 {
			t.Fatalf("pruned %+v, want the rejected record and not the decision its pending turn waits on", n)
		}
		fx.settle(fx.v, "$q")
		if n := fx.retain(retentionPolicy); n.Approvals != 1 || n.Deliveries != 2 {
			t.Fatalf("pruned %+v once the turn settled, want the decision and then its card's two stages", n)
		}
		if _, _, found, err := fx.v.Approval(ctx, "c1"); err != nil || found {
			t.Fatalf("the decided approval = %v, %v; want it gone", found, err)
		}
	})

	t.Run("APolicyThatWouldLoseAnIdentityFirstIsRefused", func(t *testing.T) {
		fx := newFixture(t, f)
		for _, p := range []journal.RetentionPolicy{
			{Identities: time.Hour},
			{Bodies: 48 * time.Hour, Identities: journal.MinIdentityWindow},
			{Payloads: -time.Hour},
		} {
			if _, err := fx.v.Retain(ctx, p); !errors.Is(err, journal.ErrInvalidArgument) {
				t.Fatalf("Retain(%+v) = %v, want ErrInvalidArgument", p, err)
			}
		}
	})
}

// sameJSON reports whether two JSON documents hold the same value.
func sameJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	ax, _ := json.Marshal(x)
	by, _ := json.Marshal(y)
	return string(ax) == string(by)
}
