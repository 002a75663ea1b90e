package contract

import (
	"slices"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
)

// TestEditReduction checks that a message shows its latest same-sender
// revision, ordered by (origin_server_ts, event_id) whatever the arrival
// order, and that edits arriving before their original wait for it.
func TestEditReduction(t *testing.T, f Factory) {
	t.Run("AnEditReplacesTheVisibleBody", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "draft"), edit("$e1", alice, 2000, "$m1", "final"))
		page := fx.read(fx.v, room, nil, 10)
		if got, want := screen(page), []string{shown("$m1", "final")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
		m := page.Messages[0]
		if m.RevisionID != "$e1" || m.RevisionTS != 2000 || m.CreatedTS != 1000 || m.Sender != alice {
			t.Fatalf("message = %+v, want revision $e1 at 2000, created 1000 by %s", m, alice)
		}
	})

	t.Run("TheVisibleBodyIsTheNewContentNotTheFallback", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "draft"),
			editWith("$e1", alice, 2000, "$m1", map[string]any{"msgtype": "m.emote", "body": "waves"}))
		if got, want := fx.roomScreen(), []string{`$m1={"body":"waves","msgtype":"m.emote"}`}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
	})

	t.Run("AnOlderEditArrivingLateDoesNotWin", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "draft"),
			edit("$new", alice, 3000, "$m1", "newer"),
			edit("$old", alice, 2000, "$m1", "older"))
		if got, want := fx.roomScreen(), []string{shown("$m1", "newer")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
	})

	t.Run("AnEditOlderThanTheOriginalDoesNotWin", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 5000, "original"), edit("$skewed", alice, 4000, "$m1", "from a skewed clock"))
		if got, want := fx.roomScreen(), []string{shown("$m1", "original")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
	})

	for _, order := range []struct {
		name  string
		first string
	}{{"LowerIDFirst", "$aaa"}, {"HigherIDFirst", "$bbb"}} {
		t.Run("SameTimestampEditsResolveByEventID/"+order.name, func(t *testing.T) {
			fx := newFixture(t, f)
			edits := map[string]event{
				"$aaa": edit("$aaa", alice, 2000, "$m1", "from aaa"),
				"$bbb": edit("$bbb", alice, 2000, "$m1", "from bbb"),
			}
			second := "$bbb"
			if order.first == "$bbb" {
				second = "$aaa"
			}
			fx.live(msg("$m1", alice, 1000, "draft"), edits[order.first], edits[second])
			if got, want := fx.roomScreen(), []string{shown("$m1", "from bbb")}; !slices.Equal(got, want) {
				t.Fatalf("room = %v, want %v", got, want)
			}
		})
	}

	for _, order := range []string{"UpperFirst", "LowerFirst"} {
		t.Run("TiesCompareEventIDsInByteOrder/"+order, func(t *testing.T) {
			fx := newFixture(t, f)
			// In byte order every upper-case letter sorts before every
			// lower-case one, so "$a..." beats "$Z..." though a
			// case-insensitive collation would say the opposite.
			upper := edit("$Zzz", alice, 2000, "$m1", "from Zzz")
			lower := edit("$abc", alice, 2000, "$m1", "from abc")
			if order == "UpperFirst" {
				fx.live(msg("$m1", alice, 1000, "draft"), upper, lower)
			} else {
				fx.live(msg("$m1", alice, 1000, "draft"), lower, upper)
			}
			if got, want := fx.roomScreen(), []string{shown("$m1", "from abc")}; !slices.Equal(got, want) {
				t.Fatalf("room = %v, want %v", got, want)
			}
		})
	}

	t.Run("AnEditBeforeItsOriginalAppliesWhenTheOriginalLands", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(edit("$e1", alice, 2000, "$m1", "final"))
		if got := fx.roomScreen(); len(got) != 0 {
			t.Fatalf("room before the original = %v, want empty", got)
		}
		fx.live(msg("$m1", alice, 1000, "draft"))
		page := fx.read(fx.v, room, nil, 10)
		if got, want := screen(page), []string{shown("$m1", "final")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
		if m := page.Messages[0]; m.RevisionID != "$e1" || m.RevisionTS != 2000 || m.CreatedTS != 1000 {
			t.Fatalf("message = %+v, want revision $e1 at 2000 created 1000", m)
		}
	})

	t.Run("AnEditAndItsOriginalInOneBatchReduceTheSameWay", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.mustAdmit(batch(room, journal.Live, edit("$e1", alice, 2000, "$m1", "final"), msg("$m1", alice, 1000, "draft"))...)
		if got, want := fx.roomScreen(), []string{shown("$m1", "final")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
	})

	t.Run("AHeldEditOlderThanItsOriginalDoesNotApply", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(edit("$e1", alice, 500, "$m1", "skewed"), msg("$m1", alice, 1000, "original"))
		if got, want := fx.roomScreen(), []string{shown("$m1", "original")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
	})

	t.Run("AStrangerCannotEvictTheAuthorsHeldEdit", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(
			edit("$author", alice, 2000, "$m1", "the author's words"),
			edit("$stranger", mallory, 3000, "$m1", "the stranger's words"),
			msg("$m1", alice, 1000, "draft"),
		)
		page := fx.read(fx.v, room, nil, 10)
		if got, want := screen(page), []string{shown("$m1", "the author's words")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
		if got, want := page.Messages[0].Sender, alice; got != want {
			t.Fatalf("sender = %q, want %q", got, want)
		}
	})

	t.Run("AStrangersHeldEditNeverApplies", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(edit("$stranger", mallory, 3000, "$m1", "hijacked"), msg("$m1", alice, 1000, "draft"))
		if got, want := fx.roomScreen(), []string{shown("$m1", "draft")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
	})

	t.Run("AnEditFromAnotherSenderNeverApplies", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "draft"), edit("$stranger", mallory, 3000, "$m1", "hijacked"))
		page := fx.read(fx.v, room, nil, 10)
		if got, want := screen(page), []string{shown("$m1", "draft")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
		if got, want := page.Messages[0].RevisionID, "$m1"; got != want {
			t.Fatalf("revision = %q, want %q", got, want)
		}
	})

	for _, order := range []string{"NewestFirst", "OldestFirst"} {
		t.Run("OnlyTheLatestHeldEditIsKept/"+order, func(t *testing.T) {
			fx := newFixture(t, f)
			older := edit("$e1", alice, 2000, "$m1", "second")
			newer := edit("$e2", alice, 3000, "$m1", "third")
			if order == "NewestFirst" {
				fx.live(newer, older)
			} else {
				fx.live(older, newer)
			}
			fx.live(msg("$m1", alice, 1000, "first"))
			page := fx.read(fx.v, room, nil, 10)
			if got, want := screen(page), []string{shown("$m1", "third")}; !slices.Equal(got, want) {
				t.Fatalf("room = %v, want %v", got, want)
			}
			if got, want := page.Messages[0].RevisionID, "$e2"; got != want {
				t.Fatalf("revision = %q, want %q", got, want)
			}
		})
	}

	for _, c := range []struct {
		name  string
		order []int
	}{
		{"InOrder", []int{0, 1, 2, 3, 4, 5, 6, 7}},
		{"Reversed", []int{7, 6, 5, 4, 3, 2, 1, 0}},
		{"Shuffled", []int{3, 7, 0, 5, 1, 6, 2, 4}},
	} {
		t.Run("EditChurnLeavesOneRowAndNoHistory/"+c.name, func(t *testing.T) {
			fx := newFixture(t, f)
			fx.live(msg("$m1", alice, 1000, "v0"))
			bodies := []string{"v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8"}
			for _, i := range c.order {
				fx.live(edit("$e"+bodies[i], alice, int64(2000+i), "$m1", bodies[i]))
			}
			page := fx.read(fx.v, room, nil, 10)
			if got, want := screen(page), []string{shown("$m1", "v8")}; !slices.Equal(got, want) {
				t.Fatalf("room = %v, want %v", got, want)
			}
			if got := owed(page); len(got) != 0 {
				t.Fatalf("owed refetch = %v, want none", got)
			}
			if page.NextCursor != nil {
				t.Fatalf("a one-message room has a next cursor %+v", *page.NextCursor)
			}
		})
	}

	t.Run("EditsNeverShowAsMessagesOfTheirOwn", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "draft"), edit("$e1", alice, 2000, "$m1", "final"),
			edit("$orphan", alice, 2500, "$never_arrives", "orphaned"))
		if got, want := fx.roomScreen(), []string{shown("$m1", "final")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
	})

	t.Run("AnEditOfAThreadReplyStaysInItsThread", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$root", alice, 1000, "root"), reply("$r1", bob, 2000, "$root", "reply"),
			edit("$e1", bob, 3000, "$r1", "reply, edited"))
		if got, want := screen(fx.read(fx.v, room, ptr("$root"), 10)), []string{shown("$root", "root"), shown("$r1", "reply, edited")}; !slices.Equal(got, want) {
			t.Fatalf("thread = %v, want %v", got, want)
		}
		if got, want := fx.roomScreen(), []string{shown("$root", "root")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
	})

	t.Run("AnEditInAnotherRoomDoesNotApply", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "draft"))
		fx.mustAdmit(edit("$e1", alice, 2000, "$m1", "cross-room").In(otherRoom, journal.Live))
		if got, want := fx.roomScreen(), []string{shown("$m1", "draft")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
	})

	t.Run("AReactionChangesNothingVisible", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "draft"), reaction("$r", bob, 2000, "$m1", "+1"))
		page := fx.read(fx.v, room, nil, 10)
		if got, want := screen(page), []string{shown("$m1", "draft")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
		if got, want := page.Messages[0].RevisionID, "$m1"; got != want {
			t.Fatalf("revision = %q, want %q", got, want)
		}
	})

	t.Run("HistoryEditsReduceLikeLiveOnes", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.mustAdmit(batch(room, journal.History,
			edit("$e2", alice, 3000, "$m1", "third"),
			edit("$e1", alice, 2000, "$m1", "second"),
			msg("$m1", alice, 1000, "first"))...)
		if got, want := fx.roomScreen(), []string{shown("$m1", "third")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
	})
}

