package principal

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/matrix"
)

// Transport is the homeserver as a principal's loops use it, signed in as
// the principal's account (matrix.Client).
type Transport interface {
	// UserID is the account's Matrix user ID.
	UserID() string
	Sync(ctx context.Context, since string, timeout time.Duration) (*matrix.SyncBatch, error)
	Messages(ctx context.Context, room, from string, dir matrix.Direction, limit int) (matrix.MessagesPage, error)
	Join(ctx context.Context, room string) (string, error)
	Leave(ctx context.Context, room string) error
	// Send puts content into room under txnID and returns the event's ID:
	// the progress edits of a turn, which bypass the outbox.
	Send(ctx context.Context, room, eventType, txnID string, content json.RawMessage) (string, error)
}

// memberType is in the JSON of every membership event that escapes no
// character.
var (
	memberType = []byte(`"m.room.member"`)
	escape     = []byte(`\u`)
)

// Gap filling: a limited timeline is filled backwards from its prev_batch
// until an event the journal already holds, in pages of gapPage, and at
// most gapEvents events, so a long absence cannot make one batch unbounded.
const (
	gapPage   = 100
	gapEvents = 1000
)

// syncLoop long-polls the homeserver and admits each response as one
// batch with its next_batch token. The token advances only with a commit:
// a batch that fails is fetched again from the same token. It returns an
// error only for a fault it cannot retry (the token was revoked).
func (a *principalActor) syncLoop(ctx context.Context) error {
	since, err := a.deps.Store.SyncToken(ctx)
	if err != nil {
		return fmt.Errorf("read sync token: %w", err)
	}
	a.tokenMu.Lock()
	a.synced, a.stored = since, since
	a.tokenMu.Unlock()
	failures := 0
	for ctx.Err() == nil {
		batch, err := a.deps.Transport.Sync(ctx, since, a.deps.SyncTimeout)
		if err == nil {
			err = a.apply(ctx, since, batch)
		}
		switch {
		case err == nil:
			since, failures = batch.NextBatch, 0
			continue
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, matrix.ErrInvalidToken):
			return err
		}
		failures++
		delay := backoffAfter(failures, a.deps.BackoffBase, a.deps.BackoffMax)
		// A server that limits the rate says how long to wait: no less.
		if he := (*matrix.HTTPError)(nil); errors.As(err, &he) && he.RetryAfter > delay {
			delay = he.RetryAfter
		}
		a.log.Warn().Err(err).Int("failures", failures).Dur("retry_in", delay).Msg("Sync failed; retrying from the same token")
		if !sleep(ctx, delay) {
			return nil
		}
	}
	return nil
}

// apply admits one sync response. Membership changes of the principal's
// own account go to the fence first, so the events after them are
// admitted under the membership they belong to; the first sync (no token
// yet) is history and owes nothing, and so is whatever a room's timeline
// holds up to the principal's own join in it; events behind a limited
// timeline's gap are recovered, and answered like live ones.
func (a *principalActor) apply(ctx context.Context, since string, batch *matrix.SyncBatch) error {
	prov := journal.Live
	if since == "" {
		prov = journal.History
	}
	if c := a.deps.Crypto; c != nil {
		if err := c.ProcessSync(ctx, since, batch); err != nil {
			return fmt.Errorf("take device news: %w", err)
		}
	}
	var in []journal.Inbound
	for _, rooms := range [][]matrix.RoomTimeline{batch.Left, batch.Joined} {
		for _, r := range rooms {
			beganAt, err := a.observeMembership(ctx, r, prov)
			if err != nil {
				return err
			}
			// A timeline that holds the beginning of the principal's
			// membership (its invite, or a join without one) opens with
			// what the room said before: history, like a first sync's,
			// and so is any gap behind it.
			if r.Limited && prov == journal.Live && r.PrevBatch != "" && beganAt < 0 {
				gap, err := a.fillGap(ctx, r)
				if err != nil {
					return fmt.Errorf("fill gap in %s: %w", r.RoomID, err)
				}
				in = append(in, gap...)
			}
			for i, ev := range r.Events {
				p := prov
				if i <= beganAt {
					p = journal.History
				}
				in = append(in, journal.Inbound{RoomID: r.RoomID, Provenance: p, Event: ev})
			}
		}
	}
	for _, room := range batch.Invited {
		if err := a.fenceInvited(ctx, room); err != nil {
			return err
		}
	}
	if a.deps.AutoJoin && since == "" {
		if err := a.acceptFirst(ctx, batch.Invited); err != nil {
			return err
		}
	}
	// Before the batch is admitted, so a crash cannot lose a departure.
	if err := a.approversLeft(ctx, batch); err != nil {
		return err
	}
	a.decrypt(ctx, in)
	res, err := a.admit(ctx, since, batch, in)
	if err != nil {
		return fmt.Errorf("admit: %w", err)
	}
	a.judgeBatch(ctx, in, res)
	if err := a.keysArrived(ctx); err != nil {
		return err
	}
	for _, r := range res {
		if r.Outcome == journal.Rejected {
			a.log.Warn().Str("event_id", r.EventID).Err(r.Err).Msg("Malformed event recorded and skipped")
		}
	}
	a.caughtUp(batch)
	if a.deps.OnSynced != nil {
		a.deps.OnSynced(res)
	}
	if a.deps.AutoJoin && len(batch.Invited) > 0 {
		select {
		case a.joinWake <- struct{}{}:
		default:
		}
	}
	return nil
}

