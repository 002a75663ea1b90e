// Package mx builds Matrix events for tests. It depends on nothing but the
// journal's types, so a backend's contract suite can use it without pulling
// in another backend.
package mx

import (
	"encoding/json"

	"github.com/mindroomd/mindroomd/journal"
)

// Ev is a Matrix event under construction. Fields left empty are omitted,
// so tests can also build malformed events.
type Ev map[string]any

// Message builds an m.room.message text event.
func Message(id, sender string, ts int64, body string) Ev {
	return Ev{
		"event_id": id, "type": "m.room.message", "sender": sender, "origin_server_ts": ts,
		"content": map[string]any{"msgtype": "m.text", "body": body},
	}
}

// Notice builds an m.notice message (context-only).
func Notice(id, sender string, ts int64, body string) Ev {
	e := Message(id, sender, ts, body)
	e["content"].(map[string]any)["msgtype"] = "m.notice"
	return e
}

// ThreadReply builds a text message in the thread rooted at root.
func ThreadReply(id, sender string, ts int64, root, body string) Ev {
	e := Message(id, sender, ts, body)
	e["content"].(map[string]any)["m.relates_to"] = map[string]any{"rel_type": "m.thread", "event_id": root}
	return e
}

// Image builds an m.image message (media).
func Image(id, sender string, ts int64) Ev {
	return Ev{
		"event_id": id, "type": "m.room.message", "sender": sender, "origin_server_ts": ts,
		"content": map[string]any{"msgtype": "m.image", "body": "cat.png", "url": "mxc://example.org/cat"},
	}
}

// Encrypted builds ciphertext the journal cannot read.
func Encrypted(id, sender string, ts int64) Ev {
	return Ev{
		"event_id": id, "type": "m.room.encrypted", "sender": sender, "origin_server_ts": ts,
		"content": map[string]any{"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "AwgAEnAc", "session_id": "s"},
	}
}

// Member builds the sender's own m.room.member event.
func Member(id, sender string, ts int64, membership string) Ev {
	return Ev{
		"event_id": id, "type": "m.room.member", "sender": sender, "origin_server_ts": ts,
		"state_key": sender, "content": map[string]any{"membership": membership},
	}
}

// StreamEdit builds an edit whose new content carries a stream status.
func StreamEdit(id, sender string, ts int64, target, body, status string) Ev {
	return EditContent(id, sender, ts, target, map[string]any{
		"msgtype": "m.text", "body": body, journal.StreamStatusKey: status,
	})
}

// Edit builds an m.replace of target whose new body is body.
func Edit(id, sender string, ts int64, target, body string) Ev {
	return EditContent(id, sender, ts, target, map[string]any{"msgtype": "m.text", "body": body})
}

// EditContent builds an m.replace of target with newContent as m.new_content.
func EditContent(id, sender string, ts int64, target string, newContent map[string]any) Ev {
	return Ev{
		"event_id": id, "type": "m.room.message", "sender": sender, "origin_server_ts": ts,
		"content": map[string]any{
			"msgtype": "m.text", "body": "* edited",
			"m.new_content": newContent,
			"m.relates_to":  map[string]any{"rel_type": "m.replace", "event_id": target},
		},
	}
}

// Reaction builds an m.reaction annotating target.
func Reaction(id, sender string, ts int64, target, key string) Ev {
	return Ev{
		"event_id": id, "type": "m.reaction", "sender": sender, "origin_server_ts": ts,
		"content": map[string]any{"m.relates_to": map[string]any{"rel_type": "m.annotation", "event_id": target, "key": key}},
	}
}

// Redaction builds an m.room.redaction of target.
func Redaction(id, sender string, ts int64, target string) Ev {
	return Ev{
		"event_id": id, "type": "m.room.redaction", "sender": sender, "origin_server_ts": ts,
		"redacts": target, "content": map[string]any{"redacts": target},
	}
}

// Sidecar builds a message whose real content lives in an attached JSON
// file, carrying only a preview in body.
func Sidecar(id, sender string, ts int64, preview string) Ev {
	e := Message(id, sender, ts, preview)
	c := e["content"].(map[string]any)
	c[journal.LongTextKey] = map[string]any{"version": 2, "encoding": "matrix_event_content_json"}
	c["url"] = "mxc://example.org/sidecar"
	return e
}

// With returns a copy of e with key set (or removed when value is nil), so
// tests build malformed events from good ones.
func (e Ev) With(key string, value any) Ev {
	c := make(Ev, len(e))
	for k, v := range e {
		c[k] = v
	}
	if value == nil {
		delete(c, key)
	} else {
		c[key] = value
	}
	return c
}

// In wraps the event as one inbound event of a room and provenance.
func (e Ev) In(room string, prov journal.Provenance) journal.Inbound {
	return journal.Inbound{RoomID: room, Provenance: prov, Event: e.JSON()}
}

// JSON encodes the event.
func (e Ev) JSON() json.RawMessage {
	b, err := json.Marshal(map[string]any(e))
	if err != nil {
		panic(err)
	}
	return b
}

// In wraps events as inbound events of one room and provenance.
func In(room string, prov journal.Provenance, evs ...Ev) []journal.Inbound {
	out := make([]journal.Inbound, len(evs))
	for i, e := range evs {
		out[i] = e.In(room, prov)
	}
	return out
}

// Live wraps events as live inbound events of one room.
func Live(room string, evs ...Ev) []journal.Inbound { return In(room, journal.Live, evs...) }
