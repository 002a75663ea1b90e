// Package e2eeperson plays a person in end-to-end encrypted rooms the way
// Element would: a Matrix user logged in on a device of its own, with its
// own Olm account (mautrix's crypto over the pure-Go goolm), talking to the
// real Dendrite of testsupport/dendrite. What it sends is real Megolm
// ciphertext whose room key reaches every member's devices over Olm
// to-device messages, so a bot under test has to do real decryption to
// read it, and what others send it decrypts the same way.
//
// Build it with the goolm tag (go test -tags goolm; the Makefile sets it
// for every go command): without it mautrix's crypto links libolm through
// cgo, which the project does not use, and the build fails. The package
// carries no build constraint of its own, so a missing tag fails loudly
// rather than dropping its tests from a run unnoticed.
package e2eeperson

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"maunium.net/go/mautrix"
	"maunium.net/go/mautrix/crypto"
	"maunium.net/go/mautrix/event"
	"maunium.net/go/mautrix/id"

	"github.com/mindroomd/mindroomd/testsupport/dendrite"
)

const (
	// requestTimeout bounds one helper's requests to the server.
	requestTimeout = 30 * time.Second
	// syncPoll is the long-poll timeout of one sync of the loop. Dendrite
	// answers early when anything arrives; the bound only matters if it
	// failed to wake a waiting sync for some stream.
	syncPoll = 5 * time.Second
	// syncFilter asks for whole timelines of up to 100 events per room and
	// every member, as the loop records timelines and keeps room state.
	syncFilter = `{"room":{"timeline":{"limit":100},"state":{"lazy_load_members":false}}}`
)

// Person is a Matrix user with its own device and crypto, as Element would
// be. Its helpers fail the test it was made for on any error, so a test
// reads as the conversation it plays; they must be called from that
// test's goroutine.
//
// A sync loop of its own runs from New until the test ends: it hands
// to-device messages (room keys over Olm), device-list changes and
// one-time-key counts to the Olm machine, keeps the room state the machine
// needs and records every room timeline event it sees.
type Person struct {
	tb       testing.TB
	cli      *mautrix.Client
	mach     *crypto.OlmMachine
	password string
	txns     atomic.Int64

	// mu serialises every use of the Olm machine and its stores between
	// the sync loop and the test's calls, as a client's crypto is one
	// state machine; it also guards the fields below.
	mu sync.Mutex
	// timeline is every timeline event each room showed in a sync, in
	// order.
	timeline map[id.RoomID][]*seenEvent
	// synced is closed, and replaced, after each sync is processed, to
	// wake whoever awaits an event.
	synced chan struct{}
	// syncErr is the error that stopped the sync loop.
	syncErr error
	// sharedWith is, per outbound Megolm session, the devices its key was
	// sent to.
	sharedWith map[id.SessionID]map[crypto.UserDevice]bool
	// withheld is, per room, the sessions whose key was kept from a user
	// until ShareWithheldKeys.
	withheld map[id.RoomID][]withheldKey
}

// New logs acct's user in on a new device, creates its Olm account,
// uploads the device keys and one-time keys, and starts the sync loop,
// stopped when the test ends. It returns after the first sync has been
// processed.
func New(tb testing.TB, s *dendrite.Server, acct dendrite.Account) *Person {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), requestTimeout)
	defer cancel()
	userID := id.UserID(acct.UserID)
	localpart, _, err := userID.Parse()
	if err != nil {
		tb.Fatalf("user ID %q: %v", acct.UserID, err)
	}
	cli, err := mautrix.NewClient(s.URL, "", "")
	if err != nil {
		tb.Fatalf("client for %s: %v", userID, err)
	}
	// Each Person is a new device, as a person opening Element on another
	// machine is; the registration's device stays keyless.
	_, err = cli.Login(ctx, &mautrix.ReqLogin{
		Type:                     mautrix.AuthTypePassword,
		Identifier:               mautrix.UserIdentifier{Type: mautrix.IdentifierTypeUser, User: localpart},
		Password:                 acct.Password,
		InitialDeviceDisplayName: "e2eeperson",
		StoreCredentials:         true,
	})
	if err != nil {
		tb.Fatalf("log %s in: %v", userID, err)
	}
	cli.StateStore = mautrix.NewMemoryStateStore()
	log := zerolog.Nop()
	mach := crypto.NewOlmMachine(cli, &log, crypto.NewMemoryStore(nil), cli.StateStore.(crypto.StateStore))
	// A client that only reads has no use for mautrix's ratchet-safety
	// bookkeeping, which would write to the inbound sessions on every
	// decryption.
	mach.DisableRatchetTracking = true
	if err := mach.Load(ctx); err != nil {
		tb.Fatalf("olm account of %s: %v", userID, err)
	}
	if err := mach.ShareKeys(ctx, 0); err != nil {
		tb.Fatalf("upload keys of %s: %v", userID, err)
	}
	p := &Person{
		tb: tb, cli: cli, mach: mach, password: acct.Password,
		timeline:   map[id.RoomID][]*seenEvent{},
		synced:     make(chan struct{}),
		sharedWith: map[id.SessionID]map[crypto.UserDevice]bool{},
		withheld:   map[id.RoomID][]withheldKey{},
	}
	p.startSync(ctx)
	return p
}

