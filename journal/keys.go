package journal

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// An encrypted event whose megolm session the daemon does not hold yet is
// journaled as ciphertext awaiting its key: its identity deduplicates like
// any other event's, but it is never actionable and never projected until
// the key arrives. Then it is decrypted and resolved through the same rules
// as a clear event (ResolveAwaiting), or, past a deadline, settled as
// undecryptable.

// AwaitingEvent is a journaled event still waiting for its key.
type AwaitingEvent struct {
	// Seq is its journal position, which resolving keeps: work it becomes
	// is offered in the order it was received.
	Seq     int64
	EventID string
	RoomID  string
	// Session is the megolm session it waits on.
	Session string
	// Provenance is where it was seen: history never becomes work.
	Provenance Provenance
	// Event is the encrypted event as received.
	Event json.RawMessage
	// ReceivedMS is when it was journaled, in unix milliseconds.
	ReceivedMS int64
}

// DefaultKeyDeadline is how long an encrypted event waits for its key
// before it is settled as undecryptable: a day, so a sender's device
// offline overnight still shares it.
const DefaultKeyDeadline = 24 * time.Hour

// KeyWait names a megolm session some journaled events wait on.
type KeyWait struct {
	RoomID, Session string
}

// KeyOutcome is what resolving an awaiting event did.
type KeyOutcome uint8

// Key outcomes.
const (
	// KeyResolved: the cleartext was journaled and projected like a clear
	// event's (and is pending work if it is actionable).
	KeyResolved KeyOutcome = 1
	// KeyVoided: the membership it was received under has ended, so it was
	// settled as context: nothing of an old membership becomes work.
	KeyVoided KeyOutcome = 2
	// KeyNotAwaiting: the event waits no more (resolved before, voided by
	// a fence, or settled as undecryptable); nothing changed.
	KeyNotAwaiting KeyOutcome = 3
	// KeyMalformed: the cleartext is not a valid event; it was recorded as
	// rejected and the event settled as undecryptable.
	KeyMalformed KeyOutcome = 4
)

// String implements fmt.Stringer.
func (o KeyOutcome) String() string {
	switch o {
	case KeyResolved:
		return "resolved"
	case KeyVoided:
		return "voided"
	case KeyNotAwaiting:
		return "not_awaiting"
	case KeyMalformed:
		return "malformed"
	}
	return "key_outcome(" + strconv.Itoa(int(o)) + ")"
}

// Keys is what the daemon's decryption needs of a principal's journal.
type Keys interface {
	// KeyWaits lists the sessions the principal's awaiting events wait
	// on, at most limit of them.
	KeyWaits(ctx context.Context, limit int) ([]KeyWait, error)
	// AwaitingFor lists up to limit events of room waiting on session, in
	// receipt order.
	AwaitingFor(ctx context.Context, room, session string, limit int) ([]AwaitingEvent, error)
	// ResolveAwaiting installs the decrypted cleartext of the awaiting
	// event at seq in one transaction (ResolveAwaiting's rule).
	ResolveAwaiting(ctx context.Context, seq int64, clear Inbound) (KeyOutcome, error)
	// ExpireAwaiting settles as undecryptable every event that has waited
	// since before cutoffMS, and returns how many.
	ExpireAwaiting(ctx context.Context, cutoffMS int64) (int, error)
}

// AwaitingRow is an awaiting event as the resolving transaction reads it.
type AwaitingRow struct {
	RoomID     string
	Epoch      int64
	Provenance Provenance
}

// KeyStore is what resolving needs of a backend, for one principal inside
// one transaction.
type KeyStore interface {
	// Room reads the room's membership.
	Room(room string) (RoomState, error)
	// AwaitingRow reads the event at seq; ok is false unless it is still
	// awaiting its key.
	AwaitingRow(seq int64) (row AwaitingRow, ok bool, err error)
	// ThreadOf returns the thread key of the principal's admitted eventID
	// in room.
	ThreadOf(room, eventID string) (thread string, ok bool, err error)
	// Decrypted rewrites the awaiting row at seq as ev (its kind, thread
	// and target), pending with ev's payload or settled, and forgets the
	// ciphertext.
	Decrypted(seq int64, ev *Event, thread string, class Class, pending bool) error
	// Undecryptable settles the awaiting row at seq for good and forgets
	// the ciphertext.
	Undecryptable(seq int64) error
	// RecordRejected keeps a malformed cleartext for inspection.
	RecordRejected(in Inbound, eventID string, reason error) error
	// Projection is the projection store for the event at seq in room.
	Projection(room string, seq int64, rebuilt bool) ProjectionStore
}

