package e2eeperson

import (
	"context"
	"errors"
	"fmt"

	"maunium.net/go/mautrix"
	"maunium.net/go/mautrix/crypto"
	"maunium.net/go/mautrix/event"
	"maunium.net/go/mautrix/id"
)

// withheldKey is the room key of a session sent while its key was kept
// from user.
type withheldKey struct {
	user id.UserID
	key  event.Content
}

// SendText sends an encrypted plain text message and returns its event ID.
func (c *Client) SendText(ctx context.Context, room, body string) (string, error) {
	return c.SendMessage(ctx, room, map[string]any{"msgtype": "m.text", "body": body})
}

// Edit replaces the text of target with body. The m.replace relation is
// in the encrypted content and, as mautrix and Element's crypto both copy
// it, in the cleartext of the m.room.encrypted envelope too, where the
// server reads it for aggregation.
func (c *Client) Edit(ctx context.Context, room, target, body string) (string, error) {
	return c.SendMessage(ctx, room, map[string]any{
		"msgtype": "m.text", "body": "* " + body,
		"m.new_content": map[string]any{"msgtype": "m.text", "body": body},
		"m.relates_to":  map[string]any{"rel_type": "m.replace", "event_id": target},
	})
}

// ThreadReply sends body, encrypted, into the thread rooted at root, with
// the reply fallback Element adds. The m.thread relation is copied to the
// cleartext envelope as Edit's is.
func (c *Client) ThreadReply(ctx context.Context, room, root, body string) (string, error) {
	return c.SendMessage(ctx, room, map[string]any{
		"msgtype": "m.text", "body": body,
		"m.relates_to": map[string]any{
			"rel_type": "m.thread", "event_id": root, "is_falling_back": true,
			"m.in_reply_to": map[string]any{"event_id": root},
		},
	})
}

// SendMessage sends an m.room.message of content into room, encrypted,
// and returns its event ID: what SendText, Edit and ThreadReply send, for
// a caller that builds the content itself. A relation in content is
// copied to the cleartext envelope as Edit's is.
func (c *Client) SendMessage(ctx context.Context, room string, content map[string]any) (string, error) {
	return c.send(ctx, room, content, "")
}

// SendTextWithheldFrom sends an encrypted text message whose room key
// every member's devices get except user's, which get nothing at all (no
// m.room_key.withheld either, so user's client has to wait as it would
// for a late key). The message goes out in a session of its own, made for
// it and dropped after it, so no earlier or later message shares its key.
// ShareWithheldKeys sends the key later.
func (c *Client) SendTextWithheldFrom(ctx context.Context, room, body, user string) (string, error) {
	return c.send(ctx, room, map[string]any{"msgtype": "m.text", "body": body}, id.UserID(user))
}

// ShareWithheldKeys sends the room key of every message of room sent by
// SendTextWithheldFrom since the last call, to the devices of the user it
// was kept from, over Olm as any room key goes. A room with no such
// message is an error.
func (c *Client) ShareWithheldKeys(ctx context.Context, room string) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.withheld[id.RoomID(room)]) == 0 {
		return c.fail("share withheld keys", fmt.Errorf("no message of %s was withheld", room))
	}
	for _, w := range c.withheld[id.RoomID(room)] {
		devices, err := c.mach.FetchKeys(ctx, []id.UserID{w.user}, true)
		if err != nil {
			return c.fail("fetch the devices of "+w.user.String(), err)
		}
		if len(devices[w.user]) == 0 {
			return c.fail("share a withheld key", fmt.Errorf("%s has no device with keys", w.user))
		}
		if _, err := c.sendRoomKey(ctx, w.key, devices, ""); err != nil {
			return c.fail("share a withheld key with "+w.user.String(), err)
		}
	}
	delete(c.withheld, id.RoomID(room))
	return nil
}

// send encrypts an m.room.message with content into room, as Element
// does: it reads the room's members from the server, queries their
// devices, sends the room's outbound session key over Olm to every device
// that lacks it (but withhold's), encrypts and sends. It returns the
// event's ID.
func (c *Client) send(ctx context.Context, room string, content map[string]any, withhold id.UserID) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	roomID := id.RoomID(room)
	c.mu.Lock()
	defer c.mu.Unlock()
	members, err := c.members(ctx, roomID)
	if err != nil {
		return "", c.fail("read the members of "+room, err)
	}
	// A fresh query, not the device lists synced so far: a device that
	// logged in a moment ago gets the key too. It comes before the
	// session is chosen because mautrix ends a room's session when it
	// sees a member's devices change.
	devices, err := c.mach.FetchKeys(ctx, members, true)
	if err != nil {
		return "", c.fail("fetch the devices of the members of "+room, err)
	}
	session, err := c.outboundSession(ctx, roomID, members, withhold != "")
	if err != nil {
		return "", c.fail("start a megolm session in "+room, err)
	}
	key := session.ShareContent()
	shared, err := c.sendRoomKey(ctx, key, devices, withhold)
	if err != nil {
		return "", c.fail("share the room key of "+room, err)
	}
	for device := range shared {
		c.sharedWith[session.ID()][device] = true
	}
	encrypted, err := c.mach.EncryptMegolmEvent(ctx, roomID, event.EventMessage, content)
	if err != nil {
		return "", c.fail("encrypt a message for "+room, err)
	}
	if withhold != "" {
		c.withheld[roomID] = append(c.withheld[roomID], withheldKey{user: withhold, key: key})
		if err := c.mach.CryptoStore.RemoveOutboundGroupSession(ctx, roomID); err != nil {
			return "", c.fail("end the withheld session in "+room, err)
		}
	}
	resp, err := c.cli.SendMessageEvent(ctx, roomID, event.EventEncrypted, encrypted, mautrix.ReqSendEvent{TransactionID: c.txnID()})
	if err != nil {
		return "", c.fail("send an encrypted message to "+room, err)
	}
	return resp.EventID.String(), nil
}

