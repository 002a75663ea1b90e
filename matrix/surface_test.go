package matrix_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/matrix"
	"github.com/mindroomd/mindroomd/testsupport/dendrite"
)

// surfaceAwait bounds each wait for something to reach a person's sync.
const surfaceAwait = 30 * time.Second

// surface is a bot and a person in a room the person created, named
// "Alice" and joined by the bot.
type surface struct {
	bot        *matrix.Client
	person     *dendrite.User
	personAcct dendrite.Account
	room       string
}

func newSurface(t *testing.T) surface {
	t.Helper()
	bot := login(t, config(t, register(t)))
	acct := register(t)
	person := hs.User(t, acct)
	if err := person.Client.SetDisplayName(t.Context(), "Alice"); err != nil {
		t.Fatal(err)
	}
	room := person.CreateRoom(bot.UserID())
	if _, err := bot.Join(t.Context(), room); err != nil {
		t.Fatal(err)
	}
	return surface{bot: bot, person: person, personAcct: acct, room: room}
}

// awaitEphemeral waits for an ephemeral event of the room in the person's
// sync, failing with what was awaited.
func (s surface) awaitEphemeral(t *testing.T, what string, match func(json.RawMessage) bool) {
	t.Helper()
	// Logged first: a wait that times out fails inside AwaitEphemeral,
	// and a failed test shows its log.
	t.Logf("awaiting a %s in %s's sync (at most %s)", what, s.person.UserID, surfaceAwait)
	ctx, cancel := context.WithTimeout(t.Context(), surfaceAwait)
	defer cancel()
	s.person.AwaitEphemeral(ctx, s.room, match)
}

// typingUsers matches an m.typing event whose user list satisfies want.
func typingUsers(want func([]string) bool) func(json.RawMessage) bool {
	return func(raw json.RawMessage) bool {
		var e struct {
			Type    string `json:"type"`
			Content struct {
				UserIDs []string `json:"user_ids"`
			} `json:"content"`
		}
		return json.Unmarshal(raw, &e) == nil && e.Type == "m.typing" && want(e.Content.UserIDs)
	}
}

func TestTypingReachesThePersonsSync(t *testing.T) {
	s := newSurface(t)
	// Longer than the test waits: only the withdrawal can end it in time.
	if err := s.bot.Typing(t.Context(), s.room, true, 2*surfaceAwait); err != nil {
		t.Fatal(err)
	}
	s.awaitEphemeral(t, "typing notice naming the bot", typingUsers(func(users []string) bool {
		return slices.Contains(users, s.bot.UserID())
	}))
	if err := s.bot.Typing(t.Context(), s.room, false, 0); err != nil {
		t.Fatal(err)
	}
	s.awaitEphemeral(t, "typing notice without the bot", typingUsers(func(users []string) bool {
		return !slices.Contains(users, s.bot.UserID())
	}))
}

func TestAReadReceiptReachesThePersonsSync(t *testing.T) {
	s := newSurface(t)
	msg := s.person.SendText(s.room, "did you read this?")
	if err := s.bot.ReadReceipt(t.Context(), s.room, msg); err != nil {
		t.Fatal(err)
	}
	s.awaitEphemeral(t, "read receipt by the bot for "+msg, func(raw json.RawMessage) bool {
		var e struct {
			Type    string                                           `json:"type"`
			Content map[string]map[string]map[string]json.RawMessage `json:"content"`
		}
		if json.Unmarshal(raw, &e) != nil || e.Type != "m.receipt" {
			return false
		}
		_, ok := e.Content[msg]["m.read"][s.bot.UserID()]
		return ok
	})
}

