package hydrator_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mindroomd/mindroomd/actors/hydrator"
	"github.com/mindroomd/mindroomd/actors/principal"
	"github.com/mindroomd/mindroomd/agent"
	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/matrix"
	"github.com/mindroomd/mindroomd/testsupport/dendrite"
)

// agentMessages counts the agent's messages in the room, by body, as the
// homeserver holds them.
func (f *fixture) agentMessages() map[string]int {
	f.t.Helper()
	out := map[string]int{}
	for _, raw := range f.alice.Messages(f.room) {
		var ev struct {
			Sender  string `json:"sender"`
			Content struct {
				Body string `json:"body"`
			} `json:"content"`
		}
		if json.Unmarshal(raw, &ev) == nil && ev.Sender == f.bot.UserID && ev.Content.Body != "" {
			out[ev.Content.Body]++
		}
	}
	return out
}

// awaitBody waits until alice's sync shows a message of sender's with body.
func (f *fixture) awaitBody(sender, body string) string {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.ctx, testDeadline)
	defer cancel()
	raw := f.alice.AwaitEvent(ctx, f.room, func(raw json.RawMessage) bool {
		var ev struct {
			Sender  string `json:"sender"`
			Content struct {
				Body string `json:"body"`
			} `json:"content"`
		}
		return json.Unmarshal(raw, &ev) == nil && ev.Sender == sender && ev.Content.Body == body
	})
	var id struct {
		EventID string `json:"event_id"`
	}
	_ = json.Unmarshal(raw, &id)
	return id.EventID
}

func TestARejoinedRoomServesItsHydratedHistoryAndAnswersOnlyWhatCameAfter(t *testing.T) {
	f := newFixture(t, hydrator.Deps{})
	pid := f.system.Root.Spawn(principal.Props(principal.Deps{
		Store: f.view, Transport: f.client, Agent: agent.Echo{}, Conversation: f.reader,
		Sender: matrix.NewSender(f.client), Reconciler: matrix.NewReconciler(f.client), DeviceID: f.client.DeviceID(),
		// Hints is left out: the principal takes the view's bus.
		AutoJoin: true, Log: zerolog.Nop(), SyncTimeout: time.Second,
		BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		OnFault: func(err error) { t.Errorf("principal stopped: %v", err) },
	}))
	t.Cleanup(func() { _ = f.system.Root.StopFuture(pid).Wait() })
	f.alice.SendText(f.room, "before the leave")
	f.awaitBody(f.bot.UserID, "echo: before the leave")

	res, err := f.system.Root.RequestFuture(pid, &principal.Leave{RoomID: f.room}, testDeadline).Result()
	if err != nil || res.(*principal.Left).Err != nil {
		t.Fatalf("leave: %v %v", err, res)
	}
	if got := bodies(f.read(journal.ReadRequest{RoomID: f.room, Limit: 50})); len(got) != 0 {
		t.Fatalf("the fenced room still serves %q", got)
	}
	away := f.alice.SendText(f.room, "while the agent was away")
	f.settled(away)
	f.alice.Invite(f.room, f.bot.UserID)
	ctx, cancel := context.WithTimeout(f.ctx, testDeadline)
	defer cancel()
	f.alice.AwaitEvent(ctx, f.room, dendrite.Joined(f.bot.UserID, 2))
	// The server shows the join before the agent's sync has brought it
	// to the journal, and until then a read finds the agent out.
	for deadline := time.Now().Add(testDeadline); ; {
		_, departed, err := f.view.RoomEpoch(f.ctx, f.room)
		if err != nil {
			t.Fatal(err)
		}
		if !departed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the journal never recorded the rejoin")
		}
		time.Sleep(10 * time.Millisecond) // a join commits no hint to wait on
	}

	page, err := f.reader.Read(f.ctx, journal.ReadRequest{RoomID: f.room, Limit: 50, Strict: true})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"before the leave", "echo: before the leave", "while the agent was away"}
	if got := bodies(page); !slices.Equal(got[:min(len(got), 3)], want) {
		t.Fatalf("after the rejoin the room serves %q, want its history %q first", got, want)
	}
	f.alice.SendText(f.room, "after the rejoin")
	f.awaitBody(f.bot.UserID, "echo: after the rejoin")
	got := f.agentMessages()
	if got["echo: before the leave"] != 1 || got["echo: after the rejoin"] != 1 || got["echo: while the agent was away"] != 0 {
		t.Fatalf("the agent said %v; want each answer once and nothing for history", got)
	}
}
