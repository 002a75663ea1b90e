package journal

import "encoding/json"

// Content keys shared with the MindRoom clients, so both read each other's
// messages.
const (
	// StreamStatusKey carries a streamed message's progress.
	StreamStatusKey = "io.mindroom.stream_status"
	// LongTextKey marks a sidecar preview whose real content is a JSON file.
	LongTextKey = "io.mindroom.long_text"
	// DeliveryKey carries a delivery's identity so a sync echo can be matched
	// to its outbox row without a transaction ID.
	DeliveryKey = "io.mindroomd.delivery"
)

// StreamInProgress reports whether a stream status word means the message is
// still being written. Every other word (completed, error, cancelled, ...)
// is terminal, and so is a missing status.
func StreamInProgress(status string) bool { return status == "pending" || status == "streaming" }

// streamStatus reads the stream status of a content object.
func streamStatus(content json.RawMessage) string {
	var c map[string]json.RawMessage
	if json.Unmarshal(content, &c) != nil {
		return ""
	}
	var s string
	if json.Unmarshal(c[StreamStatusKey], &s) != nil {
		return ""
	}
	return s
}

// IsTransportProgress is the one predicate that keeps the agent's own
// streaming progress out of the projection, from sync and from hydration
// alike: a self-authored edit whose new content is still in progress. Only
// the terminal body of a stream is kept.
func IsTransportProgress(ev *Event, self string) bool {
	return ev.Kind == KindEdit && ev.Sender == self && StreamInProgress(streamStatus(ev.NewContent))
}

// IsSidecarPreview reports whether content is only a preview whose real text
// lives in an attached file. The projection stores no body for it, only a
// refresh debt, because a preview looks complete and is not.
func IsSidecarPreview(content json.RawMessage) bool {
	var c map[string]json.RawMessage
	if json.Unmarshal(content, &c) != nil {
		return false
	}
	raw, ok := c[LongTextKey]
	return ok && len(raw) > 0 && raw[0] == '{'
}