// TestStreamingProgress checks that the agent's own in-progress stream
// edits are transport only: they never reach the projection, while the
// terminal edit and other senders' edits do.
func TestStreamingProgress(t *testing.T, f Factory) {
	for _, status := range []string{"streaming", "pending"} {
		t.Run("ASelfAuthoredProgressEditNeverReachesTheProjection/"+status, func(t *testing.T) {
			fx := newFixture(t, f)
			fx.live(msg("$m1", botUser, 1000, "Thinking"), streamEdit("$p1", botUser, 2000, "$m1", "Thinking about it", status))
			page := fx.read(fx.v, room, nil, 10)
			if got, want := screen(page), []string{shown("$m1", "Thinking")}; !slices.Equal(got, want) {
				t.Fatalf("room = %v, want %v", got, want)
			}
			if got, want := page.Messages[0].RevisionID, "$m1"; got != want {
				t.Fatalf("revision = %q, want %q", got, want)
			}
		})
	}

	t.Run("TheTerminalEditReplacesTheStream", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", botUser, 1000, "Thinking"),
			streamEdit("$p1", botUser, 2000, "$m1", "The answer is", "streaming"),
			streamEdit("$done", botUser, 3000, "$m1", "The answer is 42", "completed"),
			streamEdit("$p2", botUser, 4000, "$m1", "late progress", "streaming"))
		want := `$m1={"body":"The answer is 42","io.mindroom.stream_status":"completed","msgtype":"m.text"}`
		if got := fx.roomScreen(); !slices.Equal(got, []string{want}) {
			t.Fatalf("room = %v, want [%s]", got, want)
		}
		if got, ok := fx.latest(room, nil); !ok || got != "$done" {
			t.Fatalf("latest = %q, %v; want $done", got, ok)
		}
	})

	t.Run("AProgressEditBeforeItsOriginalIsNotHeld", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(streamEdit("$p1", botUser, 2000, "$m1", "halfway", "streaming"), msg("$m1", botUser, 1000, "Thinking"))
		if got, want := fx.roomScreen(), []string{shown("$m1", "Thinking")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
	})

	t.Run("ProgressFromHistoryIsAlsoTransport", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.mustAdmit(batch(room, journal.History,
			streamEdit("$p2", botUser, 3000, "$m1", "nearly", "streaming"),
			streamEdit("$done", botUser, 2500, "$m1", "done", "completed"),
			msg("$m1", botUser, 1000, "Thinking"))...)
		want := `$m1={"body":"done","io.mindroom.stream_status":"completed","msgtype":"m.text"}`
		if got := fx.roomScreen(); !slices.Equal(got, []string{want}) {
			t.Fatalf("room = %v, want [%s]", got, want)
		}
	})

	t.Run("AnotherSendersStreamingEditStillApplies", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "draft"), streamEdit("$e1", alice, 2000, "$m1", "alice streams too", "streaming"))
		want := `$m1={"body":"alice streams too","io.mindroom.stream_status":"streaming","msgtype":"m.text"}`
		if got := fx.roomScreen(); !slices.Equal(got, []string{want}) {
			t.Fatalf("room = %v, want [%s]", got, want)
		}
	})

	for _, status := range []string{"error", "cancelled"} {
		t.Run("AnyOtherStatusIsTerminal/"+status, func(t *testing.T) {
			fx := newFixture(t, f)
			fx.live(msg("$m1", botUser, 1000, "Thinking"), streamEdit("$end", botUser, 2000, "$m1", "stopped", status))
			want := `$m1={"body":"stopped","io.mindroom.stream_status":"` + status + `","msgtype":"m.text"}`
			if got := fx.roomScreen(); !slices.Equal(got, []string{want}) {
				t.Fatalf("room = %v, want [%s]", got, want)
			}
		})
	}

	t.Run("AnotherPrincipalSeesTheBotsProgressAsAnyEdit", func(t *testing.T) {
		fx := newFixture(t, f)
		// Progress is transport only for the account that streams it; for
		// another account it is an ordinary edit by another user.
		watcher := fx.principal("watcher", alice)
		evs := batch(room, journal.Live, msg("$m1", botUser, 1000, "Thinking"), streamEdit("$p1", botUser, 2000, "$m1", "halfway", "streaming"))
		fx.mustAdmitOn(watcher, evs...)
		want := `$m1={"body":"halfway","io.mindroom.stream_status":"streaming","msgtype":"m.text"}`
		if got := screen(fx.read(watcher, room, nil, 10)); !slices.Equal(got, []string{want}) {
			t.Fatalf("watcher room = %v, want [%s]", got, want)
		}
	})
}

