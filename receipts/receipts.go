// Package receipts marks an agent's rooms read: once the agent has dealt
// with an event (answered it, or settled it in any way, as configured), the
// room's read marker moves to it. Receipts are best-effort and coalesced:
// one per room per flush, for the newest event dealt with, sent off the
// delivery path, so a slow or refusing homeserver never holds up an answer
// and a lost receipt costs only a stale marker.
package receipts

import (
	"context"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journal"
)

// Mode is when an event counts as read.
type Mode uint8

// Modes.
const (
	// Off sends no receipts.
	Off Mode = iota
	// OnSettle marks an event read once it settled: answered, ignored or
	// dropped.
	OnSettle
	// OnAnswer marks an event read once an answer to it was enqueued.
	OnAnswer
)

// DefaultDelay is how long the first event dealt with waits for others of
// its room before its receipt goes out.
const DefaultDelay = 500 * time.Millisecond

// sendTimeout bounds one receipt.
const sendTimeout = 10 * time.Second

// Sender sends one read receipt (*matrix.Client).
type Sender interface {
	ReadReceipt(ctx context.Context, room, eventID string) error
}

// Deps configure New.
type Deps struct {
	Sender Sender
	Mode   Mode
	// Delay coalesces receipts (DefaultDelay).
	Delay time.Duration
	Log   zerolog.Logger
}

// Receipts gathers the newest event dealt with per room and sends their
// receipts.
type Receipts struct {
	deps Deps
	mu   sync.Mutex
	// newest is the event to mark read, per room, since the last flush.
	newest map[string]string
	wake   chan struct{}
}

// New returns the receipts of one agent; Run sends them.
func New(deps Deps) *Receipts {
	if deps.Delay <= 0 {
		deps.Delay = DefaultDelay
	}
	return &Receipts{deps: deps, newest: make(map[string]string), wake: make(chan struct{}, 1)}
}

// mark is one event dealt with, in its room.
type mark struct{ room, eventID string }

// note records the events of one settlement as dealt with, all at once:
// a flush that starts between them would otherwise mark an older one of
// them read on its own, a receipt the next flush at once supersedes.
func (r *Receipts) note(marks ...mark) {
	if len(marks) == 0 {
		return
	}
	r.mu.Lock()
	for _, m := range marks {
		r.newest[m.room] = m.eventID
	}
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run sends receipts until ctx ends; what is gathered then is dropped, as
// a receipt is only ever a hint to people's clients.
func (r *Receipts) Run(ctx context.Context) {
	if r.deps.Mode == Off {
		return
	}
	timer := time.NewTimer(0)
	<-timer.C
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		}
		timer.Reset(r.deps.Delay)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		r.mu.Lock()
		batch := r.newest
		r.newest = make(map[string]string, len(batch))
		r.mu.Unlock()
		for room, eventID := range batch {
			sctx, cancel := context.WithTimeout(ctx, sendTimeout)
			err := r.deps.Sender.ReadReceipt(sctx, room, eventID)
			cancel()
			if err != nil && ctx.Err() == nil {
				r.deps.Log.Warn().Err(err).Str("room_id", room).Str("event_id", eventID).Msg("Read receipt failed; skipped")
			}
		}
	}
}

// Store is a principal's journal view that tells Receipts what it
// settles. Everything that settles an event on the principal's behalf (its
// own turns and the agent API) goes through it.
type Store struct {
	journal.PrincipalStore
	r *Receipts
}

// Wrap returns v reporting its settlements to r.
func Wrap(v journal.PrincipalStore, r *Receipts) *Store { return &Store{PrincipalStore: v, r: r} }

// EnqueueAndSettle implements journal.Outbox: an answer's sources are
// dealt with once it commits.
func (s *Store) EnqueueAndSettle(ctx context.Context, req journal.EnqueueRequest) (journal.EnqueueResult, error) {
	res, err := s.PrincipalStore.EnqueueAndSettle(ctx, req)
	if err == nil && s.r.deps.Mode != Off {
		marks := make([]mark, len(req.Sources))
		for i, src := range req.Sources {
			marks[i] = mark{req.RoomID, src}
		}
		s.r.note(marks...)
	}
	return res, err
}

// Settle implements journal.Replay: with OnSettle, events settled without
// an answer are dealt with too.
func (s *Store) Settle(ctx context.Context, eventIDs ...string) (int, error) {
	n, err := s.PrincipalStore.Settle(ctx, eventIDs...)
	if err != nil || n == 0 || s.r.deps.Mode != OnSettle {
		return n, err
	}
	marks := make([]mark, 0, len(eventIDs))
	for _, id := range eventIDs {
		e, seen, err := s.PrincipalStore.AdmittedEvent(ctx, id)
		if err != nil || !seen {
			// Only a receipt is lost; the settlement stands.
			continue
		}
		marks = append(marks, mark{e.RoomID, id})
	}
	s.r.note(marks...)
	return n, nil
}

// Hints is the wrapped view's after-commit bus, when it has one.
func (s *Store) Hints() *hint.Bus {
	if h, ok := s.PrincipalStore.(interface{ Hints() *hint.Bus }); ok {
		return h.Hints()
	}
	return nil
}
