package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/journalsql"
)

// backend is one dialect's journal under the views: its write port, its
// shared reads, and the reads each dialect answers in its own way.
type backend interface {
	// Writer is p's write port.
	Writer(p journalsql.Principal) journalsql.Writer
	// Reader runs the shared reads.
	Reader() journalsql.Reader
	// Read returns one bounded page of a conversation.
	Read(ctx context.Context, p journalsql.Principal, req journal.ReadRequest) (journal.Page, error)
	// LatestVisibleEventID returns the ID the newest message of a
	// conversation answers to.
	LatestVisibleEventID(ctx context.Context, p journalsql.Principal, room string, thread *string) (string, bool, error)
	// Register interns a principal (looks it up alone on a read-only
	// journal).
	Register(ctx context.Context, p journal.Principal) (journalsql.Principal, error)
}

// View is the journal bound to one principal, on either backend. It
// implements journal.PrincipalStore; hand collaborators the narrow
// interface they need.
type View struct {
	b     backend
	w     journalsql.Writer
	r     journalsql.Reader
	p     journalsql.Principal
	hints *hint.Bus
	now   func() time.Time
}

var _ journal.PrincipalStore = (*View)(nil)

func newView(b backend, p journalsql.Principal, hints *hint.Bus, now func() time.Time) *View {
	return &View{b: b, w: b.Writer(p), r: b.Reader(), p: p, hints: hints, now: now}
}

// Hints returns the bus on which this view's commits are published.
func (v *View) Hints() *hint.Bus { return v.hints }

// Principal names the bound principal.
func (v *View) Principal() journal.Principal { return v.p.Principal }

// A command's results are captured by its closure and read only when Do
// succeeds: a command whose caller gave up (its context ended) may still
// run in the writer afterwards, and its writes must meet no reader.

// do runs a command that publishes no hint.
func (v *View) do(ctx context.Context, name string, size int, run func(tx journalsql.Tx) error) error {
	return v.w.Do(ctx, name, size, func(tx journalsql.Tx) ([]hint.Hint, error) { return nil, run(tx) })
}

// AdmitBatch implements journal.Admission. Events are parsed here, in the
// caller's goroutine, so a single writer only runs SQL.
func (v *View) AdmitBatch(ctx context.Context, events []journal.Inbound, nextBatch string) ([]journal.AdmitResult, error) {
	var results []journal.AdmitResult
	parsed := journal.Parse(events, v.now())
	err := v.w.Do(ctx, "admit batch", len(nextBatch)+inboundSize(events), func(tx journalsql.Tx) (hints []hint.Hint, err error) {
		results, hints, err = journalsql.AdmitBatch(tx, v.p, parsed, nextBatch)
		return hints, err
	})
	if err != nil {
		return nil, err
	}
	return results, nil
}

// inboundSize is the bytes of raw events a command carries.
func inboundSize(events []journal.Inbound) int {
	size := 0
	for _, e := range events {
		size += len(e.Event)
	}
	return size
}

// SyncToken implements journal.Admission.
func (v *View) SyncToken(ctx context.Context) (string, error) {
	return journalsql.SyncToken(ctx, v.r, v.p)
}

// Pending implements journal.Replay.
func (v *View) Pending(ctx context.Context, limit int, after int64) (journal.PendingPage, error) {
	return journalsql.Pending(ctx, v.r, v.p, limit, after)
}

