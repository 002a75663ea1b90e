package pgfs

import (
	"context"
	"errors"
	"fmt"

	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journal"
)

// View is the store bound to one principal. It implements
// journal.PrincipalStore.
type View struct {
	s *Store
	p Principal
}

var _ journal.PrincipalStore = (*View)(nil)

// Hints returns the store's after-commit bus.
func (v *View) Hints() *hint.Bus { return v.s.hints }

// Principal names the bound principal.
func (v *View) Principal() journal.Principal { return v.p.Principal }

// command runs a write that publishes no hint.
func command[T any](ctx context.Context, v *View, name string, run func(tx *Tx) (T, error)) (T, error) {
	return write(ctx, v.s, v.p, name, func(tx *Tx) (T, []hint.Hint, error) {
		out, err := run(tx)
		return out, nil, err
	})
}

// AdmitBatch implements journal.Admission. Events are parsed before the
// transaction begins.
func (v *View) AdmitBatch(ctx context.Context, events []journal.Inbound, nextBatch string) ([]journal.AdmitResult, error) {
	parsed := journal.Parse(events, v.s.now())
	return write(ctx, v.s, v.p, "admit batch", func(tx *Tx) ([]journal.AdmitResult, []hint.Hint, error) {
		return AdmitBatch(tx, v.p, parsed, nextBatch)
	})
}

// SyncToken implements journal.Admission.
func (v *View) SyncToken(ctx context.Context) (string, error) { return v.s.syncToken(ctx, v.p) }

// Pending implements journal.Replay.
func (v *View) Pending(ctx context.Context, limit int, after int64) (journal.PendingPage, error) {
	return v.s.pending(ctx, v.p, limit, after)
}

// Settle implements journal.Replay.
func (v *View) Settle(ctx context.Context, eventIDs ...string) (int, error) {
	return command(ctx, v, "settle", func(tx *Tx) (int, error) { return Settle(tx, v.p, eventIDs) })
}

// Read implements journal.ConversationReader.
func (v *View) Read(ctx context.Context, req journal.ReadRequest) (journal.Page, error) {
	return v.s.read(ctx, v.p, req)
}

// AdmittedThreadID implements journal.RelationLookup.
func (v *View) AdmittedThreadID(ctx context.Context, roomID, eventID string) (*string, bool, error) {
	thread, ok, err := v.s.admittedThreadID(ctx, v.p, roomID, eventID)
	return journal.DecodeThread(thread), ok, err
}

// AdmittedEvent implements journal.RelationLookup.
func (v *View) AdmittedEvent(ctx context.Context, eventID string) (journal.AdmittedEvent, bool, error) {
	room, thread, pending, ok, err := v.s.admittedEvent(ctx, v.p, eventID)
	return journal.AdmittedEvent{RoomID: room, Thread: journal.DecodeThread(thread), Pending: pending}, ok, err
}

// LatestVisibleEventID implements journal.RelationLookup.
func (v *View) LatestVisibleEventID(ctx context.Context, roomID string, thread *string) (string, bool, error) {
	return v.s.latestVisibleEventID(ctx, v.p, roomID, thread)
}

// InstallHistory implements journal.Hydration.
func (v *View) InstallHistory(ctx context.Context, roomID string, epoch int64, events []journal.Inbound) (journal.HistoryResult, error) {
	parsed := journal.Parse(events, v.s.now())
	return command(ctx, v, "install history", func(tx *Tx) (journal.HistoryResult, error) {
		return InstallHistory(tx, v.p, roomID, epoch, parsed)
	})
}

// MarkCovered implements journal.Hydration.
func (v *View) MarkCovered(ctx context.Context, roomID string, thread *string, epoch int64) error {
	key, err := journal.EncodeThread(thread)
	if err != nil {
		return err
	}
	_, err = command(ctx, v, "mark covered", func(tx *Tx) (struct{}, error) {
		return struct{}{}, MarkCovered(tx, v.p, roomID, key, epoch)
	})
	return err
}

// Covered implements journal.Hydration.
func (v *View) Covered(ctx context.Context, roomID string, thread *string) (bool, error) {
	key, err := journal.EncodeThread(thread)
	if err != nil {
		return false, err
	}
	return v.s.covered(ctx, v.p, roomID, key)
}

// RefreshDebt implements journal.Hydration.
func (v *View) RefreshDebt(ctx context.Context, roomID, eventID string) (journal.RefreshDebt, bool, error) {
	return v.s.refreshDebt(ctx, v.p, roomID, eventID)
}

// ApplyRefetch implements journal.Hydration.
func (v *View) ApplyRefetch(ctx context.Context, r journal.Refetched) (journal.RefetchOutcome, error) {
	return command(ctx, v, "apply refetch", func(tx *Tx) (journal.RefetchOutcome, error) {
		return ApplyRefetch(tx, v.p, r)
	})
}

// EnqueueAndSettle implements journal.Outbox.
func (v *View) EnqueueAndSettle(ctx context.Context, req journal.EnqueueRequest) (journal.EnqueueResult, error) {
	return write(ctx, v.s, v.p, "enqueue", func(tx *Tx) (journal.EnqueueResult, []hint.Hint, error) {
		return EnqueueAndSettle(tx, v.p, req)
	})
}

