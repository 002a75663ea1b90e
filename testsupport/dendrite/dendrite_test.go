package dendrite_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"maunium.net/go/mautrix"

	"github.com/mindroomd/mindroomd/testsupport/dendrite"
)

// ev is the part of an event the tests read.
type ev struct {
	ID       string  `json:"event_id"`
	Type     string  `json:"type"`
	Sender   string  `json:"sender"`
	StateKey *string `json:"state_key"`
	TS       int64   `json:"origin_server_ts"`
	Redacts  string  `json:"redacts"`
	Content  struct {
		Body       string `json:"body"`
		Membership string `json:"membership"`
		RelatesTo  *struct {
			RelType string `json:"rel_type"`
			EventID string `json:"event_id"`
		} `json:"m.relates_to"`
		NewContent struct {
			Body string `json:"body"`
		} `json:"m.new_content"`
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

func TestAConversationIsReadBackAsItWasPlayed(t *testing.T) {
	s := dendrite.Start(t)
	t.Logf("dendrite answered %s after %s", s.URL, s.StartTime)
	alice := s.User(t, s.Register(t, "alice", "alice-password"))
	bob := s.User(t, s.Register(t, "bob", "bob-password"))

	room := alice.CreateRoom()
	alice.Invite(room, bob.UserID)
	bob.Join(room)
	hello := alice.SendText(room, "hello")
	edit := alice.Edit(room, hello, "hello, bob")
	reply := bob.ThreadReply(room, hello, "hi alice")
	reaction := alice.React(room, reply, "👍")
	redaction := alice.Redact(room, reaction)
	bob.Leave(room)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	alice.AwaitEvent(ctx, room, func(raw json.RawMessage) bool {
		e := parse(t, raw)
		return e.Type == "m.room.member" && e.StateKey != nil && *e.StateKey == bob.UserID && e.Content.Membership == "leave"
	})

	// What the test played: bob's membership changes (by state key) and
	// the events it sent; the room's creation is left out.
	played := map[string]bool{hello: true, edit: true, reply: true, reaction: true, redaction: true}
	var got []ev
	for _, raw := range alice.Messages(room) {
		e := parse(t, raw)
		if played[e.ID] || (e.Type == "m.room.member" && e.StateKey != nil && *e.StateKey == bob.UserID) {
			got = append(got, e)
		}
	}
	want := []struct{ id, typ, sender, membership string }{
		{"", "m.room.member", alice.UserID, "invite"},
		{"", "m.room.member", bob.UserID, "join"},
		{hello, "m.room.message", alice.UserID, ""},
		{edit, "m.room.message", alice.UserID, ""},
		{reply, "m.room.message", bob.UserID, ""},
		{reaction, "m.reaction", alice.UserID, ""},
		{redaction, "m.room.redaction", alice.UserID, ""},
		{"", "m.room.member", bob.UserID, "leave"},
	}
	if len(got) != len(want) {
		t.Fatalf("read back %d events, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		g := got[i]
		if g.Type != w.typ || g.Sender != w.sender || (w.id != "" && g.ID != w.id) || g.Content.Membership != w.membership {
			t.Errorf("event %d = %s %s %q from %s, want %s %s %q from %s",
				i, g.ID, g.Type, g.Content.Membership, g.Sender, w.id, w.typ, w.membership, w.sender)
		}
		if i > 0 && g.TS < got[i-1].TS {
			t.Errorf("event %d (ts %d) before event %d (ts %d): not oldest first", i, g.TS, i-1, got[i-1].TS)
		}
	}
	if e := got[3]; e.Content.RelatesTo == nil || e.Content.RelatesTo.RelType != "m.replace" ||
		e.Content.RelatesTo.EventID != hello || e.Content.NewContent.Body != "hello, bob" {
		t.Errorf("edit content = %+v, want an m.replace of %s with body %q", e.Content, hello, "hello, bob")
	}
	if e := got[4]; e.Content.RelatesTo == nil || e.Content.RelatesTo.RelType != "m.thread" || e.Content.RelatesTo.EventID != hello {
		t.Errorf("thread reply content = %+v, want an m.thread under %s", e.Content, hello)
	}
	if e := got[5]; e.Content.RelatesTo != nil {
		t.Errorf("redacted reaction still relates to %s", e.Content.RelatesTo.EventID)
	}
	if e := got[6]; e.Redacts != reaction {
		t.Errorf("redaction redacts %q, want %q", e.Redacts, reaction)
	}
}

func TestAwaitEventSeesAnotherUsersMessageInItsOwnSync(t *testing.T) {
	s := dendrite.Start(t)
	alice := s.User(t, s.Register(t, "alice", "alice-password"))
	bob := s.User(t, s.Register(t, "bob", "bob-password"))
	room := alice.CreateRoom(bob.UserID)
	bob.Join(room)

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	isText := func(body string) func(json.RawMessage) bool {
		return func(raw json.RawMessage) bool {
			var e ev
			return json.Unmarshal(raw, &e) == nil && e.Content.Body == body
		}
	}
	first := alice.SendText(room, "first")
	if got := parse(t, bob.AwaitEvent(ctx, room, isText("first"))).ID; got != first {
		t.Fatalf("awaited event %s, want %s", got, first)
	}
	// Sent while bob is not syncing: the next call's sync picks it up.
	second := alice.SendText(room, "second")
	if got := parse(t, bob.AwaitEvent(ctx, room, isText("second"))).ID; got != second {
		t.Fatalf("awaited event %s, want %s", got, second)
	}
	// Passed over by an earlier call: found again without a new sync.
	if got := parse(t, bob.AwaitEvent(ctx, room, isText("first"))).ID; got != first {
		t.Fatalf("awaited event %s, want %s", got, first)
	}
}

// The homeserver's deviations from the spec that the daemon is written
// around. If an upgrade changes one, this test names the assumption that
// moved.
func TestDendriteDeviatesFromTheSpecAsTheDaemonExpects(t *testing.T) {
	s := dendrite.Start(t)
	alice := s.User(t, s.Register(t, "alice", "alice-password"))
	room := alice.CreateRoom()
	root := alice.SendText(room, "root")
	child := alice.ThreadReply(room, root, "child")
	grandchild := alice.React(room, child, "x")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	alice.AwaitEvent(ctx, room, dendrite.WithID(grandchild))

	t.Run("RelationsDoNotRecurse", func(t *testing.T) {
		var page struct {
			Chunk          []json.RawMessage `json:"chunk"`
			RecursionDepth *int              `json:"recursion_depth"`
		}
		url := alice.Client.BuildURLWithQuery(mautrix.ClientURLPath{"v1", "rooms", room, "relations", root},
			map[string]string{"recurse": "true", "dir": "b"})
		if _, err := alice.Client.MakeRequest(t.Context(), http.MethodGet, url, nil, &page); err != nil {
			t.Fatal(err)
		}
		if page.RecursionDepth != nil {
			t.Errorf("recursion_depth = %d, want absent", *page.RecursionDepth)
		}
		var ids []string
		for _, raw := range page.Chunk {
			ids = append(ids, parse(t, raw).ID)
		}
		if len(ids) != 1 || ids[0] != child {
			t.Errorf("relations of the root = %v, want only the direct child %s (not %s)", ids, child, grandchild)
		}
	})
	t.Run("ForwardMessagesNeedFrom", func(t *testing.T) {
		url := alice.Client.BuildURLWithQuery(mautrix.ClientURLPath{"v3", "rooms", room, "messages"},
			map[string]string{"dir": "f"})
		var page struct {
			Chunk []json.RawMessage `json:"chunk"`
		}
		_, err := alice.Client.MakeRequest(t.Context(), http.MethodGet, url, nil, &page)
		var httpErr mautrix.HTTPError
		if !errors.As(err, &httpErr) || !httpErr.IsStatus(http.StatusBadRequest) {
			t.Errorf("dir=f without from: err=%v, %d events; want HTTP 400", err, len(page.Chunk))
		}
	})
}

// Without the binaries a test fails and says how to build them: a test
// needing a homeserver must never pass by skipping.
func TestAMissingDendriteIsAnErrorThatSaysHowToBuildIt(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module example.org/empty\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	s, err := dendrite.Launch(t.TempDir())
	if err == nil {
		_ = s.Stop()
		t.Fatal("launched without binaries")
	}
	if !strings.Contains(err.Error(), "make dendrite") {
		t.Errorf("error = %v, want it to name `make dendrite`", err)
	}
}
