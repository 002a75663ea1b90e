package hydrator

import (
	"context"
	"fmt"

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
}

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
	r.Root.Send(r.Hydrator, &Hydrate{RoomID: room, Thread: thread, Reply: reply})
	select {
	case h := <-reply:
		return h.Err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *Reader) refetch(ctx context.Context, room, eventID string) error {
	reply := make(chan *Refetched, 1)
	r.Root.Send(r.Hydrator, &Refetch{RoomID: room, EventID: eventID, Reply: reply})
	select {
	case f := <-reply:
		return f.Err
	case <-ctx.Done():
		return ctx.Err()
	}
}
