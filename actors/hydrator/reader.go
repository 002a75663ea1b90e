package hydrator

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/journal"
)

// ReaderStore is what a Reader reads: pages and coverage.
type ReaderStore interface {
	journal.ConversationReader
	Covered(ctx context.Context, roomID string, thread *string) (bool, error)
}

// Reader reads conversations as a person sees them, hydrating a cold one
// first through the hydrator actor. A strict read then waits for one shared
// refetch of each message its page owes, and fails closed (journal.ErrStrictRead)
// if any cannot complete; a read that is not strict never waits for a
// refetch, and serves what the journal holds when hydration fails.
type Reader struct {
	Store ReaderStore
	Root  *actor.RootContext
	// Hydrator is the principal's hydrator actor.
	Hydrator *actor.PID
	Log      zerolog.Logger

	watch sync.Once
	gone  chan struct{} // closed once the hydrator has stopped
}

// ErrStopped fails a read that needs the hydrator after it has stopped: no
// answer would ever come.
var ErrStopped = errors.New("hydrator stopped")

var _ journal.ConversationReader = (*Reader)(nil)

// Read implements journal.ConversationReader.
func (r *Reader) Read(ctx context.Context, req journal.ReadRequest) (journal.Page, error) {
	if err := r.hydrate(ctx, req.RoomID, req.Thread); err != nil {
		if req.Strict {
			return journal.Page{}, fmt.Errorf("%w: %w", journal.ErrStrictRead, err)
		}
		r.Log.Warn().Err(err).Str("room_id", req.RoomID).Msg("Reading without hydration")
	}
	page, err := r.Store.Read(ctx, req)
	if err != nil || !req.Strict || len(page.OwedRefetch) == 0 {
		return page, err
	}
	for _, id := range page.OwedRefetch {
		if err := r.refetch(ctx, req.RoomID, id); err != nil {
			return journal.Page{}, fmt.Errorf("%w: %w", journal.ErrStrictRead, err)
		}
	}
	if page, err = r.Store.Read(ctx, req); err != nil {
		return journal.Page{}, err
	}
	if len(page.OwedRefetch) > 0 {
		// Something newer owes a refetch again already; the next strict
		// read retries.
		return journal.Page{}, fmt.Errorf("%w: %s still owes a refetch", journal.ErrStrictRead, page.OwedRefetch[0])
	}
	return page, nil
}

// hydrate makes sure a walk under the current membership covers the
// conversation, sharing one with every reader that asks meanwhile.
func (r *Reader) hydrate(ctx context.Context, room string, thread *string) error {
	covered, err := r.Store.Covered(ctx, room, thread)
	if err != nil || covered {
		return err
	}
	reply := make(chan *Hydrated, 1)
	gone := r.stopped()
	r.Root.Send(r.Hydrator, &Hydrate{RoomID: room, Thread: thread, Reply: reply})
	h, err := await(ctx, reply, gone)
	if err != nil {
		return err
	}
	return h.Err
}

func (r *Reader) refetch(ctx context.Context, room, eventID string) error {
	reply := make(chan *Refetched, 1)
	gone := r.stopped()
	r.Root.Send(r.Hydrator, &Refetch{RoomID: room, EventID: eventID, Reply: reply})
	f, err := await(ctx, reply, gone)
	if err != nil {
		return err
	}
	return f.Err
}

// await waits for the hydrator's answer, failing when ctx ends or when the
// hydrator stops first: a stopped actor drops what it is sent, and a walk
// still running when it stopped never answers.
func await[T any](ctx context.Context, reply <-chan T, gone <-chan struct{}) (T, error) {
	var zero T
	select {
	case v := <-reply:
		return v, nil
	case <-ctx.Done():
		return zero, ctx.Err()
	case <-gone:
		// An answer sent just before the stop still counts.
		select {
		case v := <-reply:
			return v, nil
		default:
			return zero, ErrStopped
		}
	}
}

// stopped returns a channel closed once the hydrator has stopped, watched
// by an actor of the Reader's own from the first read that needs it on
// (watching an actor that already stopped reports it at once).
func (r *Reader) stopped() <-chan struct{} {
	r.watch.Do(func() {
		gone, hydrator := make(chan struct{}), r.Hydrator
		r.gone = gone
		closed := false // touched on the watcher's goroutine only
		r.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
			switch m := c.Message().(type) {
			case *actor.Started:
				c.Watch(hydrator)
			case *actor.Terminated:
				if m.Who.Equal(hydrator) && !closed {
					closed = true
					close(gone)
					c.Stop(c.Self())
				}
			}
		}))
	})
	return r.gone
}
