package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/mattn/go-sqlite3"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// Each trigger fails one write of a command, after or before its other
// writes, with an ordinary (not fatal) error: the command rolls back alone.
// A command that split its writes over two transactions would leave the
// other one committed.
const (
	failTokenUpdate = `CREATE TRIGGER injected_failure BEFORE UPDATE OF sync_token ON principals
		BEGIN SELECT RAISE(ABORT, 'injected failure'); END`
	// The batch's last event fails, after the others were written.
	failLastEventInsert = `CREATE TRIGGER injected_failure BEFORE INSERT ON journal_events
		WHEN new.event_id = '$b3' BEGIN SELECT RAISE(ABORT, 'injected failure'); END`
	failTurnCompletion = `CREATE TRIGGER injected_failure BEFORE UPDATE OF state ON turn_records
		WHEN new.state = 2 BEGIN SELECT RAISE(ABORT, 'injected failure'); END`
	failAcknowledgement = `CREATE TRIGGER injected_failure BEFORE UPDATE OF state ON delivery_outbox
		WHEN new.state = 2 BEGIN SELECT RAISE(ABORT, 'injected failure'); END`
	dropInjectedFailure = `DROP TRIGGER injected_failure`
)

// injectFailure installs trigger through a connection of its own while the
// store stays open, and returns what removes it again.
func injectFailure(t *testing.T, dir, trigger string) (remove func()) {
	t.Helper()
	db := openRaw(t, dir)
	if _, err := db.Exec(trigger); err != nil {
		t.Fatalf("install trigger: %v", err)
	}
	return func() {
		t.Helper()
		if _, err := db.Exec(dropInjectedFailure); err != nil {
			t.Fatalf("drop trigger: %v", err)
		}
	}
}

// requireInjectedFailure fails the test unless err is the trigger's abort.
func requireInjectedFailure(t *testing.T, what string, err error) {
	t.Helper()
	var se sqlite3.Error
	if !errors.As(err, &se) || se.ExtendedCode != sqlite3.ErrConstraintTrigger {
		t.Fatalf("%s: error %v, want the injected failure", what, err)
	}
}

// pendingIDs lists v's pending events in receipt order.
func pendingIDs(t *testing.T, v journal.PrincipalStore) []string {
	t.Helper()
	page, err := v.Pending(context.Background(), 100, 0)
	if err != nil {
		t.Fatalf("Pending: %v", err)
	}
	ids := []string{}
	for _, e := range page.Events {
		ids = append(ids, e.EventID)
	}
	return ids
}

func TestTheSyncTokenMovesOnlyWithItsBatch(t *testing.T) {
	const (
		room  = "!atomic:example.org"
		alice = "@alice:example.org"
	)
	for _, c := range []struct {
		name, trigger string
	}{
		{"WhenTheTokenCannotBeStoredNoEventOfTheBatchCommits", failTokenUpdate},
		{"WhenAnEventCannotBeStoredTheTokenStaysWhereItWas", failLastEventInsert},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			s, dir := testsupport.MustOpen(t)
			v, err := s.Principal(ctx, "helper", "@bot:example.org")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := v.AdmitBatch(ctx, mx.Live(room, mx.Message("$a1", alice, 1000, "before")), "t1"); err != nil {
				t.Fatalf("first batch: %v", err)
			}
			second := mx.Live(room,
				mx.Message("$b1", alice, 1001, "one"),
				mx.Message("$b2", alice, 1002, "two"),
				mx.Message("$b3", alice, 1003, "three"))

			remove := injectFailure(t, dir, c.trigger)
			_, err = v.AdmitBatch(ctx, second, "t2")
			requireInjectedFailure(t, "second batch", err)
			if tok, err := v.SyncToken(ctx); err != nil || tok != "t1" {
				t.Fatalf("sync token after the failed batch = %q, %v; want t1", tok, err)
			}
			if got := pendingIDs(t, v); !slices.Equal(got, []string{"$a1"}) {
				t.Fatalf("pending after the failed batch = %q, want [$a1]", got)
			}

			// The same batch again is new in every event: none of it
			// committed the first time.
			remove()
			res, err := v.AdmitBatch(ctx, second, "t2")
			if err != nil {
				t.Fatalf("second batch again: %v", err)
			}
			for _, r := range res {
				if r.Outcome != journal.Admitted {
					t.Fatalf("%s on the retry: %v, want admitted (it committed with the failed batch)", r.EventID, r.Outcome)
				}
			}
			if tok, err := v.SyncToken(ctx); err != nil || tok != "t2" {
				t.Fatalf("sync token after the retry = %q, %v; want t2", tok, err)
			}
		})
	}
}

