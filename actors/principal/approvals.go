package principal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync/atomic"
	"time"

	"github.com/mindroomd/mindroomd/agent"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/matrix"
)

// Tool approvals as the principal drives them: the room decides, the
// ledger (journal.Approvals) keeps the decision. A vote (a reaction or a
// reply to a card) is judged when its sync batch is admitted, and whenever
// it is found still pending (a crash in between, a room whose members
// could not be read): it is never work for the agent. A card's redaction
// withdraws its call, so does the departure of its last approver, and a
// sweep decides the calls nobody decided in time. The turn an approval
// belongs to stays pending, never offered to the Agent, until every call
// it asked about is decided; it is then offered again with the decisions.

// Defaults for Deps.
const (
	// DefaultApprovalSweep is how often, at most, the calls nobody
	// decided in time are found; the sweep also wakes at the soonest
	// expiry and after every commit of the principal.
	DefaultApprovalSweep = 30 * time.Second
	// DefaultApprovalExpiry is how long a call an Agent asks about waits
	// for a decision when the Agent names no expiry.
	DefaultApprovalExpiry = time.Hour
)

// approvalPage bounds one read of due approvals.
const approvalPage = 100

// Why a call was decided without a vote.
const (
	reasonCardRemoved  = "the card was removed"
	reasonApproverLeft = "the approver left the room"
	reasonExpired      = "nobody decided in time"
)

// memberLister is a Transport that lists a room's joined members
// (*matrix.Client): a vote decides only while its voter is in the room.
type memberLister interface {
	JoinedMembers(ctx context.Context, room string) ([]matrix.Member, error)
}

// errMembersUnknown reports a room whose members could not be read: a vote
// there is not judged now, and stays pending for a retry.
var errMembersUnknown = errors.New("the room's members could not be read")

// errCardInFlight reports a vote on no acknowledged card in a room where a
// card's acknowledgement is still to be recorded: the homeserver takes a
// card, a person sees it and votes, and the sync can bring that vote
// before the send's answer is recorded. The vote stays pending, and is
// judged again once the card is acknowledged.
var errCardInFlight = errors.New("a card of the room is not acknowledged yet")

// judgedLater reports whether err leaves a vote pending, to be judged
// again, rather than failing what judged it.
func judgedLater(err error) bool {
	return errors.Is(err, errMembersUnknown) || errors.Is(err, errCardInFlight)
}

// approvalState is the actor's approval bookkeeping.
type approvalState struct {
	// rescan is set when a pending vote could not be judged: the next
	// sweep looks through the pending work for it again.
	rescan atomic.Bool
	// wake starts the next sweep at once, for work no commit hint
	// announces in time: a commit's hint may have come and gone before
	// the rescan it calls for was asked.
	wake chan struct{}
}

// rescanNow asks the approvals loop to look through the pending work
// again, now.
func (s *approvalState) rescanNow() {
	s.rescan.Store(true)
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// joinedMembers returns the joined members of room, as the homeserver
// says now.
func (a *principalActor) joinedMembers(ctx context.Context, room string) (map[string]bool, error) {
	l, ok := a.deps.Transport.(memberLister)
	if !ok {
		return nil, fmt.Errorf("%w: the transport cannot list them", errMembersUnknown)
	}
	list, err := l.JoinedMembers(ctx, room)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errMembersUnknown, err)
	}
	members := make(map[string]bool, len(list))
	for _, m := range list {
		members[m.UserID] = true
	}
	return members, nil
}

// mayConcernCard reports whether an event of kind can be a vote or a
// card's redaction, before it is parsed.
func mayConcernCard(k journal.Kind) bool {
	return k == journal.KindReaction || k == journal.KindMessage || k == journal.KindRedaction
}