// ResolveAwaiting installs the cleartext of the awaiting event at seq,
// decrypted once its key came. clear is the decrypted event under the
// outer event's ID, sender and timestamp, with the provenance the event
// was received under.
//
// The rules are a clear event's, applied late: it is classified and
// projected as admission would have, so a live message becomes work and
// history never does; an edit or a redaction that arrived meanwhile has
// already left its mark (a held edit, a tombstone) and wins as it would
// have. A membership that ended while it waited voids it: settled, never
// projected into the next one.
func ResolveAwaiting(s KeyStore, self string, seq int64, clear Parsed) (KeyOutcome, error) {
	row, ok, err := s.AwaitingRow(seq)
	if err != nil {
		return 0, fmt.Errorf("read awaiting event: %w", err)
	}
	if !ok {
		return KeyNotAwaiting, nil
	}
	if clear.Err != nil || clear.Event.RoomID != row.RoomID {
		reason := clear.Err
		if reason == nil {
			reason = eventErr("room_id", "the cleartext names another room")
		}
		if err := recordRejected(s, clear.In, salvageEventID(clear.In.Event), reason); err != nil {
			return 0, err
		}
		if err := s.Undecryptable(seq); err != nil {
			return 0, fmt.Errorf("settle undecryptable event: %w", err)
		}
		return KeyMalformed, nil
	}
	ev := clear.Event
	ev.Provenance = row.Provenance
	room, err := s.Room(row.RoomID)
	if err != nil {
		return 0, fmt.Errorf("read membership: %w", err)
	}
	if room.Departed || room.Epoch != row.Epoch {
		if err := s.Decrypted(seq, ev, ev.Thread, ContextOnly, false); err != nil {
			return 0, fmt.Errorf("void awaiting event: %w", err)
		}
		return KeyVoided, nil
	}
	thread, err := relationThread(s, ev)
	if err != nil {
		return 0, err
	}
	class := Classify(ev, self, false)
	if err := s.Decrypted(seq, ev, thread, class, class == Actionable); err != nil {
		return 0, fmt.Errorf("resolve awaiting event: %w", err)
	}
	ev.Thread = thread
	if err := Project(s.Projection(row.RoomID, seq, false), ev, self, false); err != nil {
		return 0, err
	}
	return KeyResolved, nil
}

// awaits reports whether a parsed event is ciphertext to journal as
// awaiting its key.
func awaits(pe Parsed) bool {
	return pe.In.AwaitingSession != "" && pe.Event.Kind == KindEncrypted
}

// await journals an encrypted event as awaiting its key, unless the
// principal holds it already.
func await(s AdmissionStore, ev *Event, in Inbound, epoch int64) (bool, error) {
	seq, admitted, err := s.Insert(ev, ev.Thread, ContextOnly, false, epoch)
	if err != nil || !admitted {
		return false, err
	}
	if err := s.Await(seq, ev.RoomID, in.AwaitingSession, in.Event); err != nil {
		return false, fmt.Errorf("keep ciphertext: %w", err)
	}
	return true, nil
}

// threadReader reads the thread of an admitted event.
type threadReader interface {
	ThreadOf(room, eventID string) (thread string, ok bool, err error)
}

// relationThread is the thread an event is journaled under: an edit's or a
// reaction's is its target's, when the journal holds the target.
func relationThread(s threadReader, ev *Event) (string, error) {
	if ev.Kind != KindEdit && ev.Kind != KindReaction {
		return ev.Thread, nil
	}
	t, ok, err := s.ThreadOf(ev.RoomID, ev.Target)
	if err != nil {
		return "", err
	}
	if ok {
		return t, nil
	}
	return ev.Thread, nil
}

// KeyNoticeBody is what the agent tells a room once per megolm session
// whose key it lacks, so the person knows why no answer comes.
const KeyNoticeBody = "I can't read a message here yet: its decryption key has not reached my device. " +
	"I will answer it once the key arrives (keeping your session open, or verifying my device, helps)."

// KeyNotice is the notice the agent sends to room about a session whose
// key it lacks. Its delivery ID is the session's, so it goes out once
// however often it is asked for, across restarts too.
func KeyNotice(room, session string) EnqueueRequest {
	content, _ := json.Marshal(map[string]string{"msgtype": "m.notice", "body": KeyNoticeBody})
	return EnqueueRequest{DeliveryID: "key-notice:" + session, Stage: StageFinal, RoomID: room, Content: content}
}
