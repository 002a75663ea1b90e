// Package hydrator is the actor that fetches a cold conversation's history
// from the homeserver and pays refresh debts, for one principal.
//
// A conversation (a room, or a thread by its root) is cold while no walk
// under the current membership covers it. The first reader asks for a walk;
// readers asking meanwhile share it. A walk fetches backwards up to a window
// of logical messages and a ceiling of raw events, installs what it fetched
// as history in epoch-checked chunks while it goes on fetching, and ends by
// publishing a coverage marker. The point refetch re-reads one message whose
// visible revision is owed and installs it only while nothing newer won.
// There is no background work: everything runs because a reader asked.
package hydrator

import (
	"context"
	"encoding/json"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/actors"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/matrix"
)

// Defaults for Deps.
const (
	// DefaultWindow is how many logical messages a walk fetches.
	DefaultWindow = 200
	// DefaultCeiling bounds the raw events one walk fetches, edits,
	// reactions and state included.
	DefaultCeiling = 2000
	// DefaultPageSize is the events asked for per /messages request;
	// Dendrite serves at most 100.
	DefaultPageSize = 100
	// DefaultRelationsPageSize is the events asked for per /relations
	// request. Dendrite v0.13 answers a larger page with only its oldest
	// 20 events yet a next_batch past all of them, silently losing the
	// rest, so a walk never asks for more.
	DefaultRelationsPageSize = 20
	// DefaultTimeout bounds one walk or refetch.
	DefaultTimeout = 2 * time.Minute
)

// Transport is the homeserver as a walk reads it (*matrix.Client).
type Transport interface {
	Messages(ctx context.Context, room, from string, dir matrix.Direction, limit int) (matrix.MessagesPage, error)
	Relations(ctx context.Context, room, eventID, relType, from string, limit int) (matrix.RelationsPage, error)
	Event(ctx context.Context, room, eventID string) (json.RawMessage, error)
}

// Store is the principal-bound journal as the hydrator uses it.
type Store interface {
	journal.Hydration
	RoomEpoch(ctx context.Context, roomID string) (epoch int64, departed bool, err error)
	// SyncToken is where the principal's sync stands: a room walk starts
	// there, not at the room's newest event.
	SyncToken(ctx context.Context) (string, error)
}

// Deps are the actor's collaborators.
type Deps struct {
	Store     Store
	Transport Transport
	// Window, Ceiling, PageSize, RelationsPageSize and Timeout default to
	// the constants above.
	Window, Ceiling, PageSize, RelationsPageSize int
	Timeout                                      time.Duration
	Now                                          func() time.Time
	Log                                          zerolog.Logger
	// Decrypt, when set, returns a fetched event as the journal should
	// install it: decrypted, awaiting its key, or marked undecryptable
	// (principal.Crypto's Decrypt). History's keys that are missing wait
	// like live ones.
	Decrypt func(context.Context, journal.Inbound) journal.Inbound
	// Finished, when set, learns of every finished walk and refetch and
	// how it ended (metrics count requests, events and chunks here). It
	// runs on the actor: it must not block.
	Finished func(Walk, error)
}

