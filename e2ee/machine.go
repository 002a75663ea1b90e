package e2ee

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/rs/zerolog"
	"maunium.net/go/mautrix"
	"maunium.net/go/mautrix/crypto"
	"maunium.net/go/mautrix/event"
	"maunium.net/go/mautrix/id"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/matrix"
)

// Options configure one agent's machine.
type Options struct {
	// Account keys the agent's olm account in the store: the principal's
	// name, so two agents never share an account and one agent keeps its
	// own across restarts and re-logins.
	Account string
	// Client is the agent's logged-in client; its device is the olm
	// account's device.
	Client *matrix.Client
	// PickleKey encrypts the account and its sessions at rest.
	PickleKey []byte `json:"-"`
	// Log receives the machine's records.
	Log zerolog.Logger
	// Observe, when set, learns the outcome of each encrypted event Decrypt
	// reads: "ok", "late" (an event that waited for its key), "awaiting",
	// or "failed_" and the reason it never decrypts.
	Observe func(outcome string)
}

// Machine is one agent's end-to-end encryption: its olm account and device,
// driven by the principal's sync loop.
type Machine struct {
	mach    *crypto.OlmMachine
	crypto  *crypto.SQLCryptoStore
	store   *Store
	log     zerolog.Logger
	self    id.UserID
	observe func(outcome string)
	// client and session notice a re-login: on Dendrite a signed-out
	// session takes its device's keys with it, so they are published
	// (and the device signed) again. crossSign is how CrossSign was last
	// asked to sign.
	client   *matrix.Client
	session  uint64
	signWith *CrossSignOptions

	// op runs one operation on the olm machine at a time: the sync loop,
	// the outbox's sends, the hydrator and the keys loop all reach it, and
	// mautrix's machine keeps caches (its cross-signing keys among them)
	// that it does not guard itself.
	op sync.Mutex

	mu sync.Mutex
	// received are the megolm sessions stored since the principal last
	// took them: events may be waiting on them.
	received map[journal.KeyWait]struct{}
	// wanted are sessions an event waits on whose key was not asked for
	// yet in this run; asked are those already asked for.
	wanted map[journal.KeyWait]keyRequest
	asked  map[journal.KeyWait]struct{}
	// clear are the rooms the homeserver said are not encrypted, this run.
	clear map[id.RoomID]struct{}
}

// keyRequest is what a room key request names.
type keyRequest struct {
	sender    id.UserID
	senderKey id.SenderKey
}

// Machine loads (or on the first start creates) the agent's olm account
// and publishes its device keys. A pickle key that does not open the
// stored account, or stored keys other than those the homeserver publishes
// for the device, are ErrRefused: a new account would silently lose every
// session the old one holds.
func (s *Store) Machine(ctx context.Context, o Options) (*Machine, error) {
	mx := o.Client.CryptoClient()
	cs := crypto.NewSQLCryptoStore(s.db, nil, o.Account, mx.DeviceID, o.PickleKey)
	stored, err := cs.FindDeviceID(ctx)
	if err != nil {
		return nil, fmt.Errorf("read olm account: %w", err)
	}
	if stored != "" && stored != mx.DeviceID {
		// The account's keys were published for a device the agent no
		// longer signs in on: the new device needs an account of its own.
		o.Log.Warn().Str("agent", o.Account).Str("old_device_id", stored.String()).Str("device_id", mx.DeviceID.String()).
			Msg("The Matrix device changed: a new olm account is created for it; keys shared with the old device do not carry over")
		if err := s.forgetAccount(ctx, o.Account); err != nil {
			return nil, err
		}
	}
	log := o.Log.With().Str("agent", o.Account).Logger()
	mlog := log.Level(zerolog.WarnLevel)
	m := &Machine{
		crypto: cs, store: s, log: log, self: mx.UserID, observe: o.Observe, client: o.Client, session: o.Client.Session(),
		received: make(map[journal.KeyWait]struct{}),
		wanted:   make(map[journal.KeyWait]keyRequest),
		asked:    make(map[journal.KeyWait]struct{}),
		clear:    make(map[id.RoomID]struct{}),
	}
	m.mach = crypto.NewOlmMachine(mx, &mlog, cs, s.state)
	m.mach.SessionReceived = m.sessionReceived
	if err := m.mach.Load(ctx); err != nil {
		return nil, fmt.Errorf("%w: the pickle key does not open %s's olm account: %w", ErrRefused, o.Account, err)
	}
	if err := m.publish(ctx); err != nil {
		return nil, err
	}
	return m, nil
}

