package contract

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
)

// redactedCopy is an event as the server hands it over after its
// redaction: content stripped, relation and all.
func redactedCopy(id, sender string, ts int64) event {
	return event{"event_id": id, "type": "m.room.message", "sender": sender, "origin_server_ts": ts,
		"content": map[string]any{}, "unsigned": map[string]any{"redacted_because": map[string]any{"type": "m.room.redaction"}}}
}

// epoch reads the room's current membership epoch on the default view.
func (fx *fixture) epoch() int64 {
	fx.t.Helper()
	e, _, err := fx.v.RoomEpoch(context.Background(), room)
	if err != nil {
		fx.t.Fatalf("RoomEpoch: %v", err)
	}
	return e
}

// history installs evs as one chunk of room history fetched under epoch.
func (fx *fixture) history(epoch int64, evs ...event) (journal.HistoryResult, error) {
	fx.t.Helper()
	return fx.v.InstallHistory(context.Background(), room, epoch, batch(room, journal.History, evs...))
}

func (fx *fixture) mustHistory(evs ...event) journal.HistoryResult {
	fx.t.Helper()
	res, err := fx.history(fx.epoch(), evs...)
	if err != nil {
		fx.t.Fatalf("InstallHistory: %v", err)
	}
	return res
}

func (fx *fixture) covered(thread *string) bool {
	fx.t.Helper()
	ok, err := fx.v.Covered(context.Background(), room, thread)
	if err != nil {
		fx.t.Fatalf("Covered: %v", err)
	}
	return ok
}

func (fx *fixture) fenceAndRejoin() {
	fx.t.Helper()
	ctx := context.Background()
	if _, err := fx.v.FenceDeparture(ctx, room, journal.DepartureReported, ""); err != nil {
		fx.t.Fatalf("FenceDeparture: %v", err)
	}
	if err := fx.v.RecordJoin(ctx, room, ""); err != nil {
		fx.t.Fatalf("RecordJoin: %v", err)
	}
}

func (fx *fixture) debt(eventID string) journal.RefreshDebt {
	fx.t.Helper()
	d, ok, err := fx.v.RefreshDebt(context.Background(), room, eventID)
	if err != nil || !ok {
		fx.t.Fatalf("RefreshDebt(%s) = %v, %v; want a debt", eventID, ok, err)
	}
	return d
}

// refetched parses the server's copy of a message for a refetch.
func refetched(t *testing.T, d journal.RefreshDebt, original event, edits ...event) journal.Refetched {
	t.Helper()
	parse := func(e event) *journal.Event {
		ev, err := journal.ParseEvent(e.In(room, journal.History), time.Now())
		if err != nil {
			t.Fatalf("parse %v: %v", e["event_id"], err)
		}
		return ev
	}
	r := journal.Refetched{Debt: d, Original: parse(original)}
	for _, e := range edits {
		r.Edits = append(r.Edits, parse(e))
	}
	return r
}