// TestSidecarPreview checks that a message whose real text is in an
// attached file never shows its preview as if it were the message: the row
// has no body and owes a refetch.
func TestSidecarPreview(t *testing.T, f Factory) {
	t.Run("ASidecarPreviewProjectsWithoutABody", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m0", alice, 500, "before"), sidecar("$long", alice, 1000, "The first lines..."), msg("$m2", alice, 1500, "after"))
		page := fx.read(fx.v, room, nil, 10)
		if got, want := screen(page), []string{shown("$m0", "before"), shown("$m2", "after")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
		if got, want := owed(page), []string{"$long"}; !slices.Equal(got, want) {
			t.Fatalf("owed refetch = %v, want %v", got, want)
		}
	})

	t.Run("ASidecarSourceIsStillOwedItsTurn", func(t *testing.T) {
		fx := newFixture(t, f)
		e := sidecar("$long", alice, 1000, "The first lines...")
		fx.live(e)
		p := fx.pending(fx.v)
		if got, want := len(p), 1; got != want {
			t.Fatalf("pending has %d events, want %d", got, want)
		}
		if got, want := string(p[0].Event), canonicalEvent(t, e, room); got != want {
			t.Fatalf("replay payload = %s, want %s", got, want)
		}
	})

	t.Run("ASidecarEditOnScreenOwesARefetch", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(msg("$m1", alice, 1000, "short"), editWith("$e1", alice, 2000, "$m1", map[string]any{
			"msgtype": "m.text", "body": "preview...", journal.LongTextKey: map[string]any{"version": 2, "encoding": "matrix_event_content_json"},
			"url": "mxc://example.org/sidecar",
		}))
		page := fx.read(fx.v, room, nil, 10)
		if got := screen(page); len(got) != 0 {
			t.Fatalf("room = %v, want empty", got)
		}
		if got, want := owed(page), []string{"$m1"}; !slices.Equal(got, want) {
			t.Fatalf("owed refetch = %v, want %v", got, want)
		}
	})

	t.Run("APlainEditOfASidecarPutsABodyOnScreen", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(sidecar("$long", alice, 1000, "preview..."), edit("$e1", alice, 2000, "$long", "short now"))
		page := fx.read(fx.v, room, nil, 10)
		if got, want := screen(page), []string{shown("$long", "short now")}; !slices.Equal(got, want) {
			t.Fatalf("room = %v, want %v", got, want)
		}
		if got := owed(page); len(got) != 0 {
			t.Fatalf("owed refetch = %v, want none", got)
		}
	})

	t.Run("TheSidecarDebtSurvivesARestart", func(t *testing.T) {
		fx := newFixture(t, f)
		fx.live(sidecar("$long", alice, 1000, "preview..."))
		fx.restart()
		page := fx.read(fx.v, room, nil, 10)
		if got := screen(page); len(got) != 0 {
			t.Fatalf("room = %v, want empty", got)
		}
		if got, want := owed(page), []string{"$long"}; !slices.Equal(got, want) {
			t.Fatalf("owed refetch = %v, want %v", got, want)
		}
	})
}
