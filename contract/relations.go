package contract

import (
	"context"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
)

// TestAdmittedThreadID checks the lookup a turn uses to place a related
// event: it answers for everything the principal admitted in that room,
// context-only or settled, and for nothing else.
func TestAdmittedThreadID(t *testing.T, f Factory) {
	ctx := context.Background()
	lookup := func(fx *fixture, roomID, id string) (string, bool) {
		fx.t.Helper()
		th, seen, err := fx.v.AdmittedThreadID(ctx, roomID, id)
		if err != nil {
			fx.t.Fatalf("AdmittedThreadID(%s, %s): %v", roomID, id, err)
		}
		if !seen && th != nil {
			fx.t.Fatalf("AdmittedThreadID(%s, %s) unseen but thread %q", roomID, id, *th)
		}
		return threadName(th), seen
	}

	t.Run("AnUnseenEventIsReportedAsUnseen", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "hi"))
		if th, seen := lookup(fx, room, "$never"); seen {
			t.Fatalf("unseen event reported in %s", th)
		}
	})

	t.Run("ARoomEventIsInNoThread", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "hi"))
		if th, seen := lookup(fx, room, "$m1"); !seen || th != "<room>" {
			t.Fatalf("got %s, seen %v; want the room", th, seen)
		}
	})

	t.Run("AThreadReplyReportsItsRoot", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$root", alice, 1000, "root"), reply("$r1", bob, 2000, "$root", "reply"))
		if th, seen := lookup(fx, room, "$r1"); !seen || th != "$root" {
			t.Fatalf("got %s, seen %v; want $root", th, seen)
		}
		if th, seen := lookup(fx, room, "$root"); !seen || th != "<room>" {
			t.Fatalf("root: got %s, seen %v; want the room", th, seen)
		}
	})

	t.Run("AReplyWhoseRootNeverArrivedStillReportsIt", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(reply("$r1", bob, 2000, "$missing_root", "reply"))
		if th, seen := lookup(fx, room, "$r1"); !seen || th != "$missing_root" {
			t.Fatalf("got %s, seen %v; want $missing_root", th, seen)
		}
	})

	t.Run("RelationsBelongToTheirTargetsThread", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$root", alice, 1000, "root"), reply("$r1", bob, 2000, "$root", "reply"),
			edit("$e1", bob, 3000, "$r1", "reply, edited"), reaction("$re", alice, 3500, "$r1", "+1"))
		for _, id := range []string{"$e1", "$re"} {
			if th, seen := lookup(fx, room, id); !seen || th != "$root" {
				t.Fatalf("%s: got %s, seen %v; want $root", id, th, seen)
			}
		}
	})

	t.Run("AContextOnlyEventStillAnswers", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.mustAdmit(batch(room, journal.History, reply("$old", alice, 500, "$root", "old reply"))...)
		fx.live(notice("$n", alice, 1000, "fyi"), msg("$echo", botUser, 1001, "mine"), encrypted("$c", alice, 1002))
		want := map[string]string{"$old": "$root", "$n": "<room>", "$echo": "<room>", "$c": "<room>"}
		for id, wantThread := range want {
			if th, seen := lookup(fx, room, id); !seen || th != wantThread {
				t.Fatalf("%s: got %s, seen %v; want %s", id, th, seen, wantThread)
			}
		}
	})

	t.Run("ASettledOrRedactedEventStillAnswers", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$root", alice, 1000, "root"), reply("$r1", bob, 2000, "$root", "reply"),
			reply("$r2", bob, 2001, "$root", "gone"), redaction("$x", bob, 3000, "$r2"))
		fx.settle(fx.v, "$r1")
		for _, id := range []string{"$r1", "$r2"} {
			if th, seen := lookup(fx, room, id); !seen || th != "$root" {
				t.Fatalf("%s: got %s, seen %v; want $root", id, th, seen)
			}
		}
	})

	t.Run("AnotherRoomDoesNotAnswer", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "hi"))
		if th, seen := lookup(fx, otherRoom, "$m1"); seen {
			t.Fatalf("another room reported %s", th)
		}
	})

	t.Run("ARejectedEventIsUnseen", func(t *testing.T) {
		fx := newFixture(t, f)
		bad := msg("$bad", alice, 0, "zero timestamp")
		res := fx.admit(fx.v, batch(room, journal.Live, bad), "")
		if got, want := res[0].Outcome, journal.Rejected; got != want {
			t.Fatalf("outcome = %v, want %v", got, want)
		}
		if th, seen := lookup(fx, room, "$bad"); seen {
			t.Fatalf("rejected event reported in %s", th)
		}
	})

	t.Run("TheAnswerSurvivesARestart", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(reply("$r1", bob, 2000, "$root", "reply"))
		fx.restart()
		if th, seen := lookup(fx, room, "$r1"); !seen || th != "$root" {
			t.Fatalf("got %s, seen %v; want $root", th, seen)
		}
	})
}

