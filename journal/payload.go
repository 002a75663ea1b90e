package journal

import (
	"encoding/json"
	"fmt"
)

// CheckPayload confirms that a stored pending payload is the event it
// claims to be: it decodes, and names eventID. A backend reports a row
// whose payload fails as an UnreadableEvent and pages past it, so a
// corrupt row neither hides nor ends the backlog.
func CheckPayload(payload, eventID string) error {
	var e struct {
		EventID string `json:"event_id"`
	}
	if err := json.Unmarshal([]byte(payload), &e); err != nil {
		return fmt.Errorf("stored payload does not decode: %w", err)
	}
	if e.EventID != eventID {
		return fmt.Errorf("stored payload names event %q", e.EventID)
	}
	return nil
}

// CheckPendingLimit refuses a page of pending work that could hold
// nothing.
func CheckPendingLimit(limit int) error {
	if limit <= 0 {
		return fmt.Errorf("%w: limit must be positive", ErrInvalidArgument)
	}
	return nil
}

// Add puts one pending row, read in position order with its stored
// payload, on the page: readable, or reported as unreadable. Either way
// the page advances past it.
func (p *PendingPage) Add(e PendingEvent, payload string) {
	p.Next = e.Seq
	if err := CheckPayload(payload, e.EventID); err != nil {
		p.Unreadable = append(p.Unreadable, UnreadableEvent{Seq: e.Seq, EventID: e.EventID, Err: err})
		return
	}
	e.Event = json.RawMessage(payload)
	p.Events = append(p.Events, e)
}

// Filled records whether the page read limit rows, so more may follow.
func (p *PendingPage) Filled(limit int) {
	p.More = len(p.Events)+len(p.Unreadable) == limit
}
