package matrix_test

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/matrix"
)

// delivery builds a stage of a reply as the outbox would claim it.
func delivery(t *testing.T, c *matrix.Client, room, id string, stage journal.Stage, body string) journal.Delivery {
	t.Helper()
	p, err := journal.NewPrincipal("bot", c.UserID())
	if err != nil {
		t.Fatal(err)
	}
	return journal.Delivery{
		DeliveryID: id, Stage: stage, RoomID: room, TxnID: journal.TxnID(p, id, stage),
		EventType: "m.room.message", Content: json.RawMessage(`{"msgtype":"m.text","body":"` + body + `"}`),
	}
}

func wire(t *testing.T, d journal.Delivery) json.RawMessage {
	t.Helper()
	content, err := journal.WireContent(d)
	if err != nil {
		t.Fatal(err)
	}
	return content
}

// countBodies counts the room's messages with body.
func countBodies(t *testing.T, history []json.RawMessage, body string) int {
	t.Helper()
	n := 0
	for _, b := range bodies(t, history) {
		if b == body {
			n++
		}
	}
	return n
}

func TestARepeatedTransactionFromTheSameDeviceIsOneEvent(t *testing.T) {
	c := login(t, config(t, register(t)))
	human, room := roomWithBot(t, c)
	content := json.RawMessage(`{"msgtype":"m.text","body":"once"}`)

	first, err := c.Send(t.Context(), room, "m.room.message", "txn-1", content)
	if err != nil {
		t.Fatal(err)
	}
	second, err := c.Send(t.Context(), room, "m.room.message", "txn-1", content)
	if err != nil {
		t.Fatal(err)
	}
	if second != first {
		t.Errorf("the repeated send answered %s, want the first send's %s", second, first)
	}
	if n := countBodies(t, history(t, human, room, second), "once"); n != 1 {
		t.Errorf("the room shows the message %d times, want once", n)
	}
}

// Transaction IDs are deduplicated per device: the same ID from a second
// device of the same user is a second event. This is why a delivery
// attempted from another device is reconciled by its marker before any
// resend.
func TestTheSameTransactionFromAnotherDeviceIsASecondEvent(t *testing.T) {
	acct := register(t)
	c := login(t, config(t, acct))
	other := login(t, config(t, acct)) // its own storage: a new device
	if other.DeviceID() == c.DeviceID() {
		t.Fatalf("both logins on device %s", c.DeviceID())
	}
	human, room := roomWithBot(t, c)
	content := json.RawMessage(`{"msgtype":"m.text","body":"twice"}`)

	first, err := c.Send(t.Context(), room, "m.room.message", "txn-1", content)
	if err != nil {
		t.Fatal(err)
	}
	second, err := other.Send(t.Context(), room, "m.room.message", "txn-1", content)
	if err != nil {
		t.Fatal(err)
	}
	if first == second {
		t.Fatalf("the second device's send was deduplicated into %s", first)
	}
	if n := countBodies(t, history(t, human, room, second), "twice"); n != 2 {
		t.Errorf("the room shows the message %d times, want twice", n)
	}
}

// Dendrite keys its transaction cache by access token, not device: after
// a revoked token is replaced on the same device, the same transaction ID
// is a second event. Keeping the device is not enough on this server; a
// send after any re-login needs the marker search as well.
func TestOnDendriteANewTokenOnTheSameDeviceForgetsEarlierTransactions(t *testing.T) {
	acct := register(t)
	cfg := config(t, acct)
	c := login(t, cfg)
	human, room := roomWithBot(t, c)
	content := json.RawMessage(`{"msgtype":"m.text","body":"after relogin"}`)
	first, err := c.Send(t.Context(), room, "m.room.message", "txn-1", content)
	if err != nil {
		t.Fatal(err)
	}
	_, _, token := storedSession(t, cfg)
	logout(t, token)
	again := login(t, cfg)
	if again.DeviceID() != c.DeviceID() {
		t.Fatalf("device %s after re-login, want %s", again.DeviceID(), c.DeviceID())
	}
	second, err := again.Send(t.Context(), room, "m.room.message", "txn-1", content)
	if err != nil {
		t.Fatal(err)
	}
	if second == first || countBodies(t, history(t, human, room, second), "after relogin") != 2 {
		t.Errorf("the resend under a new token was deduplicated (%s, %s): Dendrite's transaction cache changed", first, second)
	}
}