// forgetAccount drops an agent's olm account of an old device, with the
// olm sessions and outbound room sessions that device made, which the new
// device must not send under; the inbound room sessions stay, since they
// still decrypt what they were shared for.
func (s *Store) forgetAccount(ctx context.Context, account string) error {
	for _, stmt := range []string{deleteOlmSessions, deleteOutboundSessions, deleteAccount} {
		if _, err := s.db.Exec(ctx, stmt, account); err != nil {
			return fmt.Errorf("drop olm account of an old device: %w", err)
		}
	}
	return nil
}

// What an old device's account leaves behind (mautrix's tables, keyed by
// account ID).
const (
	deleteOlmSessions      = `DELETE FROM crypto_olm_session WHERE account_id = $1`
	deleteOutboundSessions = `DELETE FROM crypto_megolm_outbound_session WHERE account_id = $1`
	deleteAccount          = `DELETE FROM crypto_account WHERE account_id = $1`
)

// publish uploads the device's keys on the first start and, on later
// ones, checks that the homeserver still publishes this account's keys
// for the device. Keys published for the device that this store does not
// hold mean the store was lost or replaced: a new account's keys would be
// refused, and the old account's sessions are gone with it.
func (m *Machine) publish(ctx context.Context) error {
	acc := m.mach.GetAccount()
	device := m.mach.Client.DeviceID
	resp, err := m.mach.Client.QueryKeys(ctx, &mautrix.ReqQueryKeys{
		DeviceKeys: mautrix.DeviceKeysRequest{m.self: mautrix.DeviceIDList{device}},
	})
	if err != nil {
		return fmt.Errorf("query own device keys: %w", err)
	}
	published, ok := resp.DeviceKeys[m.self][device]
	signing, identity := acc.Keys()
	switch {
	case ok && (published.Keys.GetEd25519(device) != signing || published.Keys.GetCurve25519(device) != identity):
		return fmt.Errorf("%w: the homeserver publishes other keys for device %s than this crypto store holds: "+
			"the store was lost or belongs to another account or device; restore it from a backup, "+
			"or remove the agent's session file to sign in on a new device", ErrRefused, device)
	case ok && acc.Shared:
		return nil
	}
	// First start, or the server forgot the keys (a device deleted and
	// made again): publish them.
	acc.Shared = false
	if err := m.mach.ShareKeys(ctx, -1); err != nil {
		return fmt.Errorf("upload device keys: %w", err)
	}
	m.log.Info().Str("device_id", device.String()).Msg("Device keys uploaded")
	return nil
}

// afterRelogin publishes the device's keys again, and has the device
// signed again, when the client logged in again since the last sync: the
// server may have dropped both with the old session.
func (m *Machine) afterRelogin(ctx context.Context) error {
	now := m.client.Session()
	if now == m.session {
		return nil
	}
	if m.client.DeviceID() != m.mach.Client.DeviceID.String() {
		return fmt.Errorf("the Matrix device changed from %s to %s at a re-login: restart the daemon to make the new device's olm account",
			m.mach.Client.DeviceID, m.client.DeviceID())
	}
	if err := m.publish(ctx); err != nil {
		return err
	}
	m.session = now
	if m.signWith == nil {
		return nil
	}
	st, err := m.crossSign(ctx, *m.signWith)
	if err != nil {
		return err
	}
	if !st.CrossSigned {
		m.log.Warn().Str("reason", st.Reason).Msg("After a re-login the device is not cross-signed")
	}
	return nil
}

// DeviceID is the device the account belongs to.
func (m *Machine) DeviceID() string { return m.mach.Client.DeviceID.String() }

// Close stops the machine's background work.
func (m *Machine) Close() { m.mach.Destroy() }

// sessionReceived notes a stored megolm session: events may wait on it.
func (m *Machine) sessionReceived(_ context.Context, room id.RoomID, session id.SessionID, _ uint32) {
	m.mu.Lock()
	m.received[journal.KeyWait{RoomID: room.String(), Session: session.String()}] = struct{}{}
	m.mu.Unlock()
}

