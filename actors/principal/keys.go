package principal

import (
	"context"
	"fmt"
	"time"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/matrix"
)

// Crypto is an account's end-to-end encryption as the principal drives it
// (e2ee.Machine).
type Crypto interface {
	// ProcessSync takes a sync response's device news (room keys among
	// its to-device messages) and the room state encryption reads, before
	// the batch is admitted.
	ProcessSync(ctx context.Context, since string, b *matrix.SyncBatch) error
	// Decrypt returns an event as the journal should admit it: decrypted,
	// awaiting its key, or marked undecryptable. An event given with its
	// AwaitingSession set is one tried again, returned as it was while its
	// key is still missing.
	Decrypt(ctx context.Context, in journal.Inbound) journal.Inbound
	// TakeReceived returns the megolm sessions stored since the last call.
	TakeReceived() []journal.KeyWait
	// RequestKeys asks, best-effort and once per session, for the keys
	// events wait on.
	RequestKeys(ctx context.Context)
}

// Key resolution reads waits and their events in pages of this size.
const keyPage = 100

// keySweep is how often, at most, the keys loop settles events past their
// deadline, retries every wait (a key a crash kept from resolving its
// events) and tells rooms about keys still missing; a shorter
// KeyNoticeAfter makes it run as often as that.
const keySweep = time.Minute

// decrypt replaces each event of a batch by what the journal admits of it.
func (a *principalActor) decrypt(ctx context.Context, in []journal.Inbound) {
	if a.deps.Crypto == nil {
		return
	}
	for i := range in {
		in[i] = a.deps.Crypto.Decrypt(ctx, in[i])
	}
}

// keysArrived resolves the events waiting on the sessions the last sync
// brought, and asks for the keys still missing.
func (a *principalActor) keysArrived(ctx context.Context) error {
	c := a.deps.Crypto
	if c == nil {
		return nil
	}
	for _, w := range c.TakeReceived() {
		if err := a.resolveWait(ctx, w); err != nil {
			return err
		}
	}
	c.RequestKeys(ctx)
	return nil
}

// keysLoop, at start and every keySweep (or KeyNoticeAfter), settles events past their
// deadline and resolves every wait whose key the crypto store holds: a
// crash between storing a key and resolving its events leaves them for
// this pass.
func (a *principalActor) keysLoop(ctx context.Context) error {
	every := keySweep
	if n := a.deps.KeyNoticeAfter; n > 0 && n < every {
		every = n
	}
	for {
		if err := a.sweepKeys(ctx); err != nil && ctx.Err() == nil {
			a.log.Warn().Err(err).Msg("Key sweep failed; retried at the next one")
		}
		if !sleep(ctx, every) {
			return nil
		}
	}
}

// sweepKeys is one pass of keysLoop.
func (a *principalActor) sweepKeys(ctx context.Context) error {
	cutoff := a.deps.Now().Add(-a.deps.KeyDeadline).UnixMilli()
	n, err := a.deps.Store.ExpireAwaiting(ctx, cutoff)
	if err != nil {
		return fmt.Errorf("settle undecryptable events: %w", err)
	}
	if n > 0 {
		a.log.Warn().Int("events", n).Dur("deadline", a.deps.KeyDeadline).
			Msg("Encrypted events whose keys never came are settled as undecryptable")
	}
	waits, err := a.deps.Store.KeyWaits(ctx, keyPage)
	if err != nil {
		return fmt.Errorf("read key waits: %w", err)
	}
	for _, w := range waits {
		if err := a.resolveWait(ctx, w); err != nil {
			return err
		}
	}
	a.deps.Crypto.RequestKeys(ctx)
	return nil
}

// tellRoom sends a room, once per session, a notice that a live message
// has waited KeyNoticeAfter for its key: the person otherwise sees only
// silence. The notice goes through the outbox under the session's
// delivery ID, so asking again sends nothing more.
func (a *principalActor) tellRoom(ctx context.Context, w journal.KeyWait, waiting []journal.AwaitingEvent) error {
	if a.deps.KeyNoticeAfter <= 0 {
		return nil
	}
	due := a.deps.Now().Add(-a.deps.KeyNoticeAfter).UnixMilli()
	for _, e := range waiting {
		if e.Provenance == journal.History || e.ReceivedMS > due {
			continue
		}
		_, err := a.deps.Store.EnqueueAndSettle(ctx, journal.KeyNotice(w.RoomID, w.Session))
		if err != nil && !journal.DropsTurn(err) {
			return fmt.Errorf("tell %s a key is missing: %w", w.RoomID, err)
		}
		return nil
	}
	return nil
}

// resolveWait decrypts and installs the events waiting on one session,
// those the key opens; the rest keep waiting.
func (a *principalActor) resolveWait(ctx context.Context, w journal.KeyWait) error {
	for {
		events, err := a.deps.Store.AwaitingFor(ctx, w.RoomID, w.Session, keyPage)
		if err != nil {
			return fmt.Errorf("read events awaiting a key: %w", err)
		}
		resolved := 0
		var still []journal.AwaitingEvent
		for _, e := range events {
			clear := a.deps.Crypto.Decrypt(ctx, journal.Inbound{RoomID: e.RoomID, Provenance: e.Provenance, Event: e.Event,
				AwaitingSession: e.Session})
			if clear.AwaitingSession != "" && clear.Undecryptable == "" {
				still = append(still, e) // the key is still missing
				continue
			}
			out, err := a.deps.Store.ResolveAwaiting(ctx, e.Seq, clear)
			if err != nil {
				return fmt.Errorf("resolve %s: %w", e.EventID, err)
			}
			resolved++
			// What the key opened may be a vote on a card: it is judged
			// as one that a sync brought would be. The loop is woken, not
			// left to the commit's hint, which may have passed it by.
			a.approvals.rescanNow()
			a.log.Info().Str("event_id", e.EventID).Str("room_id", e.RoomID).Stringer("outcome", out).
				Msg("An encrypted event's key came")
		}
		if err := a.tellRoom(ctx, w, still); err != nil {
			return err
		}
		if len(events) < keyPage || resolved == 0 {
			return nil
		}
	}
}
