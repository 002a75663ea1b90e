package contract

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
)

// TestDeliveryIsScopedToTheMembershipThatAuthorizedIt checks that an answer
// is written, sent and shown only under the membership that admitted what it
// answers.
func TestDeliveryIsScopedToTheMembershipThatAuthorizedIt(t *testing.T, f Factory) {
	t.Run("ATurnAdmittedUnderAnEndedMembershipCannotEnqueue", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		same(t, "fence", x.fence(x.v, dRoom, journal.DepartureLocal, ""), journal.Fenced)
		x.refuse(x.v, answer("d1", journal.StageFinal, dRoom, "answer", "$q1"), journal.ErrMembershipEnded)
		x.join(x.v, dRoom, "")
		x.refuse(x.v, answer("d1", journal.StageFinal, dRoom, "answer", "$q1"), journal.ErrMembershipEnded)
		x.restart()
		x.refuse(x.v, answer("d1", journal.StageFinal, dRoom, "answer", "$q1"), journal.ErrMembershipEnded)
		same(t, "row", x.state(x.v, "d1", journal.StageFinal), "absent")
	})

	t.Run("AnAdmittedTurnCannotBorrowAnotherRoomsEqualEpoch", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom2, dText("$r1", 1000, "there"))
		x.refuse(x.v, answer("d1", journal.StageFinal, dRoom, "answer", "$r1"), journal.ErrUnknownSource)
		// Both rooms at epoch 1 now; the source still belongs to its room.
		for _, r := range []string{dRoom, dRoom2} {
			x.fence(x.v, r, journal.DepartureReported, "")
			x.join(x.v, r, "")
		}
		x.admit(x.v, dRoom2, dText("$r2", 2000, "there again"))
		same(t, "epochs", []string{x.membership(x.v, dRoom), x.membership(x.v, dRoom2)}, []string{"epoch 1, in", "epoch 1, in"})
		x.refuse(x.v, answer("d1", journal.StageFinal, dRoom, "answer", "$r2"), journal.ErrUnknownSource)
		same(t, "pending", x.pendingIDs(x.v), []string{"$r2"})
	})

	t.Run("ATurnUnderTheCurrentMembershipEnqueues", func(t *testing.T) {
		x := newDFX(t, f)
		x.fence(x.v, dRoom, journal.DepartureReported, "")
		x.join(x.v, dRoom, "")
		x.admit(x.v, dRoom, dText("$q2", 2000, "new question"))
		res := x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "answer", "$q2"))
		same(t, "outcome", res.Outcome, journal.EnqueueCreated)
		same(t, "epoch", res.Epoch, int64(1))
		same(t, "stored epoch", x.delivery(x.v, "d1", journal.StageFinal).Epoch, int64(1))
		same(t, "pending", x.pendingIDs(x.v), []string{})
	})

	t.Run("ARoomAdmittedToBeforeTheFenceTakesTheNewMembershipAfterTheRejoin", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "old question"))
		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		x.join(x.v, dRoom, "")
		x.admit(x.v, dRoom, dText("$q2", 2000, "new question"))
		pending := x.pending(x.v)
		same(t, "pending", len(pending), 1)
		same(t, "pending epoch", []any{pending[0].EventID, pending[0].Epoch}, []any{"$q2", int64(1)})
		res := x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "answer", "$q2"))
		same(t, "outcome", []any{res.Outcome, res.Epoch}, []any{journal.EnqueueCreated, int64(1)})
		same(t, "fence again", x.fence(x.v, dRoom, journal.DepartureLocal, ""), journal.Fenced)
		x.join(x.v, dRoom, "")
		x.admit(x.v, dRoom, dText("$q3", 3000, "newer question"))
		same(t, "membership", x.membership(x.v, dRoom), "epoch 2, in")
		same(t, "after a second fence", x.pending(x.v)[0].Epoch, int64(2))
	})

	t.Run("AnUnattemptedRowIsRetiredByTheFenceForGood", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		x.enqueue(x.v, answer("d1", journal.StageInitial, dRoom, "thinking", "$q1"))
		x.enqueue(x.v, answer("d2", journal.StageFinal, dRoom, "source-less notice"))
		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		same(t, "initial", x.state(x.v, "d1", journal.StageInitial), "retired")
		same(t, "source-less", x.state(x.v, "d2", journal.StageFinal), "retired")
		same(t, "scan", x.unacked(x.v), []string{})
		x.join(x.v, dRoom, "")
		// The late stage must not adopt the new membership.
		x.refuse(x.v, answer("d1", journal.StageFinal, dRoom, "answer"), journal.ErrDeliveryRetired)
		x.refuse(x.v, answer("d1", journal.StageInitial, dRoom, "thinking"), journal.ErrDeliveryRetired)
		x.refuse(x.v, answer("d2", journal.StageFinal, dRoom, "notice"), journal.ErrDeliveryRetired)
		x.claimErr(x.v, "d1", journal.StageInitial, journal.ErrNotClaimable)
		same(t, "final", x.state(x.v, "d1", journal.StageFinal), "absent")
	})

	t.Run("AnAttemptedRowStillRetriesAfterTheFenceUnderItsFirstTransaction", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "answer", "$q1"))
		first := x.claim(x.v, "d1", journal.StageFinal)
		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		same(t, "state", x.state(x.v, "d1", journal.StageFinal), "attempted")
		same(t, "scan", x.unacked(x.v), []string{"d1/final"})
		x.join(x.v, dRoom, "")
		x.restart()
		retry := x.claim(x.v, "d1", journal.StageFinal)
		same(t, "txn", retry.TxnID, first.TxnID)
		same(t, "content", string(retry.Content), string(first.Content))
		same(t, "epoch", retry.Epoch, int64(0))
		same(t, "device", retry.DeviceID, dDevice)
	})

	t.Run("AnAnswerAcknowledgedAfterTheFenceIsNotShown", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		x.upsertTurn(x.v, journal.TurnRecord{TurnID: "turn-1", RoomID: dRoom, State: journal.TurnResultRecorded, Sources: []string{"$q1"}})
		req := answer("d1", journal.StageFinal, dRoom, "answer", "$q1")
		req.TurnID = "turn-1"
		x.enqueue(x.v, req)
		x.claim(x.v, "d1", journal.StageFinal)
		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		// In flight while the membership ended: the send may have happened,
		// so it is recorded, but nothing of the old membership is shown.
		same(t, "membership", x.membership(x.v, dRoom), "epoch 1, out")
		same(t, "ack", x.ack(x.v, "d1", journal.StageFinal, "$a1"), journal.AckResult{EventID: "$a1", First: true, RoomID: dRoom})
		same(t, "turn", x.turnFor(x.v, "$q1"), "turn-1 2 $a1")
		same(t, "screen", x.screen(x.v, dRoom), []string{})
		x.join(x.v, dRoom, "")
		same(t, "screen after rejoin", x.screen(x.v, dRoom), []string{})
	})

	t.Run("ARejoinBetweenSendAndAcknowledgementLeavesOneAnswer", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "answer", "$q1"))
		first := x.claim(x.v, "d1", journal.StageFinal)
		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		x.join(x.v, dRoom, "")
		x.admit(x.v, dRoom, dText("$n1", 3000, "after rejoining"))
		// The regenerated answer cannot replace what may already be sent.
		res := x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "regenerated"))
		same(t, "outcome", res.Outcome, journal.EnqueueFrozen)
		same(t, "epoch", res.Epoch, int64(0))
		same(t, "txn", res.TxnID, first.TxnID)
		same(t, "ack", x.ack(x.v, "d1", journal.StageFinal, "$a1"), journal.AckResult{EventID: "$a1", First: true, RoomID: dRoom})
		same(t, "screen", x.screen(x.v, dRoom), []string{"$n1:after rejoining"})
		same(t, "content", string(x.delivery(x.v, "d1", journal.StageFinal).Content), string(dBody("answer")))
	})

	t.Run("ASourceLessDeliveryWaitsForAnActiveMembership", func(t *testing.T) {
		x := newDFX(t, f)
		x.fence(x.v, dRoom, journal.DepartureReported, "")
		x.refuse(x.v, answer("d1", journal.StageFinal, dRoom, "hello"), journal.ErrMembershipEnded)
		same(t, "row", x.state(x.v, "d1", journal.StageFinal), "absent")
		x.join(x.v, dRoom, "")
		res := x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "hello"))
		same(t, "result", []any{res.Outcome, res.Epoch}, []any{journal.EnqueueCreated, int64(1)})
	})

	t.Run("SourceLessStagesShareOneMembership", func(t *testing.T) {
		x := newDFX(t, f)
		x.enqueue(x.v, answer("d1", journal.StageInitial, dRoom, "thinking"))
		x.claim(x.v, "d1", journal.StageInitial)
		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		x.join(x.v, dRoom, "")
		x.refuse(x.v, answer("d1", journal.StageFinal, dRoom, "answer"), journal.ErrMembershipEnded)
		same(t, "final", x.state(x.v, "d1", journal.StageFinal), "absent")
		// The attempted placeholder keeps its own membership for a retry.
		res := x.enqueue(x.v, answer("d1", journal.StageInitial, dRoom, "thinking"))
		same(t, "placeholder", []any{res.Outcome, res.Epoch}, []any{journal.EnqueueFrozen, int64(0)})
		same(t, "stored epoch", x.delivery(x.v, "d1", journal.StageInitial).Epoch, int64(0))
	})

	t.Run("OneRoomsFenceDoesNotSilenceAnotherRoom", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "here"))
		x.admit(x.v, dRoom2, dText("$r1", 1001, "there"), dText("$r2", 1002, "there too"))
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "answer here"))
		x.enqueue(x.v, answer("d2", journal.StageFinal, dRoom2, "answer there", "$r1"))
		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		same(t, "this room", x.membership(x.v, dRoom), "epoch 1, out")
		same(t, "other room", x.membership(x.v, dRoom2), "epoch 0, in")
		same(t, "other screen", x.screen(x.v, dRoom2), []string{"$r1:there", "$r2:there too"})
		same(t, "pending", x.pendingIDs(x.v), []string{"$r2"})
		same(t, "scan", x.unacked(x.v), []string{"d2/final"})
		x.enqueue(x.v, answer("d3", journal.StageFinal, dRoom2, "more", "$r2"))
		x.claim(x.v, "d2", journal.StageFinal)
		same(t, "ack there", x.ack(x.v, "d2", journal.StageFinal, "$a2"), journal.AckResult{EventID: "$a2", First: true, RoomID: dRoom2, Projected: true})
	})
}