// cardEvent decides what ev does to a call: a redaction of a card
// withdraws its call, a vote on a card is judged. Either is settled with
// it, never offered to the agent: handled reports that ev was one. A vote
// whose room's members cannot be read is left pending (errMembersUnknown).
func (a *principalActor) cardEvent(ctx context.Context, ev *journal.Event) (handled bool, err error) {
	if ev.Kind == journal.KindRedaction && ev.Target != "" {
		return a.cardRemoved(ctx, ev)
	}
	vote, ok := journal.ReadVote(*ev, a.deps.approvalKeys())
	if !ok || ev.Sender == a.deps.Transport.UserID() {
		return false, nil
	}
	call, found, err := a.deps.Store.CardApproval(ctx, vote.Card)
	switch {
	case err != nil:
		return false, err
	case !found:
		inFlight, err := a.cardInFlight(ctx, ev.RoomID)
		if err != nil {
			return false, err
		}
		if inFlight {
			a.approvals.rescanNow()
			return true, errCardInFlight
		}
		// Not a card: an ordinary reaction or reply.
		return false, nil
	case call.RoomID != ev.RoomID:
		// Another room's card.
		return false, nil
	}
	now := a.deps.Now().UnixMilli()
	outcome := journal.JudgeVote(call, vote.Card, vote, true, now)
	if outcome == journal.VoteDecides {
		members, err := a.joinedMembers(ctx, ev.RoomID)
		if err != nil {
			a.approvals.rescan.Store(true)
			return true, err
		}
		outcome = journal.JudgeVote(call, vote.Card, vote, members[vote.Sender], now)
	}
	log := a.log.With().Str("call_id", call.CallID).Str("vote_id", ev.ID).Str("voter", vote.Sender).Logger()
	if outcome != journal.VoteDecides {
		if _, err := a.deps.Store.Settle(ctx, ev.ID); err != nil {
			return true, fmt.Errorf("settle vote: %w", err)
		}
		if outcome == journal.VoteConsumed {
			log.Debug().Msg("A vote on a decided call is consumed")
		} else {
			log.Info().Msg("A vote that may not decide is ignored")
		}
		return true, nil
	}
	state := journal.ApprovalDenied
	if vote.Approve {
		state = journal.ApprovalApproved
	}
	decided, ok, err := a.deps.Store.DecideApproval(ctx, call.CallID, journal.ApprovalDecision{State: state,
		By: vote.Sender, EventID: ev.ID, Settle: []string{ev.ID}})
	if err != nil {
		return true, fmt.Errorf("decide %s: %w", call.CallID, err)
	}
	if ok {
		log.Info().Stringer("state", decided.State).Msg("Call decided")
	}
	return true, nil
}

// cardInFlight reports whether room has an open call whose card's
// acknowledgement is not recorded yet.
func (a *principalActor) cardInFlight(ctx context.Context, room string) (bool, error) {
	open, err := a.deps.Store.OpenApprovals(ctx, room)
	if err != nil {
		return false, fmt.Errorf("read open calls: %w", err)
	}
	for _, call := range open {
		_, card, found, err := a.deps.Store.Approval(ctx, call.CallID)
		if err != nil {
			return false, fmt.Errorf("read call %s: %w", call.CallID, err)
		}
		if found && card == "" {
			return true, nil
		}
	}
	return false, nil
}

// cardRemoved withdraws the call whose card ev redacts, and settles ev.
func (a *principalActor) cardRemoved(ctx context.Context, ev *journal.Event) (bool, error) {
	call, found, err := a.deps.Store.CardApproval(ctx, ev.Target)
	if err != nil || !found || call.RoomID != ev.RoomID {
		return false, err
	}
	_, decided, err := a.deps.Store.DecideApproval(ctx, call.CallID, journal.ApprovalDecision{State: journal.ApprovalWithdrawn,
		EventID: ev.ID, Reason: reasonCardRemoved, Settle: []string{ev.ID}})
	if err != nil {
		return true, fmt.Errorf("withdraw %s: %w", call.CallID, err)
	}
	if decided {
		a.log.Info().Str("call_id", call.CallID).Str("redaction_id", ev.ID).Msg("Call withdrawn: its card was removed")
	}
	return true, nil
}

