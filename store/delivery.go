package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/sqlitefs"
)

var (
	_ journal.Outbox      = (*View)(nil)
	_ journal.TurnRecords = (*View)(nil)
	_ journal.Membership  = (*View)(nil)
)

// EnqueueAndSettle implements journal.Outbox.
func (v *View) EnqueueAndSettle(ctx context.Context, req journal.EnqueueRequest) (journal.EnqueueResult, error) {
	return write(ctx, v, "enqueue", len(req.Content), func(tx *sqlitefs.Tx) (journal.EnqueueResult, []hint.Hint, error) {
		return sqlitefs.EnqueueAndSettle(tx, v.p, req)
	})
}

// Claim implements journal.Outbox.
func (v *View) Claim(ctx context.Context, deliveryID string, stage journal.Stage, deviceID string) (journal.Delivery, error) {
	// A superseded placeholder is refused, but its retirement commits.
	type claimed struct {
		d       journal.Delivery
		refused error
	}
	res, err := write(ctx, v, "claim", 0, func(tx *sqlitefs.Tx) (claimed, []hint.Hint, error) {
		d, err := sqlitefs.Claim(tx, v.p, deliveryID, stage, deviceID)
		if errors.Is(err, journal.ErrPlaceholderSuperseded) {
			return claimed{refused: err}, nil, nil
		}
		return claimed{d: d}, nil, err
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
	_, err := write(ctx, v, "adopt_device", 0, func(tx *sqlitefs.Tx) (struct{}, []hint.Hint, error) {
		return struct{}{}, nil, sqlitefs.AdoptDevice(tx, v.p, deliveryID, stage, deviceID)
	})
	return err
}

// Acknowledge implements journal.Outbox.
func (v *View) Acknowledge(ctx context.Context, deliveryID string, stage journal.Stage, sent journal.Sent) (journal.AckResult, error) {
	return write(ctx, v, "acknowledge", 0, func(tx *sqlitefs.Tx) (journal.AckResult, []hint.Hint, error) {
		return sqlitefs.Acknowledge(tx, v.p, deliveryID, stage, sent)
	})
}

// Fail implements journal.Outbox.
func (v *View) Fail(ctx context.Context, deliveryID string, stage journal.Stage, reason string, permanent bool) error {
	_, err := write(ctx, v, "fail_delivery", len(reason), func(tx *sqlitefs.Tx) (struct{}, []hint.Hint, error) {
		return struct{}{}, nil, sqlitefs.Fail(tx, v.p, deliveryID, stage, reason, permanent)
	})
	return err
}

// Retire implements journal.Outbox.
func (v *View) Retire(ctx context.Context, deliveryID string, stage journal.Stage) error {
	_, err := write(ctx, v, "retire_delivery", 0, func(tx *sqlitefs.Tx) (struct{}, []hint.Hint, error) {
		return struct{}{}, nil, sqlitefs.Retire(tx, v.p, deliveryID, stage)
	})
	return err
}

// Delivery implements journal.Outbox.
func (v *View) Delivery(ctx context.Context, deliveryID string, stage journal.Stage) (journal.Delivery, error) {
	return v.s.db.Delivery(ctx, v.p, deliveryID, stage)
}

// Unacknowledged implements journal.Outbox.
func (v *View) Unacknowledged(ctx context.Context, limit int, after *journal.DeliveryCursor) ([]journal.Delivery, error) {
	return v.s.db.Unacknowledged(ctx, v.p, limit, after)
}

// UpsertTurn implements journal.TurnRecords.
func (v *View) UpsertTurn(ctx context.Context, rec journal.TurnRecord) error {
	_, err := write(ctx, v, "upsert_turn", len(rec.Record), func(tx *sqlitefs.Tx) (struct{}, []hint.Hint, error) {
		return struct{}{}, nil, sqlitefs.UpsertTurn(tx, v.p.Agent, rec)
	})
	return err
}

// Turn implements journal.TurnRecords.
func (v *View) Turn(ctx context.Context, turnID string) (journal.TurnRecord, bool, error) {
	return v.s.db.Turn(ctx, v.p.Agent, turnID)
}

// TurnForEvent implements journal.TurnRecords.
func (v *View) TurnForEvent(ctx context.Context, eventID string) (journal.TurnRecord, bool, error) {
	return v.s.db.TurnForEvent(ctx, v.p.Agent, eventID)
}

// Turns implements journal.TurnRecords.
func (v *View) Turns(ctx context.Context, limit int, afterTurnID string) ([]journal.TurnRecord, error) {
	return v.s.db.Turns(ctx, v.p.Agent, limit, afterTurnID)
}

// ForgetTurns implements journal.TurnRecords.
func (v *View) ForgetTurns(ctx context.Context, turnIDs ...string) (int, error) {
	return write(ctx, v, "forget_turns", 0, func(tx *sqlitefs.Tx) (int, []hint.Hint, error) {
		n, err := sqlitefs.ForgetTurns(tx, v.p.Agent, turnIDs)
		return n, nil, err
	})
}

// FenceDeparture implements journal.Membership.
func (v *View) FenceDeparture(ctx context.Context, roomID string, source journal.DepartureSource, observationID string) (journal.DepartureOutcome, error) {
	return write(ctx, v, "fence_departure", 0, func(tx *sqlitefs.Tx) (journal.DepartureOutcome, []hint.Hint, error) {
		o, err := sqlitefs.FenceDeparture(tx, v.p, roomID, source, observationID)
		return o, []hint.Hint{{Principal: v.p.String(), Room: roomID}}, err
	})
}

// RecordJoin implements journal.Membership.
func (v *View) RecordJoin(ctx context.Context, roomID, observationID string) error {
	_, err := write(ctx, v, "record_join", 0, func(tx *sqlitefs.Tx) (struct{}, []hint.Hint, error) {
		return struct{}{}, nil, sqlitefs.RecordJoin(tx, v.p, roomID, observationID)
	})
	return err
}

// RoomEpoch implements journal.Membership.
func (v *View) RoomEpoch(ctx context.Context, roomID string) (int64, bool, error) {
	return v.s.db.RoomEpoch(ctx, v.p, roomID)
}

// RoomsOwingDepartureReports implements journal.Membership.
func (v *View) RoomsOwingDepartureReports(ctx context.Context) ([]string, error) {
	return v.s.db.RoomsOwingDepartureReports(ctx, v.p)
}

// RetireOwedDepartureReports implements journal.Membership.
func (v *View) RetireOwedDepartureReports(ctx context.Context, roomIDs ...string) (int, error) {
	return write(ctx, v, "retire_owed_reports", 0, func(tx *sqlitefs.Tx) (int, []hint.Hint, error) {
		n, err := sqlitefs.RetireOwedDepartureReports(tx, v.p, roomIDs)
		return n, nil, err
	})
}
