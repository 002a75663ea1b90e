package main

import (
	"context"
	"encoding/json"
	"fmt"

	"maunium.net/go/mautrix"
	"maunium.net/go/mautrix/event"
	"maunium.net/go/mautrix/id"

	"github.com/mindroomd/mindroomd/testsupport/dendrite"
	"github.com/mindroomd/mindroomd/testsupport/e2eeperson"
)

// person is the demo's human: a plain client in a room in the clear, or a
// client with a device and keys of its own in an encrypted room.
type person interface {
	// createRoom creates a private room, invites agent and waits until the
	// agent has joined it.
	createRoom(ctx context.Context, agent string) (string, error)
	// kind says which kind of room the person creates.
	kind() string
	sendText(ctx context.Context, room, body string) (string, error)
	edit(ctx context.Context, room, target, body string) error
	threadReply(ctx context.Context, room, root, body string) error
	// agentMessages returns the content of each message the agent sent in
	// room, as the person reads it.
	agentMessages(ctx context.Context, room, agent string) ([]map[string]any, error)
	// more waits until the room may hold more than agentMessages last
	// read.
	more(ctx context.Context) error
	close()
}

// openPerson signs acct in: on a device of its own, with its own keys,
// when encrypted; with the registration's token otherwise.
func openPerson(ctx context.Context, serverURL string, acct dendrite.Account, encrypted bool) (person, error) {
	if encrypted {
		c, err := e2eeperson.Open(ctx, serverURL, acct)
		if err != nil {
			return nil, err
		}
		return &sealedPerson{c: c}, nil
	}
	cli, err := mautrix.NewClient(serverURL, id.UserID(acct.UserID), acct.AccessToken)
	if err != nil {
		return nil, err
	}
	return &clearPerson{cli: cli}, nil
}

// clearPerson writes in the clear through a plain client.
type clearPerson struct {
	cli *mautrix.Client
}

func (p *clearPerson) createRoom(ctx context.Context, agent string) (string, error) {
	created, err := p.cli.CreateRoom(ctx, &mautrix.ReqCreateRoom{Preset: "private_chat", Invite: []id.UserID{id.UserID(agent)}})
	if err != nil {
		return "", err
	}
	for {
		members, err := p.cli.JoinedMembers(ctx, created.RoomID)
		if err == nil {
			if _, ok := members.Joined[id.UserID(agent)]; ok {
				return created.RoomID.String(), nil
			}
		}
		if err := p.more(ctx); err != nil {
			return "", fmt.Errorf("the agent never joined %s: %w", created.RoomID, err)
		}
	}
}

func (p *clearPerson) kind() string {
	return "The room is not encrypted (ENCRYPTED=0): the homeserver stores every message in the clear"
}

func (p *clearPerson) sendText(ctx context.Context, room, body string) (string, error) {
	resp, err := p.cli.SendText(ctx, id.RoomID(room), body)
	if err != nil {
		return "", err
	}
	return resp.EventID.String(), nil
}

func (p *clearPerson) edit(ctx context.Context, room, target, body string) error {
	edit := event.MessageEventContent{MsgType: event.MsgText, Body: "* " + body,
		NewContent: &event.MessageEventContent{MsgType: event.MsgText, Body: body},
		RelatesTo:  &event.RelatesTo{Type: event.RelReplace, EventID: id.EventID(target)}}
	_, err := p.cli.SendMessageEvent(ctx, id.RoomID(room), event.EventMessage, &edit)
	return err
}

func (p *clearPerson) threadReply(ctx context.Context, room, root, body string) error {
	thread := event.MessageEventContent{MsgType: event.MsgText, Body: body,
		RelatesTo: &event.RelatesTo{Type: event.RelThread, EventID: id.EventID(root)}}
	_, err := p.cli.SendMessageEvent(ctx, id.RoomID(room), event.EventMessage, &thread)
	return err
}