func TestJoinedRoomsListsTheRoomsTheBotIsIn(t *testing.T) {
	s := newSurface(t)
	other := s.person.CreateRoom(s.bot.UserID())
	if _, err := s.bot.Join(t.Context(), other); err != nil {
		t.Fatal(err)
	}
	rooms, err := s.bot.JoinedRooms(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{s.room, other}
	slices.Sort(want)
	if !slices.Equal(rooms, want) {
		t.Errorf("JoinedRooms = %v, want %v", rooms, want)
	}
	if err := s.bot.Leave(t.Context(), other); err != nil {
		t.Fatal(err)
	}
	if rooms, err = s.bot.JoinedRooms(t.Context()); err != nil || !slices.Equal(rooms, []string{s.room}) {
		t.Errorf("after leaving %s: JoinedRooms = %v, %v; want only %s", other, rooms, err, s.room)
	}
}

func TestRoomSummaryReadsNameTopicEncryptionAndMembers(t *testing.T) {
	s := newSurface(t)
	got, err := s.bot.RoomSummary(t.Context(), s.room)
	if err != nil {
		t.Fatal(err)
	}
	if want := (matrix.RoomSummary{RoomID: s.room, Members: 2}); got != want {
		t.Errorf("summary of a room with no name or topic = %+v, want %+v", got, want)
	}

	s.person.SetState(s.room, "m.room.name", "", map[string]any{"name": "Support"})
	s.person.SetState(s.room, "m.room.topic", "", map[string]any{"topic": "Questions about the daemon"})
	got, err = s.bot.RoomSummary(t.Context(), s.room)
	if err != nil {
		t.Fatal(err)
	}
	want := matrix.RoomSummary{RoomID: s.room, Name: "Support", Topic: "Questions about the daemon", Members: 2}
	if got != want {
		t.Errorf("summary = %+v, want %+v", got, want)
	}

	s.person.SetState(s.room, "m.room.encryption", "", map[string]any{"algorithm": "m.megolm.v1.aes-sha2"})
	if got, err = s.bot.RoomSummary(t.Context(), s.room); err != nil || !got.Encrypted {
		t.Errorf("after the person enabled encryption: summary = %+v, %v; want Encrypted", got, err)
	}
}

// A room the agent is not in is the server's refusal, reachable as an
// HTTPError, for each call that reads the room or shows the agent in it.
// (Dendrite v0.13 takes a read receipt for any room without checking
// membership, so ReadReceipt is not among them.)
func TestRoomCallsOutsideTheRoomAreTheServersRefusal(t *testing.T) {
	s := newSurface(t)
	private := s.person.CreateRoom()
	ctx := t.Context()
	for name, call := range map[string]func() error{
		"Typing":        func() error { return s.bot.Typing(ctx, private, true, time.Second) },
		"RoomSummary":   func() error { _, err := s.bot.RoomSummary(ctx, private); return err },
		"JoinedMembers": func() error { _, err := s.bot.JoinedMembers(ctx, private); return err },
	} {
		t.Run(name, func(t *testing.T) {
			err := call()
			var he *matrix.HTTPError
			if !errors.As(err, &he) || he.Status < 400 || he.Status >= 500 {
				t.Errorf("%s in a room the bot is not in: %v, want the server's 4xx as an HTTPError", name, err)
			}
		})
	}
}

func TestJoinedMembersListsBothSortedByUserID(t *testing.T) {
	s := newSurface(t)
	members, err := s.bot.JoinedMembers(t.Context(), s.room)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, 0, len(members))
	for _, m := range members {
		ids = append(ids, m.UserID)
	}
	want := []string{s.bot.UserID(), s.person.UserID}
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Fatalf("members %v, want %v", ids, want)
	}
	for _, m := range members {
		if m.UserID == s.person.UserID && m.DisplayName != "Alice" {
			t.Errorf("the person's display name is %q, want %q", m.DisplayName, "Alice")
		}
	}
}

// redaction builds a redaction delivery as the outbox would claim it.
func redaction(t *testing.T, c *matrix.Client, room, id string, content string) journal.Delivery {
	t.Helper()
	p, err := journal.NewPrincipal("bot", c.UserID())
	if err != nil {
		t.Fatal(err)
	}
	return journal.Delivery{
		DeliveryID: id, Stage: journal.StageFinal, RoomID: room, TxnID: journal.TxnID(p, id, journal.StageFinal),
		EventType: "m.room.redaction", Content: json.RawMessage(content),
	}
}

