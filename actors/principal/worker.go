package principal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/mindroomd/mindroomd/agent"
	"time"

	"github.com/google/uuid"

	"github.com/mindroomd/mindroomd/journal"
)

// workPage is how many pending events one read of the backlog takes.
const workPage = 64

// retry is a turn whose agent failed, waiting out its backoff.
type retry struct {
	failures int
	until    time.Time
}

// workLoop offers the principal's pending work to the agent in receipt
// order, after every commit that may have added some and whenever a failed
// turn's backoff ends. A failed turn waits alone: the events behind it are
// offered meanwhile.
func (a *principalActor) workLoop(ctx context.Context) error {
	sub := a.deps.Hints.Subscribe(a.deps.Store.Principal().String())
	defer sub.Close()
	retries := make(map[string]retry)
	// An unreadable row stays pending for an operator to see; it is
	// reported once per run, not on every pass over the backlog.
	reported := make(map[int64]bool)
	for {
		next, err := a.offerBacklog(ctx, retries, reported)
		if err != nil && ctx.Err() == nil {
			a.log.Error().Err(err).Msg("Reading pending work failed")
			next = a.deps.Now().Add(a.deps.BackoffBase)
		}
		var (
			due   <-chan time.Time
			timer *time.Timer
		)
		if !next.IsZero() {
			timer = time.NewTimer(max(next.Sub(a.deps.Now()), 0))
			due = timer.C
		}
		select {
		case <-ctx.Done():
		case <-sub.C():
		case <-due:
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// offerBacklog offers every pending event not waiting out a backoff, once,
// reports unreadable rows not reported yet, and returns when the earliest
// backoff ends (zero when none waits). A pass over the whole backlog
// forgets the backoffs and reports of events no longer pending (answered
// through the API, ignored, redacted, fenced), so neither map outgrows
// the backlog.
func (a *principalActor) offerBacklog(ctx context.Context, retries map[string]retry, reported map[int64]bool) (time.Time, error) {
	var (
		after int64
		next  time.Time
	)
	pendingIDs, pendingSeqs := make(map[string]bool), make(map[int64]bool)
	for {
		page, err := a.deps.Store.Pending(ctx, workPage, after)
		if err != nil {
			return next, err
		}
		for _, u := range page.Unreadable {
			pendingSeqs[u.Seq] = true
			if !reported[u.Seq] {
				reported[u.Seq] = true
				a.log.Error().Err(u.Err).Str("event_id", u.EventID).Msg("Pending event unreadable; skipped")
			}
		}
		for _, e := range page.Events {
			if ctx.Err() != nil {
				return next, nil
			}
			pendingIDs[e.EventID] = true
			if r, ok := retries[e.EventID]; ok && r.until.After(a.deps.Now()) {
				next = earliest(next, r.until)
				continue
			}
			if err := a.offer(ctx, e); err != nil {
				if ctx.Err() != nil {
					return next, nil
				}
				r := retries[e.EventID]
				r.failures++
				r.until = a.deps.Now().Add(backoffAfter(r.failures, a.deps.BackoffBase, a.deps.BackoffMax))
				retries[e.EventID] = r
				next = earliest(next, r.until)
				if errors.Is(err, errCardInFlight) {
					// A vote, no turn: the approvals loop judges it.
					continue
				}
				a.log.Warn().Err(err).Str("event_id", e.EventID).Int("failures", r.failures).
					Time("retry_at", r.until).Msg("Turn failed; the event stays pending")
				continue
			}
			delete(retries, e.EventID)
		}
		if !page.More {
			for id := range retries {
				if !pendingIDs[id] {
					delete(retries, id)
				}
			}
			for seq := range reported {
				if !pendingSeqs[seq] {
					delete(reported, seq)
				}
			}
			return next, nil
		}
		after = page.Next
	}
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || b.Before(a) {
		return b
	}
	return a
}

// offer runs one turn. The agent's answer is recorded in the turn record,
// in a commit of its own, before the transaction that enqueues the reply
// and settles the event: once the agent has answered, a retry or a restart
// sends the recorded answer and never asks the agent again. (An agent whose
// work takes long would record its result on its own first.) A reaction is
// recorded as the reaction it is, and sent again as one. An agent that asks
// a person about a call leaves the event pending: it is not offered while
// the call is open, and then offered again with the decision.
func (a *principalActor) offer(ctx context.Context, e journal.PendingEvent) error {
	// A vote on a card, or a card's redaction, is never a turn.
	if handled, err := a.pendingCardEvent(ctx, e); handled || err != nil {
		return err
	}
	thread, _, err := a.deps.Store.AdmittedThreadID(ctx, e.RoomID, e.EventID)
	if err != nil {
		return fmt.Errorf("read thread: %w", err)
	}
	id := journal.ReplyDeliveryID(e.EventID)
	rec, answered, err := a.deps.Store.TurnForEvent(ctx, e.EventID)
	if err != nil {
		return fmt.Errorf("read turn record: %w", err)
	}
	// Only a turn that can be answered has a placeholder: a reaction or a
	// redaction is never answered, and its placeholder would only be
	// withdrawn again, or stay in the room had it gone out meanwhile.
	withPlaceholder := a.deps.Placeholder != nil && e.Kind.TurnBacked()
	var content json.RawMessage
	switch {
	case answered && rec.State == journal.TurnDelivered:
		_, err := a.deps.Store.Settle(ctx, e.EventID)
		return err
	case answered:
		if key, ok := journal.RecordedReaction(rec.Record, e.EventID); ok {
			return a.react(ctx, e, id, key, withPlaceholder)
		}
		content = rec.Record
	default:
		// A turn whose calls are not all decided waits, pending.
		approvals, wait, err := a.turnApprovals(ctx, e)
		if err != nil || wait {
			return err
		}
		reply, err := a.ask(ctx, e, id, thread, withPlaceholder, approvals)
		if err != nil {
			return err
		}
		switch {
		case reply.dropped:
			return nil
		case reply.Approval != nil:
			return a.requestApproval(ctx, e, reply.Approval)
		case reply.Ignore:
			// Retracted before the event settles, so a crash in between
			// offers the turn again rather than leave the placeholder.
			if withPlaceholder {
				if err := a.retract(ctx, e, id); err != nil {
					return err
				}
			}
			_, err := a.deps.Store.Settle(ctx, e.EventID)
			return err
		case reply.React != "":
			req, err := journal.ReactionReply(e.RoomID, e.EventID, reply.React, true)
			if err != nil {
				return fmt.Errorf("agent: %w", err)
			}
			if err := a.deps.Store.UpsertTurn(ctx, *req.Turn); err != nil {
				return fmt.Errorf("record turn: %w", err)
			}
			return a.react(ctx, e, id, reply.React, withPlaceholder)
		case reply.Attachment != nil:
			if content, err = a.attachment(ctx, e, reply.Attachment); err != nil {
				return err
			}
		default:
			content = reply.Content
		}
		if content, err = journal.RelateReply(content, e.EventID, thread, journal.ReplyMarkdown); err != nil {
			return err
		}
		if err := a.deps.Store.UpsertTurn(ctx, journal.TurnRecord{TurnID: id, RoomID: e.RoomID, State: journal.TurnResultRecorded,
			Sources: []string{e.EventID}, Record: content}); err != nil {
			return fmt.Errorf("record turn: %w", err)
		}
	}
	// The answer is recorded already: the enqueue only sends and settles.
	_, err = a.deps.Store.EnqueueAndSettle(ctx, journal.FinalReply(e.RoomID, e.EventID, thread, content, false))
	dropped, err := a.dropIfEnded(ctx, e, err)
	if dropped && err == nil && withPlaceholder {
		err = a.retract(ctx, e, id)
	}
	return err
}

// answer is the agent's reply to a turn, or a turn dropped before it was
// asked.
type answer struct {
	agent.Reply
	dropped bool
}

// ask sends the turn's placeholder when it has one, then asks the agent,
// showing it typing and its progress meanwhile. Both end the moment
// Answer returns: nothing of them holds up the answer.
func (a *principalActor) ask(ctx context.Context, e journal.PendingEvent, id string, thread *string, withPlaceholder bool,
	approvals []journal.Approval) (answer, error) {
	var progress func(context.Context, string)
	stopProgress := func() {}
	if withPlaceholder {
		if dropped, err := a.placeholder(ctx, e, thread); dropped || err != nil {
			return answer{dropped: dropped}, err
		}
		progress, stopProgress = a.progress(ctx, e, id)
	}
	stopTyping := a.typing(ctx, e)
	reply, err := a.deps.Agent.Answer(ctx, agent.Turn{Event: e, Thread: thread, Conversation: a.conversation(), Progress: progress,
		Approvals: approvals, ToolRuns: a.deps.Store})
	stopProgress()
	stopTyping()
	if err == nil {
		err = reply.Validate()
	}
	if err != nil {
		return answer{}, fmt.Errorf("agent: %w", err)
	}
	return answer{Reply: reply}, nil
}

// react sends the reaction with key that answers e, recorded already, and
// settles e. A placeholder is withdrawn first, as for a turn ignored: the
// reaction is the answer, and nothing replaces the placeholder. Retracted
// before the enqueue settles the event, so a crash in between offers the
// turn again, which sends the recorded reaction.
func (a *principalActor) react(ctx context.Context, e journal.PendingEvent, id, key string, withPlaceholder bool) error {
	if withPlaceholder {
		if err := a.retract(ctx, e, id); err != nil {
			return err
		}
	}
	req, err := journal.ReactionReply(e.RoomID, e.EventID, key, false)
	if err != nil {
		return err
	}
	_, err = a.deps.Store.EnqueueAndSettle(ctx, req)
	_, err = a.dropIfEnded(ctx, e, err)
	return err
}

// placeholder enqueues the turn's placeholder before the agent is asked.
// It is source-less, so the event stays pending until the answer's
// enqueue settles it; enqueued again on a retry, it is the same row.
func (a *principalActor) placeholder(ctx context.Context, e journal.PendingEvent, thread *string) (dropped bool, err error) {
	content, err := journal.RelateReply(a.deps.Placeholder, e.EventID, thread, journal.ReplyMarkdown)
	if err != nil {
		return false, err
	}
	_, err = a.deps.Store.EnqueueAndSettle(ctx, journal.PlaceholderReply(e.RoomID, e.EventID, thread, content))
	return a.dropIfEnded(ctx, e, err)
}

// placeholderWait bounds how long a turn that ends unanswered waits for
// its placeholder's send to finish before it can tell whether to redact
// it; past it, the turn fails and is offered again after a backoff.
const placeholderWait = 30 * time.Second

// errPlaceholderInFlight fails a turn whose placeholder is still being
// sent when the turn ends unanswered.
var errPlaceholderInFlight = errors.New("placeholder still being sent")

// redacter is a Transport that can redact an event (*matrix.Client).
type redacter interface {
	Redact(ctx context.Context, room, eventID, txnID string) (string, error)
}

// retract withdraws the placeholder of the turn of e, whose delivery is id,
// when the turn ends unanswered: never sent, it is retired; sent, it is
// redacted. A send in flight is waited out first. A placeholder of a
// membership that has ended stays as it is: nothing may be sent under
// another membership, and the fence has ended this one.
func (a *principalActor) retract(ctx context.Context, e journal.PendingEvent, id string) error {
	err := a.deps.Store.Retire(ctx, id, journal.StageInitial)
	switch {
	case err == nil, errors.Is(err, journal.ErrNoDelivery):
		return nil
	case !errors.Is(err, journal.ErrNotClaimable):
		return fmt.Errorf("retire placeholder: %w", err)
	}
	// Checked before the wait too: a dropped turn's membership has ended,
	// and its placeholder's send need not be waited for.
	if current, err := a.current(ctx, e); err != nil || !current {
		return err
	}
	d, err := a.sentPlaceholder(ctx, id)
	if err != nil || d.State != journal.DeliveryAcknowledged {
		return err // a placeholder refused for good was never shown
	}
	if current, err := a.current(ctx, e); err != nil || !current {
		return err
	}
	r, ok := a.deps.Transport.(redacter)
	if !ok {
		a.log.Error().Str("event_id", e.EventID).Str("placeholder_id", d.EventID).
			Msg("The transport cannot redact; the placeholder stays")
		return nil
	}
	// Redacting twice changes nothing, so a retry needs no stable
	// transaction ID.
	if _, err := r.Redact(ctx, e.RoomID, d.EventID, "mindroomd-retract-"+uuid.NewString()); err != nil {
		return fmt.Errorf("redact placeholder: %w", err)
	}
	a.log.Info().Str("event_id", e.EventID).Str("placeholder_id", d.EventID).Msg("Placeholder of an unanswered turn redacted")
	return nil
}

// sentPlaceholder returns the placeholder of delivery id once no send of it
// is in flight, waiting at most placeholderWait.
func (a *principalActor) sentPlaceholder(ctx context.Context, id string) (journal.Delivery, error) {
	sub := a.deps.Hints.Subscribe(a.deps.Store.Principal().String())
	defer sub.Close()
	deadline := time.NewTimer(placeholderWait)
	defer deadline.Stop()
	for {
		d, err := a.deps.Store.Delivery(ctx, id, journal.StageInitial)
		if err != nil {
			return d, fmt.Errorf("read placeholder: %w", err)
		}
		if d.State != journal.DeliveryAttempted {
			return d, nil
		}
		select {
		case <-sub.C():
		case <-deadline.C:
			return d, errPlaceholderInFlight
		case <-ctx.Done():
			return d, ctx.Err()
		}
	}
}

// current reports whether the membership e was admitted under is still the
// room's: only then may anything of its turn be sent.
func (a *principalActor) current(ctx context.Context, e journal.PendingEvent) (bool, error) {
	epoch, departed, err := a.deps.Store.RoomEpoch(ctx, e.RoomID)
	if err != nil {
		return false, fmt.Errorf("read membership: %w", err)
	}
	return !departed && epoch == e.Epoch, nil
}

// dropIfEnded settles e when an enqueue for it was refused because the
// membership that asked has ended: nothing may answer it now.
func (a *principalActor) dropIfEnded(ctx context.Context, e journal.PendingEvent, err error) (dropped bool, _ error) {
	if !journal.DropsTurn(err) {
		return false, err
	}
	a.log.Info().Err(err).Str("event_id", e.EventID).Msg("Turn dropped: its membership ended")
	_, err = a.deps.Store.Settle(ctx, e.EventID)
	return true, err
}

// conversation is what a turn reads its conversation through.
func (a *principalActor) conversation() journal.ConversationReader {
	if a.deps.Conversation != nil {
		return a.deps.Conversation
	}
	return a.deps.Store
}