// agentMessages reads the room's newest 100 events through /messages.
func (p *clearPerson) agentMessages(ctx context.Context, room, agent string) ([]map[string]any, error) {
	msgs, err := p.cli.Messages(ctx, id.RoomID(room), "", "", mautrix.DirectionBackward, nil, 100)
	if err != nil {
		return nil, fmt.Errorf("read the room: %w", err)
	}
	var out []map[string]any
	for _, ev := range msgs.Chunk {
		if ev.Sender.String() == agent && ev.Type == event.EventMessage {
			out = append(out, ev.Content.Raw)
		}
	}
	return out, nil
}

func (p *clearPerson) more(ctx context.Context) error { return pause(ctx) }

func (p *clearPerson) close() {}

// sealedPerson writes from a device of its own, encrypted, as Element does
// (testsupport/e2eeperson), and reads what its sync loop decrypts.
type sealedPerson struct {
	c *e2eeperson.Client
	// next is the sync after agentMessages last read; stopped is why no
	// sync will come, once the loop has stopped.
	next    <-chan struct{}
	stopped error
	// sealed counts the agent's events agentMessages last found still
	// awaiting their keys.
	sealed int
}

func (p *sealedPerson) createRoom(ctx context.Context, agent string) (string, error) {
	room, err := p.c.CreateEncryptedRoom(ctx, agent)
	if err != nil {
		return "", err
	}
	joined := func(typ string, content map[string]any, raw json.RawMessage) bool {
		var ev struct {
			StateKey string `json:"state_key"`
		}
		return typ == "m.room.member" && content["membership"] == "join" &&
			json.Unmarshal(raw, &ev) == nil && ev.StateKey == agent
	}
	if _, err := p.c.AwaitDecrypted(ctx, room, joined); err != nil {
		return "", fmt.Errorf("the agent never joined %s: %w", room, err)
	}
	return room, nil
}

func (p *sealedPerson) kind() string {
	return fmt.Sprintf("The room is end-to-end encrypted (m.megolm.v1.aes-sha2), as Element creates one; "+
		"Alice writes from her own device %s, the homeserver sees only ciphertext", p.c.DeviceID())
}

func (p *sealedPerson) sendText(ctx context.Context, room, body string) (string, error) {
	return p.c.SendText(ctx, room, body)
}

func (p *sealedPerson) edit(ctx context.Context, room, target, body string) error {
	_, err := p.c.Edit(ctx, room, target, body)
	return err
}

func (p *sealedPerson) threadReply(ctx context.Context, room, root, body string) error {
	_, err := p.c.ThreadReply(ctx, room, root, body)
	return err
}

// agentMessages reads the agent's messages as the person's device
// decrypted them; one whose key has not come yet is left for a later
// look. A message the agent sent in the clear is an error: the daemon
// must seal what it sends into an encrypted room.
func (p *sealedPerson) agentMessages(ctx context.Context, room, agent string) ([]map[string]any, error) {
	p.next, p.stopped = p.c.Synced()
	p.sealed = 0
	var out []map[string]any
	for _, d := range p.c.DecryptedTimeline(ctx, room) {
		switch {
		case d.Sender != agent:
		case d.Err != nil:
			p.sealed++
		case !d.Encrypted && d.Type == event.EventMessage.Type:
			return nil, fmt.Errorf("the agent sent %s in the clear into an encrypted room", d.EventID)
		case d.Type == event.EventMessage.Type:
			out = append(out, d.Content)
		}
	}
	return out, nil
}

// more waits for the next sync: it brings the agent's events and their
// keys. A wait that ends says how many of the agent's events never
// decrypted.
func (p *sealedPerson) more(ctx context.Context) error {
	if p.stopped != nil {
		return p.stopped
	}
	select {
	case <-p.next:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w (%d of the agent's events still awaiting their keys)", ctx.Err(), p.sealed)
	}
}

func (p *sealedPerson) close() { p.c.Close() }
