package journal

import (
	"cmp"
	"slices"
	"time"
)

// RedactedCopySkew is how far before a delivery was enqueued the homeserver
// may have stamped an event and it still be taken for the delivery's copy.
// A copy is stamped after its claim, so only a daemon clock running ahead
// of the homeserver's makes it look older; NTP keeps a disciplined clock
// well within 128 ms (the offset at which ntpd steps it), and a second
// covers two such hosts several times over. A clock further ahead only
// makes the rule miss a copy, which is then sent again as it was before the
// rule; a larger bound would instead let the agent's own earlier events,
// such as the progress edits that just precede a final, pass for its copy.
const RedactedCopySkew = time.Second

// RedactedSend is an event of the agent's own account, of a delivery's
// type, that another user redacted, as a reconciliation's search met it.
// Its content went with the redaction, and with it any delivery marker, so
// nothing in it says which delivery, if any, it was.
type RedactedSend struct {
	EventID string
	// ServerTS is the event's origin_server_ts in milliseconds.
	ServerTS int64
}

// Search is what a reconciliation found in a delivery's room: the copy
// carrying the delivery's marker, or failing that the redacted events of
// the agent's account that could be it (RedactedCopy decides).
type Search struct {
	// Copy is the server's record of the copy, when Found.
	Copy  Sent
	Found bool
	// Redacted are the agent's events of the delivery's type in the
	// searched window that another user redacted.
	Redacted []RedactedSend
}

// RedactedCopy decides whether d, attempted and unacknowledged, whose
// search found no copy by its marker, was sent and then redacted by
// someone: a cut-off send the server accepted, removed by a person before
// a restart reconciled it, has lost the marker with its content. Sent
// again, the reply would show although a person removed it.
//
// An event of the search explains a delivery when it is not the
// acknowledged event of a delivery of the principal (delivered) and the
// server stamped it at or after the delivery was enqueued, less
// RedactedCopySkew: the row keeps no claim time, and enqueueing precedes
// the first claim, so this bound holds for every copy. unacknowledged are
// the principal's rows not acknowledged; the attempted ones of d's room
// are the deliveries in doubt there, d among them. Events are taken oldest
// first, each by the oldest delivery in doubt it can explain and no other
// has taken, so one event explains at most one delivery.
//
// d is explained only when the events explain fewer deliveries without
// it: when another delivery in doubt could have been the copy instead (one
// whose send was refused, say, and never landed), a guess would lose a
// reply that was never shown, so none is made and d is sent again, as it
// would have been without the rule.
//
// The acknowledgement it returns has no server timestamp, so it projects
// nothing: the sync brings the redaction, and nothing redacted is shown.
//
// What can still mislead it is another sender on the agent's account (a
// client of a person signed in as the bot, another principal sharing the
// account) whose event someone else redacted in the same room after d was
// enqueued. The search already leaves out events the account redacted
// itself, and the rule needs all of a room, a type, a time and a redaction
// by another user to line up with a send cut off by a crash.
func RedactedCopy(d Delivery, unacknowledged []Delivery, redacted []RedactedSend, delivered map[string]bool) (Sent, bool) {
	if d.State != DeliveryAttempted {
		return Sent{}, false
	}
	inDoubt := []Delivery{d}
	for _, u := range unacknowledged {
		if u.RoomID == d.RoomID && u.State == DeliveryAttempted && (u.DeliveryID != d.DeliveryID || u.Stage != d.Stage) {
			inDoubt = append(inDoubt, u)
		}
	}
	slices.SortFunc(inDoubt, func(a, b Delivery) int {
		return cmp.Or(cmp.Compare(a.CreatedMS, b.CreatedMS), cmp.Compare(a.Position, b.Position))
	})
	self := slices.IndexFunc(inDoubt, func(u Delivery) bool { return u.DeliveryID == d.DeliveryID && u.Stage == d.Stage })

	var unexplained []RedactedSend
	for _, e := range redacted {
		if ValidEventID(e.EventID) && e.ServerTS > 0 && !delivered[e.EventID] &&
			!slices.ContainsFunc(unexplained, func(u RedactedSend) bool { return u.EventID == e.EventID }) {
			unexplained = append(unexplained, e)
		}
	}
	slices.SortFunc(unexplained, func(a, b RedactedSend) int {
		return cmp.Or(cmp.Compare(a.ServerTS, b.ServerTS), cmp.Compare(a.EventID, b.EventID))
	})

	paired, n := pairRedacted(inDoubt, unexplained, -1)
	e, ok := paired[self]
	if !ok {
		return Sent{}, false
	}
	if _, without := pairRedacted(inDoubt, unexplained, self); without == n {
		return Sent{}, false
	}
	return Sent{EventID: e.EventID}, true
}

// pairRedacted pairs each event, oldest first, with the oldest delivery in
// doubt (sorted oldest first) it can explain and no event has taken yet,
// leaving out the delivery at skip. The deliveries an event can explain
// are a prefix of inDoubt that grows with the event's time, so taking the
// events in time order pairs as many deliveries as any pairing can.
func pairRedacted(inDoubt []Delivery, events []RedactedSend, skip int) (map[int]RedactedSend, int) {
	paired := make(map[int]RedactedSend)
	for _, e := range events {
		for i, x := range inDoubt {
			if e.ServerTS < x.CreatedMS-RedactedCopySkew.Milliseconds() {
				break // enqueued after the event was stamped, and so is every later one
			}
			if _, taken := paired[i]; !taken && i != skip {
				paired[i] = e
				break
			}
		}
	}
	return paired, len(paired)
}