// Settle implements journal.Replay.
func (v *View) Settle(ctx context.Context, eventIDs ...string) (int, error) {
	var n int
	err := v.do(ctx, "settle", 0, func(tx journalsql.Tx) (err error) {
		n, err = journalsql.Settle(tx, v.p, eventIDs)
		return err
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// Read implements journal.ConversationReader. A page that reached the
// oldest message kept says what retention removed before it.
func (v *View) Read(ctx context.Context, req journal.ReadRequest) (journal.Page, error) {
	page, err := v.b.Read(ctx, v.p, req)
	if err != nil || page.NextCursor != nil {
		return page, err
	}
	if page.PrunedBefore, err = journalsql.PrunedBefore(ctx, v.r, v.p, req.RoomID); err != nil {
		return journal.Page{}, fmt.Errorf("read page: %w", err)
	}
	return page, nil
}

// AdmittedThreadID implements journal.RelationLookup.
func (v *View) AdmittedThreadID(ctx context.Context, roomID, eventID string) (*string, bool, error) {
	return journalsql.AdmittedThreadID(ctx, v.r, v.p, roomID, eventID)
}

// AdmittedEvent implements journal.RelationLookup.
func (v *View) AdmittedEvent(ctx context.Context, eventID string) (journal.AdmittedEvent, bool, error) {
	return journalsql.AdmittedEvent(ctx, v.r, v.p, eventID)
}

// LatestVisibleEventID implements journal.RelationLookup.
func (v *View) LatestVisibleEventID(ctx context.Context, roomID string, thread *string) (string, bool, error) {
	return v.b.LatestVisibleEventID(ctx, v.p, roomID, thread)
}

// InstallHistory implements journal.Hydration. Events are parsed here, in
// the caller's goroutine, as admission's are.
func (v *View) InstallHistory(ctx context.Context, roomID string, epoch int64, events []journal.Inbound) (journal.HistoryResult, error) {
	var res journal.HistoryResult
	parsed := journal.Parse(events, v.now())
	err := v.do(ctx, "install history", inboundSize(events), func(tx journalsql.Tx) (err error) {
		res, err = journalsql.InstallHistory(tx, v.p, roomID, epoch, parsed)
		return err
	})
	if err != nil {
		return journal.HistoryResult{}, err
	}
	return res, nil
}

// MarkCovered implements journal.Hydration.
func (v *View) MarkCovered(ctx context.Context, roomID string, thread *string, epoch int64) error {
	key, err := journal.EncodeThread(thread)
	if err != nil {
		return err
	}
	return v.do(ctx, "mark covered", 0, func(tx journalsql.Tx) error {
		return journalsql.MarkCovered(tx, v.p, roomID, key, epoch)
	})
}

// Covered implements journal.Hydration.
func (v *View) Covered(ctx context.Context, roomID string, thread *string) (bool, error) {
	return journalsql.Covered(ctx, v.r, v.p, roomID, thread)
}

// RefreshDebt implements journal.Hydration.
func (v *View) RefreshDebt(ctx context.Context, roomID, eventID string) (journal.RefreshDebt, bool, error) {
	return journalsql.RefreshDebt(ctx, v.r, v.p, roomID, eventID)
}

// ApplyRefetch implements journal.Hydration.
func (v *View) ApplyRefetch(ctx context.Context, r journal.Refetched) (journal.RefetchOutcome, error) {
	var outcome journal.RefetchOutcome
	err := v.do(ctx, "apply refetch", 0, func(tx journalsql.Tx) (err error) {
		outcome, err = journalsql.ApplyRefetch(tx, v.p, r)
		return err
	})
	if err != nil {
		return 0, err
	}
	return outcome, nil
}

// EnqueueAndSettle implements journal.Outbox.
func (v *View) EnqueueAndSettle(ctx context.Context, req journal.EnqueueRequest) (journal.EnqueueResult, error) {
	var res journal.EnqueueResult
	err := v.w.Do(ctx, "enqueue", len(req.Content), func(tx journalsql.Tx) (hints []hint.Hint, err error) {
		res, hints, err = journalsql.EnqueueAndSettle(tx, v.p, req)
		return hints, err
	})
	if err != nil {
		return journal.EnqueueResult{}, err
	}
	return res, nil
}

// Claim implements journal.Outbox. A superseded placeholder is refused,
// but its retirement commits.
func (v *View) Claim(ctx context.Context, deliveryID string, stage journal.Stage, deviceID string) (journal.Delivery, error) {
	var (
		d       journal.Delivery
		refused error
	)
	err := v.do(ctx, "claim", 0, func(tx journalsql.Tx) (err error) {
		d, err = journalsql.Claim(tx, v.p, deliveryID, stage, deviceID)
		if errors.Is(err, journal.ErrPlaceholderSuperseded) {
			refused, err = err, nil
		}
		return err
	})
	if err != nil {
		return journal.Delivery{}, err
	}
	if refused != nil {
		return journal.Delivery{}, fmt.Errorf("claim: %w", refused)
	}
	return d, nil
}

// AdoptDevice implements journal.Outbox.
func (v *View) AdoptDevice(ctx context.Context, deliveryID string, stage journal.Stage, deviceID string) error {
	return v.do(ctx, "adopt_device", 0, func(tx journalsql.Tx) error {
		return journalsql.AdoptDevice(tx, v.p, deliveryID, stage, deviceID)
	})
}

// Acknowledge implements journal.Outbox.
func (v *View) Acknowledge(ctx context.Context, deliveryID string, stage journal.Stage, sent journal.Sent) (journal.AckResult, error) {
	var res journal.AckResult
	err := v.w.Do(ctx, "acknowledge", 0, func(tx journalsql.Tx) (hints []hint.Hint, err error) {
		res, hints, err = journalsql.Acknowledge(tx, v.p, deliveryID, stage, sent)
		return hints, err
	})
	if err != nil {
		return journal.AckResult{}, err
	}
	return res, nil
}

// Fail implements journal.Outbox.
func (v *View) Fail(ctx context.Context, deliveryID string, stage journal.Stage, reason string, permanent bool) error {
	return v.do(ctx, "fail_delivery", len(reason), func(tx journalsql.Tx) error {
		return journalsql.Fail(tx, v.p, deliveryID, stage, reason, permanent)
	})
}

// Retire implements journal.Outbox.
func (v *View) Retire(ctx context.Context, deliveryID string, stage journal.Stage) error {
	return v.do(ctx, "retire_delivery", 0, func(tx journalsql.Tx) error {
		return journalsql.Retire(tx, v.p, deliveryID, stage)
	})
}

// Delivery implements journal.Outbox.
func (v *View) Delivery(ctx context.Context, deliveryID string, stage journal.Stage) (journal.Delivery, error) {
	return journalsql.Delivery(ctx, v.r, v.p, deliveryID, stage)
}

// Unacknowledged implements journal.Outbox.
func (v *View) Unacknowledged(ctx context.Context, limit int, after *journal.DeliveryCursor) ([]journal.Delivery, error) {
	return journalsql.Unacknowledged(ctx, v.r, v.p, limit, after)
}

// DeliveredEvent implements journal.Outbox.
func (v *View) DeliveredEvent(ctx context.Context, roomID, eventID string) (bool, error) {
	return journalsql.DeliveredEvent(ctx, v.r, v.p, roomID, eventID)
}

// UpsertTurn implements journal.TurnRecords.
func (v *View) UpsertTurn(ctx context.Context, rec journal.TurnRecord) error {
	return v.do(ctx, "upsert_turn", len(rec.Record), func(tx journalsql.Tx) error {
		return journalsql.UpsertTurn(tx, v.p.Agent, rec)
	})
}

// Turn implements journal.TurnRecords.
func (v *View) Turn(ctx context.Context, turnID string) (journal.TurnRecord, bool, error) {
	return journalsql.Turn(ctx, v.r, v.p.Agent, turnID)
}

// TurnForEvent implements journal.TurnRecords.
func (v *View) TurnForEvent(ctx context.Context, eventID string) (journal.TurnRecord, bool, error) {
	return journalsql.TurnForEvent(ctx, v.r, v.p.Agent, eventID)
}

// Turns implements journal.TurnRecords.
func (v *View) Turns(ctx context.Context, limit int, afterTurnID string) ([]journal.TurnRecord, error) {
	return journalsql.Turns(ctx, v.r, v.p.Agent, limit, afterTurnID)
}

// ForgetTurns implements journal.TurnRecords.
func (v *View) ForgetTurns(ctx context.Context, turnIDs ...string) (int, error) {
	var n int
	err := v.do(ctx, "forget_turns", 0, func(tx journalsql.Tx) (err error) {
		n, err = journalsql.ForgetTurns(tx, v.p.Agent, turnIDs)
		return err
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// FenceDeparture implements journal.Membership.
func (v *View) FenceDeparture(ctx context.Context, roomID string, source journal.DepartureSource, observationID string) (journal.DepartureOutcome, error) {
	var o journal.DepartureOutcome
	err := v.w.Do(ctx, "fence_departure", 0, func(tx journalsql.Tx) (hints []hint.Hint, err error) {
		o, hints, err = journalsql.FenceDeparture(tx, v.p, roomID, source, observationID)
		return hints, err
	})
	if err != nil {
		return 0, err
	}
	return o, nil
}

// RecordJoin implements journal.Membership.
func (v *View) RecordJoin(ctx context.Context, roomID, observationID string) error {
	return v.do(ctx, "record_join", 0, func(tx journalsql.Tx) error {
		return journalsql.RecordJoin(tx, v.p, roomID, observationID)
	})
}

// RoomEpoch implements journal.Membership.
func (v *View) RoomEpoch(ctx context.Context, roomID string) (int64, bool, error) {
	return journalsql.RoomEpoch(ctx, v.r, v.p, roomID)
}

// Joined implements journal.Membership.
func (v *View) Joined(ctx context.Context, roomID string) (bool, error) {
	return journalsql.Joined(ctx, v.r, v.p, roomID)
}

// Rooms implements journal.Membership.
func (v *View) Rooms(ctx context.Context) ([]journal.RoomActivity, error) {
	return journalsql.Rooms(ctx, v.r, v.p)
}

// RoomsOwingDepartureReports implements journal.Membership.
func (v *View) RoomsOwingDepartureReports(ctx context.Context) ([]string, error) {
	return journalsql.RoomsOwingDepartureReports(ctx, v.r, v.p)
}

// RetireOwedDepartureReports implements journal.Membership.
func (v *View) RetireOwedDepartureReports(ctx context.Context, roomIDs ...string) (int, error) {
	var n int
	err := v.do(ctx, "retire_owed_reports", 0, func(tx journalsql.Tx) (err error) {
		n, err = journalsql.RetireOwedDepartureReports(tx, v.p, roomIDs)
		return err
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}
