package journal

import (
	"encoding/json"
	"fmt"
	"time"
)

// Parsed is one inbound event after validation, which needs no storage and
// so runs in the caller's goroutine, off the transaction.
type Parsed struct {
	In    Inbound
	Event *Event // nil when Err is set
	Err   error
}

// Parse validates a batch against the clock's now.
func Parse(events []Inbound, now time.Time) []Parsed {
	out := make([]Parsed, len(events))
	for i, in := range events {
		ev, err := ParseEvent(in, now)
		out[i] = Parsed{In: in, Event: ev, Err: err}
	}
	return out
}

// RoomState is a room's membership as one transaction sees it.
type RoomState struct {
	Epoch    int64
	Departed bool
}

// AdmissionStore is what admission and history installs need of a backend,
// for one principal inside one transaction. It stores; AdmitBatch and
// InstallHistory decide.
type AdmissionStore interface {
	// Room reads the room's membership, registering the room on first
	// sight.
	Room(room string) (RoomState, error)
	// ThreadOf returns the thread key of the principal's admitted eventID
	// in room; ok is false when it holds no such event.
	ThreadOf(room, eventID string) (thread string, ok bool, err error)
	// Insert journals ev in thread under epoch unless the principal holds
	// its ID already (admitted is false then). A pending row keeps ev's
	// canonical payload; a settled one keeps its identity alone.
	Insert(ev *Event, thread string, class Class, pending bool, epoch int64) (seq int64, admitted bool, err error)
	// Known returns the position and thread key of an event the principal
	// journaled in room.
	Known(room, eventID string) (seq int64, thread string, err error)
	// RecordRejected keeps a malformed event for inspection; the same
	// bytes are kept once.
	RecordRejected(in Inbound, eventID string, reason error) error
	// Projection is the projection store for the event at journal position
	// seq in room. rebuilt is set when the event was admitted before and is
	// projected again.
	Projection(room string, seq int64, rebuilt bool) ProjectionStore
	// StoreSyncToken stores the principal's sync token.
	StoreSyncToken(token string) error
	// Await marks the event just journaled at seq as ciphertext awaiting
	// the megolm session, keeping raw (the event as received) to decrypt
	// once the key comes.
	Await(seq int64, room, session string, raw json.RawMessage) error
}

// AdmitBatch journals one parsed sync batch for the principal self: each
// event is inserted or recognised as a duplicate and projected, malformed
// ones are recorded and skipped, and nextBatch is stored, all in the
// store's one transaction. It returns one result per event and, per room,
// the newest position it wrote, for the after-commit hints.
func AdmitBatch(s AdmissionStore, self string, events []Parsed, nextBatch string) ([]AdmitResult, map[string]int64, error) {
	results := make([]AdmitResult, len(events))
	rooms := make(map[string]RoomState)
	newest := make(map[string]int64)
	for i, pe := range events {
		if pe.Err != nil {
			results[i] = AdmitResult{EventID: salvageEventID(pe.In.Event), Outcome: Rejected, Err: pe.Err}
			if err := recordRejected(s, pe.In, results[i].EventID, pe.Err); err != nil {
				return nil, nil, err
			}
			continue
		}
		ev := pe.Event
		room, ok := rooms[ev.RoomID]
		if !ok {
			var err error
			if room, err = s.Room(ev.RoomID); err != nil {
				return nil, nil, fmt.Errorf("read membership: %w", err)
			}
			rooms[ev.RoomID] = room
		}
		if awaits(pe) {
			admitted, err := await(s, ev, pe.In, room.Epoch)
			if err != nil {
				return nil, nil, fmt.Errorf("admit %s: %w", ev.ID, err)
			}
			results[i] = AdmitResult{EventID: ev.ID, Outcome: Duplicate}
			if admitted {
				results[i] = AdmitResult{EventID: ev.ID, Outcome: Admitted, Class: ContextOnly, Awaiting: true}
			}
			continue
		}
		class := Classify(ev, self, room.Departed)
		seq, admitted, err := insert(s, ev, class, room.Epoch)
		if err != nil {
			return nil, nil, fmt.Errorf("admit %s: %w", ev.ID, err)
		}
		if !admitted {
			results[i] = AdmitResult{EventID: ev.ID, Outcome: Duplicate}
			continue
		}
		if err := Project(s.Projection(ev.RoomID, seq, false), ev, self, room.Departed); err != nil {
			return nil, nil, err
		}
		results[i] = AdmitResult{EventID: ev.ID, Outcome: Admitted, Class: class}
		newest[ev.RoomID] = seq
	}
	if nextBatch != "" {
		if err := s.StoreSyncToken(nextBatch); err != nil {
			return nil, nil, fmt.Errorf("store sync token: %w", err)
		}
	}
	return results, newest, nil
}

