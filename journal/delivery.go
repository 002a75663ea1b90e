package journal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/google/uuid"
)

// Delivery errors.
var (
	// ErrMembershipEnded refuses work authorized by a membership that has
	// since ended: the room's epoch moved, or the principal is out of the
	// room.
	ErrMembershipEnded = errors.New("membership ended")
	// ErrDeliveryRetired refuses a stage of a delivery that has a retired
	// stage: it must never adopt a later membership.
	ErrDeliveryRetired = errors.New("delivery retired")
	// ErrUnknownSource refuses an enqueue whose source event the principal
	// never admitted in that room.
	ErrUnknownSource = errors.New("unknown source event")
	// ErrNoDelivery reports a delivery stage that does not exist.
	ErrNoDelivery = errors.New("no such delivery")
	// ErrStageBlocked refuses to claim a final stage while its initial
	// placeholder was attempted but not acknowledged: the initial is retried
	// first, so the final knows whether to edit it.
	ErrStageBlocked = errors.New("stage blocked by its initial")
	// ErrNotClaimable refuses to claim a row that is acknowledged, failed or
	// retired.
	ErrNotClaimable = errors.New("delivery not claimable")
	// ErrDeviceChanged refuses to resend an attempted row from a device
	// other than the one that first sent it. Homeservers deduplicate
	// transaction IDs per device, so the new device's send could show the
	// reply twice: the row must be reconciled first (AdoptDevice).
	ErrDeviceChanged = errors.New("delivery attempted from another device")
)

// Stage is a delivery stage.
type Stage uint8

// Stages.
const (
	// StageInitial is an optional placeholder sent while the answer is made.
	StageInitial Stage = 1
	// StageFinal is the answer; it edits the initial placeholder if that was
	// acknowledged.
	StageFinal Stage = 2
)

// String implements fmt.Stringer.
func (s Stage) String() string {
	switch s {
	case StageInitial:
		return "initial"
	case StageFinal:
		return "final"
	}
	return "stage(" + strconv.Itoa(int(s)) + ")"
}

// DeliveryState is where a delivery stage is in its life.
type DeliveryState uint8

// Delivery states.
const (
	DeliveryQueued       DeliveryState = 0 // enqueued, never attempted
	DeliveryAttempted    DeliveryState = 1 // claimed; outcome unknown until acknowledged
	DeliveryAcknowledged DeliveryState = 2 // the homeserver returned its event ID
	DeliveryFailed       DeliveryState = 3 // permanently refused
	DeliveryRetired      DeliveryState = 4 // will never be sent (a fence or a superseding final)
)

// String implements fmt.Stringer.
func (s DeliveryState) String() string {
	switch s {
	case DeliveryQueued:
		return "queued"
	case DeliveryAttempted:
		return "attempted"
	case DeliveryAcknowledged:
		return "acknowledged"
	case DeliveryFailed:
		return "failed"
	case DeliveryRetired:
		return "retired"
	}
	return "state(" + strconv.Itoa(int(s)) + ")"
}

// txnNamespace is the fixed UUIDv5 namespace of delivery transaction IDs.
var txnNamespace = uuid.MustParse("8d3c8f5e-3c1a-5b52-9a41-6d696e64726f")

// TxnID derives the Matrix transaction ID of one delivery stage. It depends
// only on (principal, delivery, stage), never on time or epoch, so a retry
// after any crash repeats the same ID and the homeserver deduplicates it.
func TxnID(p Principal, deliveryID string, stage Stage) string {
	name := p.String() + "\x00" + deliveryID + "\x00" + stage.String()
	return "mindroomd-" + uuid.NewSHA1(txnNamespace, []byte(name)).String()
}

// ReplyDeliveryID names the reply to a source event: the same on every
// attempt, so a turn retried after a crash updates or finds its one outbox
// row, and the same whoever answers (the principal's own agent or one
// outside the process), so two answers to one event are one delivery.
func ReplyDeliveryID(eventID string) string { return "reply:" + eventID }