// admit admits one batch's events with the token to write beside them:
// its next_batch, or the token an invite not accepted yet holds
// (queueJoins).
func (a *principalActor) admit(ctx context.Context, since string, batch *matrix.SyncBatch, in []journal.Inbound) ([]journal.AdmitResult, error) {
	a.tokenMu.Lock()
	defer a.tokenMu.Unlock()
	token := batch.NextBatch
	if a.deps.AutoJoin && since != "" {
		token = a.queueJoins(since, batch)
	}
	res, err := a.deps.Store.AdmitBatch(ctx, in, token)
	if err != nil {
		return nil, err
	}
	a.synced, a.stored = batch.NextBatch, token
	return res, nil
}

// observeMembership applies the principal's own membership events of one
// timeline, in order: a leave, kick or ban fences, a join ends the
// departure. Each is keyed by its event ID, so a batch fetched again after
// a crash applies nothing twice. It returns the index of the last own
// event that began a membership (beginsMembership), -1 when there is none.
func (a *principalActor) observeMembership(ctx context.Context, r matrix.RoomTimeline, prov journal.Provenance) (beganAt int, err error) {
	self := a.deps.Transport.UserID()
	beganAt = -1
	for i, raw := range r.Events {
		// Admission parses every event anyway; only the few that can be a
		// membership change are parsed here as well (and any that escapes
		// a character, which could spell the type another way).
		if !bytes.Contains(raw, memberType) && !bytes.Contains(raw, escape) {
			continue
		}
		ev, err := journal.ParseEvent(journal.Inbound{RoomID: r.RoomID, Provenance: prov, Event: raw}, a.deps.Now())
		if err != nil || ev.Kind != journal.KindMembership || ev.StateKey == nil || *ev.StateKey != self {
			continue // admission records what is malformed
		}
		switch ev.Membership {
		case "join", "invite":
			if beginsMembership(ev, raw) {
				beganAt = i
			}
			if ev.Membership == "invite" {
				continue
			}
			err := a.members.locked(func() error { return a.members.join(ctx, r.RoomID, ev.ID) })
			if err != nil {
				return -1, fmt.Errorf("record join of %s: %w", r.RoomID, err)
			}
		case "leave", "ban":
			source := journal.DepartureReported
			if ev.Sender != self {
				source = journal.DepartureRemoved
			}
			var outcome journal.DepartureOutcome
			err := a.members.locked(func() (err error) {
				outcome, err = a.members.fence(ctx, r.RoomID, source, ev.ID)
				return err
			})
			if err != nil {
				return -1, fmt.Errorf("fence %s: %w", r.RoomID, err)
			}
			a.log.Info().Str("room_id", r.RoomID).Stringer("outcome", outcome).Msg("Departure reported by sync")
		}
	}
	return beganAt, nil
}

