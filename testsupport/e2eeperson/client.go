// Package e2eeperson plays a person in end-to-end encrypted rooms the way
// Element would: a Matrix user logged in on a device of its own, with its
// own Olm account (mautrix's crypto over the pure-Go goolm), talking to the
// real Dendrite of testsupport/dendrite. What it sends is real Megolm
// ciphertext whose room key reaches every member's devices over Olm
// to-device messages, so a bot under test has to do real decryption to
// read it, and what others send it decrypts the same way.
//
// A test takes a Person (New), whose helpers fail the test on any error; a
// program (the demo, the soak) takes a Client (Open), whose operations
// return their errors. A Person is a Client bound to its test: each
// operation has one implementation, the Client's.
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
	"time"

	"github.com/rs/zerolog"
	"maunium.net/go/mautrix"
	"maunium.net/go/mautrix/crypto"
	"maunium.net/go/mautrix/event"
	"maunium.net/go/mautrix/id"

	"github.com/mindroomd/mindroomd/testsupport/dendrite"
)

const (
	// requestTimeout bounds one operation's requests to the server.
	requestTimeout = 30 * time.Second
	// syncPoll is the long-poll timeout of one sync of the loop. Dendrite
	// answers early when anything arrives; the bound only matters if it
	// failed to wake a waiting sync for some stream.
	syncPoll = 5 * time.Second
	// syncFilter asks for whole timelines of up to 100 events per room and
	// every member, as the loop records timelines and keeps room state.
	syncFilter = `{"room":{"timeline":{"limit":100},"state":{"lazy_load_members":false}}}`
)

// errClosed is the sync loop's end once Close stopped it.
var errClosed = errors.New("sync loop stopped: the client is closed")

