package contract

import (
	"context"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
)

// TestStoreGeneration checks that a database has one identity, minted when
// it is created and kept for its life, so caches keyed by it can tell a
// restored or replaced database from the one they knew.
func TestStoreGeneration(t *testing.T, f Factory) {
	ctx := context.Background()
	generation := func(t *testing.T, s journal.Store) string {
		t.Helper()
		g, err := s.Generation(ctx)
		if err != nil {
			t.Fatalf("Generation: %v", err)
		}
		if g == "" {
			t.Fatalf("Generation is empty")
		}
		return g
	}

	t.Run("TheGenerationIsMintedOnceAndThenKept", func(t *testing.T) {
		fx := newFixture(t, f)
		first := generation(t, fx.s)
		if got := generation(t, fx.s); got != first {
			t.Fatalf("second read = %q, want %q", got, first)
		}
		fx.restart()
		if got := generation(t, fx.s); got != first {
			t.Fatalf("after restart = %q, want %q", got, first)
		}
	})

	t.Run("ADifferentDatabaseHasADifferentGeneration", func(t *testing.T) {
		one, two := newFixture(t, f), newFixture(t, f)
		if g1, g2 := generation(t, one.s), generation(t, two.s); g1 == g2 {
			t.Fatalf("two databases share generation %q", g1)
		}
	})

	t.Run("TheGenerationBelongsToTheDatabaseNotAPrincipal", func(t *testing.T) {
		fx := newFixture(t, f)
		before := generation(t, fx.s)
		other := fx.principal("other", alice)
		fx.mustAdmitOn(other, batch(room, journal.Live, msg("$m1", bob, 1000, "hi"))...)
		fx.mustAdmit(batch(room, journal.Live, msg("$m1", bob, 1000, "hi"))...)
		if got := generation(t, fx.s); got != before {
			t.Fatalf("generation after principals wrote = %q, want %q", got, before)
		}
	})
}