// pendingCardEvent is cardEvent for a pending event.
func (a *principalActor) pendingCardEvent(ctx context.Context, e journal.PendingEvent) (bool, error) {
	if !mayConcernCard(e.Kind) {
		return false, nil
	}
	ev, err := journal.ParseEvent(journal.Inbound{RoomID: e.RoomID, Provenance: journal.Live, Event: e.Event}, a.deps.Now())
	if err != nil {
		return false, nil // offered as it is; the agent sees what it is
	}
	return a.cardEvent(ctx, ev)
}

// judgeBatch judges the votes and card redactions a batch admitted: in is
// the batch as admitted, res its results. Only what was admitted now is
// judged (a vote admitted before was judged then, or is pending and judged
// by the worker or the sweep), and only what is work: a vote of history or
// of a membership that ended decides nothing. A vote that cannot be judged
// now stays pending and the sweep looks for it again.
func (a *principalActor) judgeBatch(ctx context.Context, in []journal.Inbound, res []journal.AdmitResult) {
	for i, r := range res {
		if i >= len(in) || r.Outcome != journal.Admitted || r.Awaiting {
			continue
		}
		// Only what can relate to another event: a vote names its card.
		if !bytes.Contains(in[i].Event, []byte("m.relates_to")) && !bytes.Contains(in[i].Event, []byte("redacts")) &&
			!bytes.Contains(in[i].Event, escape) {
			continue
		}
		ev, err := journal.ParseEvent(in[i], a.deps.Now())
		if err != nil || !mayConcernCard(ev.Kind) || r.Class != journal.Actionable && ev.Kind != journal.KindRedaction {
			continue
		}
		if _, err := a.cardEvent(ctx, ev); err != nil {
			if ctx.Err() != nil {
				return
			}
			a.approvals.rescan.Store(true)
			a.logLeftPending(err, ev.ID)
		}
	}
}

// approversLeft withdraws, before a batch is admitted, the open calls of
// each room where the batch shows one of their approvers leaving (a leave,
// a kick or a ban of another user, in the room's timeline or state) and
// none of their approvers is still a member. A member who comes back
// revives nothing: a decision is final. A room whose members the
// homeserver refuses to list is left as it is; any other failure fails the
// batch, which is fetched again.
func (a *principalActor) approversLeft(ctx context.Context, batch *matrix.SyncBatch) error {
	self := a.deps.Transport.UserID()
	for _, r := range batch.Joined {
		left := map[string]bool{}
		for _, raw := range slices.Concat(r.State, r.Events) {
			if !bytes.Contains(raw, memberType) && !bytes.Contains(raw, escape) {
				continue
			}
			ev, err := journal.ParseEvent(journal.Inbound{RoomID: r.RoomID, Provenance: journal.Live, Event: raw}, a.deps.Now())
			if err != nil || ev.Kind != journal.KindMembership || ev.StateKey == nil || *ev.StateKey == self {
				continue
			}
			if ev.Membership == "leave" || ev.Membership == "ban" {
				left[*ev.StateKey] = true
			}
		}
		if len(left) == 0 {
			continue
		}
		if err := a.withdrawLeft(ctx, r.RoomID, left); err != nil {
			return fmt.Errorf("withdraw the calls of approvers who left %s: %w", r.RoomID, err)
		}
	}
	return nil
}

// withdrawLeft withdraws room's open calls that list one of left as an
// approver and have no approver in the room any more.
func (a *principalActor) withdrawLeft(ctx context.Context, room string, left map[string]bool) error {
	open, err := a.deps.Store.OpenApprovals(ctx, room)
	if err != nil {
		return err
	}
	var affected []journal.Approval
	for _, call := range open {
		if slices.ContainsFunc(call.Approvers, func(u string) bool { return left[u] }) {
			affected = append(affected, call)
		}
	}
	if len(affected) == 0 {
		return nil
	}
	members, err := a.joinedMembers(ctx, room)
	if err != nil {
		if refused(err) || isNoLister(a) {
			a.log.Warn().Err(err).Str("room_id", room).Msg("The room's members cannot be read; the calls of an approver who left stay open")
			return nil
		}
		return err
	}
	for _, call := range affected {
		if slices.ContainsFunc(call.Approvers, func(u string) bool { return members[u] }) {
			continue
		}
		_, decided, err := a.deps.Store.DecideApproval(ctx, call.CallID, journal.ApprovalDecision{State: journal.ApprovalWithdrawn,
			Reason: reasonApproverLeft})
		if err != nil {
			return fmt.Errorf("withdraw %s: %w", call.CallID, err)
		}
		if decided {
			a.log.Info().Str("call_id", call.CallID).Str("room_id", room).Msg("Call withdrawn: no approver is left in the room")
		}
	}
	return nil
}

