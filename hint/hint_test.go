package hint_test

import (
	"sort"
	"testing"

	"github.com/mindroomd/mindroomd/hint"
)

func pending(s *hint.Subscription) bool {
	select {
	case <-s.C():
		return true
	default:
		return false
	}
}

func TestASubscriptionWakesOnlyForItsPrincipal(t *testing.T) {
	var b hint.Bus
	mine, other, all := b.Subscribe("a@@a:x"), b.Subscribe("b@@b:x"), b.Subscribe("")
	b.Publish([]hint.Hint{{Principal: "a@@a:x", Room: "!r:x", Position: 7}})
	if !pending(mine) || pending(other) || !pending(all) {
		t.Fatal("a hint woke the wrong subscriptions")
	}
}

func TestWakeUpsCoalesceAndNeverBlockThePublisher(t *testing.T) {
	var b hint.Bus
	s := b.Subscribe("")
	for i := 0; i < 1000; i++ { // an unread subscription must not stall this
		b.Publish([]hint.Hint{{Principal: "p", Position: int64(i)}})
	}
	if !pending(s) {
		t.Fatal("no wake-up after publishing")
	}
	if pending(s) {
		t.Fatal("a thousand hints left more than one wake-up")
	}
}

func TestAClosedSubscriptionIsNotWoken(t *testing.T) {
	var b hint.Bus
	s := b.Subscribe("")
	s.Close()
	b.Publish([]hint.Hint{{Principal: "p"}})
	if pending(s) {
		t.Fatal("a closed subscription was woken")
	}
}

func TestWakeAllWakesEverySubscriptionWhateverItsPrincipal(t *testing.T) {
	var b hint.Bus
	a, c := b.Subscribe("a"), b.Subscribe("c")
	b.WakeAll()
	if !pending(a) || !pending(c) {
		t.Fatal("WakeAll left a subscription asleep")
	}
}

func TestForRoomsIsOneHintPerRoomAtItsNewestPosition(t *testing.T) {
	got := hint.ForRooms("a@@a:x", map[string]int64{"!r1:x": 7, "!r2:x": 9})
	want := map[string]int64{"!r1:x": 7, "!r2:x": 9}
	if len(got) != len(want) {
		t.Fatalf("%d hints, want %d", len(got), len(want))
	}
	for _, h := range got {
		if h.Principal != "a@@a:x" || want[h.Room] != h.Position {
			t.Fatalf("hint %+v", h)
		}
	}
}

func TestARoomSubscriptionGathersEachChangedRoomOnce(t *testing.T) {
	var b hint.Bus
	s := b.SubscribeRooms("a")
	defer s.Close()
	b.Publish([]hint.Hint{{Principal: "a", Room: "!x"}, {Principal: "b", Room: "!other"}})
	b.Publish([]hint.Hint{{Principal: "a", Room: "!x"}, {Principal: "a", Room: "!y"}, {Principal: "a"}})
	<-s.C()
	rooms, all := s.Rooms()
	sort.Strings(rooms)
	if all || len(rooms) != 2 || rooms[0] != "!x" || rooms[1] != "!y" {
		t.Fatalf("rooms = %v, all = %v; want [!x !y], false", rooms, all)
	}
	if rooms, all := s.Rooms(); rooms != nil || all {
		t.Fatalf("a second take = %v, %v; want nothing", rooms, all)
	}
	b.WakeAll()
	<-s.C()
	if _, all := s.Rooms(); !all {
		t.Fatal("after WakeAll the subscription must say every room may have changed")
	}
	plain := b.Subscribe("a")
	defer plain.Close()
	b.Publish([]hint.Hint{{Principal: "a", Room: "!x"}})
	if rooms, _ := plain.Rooms(); rooms != nil {
		t.Fatalf("a plain subscription gathered %v", rooms)
	}
}
