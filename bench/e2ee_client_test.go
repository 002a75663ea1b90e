package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/rs/zerolog"
	"maunium.net/go/mautrix"
	"maunium.net/go/mautrix/crypto"
	"maunium.net/go/mautrix/event"
	"maunium.net/go/mautrix/id"

	"github.com/mindroomd/mindroomd/matrix"
)

// memCrypto is the end-to-end encryption of a bare client: mautrix's
// OlmMachine, as the daemon's e2ee.Machine drives it, but with its olm
// account, sessions and room state in memory. It stores nothing, so a
// client built on it does the least any client reading and writing an
// encrypted room must do: decrypt what comes, encrypt what goes, share its
// room key once per session.
//
// It is not safe for concurrent use; each bare client drives its own from
// one goroutine.
type memCrypto struct {
	mach  *crypto.OlmMachine
	state mautrix.StateStore
}

// newMemCrypto creates an olm account for c's device and uploads its
// device keys and one-time keys.
func newMemCrypto(ctx context.Context, c *matrix.Client) (*memCrypto, error) {
	state := mautrix.NewMemoryStateStore()
	log := zerolog.Nop()
	mach := crypto.NewOlmMachine(c.CryptoClient(), &log, crypto.NewMemoryStore(nil), state.(crypto.StateStore))
	if err := mach.Load(ctx); err != nil {
		return nil, fmt.Errorf("olm account: %w", err)
	}
	if err := mach.ShareKeys(ctx, -1); err != nil {
		return nil, fmt.Errorf("upload device keys: %w", err)
	}
	return &memCrypto{mach: mach, state: state}, nil
}

// close stops the machine's background work.
func (m *memCrypto) close() { m.mach.Destroy() }

// process takes one sync's room state (members, encryption settings) and
// device news (room keys among the to-device messages), as
// e2ee.Machine.ProcessSync does before the daemon admits a batch.
func (m *memCrypto) process(ctx context.Context, since string, b *matrix.SyncBatch) {
	for _, rooms := range [][]matrix.RoomTimeline{b.Left, b.Joined} {
		for _, r := range rooms {
			for _, list := range [][]json.RawMessage{r.State, r.Events} {
				for _, raw := range list {
					m.observeState(ctx, r.RoomID, raw)
				}
			}
		}
	}
	resp := &mautrix.RespSync{DeviceLists: b.Crypto.DeviceLists, DeviceOTKCount: b.Crypto.OneTimeKeys}
	for _, raw := range b.Crypto.ToDevice {
		evt := &event.Event{}
		if json.Unmarshal(raw, evt) == nil {
			resp.ToDevice.Events = append(resp.ToDevice.Events, evt)
		}
	}
	m.mach.ProcessSyncResponse(ctx, resp, since)
}

// observeState keeps a state event in the state store and tells the
// machine of membership changes.
func (m *memCrypto) observeState(ctx context.Context, room string, raw json.RawMessage) {
	if !bytes.Contains(raw, []byte(`"state_key"`)) {
		return
	}
	evt := &event.Event{}
	if json.Unmarshal(raw, evt) != nil || evt.StateKey == nil {
		return
	}
	evt.RoomID = id.RoomID(room)
	evt.Type.Class = event.StateEventType
	if evt.Content.ParseRaw(evt.Type) != nil {
		return
	}
	mautrix.UpdateStateStore(ctx, m.state, evt)
	if evt.Type == event.StateMember {
		m.mach.HandleMemberEvent(ctx, evt)
	}
}

// decrypt returns the cleartext content of the encrypted event raw of
// room.
func (m *memCrypto) decrypt(ctx context.Context, room string, raw json.RawMessage) (json.RawMessage, error) {
	evt := &event.Event{}
	if err := json.Unmarshal(raw, evt); err != nil {
		return nil, err
	}
	evt.RoomID = id.RoomID(room)
	evt.Type.Class = event.MessageEventType
	if err := evt.Content.ParseRaw(evt.Type); err != nil {
		return nil, err
	}
	clear, err := m.mach.DecryptMegolmEvent(ctx, evt)
	if err != nil {
		return nil, err
	}
	return clear.Content.VeryRaw, nil
}

// Encrypts implements matrix.Encrypter from the kept room state.
func (m *memCrypto) Encrypts(ctx context.Context, room string) (bool, error) {
	return m.state.IsEncrypted(ctx, id.RoomID(room))
}

// Seal implements matrix.Encrypter as e2ee.Machine.Seal does: in an
// encrypted room the event goes out under the room's megolm session,
// whose key is shared with the joined and invited members' devices first
// whenever the session is new.
func (m *memCrypto) Seal(ctx context.Context, room, eventType string, content json.RawMessage) (string, json.RawMessage, error) {
	rid := id.RoomID(room)
	encrypted, err := m.state.IsEncrypted(ctx, rid)
	if err != nil || !encrypted {
		return eventType, content, err
	}
	typ := event.Type{Type: eventType, Class: event.MessageEventType}
	sealed, err := m.mach.EncryptMegolmEvent(ctx, rid, typ, content)
	if errors.Is(err, crypto.ErrNoGroupSession) || errors.Is(err, crypto.ErrSessionExpired) || errors.Is(err, crypto.ErrSessionNotShared) {
		members, merr := m.state.GetRoomJoinedOrInvitedMembers(ctx, rid)
		if merr != nil {
			return "", nil, merr
		}
		if err := m.mach.ShareGroupSession(ctx, rid, members); err != nil {
			return "", nil, fmt.Errorf("share the room key: %w", err)
		}
		sealed, err = m.mach.EncryptMegolmEvent(ctx, rid, typ, content)
	}
	if err != nil {
		return "", nil, err
	}
	out, err := json.Marshal(sealed)
	return event.EventEncrypted.Type, out, err
}
