package journal

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"
)

// MaxContentBytes bounds the encoded content of one admitted event. Matrix
// caps a whole event at 64 KiB, so anything larger did not come from a
// conforming server.
const MaxContentBytes = 64 << 10

// MaxJSONDepth bounds how deeply an inbound event nests JSON objects and
// arrays, the event itself being level 1. Matrix sets no depth bound, but
// real events stay within about ten levels (content, m.new_content,
// m.relates_to, a redacted_because event in unsigned), while readers
// downstream refuse deep values (encoding/json stops at 10,000 levels, and
// 64 KiB of content holds 30,000): an event nested deeper is malformed at
// admission rather than stored where no reader can decode it.
const MaxJSONDepth = 64

// maxFutureSkew is how far ahead of the local clock an origin_server_ts may be
// before it is treated as absurd rather than as clock skew.
const maxFutureSkew = 366 * 24 * time.Hour

// Provenance says where an event was seen, which decides whether it may be
// answered. It is never guessed from the event itself.
type Provenance uint8

// Provenances.
const (
	// Live events come from the timeline of an incremental sync.
	Live Provenance = 1
	// Recovered events were fetched to fill a limited gap of an incremental
	// sync: the agent missed them while away, so they are actionable too.
	Recovered Provenance = 2
	// History is the first sync's timeline and everything hydration fetches.
	// It is never actionable.
	History Provenance = 3
)

// String implements fmt.Stringer.
func (p Provenance) String() string {
	switch p {
	case Live:
		return "live"
	case Recovered:
		return "recovered"
	case History:
		return "history"
	}
	return "provenance(" + strconv.Itoa(int(p)) + ")"
}

// Class decides what the journal keeps of an event.
type Class uint8

// Classes.
const (
	// Actionable events are stored pending with their canonical payload until
	// settled.
	Actionable Class = 1
	// ContextOnly events are stored settled with an empty payload; only their
	// identity is kept, to deduplicate.
	ContextOnly Class = 2
)

// String implements fmt.Stringer.
func (c Class) String() string {
	switch c {
	case Actionable:
		return "actionable"
	case ContextOnly:
		return "context_only"
	}
	return "class(" + strconv.Itoa(int(c)) + ")"
}

// Kind is the journal's coarse reading of an event's type.
type Kind uint8

// Kinds.
const (
	KindOther      Kind = 0
	KindMessage    Kind = 1 // m.room.message with a text msgtype
	KindMedia      Kind = 2 // image, file, audio, video, sticker
	KindEdit       Kind = 3 // m.replace of another message
	KindReaction   Kind = 4
	KindRedaction  Kind = 5
	KindMembership Kind = 6
	KindEncrypted  Kind = 7 // ciphertext the journal cannot read
	KindState      Kind = 8 // any other state event
)

// String implements fmt.Stringer.
func (k Kind) String() string {
	switch k {
	case KindMessage:
		return "message"
	case KindMedia:
		return "media"
	case KindEdit:
		return "edit"
	case KindReaction:
		return "reaction"
	case KindRedaction:
		return "redaction"
	case KindMembership:
		return "membership"
	case KindEncrypted:
		return "encrypted"
	case KindState:
		return "state"
	}
	return "other"
}

// TurnBacked reports whether answering the kind produces a turn (and so a
// delivery). A membership fence force-settles only these; a redaction still
// owes cleanup and must stay pending.
func (k Kind) TurnBacked() bool { return k == KindMessage || k == KindMedia }

// Original reports whether events of the kind are logical messages of
// their own, the rows of the visible projection that edits apply to.
func (k Kind) Original() bool { return k == KindMessage || k == KindMedia }

// Visible reports whether the kind adds or revises a row of the visible
// conversation.
func (k Kind) Visible() bool { return k == KindMessage || k == KindMedia || k == KindEdit }