// beginsMembership reports whether an own membership event begins a
// membership: an invite (what the room says from then on is said to the
// agent), or a join that follows neither an invite nor a join (a join of a
// public room, or a profile change, which changes nothing).
func beginsMembership(ev *journal.Event, raw json.RawMessage) bool {
	switch ev.Membership {
	case "invite":
		return true
	case "join":
		prev := previousMembership(raw)
		return prev != "join" && prev != "invite"
	}
	return false
}

// previousMembership reads the membership an event replaced, from its
// prev_content (under unsigned, or top level in older formats).
func previousMembership(raw json.RawMessage) string {
	var ev struct {
		Unsigned struct {
			PrevContent struct {
				Membership string `json:"membership"`
			} `json:"prev_content"`
		} `json:"unsigned"`
		PrevContent struct {
			Membership string `json:"membership"`
		} `json:"prev_content"`
	}
	if json.Unmarshal(raw, &ev) != nil {
		return ""
	}
	if m := ev.Unsigned.PrevContent.Membership; m != "" {
		return m
	}
	return ev.PrevContent.Membership
}

// fillGap fetches the events a limited timeline skipped, newest first from
// its prev_batch, until one the journal already holds, and returns them
// oldest first as recovered.
func (a *principalActor) fillGap(ctx context.Context, r matrix.RoomTimeline) ([]journal.Inbound, error) {
	var gap []json.RawMessage
	from := r.PrevBatch
	// Retention forgets identities received before the horizon: an event
	// older than it may be one answered long ago, so the walk ends there
	// as at one it knows.
	horizon, err := a.deps.Store.IdentityHorizon(ctx)
	if err != nil {
		return nil, err
	}
	for len(gap) < gapEvents && from != "" {
		page, err := a.deps.Transport.Messages(ctx, r.RoomID, from, matrix.Backward, gapPage)
		if err != nil {
			return nil, err
		}
		for _, raw := range page.Chunk {
			// A malformed event is kept: admission records and skips it.
			if ev, err := journal.ParseEvent(journal.Inbound{RoomID: r.RoomID, Provenance: journal.Recovered, Event: raw}, a.deps.Now()); err == nil {
				if _, seen, err := a.deps.Store.AdmittedThreadID(ctx, r.RoomID, ev.ID); err != nil {
					return nil, err
				} else if seen || ev.TS < horizon {
					return recovered(r.RoomID, gap), nil
				}
				// What came before the principal's membership began was not
				// said to it: nothing it missed.
				if ev.Kind == journal.KindMembership && ev.StateKey != nil && *ev.StateKey == a.deps.Transport.UserID() &&
					beginsMembership(ev, raw) {
					return recovered(r.RoomID, gap), nil
				}
			}
			gap = append(gap, raw)
		}
		if len(page.Chunk) == 0 || page.End == from {
			break
		}
		from = page.End
	}
	if len(gap) >= gapEvents {
		a.log.Warn().Str("room_id", r.RoomID).Int("events", len(gap)).Msg("Sync gap longer than the fill bound; older missed events are not recovered")
	}
	return recovered(r.RoomID, gap), nil
}

// recovered turns a newest-first list into recovered inbound events,
// oldest first.
func recovered(room string, newestFirst []json.RawMessage) []journal.Inbound {
	out := make([]journal.Inbound, len(newestFirst))
	for i, raw := range newestFirst {
		out[len(out)-1-i] = journal.Inbound{RoomID: room, Provenance: journal.Recovered, Event: raw}
	}
	return out
}

