package pgfs

import (
	"context"

	"github.com/mindroomd/mindroomd/hint"
	"github.com/mindroomd/mindroomd/journal"
)

// EnqueueAndSettle writes a delivery stage and settles its sources.
func EnqueueAndSettle(tx *Tx, p Principal, req journal.EnqueueRequest) (journal.EnqueueResult, []hint.Hint, error) {
	return journal.EnqueueResult{}, nil, errNotBuilt
}

// Claim freezes one delivery stage for sending.
func Claim(tx *Tx, p Principal, deliveryID string, stage journal.Stage, deviceID string) (journal.Delivery, error) {
	return journal.Delivery{}, errNotBuilt
}

// AdoptDevice moves an attempted row to deviceID.
func AdoptDevice(tx *Tx, p Principal, deliveryID string, stage journal.Stage, deviceID string) error {
	return errNotBuilt
}

// Acknowledge records the server's record of a sent stage.
func Acknowledge(tx *Tx, p Principal, deliveryID string, stage journal.Stage, sent journal.Sent) (journal.AckResult, []hint.Hint, error) {
	return journal.AckResult{}, nil, errNotBuilt
}

// Fail records a failed send.
func Fail(tx *Tx, p Principal, deliveryID string, stage journal.Stage, reason string, permanent bool) error {
	return errNotBuilt
}

// Retire withdraws a stage that was never attempted.
func Retire(tx *Tx, p Principal, deliveryID string, stage journal.Stage) error { return errNotBuilt }

func (s *Store) delivery(ctx context.Context, p Principal, deliveryID string, stage journal.Stage) (journal.Delivery, error) {
	return journal.Delivery{}, errNotBuilt
}

func (s *Store) unacknowledged(ctx context.Context, p Principal, limit int, after *journal.DeliveryCursor) ([]journal.Delivery, error) {
	return nil, errNotBuilt
}

// UpsertTurn writes a turn record.
func UpsertTurn(tx *Tx, agent string, rec journal.TurnRecord) error { return errNotBuilt }

func (s *Store) turn(ctx context.Context, agent, turnID string) (journal.TurnRecord, bool, error) {
	return journal.TurnRecord{}, false, errNotBuilt
}

func (s *Store) turnForEvent(ctx context.Context, agent, eventID string) (journal.TurnRecord, bool, error) {
	return journal.TurnRecord{}, false, errNotBuilt
}

func (s *Store) turns(ctx context.Context, agent string, limit int, after string) ([]journal.TurnRecord, error) {
	return nil, errNotBuilt
}

// ForgetTurns deletes turn records.
func ForgetTurns(tx *Tx, agent string, turnIDs []string) (int, error) { return 0, errNotBuilt }

// FenceDeparture applies one departure observation.
func FenceDeparture(tx *Tx, p Principal, room string, source journal.DepartureSource, observation string) (journal.DepartureOutcome, error) {
	return 0, errNotBuilt
}

// RecordJoin marks p back in room.
func RecordJoin(tx *Tx, p Principal, room, observation string) error { return errNotBuilt }

func (s *Store) roomsOwingDepartureReports(ctx context.Context, p Principal) ([]string, error) {
	return nil, errNotBuilt
}

// RetireOwedDepartureReports forgets the owed echoes of rooms.
func RetireOwedDepartureReports(tx *Tx, p Principal, rooms []string) (int, error) {
	return 0, errNotBuilt
}
