package contract

import (
	"slices"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
)

// TestSettlement checks that settling ends an event's turn for good and
// only for the principal that settles it, while the journal keeps its
// identity.
func TestSettlement(t *testing.T, f Factory) {
	t.Run("SettledEventsStayOutOfReplay", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "one"), msg("$m2", alice, 1001, "two"), msg("$m3", alice, 1002, "three"))
		if got, want := fx.settle(fx.v, "$m2"), 1; got != want {
			t.Fatalf("settled %d, want %d", got, want)
		}
		if got, want := fx.pendingIDs(fx.v), []string{"$m1", "$m3"}; !slices.Equal(got, want) {
			t.Fatalf("pending = %v, want %v", got, want)
		}
	})

	t.Run("SettlingCountsEachEventOnce", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "one"), msg("$m2", alice, 1001, "two"))
		if got, want := fx.settle(fx.v, "$m1", "$m2", "$m1"), 2; got != want {
			t.Fatalf("settled %d, want %d", got, want)
		}
		if got, want := fx.settle(fx.v, "$m1", "$m2"), 0; got != want {
			t.Fatalf("settling again changed %d, want %d", got, want)
		}
		if got := fx.pendingIDs(fx.v); len(got) != 0 {
			t.Fatalf("pending = %v, want none", got)
		}
	})

	t.Run("SettlingNothingOrUnknownEventsChangesNothing", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "one"))
		if got, want := fx.settle(fx.v), 0; got != want {
			t.Fatalf("settling nothing changed %d, want %d", got, want)
		}
		if got, want := fx.settle(fx.v, "$never_seen"), 0; got != want {
			t.Fatalf("settling an unknown event changed %d, want %d", got, want)
		}
		if got, want := fx.pendingIDs(fx.v), []string{"$m1"}; !slices.Equal(got, want) {
			t.Fatalf("pending = %v, want %v", got, want)
		}
	})

	t.Run("ASettledEventIsStillADuplicate", func(t *testing.T) {
		fx := newFixture(t, f)
		in := batch(room, journal.Live, msg("$m1", alice, 1000, "one"))
		fx.mustAdmit(in...)
		fx.settle(fx.v, "$m1")
		// The row is the proof the event had its turn: a redelivery must not
		// make it owed again.
		if got, want := outcomes(fx.admit(fx.v, in, "")), "$m1:duplicate"; got != want {
			t.Fatalf("redelivery = %s, want %s", got, want)
		}
		if got := fx.pendingIDs(fx.v); len(got) != 0 {
			t.Fatalf("pending = %v, want none", got)
		}
	})

	t.Run("SettlementSurvivesARestart", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "one"), msg("$m2", alice, 1001, "two"))
		fx.settle(fx.v, "$m1")
		fx.restart()
		if got, want := fx.pendingIDs(fx.v), []string{"$m2"}; !slices.Equal(got, want) {
			t.Fatalf("pending after restart = %v, want %v", got, want)
		}
		if got, want := outcomes(fx.admit(fx.v, batch(room, journal.Live, msg("$m1", alice, 1000, "one")), "")), "$m1:duplicate"; got != want {
			t.Fatalf("redelivery after restart = %s, want %s", got, want)
		}
	})

	t.Run("SettlementLeavesTheConversationAlone", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "one"))
		fx.settle(fx.v, "$m1")
		if got, want := fx.roomScreen(), []string{shown("$m1", "one")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
		// Edits still apply to a message whose turn is over.
		fx.live(edit("$e1", alice, 2000, "$m1", "one, edited"))
		if got, want := fx.roomScreen(), []string{shown("$m1", "one, edited")}; !slices.Equal(got, want) {
			t.Fatalf("room after edit = %v, want %v", got, want)
		}
	})

	t.Run("SettlingIsBoundToItsPrincipal", func(t *testing.T) {
		fx := newFixture(t, f)
		other := fx.principal("other", botUser)
		fx.mustAdmitOn(fx.v, batch(room, journal.Live, msg("$m1", alice, 1000, "one"))...)
		fx.mustAdmitOn(other, batch(room, journal.Live, msg("$m1", alice, 1000, "one"))...)
		if got, want := fx.settle(fx.v, "$m1"), 1; got != want {
			t.Fatalf("settled %d, want %d", got, want)
		}
		if got, want := fx.pendingIDs(other), []string{"$m1"}; !slices.Equal(got, want) {
			t.Fatalf("other principal's pending = %v, want %v", got, want)
		}
	})
}
