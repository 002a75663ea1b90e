package matrix_test

import (
	"encoding/json"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/matrix"
)

// A copy redacted since it was sent has lost its marker: the search lists
// the agent's events of the delivery's type that another user redacted,
// and nothing else a redaction touched.
func TestTheReconcilerListsOnlyTheAgentsEventsAnotherUserRedacted(t *testing.T) {
	acct := register(t)
	sending := login(t, config(t, acct))
	human, room := roomWithBot(t, sending)
	sender := matrix.NewSender(sending)
	send := func(id string) string {
		d := delivery(t, sending, room, id, journal.StageFinal, id)
		sent, err := sender.Send(t.Context(), d, wire(t, d))
		if err != nil {
			t.Fatal(err)
		}
		return sent.EventID
	}
	byHuman := send("redacted-by-a-person")
	human.Redact(room, byHuman)
	byAgent := send("redacted-by-the-agent")
	if _, err := sending.Redact(t.Context(), room, byAgent, "redact-own"); err != nil {
		t.Fatal(err)
	}
	reaction, err := sending.Send(t.Context(), room, "m.reaction", "react-1", json.RawMessage(
		`{"m.relates_to":{"rel_type":"m.annotation","event_id":"`+byHuman+`","key":"👍"}}`))
	if err != nil {
		t.Fatal(err)
	}
	human.Redact(room, reaction)
	last := human.Redact(room, human.SendText(room, "the person's own message"))
	settle(t, human, room, last)

	rec := matrix.NewReconciler(login(t, config(t, acct)))
	s, err := rec.Find(t.Context(), delivery(t, sending, room, "never-sent", journal.StageFinal, "x"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Found || len(s.Redacted) != 1 || s.Redacted[0].EventID != byHuman || s.Redacted[0].ServerTS <= 0 {
		t.Fatalf("Find = %+v; want only %s, with its timestamp, among the redacted", s, byHuman)
	}
}

// The daemon died after the homeserver accepted a reply and before the
// acknowledgement committed; a person then redacted the reply, and with
// its content went the marker a restart searches for. The restarted
// daemon, on a new device (its session file was lost, so the server's
// transaction memory cannot help), must take the redacted event for the
// reply and never show it again.
func TestAReplyRedactedBeforeItsAcknowledgementIsNotSentAgainAfterARestart(t *testing.T) {
	acct := register(t)
	died := login(t, config(t, acct))
	human, room := roomWithBot(t, died)
	o := newOwedReply(t, died, room)
	claimed, err := o.view.Claim(t.Context(), "reply-1", journal.StageFinal, died.DeviceID())
	if err != nil {
		t.Fatal(err)
	}
	accepted, err := matrix.NewSender(died).Send(t.Context(), claimed, wire(t, claimed))
	if err != nil {
		t.Fatal(err)
	}
	settle(t, human, room, human.Redact(room, accepted.EventID))

	restarted := login(t, config(t, acct))
	if restarted.DeviceID() == died.DeviceID() {
		t.Fatalf("the restart signed in on the same device %s", died.DeviceID())
	}
	o.deliver(restarted)
	eventID := o.awaitAcknowledged()

	if n := countBodies(t, history(t, human, room, eventID), owedBody); n != 0 {
		t.Errorf("after the restart the room shows the reply %d time(s), want none: a person removed it", n)
	}
	if eventID != accepted.EventID {
		t.Errorf("acknowledged %s, want the redacted copy %s", eventID, accepted.EventID)
	}
	page, err := o.view.Read(t.Context(), journal.ReadRequest{RoomID: room, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range page.Messages {
		if m.EventID == accepted.EventID || m.EventID == eventID {
			t.Errorf("the journal shows the reply a person removed, as %s: %s", m.EventID, m.Content)
		}
	}
}
