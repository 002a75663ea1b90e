package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/mindroomd/mindroomd/journal"
)

// Sender is the port to the homeserver. Send must use d.TxnID as the
// transaction ID, so a repeated send of a frozen delivery is deduplicated
// by the server (per sending device). It returns the server's record of the
// event: its event ID and, when it can learn it (a fetch of the event), the
// server's timestamp, which orders the reply's projection.
type Sender interface {
	Send(ctx context.Context, d journal.Delivery, content json.RawMessage) (journal.Sent, error)
}

// Sessions is implemented by a Sender that logs in again while it runs
// (after the homeserver refused its access token). Session counts those
// logins. Dendrite keeps transaction IDs per access token, so a row sent
// under an earlier session is looked for in the room before it is sent
// again, as a row of an earlier run is.
type Sessions interface {
	Session() uint64
}

// Reconciler looks for a delivery in its room's recent history, as sent by
// the agent. Homeservers deduplicate transaction IDs per device, and Matrix
// returns unsigned.transaction_id only to the sending device, so after a
// device change the only sure sign that an attempted send reached the room
// is the delivery marker in its content (journal.DeliveryKey). Find reports
// the server's record of the event carrying d's marker, if there is one,
// and otherwise the agent's events of d's type that another user redacted,
// which took their markers with them (journal.RedactedCopy weighs them).
type Reconciler interface {
	Find(ctx context.Context, d journal.Delivery) (journal.Search, error)
}

// ErrInvalidEventID is the outcome of a send the homeserver accepted but
// answered with something that is not an event ID. The answer cannot be
// recorded, and a resend under the same transaction ID brings it back, so
// the delivery fails permanently rather than retrying forever.
var ErrInvalidEventID = errors.New("homeserver accepted the send but returned no valid event ID")

// maxReportedEventID bounds how much of an invalid answer is kept in the
// row's last error.
const maxReportedEventID = 300

// invalidAnswer is the failure recorded for an accepted send whose event ID
// the store refused.
func invalidAnswer(eventID string, refusal error) error {
	if len(eventID) > maxReportedEventID {
		eventID = eventID[:maxReportedEventID] + "…"
	}
	return fmt.Errorf("%w: %q (%v)", ErrInvalidEventID, eventID, refusal)
}

// verdict is what to do after a failed send.
type verdict struct {
	permanent bool
	// after is the server-mandated delay; zero means exponential backoff.
	after time.Duration
	// tokenRefused marks a 401: the send was refused for its access token
	// (signed out, a password reset), not for what it sends.
	tokenRefused bool
	// unanswered marks a send that got no answer at all: it may have
	// reached the room.
	unanswered bool
}

// judge classifies a send failure: a 429 waits as long as the server asks;
// a 401 (M_UNKNOWN_TOKEN) stays owed and retries with backoff, since the
// delivery itself was not refused and goes out once a login is accepted;
// any other 4xx and an invalid event ID are permanent; and 5xx or a network
// error retries with backoff.
func judge(err error) verdict {
	if errors.Is(err, ErrInvalidEventID) {
		return verdict{permanent: true}
	}
	var se *journal.SendError
	if !errors.As(err, &se) {
		return verdict{unanswered: true}
	}
	switch {
	case se.Status == 0:
		return verdict{unanswered: true}
	case se.Status == 429:
		return verdict{after: se.RetryAfter}
	case se.Status == 401:
		return verdict{tokenRefused: true}
	case se.Status >= 400 && se.Status < 500:
		return verdict{permanent: true}
	}
	return verdict{}
}
