package matrix

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/mindroomd/mindroomd/journal"
)

// Sender sends deliveries for the outbox (its Sender and Sessions ports).
type Sender struct {
	c *Client
}

// NewSender returns the outbox's sender over c.
func NewSender(c *Client) *Sender { return &Sender{c: c} }

// Session counts the client's re-logins (the outbox's Sessions port).
func (s *Sender) Session() uint64 { return s.c.Session() }

// Send puts the delivery's wire content into its room under its frozen
// transaction ID, then fetches the event to learn the server's timestamp,
// which orders the reply's projection. A failed fetch still acknowledges
// the send, with ServerTS zero: the sync echo carries the timestamp.
//
// An m.room.redaction delivery redacts the event its content's "redacts"
// names, with its optional "reason", through the redact endpoint under
// the delivery's transaction ID: rooms before version 11 want the target
// at the event's top level, which a plain send cannot put there. It is
// never sealed: every server in the room must read a redaction to apply
// it. A content naming no valid event is refused as a 400: no retry can
// mend it.
func (s *Sender) Send(ctx context.Context, d journal.Delivery, content json.RawMessage) (journal.Sent, error) {
	var eventID string
	var err error
	if d.EventType == journal.TypeRedaction {
		eventID, err = s.redact(ctx, d, content)
	} else if eventID, err = s.c.Send(ctx, d.RoomID, d.EventType, d.TxnID, content); err != nil {
		err = sendError(err)
	}
	if err != nil {
		return journal.Sent{}, err
	}
	sent := journal.Sent{EventID: eventID}
	if !journal.ValidEventID(eventID) {
		// Nothing to fetch; the outbox refuses the answer.
		return sent, nil
	}
	raw, err := s.fetchSent(ctx, d.RoomID, eventID)
	if err != nil {
		s.c.log.Warn().Err(err).Str("delivery_id", d.DeliveryID).Str("event_id", eventID).
			Msg("Fetching a sent event failed; its sync echo will order it")
		return sent, nil
	}
	e, err := readEvent(raw)
	if err != nil || e.EventID != eventID || e.TS <= 0 {
		s.c.log.Warn().Err(err).Str("delivery_id", d.DeliveryID).Str("event_id", eventID).
			Msg("A sent event came back without its ID or timestamp; its sync echo will order it")
		return sent, nil
	}
	sent.ServerTS = e.TS
	return sent, nil
}

// redact sends a redaction delivery; its error is the outbox's.
func (s *Sender) redact(ctx context.Context, d journal.Delivery, content json.RawMessage) (string, error) {
	target, reason, err := readRedaction(content)
	if err != nil {
		return "", &journal.SendError{Status: 400, Err: fmt.Errorf("redaction %s: %w", d.DeliveryID, err)}
	}
	eventID, err := s.c.RedactWithReason(ctx, d.RoomID, target, d.TxnID, reason)
	if err != nil {
		return "", sendError(err)
	}
	return eventID, nil
}

// readRedaction reads what a redaction's content redacts and why.
func readRedaction(content json.RawMessage) (target, reason string, err error) {
	var c struct {
		Redacts json.RawMessage `json:"redacts"`
		Reason  json.RawMessage `json:"reason"`
	}
	if err := json.Unmarshal(content, &c); err != nil {
		return "", "", fmt.Errorf("content: %w", err)
	}
	if json.Unmarshal(c.Redacts, &target) != nil || !journal.ValidEventID(target) {
		return "", "", errors.New("content names no valid event ID to redact")
	}
	if len(c.Reason) > 0 && string(c.Reason) != "null" && json.Unmarshal(c.Reason, &reason) != nil {
		return "", "", errors.New("the reason is not a string")
	}
	return target, reason, nil
}

// fetchSent fetches an event just sent, once. Dendrite answers a send
// before the event can be read (GET /event is served from its sync store,
// filled right after), and waiting for it would hold the principal's next
// send: an event not readable yet is left to its sync echo, which carries
// the same timestamp.
func (s *Sender) fetchSent(ctx context.Context, room, eventID string) (json.RawMessage, error) {
	return s.c.Event(ctx, room, eventID)
}

// sendError gives the outbox the homeserver's answer: a refusal's status
// and requested wait, or status 0 for anything that never got an answer
// (the network, a deadline), which the outbox retries.
func sendError(err error) error {
	var he *HTTPError
	if errors.As(err, &he) {
		return &journal.SendError{Status: he.Status, RetryAfter: he.RetryAfter, Err: err}
	}
	return &journal.SendError{Err: err}
}

// DefaultReconcileWindow is how many of a room's most recent events a
// reconciliation searches. A delivery is reconciled soon after the restart
// that changed the device, so its copy, if it was sent, is among the
// room's latest events unless the room is very busy.
const DefaultReconcileWindow = 500

// reconcilePage is the page size of a reconciliation's walk (Dendrite caps
// /messages at 100 events a page).
const reconcilePage = 100