// EnqueueRequest hands a reply to the outbox and settles its sources in the
// same transaction.
type EnqueueRequest struct {
	// DeliveryID names the reply; with Stage it keys the outbox row.
	DeliveryID string
	Stage      Stage
	RoomID     string
	// Thread is the thread the reply goes to; nil for the room.
	Thread *string
	// TurnID names the turn record an acknowledged final completes ("" for
	// none).
	TurnID string
	// EventType is the Matrix event type (default m.room.message).
	EventType string
	// Content is the event content to send.
	Content json.RawMessage
	// Sources are the admitted events this reply answers; they are settled
	// with the enqueue. A source-less delivery takes the room's current
	// membership.
	Sources []string
	// Turn, when set, is the turn record of the answer, written in the same
	// transaction just before the enqueue: the answer is never enqueued
	// without its durable record, and one commit does both.
	Turn *TurnRecord
}

// Validate refuses a request the outbox must not accept: anything the
// delivery could not put on the wire is refused here, at enqueue, and never
// discovered at send, when the reply is already owed.
func (r EnqueueRequest) Validate() error {
	switch {
	case r.DeliveryID == "":
		return fmt.Errorf("%w: delivery ID is required", ErrInvalidArgument)
	case !ValidRoomID(r.RoomID):
		return fmt.Errorf("%w: %q is not a room ID", ErrInvalidArgument, r.RoomID)
	case len(r.Content) > MaxContentBytes:
		return fmt.Errorf("%w: content larger than 64 KiB", ErrInvalidArgument)
	case r.Stage != StageInitial && r.Stage != StageFinal:
		return fmt.Errorf("%w: unknown stage %d", ErrInvalidArgument, r.Stage)
	}
	// The wire form of both shapes a claim may give it: as sent, and as an
	// edit of an acknowledged placeholder.
	for _, replaces := range []string{"", "$placeholder"} {
		if _, err := WireContent(Delivery{DeliveryID: r.DeliveryID, Stage: r.Stage, Thread: r.Thread,
			Content: r.Content, ReplacesEventID: replaces}); err != nil {
			return fmt.Errorf("%w: content must be one JSON object: %w", ErrInvalidArgument, err)
		}
	}
	return nil
}

// EnqueueOutcome says what an enqueue did to the outbox row.
type EnqueueOutcome uint8

// Enqueue outcomes.
const (
	// EnqueueCreated wrote a new row.
	EnqueueCreated EnqueueOutcome = 1
	// EnqueueUpdated replaced the payload of a row not yet attempted.
	EnqueueUpdated EnqueueOutcome = 2
	// EnqueueFrozen left an attempted row as it was: what may already be
	// visible is never changed.
	EnqueueFrozen EnqueueOutcome = 3
)

// EnqueueResult reports an enqueue.
type EnqueueResult struct {
	Outcome EnqueueOutcome
	TxnID   string
	Epoch   int64
}

// Delivery is one outbox row as the sender sees it. After a claim its
// payload, target and transaction ID are frozen.
type Delivery struct {
	// Position orders the recovery scan (oldest first).
	Position   int64
	CreatedMS  int64
	DeliveryID string
	Stage      Stage
	RoomID     string
	Thread     *string
	TxnID      string
	TurnID     string
	EventType  string
	Content    json.RawMessage
	// ReplacesEventID is set on a final that edits its acknowledged initial.
	ReplacesEventID string
	// Epoch is the membership epoch that authorized the row.
	Epoch    int64
	State    DeliveryState
	DeviceID string
	Attempts int
	// EventID is the acknowledged Matrix event ID.
	EventID   string
	LastError string
}

// DeliveryCursor continues a recovery scan.
type DeliveryCursor struct {
	CreatedMS int64
	Position  int64
}

// Sent is the homeserver's record of one accepted send: what an
// acknowledgement stores and what the projection of our own reply is
// ordered by.
//
// Revisions and pages are ordered by origin_server_ts, a timestamp the
// homeserver assigns, so the projection of a reply must carry the server's
// timestamp, never the daemon's clock: with two clocks in one order, a
// reply stamped by a clock running ahead would sort after the user's next
// message and outrank the sync echo of its own final edit. The sender reads
// the timestamp from the server's record of the event (a fetch of the event
// after the send). When it cannot, ServerTS stays zero and the
// acknowledgement projects nothing: the sync echo, which carries the
// server's timestamp, projects the reply instead.
type Sent struct {
	// EventID is the event ID the homeserver assigned.
	EventID string
	// ServerTS is the event's origin_server_ts in milliseconds as the
	// homeserver recorded it; zero when unknown.
	ServerTS int64
}