// Claim implements journal.Outbox. A superseded placeholder is refused,
// but its retirement commits.
func (v *View) Claim(ctx context.Context, deliveryID string, stage journal.Stage, deviceID string) (journal.Delivery, error) {
	type claimed struct {
		d       journal.Delivery
		refused error
	}
	res, err := command(ctx, v, "claim", func(tx *Tx) (claimed, error) {
		d, err := Claim(tx, v.p, deliveryID, stage, deviceID)
		if errors.Is(err, journal.ErrPlaceholderSuperseded) {
			return claimed{refused: err}, nil
		}
		return claimed{d: d}, err
	})
	if err != nil {
		return journal.Delivery{}, err
	}
	if res.refused != nil {
		return journal.Delivery{}, fmt.Errorf("claim: %w", res.refused)
	}
	return res.d, nil
}

// AdoptDevice implements journal.Outbox.
func (v *View) AdoptDevice(ctx context.Context, deliveryID string, stage journal.Stage, deviceID string) error {
	_, err := command(ctx, v, "adopt_device", func(tx *Tx) (struct{}, error) {
		return struct{}{}, AdoptDevice(tx, v.p, deliveryID, stage, deviceID)
	})
	return err
}

// Acknowledge implements journal.Outbox.
func (v *View) Acknowledge(ctx context.Context, deliveryID string, stage journal.Stage, sent journal.Sent) (journal.AckResult, error) {
	return write(ctx, v.s, v.p, "acknowledge", func(tx *Tx) (journal.AckResult, []hint.Hint, error) {
		return Acknowledge(tx, v.p, deliveryID, stage, sent)
	})
}

// Fail implements journal.Outbox.
func (v *View) Fail(ctx context.Context, deliveryID string, stage journal.Stage, reason string, permanent bool) error {
	_, err := command(ctx, v, "fail_delivery", func(tx *Tx) (struct{}, error) {
		return struct{}{}, Fail(tx, v.p, deliveryID, stage, reason, permanent)
	})
	return err
}

// Retire implements journal.Outbox.
func (v *View) Retire(ctx context.Context, deliveryID string, stage journal.Stage) error {
	_, err := command(ctx, v, "retire_delivery", func(tx *Tx) (struct{}, error) {
		return struct{}{}, Retire(tx, v.p, deliveryID, stage)
	})
	return err
}

// Delivery implements journal.Outbox.
func (v *View) Delivery(ctx context.Context, deliveryID string, stage journal.Stage) (journal.Delivery, error) {
	return v.s.delivery(ctx, v.p, deliveryID, stage)
}

// Unacknowledged implements journal.Outbox.
func (v *View) Unacknowledged(ctx context.Context, limit int, after *journal.DeliveryCursor) ([]journal.Delivery, error) {
	return v.s.unacknowledged(ctx, v.p, limit, after)
}

// UpsertTurn implements journal.TurnRecords.
func (v *View) UpsertTurn(ctx context.Context, rec journal.TurnRecord) error {
	_, err := command(ctx, v, "upsert_turn", func(tx *Tx) (struct{}, error) {
		return struct{}{}, UpsertTurn(tx, v.p.Agent, rec)
	})
	return err
}

// Turn implements journal.TurnRecords.
func (v *View) Turn(ctx context.Context, turnID string) (journal.TurnRecord, bool, error) {
	return v.s.turn(ctx, v.p.Agent, turnID)
}

// TurnForEvent implements journal.TurnRecords.
func (v *View) TurnForEvent(ctx context.Context, eventID string) (journal.TurnRecord, bool, error) {
	return v.s.turnForEvent(ctx, v.p.Agent, eventID)
}

// Turns implements journal.TurnRecords.
func (v *View) Turns(ctx context.Context, limit int, afterTurnID string) ([]journal.TurnRecord, error) {
	return v.s.turns(ctx, v.p.Agent, limit, afterTurnID)
}

// ForgetTurns implements journal.TurnRecords.
func (v *View) ForgetTurns(ctx context.Context, turnIDs ...string) (int, error) {
	return command(ctx, v, "forget_turns", func(tx *Tx) (int, error) { return ForgetTurns(tx, v.p.Agent, turnIDs) })
}

// FenceDeparture implements journal.Membership.
func (v *View) FenceDeparture(ctx context.Context, roomID string, source journal.DepartureSource, observationID string) (journal.DepartureOutcome, error) {
	return write(ctx, v.s, v.p, "fence_departure", func(tx *Tx) (journal.DepartureOutcome, []hint.Hint, error) {
		o, err := FenceDeparture(tx, v.p, roomID, source, observationID)
		return o, []hint.Hint{{Principal: v.p.String(), Room: roomID}}, err
	})
}

// RecordJoin implements journal.Membership.
func (v *View) RecordJoin(ctx context.Context, roomID, observationID string) error {
	_, err := command(ctx, v, "record_join", func(tx *Tx) (struct{}, error) {
		return struct{}{}, RecordJoin(tx, v.p, roomID, observationID)
	})
	return err
}

// RoomEpoch implements journal.Membership.
func (v *View) RoomEpoch(ctx context.Context, roomID string) (int64, bool, error) {
	epoch, departed, err := membershipOf(ctx, v.s.pool, v.p, roomID)
	if err != nil {
		return 0, false, fmt.Errorf("read membership: %w", err)
	}
	return epoch, departed, nil
}

// RoomsOwingDepartureReports implements journal.Membership.
func (v *View) RoomsOwingDepartureReports(ctx context.Context) ([]string, error) {
	return v.s.roomsOwingDepartureReports(ctx, v.p)
}

// RetireOwedDepartureReports implements journal.Membership.
func (v *View) RetireOwedDepartureReports(ctx context.Context, roomIDs ...string) (int, error) {
	return command(ctx, v, "retire_owed_reports", func(tx *Tx) (int, error) {
		return RetireOwedDepartureReports(tx, v.p, roomIDs)
	})
}