// TakeReceived returns the megolm sessions stored since the last call.
func (m *Machine) TakeReceived() []journal.KeyWait {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]journal.KeyWait, 0, len(m.received))
	for w := range m.received {
		out = append(out, w)
	}
	clear(m.received)
	return out
}

// ProcessSync takes what a sync response holds for the device, before the
// journal admits its events: the rooms' encryption settings and members,
// then the to-device messages (room keys among them), device list changes
// and one-time key counts, each kept in the crypto store. A crash before
// the batch commits brings the same response again; olm's replay check
// makes its to-device messages harmless the second time.
func (m *Machine) ProcessSync(ctx context.Context, since string, b *matrix.SyncBatch) error {
	m.op.Lock()
	defer m.op.Unlock()
	if err := m.afterRelogin(ctx); err != nil {
		return err
	}
	for _, rooms := range [][]matrix.RoomTimeline{b.Left, b.Joined} {
		for _, r := range rooms {
			for _, list := range [][]json.RawMessage{r.State, r.Events} {
				for _, raw := range list {
					if err := m.observeState(ctx, r.RoomID, raw); err != nil {
						return err
					}
				}
			}
		}
	}
	resp := &mautrix.RespSync{DeviceLists: b.Crypto.DeviceLists, DeviceOTKCount: b.Crypto.OneTimeKeys}
	for _, raw := range b.Crypto.ToDevice {
		evt := &event.Event{}
		if err := json.Unmarshal(raw, evt); err != nil {
			m.log.Warn().Err(err).Msg("Malformed to-device event skipped")
			continue
		}
		resp.ToDevice.Events = append(resp.ToDevice.Events, evt)
	}
	m.mach.ProcessSyncResponse(ctx, resp, since)
	return nil
}

// stateTypes are the state events encryption reads.
var stateTypes = map[string]bool{
	event.StateMember.Type: true, event.StateEncryption.Type: true, event.StateHistoryVisibility.Type: true,
	event.StateCreate.Type: true,
}

// observeState keeps a state event that encryption reads.
func (m *Machine) observeState(ctx context.Context, room string, raw json.RawMessage) error {
	if !bytes.Contains(raw, []byte(`"state_key"`)) {
		return nil
	}
	var head struct {
		Type     string  `json:"type"`
		StateKey *string `json:"state_key"`
	}
	if json.Unmarshal(raw, &head) != nil || head.StateKey == nil || !stateTypes[head.Type] {
		return nil
	}
	evt := &event.Event{}
	if err := json.Unmarshal(raw, evt); err != nil {
		return nil // admission records what is malformed
	}
	evt.RoomID = id.RoomID(room)
	evt.Type.Class = event.StateEventType
	if err := evt.Content.ParseRaw(evt.Type); err != nil {
		return nil
	}
	mautrix.UpdateStateStore(ctx, m.store.state, evt)
	if evt.Type == event.StateMember {
		m.mach.HandleMemberEvent(ctx, evt)
	}
	return nil
}

// encryptedType is in the JSON of every encrypted event that escapes no
// character.
var encryptedType = []byte(`"m.room.encrypted"`)

// Decrypt returns in as the journal should admit it: a clear event as it
// came; an encrypted one it can decrypt as the cleartext event (the outer
// event's ID, sender, timestamp and unsigned data, the inner type and
// content); one whose key it lacks marked as awaiting that session; one
// that can never decrypt marked undecryptable, for the journal to record
// and skip. An event already awaiting its key (in.AwaitingSession set) is
// one tried again: it comes back unchanged while the key is missing.
func (m *Machine) Decrypt(ctx context.Context, in journal.Inbound) journal.Inbound {
	m.op.Lock()
	defer m.op.Unlock()
	out, outcome := m.decrypt(ctx, in)
	if outcome != "" && m.observe != nil {
		m.observe(outcome)
	}
	return out
}

// Open returns an event of room in the clear when it can, as it came
// otherwise, counting nothing: the reconciler reads the agent's own sends
// with it.
func (m *Machine) Open(ctx context.Context, room string, raw json.RawMessage) json.RawMessage {
	m.op.Lock()
	defer m.op.Unlock()
	out, _ := m.decrypt(ctx, journal.Inbound{RoomID: room, Provenance: journal.History, Event: raw})
	return out.Event
}