// TestLatestVisibleEvent checks which event a reply should relate to: the
// revision on screen of the newest visible message, never a thread's root
// and never a redacted revision.
func TestLatestVisibleEvent(t *testing.T, f Factory) {
	t.Run("AnEmptyConversationHasNoLatestEvent", func(t *testing.T) {
		fx := newFixture(t, f)
		if id, ok := fx.latest(room, nil); ok {
			t.Fatalf("empty room answered %q", id)
		}
		if id, ok := fx.latest(room, ptr("$root")); ok {
			t.Fatalf("empty thread answered %q", id)
		}
	})

	t.Run("TheNewestMessageWinsNotTheLastArrival", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$root", alice, 1000, "root"), reply("$new", bob, 3000, "$root", "newest"),
			reply("$late", alice, 2000, "$root", "arrived last"))
		if got, ok := fx.latest(room, ptr("$root")); !ok || got != "$new" {
			t.Fatalf("latest in thread = %q, %v; want $new", got, ok)
		}
	})

	t.Run("ATimestampTieIsBrokenByEventID", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$abc", alice, 1000, "lower case"), msg("$Zzz", alice, 1000, "upper case"))
		if got, ok := fx.latest(room, nil); !ok || got != "$abc" {
			t.Fatalf("latest = %q, %v; want $abc (byte order)", got, ok)
		}
	})

	t.Run("AnEditedMessageAnswersWithTheRevisionOnScreen", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "v0"), edit("$e1", alice, 2000, "$m1", "v1"), edit("$stranger", mallory, 3000, "$m1", "nope"))
		if got, ok := fx.latest(room, nil); !ok || got != "$e1" {
			t.Fatalf("latest = %q, %v; want $e1", got, ok)
		}
	})

	t.Run("ARedactedRevisionAnswersWithItsLogicalEvent", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "v0"), edit("$e1", alice, 2000, "$m1", "v1"), redaction("$x", alice, 3000, "$e1"))
		if got, ok := fx.latest(room, nil); !ok || got != "$m1" {
			t.Fatalf("latest = %q, %v; want $m1", got, ok)
		}
	})

	t.Run("ARedactedLogicalEventFallsThroughToTheMessageBehindIt", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "older"), edit("$e1", alice, 1500, "$m1", "older, edited"),
			msg("$m2", alice, 2000, "newer"), redaction("$x", alice, 3000, "$m2"))
		if got, ok := fx.latest(room, nil); !ok || got != "$e1" {
			t.Fatalf("latest = %q, %v; want $e1", got, ok)
		}
	})

	t.Run("ARootOnlyThreadHasNoLatestEvent", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$root", alice, 1000, "root"), edit("$e", alice, 1500, "$root", "root, edited"))
		if id, ok := fx.latest(room, ptr("$root")); ok {
			t.Fatalf("root-only thread answered %q", id)
		}
	})

	t.Run("AThreadWhoseRepliesWereRedactedHasNoLatestEvent", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$root", alice, 1000, "root"), reply("$r1", bob, 2000, "$root", "reply"), redaction("$x", bob, 3000, "$r1"))
		if id, ok := fx.latest(room, ptr("$root")); ok {
			t.Fatalf("thread answered %q", id)
		}
	})

	t.Run("AnotherThreadInTheRoomDoesNotAnswer", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$a", alice, 1000, "thread a"), msg("$b", alice, 1001, "thread b"),
			reply("$a1", bob, 2000, "$a", "in a"), reply("$b1", bob, 3000, "$b", "in b"))
		if got, ok := fx.latest(room, ptr("$a")); !ok || got != "$a1" {
			t.Fatalf("latest in $a = %q, %v; want $a1", got, ok)
		}
	})

	t.Run("ThreadRepliesDoNotAnswerForTheRoom", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$root", alice, 1000, "root"), msg("$m2", alice, 1500, "room message"),
			reply("$r1", bob, 5000, "$root", "newest, but threaded"))
		if got, ok := fx.latest(room, nil); !ok || got != "$m2" {
			t.Fatalf("latest in room = %q, %v; want $m2", got, ok)
		}
	})

	t.Run("AnotherRoomDoesNotAnswer", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "here"))
		if id, ok := fx.latest(otherRoom, nil); ok {
			t.Fatalf("another room answered %q", id)
		}
	})

	t.Run("ASidecarMessageAnswersWithTheRevisionOnScreen", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "older"), sidecar("$long", alice, 2000, "preview..."))
		if got, ok := fx.latest(room, nil); !ok || got != "$long" {
			t.Fatalf("latest = %q, %v; want $long", got, ok)
		}
		fx.live(editWith("$e1", alice, 3000, "$long", map[string]any{
			"msgtype": "m.text", "body": "longer preview...", journal.LongTextKey: map[string]any{"version": 2, "encoding": "matrix_event_content_json"},
			"url": "mxc://example.org/sidecar2",
		}))
		if got, ok := fx.latest(room, nil); !ok || got != "$e1" {
			t.Fatalf("latest after a sidecar edit = %q, %v; want $e1", got, ok)
		}
	})

	t.Run("ContextOnlyMessagesCount", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "question"), msg("$echo", botUser, 2000, "my answer"))
		if got, ok := fx.latest(room, nil); !ok || got != "$echo" {
			t.Fatalf("latest = %q, %v; want $echo", got, ok)
		}
	})

	t.Run("ARejoinStopsThePreviousMembershipFromAnswering", func(t *testing.T) {
		fx := newFixture(t, f)
		ctx := context.Background()
		fx.live(msg("$m1", alice, 1000, "before leaving"), msg("$root", alice, 1100, "root"), reply("$r1", bob, 1200, "$root", "reply"))
		if _, err := fx.v.FenceDeparture(ctx, room, journal.DepartureLocal, "leave-1"); err != nil {
			t.Fatalf("FenceDeparture: %v", err)
		}
		if err := fx.v.RecordJoin(ctx, room, "join-1"); err != nil {
			t.Fatalf("RecordJoin: %v", err)
		}
		if id, ok := fx.latest(room, nil); ok {
			t.Fatalf("room answered %q from the previous membership", id)
		}
		if id, ok := fx.latest(room, ptr("$root")); ok {
			t.Fatalf("thread answered %q from the previous membership", id)
		}
		fx.live(msg("$m2", alice, 900, "after rejoining"))
		if got, ok := fx.latest(room, nil); !ok || got != "$m2" {
			t.Fatalf("latest after rejoin = %q, %v; want $m2", got, ok)
		}
	})

	t.Run("TheAnswerSurvivesARestart", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "v0"), edit("$e1", alice, 2000, "$m1", "v1"))
		fx.restart()
		if got, ok := fx.latest(room, nil); !ok || got != "$e1" {
			t.Fatalf("latest after restart = %q, %v; want $e1", got, ok)
		}
	})
}

