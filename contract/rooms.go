package contract

import (
	"context"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
)

// TestRoomList checks what the journal says of a principal's rooms: each
// room it recorded, with its epoch, the newest message of its main
// timeline and its pending count, and whether the principal is in it.
func TestRoomList(t *testing.T, f Factory) {
	ctx := context.Background()
	fx := newFixture(t, f)
	fx.live(msg("$a", alice, 1000, "one"), msg("$b", alice, 3000, "two"), reply("$t", alice, 5000, "$a", "in a thread"))
	fx.mustAdmit(batch(otherRoom, journal.Live, msg("$o", alice, 2000, "elsewhere"))...)
	fx.settle(fx.v, "$o")
	rooms, err := fx.v.Rooms(ctx)
	if err != nil {
		t.Fatalf("Rooms: %v", err)
	}
	want := []journal.RoomActivity{
		{RoomID: otherRoom, NewestTS: 2000},
		{RoomID: room, NewestTS: 3000, Pending: 3},
	}
	if len(rooms) != len(want) || rooms[0] != want[0] || rooms[1] != want[1] {
		t.Fatalf("rooms = %+v, want %+v (a thread's reply is not the main timeline's newest)", rooms, want)
	}
	for r, in := range map[string]bool{room: true, otherRoom: true, "!never:example.org": false} {
		if got, err := fx.v.Joined(ctx, r); err != nil || got != in {
			t.Fatalf("Joined(%s) = %v, %v; want %v", r, got, err, in)
		}
	}
	if _, err := fx.v.FenceDeparture(ctx, otherRoom, journal.DepartureReported, "leave-o"); err != nil {
		t.Fatal(err)
	}
	if in, err := fx.v.Joined(ctx, otherRoom); err != nil || in {
		t.Fatalf("Joined after the departure = %v, %v; want false", in, err)
	}
	rooms, err = fx.v.Rooms(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rooms[0].RoomID != otherRoom || !rooms[0].Departed || rooms[0].Epoch != 1 || rooms[0].NewestTS != 0 {
		t.Fatalf("the room left = %+v, want departed at epoch 1 with nothing on screen", rooms[0])
	}
	other := fx.principal("other", "@other:example.org")
	if rooms, err := other.Rooms(ctx); err != nil || len(rooms) != 0 {
		t.Fatalf("another principal's rooms = %+v, %v; want none", rooms, err)
	}
}