// Inbound is one event as a transport hands it to admission: the raw JSON
// and the room and provenance it was seen under.
type Inbound struct {
	// RoomID is the room the event was delivered in (sync timelines omit
	// room_id from the event itself).
	RoomID string
	// Provenance is where the event was seen.
	Provenance Provenance
	// Event is the event's JSON as received.
	Event json.RawMessage
	// AwaitingSession is set for an encrypted event the daemon holds no
	// key for yet: the megolm session it waits on. The event is journaled
	// as ciphertext awaiting that key, never actionable until decrypted.
	AwaitingSession string
	// Undecryptable says why an encrypted event can never be decrypted
	// (malformed ciphertext, an unknown algorithm, a replayed message
	// index): the event is malformed, recorded as rejected and skipped.
	Undecryptable string
}

// Event is a validated inbound event with the fields the journal's rules read.
type Event struct {
	ID     string
	RoomID string
	Sender string
	Type   string
	// TS is origin_server_ts in milliseconds.
	TS         int64
	Kind       Kind
	Provenance Provenance
	// StateKey is set for state events.
	StateKey *string
	// Membership is content.membership of an m.room.member event.
	Membership string
	// Target is the event an edit replaces, a reaction annotates or a
	// redaction removes.
	Target string
	// Thread is the storage key of the thread this event belongs to ("" for
	// the room). An edit's thread is its target's and is resolved later.
	Thread string
	// Content is the canonical content of the event.
	Content json.RawMessage
	// NewContent is the canonical m.new_content of an edit.
	NewContent json.RawMessage
	// Canonical is the canonical JSON of the whole event, room_id included.
	Canonical json.RawMessage
	// Notice is set when content.msgtype is m.notice: a bot's message,
	// never owed an answer.
	Notice bool
	// Preview is set when what the event puts on screen (Content, or
	// NewContent for an edit) is only a sidecar preview (IsSidecarPreview).
	// Parsing decides both, so the writer never decodes content again.
	Preview bool
	// Redacted is set when the server handed the event over already
	// redacted (unsigned.redacted_because), as history fetched after the
	// redaction arrives: its content is gone, and with it any relation, so
	// nothing it once said may reach the screen.
	Redacted bool
}

// maxEventBytes bounds the raw JSON of one inbound event before it is
// decoded at all. Matrix caps an event at 64 KiB; a sync may add unsigned
// data, so the raw bound is looser than the content bound.
const maxEventBytes = 1 << 20

// object is a decoded JSON object read with exact keys.
type object map[string]any

// str reads an optional string field: absent and null read as not present,
// any other type is an error.
func (o object) str(key string) (s string, present bool, err error) {
	switch v := o[key].(type) {
	case nil:
		return "", false, nil
	case string:
		return v, true, nil
	}
	return "", false, fmt.Errorf("%s: not a string", key)
}

// obj reads an optional object field the same way.
func (o object) obj(key string) (object, bool, error) {
	switch v := o[key].(type) {
	case nil:
		return nil, false, nil
	case map[string]any:
		return v, true, nil
	}
	return nil, false, fmt.Errorf("%s: not an object", key)
}

