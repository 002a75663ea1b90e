package contract

import (
	"context"
	"slices"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
)

// TestUnreadableRowsDoNotEndTheBacklog checks that a pending row whose
// payload does not decode is reported and stepped over: it never hides the
// work behind it and never makes a short page look like the end.
func TestUnreadableRowsDoNotEndTheBacklog(t *testing.T, f Factory) {
	ctx := context.Background()

	// five admits m1..m5 and returns their receipt positions.
	five := func(fx *fixture) map[string]int64 {
		fx.live(msg("$m1", alice, 1000, "1"), msg("$m2", alice, 1001, "2"), msg("$m3", alice, 1002, "3"),
			msg("$m4", alice, 1003, "4"), msg("$m5", alice, 1004, "5"))
		seqs := map[string]int64{}
		for _, e := range fx.pending(fx.v) {
			seqs[e.EventID] = e.Seq
		}
		if len(seqs) != 5 {
			fx.t.Fatalf("pending before corruption = %v, want five events", seqs)
		}
		return seqs
	}

	t.Run("ACorruptRowShortensItsPageWithoutEndingTheBacklog", func(t *testing.T) {
		fx := newFixture(t, f)
		seqs := five(fx)
		fx.b.CorruptPayload(t, fx.v.Principal(), "$m2")

		page, err := fx.v.Pending(ctx, 3, 0)
		if err != nil {
			t.Fatalf("Pending: %v", err)
		}
		if got, want := pendingEventIDs(page), []string{"$m1", "$m3"}; !slices.Equal(got, want) {
			t.Fatalf("first page = %v, want %v", got, want)
		}
		if got, want := len(page.Unreadable), 1; got != want {
			t.Fatalf("first page reports %d unreadable rows, want %d", got, want)
		}
		u := page.Unreadable[0]
		if u.EventID != "$m2" || u.Seq != seqs["$m2"] || u.Err == nil {
			t.Fatalf("unreadable = %+v, want $m2 at %d with an error", u, seqs["$m2"])
		}
		if !page.More || page.Next != seqs["$m3"] {
			t.Fatalf("first page More=%v Next=%d, want true and %d", page.More, page.Next, seqs["$m3"])
		}
		rest, err := fx.v.Pending(ctx, 3, page.Next)
		if err != nil {
			t.Fatalf("Pending: %v", err)
		}
		if got, want := pendingEventIDs(rest), []string{"$m4", "$m5"}; !slices.Equal(got, want) {
			t.Fatalf("second page = %v, want %v", got, want)
		}
		if rest.More || len(rest.Unreadable) != 0 {
			t.Fatalf("second page More=%v unreadable=%v, want the end and none", rest.More, rest.Unreadable)
		}
	})

	t.Run("APageOfNothingButCorruptRowsStillCarriesACursor", func(t *testing.T) {
		fx := newFixture(t, f)
		seqs := five(fx)
		fx.b.CorruptPayload(t, fx.v.Principal(), "$m1")
		fx.b.CorruptPayload(t, fx.v.Principal(), "$m2")

		page, err := fx.v.Pending(ctx, 2, 0)
		if err != nil {
			t.Fatalf("Pending: %v", err)
		}
		if len(page.Events) != 0 {
			t.Fatalf("events = %v, want none", pendingEventIDs(page))
		}
		var bad []string
		for _, u := range page.Unreadable {
			bad = append(bad, u.EventID)
		}
		if want := []string{"$m1", "$m2"}; !slices.Equal(bad, want) {
			t.Fatalf("unreadable = %v, want %v", bad, want)
		}
		if !page.More || page.Next != seqs["$m2"] {
			t.Fatalf("More=%v Next=%d, want true and %d", page.More, page.Next, seqs["$m2"])
		}
		next, err := fx.v.Pending(ctx, 2, page.Next)
		if err != nil {
			t.Fatalf("Pending: %v", err)
		}
		if got, want := pendingEventIDs(next), []string{"$m3", "$m4"}; !slices.Equal(got, want) {
			t.Fatalf("next page = %v, want %v", got, want)
		}
	})

	t.Run("AShortPageStillMeansTheEndOfTheBacklog", func(t *testing.T) {
		fx := newFixture(t, f)
		five(fx)
		fx.b.CorruptPayload(t, fx.v.Principal(), "$m5")
		page, err := fx.v.Pending(ctx, 10, 0)
		if err != nil {
			t.Fatalf("Pending: %v", err)
		}
		if got, want := pendingEventIDs(page), []string{"$m1", "$m2", "$m3", "$m4"}; !slices.Equal(got, want) {
			t.Fatalf("events = %v, want %v", got, want)
		}
		if got, want := len(page.Unreadable), 1; got != want {
			t.Fatalf("unreadable rows = %d, want %d", got, want)
		}
		if page.More {
			t.Fatalf("a short page claims more work")
		}
	})

	t.Run("AnEmptyBacklogIsAShortPage", func(t *testing.T) {
		fx := newFixture(t, f)
		page, err := fx.v.Pending(ctx, 5, 0)
		if err != nil {
			t.Fatalf("Pending: %v", err)
		}
		if page.More || len(page.Events) != 0 || len(page.Unreadable) != 0 || page.Next != 0 {
			t.Fatalf("empty backlog page = %+v, want nothing, Next 0, no more", page)
		}
	})

	t.Run("AnUnreadableRowCanBeSettledAway", func(t *testing.T) {
		fx := newFixture(t, f)
		five(fx)
		fx.b.CorruptPayload(t, fx.v.Principal(), "$m3")
		if got, want := fx.settle(fx.v, "$m3"), 1; got != want {
			t.Fatalf("settled %d, want %d", got, want)
		}
		page, err := fx.v.Pending(ctx, 10, 0)
		if err != nil {
			t.Fatalf("Pending: %v", err)
		}
		if got, want := pendingEventIDs(page), []string{"$m1", "$m2", "$m4", "$m5"}; !slices.Equal(got, want) {
			t.Fatalf("events = %v, want %v", got, want)
		}
		if len(page.Unreadable) != 0 {
			t.Fatalf("unreadable = %+v, want none", page.Unreadable)
		}
	})

	t.Run("CorruptionStaysWithItsPrincipal", func(t *testing.T) {
		fx := newFixture(t, f)
		twin := fx.principal("twin", botUser)
		in := batch(room, journal.Live, msg("$m1", alice, 1000, "1"))
		fx.mustAdmitOn(fx.v, in...)
		fx.mustAdmitOn(twin, in...)
		fx.b.CorruptPayload(t, fx.v.Principal(), "$m1")
		p := fx.pending(twin)
		if len(p) != 1 || string(p[0].Event) != canonicalEvent(t, msg("$m1", alice, 1000, "1"), room) {
			t.Fatalf("twin pending = %+v, want its intact $m1", p)
		}
	})
}
