package contract

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
)

// askApproval asks alice to approve the call callID of eventID.
func (fx *fixture) askApproval(eventID, callID, args string) (journal.Approval, journal.ApprovalOutcome, error) {
	return fx.v.RequestApproval(context.Background(), journal.ApprovalRequest{EventID: eventID, CallID: callID,
		Tool: "send_mail", Arguments: json.RawMessage(args), Secret: []string{"token"},
		ExpiresMS: farFuture}, journal.DefaultApprovalKeys)
}

// sendCard has the outbox send the card of callID as cardEventID.
func (fx *fixture) sendCard(callID, cardEventID string) {
	fx.t.Helper()
	ctx := context.Background()
	id := journal.ApprovalDeliveryID(callID)
	if _, err := fx.v.Claim(ctx, id, journal.StageInitial, "DEV"); err != nil {
		fx.t.Fatalf("claim card: %v", err)
	}
	if _, err := fx.v.Acknowledge(ctx, id, journal.StageInitial, journal.Sent{EventID: cardEventID}); err != nil {
		fx.t.Fatalf("acknowledge card: %v", err)
	}
}

// stage reads one stage of a card's delivery ("" when there is none).
func (fx *fixture) stage(callID string, stage journal.Stage) journal.Delivery {
	fx.t.Helper()
	d, err := fx.v.Delivery(context.Background(), journal.ApprovalDeliveryID(callID), stage)
	if err != nil && !errors.Is(err, journal.ErrNoDelivery) {
		fx.t.Fatalf("delivery: %v", err)
	}
	return d
}