// Client is a Matrix user with its own device and crypto, as Element
// would be, for a program: every operation takes a context, which bounds
// it, and returns its error, naming the operation and the user. Its
// methods may be called from any goroutine.
//
// A sync loop of its own runs from Open until Close: it hands to-device
// messages (room keys over Olm), device-list changes and one-time-key
// counts to the Olm machine, keeps the room state the machine needs and
// records every room timeline event it sees.
type Client struct {
	cli      *mautrix.Client
	mach     *crypto.OlmMachine
	password string
	txns     atomic.Int64
	// stop ends the sync loop; done is closed once it has.
	stop context.CancelFunc
	done chan struct{}

	// mu serialises every use of the Olm machine and its stores between
	// the sync loop and the operations, as a client's crypto is one state
	// machine; it also guards the fields below.
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

// Open logs acct's user in on a new device of the server at serverURL,
// creates its Olm account, uploads the device keys and one-time keys, and
// starts the sync loop, which runs until Close. It returns after the first
// sync has been processed; ctx bounds that much, not the loop.
func Open(ctx context.Context, serverURL string, acct dendrite.Account) (*Client, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	userID := id.UserID(acct.UserID)
	localpart, _, err := userID.Parse()
	if err != nil {
		return nil, fmt.Errorf("user ID %q: %w", acct.UserID, err)
	}
	cli, err := mautrix.NewClient(serverURL, "", "")
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", userID, err)
	}
	// Each Client is a new device, as a person opening Element on another
	// machine is; the registration's device stays keyless.
	_, err = cli.Login(ctx, &mautrix.ReqLogin{
		Type:                     mautrix.AuthTypePassword,
		Identifier:               mautrix.UserIdentifier{Type: mautrix.IdentifierTypeUser, User: localpart},
		Password:                 acct.Password,
		InitialDeviceDisplayName: "e2eeperson",
		StoreCredentials:         true,
	})
	if err != nil {
		return nil, fmt.Errorf("log %s in: %w", userID, err)
	}
	cli.StateStore = mautrix.NewMemoryStateStore()
	log := zerolog.Nop()
	mach := crypto.NewOlmMachine(cli, &log, crypto.NewMemoryStore(nil), cli.StateStore.(crypto.StateStore))
	// A client that only reads has no use for mautrix's ratchet-safety
	// bookkeeping, which would write to the inbound sessions on every
	// decryption.
	mach.DisableRatchetTracking = true
	if err := mach.Load(ctx); err != nil {
		return nil, fmt.Errorf("olm account of %s: %w", userID, err)
	}
	if err := mach.ShareKeys(ctx, 0); err != nil {
		return nil, fmt.Errorf("upload keys of %s: %w", userID, err)
	}
	c := &Client{
		cli: cli, mach: mach, password: acct.Password,
		timeline:   map[id.RoomID][]*seenEvent{},
		synced:     make(chan struct{}),
		sharedWith: map[id.SessionID]map[crypto.UserDevice]bool{},
		withheld:   map[id.RoomID][]withheldKey{},
	}
	if err := c.startSync(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Close stops the sync loop, waits for it to end and releases the Olm
// machine. The device stays on the server. Call it once.
func (c *Client) Close() {
	c.stop()
	<-c.done
	c.mach.Destroy()
}

// UserID is the person's full Matrix user ID.
func (c *Client) UserID() string { return c.cli.UserID.String() }

// DeviceID is the ID of the person's own device.
func (c *Client) DeviceID() string { return c.cli.DeviceID.String() }

// Synced returns a channel closed once the sync loop has processed its
// next sync, for a caller waiting for what a sync brings (a room key, an
// event): take it before looking, and a sync that lands meanwhile still
// wakes the wait. Once the loop has stopped no sync comes, and err says
// why.
func (c *Client) Synced() (next <-chan struct{}, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.synced, c.syncErr
}

// txnID names one send of this device. Counting keeps a run's sends
// reproducible, where mautrix's default would be random.
func (c *Client) txnID() string {
	return "e2eeperson-" + strconv.FormatInt(c.txns.Add(1), 10)
}

// fail names what failed and as whom.
func (c *Client) fail(what string, err error) error {
	return fmt.Errorf("%s as %s: %w", what, c.UserID(), err)
}

// startSync runs the sync loop until Close and waits, bounded by ctx, for
// its first sync to be processed.
func (c *Client) startSync(ctx context.Context) error {
	loopCtx, stop := context.WithCancel(context.Background())
	c.stop, c.done = stop, make(chan struct{})
	first := c.synced
	go func() {
		defer close(c.done)
		c.syncLoop(loopCtx)
	}()
	select {
	case <-first:
	case <-ctx.Done():
		return c.fail("first sync", ctx.Err())
	}
	c.mu.Lock()
	err := c.syncErr
	c.mu.Unlock()
	if err != nil {
		return c.fail("first sync", err)
	}
	return nil
}

// syncLoop syncs until ctx ends or a sync fails. A failure is kept in
// syncErr for the awaiting operations to report: the loop runs on a
// goroutine of its own, which no caller waits on.
func (c *Client) syncLoop(ctx context.Context) {
	since := ""
	for {
		resp, body, err := c.syncOnce(ctx, since)
		c.mu.Lock()
		if err != nil {
			if ctx.Err() == nil {
				c.syncErr = fmt.Errorf("sync: %w", err)
			} else {
				c.syncErr = errClosed
			}
		} else {
			c.process(ctx, resp, body, since)
			since = resp.NextBatch
		}
		close(c.synced)
		c.synced = make(chan struct{})
		stopped := c.syncErr != nil
		c.mu.Unlock()
		if stopped {
			return
		}
	}
}

// syncOnce makes one /sync request and returns it both parsed for the Olm
// machine and as the body, from which timeline events are kept as sent.
func (c *Client) syncOnce(ctx context.Context, since string) (*mautrix.RespSync, []byte, error) {
	req := mautrix.ReqSync{Timeout: int(syncPoll.Milliseconds()), Since: since, FilterID: syncFilter}
	var resp *mautrix.RespSync
	body, err := c.cli.MakeFullRequest(ctx, mautrix.FullRequest{
		Method:       "GET",
		URL:          c.cli.BuildURLWithQuery(mautrix.ClientURLPath{"v3", "sync"}, req.BuildQuery()),
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
func (c *Client) process(ctx context.Context, resp *mautrix.RespSync, body []byte, since string) {
	c.mach.ProcessSyncResponse(ctx, resp, since)
	var raw rawSync
	if err := json.Unmarshal(body, &raw); err != nil {
		c.syncErr = fmt.Errorf("read sync body: %w", err)
		return
	}
	for _, rooms := range []map[id.RoomID]rawRoom{raw.Rooms.Join, raw.Rooms.Leave} {
		for room, data := range rooms {
			for _, ev := range data.State.Events {
				c.apply(ctx, room, ev)
			}
			for _, ev := range data.Timeline.Events {
				if evt := c.apply(ctx, room, ev); evt != nil {
					c.timeline[room] = append(c.timeline[room], &seenEvent{raw: ev, evt: evt})
				}
			}
		}
	}
}

// apply parses one room event of a sync and, for a state event, updates
// the state store and tells the Olm machine of membership and
// history-visibility changes, which end the room's outbound session as
// Element's would. It returns nil for an event it could not parse.
func (c *Client) apply(ctx context.Context, room id.RoomID, raw json.RawMessage) *event.Event {
	evt := parseEvent(room, raw)
	if evt == nil || evt.StateKey == nil {
		return evt
	}
	mautrix.UpdateStateStore(ctx, c.cli.StateStore, evt)
	switch evt.Type {
	case event.StateMember:
		c.mach.HandleMemberEvent(ctx, evt)
	case event.StateHistoryVisibility:
		c.mach.HandleHistoryVisibility(ctx, evt)
	}
	return evt
}

// parseEvent parses one event of room, nil if it does not parse.
func parseEvent(room id.RoomID, raw json.RawMessage) *event.Event {
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
	return evt
}

// CreateEncryptedRoom creates a private room encrypted from its first
// event, as Element creates one: preset private_chat with
// m.room.encryption (m.megolm.v1.aes-sha2) in the initial state, users
// invited. It returns the room's ID.
func (c *Client) CreateEncryptedRoom(ctx context.Context, invite ...string) (string, error) {
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
	var room id.RoomID
	err := c.request(ctx, "create encrypted room", func(ctx context.Context) error {
		resp, err := c.cli.CreateRoom(ctx, req)
		if err == nil {
			room = resp.RoomID
		}
		return err
	})
	return room.String(), err
}

// Invite invites user to room.
func (c *Client) Invite(ctx context.Context, room, user string) error {
	return c.request(ctx, "invite "+user+" to "+room, func(ctx context.Context) error {
		_, err := c.cli.InviteUser(ctx, id.RoomID(room), &mautrix.ReqInviteUser{UserID: id.UserID(user)})
		return err
	})
}

// Join joins room.
func (c *Client) Join(ctx context.Context, room string) error {
	return c.request(ctx, "join "+room, func(ctx context.Context) error {
		_, err := c.cli.JoinRoomByID(ctx, id.RoomID(room))
		return err
	})
}

// Kick removes user from room. The next message this person sends there
// goes out in a new Megolm session the kicked user never gets.
func (c *Client) Kick(ctx context.Context, room, user string) error {
	return c.request(ctx, "kick "+user+" from "+room, func(ctx context.Context) error {
		_, err := c.cli.KickUser(ctx, id.RoomID(room), &mautrix.ReqKickUser{UserID: id.UserID(user)})
		return err
	})
}

// Redact redacts target and returns the redaction's ID. Redactions are
// never encrypted: the server has to read which event they remove.
func (c *Client) Redact(ctx context.Context, room, target string) (string, error) {
	var redaction id.EventID
	err := c.request(ctx, "redact "+target, func(ctx context.Context) error {
		resp, err := c.cli.RedactEvent(ctx, id.RoomID(room), id.EventID(target), mautrix.ReqRedact{TxnID: c.txnID()})
		if err == nil {
			redaction = resp.EventID
		}
		return err
	})
	return redaction.String(), err
}

// request runs one operation: do's requests bounded by requestTimeout and
// serialised with the sync loop and the other operations (a join or a
// kick updates the state store the Olm machine reads), its error naming
// what failed.
func (c *Client) request(ctx context.Context, what string, do func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := do(ctx); err != nil {
		return c.fail(what, err)
	}
	return nil
}