// ParseEvent validates one inbound event and extracts what the journal's
// rules need. Every failure is an *EventError naming the field at fault.
//
// The event is decoded once, strictly (decodeJSON: exact keys, no repeated
// key), and everything is read from that one tree: the kind, relation and
// class, the size check and the canonical form that is stored. No rule can
// see a field that the stored event does not hold.
func ParseEvent(in Inbound, now time.Time) (*Event, error) {
	if !ValidRoomID(in.RoomID) {
		return nil, eventErr("room_id", "not a Matrix room ID")
	}
	switch in.Provenance {
	case Live, Recovered, History:
	default:
		return nil, eventErr("provenance", "unknown provenance")
	}
	if len(in.Event) > maxEventBytes {
		return nil, eventErr("event", "larger than 1 MiB")
	}
	if in.Undecryptable != "" {
		return nil, eventErr("content", "undecryptable: "+in.Undecryptable)
	}
	if !utf8.Valid(in.Event) {
		return nil, eventErr("event", "not valid UTF-8")
	}
	tree, err := decodeJSON(in.Event)
	if err != nil {
		return nil, eventErr("event", "not JSON with one reading: "+err.Error())
	}
	whole, ok := tree.(map[string]any)
	if !ok {
		return nil, eventErr("event", "not a JSON object")
	}
	w := object(whole)
	ev := &Event{RoomID: in.RoomID, Provenance: in.Provenance}
	var fields [5]string
	var present [5]bool
	for i, key := range []string{"event_id", "type", "sender", "room_id", "state_key"} {
		if fields[i], present[i], err = w.str(key); err != nil {
			return nil, eventErr("event", err.Error())
		}
	}
	if present[4] {
		ev.StateKey = &fields[4]
	}
	switch {
	case !present[0]:
		return nil, eventErr("event_id", "missing")
	case !ValidEventID(fields[0]):
		return nil, eventErr("event_id", "not a Matrix event ID")
	case fields[1] == "":
		return nil, eventErr("type", "missing")
	case !present[2]:
		return nil, eventErr("sender", "missing")
	case !ValidUserID(fields[2]):
		return nil, eventErr("sender", "not a Matrix user ID")
	case present[3] && fields[3] != in.RoomID:
		return nil, eventErr("room_id", "disagrees with the room it was delivered in")
	}
	ev.ID, ev.Type, ev.Sender = fields[0], fields[1], fields[2]
	if ev.TS, err = timestamp(w["origin_server_ts"], now); err != nil {
		return nil, err
	}
	content, isObject := whole["content"].(map[string]any)
	if !isObject {
		return nil, eventErr("content", "missing or not an object")
	}
	if ev.Content, err = encodeCanonical(content); err != nil {
		return nil, eventErr("content", err.Error())
	}
	if len(ev.Content) > MaxContentBytes {
		return nil, eventErr("content", "larger than 64 KiB")
	}
	// Whether the server redacted it decides how much of its content
	// classification may ask for.
	if unsigned, ok := whole["unsigned"].(map[string]any); ok {
		_, ev.Redacted = unsigned["redacted_because"]
	}
	if err := ev.classifyKind(w, content); err != nil {
		return nil, err
	}
	ev.Notice = content["msgtype"] == "m.notice"
	if ev.Kind == KindEdit {
		ev.Preview = IsSidecarPreview(ev.NewContent)
	} else {
		_, ev.Preview = content[LongTextKey].(map[string]any)
	}
	whole["room_id"] = in.RoomID
	if ev.Canonical, err = encodeCanonical(whole); err != nil {
		return nil, eventErr("event", err.Error())
	}
	return ev, nil
}

// timestamp reads origin_server_ts: an integer literal, not a string, a
// fraction or an exponent, within a year of now.
func timestamp(v any, now time.Time) (int64, error) {
	n, ok := v.(json.Number)
	if !ok {
		if v == nil {
			return 0, eventErr("origin_server_ts", "missing")
		}
		return 0, eventErr("origin_server_ts", "not an integer")
	}
	ts, err := strconv.ParseInt(string(n), 10, 64)
	if err != nil {
		return 0, eventErr("origin_server_ts", "not an integer")
	}
	if ts <= 0 || ts > now.Add(maxFutureSkew).UnixMilli() {
		return 0, eventErr("origin_server_ts", "absurd timestamp "+strconv.FormatInt(ts, 10))
	}
	return ts, nil
}

// RelThread is the rel_type of a message in a thread.
const RelThread = "m.thread"

// relThreadUnstable is the name of m.thread before the specification took
// it (MSC3440). Element still sends it to a homeserver that advertises no
// spec version from v1.4 on, Dendrite 0.13 among them.
const relThreadUnstable = "io.element.thread"

// RelType returns a relation's rel_type as the rules read it: the unstable
// name of a thread relation is read as m.thread, so a thread reply is one
// whichever name its client chose.
func RelType(relType string) string {
	if relType == relThreadUnstable {
		return RelThread
	}
	return relType
}

// relation is content.m.relates_to as the rules read it.
type relation struct {
	relType, eventID string
}