// TestApprovals checks the ledger of tool approvals: a request is stored
// with its card in one commit and is idempotent by call ID; the first
// decision wins and every later vote is consumed; the card is edited once,
// or never shown when it was never sent; the agent's departure withdraws
// what is undecided for good; and a decided card is still recognised.
func TestApprovals(t *testing.T, f Factory) {
	ctx := context.Background()
	const args = `{"to":"bob@example.org","token":"s3cret"}`

	t.Run("ARequestIsStoredWithItsCardAndIsIdempotentByCallID", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$q", alice, 1000, "mail bob"), msg("$done", alice, 1001, "done"))
		fx.settle(fx.v, "$done")
		a, out, err := fx.askApproval("$q", "c1", args)
		if err != nil || out != journal.ApprovalCreated {
			t.Fatalf("request = %v, %v", out, err)
		}
		if a.RoomID != room || len(a.Approvers) != 1 || a.Approvers[0] != alice || a.State != journal.ApprovalOpen {
			t.Fatalf("approval = %+v, want open in the room, alice (the sender) deciding", a)
		}
		card := fx.stage("c1", journal.StageInitial)
		if card.State != journal.DeliveryQueued || card.RoomID != room {
			t.Fatalf("card = %+v, want queued in the room", card)
		}
		if got := fx.pendingIDs(fx.v); len(got) != 1 || got[0] != "$q" {
			t.Fatalf("pending = %v: the turn stays pending while its approval is open", got)
		}
		// Spelled otherwise, the same call is the same request.
		if _, out, err := fx.askApproval("$q", "c1", `{"token":"s3cret", "to":"bob@example.org"}`); err != nil || out != journal.ApprovalReplayed {
			t.Fatalf("the same request again = %v, %v; want replayed", out, err)
		}
		if _, _, err := fx.askApproval("$q", "c1", `{"to":"eve@example.org"}`); !errors.Is(err, journal.ErrCallConflict) {
			t.Fatalf("another call under the same ID = %v, want ErrCallConflict", err)
		}
		if _, _, err := fx.askApproval("$never", "c2", args); !errors.Is(err, journal.ErrUnknownSource) {
			t.Fatalf("an event never admitted = %v, want ErrUnknownSource", err)
		}
		if _, _, err := fx.askApproval("$done", "c3", args); !errors.Is(err, journal.ErrNotPending) {
			t.Fatalf("a settled event = %v, want ErrNotPending", err)
		}
		if _, _, err := fx.askApproval("$q", "c4", `not json`); !errors.Is(err, journal.ErrInvalidArgument) {
			t.Fatalf("arguments not JSON = %v, want ErrInvalidArgument", err)
		}
		for _, id := range []string{"c2", "c3", "c4"} {
			if _, _, found, err := fx.v.Approval(ctx, id); err != nil || found {
				t.Fatalf("refused request %s was stored: %v %v", id, found, err)
			}
		}
	})

	t.Run("TheFirstDecisionWinsAndEveryLaterVoteIsConsumed", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$q", alice, 1000, "mail bob"))
		if _, _, err := fx.askApproval("$q", "c1", args); err != nil {
			t.Fatal(err)
		}
		fx.sendCard("c1", "$card")
		fx.live(reaction("$yes", alice, 1002, "$card", "✅"), reaction("$no", alice, 1003, "$card", "❌"))
		found, ok, err := fx.v.CardApproval(ctx, "$card")
		if err != nil || !ok || found.CallID != "c1" {
			t.Fatalf("the card's approval = %+v, %v, %v", found, ok, err)
		}
		a, decided, err := fx.v.DecideApproval(ctx, "c1", journal.ApprovalDecision{State: journal.ApprovalApproved,
			By: alice, EventID: "$yes", Settle: []string{"$yes"}})
		if err != nil || !decided || a.State != journal.ApprovalApproved || a.DecidedBy != alice {
			t.Fatalf("first decision = %+v, %v, %v", a, decided, err)
		}
		edit := fx.stage("c1", journal.StageFinal)
		if edit.State != journal.DeliveryQueued {
			t.Fatalf("the card's edit = %+v, want queued", edit)
		}
		a, decided, err = fx.v.DecideApproval(ctx, "c1", journal.ApprovalDecision{State: journal.ApprovalDenied,
			By: alice, EventID: "$no", Settle: []string{"$no"}})
		if err != nil || decided || a.State != journal.ApprovalApproved {
			t.Fatalf("a later decision = %+v, %v, %v; want the first standing", a, decided, err)
		}
		if got := fx.pendingIDs(fx.v); len(got) != 1 || got[0] != "$q" {
			t.Fatalf("pending = %v: both votes are settled, consumed, and the turn waits for its agent", got)
		}
		if again := fx.stage("c1", journal.StageFinal); again.TxnID != edit.TxnID || again.Content == nil {
			t.Fatalf("the card's edit changed: %+v", again)
		}
		// The card stays recognised after its edit went out, so a late
		// click is consumed, never taken for something else.
		if _, err := fx.v.Claim(ctx, journal.ApprovalDeliveryID("c1"), journal.StageFinal, "DEV"); err != nil {
			t.Fatal(err)
		}
		fx.restart()
		if got, ok, err := fx.v.CardApproval(ctx, "$card"); err != nil || !ok || got.State != journal.ApprovalApproved {
			t.Fatalf("after a restart the card's approval = %+v, %v, %v", got, ok, err)
		}
		if got, card, ok, err := fx.v.Approval(ctx, "c1"); err != nil || !ok || card != "$card" || got.DecisionEventID != "$yes" {
			t.Fatalf("Approval = %+v, card %q, %v, %v", got, card, ok, err)
		}
	})

	t.Run("ACardNeverSentIsNeverShownOnceDecided", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$q", alice, 1000, "mail bob"))
		if _, _, err := fx.askApproval("$q", "c1", args); err != nil {
			t.Fatal(err)
		}
		due, err := fx.v.DueApprovals(ctx, farFuture, 10)
		if err == nil && len(due) == 1 {
			// Not due before its expiry.
			var early []journal.Approval
			if early, err = fx.v.DueApprovals(ctx, farFuture-1, 10); err == nil && len(early) != 0 {
				t.Fatalf("due before the expiry = %+v", early)
			}
		}
		if err != nil || len(due) != 1 || due[0].CallID != "c1" {
			t.Fatalf("due = %+v, %v", due, err)
		}
		if _, decided, err := fx.v.DecideApproval(ctx, "c1", journal.ApprovalDecision{State: journal.ApprovalExpired,
			Reason: "nobody decided in time"}); err != nil || !decided {
			t.Fatalf("expire = %v, %v", decided, err)
		}
		if card := fx.stage("c1", journal.StageInitial); card.State != journal.DeliveryRetired {
			t.Fatalf("card = %+v, want retired", card)
		}
		if edit := fx.stage("c1", journal.StageFinal); edit.DeliveryID != "" {
			t.Fatalf("an edit was enqueued for a card never shown: %+v", edit)
		}
		if due, err := fx.v.DueApprovals(ctx, farFuture, 10); err != nil || len(due) != 0 {
			t.Fatalf("due after the expiry = %+v, %v", due, err)
		}
	})

	t.Run("TheAgentsDepartureWithdrawsWhatIsUndecidedAndARejoinNeverRevivesIt", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$q", alice, 1000, "mail bob"), msg("$r", alice, 1001, "and carol"))
		for _, c := range []string{"c1", "c2"} {
			if _, _, err := fx.askApproval(map[string]string{"c1": "$q", "c2": "$r"}[c], c, args); err != nil {
				t.Fatal(err)
			}
		}
		fx.sendCard("c1", "$card1")
		if _, _, err := fx.v.DecideApproval(ctx, "c1", journal.ApprovalDecision{State: journal.ApprovalDenied, By: alice}); err != nil {
			t.Fatal(err)
		}
		if _, err := fx.v.FenceDeparture(ctx, room, journal.DepartureRemoved, "kick-1"); err != nil {
			t.Fatal(err)
		}
		if err := fx.v.RecordJoin(ctx, room, "join-2"); err != nil {
			t.Fatal(err)
		}
		a, _, _, err := fx.v.Approval(ctx, "c2")
		if err != nil || a.State != journal.ApprovalWithdrawn || a.Reason == "" {
			t.Fatalf("the undecided approval after the departure = %+v, %v; want withdrawn with its reason", a, err)
		}
		if b, _, _, err := fx.v.Approval(ctx, "c1"); err != nil || b.State != journal.ApprovalDenied {
			t.Fatalf("the decided approval after the departure = %+v, %v; its decision stands", b, err)
		}
		if _, decided, err := fx.v.DecideApproval(ctx, "c2", journal.ApprovalDecision{State: journal.ApprovalApproved, By: alice}); err != nil || decided {
			t.Fatalf("a decision after the withdrawal = %v, %v; want none taken", decided, err)
		}
		if open, err := fx.v.OpenApprovals(ctx, room); err != nil || len(open) != 0 {
			t.Fatalf("open approvals = %+v, %v", open, err)
		}
	})

	t.Run("DecisionsAreNumberedInTheOrderTheyWereWritten", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$q", alice, 1000, "mail bob"), msg("$r", alice, 1001, "and carol"), msg("$s", alice, 1002, "and dan"))
		for c, e := range map[string]string{"c1": "$q", "c2": "$r", "c3": "$s"} {
			if _, _, err := fx.askApproval(e, c, args); err != nil {
				t.Fatal(err)
			}
		}
		if got, _, err := fx.v.DecidedAfter(ctx, 0, 10); err != nil || len(got) != 0 {
			t.Fatalf("decisions before any = %+v, %v", got, err)
		}
		if _, _, err := fx.v.DecideApproval(ctx, "c2", journal.ApprovalDecision{State: journal.ApprovalDenied, By: alice}); err != nil {
			t.Fatal(err)
		}
		// A consumed vote decides nothing and takes no number.
		if _, _, err := fx.v.DecideApproval(ctx, "c2", journal.ApprovalDecision{State: journal.ApprovalApproved, By: alice}); err != nil {
			t.Fatal(err)
		}
		if _, err := fx.v.FenceDeparture(ctx, room, journal.DepartureReported, "leave-1"); err != nil {
			t.Fatal(err)
		}
		got, seqs, err := fx.v.DecidedAfter(ctx, 0, 10)
		if err != nil || len(got) != 3 || got[0].CallID != "c2" || got[0].State != journal.ApprovalDenied ||
			got[1].State != journal.ApprovalWithdrawn || got[2].State != journal.ApprovalWithdrawn {
			t.Fatalf("decisions = %+v, %v; want c2 denied, then the two the departure withdrew", got, err)
		}
		if seqs[0] >= seqs[1] || seqs[1] >= seqs[2] {
			t.Fatalf("decision numbers %v are not increasing", seqs)
		}
		rest, _, err := fx.v.DecidedAfter(ctx, seqs[0], 10)
		if err != nil || len(rest) != 2 || rest[0].CallID == "c2" {
			t.Fatalf("decisions after the first = %+v, %v", rest, err)
		}
		if other, _, err := fx.principal("other", "@other:example.org").DecidedAfter(ctx, 0, 10); err != nil || len(other) != 0 {
			t.Fatalf("another principal's decisions = %+v, %v", other, err)
		}
	})

	t.Run("AnotherPrincipalSeesNoneOfThem", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$q", alice, 1000, "mail bob"))
		if _, _, err := fx.askApproval("$q", "c1", args); err != nil {
			t.Fatal(err)
		}
		other := fx.principal("other", "@other:example.org")
		if _, _, ok, err := other.Approval(ctx, "c1"); err != nil || ok {
			t.Fatalf("another principal reads the approval: %v %v", ok, err)
		}
		if _, _, err := other.DecideApproval(ctx, "c1", journal.ApprovalDecision{State: journal.ApprovalApproved, By: alice}); !errors.Is(err, journal.ErrNoApproval) {
			t.Fatalf("another principal's decision = %v, want ErrNoApproval", err)
		}
	})

	t.Run("AnApprovedCallRunsOnceAndTheAgentsContextComesBackWithIt", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$q", alice, 1000, "mail bob"))
		step := json.RawMessage(`{"steps":[{"calls":[{"id":"x","name":"send_mail"}]}]}`)
		if _, _, err := fx.v.RequestApproval(ctx, journal.ApprovalRequest{EventID: "$q", CallID: "c1", Tool: "send_mail",
			Arguments: json.RawMessage(args), ExpiresMS: farFuture, Context: step}, journal.DefaultApprovalKeys); err != nil {
			t.Fatal(err)
		}
		if _, _, err := fx.v.StartToolRun(ctx, "c1"); !errors.Is(err, journal.ErrNotApproved) {
			t.Fatalf("running an open call = %v, want ErrNotApproved", err)
		}
		if _, _, err := fx.v.StartToolRun(ctx, "c9"); !errors.Is(err, journal.ErrNoApproval) {
			t.Fatalf("running a call never asked = %v, want ErrNoApproval", err)
		}
		if _, err := fx.v.FinishToolRun(ctx, "c1", "sent"); !errors.Is(err, journal.ErrInvalidArgument) {
			t.Fatalf("finishing a run never started = %v, want ErrInvalidArgument", err)
		}
		fx.sendCard("c1", "$card")
		if _, _, err := fx.v.DecideApproval(ctx, "c1", journal.ApprovalDecision{State: journal.ApprovalApproved, By: alice}); err != nil {
			t.Fatal(err)
		}
		a, started, err := fx.v.StartToolRun(ctx, "c1")
		if err != nil || !started || a.Run != journal.ToolRunStarted {
			t.Fatalf("the first start = %+v, %v, %v; want it claimed", a.Run, started, err)
		}
		// A crash after the claim: the run is found started, never claimed
		// again, so it cannot run a second time.
		fx.restart()
		a, started, err = fx.v.StartToolRun(ctx, "c1")
		if err != nil || started || a.Run != journal.ToolRunStarted {
			t.Fatalf("a start after the restart = %+v, %v, %v; want the earlier claim", a.Run, started, err)
		}
		if _, err := fx.v.FinishToolRun(ctx, "c1", strings.Repeat("x", journal.MaxToolResultBytes+1)); !errors.Is(err, journal.ErrInvalidArgument) {
			t.Fatalf("a result too large = %v, want ErrInvalidArgument", err)
		}
		if a, err = fx.v.FinishToolRun(ctx, "c1", "sent to bob"); err != nil || a.Run != journal.ToolRunFinished {
			t.Fatalf("finish = %+v, %v", a.Run, err)
		}
		if a, err = fx.v.FinishToolRun(ctx, "c1", "something else"); err != nil || a.RunResult != "sent to bob" {
			t.Fatalf("finishing again = %q, %v; want the first result kept", a.RunResult, err)
		}
		got, err := fx.v.ApprovalsForEvent(ctx, "$q")
		if err != nil || len(got) != 1 {
			t.Fatalf("approvals = %+v, %v", got, err)
		}
		if got[0].Run != journal.ToolRunFinished || got[0].RunResult != "sent to bob" || string(got[0].Context) != string(step) {
			t.Fatalf("the turn's approval = run %v %q, context %s; want finished, its result, and the context as asked",
				got[0].Run, got[0].RunResult, got[0].Context)
		}
		// Asked again with other context, the request is the recorded one.
		again, out, err := fx.v.RequestApproval(ctx, journal.ApprovalRequest{EventID: "$q", CallID: "c1", Tool: "send_mail",
			Arguments: json.RawMessage(args), ExpiresMS: farFuture, Context: json.RawMessage(`{}`)}, journal.DefaultApprovalKeys)
		if err != nil || out != journal.ApprovalReplayed || string(again.Context) != string(step) {
			t.Fatalf("asked again = %v, %v, context %s", out, err, again.Context)
		}
	})
}
