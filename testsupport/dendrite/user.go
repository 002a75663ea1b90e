package dendrite

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"maunium.net/go/mautrix"
	"maunium.net/go/mautrix/event"
	"maunium.net/go/mautrix/id"
)

// awaitSyncFilter is the inline filter of a user's own sync: whole
// timelines up to 100 events per room, members not lazy-loaded.
const awaitSyncFilter = `{"room":{"timeline":{"limit":100},"state":{"lazy_load_members":false}}}`

// awaitPoll is the long-poll timeout of one sync inside AwaitEvent.
const awaitPoll = 5 * time.Second

// User is a test user's client. Its helpers fail the test they were bound
// to (User's tb) on any error, so a test reads as the conversation it
// plays.
type User struct {
	// UserID is the user's full Matrix ID.
	UserID string
	// Client is the underlying mautrix client, for what the helpers lack.
	Client *mautrix.Client

	tb   testing.TB
	txns atomic.Int64
	// since and seen are this user's own sync position and every timeline
	// event it has synced so far, per room, so AwaitEvent also finds an
	// event an earlier call already passed over.
	since string
	seen  map[string][]json.RawMessage
}

// User returns a client for acct bound to tb.
func (s *Server) User(tb testing.TB, acct Account) *User {
	tb.Helper()
	cli, err := mautrix.NewClient(s.URL, id.UserID(acct.UserID), acct.AccessToken)
	if err != nil {
		tb.Fatalf("client for %s: %v", acct.UserID, err)
	}
	cli.DeviceID = id.DeviceID(acct.DeviceID)
	return &User{UserID: acct.UserID, Client: cli, tb: tb, seen: map[string][]json.RawMessage{}}
}

// ctx bounds one helper's request.
func (u *User) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(u.tb.Context(), requestTimeout)
}

// txnID names one send of this client. Counting keeps a test's sends
// reproducible, where mautrix's default would be random.
func (u *User) txnID() string {
	return "harness-" + strconv.FormatInt(u.txns.Add(1), 10)
}

func (u *User) fatal(what string, err error) {
	u.tb.Helper()
	u.tb.Fatalf("%s as %s: %v", what, u.UserID, err)
}

// CreateRoom creates a private room and invites users to it.
func (u *User) CreateRoom(invite ...string) string {
	u.tb.Helper()
	ctx, cancel := u.ctx()
	defer cancel()
	req := &mautrix.ReqCreateRoom{Preset: "private_chat"}
	for _, user := range invite {
		req.Invite = append(req.Invite, id.UserID(user))
	}
	resp, err := u.Client.CreateRoom(ctx, req)
	if err != nil {
		u.fatal("create room", err)
	}
	return resp.RoomID.String()
}

// Invite invites user to room.
func (u *User) Invite(room, user string) {
	u.tb.Helper()
	ctx, cancel := u.ctx()
	defer cancel()
	if _, err := u.Client.InviteUser(ctx, id.RoomID(room), &mautrix.ReqInviteUser{UserID: id.UserID(user)}); err != nil {
		u.fatal("invite "+user+" to "+room, err)
	}
}

// Join joins room.
func (u *User) Join(room string) {
	u.tb.Helper()
	ctx, cancel := u.ctx()
	defer cancel()
	if _, err := u.Client.JoinRoomByID(ctx, id.RoomID(room)); err != nil {
		u.fatal("join "+room, err)
	}
}

// Leave leaves room.
func (u *User) Leave(room string) {
	u.tb.Helper()
	ctx, cancel := u.ctx()
	defer cancel()
	if _, err := u.Client.LeaveRoom(ctx, id.RoomID(room)); err != nil {
		u.fatal("leave "+room, err)
	}
}

// Kick removes user from room.
func (u *User) Kick(room, user string) {
	u.tb.Helper()
	ctx, cancel := u.ctx()
	defer cancel()
	if _, err := u.Client.KickUser(ctx, id.RoomID(room), &mautrix.ReqKickUser{UserID: id.UserID(user)}); err != nil {
		u.fatal("kick "+user+" from "+room, err)
	}
}

// Send sends an event of eventType with content to room and returns its ID.
func (u *User) Send(room, eventType string, content any) string {
	u.tb.Helper()
	ctx, cancel := u.ctx()
	defer cancel()
	evType := event.Type{Type: eventType, Class: event.MessageEventType}
	resp, err := u.Client.SendMessageEvent(ctx, id.RoomID(room), evType, content,
		mautrix.ReqSendEvent{TransactionID: u.txnID()})
	if err != nil {
		u.fatal("send "+eventType+" to "+room, err)
	}
	return resp.EventID.String()
}

// SendText sends a plain text message.
func (u *User) SendText(room, body string) string {
	u.tb.Helper()
	return u.Send(room, "m.room.message", map[string]any{"msgtype": "m.text", "body": body})
}

