package contract

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
)

// TestBadInput checks that a malformed event is rejected on its own, with a
// reason, while the rest of its batch is admitted, and that malformed
// arguments to reads and views are refused with the shared sentinels.
func TestBadInput(t *testing.T, f Factory) {
	ctx := context.Background()
	good := func(id string) event { return msg(id, alice, 1000, "fine") }
	bad := func() event { return msg("$bad", alice, 1000, "bad") }
	content := func(extra map[string]any) map[string]any {
		c := map[string]any{"msgtype": "m.text", "body": "bad"}
		for k, v := range extra {
			c[k] = v
		}
		return c
	}
	raw := func(s string) journal.Inbound {
		return journal.Inbound{RoomID: room, Provenance: journal.Live, Event: []byte(s)}
	}
	live := func(e event) journal.Inbound { return e.In(room, journal.Live) }

	cases := []struct {
		name  string
		in    journal.Inbound
		field string // the EventError field that names the fault
		id    string // the event ID the result can still report
	}{
		{"MissingEventID", live(bad().With("event_id", nil)), "event_id", ""},
		{"EventIDWithoutItsSigil", live(bad().With("event_id", "bad")), "event_id", ""},
		{"EventIDWithASpace", live(bad().With("event_id", "$b ad")), "event_id", ""},
		{"EventIDOfTheWrongType", live(bad().With("event_id", 42)), "event", ""},
		{"MissingType", live(bad().With("type", nil)), "type", "$bad"},
		{"EmptyType", live(bad().With("type", "")), "type", "$bad"},
		{"MissingSender", live(bad().With("sender", nil)), "sender", "$bad"},
		{"SenderWithoutAServer", live(bad().With("sender", "@alice")), "sender", "$bad"},
		{"SenderWithoutItsSigil", live(bad().With("sender", "alice:example.org")), "sender", "$bad"},
		{"SenderOfTheWrongType", live(bad().With("sender", true)), "event", "$bad"},
		{"MissingTimestamp", live(bad().With("origin_server_ts", nil)), "origin_server_ts", "$bad"},
		{"TimestampAsAString", live(bad().With("origin_server_ts", "1000")), "origin_server_ts", "$bad"},
		{"FractionalTimestamp", live(bad().With("origin_server_ts", 1000.5)), "origin_server_ts", "$bad"},
		{"ZeroTimestamp", live(bad().With("origin_server_ts", 0)), "origin_server_ts", "$bad"},
		{"NegativeTimestamp", live(bad().With("origin_server_ts", -1000)), "origin_server_ts", "$bad"},
		{"TimestampCenturiesAhead", live(bad().With("origin_server_ts", farFuture)), "origin_server_ts", "$bad"},
		{"MissingContent", live(bad().With("content", nil)), "content", "$bad"},
		{"ContentNotAnObject", live(bad().With("content", "hello")), "content", "$bad"},
		{"ContentOver64KiB", live(bad().With("content", content(map[string]any{"body": strings.Repeat("x", journal.MaxContentBytes)}))), "content", "$bad"},
		{"ContentFieldOfTheWrongType", live(bad().With("content", content(map[string]any{"msgtype": 7}))), "content", "$bad"},
		{"RelationOfTheWrongType", live(bad().With("content", content(map[string]any{"m.relates_to": "$x"}))), "content", "$bad"},
		{"RelationToAMalformedEventID", live(bad().With("content", content(map[string]any{"m.relates_to": map[string]any{"rel_type": "m.thread", "event_id": "root"}}))), "content.m.relates_to.event_id", "$bad"},
		{"EditWithoutNewContent", live(bad().With("content", content(map[string]any{"m.relates_to": map[string]any{"rel_type": "m.replace", "event_id": "$m"}}))), "content.m.new_content", "$bad"},
		{"RedactionWithoutATarget", live(redaction("$bad", alice, 1000, "$m").With("redacts", nil).With("content", map[string]any{})), "redacts", "$bad"},
		{"RedactionOfAMalformedTarget", live(redaction("$bad", alice, 1000, "not-an-id")), "redacts", "$bad"},
		{"ReactionWithoutAnAnnotation", live(reaction("$bad", alice, 1000, "$m", "+1").With("content", map[string]any{"key": "+1"})), "content.m.relates_to", "$bad"},
		{"MembershipWithoutAStateKey", live(member("$bad", alice, 1000, "join").With("state_key", nil)), "state_key", "$bad"},
		{"MembershipWithoutAMembership", live(member("$bad", alice, 1000, "join").With("content", map[string]any{})), "content.membership", "$bad"},
		{"RoomIDThatDisagreesWithTheTimeline", live(bad().With("room_id", otherRoom)), "room_id", "$bad"},
		{"MalformedRoomID", bad().In("room:example.org", journal.Live), "room_id", "$bad"},
		{"UnknownProvenance", bad().In(room, journal.Provenance(0)), "provenance", "$bad"},
		{"InvalidJSON", raw(`{"event_id":"$bad","type":`), "event", ""},
		{"TrailingGarbage", raw(string(bad().JSON()) + `{}`), "event", ""},
		{"NotAnObject", raw(`["$bad"]`), "event", ""},
		{"InvalidUTF8", raw(strings.Replace(string(bad().JSON()), `"bad"`, "\"b\xffd\"", 1)), "event", "$bad"},
	}
	for _, c := range cases {
		t.Run("IsRejectedAlone/"+c.name, func(t *testing.T) {
			fx := newFixture(t, f)
			res := fx.admit(fx.v, []journal.Inbound{live(good("$before")), c.in, live(good("$after"))}, "s_next")
			if got, want := outcomes(res), "$before:admitted/actionable "+c.id+":rejected $after:admitted/actionable"; got != want {
				t.Fatalf("outcomes = %s, want %s", got, want)
			}
			err := res[1].Err
			if !errors.Is(err, journal.ErrInvalidEvent) {
				t.Fatalf("error %v does not wrap ErrInvalidEvent", err)
			}
			var ee *journal.EventError
			if !errors.As(err, &ee) {
				t.Fatalf("error %v is not an *EventError", err)
			}
			if got, want := ee.Field, c.field; got != want {
				t.Fatalf("rejected field = %q (%v), want %q", got, err, want)
			}
			if got, want := fx.pendingIDs(fx.v), []string{"$before", "$after"}; !slices.Equal(got, want) {
				t.Fatalf("pending = %v, want %v", got, want)
			}
			if got, want := fx.roomScreen(), []string{shown("$after", "fine"), shown("$before", "fine")}; !slices.Equal(got, want) {
				t.Fatalf("room = %v, want %v", got, want)
			}
			if tok, err := fx.v.SyncToken(ctx); err != nil || tok != "s_next" {
				t.Fatalf("SyncToken = %q, %v; want s_next", tok, err)
			}
		})
	}

	t.Run("ATimestampWithinTheSkewAllowanceIsAccepted", func(t *testing.T) {
		fx := newFixture(t, f)
		// A small positive timestamp and one near 2026 are both plausible.
		res := fx.admit(fx.v, batch(room, journal.Live, msg("$early", alice, 1, "epoch"), msg("$now", alice, 1793534400000, "2026")), "")
		if got, want := outcomes(res), "$early:admitted/actionable $now:admitted/actionable"; got != want {
			t.Fatalf("outcomes = %s, want %s", got, want)
		}
	})

	t.Run("ARejectionDoesNotClaimTheEventID", func(t *testing.T) {
		fx := newFixture(t, f)
		res := fx.admit(fx.v, batch(room, journal.Live, msg("$m1", alice, 0, "broken copy")), "")
		if got, want := res[0].Outcome, journal.Rejected; got != want {
			t.Fatalf("broken copy = %v, want %v", got, want)
		}
		res = fx.admit(fx.v, batch(room, journal.Live, msg("$m1", alice, 1000, "good copy")), "")
		if got, want := outcomes(res), "$m1:admitted/actionable"; got != want {
			t.Fatalf("good copy = %s, want %s", got, want)
		}
		if got, want := fx.roomScreen(), []string{shown("$m1", "good copy")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
	})

	t.Run("ARejectedEventIsRejectedAgainOnRedelivery", func(t *testing.T) {
		fx := newFixture(t, f)
		in := batch(room, journal.Live, msg("$m1", alice, -5, "broken"))
		for i := range 2 {
			res := fx.admit(fx.v, in, "")
			if got, want := res[0].Outcome, journal.Rejected; got != want {
				t.Fatalf("delivery %d = %v, want %v", i+1, got, want)
			}
		}
		if got := fx.pendingIDs(fx.v); len(got) != 0 {
			t.Fatalf("pending = %v, want none", got)
		}
	})

	t.Run("AnUnknownEventTypeIsKeptAsContext", func(t *testing.T) {
		fx := newFixture(t, f)
		custom := event{"event_id": "$custom", "type": "com.example.widget", "sender": alice, "origin_server_ts": 1000,
			"content": map[string]any{"anything": []any{1, 2}}}
		if got, want := outcomes(fx.admit(fx.v, batch(room, journal.Live, custom), "")), "$custom:admitted/context_only"; got != want {
			t.Fatalf("outcome = %s, want %s", got, want)
		}
		if got := fx.roomScreen(); len(got) != 0 {
			t.Fatalf("room = %v, want empty", got)
		}
	})

	t.Run("AMalformedPrincipalIsRefused", func(t *testing.T) {
		fx := newFixture(t, f)
		for _, p := range []struct{ agent, user string }{
			{"", botUser},
			{"has space", botUser},
			{strings.Repeat("a", 65), botUser},
			{"helper", "bot"},
			{"helper", "@bot"},
			{"helper", "!bot:example.org"},
		} {
			if _, err := fx.s.Principal(ctx, p.agent, p.user); !errors.Is(err, journal.ErrInvalidPrincipal) {
				t.Fatalf("Principal(%q, %q) error = %v, want ErrInvalidPrincipal", p.agent, p.user, err)
			}
		}
	})

	t.Run("MalformedReadsAreRefused", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "hi"))
		for name, req := range map[string]journal.ReadRequest{
			"ZeroLimit":          {RoomID: room, Limit: 0},
			"NegativeLimit":      {RoomID: room, Limit: -1},
			"MalformedRoom":      {RoomID: "room", Limit: 10},
			"MalformedThread":    {RoomID: room, Thread: ptr("root"), Limit: 10},
			"EmptyThread":        {RoomID: room, Thread: ptr(""), Limit: 10},
			"MalformedCursorID":  {RoomID: room, Limit: 10, Before: &journal.Cursor{CreatedTS: 1000, EventID: "m1"}},
			"CursorWithoutEvent": {RoomID: room, Limit: 10, Before: &journal.Cursor{CreatedTS: 1000}},
		} {
			if _, err := fx.v.Read(ctx, req); !errors.Is(err, journal.ErrInvalidArgument) {
				t.Fatalf("%s: Read error = %v, want ErrInvalidArgument", name, err)
			}
		}
	})

	t.Run("PendingNeedsAPositiveLimit", func(t *testing.T) {
		fx := newFixture(t, f)
		for _, limit := range []int{0, -3} {
			if _, err := fx.v.Pending(ctx, limit, 0); !errors.Is(err, journal.ErrInvalidArgument) {
				t.Fatalf("Pending(%d) error = %v, want ErrInvalidArgument", limit, err)
			}
		}
	})

	t.Run("LatestVisibleNeedsAnEventIDThread", func(t *testing.T) {
		fx := newFixture(t, f)
		if _, _, err := fx.v.LatestVisibleEventID(ctx, room, ptr("root")); !errors.Is(err, journal.ErrInvalidArgument) {
			t.Fatalf("LatestVisibleEventID error = %v, want ErrInvalidArgument", err)
		}
	})
}