func TestAnAcknowledgedFinalAndItsCompletedTurnCommitTogether(t *testing.T) {
	const (
		room   = "!atomic:example.org"
		person = "@person:example.org"
	)
	for _, c := range []struct {
		name, trigger string
	}{
		{"WhenTheTurnCannotBeCompletedTheFinalStaysUnacknowledged", failTurnCompletion},
		{"WhenTheFinalCannotBeAcknowledgedTheTurnStaysOpen", failAcknowledgement},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			s, dir := testsupport.MustOpen(t)
			v, err := s.Principal(ctx, "courier", "@courier:example.org")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := v.AdmitBatch(ctx, mx.Live(room, mx.Message("$q", person, 1000, "question")), ""); err != nil {
				t.Fatal(err)
			}
			if err := v.UpsertTurn(ctx, journal.TurnRecord{TurnID: "turn-1", RoomID: room, State: journal.TurnResultRecorded,
				Sources: []string{"$q"}, Record: json.RawMessage(`{"answer":"forty-two"}`)}); err != nil {
				t.Fatal(err)
			}
			if _, err := v.EnqueueAndSettle(ctx, journal.EnqueueRequest{DeliveryID: "d1", Stage: journal.StageFinal, RoomID: room,
				TurnID: "turn-1", Content: json.RawMessage(`{"body":"forty-two","msgtype":"m.text"}`), Sources: []string{"$q"}}); err != nil {
				t.Fatal(err)
			}
			if _, err := v.Claim(ctx, "d1", journal.StageFinal, "DEVICEA"); err != nil {
				t.Fatal(err)
			}

			answer := journal.Sent{EventID: "$answer", ServerTS: 2000}
			remove := injectFailure(t, dir, c.trigger)
			_, err = v.Acknowledge(ctx, "d1", journal.StageFinal, answer)
			requireInjectedFailure(t, "acknowledge", err)
			checkAckAndTurn(t, v, "after the failed acknowledgement", journal.DeliveryAttempted, "", journal.TurnResultRecorded, "")
			if got := screenIDs(t, v, room); !slices.Equal(got, []string{"$q"}) {
				t.Fatalf("screen after the failed acknowledgement = %q, want only [$q]", got)
			}

			remove()
			res, err := v.Acknowledge(ctx, "d1", journal.StageFinal, answer)
			if err != nil {
				t.Fatalf("acknowledge again: %v", err)
			}
			if want := (journal.AckResult{EventID: "$answer", First: true, RoomID: room, Projected: true}); res != want {
				t.Fatalf("acknowledge again = %+v, want %+v", res, want)
			}
			checkAckAndTurn(t, v, "after the acknowledgement", journal.DeliveryAcknowledged, "$answer", journal.TurnDelivered, "$answer")
			if got := screenIDs(t, v, room); !slices.Equal(got, []string{"$q", "$answer"}) {
				t.Fatalf("screen after the acknowledgement = %q, want [$q $answer]", got)
			}
		})
	}
}

// checkAckAndTurn compares the final's state and event ID and the turn's
// state and event ID with what is expected.
func checkAckAndTurn(t *testing.T, v journal.PrincipalStore, when string,
	state journal.DeliveryState, ackedID string, turnState journal.TurnState, turnEventID string) {
	t.Helper()
	ctx := context.Background()
	d, err := v.Delivery(ctx, "d1", journal.StageFinal)
	if err != nil {
		t.Fatalf("Delivery: %v", err)
	}
	rec, ok, err := v.Turn(ctx, "turn-1")
	if err != nil || !ok {
		t.Fatalf("Turn = %v, %v", ok, err)
	}
	if d.State != state || d.EventID != ackedID || rec.State != turnState || rec.EventID != turnEventID {
		t.Fatalf("%s: final %v %q, turn %d %q; want final %v %q, turn %d %q", when,
			d.State, d.EventID, rec.State, rec.EventID, state, ackedID, turnState, turnEventID)
	}
}

// screenIDs lists the messages a room page shows.
func screenIDs(t *testing.T, v journal.PrincipalStore, room string) []string {
	t.Helper()
	page, err := v.Read(context.Background(), journal.ReadRequest{RoomID: room, Limit: 100})
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	ids := []string{}
	for _, m := range page.Messages {
		ids = append(ids, m.EventID)
	}
	return ids
}
