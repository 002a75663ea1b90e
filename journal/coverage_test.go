package journal_test

import (
	"errors"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
)

// coverage is a CoverageStore over one room's membership.
type coverage struct {
	state   journal.RoomState
	covered []string
}

func (c *coverage) Room(string) (journal.RoomState, error) { return c.state, nil }

func (c *coverage) Cover(room, thread string, epoch int64) error {
	c.covered = append(c.covered, room+"/"+thread)
	return nil
}

func TestACoverageMarkerIsWrittenOnlyUnderTheMembershipItsWalkBeganIn(t *testing.T) {
	for _, c := range []struct {
		name  string
		state journal.RoomState
		epoch int64
		ok    bool
	}{
		{"the same membership", journal.RoomState{Epoch: 2}, 2, true},
		{"a membership since ended and begun again", journal.RoomState{Epoch: 3}, 2, false},
		{"out of the room", journal.RoomState{Epoch: 2, Departed: true}, 2, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &coverage{state: c.state}
			err := journal.MarkCovered(s, "!r:x", "$root", c.epoch)
			if c.ok != (err == nil) || (!c.ok && !errors.Is(err, journal.ErrMembershipEnded)) {
				t.Fatalf("MarkCovered = %v, want ok %v", err, c.ok)
			}
			if c.ok != (len(s.covered) == 1) {
				t.Fatalf("markers written %v", s.covered)
			}
		})
	}
}

func TestARefreshDebtIsOwedOnlyWithATokenAndWhileInTheRoom(t *testing.T) {
	for _, c := range []struct {
		token    int64
		departed bool
		owed     bool
	}{{7, false, true}, {0, false, false}, {7, true, false}} {
		if got := (journal.RefreshDebt{Token: c.token}).Owed(c.departed); got != c.owed {
			t.Errorf("token %d, departed %v: owed %v, want %v", c.token, c.departed, got, c.owed)
		}
	}
}