// isNoLister reports whether the actor's Transport cannot list members at
// all.
func isNoLister(a *principalActor) bool {
	_, ok := a.deps.Transport.(memberLister)
	return !ok
}

// approvalsLoop judges, at start, the votes and card redactions a crash
// left pending, then sweeps: at once, at the soonest expiry, after every
// commit of the principal, and at least every ApprovalSweep, it decides
// the calls nobody decided in time, and looks through the pending work
// again when a vote could not be judged.
func (a *principalActor) approvalsLoop(ctx context.Context) error {
	sub := a.deps.Hints.Subscribe(a.deps.Store.Principal().String())
	defer sub.Close()
	a.approvals.rescan.Store(true)
	var (
		failures int
		rescanAt time.Time
	)
	for {
		if a.approvals.rescan.Load() && !a.deps.Now().Before(rescanAt) {
			a.approvals.rescan.Store(false)
			err := a.scanPending(ctx)
			if ctx.Err() != nil {
				return nil
			}
			if err != nil || a.approvals.rescan.Load() {
				// Something is still not judged: looked for again after a
				// backoff, not on every commit.
				a.approvals.rescan.Store(true)
				failures++
				rescanAt = a.deps.Now().Add(backoffAfter(failures, a.deps.BackoffBase, a.deps.BackoffMax))
				if err != nil {
					a.log.Warn().Err(err).Time("retry_at", rescanAt).Msg("Judging pending votes failed")
				}
			} else {
				failures = 0
			}
		}
		wait := a.deps.ApprovalSweep
		next, err := a.sweepApprovals(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			a.log.Warn().Err(err).Msg("Approval sweep failed; retried at the next one")
			wait = min(wait, a.deps.BackoffBase)
		case !next.IsZero():
			wait = min(wait, max(next.Sub(a.deps.Now()), 0))
		}
		if a.approvals.rescan.Load() {
			wait = min(wait, max(rescanAt.Sub(a.deps.Now()), 0))
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-sub.C():
		case <-a.approvals.wake:
		case <-t.C:
		}
		t.Stop()
		if ctx.Err() != nil {
			return nil
		}
	}
}

// sweepApprovals decides as expired every open call whose expiry has
// passed, and returns the soonest expiry still ahead (zero when no call is
// open).
func (a *principalActor) sweepApprovals(ctx context.Context) (time.Time, error) {
	now := a.deps.Now().UnixMilli()
	for {
		due, err := a.deps.Store.DueApprovals(ctx, now, approvalPage)
		if err != nil {
			return time.Time{}, fmt.Errorf("read due approvals: %w", err)
		}
		for _, call := range due {
			_, decided, err := a.deps.Store.DecideApproval(ctx, call.CallID, journal.ApprovalDecision{State: journal.ApprovalExpired,
				Reason: reasonExpired})
			if err != nil {
				return time.Time{}, fmt.Errorf("expire %s: %w", call.CallID, err)
			}
			if decided {
				a.log.Info().Str("call_id", call.CallID).Msg("Call expired: nobody decided in time")
			}
		}
		if len(due) < approvalPage {
			break
		}
	}
	soonest, err := a.deps.Store.DueApprovals(ctx, math.MaxInt64, 1)
	if err != nil || len(soonest) == 0 {
		return time.Time{}, err
	}
	return time.UnixMilli(soonest[0].ExpiresMS), nil
}