// TestHydration checks what hydration installs: history that is never
// work, fenced by the membership it was fetched under, rebuilding a
// rejoined room, and the point refetch that pays a refresh debt.
func TestHydration(t *testing.T, f Factory) {
	t.Run("HistoryIsShownAndNeverOfferedAsWork", func(t *testing.T) {
		fx := newFixture(t, f)
		// A backward walk hands over the newest first: the edit before its
		// original.
		res := fx.mustHistory(edit("$e", alice, 3000, "$a", "a2"), msg("$b", bob, 2000, "b"), msg("$a", alice, 1000, "a"))
		same(t, "result", res, journal.HistoryResult{Admitted: 3})
		same(t, "screen", fx.roomScreen(), []string{shown("$a", "a2"), shown("$b", "b")})
		same(t, "pending", fx.pendingIDs(fx.v), []string{})
		fx.restart()
		same(t, "pending after a restart", fx.pendingIDs(fx.v), []string{})
	})

	t.Run("HistoryDoesNotTouchLiveWork", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$q", alice, 2000, "question"))
		res := fx.mustHistory(msg("$q", alice, 2000, "question"), msg("$old", alice, 1000, "old"))
		same(t, "result", res, journal.HistoryResult{Admitted: 1, Known: 1})
		same(t, "pending", fx.pendingIDs(fx.v), []string{"$q"})
		same(t, "screen", fx.roomScreen(), []string{shown("$old", "old"), shown("$q", "question")})
	})

	t.Run("AChunkFetchedUnderAnEndedMembershipIsRefused", func(t *testing.T) {
		fx := newFixture(t, f)
		before := fx.epoch()
		fx.fenceAndRejoin()
		_, err := fx.history(before, msg("$a", alice, 1000, "a"))
		if !errors.Is(err, journal.ErrMembershipEnded) {
			t.Fatalf("InstallHistory under the ended epoch: %v, want ErrMembershipEnded", err)
		}
		if err := fx.v.MarkCovered(context.Background(), room, nil, before); !errors.Is(err, journal.ErrMembershipEnded) {
			t.Fatalf("MarkCovered under the ended epoch: %v, want ErrMembershipEnded", err)
		}
		same(t, "screen", fx.roomScreen(), []string{})
		same(t, "covered", fx.covered(nil), false)
	})

	t.Run("NothingIsInstalledWhileOutOfTheRoom", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$a", alice, 1000, "a"))
		if _, err := fx.v.FenceDeparture(context.Background(), room, journal.DepartureReported, ""); err != nil {
			t.Fatal(err)
		}
		if _, err := fx.history(fx.epoch(), msg("$b", alice, 2000, "b")); !errors.Is(err, journal.ErrMembershipEnded) {
			t.Fatalf("InstallHistory while departed: %v, want ErrMembershipEnded", err)
		}
	})

	t.Run("HistoryAfterARejoinRebuildsWhatTheJournalAlreadyHeld", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$a", alice, 1000, "a"), edit("$e", alice, 1500, "$a", "a2"), msg("$q", bob, 2000, "unanswered"))
		fx.fenceAndRejoin()
		same(t, "screen after the rejoin", fx.roomScreen(), []string{})
		same(t, "pending after the rejoin", fx.pendingIDs(fx.v), []string{})
		res := fx.mustHistory(msg("$q", bob, 2000, "unanswered"), edit("$e", alice, 1500, "$a", "a2"), msg("$a", alice, 1000, "a"))
		same(t, "result", res, journal.HistoryResult{Known: 3})
		same(t, "screen", fx.roomScreen(), []string{shown("$a", "a2"), shown("$q", "unanswered")})
		same(t, "pending", fx.pendingIDs(fx.v), []string{})
		// The same chunk again changes nothing.
		fx.mustHistory(msg("$q", bob, 2000, "unanswered"), edit("$e", alice, 1500, "$a", "a2"), msg("$a", alice, 1000, "a"))
		same(t, "screen again", fx.roomScreen(), []string{shown("$a", "a2"), shown("$q", "unanswered")})
	})

	t.Run("ARedactedCopyInHistoryTakesItsMessageDown", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$a", alice, 1000, "a"), msg("$b", alice, 2000, "b"))
		fx.mustHistory(redactedCopy("$b", alice, 2000), msg("$a", alice, 1000, "a"))
		same(t, "screen", fx.roomScreen(), []string{shown("$a", "a")})
		fx.live(msg("$c", alice, 3000, "c"))
		same(t, "screen", fx.roomScreen(), []string{shown("$a", "a"), shown("$c", "c")})
	})

	t.Run("CoverageIsPerConversationAndEndsWithTheMembership", func(t *testing.T) {
		fx := newFixture(t, f)
		ctx := context.Background()
		root := "$root"
		same(t, "cold", fx.covered(nil), false)
		if err := fx.v.MarkCovered(ctx, room, nil, fx.epoch()); err != nil {
			t.Fatal(err)
		}
		same(t, "room covered", fx.covered(nil), true)
		same(t, "thread covered", fx.covered(&root), false)
		if err := fx.v.MarkCovered(ctx, room, &root, fx.epoch()); err != nil {
			t.Fatal(err)
		}
		fx.restart()
		same(t, "after a restart", []bool{fx.covered(nil), fx.covered(&root)}, []bool{true, true})
		fx.fenceAndRejoin()
		same(t, "after a rejoin", []bool{fx.covered(nil), fx.covered(&root)}, []bool{false, false})
	})

	t.Run("TheRefetchInstallsTheServersRevision", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m", alice, 1000, "hi"), edit("$e1", alice, 2000, "$m", "one"), edit("$e2", alice, 3000, "$m", "two"),
			redaction("$x", alice, 4000, "$e2"))
		same(t, "owed", owed(fx.read(fx.v, room, nil, 10)), []string{"$m"})
		d := fx.debt("$m")
		outcome, err := fx.v.ApplyRefetch(context.Background(), refetched(t, d, msg("$m", alice, 1000, "hi"),
			edit("$e1", alice, 2000, "$m", "one"), redactedCopy("$e2", alice, 3000)))
		same(t, "outcome", []any{outcome, err}, []any{journal.RefetchInstalled, error(nil)})
		same(t, "screen", fx.roomScreen(), []string{shown("$m", "one")})
		if _, ok, err := fx.v.RefreshDebt(context.Background(), room, "$m"); ok || err != nil {
			t.Fatalf("a paid debt is still owed (%v, %v)", ok, err)
		}
		// A second answer to the same debt finds it paid.
		outcome, err = fx.v.ApplyRefetch(context.Background(), refetched(t, d, msg("$m", alice, 1000, "hi")))
		same(t, "second outcome", []any{outcome, err}, []any{journal.RefetchSuperseded, error(nil)})
		same(t, "screen", fx.roomScreen(), []string{shown("$m", "one")})
	})

	t.Run("ANewerEditWinsOverARefetchInFlight", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m", alice, 1000, "hi"), edit("$e1", alice, 2000, "$m", "one"), redaction("$x", alice, 3000, "$e1"))
		d := fx.debt("$m")
		fx.live(edit("$e2", alice, 4000, "$m", "newer"))
		outcome, err := fx.v.ApplyRefetch(context.Background(), refetched(t, d, msg("$m", alice, 1000, "hi")))
		same(t, "outcome", []any{outcome, err}, []any{journal.RefetchSuperseded, error(nil)})
		same(t, "screen", fx.roomScreen(), []string{shown("$m", "newer")})
	})

	t.Run("ARevisionRedactedHereIsRefusedAndTheDebtKept", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m", alice, 1000, "hi"), edit("$e1", alice, 2000, "$m", "one"), redaction("$x", alice, 3000, "$e1"))
		d := fx.debt("$m")
		// The server has not applied the redaction yet.
		_, err := fx.v.ApplyRefetch(context.Background(), refetched(t, d, msg("$m", alice, 1000, "hi"), edit("$e1", alice, 2000, "$m", "one")))
		if !errors.Is(err, journal.ErrRefetchRefused) {
			t.Fatalf("ApplyRefetch: %v, want ErrRefetchRefused", err)
		}
		same(t, "owed", owed(fx.read(fx.v, room, nil, 10)), []string{"$m"})
		same(t, "debt kept", fx.debt("$m"), d)
	})

	t.Run("AFenceBetweenReadingTheDebtAndInstallingWins", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m", alice, 1000, "hi"), edit("$e1", alice, 2000, "$m", "one"), redaction("$x", alice, 3000, "$e1"))
		d := fx.debt("$m")
		fx.fenceAndRejoin()
		fx.mustHistory(redactedCopy("$e1", alice, 2000), msg("$m", alice, 1000, "hi"))
		outcome, err := fx.v.ApplyRefetch(context.Background(), refetched(t, d, msg("$m", alice, 1000, "stale")))
		same(t, "outcome", []any{outcome, err}, []any{journal.RefetchSuperseded, error(nil)})
		if got := fx.roomScreen(); !slices.Equal(got, []string{shown("$m", "hi")}) {
			t.Fatalf("screen = %v", got)
		}
	})

	t.Run("AnEditARefetchInstalledIsTakenDownByItsRedaction", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(sidecar("$m", alice, 1000, "preview"))
		d := fx.debt("$m")
		// The server holds an edit the journal never saw.
		outcome, err := fx.v.ApplyRefetch(context.Background(), refetched(t, d, sidecar("$m", alice, 1000, "preview"),
			edit("$e", alice, 2000, "$m", "secret")))
		same(t, "outcome", []any{outcome, err}, []any{journal.RefetchInstalled, error(nil)})
		same(t, "screen", fx.roomScreen(), []string{shown("$m", "secret")})
		fx.live(redaction("$x", bob, 3000, "$e"))
		same(t, "screen after the redaction", fx.roomScreen(), []string{})
		same(t, "owed", owed(fx.read(fx.v, room, nil, 10)), []string{"$m"})
		// The edit arriving late is known already, and changes nothing.
		same(t, "late edit", outcomes(fx.admit(fx.v, []journal.Inbound{edit("$e", alice, 2000, "$m", "secret").In(room, journal.Live)}, "")),
			"$e:duplicate")
		same(t, "screen after the late edit", fx.roomScreen(), []string{})
	})

	t.Run("AnEditOnScreenIsTakenDownByItsRedactedCopy", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m", alice, 1000, "hi"), edit("$e", alice, 2000, "$m", "secret"))
		same(t, "screen", fx.roomScreen(), []string{shown("$m", "secret")})
		fx.mustHistory(redactedCopy("$e", alice, 2000))
		same(t, "screen after the copy", fx.roomScreen(), []string{})
		same(t, "owed", owed(fx.read(fx.v, room, nil, 10)), []string{"$m"})
	})
}