// decrypt is Decrypt, with the outcome to count ("" for a clear event or
// one still waiting).
func (m *Machine) decrypt(ctx context.Context, in journal.Inbound) (journal.Inbound, string) {
	retried := in.AwaitingSession != ""
	if !bytes.Contains(in.Event, encryptedType) && !bytes.Contains(in.Event, []byte(`\u`)) {
		return in, ""
	}
	evt := &event.Event{}
	if err := json.Unmarshal(in.Event, evt); err != nil || evt.Type != event.EventEncrypted {
		return in, "" // the journal reads (or rejects) it as it is
	}
	if len(evt.Content.VeryRaw) == 0 || bytes.Equal(bytes.TrimSpace(evt.Content.VeryRaw), []byte("{}")) {
		return in, "" // redacted: nothing left to decrypt, journaled as context
	}
	evt.RoomID = id.RoomID(in.RoomID)
	evt.Type.Class = event.MessageEventType
	if err := evt.Content.ParseRaw(evt.Type); err != nil {
		in.Undecryptable = "malformed encrypted content"
		return in, "failed_malformed"
	}
	content := evt.Content.AsEncrypted()
	clear, err := m.mach.DecryptMegolmEvent(ctx, evt)
	switch {
	case err == nil:
	case errors.Is(err, crypto.ErrNoSessionFound), errors.Is(err, crypto.ErrGroupSessionWithheld):
		w := journal.KeyWait{RoomID: in.RoomID, Session: content.SessionID.String()}
		in.AwaitingSession = w.Session
		m.mu.Lock()
		if _, done := m.asked[w]; !done {
			m.wanted[w] = keyRequest{sender: evt.Sender, senderKey: content.SenderKey}
		}
		m.mu.Unlock()
		if retried {
			return in, ""
		}
		return in, "awaiting"
	default:
		reason, code := undecryptableReason(err)
		in.Undecryptable = reason
		return in, "failed_" + code
	}
	raw, err := cleartext(in.Event, clear)
	if err != nil {
		in.Undecryptable = "the cleartext does not encode"
		return in, "failed_malformed"
	}
	outcome := "ok"
	if retried {
		outcome = "late"
	}
	return journal.Inbound{RoomID: in.RoomID, Provenance: in.Provenance, Event: raw}, outcome
}

// undecryptableReason names why a ciphertext can never decrypt, without
// quoting it, in words and as a metric's code.
func undecryptableReason(err error) (reason, code string) {
	for _, known := range []struct {
		err  error
		code string
	}{
		{crypto.ErrUnsupportedAlgorithm, "algorithm"}, {crypto.ErrCorruptedMegolmPayload, "corrupted"},
		{crypto.ErrDuplicateMessageIndex, "replayed"}, {crypto.ErrWrongRoom, "wrong_room"},
		{crypto.ErrRatchetError, "ratchet"}, {crypto.ErrIncorrectEncryptedContentType, "malformed"},
	} {
		if errors.Is(err, known.err) {
			return known.err.Error(), known.code
		}
	}
	return "megolm decryption failed", "other"
}

// cleartext builds the event the journal admits for a decrypted one: the
// outer event's identity and unsigned data, the inner type and content.
func cleartext(outer json.RawMessage, inner *event.Event) (json.RawMessage, error) {
	var o map[string]json.RawMessage
	if err := json.Unmarshal(outer, &o); err != nil {
		return nil, err
	}
	typ, err := json.Marshal(inner.Type.Type)
	if err != nil {
		return nil, err
	}
	o["type"] = typ
	o["content"] = inner.Content.VeryRaw
	return json.Marshal(o)
}

// RequestKeys asks, once per session and run, the sender's devices and the
// account's other devices for the keys events wait on. It is best-effort:
// a key that comes unasked resolves the events all the same.
func (m *Machine) RequestKeys(ctx context.Context) {
	m.op.Lock()
	defer m.op.Unlock()
	m.mu.Lock()
	wanted := make(map[journal.KeyWait]keyRequest, len(m.wanted))
	for w, r := range m.wanted {
		wanted[w] = r
		m.asked[w] = struct{}{}
	}
	clear(m.wanted)
	m.mu.Unlock()
	for w, r := range wanted {
		to := map[id.UserID][]id.DeviceID{m.self: {"*"}, r.sender: {"*"}}
		err := m.mach.SendRoomKeyRequest(ctx, id.RoomID(w.RoomID), r.senderKey, id.SessionID(w.Session), "", to)
		if err != nil {
			m.log.Warn().Err(err).Str("room_id", w.RoomID).Str("session_id", w.Session).Msg("Room key request failed")
		}
	}
}

