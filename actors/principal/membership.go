package principal

import (
	"context"
	"sync"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/journal"
)

// membership applies one principal's departures and joins one at a time,
// in the order they are observed, each in one journal transaction. The
// journal already makes a repeated observation a no-op; what is left is
// that a local leave, which is several steps (the fence, the homeserver's
// leave, and resuming the membership when the homeserver refused), is not
// interleaved with the sync's reports of the same room. A mutex held for
// the whole of it does that, and every step runs under its caller's
// context, so a shutdown ends a wait.
type membership struct {
	mu    sync.Mutex
	store journal.Membership
	log   zerolog.Logger
}

// fence applies one departure observation.
func (m *membership) fence(ctx context.Context, room string, source journal.DepartureSource, observation string) (journal.DepartureOutcome, error) {
	o, err := m.store.FenceDeparture(ctx, room, source, observation)
	if err == nil {
		m.log.Info().Str("room_id", room).Stringer("outcome", o).Msg("Departure applied")
	}
	return o, err
}

// join ends a departure.
func (m *membership) join(ctx context.Context, room, observation string) error {
	return m.store.RecordJoin(ctx, room, observation)
}

// retireOwed forgets the owed echoes of rooms.
func (m *membership) retireOwed(ctx context.Context, rooms ...string) (int, error) {
	return m.store.RetireOwedDepartureReports(ctx, rooms...)
}

// locked runs apply while no other departure or join of the principal
// runs.
func (m *membership) locked(apply func() error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return apply()
}

// sayOwed logs the echoes a restart inherits: owed reports outlive a
// process.
func (m *membership) sayOwed(ctx context.Context) {
	rooms, err := m.store.RoomsOwingDepartureReports(ctx)
	switch {
	case err != nil:
		m.log.Error().Err(err).Msg("Reading owed departure reports failed")
	case len(rooms) > 0:
		m.log.Info().Strs("room_ids", rooms).Msg("Departure reports still owed")
	}
}