// fenceInvited ends the membership an invite shows to be over. An invite
// to a room the journal still has the principal in means it was removed
// (kicked, banned, or it left from elsewhere) while no sync showed it: a
// daemon that was down, or a timeline too long to hold the removal. The
// fence goes first, so nothing of the old membership is answered in the
// next one. The observation is keyed by the room and the epoch the invite
// ended, so a batch fetched again after a crash fences nothing twice. A room the
// journal never heard of reads as joined at epoch 0: fencing it only
// records the room, which the join then enters.
//
// The one exception is the membership this run itself began by accepting
// an invite (accept), until a sync has shown the room joined or left
// (caughtUp): a homeserver may list the accepted invite again until its
// sync stream has the join, and that listing ends nothing.
func (a *principalActor) fenceInvited(ctx context.Context, room string) error {
	epoch, departed, err := a.deps.Store.RoomEpoch(ctx, room)
	if err != nil {
		return fmt.Errorf("read membership of %s: %w", room, err)
	}
	if departed {
		return nil
	}
	var outcome journal.DepartureOutcome
	live := false
	err = a.members.locked(func() (err error) {
		// Checked under the membership lock, which accept records its
		// join under: an epoch read after that join finds it here.
		if live = a.acceptedAt(room, epoch); live {
			return nil
		}
		// Observations are keyed per principal, not per room: the room is
		// part of the key, or one room's fence would pass for another's.
		outcome, err = a.members.fence(ctx, room, journal.DepartureRemoved, "invite@"+room+"@"+strconv.FormatInt(epoch, 10))
		return err
	})
	if err != nil {
		return fmt.Errorf("fence %s before its invite: %w", room, err)
	}
	if live {
		a.log.Debug().Str("room_id", room).Int64("epoch", epoch).Msg("An accepted invite listed again; the membership it began goes on")
		return nil
	}
	a.log.Info().Str("room_id", room).Int64("epoch", epoch).Stringer("outcome", outcome).Msg("Invited to a room the journal had the agent in; the old membership is fenced")
	return nil
}

// pendingJoin is an invite not accepted yet.
type pendingJoin struct {
	// heldAt is the token of the sync that listed the invite: the sync
	// token written with later batches stays there until it is accepted.
	heldAt string
	// order is when it was listed, so the oldest holds the token.
	order    int
	failures int
	due      time.Time
}

// queueJoins keeps the invites of an incremental batch for the join loop
// and returns the sync token to write with the batch.
//
// A homeserver lists an invite in the sync that brings it, never again, so
// an invite whose join fails (a rate limit is enough) is kept and retried
// with backoff. It is kept durably through the token itself: the token
// written stays at the since of the oldest batch whose invite is not
// accepted, so a restart syncs from there and the server lists the invite
// again. What that sync brings again is deduplicated; nothing of the
// journal, and no invite, is lost, which a list kept in memory, or a
// marker only this daemon reads, would not promise.
func (a *principalActor) queueJoins(since string, batch *matrix.SyncBatch) string {
	a.joinMu.Lock()
	defer a.joinMu.Unlock()
	// A room joined from elsewhere, or whose invite was withdrawn or
	// refused, needs no join any more.
	for _, rooms := range [][]matrix.RoomTimeline{batch.Joined, batch.Left} {
		for _, r := range rooms {
			delete(a.joins, r.RoomID)
		}
	}
	for _, room := range batch.Invited {
		if _, ok := a.accepted[room]; ok {
			continue // listed again, accepted already (fenceInvited)
		}
		if _, ok := a.joins[room]; !ok {
			a.joinOrder++
			a.joins[room] = &pendingJoin{heldAt: since, order: a.joinOrder, due: a.deps.Now()}
		}
	}
	return a.heldToken(batch.NextBatch, "")
}

// heldToken is the token the oldest invite kept holds, other than
// except's, or next when none does. The caller holds joinMu.
func (a *principalActor) heldToken(next, except string) string {
	token, oldest := next, 0
	for room, p := range a.joins {
		if room != except && (oldest == 0 || p.order < oldest) {
			token, oldest = p.heldAt, p.order
		}
	}
	return token
}

// acceptFirst accepts the invites of the first sync before it is admitted.
// No earlier token exists to hold (a sync from none is history), so a join
// that fails and may succeed later fails the batch, which is fetched again
// after the sync's backoff; the joins that succeeded show as joined rooms
// by then.
func (a *principalActor) acceptFirst(ctx context.Context, rooms []string) error {
	for _, room := range rooms {
		err := a.accept(ctx, room)
		switch {
		case err == nil:
		case refused(err):
			a.log.Error().Err(err).Str("room_id", room).Msg("The homeserver refused to accept an invite; it is dropped")
		default:
			return fmt.Errorf("accept invite to %s: %w", room, err)
		}
	}
	return nil
}