// scanPending judges every pending vote and card redaction: those a crash
// left between their admission and their decision, and those whose room's
// members could not be read.
func (a *principalActor) scanPending(ctx context.Context) error {
	var after int64
	for {
		page, err := a.deps.Store.Pending(ctx, workPage, after)
		if err != nil {
			return fmt.Errorf("read pending work: %w", err)
		}
		for _, e := range page.Events {
			if _, err := a.pendingCardEvent(ctx, e); err != nil {
				if !judgedLater(err) {
					return err
				}
				a.logLeftPending(err, e.EventID)
			}
		}
		if !page.More {
			return nil
		}
		after = page.Next
	}
}

// logLeftPending logs a vote left pending by err: a warning, unless it
// only waits for its card's acknowledgement, which comes in moments.
func (a *principalActor) logLeftPending(err error, eventID string) {
	rec := a.log.Warn()
	if errors.Is(err, errCardInFlight) {
		rec = a.log.Debug()
	}
	rec.Err(err).Str("event_id", eventID).Msg("A vote could not be judged; it stays pending and is judged again")
}

// turnApprovals returns the calls asked about for e's turn, and whether
// the turn must wait: while any is open it is not offered.
func (a *principalActor) turnApprovals(ctx context.Context, e journal.PendingEvent) ([]journal.Approval, bool, error) {
	calls, err := a.deps.Store.ApprovalsForEvent(ctx, e.EventID)
	if err != nil {
		return nil, false, fmt.Errorf("read approvals: %w", err)
	}
	for _, c := range calls {
		if c.State == journal.ApprovalOpen {
			return nil, true, nil
		}
	}
	return calls, false, nil
}

// requestApproval records the call the Agent asked a person about for e,
// which posts its card, and leaves e pending: the turn is offered again
// once the call is decided. Asking again about a call decided already is
// the Agent's fault, and fails the turn rather than offer it for ever.
func (a *principalActor) requestApproval(ctx context.Context, e journal.PendingEvent, ask *agent.ApprovalAsk) error {
	now := a.deps.Now()
	in := ask.ExpiresIn
	if in <= 0 {
		in = DefaultApprovalExpiry
	}
	expires := now.Add(in).UnixMilli()
	if err := journal.ValidExpiry(expires, now); err != nil {
		return fmt.Errorf("agent: approval %s: %w", ask.CallID, err)
	}
	call, outcome, err := a.deps.Store.RequestApproval(ctx, journal.ApprovalRequest{EventID: e.EventID, CallID: ask.CallID,
		Tool: ask.Tool, Arguments: ask.Arguments, Secret: ask.Secret, Approvers: ask.Approvers, ExpiresMS: expires,
		Rendering: ask.Rendering, Context: ask.Context}, a.deps.approvalKeys())
	switch {
	case errors.Is(err, journal.ErrNotPending):
		return nil // settled meanwhile: nothing waits for the call
	case journal.DropsTurn(err):
		_, err = a.dropIfEnded(ctx, e, err)
		return err
	case err != nil:
		return fmt.Errorf("agent: approval %s: %w", ask.CallID, err)
	case outcome == journal.ApprovalReplayed && call.State != journal.ApprovalOpen:
		return fmt.Errorf("agent: approval %s: asked again about a call already %s", ask.CallID, call.State)
	}
	a.log.Info().Str("event_id", e.EventID).Str("call_id", call.CallID).Str("tool", call.Tool).
		Strs("approvers", call.Approvers).Time("expires", time.UnixMilli(call.ExpiresMS)).Msg("Approval asked")
	return nil
}

// approvalKeys are the reactions that decide a call: the configured ones,
// or journal.DefaultApprovalKeys.
func (d Deps) approvalKeys() journal.ApprovalKeys {
	if d.ApprovalKeys == (journal.ApprovalKeys{}) {
		return journal.DefaultApprovalKeys
	}
	return d.ApprovalKeys
}
