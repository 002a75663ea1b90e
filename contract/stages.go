package contract

import (
	"context"
	"errors"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
)

// TestInitialAndFinalStages checks how the optional placeholder and the
// answer of one delivery interact: separate sends, the placeholder dropped
// when it was never attempted, edited when it was acknowledged, and never
// shown once the answer owns the delivery.
func TestInitialAndFinalStages(t *testing.T, f Factory) {
	t.Run("TheStagesDoNotShareATransaction", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		i := x.enqueue(x.v, answer("d1", journal.StageInitial, dRoom, "thinking", "$q1"))
		fin := x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "answer"))
		if i.TxnID == fin.TxnID {
			t.Fatalf("initial and final share transaction ID %q", i.TxnID)
		}
		same(t, "outcomes", []journal.EnqueueOutcome{i.Outcome, fin.Outcome},
			[]journal.EnqueueOutcome{journal.EnqueueCreated, journal.EnqueueCreated})
		same(t, "scan", x.unacked(x.v), []string{"d1/initial", "d1/final"})
	})

	t.Run("AFinalClaimedBeforeItsPlaceholderDropsThePlaceholder", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		x.enqueue(x.v, answer("d1", journal.StageInitial, dRoom, "thinking", "$q1"))
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "answer"))
		d := x.claim(x.v, "d1", journal.StageFinal)
		same(t, "replaces", d.ReplacesEventID, "")
		same(t, "initial state", x.state(x.v, "d1", journal.StageInitial), "retired")
		same(t, "scan", x.unacked(x.v), []string{"d1/final"})
		x.claimErr(x.v, "d1", journal.StageInitial, journal.ErrNotClaimable)
		x.ack(x.v, "d1", journal.StageFinal, "$a1")
		same(t, "screen", x.screen(x.v, dRoom), []string{"$q1:question", "$a1:answer"})
		same(t, "scan after ack", x.unacked(x.v), []string{})
	})

	t.Run("AFinalWaitsForItsAttemptedPlaceholder", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		x.enqueue(x.v, answer("d1", journal.StageInitial, dRoom, "thinking", "$q1"))
		x.claim(x.v, "d1", journal.StageInitial)
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "answer"))
		x.claimErr(x.v, "d1", journal.StageFinal, journal.ErrStageBlocked)
		same(t, "final state while blocked", x.state(x.v, "d1", journal.StageFinal), "queued")
		// A transient failure of the placeholder keeps the final blocked.
		x.fail(x.v, "d1", journal.StageInitial, "timeout", false)
		x.claimErr(x.v, "d1", journal.StageFinal, journal.ErrStageBlocked)
		x.restart()
		x.claimErr(x.v, "d1", journal.StageFinal, journal.ErrStageBlocked)
		same(t, "scan", x.unacked(x.v), []string{"d1/initial", "d1/final"})
	})

	t.Run("AFinalEditsItsAcknowledgedPlaceholder", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		x.enqueue(x.v, answer("d1", journal.StageInitial, dRoom, "thinking", "$q1"))
		x.claim(x.v, "d1", journal.StageInitial)
		same(t, "initial ack", x.ack(x.v, "d1", journal.StageInitial, "$p1"),
			journal.AckResult{EventID: "$p1", First: true, RoomID: dRoom, Projected: true})
		same(t, "screen with placeholder", x.screen(x.v, dRoom), []string{"$q1:question", "$p1:thinking"})

		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "answer"))
		d := x.claim(x.v, "d1", journal.StageFinal)
		same(t, "replaces", d.ReplacesEventID, "$p1")
		wire, err := journal.WireContent(d)
		if err != nil {
			t.Fatal(err)
		}
		want := `{"body":"* answer","io.mindroomd.delivery":{"delivery_id":"d1","stage":"final"},` +
			`"m.new_content":{"body":"answer","io.mindroomd.delivery":{"delivery_id":"d1","stage":"final"},"msgtype":"m.text"},` +
			`"m.relates_to":{"event_id":"$p1","rel_type":"m.replace"},"msgtype":"m.text"}`
		same(t, "wire content", string(wire), want)
		// Survives a restart: the claim froze the edit target.
		x.restart()
		same(t, "replaces after restart", x.claim(x.v, "d1", journal.StageFinal).ReplacesEventID, "$p1")
		same(t, "final ack", x.ack(x.v, "d1", journal.StageFinal, "$a1"),
			journal.AckResult{EventID: "$a1", First: true, RoomID: dRoom, Projected: true})
		// One message on screen: the placeholder now shows the answer.
		same(t, "screen", x.screen(x.v, dRoom), []string{"$q1:question", "$p1:answer"})
	})

	t.Run("TheAnswerReplacesThePlaceholderWhateverTheEventIDsSortAs", func(t *testing.T) {
		// The homeserver's event IDs are opaque: the answer's may sort
		// before the placeholder's, and both acknowledgements may fall in
		// the same millisecond.
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		x.enqueue(x.v, answer("d1", journal.StageInitial, dRoom, "thinking", "$q1"))
		x.claim(x.v, "d1", journal.StageInitial)
		x.ack(x.v, "d1", journal.StageInitial, "$zzz-placeholder")
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "answer"))
		x.claim(x.v, "d1", journal.StageFinal)
		x.ack(x.v, "d1", journal.StageFinal, "$aaa-answer")
		same(t, "screen", x.screen(x.v, dRoom), []string{"$q1:question", "$zzz-placeholder:answer"})
	})

	t.Run("AFailedPlaceholderWithoutAFinalStaysRecoverable", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		x.enqueue(x.v, answer("d1", journal.StageInitial, dRoom, "thinking", "$q1"))
		first := x.claim(x.v, "d1", journal.StageInitial)
		x.fail(x.v, "d1", journal.StageInitial, "502", false)
		x.restart()
		same(t, "scan", x.unacked(x.v), []string{"d1/initial"})
		again := x.claim(x.v, "d1", journal.StageInitial)
		same(t, "txn", again.TxnID, first.TxnID)
		same(t, "last error", again.LastError, "502")
	})

	t.Run("APermanentlyFailedPlaceholderDoesNotBlockTheAnswer", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		x.enqueue(x.v, answer("d1", journal.StageInitial, dRoom, "thinking", "$q1"))
		x.claim(x.v, "d1", journal.StageInitial)
		x.fail(x.v, "d1", journal.StageInitial, "M_FORBIDDEN", true)
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "answer"))
		d := x.claim(x.v, "d1", journal.StageFinal)
		same(t, "replaces", d.ReplacesEventID, "")
		same(t, "initial state", x.state(x.v, "d1", journal.StageInitial), "failed")
		x.ack(x.v, "d1", journal.StageFinal, "$a1")
		same(t, "screen", x.screen(x.v, dRoom), []string{"$q1:question", "$a1:answer"})
	})

	t.Run("APlaceholderCannotShowOnceItsAnswerOwnsTheDelivery", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "answer", "$q1"))
		x.claim(x.v, "d1", journal.StageFinal)
		// A placeholder handed over late, after the answer was claimed.
		x.enqueue(x.v, answer("d1", journal.StageInitial, dRoom, "thinking"))
		x.claimErr(x.v, "d1", journal.StageInitial, journal.ErrNotClaimable)
		// Refused for good: it is retired, and the scan no longer offers it.
		same(t, "initial state", x.state(x.v, "d1", journal.StageInitial), "retired")
		same(t, "scan", x.unacked(x.v), []string{"d1/final"})
		x.claimErr(x.v, "d1", journal.StageInitial, journal.ErrNotClaimable)
		x.ack(x.v, "d1", journal.StageFinal, "$a1")
		same(t, "screen", x.screen(x.v, dRoom), []string{"$q1:question", "$a1:answer"})
	})

	t.Run("ReplayingAnAnswerThatDroppedItsPlaceholderChangesNothing", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		x.enqueue(x.v, answer("d1", journal.StageInitial, dRoom, "thinking"))
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "answer", "$q1"))
		x.claim(x.v, "d1", journal.StageFinal) // drops the unsent placeholder
		same(t, "initial state", x.state(x.v, "d1", journal.StageInitial), "retired")
		res := x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "a different answer", "$q1"))
		same(t, "outcome", res.Outcome, journal.EnqueueFrozen)
		x.ack(x.v, "d1", journal.StageFinal, "$a1")
		same(t, "screen", x.screen(x.v, dRoom), []string{"$q1:question", "$a1:answer"})
	})
}

