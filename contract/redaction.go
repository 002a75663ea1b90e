package contract

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
)

// TestRedaction checks that redacted content never comes back: the
// tombstone is written before anything it could block, a redacted revision
// on screen leaves a refetch debt instead of its body, and a redacted turn
// source is no longer owed an answer.
func TestRedaction(t *testing.T, f Factory) {
	ctx := context.Background()

	t.Run("ARedactedPendingSourceIsSettled/InALaterBatch", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "oops"), redaction("$x1", alice, 2000, "$m1"))
		if got, want := fx.pendingIDs(fx.v), []string{"$x1"}; !slices.Equal(got, want) {
			t.Fatalf("pending = %v, want %v", got, want)
		}
	})

	t.Run("ARedactedPendingSourceIsSettled/InTheSameBatch", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.mustAdmit(batch(room, journal.Live, msg("$m1", alice, 1000, "oops"), redaction("$x1", alice, 2000, "$m1"))...)
		if got, want := fx.pendingIDs(fx.v), []string{"$x1"}; !slices.Equal(got, want) {
			t.Fatalf("pending = %v, want %v", got, want)
		}
	})

	t.Run("ARedactedPendingSourceIsSettled/WhenTheRedactionCameFirst", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(redaction("$x1", alice, 2000, "$m1"), msg("$m1", alice, 1000, "oops"))
		if got, want := fx.pendingIDs(fx.v), []string{"$x1"}; !slices.Equal(got, want) {
			t.Fatalf("pending = %v, want %v", got, want)
		}
	})

	t.Run("ARedactedPendingSourceIsSettled/AReactionRedactedBeforeItArrives", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", bob, 1000, "hi"), redaction("$x1", alice, 2000, "$r1"), reaction("$r1", alice, 1500, "$m1", "+1"))
		if got, want := fx.pendingIDs(fx.v), []string{"$m1", "$x1"}; !slices.Equal(got, want) {
			t.Fatalf("pending = %v, want %v", got, want)
		}
	})

	t.Run("ARedactedPendingSourceIsSettled/Media", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(image("$img", alice, 1000), redaction("$x1", alice, 2000, "$img"))
		if got, want := fx.pendingIDs(fx.v), []string{"$x1"}; !slices.Equal(got, want) {
			t.Fatalf("pending = %v, want %v", got, want)
		}
	})

	t.Run("ARedactedReactionIsSettled", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", bob, 1000, "hi"), reaction("$r1", alice, 1500, "$m1", "+1"), redaction("$x1", alice, 2000, "$r1"))
		if got, want := fx.pendingIDs(fx.v), []string{"$m1", "$x1"}; !slices.Equal(got, want) {
			t.Fatalf("pending = %v, want %v", got, want)
		}
	})

	t.Run("RedactionSettlementLeavesOtherPendingWorkUnchanged", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "one"), msg("$m2", alice, 1001, "two"), msg("$m3", bob, 1002, "three"),
			redaction("$x1", alice, 2000, "$m2"))
		if got, want := fx.pendingIDs(fx.v), []string{"$m1", "$m3", "$x1"}; !slices.Equal(got, want) {
			t.Fatalf("pending = %v, want %v", got, want)
		}
	})

	t.Run("ARedactionInAnotherRoomTouchesNothingHere", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "stays"))
		fx.mustAdmit(redaction("$x1", alice, 2000, "$m1").In(otherRoom, journal.Live))
		if got, want := fx.roomScreen(), []string{shown("$m1", "stays")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
		if got, want := fx.pendingIDs(fx.v), []string{"$m1", "$x1"}; !slices.Equal(got, want) {
			t.Fatalf("pending = %v, want %v", got, want)
		}
	})

	t.Run("RedactingTheOriginalRemovesTheMessage", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "keep"), msg("$m2", alice, 1001, "remove"),
			edit("$e2", alice, 1500, "$m2", "remove, edited"), redaction("$x1", alice, 2000, "$m2"))
		page := fx.read(fx.v, room, nil, 10)
		if got, want := screen(page), []string{shown("$m1", "keep")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
		if got := owed(page); len(got) != 0 {
			t.Fatalf("owed refetch = %v, want none", got)
		}
	})

	t.Run("ARedactedOriginalCannotBeResurrected", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "secret"), redaction("$x1", alice, 2000, "$m1"),
			edit("$e1", alice, 3000, "$m1", "secret, edited"))
		// Hydration may bring the original back as history.
		fx.admit(fx.v, batch(room, journal.History, msg("$m1", alice, 1000, "secret")), "")
		if got := fx.roomScreen(); len(got) != 0 {
			t.Fatalf("room = %v, want empty", got)
		}
		if id, ok := fx.latest(room, nil); ok {
			t.Fatalf("latest = %q, want none", id)
		}
	})

	t.Run("AnOriginalRedactedBeforeItArrivesNeverShows", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(redaction("$x1", alice, 2000, "$m1"), msg("$m1", alice, 1000, "secret"))
		page := fx.read(fx.v, room, nil, 10)
		if got := screen(page); len(got) != 0 {
			t.Fatalf("room = %v, want empty", got)
		}
		if got := owed(page); len(got) != 0 {
			t.Fatalf("owed refetch = %v, want none", got)
		}
	})

	t.Run("ARedactedEditCannotBeResurrected", func(t *testing.T) {
		// The redacted words are never served. The edit arriving after its
		// redaction still takes its place as the newest revision, bodiless,
		// as if it had come first: the message owes a refetch rather than
		// falling back to the older "draft", which the server no longer
		// shows either.
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "draft"), redaction("$x1", alice, 2000, "$e1"),
			edit("$e1", alice, 3000, "$m1", "redacted words"))
		page := fx.read(fx.v, room, nil, 10)
		if got := screen(page); len(got) != 0 {
			t.Fatalf("room = %v, want nothing served", got)
		}
		if got, want := owed(page), []string{"$m1"}; !slices.Equal(got, want) {
			t.Fatalf("owed refetch = %v, want %v", got, want)
		}
	})

	t.Run("ARedactedEditHasOneEffectWhateverTheArrivalOrder", func(t *testing.T) {
		events := []event{msg("$Z1", alice, 1000, "original"), edit("$ZA0", alice, 1003, "$Z1", "edited"),
			redaction("$X", alice, 1004, "$ZA0")}
		for _, order := range [][]int{{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}} {
			fx := newFixture(t, f)
			for _, i := range order {
				fx.live(events[i])
			}
			page := fx.read(fx.v, room, nil, 10)
			if got := screen(page); len(got) != 0 {
				t.Fatalf("order %v: room = %v, want nothing served", order, got)
			}
			if got, want := owed(page), []string{"$Z1"}; !slices.Equal(got, want) {
				t.Fatalf("order %v: owed refetch = %v, want %v", order, got, want)
			}
		}
	})

	t.Run("AnOlderEditNeverReplacesARedactedNewerOne", func(t *testing.T) {
		// Two edits in one millisecond, ordered by event ID; the newer one is
		// redacted before it arrives.
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "original"), redaction("$x1", alice, 3000, "$e2"),
			edit("$e2", alice, 2000, "$m1", "newer"), edit("$e1", alice, 2000, "$m1", "older"))
		page := fx.read(fx.v, room, nil, 10)
		if got := screen(page); len(got) != 0 {
			t.Fatalf("room = %v, want nothing served", got)
		}
		if got, want := owed(page), []string{"$m1"}; !slices.Equal(got, want) {
			t.Fatalf("owed refetch = %v, want %v", got, want)
		}
	})

	t.Run("AnEditRedactedBeforeItsTargetArrivesIsHeldBodiless", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(redaction("$x1", alice, 3000, "$e1"), edit("$e1", alice, 2000, "$m1", "redacted words"),
			msg("$m1", alice, 1000, "draft"))
		page := fx.read(fx.v, room, nil, 10)
		if got := screen(page); len(got) != 0 {
			t.Fatalf("room = %v, want nothing served", got)
		}
		if got, want := owed(page), []string{"$m1"}; !slices.Equal(got, want) {
			t.Fatalf("owed refetch = %v, want %v", got, want)
		}
	})

	t.Run("RedactingATargetThatNeverArrivedDropsItsHeldEdit", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(edit("$e1", alice, 1500, "$m1", "held words"), redaction("$x1", alice, 2000, "$m1"),
			msg("$m1", alice, 1000, "late original"))
		page := fx.read(fx.v, room, nil, 10)
		if got := screen(page); len(got) != 0 {
			t.Fatalf("room = %v, want empty", got)
		}
		if got := owed(page); len(got) != 0 {
			t.Fatalf("owed refetch = %v, want none", got)
		}
	})

	t.Run("AHeldEditNeverCoexistsWithAVisibleTarget", func(t *testing.T) {
		fx := newFixture(t, f)
		// Once the original lands, the held edit is the revision on screen,
		// not a held row any more: redacting it must clear the body.
		fx.live(edit("$e1", alice, 2000, "$m1", "held"), msg("$m1", alice, 1000, "draft"))
		if got, want := fx.roomScreen(), []string{shown("$m1", "held")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
		fx.live(redaction("$x1", alice, 3000, "$e1"))
		page := fx.read(fx.v, room, nil, 10)
		if got := screen(page); len(got) != 0 {
			t.Fatalf("room = %v, want empty", got)
		}
		if got, want := owed(page), []string{"$m1"}; !slices.Equal(got, want) {
			t.Fatalf("owed refetch = %v, want %v", got, want)
		}
	})

	t.Run("RedactingASupersededEditChangesNothing", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "v0"), edit("$e1", alice, 2000, "$m1", "v1"), edit("$e2", alice, 3000, "$m1", "v2"),
			redaction("$x1", alice, 4000, "$e1"))
		page := fx.read(fx.v, room, nil, 10)
		if got, want := screen(page), []string{shown("$m1", "v2")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
		if got := owed(page); len(got) != 0 {
			t.Fatalf("owed refetch = %v, want none", got)
		}
	})

	t.Run("RedactingTheVisibleEditHidesItAndAsksForARefetch", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m0", bob, 500, "before"), msg("$m1", alice, 1000, "v0"), edit("$e1", alice, 2000, "$m1", "v1"),
			redaction("$x1", alice, 3000, "$e1"))
		page := fx.read(fx.v, room, nil, 10)
		if got, want := screen(page), []string{shown("$m0", "before")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
		if got, want := owed(page), []string{"$m1"}; !slices.Equal(got, want) {
			t.Fatalf("owed refetch = %v, want %v", got, want)
		}
	})

	t.Run("NoReadOfAnyKindReturnsTheRedactedRevision", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$root", bob, 500, "root"),
			reply("$r1", alice, 1000, "$root", "v0"),
			reply("$r2", bob, 1100, "$root", "newer reply"),
			edit("$e1", alice, 2000, "$r1", "the words to forget"),
			redaction("$x1", alice, 3000, "$e1"))

		thread := fx.read(fx.v, room, ptr("$root"), 10)
		if got, want := screen(thread), []string{shown("$root", "root"), shownReply("$r2", "$root", "newer reply")}; !slices.Equal(got, want) {
			t.Fatalf("thread = %v, want %v", got, want)
		}
		if got, want := owed(thread), []string{"$r1"}; !slices.Equal(got, want) {
			t.Fatalf("thread owed refetch = %v, want %v", got, want)
		}
		// Walk the thread one message per page so the redacted row is met
		// behind a cursor too.
		var walked, walkedOwed []string
		req := journal.ReadRequest{RoomID: room, Thread: ptr("$root"), Limit: 1}
		for range 10 {
			page, err := fx.v.Read(ctx, req)
			if err != nil {
				t.Fatalf("Read: %v", err)
			}
			walked = append(walked, screen(page)...)
			walkedOwed = append(walkedOwed, page.OwedRefetch...)
			if page.NextCursor == nil {
				break
			}
			req.Before = page.NextCursor
		}
		if want := []string{shownReply("$r2", "$root", "newer reply"), shown("$root", "root")}; !slices.Equal(walked, want) {
			t.Fatalf("paged thread = %v, want %v", walked, want)
		}
		if want := []string{"$r1"}; !slices.Equal(walkedOwed, want) {
			t.Fatalf("paged owed refetch = %v, want %v", walkedOwed, want)
		}
		for _, s := range screen(fx.read(fx.v, room, nil, 10)) {
			if strings.Contains(s, "the words to forget") {
				t.Fatalf("the room read returned %s", s)
			}
		}
		if got, ok := fx.latest(room, ptr("$root")); !ok || got != "$r2" {
			t.Fatalf("latest in thread = %q, %v; want $r2", got, ok)
		}
	})

	t.Run("TheRefreshDebtSurvivesARestart", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "v0"), edit("$e1", alice, 2000, "$m1", "v1"), redaction("$x1", alice, 3000, "$e1"))
		fx.restart()
		page := fx.read(fx.v, room, nil, 10)
		if got := screen(page); len(got) != 0 {
			t.Fatalf("room after restart = %v, want empty", got)
		}
		if got, want := owed(page), []string{"$m1"}; !slices.Equal(got, want) {
			t.Fatalf("owed refetch after restart = %v, want %v", got, want)
		}
	})

	t.Run("ANewerEditPutsABodyBackAfterARedactedRevision", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "v0"), edit("$e1", alice, 2000, "$m1", "v1"), redaction("$x1", alice, 3000, "$e1"),
			edit("$e2", alice, 4000, "$m1", "v2"))
		page := fx.read(fx.v, room, nil, 10)
		if got, want := screen(page), []string{shown("$m1", "v2")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
		if got := owed(page); len(got) != 0 {
			t.Fatalf("owed refetch = %v, want none", got)
		}
	})

	t.Run("AnOlderEditCannotSettleTheRefreshDebt", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "v0"), edit("$e2", alice, 3000, "$m1", "v2"), redaction("$x1", alice, 3500, "$e2"),
			edit("$e1", alice, 2000, "$m1", "v1 arriving late"))
		page := fx.read(fx.v, room, nil, 10)
		if got := screen(page); len(got) != 0 {
			t.Fatalf("room = %v, want empty", got)
		}
		if got, want := owed(page), []string{"$m1"}; !slices.Equal(got, want) {
			t.Fatalf("owed refetch = %v, want %v", got, want)
		}
	})

	t.Run("RedactingAHeldEditKeepsItsOrderingButNotItsBody", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(edit("$e2", alice, 3000, "$m1", "v2"), redaction("$x1", alice, 3500, "$e2"),
			// An older edit must not take the held slot: the redacted edit is
			// still the newest revision the author made.
			edit("$e1", alice, 2000, "$m1", "v1"),
			msg("$m1", alice, 1000, "v0"))
		page := fx.read(fx.v, room, nil, 10)
		if got := screen(page); len(got) != 0 {
			t.Fatalf("room = %v, want empty", got)
		}
		if got, want := owed(page), []string{"$m1"}; !slices.Equal(got, want) {
			t.Fatalf("owed refetch = %v, want %v", got, want)
		}
		if got, ok := fx.latest(room, nil); !ok || got != "$m1" {
			t.Fatalf("latest = %q, %v; want the logical $m1", got, ok)
		}
	})

	t.Run("ANewerHeldEditReplacesARedactedHeldEdit", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(edit("$e1", alice, 2000, "$m1", "v1"), redaction("$x1", alice, 2500, "$e1"),
			edit("$e2", alice, 3000, "$m1", "v2"), msg("$m1", alice, 1000, "v0"))
		page := fx.read(fx.v, room, nil, 10)
		if got, want := screen(page), []string{shown("$m1", "v2")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
		if got := owed(page); len(got) != 0 {
			t.Fatalf("owed refetch = %v, want none", got)
		}
	})

	t.Run("ARedactionIsItselfOwedItsTurn", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "hi"))
		res := fx.admit(fx.v, batch(room, journal.Live, redaction("$x1", alice, 2000, "$m1")), "")
		if got, want := outcomes(res), "$x1:admitted/actionable"; got != want {
			t.Fatalf("outcome = %s, want %s", got, want)
		}
		p := fx.pending(fx.v)
		if len(p) != 1 || p[0].EventID != "$x1" || p[0].Kind != journal.KindRedaction {
			t.Fatalf("pending = %+v, want the one redaction $x1", p)
		}
	})

	t.Run("RedactionsInTheRoomV11ShapeAlsoApply", func(t *testing.T) {
		fx := newFixture(t, f)
		// Room version 11 moved redacts into the content.
		v11 := redaction("$x1", alice, 2000, "$m1").With("redacts", nil)
		fx.live(msg("$m0", alice, 500, "keep"), msg("$m1", alice, 1000, "remove"), v11)
		if got, want := fx.roomScreen(), []string{shown("$m0", "keep")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
		if got, want := fx.pendingIDs(fx.v), []string{"$m0", "$x1"}; !slices.Equal(got, want) {
			t.Fatalf("pending = %v, want %v", got, want)
		}
	})

	t.Run("TheAgentsOwnRedactionStillRemovesTheMessage", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", botUser, 1000, "said too much"), redaction("$x1", botUser, 2000, "$m1"))
		if got := fx.roomScreen(); len(got) != 0 {
			t.Fatalf("room = %v, want empty", got)
		}
		if got := fx.pendingIDs(fx.v); len(got) != 0 {
			t.Fatalf("pending = %v, want none", got)
		}
	})
}