// AckResult reports an acknowledgement.
type AckResult struct {
	// EventID is the acknowledged event ID: this call's, or the first
	// acknowledger's when this one lost.
	EventID string
	// First is true when this call wrote the acknowledgement.
	First bool
	// RoomID is the delivery's room, set when First: the room whose
	// readers a commit of the acknowledgement wakes.
	RoomID string
	// Projected is true when the delivered event was installed in the
	// visible projection: only while its authorizing epoch is current, and
	// only when the server's timestamp of the event is known.
	Projected bool
}

// Outbox is the delivery view: enqueue-and-settle, claim, acknowledge,
// fail, retire and the recovery scan.
type Outbox interface {
	// EnqueueAndSettle writes the outbox row and settles its sources in one
	// transaction.
	EnqueueAndSettle(ctx context.Context, req EnqueueRequest) (EnqueueResult, error)
	// Claim commits attempted=1 and the sending device before any network
	// I/O and returns the frozen delivery. Claiming an attempted row again
	// from its device returns the identical delivery for a retry; from
	// another device it fails with ErrDeviceChanged.
	Claim(ctx context.Context, deliveryID string, stage Stage, deviceID string) (Delivery, error)
	// AdoptDevice moves an attempted, unacknowledged row to deviceID, once
	// a search of the room found no copy of it sent from its earlier device:
	// only then may the new device send it again.
	AdoptDevice(ctx context.Context, deliveryID string, stage Stage, deviceID string) error
	// Acknowledge records the homeserver's event ID and completes the turn
	// record in the same transaction. It projects the delivered event at
	// sent.ServerTS, the server's timestamp, when that is known.
	Acknowledge(ctx context.Context, deliveryID string, stage Stage, sent Sent) (AckResult, error)
	// Fail records a failed attempt; a permanent failure takes the row out
	// of recovery.
	Fail(ctx context.Context, deliveryID string, stage Stage, reason string, permanent bool) error
	// Retire withdraws a stage that was never attempted.
	Retire(ctx context.Context, deliveryID string, stage Stage) error
	// Delivery loads one stage.
	Delivery(ctx context.Context, deliveryID string, stage Stage) (Delivery, error)
	// Unacknowledged scans queued and attempted rows oldest first.
	Unacknowledged(ctx context.Context, limit int, after *DeliveryCursor) ([]Delivery, error)
	// DeliveredEvent reports whether eventID is the acknowledged event of
	// one of the principal's deliveries to roomID.
	DeliveredEvent(ctx context.Context, roomID, eventID string) (bool, error)
}

// TurnState is how far a turn has come.
type TurnState uint8

// Turn states.
const (
	// TurnResultRecorded: the model finished and its result is durable, so
	// recovery never reruns it.
	TurnResultRecorded TurnState = 1
	// TurnDelivered: the final answer was acknowledged; terminal.
	TurnDelivered TurnState = 2
)

// TurnRecord is the durable proof of a turn.
type TurnRecord struct {
	TurnID string
	RoomID string
	State  TurnState
	// Sources are the events the turn answers; each indexes the record.
	Sources []string
	// Record is the turn's durable content (the model result, ...).
	Record json.RawMessage
	// EventID is the delivered answer's event ID once delivered.
	EventID   string
	UpdatedMS int64
}

// TurnRecords stores turn records, scoped to the agent name.
type TurnRecords interface {
	// UpsertTurn writes a record and re-indexes it by exactly its sources.
	UpsertTurn(ctx context.Context, rec TurnRecord) error
	// Turn loads a record by ID.
	Turn(ctx context.Context, turnID string) (TurnRecord, bool, error)
	// TurnForEvent finds the record a source event indexes.
	TurnForEvent(ctx context.Context, eventID string) (TurnRecord, bool, error)
	// Turns pages every record in turn ID order, for a warm-up.
	Turns(ctx context.Context, limit int, afterTurnID string) ([]TurnRecord, error)
	// ForgetTurns deletes records and their indexes.
	ForgetTurns(ctx context.Context, turnIDs ...string) (int, error)
}

// DepartureSource says who observed a departure.
type DepartureSource uint8

// Departure sources.
const (
	// DepartureLocal is a leave this process performed; it owes one
	// sync-reported echo.
	DepartureLocal DepartureSource = 1
	// DepartureReported is the principal's own leave reported by sync: the
	// echo of a local leave, or a leave made elsewhere.
	DepartureReported DepartureSource = 2
	// DepartureRemoved is a kick or ban reported by sync: someone else
	// removed the principal. It is never the echo of a local leave, so it
	// fences whatever echo is owed.
	DepartureRemoved DepartureSource = 3
)