// TestTheHandoffIsOneTransaction checks that an answer and the settlement
// of the events it answers commit together, or not at all.
func TestTheHandoffIsOneTransaction(t *testing.T, f Factory) {
	t.Run("TheRowAndTheSettlementCommitTogether", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "one"), dText("$q2", 1001, "two"))
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "answer", "$q1", "$q2"))
		x.restart()
		same(t, "pending", x.pendingIDs(x.v), []string{})
		same(t, "scan", x.unacked(x.v), []string{"d1/final"})
	})

	t.Run("AnUnknownSourceRollsTheWholeHandoffBack", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "one"))
		x.refuse(x.v, answer("d1", journal.StageFinal, dRoom, "answer", "$q1", "$never-seen"), journal.ErrUnknownSource)
		same(t, "pending", x.pendingIDs(x.v), []string{"$q1"})
		same(t, "row", x.state(x.v, "d1", journal.StageFinal), "absent")
	})

	t.Run("ASourceFromAnotherRoomIsRefused", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "here"))
		x.admit(x.v, dRoom2, dText("$r1", 1001, "there"))
		x.refuse(x.v, answer("d1", journal.StageFinal, dRoom, "answer", "$q1", "$r1"), journal.ErrUnknownSource)
		same(t, "pending", x.pendingIDs(x.v), []string{"$q1", "$r1"})
		same(t, "row", x.state(x.v, "d1", journal.StageFinal), "absent")
	})

	t.Run("AnotherPrincipalsSourceIsUnknown", func(t *testing.T) {
		x := newDFX(t, f)
		other := x.view("other-agent", dBot)
		x.admit(other, dRoom, dText("$q1", 1000, "for the other agent"))
		x.refuse(x.v, answer("d1", journal.StageFinal, dRoom, "answer", "$q1"), journal.ErrUnknownSource)
		same(t, "other's pending", x.pendingIDs(other), []string{"$q1"})
	})

	t.Run("ARetiredDeliveryHandsNothingOver", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "one"), dText("$q2", 1001, "two"))
		x.enqueue(x.v, answer("d1", journal.StageInitial, dRoom, "thinking", "$q1"))
		if err := x.v.Retire(context.Background(), "d1", journal.StageInitial); err != nil {
			t.Fatal(err)
		}
		x.refuse(x.v, answer("d1", journal.StageFinal, dRoom, "answer", "$q2"), journal.ErrDeliveryRetired)
		same(t, "pending", x.pendingIDs(x.v), []string{"$q2"})
		same(t, "final", x.state(x.v, "d1", journal.StageFinal), "absent")
	})

	t.Run("AnEndedMembershipHandsNothingOver", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "one"))
		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		x.refuse(x.v, answer("d1", journal.StageFinal, dRoom, "answer"), journal.ErrMembershipEnded)
		x.join(x.v, dRoom, "")
		x.admit(x.v, dRoom, dText("$q2", 2000, "two"))
		// $q2 is current but $q1 was admitted by the ended membership.
		x.refuse(x.v, answer("d1", journal.StageFinal, dRoom, "answer", "$q2", "$q1"), journal.ErrMembershipEnded)
		same(t, "row", x.state(x.v, "d1", journal.StageFinal), "absent")
		same(t, "pending", x.pendingIDs(x.v), []string{"$q2"})
	})
}