// InstallHistory installs one chunk of room's history fetched under the
// membership epoch, and refuses it (ErrMembershipEnded) once that
// membership is over. Every event is history: journaled settled, never
// work. One the journal already holds is projected again (Reproject), so a
// rejoined room shows its history again while its journal row stays the
// proof of its first admission.
func InstallHistory(s AdmissionStore, self, room string, epoch int64, events []Parsed) (HistoryResult, error) {
	var res HistoryResult
	state, err := s.Room(room)
	if err != nil {
		return res, fmt.Errorf("read membership: %w", err)
	}
	if state.Departed || state.Epoch != epoch {
		return res, fmt.Errorf("%w: history of %s was fetched under epoch %d, the room is at %d", ErrMembershipEnded, room, epoch, state.Epoch)
	}
	for _, pe := range events {
		if pe.Err != nil {
			res.Rejected++
			if err := recordRejected(s, pe.In, salvageEventID(pe.In.Event), pe.Err); err != nil {
				return res, err
			}
			continue
		}
		ev := pe.Event
		if ev.RoomID != room || ev.Provenance != History {
			return res, fmt.Errorf("%w: %s is not history of %s", ErrInvalidArgument, ev.ID, room)
		}
		if awaits(pe) {
			admitted, err := await(s, ev, pe.In, state.Epoch)
			if err != nil {
				return res, fmt.Errorf("install %s: %w", ev.ID, err)
			}
			if admitted {
				res.Admitted++
			} else {
				res.Known++
			}
			continue
		}
		seq, admitted, err := insert(s, ev, Classify(ev, self, false), state.Epoch)
		if err != nil {
			return res, fmt.Errorf("install %s: %w", ev.ID, err)
		}
		if admitted {
			res.Admitted++
			if err := Project(s.Projection(room, seq, false), ev, self, false); err != nil {
				return res, err
			}
			continue
		}
		res.Known++
		if seq, ev.Thread, err = s.Known(room, ev.ID); err != nil {
			return res, fmt.Errorf("install %s: %w", ev.ID, err)
		}
		if err := Reproject(s.Projection(room, seq, true), ev, self); err != nil {
			return res, err
		}
	}
	return res, nil
}

// CoverageStore records that a conversation was hydrated.
type CoverageStore interface {
	// Room reads the room's membership, registering the room on first
	// sight.
	Room(room string) (RoomState, error)
	// Cover writes the conversation's coverage marker under epoch.
	Cover(room, thread string, epoch int64) error
}

// MarkCovered publishes that a conversation (thread "" for the room) was
// hydrated under epoch, unless that membership is over: a marker covers
// only the membership whose walk wrote it.
func MarkCovered(s CoverageStore, room, thread string, epoch int64) error {
	state, err := s.Room(room)
	if err != nil {
		return fmt.Errorf("mark covered: %w", err)
	}
	if state.Departed || state.Epoch != epoch {
		return fmt.Errorf("%w: %s was hydrated under epoch %d, the room is at %d", ErrMembershipEnded, room, epoch, state.Epoch)
	}
	if err := s.Cover(room, thread, epoch); err != nil {
		return fmt.Errorf("mark covered: %w", err)
	}
	return nil
}

// JournalContext journals ev as context only, settled from the start,
// unless the principal holds it already.
func JournalContext(s AdmissionStore, ev *Event) error {
	state, err := s.Room(ev.RoomID)
	if err != nil {
		return fmt.Errorf("read membership: %w", err)
	}
	_, _, err = insert(s, ev, ContextOnly, state.Epoch)
	return err
}

// insert journals ev: actionable events stay pending with their payload,
// everything else is settled from the start. A relation belongs to the
// thread of the event it relates to.
func insert(s AdmissionStore, ev *Event, class Class, epoch int64) (int64, bool, error) {
	thread, err := relationThread(s, ev)
	if err != nil {
		return 0, false, err
	}
	seq, admitted, err := s.Insert(ev, thread, class, class == Actionable, epoch)
	if admitted {
		ev.Thread = thread
	}
	return seq, admitted, err
}

// rejectedRecorder keeps malformed events.
type rejectedRecorder interface {
	RecordRejected(in Inbound, eventID string, reason error) error
}

func recordRejected(s rejectedRecorder, in Inbound, eventID string, reason error) error {
	if err := s.RecordRejected(in, eventID, reason); err != nil {
		return fmt.Errorf("record rejected event: %w", err)
	}
	return nil
}

// salvageEventID reads an event ID from a rejected event for its report.
func salvageEventID(raw json.RawMessage) string {
	var e struct {
		EventID string `json:"event_id"`
	}
	if json.Unmarshal(raw, &e) != nil || !ValidEventID(e.EventID) {
		return ""
	}
	return e.EventID
}

// AdmitDelivered admits an event the agent sent exactly as its sync echo
// will read, server timestamp included, so whichever comes first projects
// it and the other deduplicates against it. It reports false when the
// rules refused it (a timestamp the parser finds absurd): it is recorded
// as rejected and left to its echo.
func AdmitDelivered(s AdmissionStore, self string, d Delivery, sent Sent, now time.Time) (bool, error) {
	content, err := WireContent(d)
	if err != nil {
		return false, err
	}
	raw, err := json.Marshal(map[string]any{
		"event_id": sent.EventID, "type": d.EventType, "sender": self,
		"origin_server_ts": sent.ServerTS, "content": content,
	})
	if err != nil {
		return false, err
	}
	res, _, err := AdmitBatch(s, self, Parse([]Inbound{{RoomID: d.RoomID, Provenance: Live, Event: raw}}, now), "")
	if err != nil {
		return false, err
	}
	return res[0].Outcome != Rejected, nil
}