// A redaction delivery goes through the redact endpoint under its own
// transaction ID: the target is redacted, the reason kept, and a resend
// is the same redaction.
func TestTheSenderRedactsWhatARedactionDeliveryNames(t *testing.T) {
	s := newSurface(t)
	msg := s.person.SendText(s.room, "react to me")
	reaction, err := s.bot.Send(t.Context(), s.room, "m.reaction", "react-1", json.RawMessage(
		`{"m.relates_to":{"rel_type":"m.annotation","event_id":"`+msg+`","key":"👍"}}`))
	if err != nil {
		t.Fatal(err)
	}
	d := redaction(t, s.bot, s.room, "unreact-1", `{"redacts":"`+reaction+`","reason":"withdrawn"}`)
	sender := matrix.NewSender(s.bot)
	sent, err := sender.Send(t.Context(), d, wire(t, d))
	if err != nil {
		t.Fatal(err)
	}
	if !journal.ValidEventID(sent.EventID) {
		t.Fatalf("the redaction was acknowledged as %q", sent.EventID)
	}

	var redactedBy string
	var reason string
	for _, raw := range history(t, s.person, s.room, sent.EventID) {
		var e struct {
			ID       string `json:"event_id"`
			Type     string `json:"type"`
			Redacts  string `json:"redacts"`
			Content  json.RawMessage
			Unsigned struct {
				RedactedBecause *struct {
					ID string `json:"event_id"`
				} `json:"redacted_because"`
			} `json:"unsigned"`
		}
		if err := json.Unmarshal(raw, &e); err != nil {
			t.Fatal(err)
		}
		switch e.ID {
		case reaction:
			if e.Unsigned.RedactedBecause != nil {
				redactedBy = e.Unsigned.RedactedBecause.ID
			}
			if string(e.Content) != "{}" {
				t.Errorf("the redacted reaction still has content %s", e.Content)
			}
		case sent.EventID:
			var c struct {
				Redacts string `json:"redacts"`
				Reason  string `json:"reason"`
			}
			_ = json.Unmarshal(e.Content, &c)
			if e.Type != "m.room.redaction" || (e.Redacts != reaction && c.Redacts != reaction) {
				t.Errorf("the acknowledged event is %s redacting %q/%q, want a redaction of %s", e.Type, e.Redacts, c.Redacts, reaction)
			}
			reason = c.Reason
		}
	}
	if redactedBy != sent.EventID {
		t.Errorf("the reaction is redacted by %q, want %s", redactedBy, sent.EventID)
	}
	if reason != "withdrawn" {
		t.Errorf("the redaction's reason is %q, want %q", reason, "withdrawn")
	}

	again, err := sender.Send(t.Context(), d, wire(t, d))
	if err != nil || again.EventID != sent.EventID {
		t.Errorf("resend = %s, %v; want %s deduplicated", again.EventID, err, sent.EventID)
	}
}

// A redaction delivery naming no valid target cannot succeed on any retry:
// it is a permanent 400, and nothing is asked of the server.
func TestARedactionDeliveryWithoutAValidTargetIsAPermanentFailure(t *testing.T) {
	c, requests := countingClient(t)
	for name, content := range map[string]string{
		"Missing":      `{"reason":"x"}`,
		"NotAnEventID": `{"redacts":"not-an-id"}`,
		"NotAString":   `{"redacts":42}`,
		"Null":         `{"redacts":null}`,
		"BadReason":    `{"redacts":"$event:fake","reason":7}`,
	} {
		t.Run(name, func(t *testing.T) {
			d := redaction(t, c, "!r:fake", "unreact-"+name, content)
			_, err := matrix.NewSender(c).Send(t.Context(), d, json.RawMessage(content))
			var se *journal.SendError
			if !errors.As(err, &se) || se.Status != http.StatusBadRequest {
				t.Errorf("send %s: %v, want a SendError with status 400", content, err)
			}
		})
	}
	if n := requests(); n != 0 {
		t.Errorf("%d requests reached the server, want none", n)
	}
}