// TestOneTurnStageIsOneMessage checks that one stage of one delivery is one
// message, whatever is handed over for it later.
func TestOneTurnStageIsOneMessage(t *testing.T, f Factory) {
	t.Run("ASecondAnswerForOneTurnKeepsTheFirstText", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"), dText("$q2", 1001, "follow-up"))
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "first answer", "$q1"))
		first := x.claim(x.v, "d1", journal.StageFinal)
		res := x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "second answer", "$q2"))
		same(t, "outcome", res.Outcome, journal.EnqueueFrozen)
		same(t, "txn", res.TxnID, first.TxnID)
		// The second hand-over still settles what it answered.
		same(t, "pending", x.pendingIDs(x.v), []string{})
		retry := x.claim(x.v, "d1", journal.StageFinal)
		same(t, "content", string(retry.Content), string(dBody("first answer")))
		x.ack(x.v, "d1", journal.StageFinal, "$a1")
		same(t, "screen", x.screen(x.v, dRoom), []string{"$q1:question", "$q2:follow-up", "$a1:first answer"})
	})

	t.Run("TheTwoStagesDoNotCollide", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		x.enqueue(x.v, answer("d1", journal.StageInitial, dRoom, "thinking", "$q1"))
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "answer"))
		// Updating one stage leaves the other as it was.
		x.enqueue(x.v, answer("d1", journal.StageInitial, dRoom, "still thinking"))
		i := x.delivery(x.v, "d1", journal.StageInitial)
		fin := x.delivery(x.v, "d1", journal.StageFinal)
		same(t, "initial content", string(i.Content), string(dBody("still thinking")))
		same(t, "final content", string(fin.Content), string(dBody("answer")))
		same(t, "stages", []journal.Stage{i.Stage, fin.Stage}, []journal.Stage{journal.StageInitial, journal.StageFinal})
		if i.Position == fin.Position {
			t.Fatalf("both stages are row %d", i.Position)
		}
	})

	t.Run("AnUnknownStageIsNotADelivery", func(t *testing.T) {
		x := newDFX(t, f)
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "answer"))
		if _, err := x.v.Delivery(context.Background(), "d1", journal.StageInitial); !errors.Is(err, journal.ErrNoDelivery) {
			t.Fatalf("Delivery(missing stage) = %v, want %v", err, journal.ErrNoDelivery)
		}
	})
}