func TestTheSenderReportsTheServersTimestamp(t *testing.T) {
	c := login(t, config(t, register(t)))
	human, room := roomWithBot(t, c)
	d := delivery(t, c, room, "reply-1", journal.StageFinal, "the answer")

	sent, err := matrix.NewSender(c).Send(t.Context(), d, wire(t, d))
	if err != nil {
		t.Fatal(err)
	}
	events := history(t, human, room, sent.EventID)
	i := slices.IndexFunc(events, func(raw json.RawMessage) bool { return parse(t, raw).ID == sent.EventID })
	if i < 0 {
		t.Fatalf("sent event %s is not in the room", sent.EventID)
	}
	// Dendrite may not serve the event yet when the send returns; then the
	// timestamp is left to the sync echo (zero), never made up.
	if e := parse(t, events[i]); (sent.ServerTS != 0 && sent.ServerTS != e.TS) || e.TS <= 0 || e.Content.Body != "the answer" {
		t.Errorf("sent ts %d, the room's event: ts %d body %q; want its positive ts (or none) and body %q", sent.ServerTS, e.TS, e.Content.Body, "the answer")
	}
	// The delivery's own transaction ID is used: resending is deduplicated.
	again, err := matrix.NewSender(c).Send(t.Context(), d, wire(t, d))
	if err != nil || again.EventID != sent.EventID {
		t.Errorf("resend = %s, %v; want %s deduplicated", again.EventID, err, sent.EventID)
	}
}

func TestTheReconcilerFindsADeliveryByItsMarkerAndNothingElse(t *testing.T) {
	acct := register(t)
	sending := login(t, config(t, acct))
	human, room := roomWithBot(t, sending)
	sender := matrix.NewSender(sending)

	initial := delivery(t, sending, room, "reply-1", journal.StageInitial, "thinking")
	sentInitial, err := sender.Send(t.Context(), initial, wire(t, initial))
	if err != nil {
		t.Fatal(err)
	}
	final := delivery(t, sending, room, "reply-1", journal.StageFinal, "the answer")
	final.ReplacesEventID = sentInitial.EventID // sent as an edit of the placeholder
	sentFinal, err := sender.Send(t.Context(), final, wire(t, final))
	if err != nil {
		t.Fatal(err)
	}
	// Another user's message forging the marker of a delivery never sent.
	forged := delivery(t, sending, room, "reply-2", journal.StageFinal, "forged")
	human.Send(room, "m.room.message", wire(t, forged))
	// The agent's copies lie behind the room's later chatter.
	var last string
	for range 12 {
		last = human.SendText(room, "chatter")
	}
	settle(t, human, room, last)

	// A new device of the same agent, after a restart, searches.
	rec := matrix.NewReconciler(login(t, config(t, acct)))
	for _, tc := range []struct {
		name  string
		d     journal.Delivery
		found bool
		want  journal.Sent
	}{
		{"Initial", initial, true, sentInitial},
		{"FinalEdit", final, true, sentFinal},
		{"NeverSent", delivery(t, sending, room, "reply-3", journal.StageFinal, "x"), false, journal.Sent{}},
		{"ForgedByAnotherUser", forged, false, journal.Sent{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := rec.Find(t.Context(), tc.d)
			if err != nil {
				t.Fatal(err)
			}
			// The sender may have sent before the event was readable, so
			// only the ID is compared; a find always carries the timestamp.
			if s.Found != tc.found || s.Copy.EventID != tc.want.EventID || (s.Found && s.Copy.ServerTS <= 0) || len(s.Redacted) > 0 {
				t.Errorf("Find = %+v; want %+v found=%t, nothing redacted", s, tc.want, tc.found)
			}
		})
	}
}

// The search reaches no further back than its window: a copy behind more
// events than that is not found, and a busy room is never walked to its
// beginning.
func TestTheReconcilerSearchesNoFurtherThanItsWindow(t *testing.T) {
	acct := register(t)
	sending := login(t, config(t, acct))
	human, room := roomWithBot(t, sending)
	d := delivery(t, sending, room, "reply-1", journal.StageFinal, "the answer")
	sent, err := matrix.NewSender(sending).Send(t.Context(), d, wire(t, d))
	if err != nil {
		t.Fatal(err)
	}
	var last string
	for range 6 {
		last = human.SendText(room, "chatter")
	}
	settle(t, human, room, last)

	rec := matrix.NewReconciler(login(t, config(t, acct)))
	for window, want := range map[int]bool{6: false, 7: true} {
		rec.Window = window
		s, err := rec.Find(t.Context(), d)
		if err != nil {
			t.Fatal(err)
		}
		if s.Found != want || (s.Found && (s.Copy.EventID != sent.EventID || s.Copy.ServerTS <= 0)) {
			t.Errorf("window %d: Find = %+v; want found=%t", window, s, want)
		}
	}
}