// TestDepartureBookkeeping checks the durable owed echoes of local leaves.
func TestDepartureBookkeeping(t *testing.T, f Factory) {
	t.Run("AConsumedReportLeavesTheNewProjectionAlone", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "old"))
		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		x.join(x.v, dRoom, "join-1")
		x.admit(x.v, dRoom, dText("$n1", 2000, "new"))
		same(t, "echo", x.fence(x.v, dRoom, journal.DepartureReported, "leave-1"), journal.OwedReportConsumed)
		same(t, "membership", x.membership(x.v, dRoom), "epoch 1, in")
		same(t, "screen", x.screen(x.v, dRoom), []string{"$n1:new"})
		same(t, "pending", x.pendingIDs(x.v), []string{"$n1"})
	})

	t.Run("ADepartureWithNoReportOwedInvalidates", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "old"))
		same(t, "report", x.fence(x.v, dRoom, journal.DepartureReported, "kick-1"), journal.Fenced)
		same(t, "membership", x.membership(x.v, dRoom), "epoch 1, out")
		same(t, "screen", x.screen(x.v, dRoom), []string{})
		same(t, "owing", x.owing(x.v), []string{})
	})

	t.Run("OwedReportsAreScopedToOnePrincipal", func(t *testing.T) {
		x := newDFX(t, f)
		other := x.view("other-agent", dBot)
		x.admit(other, dRoom, dText("$q1", 1000, "for the other agent"))
		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		same(t, "own owing", x.owing(x.v), []string{dRoom})
		same(t, "other owing", x.owing(other), []string{})
		// The other principal's own departure is not the echo of this one.
		same(t, "other's report", x.fence(other, dRoom, journal.DepartureReported, "leave-other"), journal.Fenced)
		same(t, "other screen", x.screen(other, dRoom), []string{})
		same(t, "own owing after", x.owing(x.v), []string{dRoom})
		n, err := other.RetireOwedDepartureReports(context.Background(), dRoom)
		if err != nil {
			t.Fatal(err)
		}
		same(t, "retired by the other principal", n, 0)
		same(t, "own owing at last", x.owing(x.v), []string{dRoom})
	})

	t.Run("OwedReportsSurviveARestart", func(t *testing.T) {
		x := newDFX(t, f)
		x.fence(x.v, dRoom2, journal.DepartureLocal, "")
		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		x.restart()
		same(t, "owing", x.owing(x.v), []string{dRoom, dRoom2})
		same(t, "echo", x.fence(x.v, dRoom, journal.DepartureReported, "leave-1"), journal.OwedReportConsumed)
		same(t, "owing after the echo", x.owing(x.v), []string{dRoom2})
	})

	t.Run("RetiringOneRoomLeavesAnotherRoomsReportOwed", func(t *testing.T) {
		x := newDFX(t, f)
		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		x.fence(x.v, dRoom2, journal.DepartureLocal, "")
		n, err := x.v.RetireOwedDepartureReports(context.Background(), dRoom)
		if err != nil {
			t.Fatal(err)
		}
		same(t, "retired", n, 1)
		x.restart()
		same(t, "owing", x.owing(x.v), []string{dRoom2})
		n, err = x.v.RetireOwedDepartureReports(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		same(t, "retiring nothing", n, 0)
		same(t, "owing still", x.owing(x.v), []string{dRoom2})
	})

	t.Run("ARetiredReportIsForgottenDurably", func(t *testing.T) {
		x := newDFX(t, f)
		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		x.join(x.v, dRoom, "")
		n, err := x.v.RetireOwedDepartureReports(context.Background(), dRoom)
		if err != nil {
			t.Fatal(err)
		}
		same(t, "retired", n, 1)
		x.restart()
		same(t, "owing", x.owing(x.v), []string{})
		// With nothing owed, a reported departure is a real one.
		same(t, "report", x.fence(x.v, dRoom, journal.DepartureReported, "kick-1"), journal.Fenced)
		same(t, "membership", x.membership(x.v, dRoom), "epoch 2, out")
	})

	t.Run("NoDeparturesAskForNothing", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "hello"))
		same(t, "owing", x.owing(x.v), []string{})
		x.fence(x.v, dRoom, journal.DepartureReported, "")
		same(t, "owing after a reported departure", x.owing(x.v), []string{})
	})
}