// Reconciler looks for a delivery's copy in its room by the delivery
// marker in its content (the outbox's Reconciler port). The homeserver's transaction
// ID dedup is per device, and only the sending device sees
// unsigned.transaction_id, so after a device change the marker is the only
// sure sign a send went through.
type Reconciler struct {
	c *Client
	// Window is how many of the room's most recent events are searched
	// (DefaultReconcileWindow).
	Window int
	// Open, when set, returns an event of room in the clear: in an
	// encrypted room the marker is inside the ciphertext.
	Open func(ctx context.Context, room string, raw json.RawMessage) json.RawMessage
}

// NewReconciler returns the outbox's reconciler over c.
func NewReconciler(c *Client) *Reconciler {
	return &Reconciler{c: c, Window: DefaultReconcileWindow}
}

// Find walks the room's history backwards from the newest event, at most
// Window events deep, and reports the first event the agent sent with the
// delivery's type whose top-level content carries d's marker. For an edit
// that is the edit's own content, not its m.new_content. A copy since
// redacted has lost its content, marker and all, so the search also lists
// the agent's events of the delivery's type that another user redacted,
// for the outbox to weigh (journal.RedactedCopy).
//
// The walk filters on the client: Dendrite applies a /messages filter
// after cutting the page and ends the walk at the first page the filter
// empties, so a server-side filter would stop at the first page of other
// people's messages.
func (r *Reconciler) Find(ctx context.Context, d journal.Delivery) (journal.Search, error) {
	var s journal.Search
	from := ""
	for searched := 0; searched < r.Window; {
		page, err := r.c.Messages(ctx, d.RoomID, from, Backward, min(reconcilePage, r.Window-searched))
		if err != nil {
			return journal.Search{}, fmt.Errorf("reconcile %s: %w", d.DeliveryID, err)
		}
		for _, raw := range page.Chunk {
			if r.Open != nil {
				raw = r.Open(ctx, d.RoomID, raw)
			}
			e, err := readEvent(raw)
			switch {
			case err != nil:
				// Not an event the search can read.
			case r.carries(e, d):
				return journal.Search{Copy: journal.Sent{EventID: e.EventID, ServerTS: e.TS}, Found: true}, nil
			case r.redactedByAnother(e, d):
				s.Redacted = append(s.Redacted, journal.RedactedSend{EventID: e.EventID, ServerTS: e.TS})
			}
		}
		searched += len(page.Chunk)
		if len(page.Chunk) == 0 || page.End == "" {
			break
		}
		from = page.End
	}
	return s, nil
}

// carries reports whether e is the agent's copy of d.
func (r *Reconciler) carries(e event, d journal.Delivery) bool {
	if e.Sender != r.c.UserID() || e.Type != d.EventType || e.TS <= 0 || !journal.ValidEventID(e.EventID) {
		return false
	}
	var content map[string]json.RawMessage
	if json.Unmarshal(e.Content, &content) != nil {
		return false
	}
	var marker map[string]json.RawMessage
	if json.Unmarshal(content[journal.DeliveryKey], &marker) != nil {
		return false
	}
	var deliveryID, stage string
	return json.Unmarshal(marker["delivery_id"], &deliveryID) == nil && deliveryID == d.DeliveryID &&
		json.Unmarshal(marker["stage"], &stage) == nil && stage == d.Stage.String()
}

// redactedByAnother reports whether e is an event the agent sent with d's
// type that another user redacted: it could be d's copy. A redaction by
// the agent's own account is left out: this daemon redacts only
// placeholders it acknowledged, never a row in doubt, and the account's
// other senders (another principal on it, a person's client) redact
// their own events.
func (r *Reconciler) redactedByAnother(e event, d journal.Delivery) bool {
	// A redacted copy sent into an encrypted room kept only its outer
	// type: what it sealed is gone with its ciphertext.
	sealed := e.Type == "m.room.encrypted" && r.Open != nil
	if e.Sender != r.c.UserID() || (e.Type != d.EventType && !sealed) || e.TS <= 0 || !journal.ValidEventID(e.EventID) {
		return false
	}
	var unsigned struct {
		RedactedBecause *struct {
			Sender string `json:"sender"`
		} `json:"redacted_because"`
	}
	if json.Unmarshal(e.Unsigned, &unsigned) != nil || unsigned.RedactedBecause == nil {
		return false
	}
	by := unsigned.RedactedBecause.Sender
	return by != "" && by != r.c.UserID()
}

// event is the part of an event the port reads.
type event struct {
	EventID string          `json:"event_id"`
	Type    string          `json:"type"`
	Sender  string          `json:"sender"`
	TS      int64           `json:"origin_server_ts"`
	Content json.RawMessage `json:"content"`
	// Unsigned holds, among others, the redaction of an event the server
	// hands over redacted; it is read only where that matters.
	Unsigned json.RawMessage `json:"unsigned"`
}

func readEvent(raw json.RawMessage) (event, error) {
	var e event
	if err := json.Unmarshal(raw, &e); err != nil {
		return event{}, fmt.Errorf("read event: %w", err)
	}
	return e, nil
}