// UserID is the person's full Matrix user ID.
func (p *Person) UserID() string { return p.cli.UserID.String() }

// DeviceID is the ID of the person's own device.
func (p *Person) DeviceID() string { return p.cli.DeviceID.String() }

// ctx bounds one helper's requests.
func (p *Person) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(p.tb.Context(), requestTimeout)
}

// txnID names one send of this device. Counting keeps a test's sends
// reproducible, where mautrix's default would be random.
func (p *Person) txnID() string {
	return "e2eeperson-" + strconv.FormatInt(p.txns.Add(1), 10)
}

func (p *Person) fatal(what string, err error) {
	p.tb.Helper()
	p.tb.Fatalf("%s as %s: %v", what, p.UserID(), err)
}

// startSync runs the sync loop until the test ends and waits, bounded by
// ctx, for its first sync to be processed.
func (p *Person) startSync(ctx context.Context) {
	p.tb.Helper()
	loopCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	first := p.synced
	go func() {
		defer close(done)
		p.syncLoop(loopCtx)
	}()
	p.tb.Cleanup(func() {
		stop()
		<-done
		p.mach.Destroy()
	})
	select {
	case <-first:
	case <-ctx.Done():
		p.fatal("first sync", ctx.Err())
	}
	p.mu.Lock()
	err := p.syncErr
	p.mu.Unlock()
	if err != nil {
		p.fatal("first sync", err)
	}
}

// syncLoop syncs until ctx ends or a sync fails. A failure is kept in
// syncErr for the awaiting helpers to report: the loop runs outside the
// test's goroutine and cannot fail the test itself.
func (p *Person) syncLoop(ctx context.Context) {
	since := ""
	for {
		resp, body, err := p.syncOnce(ctx, since)
		p.mu.Lock()
		if err != nil {
			if ctx.Err() == nil {
				p.syncErr = fmt.Errorf("sync: %w", err)
			} else {
				p.syncErr = errors.New("sync loop stopped: the test has ended")
			}
		} else {
			p.process(ctx, resp, body, since)
			since = resp.NextBatch
		}
		close(p.synced)
		p.synced = make(chan struct{})
		stopped := p.syncErr != nil
		p.mu.Unlock()
		if stopped {
			return
		}
	}
}

// syncOnce makes one /sync request and returns it both parsed for the Olm
// machine and as the body, from which timeline events are kept as sent.
func (p *Person) syncOnce(ctx context.Context, since string) (*mautrix.RespSync, []byte, error) {
	req := mautrix.ReqSync{Timeout: int(syncPoll.Milliseconds()), Since: since, FilterID: syncFilter}
	var resp *mautrix.RespSync
	body, err := p.cli.MakeFullRequest(ctx, mautrix.FullRequest{
		Method:       "GET",
		URL:          p.cli.BuildURLWithQuery(mautrix.ClientURLPath{"v3", "sync"}, req.BuildQuery()),
		ResponseJSON: &resp,
		MaxAttempts:  1,
	})
	if err != nil {
		return nil, nil, err
	}
	return resp, body, nil
}

// rawSync is the part of a sync body whose events are kept as raw JSON.
type rawSync struct {
	Rooms struct {
		Join  map[id.RoomID]rawRoom `json:"join"`
		Leave map[id.RoomID]rawRoom `json:"leave"`
	} `json:"rooms"`
}

type rawRoom struct {
	State struct {
		Events []json.RawMessage `json:"events"`
	} `json:"state"`
	Timeline struct {
		Events []json.RawMessage `json:"events"`
	} `json:"timeline"`
}