// DepartureOutcome is what FenceDeparture did.
type DepartureOutcome uint8

// Departure outcomes.
const (
	// Fenced: the epoch advanced and the old membership's state is gone.
	Fenced DepartureOutcome = 1
	// AlreadyFenced: the principal was already out of the room.
	AlreadyFenced DepartureOutcome = 2
	// OwedReportConsumed: the sync echo of an earlier local leave; nothing
	// fenced again.
	OwedReportConsumed DepartureOutcome = 3
	// RepeatedReport: this observation was applied before.
	RepeatedReport DepartureOutcome = 4
)

// String implements fmt.Stringer.
func (o DepartureOutcome) String() string {
	switch o {
	case Fenced:
		return "fenced"
	case AlreadyFenced:
		return "already_fenced"
	case OwedReportConsumed:
		return "owed_report_consumed"
	case RepeatedReport:
		return "repeated_report"
	}
	return "outcome(" + strconv.Itoa(int(o)) + ")"
}

// RoomActivity is what the journal knows of one of a principal's rooms.
type RoomActivity struct {
	RoomID string
	// Epoch is the current membership epoch; Departed is true while the
	// principal is out of the room.
	Epoch    int64
	Departed bool
	// NewestTS is the server timestamp of the newest visible message of
	// the room's main timeline (thread roots included, replies within
	// threads not), 0 when it shows none.
	NewestTS int64
	// Pending counts the room's events still owed their turn.
	Pending int64
}

// Membership is the fence view of one principal.
type Membership interface {
	// FenceDeparture applies a departure observation.
	FenceDeparture(ctx context.Context, roomID string, source DepartureSource, observationID string) (DepartureOutcome, error)
	// RecordJoin ends a departure: the principal is in the room again under
	// the advanced epoch. Owed reports survive it.
	RecordJoin(ctx context.Context, roomID, observationID string) error
	// RoomEpoch returns the room's current epoch and whether the principal
	// is out of the room.
	RoomEpoch(ctx context.Context, roomID string) (epoch int64, departed bool, err error)
	// Joined reports whether the journal records the principal in the
	// room: a room it never recorded, or one it left, is not joined.
	Joined(ctx context.Context, roomID string) (bool, error)
	// Rooms lists what the journal knows of each room the principal was
	// ever in, ordered by room ID.
	Rooms(ctx context.Context) ([]RoomActivity, error)
	// RoomsOwingDepartureReports lists rooms with owed echoes.
	RoomsOwingDepartureReports(ctx context.Context) ([]string, error)
	// RetireOwedDepartureReports forgets the owed echoes of rooms.
	RetireOwedDepartureReports(ctx context.Context, roomIDs ...string) (int, error)
}

// WireContent is the content a delivery puts on the wire: the stored
// content plus the delivery marker, so a sync echo can be matched to its
// outbox row even without a transaction ID; a final that replaces its
// acknowledged initial is wrapped as an m.replace edit of it.
func WireContent(d Delivery) (json.RawMessage, error) {
	// Decoded with numbers kept as their literal text: a float64 would turn
	// an integer past 2^53 into a different number on the wire.
	v, err := decodeJSON(d.Content)
	if err != nil {
		return nil, fmt.Errorf("delivery content: %w", err)
	}
	c, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("delivery content: not a JSON object")
	}
	c[DeliveryKey] = map[string]string{"delivery_id": d.DeliveryID, "stage": d.Stage.String()}
	if d.ReplacesEventID != "" {
		// The replacement's own relation (a reply, a thread) belongs to the
		// event it replaces; new content carries none.
		delete(c, "m.relates_to")
		body, _ := c["body"].(string)
		c = map[string]any{
			"msgtype":       orString(c["msgtype"], "m.text"),
			"body":          "* " + body,
			"m.new_content": c,
			"m.relates_to":  map[string]string{"rel_type": "m.replace", "event_id": d.ReplacesEventID},
			DeliveryKey:     c[DeliveryKey],
		}
	} else if d.Thread != nil {
		if _, ok := c["m.relates_to"]; !ok {
			c["m.relates_to"] = map[string]any{"rel_type": "m.thread", "event_id": *d.Thread, "is_falling_back": true}
		}
	}
	return encodeCanonical(c)
}

func orString(v any, def string) string {
	if s, ok := v.(string); ok && s != "" {
		return s
	}
	return def
}