// TestAdmittedEvent is the lookup of an admitted event by its ID alone.
func TestAdmittedEvent(t *testing.T, f Factory) {
	ctx := context.Background()
	lookup := func(fx *fixture, id string) (journal.AdmittedEvent, bool) {
		fx.t.Helper()
		e, seen, err := fx.v.AdmittedEvent(ctx, id)
		if err != nil {
			fx.t.Fatalf("AdmittedEvent(%s): %v", id, err)
		}
		return e, seen
	}
	t.Run("AnEventIsFoundWithItsRoomThreadAndState", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "hi"), reply("$t1", alice, 1001, "$m1", "in the thread"))
		e, seen := lookup(fx, "$t1")
		if !seen || e.RoomID != room || threadName(e.Thread) != "$m1" || !e.Pending {
			t.Fatalf("$t1 = %+v, %v; want pending in the thread of $m1 in %s", e, seen, room)
		}
		if _, err := fx.v.Settle(ctx, "$m1"); err != nil {
			t.Fatal(err)
		}
		if e, seen := lookup(fx, "$m1"); !seen || e.Pending || e.Thread != nil {
			t.Fatalf("$m1 after settling = %+v, %v; want settled in the room", e, seen)
		}
	})
	t.Run("AnotherPrincipalsEventIsUnseen", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "hi"))
		other := fx.principal("other", "@other:example.org")
		if e, seen, err := other.AdmittedEvent(ctx, "$m1"); err != nil || seen {
			t.Fatalf("another principal's lookup = %+v, %v, %v; want unseen", e, seen, err)
		}
		if _, seen := lookup(fx, "$never"); seen {
			t.Fatal("an event never admitted was found")
		}
	})
}
