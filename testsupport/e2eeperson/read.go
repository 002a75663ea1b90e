package e2eeperson

import (
	"context"
	"encoding/json"
	"fmt"

	"maunium.net/go/mautrix/event"
	"maunium.net/go/mautrix/id"
)

// Decrypted is one room timeline event as this person's client reads it.
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

// AwaitDecrypted returns the ID and content of the first timeline event
// of room for which match is true, syncing until ctx ends (which fails
// the test). match sees only events that read in the clear: ones that
// decrypted (evType and content as decrypted) and ones never encrypted;
// raw is the event as the server sent it. An encrypted event whose key is
// missing is tried again after every later sync, so awaiting it waits for
// its key as well. Events seen before the call count too.
func (p *Person) AwaitDecrypted(ctx context.Context, room string, match func(evType string, content map[string]any, raw json.RawMessage) bool) (eventID string, content map[string]any) {
	p.tb.Helper()
	for {
		p.mu.Lock()
		var found *Decrypted
		for _, seen := range p.timeline[id.RoomID(room)] {
			d := p.read(ctx, seen)
			if d.Err == nil && match(d.Type, d.Content, d.Raw) {
				found = &d
				break
			}
		}
		synced, syncErr, checked := p.synced, p.syncErr, len(p.timeline[id.RoomID(room)])
		p.mu.Unlock()
		if found != nil {
			return found.EventID, found.Content
		}
		if syncErr != nil {
			p.fatal(fmt.Sprintf("await an event in %s (%d seen)", room, checked), syncErr)
		}
		select {
		case <-synced:
		case <-ctx.Done():
			p.fatal(fmt.Sprintf("await an event in %s (%d seen)", room, checked), ctx.Err())
		}
	}
}

// Decrypt waits, until ctx ends (which fails the test), for a sync to
// show eventID in room, and reads it now: a key that arrived since the
// last try is used.
func (p *Person) Decrypt(ctx context.Context, room, eventID string) Decrypted {
	p.tb.Helper()
	for {
		p.mu.Lock()
		var found *Decrypted
		for _, seen := range p.timeline[id.RoomID(room)] {
			if seen.evt.ID.String() == eventID {
				d := p.read(ctx, seen)
				found = &d
				break
			}
		}
		synced, syncErr := p.synced, p.syncErr
		p.mu.Unlock()
		if found != nil {
			return *found
		}
		if syncErr != nil {
			p.fatal("await "+eventID, syncErr)
		}
		select {
		case <-synced:
		case <-ctx.Done():
			p.fatal("await "+eventID, ctx.Err())
		}
	}
}

// DecryptedTimeline returns every timeline event of room the sync loop has
// seen so far, oldest first, each decrypted where it can be now.
func (p *Person) DecryptedTimeline(room string) []Decrypted {
	p.tb.Helper()
	ctx, cancel := p.ctx()
	defer cancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Decrypted
	for _, seen := range p.timeline[id.RoomID(room)] {
		out = append(out, p.read(ctx, seen))
	}
	return out
}

// read returns what seen reads as now, trying to decrypt it if it is
// encrypted and has not decrypted yet. Called with mu held.
func (p *Person) read(ctx context.Context, seen *seenEvent) Decrypted {
	if seen.read != nil {
		return *seen.read
	}
	evt := seen.evt
	d := Decrypted{EventID: evt.ID.String(), Sender: evt.Sender.String(), Type: evt.Type.Type, Raw: seen.raw}
	content := evt.Content.VeryRaw
	if evt.Type == event.EventEncrypted {
		d.Encrypted = true
		decrypted, err := p.mach.DecryptMegolmEvent(ctx, evt)
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
