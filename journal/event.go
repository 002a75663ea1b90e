package journal

import (
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"
)

// MaxContentBytes bounds the encoded content of one admitted event. Matrix
// caps a whole event at 64 KiB, so anything larger did not come from a
// conforming server.
const MaxContentBytes = 64 << 10

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
}

// wireEvent is the envelope shape; a field of the wrong JSON type fails
// decoding and rejects the event with a precise reason. The timestamp stays
// raw because a json.Number would also accept a quoted string.
type wireEvent struct {
	EventID        *string         `json:"event_id"`
	Type           *string         `json:"type"`
	Sender         *string         `json:"sender"`
	OriginServerTS json.RawMessage `json:"origin_server_ts"`
	RoomID         *string         `json:"room_id"`
	StateKey       *string         `json:"state_key"`
	Redacts        *string         `json:"redacts"`
	Content        json.RawMessage `json:"content"`
}

type wireRelation struct {
	RelType string `json:"rel_type"`
	EventID string `json:"event_id"`
}

type wireContent struct {
	MsgType    *string         `json:"msgtype"`
	Membership *string         `json:"membership"`
	Redacts    *string         `json:"redacts"`
	RelatesTo  *wireRelation   `json:"m.relates_to"`
	NewContent json.RawMessage `json:"m.new_content"`
}

// ParseEvent validates one inbound event and extracts what the journal's
// rules need. Every failure is an *EventError naming the field at fault.
func ParseEvent(in Inbound, now time.Time) (*Event, error) {
	if !ValidRoomID(in.RoomID) {
		return nil, eventErr("room_id", "not a Matrix room ID")
	}
	switch in.Provenance {
	case Live, Recovered, History:
	default:
		return nil, eventErr("provenance", "unknown provenance")
	}
	if !utf8.Valid(in.Event) {
		return nil, eventErr("event", "not valid UTF-8")
	}
	var w wireEvent
	if err := json.Unmarshal(in.Event, &w); err != nil {
		return nil, eventErr("event", "not a JSON object of the event shape: "+err.Error())
	}
	ev := &Event{RoomID: in.RoomID, Provenance: in.Provenance, StateKey: w.StateKey}
	switch {
	case w.EventID == nil:
		return nil, eventErr("event_id", "missing")
	case !ValidEventID(*w.EventID):
		return nil, eventErr("event_id", "not a Matrix event ID")
	case w.Type == nil || *w.Type == "":
		return nil, eventErr("type", "missing")
	case w.Sender == nil:
		return nil, eventErr("sender", "missing")
	case !ValidUserID(*w.Sender):
		return nil, eventErr("sender", "not a Matrix user ID")
	case len(w.OriginServerTS) == 0:
		return nil, eventErr("origin_server_ts", "missing")
	case w.RoomID != nil && *w.RoomID != in.RoomID:
		return nil, eventErr("room_id", "disagrees with the room it was delivered in")
	case len(w.Content) == 0 || w.Content[0] != '{':
		return nil, eventErr("content", "missing or not an object")
	case len(w.Content) > MaxContentBytes:
		return nil, eventErr("content", "larger than 64 KiB")
	}
	ev.ID, ev.Type, ev.Sender = *w.EventID, *w.Type, *w.Sender
	ts, err := strconv.ParseInt(string(w.OriginServerTS), 10, 64)
	if err != nil {
		return nil, eventErr("origin_server_ts", "not an integer")
	}
	if ts <= 0 || ts > now.Add(maxFutureSkew).UnixMilli() {
		return nil, eventErr("origin_server_ts", "absurd timestamp "+strconv.FormatInt(ts, 10))
	}
	ev.TS = ts

	var c wireContent
	if err := json.Unmarshal(w.Content, &c); err != nil {
		return nil, eventErr("content", "field of the wrong type: "+err.Error())
	}
	if err := ev.classifyKind(&w, &c); err != nil {
		return nil, err
	}
	// One generic decode serves both canonical forms: the event's and its
	// content's.
	decoded, err := decodeJSON(in.Event)
	if err != nil {
		return nil, eventErr("event", err.Error())
	}
	whole := decoded.(map[string]any)
	if ev.Content, err = encodeCanonical(whole["content"]); err != nil {
		return nil, eventErr("content", err.Error())
	}
	ev.Notice = c.MsgType != nil && *c.MsgType == "m.notice"
	if ev.Kind == KindEdit {
		ev.Preview = IsSidecarPreview(ev.NewContent)
	} else {
		content, _ := whole["content"].(map[string]any)
		_, ev.Preview = content[LongTextKey].(map[string]any)
	}
	whole["room_id"] = in.RoomID
	if ev.Canonical, err = encodeCanonical(whole); err != nil {
		return nil, eventErr("event", err.Error())
	}
	return ev, nil
}

func (ev *Event) classifyKind(w *wireEvent, c *wireContent) error {
	rel := c.RelatesTo
	if rel != nil && rel.RelType != "" && !ValidEventID(rel.EventID) {
		return eventErr("content.m.relates_to.event_id", "not a Matrix event ID")
	}
	switch ev.Type {
	case "m.room.message", "m.sticker":
		if rel != nil && rel.RelType == "m.replace" {
			if len(c.NewContent) == 0 || c.NewContent[0] != '{' {
				return eventErr("content.m.new_content", "an edit needs an object")
			}
			nc, err := CanonicalJSON(c.NewContent)
			if err != nil {
				return eventErr("content.m.new_content", err.Error())
			}
			ev.Kind, ev.Target, ev.NewContent = KindEdit, rel.EventID, nc
			return nil
		}
		if rel != nil && rel.RelType == "m.thread" {
			ev.Thread = rel.EventID
		}
		ev.Kind = KindMessage
		if ev.Type == "m.sticker" {
			ev.Kind = KindMedia
		} else if c.MsgType != nil {
			switch *c.MsgType {
			case "m.image", "m.file", "m.audio", "m.video":
				ev.Kind = KindMedia
			}
		}
	case "m.reaction":
		if rel == nil || rel.RelType != "m.annotation" {
			return eventErr("content.m.relates_to", "a reaction needs an m.annotation relation")
		}
		ev.Kind, ev.Target = KindReaction, rel.EventID
	case "m.room.redaction":
		target := w.Redacts
		if c.Redacts != nil {
			target = c.Redacts
		}
		if target == nil || !ValidEventID(*target) {
			return eventErr("redacts", "a redaction needs a target event ID")
		}
		ev.Kind, ev.Target = KindRedaction, *target
	case "m.room.encrypted":
		ev.Kind = KindEncrypted
	case "m.room.member":
		if ev.StateKey == nil || !ValidUserID(*ev.StateKey) {
			return eventErr("state_key", "a membership event needs a user ID state key")
		}
		if c.Membership == nil {
			return eventErr("content.membership", "missing")
		}
		ev.Kind, ev.Membership = KindMembership, *c.Membership
	default:
		if ev.StateKey != nil {
			ev.Kind = KindState
		}
	}
	return nil
}

// Classify decides what the journal keeps of an event admitted by the
// principal whose Matrix user ID is self.
func Classify(ev *Event, self string) Class {
	if ev.Provenance == History || ev.Sender == self {
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
