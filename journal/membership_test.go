package journal_test

import (
	"errors"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
)

// memMembership is journal.MembershipStore over plain fields, for one room.
type memMembership struct {
	epoch        int64
	departed     bool
	observations map[string]bool
	owed         []time.Time
	ended        int // EndMembership calls
}

func (m *memMembership) RecordObservation(_, obs string) (bool, error) {
	if m.observations[obs] {
		return false, nil
	}
	m.observations[obs] = true
	return true, nil
}
func (m *memMembership) Membership(string) (int64, bool, error) { return m.epoch, m.departed, nil }
func (m *memMembership) EndMembership(string) error {
	m.epoch, m.departed, m.ended = m.epoch+1, true, m.ended+1
	return nil
}
func (m *memMembership) Rejoin(string) error {
	m.departed = false
	return nil
}
func (m *memMembership) OweReport(_ string, at time.Time) error {
	m.owed = append(m.owed, at)
	return nil
}
func (m *memMembership) DropOwedReportsBefore(_ string, t time.Time) error {
	kept := m.owed[:0]
	for _, at := range m.owed {
		if !at.Before(t) {
			kept = append(kept, at)
		}
	}
	m.owed = kept
	return nil
}
func (m *memMembership) TakeOwedReport(_ string, since time.Time) (bool, error) {
	for i, at := range m.owed {
		if !at.Before(since) {
			m.owed = append(m.owed[:i], m.owed[i+1:]...)
			return true, nil
		}
	}
	return false, nil
}

func TestTheFenceRules(t *testing.T) {
	const room = "!r:example.org"
	t0 := parseNow
	type step struct {
		join   bool
		source journal.DepartureSource
		obs    string
		at     time.Duration
		want   journal.DepartureOutcome
	}
	leave := func(src journal.DepartureSource, obs string, at time.Duration, want journal.DepartureOutcome) step {
		return step{source: src, obs: obs, at: at, want: want}
	}
	join := step{join: true}
	for _, c := range []struct {
		name  string
		steps []step
		epoch int64
		owed  int
	}{
		{"ALocalLeaveFencesAndOwesAnEcho", []step{leave(journal.DepartureLocal, "", 0, journal.Fenced)}, 1, 1},
		{"TheEchoIsAbsorbedOnce", []step{leave(journal.DepartureLocal, "", 0, journal.Fenced),
			leave(journal.DepartureReported, "l1", time.Minute, journal.OwedReportConsumed),
			leave(journal.DepartureReported, "l1", time.Minute, journal.RepeatedReport)}, 1, 0},
		{"AReportedLeaveFences", []step{leave(journal.DepartureReported, "l1", 0, journal.Fenced)}, 1, 0},
		{"ALeaveWhileOutFencesNothing", []step{leave(journal.DepartureReported, "l1", 0, journal.Fenced),
			leave(journal.DepartureLocal, "", 0, journal.AlreadyFenced)}, 1, 0},
		{"AnEchoAfterARejoinIsStillAbsorbed", []step{leave(journal.DepartureLocal, "", 0, journal.Fenced), join,
			leave(journal.DepartureReported, "l1", time.Minute, journal.OwedReportConsumed)}, 1, 0},
		{"AnEchoPastItsWindowIsADeparture", []step{leave(journal.DepartureLocal, "", 0, journal.Fenced), join,
			leave(journal.DepartureReported, "l1", journal.OwedReportWindow+time.Millisecond, journal.Fenced)}, 2, 0},
		{"AKickIsNeverAnEcho", []step{leave(journal.DepartureLocal, "", 0, journal.Fenced), join,
			leave(journal.DepartureRemoved, "k1", time.Minute, journal.Fenced)}, 2, 1},
		{"AKickWhileOutFencesNothing", []step{leave(journal.DepartureLocal, "", 0, journal.Fenced),
			leave(journal.DepartureRemoved, "k1", time.Minute, journal.AlreadyFenced)}, 1, 1},
		{"TwoLocalLeavesWithARejoinOweTwoEchoes", []step{leave(journal.DepartureLocal, "", 0, journal.Fenced), join,
			leave(journal.DepartureLocal, "", time.Second, journal.Fenced)}, 2, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := &memMembership{observations: map[string]bool{}}
			for i, st := range c.steps {
				if st.join {
					if err := journal.ApplyJoin(m, room, ""); err != nil {
						t.Fatal(err)
					}
					continue
				}
				got, err := journal.ApplyDeparture(m, room, st.source, st.obs, t0.Add(st.at))
				if err != nil || got != st.want {
					t.Fatalf("step %d: %v, %v; want %v", i, got, err, st.want)
				}
			}
			if m.epoch != c.epoch || len(m.owed) != c.owed {
				t.Fatalf("epoch %d, owed %d; want %d, %d", m.epoch, len(m.owed), c.epoch, c.owed)
			}
		})
	}
}

func TestTheFenceRefusesMalformedObservations(t *testing.T) {
	m := &memMembership{observations: map[string]bool{}}
	if _, err := journal.ApplyDeparture(m, "room", journal.DepartureLocal, "", parseNow); !errors.Is(err, journal.ErrInvalidArgument) {
		t.Errorf("bad room: %v", err)
	}
	if _, err := journal.ApplyDeparture(m, "!r:example.org", 9, "", parseNow); !errors.Is(err, journal.ErrInvalidArgument) {
		t.Errorf("bad source: %v", err)
	}
	if m.ended != 0 || len(m.observations) != 0 {
		t.Errorf("a refused observation changed the store: %+v", m)
	}
}
