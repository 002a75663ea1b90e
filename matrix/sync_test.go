package matrix_test

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/matrix"
)

// syncUntil syncs from since until done accepts a batch, and returns that
// batch. Each sync long-polls, so a wait costs no more than the server
// takes to have news.
func syncUntil(t *testing.T, c *matrix.Client, since string, done func(*matrix.SyncBatch) bool) *matrix.SyncBatch {
	t.Helper()
	for range 20 {
		b, err := c.Sync(t.Context(), since, 5*time.Second)
		if err != nil {
			t.Fatalf("sync: %v", err)
		}
		if done(b) {
			return b
		}
		since = b.NextBatch
	}
	t.Fatal("the awaited sync never came")
	return nil
}

func roomIn(rooms []matrix.RoomTimeline, id string) (matrix.RoomTimeline, bool) {
	i := slices.IndexFunc(rooms, func(r matrix.RoomTimeline) bool { return r.RoomID == id })
	if i < 0 {
		return matrix.RoomTimeline{}, false
	}
	return rooms[i], true
}

func TestSyncHandsOverTimelinesRawAndInOrderAndMarksAGap(t *testing.T) {
	c := login(t, config(t, register(t)))
	human := hs.User(t, register(t))
	room := human.CreateRoom(c.UserID())

	invited := syncUntil(t, c, "", func(b *matrix.SyncBatch) bool { return slices.Contains(b.Invited, room) })
	if got, err := c.Join(t.Context(), room); err != nil || got != room {
		t.Fatalf("join = %q, %v; want %s", got, err, room)
	}
	joined := syncUntil(t, c, invited.NextBatch, func(b *matrix.SyncBatch) bool { _, ok := roomIn(b.Joined, room); return ok })

	var newest string
	for i := 0; i < matrix.TimelineLimit+10; i++ {
		newest = human.SendText(room, strconv.Itoa(i))
	}
	// Once the newest is in anyone's sync, all of them are in the bot's.
	settle(t, human, room, newest)
	gap := syncUntil(t, c, joined.NextBatch, func(b *matrix.SyncBatch) bool { _, ok := roomIn(b.Joined, room); return ok })
	tl, _ := roomIn(gap.Joined, room)
	var want []string
	for i := 10; i < matrix.TimelineLimit+10; i++ {
		want = append(want, strconv.Itoa(i))
	}
	if got := bodies(t, tl.Events); !tl.Limited || !slices.Equal(got, want) || tl.PrevBatch == "" {
		t.Fatalf("timeline limited=%t prev_batch=%q bodies=%v, want limited with bodies %v", tl.Limited, tl.PrevBatch, got, want)
	}

	// The gap before the timeline is read from its prev_batch.
	page, err := c.Messages(t.Context(), room, tl.PrevBatch, matrix.Backward, 10)
	if err != nil {
		t.Fatal(err)
	}
	if got := bodies(t, page.Chunk); !slices.Equal(got, []string{"9", "8", "7", "6", "5", "4", "3", "2", "1", "0"}) {
		t.Fatalf("the gap = %v, want 9 down to 0", got)
	}

	last := human.SendText(room, "last")
	next := syncUntil(t, c, gap.NextBatch, func(b *matrix.SyncBatch) bool { _, ok := roomIn(b.Joined, room); return ok })
	tl, _ = roomIn(next.Joined, room)
	if tl.Limited || len(tl.Events) != 1 || parse(t, tl.Events[0]).ID != last {
		t.Errorf("next timeline limited=%t with %d events, want just %s", tl.Limited, len(tl.Events), last)
	}
}

func TestSyncReportsRoomsTheUserLeftOrWasRemovedFrom(t *testing.T) {
	c := login(t, config(t, register(t)))
	human, kickedFrom := roomWithBot(t, c)
	leftRoom := human.CreateRoom(c.UserID())
	if _, err := c.Join(t.Context(), leftRoom); err != nil {
		t.Fatal(err)
	}
	var joined []matrix.RoomTimeline
	start := syncUntil(t, c, "", func(b *matrix.SyncBatch) bool {
		joined = append(joined, b.Joined...)
		_, a := roomIn(joined, kickedFrom)
		_, b2 := roomIn(joined, leftRoom)
		return a && b2
	})

	human.Kick(kickedFrom, c.UserID())
	if err := c.Leave(t.Context(), leftRoom); err != nil {
		t.Fatal(err)
	}
	var left []matrix.RoomTimeline
	syncUntil(t, c, start.NextBatch, func(b *matrix.SyncBatch) bool {
		left = append(left, b.Left...)
		_, a := roomIn(left, kickedFrom)
		_, b2 := roomIn(left, leftRoom)
		return a && b2
	})
	for room, sender := range map[string]string{kickedFrom: human.UserID, leftRoom: c.UserID()} {
		tl, _ := roomIn(left, room)
		if len(tl.Events) == 0 {
			t.Fatalf("left room %s has no final timeline", room)
		}
		e := parse(t, tl.Events[len(tl.Events)-1])
		if e.Type != "m.room.member" || e.StateKey == nil || *e.StateKey != c.UserID() || e.Content.Membership != "leave" || e.Sender != sender {
			t.Errorf("last event in %s = %s %s by %s, want the bot's leave by %s", room, e.Type, e.Content.Membership, e.Sender, sender)
		}
	}
}

func TestRelationsOfARootAreItsDirectChildrenWithoutRecursionDepth(t *testing.T) {
	c := login(t, config(t, register(t)))
	human, room := roomWithBot(t, c)
	root := human.SendText(room, "root")
	child := human.ThreadReply(room, root, "child")
	settle(t, human, room, human.React(room, child, "x"))

	page, err := c.Relations(t.Context(), room, root, "", "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if page.RecursionDepth != nil {
		t.Errorf("recursion_depth = %d, want absent (Dendrite does not recurse)", *page.RecursionDepth)
	}
	if len(page.Chunk) != 1 || parse(t, page.Chunk[0]).ID != child {
		t.Errorf("relations = %d events, want the child %s only", len(page.Chunk), child)
	}
}