// TestMembershipEpoch checks what an epoch advance does to the departing
// principal's state, and only to it.
func TestMembershipEpoch(t *testing.T, f Factory) {
	t.Run("TheEpochOnlyGrows", func(t *testing.T) {
		x := newDFX(t, f)
		got := []string{x.membership(x.v, dRoom)}
		x.fence(x.v, dRoom, journal.DepartureReported, "kick-1")
		got = append(got, x.membership(x.v, dRoom))
		x.join(x.v, dRoom, "")
		got = append(got, x.membership(x.v, dRoom))
		x.fence(x.v, dRoom, journal.DepartureReported, "kick-2")
		got = append(got, x.membership(x.v, dRoom))
		x.join(x.v, dRoom, "")
		x.restart()
		got = append(got, x.membership(x.v, dRoom))
		same(t, "memberships", got, []string{"epoch 0, in", "epoch 1, out", "epoch 1, in", "epoch 2, out", "epoch 2, in"})
	})

	t.Run("AnOldJoinCannotRearmANewerDeparture", func(t *testing.T) {
		x := newDFX(t, f)
		x.join(x.v, dRoom, "join-1")
		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		x.join(x.v, dRoom, "join-1") // replayed by sync
		same(t, "after the replayed join", x.membership(x.v, dRoom), "epoch 1, out")
		x.refuse(x.v, answer("d1", journal.StageFinal, dRoom, "hello"), journal.ErrMembershipEnded)
		x.join(x.v, dRoom, "join-2")
		same(t, "after a new join", x.membership(x.v, dRoom), "epoch 1, in")
	})

	t.Run("ConsecutiveDeparturesThenAJoinRearmOneMembership", func(t *testing.T) {
		x := newDFX(t, f)
		same(t, "first", x.fence(x.v, dRoom, journal.DepartureReported, "leave-1"), journal.Fenced)
		same(t, "second", x.fence(x.v, dRoom, journal.DepartureReported, "ban-1"), journal.AlreadyFenced)
		x.join(x.v, dRoom, "join-1")
		same(t, "membership", x.membership(x.v, dRoom), "epoch 1, in")
	})

	t.Run("TheDepartingPrincipalsRoomStateGoes", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom,
			dText("$q1", 1000, "visible"),
			dEditOf("$e1", 1001, "$late", "held edit"), // its target has not arrived
			dRedact("$x1", 1002, "$gone"),              // redacted before it arrived
		)
		x.fence(x.v, dRoom, journal.DepartureReported, "")
		same(t, "screen", x.screen(x.v, dRoom), []string{})
		x.join(x.v, dRoom, "")
		same(t, "screen after rejoin", x.screen(x.v, dRoom), []string{})
		// Neither the held edit nor the tombstone reaches into the new
		// membership: both targets arrive and show as they are.
		x.admit(x.v, dRoom, dText("$late", 900, "original"), dText("$gone", 901, "unredacted here"))
		same(t, "screen with late arrivals", x.screen(x.v, dRoom), []string{"$late:original", "$gone:unredacted here"})
	})

	t.Run("MessagesSyncedAfterALeaveAreNeverOwedAnAnswer", func(t *testing.T) {
		// Sent before the leave, delivered by the next sync after it: they
		// belong to the membership that ended.
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "before"))
		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		x.admit(x.v, dRoom, dText("$q2", 1001, "late"), dImage("$i2", 1002), dReact("$re2", 1003, "$q1"),
			dEditOf("$e2", 1004, "$q1", "edited late"), dRedact("$x2", 1005, "$q1"))
		same(t, "pending while out", x.pendingIDs(x.v), []string{})
		same(t, "screen while out", x.screen(x.v, dRoom), []string{})
		x.refuse(x.v, answer("d1", journal.StageFinal, dRoom, "answer", "$q2"), journal.ErrMembershipEnded)

		x.join(x.v, dRoom, "join-1")
		same(t, "pending after the rejoin", x.pendingIDs(x.v), []string{})
		same(t, "screen after the rejoin", x.screen(x.v, dRoom), []string{})
		same(t, "the late events are duplicates", x.admitOutcomes(x.v, dRoom, dText("$q2", 1001, "late")),
			[]journal.Outcome{journal.Duplicate})
		x.admit(x.v, dRoom, dText("$q3", 2000, "after"))
		same(t, "pending of the new membership", x.pendingIDs(x.v), []string{"$q3"})
		same(t, "screen of the new membership", x.screen(x.v, dRoom), []string{"$q3:after"})
		x.restart()
		same(t, "pending after a restart", x.pendingIDs(x.v), []string{"$q3"})
	})

	t.Run("TheFenceSettlesTurnWorkButNotCleanup", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom2, dText("$r1", 900, "elsewhere"))
		x.admit(x.v, dRoom,
			dText("$q1", 1000, "question"),
			dImage("$i1", 1001),
			dRedact("$x1", 1002, "$someone-elses"),
			dReact("$re1", 1003, "$q1"),
		)
		same(t, "pending before", x.pendingIDs(x.v), []string{"$r1", "$q1", "$i1", "$x1", "$re1"})
		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		same(t, "pending after", x.pendingIDs(x.v), []string{"$r1", "$x1", "$re1"})
	})

	t.Run("RejoiningDropsAnswersThePreviousMembershipNeverSent", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		x.enqueue(x.v, answer("d1", journal.StageInitial, dRoom, "thinking", "$q1"))
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "answer"))
		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		x.join(x.v, dRoom, "")
		same(t, "stages", []string{x.state(x.v, "d1", journal.StageInitial), x.state(x.v, "d1", journal.StageFinal)},
			[]string{"retired", "retired"})
		same(t, "scan", x.unacked(x.v), []string{})
	})

	t.Run("RejoiningKeepsAnAnswerThatMayAlreadyBeVisible", func(t *testing.T) {
		x := newDFX(t, f)
		x.enqueue(x.v, answer("d1", journal.StageInitial, dRoom, "thinking"))
		x.claim(x.v, "d1", journal.StageInitial)
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "answer"))
		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		x.join(x.v, dRoom, "")
		same(t, "stages", []string{x.state(x.v, "d1", journal.StageInitial), x.state(x.v, "d1", journal.StageFinal)},
			[]string{"attempted", "retired"})
		same(t, "scan", x.unacked(x.v), []string{"d1/initial"})
	})

	t.Run("RejoiningKeepsAnAnswerMatrixAlreadyAccepted", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "answer", "$q1"))
		x.claim(x.v, "d1", journal.StageFinal)
		x.ack(x.v, "d1", journal.StageFinal, "$a1")
		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		x.join(x.v, dRoom, "")
		d := x.delivery(x.v, "d1", journal.StageFinal)
		same(t, "state", d.State, journal.DeliveryAcknowledged)
		same(t, "event", d.EventID, "$a1")
		same(t, "second ack", x.ack(x.v, "d1", journal.StageFinal, "$a2"), journal.AckResult{EventID: "$a1"})
		same(t, "screen", x.screen(x.v, dRoom), []string{})
	})

	t.Run("EventsOfTheNewMembershipKeepTheirClassPayloads", func(t *testing.T) {
		x := newDFX(t, f)
		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		x.join(x.v, dRoom, "")
		notice := dText("$n1", 2000, "a notice")
		notice["content"] = map[string]any{"msgtype": "m.notice", "body": "a notice"}
		x.admit(x.v, dRoom, notice, dText("$q2", 2001, "a question"))
		page, err := x.v.Pending(context.Background(), 10, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Events) != 1 {
			t.Fatalf("pending = %+v, want only $q2", page.Events)
		}
		e := page.Events[0]
		same(t, "pending event", []any{e.EventID, e.Epoch, e.Kind}, []any{"$q2", int64(1), journal.KindMessage})
		if bodyOf(contentOf(t, e.Event)) != "a question" {
			t.Fatalf("replay payload %s does not carry the question", e.Event)
		}
		same(t, "screen", x.screen(x.v, dRoom), []string{"$n1:a notice", "$q2:a question"})
	})

	t.Run("RejoiningKeepsTheProofThatAnEventWasAnswered", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "answered"), dText("$q2", 1001, "never answered"))
		x.upsertTurn(x.v, journal.TurnRecord{TurnID: "turn-1", RoomID: dRoom, State: journal.TurnResultRecorded, Sources: []string{"$q1"}})
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "answer", "$q1"))
		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		x.join(x.v, dRoom, "")
		// The journal keeps every identity: sync redelivering the old
		// timeline answers nothing again.
		same(t, "redelivery", x.admitOutcomes(x.v, dRoom, dText("$q1", 1000, "answered"), dText("$q2", 1001, "never answered")),
			[]journal.Outcome{journal.Duplicate, journal.Duplicate})
		same(t, "pending", x.pendingIDs(x.v), []string{})
		same(t, "screen", x.screen(x.v, dRoom), []string{})
		same(t, "turn", x.turnFor(x.v, "$q1"), "turn-1 1 ")
	})

	t.Run("AnotherPrincipalInTheRoomKeepsEverything", func(t *testing.T) {
		x := newDFX(t, f)
		other := x.view("other-agent", dBot)
		for _, v := range []journal.PrincipalStore{x.v, other} {
			x.admit(v, dRoom, dText("$q1", 1000, "question"), dEditOf("$e1", 1001, "$late", "held"), dText("$q2", 1002, "more"))
			x.enqueue(v, answer("d1", journal.StageFinal, dRoom, "answer", "$q2"))
		}
		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		same(t, "own membership", x.membership(x.v, dRoom), "epoch 1, out")
		same(t, "other membership", x.membership(other, dRoom), "epoch 0, in")
		same(t, "other screen", x.screen(other, dRoom), []string{"$q1:question", "$q2:more"})
		same(t, "other pending", x.pendingIDs(other), []string{"$q1"})
		same(t, "other scan", x.unacked(other), []string{"d1/final"})
		same(t, "own scan", x.unacked(x.v), []string{})
		same(t, "other owing", x.owing(other), []string{})
		// The other principal's held edit is still held.
		x.admit(other, dRoom, dText("$late", 900, "original"))
		same(t, "other screen with the late target", x.screen(other, dRoom),
			[]string{"$late:held", "$q1:question", "$q2:more"})
	})
}

