package e2eeperson

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"maunium.net/go/mautrix/event"
	"maunium.net/go/mautrix/id"
)

// Decrypted is one room event as this person's client reads it.
type Decrypted struct {
	// EventID and Sender are the event's, as the server sent them.
	EventID string
	Sender  string
	// Type is the type of the event's content: the inner type (such as
	// m.room.message) of an encrypted event that decrypted,
	// m.room.encrypted of one that did not.
	Type string
	// Content is the decrypted content, or the content of an event that
	// was never encrypted; nil while Err is set. A decrypted content
	// carries m.relates_to even if the sender kept it in the cleartext
	// envelope only, as mautrix copies it in.
	Content map[string]any
	// Encrypted is whether the event came as m.room.encrypted.
	Encrypted bool
	// Err is why an encrypted event did not decrypt (no room key yet:
	// crypto.ErrNoSessionFound).
	Err error
	// Raw is the event as the server sent it.
	Raw json.RawMessage
}

// seenEvent is one timeline event the sync loop recorded.
type seenEvent struct {
	raw json.RawMessage
	evt *event.Event
	// read is what the event read as once it read in the clear; until
	// then each read tries to decrypt it again.
	read *Decrypted
}

// WithID matches the event with eventID, for AwaitDecrypted.
func WithID(eventID string) func(evType string, content map[string]any, raw json.RawMessage) bool {
	return func(_ string, _ map[string]any, raw json.RawMessage) bool {
		var e struct {
			ID string `json:"event_id"`
		}
		return json.Unmarshal(raw, &e) == nil && e.ID == eventID
	}
}

// AwaitDecrypted returns the first timeline event of room for which
// match is true, waiting on syncs until ctx ends (an error). match sees
// only events that read in the clear: ones that decrypted (evType and
// content as decrypted) and ones never encrypted; raw is the event as the
// server sent it. An encrypted event whose key is missing is tried again
// after every later sync, so awaiting it waits for its key as well. Events
// seen before the call count too.
func (c *Client) AwaitDecrypted(ctx context.Context, room string, match func(evType string, content map[string]any, raw json.RawMessage) bool) (Decrypted, error) {
	return c.await(ctx, room, fmt.Sprintf("await an event in %s", room), func(d Decrypted) bool {
		return d.Err == nil && match(d.Type, d.Content, d.Raw)
	})
}

// Decrypt waits, until ctx ends (an error), for a sync to show eventID in
// room, and reads it now: a key that arrived since the last try is used.
func (c *Client) Decrypt(ctx context.Context, room, eventID string) (Decrypted, error) {
	return c.await(ctx, room, "await "+eventID, func(d Decrypted) bool { return d.EventID == eventID })
}

// await returns the first timeline event of room, read now, that found
// accepts, waiting on syncs until ctx ends or the sync loop stops; what
// names the wait in its error, with how many events were seen.
func (c *Client) await(ctx context.Context, room, what string, found func(Decrypted) bool) (Decrypted, error) {
	for {
		c.mu.Lock()
		var hit *Decrypted
		for _, seen := range c.timeline[id.RoomID(room)] {
			if d := c.read(ctx, seen); found(d) {
				hit = &d
				break
			}
		}
		synced, syncErr, checked := c.synced, c.syncErr, len(c.timeline[id.RoomID(room)])
		c.mu.Unlock()
		if hit != nil {
			return *hit, nil
		}
		if syncErr != nil {
			return Decrypted{}, c.fail(fmt.Sprintf("%s (%d seen)", what, checked), syncErr)
		}
		select {
		case <-synced:
		case <-ctx.Done():
			return Decrypted{}, c.fail(fmt.Sprintf("%s (%d seen)", what, checked), ctx.Err())
		}
	}
}

// DecryptedTimeline returns every timeline event of room the sync loop has
// seen so far, oldest first, each decrypted where it can be now.
func (c *Client) DecryptedTimeline(ctx context.Context, room string) []Decrypted {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Decrypted
	for _, seen := range c.timeline[id.RoomID(room)] {
		out = append(out, c.read(ctx, seen))
	}
	return out
}

// ReadEvent reads raw, an event of room this client came by otherwise
// than through its sync (a page of /messages), as it reads its timeline's:
// decrypted if its key is here now. A state event read so changes no room
// state.
func (c *Client) ReadEvent(ctx context.Context, room string, raw json.RawMessage) Decrypted {
	evt := parseEvent(id.RoomID(room), raw)
	if evt == nil {
		return Decrypted{Raw: raw, Err: errors.New("the event does not parse")}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.read(ctx, &seenEvent{raw: raw, evt: evt})
}

// read returns what seen reads as now, trying to decrypt it if it is
// encrypted and has not decrypted yet. Called with mu held.
func (c *Client) read(ctx context.Context, seen *seenEvent) Decrypted {
	if seen.read != nil {
		return *seen.read
	}
	evt := seen.evt
	d := Decrypted{EventID: evt.ID.String(), Sender: evt.Sender.String(), Type: evt.Type.Type, Raw: seen.raw}
	content := evt.Content.VeryRaw
	if evt.Type == event.EventEncrypted {
		d.Encrypted = true
		decrypted, err := c.mach.DecryptMegolmEvent(ctx, evt)
		if err != nil {
			d.Err = err
			return d
		}
		d.Type, content = decrypted.Type.Type, decrypted.Content.VeryRaw
	}
	if err := json.Unmarshal(content, &d.Content); err != nil {
		d.Content, d.Err = nil, fmt.Errorf("read content: %w", err)
		return d
	}
	seen.read = &d
	return d
}
