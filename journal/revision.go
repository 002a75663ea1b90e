package journal

// Revision identifies one revision of a logical message for ordering.
type Revision struct {
	// TS is the revision's origin_server_ts in milliseconds.
	TS int64
	// EventID breaks ties between revisions sharing a millisecond.
	EventID string
}

// After reports whether r is newer than o. Revisions compare as the tuple
// (TS, EventID) with event IDs in byte order, so every replica converges on
// the same winner whatever order the edits arrived in.
func (r Revision) After(o Revision) bool {
	if r.TS != o.TS {
		return r.TS > o.TS
	}
	return r.EventID > o.EventID
}
