package journal

import "fmt"

// ErrPlaceholderSuperseded refuses to claim an initial whose final already
// owns the delivery. The claim retires the placeholder as it refuses, and
// unlike other refusals that write must commit, or the recovery scan offers
// the placeholder forever.
var ErrPlaceholderSuperseded = fmt.Errorf("%w: the final already owns the delivery", ErrNotClaimable)

// OutboxStore is what the outbox's rules read and write for one principal,
// inside one transaction. A backend implements it in its own SQL; the
// decisions are EnqueueStage's, ClaimStage's, AcknowledgeStage's,
// RetireStage's and AdoptStageDevice's.
type OutboxStore interface {
	// Delivery loads one stage; ok is false when there is no such row.
	Delivery(deliveryID string, stage Stage) (d Delivery, ok bool, err error)
	// HasRetiredStage reports whether any stage of the delivery is retired.
	HasRetiredStage(deliveryID string) (bool, error)
	// Membership returns the room's epoch and whether the principal is out
	// of it.
	Membership(room string) (epoch int64, departed bool, err error)
	// Source returns the room and epoch an admitted event was admitted
	// under.
	Source(eventID string) (room string, epoch int64, ok bool, err error)
	// InsertStage writes a new, never attempted row for req.
	InsertStage(req EnqueueRequest, txnID string, epoch int64) error
	// UpdateStage replaces the payload of d, a row never attempted.
	UpdateStage(d Delivery, req EnqueueRequest, epoch int64) error
	// Settle settles the principal's pending events.
	Settle(eventIDs []string) error
	// MarkAttempted commits attempted=1, the sending device (kept when the
	// row already has one) and the event a final edits.
	MarkAttempted(d Delivery, deviceID, replaces string) error
	// MarkRetired retires d if it was never attempted.
	MarkRetired(d Delivery) error
	// MarkFailed records a failed attempt of d, a row not yet
	// acknowledged; permanent takes it out of recovery.
	MarkFailed(d Delivery, reason string, permanent bool) error
	// MarkAcknowledged records the event ID the homeserver returned.
	MarkAcknowledged(d Delivery, eventID string) error
	// AssignDevice moves the attempted row d to deviceID.
	AssignDevice(d Delivery, deviceID string) error
	// RecordTurn writes a turn record.
	RecordTurn(rec TurnRecord) error
	// CompleteTurn marks the turn delivered with the answer's event ID.
	CompleteTurn(turnID, eventID string) error
	// ProjectDelivered admits the delivered event as its sync echo reads,
	// at the server's timestamp; it reports whether the event was projected.
	ProjectDelivered(d Delivery, sent Sent) (bool, error)
}

// load reads one stage, as ErrNoDelivery when it does not exist.
func load(s OutboxStore, deliveryID string, stage Stage) (Delivery, error) {
	d, ok, err := s.Delivery(deliveryID, stage)
	if err != nil {
		return d, fmt.Errorf("load %s/%s: %w", deliveryID, stage, err)
	}
	if !ok {
		return d, fmt.Errorf("%w: %s/%s", ErrNoDelivery, deliveryID, stage)
	}
	return d, nil
}

// DefaultEventType is the event type of a reply that names none.
const DefaultEventType = "m.room.message"

// StageColumns are the stored forms of a request's thread and event type.
func StageColumns(req EnqueueRequest) (thread, eventType string, err error) {
	if thread, err = EncodeThread(req.Thread); err != nil {
		return "", "", err
	}
	eventType = req.EventType
	if eventType == "" {
		eventType = DefaultEventType
	}
	return thread, eventType, nil
}

// FailStage records a failed send of a stage. A permanent failure takes
// the row out of recovery; an acknowledged row is never failed afterwards.
func FailStage(s OutboxStore, deliveryID string, stage Stage, reason string, permanent bool) error {
	d, err := load(s, deliveryID, stage)
	if err != nil {
		return err
	}
	if err := s.MarkFailed(d, reason, permanent); err != nil {
		return fmt.Errorf("fail: %w", err)
	}
	return nil
}

func validStage(s Stage) error {
	if s != StageInitial && s != StageFinal {
		return fmt.Errorf("%w: unknown stage %d", ErrInvalidArgument, s)
	}
	return nil
}

// sibling is the other stage of a delivery.
func (s Stage) sibling() Stage {
	if s == StageFinal {
		return StageInitial
	}
	return StageFinal
}

