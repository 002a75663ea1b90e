package contract

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
)

// TestTurnRecords checks the durable proof of turns: indexed by exactly its
// sources, scoped to the agent name so a re-login does not answer again,
// paged for a warm-up, completed by the answer's acknowledgement, and never
// lost across a restart so a finished model call is not run again.
func TestTurnRecords(t *testing.T, f Factory) {
	t.Run("AnEnqueueCarryingItsTurnRecordWritesBothOrNeither", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"), dText("$q2", 1001, "another"))
		rec := journal.TurnRecord{TurnID: "turn-1", RoomID: dRoom, State: journal.TurnResultRecorded,
			Sources: []string{"$q1"}, Record: json.RawMessage(`{"answer":"recorded"}`)}
		req := answer("d1", journal.StageFinal, dRoom, "answer", "$q1")
		req.TurnID, req.Turn = "turn-1", &rec
		x.enqueue(x.v, req)
		same(t, "turn", x.turnFor(x.v, "$q1"), "turn-1 1 ")
		same(t, "pending", x.pendingIDs(x.v), []string{"$q2"})

		x.fence(x.v, dRoom, journal.DepartureLocal, "")
		refused := answer("d2", journal.StageFinal, dRoom, "late", "$q2")
		refused.TurnID, refused.Turn = "turn-2", &journal.TurnRecord{TurnID: "turn-2", RoomID: dRoom,
			State: journal.TurnResultRecorded, Sources: []string{"$q2"}, Record: json.RawMessage(`{}`)}
		x.refuse(x.v, refused, journal.ErrMembershipEnded)
		same(t, "turn of the refused enqueue", x.turnFor(x.v, "$q2"), "none")
	})

	t.Run("ARecordIsReachableFromEveryEventThatIndexesIt", func(t *testing.T) {
		x := newDFX(t, f)
		x.upsertTurn(x.v, journal.TurnRecord{TurnID: "turn-1", RoomID: dRoom, State: journal.TurnResultRecorded,
			Sources: []string{"$s2", "$s1", "$s3"}, Record: json.RawMessage(`{"answer":"forty-two"}`)})
		for _, src := range []string{"$s1", "$s2", "$s3"} {
			same(t, "turn for "+src, x.turnFor(x.v, src), "turn-1 1 ")
		}
		same(t, "unrelated event", x.turnFor(x.v, "$s4"), "none")
		rec, ok := x.turn(x.v, "turn-1")
		if !ok {
			t.Fatal("turn-1 not found")
		}
		same(t, "room", rec.RoomID, dRoom)
		same(t, "record", string(rec.Record), `{"answer":"forty-two"}`)
		same(t, "sources", sorted(rec.Sources), []string{"$s1", "$s2", "$s3"})
		same(t, "event", rec.EventID, "")
		if _, ok := x.turn(x.v, "turn-2"); ok {
			t.Fatal("turn-2 found, want none")
		}
	})

	t.Run("AnIndexTheTurnNoLongerAnswersIsDropped", func(t *testing.T) {
		x := newDFX(t, f)
		x.upsertTurn(x.v, journal.TurnRecord{TurnID: "turn-1", RoomID: dRoom, State: journal.TurnResultRecorded, Sources: []string{"$s1", "$s2"}})
		x.upsertTurn(x.v, journal.TurnRecord{TurnID: "turn-1", RoomID: dRoom, State: journal.TurnResultRecorded, Sources: []string{"$s2", "$s3"}})
		same(t, "dropped source", x.turnFor(x.v, "$s1"), "none")
		same(t, "kept source", x.turnFor(x.v, "$s2"), "turn-1 1 ")
		same(t, "new source", x.turnFor(x.v, "$s3"), "turn-1 1 ")
		rec, _ := x.turn(x.v, "turn-1")
		same(t, "sources", sorted(rec.Sources), []string{"$s2", "$s3"})
	})

	t.Run("AReAnchoredSourceLeavesNoRowUnderItsOldTurn", func(t *testing.T) {
		x := newDFX(t, f)
		x.upsertTurn(x.v, journal.TurnRecord{TurnID: "turn-1", RoomID: dRoom, State: journal.TurnResultRecorded, Sources: []string{"$s1", "$s2"}})
		x.upsertTurn(x.v, journal.TurnRecord{TurnID: "turn-2", RoomID: dRoom, State: journal.TurnResultRecorded, Sources: []string{"$s2"}})
		same(t, "moved source", x.turnFor(x.v, "$s2"), "turn-2 1 ")
		rec, _ := x.turn(x.v, "turn-1")
		same(t, "old turn's sources", sorted(rec.Sources), []string{"$s1"})
		// Forgetting the old turn cannot take the moved source with it.
		n, err := x.v.ForgetTurns(context.Background(), "turn-1")
		if err != nil {
			t.Fatal(err)
		}
		same(t, "forgotten", n, 1)
		same(t, "moved source after forgetting", x.turnFor(x.v, "$s2"), "turn-2 1 ")
		same(t, "forgotten source", x.turnFor(x.v, "$s1"), "none")
	})

	t.Run("RecordsAreScopedToTheAgentNotTheMatrixIdentity", func(t *testing.T) {
		x := newDFX(t, f)
		relogin := x.view(dAgent, dBot2)
		stranger := x.view("other-agent", dBot)
		x.upsertTurn(x.v, journal.TurnRecord{TurnID: "turn-1", RoomID: dRoom, State: journal.TurnResultRecorded, Sources: []string{"$s1"}})
		x.upsertTurn(relogin, journal.TurnRecord{TurnID: "turn-2", RoomID: dRoom, State: journal.TurnResultRecorded, Sources: []string{"$s2"}})
		for _, v := range []journal.PrincipalStore{x.v, relogin} {
			same(t, "turn-1 via "+v.Principal().String(), x.turnFor(v, "$s1"), "turn-1 1 ")
			same(t, "turn-2 via "+v.Principal().String(), x.turnFor(v, "$s2"), "turn-2 1 ")
		}
		same(t, "another agent", x.turnFor(stranger, "$s1"), "none")
		if _, ok := x.turn(stranger, "turn-1"); ok {
			t.Fatal("another agent sees turn-1")
		}
		got, err := stranger.Turns(context.Background(), 10, "")
		if err != nil {
			t.Fatal(err)
		}
		same(t, "another agent's warm-up", len(got), 0)
		// The same turn ID under another agent is another record.
		x.upsertTurn(stranger, journal.TurnRecord{TurnID: "turn-1", RoomID: dRoom2, State: journal.TurnResultRecorded, Sources: []string{"$s9"}})
		same(t, "own turn-1 untouched", x.turnFor(x.v, "$s1"), "turn-1 1 ")
		rec, _ := x.turn(x.v, "turn-1")
		same(t, "own room", rec.RoomID, dRoom)
	})

	t.Run("AWarmUpReadsEveryRecordInAStableOrder", func(t *testing.T) {
		x := newDFX(t, f)
		for _, id := range []string{"t-c", "t-a", "t-e", "t-b", "t-d"} {
			x.upsertTurn(x.v, journal.TurnRecord{TurnID: id, RoomID: dRoom, State: journal.TurnResultRecorded, Sources: []string{"$" + id}})
		}
		var pages [][]string
		after := ""
		for i := 0; i < 10; i++ {
			recs, err := x.v.Turns(context.Background(), 2, after)
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, r := range recs {
				ids = append(ids, r.TurnID)
				same(t, "sources of "+r.TurnID, r.Sources, []string{"$" + r.TurnID})
			}
			pages = append(pages, ids)
			if len(recs) < 2 {
				break
			}
			after = recs[len(recs)-1].TurnID
		}
		same(t, "pages", pages, [][]string{{"t-a", "t-b"}, {"t-c", "t-d"}, {"t-e"}})
		if _, err := x.v.Turns(context.Background(), 0, ""); !errors.Is(err, journal.ErrInvalidArgument) {
			t.Fatalf("Turns(limit 0) = %v, want %v", err, journal.ErrInvalidArgument)
		}
	})

	t.Run("CompactionForgetsWhatItIsToldTo", func(t *testing.T) {
		x := newDFX(t, f)
		for _, id := range []string{"t-a", "t-b", "t-c"} {
			x.upsertTurn(x.v, journal.TurnRecord{TurnID: id, RoomID: dRoom, State: journal.TurnDelivered,
				Sources: []string{"$" + id + "1", "$" + id + "2"}, EventID: "$answer-" + id})
		}
		n, err := x.v.ForgetTurns(context.Background(), "t-a", "t-c", "t-missing")
		if err != nil {
			t.Fatal(err)
		}
		same(t, "forgotten", n, 2)
		x.restart()
		for _, src := range []string{"$t-a1", "$t-a2", "$t-c1", "$t-c2"} {
			same(t, "forgotten source "+src, x.turnFor(x.v, src), "none")
		}
		same(t, "kept", x.turnFor(x.v, "$t-b2"), "t-b 2 $answer-t-b")
		recs, err := x.v.Turns(context.Background(), 10, "")
		if err != nil {
			t.Fatal(err)
		}
		same(t, "records left", len(recs), 1)
		same(t, "record left", recs[0].TurnID, "t-b")
		n, err = x.v.ForgetTurns(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		same(t, "forgetting nothing", n, 0)
	})

	t.Run("ARecordedResultSurvivesARestart", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		x.upsertTurn(x.v, journal.TurnRecord{TurnID: "turn-1", RoomID: dRoom, State: journal.TurnResultRecorded,
			Sources: []string{"$q1"}, Record: json.RawMessage(`{"model_result":"the answer"}`)})
		x.restart()
		rec, ok, err := x.v.TurnForEvent(context.Background(), "$q1")
		if err != nil || !ok {
			t.Fatalf("TurnForEvent after restart = %v, %v", ok, err)
		}
		same(t, "state", rec.State, journal.TurnResultRecorded)
		same(t, "record", string(rec.Record), `{"model_result":"the answer"}`)
		same(t, "room", rec.RoomID, dRoom)
	})

	t.Run("ASendFailureLeavesTheDeliveryRetryableNotTheTurn", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		x.upsertTurn(x.v, journal.TurnRecord{TurnID: "turn-1", RoomID: dRoom, State: journal.TurnResultRecorded, Sources: []string{"$q1"}})
		req := answer("d1", journal.StageFinal, dRoom, "answer", "$q1")
		req.TurnID = "turn-1"
		x.enqueue(x.v, req)
		x.claim(x.v, "d1", journal.StageFinal)
		x.fail(x.v, "d1", journal.StageFinal, "connection reset", false)
		x.restart()
		same(t, "turn", x.turnFor(x.v, "$q1"), "turn-1 1 ")
		same(t, "scan", x.unacked(x.v), []string{"d1/final"})
		same(t, "delivery turn", x.claim(x.v, "d1", journal.StageFinal).TurnID, "turn-1")
	})

	t.Run("OnlyTheAnswerCompletesTheTurn", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		x.upsertTurn(x.v, journal.TurnRecord{TurnID: "turn-1", RoomID: dRoom, State: journal.TurnResultRecorded, Sources: []string{"$q1"}})
		for _, stage := range []journal.Stage{journal.StageInitial, journal.StageFinal} {
			req := answer("d1", stage, dRoom, "text "+stage.String())
			req.TurnID = "turn-1"
			x.enqueue(x.v, req)
		}
		x.claim(x.v, "d1", journal.StageInitial)
		x.ack(x.v, "d1", journal.StageInitial, "$p1")
		same(t, "after the placeholder", x.turnFor(x.v, "$q1"), "turn-1 1 ")
		x.claim(x.v, "d1", journal.StageFinal)
		x.ack(x.v, "d1", journal.StageFinal, "$a1")
		same(t, "after the answer", x.turnFor(x.v, "$q1"), "turn-1 2 $a1")
	})

	t.Run("ARelogInSeesTheAnswerAlreadySent", func(t *testing.T) {
		x := newDFX(t, f)
		x.admit(x.v, dRoom, dText("$q1", 1000, "question"))
		x.upsertTurn(x.v, journal.TurnRecord{TurnID: "turn-1", RoomID: dRoom, State: journal.TurnResultRecorded, Sources: []string{"$q1"}})
		req := answer("d1", journal.StageFinal, dRoom, "answer", "$q1")
		req.TurnID = "turn-1"
		x.enqueue(x.v, req)
		sent := x.claim(x.v, "d1", journal.StageFinal)
		x.ack(x.v, "d1", journal.StageFinal, "$a1")
		x.restart()

		// The same agent under a new Matrix ID: the homeserver cannot
		// deduplicate its sends against the old account's...
		relogin := x.view(dAgent, dBot2)
		if got := journal.TxnID(relogin.Principal(), "d1", journal.StageFinal); got == sent.TxnID {
			t.Fatalf("the re-login derives the old account's transaction ID %q", got)
		}
		if _, err := relogin.Delivery(context.Background(), "d1", journal.StageFinal); !errors.Is(err, journal.ErrNoDelivery) {
			t.Fatalf("re-login sees the old account's outbox row: %v", err)
		}
		// ...so the turn record is what tells it the question was answered.
		same(t, "turn seen by the re-login", x.turnFor(relogin, "$q1"), "turn-1 2 $a1")
	})

	t.Run("MalformedRecordsAreRefused", func(t *testing.T) {
		x := newDFX(t, f)
		for _, rec := range []journal.TurnRecord{
			{TurnID: "", RoomID: dRoom, State: journal.TurnResultRecorded},
			{TurnID: "turn-1", RoomID: dRoom, State: 0},
			{TurnID: "turn-1", RoomID: dRoom, State: 9},
			{TurnID: "turn-1", RoomID: dRoom, State: journal.TurnResultRecorded, Record: json.RawMessage(`{"open":`)},
		} {
			if err := x.v.UpsertTurn(context.Background(), rec); !errors.Is(err, journal.ErrInvalidArgument) {
				t.Fatalf("UpsertTurn(%+v) = %v, want %v", rec, err, journal.ErrInvalidArgument)
			}
		}
		if _, ok := x.turn(x.v, "turn-1"); ok {
			t.Fatal("a refused record was written")
		}
	})
}

// sorted returns a sorted copy of ids, never nil.
func sorted(ids []string) []string {
	out := append([]string{}, ids...)
	slices.Sort(out)
	return out
}

// contentOf extracts the content of a canonical event.
func contentOf(t *testing.T, event json.RawMessage) json.RawMessage {
	t.Helper()
	var e struct {
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(event, &e); err != nil {
		t.Fatalf("decode event %s: %v", event, err)
	}
	return e.Content
}