// TestMembershipFence checks FenceDeparture's outcomes: a local leave owes
// exactly one echo, reports are applied once, and no echo or replay ever
// fences a later membership.
func TestMembershipFence(t *testing.T, f Factory) {
	t.Run("ALocalDepartureFencesImmediately", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		same(t, "outcome", x.fence(x.v, dRoom, journal.DepartureLocal, ""), journal.Fenced)
		same(t, "membership", x.membership(x.v, dRoom), "epoch 1, out")
		same(t, "screen", x.screen(x.v, dRoom), []string{})
		same(t, "pending", x.pendingIDs(x.v), []string{})
		same(t, "owing", x.owing(x.v), []string{dRoom})
	})

	t.Run("ASyncReportedDepartureFences", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		same(t, "outcome", x.fence(x.v, dRoom, journal.DepartureReported, "kick-1"), journal.Fenced)
		same(t, "membership", x.membership(x.v, dRoom), "epoch 1, out")
		same(t, "screen", x.screen(x.v, dRoom), []string{})
		same(t, "owing", x.owing(x.v), []string{})
	})

	t.Run("TheEchoOfALocalDepartureDoesNotFenceAgain", func(t *testing.T) {
		x := newDFX(t, f)
		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		same(t, "echo", x.fence(x.v, dRoom, journal.DepartureReported, "leave-1"), journal.OwedReportConsumed)
		same(t, "membership", x.membership(x.v, dRoom), "epoch 1, out")
		same(t, "owing", x.owing(x.v), []string{})
		// An alias of the same departure seen again consumes nothing more.
		same(t, "alias", x.fence(x.v, dRoom, journal.DepartureReported, "leave-1-state"), journal.AlreadyFenced)
		same(t, "membership after alias", x.membership(x.v, dRoom), "epoch 1, out")
	})

	t.Run("AReplayedReportDoesNotFenceASecondTime", func(t *testing.T) {
		x := newDFX(t, f)
		same(t, "first", x.fence(x.v, dRoom, journal.DepartureReported, "leave-1"), journal.Fenced)
		x.join(x.v, dRoom, "join-1")
		x.admit(x.v, dRoom, dText("$n1", 2000, "new membership"))
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "answer", "$n1"))
		same(t, "replay", x.fence(x.v, dRoom, journal.DepartureReported, "leave-1"), journal.RepeatedReport)
		x.restart()
		same(t, "replay after restart", x.fence(x.v, dRoom, journal.DepartureReported, "leave-1"), journal.RepeatedReport)
		same(t, "membership", x.membership(x.v, dRoom), "epoch 1, in")
		same(t, "screen", x.screen(x.v, dRoom), []string{"$n1:new membership"})
		same(t, "answer", x.state(x.v, "d1", journal.StageFinal), "queued")
	})

	t.Run("TheEchoOfALocalDepartureIsAppliedOnce", func(t *testing.T) {
		x := newDFX(t, f)
		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		same(t, "echo", x.fence(x.v, dRoom, journal.DepartureReported, "leave-1"), journal.OwedReportConsumed)
		x.join(x.v, dRoom, "join-1")
		x.admit(x.v, dRoom, dText("$n1", 2000, "new membership"))
		same(t, "replayed echo", x.fence(x.v, dRoom, journal.DepartureReported, "leave-1"), journal.RepeatedReport)
		same(t, "membership", x.membership(x.v, dRoom), "epoch 1, in")
		same(t, "screen", x.screen(x.v, dRoom), []string{"$n1:new membership"})
	})

	t.Run("TwoReportedDeparturesWithRejoinsAdvanceTwice", func(t *testing.T) {
		x := newDFX(t, f)
		same(t, "first", x.fence(x.v, dRoom, journal.DepartureReported, "leave-1"), journal.Fenced)
		x.join(x.v, dRoom, "join-1")
		same(t, "second", x.fence(x.v, dRoom, journal.DepartureReported, "leave-2"), journal.Fenced)
		same(t, "membership", x.membership(x.v, dRoom), "epoch 2, out")
	})

	t.Run("AfterTheEchoARejoinAndADepartureFenceAgain", func(t *testing.T) {
		x := newDFX(t, f)
		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		x.fence(x.v, dRoom, journal.DepartureReported, "leave-1")
		x.join(x.v, dRoom, "join-1")
		x.admit(x.v, dRoom, dText("$n1", 2000, "new membership"))
		same(t, "reported", x.fence(x.v, dRoom, journal.DepartureReported, "kick-2"), journal.Fenced)
		same(t, "membership", x.membership(x.v, dRoom), "epoch 2, out")
		same(t, "screen", x.screen(x.v, dRoom), []string{})
		x.join(x.v, dRoom, "join-2")
		same(t, "local", x.fence(x.v, dRoom, journal.DepartureLocal, ""), journal.Fenced)
		same(t, "membership at last", x.membership(x.v, dRoom), "epoch 3, out")
		same(t, "owing", x.owing(x.v), []string{dRoom})
	})

	t.Run("ALocalDepartureRepeatedWithoutARejoinFencesOnce", func(t *testing.T) {
		x := newDFX(t, f)
		same(t, "first", x.fence(x.v, dRoom, journal.DepartureLocal, ""), journal.Fenced)
		same(t, "second", x.fence(x.v, dRoom, journal.DepartureLocal, ""), journal.AlreadyFenced)
		same(t, "membership", x.membership(x.v, dRoom), "epoch 1, out")
		// One departure owes one echo.
		same(t, "echo", x.fence(x.v, dRoom, journal.DepartureReported, "leave-1"), journal.OwedReportConsumed)
		same(t, "owing", x.owing(x.v), []string{})
		same(t, "another report", x.fence(x.v, dRoom, journal.DepartureReported, "leave-2"), journal.AlreadyFenced)
		same(t, "membership at last", x.membership(x.v, dRoom), "epoch 1, out")
	})

	t.Run("TwoLocalDeparturesBeforeEitherReportFenceTwice", func(t *testing.T) {
		x := newDFX(t, f)
		same(t, "first leave", x.fence(x.v, dRoom, journal.DepartureLocal, ""), journal.Fenced)
		x.join(x.v, dRoom, "join-1")
		same(t, "second leave", x.fence(x.v, dRoom, journal.DepartureLocal, ""), journal.Fenced)
		same(t, "membership", x.membership(x.v, dRoom), "epoch 2, out")
		x.restart()
		same(t, "first echo", x.fence(x.v, dRoom, journal.DepartureReported, "leave-1"), journal.OwedReportConsumed)
		same(t, "owing between the echoes", x.owing(x.v), []string{dRoom})
		same(t, "second echo", x.fence(x.v, dRoom, journal.DepartureReported, "leave-2"), journal.OwedReportConsumed)
		same(t, "owing", x.owing(x.v), []string{})
		same(t, "membership at last", x.membership(x.v, dRoom), "epoch 2, out")
	})

	t.Run("AnEchoAbsorbsOnlyItsOwnRoom", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom2, dText("$r1", 1000, "there"))
		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		same(t, "other room's report", x.fence(x.v, dRoom2, journal.DepartureReported, "kick-2"), journal.Fenced)
		same(t, "other room", x.membership(x.v, dRoom2), "epoch 1, out")
		same(t, "other screen", x.screen(x.v, dRoom2), []string{})
		same(t, "owing", x.owing(x.v), []string{dRoom})
	})

	t.Run("ARejoinBeforeTheEchoKeepsTheNewMembership", func(t *testing.T) {
		x := newDFX(t, f)
		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		x.join(x.v, dRoom, "join-1")
		same(t, "owing after the rejoin", x.owing(x.v), []string{dRoom})
		x.admit(x.v, dRoom, dText("$n1", 2000, "new question"))
		x.enqueue(x.v, answer("d1", journal.StageFinal, dRoom, "answer", "$n1"))
		x.enqueue(x.v, answer("d2", journal.StageFinal, dRoom, "source-less"))
		same(t, "late echo", x.fence(x.v, dRoom, journal.DepartureReported, "leave-1"), journal.OwedReportConsumed)
		same(t, "membership", x.membership(x.v, dRoom), "epoch 1, in")
		same(t, "screen", x.screen(x.v, dRoom), []string{"$n1:new question"})
		same(t, "scan", x.unacked(x.v), []string{"d1/final", "d2/final"})
		x.claim(x.v, "d1", journal.StageFinal)
		same(t, "ack", x.ack(x.v, "d1", journal.StageFinal, "$a1"), journal.AckResult{EventID: "$a1", First: true, RoomID: dRoom, Projected: true})
		same(t, "screen with the answer", x.screen(x.v, dRoom), []string{"$n1:new question", "$a1:answer"})
	})

	t.Run("AKickAfterARejoinFencesThoughALeaveEchoIsStillOwed", func(t *testing.T) {
		// The echo of the local leave never came (a gap in sync); a kick
		// after the rejoin is someone else's act, never that echo.
		x := newDFX(t, f)
		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		x.join(x.v, dRoom, "join-1")
		x.admit(x.v, dRoom, dText("$n1", 2000, "new question"))
		same(t, "kick", x.fence(x.v, dRoom, journal.DepartureRemoved, "kick-1"), journal.Fenced)
		same(t, "membership", x.membership(x.v, dRoom), "epoch 2, out")
		same(t, "screen", x.screen(x.v, dRoom), []string{})
		same(t, "pending", x.pendingIDs(x.v), []string{})
		same(t, "kick replayed", x.fence(x.v, dRoom, journal.DepartureRemoved, "kick-1"), journal.RepeatedReport)
		// The late echo is still absorbed: it fences nothing twice.
		same(t, "late echo", x.fence(x.v, dRoom, journal.DepartureReported, "leave-1"), journal.OwedReportConsumed)
		same(t, "membership after the echo", x.membership(x.v, dRoom), "epoch 2, out")
	})

	t.Run("AKickWhileOutOfTheRoomChangesNothing", func(t *testing.T) {
		x := newDFX(t, f)
		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		same(t, "kick", x.fence(x.v, dRoom, journal.DepartureRemoved, "kick-1"), journal.AlreadyFenced)
		same(t, "membership", x.membership(x.v, dRoom), "epoch 1, out")
		same(t, "owing", x.owing(x.v), []string{dRoom})
	})

	t.Run("ARestartBetweenTheFenceAndItsReportAbsorbsTheReport", func(t *testing.T) {
		x := newDFX(t, f)
		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		x.join(x.v, dRoom, "join-1")
		x.restart()
		x.admit(x.v, dRoom, dText("$n1", 2000, "new"))
		same(t, "echo", x.fence(x.v, dRoom, journal.DepartureReported, "leave-1"), journal.OwedReportConsumed)
		same(t, "membership", x.membership(x.v, dRoom), "epoch 1, in")
		same(t, "screen", x.screen(x.v, dRoom), []string{"$n1:new"})
	})

	t.Run("ADepartureReportedBeforeTheLocalOneFencesOnce", func(t *testing.T) {
		x := newDFX(t, f)
		same(t, "reported", x.fence(x.v, dRoom, journal.DepartureReported, "leave-1"), journal.Fenced)
		same(t, "local", x.fence(x.v, dRoom, journal.DepartureLocal, ""), journal.AlreadyFenced)
		same(t, "membership", x.membership(x.v, dRoom), "epoch 1, out")
		same(t, "owing", x.owing(x.v), []string{})
	})

	t.Run("ADepartureAfterAReportedOneAndARejoinFencesAgain", func(t *testing.T) {
		x := newDFX(t, f)
		x.fence(x.v, dRoom, journal.DepartureReported, "leave-1")
		x.join(x.v, dRoom, "join-1")
		same(t, "local", x.fence(x.v, dRoom, journal.DepartureLocal, ""), journal.Fenced)
		same(t, "membership", x.membership(x.v, dRoom), "epoch 2, out")
	})

	t.Run("AConcurrentLocalAndReportedDepartureFenceOnce", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		var (
			wg           sync.WaitGroup
			local, rep   journal.DepartureOutcome
			errL, errRep error
		)
		wg.Add(2)
		go func() {
			defer wg.Done()
			local, errL = x.v.FenceDeparture(context.Background(), dRoom, journal.DepartureLocal, "")
		}()
		go func() {
			defer wg.Done()
			rep, errRep = x.v.FenceDeparture(context.Background(), dRoom, journal.DepartureReported, "leave-1")
		}()
		wg.Wait()
		if err := errors.Join(errL, errRep); err != nil {
			t.Fatal(err)
		}
		got := []journal.DepartureOutcome{local, rep}
		localFirst := []journal.DepartureOutcome{journal.Fenced, journal.OwedReportConsumed}
		reportFirst := []journal.DepartureOutcome{journal.AlreadyFenced, journal.Fenced}
		if !slices.Equal(got, localFirst) && !slices.Equal(got, reportFirst) {
			t.Fatalf("outcomes (local, reported) = %v, want %v or %v", got, localFirst, reportFirst)
		}
		same(t, "membership", x.membership(x.v, dRoom), "epoch 1, out")
		same(t, "owing", x.owing(x.v), []string{})
	})

	t.Run("MalformedObservationsAreRefused", func(t *testing.T) {
		x := newDFX(t, f)
		if _, err := x.v.FenceDeparture(context.Background(), "not-a-room", journal.DepartureLocal, ""); !errors.Is(err, journal.ErrInvalidArgument) {
			t.Fatalf("FenceDeparture(bad room) = %v, want %v", err, journal.ErrInvalidArgument)
		}
		if _, err := x.v.FenceDeparture(context.Background(), dRoom, 9, "obs-1"); !errors.Is(err, journal.ErrInvalidArgument) {
			t.Fatalf("FenceDeparture(bad source) = %v, want %v", err, journal.ErrInvalidArgument)
		}
		if err := x.v.RecordJoin(context.Background(), "not-a-room", ""); !errors.Is(err, journal.ErrInvalidArgument) {
			t.Fatalf("RecordJoin(bad room) = %v, want %v", err, journal.ErrInvalidArgument)
		}
		// Nothing of a refused observation was kept: its ID still applies.
		same(t, "membership", x.membership(x.v, dRoom), "epoch 0, in")
		same(t, "observation", x.fence(x.v, dRoom, journal.DepartureReported, "obs-1"), journal.Fenced)
	})
}