// readRelation reads content.m.relates_to; nil when there is none.
func readRelation(c object) (*relation, error) {
	r, ok, err := c.obj("m.relates_to")
	if err != nil || !ok {
		return nil, err
	}
	rel := &relation{}
	if rel.relType, _, err = r.str("rel_type"); err != nil {
		return nil, err
	}
	rel.relType = RelType(rel.relType)
	if rel.eventID, _, err = r.str("event_id"); err != nil {
		return nil, err
	}
	return rel, nil
}

func (ev *Event) classifyKind(w, c object) error {
	rel, err := readRelation(c)
	if err != nil {
		return eventErr("content", "m.relates_to."+err.Error())
	}
	if rel != nil && rel.relType != "" && !ValidEventID(rel.eventID) {
		return eventErr("content.m.relates_to.event_id", "not a Matrix event ID")
	}
	msgtype, _, err := c.str("msgtype")
	if err != nil {
		return eventErr("content", err.Error())
	}
	switch ev.Type {
	case "m.room.message", "m.sticker":
		if rel != nil && rel.relType == "m.replace" {
			nc, ok := c["m.new_content"].(map[string]any)
			if !ok {
				return eventErr("content.m.new_content", "an edit needs an object")
			}
			canonical, err := encodeCanonical(nc)
			if err != nil {
				return eventErr("content.m.new_content", err.Error())
			}
			ev.Kind, ev.Target, ev.NewContent = KindEdit, rel.eventID, canonical
			return nil
		}
		if rel != nil && rel.relType == RelThread {
			ev.Thread = rel.eventID
		}
		ev.Kind = KindMessage
		if ev.Type == "m.sticker" {
			ev.Kind = KindMedia
		} else {
			switch msgtype {
			case "m.image", "m.file", "m.audio", "m.video":
				ev.Kind = KindMedia
			}
		}
	case "m.reaction":
		if rel == nil && ev.Redacted {
			// Redaction stripped its relation: nothing of it can show,
			// and its copy stands in for the redaction.
			return nil
		}
		if rel == nil || rel.relType != "m.annotation" {
			return eventErr("content.m.relates_to", "a reaction needs an m.annotation relation")
		}
		ev.Kind, ev.Target = KindReaction, rel.eventID
	case "m.room.redaction":
		outer, hasOuter, err := w.str("redacts")
		if err != nil {
			return eventErr("event", err.Error())
		}
		inner, hasInner, err := c.str("redacts")
		if err != nil {
			return eventErr("content", err.Error())
		}
		// The content's target (room version 11) is authoritative.
		target, ok := outer, hasOuter
		if hasInner {
			target, ok = inner, true
		}
		if !ok || !ValidEventID(target) {
			return eventErr("redacts", "a redaction needs a target event ID")
		}
		ev.Kind, ev.Target = KindRedaction, target
	case "m.room.encrypted":
		ev.Kind = KindEncrypted
	case "m.room.member":
		if ev.StateKey == nil || !ValidUserID(*ev.StateKey) {
			return eventErr("state_key", "a membership event needs a user ID state key")
		}
		membership, ok, err := c.str("membership")
		if err != nil {
			return eventErr("content", err.Error())
		}
		if !ok {
			return eventErr("content.membership", "missing")
		}
		ev.Kind, ev.Membership = KindMembership, membership
	default:
		if ev.StateKey != nil {
			ev.Kind = KindState
		}
	}
	return nil
}

// Classify decides what the journal keeps of an event admitted by the
// principal whose Matrix user ID is self. departed says the principal is
// out of the event's room: what sync still delivers from before the leave
// belongs to a membership that ended and is owed nothing.
func Classify(ev *Event, self string, departed bool) Class {
	if departed || ev.Provenance == History || ev.Sender == self {
		return ContextOnly
	}
	switch ev.Kind {
	case KindMessage:
		if ev.Notice {
			return ContextOnly
		}
		return Actionable
	case KindMedia, KindReaction, KindRedaction:
		return Actionable
	}
	return ContextOnly
}