// joinLoop accepts the invites queueJoins keeps, each as soon as it is
// due, and retries a failed one with backoff (no sooner than a rate limit
// asks) until it is accepted, refused, or no longer needed.
func (a *principalActor) joinLoop(ctx context.Context) error {
	for ctx.Err() == nil {
		room, wait := a.nextJoin()
		if room == "" {
			a.awaitJoin(ctx, wait)
			continue
		}
		err := a.accept(ctx, room)
		if ctx.Err() != nil {
			return nil
		}
		a.joinDone(room, err)
	}
	return nil
}

// awaitJoin waits for news of an invite, or wait when it is not 0.
func (a *principalActor) awaitJoin(ctx context.Context, wait time.Duration) {
	var due <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		due = t.C
	}
	select {
	case <-ctx.Done():
	case <-a.joinWake:
	case <-due:
	}
}

// nextJoin returns the oldest invite due, or how long until one is (0
// when none is kept).
func (a *principalActor) nextJoin() (room string, wait time.Duration) {
	a.joinMu.Lock()
	defer a.joinMu.Unlock()
	now, order := a.deps.Now(), 0
	for r, p := range a.joins {
		if d := p.due.Sub(now); d > 0 {
			if wait == 0 || d < wait {
				wait = d
			}
		} else if order == 0 || p.order < order {
			room, order = r, p.order
		}
	}
	return room, wait
}

// joinDone records the outcome of one attempt: an accepted or refused
// invite is no longer kept, any other failure is due again after a
// backoff.
func (a *principalActor) joinDone(room string, err error) {
	a.joinMu.Lock()
	defer a.joinMu.Unlock()
	p, ok := a.joins[room]
	if !ok {
		return
	}
	if err == nil || refused(err) {
		delete(a.joins, room)
		if err != nil {
			a.log.Error().Err(err).Str("room_id", room).Msg("The homeserver refused to accept an invite; it is dropped")
		}
		return
	}
	p.failures++
	delay := backoffAfter(p.failures, a.deps.BackoffBase, a.deps.BackoffMax)
	if he := (*matrix.HTTPError)(nil); errors.As(err, &he) && he.RetryAfter > delay {
		delay = he.RetryAfter
	}
	p.due = a.deps.Now().Add(delay)
	a.log.Warn().Err(err).Str("room_id", room).Int("failures", p.failures).Dur("retry_in", delay).Msg("Accepting an invite failed; retrying")
}

// refused reports a join the homeserver refused for good: a 4xx other
// than a rate limit or a refused token (the sync loop stops on that one).
func refused(err error) bool {
	var he *matrix.HTTPError
	return errors.As(err, &he) && he.Status >= 400 && he.Status < 500 && he.Status != 429 &&
		!errors.Is(err, matrix.ErrInvalidToken)
}

// accept joins an invited room. The join's own event arrives by sync later
// and is recorded then; recording it now as well means what the same
// sync's next batches bring is already under the new membership. The
// token the invite held is let go of first (release).
func (a *principalActor) accept(ctx context.Context, room string) error {
	if _, err := a.deps.Transport.Join(ctx, room); err != nil {
		return err
	}
	if err := a.release(ctx, room); err != nil {
		return fmt.Errorf("release the sync token held for %s: %w", room, err)
	}
	err := a.members.locked(func() error {
		if err := a.members.join(ctx, room, ""); err != nil {
			return err
		}
		epoch, _, err := a.deps.Store.RoomEpoch(ctx, room)
		if err != nil {
			return err
		}
		a.joinMu.Lock()
		a.accepted[room] = epoch
		a.joinMu.Unlock()
		return nil
	})
	if err != nil {
		return fmt.Errorf("record join of %s: %w", room, err)
	}
	a.log.Info().Str("room_id", room).Msg("Invite accepted")
	return nil
}