// process hands one sync to the Olm machine, then applies its room state
// and records its timelines. The machine goes first so that room keys
// arriving with the events they open are there when those are read.
// Called with mu held.
func (p *Person) process(ctx context.Context, resp *mautrix.RespSync, body []byte, since string) {
	p.mach.ProcessSyncResponse(ctx, resp, since)
	var raw rawSync
	if err := json.Unmarshal(body, &raw); err != nil {
		p.syncErr = fmt.Errorf("read sync body: %w", err)
		return
	}
	for _, rooms := range []map[id.RoomID]rawRoom{raw.Rooms.Join, raw.Rooms.Leave} {
		for room, data := range rooms {
			for _, ev := range data.State.Events {
				p.apply(ctx, room, ev)
			}
			for _, ev := range data.Timeline.Events {
				if evt := p.apply(ctx, room, ev); evt != nil {
					p.timeline[room] = append(p.timeline[room], &seenEvent{raw: ev, evt: evt})
				}
			}
		}
	}
}

// apply parses one room event and, for a state event, updates the state
// store and tells the Olm machine of membership and history-visibility
// changes, which end the room's outbound session as Element's would.
// It returns nil for an event it could not parse.
func (p *Person) apply(ctx context.Context, room id.RoomID, raw json.RawMessage) *event.Event {
	evt := &event.Event{}
	if err := json.Unmarshal(raw, evt); err != nil {
		return nil
	}
	evt.RoomID = room
	evt.Type.Class = event.MessageEventType
	if evt.StateKey != nil {
		evt.Type.Class = event.StateEventType
	}
	// An event type mautrix has no struct for stays unparsed; its raw
	// content is all this package reads of it.
	_ = evt.Content.ParseRaw(evt.Type)
	if evt.StateKey == nil {
		return evt
	}
	mautrix.UpdateStateStore(ctx, p.cli.StateStore, evt)
	switch evt.Type {
	case event.StateMember:
		p.mach.HandleMemberEvent(ctx, evt)
	case event.StateHistoryVisibility:
		p.mach.HandleHistoryVisibility(ctx, evt)
	}
	return evt
}

// CreateEncryptedRoom creates a private room encrypted from its first
// event, as Element creates one: preset private_chat with
// m.room.encryption (m.megolm.v1.aes-sha2) in the initial state, users
// invited. It returns the room's ID.
func (p *Person) CreateEncryptedRoom(invite ...string) string {
	p.tb.Helper()
	ctx, cancel := p.ctx()
	defer cancel()
	stateKey := ""
	req := &mautrix.ReqCreateRoom{
		Preset: "private_chat",
		InitialState: []*event.Event{{
			Type:     event.StateEncryption,
			StateKey: &stateKey,
			Content:  event.Content{Parsed: &event.EncryptionEventContent{Algorithm: id.AlgorithmMegolmV1}},
		}},
	}
	for _, user := range invite {
		req.Invite = append(req.Invite, id.UserID(user))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	resp, err := p.cli.CreateRoom(ctx, req)
	if err != nil {
		p.fatal("create encrypted room", err)
	}
	return resp.RoomID.String()
}

// Invite invites user to room.
func (p *Person) Invite(room, user string) {
	p.tb.Helper()
	ctx, cancel := p.ctx()
	defer cancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := p.cli.InviteUser(ctx, id.RoomID(room), &mautrix.ReqInviteUser{UserID: id.UserID(user)}); err != nil {
		p.fatal("invite "+user+" to "+room, err)
	}
}

// Join joins room.
func (p *Person) Join(room string) {
	p.tb.Helper()
	ctx, cancel := p.ctx()
	defer cancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := p.cli.JoinRoomByID(ctx, id.RoomID(room)); err != nil {
		p.fatal("join "+room, err)
	}
}

// Kick removes user from room. The next message this person sends there
// goes out in a new Megolm session the kicked user never gets.
func (p *Person) Kick(room, user string) {
	p.tb.Helper()
	ctx, cancel := p.ctx()
	defer cancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := p.cli.KickUser(ctx, id.RoomID(room), &mautrix.ReqKickUser{UserID: id.UserID(user)}); err != nil {
		p.fatal("kick "+user+" from "+room, err)
	}
}

// Redact redacts target and returns the redaction's ID. Redactions are
// never encrypted: the server has to read which event they remove.
func (p *Person) Redact(room, target string) string {
	p.tb.Helper()
	ctx, cancel := p.ctx()
	defer cancel()
	resp, err := p.cli.RedactEvent(ctx, id.RoomID(room), id.EventID(target), mautrix.ReqRedact{TxnID: p.txnID()})
	if err != nil {
		p.fatal("redact "+target, err)
	}
	return resp.EventID.String()
}