// members returns the users joined to or invited into room, from the
// room's current state, which also refreshes the state store (encryption
// settings, history visibility) the session is made from. Invited users
// count as Element counts them: they read the room's history from their
// invite on, as private_chat's shared history visibility lets them.
//
// The state comes from /rooms/{id}/state, which Dendrite answers from its
// room server, where a join or kick has landed by the time its request
// returns; /members is answered from the sync store, which lags, and
// would share the key with a user kicked a moment ago.
func (c *Client) members(ctx context.Context, room id.RoomID) ([]id.UserID, error) {
	state, err := c.cli.State(ctx, room)
	if err != nil {
		return nil, err
	}
	var users []id.UserID
	for user, evt := range state[event.StateMember] {
		switch evt.Content.AsMember().Membership {
		case event.MembershipJoin, event.MembershipInvite:
			users = append(users, id.UserID(user))
		}
	}
	return users, nil
}

// outboundSession returns room's outbound Megolm session, starting a new
// one if there is none, it has expired, fresh is set, or a user its key
// went to is no longer among members (Element's rotation when someone
// leaves: what is sent after must be closed to them).
func (c *Client) outboundSession(ctx context.Context, room id.RoomID, members []id.UserID, fresh bool) (*crypto.OutboundGroupSession, error) {
	session, err := c.mach.CryptoStore.GetOutboundGroupSession(ctx, room)
	if err != nil {
		return nil, err
	}
	if session != nil && !fresh && !session.Expired() && !c.sharedBeyond(session.ID(), members) {
		return session, nil
	}
	settings, err := c.mach.StateStore.GetEncryptionEvent(ctx, room)
	if err != nil {
		return nil, err
	}
	if settings == nil || settings.Algorithm != id.AlgorithmMegolmV1 {
		return nil, fmt.Errorf("room does not encrypt with megolm (m.room.encryption %+v)", settings)
	}
	visibility, err := c.mach.StateStore.GetHistoryVisibility(ctx, room)
	if err != nil {
		return nil, err
	}
	session, err = crypto.NewOutboundGroupSession(room, settings, visibility)
	if err != nil {
		return nil, err
	}
	// The person reads its own messages back through an inbound copy of
	// the session, as every Megolm sender keeps one.
	signingKey, identityKey := c.mach.GetAccount().Keys()
	own, err := crypto.NewInboundGroupSession(identityKey, signingKey, room, session.Internal.Key(),
		session.MaxAge, session.MaxMessages, session.SharedHistory, false)
	if err != nil {
		return nil, err
	}
	own.SourceUser = c.cli.UserID
	if err := c.mach.StoreGroupSession(ctx, own); err != nil {
		return nil, err
	}
	// Shared tells mautrix it may encrypt with the session; send shares
	// the key itself before it does.
	session.Shared = true
	if err := c.mach.CryptoStore.AddOutboundGroupSession(ctx, session); err != nil {
		return nil, err
	}
	c.sharedWith[session.ID()] = map[crypto.UserDevice]bool{}
	return session, nil
}

// sharedBeyond reports whether the session's key went to a user not among
// members.
func (c *Client) sharedBeyond(session id.SessionID, members []id.UserID) bool {
	current := map[id.UserID]bool{}
	for _, user := range members {
		current[user] = true
	}
	for device := range c.sharedWith[session] {
		if !current[device.UserID] {
			return true
		}
	}
	return false
}

// sendRoomKey sends the room key key over Olm to every device in devices
// but this person's own one, the devices of withhold and those it was
// already sent to. It claims a one-time key of each device it has no Olm
// session with yet. It returns the devices it sent to, and fails if any
// device could not be reached: a device left without its key would read
// as a bot that cannot decrypt.
func (c *Client) sendRoomKey(ctx context.Context, key event.Content, devices map[id.UserID]map[id.DeviceID]*id.Device, withhold id.UserID) (map[crypto.UserDevice]bool, error) {
	roomKey, ok := key.Parsed.(*event.RoomKeyEventContent)
	if !ok {
		return nil, errors.New("room key content is not m.room_key")
	}
	already := c.sharedWith[roomKey.SessionID]
	req := &mautrix.ReqSendToDevice{Messages: map[id.UserID]map[id.DeviceID]*event.Content{}}
	want := map[crypto.UserDevice]bool{}
	for user, userDevices := range devices {
		if user == withhold {
			continue
		}
		for deviceID := range userDevices {
			device := crypto.UserDevice{UserID: user, DeviceID: deviceID}
			if (user == c.cli.UserID && deviceID == c.cli.DeviceID) || already[device] {
				continue
			}
			if req.Messages[user] == nil {
				req.Messages[user] = map[id.DeviceID]*event.Content{}
			}
			req.Messages[user][deviceID] = &key
			want[device] = true
		}
	}
	if len(want) == 0 {
		return want, nil
	}
	encrypted, err := c.mach.EncryptToDevices(ctx, event.ToDeviceRoomKey, req)
	if err != nil {
		return nil, err
	}
	for device := range want {
		if encrypted.Messages[device.UserID][device.DeviceID] == nil {
			return nil, fmt.Errorf("no olm session with device %s of %s (no one-time key left to claim?)", device.DeviceID, device.UserID)
		}
	}
	if _, err := c.cli.SendToDevice(ctx, event.ToDeviceEncrypted, encrypted); err != nil {
		return nil, err
	}
	return want, nil
}
