package journal_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// nestedEvent is a text message whose content holds a value nested so that
// the whole event is depth levels deep, the event itself being level 1 and
// its content level 2. open and close build one level inside the content.
func nestedEvent(id string, depth int, open, close string) []byte {
	inner := max(depth-2, 0)
	return []byte(`{"event_id":"` + id + `","type":"m.room.message","sender":"@alice:example.org",` +
		`"origin_server_ts":1000,"content":{"msgtype":"m.text","body":"deep",` +
		`"x":` + strings.Repeat(open, inner) + `1` + strings.Repeat(close, inner) + `}}`)
}

func TestAnEventNestedDeeperThanTheBoundIsRefusedAtParseTime(t *testing.T) {
	for _, c := range []struct {
		name    string
		depth   int
		refused bool
	}{
		{"AtTheBound", journal.MaxJSONDepth, false},
		{"OneLevelBeyond", journal.MaxJSONDepth + 1, true},
		// Deeper than encoding/json reads back, yet well inside 64 KiB.
		{"BeyondWhatAStoredPayloadDecodes", 10_001, true},
	} {
		for _, shape := range []struct{ name, open, close string }{
			{"Objects", `{"x":`, `}`},
			{"Arrays", `[`, `]`},
		} {
			t.Run(c.name+"/"+shape.name, func(t *testing.T) {
				in := journal.Inbound{RoomID: parseRoom, Provenance: journal.Live,
					Event: nestedEvent("$deep", c.depth, shape.open, shape.close)}
				if len(in.Event) > journal.MaxContentBytes {
					t.Fatalf("the event is %d bytes: the depth, not the size, must be what is judged", len(in.Event))
				}
				_, err := journal.ParseEvent(in, parseNow)
				var ee *journal.EventError
				switch {
				case !c.refused && err != nil:
					t.Fatalf("an event %d levels deep was refused: %v", c.depth, err)
				case c.refused && err == nil:
					t.Fatalf("an event %d levels deep was accepted", c.depth)
				case c.refused && (!errors.As(err, &ee) || ee.Field != "event" || !errors.Is(err, journal.ErrInvalidEvent) ||
					!strings.Contains(err.Error(), "nested deeper than 64 levels")):
					t.Fatalf("an event %d levels deep was refused with %v, want an invalid event naming its depth", c.depth, err)
				}
			})
		}
	}
}

// countRejected counts every rejected event: the fresh journal rejects
// only the deep one. (Its ID cannot be salvaged for the report: the
// salvage reads the event with encoding/json, which refuses it too.)
const countRejected = `SELECT count(*) FROM rejected_events`

// A deep event from any room member is recorded as malformed and skipped:
// it never becomes a pending row no worker can read, and the events after
// it are admitted and offered as work.
func TestAnEventTooDeepToReadBackIsRecordedAsMalformedAndLaterEventsFlow(t *testing.T) {
	s, _ := testsupport.MustOpen(t)
	v, err := s.Principal(t.Context(), "bot", "@bot:example.org")
	if err != nil {
		t.Fatal(err)
	}
	const room = "!deep:example.org"
	batch := []journal.Inbound{
		{RoomID: room, Provenance: journal.Live, Event: nestedEvent("$deep", 10_001, `{"x":`, `}`)},
		mx.Message("$after", "@alice:example.org", 1001, "after").In(room, journal.Live),
	}
	res, err := v.AdmitBatch(t.Context(), batch, "")
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Outcome != journal.Rejected || res[1].Outcome != journal.Admitted {
		t.Fatalf("outcomes %v (%v), %v; want rejected, admitted", res[0].Outcome, res[0].Err, res[1].Outcome)
	}
	if !strings.Contains(fmt.Sprint(res[0].Err), "nested deeper than 64 levels") {
		t.Errorf("rejected for %v, want the depth named", res[0].Err)
	}
	var rejected int
	if err := s.DB().QueryPool().QueryRowContext(t.Context(), countRejected).Scan(&rejected); err != nil {
		t.Fatal(err)
	}
	if rejected != 1 {
		t.Fatalf("rejected events recorded = %d, want the deep one", rejected)
	}
	res, err = v.AdmitBatch(t.Context(), mx.Live(room, mx.Message("$later", "@alice:example.org", 1002, "later")), "")
	if err != nil || res[0].Outcome != journal.Admitted {
		t.Fatalf("a later batch = %v, %v; want admitted", res, err)
	}
	page, err := v.Pending(t.Context(), 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	var pending []string
	for _, e := range page.Events {
		pending = append(pending, e.EventID)
	}
	if len(page.Unreadable) != 0 || strings.Join(pending, ",") != "$after,$later" {
		t.Fatalf("pending %v, unreadable %v; want $after,$later and nothing unreadable", pending, page.Unreadable)
	}
}
