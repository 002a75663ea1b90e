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
