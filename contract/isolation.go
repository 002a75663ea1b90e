package contract

import (
	"context"
	"slices"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
)

// TestPrincipalIsolation checks that principals sharing one database, even
// one Matrix account, never see or change each other's rows.
func TestPrincipalIsolation(t *testing.T, f Factory) {
	ctx := context.Background()

	t.Run("AViewNamesTheBoundPrincipal", func(t *testing.T) {
		fx := newFixture(t, f)
		if got, want := fx.v.Principal(), (journal.Principal{Agent: agentName, UserID: botUser}); got != want {
			t.Fatalf("Principal() = %+v, want %+v", got, want)
		}
	})

	t.Run("BoundViewsCannotSeeEachOther", func(t *testing.T) {
		fx := newFixture(t, f)
		other := fx.principal("other", alice)
		fx.mustAdmit(reply("$r1", bob, 2000, "$root", "hello").In(room, journal.Live),
			msg("$root", bob, 1000, "root").In(room, journal.Live))

		if got := fx.pendingIDs(other); len(got) != 0 {
			t.Fatalf("other principal's pending = %v, want none", got)
		}
		if got := screen(fx.read(other, room, nil, 10)); len(got) != 0 {
			t.Fatalf("other principal's room = %v, want empty", got)
		}
		if got := screen(fx.read(other, room, ptr("$root"), 10)); len(got) != 0 {
			t.Fatalf("other principal's thread = %v, want empty", got)
		}
		if _, seen, err := other.AdmittedThreadID(ctx, room, "$r1"); err != nil || seen {
			t.Fatalf("other principal AdmittedThreadID = seen %v, err %v; want unseen", seen, err)
		}
		if id, ok, err := other.LatestVisibleEventID(ctx, room, nil); err != nil || ok {
			t.Fatalf("other principal LatestVisibleEventID = %q, %v, %v; want none", id, ok, err)
		}
		// The owner still sees its own rows, so the emptiness above is
		// isolation and not a failed admission.
		if got, want := fx.pendingIDs(fx.v), []string{"$r1", "$root"}; !slices.Equal(got, want) {
			t.Fatalf("owner pending = %v, want %v", got, want)
		}
	})

	t.Run("TwoAgentsOnOneAccountAreTwoPrincipals", func(t *testing.T) {
		fx := newFixture(t, f)
		twin := fx.principal("twin", botUser)
		fx.mustAdmit(msg("$m1", alice, 1000, "for helper").In(room, journal.Live))

		if got := fx.pendingIDs(twin); len(got) != 0 {
			t.Fatalf("twin pending = %v, want none", got)
		}
		if got := screen(fx.read(twin, room, nil, 10)); len(got) != 0 {
			t.Fatalf("twin room = %v, want empty", got)
		}
	})

	t.Run("EachPrincipalAdmitsTheSameEventOnce", func(t *testing.T) {
		fx := newFixture(t, f)
		twin := fx.principal("twin", botUser)
		in := []journal.Inbound{msg("$m1", alice, 1000, "shared").In(room, journal.Live)}
		fx.mustAdmitOn(fx.v, in...)
		fx.mustAdmitOn(twin, in...)
		if got, want := outcomes(fx.admit(twin, in, "")), "$m1:duplicate"; got != want {
			t.Fatalf("second admission by twin = %s, want %s", got, want)
		}
		for _, v := range []journal.PrincipalStore{fx.v, twin} {
			if got, want := fx.pendingIDs(v), []string{"$m1"}; !slices.Equal(got, want) {
				t.Fatalf("%v pending = %v, want %v", v.Principal(), got, want)
			}
		}
	})

	t.Run("SettlingIsBoundToItsPrincipal", func(t *testing.T) {
		fx := newFixture(t, f)
		twin := fx.principal("twin", botUser)
		in := []journal.Inbound{msg("$m1", alice, 1000, "shared").In(room, journal.Live)}
		fx.mustAdmitOn(fx.v, in...)
		fx.mustAdmitOn(twin, in...)

		if got, want := fx.settle(twin, "$m1"), 1; got != want {
			t.Fatalf("twin settled %d, want %d", got, want)
		}
		if got, want := fx.pendingIDs(fx.v), []string{"$m1"}; !slices.Equal(got, want) {
			t.Fatalf("owner pending after twin settled = %v, want %v", got, want)
		}
		if got := fx.pendingIDs(twin); len(got) != 0 {
			t.Fatalf("twin pending = %v, want none", got)
		}
	})

	t.Run("SettlingAnotherPrincipalsEventChangesNothing", func(t *testing.T) {
		fx := newFixture(t, f)
		other := fx.principal("other", alice)
		fx.mustAdmit(msg("$m1", bob, 1000, "mine").In(room, journal.Live))

		if got, want := fx.settle(other, "$m1"), 0; got != want {
			t.Fatalf("other settled %d, want %d", got, want)
		}
		if got, want := fx.pendingIDs(fx.v), []string{"$m1"}; !slices.Equal(got, want) {
			t.Fatalf("owner pending = %v, want %v", got, want)
		}
	})

	t.Run("EditsAndRedactionsOfOnePrincipalDoNotReachAnother", func(t *testing.T) {
		fx := newFixture(t, f)
		twin := fx.principal("twin", botUser)
		fx.mustAdmitOn(fx.v, msg("$m1", alice, 1000, "one").In(room, journal.Live), msg("$m2", alice, 1001, "two").In(room, journal.Live))
		fx.mustAdmitOn(twin, msg("$m1", alice, 1000, "one").In(room, journal.Live), msg("$m2", alice, 1001, "two").In(room, journal.Live))
		fx.mustAdmitOn(twin, edit("$e1", alice, 2000, "$m1", "changed").In(room, journal.Live),
			redaction("$x1", alice, 2001, "$m2").In(room, journal.Live))

		if got, want := screen(fx.read(fx.v, room, nil, 10)), []string{shown("$m1", "one"), shown("$m2", "two")}; !slices.Equal(got, want) {
			t.Fatalf("owner room = %v, want %v", got, want)
		}
		if got, want := screen(fx.read(twin, room, nil, 10)), []string{shown("$m1", "changed")}; !slices.Equal(got, want) {
			t.Fatalf("twin room = %v, want %v", got, want)
		}
		if got, want := fx.pendingIDs(fx.v), []string{"$m1", "$m2"}; !slices.Equal(got, want) {
			t.Fatalf("owner pending = %v, want %v", got, want)
		}
	})

	t.Run("SyncTokensAreKeptPerPrincipal", func(t *testing.T) {
		fx := newFixture(t, f)
		twin := fx.principal("twin", botUser)
		fx.admit(fx.v, nil, "s_helper")
		fx.admit(twin, nil, "s_twin")
		for v, want := range map[journal.PrincipalStore]string{fx.v: "s_helper", twin: "s_twin"} {
			got, err := v.SyncToken(ctx)
			if err != nil {
				t.Fatalf("SyncToken: %v", err)
			}
			if got != want {
				t.Fatalf("%v sync token = %q, want %q", v.Principal(), got, want)
			}
		}
	})

	t.Run("IsolationSurvivesARestart", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.mustAdmit(msg("$m1", alice, 1000, "mine").In(room, journal.Live))
		fx.restart()
		twin := fx.principal("twin", botUser)
		if got := fx.pendingIDs(twin); len(got) != 0 {
			t.Fatalf("twin pending after restart = %v, want none", got)
		}
		if got, want := fx.pendingIDs(fx.v), []string{"$m1"}; !slices.Equal(got, want) {
			t.Fatalf("owner pending after restart = %v, want %v", got, want)
		}
	})
}
