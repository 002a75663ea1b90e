package contract

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
)

// TestAdmission checks exactly-once admission: deduplication, classes and
// provenance, durable receipt order, the replay payload and the sync token
// committed with its batch.
func TestAdmission(t *testing.T, f Factory) {
	ctx := context.Background()

	t.Run("AdmittingTwiceCreatesOnePendingEvent", func(t *testing.T) {
		fx := newFixture(t, f)
		in := batch(room, journal.Live, msg("$m1", alice, 1000, "hi"))
		if got, want := outcomes(fx.admit(fx.v, in, "s1")), "$m1:admitted/actionable"; got != want {
			t.Fatalf("first admission = %s, want %s", got, want)
		}
		if got, want := outcomes(fx.admit(fx.v, in, "s1")), "$m1:duplicate"; got != want {
			t.Fatalf("second admission = %s, want %s", got, want)
		}
		if got, want := fx.pendingIDs(fx.v), []string{"$m1"}; !slices.Equal(got, want) {
			t.Fatalf("pending = %v, want %v", got, want)
		}
		if got, want := fx.roomScreen(), []string{shown("$m1", "hi")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
	})

	t.Run("ADuplicateInsideOneBatchIsRecognised", func(t *testing.T) {
		fx := newFixture(t, f)
		in := batch(room, journal.Live, msg("$m1", alice, 1000, "hi"), msg("$m1", alice, 1000, "hi"))
		if got, want := outcomes(fx.admit(fx.v, in, "")), "$m1:admitted/actionable $m1:duplicate"; got != want {
			t.Fatalf("outcomes = %s, want %s", got, want)
		}
		if got, want := fx.pendingIDs(fx.v), []string{"$m1"}; !slices.Equal(got, want) {
			t.Fatalf("pending = %v, want %v", got, want)
		}
	})

	t.Run("ASecondDisagreeingPayloadNeverProjects", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "original"))
		forged := batch(room, journal.Live, msg("$m1", mallory, 5000, "forged"))
		if got, want := outcomes(fx.admit(fx.v, forged, "")), "$m1:duplicate"; got != want {
			t.Fatalf("forged copy = %s, want %s", got, want)
		}
		page := fx.read(fx.v, room, nil, 10)
		if got, want := screen(page), []string{shown("$m1", "original")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
		if got, want := page.Messages[0].Sender, alice; got != want {
			t.Fatalf("sender = %q, want %q", got, want)
		}
		if got, want := page.Messages[0].CreatedTS, int64(1000); got != want {
			t.Fatalf("created_ts = %d, want %d", got, want)
		}
		p := fx.pending(fx.v)
		if got, want := len(p), 1; got != want {
			t.Fatalf("pending has %d events, want %d", got, want)
		}
		if got, want := string(p[0].Event), canonicalEvent(t, msg("$m1", alice, 1000, "original"), room); got != want {
			t.Fatalf("replay payload = %s, want %s", got, want)
		}
	})

	t.Run("ADisagreeingEditCopyNeverProjects", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "original"), edit("$e1", alice, 2000, "$m1", "first edit"))
		forged := batch(room, journal.Live, edit("$e1", alice, 2000, "$m1", "forged edit"))
		if got, want := outcomes(fx.admit(fx.v, forged, "")), "$e1:duplicate"; got != want {
			t.Fatalf("forged edit = %s, want %s", got, want)
		}
		if got, want := fx.roomScreen(), []string{shown("$m1", "first edit")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
	})

	t.Run("PendingReplaysInReceiptOrder", func(t *testing.T) {
		fx := newFixture(t, f)
		// Receipt order deliberately disagrees with timestamp order.
		fx.mustAdmit(batch(room, journal.Live, msg("$c", alice, 3000, "c"), msg("$a", alice, 1000, "a"))...)
		fx.mustAdmit(batch(otherRoom, journal.Live, msg("$b", bob, 2000, "b"))...)
		fx.mustAdmit(batch(room, journal.Live, msg("$d", alice, 500, "d"))...)

		p := fx.pending(fx.v)
		var ids []string
		for i, e := range p {
			ids = append(ids, e.EventID)
			if i > 0 && e.Seq <= p[i-1].Seq {
				t.Fatalf("seq %d of %s does not follow %d", e.Seq, e.EventID, p[i-1].Seq)
			}
		}
		if want := []string{"$c", "$a", "$b", "$d"}; !slices.Equal(ids, want) {
			t.Fatalf("pending = %v, want %v", ids, want)
		}
		if got, want := p[2].RoomID, otherRoom; got != want {
			t.Fatalf("room of $b = %q, want %q", got, want)
		}
	})

	t.Run("PendingPagesResumeAfterTheirCursor", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$1", alice, 1000, "1"), msg("$2", alice, 1001, "2"), msg("$3", alice, 1002, "3"))
		first, err := fx.v.Pending(ctx, 2, 0)
		if err != nil {
			t.Fatalf("Pending: %v", err)
		}
		if got, want := pendingEventIDs(first), []string{"$1", "$2"}; !slices.Equal(got, want) {
			t.Fatalf("first page = %v, want %v", got, want)
		}
		if !first.More || first.Next != first.Events[1].Seq {
			t.Fatalf("first page More=%v Next=%d, want true and %d", first.More, first.Next, first.Events[1].Seq)
		}
		second, err := fx.v.Pending(ctx, 2, first.Next)
		if err != nil {
			t.Fatalf("Pending: %v", err)
		}
		if got, want := pendingEventIDs(second), []string{"$3"}; !slices.Equal(got, want) {
			t.Fatalf("second page = %v, want %v", got, want)
		}
		if second.More {
			t.Fatalf("a short page claims more work")
		}
	})

	t.Run("ActionableClassesArePendingWithTheirKinds", func(t *testing.T) {
		fx := newFixture(t, f)
		res := fx.admit(fx.v, batch(room, journal.Live,
			msg("$text", alice, 1000, "hi"),
			image("$img", alice, 1001),
			reaction("$react", alice, 1002, "$text", "+1"),
			redaction("$redact", alice, 1003, "$elsewhere"),
		), "")
		if got, want := outcomes(res), "$text:admitted/actionable $img:admitted/actionable $react:admitted/actionable $redact:admitted/actionable"; got != want {
			t.Fatalf("outcomes = %s, want %s", got, want)
		}
		var kinds []journal.Kind
		for _, e := range fx.pending(fx.v) {
			kinds = append(kinds, e.Kind)
			if got, want := e.RoomID, room; got != want {
				t.Fatalf("room of %s = %q, want %q", e.EventID, got, want)
			}
		}
		if want := []journal.Kind{journal.KindMessage, journal.KindMedia, journal.KindReaction, journal.KindRedaction}; !slices.Equal(kinds, want) {
			t.Fatalf("pending kinds = %v, want %v", kinds, want)
		}
	})

	t.Run("ContextOnlyEventsNeverBecomePending", func(t *testing.T) {
		fx := newFixture(t, f)
		live := fx.admit(fx.v, batch(room, journal.Live,
			notice("$notice", alice, 1000, "fyi"),
			msg("$echo", botUser, 1001, "my own words"),
			encrypted("$cipher", alice, 1002),
			member("$join", alice, 1003, "join"),
			edit("$edit", alice, 1004, "$notice", "fyi, edited"),
		), "")
		history := fx.admit(fx.v, batch(room, journal.History,
			msg("$old", alice, 500, "last year"),
			image("$oldimg", alice, 501),
			reaction("$oldreact", alice, 502, "$old", "+1"),
			redaction("$oldredact", alice, 503, "$gone"),
		), "")
		if got, want := outcomes(append(live, history...)),
			"$notice:admitted/context_only $echo:admitted/context_only $cipher:admitted/context_only "+
				"$join:admitted/context_only $edit:admitted/context_only $old:admitted/context_only "+
				"$oldimg:admitted/context_only $oldreact:admitted/context_only $oldredact:admitted/context_only"; got != want {
			t.Fatalf("outcomes = %s, want %s", got, want)
		}
		if got := fx.pendingIDs(fx.v); len(got) != 0 {
			t.Fatalf("pending = %v, want none", got)
		}
		// Settled from the start: there is nothing left to settle.
		if got, want := fx.settle(fx.v, "$notice", "$echo", "$cipher", "$join", "$edit", "$old", "$oldimg", "$oldreact", "$oldredact"), 0; got != want {
			t.Fatalf("settled %d context-only events, want %d", got, want)
		}
		// Their identity is kept, so a second copy is a duplicate.
		again := fx.admit(fx.v, batch(room, journal.Live, notice("$notice", alice, 1000, "fyi"), msg("$old", alice, 500, "last year")), "")
		if got, want := outcomes(again), "$notice:duplicate $old:duplicate"; got != want {
			t.Fatalf("second copies = %s, want %s", got, want)
		}
		if got := fx.pendingIDs(fx.v); len(got) != 0 {
			t.Fatalf("pending after live copies = %v, want none", got)
		}
	})

	t.Run("ContextOnlyMessagesStillShowInTheConversation", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.mustAdmit(batch(room, journal.History, msg("$old", alice, 500, "last year"))...)
		fx.mustAdmit(batch(room, journal.Live,
			notice("$notice", alice, 1000, "fyi"),
			msg("$echo", botUser, 1001, "my own words"),
			encrypted("$cipher", alice, 1002),
		)...)
		want := []string{
			shown("$old", "last year"),
			`$notice={"body":"fyi","msgtype":"m.notice"}`,
			shown("$echo", "my own words"),
		}
		if got := fx.roomScreen(); !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
	})

	t.Run("RecoveredEventsAreActionable", func(t *testing.T) {
		fx := newFixture(t, f)
		res := fx.admit(fx.v, batch(room, journal.Recovered, msg("$missed", alice, 1000, "while you were away"), image("$pic", alice, 1001)), "s2")
		if got, want := outcomes(res), "$missed:admitted/actionable $pic:admitted/actionable"; got != want {
			t.Fatalf("outcomes = %s, want %s", got, want)
		}
		if got, want := fx.pendingIDs(fx.v), []string{"$missed", "$pic"}; !slices.Equal(got, want) {
			t.Fatalf("pending = %v, want %v", got, want)
		}
	})

	t.Run("RecoveredEchoesAndNoticesStayContextOnly", func(t *testing.T) {
		fx := newFixture(t, f)
		res := fx.admit(fx.v, batch(room, journal.Recovered, msg("$echo", botUser, 1000, "mine"), notice("$n", alice, 1001, "fyi")), "")
		if got, want := outcomes(res), "$echo:admitted/context_only $n:admitted/context_only"; got != want {
			t.Fatalf("outcomes = %s, want %s", got, want)
		}
		if got := fx.pendingIDs(fx.v); len(got) != 0 {
			t.Fatalf("pending = %v, want none", got)
		}
	})

	t.Run("HistorySeenFirstStaysContextOnlyWhenSeenLive", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.mustAdmit(batch(room, journal.History, msg("$m1", alice, 1000, "old"))...)
		if got, want := outcomes(fx.admit(fx.v, batch(room, journal.Live, msg("$m1", alice, 1000, "old")), "")), "$m1:duplicate"; got != want {
			t.Fatalf("live copy = %s, want %s", got, want)
		}
		if got := fx.pendingIDs(fx.v); len(got) != 0 {
			t.Fatalf("pending = %v, want none", got)
		}
	})

	t.Run("TheReplayPayloadIsTheCanonicalEvent", func(t *testing.T) {
		fx := newFixture(t, f)
		// Sync omits room_id; big integers and HTML-looking text must come
		// back byte for byte.
		e := msg("$m1", alice, 1000, "a <b> & c")
		e["content"].(map[string]any)["big"] = json.Number("123456789012345678901234567890")
		e["unsigned"] = map[string]any{"age": 5}
		fx.live(e)
		p := fx.pending(fx.v)
		if got, want := len(p), 1; got != want {
			t.Fatalf("pending has %d events, want %d", got, want)
		}
		want := `{"content":{"big":123456789012345678901234567890,"body":"a <b> & c","msgtype":"m.text"},` +
			`"event_id":"$m1","origin_server_ts":1000,"room_id":"!room:example.org","sender":"@alice:example.org",` +
			`"type":"m.room.message","unsigned":{"age":5}}`
		if got := string(p[0].Event); got != want {
			t.Fatalf("replay payload = %s, want %s", got, want)
		}
	})

	t.Run("ThePayloadSurvivesUntilSettlement", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "keep me"), msg("$m2", alice, 1001, "and me"))
		fx.restart()
		p := fx.pending(fx.v)
		if got, want := len(p), 2; got != want {
			t.Fatalf("pending after restart has %d events, want %d", got, want)
		}
		if got, want := string(p[0].Event), canonicalEvent(t, msg("$m1", alice, 1000, "keep me"), room); got != want {
			t.Fatalf("payload after restart = %s, want %s", got, want)
		}
		fx.settle(fx.v, "$m1")
		fx.restart()
		if got, want := fx.pendingIDs(fx.v), []string{"$m2"}; !slices.Equal(got, want) {
			t.Fatalf("pending after settle and restart = %v, want %v", got, want)
		}
	})

	t.Run("TheSyncTokenIsStoredWithItsBatch", func(t *testing.T) {
		fx := newFixture(t, f)
		if got, err := fx.v.SyncToken(ctx); err != nil || got != "" {
			t.Fatalf("SyncToken before any batch = %q, %v; want empty", got, err)
		}
		fx.admit(fx.v, batch(room, journal.History, msg("$m1", alice, 1000, "first sync")), "s_first")
		if got, err := fx.v.SyncToken(ctx); err != nil || got != "s_first" {
			t.Fatalf("SyncToken = %q, %v; want s_first", got, err)
		}
		fx.admit(fx.v, batch(room, journal.Live, msg("$m2", alice, 2000, "next")), "s_second")
		if got, err := fx.v.SyncToken(ctx); err != nil || got != "s_second" {
			t.Fatalf("SyncToken = %q, %v; want s_second", got, err)
		}
	})

	t.Run("TheSyncTokenSurvivesARestart", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.admit(fx.v, batch(room, journal.Live, msg("$m1", alice, 1000, "hi")), "s_42")
		fx.restart()
		if got, err := fx.v.SyncToken(ctx); err != nil || got != "s_42" {
			t.Fatalf("SyncToken after restart = %q, %v; want s_42", got, err)
		}
		if got, want := fx.pendingIDs(fx.v), []string{"$m1"}; !slices.Equal(got, want) {
			t.Fatalf("pending after restart = %v, want %v", got, want)
		}
	})

	t.Run("ABatchOfDuplicatesStillAdvancesTheToken", func(t *testing.T) {
		fx := newFixture(t, f)
		in := batch(room, journal.Live, msg("$m1", alice, 1000, "hi"))
		fx.admit(fx.v, in, "s1")
		// A crash after commit but before the caller saw the reply replays the
		// batch under a newer token.
		fx.admit(fx.v, in, "s2")
		if got, err := fx.v.SyncToken(ctx); err != nil || got != "s2" {
			t.Fatalf("SyncToken = %q, %v; want s2", got, err)
		}
	})

	t.Run("AnEmptyBatchStillStoresItsToken", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.admit(fx.v, nil, "s_quiet")
		if got, err := fx.v.SyncToken(ctx); err != nil || got != "s_quiet" {
			t.Fatalf("SyncToken = %q, %v; want s_quiet", got, err)
		}
	})

	t.Run("ABatchWithoutATokenKeepsTheStoredOne", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.admit(fx.v, nil, "s1")
		fx.admit(fx.v, batch(room, journal.History, msg("$m1", alice, 1000, "hydrated")), "")
		if got, err := fx.v.SyncToken(ctx); err != nil || got != "s1" {
			t.Fatalf("SyncToken = %q, %v; want s1", got, err)
		}
	})

	t.Run("TheProjectionSurvivesARestart", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "one"), edit("$e1", alice, 2000, "$m1", "one, edited"), msg("$m2", bob, 1500, "two"))
		fx.restart()
		if got, want := fx.roomScreen(), []string{shown("$m1", "one, edited"), shown("$m2", "two")}; !slices.Equal(got, want) {
			t.Fatalf("room after restart = %v, want %v", got, want)
		}
	})

	t.Run("AVisibleMessageCarriesItsIdentity", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$root", alice, 1000, "root"), reply("$r1", bob, 2000, "$root", "in thread"))
		page := fx.read(fx.v, room, ptr("$root"), 10)
		if got, want := len(page.Messages), 2; got != want {
			t.Fatalf("thread page has %d messages, want %d", got, want)
		}
		m := page.Messages[1]
		if m.EventID != "$r1" || m.RoomID != room || threadName(m.Thread) != "$root" || m.Sender != bob ||
			m.CreatedTS != 2000 || m.RevisionID != "$r1" || m.RevisionTS != 2000 {
			t.Fatalf("reply = %+v (thread %s), want $r1 in %s thread $root by %s at 2000, revision itself", m, threadName(m.Thread), room, bob)
		}
		if root := page.Messages[0]; root.EventID != "$root" || root.Thread != nil {
			t.Fatalf("root = %+v (thread %s), want $root in no thread", root, threadName(root.Thread))
		}
	})
}

// canonicalEvent is the replay payload a backend must keep for e admitted
// in roomID: the canonical JSON of the whole event with room_id filled in.
func canonicalEvent(t *testing.T, e event, roomID string) string {
	t.Helper()
	b, err := journal.CanonicalJSON(e.With("room_id", roomID).JSON())
	if err != nil {
		t.Fatalf("canonical JSON: %v", err)
	}
	return string(b)
}

func pendingEventIDs(p journal.PendingPage) []string {
	ids := []string{}
	for _, e := range p.Events {
		ids = append(ids, e.EventID)
	}
	return ids
}
