// Package fence is the membership actor of one principal. It serializes
// departures and joins for that principal, so a local leave and its sync
// echo, or two leaves around a rejoin, are applied in the order observed,
// each in one journal transaction that advances the epoch and drops what the
// ended membership derived.
package fence

import (
	"context"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/actors"
	"github.com/mindroomd/mindroomd/journal"
)

// Deps are the actor's collaborators.
type Deps struct {
	// Membership is the principal-bound membership view.
	Membership journal.Membership
	Log        zerolog.Logger
}

// Props returns the actor's props; a failure stops it.
func Props(d Deps) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor { return &fenceActor{deps: d} },
		actor.WithGuardian(actors.StopOnFailure()), actor.WithSupervisor(actors.StopOnFailure()))
}

type fenceActor struct{ deps Deps }

// Receive implements actor.Actor.
func (a *fenceActor) Receive(ctx actor.Context) {
	bg := context.Background()
	switch m := ctx.Message().(type) {
	case *actor.Started:
		// Owed echoes outlive restarts; say what this run inherits.
		if rooms, err := a.deps.Membership.RoomsOwingDepartureReports(bg); err != nil {
			a.deps.Log.Error().Err(err).Msg("Reading owed departure reports failed")
		} else if len(rooms) > 0 {
			a.deps.Log.Info().Strs("room_ids", rooms).Msg("Departure reports still owed")
		}
	case *FenceDeparture:
		o, err := a.deps.Membership.FenceDeparture(bg, m.RoomID, m.Source, m.ObservationID)
		if err == nil {
			a.deps.Log.Info().Str("room_id", m.RoomID).Stringer("outcome", o).Msg("Departure applied")
		}
		ctx.Respond(&DepartureFenced{Outcome: o, Err: err})
	case *RecordJoin:
		ctx.Respond(&JoinRecorded{Err: a.deps.Membership.RecordJoin(bg, m.RoomID, m.ObservationID)})
	case *RetireOwedReports:
		n, err := a.deps.Membership.RetireOwedDepartureReports(bg, m.RoomIDs...)
		ctx.Respond(&OwedReportsRetired{Retired: n, Err: err})
	}
}