// EnqueueStage writes (or updates, while never attempted) one delivery
// stage for principal p and settles its sources. It refuses when the
// membership that admitted a source has ended, when a source was admitted
// in another room, and when a stage not yet sent would join a delivery
// that has a retired stage.
func EnqueueStage(s OutboxStore, p Principal, req EnqueueRequest) (EnqueueResult, error) {
	var res EnqueueResult
	if err := req.Validate(); err != nil {
		return res, err
	}
	existing, exists, err := s.Delivery(req.DeliveryID, req.Stage)
	if err != nil {
		return res, fmt.Errorf("load stage: %w", err)
	}
	// Replaying a stage already attempted is a no-op whatever happened to
	// its sibling (a final's claim retires its unsent placeholder); only a
	// stage not yet sent must not adopt a delivery with a retired stage.
	if !exists || existing.State == DeliveryQueued || existing.State == DeliveryRetired {
		retired, err := s.HasRetiredStage(req.DeliveryID)
		if err != nil {
			return res, fmt.Errorf("retired stage: %w", err)
		}
		if retired {
			return res, fmt.Errorf("%w: %s", ErrDeliveryRetired, req.DeliveryID)
		}
	}
	epoch, departed, err := s.Membership(req.RoomID)
	if err != nil {
		return res, fmt.Errorf("read membership: %w", err)
	}
	if departed {
		return res, fmt.Errorf("%w: not in %s", ErrMembershipEnded, req.RoomID)
	}
	for _, src := range req.Sources {
		room, srcEpoch, ok, err := s.Source(src)
		if err != nil {
			return res, fmt.Errorf("source %s: %w", src, err)
		}
		if !ok || room != req.RoomID {
			return res, fmt.Errorf("%w: %s in %s", ErrUnknownSource, src, req.RoomID)
		}
		if srcEpoch != epoch {
			return res, fmt.Errorf("%w: %s was admitted under epoch %d, the room is at %d", ErrMembershipEnded, src, srcEpoch, epoch)
		}
	}
	// Both stages of one delivery answer under one membership.
	other, ok, err := s.Delivery(req.DeliveryID, req.Stage.sibling())
	if err != nil {
		return res, fmt.Errorf("load sibling stage: %w", err)
	}
	if ok && other.Epoch != epoch {
		return res, fmt.Errorf("%w: stage %s was enqueued under epoch %d", ErrMembershipEnded, other.Stage, other.Epoch)
	}

	if req.Turn != nil {
		if err := s.RecordTurn(*req.Turn); err != nil {
			return res, fmt.Errorf("record turn: %w", err)
		}
	}
	res.TxnID, res.Epoch = TxnID(p, req.DeliveryID, req.Stage), epoch
	switch {
	case !exists:
		if err := s.InsertStage(req, res.TxnID, epoch); err != nil {
			return res, fmt.Errorf("insert delivery: %w", err)
		}
		res.Outcome = EnqueueCreated
	case existing.State == DeliveryQueued:
		if err := s.UpdateStage(existing, req, epoch); err != nil {
			return res, fmt.Errorf("update delivery: %w", err)
		}
		res.Outcome = EnqueueUpdated
	default:
		// Attempted (or done): what may already be visible never changes.
		res.Outcome, res.Epoch = EnqueueFrozen, existing.Epoch
	}
	if err := s.Settle(req.Sources); err != nil {
		return res, fmt.Errorf("settle sources: %w", err)
	}
	return res, nil
}

