package journal_test

import (
	"errors"
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

func TestAPendingPageAdvancesPastEveryRowAndReportsTheUnreadable(t *testing.T) {
	page := journal.PendingPage{Next: 3}
	page.Add(journal.PendingEvent{Seq: 4, EventID: "$a"}, `{"event_id":"$a"}`)
	page.Add(journal.PendingEvent{Seq: 7, EventID: "$b"}, `{not json`)
	page.Add(journal.PendingEvent{Seq: 9, EventID: "$c"}, `{"event_id":"$other"}`)
	page.Filled(3)
	if page.Next != 9 || !page.More {
		t.Fatalf("Next %d More %v, want 9 and true: the page read its limit", page.Next, page.More)
	}
	if len(page.Events) != 1 || page.Events[0].EventID != "$a" || string(page.Events[0].Event) != `{"event_id":"$a"}` {
		t.Fatalf("readable rows %+v", page.Events)
	}
	if len(page.Unreadable) != 2 || page.Unreadable[0].Seq != 7 || page.Unreadable[1].Seq != 9 {
		t.Fatalf("unreadable rows %+v", page.Unreadable)
	}
	short := journal.PendingPage{}
	short.Add(journal.PendingEvent{Seq: 1, EventID: "$a"}, `{"event_id":"$a"}`)
	if short.Filled(2); short.More {
		t.Fatal("a short page says more may follow")
	}
	if err := journal.CheckPendingLimit(0); !errors.Is(err, journal.ErrInvalidArgument) {
		t.Fatalf("a limit of 0: %v", err)
	}
}