// Seal implements matrix.Encrypter: in a room whose state says it is
// encrypted, the event goes out as m.room.encrypted under the room's
// megolm session, shared first with the joined and invited members'
// devices. Its relation stays in the clear, as clients expect. Anything
// that keeps it from encrypting is an error: plaintext never goes into an
// encrypted room.
func (m *Machine) Seal(ctx context.Context, room, eventType string, content json.RawMessage) (string, json.RawMessage, error) {
	m.op.Lock()
	defer m.op.Unlock()
	rid := id.RoomID(room)
	encrypted, err := m.encrypted(ctx, rid)
	if err != nil {
		return "", nil, fmt.Errorf("read whether %s is encrypted: %w", room, err)
	}
	if !encrypted {
		return eventType, content, nil
	}
	typ := event.Type{Type: eventType, Class: event.MessageEventType}
	sealed, err := m.mach.EncryptMegolmEvent(ctx, rid, typ, content)
	if errors.Is(err, crypto.ErrNoGroupSession) || errors.Is(err, crypto.ErrSessionExpired) || errors.Is(err, crypto.ErrSessionNotShared) {
		members, merr := m.store.state.GetRoomJoinedOrInvitedMembers(ctx, rid)
		if merr != nil {
			return "", nil, fmt.Errorf("encrypt for %s: read members: %w", room, merr)
		}
		if err := m.mach.ShareGroupSession(ctx, rid, members); err != nil {
			return "", nil, fmt.Errorf("encrypt for %s: share the room key: %w", room, err)
		}
		sealed, err = m.mach.EncryptMegolmEvent(ctx, rid, typ, content)
	}
	if err != nil {
		return "", nil, fmt.Errorf("encrypt for %s: %w", room, err)
	}
	var rel struct {
		RelatesTo *event.RelatesTo `json:"m.relates_to"`
	}
	if json.Unmarshal(content, &rel) == nil && rel.RelatesTo != nil {
		sealed.RelatesTo = rel.RelatesTo
	}
	out, err := json.Marshal(sealed)
	if err != nil {
		return "", nil, fmt.Errorf("encrypt for %s: %w", room, err)
	}
	return event.EventEncrypted.Type, out, nil
}

// Encrypts implements matrix.Encrypter: whether Seal would encrypt what
// goes into room.
func (m *Machine) Encrypts(ctx context.Context, room string) (bool, error) {
	m.op.Lock()
	defer m.op.Unlock()
	return m.encrypted(ctx, id.RoomID(room))
}

// encrypted reports whether room is encrypted. The kept room state may
// not say so (a crypto store restored from a copy older than the
// journal, whose sync will not show the room's state again): a room it
// holds no encryption for is asked of the homeserver once per run before
// anything goes into it in the clear, and a failed answer fails the send.
func (m *Machine) encrypted(ctx context.Context, room id.RoomID) (bool, error) {
	encrypted, err := m.store.state.IsEncrypted(ctx, room)
	if err != nil || encrypted {
		return encrypted, err
	}
	m.mu.Lock()
	_, known := m.clear[room]
	m.mu.Unlock()
	if known {
		return false, nil
	}
	var content event.EncryptionEventContent
	err = m.mach.Client.StateEvent(ctx, room, event.StateEncryption, "", &content)
	switch {
	case errors.Is(err, mautrix.MNotFound):
		m.mu.Lock()
		m.clear[room] = struct{}{}
		m.mu.Unlock()
		return false, nil
	case err != nil:
		return false, err
	}
	if err := m.store.state.SetEncryptionEvent(ctx, room, &content); err != nil {
		return false, err
	}
	m.log.Warn().Str("room_id", room.String()).Msg("The kept room state did not know this room is encrypted; the homeserver said so")
	return true, nil
}
