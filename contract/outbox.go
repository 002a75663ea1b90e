package contract

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
)

// TestOutbox checks the outbox rows themselves: derived transaction IDs,
// enqueue-or-update while unattempted, the claim that freezes a row, the
// acknowledgement that only the first caller writes, failures, retirement
// and the recovery scan.
func TestOutbox(t *testing.T, f Factory) {
	t.Run("TheTransactionIDIsDerivedFromPrincipalDeliveryAndStage", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		p := x.v.Principal()
		initial := x.enqueue(x.v, answer("d1", journal.StageInitial, dRoom, "thinking", "$q1"))
		final := x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "answer"))
		same(t, "initial txn", initial.TxnID, journal.TxnID(p, "d1", journal.StageInitial))
		same(t, "final txn", final.TxnID, journal.TxnID(p, "d1", journal.StageFinal))
		if initial.TxnID == final.TxnID {
			t.Fatalf("both stages share transaction ID %q", initial.TxnID)
		}
		same(t, "stored initial txn", x.delivery(x.v, "d1", journal.StageInitial).TxnID, initial.TxnID)

		// Another principal's delivery of the same name is another send.
		other := x.view("other-agent", dBot)
		res := x.enqueue(other, answer("d1", journal.StageInitial, dRoom, "thinking"))
		same(t, "other principal's txn", res.TxnID, journal.TxnID(other.Principal(), "d1", journal.StageInitial))
		if res.TxnID == initial.TxnID {
			t.Fatalf("two principals share transaction ID %q", res.TxnID)
		}
	})

	t.Run("TheTransactionIDIsTheSameAcrossRestarts", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		first := x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "draft", "$q1"))
		x.restart()
		again := x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "better"))
		same(t, "outcome after restart", again.Outcome, journal.EnqueueUpdated)
		same(t, "txn after restart", again.TxnID, first.TxnID)
		d := x.claim(x.v, "d1", journal.StageFinal)
		x.restart()
		same(t, "claimed txn after restart", x.delivery(x.v, "d1", journal.StageFinal).TxnID, first.TxnID)
		same(t, "claimed txn", d.TxnID, first.TxnID)
	})

	t.Run("TheTransactionIDNeverDependsOnTheEpoch", func(t *testing.T) {
		x := newDFX(t, f)
		x.enqueue(x.v, answer("old", journal.StageFinal, dRoom, "sent before leaving"))
		before := x.claim(x.v, "old", journal.StageFinal)
		same(t, "epoch before", before.Epoch, int64(0))
		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		x.join(x.v, dRoom, "")
		fresh := x.enqueue(x.v, answer("new", journal.StageFinal, dRoom, "sent after rejoining"))
		same(t, "new epoch", fresh.Epoch, int64(1))
		same(t, "txn under the new epoch", fresh.TxnID, journal.TxnID(x.v.Principal(), "new", journal.StageFinal))
		retry := x.claim(x.v, "old", journal.StageFinal)
		same(t, "retried txn", retry.TxnID, before.TxnID)
		same(t, "retried epoch", retry.Epoch, int64(0))
	})

	t.Run("AnUnattemptedDeliveryCanStillChange", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		res := x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "draft", "$q1"))
		same(t, "first outcome", res.Outcome, journal.EnqueueCreated)
		req := answer("d1", journal.StageFinal, dRoom, "revised")
		req.TurnID = "turn-1"
		req.Thread = ptrTo("$q1")
		res = x.enqueue(x.v, req)
		same(t, "second outcome", res.Outcome, journal.EnqueueUpdated)
		d := x.delivery(x.v, "d1", journal.StageFinal)
		same(t, "content", string(d.Content), string(dBody("revised")))
		same(t, "turn", d.TurnID, "turn-1")
		same(t, "thread", derefThread(d.Thread), "$q1")
		same(t, "event type", d.EventType, "m.room.message")
		same(t, "state", d.State, journal.DeliveryQueued)
		same(t, "attempts", d.Attempts, 0)
		same(t, "device", d.DeviceID, "")
	})

	t.Run("EnqueueSettlesExactlyItsSources", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "one"), dText("$q2", 1001, "two"), dText("$q3", 1002, "three"))
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "answer", "$q1", "$q3"))
		same(t, "pending", x.pendingIDs(x.v), []string{"$q2"})
	})

	t.Run("ClaimingFreezesThePayload", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "first text", "$q1"))
		d := x.claim(x.v, "d1", journal.StageFinal)
		same(t, "claimed state", d.State, journal.DeliveryAttempted)
		same(t, "claimed device", d.DeviceID, dDevice)
		same(t, "claimed attempts", d.Attempts, 1)
		same(t, "claimed content", string(d.Content), string(dBody("first text")))

		res := x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "second text"))
		same(t, "outcome", res.Outcome, journal.EnqueueFrozen)
		same(t, "txn", res.TxnID, d.TxnID)
		same(t, "content after re-enqueue", string(x.delivery(x.v, "d1", journal.StageFinal).Content), string(dBody("first text")))

		// A late preflight failure cannot withdraw what may already be sent.
		if err := x.v.Retire(context.Background(), "d1", journal.StageFinal); !errors.Is(err, journal.ErrNotClaimable) {
			t.Fatalf("Retire(attempted) = %v, want %v", err, journal.ErrNotClaimable)
		}
		same(t, "state after refused retire", x.state(x.v, "d1", journal.StageFinal), "attempted")
	})

	t.Run("TheClaimIsDurableBeforeAnyNetworkIO", func(t *testing.T) {
		x := newDFX(t, f)
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "answer"))
		x.claim(x.v, "d1", journal.StageFinal)
		x.restart()
		d := x.delivery(x.v, "d1", journal.StageFinal)
		same(t, "state after restart", d.State, journal.DeliveryAttempted)
		same(t, "device after restart", d.DeviceID, dDevice)
		same(t, "unacknowledged after restart", x.unacked(x.v), []string{"d1/final"})
	})

	t.Run("ReclaimingReturnsTheIdenticalDelivery", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		req := answer("d1", journal.StageFinal, dRoom, "answer", "$q1")
		req.Thread, req.TurnID = ptrTo("$q1"), "turn-1"
		x.enqueue(x.v, req)
		first := x.claim(x.v, "d1", journal.StageFinal)
		x.restart()
		d := x.claim(x.v, "d1", journal.StageFinal)
		same(t, "txn", d.TxnID, first.TxnID)
		same(t, "content", string(d.Content), string(first.Content))
		same(t, "room", d.RoomID, first.RoomID)
		same(t, "thread", derefThread(d.Thread), "$q1")
		same(t, "turn", d.TurnID, first.TurnID)
		same(t, "replaces", d.ReplacesEventID, first.ReplacesEventID)
		same(t, "epoch", d.Epoch, first.Epoch)
		same(t, "state", d.State, journal.DeliveryAttempted)
		same(t, "device", d.DeviceID, dDevice)
		same(t, "attempts", d.Attempts, 2)
		w1, err := journal.WireContent(first)
		if err != nil {
			t.Fatal(err)
		}
		w2, err := journal.WireContent(d)
		if err != nil {
			t.Fatal(err)
		}
		same(t, "wire content", string(w2), string(w1))
	})

	t.Run("AnotherDeviceResendsAnAttemptedRowOnlyAfterAdoptingIt", func(t *testing.T) {
		// The homeserver deduplicates transaction IDs per device: a resend
		// from a new device could show the reply twice, so the row is
		// refused to it until a search of the room found no copy.
		x := newDFX(t, f)
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "answer"))
		first := x.claim(x.v, "d1", journal.StageFinal)
		x.restart()
		d, err := x.v.Claim(context.Background(), "d1", journal.StageFinal, "NEWDEVICE")
		if !errors.Is(err, journal.ErrDeviceChanged) {
			t.Fatalf("claim from a new device = %v, %v; want %v", d.State, err, journal.ErrDeviceChanged)
		}
		same(t, "device after the refusal", x.delivery(x.v, "d1", journal.StageFinal).DeviceID, dDevice)
		if err := x.v.AdoptDevice(context.Background(), "d1", journal.StageFinal, "NEWDEVICE"); err != nil {
			t.Fatalf("AdoptDevice: %v", err)
		}
		d, err = x.v.Claim(context.Background(), "d1", journal.StageFinal, "NEWDEVICE")
		if err != nil {
			t.Fatalf("claim after adopting: %v", err)
		}
		same(t, "device", d.DeviceID, "NEWDEVICE")
		same(t, "txn", d.TxnID, first.TxnID)
		same(t, "content", string(d.Content), string(first.Content))
		if _, err := x.v.Claim(context.Background(), "d1", journal.StageFinal, dDevice); !errors.Is(err, journal.ErrDeviceChanged) {
			t.Fatalf("claim from the old device after the adoption = %v, want %v", err, journal.ErrDeviceChanged)
		}
	})

	t.Run("OnlyAnAttemptedRowCanBeAdopted", func(t *testing.T) {
		x := newDFX(t, f)
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "answer"))
		if err := x.v.AdoptDevice(context.Background(), "d1", journal.StageFinal, "NEWDEVICE"); !errors.Is(err, journal.ErrNotClaimable) {
			t.Fatalf("adopting a queued row = %v, want %v", err, journal.ErrNotClaimable)
		}
		x.claim(x.v, "d1", journal.StageFinal)
		x.ack(x.v, "d1", journal.StageFinal, "$a1")
		if err := x.v.AdoptDevice(context.Background(), "d1", journal.StageFinal, "NEWDEVICE"); !errors.Is(err, journal.ErrNotClaimable) {
			t.Fatalf("adopting an acknowledged row = %v, want %v", err, journal.ErrNotClaimable)
		}
		if err := x.v.AdoptDevice(context.Background(), "d9", journal.StageFinal, "NEWDEVICE"); !errors.Is(err, journal.ErrNoDelivery) {
			t.Fatalf("adopting a missing row = %v, want %v", err, journal.ErrNoDelivery)
		}
	})

	t.Run("OnlyOneOfTwoConcurrentClaimsSeesAnUnattemptedRow", func(t *testing.T) {
		x := newDFX(t, f)
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "answer"))
		var (
			wg   sync.WaitGroup
			got  [2]journal.Delivery
			errs [2]error
		)
		for i := range got {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got[i], errs[i] = x.v.Claim(context.Background(), "d1", journal.StageFinal, dDevice)
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("claim %d: %v", i, err)
			}
		}
		attempts := []int{got[0].Attempts, got[1].Attempts}
		slices.Sort(attempts)
		same(t, "attempt numbers", attempts, []int{1, 2})
		same(t, "txn", got[1].TxnID, got[0].TxnID)
		same(t, "content", string(got[1].Content), string(got[0].Content))
	})

	t.Run("TheFirstAcknowledgementWinsAndCompletesTheTurn", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		x.upsertTurn(x.v, journal.TurnRecord{TurnID: "turn-1", RoomID: dRoom, State: journal.TurnResultRecorded,
			Sources: []string{"$q1"}, Record: []byte(`{"result":"answer"}`)})
		req := answer("d1", journal.StageFinal, dRoom, "answer", "$q1")
		req.TurnID = "turn-1"
		x.enqueue(x.v, req)
		x.claim(x.v, "d1", journal.StageFinal)

		first := x.ack(x.v, "d1", journal.StageFinal, "$a1")
		same(t, "first ack", first, journal.AckResult{EventID: "$a1", First: true, RoomID: dRoom, Projected: true})
		rec, ok := x.turn(x.v, "turn-1")
		if !ok {
			t.Fatalf("turn-1 vanished")
		}
		same(t, "turn state", rec.State, journal.TurnDelivered)
		same(t, "turn event", rec.EventID, "$a1")
		same(t, "turn record kept", string(rec.Record), `{"result":"answer"}`)

		second := x.ack(x.v, "d1", journal.StageFinal, "$a2")
		same(t, "losing ack", second, journal.AckResult{EventID: "$a1"})
		d := x.delivery(x.v, "d1", journal.StageFinal)
		same(t, "delivery state", d.State, journal.DeliveryAcknowledged)
		same(t, "delivery event", d.EventID, "$a1")
		same(t, "turn after losing ack", x.turnFor(x.v, "$q1"), "turn-1 2 $a1")
		same(t, "screen", x.screen(x.v, dRoom), []string{"$q1:question", "$a1:answer"})
		x.restart()
		same(t, "turn after restart", x.turnFor(x.v, "$q1"), "turn-1 2 $a1")
		same(t, "screen after restart", x.screen(x.v, dRoom), []string{"$q1:question", "$a1:answer"})
	})

	t.Run("TheAcknowledgedAnswerIsItsOwnEchoInTheConversation", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "answer", "$q1"))
		d := x.claim(x.v, "d1", journal.StageFinal)
		x.ack(x.v, "d1", journal.StageFinal, "$a1")
		wire, err := journal.WireContent(d)
		if err != nil {
			t.Fatal(err)
		}
		echo := dEvent{"event_id": "$a1", "type": "m.room.message", "sender": dBot, "origin_server_ts": int64(5000),
			"content": wire}
		same(t, "echo outcome", x.admitOutcomes(x.v, dRoom, echo), []journal.Outcome{journal.Duplicate})
		same(t, "screen", x.screen(x.v, dRoom), []string{"$q1:question", "$a1:answer"})
		same(t, "pending", x.pendingIDs(x.v), []string{})
	})

	t.Run("AcknowledgementSupersedesAPermanentFailure", func(t *testing.T) {
		x := newDFX(t, f)
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "answer"))
		x.claim(x.v, "d1", journal.StageFinal)
		x.fail(x.v, "d1", journal.StageFinal, "M_FORBIDDEN", true)
		same(t, "failed state", x.state(x.v, "d1", journal.StageFinal), "failed")
		got := x.ack(x.v, "d1", journal.StageFinal, "$a1")
		same(t, "ack", got, journal.AckResult{EventID: "$a1", First: true, RoomID: dRoom, Projected: true})
		d := x.delivery(x.v, "d1", journal.StageFinal)
		same(t, "state", d.State, journal.DeliveryAcknowledged)
		same(t, "last error", d.LastError, "")
		// A failure reported after the acknowledgement changes nothing.
		x.fail(x.v, "d1", journal.StageFinal, "late", true)
		d = x.delivery(x.v, "d1", journal.StageFinal)
		same(t, "state after late failure", d.State, journal.DeliveryAcknowledged)
		same(t, "event after late failure", d.EventID, "$a1")
		same(t, "unacknowledged", x.unacked(x.v), []string{})
	})

	t.Run("APermanentFailureLeavesRecoveryATransientOneDoesNot", func(t *testing.T) {
		x := newDFX(t, f)
		x.enqueue(x.v, answer("transient", journal.StageFinal, dRoom, "a"))
		x.enqueue(x.v, answer("permanent", journal.StageFinal, dRoom, "b"))
		x.enqueue(x.v, answer("queued", journal.StageFinal, dRoom, "c"))
		x.claim(x.v, "transient", journal.StageFinal)
		x.claim(x.v, "permanent", journal.StageFinal)
		x.fail(x.v, "transient", journal.StageFinal, "timeout", false)
		x.fail(x.v, "permanent", journal.StageFinal, "M_TOO_LARGE", true)
		x.fail(x.v, "queued", journal.StageFinal, "preflight", true)

		d := x.delivery(x.v, "transient", journal.StageFinal)
		same(t, "transient state", d.State, journal.DeliveryAttempted)
		same(t, "transient error", d.LastError, "timeout")
		d = x.delivery(x.v, "permanent", journal.StageFinal)
		same(t, "permanent state", d.State, journal.DeliveryFailed)
		same(t, "permanent error", d.LastError, "M_TOO_LARGE")
		same(t, "queued state", x.state(x.v, "queued", journal.StageFinal), "failed")
		same(t, "unacknowledged", x.unacked(x.v), []string{"transient/final"})
		x.claimErr(x.v, "permanent", journal.StageFinal, journal.ErrNotClaimable)
		x.claimErr(x.v, "queued", journal.StageFinal, journal.ErrNotClaimable)
		again := x.claim(x.v, "transient", journal.StageFinal)
		same(t, "transient retried", again.Attempts, 2)
	})

	t.Run("OnlyAnUnattemptedStageCanBeRetired", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		x.enqueue(x.v, answer("d1", journal.StageInitial, dRoom, "thinking", "$q1"))
		x.enqueue(x.v, answer("d2", journal.StageFinal, dRoom, "answer"))
		x.claim(x.v, "d2", journal.StageFinal)
		if err := x.v.Retire(context.Background(), "d1", journal.StageInitial); err != nil {
			t.Fatalf("Retire(queued): %v", err)
		}
		if err := x.v.Retire(context.Background(), "d2", journal.StageFinal); !errors.Is(err, journal.ErrNotClaimable) {
			t.Fatalf("Retire(attempted) = %v, want %v", err, journal.ErrNotClaimable)
		}
		if err := x.v.Retire(context.Background(), "nothing", journal.StageFinal); !errors.Is(err, journal.ErrNoDelivery) {
			t.Fatalf("Retire(missing) = %v, want %v", err, journal.ErrNoDelivery)
		}
		same(t, "retired state", x.state(x.v, "d1", journal.StageInitial), "retired")
		same(t, "unacknowledged", x.unacked(x.v), []string{"d2/final"})
		x.claimErr(x.v, "d1", journal.StageInitial, journal.ErrNotClaimable)
		// A retired stage is a tombstone: neither stage of its delivery
		// comes back.
		x.refuse(x.v, answer("d1", journal.StageInitial, dRoom, "again"), journal.ErrDeliveryRetired)
		x.refuse(x.v, answer("d1", journal.StageFinal, dRoom, "answer"), journal.ErrDeliveryRetired)
		same(t, "final never written", x.state(x.v, "d1", journal.StageFinal), "absent")
		// The sources handed over with the retired stage stay answered.
		same(t, "pending", x.pendingIDs(x.v), []string{})
	})

	t.Run("TheRecoveryScanIsOldestFirstWithoutGapsOrRepeats", func(t *testing.T) {
		x := newDFX(t, f)
		for _, id := range []string{"d1", "d2", "d3", "d4", "d5", "d6", "d7"} {
			x.enqueue(x.v, answer(id, journal.StageFinal, dRoom, "answer "+id))
		}
		x.claim(x.v, "d2", journal.StageFinal)
		x.claim(x.v, "d4", journal.StageFinal)
		x.ack(x.v, "d4", journal.StageFinal, "$a4")
		x.claim(x.v, "d5", journal.StageFinal)
		x.fail(x.v, "d5", journal.StageFinal, "gone", true)
		if err := x.v.Retire(context.Background(), "d6", journal.StageFinal); err != nil {
			t.Fatal(err)
		}
		// Updating an unattempted row keeps its place in the scan.
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "revised"))
		same(t, "scan", x.unacked(x.v), []string{"d1/final", "d2/final", "d3/final", "d7/final"})

		rows, err := x.v.Unacknowledged(context.Background(), 10, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := 1; i < len(rows); i++ {
			a, b := rows[i-1], rows[i]
			if a.CreatedMS > b.CreatedMS || (a.CreatedMS == b.CreatedMS && a.Position >= b.Position) {
				t.Fatalf("rows %d and %d out of order: (%d, %d) then (%d, %d)", i-1, i, a.CreatedMS, a.Position, b.CreatedMS, b.Position)
			}
		}
		last := rows[len(rows)-1]
		tail, err := x.v.Unacknowledged(context.Background(), 10, &journal.DeliveryCursor{CreatedMS: last.CreatedMS, Position: last.Position})
		if err != nil {
			t.Fatal(err)
		}
		same(t, "after the last row", len(tail), 0)
		if _, err := x.v.Unacknowledged(context.Background(), 0, nil); !errors.Is(err, journal.ErrInvalidArgument) {
			t.Fatalf("Unacknowledged(limit 0) = %v, want %v", err, journal.ErrInvalidArgument)
		}
	})

	t.Run("AnAcknowledgedDeliveryIsNeverSentAgain", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "accepted", "$q1"))
		x.claim(x.v, "d1", journal.StageFinal)
		x.ack(x.v, "d1", journal.StageFinal, "$a1")
		x.restart()
		same(t, "unacknowledged", x.unacked(x.v), []string{})
		// A regenerated answer cannot replace the accepted one.
		res := x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "regenerated"))
		same(t, "outcome", res.Outcome, journal.EnqueueFrozen)
		d := x.delivery(x.v, "d1", journal.StageFinal)
		same(t, "content", string(d.Content), string(dBody("accepted")))
		same(t, "state", d.State, journal.DeliveryAcknowledged)
		x.claimErr(x.v, "d1", journal.StageFinal, journal.ErrNotClaimable)
		same(t, "screen", x.screen(x.v, dRoom), []string{"$q1:question", "$a1:accepted"})
	})

	t.Run("OnlyAnAcknowledgedEventOfTheRoomIsKnownAsDelivered", func(t *testing.T) {
		x := newDFX(t, f)
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "accepted"))
		x.claim(x.v, "d1", journal.StageFinal)
		x.ack(x.v, "d1", journal.StageFinal, "$a1")
		x.enqueue(x.v, answer("d2", journal.StageFinal, dRoom, "in doubt"))
		x.claim(x.v, "d2", journal.StageFinal)
		x.restart()
		other := x.view("other-agent", dBot)
		for _, c := range []struct {
			name        string
			v           journal.PrincipalStore
			room, event string
			want        bool
		}{
			{"TheAcknowledgedEvent", x.v, dRoom, "$a1", true},
			{"InAnotherRoom", x.v, dRoom2, "$a1", false},
			{"OfAnotherPrincipal", other, dRoom, "$a1", false},
			{"AnyOtherEvent", x.v, dRoom, "$a2", false},
		} {
			got, err := c.v.DeliveredEvent(context.Background(), c.room, c.event)
			if err != nil || got != c.want {
				t.Fatalf("%s: DeliveredEvent(%s, %s) = %v, %v; want %v", c.name, c.room, c.event, got, err, c.want)
			}
		}
	})

	t.Run("DeliveriesBelongToOnePrincipal", func(t *testing.T) {
		x := newDFX(t, f)
		other := x.view(dAgent, "@someone-else:example.org")
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "mine"))
		for _, call := range []struct {
			name string
			err  error
		}{
			{"Delivery", func() error { _, err := other.Delivery(context.Background(), "d1", journal.StageFinal); return err }()},
			{"Claim", func() error {
				_, err := other.Claim(context.Background(), "d1", journal.StageFinal, dDevice)
				return err
			}()},
			{"Acknowledge", func() error {
				_, err := other.Acknowledge(context.Background(), "d1", journal.StageFinal, journal.Sent{EventID: "$x", ServerTS: dServerEpochMS})
				return err
			}()},
			{"Fail", other.Fail(context.Background(), "d1", journal.StageFinal, "x", true)},
			{"Retire", other.Retire(context.Background(), "d1", journal.StageFinal)},
		} {
			if !errors.Is(call.err, journal.ErrNoDelivery) {
				t.Fatalf("other principal's %s = %v, want %v", call.name, call.err, journal.ErrNoDelivery)
			}
		}
		same(t, "other's scan", x.unacked(other), []string{})
		same(t, "own state", x.state(x.v, "d1", journal.StageFinal), "queued")
		// Its own delivery of the same name is a separate row.
		x.enqueue(other, answer("d1", journal.StageFinal, dRoom, "theirs"))
		same(t, "own content", string(x.delivery(x.v, "d1", journal.StageFinal).Content), string(dBody("mine")))
		same(t, "other content", string(x.delivery(other, "d1", journal.StageFinal).Content), string(dBody("theirs")))
	})

	t.Run("MalformedRequestsAreRefused", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		for _, req := range []journal.EnqueueRequest{
			{DeliveryID: "", Stage: journal.StageFinal, RoomID: dRoom, Content: dBody("a"), Sources: []string{"$q1"}},
			{DeliveryID: "d1", Stage: 7, RoomID: dRoom, Content: dBody("a"), Sources: []string{"$q1"}},
			{DeliveryID: "d1", Stage: journal.StageFinal, RoomID: "not-a-room", Content: dBody("a"), Sources: []string{"$q1"}},
			{DeliveryID: "d1", Stage: journal.StageFinal, RoomID: dRoom, Content: []byte(`["a"]`), Sources: []string{"$q1"}},
			{DeliveryID: "d1", Stage: journal.StageFinal, RoomID: dRoom, Content: []byte(`{"body":`), Sources: []string{"$q1"}},
		} {
			x.refuse(x.v, req, journal.ErrInvalidArgument)
		}
		same(t, "pending", x.pendingIDs(x.v), []string{"$q1"})
		same(t, "scan", x.unacked(x.v), []string{})
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "a"))
		x.claim(x.v, "d1", journal.StageFinal)
		if _, err := x.v.Acknowledge(context.Background(), "d1", journal.StageFinal, journal.Sent{EventID: "not-an-event", ServerTS: dServerEpochMS}); !errors.Is(err, journal.ErrInvalidArgument) {
			t.Fatalf("Acknowledge(bad event ID) = %v, want %v", err, journal.ErrInvalidArgument)
		}
		same(t, "state", x.state(x.v, "d1", journal.StageFinal), "attempted")
		if _, err := x.v.Claim(context.Background(), "d1", 9, dDevice); !errors.Is(err, journal.ErrInvalidArgument) {
			t.Fatalf("Claim(bad stage) = %v, want %v", err, journal.ErrInvalidArgument)
		}
		if _, err := x.v.Claim(context.Background(), "missing", journal.StageFinal, dDevice); !errors.Is(err, journal.ErrNoDelivery) {
			t.Fatalf("Claim(missing) = %v, want %v", err, journal.ErrNoDelivery)
		}
	})
}

// ptrTo returns a pointer to s.
func ptrTo(s string) *string { return &s }

// derefThread renders a typed thread, "" for the room.
func derefThread(th *string) string {
	if th == nil {
		return ""
	}
	return *th
}