// acceptedAt reports whether the membership at epoch of room is the one
// this run began by accepting its invite, and no sync has shown the room
// since.
func (a *principalActor) acceptedAt(room string, epoch int64) bool {
	a.joinMu.Lock()
	defer a.joinMu.Unlock()
	at, ok := a.accepted[room]
	return ok && at == epoch
}

// caughtUp forgets the accepted invites of the rooms an admitted batch
// shows joined or left: the homeserver's sync stream has the join by then,
// so an invite it lists later is a new one.
func (a *principalActor) caughtUp(batch *matrix.SyncBatch) {
	a.joinMu.Lock()
	defer a.joinMu.Unlock()
	for _, rooms := range [][]matrix.RoomTimeline{batch.Joined, batch.Left} {
		for _, r := range rooms {
			delete(a.accepted, r.RoomID)
		}
	}
}

// release writes the sync token an accepted invite no longer holds back,
// before the journal records the join, and stops keeping the invite.
//
// The stored token is where a room walk starts (a sync token is where the
// sync stands). Held at the since of the batch that listed the invite, it
// stands before what the room said while the agent was out of it, which
// no batch brought and which is history of the new membership: a walk
// from there, as soon as the journal has the agent in, would miss it and
// still cover the room. The batch that listed the invite was admitted, so
// from the invite's point of view the sync stands at its next_batch; an
// older invite not accepted yet still holds the token where it was.
// Written and forgotten under tokenMu, no batch in between writes the
// held token back; a write that fails keeps the invite, retried.
func (a *principalActor) release(ctx context.Context, room string) error {
	a.tokenMu.Lock()
	defer a.tokenMu.Unlock()
	a.joinMu.Lock()
	token := a.heldToken(a.synced, room)
	a.joinMu.Unlock()
	if token != a.stored {
		if _, err := a.deps.Store.AdmitBatch(ctx, nil, token); err != nil {
			return err
		}
		a.stored = token
	}
	a.joinMu.Lock()
	delete(a.joins, room)
	a.joinMu.Unlock()
	return nil
}

// leaveRoom is a local leave: the fence first, so nothing of the ending
// membership is answered or sent afterwards, then the homeserver. The sync
// echo of the leave later consumes the report the fence owes.
//
// A leave the homeserver did not take would leave the agent in the room
// and fenced for good: silent, every later message context-only. So a
// failed leave resumes the membership: the owed echo is retired and a
// join recorded, under the new epoch, so what the fence settled stays
// settled and the caller may leave again. When the leave took effect
// after all (an answer lost on the way back), its echo then finds nothing
// owed and fences. A leave of a room the journal had the agent out of
// already resumes nothing.
func (a *principalActor) leaveRoom(ctx context.Context, room string) error {
	// The membership stays locked to the end, so the sync's echo of this
	// leave is applied after whatever the leave did, never in between.
	return a.members.locked(func() error {
		outcome, err := a.members.fence(ctx, room, journal.DepartureLocal, "")
		if err != nil {
			return fmt.Errorf("fence %s: %w", room, err)
		}
		if err := a.deps.Transport.Leave(ctx, room); err != nil {
			if outcome != journal.Fenced {
				// The agent was out already; there is nothing to resume.
				return fmt.Errorf("leave %s: %w", room, err)
			}
			if rerr := a.resume(ctx, room); rerr != nil {
				a.log.Error().Err(rerr).Str("room_id", room).Msg("Resuming the membership after a failed leave failed; the room stays fenced")
			}
			return fmt.Errorf("leave %s: %w", room, err)
		}
		a.log.Info().Str("room_id", room).Msg("Left room")
		return nil
	})
}

// resume undoes a local leave the homeserver did not take (leaveRoom).
// The leave's failure may come from its context, so resuming does not
// wait on it.
func (a *principalActor) resume(ctx context.Context, room string) error {
	ctx = context.WithoutCancel(ctx)
	if _, err := a.members.retireOwed(ctx, room); err != nil {
		return fmt.Errorf("retire owed reports: %w", err)
	}
	if err := a.members.join(ctx, room, ""); err != nil {
		return fmt.Errorf("record join: %w", err)
	}
	a.log.Warn().Str("room_id", room).Msg("The homeserver did not take the leave; the membership goes on under a new epoch")
	return nil
}
