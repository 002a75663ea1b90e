package matrix_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/matrix"
	"github.com/mindroomd/mindroomd/testsupport/dendrite"
)

// hs is the package's homeserver, shared by all tests: each test registers
// users of its own, so none sees another's rooms.
var hs *dendrite.Server

func TestMain(m *testing.M) { os.Exit(dendrite.RunTests(m, func(s *dendrite.Server) { hs = s })) }

var users atomic.Int64

// register makes a fresh account on the shared server.
func register(t *testing.T) dendrite.Account {
	t.Helper()
	n := users.Add(1)
	return hs.Register(t, fmt.Sprintf("user%d", n), fmt.Sprintf("password-%d", n))
}

// config is a password login for acct with its own storage directory.
func config(t *testing.T, acct dendrite.Account) matrix.Config {
	return matrix.Config{
		Homeserver: hs.URL, UserID: acct.UserID, Password: acct.Password,
		Agent: "bot", StorageDir: t.TempDir(), Log: zerolog.New(zerolog.NewTestWriter(t)),
	}
}

func login(t *testing.T, cfg matrix.Config) *matrix.Client {
	t.Helper()
	c, err := matrix.Login(t.Context(), cfg)
	if err != nil {
		t.Fatalf("login: %v", err)
	}
	return c
}

// roomWithBot has a human create a room the bot joins.
func roomWithBot(t *testing.T, c *matrix.Client) (*dendrite.User, string) {
	t.Helper()
	human := hs.User(t, register(t))
	room := human.CreateRoom(c.UserID())
	if _, err := c.Join(t.Context(), room); err != nil {
		t.Fatal(err)
	}
	return human, room
}

// logout revokes an access token (and, on Dendrite, deletes its device).
func logout(t *testing.T, token string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, hs.URL+"/_matrix/client/v3/logout", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("logout: HTTP %d", resp.StatusCode)
	}
}

// ev is the part of an event the tests read.
type ev struct {
	ID       string  `json:"event_id"`
	Type     string  `json:"type"`
	Sender   string  `json:"sender"`
	StateKey *string `json:"state_key"`
	TS       int64   `json:"origin_server_ts"`
	Content  struct {
		Body       string `json:"body"`
		Membership string `json:"membership"`
	} `json:"content"`
}

func parse(t *testing.T, raw json.RawMessage) ev {
	t.Helper()
	var e ev
	if err := json.Unmarshal(raw, &e); err != nil {
		t.Fatalf("event %s: %v", raw, err)
	}
	return e
}

// bodies lists the text bodies among events, in order.
func bodies(t *testing.T, events []json.RawMessage) []string {
	t.Helper()
	var out []string
	for _, raw := range events {
		if e := parse(t, raw); e.Type == "m.room.message" {
			out = append(out, e.Content.Body)
		}
	}
	return out
}

// history returns the room's events as u reads them once eventID is in
// u's sync. Dendrite fills the store behind /messages after it answers a
// send, in order, and sync reads that same store: once the last event is
// there, so is everything before it.
func history(t *testing.T, u *dendrite.User, room, eventID string) []json.RawMessage {
	t.Helper()
	settle(t, u, room, eventID)
	return u.Messages(room)
}

// settle waits until eventID is in u's sync.
func settle(t *testing.T, u *dendrite.User, room, eventID string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	u.AwaitEvent(ctx, room, dendrite.WithID(eventID))
}