func (d *Deps) defaults() {
	if d.Window <= 0 {
		d.Window = DefaultWindow
	}
	if d.Ceiling <= 0 {
		d.Ceiling = DefaultCeiling
	}
	if d.PageSize <= 0 {
		d.PageSize = DefaultPageSize
	}
	if d.RelationsPageSize <= 0 {
		d.RelationsPageSize = DefaultRelationsPageSize
	}
	if d.Timeout <= 0 {
		d.Timeout = DefaultTimeout
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Decrypt == nil {
		d.Decrypt = func(_ context.Context, in journal.Inbound) journal.Inbound { return in }
	}
}

// history is a fetched event as the journal installs it.
func (d *Deps) history(ctx context.Context, room string, raw json.RawMessage) journal.Inbound {
	return d.Decrypt(ctx, journal.Inbound{RoomID: room, Provenance: journal.History, Event: raw})
}

// Props returns the actor's props; a failure stops it.
func Props(d Deps) *actor.Props {
	d.defaults()
	return actor.PropsFromProducer(func() actor.Actor {
		return &hydratorActor{deps: &d, walks: map[conversation][]chan<- *Hydrated{}, refetches: map[message][]chan<- *Refetched{}}
	}, actor.WithGuardian(actors.StopOnFailure()), actor.WithSupervisor(actors.StopOnFailure()))
}

// conversation keys a walk; message keys a refetch.
type (
	conversation struct{ room, thread string }
	message      struct{ room, event string }
)

type hydratorActor struct {
	deps      *Deps
	walks     map[conversation][]chan<- *Hydrated
	refetches map[message][]chan<- *Refetched
	// life ends the walks in flight when the actor stops.
	life context.Context
	stop context.CancelFunc
}

// Receive implements actor.Actor.
func (a *hydratorActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		a.life, a.stop = context.WithCancel(context.Background())
	case *actor.Stopping:
		a.stop()
	case *Hydrate:
		key := conversation{room: m.RoomID}
		if m.Thread != nil {
			key.thread = *m.Thread
		}
		waiting, running := a.walks[key]
		a.walks[key] = append(waiting, m.Reply)
		if !running {
			a.spawn(ctx, func(c context.Context) any {
				w, err := a.deps.hydrate(c, m.RoomID, m.Thread)
				return &walkFinished{key: key, walk: w, err: err}
			})
		}
	case *walkFinished:
		a.logWalk(m.walk, m.err)
		for _, reply := range a.walks[m.key] {
			reply <- &Hydrated{Walk: m.walk, Err: m.err}
		}
		delete(a.walks, m.key)
	case *Refetch:
		key := message{room: m.RoomID, event: m.EventID}
		waiting, running := a.refetches[key]
		a.refetches[key] = append(waiting, m.Reply)
		if !running {
			a.spawn(ctx, func(c context.Context) any {
				o, w, err := a.deps.refetch(c, m.RoomID, m.EventID)
				return &refetchFinished{key: key, outcome: o, walk: w, err: err}
			})
		}
	case *refetchFinished:
		a.logWalk(m.walk, m.err)
		for _, reply := range a.refetches[m.key] {
			reply <- &Refetched{Outcome: m.outcome, Walk: m.walk, Err: m.err}
		}
		delete(a.refetches, m.key)
	}
}

// spawn runs work off the actor's goroutine, bounded by the timeout and
// the actor's life, and sends its result back to the actor.
func (a *hydratorActor) spawn(ctx actor.Context, work func(context.Context) any) {
	self, root := ctx.Self(), ctx.ActorSystem().Root
	life, timeout := a.life, a.deps.Timeout
	go func() {
		c, cancel := context.WithTimeout(life, timeout)
		defer cancel()
		root.Send(self, work(c))
	}()
}

// logWalk writes the one line every finished walk and refetch gets.
func (a *hydratorActor) logWalk(w Walk, err error) {
	if a.deps.Finished != nil {
		a.deps.Finished(w, err)
	}
	if w.Covered {
		return
	}
	e := a.deps.Log.Info()
	if err != nil {
		e = a.deps.Log.Warn().Err(err)
	}
	e.Str("kind", w.Kind).Str("room_id", w.RoomID).Str("thread_id", w.Thread).Int("requests", w.Requests).
		Int("events", w.Events).Int("installed", w.Installed).Int("chunks", w.Chunks).Int("messages", w.Messages).
		Bool("complete", w.Complete).Dur("took", w.Took).Msg("Hydration walk finished")
}

// hydrate walks a conversation unless a walk under the current membership
// already covers it (a reader may have asked just as an earlier walk
// finished).
func (d *Deps) hydrate(ctx context.Context, room string, thread *string) (Walk, error) {
	w := Walk{Kind: "room", RoomID: room}
	if thread != nil {
		w.Kind, w.Thread = "thread", *thread
	}
	covered, err := d.Store.Covered(ctx, room, thread)
	if err != nil {
		return w, err
	}
	if covered {
		w.Covered = true
		return w, nil
	}
	return d.run(ctx, w, thread, func(ctx context.Context, wk *walker) error {
		if thread != nil {
			return wk.threadWalk(ctx, *thread)
		}
		return wk.roomWalk(ctx)
	})
}
