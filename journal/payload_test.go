package journal_test

import (
	"testing"

	"github.com/mindroomd/mindroomd/journal"
)

func TestCheckPayloadAcceptsOnlyTheEventItIsStoredFor(t *testing.T) {
	for _, c := range []struct {
		name, payload string
		ok            bool
	}{
		{"TheNamedEvent", `{"event_id":"$e","type":"m.room.message"}`, true},
		{"AnotherEvent", `{"event_id":"$other","type":"m.room.message"}`, false},
		{"NoEventID", `{"type":"m.room.message"}`, false},
		{"NotJSON", `{not json`, false},
		{"Empty", ``, false},
		{"NotAnObject", `["$e"]`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := journal.CheckPayload(c.payload, "$e")
			if (err == nil) != c.ok {
				t.Fatalf("CheckPayload(%q) = %v, want ok=%v", c.payload, err, c.ok)
			}
		})
	}
}