// ClaimStage freezes one delivery stage for sending from deviceID:
// attempted=1 and the device are committed before any network I/O. A final
// learns here whether it edits its acknowledged initial; an initial never
// attempted is dropped in favour of the final, and an initial can never
// become visible once its final owns the delivery. A row attempted from
// another device is refused until AdoptStageDevice hands it over.
func ClaimStage(s OutboxStore, deliveryID string, stage Stage, deviceID string) (Delivery, error) {
	if err := validStage(stage); err != nil {
		return Delivery{}, err
	}
	d, err := load(s, deliveryID, stage)
	if err != nil {
		return d, err
	}
	switch d.State {
	case DeliveryAttempted:
		if d.DeviceID != "" && d.DeviceID != deviceID {
			return d, fmt.Errorf("%w: %s/%s was sent from %s", ErrDeviceChanged, deliveryID, stage, d.DeviceID)
		}
		// A retry: the identical delivery, same payload and transaction ID.
		if err := s.MarkAttempted(d, deviceID, d.ReplacesEventID); err != nil {
			return d, fmt.Errorf("claim: %w", err)
		}
		return load(s, deliveryID, stage)
	case DeliveryQueued:
	default:
		return d, fmt.Errorf("%w: %s/%s is %s", ErrNotClaimable, deliveryID, stage, d.State)
	}
	replaces := ""
	o, ok, err := s.Delivery(deliveryID, stage.sibling())
	switch {
	case err != nil:
		return d, fmt.Errorf("load sibling stage: %w", err)
	case !ok:
	case stage == StageInitial && o.State != DeliveryQueued:
		// The final already owns the delivery: the placeholder never shows.
		if err := s.MarkRetired(d); err != nil {
			return d, fmt.Errorf("retire placeholder: %w", err)
		}
		return d, fmt.Errorf("%w: %s", ErrPlaceholderSuperseded, deliveryID)
	case stage == StageFinal && o.State == DeliveryAttempted:
		return d, fmt.Errorf("%w: %s", ErrStageBlocked, deliveryID)
	case stage == StageFinal && o.State == DeliveryAcknowledged:
		replaces = o.EventID
	case stage == StageFinal && o.State == DeliveryQueued:
		// Never attempted, so never visible: drop the placeholder.
		if err := s.MarkRetired(o); err != nil {
			return d, fmt.Errorf("retire placeholder: %w", err)
		}
	}
	if err := s.MarkAttempted(d, deviceID, replaces); err != nil {
		return d, fmt.Errorf("claim: %w", err)
	}
	return load(s, deliveryID, stage)
}

// AcknowledgeStage records the server's record of a sent stage. The first
// acknowledger also completes the turn record and, while the epoch that
// authorized the row is current and the server's timestamp is known,
// projects the delivered event; a later acknowledger writes nothing and
// learns the first's event ID.
func AcknowledgeStage(s OutboxStore, deliveryID string, stage Stage, sent Sent) (AckResult, error) {
	if !ValidEventID(sent.EventID) {
		return AckResult{}, fmt.Errorf("%w: %q is not an event ID", ErrInvalidArgument, sent.EventID)
	}
	if sent.ServerTS < 0 {
		return AckResult{}, fmt.Errorf("%w: negative server timestamp %d", ErrInvalidArgument, sent.ServerTS)
	}
	d, err := load(s, deliveryID, stage)
	if err != nil {
		return AckResult{}, err
	}
	if d.State == DeliveryAcknowledged {
		return AckResult{EventID: d.EventID}, nil
	}
	if err := s.MarkAcknowledged(d, sent.EventID); err != nil {
		return AckResult{}, fmt.Errorf("acknowledge: %w", err)
	}
	res := AckResult{EventID: sent.EventID, First: true, RoomID: d.RoomID}
	if d.TurnID != "" && stage == StageFinal {
		if err := s.CompleteTurn(d.TurnID, sent.EventID); err != nil {
			return AckResult{}, fmt.Errorf("complete turn: %w", err)
		}
	}
	epoch, departed, err := s.Membership(d.RoomID)
	if err != nil {
		return AckResult{}, fmt.Errorf("read membership: %w", err)
	}
	if epoch == d.Epoch && !departed && sent.ServerTS > 0 {
		if res.Projected, err = s.ProjectDelivered(d, sent); err != nil {
			return AckResult{}, fmt.Errorf("project delivered: %w", err)
		}
	}
	return res, nil
}

// RetireStage withdraws a stage that was never attempted. An attempted
// stage's outcome is unknown, so it is kept for an exact retry instead.
func RetireStage(s OutboxStore, deliveryID string, stage Stage) error {
	d, err := load(s, deliveryID, stage)
	if err != nil {
		return err
	}
	if d.State != DeliveryQueued && d.State != DeliveryRetired {
		return fmt.Errorf("%w: %s/%s is %s", ErrNotClaimable, deliveryID, stage, d.State)
	}
	if err := s.MarkRetired(d); err != nil {
		return fmt.Errorf("retire: %w", err)
	}
	return nil
}

// AdoptStageDevice hands an attempted row to deviceID after reconciliation
// found no copy of it in the room: from then on its retries are
// deduplicated per the new device.
func AdoptStageDevice(s OutboxStore, deliveryID string, stage Stage, deviceID string) error {
	if deviceID == "" {
		return fmt.Errorf("%w: device ID is required", ErrInvalidArgument)
	}
	d, err := load(s, deliveryID, stage)
	if err != nil {
		return err
	}
	if d.State != DeliveryAttempted {
		return fmt.Errorf("%w: %s/%s is %s", ErrNotClaimable, deliveryID, stage, d.State)
	}
	if err := s.AssignDevice(d, deviceID); err != nil {
		return fmt.Errorf("adopt device: %w", err)
	}
	return nil
}