// Edit replaces the text of target with body.
func (u *User) Edit(room, target, body string) string {
	u.tb.Helper()
	return u.Send(room, "m.room.message", map[string]any{
		"msgtype": "m.text", "body": "* " + body,
		"m.new_content": map[string]any{"msgtype": "m.text", "body": body},
		"m.relates_to":  map[string]any{"rel_type": "m.replace", "event_id": target},
	})
}

// ThreadReply sends body into the thread rooted at root.
func (u *User) ThreadReply(room, root, body string) string {
	u.tb.Helper()
	return u.Send(room, "m.room.message", map[string]any{
		"msgtype": "m.text", "body": body,
		"m.relates_to": map[string]any{
			"rel_type": "m.thread", "event_id": root, "is_falling_back": true,
			"m.in_reply_to": map[string]any{"event_id": root},
		},
	})
}

// React annotates target with key.
func (u *User) React(room, target, key string) string {
	u.tb.Helper()
	return u.Send(room, "m.reaction", map[string]any{
		"m.relates_to": map[string]any{"rel_type": "m.annotation", "event_id": target, "key": key},
	})
}

// Redact redacts target and returns the redaction's ID.
func (u *User) Redact(room, target string) string {
	u.tb.Helper()
	ctx, cancel := u.ctx()
	defer cancel()
	resp, err := u.Client.RedactEvent(ctx, id.RoomID(room), id.EventID(target), mautrix.ReqRedact{TxnID: u.txnID()})
	if err != nil {
		u.fatal("redact "+target, err)
	}
	return resp.EventID.String()
}

// Messages returns every event of room this user may see, oldest first. It
// walks /messages backwards from the newest event (Dendrite refuses a
// forward walk without a from token) and reverses the result.
//
// Dendrite writes the store behind /messages after it answers a send, so
// await the last event of interest in a sync first (AwaitEvent with
// WithID): the store is filled in order, and the sync reads the same store.
func (u *User) Messages(room string) []json.RawMessage {
	u.tb.Helper()
	var all []json.RawMessage
	from := ""
	for {
		ctx, cancel := u.ctx()
		page, err := u.messagesPage(ctx, room, from)
		cancel()
		if err != nil {
			u.fatal("read messages of "+room, err)
		}
		all = append(all, page.Chunk...)
		if len(page.Chunk) == 0 || page.End == "" || page.End == from {
			break
		}
		from = page.End
	}
	slices.Reverse(all)
	return all
}

type messagesPage struct {
	Chunk []json.RawMessage `json:"chunk"`
	End   string            `json:"end"`
}

func (u *User) messagesPage(ctx context.Context, room, from string) (messagesPage, error) {
	query := map[string]string{"dir": "b", "limit": "100"}
	if from != "" {
		query["from"] = from
	}
	var page messagesPage
	url := u.Client.BuildURLWithQuery(mautrix.ClientURLPath{"v3", "rooms", room, "messages"}, query)
	_, err := u.Client.MakeRequest(ctx, http.MethodGet, url, nil, &page)
	return page, err
}

// AwaitEvent returns the first timeline event of room in this user's own
// sync for which match is true, syncing until ctx ends (which fails the
// test). It sees every event synced by earlier calls too; the first call
// starts from the newest 100 events of each room.
func (u *User) AwaitEvent(ctx context.Context, room string, match func(json.RawMessage) bool) json.RawMessage {
	u.tb.Helper()
	checked := 0
	for {
		for _, ev := range u.seen[room][checked:] {
			if match(ev) {
				return ev
			}
		}
		checked = len(u.seen[room])
		if err := u.syncOnce(ctx); err != nil {
			u.fatal(fmt.Sprintf("await an event in %s (%d seen)", room, checked), err)
		}
	}
}

// WithID matches the event with eventID, for AwaitEvent.
func WithID(eventID string) func(json.RawMessage) bool {
	return func(raw json.RawMessage) bool {
		var e struct {
			ID string `json:"event_id"`
		}
		return json.Unmarshal(raw, &e) == nil && e.ID == eventID
	}
}

// Says matches a message of sender's whose body is body, for AwaitEvent.
func Says(sender, body string) func(json.RawMessage) bool {
	return func(raw json.RawMessage) bool {
		var e struct {
			Sender  string `json:"sender"`
			Content struct {
				Body string `json:"body"`
			} `json:"content"`
		}
		return json.Unmarshal(raw, &e) == nil && e.Sender == sender && e.Content.Body == body
	}
}

func (u *User) syncOnce(ctx context.Context) error {
	resp, err := SyncTimelines(ctx, u.Client, awaitSyncFilter, u.since, awaitPoll)
	if err != nil {
		return err
	}
	for room, joined := range resp.Rooms.Join {
		u.seen[room] = append(u.seen[room], joined.Timeline.Events...)
	}
	u.since = resp.NextBatch
	return nil
}
